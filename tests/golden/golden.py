"""Hashes of results over a fixed set of calls: the bitwise record of the kernels.

``python tests/golden/golden.py record`` writes ``golden.json`` beside this
file (``record-new`` adds the calls not yet recorded and keeps the rest); ``python tests/golden/golden.py check`` recomputes every hash and exits
non-zero on a difference.  ``test_golden.py`` runs ``check`` under every ISA
variant the CPU supports and several thread counts: a refactor of the kernels
must reproduce the record bit for bit.
"""

import hashlib
import itertools
import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

import posenc_fast as pf

RECORD = Path(__file__).with_name("golden.json")


def _hash(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:24]


def _data(shape, dtype, seed):
    x = np.random.default_rng(seed).standard_normal(shape)
    if np.dtype(dtype) == np.dtype(ml_dtypes.bfloat16):
        # through float32, rounded once from there: ml_dtypes 0.7 rounds float64 to bfloat16
        # directly, 0.5-0.6 through float32 (the record's inputs), which can differ by an ulp
        x = x.astype(np.float32)
    return x.astype(dtype)


def _in_place(function, x, *args, **kwargs):
    """A call of function on a copy of x in place (function(copy, ..., out=copy))."""
    def call():
        y = x.copy()
        function(y, *args, out=y, **kwargs)
        return y
    return call


def _rope_calls(dtype, name):
    rng_positions = np.random.default_rng(7).integers(0, 1 << 20, size=(37,))
    for layout in ("half", "interleaved"):
        for rotary_dim in (None, 48, 2):
            tag = f"{name}-{layout}-{rotary_dim}"
            rope = pf.RotaryEmbedding(64, layout=layout, rotary_dim=rotary_dim)
            x = _data((2, 3, 37, 64), dtype, 1)
            yield f"rope.apply-{tag}", lambda r=rope, x=x: r.apply(x)
            yield f"rope.apply-offset-{tag}", lambda r=rope, x=x: r.apply(x, offset=4093)
            yield (f"rope.apply-positions-{tag}",
                   lambda r=rope, x=x: r.apply(x, rng_positions))
            yield (f"rope.apply-float-positions-{tag}",
                   lambda r=rope, x=x: r.apply(x, rng_positions + 0.25))
            yield (f"rope.inverse-{tag}",
                   lambda r=rope, x=x: r.apply(x, offset=77, inverse=True))

            yield f"rope.apply-in-place-{tag}", _in_place(rope.apply, x, offset=5)
            k = _data((2, 1, 37, 64), dtype, 2)
            yield (f"rope.apply_qk-{tag}",
                   lambda r=rope, x=x, k=k: r.apply_qk(x, k, offset=1000))
            yield (f"apply_rotary-{tag}",
                   lambda x=x, layout=layout, rd=rotary_dim: pf.apply_rotary(
                       x, layout=layout, rotary_dim=rd, interpolation_factor=4.0))
        cos, sin = pf.RotaryEmbedding(64, layout=layout).cos_sin(np.arange(300), dtype=dtype)
        x = _data((2, 4, 300, 64), dtype, 3)
        k = _data((2, 2, 300, 64), dtype, 4)
        yield (f"apply_rotary_cos_sin-{name}-{layout}",
               lambda x=x, c=cos, s=sin, lay=layout: pf.apply_rotary_cos_sin(x, c, s, layout=lay))
        yield (f"apply_rotary_cos_sin-sliced-{name}-{layout}",
               lambda x=x, c=cos, s=sin, lay=layout: pf.apply_rotary_cos_sin(
                   x[..., :48], c[:, :24], s[:, :24], layout=lay))
        yield (f"apply_rotary_cos_sin-positions-{name}-{layout}",
               lambda x=x, c=cos, s=sin, lay=layout: pf.apply_rotary_cos_sin(
                   x, c, s, np.arange(300)[::-1].copy(), layout=lay))
        yield (f"apply_rotary_cos_sin_qk-{name}-{layout}",
               lambda x=x, k=k, c=cos, s=sin, lay=layout: pf.apply_rotary_cos_sin_qk(
                   x, k, c, s, layout=lay))
        # Past the prefetch (512 KiB) and streaming (16 MiB) thresholds.
        big = _data((1, 8, 2200 if dtype == np.float64 else 4400, 128), dtype, 5)
        rope = pf.RotaryEmbedding(128, layout=layout)
        yield f"rope.apply-17MiB-{name}-{layout}", lambda r=rope, b=big: r.apply(b)

        yield f"rope.apply-17MiB-in-place-{name}-{layout}", _in_place(rope.apply, big)
    for scaling in ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
                    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                    {"rope_type": "dynamic", "factor": 2.0,
                     "original_max_position_embeddings": 1024}):
        rope = pf.RotaryEmbedding(128, layout="half", scaling=scaling)
        x = _data((1, 2, 3000, 128), dtype, 6)
        yield f"rope.scaled-{scaling['rope_type']}-{name}", lambda r=rope, x=x: r.apply(x)
        yield (f"rope.cos_sin-{scaling['rope_type']}-{name}",
               lambda r=rope: r.cos_sin(np.arange(0, 70000, 7), dtype=dtype))


def _table_calls(dtype, name):
    yield f"sinusoidal_table-{name}", lambda: pf.sinusoidal_table(5000, 130, dtype=dtype)
    yield (f"sinusoidal_table-offset-{name}",
           lambda: pf.sinusoidal_table(700, 63, offset=(1 << 20) - 3, dtype=dtype))
    yield (f"sinusoidal-{name}",
           lambda: pf.sinusoidal(np.linspace(0, 1000, 257), 64, dtype=dtype))
    x = _data((3, 600, 96), dtype, 8)
    yield f"add_sinusoidal-{name}", lambda x=x: pf.add_sinusoidal(x, offset=11)
    table = _data((900, 96), np.float32, 9)
    yield (f"add_position_table-{name}",
           lambda x=x, t=table: pf.add_position_table(x, t, offset=250))
    scores = _data((8, 300, 300), dtype, 10)
    yield f"add_alibi-{name}", lambda s=scores: pf.add_alibi(s)
    yield f"add_alibi-noncausal-{name}", lambda s=scores: pf.add_alibi(s, causal=False, offset=9)
    yield f"alibi_bias-{name}", lambda: pf.alibi_bias(12, 40, 70, dtype=dtype)
    # In place: the explicit-vector rows (8 heads: power-of-two slopes), rows
    # longer than the 512-distance ramp, distances near 2**24.
    for heads in (8, 12):
        long_rows = _data((heads, 3, 1100), dtype, 16)
        for causal, offset in ((True, 0), (False, 550), (True, (1 << 24) - 600)):
            yield (f"add_alibi-in-place-{heads}-{causal}-{offset}-{name}",
                   _in_place(pf.add_alibi, long_rows, causal=causal, offset=offset))


def _int_calls():
    yield "alibi_slopes", lambda: pf.alibi_slopes(24)
    yield "relative_position_index", lambda: pf.relative_position_index(33, 50, max_distance=7)
    yield "t5_relative_bucket", lambda: pf.t5_relative_bucket(64, 90, bidirectional=False)


def _half_calls():
    # Added with the half types (recorded on their first build).
    for dtype, name in ((np.float16, "f16"), (ml_dtypes.bfloat16, "bf16")):
        for layout in ("half", "interleaved"):
            rope = pf.RotaryEmbedding(64, layout=layout, rotary_dim=48)
            x = _data((2, 3, 37, 64), dtype, 11)
            yield f"rope.apply-{name}-{layout}", lambda r=rope, x=x: r.apply(x, offset=4093)
            yield (f"rope.apply_qk-{name}-{layout}",
                   lambda r=rope, x=x: r.apply_qk(x, x[:, :1].copy(), inverse=True))
            big = _data((1, 8, 9000, 128), dtype, 12)  # past the streaming threshold
            yield (f"rope.apply-big-{name}-{layout}",
                   lambda b=big, lay=layout: pf.RotaryEmbedding(128, layout=lay).apply(b))
        yield (f"cos_sin-{name}",
               lambda d=dtype: pf.RotaryEmbedding(64).cos_sin(np.arange(0, 9000, 3), dtype=d))
        yield f"sinusoidal_table-{name}", lambda d=dtype: pf.sinusoidal_table(900, 65, dtype=d)
        yield (f"add_alibi-{name}",
               lambda d=dtype: pf.add_alibi(_data((8, 64, 64), d, 13), causal=False))
        yield (f"add_position_table-{name}",
               lambda d=dtype: pf.add_position_table(_data((3, 50, 16), d, 14),
                                                     _data((60, 16), np.float64, 15)))


def _one_position_calls():
    # Added with the rows of one position (posenc_position.h): a token's heads
    # in one kernel call, recorded from the row-by-row kernels before it.
    # 68 pairs: whole groups of vectors and a rest, in every variant.
    for dtype, name in ((np.float32, "f32"), (np.float64, "f64"), (np.float16, "f16"),
                        (ml_dtypes.bfloat16, "bf16")):
        for layout in ("half", "interleaved"):
            for rotary_dim in (None, 120):
                tag = f"{name}-{layout}-{rotary_dim}"
                rope = pf.RotaryEmbedding(136, layout=layout, rotary_dim=rotary_dim)
                x = _data((2, 5, 1, 136), dtype, 16)
                yield f"rope.one-position-{tag}", lambda r=rope, x=x: r.apply(x, offset=4093)
                yield (f"rope.one-position-inverse-{tag}",
                       lambda r=rope, x=x: r.apply(x, offset=70, inverse=True))

                yield f"rope.one-position-in-place-{tag}", _in_place(rope.apply, x, 9)
            yield (f"rope.one-position-shifted-{name}-{layout}",
                   lambda d=dtype, lay=layout: _shifted_one_position(d, lay))


def _half_vector_loop_calls():
    # Added with the half types' rows of one position in vector groups and their heads' rows in cache
    # by the vector loops alone (posenc_position.h), recorded from the row-by-row kernels before
    # them: head sizes whose pairs fill the groups under AVX-512 (128, 256) or AVX2 (also 64, 192),
    # a decode step's token and its 40 heads, and a prefill of 33 positions (also of head sizes
    # whose pairs end in one vector more, 96 and 160).
    for dtype, name in ((np.float16, "f16"), (ml_dtypes.bfloat16, "bf16")):
        for layout, dim in itertools.product(("half", "interleaved"), (64, 128, 192, 256)):
            tag = f"{name}-{layout}-{dim}"
            rope = pf.RotaryEmbedding(dim, layout=layout)
            x = _data((1, 40, 1, dim), dtype, 22)
            yield f"rope.decode-{tag}", lambda r=rope, x=x: r.apply(x, offset=4093)
            yield f"rope.decode-inverse-{tag}", lambda r=rope, x=x: r.apply(x, offset=70, inverse=True)
            yield f"rope.decode-in-place-{tag}", _in_place(rope.apply, x, 9)
            yield from _prefill_calls(rope, dtype, tag)
        for layout, dim in itertools.product(("half", "interleaved"), (96, 160)):  # a vector more
            yield from _prefill_calls(pf.RotaryEmbedding(dim, layout=layout), dtype, f"{name}-{layout}-{dim}")


def _prefill_calls(rope, dtype, tag):
    x = _data((1, 4, 33, rope.dim), dtype, 23)
    yield f"rope.prefill-{tag}", lambda r=rope, x=x: r.apply(x, offset=100)
    yield f"rope.prefill-inverse-{tag}", lambda r=rope, x=x: r.apply(x, offset=7, inverse=True)
    yield f"rope.prefill-in-place-{tag}", _in_place(rope.apply, x, 5)


def _half_bit_pattern_calls():
    # Added before the AVX-512 half-type rows: every float16/bfloat16 bit
    # pattern (subnormals, NaN payloads, inf, pairs that overflow) through the
    # rotation in cache and past the streaming threshold, out of place and in place.
    # No pair of two NaNs: which payload a NaN op NaN keeps depends on the
    # order of the operands, which the compiler may swap (a + b is b + a).
    order = np.random.default_rng(18).permutation(1 << 16)
    for dtype, name in ((np.float16, "f16"), (ml_dtypes.bfloat16, "bf16")):
        every = np.arange(1 << 16, dtype=np.uint16)[order].view(dtype)
        for layout in ("half", "interleaved"):
            rope = pf.RotaryEmbedding(128, layout=layout)
            for size, shape in (("small", (2, 4, 64, 128)), ("big", (1, 8, 9000, 128))):
                x = _without_nan_pairs(np.resize(every, shape), layout)
                tag = f"{name}-{layout}-{size}"
                yield (f"rope.bit-patterns-{tag}",
                       lambda r=rope, x=x: r.apply(x, offset=1000).view(np.uint16))

                yield (f"rope.bit-patterns-in-place-{tag}",
                       lambda f=_in_place(rope.apply, x, offset=3, inverse=True): f().view(np.uint16))


def _without_nan_pairs(x, layout):
    # x with the second of every NaN pair set to 1.
    x = x.copy()
    if layout == "half":
        a, b = x[..., :64], x[..., 64:]
    else:
        a, b = x[..., 0::2], x[..., 1::2]
    b[np.isnan(a.astype(np.float32)) & np.isnan(b.astype(np.float32))] = 1
    return x


def _shifted_one_position(dtype, layout):
    # x and out at every element offset within 64 bytes, out of place and in place.
    rope = pf.RotaryEmbedding(128, layout=layout)
    itemsize = np.dtype(dtype).itemsize
    results = []
    for shift in range(64 // itemsize):
        x = np.empty(3 * 4 * 128 + shift, dtype)[shift:].reshape(3, 4, 1, 128)
        out = np.empty(x.size + 64 // itemsize - shift, dtype)[64 // itemsize - shift:]
        x[...] = _data(x.shape, dtype, 17)
        results.append(rope.apply(x, offset=300, out=out.reshape(x.shape)).copy())
        results.append(rope.apply(x, offset=301, out=x).copy())
    return np.stack(results)


def _qk_norm_calls():
    # Added with the norm's rows in each variant (K.norm_scale), recorded from the portable loop
    # before it: head_dim 100 leaves a rest of the eight running sums.
    for dtype, name in ((np.float32, "f32"), (np.float64, "f64"), (np.float16, "f16"),
                        (ml_dtypes.bfloat16, "bf16")):
        for layout, dim in (("half", 128), ("interleaved", 100)):
            rope = pf.RotaryEmbedding(dim, layout=layout)
            q, k = _data((1, 6, 40, dim), dtype, 17), _data((1, 2, 40, dim), dtype, 18)
            weights = _data(dim, np.float32, 19), _data(dim, np.float32, 20)
            yield (f"rope.apply_qk_norm-{name}-{layout}",
                   lambda r=rope, q=q, k=k, w=weights: r.apply_qk_norm(q, k, *w, offset=900, eps=1e-5,
                                                                       weight_offset=1.0))


def _rotary_start_calls():
    # Added with rotary_start (DeepSeek-V4: the last 64 of 512 features; a start off a vector boundary)
    for dtype, name in ((np.float32, "f32"), (np.float64, "f64"), (ml_dtypes.bfloat16, "bf16")):
        for layout, dim, rotary_dim, start in (("interleaved", 512, 64, 448), ("half", 70, 48, 5)):
            rope = pf.RotaryEmbedding(dim, rotary_dim=rotary_dim, rotary_start=start, layout=layout)
            x = _data((2, 3, 21, dim), dtype, 21)
            yield f"rope.rotary_start-{name}-{layout}-{start}", lambda r=rope, x=x: r.apply(x, offset=333)
            yield f"rope.rotary_start-in-place-{name}-{layout}-{start}", _in_place(rope.apply, x, offset=7)


def calls():
    """(name, zero-argument function) for every recorded call."""
    for dtype, name in ((np.float32, "f32"), (np.float64, "f64")):
        yield from _rope_calls(dtype, name)
        yield from _table_calls(dtype, name)
    yield from _int_calls()
    yield from _half_calls()
    yield from _one_position_calls()
    yield from _half_vector_loop_calls()
    yield from _half_bit_pattern_calls()
    yield from _qk_norm_calls()
    yield from _rotary_start_calls()


def compute() -> dict:
    result = {}
    for name, call in calls():
        value = call()
        result[name] = _hash(*(value if isinstance(value, tuple) else (value,)))
    return result


def main(argv) -> int:
    mode = argv[1] if len(argv) > 1 else "check"
    hashes = compute()
    if mode in ("record", "record-new"):
        if mode == "record-new":  # keep every recorded hash, add the new calls'
            hashes = {**hashes, **json.loads(RECORD.read_text())}
        RECORD.write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
        print(f"recorded {len(hashes)} hashes")
        return 0
    expected = json.loads(RECORD.read_text())
    differ = sorted(k for k in expected if hashes.get(k) != expected[k])
    missing = sorted(set(hashes) ^ set(expected))
    for name in differ + missing:
        print(f"DIFFERS: {name}")
    print(f"{len(expected) - len(differ)} of {len(expected)} hashes equal "
          f"({pf.build_info()['isa_in_use']}, {pf.get_num_threads()} threads)")
    return 1 if differ or missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
