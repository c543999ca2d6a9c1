"""Rotary position embedding (RoPE): RotaryEmbedding and apply_rotary.

Every call reduces to the same two kernels: a cos/sin table with one row per
distinct position (float64 angles, rounded once to the data's dtype, the
attention factor folded in), and a rotation of every row of x by the table
row its position maps to.  ``RotaryEmbedding.apply``/``apply_qk`` are the
methods of its compiled base class (``_core.RotaryBase``, with a per-instance
table cache): its fast path, else the general versions below.  Scaling
methods only change the frequencies and the factor (see ``_frequencies``),
never the kernels.  (``apply_rotary_cos_sin`` is in ``_cos_sin``.)
"""

import functools
import math
import os
import sys
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from . import _kv_cache, _qk_norm, _streams
from . import _validate as v
from ._dispatch import kernels
from ._frequencies import resolve_rope_scaling
from ._rows import cos_sin_table, rotate, row_table


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
    length = min(int(frequencies.params["original_max_position_embeddings"]), 2**62)
    same = np.array_equal(frequencies.inv_freq_for(length), frequencies.inv_freq)
    return length if same else 0


# The attributes RotaryEmbedding._setup sets: a pickle's constructor arguments stand for them
_SETUP_STATE = frozenset(("_dim", "_rotary_dim", "_start", "_base", "_layout", "_reverse", "_pair_streams",
                          "_axial", "_frequencies"))


def _seq_len(values: np.ndarray) -> int:
    # "max(positions) + 1" of the call, at least 1.
    return max(1, math.floor(values.max()) + 1) if values.size else 1


class RotaryEmbedding(kernels.RotaryBase):
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
        How many features rotate: even, ``2 <= rotary_dim <= dim``; default
        ``dim - rotary_start``, which must then be even.  The others pass
        through unchanged (partial rotary, GPT-NeoX/Phi).
    rotary_start : int, optional
        The first feature that rotates: features ``[rotary_start,
        rotary_start + rotary_dim)`` rotate (pair layout counted from it).
        Default 0; DeepSeek-V4 rotates the last 64 of 512 (``rotary_start=448``,
        vLLM's ``rope_dim_offset``).
    layout : {"interleaved", "half"}, optional
        ``"interleaved"``: pair ``i`` is ``(x[2i], x[2i+1])`` (GPT-J, Meta
        Llama, llama.cpp normal).  ``"half"``: pair ``i`` is ``(x[i],
        x[i + rotary_dim/2])`` (GPT-NeoX, Hugging Face ``rotate_half``).
    scaling : dict, optional
        Hugging Face ``rope_scaling`` vocabulary: ``{"rope_type": "linear",
        "factor": 4.0}`` etc.; see the README for every method.
    pair_streams : array_like of int, optional
        Several position streams per token (multimodal RoPE): pair ``i``
        rotates by the position of stream ``pair_streams[i]``, one entry per
        pair (``rotary_dim // 2``), streams ``0 .. n_streams-1`` all used.
        Or two rows: pair ``i``'s first feature takes the angle of stream
        ``pair_streams[0, i]``, its second ``pair_streams[1, i]``'s (HunYuan-VL;
        not a rotation where they differ: ``inverse=True`` is refused).
        Explicit positions then have a leading axis of size ``n_streams``
        (``positions[s]`` broadcasts against ``x.shape[:-1]``); without
        positions every stream is ``arange`` along `seq_axis`.
    mrope_section : sequence of int, optional
        Shorthand for `pair_streams`, summing to ``rotary_dim // 2``: the
        first ``mrope_section[0]`` pairs take stream 0, the next
        ``mrope_section[1]`` stream 1, ... (Qwen2/2.5-VL: ``[16, 24, 24]``,
        t/h/w).
    mrope_interleaved : bool, optional
        With a 3-entry `mrope_section`: Qwen3-VL's interleaved assignment
        (pairs 1, 4, 7, ... below ``3*mrope_section[1]`` take h, pairs 2, 5,
        8, ... below ``3*mrope_section[2]`` take w, the rest t).
    reverse : bool, optional
        Rotate by ``-theta`` (NanoChat, whose ``rotate_half`` is ``cat(x2,
        -x1)``): `inv_freq` is negated, so every path, cache and
        integration rotates the other way (bitwise the ``inverse=True``
        rotation of the same RoPE when ``attention_factor`` is 1).

    Examples
    --------
    >>> import numpy as np, posenc_fast as pf
    >>> rope = pf.RotaryEmbedding(64, layout="half")
    >>> q = np.ones((1, 4, 10, 64), np.float32)
    >>> rope.apply(q).shape
    (1, 4, 10, 64)
    >>> mrope = pf.RotaryEmbedding(128, layout="half", mrope_section=[16, 24, 24])
    >>> thw = np.stack([np.arange(10), np.arange(10) // 5, np.arange(10) % 5])
    >>> mrope.apply(q.repeat(2, -1), thw).shape
    (1, 4, 10, 128)
    """

    def __init__(self, dim: int, *, base: float = 10000.0, rotary_dim: int | None = None,
                 rotary_start: int = 0, layout: Literal["interleaved", "half"] = "interleaved",
                 scaling: Mapping[str, Any] | None = None, pair_streams: ArrayLike | None = None,
                 mrope_section: Any = None, mrope_interleaved: bool = False,
                 reverse: bool = False) -> None:
        self._setup(dim, base, rotary_dim, layout, scaling, pair_streams, mrope_section,
                    mrope_interleaved, axial=None, reverse=reverse, start=rotary_start)

    def _setup(self, dim, base, rotary_dim, layout, scaling, pair_streams, mrope_section,
               mrope_interleaved, axial, reverse=False, start=0):
        dim = v.integer(dim, "dim", minimum=1)
        if dim > sys.maxsize:  # no array has such an axis (and the fast path keeps a C size)
            raise ValueError(f"dim must be <= {sys.maxsize} (2**63 - 1), got {dim}")
        start = v.rotary_start(start, dim, 0)
        if rotary_dim is None:
            if (dim - start) % 2:
                what = f"dim - rotary_start = {dim} - {start}" if start else f"dim = {dim}"
                raise ValueError(f"dim must be even when rotary_dim is not given, got {what}")
            rotary_dim = dim - start
        rotary_dim = v.rotary_dim(rotary_dim, dim)
        start = v.rotary_start(start, dim, rotary_dim)
        base = v.real(base, "base", positive=True)
        layout = v.choice(layout, "layout", v.LAYOUTS_ROTARY)
        v.mapping_or_none(scaling, "scaling")
        reverse = v.flag(reverse, "reverse")
        streams = self._streams_of(rotary_dim // 2, pair_streams, mrope_section, mrope_interleaved, axial)
        # axial (an _streams.Axial): its width's frequencies, each pair's by _pair_frequencies
        frequencies = resolve_rope_scaling(
            None if scaling is None else dict(scaling),
            rotary_dim=rotary_dim if axial is None else axial.width(rotary_dim), base=base)
        valid_below = _length_with_base_frequencies(frequencies)
        # Every argument checked: only now does the state change (a second __init__ that fails leaves it whole)
        self._dim, self._rotary_dim, self._start, self._base, self._layout = dim, rotary_dim, start, base, layout
        self._reverse, self._pair_streams, self._axial, self._frequencies = reverse, streams, axial, frequencies
        self._init_rotary(dim, rotary_dim, start, layout == "half", self.inv_freq, float(frequencies.attention_factor),
                          valid_below, streams is not None)

    @staticmethod
    def _streams_of(npairs, pair_streams, mrope_section, mrope_interleaved, axial):
        mrope_interleaved = v.flag(mrope_interleaved, "mrope_interleaved")
        if pair_streams is not None and mrope_section is not None:
            raise ValueError("pass pair_streams or mrope_section, not both")
        if mrope_interleaved and mrope_section is None:
            raise ValueError("mrope_interleaved=True needs mrope_section")
        if axial is not None:
            return axial.streams(npairs)
        if mrope_section is None:
            return None if pair_streams is None else _streams.pair_streams_array(pair_streams, npairs)
        streams = (_streams.interleaved_streams if mrope_interleaved
                   else _streams.chunked_streams)(mrope_section, npairs)
        return _streams.pair_streams_array(streams, npairs, f"the pair streams of mrope_section={mrope_section!r}")

    @classmethod
    def axial(cls, dim: int, *, base: float = 10000.0, n_axes: int = 2,
              rotary_dim: int | None = None, layout: Literal["interleaved", "half"] = "half",
              axis_order: Any = None, pairs: Literal["blocks", "alternating"] = "blocks",
              frequencies: Literal["shared", "split"] = "shared") -> "RotaryEmbedding":
        """Axial RoPE of a vision tower: the head's pairs shared out among the axes of a patch.

        Each axis takes ``q = rotary_dim // (2*n_axes)`` pairs, a block: pairs
        ``b*q .. (b+1)*q - 1`` form block ``b`` (`pairs` ``"blocks"``), or pair
        ``j`` is in block ``j % n_axes`` (``"alternating"``).  Block ``b``'s
        ``k``-th pair rotates by the position along axis ``axis_order[b]``,
        frequency ``base ** (-2k / (rotary_dim/n_axes))`` (`frequencies`
        ``"shared"``: each axis a ``rotary_dim/n_axes`` RoPE's) or ``base **
        (-2(n_axes*k + b) / rotary_dim)`` (``"split"``: the ``rotary_dim``
        RoPE's, dealt to the blocks in turn; Pixtral).  The defaults are
        Qwen2-VL's and Qwen2.5-VL's vision rotary (h pairs then w pairs, half
        layout).  Positions have a leading axis of size `n_axes` (e.g. ``(2,
        patches)``: h, w; t, h, w for 3), whatever `axis_order`.

        Parameters
        ----------
        dim : int
            Head dimension.
        base : float, optional
        n_axes : int, optional
            2 for images.
        rotary_dim : int, optional
            Features that rotate, the leading ones (the rest pass through): a
            multiple of ``2 * n_axes``, default `dim`.
        layout : {"half", "interleaved"}, optional
            Pair layout, as in `RotaryEmbedding`.
        axis_order : sequence of int, optional
            The axis of each block, a permutation of ``range(n_axes)``;
            default ``0, 1, ...``; ``(1, 0)``: the w pairs first.
        pairs : {"blocks", "alternating"}, optional
        frequencies : {"shared", "split"}, optional

        Returns
        -------
        RotaryEmbedding

        Examples
        --------
        >>> import numpy as np, posenc_fast as pf
        >>> rope = pf.RotaryEmbedding.axial(80)
        >>> hw = np.stack(np.divmod(np.arange(16), 4))  # a 4x4 grid of patches
        >>> rope.apply(np.ones((16, 2, 80), np.float32), hw[:, :, None]).shape
        (16, 2, 80)
        """
        rotary_dim, spec = _streams.axial(dim, n_axes, rotary_dim, axis_order, pairs, frequencies)
        rope = cls.__new__(cls)
        rope._setup(dim, base, rotary_dim, layout, None, None, None, False, axial=spec)
        return rope

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | str | os.PathLike[str], *,
                       layer_type: str | None = None,
                       layout: Literal["interleaved", "half"] | None = None,
                       attention: Literal["main", "indexer"] = "main",
                       layer: int | None = None) -> "RotaryEmbedding":
        """Build the rotary embedding a Hugging Face model config describes.

        Parameters
        ----------
        config : dict or str or os.PathLike or transformers config
            A parsed ``config.json``, its path, or a transformers config
            object, read as transformers' configuration class and modeling
            code for its ``model_type`` read it (head_dim, partial rotary,
            ``rope_theta``/``rope_scaling`` or ``rope_parameters``, pair
            layout, a key left out as the class's default; the text part of
            a composite config; a vision tower's axial RoPE).
        layer_type : str, optional
            Which layer type's RoPE (and head size), for configs with one per
            layer type (Gemma 3: ``"full_attention"`` or
            ``"sliding_attention"``; Gemma 4's ``per_layer_config``;
            DeepSeek-V4's ``"main"`` / ``"compress"`` or a layer type).
        layout : {"interleaved", "half"}, optional
            Pair layout of a ``model_type`` posenc_fast has no rule for;
            without it, the rule is probed in the installed transformers'
            own code for that model type, or the call is refused (never a
            guess).
        attention : {"main", "indexer"}, optional
            Whose RoPE: the model's attention (default) or its DSA indexer
            (DeepSeek-V3.2, AXK2, GLM-MoE-DSA, dots3: ``index_head_dim``
            features, in the indexer's own pair layout).  Refused where
            posenc_fast reads no indexer of the model.
        layer : int, optional
            Decoder layer `layer`'s RoPE (its layer type's; refused for a
            NoPE layer, ``no_rope_layers[layer] == 0``; Molmo2's unscaled
            layers).  Without it: the RoPE of the layers that have one.

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

        kwargs = rotary_kwargs_from_hf_config(config, layer_type=layer_type, layout=layout, attention=attention,
                                              layer=layer)
        if "n_axes" in kwargs:  # a vision tower's 2-D RoPE
            return cls.axial(kwargs.pop("dim"), **kwargs)
        return cls(kwargs.pop("dim"), **kwargs)

    dim = property(lambda self: self._dim, doc="Head dimension (last axis of x).")
    rotary_dim = property(lambda self: self._rotary_dim, doc="How many features rotate.")
    rotary_start = property(lambda self: self._start, doc="The first feature that rotates.")
    layout = property(lambda self: self._layout, doc='"interleaved" or "half".')
    base = property(lambda self: self._base, doc="Frequency base (rope_theta).")
    inv_freq = property(lambda self: self._pair_frequencies(self._frequencies.inv_freq),
                        doc="float64 (rotary_dim//2,) frequencies, read-only (negative with reverse=True).")
    reverse = property(lambda self: self._reverse, doc="True: rotates by -theta (NanoChat).")
    pair_streams = property(lambda self: self._pair_streams, doc=(
        "The position stream of each pair, or of its two features (two rows; read-only intp), or None (one stream)."))
    n_streams = property(
        lambda self: 1 if self._pair_streams is None else _streams.n_streams(self._pair_streams),
        doc="Position streams per token: the leading axis of explicit positions when > 1.")

    def _pair_frequencies(self, freqs: NDArray[np.float64]) -> NDArray[np.float64]:
        # every user of the frequencies (fast path, tables, caches, integrations) gets them here
        if self._reverse:
            freqs = -freqs
            freqs.flags.writeable = False
        if self._axial is None:
            return freqs
        return self._axial.pair_frequencies(freqs, self._rotary_dim // 2)
    attention_factor = property(lambda self: float(self._frequencies.attention_factor),
                                doc="Factor multiplying the rotated features (1.0 unless scaled).")

    @property
    def scaling(self) -> dict[str, Any] | None:
        """The scaling dict (a copy), or None."""
        params = self._frequencies.params
        return None if params is None else dict(params)

    def __reduce__(self) -> tuple[Any, ...]:
        # The constructor's arguments, the class (a subclass stays one) and what else the instance holds
        streams = None if self._pair_streams is None else self._pair_streams.tolist()
        extra = {name: value for name, value in vars(self).items() if name not in _SETUP_STATE}
        return (_rebuild, (self._dim, self._base, self._rotary_dim, self._layout, self.scaling,
                           streams, 1 if self._axial is None else self._axial.n_axes, self._reverse,
                           self._start, None if self._axial is None else self._axial[1:], type(self)),
                extra or None)

    def __repr__(self) -> str:
        if self._axial is not None:
            return self._axial.call_text(self._dim, self._base, self._rotary_dim, self._layout)
        streams = ("" if self._pair_streams is None
                   else f", pair_streams={self._pair_streams.tolist()}")
        return (f"RotaryEmbedding({self._dim}, base={self._base!r}, rotary_dim={self._rotary_dim}, "
                f"{f'rotary_start={self._start}, ' if self._start else ''}"
                f"layout={self._layout!r}, scaling={self.scaling!r}{streams}"
                f"{', reverse=True' if self._reverse else ''})")

    def inv_freq_for(self, seq_len: int) -> NDArray[np.float64]:
        """Frequencies a call with ``max(positions) + 1 == seq_len`` uses (float64, read-only)."""
        return self._pair_frequencies(
            self._frequencies.inv_freq_for(v.integer(seq_len, "seq_len", minimum=1)))

    def _table(self, values: NDArray[np.float64], dtype: np.dtype[Any], inverse: bool = False
               ) -> tuple[np.ndarray, np.ndarray]:
        seq_len = _seq_len(values)
        freqs = self._pair_frequencies(self._frequencies.inv_freq_for(seq_len))
        factor = float(self._frequencies.attention_factor_for(seq_len))
        return cos_sin_table(values.reshape(-1), freqs, 1.0 / factor if inverse else factor,
                             dtype)

    def apply_qk_norm(self, q: ArrayLike, k: ArrayLike, q_weight: ArrayLike, k_weight: ArrayLike,
                      positions: ArrayLike | None = None, *, eps: float = 1e-6,
                      weight_offset: float = 0.0, offset: float = 0, seq_axis: int = -2,
                      out_q: NDArray[np.floating[Any]] | None = None,
                      out_k: NDArray[np.floating[Any]] | None = None
                      ) -> tuple[NDArray[np.floating[Any]], NDArray[np.floating[Any]]]:
        """RMSNorm each head of q and k, then rotate it: one pass (Qwen3's, Gemma's q/k norm).

        Each row ``x`` (head_dim features) becomes ``rotate(x / sqrt(mean(x**2)
        + eps) * (weight_offset + weight))``: ``weight_offset=1`` is Gemma's
        ``(1 + weight)``.  Computed in float32 (float64 for float64 data; the
        mean of squares in float64), half types rounded once.

        Parameters
        ----------
        q_weight, k_weight : array_like of shape (dim,)
            The q_norm and k_norm weights.
        eps : float, optional
            Added to the mean of squares.  With ``eps=0`` a row of float32
            subnormals (root mean square below ~2.9e-39) has no float32
            scale: it overflows to inf, and the row becomes NaN, as in
            transformers' float32 RMSNorm.
        q, k, positions, offset, seq_axis, out_q, out_k
            As in `apply_qk` (one position stream).

        Returns
        -------
        (q_out, k_out)
        """
        return _qk_norm.apply_qk_norm(self, q, k, q_weight, k_weight, positions, offset, seq_axis, eps,
                                      weight_offset, out_q, out_k)

    def apply_qk_to_cache(self, q: ArrayLike, k: ArrayLike, v: ArrayLike, positions: ArrayLike,
                          k_cache: NDArray[np.floating[Any]], v_cache: NDArray[np.floating[Any]],
                          slot_mapping: ArrayLike, *,
                          out_q: NDArray[np.floating[Any]] | None = None,
                          qk_norm: tuple[ArrayLike, ArrayLike] | None = None, eps: float = 1e-6,
                          weight_offset: float = 0.0) -> NDArray[np.floating[Any]]:
        """Rotate q; rotate k into its paged-cache slots and copy v into theirs, in one pass.

        Parameters
        ----------
        q : ndarray of shape (tokens, heads, dim)
        k, v : ndarrays of shape (tokens, kv_heads, dim), q's dtype
            Read only: k's rotated rows go straight into `k_cache`.
        positions : array_like of int, shape (tokens,)
            One position per token.
        k_cache, v_cache : ndarrays of shape (num_blocks, block_size, kv_heads, dim)
            Written in place; their strides say where each row lies: C-contiguous
            is vLLM's flash layout; a transposed view of a (num_blocks,
            kv_heads, block_size, dim) cache, or the two halves of one
            (2, ...) tensor, work too (rows contiguous and apart).  q's dtype,
            or float16/bfloat16 for float32 q, k, v (rounded once on store).
        slot_mapping : array_like of int, shape (tokens,)
            Token t goes to slot ``block * block_size + offset``: row
            ``[block, offset]`` of the caches; -1 skips the token (padding),
            whose q is still rotated.  Other slots stay untouched.
        out_q : ndarray of q's shape and dtype, optional
            May be `q` itself (in place).
        qk_norm : (q_weight, k_weight), optional
            RMSNorm each q and k row first, in the same pass: `apply_qk_norm`
            with these weights, `eps` and `weight_offset` (Qwen3, Gemma).

        Returns
        -------
        ndarray of q's shape and dtype
            The rotated q.  The cache rows equal ``apply(k, positions[:,
            None])`` (``apply_qk_norm``'s k with `qk_norm`) and v (cast to
            the cache dtype), bitwise, for any thread count.

        Raises
        ------
        TypeError, ValueError
            Shapes or dtypes that do not fit; a slot below -1, past the
            cache or used twice; caches sharing memory with another
            argument the call reads while it writes (the weights of
            `qk_norm` are read first: they may lie anywhere), or whose rows
            are not contiguous or overlap; an embedding with several
            position streams.  Nothing is written then.
        """
        return _kv_cache.apply_qk_to_cache(self, q, k, v, positions, k_cache, v_cache, slot_mapping, out_q,
                                           qk_norm, eps, weight_offset)

    def _apply_streams(self, xs, positions, offset, inverse, outs):
        # Explicit positions of several streams (the compiled base class's route for them)
        names = ("x",) if len(xs) == 1 else ("q", "k")
        arrays = [_data(x, name, self._dim) for x, name in zip(xs, names)]
        return _streams.apply(self, arrays, names, positions, offset, inverse, outs)

    def _apply_general(self, x, positions, offset, seq_axis, inverse, out):
        x = _data(x, "x", self._dim)
        offset = v.real(offset, "offset")
        inverse = v.flag(inverse, "inverse")
        values, index_shape = _call_positions(x.shape[:-1], positions, offset, seq_axis)
        out, in_place = v.output(out, "out", x.shape, x.dtype, may_be=(x,))
        cos, sin = self._table(values, v.compute_dtype(x.dtype), inverse)
        return rotate(x, cos, sin, row_table(index_shape, x.shape[:-1]),
                       self._layout == "half", inverse, out, in_place, self._start)

    def _qk_call(self, q, k, positions, offset, seq_axis, out_q, out_k):
        """q and k checked, with their positions and outputs: (q, k, values, q_index,
        k_index, (out_q, in place), (out_k, in place))."""
        q = _data(q, "q", self._dim)
        k = _data(k, "k", self._dim)
        offset = v.real(offset, "offset")
        values, q_index = _call_positions(q.shape[:-1], positions, offset, seq_axis, "q")
        if positions is None:
            k_values, k_index = _call_positions(k.shape[:-1], None, offset, seq_axis, "k")
            if k_values.shape != values.shape:
                raise ValueError(f"q and k must have the same length along seq_axis={seq_axis}, "
                                 f"got {values.shape[0]} and {k_values.shape[0]}")
        else:
            v.broadcast_target(values.shape, k.shape[:-1], "positions", "k.shape[:-1]")
            k_index = values.shape
        q_out = v.output(out_q, "out_q", q.shape, q.dtype, may_be=(q,), must_not_overlap=(k,))
        k_out = v.output(out_k, "out_k", k.shape, k.dtype, may_be=(k,),
                         must_not_overlap=(q, q_out[0]))
        return q, k, values, q_index, k_index, q_out, k_out

    def _apply_qk_general(self, q, k, positions, offset, seq_axis, inverse, out_q, out_k):
        inverse = v.flag(inverse, "inverse")
        q, k, values, q_index, k_index, (out_q, q_in_place), (out_k, k_in_place) = \
            self._qk_call(q, k, positions, offset, seq_axis, out_q, out_k)
        half = self._layout == "half"
        q_table, k_table = v.compute_dtype(q.dtype), v.compute_dtype(k.dtype)
        q_cos, q_sin = self._table(values, q_table, inverse)
        k_cos, k_sin = (q_cos, q_sin) if k_table == q_table else self._table(values, k_table,
                                                                               inverse)
        q_rot = rotate(q, q_cos, q_sin, row_table(q_index, q.shape[:-1]), half, inverse,
                        out_q, q_in_place, self._start)
        k_rot = rotate(k, k_cos, k_sin, row_table(k_index, k.shape[:-1]), half, inverse,
                        out_k, k_in_place, self._start)
        return q_rot, k_rot

    def cos_sin(self, positions: ArrayLike, *, dtype: DTypeLike = np.float32,
                out: tuple[NDArray[np.floating[Any]], NDArray[np.floating[Any]]] | None = None
                ) -> tuple[NDArray[np.floating[Any]], NDArray[np.floating[Any]]]:
        """Return ``(cos, sin)`` of the rotation angles, attention factor applied.

        Parameters
        ----------
        positions : array_like of real numbers, any shape
            With several position streams (`n_streams` > 1): shape
            ``(n_streams,) + tokens_shape``; entry ``j`` of a token is then
            the value of its pair ``j``, at the position of stream
            ``pair_streams[j]`` (two rows of streams: entries ``(f, j)``,
            feature ``f`` of pair ``j``).
        dtype : {np.float32, np.float64, np.float16, "bfloat16"}, optional
        out : tuple of two ndarrays, optional
            ``(cos, sin)`` to write, each of the shape returned and dtype
            `dtype`, or None for a new array (as NumPy's ``out=`` of a
            function with two results, e.g. ``np.divmod``).

        Returns
        -------
        cos, sin : ndarrays of shape tokens_shape + (rotary_dim//2,)
            tokens_shape is positions.shape (one stream) or positions.shape[1:];
            ``tokens_shape + (2, rotary_dim//2)`` with two rows of streams.
        """
        values = v.positions_array(positions)
        dtype = v.table_dtype(dtype)
        token_shape = values.shape
        if self._pair_streams is not None:
            values, token_shape = _streams.stream_positions(values, 0.0, self.n_streams, (), None)
        shape = token_shape + ((self._rotary_dim // 2,) if self._pair_streams is None else self._pair_streams.shape)
        if out is not None:
            if not isinstance(out, tuple) or len(out) != 2:
                raise TypeError(f"out must be a tuple (cos, sin) of two arrays, got "
                                f"{type(out).__name__}")
            cos_out, _ = v.output(out[0], "out[0]", shape, dtype)
            sin_out, _ = v.output(out[1], "out[1]", shape, dtype, must_not_overlap=(cos_out,))
            out = (cos_out, sin_out)
        if self._pair_streams is not None:
            distinct, token_rows = _streams.distinct_rows(values)
            tables = self._table(distinct, dtype)
            results = [_streams.gather(t, token_rows, self._pair_streams) for t in tables]
        else:
            seq_len = _seq_len(values)
            results = cos_sin_table(values.reshape(-1), self.inv_freq_for(seq_len),
                                    float(self._frequencies.attention_factor_for(seq_len)), dtype,
                                    None if out is None else tuple(None if t is None else t.reshape(-1, shape[-1])
                                                                   for t in out))
        results = [result.reshape(shape) for result in results]
        for j, target in enumerate((None, None) if out is None else out):
            if target is not None:  # filled where it lies, or a copy of the rows
                if not np.shares_memory(target, results[j]):
                    np.copyto(target, results[j])
                results[j] = target
        return results[0], results[1]


def _rebuild(dim: int, base: float, rotary_dim: int, layout: Literal["interleaved", "half"],
             scaling: dict[str, Any] | None, pair_streams: list | None = None, axes: int = 1,
             reverse: bool = False, start: int = 0, axial: tuple | None = None,
             cls: type | None = None) -> RotaryEmbedding:
    # Unpickling: RotaryEmbedding's constructor on an instance of `cls` (a subclass's own __init__ is
    # not called, as pickle does for any object; the cos/sin cache is rebuilt on use); `axial` is
    # (axis_order, pairs, frequencies); pickles made before them hold neither
    cls = RotaryEmbedding if cls is None else cls
    if not (isinstance(cls, type) and issubclass(cls, RotaryEmbedding)):
        raise TypeError(f"cls must be RotaryEmbedding or a subclass, got {cls!r}")
    if axes > 1:
        extra = dict(zip(("axis_order", "pairs", "frequencies"), axial or ()))
        return RotaryEmbedding.axial.__func__(cls, dim, base=base, n_axes=axes, rotary_dim=rotary_dim,
                                              layout=layout, **extra)
    rope = cls.__new__(cls)
    RotaryEmbedding.__init__(rope, dim, base=base, rotary_dim=rotary_dim, rotary_start=start,
                             layout=layout, scaling=scaling, pair_streams=pair_streams, reverse=reverse)
    return rope


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
    if x.ndim < 1 or not x.shape[-1]:
        raise ValueError(f"x must have shape (..., dim) with dim >= 1, got {x.shape}")
    factor = v.real(interpolation_factor, "interpolation_factor", minimum=1.0)
    # Checked here first: the embedding cache below needs hashable arguments.
    base = v.real(base, "base", positive=True)
    layout = v.choice(layout, "layout", v.LAYOUTS_ROTARY)
    rotary_dim = None if rotary_dim is None else v.integer(rotary_dim, "rotary_dim")
    if rotary_dim is None and x.shape[-1] % 2:
        raise ValueError(f"x.shape[-1] must be even when rotary_dim is not given, got {x.shape[-1]}")
    rope = _shortcut_embedding(x.shape[-1], base, rotary_dim, layout, factor)
    return rope.apply(x, positions, offset=offset, seq_axis=seq_axis, inverse=inverse, out=out)


@functools.lru_cache(maxsize=32)
def _shortcut_embedding(dim, base, rotary_dim, layout, factor) -> RotaryEmbedding:
    # apply_rotary reuses embeddings (and their cos/sin caches) across calls.
    scaling = None if factor == 1.0 else {"rope_type": "linear", "factor": factor}
    return RotaryEmbedding(dim, base=base, rotary_dim=rotary_dim, layout=layout, scaling=scaling)
