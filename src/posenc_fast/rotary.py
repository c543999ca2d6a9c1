"""Rotary position embedding (RoPE): RotaryEmbedding, apply_rotary and the cos/sin entry points.

Every call reduces to the same two kernels: a cos/sin table with one row per
distinct position (float64 angles, rounded once to the data's dtype, the
attention factor folded in), and a rotation of every row of x by the table
row its position maps to.  ``RotaryEmbedding.apply``/``apply_qk`` first try
their compiled fast path (``_core.RotaryFastPath``, with a per-instance
table cache); everything else takes the general versions below.  Scaling methods only change the frequencies and the
factor (see ``_frequencies``), never the kernels.
"""

import functools
import math
import os
import sys
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from . import _validate as v
from ._dispatch import kernels
from ._frequencies import resolve_rope_scaling
from ._rows import RowOutput, cos_sin_table, row_index, row_table
from ._threads import threads_for


def _data(x: ArrayLike, name: str, dim: int) -> np.ndarray:
    x = v.float_array(x, name)
    if x.ndim < 1 or x.shape[-1] != dim:
        raise ValueError(f"{name} must have shape (..., {dim}) (last axis = dim), got {x.shape}")
    return x


def _call_positions(lead: tuple[int, ...], positions: ArrayLike | None, offset: float,
                    seq_axis: int, name: str = "x"
                    ) -> tuple[NDArray[np.float64], tuple[int, ...]]:
    """Positions of one call: (float64 values, their index shape against `lead`)."""
    if positions is None:
        if not lead:
            raise ValueError(f"{name} has no sequence axis (shape (dim,)); pass positions")
        axis = v.seq_axis_index(seq_axis, len(lead) + 1)
        values = v.with_offset(np.arange(lead[axis], dtype=np.float64), offset)
        return values, (lead[axis],) + (1,) * (len(lead) - 1 - axis)
    values = v.with_offset(v.positions_array(positions), offset)
    v.broadcast_target(values.shape, lead, "positions", f"{name}.shape[:-1]")
    return values, values.shape


def _length_with_base_frequencies(frequencies) -> int:
    # The largest seq_len whose calls use frequencies.inv_freq: unbounded unless
    # the method depends on the length (dynamic NTK, LongRoPE).
    if not math.isfinite(float(np.abs(frequencies.inv_freq).max()) * 2.0**62):
        return 0  # absurd frequencies: let the general path check every angle
    if not frequencies.depends_on_length:
        return 2**62
    length = int(frequencies.params["original_max_position_embeddings"])
    same = np.array_equal(frequencies.inv_freq_for(length), frequencies.inv_freq)
    return length if same else 0


def _seq_len(values: np.ndarray) -> int:
    # "max(positions) + 1" of the call, at least 1.
    return max(1, math.floor(values.max()) + 1) if values.size else 1


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, index: np.ndarray, half: bool,
            inverse: bool, out: np.ndarray | None, in_place: bool) -> np.ndarray:
    # index: for each row of x (C order), the cos/sin row it uses.
    rows = RowOutput(x, out, in_place)
    kernels.rotate_rows(rows.x_rows, rows.rows, cos, sin, index, half, inverse,
                        threads_for(x.size))
    return rows.result()


class RotaryEmbedding:
    """Rotary position embedding for query/key arrays of head dimension `dim`.

    Pair ``i`` at position ``p`` is rotated by ``theta = p * inv_freq[i]``:
    ``(a, b) -> (a*cos - b*sin, a*sin + b*cos)``, then scaled by
    ``attention_factor``.  Angles are formed in float64.

    Parameters
    ----------
    dim : int
        Head dimension: the last axis of the arrays it rotates.
    base : float, optional
        ``inv_freq[i] = base ** (-2*i/rotary_dim)`` before scaling (Hugging
        Face's ``rope_theta``).
    rotary_dim : int, optional
        How many leading features rotate: even, ``2 <= rotary_dim <= dim``;
        default `dim`, which must then be even.  Features past it pass
        through unchanged (partial rotary, GPT-NeoX/Phi).
    layout : {"interleaved", "half"}, optional
        ``"interleaved"``: pair ``i`` is ``(x[2i], x[2i+1])`` (GPT-J, Meta
        Llama, llama.cpp normal).  ``"half"``: pair ``i`` is ``(x[i],
        x[i + rotary_dim/2])`` (GPT-NeoX, Hugging Face ``rotate_half``).
    scaling : dict, optional
        Hugging Face ``rope_scaling`` vocabulary: ``{"rope_type": "linear",
        "factor": 4.0}`` etc.; see the README for every method.

    Examples
    --------
    >>> import numpy as np, posenc_fast as pf
    >>> rope = pf.RotaryEmbedding(64, layout="half")
    >>> q = np.ones((1, 4, 10, 64), np.float32)
    >>> rope.apply(q).shape
    (1, 4, 10, 64)
    """

    def __init__(self, dim: int, *, base: float = 10000.0, rotary_dim: int | None = None,
                 layout: Literal["interleaved", "half"] = "interleaved",
                 scaling: Mapping[str, Any] | None = None) -> None:
        dim = v.integer(dim, "dim", minimum=1)
        if dim > sys.maxsize:  # no array has such an axis (and the fast path keeps a C size)
            raise ValueError(f"dim must be <= {sys.maxsize} (2**63 - 1), got {dim}")
        if rotary_dim is None:
            if dim % 2:
                raise ValueError(f"dim must be even when rotary_dim is not given, got {dim}")
            rotary_dim = dim
        rotary_dim = v.rotary_dim(rotary_dim, dim)
        base = v.real(base, "base", positive=True)
        layout = v.choice(layout, "layout", v.LAYOUTS_ROTARY)
        v.mapping_or_none(scaling, "scaling")
        self._dim = dim
        self._rotary_dim = rotary_dim
        self._base = base
        self._layout = layout
        self._frequencies = resolve_rope_scaling(None if scaling is None else dict(scaling),
                                                 rotary_dim=rotary_dim, base=base)
        self._fast = kernels.RotaryFastPath(dim, rotary_dim, layout == "half",
                                            self._frequencies.inv_freq,
                                            float(self._frequencies.attention_factor),
                                            _length_with_base_frequencies(self._frequencies))

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | str | os.PathLike[str], *,
                       layer_type: str | None = None,
                       layout: Literal["interleaved", "half"] | None = None) -> "RotaryEmbedding":
        """Build the rotary embedding a Hugging Face model config describes.

        Parameters
        ----------
        config : dict or str or os.PathLike or transformers config
            A parsed ``config.json``, its path, or a transformers config
            object.  Read as transformers' own configuration class and
            modeling code for its ``model_type`` read it (head_dim, partial
            rotary, ``rope_theta``/``rope_scaling`` or ``rope_parameters``,
            pair layout; the text model's part of a composite config).
        layer_type : str, optional
            Which layer type's RoPE, for configs with one per layer type
            (Gemma 3: ``"full_attention"`` or ``"sliding_attention"``).
        layout : {"interleaved", "half"}, optional
            Pair layout of a ``model_type`` posenc_fast has no rule for
            (refused without it: never a guess).

        Returns
        -------
        RotaryEmbedding

        Examples
        --------
        >>> import posenc_fast as pf
        >>> config = {"model_type": "gemma3_text", "head_dim": 256, "rope_theta": 1e6,
        ...           "rope_local_base_freq": 1e4}
        >>> pf.RotaryEmbedding.from_hf_config(config, layer_type="sliding_attention").base
        10000.0
        """
        from ._hf_config import rotary_kwargs_from_hf_config

        kwargs = rotary_kwargs_from_hf_config(config, layer_type=layer_type, layout=layout)
        return cls(kwargs.pop("dim"), **kwargs)

    dim = property(lambda self: self._dim, doc="Head dimension (last axis of x).")
    rotary_dim = property(lambda self: self._rotary_dim, doc="Leading features that rotate.")
    layout = property(lambda self: self._layout, doc='"interleaved" or "half".')
    base = property(lambda self: self._base, doc="Frequency base (rope_theta).")
    inv_freq = property(lambda self: self._frequencies.inv_freq,
                        doc="float64 (rotary_dim//2,) frequencies, read-only.")
    attention_factor = property(lambda self: float(self._frequencies.attention_factor),
                                doc="Factor multiplying the rotated features (1.0 unless scaled).")

    @property
    def scaling(self) -> dict[str, Any] | None:
        """The scaling dict (a copy), or None."""
        params = self._frequencies.params
        return None if params is None else dict(params)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._dim, self._base, self._rotary_dim, self._layout, self.scaling))

    def __repr__(self) -> str:
        return (f"RotaryEmbedding({self._dim}, base={self._base!r}, rotary_dim={self._rotary_dim}, "
                f"layout={self._layout!r}, scaling={self.scaling!r})")

    def inv_freq_for(self, seq_len: int) -> NDArray[np.float64]:
        """Frequencies a call with ``max(positions) + 1 == seq_len`` uses (float64, read-only)."""
        return self._frequencies.inv_freq_for(v.integer(seq_len, "seq_len", minimum=1))

    def _table(self, values: NDArray[np.float64], dtype: np.dtype[Any], inverse: bool = False
               ) -> tuple[np.ndarray, np.ndarray]:
        seq_len = _seq_len(values)
        freqs = self._frequencies.inv_freq_for(seq_len)
        factor = float(self._frequencies.attention_factor_for(seq_len))
        return cos_sin_table(values.reshape(-1), freqs, 1.0 / factor if inverse else factor,
                             dtype)

    def apply(self, x: ArrayLike, positions: ArrayLike | None = None, *, offset: float = 0,
              seq_axis: int = -2, inverse: bool = False,
              out: NDArray[np.floating[Any]] | None = None) -> NDArray[np.floating[Any]]:
        """Rotate the pairs of `x` by their positions.

        Parameters
        ----------
        x : ndarray of shape (..., dim), float16, bfloat16, float32 or float64
            Queries or keys (never values).  Half types are computed in
            float32 (cos/sin in float32 from the float64 angles) and rounded
            once.
        positions : array_like of real numbers, optional
            Broadcasts against ``x.shape[:-1]``: ``(seq,)``, ``(batch, 1,
            seq)``, ``(tokens, 1)`` for ``(tokens, heads, dim)``, or a scalar.
            Default ``arange(n)`` laid along `seq_axis`.
        offset : float, optional
            Added to every position (the KV-cache length when decoding).
        seq_axis : int, optional
            The sequence axis when `positions` is None: -2 for ``(batch,
            heads, seq, dim)``, -3 for ``(batch, seq, heads, dim)``.
        inverse : bool, optional
            Rotate by ``-theta`` and divide by the attention factor.
        out : ndarray of x's shape and dtype, optional
            May be `x` itself (in place).

        Returns
        -------
        ndarray of x's shape and dtype
        """
        result = self._fast.apply(x, positions, offset, seq_axis, inverse, out)
        if result is None:
            result = self._apply_general(x, positions, offset, seq_axis, inverse, out)
        return result

    def apply_qk(self, q: ArrayLike, k: ArrayLike, positions: ArrayLike | None = None, *,
                 offset: float = 0, seq_axis: int = -2, inverse: bool = False,
                 out_q: NDArray[np.floating[Any]] | None = None,
                 out_k: NDArray[np.floating[Any]] | None = None
                 ) -> tuple[NDArray[np.floating[Any]], NDArray[np.floating[Any]]]:
        """Rotate queries and keys with one cos/sin computation.

        `q` and `k` may have different head counts (grouped-query attention)
        and dtypes; their positions (explicit, or along `seq_axis`) must agree.
        Arguments as in `apply`; `out_q` may be `q` and `out_k` may be `k`.

        Returns
        -------
        (q_rot, k_rot)
        """
        result = self._fast.apply_qk(q, k, positions, offset, seq_axis, inverse, out_q, out_k)
        if result is None:
            result = self._apply_qk_general(q, k, positions, offset, seq_axis, inverse, out_q,
                                            out_k)
        return result

    def _apply_general(self, x, positions, offset, seq_axis, inverse, out):
        x = _data(x, "x", self._dim)
        offset = v.real(offset, "offset")
        inverse = v.flag(inverse, "inverse")
        values, index_shape = _call_positions(x.shape[:-1], positions, offset, seq_axis)
        out, in_place = v.output(out, "out", x.shape, x.dtype, may_be=(x,))
        cos, sin = self._table(values, v.compute_dtype(x.dtype), inverse)
        return _rotate(x, cos, sin, row_table(index_shape, x.shape[:-1]),
                       self._layout == "half", inverse, out, in_place)

    def _apply_qk_general(self, q, k, positions, offset, seq_axis, inverse, out_q, out_k):
        q = _data(q, "q", self._dim)
        k = _data(k, "k", self._dim)
        offset = v.real(offset, "offset")
        inverse = v.flag(inverse, "inverse")
        values, q_index = _call_positions(q.shape[:-1], positions, offset, seq_axis, "q")
        if positions is None:
            k_values, k_index = _call_positions(k.shape[:-1], None, offset, seq_axis, "k")
            if k_values.shape != values.shape:
                raise ValueError(f"q and k must have the same length along seq_axis={seq_axis}, "
                                 f"got {values.shape[0]} and {k_values.shape[0]}")
        else:
            v.broadcast_target(values.shape, k.shape[:-1], "positions", "k.shape[:-1]")
            k_index = values.shape
        out_q, q_in_place = v.output(out_q, "out_q", q.shape, q.dtype, may_be=(q,),
                                     must_not_overlap=(k,))
        out_k, k_in_place = v.output(out_k, "out_k", k.shape, k.dtype, may_be=(k,),
                                     must_not_overlap=(q, out_q))
        half = self._layout == "half"
        q_table, k_table = v.compute_dtype(q.dtype), v.compute_dtype(k.dtype)
        q_cos, q_sin = self._table(values, q_table, inverse)
        k_cos, k_sin = (q_cos, q_sin) if k_table == q_table else self._table(values, k_table,
                                                                               inverse)
        q_rot = _rotate(q, q_cos, q_sin, row_table(q_index, q.shape[:-1]), half, inverse,
                        out_q, q_in_place)
        k_rot = _rotate(k, k_cos, k_sin, row_table(k_index, k.shape[:-1]), half, inverse,
                        out_k, k_in_place)
        return q_rot, k_rot

    def cos_sin(self, positions: ArrayLike, *, dtype: DTypeLike = np.float32,
                out: tuple[NDArray[np.floating[Any]], NDArray[np.floating[Any]]] | None = None
                ) -> tuple[NDArray[np.floating[Any]], NDArray[np.floating[Any]]]:
        """Return ``(cos, sin)`` of the rotation angles, attention factor applied.

        Parameters
        ----------
        positions : array_like of real numbers, any shape
        dtype : {np.float32, np.float64, np.float16, "bfloat16"}, optional
        out : tuple of two ndarrays, optional
            ``(cos, sin)`` to write, each of shape positions.shape +
            (rotary_dim//2,) and dtype `dtype` (as NumPy's ``out=`` of a
            function with two results, e.g. ``np.divmod``).

        Returns
        -------
        cos, sin : ndarrays of shape positions.shape + (rotary_dim//2,)
        """
        values = v.positions_array(positions)
        dtype = v.table_dtype(dtype)
        shape = values.shape + (self._rotary_dim // 2,)
        if out is not None:
            if not isinstance(out, tuple) or len(out) != 2:
                raise TypeError(f"out must be a tuple (cos, sin) of two arrays, got "
                                f"{type(out).__name__}")
            cos_out, _ = v.output(out[0], "out[0]", shape, dtype)
            sin_out, _ = v.output(out[1], "out[1]", shape, dtype, must_not_overlap=(cos_out,))
            out = (cos_out, sin_out)
        seq_len = _seq_len(values)
        cos, sin = cos_sin_table(values.reshape(-1), self._frequencies.inv_freq_for(seq_len),
                                 float(self._frequencies.attention_factor_for(seq_len)), dtype,
                                 None if out is None else (out[0].reshape(-1, shape[-1]),
                                                           out[1].reshape(-1, shape[-1])))
        if out is None:
            return cos.reshape(shape), sin.reshape(shape)
        for target, result in zip(out, (cos, sin)):
            if not np.shares_memory(target, result):
                np.copyto(target, result.reshape(shape))
        return out


def _rebuild(dim: int, base: float, rotary_dim: int, layout: Literal["interleaved", "half"],
             scaling: dict[str, Any] | None) -> RotaryEmbedding:
    # Unpickling: the same constructor call (the cos/sin cache is rebuilt on use).
    return RotaryEmbedding(dim, base=base, rotary_dim=rotary_dim, layout=layout, scaling=scaling)


def apply_rotary(x: ArrayLike, positions: ArrayLike | None = None, *, base: float = 10000.0,
                 interpolation_factor: float = 1.0,
                 layout: Literal["interleaved", "half"] = "interleaved",
                 rotary_dim: int | None = None, offset: float = 0, seq_axis: int = -2,
                 inverse: bool = False,
                 out: NDArray[np.floating[Any]] | None = None) -> NDArray[np.floating[Any]]:
    """Rotate `x` in one call, without building a `RotaryEmbedding`.

    ``interpolation_factor`` (>= 1) is linear position interpolation:
    positions are divided by it (``inv_freq / factor``).  Other arguments as in
    `RotaryEmbedding` and `RotaryEmbedding.apply`; ``dim`` is
    ``x.shape[-1]``.

    Examples
    --------
    >>> import numpy as np, posenc_fast as pf
    >>> x = np.ones((2, 8, 16), np.float32)
    >>> y = pf.apply_rotary(x, layout="half", offset=100)
    """
    x = v.float_array(x, "x")
    if x.ndim < 1:
        raise ValueError(f"x must have shape (..., dim), got {x.shape}")
    factor = v.real(interpolation_factor, "interpolation_factor", minimum=1.0)
    # Checked here first: the embedding cache below needs hashable arguments.
    base = v.real(base, "base", positive=True)
    layout = v.choice(layout, "layout", v.LAYOUTS_ROTARY)
    rotary_dim = None if rotary_dim is None else v.integer(rotary_dim, "rotary_dim")
    rope = _shortcut_embedding(x.shape[-1], base, rotary_dim, layout, factor)
    return rope.apply(x, positions, offset=offset, seq_axis=seq_axis, inverse=inverse, out=out)


@functools.lru_cache(maxsize=32)
def _shortcut_embedding(dim, base, rotary_dim, layout, factor) -> RotaryEmbedding:
    # apply_rotary reuses embeddings (and their cos/sin caches) across calls.
    scaling = None if factor == 1.0 else {"rope_type": "linear", "factor": factor}
    return RotaryEmbedding(dim, base=base, rotary_dim=rotary_dim, layout=layout, scaling=scaling)


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


def _check_cache_width(cos: np.ndarray, x: np.ndarray, name: str, positions) -> None:
    if positions is not None and cos.ndim != 2:
        raise ValueError(f"with positions, cos and sin must be 2-D tables (n, rotary_dim/2), "
                         f"got shape {cos.shape}")
    if 2 * cos.shape[-1] > x.shape[-1]:
        raise ValueError(f"cos/sin have {cos.shape[-1]} entries per row, so rotary_dim = "
                         f"{2 * cos.shape[-1]}, which exceeds {name}.shape[-1] = {x.shape[-1]}; "
                         f"pass one entry per pair (e.g. cos[..., :dim//2] of a full-width "
                         f"Hugging Face cache)")


def apply_rotary_cos_sin(x: ArrayLike, cos: ArrayLike, sin: ArrayLike,
                         positions: ArrayLike | None = None, *,
                         layout: Literal["interleaved", "half"] = "half", inverse: bool = False,
                         out: NDArray[np.floating[Any]] | None = None
                         ) -> NDArray[np.floating[Any]]:
    """Rotate `x` with a cos/sin cache the caller already holds.

    Parameters
    ----------
    x : ndarray of shape (..., dim), float16, bfloat16, float32 or float64
    cos, sin : ndarrays of equal shape
        float32 or float64 (float16/bfloat16 widened to float32); for
        float16/bfloat16 `x`, float32 or x's own dtype.
        One entry per pair along the last axis (``r/2`` entries rotate the
        first ``r`` features; the rest pass through).  Used as given: no
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
    if positions is None:
        fast = kernels.rotate_cos_sin_fast((x,), cos, sin, layout, inverse, (out,))
        if fast is not None:
            return fast[0]
    x = v.float_array(x, "x")
    if x.ndim < 1:
        raise ValueError(f"x must have shape (..., dim), got {x.shape}")
    cos, sin = _cache_tables(cos, sin)
    half = v.choice(layout, "layout", v.LAYOUTS_ROTARY) == "half"
    inverse = v.flag(inverse, "inverse")
    _check_cache_width(cos, x, "x", positions)
    index = _cache_index(cos, x.shape[:-1], positions, "x")
    out, in_place = v.output(out, "out", x.shape, x.dtype, may_be=(x,),
                             must_not_overlap=(cos, sin))
    cos, sin = v.rotation_tables(cos, sin, x.dtype, "x")
    return _rotate(x, _as_table(cos), _as_table(sin), index, half, inverse, out, in_place)


def apply_rotary_cos_sin_qk(q: ArrayLike, k: ArrayLike, cos: ArrayLike, sin: ArrayLike,
                            positions: ArrayLike | None = None, *,
                            layout: Literal["interleaved", "half"] = "half", inverse: bool = False,
                            out_q: NDArray[np.floating[Any]] | None = None,
                            out_k: NDArray[np.floating[Any]] | None = None
                            ) -> tuple[NDArray[np.floating[Any]], NDArray[np.floating[Any]]]:
    """Rotate queries and keys with one cos/sin cache (see `apply_rotary_cos_sin`).

    Returns
    -------
    (q_rot, k_rot)
    """
    if positions is None:
        fast = kernels.rotate_cos_sin_fast((q, k), cos, sin, layout, inverse, (out_q, out_k))
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
    _check_cache_width(cos, q, "q", positions)
    q_index = _cache_index(cos, q.shape[:-1], positions, "q")
    k_index = _cache_index(cos, k.shape[:-1], positions, "k")
    out_q, q_in_place = v.output(out_q, "out_q", q.shape, q.dtype, may_be=(q,),
                                 must_not_overlap=(k, cos, sin))
    out_k, k_in_place = v.output(out_k, "out_k", k.shape, k.dtype, may_be=(k,),
                                 must_not_overlap=(q, out_q, cos, sin))
    q_cos, q_sin = v.rotation_tables(cos, sin, q.dtype, "q")
    k_cos, k_sin = v.rotation_tables(cos, sin, k.dtype, "k")
    return (_rotate(q, _as_table(q_cos), _as_table(q_sin), q_index, half, inverse, out_q,
                    q_in_place),
            _rotate(k, _as_table(k_cos), _as_table(k_sin), k_index, half, inverse, out_k,
                    k_in_place))
