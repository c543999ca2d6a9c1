"""Several position streams per token: multimodal RoPE (mRoPE) and axial RoPE.

Pair ``j`` of a token rotates by the position of stream ``pair_streams[j]``
(Qwen2-VL's t/h/w, a vision tower's h/w); with two rows, its first feature
by that of ``pair_streams[0, j]`` and its second by that of
``pair_streams[1, j]`` (HunYuan-VL).  This module turns the common forms
into that array (an axial RoPE's also into each pair's frequency, `Axial`),
validates a call's positions (leading axis: one row per stream) and runs the
compiled ``rotate_stream_rows`` on the canonical cos/sin table of the call's
distinct positions.
"""

from typing import NamedTuple

import numpy as np

from . import _validate as v
from ._dispatch import kernels
from ._rows import RowOutput, row_table
from ._threads import threads_for


def _section(section, npairs: int, name: str) -> list[int]:
    if isinstance(section, (str, bytes)) or not hasattr(section, "__iter__"):
        raise TypeError(f"{name} must be a sequence of ints, got {type(section).__name__}")
    values = [v.integer(s, f"{name}[{i}]", minimum=0) for i, s in enumerate(section)]
    if len(values) < 2:
        raise ValueError(f"{name} must have one entry per stream (at least 2), got {values}")
    if sum(values) != npairs:
        raise ValueError(f"{name} must sum to rotary_dim // 2 = {npairs} (one entry per pair), "
                         f"got {values} (sum {sum(values)})")
    return values


def chunked_streams(section, npairs: int) -> np.ndarray:
    """Qwen2/2.5-VL: the first section[0] pairs take stream 0, the next section[1] stream 1, ..."""
    section = _section(section, npairs, "mrope_section")
    return np.repeat(np.arange(len(section)), section)


def interleaved_streams(section, npairs: int) -> np.ndarray:
    """Qwen3-VL: pairs 1, 4, 7, ... below 3*section[1] take stream 1 (h), pairs 2, 5, 8, ...

    below 3*section[2] stream 2 (w), every other pair stream 0 (t)
    (``Qwen3VLTextRotaryEmbedding.recomposition_frequencies``).
    """
    section = _section(section, npairs, "mrope_section")
    if len(section) != 3:
        raise ValueError(f"mrope_interleaved=True needs a 3-entry mrope_section (t, h, w), "
                         f"got {section}")
    pairs = np.arange(npairs)
    streams = np.zeros(npairs, dtype=np.intp)
    for stream in (1, 2):
        streams[(pairs % 3 == stream) & (pairs < 3 * section[stream])] = stream
    return streams


AXIAL_PAIRS = ("blocks", "alternating")
AXIAL_FREQUENCIES = ("shared", "split")


class Axial(NamedTuple):
    """How an axial RoPE (``RotaryEmbedding.axial``) gives its pairs to axes and frequencies.

    Pair ``j`` of ``npairs`` lies in block ``b`` at index ``k`` (``"blocks"``:
    ``b, k = divmod(j, npairs // n_axes)``; ``"alternating"``: ``k, b =
    divmod(j, n_axes)``), rotates by axis ``order[b]``'s position, with
    frequency ``k`` of a ``rotary_dim / n_axes`` RoPE (``"shared"``) or
    ``n_axes * k + b`` of the ``rotary_dim`` RoPE (``"split"``).
    """

    n_axes: int
    order: tuple[int, ...]
    pairs: str
    frequencies: str

    def _blocks(self, npairs: int) -> tuple[np.ndarray, np.ndarray]:
        j = np.arange(npairs)
        if self.pairs == "blocks":
            return j // (npairs // self.n_axes), j % (npairs // self.n_axes)
        return j % self.n_axes, j // self.n_axes

    def streams(self, npairs: int) -> np.ndarray:
        """The position stream (axis) of each pair, read-only."""
        streams = np.asarray(self.order, dtype=np.intp)[self._blocks(npairs)[0]]
        streams.flags.writeable = False
        return streams

    def width(self, rotary_dim: int) -> int:
        """The rotary_dim whose default frequencies the pairs take theirs from."""
        return rotary_dim // self.n_axes if self.frequencies == "shared" else rotary_dim

    def pair_frequencies(self, freqs: np.ndarray, npairs: int) -> np.ndarray:
        """Each pair's frequency, from the `width` RoPE's `freqs` (read-only)."""
        block, k = self._blocks(npairs)
        index = k if self.frequencies == "shared" else self.n_axes * k + block
        result = freqs[index]
        result.flags.writeable = False
        return result

    def call_text(self, dim: int, base: float, rotary_dim: int, layout: str) -> str:
        """The ``RotaryEmbedding.axial(...)`` call that builds it (its repr)."""
        extra = [f"rotary_dim={rotary_dim}"] if rotary_dim != dim else []
        extra += [f"layout={layout!r}"] if layout != "half" else []
        extra += [f"axis_order={self.order}"] if self.order != tuple(range(self.n_axes)) else []
        extra += [f"pairs={self.pairs!r}"] if self.pairs != "blocks" else []
        extra += [f"frequencies={self.frequencies!r}"] if self.frequencies != "shared" else []
        arguments = [str(dim), f"base={base!r}", f"n_axes={self.n_axes}", *extra]
        return f"RotaryEmbedding.axial({', '.join(arguments)})"


def axial(dim, n_axes, rotary_dim, axis_order, pairs, frequencies) -> tuple[int, Axial]:
    """Check ``RotaryEmbedding.axial``'s arguments: (rotary_dim, its `Axial`)."""
    dim = v.integer(dim, "dim", minimum=1)
    n_axes = v.integer(n_axes, "n_axes", minimum=2)
    name = "dim" if rotary_dim is None else "rotary_dim"
    rotary_dim = dim if rotary_dim is None else v.integer(rotary_dim, "rotary_dim", minimum=1)
    if rotary_dim % (2 * n_axes):
        raise ValueError(f"{name} must be a multiple of 2 * n_axes = {2 * n_axes}, "
                         f"got {rotary_dim}")
    if rotary_dim > dim:
        raise ValueError(f"rotary_dim must be <= dim = {dim}, got {rotary_dim}")
    if axis_order is None:
        order = tuple(range(n_axes))
    else:
        if isinstance(axis_order, (str, bytes)) or not hasattr(axis_order, "__iter__"):
            raise TypeError(f"axis_order must be a sequence of ints, "
                            f"got {type(axis_order).__name__}")
        order = tuple(v.integer(a, f"axis_order[{i}]") for i, a in enumerate(axis_order))
        if sorted(order) != list(range(n_axes)):
            raise ValueError(f"axis_order must be a permutation of range(n_axes) = "
                             f"{list(range(n_axes))} (each axis one block of pairs), "
                             f"got {list(order)}")
    pairs = v.choice(pairs, "pairs", AXIAL_PAIRS)
    frequencies = v.choice(frequencies, "frequencies", AXIAL_FREQUENCIES)
    return rotary_dim, Axial(n_axes, order, pairs, frequencies)


def pair_streams_array(pair_streams, npairs: int, name: str = "pair_streams") -> np.ndarray:
    """Validate a stream array: ints >= 0, one per pair (shape (npairs,)) or one per feature of
    each pair (shape (2, npairs); rows alike: the one row), every stream used (`name`: what the
    caller passed, for the messages)."""
    streams = v.integer_array(pair_streams, name)
    if streams.shape not in ((npairs,), (2, npairs)):
        raise ValueError(f"{name} must have one entry per pair, shape ({npairs},), or one per feature "
                         f"of each pair, shape (2, {npairs}), got {streams.shape}")
    if streams.ndim == 2 and np.array_equal(streams[0], streams[1]):
        streams = streams[0]
    if streams.size and streams.min() < 0:
        raise ValueError(f"{name} must be >= 0, got {int(streams.min())}")
    used = np.unique(streams)
    if used.size < 2 or used[-1] != used.size - 1:
        raise ValueError(f"{name} must use every stream 0 .. n_streams-1 and at least two "
                         f"(one stream is a plain RotaryEmbedding), got streams {used.tolist()}")
    streams = streams.astype(np.intp)
    streams.flags.writeable = False
    return streams


def stream_positions(positions, offset: float, n_streams: int, lead: tuple, name: str | None
                     ) -> tuple[np.ndarray, tuple]:
    """(float64 positions (n_streams, tokens) with offset, the token index shape against `lead`)."""
    values = v.with_offset(v.positions_array(positions), offset)
    if values.ndim < 1 or values.shape[0] != n_streams:
        raise ValueError(f"positions must have a leading axis of n_streams = {n_streams} (one row "
                         f"per position stream), got shape {values.shape}")
    token_shape = values.shape[1:]
    if name is not None:
        v.broadcast_target(token_shape, lead, "positions[i]", f"{name}.shape[:-1]")
    return values.reshape(n_streams, -1), token_shape


def distinct_rows(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct positions, for each token and stream the row of its position among them)."""
    distinct, inverse = np.unique(values, return_inverse=True)
    token_rows = np.ascontiguousarray(inverse.reshape(values.shape).T, dtype=np.intp)
    return distinct, token_rows


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, token_rows: np.ndarray,
           token_shape: tuple, pair_streams: np.ndarray, half: bool, inverse: bool,
           out: np.ndarray | None, in_place: bool, start: int = 0) -> np.ndarray:
    """Rotate x's rows: token t's pair j by table row token_rows[t, pair_streams[j]]
    (features from `start` on rotate)."""
    rows = RowOutput(x, out, in_place)
    row_token = row_table(token_shape, x.shape[:-1])
    kernels.rotate_stream_rows(rows.x_rows, rows.rows, cos, sin, row_token, token_rows,
                               pair_streams, half, inverse, threads_for(x.size), start)
    return rows.result()


def apply(rope, arrays: list, names: tuple, positions, offset, inverse, outs) -> tuple:
    """`RotaryEmbedding`'s rotation of x (or q and k) by explicit positions of several streams.

    One cos/sin table of the call's distinct positions (``rope._table``), gathered
    per (token, pair) by the compiled kernel; `arrays` are checked already.
    """
    out_names = ("out",) if len(arrays) == 1 else ("out_q", "out_k")
    offset = v.real(offset, "offset")
    inverse = v.flag(inverse, "inverse")
    values, token_shape = stream_positions(positions, offset, rope.n_streams, arrays[0].shape[:-1],
                                           names[0])
    for x, name in zip(arrays[1:], names[1:]):
        v.broadcast_target(token_shape, x.shape[:-1], "positions[i]", f"{name}.shape[:-1]")
    checked: list = []
    for i, (x, out, name) in enumerate(zip(arrays, outs, out_names)):
        others = arrays[:i] + arrays[i + 1:] + [given for given, _ in checked]
        checked.append(v.output(out, name, x.shape, x.dtype, may_be=(x,),
                                must_not_overlap=tuple(others)))
    if inverse and rope.pair_streams.ndim == 2:
        raise ValueError("inverse=True: this embedding's pairs take two streams each (pair_streams has two rows), "
                         "not a rotation where their positions differ, so no rotation by -theta undoes it")
    distinct, token_rows = distinct_rows(values)
    tables: dict = {}
    results = []
    for x, (out, in_place) in zip(arrays, checked):
        table = v.compute_dtype(x.dtype)
        if table not in tables:
            tables[table] = rope._table(distinct, table, inverse)
        cos, sin = tables[table]
        results.append(rotate(x, cos, sin, token_rows, token_shape, rope.pair_streams,
                              rope.layout == "half", inverse, out, in_place, rope.rotary_start))
    return tuple(results)


def gather(table: np.ndarray, token_rows: np.ndarray, pair_streams: np.ndarray) -> np.ndarray:
    """(tokens,) + pair_streams.shape: entry (t, ..., j) = table[token_rows[t, pair_streams[..., j]], j]."""
    return table[token_rows[:, pair_streams], np.arange(pair_streams.shape[-1])]


def n_streams(pair_streams: np.ndarray) -> int:
    return int(pair_streams.max()) + 1 if pair_streams.size else 1
