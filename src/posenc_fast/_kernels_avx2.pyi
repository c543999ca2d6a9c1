"""Type stub of the AVX2 build of the kernels: the API of the baseline build."""

from ._kernels_baseline import *

# Cython's doctest table (a dunder, so not re-exported by the star import).
__test__: dict[str, str]
