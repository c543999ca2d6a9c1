# cython: language_level=3, freethreading_compatible=True
"""The kernels of _kernels.pxi compiled for the 'avx512' instruction-set variant."""
ISA_VARIANT = "avx512"
include "_kernels.pxi"
