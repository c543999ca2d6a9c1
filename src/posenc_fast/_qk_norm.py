"""q/k RMSNorm and RoPE in one pass: the checks, the cos/sin table and the kernel call.

`RotaryEmbedding.apply_qk_norm` and `vllm.fused_qk_norm_rope` come here;
``_core.norm_rotate_rows`` normalises and rotates each head row in one pass.
"""

import numpy as np

from . import _validate as v
from ._dispatch import kernels
from ._rows import RowOutput, row_index, row_table
from ._threads import threads_for


def norm_weight(weight, name: str, dim: int, weight_offset: float) -> np.ndarray:
    """The dim factors ``weight_offset + weight`` in float64 (the weight of any float dtype)."""
    weight = v.float_array(weight, name)
    if weight.shape != (dim,):
        raise ValueError(f"{name} must have shape (head_dim,) = ({dim},), got {weight.shape}")
    return np.ascontiguousarray(weight.astype(np.float64) + weight_offset)


def norm_args(eps, weight_offset) -> tuple[float, float]:
    """`eps` (a real >= 0) and `weight_offset` (a real) checked."""
    eps = v.real(eps, "eps")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    return eps, v.real(weight_offset, "weight_offset")


def norm_rotate(x: np.ndarray, out, in_place: bool, weight: np.ndarray, eps: float,
                cos: np.ndarray, sin: np.ndarray, rows: np.ndarray, half: bool,
                start: int = 0) -> np.ndarray:
    """Normalise and rotate every row of `x` (row r by cos/sin row rows[r]; features from
    `start` on rotate) into `out`."""
    result = RowOutput(x, out, in_place)
    kernels.norm_rotate_rows(result.x_rows, result.rows, weight, eps, cos, sin,
                             np.ascontiguousarray(rows, dtype=np.intp), half,
                             threads_for(x.size), start)
    return result.result()


def apply_qk_norm(rope, q, k, q_weight, k_weight, positions, offset, seq_axis, eps,
                  weight_offset, out_q, out_k):
    """RotaryEmbedding.apply_qk_norm (see its docstring): the compiled fast path (every check in C,
    positions in the embedding's cos/sin cache), else `apply_qk_norm_general`."""
    args = (q, k, q_weight, k_weight, positions, offset, seq_axis, eps, weight_offset, out_q, out_k)
    result = kernels.apply_qk_norm_fast(rope, *args)
    return result if result is not None else apply_qk_norm_general(rope, *args)


def apply_qk_norm_general(rope, q, k, q_weight, k_weight, positions, offset, seq_axis, eps,
                          weight_offset, out_q, out_k):
    """apply_qk_norm's checks in Python and its cos/sin computed for the call: bitwise the fast path."""
    if rope.n_streams != 1:
        raise ValueError(f"apply_qk_norm takes one position stream; this embedding has "
                         f"{rope.n_streams} (normalise, then apply_qk)")
    q, k, values, q_index, k_index, (out_q, q_in_place), (out_k, k_in_place) = \
        rope._qk_call(q, k, positions, offset, seq_axis, out_q, out_k)
    eps, weight_offset = norm_args(eps, weight_offset)
    q_weight = norm_weight(q_weight, "q_weight", rope.dim, weight_offset)
    k_weight = norm_weight(k_weight, "k_weight", rope.dim, weight_offset)
    half = rope.layout == "half"
    results, tables = [], {}
    for x, out, in_place, weight, index in ((q, out_q, q_in_place, q_weight, q_index),
                                            (k, out_k, k_in_place, k_weight, k_index)):
        dtype = v.compute_dtype(x.dtype)
        if dtype not in tables:  # one table for q and k of one compute dtype
            tables[dtype] = rope._table(values, dtype)
        cos, sin = tables[dtype]
        results.append(norm_rotate(x, out, in_place, weight, eps, cos, sin,
                                   row_table(index, x.shape[:-1]), half, rope.rotary_start))
    return tuple(results)


def token_rows(positions: np.ndarray, heads: int) -> np.ndarray:
    """The table row of each (token, head) row: the token's position, broadcast over heads."""
    return row_index(positions.reshape(-1, 1), (positions.size, heads))
