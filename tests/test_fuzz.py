"""Fuzz the public functions (RoPE's in test_fuzz_rope.py): awkward shapes, dtypes, strides, out=.

Each call must either return the reference's result (to the dtype's
tolerance) or raise TypeError/ValueError with nothing written; never crash,
never raise anything else, never let a warning escape (warnings are errors
here).  See ``fuzzing.py`` for the strategies and the checks, and
``POSENC_FAST_FUZZ_EXAMPLES`` to run more examples.
"""

import math
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import posenc_fast as pf
from posenc_fast import reference as ref

from fuzzing import (DTYPE_ARGS, FUZZ, HUGE_INTS, LAYOUT_VALUES, OUT_KINDS, Snapshot, arrays,
                     assert_close, bad_ints, bad_reals, call, check, choose, dtype_ok, int_ok,
                     is_float_data, lead_shapes, magnitude, make_out, maybe, native, out_ok,
                     positions_for, positions_value, real_ok, real_values)

# ---------------------------------------------------------------------------
# sinusoidal encodings


def _sinusoidal_angle(positions_abs_max: float, dim: int, base: float) -> float:
    w = max(base ** (-2 * i / dim) for i in range((dim + 1) // 2))
    return positions_abs_max * w


@FUZZ
@given(length=maybe(st.integers(0, 12), st.one_of(bad_ints(), st.just(-3))),
       dim=maybe(st.integers(1, 9), st.one_of(bad_ints(), st.just(0))),
       offset=maybe(real_values(), bad_reals()),
       base=maybe(st.sampled_from([10000.0, 10000, 2.0, 0.5, 1.0, 1e-3, 1e8, np.float32(100.0)]),
                  st.one_of(bad_reals(), st.sampled_from([0.0, -1.0, 5e-324]))),
       layout=LAYOUT_VALUES, dtype=DTYPE_ARGS, out_kind=OUT_KINDS)
def test_sinusoidal_table(length, dim, offset, base, layout, dtype, out_kind):
    shape_ok = int_ok(length, 0) and int_ok(dim, 1)
    shape = (int(length), int(dim)) if shape_ok else (2, 4)
    out_dtype = native(dtype) if dtype_ok(dtype) else np.float32
    out = make_out(out_kind if out_kind not in ("in_place", "overlap") else "fresh", shape, out_dtype)
    valid = (shape_ok and real_ok(offset) and real_ok(base) and float(base) > 0
             and layout in ("interleaved", "split") and dtype_ok(dtype)
             and out_ok(out, shape, out_dtype)[0])
    want = None
    if valid:
        try:
            want = ref.sinusoidal_table(length, dim, offset=float(offset), base=float(base),
                                        layout=layout)
        except (ValueError, OverflowError):  # an angle beyond the float range
            valid = False
    snap = Snapshot(out)
    outcome = call(pf.sinusoidal_table, length, dim, offset=offset, base=base, layout=layout,
                   dtype=dtype, out=out)
    if check(outcome, not valid, snap, written=(out,)):
        result = outcome.result
        if out is not None:
            assert result is out
        angle = _sinusoidal_angle(abs(float(offset)) + int(length), int(dim), float(base))
        assert_close(result, want, out_dtype, 1.0, angle)


@FUZZ
@given(data=st.data(), dim=maybe(st.integers(1, 8), st.one_of(bad_ints(), st.just(0))),
       base=maybe(st.sampled_from([10000.0, 2.0, 0.5, 100]), bad_reals()),
       layout=LAYOUT_VALUES, dtype=DTYPE_ARGS, out_kind=OUT_KINDS)
def test_sinusoidal(data, dim, base, layout, dtype, out_kind):
    lead = data.draw(lead_shapes(max_dims=3, max_rows=24))
    positions = data.draw(positions_for(lead, allow_none=False))
    parsed = positions_value(positions, np.shape(positions))
    shape_ok = int_ok(dim, 1) and parsed is not None
    out_dtype = native(dtype) if dtype_ok(dtype) else np.float32
    shape = (np.shape(parsed[0]) + (int(dim),)) if shape_ok else (3,)
    out = make_out(out_kind if out_kind not in ("in_place", "overlap") else "fresh", shape,
                   out_dtype)
    valid = (shape_ok and real_ok(base) and float(base) > 0
             and layout in ("interleaved", "split") and dtype_ok(dtype)
             and out_ok(out, shape, out_dtype)[0])
    want = None
    if valid:
        try:
            want = ref.sinusoidal(parsed[0], dim, base=float(base), layout=layout)
        except (ValueError, OverflowError):
            valid = False
    snap = Snapshot(out, positions)
    outcome = call(pf.sinusoidal, positions, dim, base=base, layout=layout, dtype=dtype, out=out)
    if check(outcome, not valid, snap, written=(out,)):
        pmax = float(np.abs(parsed[0]).max()) if parsed[0].size else 0.0
        assert_close(outcome.result, want, out_dtype, 1.0,
                     _sinusoidal_angle(pmax, int(dim), float(base)))
        if out is not None:
            assert outcome.result is out


@FUZZ
@given(data=st.data(), offset=maybe(real_values(), bad_reals()),
       base=maybe(st.sampled_from([10000.0, 2.0, 0.5]), bad_reals()),
       out_kind=OUT_KINDS)
def test_add_sinusoidal(data, offset, base, out_kind):
    lead = data.draw(lead_shapes(min_dims=0, max_dims=4, max_rows=24))
    dim = data.draw(st.integers(0, 6))
    x = data.draw(arrays(lead + (dim,)))
    positions = data.draw(positions_for(lead))
    x_ok = is_float_data(x) and x.ndim >= 2
    dtype = native(x.dtype) if is_float_data(x) else np.float32
    out = make_out(out_kind, x.shape, dtype, x)
    valid = x_ok and real_ok(offset) and real_ok(base) and float(base) > 0
    values = None
    if valid:
        if positions is None:
            values = np.broadcast_to(np.arange(lead[-1], dtype=np.float64), lead)
        else:
            parsed = positions_value(positions, lead)
            valid = parsed is not None
            values = parsed[0] if valid else None
    valid = valid and out_ok(out, x.shape, dtype, may_be=x)[0]
    want = None
    if valid:
        try:
            with np.errstate(over="ignore"):
                total = values + float(offset)
            if not np.isfinite(total).all():
                raise ValueError
            want = ref.add_sinusoidal(np.array(x, copy=True), positions=values, offset=float(offset), base=float(base))
        except (ValueError, OverflowError):
            valid = False
    snap = Snapshot(x, out, positions)
    outcome = call(pf.add_sinusoidal, x, positions=positions, offset=offset, base=base, out=out)
    if check(outcome, not valid, snap, written=(out,)):
        pmax = float(np.abs(values + float(offset)).max()) if values.size else 0.0
        assert_close(outcome.result, want, dtype, magnitude(x) + 1,
                     _sinusoidal_angle(pmax, max(dim, 1), float(base)))
        if out is not None:
            assert outcome.result is out


@FUZZ
@given(data=st.data(), offset=maybe(st.integers(-8, 8), st.one_of(
    st.sampled_from([2.0, True, 2**70, -(2**64) + 3, None, "1"]), st.integers(-2**64, 2**64))),
    out_kind=maybe(OUT_KINDS, st.just("table")))
def test_add_position_table(data, offset, out_kind):
    lead = data.draw(lead_shapes(min_dims=data.draw(maybe(st.just(1), st.just(0))), max_dims=4,
                                 max_rows=24))
    dim = data.draw(st.integers(0, 5))
    x = data.draw(arrays(lead + (dim,)))
    max_len = data.draw(maybe(st.integers(1, 12), st.just(0)))
    table_shape = data.draw(choose([(max_len, dim)], [(max_len, dim + 1), (max_len,)]))
    table = data.draw(arrays(table_shape))
    positions = data.draw(positions_for(lead, integral=True))
    if isinstance(positions, np.ndarray) and positions.dtype.kind in "iu" and positions.size \
            and data.draw(st.booleans()):
        positions = np.abs(positions.astype(np.int64)) % max(max_len, 1)
    dtype = native(x.dtype) if is_float_data(x) else np.float32
    out = table if out_kind == "table" else make_out(out_kind, x.shape, dtype, x)
    valid = (is_float_data(x) and x.ndim >= 2 and is_float_data(table) and table.ndim == 2
             and table.shape[1] == x.shape[-1] and int_ok(offset))
    index = given = None
    if valid:
        if positions is None:
            given = np.arange(lead[-1], dtype=object)
        else:
            parsed = positions_value(positions, lead, integral=True)
            valid = parsed is not None
            if valid:
                given = np.asarray(parsed[1]).astype(object)
    valid = valid and out_ok(out, x.shape, dtype, may_be=x, must_not_overlap=(table,))[0]
    if valid:
        index = np.broadcast_to(given, lead)
    # Every position given is checked, even one that no row of an empty x uses.
    if valid and given.size:
        shifted = [int(p) + int(offset) for p in given.reshape(-1)]
        valid = 0 <= min(shifted) and max(shifted) < max_len
    x0, table0 = np.array(x, copy=True), np.array(table, copy=True)
    snap = Snapshot(x, table, out, positions)
    outcome = call(pf.add_position_table, x, table, positions, offset=offset, out=out)
    if check(outcome, not valid, snap, written=(out,)):
        rows = np.asarray(table0, dtype=np.float64)
        want = np.asarray(x0, dtype=np.float64).copy()
        for i in np.ndindex(lead):
            want[i] += rows[int(index[i]) + int(offset)]
        assert_close(outcome.result, want, dtype, magnitude(x0, table0) * 2)


# ---------------------------------------------------------------------------
# relative schemes

OFFSETS = maybe(st.one_of(st.integers(-20, 20), st.sampled_from([2**31, 2**40, 2**52, -(2**52)])),
                st.one_of(bad_ints(), st.sampled_from([2**52 + 1, -(2**52) - 1, 2**63, 10**30])))
LENGTHS = maybe(st.integers(0, 7), st.one_of(bad_ints(), st.just(-1)))


@FUZZ
@given(num_heads=maybe(st.integers(1, 40), st.one_of(bad_ints(), st.just(0))))
def test_alibi_slopes(num_heads):
    outcome = call(pf.alibi_slopes, num_heads)
    if check(outcome, not int_ok(num_heads, 1), Snapshot()):
        np.testing.assert_allclose(outcome.result, ref.alibi_slopes(int(num_heads)), rtol=1e-15)
        assert outcome.result.dtype == np.float64 and outcome.result.flags.writeable


def _lengths_ok(q_len, k_len, offset):
    if not (int_ok(q_len, 0) and int_ok(offset) and abs(int(offset)) <= 2**52):
        return None
    if k_len is None:
        k = int(offset) + int(q_len)
        return (int(q_len), k) if k >= 0 else None
    return (int(q_len), int(k_len)) if int_ok(k_len, 0) else None


@FUZZ
@given(num_heads=maybe(st.integers(1, 6), st.one_of(bad_ints(), st.just(0))), q_len=LENGTHS,
       k_len=st.one_of(st.none(), LENGTHS), offset=OFFSETS,
       causal=choose([True, False, np.bool_(False)], [1, None]), dtype=DTYPE_ARGS,
       out_kind=OUT_KINDS)
def test_alibi_bias(num_heads, q_len, k_len, offset, causal, dtype, out_kind):
    lengths = _lengths_ok(q_len, k_len, offset)
    if lengths is not None and int(offset) > 64 and lengths[1] > 16 and k_len is None:
        lengths = None  # k_len = offset + q_len is too big to build; skip via k_len below
        k_len = 3
        lengths = _lengths_ok(q_len, k_len, offset)
    out_dtype = native(dtype) if dtype_ok(dtype) else np.float32
    shape = (int(num_heads), *lengths) if int_ok(num_heads, 1) and lengths else (1, 1, 1)
    out = make_out(out_kind if out_kind not in ("in_place", "overlap") else "fresh", shape,
                   out_dtype)
    valid = (int_ok(num_heads, 1) and lengths is not None
             and isinstance(causal, (bool, np.bool_)) and dtype_ok(dtype)
             and out_ok(out, shape, out_dtype)[0])
    snap = Snapshot(out)
    outcome = call(pf.alibi_bias, num_heads, q_len, k_len, offset=offset, causal=causal,
                   dtype=dtype, out=out)
    if check(outcome, not valid, snap, written=(out,)):
        want = ref.alibi_bias(int(num_heads), lengths[0], lengths[1], offset=int(offset),
                              causal=bool(causal))
        assert_close(outcome.result, want, out_dtype, magnitude(want))


@FUZZ
@given(data=st.data(), offset=OFFSETS, causal=choose([True, False], [0]),
       out_kind=OUT_KINDS)
def test_add_alibi(data, offset, causal, out_kind):
    lead = data.draw(lead_shapes(min_dims=data.draw(maybe(st.just(2), st.just(0))), max_dims=5,
                                 max_rows=24))
    k_len = data.draw(st.integers(0, 6))
    scores = data.draw(arrays(lead + (k_len,)))
    dtype = native(scores.dtype) if is_float_data(scores) else np.float32
    out = make_out(out_kind, scores.shape, dtype, scores)
    valid = (is_float_data(scores) and scores.ndim >= 3 and int_ok(offset)
             and abs(int(offset)) <= 2**52 and isinstance(causal, bool)
             and out_ok(out, scores.shape, dtype, may_be=scores)[0])
    scores0 = np.array(scores, copy=True)
    snap = Snapshot(scores, out)
    outcome = call(pf.add_alibi, scores, offset=offset, causal=causal, out=out)
    if check(outcome, not valid, snap, written=(out,)):
        want = ref.add_alibi(scores0, offset=int(offset), causal=causal)
        assert_close(outcome.result, want, dtype, magnitude(want, scores0) * 2)


@FUZZ
@given(q_len=LENGTHS, k_len=st.one_of(st.none(), LENGTHS), offset=OFFSETS,
       max_distance=maybe(st.one_of(st.integers(0, 10), st.sampled_from([2**40, 2**52])),
                          st.one_of(bad_ints(), st.sampled_from([2**52 + 1, 2**63]))))
def test_relative_position_index(q_len, k_len, offset, max_distance):
    lengths = _lengths_ok(q_len, k_len, offset)
    if lengths is not None and lengths[1] > 64:
        k_len, lengths = 5, _lengths_ok(q_len, 5, offset)
    valid = lengths is not None and int_ok(max_distance, 0) and int(max_distance) <= 2**52
    outcome = call(pf.relative_position_index, q_len, k_len, max_distance=max_distance,
                   offset=offset)
    if check(outcome, not valid, Snapshot()):
        want = ref.relative_position_index(lengths[0], lengths[1],
                                           max_distance=int(max_distance), offset=int(offset))
        assert outcome.result.dtype == np.int64
        np.testing.assert_array_equal(outcome.result, want)


@FUZZ
@given(q_len=LENGTHS, k_len=st.one_of(st.none(), LENGTHS), offset=OFFSETS,
       bidirectional=choose([True, False, np.bool_(True)], [1]),
       num_buckets=maybe(st.one_of(st.integers(2, 64), st.sampled_from([2**20, 2**40, 2**52])),
                         st.one_of(bad_ints(), st.sampled_from([0, 1, 2**52 + 1]))),
       max_distance=maybe(st.one_of(st.integers(1, 200), st.sampled_from([2**20, 2**41, 2**52])),
                          st.one_of(bad_ints(), st.sampled_from([2**52 + 1]))),
       data=st.data())
def test_t5_relative_bucket(q_len, k_len, offset, bidirectional, num_buckets, max_distance, data):
    if data.draw(st.integers(0, 4)) == 4 and int_ok(num_buckets, 4):
        # just above max_exact: the logarithmic buckets scale up enormously
        max_distance = int(num_buckets) // 4 + data.draw(st.integers(1, 3))
    lengths = _lengths_ok(q_len, k_len, offset)
    if lengths is not None and lengths[1] > 64:
        k_len, lengths = 5, _lengths_ok(q_len, 5, offset)
    valid = lengths is not None and isinstance(bidirectional, (bool, np.bool_))
    if valid:
        minimum = 4 if bidirectional else 2
        valid = int_ok(num_buckets) and minimum <= int(num_buckets) <= 2**52
    if valid:
        n = int(num_buckets) // 2 if bidirectional else int(num_buckets)
        valid = int_ok(max_distance) and n // 2 < int(max_distance) <= 2**52
    outcome = call(pf.t5_relative_bucket, q_len, k_len, bidirectional=bidirectional,
                   num_buckets=num_buckets, max_distance=max_distance, offset=offset)
    if check(outcome, not valid, Snapshot()):
        result = outcome.result
        assert result.dtype == np.int64
        assert ((0 <= result) & (result < int(num_buckets))).all()
        want = ref.t5_relative_bucket(lengths[0], lengths[1], bidirectional=bool(bidirectional),
                                      num_buckets=int(num_buckets),
                                      max_distance=int(max_distance), offset=int(offset))
        np.testing.assert_array_equal(result, want)


@FUZZ
@given(n=maybe(st.integers(1, 8), st.one_of(bad_ints(), st.sampled_from(HUGE_INTS), st.just(0))))
def test_set_num_threads(n):
    before = pf.get_num_threads()
    try:
        outcome = call(pf.set_num_threads, n)
        if check(outcome, not int_ok(n, 1), Snapshot()):
            assert pf.get_num_threads() == int(n)
            # A call (large enough to use a team) still works and agrees with one thread.
            x = np.random.default_rng(1).standard_normal((64, 4, 64, 16)).astype(np.float32)
            many = pf.apply_rotary(x)
            pf.set_num_threads(1)
            np.testing.assert_array_equal(many, pf.apply_rotary(x))
        else:
            assert pf.get_num_threads() == before
    finally:
        pf.set_num_threads(before)


# ---------------------------------------------------------------------------
# float16 / bfloat16, and a crash-proof burst in a subprocess


@pytest.mark.parametrize("call_with", [
    lambda x: pf.apply_rotary(x),
    lambda x: pf.RotaryEmbedding(4).apply(x),
    lambda x: pf.add_sinusoidal(x),
    lambda x: pf.add_alibi(x.reshape(1, 2, 3, 4)),
    lambda x: pf.add_position_table(x, np.zeros((8, 4), np.float32)),
    lambda x: pf.apply_rotary_cos_sin(x, np.ones((3, 2)), np.zeros((3, 2))),
])
def test_float8_is_a_type_error_naming_the_supported_dtypes(call_with):
    x = np.ones((2, 3, 4), ml_dtypes.float8_e4m3fn)
    with pytest.raises(TypeError, match=r"must be a float16, bfloat16, float32 or float64 array, "
                                        r"got dtype float8_e4m3fn"):
        call_with(x)


def test_float8_table_dtype_is_a_type_error():
    with pytest.raises(TypeError, match="dtype must be float16, bfloat16, float32 or float64, "
                                        "got float8_e5m2"):
        pf.sinusoidal_table(4, 8, dtype=ml_dtypes.float8_e5m2)


BURST = textwrap.dedent("""
    import random, sys, warnings
    import ml_dtypes
    import numpy as np
    import posenc_fast as pf
    random.seed(int(sys.argv[1]))
    values = [None, 0, 1, -1, 2, 3, 7, 2**31, 2**62, 2**64, -2**63, 1e300, float("nan"),
              float("inf"), True, "x", 0.5, [1, 2], (), np.int64(3)]
    shapes = [(), (0,), (4,), (3, 4), (2, 0, 4), (2, 3, 4), (1, 2, 3, 4), (2, 1, 1, 1, 3, 4)]
    dtypes = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
              np.int32, ">f4", bool, complex, object]
    def array():
        a = np.ones(random.choice(shapes), random.choice(dtypes))
        if a.ndim and random.random() < 0.3:
            a = a[..., ::-1]
        return a
    rope = pf.RotaryEmbedding(4)
    functions = [pf.sinusoidal_table, pf.sinusoidal, pf.add_sinusoidal, pf.add_position_table,
                 pf.apply_rotary, pf.apply_rotary_cos_sin, pf.apply_rotary_cos_sin_qk,
                 rope.apply, rope.apply_qk, rope.cos_sin, rope.inv_freq_for, pf.alibi_slopes,
                 pf.alibi_bias, pf.add_alibi, pf.relative_position_index, pf.t5_relative_bucket,
                 pf.RotaryEmbedding]
    warnings.simplefilter("ignore")
    for _ in range(int(sys.argv[2])):
        f = random.choice(functions)
        args = [array() if random.random() < 0.6 else random.choice(values)
                for _ in range(random.randint(0, 4))]
        kwargs = {}
        for key in random.sample(["out", "offset", "positions", "base", "max_distance",
                                  "seq_axis", "out_q", "out_k", "dtype"], random.randint(0, 3)):
            kwargs[key] = array() if random.random() < 0.5 else random.choice(values)
        # Sizes stay small (a huge length or dim is a real, slow request), but
        # offsets and positions may be huge.
        args = [a if not isinstance(a, int) or abs(a) < 2**12 else 5 for a in args]
        kwargs = {k: (v if k in ("offset", "positions") or not isinstance(v, int)
                      or abs(v) < 2**12 else 5) for k, v in kwargs.items()}
        try:
            f(*args, **kwargs)
        except (TypeError, ValueError):
            pass
    print("done")
""")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_burst_in_a_subprocess_does_not_crash(seed):
    proc = subprocess.run([sys.executable, "-c", BURST, str(seed), "20000"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout.strip() == "done"


@pytest.mark.parametrize("layout", ["fortran", "reversed", "strided", "transposed"])
@pytest.mark.parametrize("positions_shape", [(5,), (2, 3), (2, 1, 3)])
def test_every_out_layout_is_written(layout, positions_shape):
    # Regression (found by the fuzzer): sinusoidal() wrote a Fortran-order
    # out's reshape, a copy, and returned out unwritten.
    positions = np.arange(math.prod(positions_shape)).reshape(positions_shape) * 7 - 3
    shape = positions_shape + (6,)
    want = pf.sinusoidal(positions, 6)
    if layout == "fortran":
        out = np.asfortranarray(np.full(shape, 7.0, np.float32))
    elif layout == "reversed":
        out = np.full(shape, 7.0, np.float32)[::-1]
    elif layout == "strided":
        out = np.full(shape[:-1] + (12,), 7.0, np.float32)[..., ::2]
    else:
        out = np.full(shape[::-1], 7.0, np.float32).T
    assert pf.sinusoidal(positions, 6, out=out) is out
    np.testing.assert_array_equal(out, want)
    table_out = np.asfortranarray(np.full((len(positions.reshape(-1)), 6), 7.0, np.float32))
    assert pf.sinusoidal_table(table_out.shape[0], 6, out=table_out) is table_out
    np.testing.assert_array_equal(table_out, pf.sinusoidal_table(table_out.shape[0], 6))
