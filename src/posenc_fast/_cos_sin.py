"""RoPE with a cos/sin cache the caller already holds: apply_rotary_cos_sin(_qk).

The cache is used as given (no attention factor, no recomputation): vLLM's
``cos_sin_cache`` rows picked by positions, a Hugging Face cache broadcast
against x, ONNX ``position_ids``.  Calls without positions whose arrays the
compiled walk takes (``_core.rotate_cos_sin_fast``) skip the checks here.
"""

from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import _validate as v
from ._dispatch import kernels
from ._rows import rotate, row_index, row_table


def _cache_tables(cos, sin):
    """Validate a user's cos/sin cache; return both as float arrays of one dtype."""
    cos = v.float_array(cos, "cos")
    sin = v.float_array(sin, "sin")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {cos.shape} and {sin.shape}")
    if cos.ndim < 1 or cos.shape[-1] < 1:
        raise ValueError(f"cos and sin need a last axis of rotary_dim/2 >= 1 entries, "
                         f"got shape {cos.shape}")
    if cos.dtype != sin.dtype:  # rare: compute in float64
        cos, sin = cos.astype(np.float64), sin.astype(np.float64)
    return cos, sin


def _as_table(a: np.ndarray) -> np.ndarray:
    # (..., h) -> (rows, h) with unit stride along h: a view whenever the strides allow.
    table = a.reshape(-1, a.shape[-1])
    return table if table.strides[1] == table.itemsize else np.ascontiguousarray(table)


def _cache_index(cos: np.ndarray, lead: tuple, positions, name: str) -> np.ndarray:
    """For each row of an array with leading shape `lead`, the cache row it uses."""
    if positions is None:
        v.broadcast_target(cos.shape[:-1], lead, "cos/sin without positions: their leading shape",
                           f"{name}.shape[:-1]")
        return row_table(cos.shape[:-1], lead)
    index = v.integer_array(positions)
    v.broadcast_target(index.shape, lead, "positions", f"{name}.shape[:-1]")
    n = cos.shape[0]
    if index.size and (int(index.min()) < 0 or int(index.max()) >= n):
        raise ValueError(f"positions must lie in [0, {n}) (rows of the cos/sin table), got "
                         f"values from {int(index.min())} to {int(index.max())}")
    return row_index(index, lead)


def _check_cache_width(cos: np.ndarray, x: np.ndarray, name: str, positions, start) -> int:
    """`rotary_start` checked against x's and cos/sin's widths."""
    if positions is not None and cos.ndim != 2:
        raise ValueError(f"with positions, cos and sin must be 2-D tables (n, rotary_dim/2), "
                         f"got shape {cos.shape}")
    start = v.integer(start, "rotary_start", minimum=0)
    width = 2 * cos.shape[-1]
    if start + width > x.shape[-1]:
        reach = f"rotary_start + rotary_dim = {start} + {width}" if start else f"rotary_dim = {width}"
        raise ValueError(f"cos/sin have {cos.shape[-1]} entries per row, so {reach}, which exceeds "
                         f"{name}.shape[-1] = {x.shape[-1]}; pass one entry per pair (e.g. "
                         f"cos[..., :dim//2] of a full-width Hugging Face cache)")
    return start


def apply_rotary_cos_sin(x: ArrayLike, cos: ArrayLike, sin: ArrayLike,
                         positions: ArrayLike | None = None, *,
                         layout: Literal["interleaved", "half"] = "half", inverse: bool = False,
                         rotary_start: int = 0, out: NDArray[np.floating[Any]] | None = None
                         ) -> NDArray[np.floating[Any]]:
    """Rotate `x` with a cos/sin cache the caller already holds.

    Parameters
    ----------
    x : ndarray of shape (..., dim), float16, bfloat16, float32 or float64
    cos, sin : ndarrays of equal shape
        float32 or float64 (float16/bfloat16 widened to float32); for
        float16/bfloat16 `x`, float32 or x's own dtype.
        One entry per pair along the last axis (``r/2`` entries rotate
        ``r`` features from `rotary_start` on; the rest pass through).  Used as given: no
        attention factor, no recomputation.  Without `positions` they
        broadcast against ``x.shape[:-1] + (r/2,)`` (e.g. ``(seq, r/2)`` for
        ``(batch, heads, seq, dim)``); with `positions` they are 2-D tables
        ``(n, r/2)``.
    positions : array_like of int, optional
        Rows of the tables, broadcasting against ``x.shape[:-1]``, each in
        ``[0, n)`` (vLLM's ``cos_sin_cache``, ONNX ``position_ids``).
    layout : {"half", "interleaved"}, optional
    inverse : bool, optional
        Use ``(cos, -sin)``: the inverse rotation when the cache holds true
        cos/sin.
    rotary_start : int, optional
        The first feature that rotates (DeepSeek-V4: the last ``r`` of a
        head, ``dim - r``; vLLM's ``rope_dim_offset``).
    out : ndarray of x's shape and dtype, optional
        May be `x` itself (in place).

    Returns
    -------
    ndarray of x's shape and dtype
        Arithmetic in the wider of x's and the cache's dtypes (float32 for a
        half-precision x), rounded once.

    Examples
    --------
    >>> import numpy as np, posenc_fast as pf
    >>> cos, sin = pf.RotaryEmbedding(64).cos_sin(np.arange(10))
    >>> q = np.ones((1, 4, 10, 64), np.float32)
    >>> pf.apply_rotary_cos_sin(q, cos, sin).shape
    (1, 4, 10, 64)
    """
    if positions is None and type(rotary_start) is int and 0 <= rotary_start < 1 << 62:
        fast = kernels.rotate_cos_sin_fast((x,), cos, sin, layout, inverse, (out,), rotary_start)
        if fast is not None:
            return fast[0]
    x = v.float_array(x, "x")
    if x.ndim < 1:
        raise ValueError(f"x must have shape (..., dim), got {x.shape}")
    cos, sin = _cache_tables(cos, sin)
    half = v.choice(layout, "layout", v.LAYOUTS_ROTARY) == "half"
    inverse = v.flag(inverse, "inverse")
    start = _check_cache_width(cos, x, "x", positions, rotary_start)
    index = _cache_index(cos, x.shape[:-1], positions, "x")
    out, in_place = v.output(out, "out", x.shape, x.dtype, may_be=(x,),
                             must_not_overlap=(cos, sin))
    v.indices_apart({"positions": index}, {"out": out})
    cos, sin = v.rotation_tables(cos, sin, x.dtype, "x")
    return rotate(x, _as_table(cos), _as_table(sin), index, half, inverse, out, in_place, start)


def apply_rotary_cos_sin_qk(q: ArrayLike, k: ArrayLike, cos: ArrayLike, sin: ArrayLike,
                            positions: ArrayLike | None = None, *,
                            layout: Literal["interleaved", "half"] = "half", inverse: bool = False,
                            rotary_start: int = 0, out_q: NDArray[np.floating[Any]] | None = None,
                            out_k: NDArray[np.floating[Any]] | None = None
                            ) -> tuple[NDArray[np.floating[Any]], NDArray[np.floating[Any]]]:
    """Rotate queries and keys with one cos/sin cache (see `apply_rotary_cos_sin`).

    Returns
    -------
    (q_rot, k_rot)
    """
    if positions is None and type(rotary_start) is int and 0 <= rotary_start < 1 << 62:
        fast = kernels.rotate_cos_sin_fast((q, k), cos, sin, layout, inverse, (out_q, out_k),
                                           rotary_start)
        if fast is not None:
            return fast
    q = v.float_array(q, "q")
    k = v.float_array(k, "k")
    if q.ndim < 1 or k.ndim < 1 or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have shapes (..., dim) with the same dim, "
                         f"got {q.shape} and {k.shape}")
    cos, sin = _cache_tables(cos, sin)
    half = v.choice(layout, "layout", v.LAYOUTS_ROTARY) == "half"
    inverse = v.flag(inverse, "inverse")
    start = _check_cache_width(cos, q, "q", positions, rotary_start)
    q_index = _cache_index(cos, q.shape[:-1], positions, "q")
    k_index = _cache_index(cos, k.shape[:-1], positions, "k")
    out_q, q_in_place = v.output(out_q, "out_q", q.shape, q.dtype, may_be=(q,),
                                 must_not_overlap=(k, cos, sin))
    out_k, k_in_place = v.output(out_k, "out_k", k.shape, k.dtype, may_be=(k,),
                                 must_not_overlap=(q, out_q, cos, sin))
    for index in (q_index, k_index):
        v.indices_apart({"positions": index}, {"out_q": out_q, "out_k": out_k})
    q_cos, q_sin = v.rotation_tables(cos, sin, q.dtype, "q")
    k_cos, k_sin = v.rotation_tables(cos, sin, k.dtype, "k")
    return (rotate(q, _as_table(q_cos), _as_table(q_sin), q_index, half, inverse, out_q,
                    q_in_place, start),
            rotate(k, _as_table(k_cos), _as_table(k_sin), k_index, half, inverse, out_k,
                    k_in_place, start))
