"""The standard workloads as data, and the one builder that makes a `Case` of each.

A `Workload` (W1-W5 of issue 6, ``apply_qk``, ``add_alibi`` against an
in-place pass and against the exact loop, ``add_position_table``) names its
shapes, goal and limit; its ``make`` function allocates the arrays once and
returns the calls bound to them (`Parts`).  `Case` turns those into `Impl`
objects by kind:

``"posenc_fast"``   our call, with ``out=`` where the API has it;
``"limit"``         the cheapest NumPy call that moves the same bytes
                    (``"copy"``: ``np.copyto``, ``"multiply"``:
                    ``np.multiply(x, 1, out=x)``, ``"fill"``: ``out.fill(1.0)``,
                    ``"alloc_fill"``: ``np.empty`` then ``fill`` for a call
                    that allocates its results), or for a call bound by its
                    arithmetic the cheapest exact loop (``"exact_add"``: each
                    float32 value plus a float64 one, rounded once): the limit
                    the goals are stated against;
``"numpy"``         the NumPy expression a user would write (cos/sin formed in
                    float64, then cast);
``"torch"``, ``"torch.compile"``  the same expression in PyTorch (`torch_rows`).

Before it is timed, every implementation runs once on fresh outputs and is
compared with ``posenc_fast.reference`` (float64 plain loops) on a sample of
rows (`sample_rows`: the first and last rows and random ones, about
`SAMPLE_VALUES` values per output; the loops would take minutes on the full
arrays), element by element within `posenc_fast._tolerance.tolerance`.  A
limit row checks its own result instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import _tolerance
from .._dispatch import kernels
from .. import reference as ref
from .torch_rows import (Unavailable, alibi_expression, apply_qk_expression,
                         cos_sin_expression, rope_half_expression, sinusoidal_expression,
                         torch_impl)

ROPE_DIM = 128
BASE = 10000.0
W3_OFFSET = 4096          # the token after a 4096-token prefill
ALIBI_OFFSET = 0
SAMPLE_VALUES = 1 << 18   # values per output compared with the reference (~0.1 s of its loops)

KINDS = ("posenc_fast", "limit", "numpy", "torch", "torch.compile")


@dataclass
class Diff:
    """How far a result is from the float64 reference, on the rows compared.

    ``max_ulp`` (float32 tables only) is the error in float32 ulps widened
    by the precision of the float64 angle (`_tolerance.float32_ulps`).
    """

    max_abs: float
    max_rel: float                # max_abs / max(1, max|reference|)
    max_ulp: float | None
    tolerance_used: float         # max over elements of |error| / tolerance; ok when <= 1

    @property
    def ok(self) -> bool:
        return self.tolerance_used <= 1.0

    def as_dict(self) -> dict:
        return {"max_abs_diff": self.max_abs, "max_rel_diff": self.max_rel,
                "max_ulp": self.max_ulp, "tolerance_used": self.tolerance_used, "ok": self.ok}


@dataclass
class Impl:
    """One implementation of a workload.

    ``run()`` is the timed call.  ``verify()`` runs it once more on fresh
    outputs and returns its `Diff` to the reference (None for a limit row,
    whose own result it checks instead, raising AssertionError if wrong).
    """

    kind: str
    label: str
    run: Callable[[], object]
    verify: Callable[[], Diff | None]


@dataclass
class Parts:
    """A workload at one dtype and shape: arrays allocated, calls bound to them.

    ``outputs`` are the arrays the calls write; before a checked call each
    is reset to its entry of ``initial`` (NaN for an ``out`` array, the
    input for an in-place one).  ``sources`` are what a ``"copy"`` limit
    copies into ``outputs``.  ``reference(i, rows)``, ``scale(i, rows)`` and
    ``angle(i, rows)`` give, for output ``i`` seen as rows (all axes but
    the last flattened), the float64 reference rows, the magnitude of their
    inputs and the angle behind each value.
    """

    ours: Callable[[], object]
    numpy: Callable[[], object]
    outputs: tuple
    initial: tuple
    reference: Callable[[int, np.ndarray], np.ndarray]
    scale: Callable[[int, np.ndarray], object] = lambda i, rows: 1.0
    angle: Callable[[int, np.ndarray], object] = lambda i, rows: 0.0
    sources: tuple = ()
    torch: Callable | None = None          # torch -> the function a torch row times
    torch_args: tuple = ()
    ours_label: str = "posenc_fast"
    expression_label: str = ""              # e.g. " (per head)"


@dataclass(frozen=True)
class Workload:
    """A named workload: how to build it at its real shape and at a small one."""

    key: str
    title: str
    shape: tuple
    small_shape: tuple
    goal: float                 # time / limit time
    limit: str                  # "copy", "multiply", "exact_add", "fill" or "alloc_fill"
    limit_label: str
    make: Callable[[np.dtype, tuple], Parts]
    big: bool = False           # the CI-sized (--benchmark-disable) run uses small_shape
    dtypes: tuple = ("float32", "float64")
    threaded: bool = True       # large enough for the threads axis
    kinds: tuple = KINDS
    ulps: bool = False          # float32 results are reported in ulps (tables)

    def case(self, dtype, small: bool = False, shape: tuple | None = None) -> Case:
        """The workload at `dtype` and `shape` (default: its shape, or its small shape)."""
        dtype = np.dtype(dtype)
        if shape is None:
            shape = self.small_shape if small else self.shape
        return Case(self, dtype, shape, self.make(dtype, shape))


def shape_label(shape: tuple) -> str:
    """``1x32x4096x128``, or ``a+b`` for a workload of two arrays (tuples, or lists
    as a JSON report holds them)."""
    if isinstance(shape[0], (tuple, list)):
        return "+".join(shape_label(s) for s in shape)
    return "x".join(map(str, shape))


def sample_rows(n_rows: int, row_length: int) -> np.ndarray:
    """Rows compared with the reference: all, or the first and last and random ones."""
    count = max(1, SAMPLE_VALUES // max(row_length, 1))
    if count >= n_rows:
        return np.arange(n_rows)
    edge = count // 8
    random = np.random.default_rng(n_rows).choice(n_rows, count - 2 * edge, replace=False)
    return np.unique(np.concatenate([np.arange(edge), np.arange(n_rows - edge, n_rows), random]))


def as_tuple(result) -> tuple:
    """A call's result as a tuple of its arrays (one array, or the tuple a table call returns)."""
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


class Case:
    """A workload built at one dtype and shape; hands out its `Impl` objects by kind."""

    def __init__(self, workload: Workload, dtype: np.dtype, shape: tuple, parts: Parts):
        self.workload, self.dtype, self.shape, self.parts = workload, dtype, shape, parts
        self.key, self.title, self.goal = workload.key, workload.title, workload.goal
        self.goal_text = f"<= {workload.goal:g}x"
        self.limit_label = workload.limit_label
        if workload.limit == "multiply" and dtype.itemsize == 2:
            self.limit_label = "np.copyto of x (NumPy has no vector loops for half types)"
        written = sum(out.nbytes for out in parts.outputs)
        self.bytes_moved = written if workload.limit in ("fill", "alloc_fill") else 2 * written
        self._impls: dict[str, Impl] = {}
        self._expected: dict[int, tuple] = {}

    @property
    def shape_label(self) -> str:
        return shape_label(self.shape)

    def impl(self, kind: str) -> Impl:
        """The implementation of `kind` (built once; raises `Unavailable`)."""
        if kind not in self.workload.kinds:
            raise Unavailable(f"{self.key} has no {kind!r} implementation")
        if kind not in self._impls:
            self._impls[kind] = self._build(kind)
        return self._impls[kind]

    def _build(self, kind: str) -> Impl:
        parts = self.parts
        if kind == "limit":
            return self._limit()
        if kind == "posenc_fast":
            run, label, as_numpy = parts.ours, parts.ours_label, as_tuple
        elif kind == "numpy":
            run, label, as_numpy = parts.numpy, "NumPy expression" + parts.expression_label, as_tuple
        else:
            if parts.torch is None:
                raise Unavailable(f"{self.key} has no {kind!r} implementation")
            run, to_numpy = torch_impl(parts.torch, parts.torch_args, kind == "torch.compile")
            label = "torch.compile" if kind == "torch.compile" else (
                "PyTorch eager" + parts.expression_label)

            def as_numpy(result):
                return as_tuple(to_numpy(result))

        def verify():
            self.reset()
            return self.check(as_numpy(run()))
        return Impl(kind, label, run, verify)

    def _limit(self) -> Impl:
        outputs, limit = self.parts.outputs, self.workload.limit
        written = outputs
        if limit == "copy":
            pairs = list(zip(outputs, self.parts.sources))
            if len(pairs) == 1:
                (out, source), = pairs

                def run():
                    return np.copyto(out, source)
            else:
                def run():
                    for out, source in pairs:
                        np.copyto(out, source)
            expected = self.parts.sources
        elif limit == "multiply" and self.dtype.itemsize == 2:
            (out,) = outputs  # the same bytes read and written elsewhere
            other = np.empty_like(out)

            def run():
                return np.copyto(other, out)
            expected = self.parts.initial
        elif limit == "multiply":
            (out,) = outputs  # in place: one array

            def run():
                return np.multiply(out, 1, out=out)
            expected = self.parts.initial
        elif limit == "exact_add":
            (out,) = outputs  # in place: one array, as rows
            rows = out.reshape(-1, out.shape[-1])
            bias, row_zero = _exact_add_row(out.shape[-1]), np.zeros(len(rows), np.intp)

            def run():
                return kernels.add_table_rows(rows, rows, bias[None], row_zero, 1)

            def verify():  # from -row rounded: each exact sum is the row's rounding error, float32's 0
                rows[...] = -bias.astype(out.dtype)
                expected = (rows.astype(np.float64) + bias).astype(out.dtype)
                run()
                assert np.array_equal(rows, expected), self.limit_label
                self.reset()
            return Impl("limit", self.limit_label, run, verify)
        elif limit == "fill":
            def run():
                for out in outputs:
                    out.fill(1.0)
            expected = (1.0,) * len(outputs)
        elif limit == "alloc_fill":
            layouts = [(out.shape, out.dtype) for out in outputs]

            def run():
                made = []
                for shape, dtype in layouts:
                    made.append(np.empty(shape, dtype))
                    made[-1].fill(1.0)
                return made
            expected, written = (1.0,) * len(outputs), None
        else:
            raise ValueError("limit must be 'copy', 'multiply', 'exact_add', 'fill' or 'alloc_fill', "
                             f"got {limit!r}")

        def verify():
            self.reset()
            results = run()
            for out, want in zip(results if written is None else written, expected):
                assert np.array_equal(out, np.broadcast_to(want, out.shape)), self.limit_label
            return None
        return Impl("limit", self.limit_label, run, verify)

    def reset(self) -> None:
        """Put every output back to what it holds before a checked call."""
        for out, value in zip(self.parts.outputs, self.parts.initial):
            np.copyto(out, value)

    def _reference(self, i: int, shape: tuple) -> tuple:
        """(rows, reference rows, scale, angle) of output `i` (computed once)."""
        if i not in self._expected:
            n_rows = int(np.prod(shape[:-1], dtype=np.int64))
            rows = sample_rows(n_rows, shape[-1])
            self._expected[i] = (rows, np.asarray(self.parts.reference(i, rows)),
                                 self.parts.scale(i, rows), self.parts.angle(i, rows))
        return self._expected[i]

    def check(self, results: tuple) -> Diff:
        """The `Diff` of `results` (one array per output) to the reference, on sampled rows."""
        if len(results) != len(self.parts.outputs):
            raise AssertionError(f"{len(results)} results for {len(self.parts.outputs)} outputs")
        max_abs = max_ref = used = 0.0
        max_ulp = None
        for i, (result, out) in enumerate(zip(results, self.parts.outputs)):
            result = np.asarray(result)
            if result.shape != out.shape:
                raise AssertionError(f"result shape {result.shape} != {out.shape}")
            rows, want, scale, angle = self._reference(i, out.shape)
            got = result.reshape(-1, out.shape[-1])[rows].astype(np.float64)
            err = np.abs(got - want)
            err[~np.isfinite(err)] = np.inf
            tol = _tolerance.tolerance(want, result.dtype, scale=scale, angle=angle)
            max_abs = max(max_abs, float(err.max(initial=0.0)))
            max_ref = max(max_ref, float(np.abs(want).max(initial=0.0)))
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(err == 0, 0.0, err / tol)
            used = max(used, float(np.nan_to_num(ratio, nan=np.inf).max(initial=0.0)))
            if self.workload.ulps and result.dtype == np.float32:
                ulps = _tolerance.float32_ulps(got, want, angle)
                max_ulp = max(max_ulp or 0.0, float(ulps.max(initial=0.0)))
        return Diff(max_abs, max_abs / max(1.0, max_ref), max_ulp, used)


# ---------------------------------------------------------------------------
# the workloads' parts


def _rng():
    return np.random.default_rng(20240611)


def _random(shape, dtype) -> np.ndarray:
    return _rng().standard_normal(shape, dtype=np.float32).astype(dtype, copy=False)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate((-x[..., half:], x[..., :half]), axis=-1)


def numpy_rope_half(x, positions, inv_freq):
    """HF's ``x*cos + rotate_half(x)*sin``; cos/sin in float64, cast to x's dtype.

    `positions` broadcasts against ``x.shape[:-1]`` (float64 values).
    """
    angles = np.asarray(positions, dtype=np.float64)[..., None] * inv_freq
    emb = np.concatenate((angles, angles), axis=-1)
    return x * np.cos(emb).astype(x.dtype) + _rotate_half(x) * np.sin(emb).astype(x.dtype)


def _rope_rows(xs, positions, inv_freq, layout="half"):
    """reference, scale and angle of `layout` rotations of the arrays `xs`.

    `positions[i]` broadcasts against ``xs[i].shape[:-1]``.
    """
    def rows_of(i, rows):
        x = xs[i]
        pos = np.broadcast_to(positions[i], x.shape[:-1]).reshape(-1)[rows]
        return x.reshape(-1, x.shape[-1])[rows], pos

    def reference(i, rows):
        x, pos = rows_of(i, rows)
        return ref.apply_rotary(x, pos, list(inv_freq), layout=layout)

    def scale(i, rows):
        x, _ = rows_of(i, rows)
        return np.abs(x.astype(np.float64)).max(axis=-1, keepdims=True)

    def angle(i, rows):
        _, pos = rows_of(i, rows)
        angles = np.abs(pos)[:, None] * inv_freq
        if layout == "interleaved":
            return np.repeat(angles, 2, axis=-1)
        return np.concatenate((angles, angles), axis=-1)
    return reference, scale, angle


def _rope_inv_freq(dim=ROPE_DIM):
    return np.array(ref.rope_inv_freq(dim, BASE))


def _rope(dtype, shape, *, positions=None, offset=0, in_place=False, layout="half") -> Parts:
    """W1/W2/W3: rotate x of `shape` (`layout`, head_dim shape[-1]: 128 in the workloads).

    positions: None (arange along seq, plus offset) or an integer array.
    """
    import posenc_fast as pf

    rope = pf.RotaryEmbedding(shape[-1], base=BASE, layout=layout)
    inv_freq = _rope_inv_freq(shape[-1])
    x0 = _random(shape, dtype)
    # float64 positions as they broadcast against x.shape[:-1]: (seq,) matches axis -2
    if positions is None:
        pos_b = offset + np.arange(shape[-2], dtype=np.float64)
    else:
        pos_b = np.asarray(positions, dtype=np.float64) + offset
    reference, scale, angle = _rope_rows((x0,), (pos_b,), inv_freq, layout)
    if in_place:
        out = x0.copy()

        def ours():
            return rope.apply(out, positions, offset=offset, out=out)
    else:
        out = np.empty_like(x0)

        def ours():
            return rope.apply(x0, positions, offset=offset, out=out)

    def numpy_expr():
        return numpy_rope_half(x0, pos_b, inv_freq)

    return Parts(ours, numpy_expr, (out,), (x0 if in_place else np.nan,), reference, scale,
                 angle, sources=(x0,), torch=rope_half_expression,
                 torch_args=(x0, np.ascontiguousarray(pos_b), inv_freq),
                 ours_label="posenc_fast" + (" (in place)" if in_place else ""))


def _apply_qk(dtype, shape) -> Parts:
    import posenc_fast as pf

    q_shape, k_shape = shape
    rope = pf.RotaryEmbedding(ROPE_DIM, base=BASE, layout="half")
    inv_freq = _rope_inv_freq()
    q0 = _random(q_shape, dtype)
    k0 = np.ascontiguousarray(_random(k_shape, dtype)[..., ::-1])  # not the same numbers as q
    out_q, out_k = np.empty_like(q0), np.empty_like(k0)
    pos = np.arange(q_shape[-2], dtype=np.float64)
    reference, scale, angle = _rope_rows((q0, k0), (pos, pos), inv_freq)

    def ours():
        return rope.apply_qk(q0, k0, out_q=out_q, out_k=out_k)

    def numpy_expr():
        # HF apply_rotary_pos_emb: one cos/sin, used for q and k.
        angles = pos[:, None] * inv_freq
        emb = np.concatenate((angles, angles), axis=-1)
        cos, sin = np.cos(emb).astype(dtype), np.sin(emb).astype(dtype)
        return q0 * cos + _rotate_half(q0) * sin, k0 * cos + _rotate_half(k0) * sin

    return Parts(ours, numpy_expr, (out_q, out_k), (np.nan, np.nan), reference, scale, angle,
                 sources=(q0, k0), torch=apply_qk_expression, torch_args=(q0, k0, pos, inv_freq),
                 ours_label="posenc_fast apply_qk")


def _cos_sin(dtype, shape) -> Parts:
    """W4: RotaryEmbedding(128).cos_sin(arange(n)), allocating its two results.

    ``outputs`` are never written: they give the limit (allocate and fill)
    the results' shapes and dtypes.
    """
    import posenc_fast as pf

    n, half = shape
    rope = pf.RotaryEmbedding(ROPE_DIM, base=BASE, layout="half")
    inv_freq = _rope_inv_freq()
    positions = np.arange(n)
    pos64 = positions.astype(np.float64)
    out = (np.empty(shape, dtype), np.empty(shape, dtype))

    def ours():
        return rope.cos_sin(positions, dtype=dtype)

    def numpy_expr():
        angles = np.outer(pos64, inv_freq)
        return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)

    def reference(i, rows):
        return ref.rope_cos_sin(rows, list(inv_freq))[i]

    return Parts(ours, numpy_expr, out, (np.nan, np.nan), reference,
                 angle=lambda i, rows: np.outer(rows, inv_freq),
                 torch=cos_sin_expression(dtype), torch_args=(pos64, inv_freq),
                 ours_label="posenc_fast cos_sin")


def _sinusoidal(dtype, shape) -> Parts:
    """W5: sinusoidal_table(length, dim, out=out)."""
    import posenc_fast as pf

    length, dim = shape
    out = np.empty(shape, dtype)
    pos64 = np.arange(length, dtype=np.float64)
    freqs = np.array([ref.sinusoidal_frequency(i, dim, BASE) for i in range((dim + 1) // 2)])

    def ours():
        return pf.sinusoidal_table(length, dim, dtype=dtype, out=out)

    def numpy_expr():
        # The "Attention Is All You Need" table as users write it (div_term precomputed).
        angles = np.outer(pos64, freqs)
        table = np.empty((length, dim), dtype)
        table[:, 0::2] = np.sin(angles)
        table[:, 1::2] = np.cos(angles[:, : dim // 2])
        return table

    def reference(i, rows):
        return ref.sinusoidal(rows, dim, base=BASE)

    def angle(i, rows):
        return np.outer(rows, freqs[np.arange(dim) // 2])   # column 2k and 2k+1: pair k

    return Parts(ours, numpy_expr, (out,), (np.nan,), reference, angle=angle,
                 torch=sinusoidal_expression(dtype, length, dim), torch_args=(pos64, freqs),
                 ours_label="posenc_fast sinusoidal_table")


def numpy_add_alibi(scores, slopes, offset):
    """``scores += bias`` head by head (a (heads, q, k) float64 bias would be 4 GiB)."""
    q_len, k_len = scores.shape[-2:]
    rel = np.arange(k_len, dtype=np.float64) - (offset + np.arange(q_len, dtype=np.float64))[:, None]
    for h in range(scores.shape[-3]):
        scores[..., h, :, :] += (slopes[h] * rel).astype(scores.dtype)
    return scores


def _exact_add_row(k_len: int) -> np.ndarray:
    """The float64 row the ``"exact_add"`` limit adds to every row: an ALiBi bias of the last query, with a
    slope (1/3) whose biases float32 does not hold."""
    return (np.arange(k_len, dtype=np.float64) - (k_len - 1)) / 3.0


def _alibi(dtype, shape, offset=ALIBI_OFFSET) -> Parts:
    """add_alibi(scores, out=scores) on scores of `shape` (heads, q, k), starting from zeros."""
    import posenc_fast as pf

    heads, q_len, k_len = shape
    scores = np.zeros(shape, dtype)
    slopes = ref.alibi_slopes(heads)

    def ours():
        return pf.add_alibi(scores, offset=offset, causal=True, out=scores)

    def reference(i, rows):
        # row r is head r // q_len, query r % q_len; one reference call per query row
        head, query = np.divmod(rows, q_len)
        bias = {q: ref.alibi_bias(heads, 1, k_len, offset=offset + int(q))[:, 0]
                for q in np.unique(query)}
        return np.stack([bias[q][h] for h, q in zip(head, query)])

    return Parts(ours, lambda: numpy_add_alibi(scores, slopes, offset), (scores,), (0.0,),
                 reference, scale=lambda i, rows: 0.0,
                 torch=alibi_expression(offset, q_len, k_len), torch_args=(scores, slopes),
                 ours_label="posenc_fast add_alibi (in place)", expression_label=" (per head)")


def _position_table(dtype, shape) -> Parts:
    """add_position_table(x, table, out=x): x of `shape` (batch, seq, dim), table (seq, dim)."""
    import posenc_fast as pf

    seq, dim = shape[-2:]
    x0 = _random(shape, dtype)
    table = np.ascontiguousarray(_random((seq, dim), dtype)[::-1])  # not x's numbers
    x = x0.copy()
    x_rows = x0.reshape(-1, dim)

    def ours():
        return pf.add_position_table(x, table, out=x)

    def numpy_expr():
        return np.add(x, table[np.arange(seq)], out=x)

    def reference(i, rows):
        return ref.add_position_table(x_rows[rows], table, rows % seq)

    return Parts(ours, numpy_expr, (x,), (x0,), reference, sources=(x0,),
                 ours_label="posenc_fast add_position_table (in place)")


def _w2_positions(batch: int) -> np.ndarray:
    # One position per sequence: 16 sequences of varied lengths (a decode step).
    return _rng().integers(17, 4000, size=(batch, 1, 1))


WORKLOADS: dict[str, Workload] = {w.key: w for w in [
    Workload("w1_oop", "W1 RoPE prefill, out-of-place", (1, 32, 4096, 128), (1, 32, 256, 128),
             1.15, "copy", "np.copyto(out, x)", _rope),
    Workload("w1_inplace", "W1 RoPE prefill, in place", (1, 32, 4096, 128), (1, 32, 256, 128),
             1.3, "multiply", "np.multiply(x, 1, out=x)",
             lambda dt, s: _rope(dt, s, in_place=True)),
    Workload("w1_oop_interleaved", "W1 RoPE prefill, interleaved, out-of-place", (1, 32, 4096, 128),
             (1, 32, 256, 128), 1.15, "copy", "np.copyto(out, x)",
             lambda dt, s: _rope(dt, s, layout="interleaved"), kinds=("posenc_fast", "limit")),
    Workload("w1_inplace_interleaved", "W1 RoPE prefill, interleaved, in place", (1, 32, 4096, 128),
             (1, 32, 256, 128), 1.3, "multiply", "np.multiply(x, 1, out=x)",
             lambda dt, s: _rope(dt, s, in_place=True, layout="interleaved"), kinds=("posenc_fast", "limit")),
    Workload("w2_decode", "W2 decode step, 16 sequences", (16, 32, 1, 128), (16, 32, 1, 128),
             2.5, "copy", "np.copyto(out, x)",
             lambda dt, s: _rope(dt, s, positions=_w2_positions(s[0])), threaded=False),
    Workload("w3_token", "W3 one token (offset=4096)", (1, 32, 1, 128), (1, 32, 1, 128),
             2.5, "copy", "np.copyto(out, x)",
             lambda dt, s: _rope(dt, s, offset=W3_OFFSET), threaded=False),
    Workload("w4_cos_sin", "W4 cos/sin table", (131072, 64), (8192, 64),
             2.0, "alloc_fill", "np.empty + fill of both", _cos_sin, ulps=True),
    Workload("w5_sinusoidal_131072x128", "W5 sinusoidal_table", (131072, 128), (8192, 128),
             2.0, "fill", "out.fill(1.0)", _sinusoidal, ulps=True),
    Workload("w5_sinusoidal_8192x1024", "W5 sinusoidal_table", (8192, 1024), (512, 1024),
             2.0, "fill", "out.fill(1.0)", _sinusoidal, ulps=True),
    Workload("apply_qk", "apply_qk q+k (GQA 32/8 heads)",
             ((1, 32, 4096, 128), (1, 8, 4096, 128)), ((1, 32, 256, 128), (1, 8, 256, 128)),
             1.15, "copy", "np.copyto q and k", _apply_qk),
    Workload("alibi", "add_alibi in place", (32, 4096, 4096), (32, 256, 256),
             1.3, "multiply", "np.multiply(s, 1, out=s)", _alibi, big=True, dtypes=("float32",),
             kinds=("posenc_fast", "limit", "numpy", "torch")),
    Workload("alibi_exact", "add_alibi in place, against the exact loop", (32, 256, 256), (8, 64, 64),
             1.15, "exact_add", "x += a float64 row, rounded once (posenc_fast's add loop)", _alibi,
             dtypes=("float32",), kinds=("posenc_fast", "limit")),
    Workload("position_table", "add_position_table in place", (8, 2048, 1024), (8, 256, 1024),
             1.3, "multiply", "np.multiply(x, 1, out=x)", _position_table,
             kinds=("posenc_fast", "limit", "numpy")),
]}

# What `python -m posenc_fast bench` runs (issue 7's list).
CLI_WORKLOADS = ("w1_oop", "w1_inplace", "w2_decode", "w3_token", "w4_cos_sin",
                 "w5_sinusoidal_131072x128", "w5_sinusoidal_8192x1024")


def build_case(key: str, dtype, small: bool = False, shape: tuple | None = None) -> Case:
    """Build workload `key` at `dtype` and `shape` (default: its own, or small: the reduced one)."""
    return WORKLOADS[key].case(dtype, small, shape)


def small_from_environment() -> bool:
    """True when POSENC_FAST_BENCH_SMALL asks for the reduced shapes."""
    return os.environ.get("POSENC_FAST_BENCH_SMALL", "").strip() not in ("", "0")
