"""Rotate-and-write into a paged KV cache: the checks and the kernel call.

`RotaryEmbedding.apply_qk_to_cache` first tries its compiled fast path
(``_core.apply_qk_to_cache_fast``: every check in C, positions covered by the
embedding's cos/sin cache).  Anything else comes here: every argument is
validated before the kernel (``_core.rotate_into_kv_cache``) writes anything.
"""

from typing import NamedTuple

import numpy as np

from . import _validate as v
from ._dispatch import kernels
from ._qk_norm import norm_args, norm_weight
from ._rows import RowOutput


class CacheCall(NamedTuple):
    """A validated call: C-contiguous inputs, caches by their strides, where the results go."""

    q: np.ndarray         # (tokens, heads, dim)
    k: np.ndarray         # (tokens, kv_heads, dim)
    v: np.ndarray
    k_cache: np.ndarray   # (num_blocks, block_size, kv_heads, dim)
    v_cache: np.ndarray
    positions: np.ndarray  # integers (tokens,), as given
    slots: np.ndarray     # int64 (tokens,)
    out: RowOutput        # q's result


def _token_array(x, name: str, dim: int) -> np.ndarray:
    x = v.float_array(x, name)
    if x.ndim != 3 or x.shape[2] != dim:
        raise ValueError(f"{name} must have shape (tokens, heads, {dim}), got {x.shape}")
    return x


def _kv_cache(cache, name: str, kv_heads: int, dim: int) -> np.ndarray:
    if not isinstance(cache, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray (written in place), "
                        f"got {type(cache).__name__}")
    if cache.dtype not in v.FLOAT_DTYPES:  # a non-native one too: converting would lose writes
        raise TypeError(f"{name} must be a native {v.FLOAT_NAMES} array, got dtype {cache.dtype}")
    if cache.ndim != 4 or cache.shape[2:] != (kv_heads, dim):
        raise ValueError(f"{name} must have shape (num_blocks, block_size, {kv_heads}, {dim}) "
                         f"(kv_heads, head_dim of k), got {cache.shape}")
    if not cache.flags.writeable or not cache.flags.aligned:
        raise ValueError(f"{name} must be writeable and aligned")
    if not slot_strides_apart(cache):
        raise ValueError(f"{name} must hold each (block, offset, head) row in its own "
                         f"contiguous memory (strides >= 0, rows of unit stride, no two rows "
                         f"overlapping), got strides {cache.strides}")
    return cache


def slot_strides_apart(cache: np.ndarray) -> bool:
    """True when a (num_blocks, block_size, kv_heads, dim) view has contiguous rows and
    outer strides that place every row apart (any order of the three: vLLM's flash
    layout, blocks-first, a half of one key/value tensor)."""
    if cache.size == 0 or cache.flags.c_contiguous:
        return True
    if cache.shape[3] > 1 and cache.strides[3] != cache.itemsize:
        return False
    inner = cache.shape[3] * cache.itemsize
    for extent, stride in sorted(zip(cache.shape[:3], cache.strides[:3]), key=lambda a: a[1]):
        if stride < 0:
            return False
        if extent > 1:
            if stride < inner:
                return False
            inner = stride * extent
    return True


def token_indices(values, name: str, ntokens: int) -> np.ndarray:
    """`values` checked as integers of shape (ntokens,); returned as given."""
    values = v.integer_array(values, name)
    if values.shape != (ntokens,):
        raise ValueError(f"{name} must have shape (tokens,) = ({ntokens},), got {values.shape}")
    return values


def _slots(slot_mapping, ntokens: int, num_slots: int) -> np.ndarray:
    slots = token_indices(slot_mapping, "slot_mapping", ntokens)
    if ntokens and (int(slots.min()) < -1 or int(slots.max()) >= num_slots):
        raise ValueError(f"slot_mapping must hold -1 (skip the token) or slots in [0, "
                         f"{num_slots}) (num_blocks * block_size), got values from "
                         f"{int(slots.min())} to {int(slots.max())}")
    used = np.sort(slots[slots >= 0])
    repeated = used[1:][used[1:] == used[:-1]]
    if repeated.size:
        raise ValueError(f"slot_mapping uses slot {int(repeated[0])} more than once: every "
                         f"token needs its own slot (-1 skips a token)")
    return slots


class Names(NamedTuple):
    """The caller's names of the arrays, for the messages."""

    q: str = "q"
    k: str = "k"
    v: str = "v"
    k_cache: str = "k_cache"
    v_cache: str = "v_cache"
    out_q: str = "out_q"


def check_call(q, k, v_, positions, k_cache, v_cache, slot_mapping, out_q, dim: int,
               extra_inputs: dict | None = None, names: Names = Names()) -> CacheCall:
    """Validate a rotate-and-write call (`extra_inputs`: other arrays it reads, by name)."""
    n = names
    q = _token_array(q, n.q, dim)
    k = _token_array(k, n.k, dim)
    v_ = _token_array(v_, n.v, dim)
    ntokens, kv_heads = q.shape[0], k.shape[1]
    if k.shape[0] != ntokens or v_.shape != k.shape:
        raise ValueError(f"{n.k} and {n.v} must have shape (tokens, kv_heads, dim) with {n.q}'s "
                         f"{ntokens} tokens, got {k.shape} and {v_.shape}")
    if not q.dtype == k.dtype == v_.dtype:
        raise TypeError(f"{n.q}, {n.k} and {n.v} must have one dtype, got {q.dtype}, {k.dtype}, {v_.dtype}")
    k_cache = _kv_cache(k_cache, n.k_cache, kv_heads, dim)
    v_cache = _kv_cache(v_cache, n.v_cache, kv_heads, dim)
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"{n.v_cache} must have {n.k_cache}'s shape {k_cache.shape}, got {v_cache.shape}")
    if v_cache.dtype != k_cache.dtype:
        raise TypeError(f"{n.v_cache} must have {n.k_cache}'s dtype {k_cache.dtype}, got {v_cache.dtype}")
    if k_cache.dtype != q.dtype and not (q.dtype == np.float32
                                         and k_cache.dtype in v.HALF_TYPES):
        raise TypeError(f"the caches must have {n.q}'s dtype {q.dtype} (or float16/bfloat16 for "
                        f"float32 {n.q}, {n.k}, {n.v}), got {k_cache.dtype}")
    positions = token_indices(positions, "positions", ntokens)
    slots = _slots(slot_mapping, ntokens, k_cache.shape[0] * k_cache.shape[1])
    inputs = {n.q: q, n.k: k, n.v: v_, "positions": positions, "slot_mapping": slots, **(extra_inputs or {})}
    if v.overlaps(k_cache, v_cache):
        raise ValueError(f"{n.k_cache} and {n.v_cache} share memory; pass two separate caches")
    for cache, name in ((k_cache, n.k_cache), (v_cache, n.v_cache)):
        for other, x in inputs.items():
            if v.overlaps(cache, x):
                raise ValueError(f"{name} shares memory with {other}, which the call reads")
    out_q, in_place = v.output(out_q, n.out_q, q.shape, q.dtype, may_be=(q,),
                               must_not_overlap=(k, v_, k_cache, v_cache))
    v.indices_apart({"positions": positions, "slot_mapping": slots}, {n.out_q: out_q})
    return CacheCall(q, np.ascontiguousarray(k), np.ascontiguousarray(v_), k_cache, v_cache,
                     positions, np.ascontiguousarray(slots, dtype=np.int64), RowOutput(q, out_q, in_place))


def write(call: CacheCall, rows: np.ndarray, cos: np.ndarray, sin: np.ndarray,
          half: bool, start: int = 0) -> np.ndarray:
    """Run the kernel: token t uses cos/sin row rows[t] (features from `start` on rotate);
    return q's result."""
    q_rows = call.out.x_rows.reshape(call.q.shape)
    kernels.rotate_into_kv_cache(q_rows, call.out.rows.reshape(call.q.shape), call.k, call.v,
                                 call.k_cache, call.v_cache, call.slots, rows, cos, sin, half,
                                 start)
    return call.out.result()


def write_normed(call: CacheCall, rows: np.ndarray, cos: np.ndarray, sin: np.ndarray, half: bool,
                 start: int, weights: tuple, eps: float) -> np.ndarray:
    """As `write`, each q and k row RMSNormed by its weight (float64 factors) first: q to its
    result, k straight into its cache rows, v copied (cast to the cache dtype)."""
    kernels.norm_rotate_into_kv_cache(call.out.x_rows.reshape(call.q.shape), call.out.rows.reshape(call.q.shape),
                                      call.k, call.v, call.k_cache, call.v_cache, call.slots, rows, cos, sin,
                                      half, start, weights[0], weights[1], eps)
    return call.out.result()


def apply_qk_to_cache(rope, q, k, v_, positions, k_cache, v_cache, slot_mapping, out_q, qk_norm=None,
                      eps=1e-6, weight_offset=0.0):
    """RotaryEmbedding.apply_qk_to_cache (see its docstring)."""
    if rope.n_streams != 1:
        raise ValueError(f"apply_qk_to_cache takes one position per token; this embedding has "
                         f"{rope.n_streams} position streams (use apply_qk, then write the cache)")
    fast = kernels.apply_qk_to_cache_fast(rope, q, k, v_, positions, k_cache, v_cache, slot_mapping,
                                          out_q, qk_norm, eps, weight_offset)
    if fast is not None:
        return fast
    weights = _norm_weights(qk_norm, rope.dim, eps, weight_offset)
    call = check_call(q, k, v_, positions, k_cache, v_cache, slot_mapping, out_q, rope.dim)
    # A table of the call's distinct positions, exactly as `apply` builds one
    # (the frequencies of a dynamic scaling depend on the largest).
    distinct, rows = np.unique(v.positions_array(call.positions), return_inverse=True)
    cos, sin = rope._table(distinct, v.compute_dtype(call.q.dtype))
    rows = np.ascontiguousarray(rows.reshape(-1), dtype=np.int64)
    if weights is None:
        return write(call, rows, cos, sin, rope.layout == "half", rope.rotary_start)
    return write_normed(call, rows, cos, sin, rope.layout == "half", rope.rotary_start, *weights)


def _norm_weights(qk_norm, dim: int, eps, weight_offset) -> tuple | None:
    """((q factors, k factors), eps) of a ``qk_norm=(q_weight, k_weight)`` argument, checked; None
    for ``qk_norm=None`` (eps and weight_offset still checked: a bad value is an error unused)."""
    if qk_norm is None:
        norm_args(eps, weight_offset)
        return None
    if not isinstance(qk_norm, tuple) or len(qk_norm) != 2:
        raise TypeError(f"qk_norm must be a tuple (q_weight, k_weight) or None, got {type(qk_norm).__name__}")
    eps, weight_offset = norm_args(eps, weight_offset)
    return (norm_weight(qk_norm[0], "q_weight", dim, weight_offset),
            norm_weight(qk_norm[1], "k_weight", dim, weight_offset)), eps
