"""Type stubs of the compiled kernel modules (one per instruction set, same API).

The kernels trust their inputs: the Python layer passes C-contiguous float32
or float64 arrays of the right shapes, already validated.
"""

import numpy as np
from numpy.typing import NDArray

_F64 = NDArray[np.float64]
_Float = NDArray[np.float32] | NDArray[np.float64]
_Index = NDArray[np.intp]

ISA_VARIANT: str
# Cython's doctest table.
__test__: dict[str, str]

def openmp_enabled() -> bool: ...
def simd_level() -> str: ...
def anchor_rows() -> int: ...
def cos_sin_rows(positions: _F64, freqs: _F64, scale: float, cos_out: _Float, sin_out: _Float,
                 work: _F64, num_threads: int) -> None: ...
def sinusoidal_rows(positions: _F64, freqs: _F64, out: _Float, split: bool, work: _F64,
                    num_threads: int) -> None: ...
def rotate_rows(x: _Float, out: _Float, cos_table: _Float, sin_table: _Float,
                row_table: _Index, half_layout: bool, inverse: bool,
                num_threads: int) -> None: ...
def add_table_rows(x: _Float, out: _Float, table: _Float, row_table: _Index,
                   num_threads: int) -> None: ...
