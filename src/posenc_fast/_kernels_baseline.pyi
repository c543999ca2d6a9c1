"""Type stubs of the compiled kernel modules (one per instruction set, same API).

The module-level kernels trust their inputs: the Python layer passes
C-contiguous float32 or float64 arrays of the right shapes, already
validated.  ``RotaryBase`` is the compiled half of ``RotaryEmbedding``.
"""

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from typing_extensions import disjoint_base

_F64 = NDArray[np.float64]
_Float = NDArray[np.float32] | NDArray[np.float64]
_FloatOut = NDArray[np.floating[Any]]
_Index = NDArray[np.intp]
_Int64 = NDArray[np.int64]

ISA_VARIANT: str
# Cython's doctest table.
__test__: dict[str, str]

def openmp_enabled() -> bool: ...
def simd_level() -> str: ...
def trig_work_rows(num_threads: int) -> int: ...
def set_thread_limit(n: int) -> None: ...
def cos_sin_rows(positions: _F64, freqs: _F64, scale: float, cos_out: _Float, sin_out: _Float,
                 work: _F64, num_threads: int) -> None: ...
def sinusoidal_rows(positions: _F64, freqs: _F64, out: _Float, split: bool, work: _F64,
                    num_threads: int) -> None: ...
def rotate_rows(x: _Float, out: _Float, cos_table: _Float, sin_table: _Float,
                row_table: _Index, half_layout: bool, inverse: bool,
                num_threads: int) -> None: ...
def add_table_rows(x: _Float, out: _Float, table: _Float, row_table: _Index,
                   num_threads: int) -> None: ...
def alibi_fill_rows(out: _Float, slopes: _F64, q_len: int, offset: int, causal: bool,
                    num_threads: int) -> None: ...
def alibi_add_rows(x: _Float, out: _Float, slopes: _F64, q_len: int, offset: int, causal: bool,
                   num_threads: int) -> None: ...
def clipped_vector(dstart: int, max_distance: int, out: _Int64) -> None: ...
def t5_bucket_vector(dstart: int, bidirectional: bool, num_buckets: int, log_ratio: float,
                     out: _Int64) -> None: ...
def diagonal_rows(vector: _Int64, out: _Int64, num_threads: int) -> None: ...
def rotate_cos_sin_fast(xs: tuple[Any, ...], cos_cache: Any, sin_cache: Any, layout: Any,
                        inverse: Any, outs: tuple[Any, ...]) -> tuple[_FloatOut, ...] | None: ...

@disjoint_base
class RotaryBase:
    def _init_fast_path(self, dim: int, rotary_dim: int, half: bool, freqs: _F64,
                        attention_factor: float, valid_below: int) -> None: ...
    def apply(self, x: ArrayLike, positions: ArrayLike | None = None, *, offset: float = 0,
              seq_axis: int = -2, inverse: bool = False,
              out: _FloatOut | None = None) -> _FloatOut: ...
    def apply_qk(self, q: ArrayLike, k: ArrayLike, positions: ArrayLike | None = None, *,
                 offset: float = 0, seq_axis: int = -2, inverse: bool = False,
                 out_q: _FloatOut | None = None,
                 out_k: _FloatOut | None = None) -> tuple[_FloatOut, _FloatOut]: ...
