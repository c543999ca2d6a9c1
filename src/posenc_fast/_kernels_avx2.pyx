# cython: language_level=3, freethreading_compatible=True
"""The kernels of _kernels.pxi compiled for the 'avx2' instruction-set variant."""
ISA_VARIANT = "avx2"
include "_kernels.pxi"
