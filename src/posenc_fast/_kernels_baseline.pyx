# cython: language_level=3, freethreading_compatible=True
"""The kernels of _kernels.pxi compiled for the 'baseline' instruction-set variant."""
ISA_VARIANT = "baseline"
include "_kernels.pxi"
