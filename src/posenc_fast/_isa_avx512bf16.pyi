"""Type stub of an _isa_<variant> module (see _isa.pxi)."""

from typing import Any

# A PyCapsule holding the table of row kernels, for _core.use_kernels.
KERNELS: Any
# Cython's doctest table.
__test__: dict[str, str]
