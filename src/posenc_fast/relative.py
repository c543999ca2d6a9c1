"""Relative position schemes: ALiBi (BLOOM, MPT), Shaw's clipped distances, T5 buckets.

These do not touch the token embeddings; they give each (query, key) pair a
value that depends only on the distance ``k_pos - q_pos``: an additive bias
on the attention scores (ALiBi) or an integer bucket that indexes a learned
table (Shaw et al., T5).  This module checks the arguments and allocates;
the loops over ``(q_len, k_len)`` are in ``_core_relative.pxi`` (part of the compiled layer).

Positions: query ``i`` sits at ``q_pos = offset + i`` and key ``j`` at
``k_pos = j``.  ``k_len`` defaults to ``offset + q_len``: the keys are the
``offset`` cached tokens followed by the ``q_len`` new ones, so the last
query lines up with the last key (self-attention with or without a KV cache,
and the bottom-right corner MPT and BLOOM slice from a longer bias).
"""

import functools
from typing import Any
import math

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from . import _validate as v
from ._dispatch import kernels
from ._rows import RowOutput
from ._threads import threads_for

# Every position and distance must be exact in float64 (ALiBi forms
# slope * d in double): offsets up to 2**52 leave room for any array length.
MAX_OFFSET = 2**52
# Bucket counts and distances past this are certainly mistakes; the bound
# keeps the int64 arithmetic of the kernels far from overflow.
MAX_BUCKET_ARGUMENT = 2**52


def _offset(offset) -> int:
    offset = v.integer(offset, "offset")
    if abs(offset) > MAX_OFFSET:
        raise ValueError(f"offset must lie in [-2**52, 2**52], got {offset}")
    return offset


def _lengths(q_len, k_len, offset: int) -> tuple[int, int]:
    # Lengths up to 2**52, as offsets: every position exact in float64, and the kernels' int64
    # arithmetic far from overflow (an empty result can have a longer axis than any array holds).
    q_len = _length(q_len, "q_len")
    if k_len is None:
        k_len = offset + q_len
        if k_len < 0:
            raise ValueError(f"k_len defaults to offset + q_len = {offset} + {q_len} = {k_len}, "
                             f"which is negative; pass k_len explicitly")
        return q_len, k_len
    return q_len, _length(k_len, "k_len")


def _length(value, name: str) -> int:
    value = v.integer(value, name, minimum=0)
    if value > MAX_OFFSET:
        raise ValueError(f"{name} must be at most 2**52, got {value}")
    return value


@functools.lru_cache(maxsize=64)
def _slopes(num_heads: int) -> np.ndarray:
    # Exponents -8k/m with m a power of two are exact dyadic fractions, so
    # 2.0 ** x is exact where x is an integer and libm's pow otherwise.
    closest = 1 << (num_heads.bit_length() - 1)
    # Allocated first: an impossible head count fails at once, not after a long loop.
    result = v.empty(num_heads, np.float64, f"num_heads = {num_heads}")
    for h in range(closest):
        result[h] = 2.0 ** (-8 * (h + 1) / closest)
    for h in range(num_heads - closest):
        result[closest + h] = 2.0 ** (-8 * (2 * h + 1) / (2 * closest))
    result.flags.writeable = False
    return result


def alibi_slopes(num_heads: int) -> NDArray[np.float64]:
    """Return the ALiBi slope of every head (Press et al., 2022; BLOOM).

    For a power of two ``n`` the slopes are ``2**(-8*(h+1)/n)``, ``h = 0 ..
    n-1``.  Other head counts take the ``n`` slopes of the closest lower power
    of two ``n``, followed by every other slope of ``2n`` (``2**(-8*(2h+1)/(2n))``)
    for the remaining heads, as BLOOM's ``build_alibi_tensor`` does.

    Each slope is ``2.0 ** x`` in float64: exact where ``x`` is an integer,
    libm's correctly rounded (or within an ulp) power otherwise.  BLOOM
    raises a float32-rounded base to integer powers in float32, so its slopes
    differ from these by up to about 1e-6 relative for large head counts.
    MPT's ``build_mpt_alibi_tensor`` gives the same slopes in the same order
    (in float32).

    Parameters
    ----------
    num_heads : int
        Number of attention heads, >= 1.

    Returns
    -------
    ndarray of shape (num_heads,), float64

    Examples
    --------
    >>> from posenc_fast.relative import alibi_slopes
    >>> alibi_slopes(8)
    array([0.5       , 0.25      , 0.125     , 0.0625    , 0.03125   ,
           0.015625  , 0.0078125 , 0.00390625])
    >>> alibi_slopes(12)[8:]
    array([0.70710678, 0.35355339, 0.1767767 , 0.08838835])
    """
    return _slopes(v.integer(num_heads, "num_heads", minimum=1)).copy()


def alibi_bias(num_heads: int, q_len: int, k_len: int | None = None, *, offset: int = 0,
               causal: bool = True, dtype: DTypeLike = np.float32,
               out: NDArray[np.floating[Any]] | None = None) -> NDArray[np.floating[Any]]:
    """Return the ALiBi attention bias ``-slope_h * (q_pos - k_pos)`` for every head.

    Query ``i`` sits at ``q_pos = offset + i``, key ``j`` at ``k_pos = j``.
    With ``causal=True`` the bias is ``-slope_h * (q_pos - k_pos)``: 0 on the
    diagonal, falling by ``slope_h`` per step into the past.  Future keys
    (``k_pos > q_pos``) get the same formula, a positive bias; a causal model
    masks them anyway, so the values there do not matter.  (BLOOM adds
    ``slope_h * k_pos`` instead, which differs from this by ``slope_h * q_pos``
    in each row; softmax cancels a per-row constant, so the attention is the
    same.)  With ``causal=False`` (bidirectional attention) the bias is
    ``-slope_h * |q_pos - k_pos|``, symmetric about the diagonal.

    The product is formed in float64 and rounded once to `dtype`.

    Parameters
    ----------
    num_heads : int
        >= 1; the slopes are `alibi_slopes(num_heads)`.
    q_len : int
        Number of queries, >= 0.
    k_len : int, optional
        Number of keys, >= 0.  Default ``offset + q_len``: the keys are the
        ``offset`` tokens of a KV cache followed by the ``q_len`` queries
        themselves, so the last query and the last key are the same position.
    offset : int, optional
        Position of the first query, in ``[-2**52, 2**52]``.
    causal : bool, optional
    dtype : {np.float32, np.float64, np.float16, "bfloat16"}, optional
    out : ndarray of shape (num_heads, q_len, k_len), optional
        Written and returned; `dtype` must match it.

    Returns
    -------
    ndarray of shape (num_heads, q_len, k_len)

    Examples
    --------
    >>> from posenc_fast.relative import alibi_bias
    >>> alibi_bias(4, 3)[0]  # head 0 of 4: slope 1/4
    array([[ 0.  ,  0.25,  0.5 ],
           [-0.25,  0.  ,  0.25],
           [-0.5 , -0.25,  0.  ]], dtype=float32)
    >>> alibi_bias(4, 1, offset=3, causal=False)[1]  # one query after 3 cached keys
    array([[-0.1875, -0.125 , -0.0625,  0.    ]], dtype=float32)
    """
    num_heads = v.integer(num_heads, "num_heads", minimum=1)
    offset = _offset(offset)
    q_len, k_len = _lengths(q_len, k_len, offset)
    causal = v.flag(causal, "causal")
    dtype = v.table_dtype(dtype)
    shape = (num_heads, q_len, k_len)
    out, _ = v.output(out, "out", shape, dtype)
    if out is None or not out.flags.c_contiguous:
        target = v.empty(shape, dtype, "num_heads, q_len and k_len")
    else:
        target = out
    if target.size:  # (no slopes for an empty result: num_heads may be huge)
        kernels.alibi_fill_rows(target.reshape(num_heads * q_len, k_len), _slopes(num_heads),
                                q_len, offset, causal, threads_for(target.size))
    if out is None:
        return target
    if target is not out:
        np.copyto(out, target)
    return out


def add_alibi(scores: ArrayLike, *, offset: int = 0, causal: bool = True,
              out: NDArray[np.floating[Any]] | None = None) -> NDArray[np.floating[Any]]:
    """Return ``scores + alibi_bias(heads, q_len, k_len, offset=offset, causal=causal)``.

    One pass over `scores`: each bias value is computed where it is added
    (no bias array is built), the sum formed in float64 and rounded once to
    the dtype of `scores`.  Large arrays are split over threads by rows.

    Parameters
    ----------
    scores : ndarray of shape (..., heads, q_len, k_len), float16, bfloat16, float32 or float64
        Attention scores (``q @ k.T / sqrt(d)``).  The head count is
        ``scores.shape[-3]``, and head ``h`` gets slope ``alibi_slopes(heads)[h]``.
        Leading axes (batch) share the bias.  Any strides (a non-contiguous
        array is copied first).
    offset : int, optional
        Position of the first query; key ``j`` is at position ``j``.  For a
        decode step with a KV cache of ``n`` tokens, ``k_len = n + q_len`` and
        ``offset = n``.
    causal : bool, optional
        As in `alibi_bias`.
    out : ndarray of the shape and dtype of scores, optional
        May be `scores` itself (in place).

    Returns
    -------
    ndarray of the shape and dtype of scores

    Examples
    --------
    >>> import numpy as np
    >>> from posenc_fast.relative import add_alibi
    >>> scores = np.zeros((1, 4, 2, 3), np.float32)  # (batch, heads, q_len, k_len)
    >>> add_alibi(scores, offset=1, out=scores)[0, 0]
    array([[-0.25,  0.  ,  0.25],
           [-0.5 , -0.25,  0.  ]], dtype=float32)
    """
    scores = v.float_array(scores, "scores", ("heads", "q_len", "k_len"))
    offset = _offset(offset)
    causal = v.flag(causal, "causal")
    out, in_place = v.output(out, "out", scores.shape, scores.dtype, may_be=(scores,))
    heads, q_len = scores.shape[-3:-1]
    rows = RowOutput(scores, out, in_place)  # first: a broadcast view may claim huge heads
    slopes = _slopes(heads) if scores.size else np.empty(0)
    kernels.alibi_add_rows(rows.x_rows, rows.rows, slopes, q_len, offset, causal,
                             threads_for(scores.size))
    return rows.result()


def relative_position_index(q_len: int, k_len: int | None = None, *, max_distance: int,
                            offset: int = 0) -> NDArray[np.int64]:
    """Return Shaw et al.'s clipped relative positions ``clip(k_pos - q_pos, -k, k) + k``.

    Query ``i`` sits at ``q_pos = offset + i``, key ``j`` at ``k_pos = j``,
    and ``k = max_distance``.  The values lie in ``[0, 2k]`` (``2k + 1``
    learned relative embeddings), ``k`` on the diagonal; keys more than
    ``k`` positions away share the end buckets.

    Parameters
    ----------
    q_len : int
        Number of queries, >= 0.
    k_len : int, optional
        Number of keys, >= 0; default ``offset + q_len`` (as in `alibi_bias`).
    max_distance : int
        The clipping distance ``k``, in ``[0, 2**52]``.
    offset : int, optional
        Position of the first query, in ``[-2**52, 2**52]``.

    Returns
    -------
    ndarray of shape (q_len, k_len), int64

    Examples
    --------
    >>> from posenc_fast.relative import relative_position_index
    >>> relative_position_index(3, 5, max_distance=2)
    array([[2, 3, 4, 4, 4],
           [1, 2, 3, 4, 4],
           [0, 1, 2, 3, 4]])
    """
    offset = _offset(offset)
    q_len, k_len = _lengths(q_len, k_len, offset)
    max_distance = v.integer(max_distance, "max_distance", minimum=0)
    if max_distance > MAX_BUCKET_ARGUMENT:
        raise ValueError(f"max_distance must be <= 2**52, got {max_distance}")
    out, vector = _result_and_distances(q_len, k_len)
    kernels.clipped_vector(-(offset + q_len - 1), max_distance, vector)
    return _diagonal(vector, out)


def _result_and_distances(q_len: int, k_len: int) -> tuple[np.ndarray, np.ndarray]:
    # The (q_len, k_len) result, allocated first (a size NumPy cannot hold refused before any work), and one
    # entry per distance that occurs (see _core_relative.pxi; none for an empty result)
    out = v.empty((q_len, k_len), np.int64, "q_len and k_len")
    return out, np.empty(q_len + k_len - 1 if q_len and k_len else 0, dtype=np.int64)


def _diagonal(vector: np.ndarray, out: np.ndarray) -> np.ndarray:
    kernels.diagonal_rows(vector, out, threads_for(out.size))
    return out


def t5_relative_bucket(q_len: int, k_len: int | None = None, *, bidirectional: bool = True,
                       num_buckets: int = 32, max_distance: int = 128,
                       offset: int = 0) -> NDArray[np.int64]:
    """Return T5's relative-position bucket of every (query, key) pair.

    The relative position ``k_pos - q_pos`` (query ``i`` at ``offset + i``,
    key ``j`` at ``j``) is bucketed exactly as transformers'
    ``T5Attention._relative_position_bucket`` (Mesh TensorFlow): with
    ``bidirectional`` half of the buckets are for keys after the query; in
    each half (``n`` buckets), distances below ``max_exact = n // 2`` get a
    bucket each and larger ones share ``n - max_exact`` buckets spaced
    logarithmically up to `max_distance`, beyond which all distances share
    the last bucket.  Without ``bidirectional`` (causal decoders) every
    future key is in bucket 0.  The logarithm is taken in float32 as torch
    does, so buckets agree with transformers even where a boundary falls
    exactly on an integer distance.

    Parameters
    ----------
    q_len : int
        Number of queries, >= 0.
    k_len : int, optional
        Number of keys, >= 0; default ``offset + q_len`` (as in `alibi_bias`).
    bidirectional : bool, optional
        True for encoders (T5's ``not is_decoder``).
    num_buckets : int, optional
        Total number of buckets (T5's ``relative_attention_num_buckets``):
        >= 4 when bidirectional (2 per direction), >= 2 otherwise, so that
        ``max_exact >= 1``.
    max_distance : int, optional
        T5's ``relative_attention_max_distance``; must exceed ``max_exact``
        (``num_buckets // 4`` when bidirectional, else ``num_buckets // 2``),
        since the logarithmic buckets are scaled by
        ``log(max_distance / max_exact)``.
    offset : int, optional
        Position of the first query (T5's ``past_seen_tokens``), in
        ``[-2**52, 2**52]``.

    Returns
    -------
    ndarray of shape (q_len, k_len), int64, values in ``[0, num_buckets)``

    Examples
    --------
    >>> from posenc_fast.relative import t5_relative_bucket
    >>> t5_relative_bucket(1, 9, offset=4, num_buckets=8, max_distance=16)
    array([[2, 2, 2, 1, 0, 5, 6, 6, 6]])
    """
    offset = _offset(offset)
    q_len, k_len = _lengths(q_len, k_len, offset)
    bidirectional = v.flag(bidirectional, "bidirectional")
    minimum = 4 if bidirectional else 2
    num_buckets = v.integer(num_buckets, "num_buckets")
    if not minimum <= num_buckets <= MAX_BUCKET_ARGUMENT:
        raise ValueError(f"num_buckets must be >= {minimum} when bidirectional={bidirectional} "
                         f"(at least one exact bucket per direction) and <= 2**52, "
                         f"got {num_buckets}")
    max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    max_distance = v.integer(max_distance, "max_distance")
    if not max_exact < max_distance <= MAX_BUCKET_ARGUMENT:
        raise ValueError(f"max_distance must be > max_exact = {max_exact} (the exact buckets of "
                         f"num_buckets={num_buckets}, bidirectional={bidirectional}) and "
                         f"<= 2**52, got {max_distance}")
    # As transformers: Python's double log, used by torch as a float32 scalar.
    log_ratio = math.log(max_distance / max_exact)
    out, vector = _result_and_distances(q_len, k_len)
    kernels.t5_bucket_vector(-(offset + q_len - 1), bidirectional, num_buckets, log_ratio,
                               vector)
    return _diagonal(vector, out)
