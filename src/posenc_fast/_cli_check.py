"""``python -m posenc_fast check``: test this installation against ``posenc_fast.reference``.

Draws a few hundred small random cases (shapes, dtypes, memory layouts,
offsets, forms of positions, inverse, in-place, partial rotary, scalings) for
every public function that has a reference, compares the compiled result
with the pure-Python one and prints ``N passed, M failed``.  Cases are small
because the reference is plain Python loops; the whole run takes seconds.

Tolerances: `posenc_fast._tolerance.tolerance` (float32 within ``2e-6 *
(|want| + scale)``, where ``scale`` is the magnitude of the inputs of that row;
float64 within ``1e-12 * (|want| + scale)`` plus four ulps of the angle).
The draws of a case and the comparison of its results:
`posenc_fast._cli_check_draw`.
"""

import argparse
import math
import time
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from ._cli_check_draw import Array, Comparison, Draw, row_scale

# The data types drawn: every one the kernels take.
DTYPES = (np.float32, np.float64, np.float16, ml_dtypes.bfloat16)

MAX_FAILURES_SHOWN = 20
# Original context length of the scaled cases: small, so that "dynamic" and
# "longrope" switch frequencies inside the drawn position ranges.
ORIGINAL_LENGTH = 48


# ---------------------------------------------------------------------------
# cases: each draws its arguments, calls posenc_fast and the reference, and
# returns the comparisons


def _sinusoidal_table(pf: Any, ref: Any, d: Draw) -> list[Comparison]:
    length, dim = d.integer(0, 40, "length"), d.integer(1, 40, "dim")
    offset = d.offset()
    base = d.pick((10000.0, 10000.0, 500.0, 1e6), "base")
    layout = d.pick(("interleaved", "split"), "layout")
    dtype = d.pick(DTYPES, "dtype")
    out, _ = d.out_for(np.empty((length, dim), dtype))
    got = pf.sinusoidal_table(length, dim, offset=offset, base=base, layout=layout, dtype=dtype,
                              out=out)
    want = ref.sinusoidal_table(length, dim, offset=offset, base=base, layout=layout)
    angle = np.abs(offset + np.arange(length, dtype=np.float64))[:, None]
    return [Comparison("table", got, want, dtype, angle=angle, same_as=out)]


def _sinusoidal(pf: Any, ref: Any, d: Draw) -> list[Comparison]:
    shape = d.pick(((), (5,), (3, 4), (2, 1, 3)), "shape")
    positions = d.positions(shape)
    dim = d.integer(1, 24, "dim")
    layout = d.pick(("interleaved", "split"), "layout")
    dtype = d.pick(DTYPES, "dtype")
    as_list = d.pick((False, True))
    got = pf.sinusoidal(positions.tolist() if as_list else positions, dim, layout=layout,
                        dtype=dtype)
    want = ref.sinusoidal(positions, dim, layout=layout)
    angle = np.abs(np.asarray(positions, dtype=np.float64))[..., None]
    return [Comparison("encoding", got, want, dtype, angle=angle)]


def _add_sinusoidal(pf: Any, ref: Any, d: Draw) -> list[Comparison]:
    batch, seq, dim = d.pick(((), (2,), (2, 3))), d.integer(1, 12), d.integer(1, 20)
    dtype = d.pick(DTYPES, "dtype")
    x = d.data(batch + (seq, dim), dtype)
    d.note("shape", x.shape)
    form = d.pick(("none", "seq", "full"), "positions_form")
    positions = None if form == "none" else d.positions((seq,) if form == "seq" else x.shape[:-1])
    offset = d.offset()
    base = d.pick((10000.0, 100.0), "base")
    x0 = x.copy()
    out, _ = d.out_for(x)
    got = pf.add_sinusoidal(x, positions=positions, offset=offset, base=base, out=out)
    want = ref.add_sinusoidal(x0, positions=positions, offset=offset, base=base)
    where = np.arange(seq) if positions is None else positions
    angle = np.broadcast_to(np.abs(np.asarray(where, dtype=np.float64) + offset),
                            x.shape[:-1])[..., None]
    return [Comparison("sum", got, want, dtype, scale=row_scale(x0) + 1, angle=angle,
                       same_as=out)]


def _add_position_table(pf: Any, ref: Any, d: Draw) -> list[Comparison]:
    batch, seq, dim = d.pick(((), (2,), (2, 2))), d.integer(1, 10), d.integer(1, 24)
    dtype = d.pick(DTYPES, "dtype")
    table_dtype = d.pick(DTYPES, "table_dtype")
    max_len = d.integer(seq + 8, 60, "max_len")
    x = d.data(batch + (seq, dim), dtype)
    d.note("shape", x.shape)
    table = d.data((max_len, dim), table_dtype, "table")
    offset = d.integer(0, 4, "offset")
    form = d.pick(("none", "seq", "full", "per-sequence"), "positions_form")
    if form == "none":
        positions = None
    elif form == "seq":
        positions = d.rng.integers(0, max_len - offset, seq)
    elif form == "full":
        positions = d.rng.integers(0, max_len - offset, x.shape[:-1])
    else:
        positions = d.rng.integers(0, max_len - offset, x.shape[:-2] + (1,))
    x0 = x.copy()
    out, _ = d.out_for(x)
    got = pf.add_position_table(x, table, positions, offset=offset, out=out)
    want = ref.add_position_table(x0, table, positions, offset=offset)
    scale = row_scale(x0) + np.max(np.abs(table.astype(np.float64)))
    return [Comparison("sum", got, want, dtype, scale=scale, same_as=out)]


def _scaling_dict(method: str, rotary_dim: int, factor: float) -> dict[str, Any] | None:
    original = {"original_max_position_embeddings": ORIGINAL_LENGTH}
    if method == "none":
        return None
    if method in ("linear", "ntk"):
        return {"rope_type": method, "factor": factor}
    if method in ("dynamic", "yarn"):
        return {"rope_type": method, "factor": factor, **original}
    if method == "llama3":
        return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, **original}
    pairs = rotary_dim // 2
    return {"rope_type": "longrope", "factor": factor, **original,
            "short_factor": [1.0 + 0.1 * i for i in range(pairs)],
            "long_factor": [1.0 + 0.5 * i for i in range(pairs)]}


SCALING_METHODS = ("none", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope")


def _rope(pf: Any, d: Draw) -> Any:
    method = d.pick(SCALING_METHODS, "scaling")
    # NTK-style bases divide by rotary_dim - 2: those need two pairs at least.
    fewest = 2 if method in ("ntk", "dynamic") else 1
    dim = 2 * d.integer(fewest, 16, "dim")
    partial = d.pick((False, False, True))
    rotary_dim = 2 * d.integer(fewest, dim // 2, "rotary_dim") if partial else None
    layout = d.pick(("interleaved", "half"), "layout")
    base = d.pick((10000.0, 10000.0, 500000.0), "base")
    scaling = _scaling_dict(method, rotary_dim or dim, float(d.pick((2.0, 4.0, 8.0))))
    return pf.RotaryEmbedding(dim, base=base, rotary_dim=rotary_dim, layout=layout,
                              scaling=scaling)


def _rope_input(d: Draw, dim: int, dtype: Any, label: str = "x",
                heads: int | None = None) -> tuple[Array, Any, int, str]:
    """Draw ``(x, positions, seq_axis, form)`` for one call of ``apply``."""
    form = d.pick(("bhsd", "bshd", "seq", "per-sequence", "decode", "tokens"), "form")
    b, h, s = d.integer(1, 2), heads or d.integer(1, 3), d.integer(1, 9)
    positions: Any = None
    seq_axis = -2
    if form == "bhsd":
        shape: tuple[int, ...] = (b, h, s, dim)
    elif form == "bshd":
        shape, seq_axis = (b, s, h, dim), -3
    elif form == "seq":
        shape, positions = (b, h, s, dim), d.positions((s,))
    elif form == "per-sequence":
        shape, positions = (b, h, s, dim), d.positions((b, 1, s))
    elif form == "decode":
        shape, positions = (b, h, 1, dim), int(d.positions(()))
    else:
        shape, positions = (s, h, dim), d.positions((s, 1))
    return d.data(shape, dtype, label), positions, seq_axis, form


def _call_positions(x_lead: tuple[int, ...], positions: Any, offset: float,
                    seq_axis: int) -> Array:
    """Every row's position (float64, shape `x_lead`) as the API defines it."""
    if positions is None:
        n = x_lead[seq_axis + 1]
        along = np.arange(n, dtype=np.float64).reshape((n,) + (1,) * (-seq_axis - 2))
        return np.broadcast_to(along + offset, x_lead)
    return np.broadcast_to(np.asarray(positions, dtype=np.float64) + offset, x_lead)


def _rotated(ref: Any, rope: Any, x: Array, where: Array, inverse: bool,
             name: str, got: Any, out: Array | None) -> Comparison:
    seq_len = max(1, math.floor(where.max()) + 1) if where.size else 1
    inv_freq = np.asarray(rope.inv_freq_for(seq_len))
    want = ref.apply_rotary(x, where, inv_freq.tolist(), layout=rope.layout,
                            attention_factor=rope.attention_factor, inverse=inverse)
    factor = rope.attention_factor
    scale = row_scale(x) * max(factor, 1 / factor)
    angle = np.abs(where)[..., None] * np.max(inv_freq)
    return Comparison(name, got, want, x.dtype, scale=scale, angle=angle, same_as=out)


def _rotary_apply(pf: Any, ref: Any, d: Draw) -> list[Comparison]:
    rope = _rope(pf, d)
    dtype = d.pick(DTYPES, "dtype")
    x, positions, seq_axis, _ = _rope_input(d, rope.dim, dtype)
    offset = d.offset()
    inverse = d.pick((False, True), "inverse")
    x0 = x.copy()
    out, _ = d.out_for(x)
    got = rope.apply(x, positions, offset=offset, seq_axis=seq_axis, inverse=inverse, out=out)
    where = _call_positions(x.shape[:-1], positions, offset, seq_axis)
    return [_rotated(ref, rope, x0, where, inverse, "x", got, out)]


def _rotary_apply_qk(pf: Any, ref: Any, d: Draw) -> list[Comparison]:
    rope = _rope(pf, d)
    q_dtype = d.pick(DTYPES, "q_dtype")
    k_dtype = d.pick((q_dtype, np.float32, np.float64), "k_dtype")
    q, positions, seq_axis, form = _rope_input(d, rope.dim, q_dtype, "q", heads=4)
    # Grouped-query attention: k has fewer heads than q.
    kv_heads = d.pick((4, 2, 1), "kv_heads")
    head_axis = -2 if form in ("bshd", "tokens") else -3
    k_shape = list(q.shape)
    k_shape[head_axis] = kv_heads
    k = d.data(tuple(k_shape), k_dtype, "k")
    offset = d.offset()
    inverse = d.pick((False, True), "inverse")
    q0, k0 = q.copy(), k.copy()
    out_q, _ = d.out_for(q, "out_q")
    out_k, _ = d.out_for(k, "out_k")
    got_q, got_k = rope.apply_qk(q, k, positions, offset=offset, seq_axis=seq_axis,
                                 inverse=inverse, out_q=out_q, out_k=out_k)
    return [_rotated(ref, rope, q0, _call_positions(q.shape[:-1], positions, offset, seq_axis),
                     inverse, "q", got_q, out_q),
            _rotated(ref, rope, k0, _call_positions(k.shape[:-1], positions, offset, seq_axis),
                     inverse, "k", got_k, out_k)]


def _rotary_cos_sin(pf: Any, ref: Any, d: Draw) -> list[Comparison]:
    rope = _rope(pf, d)
    shape = d.pick(((), (7,), (2, 5)), "shape")
    positions = d.positions(shape)
    dtype = d.pick(DTYPES, "dtype")
    cos, sin = rope.cos_sin(positions, dtype=dtype)
    where = np.asarray(positions, dtype=np.float64)
    seq_len = max(1, math.floor(where.max()) + 1) if where.size else 1
    inv_freq = np.asarray(rope.inv_freq_for(seq_len))
    want_cos, want_sin = ref.rope_cos_sin(where, inv_freq.tolist(), rope.attention_factor)
    angle = np.abs(where)[..., None] * np.max(inv_freq)
    scale = rope.attention_factor
    return [Comparison("cos", cos, want_cos, dtype, scale=scale, angle=angle),
            Comparison("sin", sin, want_sin, dtype, scale=scale, angle=angle)]


def _rotary_inv_freq(pf: Any, ref: Any, d: Draw) -> list[Comparison]:
    rotary_dim = 2 * d.integer(1, 32)
    d.note("rotary_dim", rotary_dim)
    base = d.pick((10000.0, 500000.0, 1e6), "base")
    factor = d.pick((None, 2.0, 8.0), "linear_factor")
    scaling = None if factor is None else {"rope_type": "linear", "factor": factor}
    rope = pf.RotaryEmbedding(rotary_dim, base=base, scaling=scaling)
    want = np.array(ref.rope_inv_freq(rotary_dim, base)) / (factor or 1.0)
    # NumPy's and libm's pow may differ by an ulp: allow a few ulps.
    return [Comparison("inv_freq", rope.inv_freq, want, np.float64, scale=0.0,
                       angle=np.abs(want))]


def _apply_rotary(pf: Any, ref: Any, d: Draw) -> list[Comparison]:
    dim = 2 * d.integer(1, 16)
    rotary_dim = d.pick((None, None, 2 * d.integer(1, dim // 2)), "rotary_dim")
    base = d.pick((10000.0, 1e6), "base")
    factor = d.pick((1.0, 1.0, 4.0), "interpolation_factor")
    layout = d.pick(("interleaved", "half"), "layout")
    dtype = d.pick(DTYPES, "dtype")
    x, positions, seq_axis, _ = _rope_input(d, dim, dtype)
    offset = d.offset()
    inverse = d.pick((False, True), "inverse")
    x0 = x.copy()
    out, _ = d.out_for(x)
    got = pf.apply_rotary(x, positions, base=base, interpolation_factor=factor, layout=layout,
                          rotary_dim=rotary_dim, offset=offset, seq_axis=seq_axis,
                          inverse=inverse, out=out)
    where = _call_positions(x.shape[:-1], positions, offset, seq_axis)
    inv_freq = np.array(ref.rope_inv_freq(rotary_dim or dim, base)) / factor
    want = ref.apply_rotary(x0, where, inv_freq.tolist(), layout=layout, inverse=inverse)
    angle = np.abs(where)[..., None] * inv_freq[0]
    return [Comparison("x", got, want, dtype, scale=row_scale(x0), angle=angle, same_as=out)]


def _cos_sin_args(ref: Any, d: Draw, x_lead: tuple[int, ...], seq_axis: int, dim: int,
                  dtype: Any) -> tuple[Array, Array, Any, Array, Array]:
    """Draw a cache form; return ``(cos, sin, positions, row positions, inv_freq)``."""
    r = d.pick((dim, dim, 2 * d.integer(1, dim // 2)), "r")
    inv_freq = np.array(ref.rope_inv_freq(r, 10000.0))
    # float32 caches only for float32 and half data (a float64 result must not see
    # float32 rounding); half data take float32 or their own type.
    cache_dtype = {np.dtype(np.float32): (np.float32, np.float64),
                   np.dtype(np.float64): (np.float64,)}.get(np.dtype(dtype), (np.float32, dtype))
    cache_dtype = d.pick(cache_dtype)
    d.note("cache_dtype", cache_dtype)
    cos_t, sin_t = ref.rope_cos_sin(np.arange(64, dtype=np.float64), inv_freq.tolist())
    cos_t, sin_t = cos_t.astype(cache_dtype), sin_t.astype(cache_dtype)
    if d.pick(("broadcast", "indexed"), "cache_form") == "indexed":
        positions = d.rng.integers(0, len(cos_t), x_lead)
        return cos_t, sin_t, positions, positions.astype(np.float64), inv_freq
    # No positions: cache row j belongs to sequence position j, broadcast over x.
    n = x_lead[seq_axis + 1]
    rows = np.arange(n).reshape((n,) + (1,) * (-seq_axis - 2))
    where = _call_positions(x_lead, None, 0.0, seq_axis)
    return cos_t[rows], sin_t[rows], None, where, inv_freq


def _apply_rotary_cos_sin(pf: Any, ref: Any, d: Draw) -> list[Comparison]:
    dim = 2 * d.integer(1, 16)
    dtype = d.pick(DTYPES, "dtype")
    x, _, seq_axis, _ = _rope_input(d, dim, dtype)
    cos, sin, positions, where, inv_freq = _cos_sin_args(ref, d, x.shape[:-1], seq_axis, dim,
                                                         dtype)
    layout = d.pick(("interleaved", "half"), "layout")
    inverse = d.pick((False, True), "inverse")
    x0 = x.copy()
    out, _ = d.out_for(x)
    got = pf.apply_rotary_cos_sin(x, cos, sin, positions, layout=layout, inverse=inverse,
                                  out=out)
    want = ref.apply_rotary(x0, where, inv_freq.tolist(), layout=layout, inverse=inverse)
    return [Comparison("x", got, want, dtype, scale=row_scale(x0), same_as=out)]


def _apply_rotary_cos_sin_qk(pf: Any, ref: Any, d: Draw) -> list[Comparison]:
    dim = 2 * d.integer(1, 16)
    dtype = d.pick(DTYPES, "dtype")
    q, _, seq_axis, _ = _rope_input(d, dim, dtype, "q")
    k = d.data(q.shape, dtype, "k")
    cos, sin, positions, where, inv_freq = _cos_sin_args(ref, d, q.shape[:-1], seq_axis, dim,
                                                         dtype)
    layout = d.pick(("interleaved", "half"), "layout")
    inverse = d.pick((False, True), "inverse")
    q0, k0 = q.copy(), k.copy()
    out_q, _ = d.out_for(q, "out_q")
    out_k, _ = d.out_for(k, "out_k")
    got_q, got_k = pf.apply_rotary_cos_sin_qk(q, k, cos, sin, positions, layout=layout,
                                              inverse=inverse, out_q=out_q, out_k=out_k)
    freqs = inv_freq.tolist()
    return [Comparison(name, got, ref.apply_rotary(x0, where, freqs, layout=layout,
                                                   inverse=inverse),
                       dtype, scale=row_scale(x0), same_as=out)
            for name, got, x0, out in (("q", got_q, q0, out_q), ("k", got_k, k0, out_k))]


def _alibi_slopes(pf: Any, ref: Any, d: Draw) -> list[Comparison]:
    heads = d.integer(1, 40, "num_heads")
    return [Comparison("slopes", pf.alibi_slopes(heads), np.asarray(ref.alibi_slopes(heads)),
                       np.float64, scale=0.0)]


def _alibi_bias(pf: Any, ref: Any, d: Draw) -> list[Comparison]:
    heads, q_len = d.integer(1, 12, "num_heads"), d.integer(1, 9, "q_len")
    k_len = d.pick((None, q_len + d.integer(0, 9)), "k_len")
    offset = d.integer(0, 20, "offset")
    causal = d.pick((True, False), "causal")
    dtype = d.pick(DTYPES, "dtype")
    got = pf.alibi_bias(heads, q_len, k_len, offset=offset, causal=causal, dtype=dtype)
    want = np.asarray(ref.alibi_bias(heads, q_len, k_len, offset=offset, causal=causal),
                      dtype=np.float64)
    return [Comparison("bias", got, want, dtype, scale=0.0)]


def _add_alibi(pf: Any, ref: Any, d: Draw) -> list[Comparison]:
    heads, q_len, k_len = d.integer(1, 8, "num_heads"), d.integer(1, 7, "q_len"), d.integer(1, 9, "k_len")
    dtype = d.pick(DTYPES, "dtype")
    scores = d.data(d.pick(((), (2,))) + (heads, q_len, k_len), dtype, "scores")
    offset = d.integer(0, 20, "offset")
    causal = d.pick((True, False), "causal")
    scores0 = scores.copy()
    out, _ = d.out_for(scores)
    got = pf.add_alibi(scores, offset=offset, causal=causal, out=out)
    want = np.asarray(ref.add_alibi(scores0, offset=offset, causal=causal), dtype=np.float64)
    return [Comparison("scores", got, want, dtype, scale=row_scale(scores0), same_as=out)]


def _relative_position_index(pf: Any, ref: Any, d: Draw) -> list[Comparison]:
    q_len = d.integer(1, 12, "q_len")
    k_len = d.pick((None, d.integer(1, 12)), "k_len")
    max_distance, offset = d.integer(1, 10, "max_distance"), d.integer(0, 10, "offset")
    got = pf.relative_position_index(q_len, k_len, max_distance=max_distance, offset=offset)
    want = np.asarray(ref.relative_position_index(q_len, k_len, max_distance=max_distance,
                                                  offset=offset))
    return [Comparison("index", got, want, np.int64)]


def _t5_relative_bucket(pf: Any, ref: Any, d: Draw) -> list[Comparison]:
    q_len = d.integer(1, 40, "q_len")
    k_len = d.pick((None, d.integer(1, 200)), "k_len")
    bidirectional = d.pick((True, False), "bidirectional")
    num_buckets = d.pick((8, 32, 33), "num_buckets")
    # T5 needs max_distance above its exact buckets (num_buckets/4 or /2).
    max_distance, offset = d.pick((20, 128), "max_distance"), d.integer(0, 300, "offset")
    kwargs = dict(bidirectional=bidirectional, num_buckets=num_buckets,
                  max_distance=max_distance, offset=offset)
    got = pf.t5_relative_bucket(q_len, k_len, **kwargs)
    want = np.asarray(ref.t5_relative_bucket(q_len, k_len, **kwargs))
    return [Comparison("bucket", got, want, np.int64)]


def _threads_agree(pf: Any, ref: Any, d: Draw) -> list[Comparison]:
    # Too large for the reference: threads=N must equal threads=1 bitwise.
    dtype = d.pick(DTYPES, "dtype")
    layout = d.pick(("interleaved", "half"), "layout")
    x = d.rng.standard_normal((2, 4, 256, 64)).astype(dtype)
    rope = pf.RotaryEmbedding(64, layout=layout)
    threads = pf.get_num_threads()
    try:
        pf.set_num_threads(1)
        one = (rope.apply(x, offset=12345), pf.sinusoidal_table(2048, 64, dtype=dtype))
    finally:
        pf.set_num_threads(threads)
    many = (rope.apply(x, offset=12345), pf.sinusoidal_table(2048, 64, dtype=dtype))
    return [Comparison(f"{name} threads={threads} vs 1", got, want.astype(np.float64), dtype,
                       scale=0.0)
            for name, got, want in zip(("rotate", "table"), many, one)]


Case = Callable[[Any, Any, Draw], list[Comparison]]


CASES: dict[str, Case] = {
    "sinusoidal_table": _sinusoidal_table,
    "sinusoidal": _sinusoidal,
    "add_sinusoidal": _add_sinusoidal,
    "add_position_table": _add_position_table,
    "RotaryEmbedding.inv_freq": _rotary_inv_freq,
    "RotaryEmbedding.apply": _rotary_apply,
    "RotaryEmbedding.apply_qk": _rotary_apply_qk,
    "RotaryEmbedding.cos_sin": _rotary_cos_sin,
    "apply_rotary": _apply_rotary,
    "apply_rotary_cos_sin": _apply_rotary_cos_sin,
    "apply_rotary_cos_sin_qk": _apply_rotary_cos_sin_qk,
    "alibi_slopes": _alibi_slopes,
    "alibi_bias": _alibi_bias,
    "add_alibi": _add_alibi,
    "relative_position_index": _relative_position_index,
    "t5_relative_bucket": _t5_relative_bucket,
}


def cases(pf: Any) -> dict[str, Case]:
    """Return the cases to run, by name: `CASES`, and the thread check when threads > 1."""
    return {**CASES, "threads": _threads_agree} if pf.get_num_threads() > 1 else dict(CASES)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``check``."""
    parser.add_argument("--cases", type=int, default=500, metavar="N",
                        help="number of random cases (default 500)")
    parser.add_argument("--seed", type=int, default=0, metavar="S",
                        help="random seed (default 0)")


def run(args: argparse.Namespace) -> int:
    """Run the cases; print failures and ``N passed, M failed``; return 0 iff none failed."""
    import posenc_fast as pf
    from posenc_fast import reference as ref

    if args.cases < 1:
        raise SystemExit("check: --cases must be >= 1")
    if args.seed < 0:
        raise SystemExit("check: --seed must be >= 0")
    info = pf.build_info()
    available = cases(pf)
    print(f"posenc_fast {info['version']} ({info['isa_in_use']}, {info['num_threads']} threads, "
          f"thread pool {'yes' if info['thread_pool'] else 'no'}): {args.cases} cases, seed {args.seed}, "
          f"{len(available)} functions, RoPE scalings: {', '.join(SCALING_METHODS[1:])}")
    names = list(available)
    rng = np.random.default_rng(args.seed)
    passed = failed = 0
    start = time.perf_counter()
    for number in range(args.cases):
        name = names[number % len(names)]
        draw = Draw(rng)
        try:
            problems = [p for c in available[name](pf, ref, draw) if (p := c.problem())]
        except Exception as exc:  # a crash of one case is a failure, not the end of the run
            problems = [f"raised {type(exc).__name__}: {exc}"]
        if not problems:
            passed += 1
            continue
        failed += 1
        if failed <= MAX_FAILURES_SHOWN:
            print(f"FAIL #{number} {name}({', '.join(draw.facts)}): {'; '.join(problems)}")
    if failed > MAX_FAILURES_SHOWN:
        print(f"... and {failed - MAX_FAILURES_SHOWN} more failures")
    print(f"took {time.perf_counter() - start:.1f} s")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1
