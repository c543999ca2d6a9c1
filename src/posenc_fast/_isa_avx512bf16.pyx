# cython: language_level=3, freethreading_compatible=True
"""The row kernels compiled for the 'avx512bf16' instruction-set variant (see _isa.pxi)."""
include "_isa.pxi"
