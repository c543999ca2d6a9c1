"""float16 and bfloat16: every kernel computes in float32 and rounds once.

Each result is checked two ways: bit for bit against a NumPy model of the
promised arithmetic (inputs widened to float32, cos/sin the float32 canonical
values, float32 operations, one rounding to the half type), and against the
float64 reference within one half-precision ulp plus float32's own error.
"""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc_fast as pf
from posenc_fast import reference as ref
from posenc_fast._tolerance import half_type_tolerance

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
HALVES = [F16, BF16]
F32 = np.float32


def bits(a):
    return np.ascontiguousarray(a).view(np.uint16)


def half_type_data(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def model_rotate(x, cos, sin, layout, inverse=False):
    """The promised arithmetic in NumPy: float32 pairs, one rounding to x's dtype."""
    n = cos.shape[-1]
    a32 = x.astype(F32)
    out = a32.copy()
    first, second = ((slice(0, n), slice(n, 2 * n)) if layout == "half"
                     else (slice(0, 2 * n, 2), slice(1, 2 * n, 2)))
    a, b = a32[..., first], a32[..., second]
    s = -sin if inverse else sin
    out[..., first] = a * cos - b * s
    out[..., second] = b * cos + a * s
    return out.astype(x.dtype)


def assert_near_reference(got, want, scale):
    got64 = got.astype(np.float64)
    tol = half_type_tolerance(want, got.dtype, scale)
    bad = np.abs(got64 - want) > tol
    assert not bad.any(), (got64[bad][:5], want[bad][:5])


def every_pattern(shape, dtype, seed):
    """Every 16-bit pattern of `dtype` (subnormals, infinities, NaN payloads), shuffled, filling `shape`."""
    order = np.random.default_rng(seed).permutation(1 << 16)
    return np.resize(np.arange(1 << 16, dtype=np.uint16)[order], shape).view(dtype)


def assert_model_bits(results, want):
    """Each result bitwise `want`, NaN where it has NaN (NumPy's own NaN conversions keep other payloads)."""
    nan = np.isnan(want.astype(F32))
    for got in results:
        assert np.array_equal(bits(got)[~nan], bits(want)[~nan])
        assert np.isnan(got.astype(F32)[nan]).all()


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(HALVES), layout=st.sampled_from(["half", "interleaved"]),
       rotary_dim=st.sampled_from([None, 6, 16]), offset=st.sampled_from([0, 77, 2**20 - 9]),
       inverse=st.booleans(), in_place=st.booleans(), strided=st.booleans(),
       seed=st.integers(0, 2**16))
def test_rope_matches_the_float32_model_and_the_reference(dtype, layout, rotary_dim, offset,
                                                          inverse, in_place, strided, seed):
    rope = pf.RotaryEmbedding(16, layout=layout, rotary_dim=rotary_dim)
    x = half_type_data((2, 3, 9, 32 if strided else 16), dtype, seed)
    x = x[..., ::2] if strided else x
    x0 = x.copy()
    positions = np.arange(offset, offset + 9)
    cos, sin = rope.cos_sin(positions, dtype=np.float32)
    want_bits = bits(model_rotate(x0, cos, sin, layout, inverse))
    out = x if in_place else None
    got = rope.apply(x, offset=offset, inverse=inverse, out=out)
    assert got.dtype == dtype and np.array_equal(bits(got), want_bits)
    if in_place:
        assert got is x
    inv_freq = list(rope.inv_freq)
    for index in [(0, 0, 0), (1, 2, 8), (0, 1, 4)]:
        want = ref.rotate_vector(list(x0[index].astype(np.float64)), offset + index[2],
                                 inv_freq, layout, inverse=inverse)
        assert_near_reference(got[index], np.array(want), 2 * np.abs(x0[index]).astype(
            np.float64).max())


@pytest.mark.parametrize("dtype", HALVES)
def test_apply_qk_positions_and_general_path_agree(dtype):
    rope = pf.RotaryEmbedding(64, layout="half")
    q, k = half_type_data((1, 4, 20, 64), dtype, 1), half_type_data((1, 2, 20, 64), dtype, 2)
    positions = np.random.default_rng(3).integers(0, 2**20, 20)
    q_rot, k_rot = rope.apply_qk(q, k, positions)
    cos, sin = rope.cos_sin(positions, dtype=np.float32)
    assert np.array_equal(bits(q_rot), bits(model_rotate(q, cos, sin, "half")))
    assert np.array_equal(bits(k_rot), bits(model_rotate(k, cos, sin, "half")))
    general = rope.apply(q.astype(np.float32), positions).astype(np.float64)
    assert_near_reference(q_rot, general, 2 * np.abs(q.astype(np.float64)))
    # Mixed with float32 keys: each in its own dtype.
    q2, k2 = rope.apply_qk(q, k.astype(np.float32), positions)
    assert q2.dtype == dtype and k2.dtype == np.float32 and np.array_equal(bits(q2), bits(q_rot))


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("table", ["float32", "own"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_apply_rotary_cos_sin(dtype, table, layout):
    cos32, sin32 = pf.RotaryEmbedding(32).cos_sin(np.arange(50), dtype=np.float32)
    cos, sin = (cos32, sin32) if table == "float32" else (cos32.astype(dtype),
                                                           sin32.astype(dtype))
    x = half_type_data((2, 3, 50, 32), dtype, 4)
    want = model_rotate(x, cos.astype(F32), sin.astype(F32), layout)
    got = pf.apply_rotary_cos_sin(x, cos, sin, layout=layout)
    assert np.array_equal(bits(got), bits(want))
    positions = np.random.default_rng(5).integers(0, 50, (50, 1))
    got = pf.apply_rotary_cos_sin(x[0].transpose(1, 0, 2).copy(), cos, sin, positions,
                                  layout=layout)
    rows = positions[:, 0]
    want = model_rotate(x[0].transpose(1, 0, 2), cos.astype(F32)[rows][:, None],
                        sin.astype(F32)[rows][:, None], layout)
    assert np.array_equal(bits(got), bits(want))


@pytest.mark.parametrize("dtype", HALVES)
def test_float64_cos_sin_with_half_data_is_refused(dtype):
    cos, sin = pf.RotaryEmbedding(16).cos_sin(np.arange(4), dtype=np.float64)
    x = half_type_data((4, 16), dtype)
    x0 = x.copy()
    with pytest.raises(TypeError, match=f"cos and sin must be float32 or {dtype}"):
        pf.apply_rotary_cos_sin(x, cos, sin, out=x)
    assert np.array_equal(bits(x), bits(x0))


@pytest.mark.parametrize("dtype", HALVES)
def test_tables_are_the_float64_values_rounded_once(dtype):
    rope = pf.RotaryEmbedding(16, scaling={"rope_type": "linear", "factor": 2.0})
    positions = np.array([0, 1, 31, 32, 1023, 1024, 2**20 - 1, 2**20])
    cos, sin = rope.cos_sin(positions, dtype=dtype)
    c64, s64 = rope.cos_sin(positions, dtype=np.float64)
    assert cos.dtype == dtype
    assert np.array_equal(bits(cos), bits(ref.round_once(c64, dtype)))
    assert np.array_equal(bits(sin), bits(ref.round_once(s64, dtype)))
    name = "bfloat16" if dtype == BF16 else "float16"
    table = pf.sinusoidal_table(40, 13, offset=2**20, dtype=name)
    assert np.array_equal(bits(table), bits(ref.round_once(
        pf.sinusoidal_table(40, 13, offset=2**20, dtype=np.float64), dtype)))
    bias = pf.alibi_bias(4, 7, 9, dtype=dtype)
    assert np.array_equal(bits(bias), bits(ref.round_once(
        pf.alibi_bias(4, 7, 9, dtype=np.float64), dtype)))


@pytest.mark.parametrize("dtype", HALVES)
def test_table_values_whose_float32_lies_on_a_tie_are_rounded_once(dtype):
    # cos/sin values whose float32 rounding lands exactly halfway between two values of the half
    # type: through float32 they would round twice (the tie broken to even, whichever side the
    # float64 value is on); the kernels round to odd first.  About one value in 2**16 (bfloat16)
    # or 2**13 (float16) is one.
    rope = pf.RotaryEmbedding(64)
    positions = np.arange(1 << 15)
    c64, s64 = rope.cos_sin(positions, dtype=np.float64)
    extra = 16 if dtype == BF16 else 13  # float32's mantissa bits past the half type's (normal values)

    def on_a_tie(v):
        u = v.astype(F32).view(np.uint32)
        return ((u & ((1 << extra) - 1)) == 1 << (extra - 1)) & (v.astype(F32) != v)

    rows = np.unique(np.nonzero(on_a_tie(c64) | on_a_tie(s64))[0])
    assert rows.size >= 8  # the test meets such values
    cos, sin = rope.cos_sin(positions[rows], dtype=dtype)
    assert np.array_equal(bits(cos), bits(ref.round_once(c64[rows], dtype)))
    assert np.array_equal(bits(sin), bits(ref.round_once(s64[rows], dtype)))


@pytest.mark.parametrize("dtype", HALVES)
def test_add_alibi_and_add_sinusoidal(dtype):
    scores = half_type_data((4, 6, 9), dtype, 6) * 8
    got = pf.add_alibi(scores, causal=False, offset=3)
    bias = pf.alibi_bias(4, 6, 9, causal=False, offset=3, dtype=np.float64)
    want = scores.astype(np.float64) + bias
    assert np.array_equal(bits(got), bits(ref.round_once(want, dtype)))  # in double, once
    x = half_type_data((2, 30, 10), dtype, 7)
    got = pf.add_sinusoidal(x, offset=5)
    table = pf.sinusoidal_table(30, 10, offset=5, dtype=np.float64)
    assert np.array_equal(bits(got), bits(ref.round_once(x.astype(np.float64) + table, dtype)))  # in double, once
    zeros = np.zeros((1, 400, 2), dtype)  # sums of zero: the table's values, rounded once as sinusoidal_table's
    assert np.array_equal(bits(pf.add_sinusoidal(zeros)[0]), bits(pf.sinusoidal_table(400, 2, dtype=dtype)))


@pytest.mark.parametrize("x_dtype", HALVES + [np.dtype(np.float32), np.dtype(np.float64)])
@pytest.mark.parametrize("table_dtype", HALVES + [np.dtype(np.float32), np.dtype(np.float64)])
def test_add_position_table_any_two_dtypes(x_dtype, table_dtype):
    x = half_type_data((3, 20, 8), x_dtype, 8)
    table = half_type_data((40, 8), table_dtype, 9)
    got = pf.add_position_table(x, table, offset=4)
    assert got.dtype == x_dtype
    rows = table[4:24]
    if x_dtype in HALVES and table_dtype == np.float64:  # in double, rounded once
        want = ref.round_once(x.astype(np.float64) + rows, x_dtype)
    elif x_dtype in HALVES:  # float32 arithmetic, one rounding
        want = (x.astype(F32) + rows.astype(F32)).astype(x_dtype)
    else:  # the wider of the two
        wide = np.result_type(x_dtype, np.float32 if table_dtype in HALVES else table_dtype)
        want = (x.astype(wide) + rows.astype(wide)).astype(x_dtype)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("dtype", HALVES)
def test_a_float64_table_added_to_half_data_is_rounded_once(dtype):
    # 1 + (a tie of the half type + 2**-40): the float64 table value rounded to float32 first lands on
    # the tie and rounds to even (1.0); the sum rounded once is above it
    tie = 2.0 ** (-11 if dtype == np.float16 else -8)
    table = np.array([[tie + 2.0**-40, -(tie + 2.0**-40)]])
    x = np.ones((1, 1, 2), dtype)
    want = ref.round_once(1.0 + table[0], dtype)
    assert want[0] == 1.0 + 2 * tie and want[1] == 1.0 - tie  # (below 1 the spacing halves: no tie)
    assert np.array_equal(bits(pf.add_position_table(x, table)[0, 0]), bits(want))
    assert np.array_equal(bits(pf.add_position_table(x, table, out=x)[0, 0]), bits(want))  # in place


@pytest.mark.parametrize("dtype", HALVES)
def test_nan_stays_nan_and_overflow_gives_inf(dtype):
    big = float(ml_dtypes.finfo(dtype).max)
    x = np.array([[np.nan, 1.0, big, big]], dtype)
    got = pf.RotaryEmbedding(4, layout="half").apply(x, 3)  # pairs (nan, big), (1, big)
    assert np.isnan(got.astype(np.float64)[0, [0, 2]]).all()
    table = np.full((4, 2), big, dtype)
    assert np.isinf(pf.add_position_table(np.full((1, 2), big, dtype), table)
                    .astype(np.float64)).all()


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("shape, rotary_dim", [((2, 4, 64, 128), 112), ((2, 4, 64, 128), 128),
                                               ((2, 4, 64, 128), 96), ((1, 8, 9000, 128), 128)],
                         ids=["in-cache", "in-cache-whole-vectors", "in-cache-a-vector-more",
                              "streamed"])
def test_every_bit_pattern_is_rounded_once(dtype, layout, shape, rotary_dim):
    # Subnormals, infinities, NaN payloads and pairs that overflow through the
    # vector rows, in cache and past the streaming threshold (16 MiB), into an
    # aligned and a misaligned out and in place: bitwise the model, NaN where
    # it has NaN (NumPy's own NaN conversions keep other payloads).  56 pairs:
    # whole packs of vectors, one vector more and scalar pairs, in every variant;
    # 64 and 48 (AVX-512: whole packs and one vector more): a head's rows in cache by the vector
    # loops alone (posenc_block_ of the half types).
    rope = pf.RotaryEmbedding(128, layout=layout, rotary_dim=rotary_dim)
    x = every_pattern(shape, dtype, 0)
    cos, sin = rope.cos_sin(np.arange(1000, 1000 + shape[2]), dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        want = model_rotate(x, cos, sin, layout)
    misaligned = np.empty(x.size + 1, dtype)[1:].reshape(shape)
    in_place = x.copy()
    assert_model_bits((rope.apply(x, offset=1000), rope.apply(x, offset=1000, out=misaligned),
                       rope.apply(in_place, offset=1000, out=in_place)), want)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dim", [64, 128, 136, 192, 256])
@pytest.mark.parametrize("inverse", [False, True])
def test_one_positions_heads_are_the_model_bitwise(dtype, layout, dim, inverse):
    # A decode step's token: its heads in one call of the rows of one position (whole groups of
    # vectors held across the rows for 128 and 256, with AVX2 also 64 and 192; 136 row by row),
    # every bit pattern through them, out of place and in place: bitwise the model.
    rope = pf.RotaryEmbedding(dim, layout=layout)
    x = every_pattern((1, (1 << 16) // dim, 1, dim), dtype, 1)
    cos, sin = rope.cos_sin(np.array([4093]), dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        want = model_rotate(x, cos, sin, layout, inverse)
    in_place = x.copy()
    assert_model_bits((rope.apply(x, offset=4093, inverse=inverse),
                       rope.apply(in_place, offset=4093, inverse=inverse, out=in_place)), want)


@pytest.mark.parametrize("dtype", HALVES)
def test_out_of_another_dtype_is_refused_and_untouched(dtype):
    # ValueError, as for every other dtype mismatch of `out` (the contract since 0.1).
    x = half_type_data((2, 8), dtype)
    out = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match=f"out must have dtype {dtype}"):
        pf.RotaryEmbedding(8).apply(x, 0, out=out)
    assert not out.any()


@pytest.mark.parametrize("bad", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, np.int16])
def test_other_dtypes_are_refused_with_the_list(bad):
    x = np.ones((2, 8), bad)
    x0 = x.copy()
    with pytest.raises(TypeError, match="float16, bfloat16, float32 or float64"):
        pf.RotaryEmbedding(8).apply(x, 0, out=x)
    assert np.array_equal(x.view(np.uint8), x0.view(np.uint8))
    with pytest.raises(TypeError, match="float16, bfloat16, float32 or float64"):
        pf.sinusoidal_table(4, 8, dtype=bad)


@pytest.mark.parametrize("dtype", HALVES)
def test_several_position_streams_compute_in_float32(dtype):
    rope = pf.RotaryEmbedding(16, layout="half", mrope_section=[2, 3, 3])
    x = half_type_data((5, 2, 16), dtype, 10)
    positions = np.random.default_rng(11).integers(0, 1000, (3, 5, 1))
    got = rope.apply(x, positions)
    cos, sin = rope.cos_sin(positions, dtype=np.float32)  # (5, 1, 8): gathered per token
    assert got.dtype == dtype
    assert np.array_equal(bits(got), bits(model_rotate(x, cos, sin, "half")))


def test_one_nan_in_any_lane_is_narrowed_to_a_nan():
    # The vectors look for a NaN in two vectors at once and blend only then: a NaN whose rounding would carry
    # into its exponent and sign (0x7fffffff -> -0.0, 0xffffffff -> +0.0) in each lane of a row of ones.
    dim = 64
    for pattern in (0x7FFFFFFF, 0xFFFFFFFF, 0x7F800001):
        v = np.ones((dim, 1, dim), F32)
        v.reshape(dim, dim).view(np.uint32)[np.arange(dim), np.arange(dim)] = pattern
        q = k = np.zeros((dim, 1, dim), F32)
        k_cache, v_cache = (np.zeros((dim, 1, 1, dim), BF16) for _ in range(2))
        pf.RotaryEmbedding(dim).apply_qk_to_cache(q, k.copy(), v, np.zeros(dim, np.int64), k_cache, v_cache,
                                                  np.arange(dim))
        got = v_cache.reshape(dim, dim).astype(F32)
        assert np.isnan(np.diagonal(got)).all(), hex(pattern)
        assert (got[~np.eye(dim, dtype=bool)] == 1).all()


def test_float32_narrowed_into_a_bfloat16_cache_is_rounded_once_for_every_pattern():
    # The KV write's narrowing of v (the variant's vectors, then a scalar rest): every bfloat16
    # pattern with low halves below, at and past its tie, bitwise NumPy's rounding to nearest even
    # (overflow to inf, subnormals), NaN a NaN.
    high = np.arange(1 << 16, dtype=np.uint32) << 16
    low = np.array([0, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    values = (high[:, None] | low).view(F32).ravel()
    dim = 80  # four vectors of 16 and a scalar rest of 16 (AVX2), one of 32 and 16 (AVX-512)
    tokens = values.size // dim
    v = values.reshape(tokens, 1, dim)
    q = k = np.zeros((tokens, 1, dim), F32)
    k_cache, v_cache = (np.zeros((tokens, 1, 1, dim), BF16) for _ in range(2))
    pf.RotaryEmbedding(dim).apply_qk_to_cache(q, k.copy(), v, np.zeros(tokens, np.int64), k_cache, v_cache,
                                              np.arange(tokens))
    nan = np.isnan(values)
    with np.errstate(invalid="ignore", over="ignore"):
        got, want = v_cache.ravel(), values.astype(BF16)
    assert np.array_equal(bits(got)[~nan], bits(want)[~nan])
    assert np.isnan(got[nan].astype(F32)).all()
