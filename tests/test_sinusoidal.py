"""sinusoidal_table, sinusoidal and add_sinusoidal against the reference."""

import math
import re

import ml_dtypes
import numpy as np
import pytest
from helpers import (angle_atol, assert_float32_rounding, exact_cos_sin, float32_ulps,
                     untouched)
from hypothesis import given
from hypothesis import strategies as st

import posenc_fast as pf
from posenc_fast import reference

LAYOUTS = ["interleaved", "split"]


def max_angle(positions, base=10000.0) -> float:
    # w_0 = 1 is the largest frequency.
    positions = np.asarray(positions, dtype=np.float64)
    return float(np.abs(positions).max()) if positions.size else 0.0


def check_table(got, positions, dim, base, layout):
    expected = reference.sinusoidal(positions, dim, base=base, layout=layout)
    atol = angle_atol(max_angle(positions, base))
    if got.dtype == np.float64:
        np.testing.assert_allclose(got, expected, rtol=0, atol=atol)
    else:
        assert_float32_rounding(got, expected, extra_atol=atol)


@pytest.mark.parametrize("dim", list(range(1, 65)) + [127, 256, 1024])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_table_matches_reference_for_every_dim(dim, layout):
    length = 40 if dim < 256 else 5
    for dtype in (np.float32, np.float64):
        got = pf.sinusoidal_table(length, dim, layout=layout, dtype=dtype)
        assert got.shape == (length, dim) and got.dtype == dtype
        check_table(got, np.arange(length), dim, 10000.0, layout)


@pytest.mark.parametrize("offset", [0, 1, 17, 1000.5, 2**20, -300, 10**9])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_table_offsets(offset, layout, dtype):
    got = pf.sinusoidal_table(100, 12, offset=offset, layout=layout, dtype=dtype)
    check_table(got, offset + np.arange(100), 12, 10000.0, layout)


@pytest.mark.parametrize("base", [2.0, 500.0, 10000.0, 1e6])
def test_table_bases(base):
    got = pf.sinusoidal_table(70, 10, base=base, dtype=np.float64)
    check_table(got, np.arange(70), 10, base, "interleaved")


def test_table_50_by_7_closed_form():
    table = pf.sinusoidal_table(50, 7)
    for p in range(50):
        for i in range(4):
            w = 10000.0 ** (-2 * i / 7)
            assert table[p, 2 * i] == np.float32(math.sin(p * w))
            if 2 * i + 1 < 7:
                assert table[p, 2 * i + 1] == np.float32(math.cos(p * w))
    check_table(table, np.arange(50), 7, 10000.0, "interleaved")


def test_split_is_a_permutation_of_interleaved():
    interleaved = pf.sinusoidal_table(30, 9, dtype=np.float64)
    split = pf.sinusoidal_table(30, 9, layout="split", dtype=np.float64)
    order = list(range(0, 9, 2)) + list(range(1, 9, 2))
    np.testing.assert_array_equal(split, interleaved[:, order])


def test_float32_within_one_ulp_of_mpmath_up_to_2_pow_20():
    positions = [0, 1, 2, 1000, 65535, 2**19 + 3, 2**20 - 1, 2**20]
    dim = 64
    worst = 0.0
    for p in positions:
        row = pf.sinusoidal_table(1, dim, offset=p)[0]
        exact = []
        for i in range(dim // 2):
            c, s = exact_cos_sin(p, 10000.0 ** (-2 * i / dim))
            exact += [s, c]
        worst = max(worst, float(float32_ulps(row, exact).max()))
    # A table of consecutive positions goes through the recurrence, not only anchors.
    table = pf.sinusoidal_table(200, dim, offset=2**20 - 199)
    for r in range(0, 200, 13):
        exact = []
        for i in range(dim // 2):
            c, s = exact_cos_sin(2**20 - 199 + r, 10000.0 ** (-2 * i / dim))
            exact += [s, c]
        worst = max(worst, float(float32_ulps(table[r], exact).max()))
    assert worst <= 1.0


def test_float32_angles_would_fail_the_precision_test():
    # The anchor the issue warns about: float32 angles are ~0.06 rad off at 1e6.
    p, w = np.float32(10**6), np.float32(10000.0 ** (-2 * 1 / 64))
    naive = np.sin(p * w)
    _, exact = exact_cos_sin(10**6, 10000.0 ** (-2 * 1 / 64))
    assert abs(float(naive) - exact) > 1e-3
    ours = pf.sinusoidal_table(1, 64, offset=10**6)[0, 2]
    assert abs(float(ours) - exact) < 1e-7


@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 1, 3)])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_sinusoidal_of_real_positions(shape, layout):
    rng = np.random.default_rng(0)
    positions = rng.uniform(-50, 1000, size=shape)
    for dtype in (np.float32, np.float64):
        got = pf.sinusoidal(positions, 11, layout=layout, dtype=dtype)
        assert got.shape == shape + (11,) and got.dtype == dtype
        check_table(got, positions, 11, 10000.0, layout)


def test_sinusoidal_accepts_lists_and_integer_arrays():
    np.testing.assert_array_equal(pf.sinusoidal([0, 1, 2], 6),
                                  pf.sinusoidal_table(3, 6))
    np.testing.assert_array_equal(pf.sinusoidal(np.arange(3, dtype=np.uint8), 6),
                                  pf.sinusoidal_table(3, 6))


def test_sinusoidal_at_consecutive_positions_equals_table():
    np.testing.assert_array_equal(pf.sinusoidal(np.arange(5, 105), 16, dtype=np.float64),
                                  pf.sinusoidal_table(100, 16, offset=5, dtype=np.float64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("in_place", [False, True])
def test_add_sinusoidal_equals_x_plus_table(dtype, in_place):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 20, 16)).astype(dtype)
    expected_64 = x.astype(np.float64) + pf.sinusoidal_table(20, 16, dtype=np.float64)
    original = x.copy()
    got = pf.add_sinusoidal(x, out=x if in_place else None)
    assert got.dtype == dtype and got.shape == x.shape
    if in_place:
        assert got is x
    else:
        assert untouched(original, x)
    # Formed in float64 and rounded once.
    np.testing.assert_array_equal(got, expected_64.astype(dtype))
    reference_sum = reference.add_sinusoidal(original)
    np.testing.assert_allclose(got, reference_sum, rtol=1e-6 if dtype == np.float32 else 1e-14,
                               atol=1e-6 if dtype == np.float32 else 1e-13)


def test_add_sinusoidal_positions_and_offset():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 5, 8))
    positions = np.array([[0, 3, 9, 2, 7], [100, 101, 102, 103, 104]])
    got = pf.add_sinusoidal(x, positions=positions, offset=4)
    np.testing.assert_allclose(got, reference.add_sinusoidal(x, positions=positions, offset=4),
                               rtol=0, atol=1e-13)
    np.testing.assert_array_equal(pf.add_sinusoidal(x, offset=4), pf.add_sinusoidal(
        x, positions=np.arange(5) + 4))


def test_add_sinusoidal_non_contiguous_and_out():
    rng = np.random.default_rng(3)
    base = rng.standard_normal((4, 12, 10))
    x = base[:, ::2, :]
    out = np.empty((4, 6, 10))[::1]
    got = pf.add_sinusoidal(x, out=out)
    assert got is out
    np.testing.assert_allclose(got, reference.add_sinusoidal(x), rtol=0, atol=1e-13)
    transposed_out = np.empty((10, 6, 4)).T
    np.testing.assert_array_equal(pf.add_sinusoidal(x, out=transposed_out), got)
    # In place on a non-contiguous view writes through to the view only.
    before = base.copy()
    pf.add_sinusoidal(x, out=x)
    np.testing.assert_array_equal(base[:, 1::2], before[:, 1::2])
    np.testing.assert_array_equal(x, got)


def test_out_argument_of_tables():
    out = np.full((10, 6), np.nan, dtype=np.float32)
    assert pf.sinusoidal_table(10, 6, out=out) is out
    np.testing.assert_array_equal(out, pf.sinusoidal_table(10, 6))
    strided = np.zeros((10, 12), dtype=np.float64)[:, ::2]
    pf.sinusoidal_table(10, 6, out=strided, dtype=np.float64)
    np.testing.assert_array_equal(strided, pf.sinusoidal_table(10, 6, dtype=np.float64))


def test_empty_tables():
    assert pf.sinusoidal_table(0, 8).shape == (0, 8)
    assert pf.sinusoidal(np.zeros((0, 3)), 4).shape == (0, 3, 4)
    x = np.zeros((2, 0, 8), np.float32)
    assert pf.add_sinusoidal(x).shape == (2, 0, 8)


@given(length=st.integers(0, 80), dim=st.integers(1, 40),
       offset=st.one_of(st.integers(-10**6, 10**6), st.floats(-1e5, 1e5)),
       layout=st.sampled_from(LAYOUTS), double=st.booleans(),
       base=st.floats(1.5, 1e6))
def test_random_tables(length, dim, offset, layout, double, base):
    dtype = np.float64 if double else np.float32
    got = pf.sinusoidal_table(length, dim, offset=offset, base=base, layout=layout, dtype=dtype)
    check_table(got, offset + np.arange(length, dtype=np.float64), dim, base, layout)


@given(threads=st.integers(1, 4), length=st.integers(0, 3000))
def test_threads_give_bitwise_equal_tables(threads, length):
    previous = pf.get_num_threads()
    try:
        pf.set_num_threads(1)
        single = pf.sinusoidal_table(length, 64, offset=123)
        pf.set_num_threads(threads)
        np.testing.assert_array_equal(pf.sinusoidal_table(length, 64, offset=123), single)
    finally:
        pf.set_num_threads(previous)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shift", [0, 4, 16, 48])
@pytest.mark.parametrize("dim", [128, 1536, 4160])
def test_streamed_table_equals_small_tables(layout, shift, dim):
    # A float32 table of 16 MiB or more is written by non-temporal stores
    # (where out is 16-byte aligned: shift 4 is not; off a 64-byte boundary
    # through a scratch of 4096 floats: 4 rows of 128, 2 of 1536, none of
    # 4160, which then takes plain stores); its rows are the canonical values
    # all the same, equal to those of small tables.
    length = (16 << 20) // (4 * dim) + 40
    buffer = np.empty(length * dim * 4 + 128, dtype=np.uint8)
    start = -buffer.ctypes.data % 64 + shift
    out = buffer[start:start + length * dim * 4].view(np.float32).reshape(length, dim)
    pf.sinusoidal_table(length, dim, layout=layout, out=out)
    for first in (0, 31, 1000, 1001, 4095, 4096, 20000, 32768, length - 40):
        if first > length - 40:
            continue
        rows = pf.sinusoidal_table(40, dim, offset=first, layout=layout)
        np.testing.assert_array_equal(out[first:first + 40], rows)
    check_table(out[-40:], np.arange(length - 40, length), dim, 10000.0, layout)


# --- bad input -------------------------------------------------------------


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(length=-1, dim=4), ValueError, "length must be >= 0"),
    (dict(length=3, dim=0), ValueError, "dim must be >= 1"),
    (dict(length=0, dim=2**62), ValueError, r"\(0, 4611686018427387904\) set by length and dim is more than NumPy"),
    (dict(length=2**62, dim=4), ValueError, r"\(4611686018427387904, 4\) set by length and dim is more than NumPy"),
    (dict(length=3.0, dim=4), TypeError, "length must be an integer"),
    (dict(length=3, dim=True), TypeError, "dim must be an integer, got bool"),
    (dict(length=3, dim=4, base=0.0), ValueError, "base must be > 0"),
    (dict(length=3, dim=4, base=float("nan")), ValueError, "base must be finite"),
    (dict(length=1, dim=64, base=5e-324), ValueError, r"base = 5e-324 gives frequencies .* past float64's range"),
    (dict(length=3, dim=4, offset=float("inf")), ValueError, "offset must be finite"),
    (dict(length=3, dim=4, offset="1"), TypeError, "offset must be a real number"),
    (dict(length=3, dim=4, layout="half"), ValueError, "layout must be one of"),
    (dict(length=3, dim=4, dtype=ml_dtypes.float8_e5m2), TypeError,
     "dtype must be float16, bfloat16, float32 or float64"),
    (dict(length=3, dim=4, dtype=np.int32), TypeError,
     "dtype must be float16, bfloat16, float32 or float64"),
    (dict(length=3, dim=4, dtype="complex"), TypeError,
     "dtype must be float16, bfloat16, float32 or float64"),
])
def test_table_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        pf.sinusoidal_table(**kwargs)


@pytest.mark.parametrize("out, match", [
    (np.zeros((3, 5), np.float32), r"out must have shape \(3, 4\), got \(3, 5\)"),
    (np.zeros((3, 4), np.float64), "out must have dtype float32, got float64"),
    (np.zeros((3, 4), np.float32).T.copy().T[:, :], None),  # fine: any strides
])
def test_table_bad_out(out, match):
    if match is None:
        pf.sinusoidal_table(3, 4, out=out)
        return
    before = out.copy()
    with pytest.raises(ValueError, match=match):
        pf.sinusoidal_table(3, 4, out=out)
    assert untouched(before, out)


def test_table_read_only_out_and_wrong_type():
    out = np.zeros((3, 4), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out must be writeable"):
        pf.sinusoidal_table(3, 4, out=out)
    assert not out.any()
    with pytest.raises(TypeError, match="out must be a numpy.ndarray"):
        pf.sinusoidal_table(3, 4, out=[[0.0] * 4] * 3)


@pytest.mark.parametrize("positions, error, match", [
    ([0.0, float("nan")], ValueError, "positions must be finite, got nan"),
    ([0.0, float("inf")], ValueError, "positions must be finite, got inf"),
    ([True, False], TypeError, re.escape("positions must be an array of real numbers (integers or float16, "
                                         "bfloat16, float32 or float64), got dtype bool")),
    (np.array([1.0, np.inf], ml_dtypes.bfloat16), ValueError, "positions must be finite, got inf"),
    (np.array([1, 2], ml_dtypes.float8_e4m3fn), TypeError, "got dtype float8_e4m3fn"),
    ([1 + 2j], TypeError, "got dtype complex128"),
    (["a"], TypeError, "positions must be an array of real numbers"),
    ([[1, 2], [3]], TypeError, "positions must be an array of real numbers"),
])
def test_sinusoidal_bad_positions(positions, error, match):
    out = np.zeros((len(positions), 4), np.float32)
    with pytest.raises(error, match=match):
        pf.sinusoidal(positions, 4, out=out)
    assert not out.any()


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_half_type_positions_are_their_values(dtype):
    # Real positions of any kernel dtype: bfloat16 ones as float16 ones, by value.
    positions = np.array([0.0, 3.0, 1.5, 4096.0], dtype)
    want = positions.astype(np.float64)
    assert np.array_equal(pf.sinusoidal(positions, 8), pf.sinusoidal(want, 8))
    x = np.ones((4, 2, 8), np.float32)
    assert np.array_equal(pf.RotaryEmbedding(8).apply(x, positions[:, None]),
                          pf.RotaryEmbedding(8).apply(x, want[:, None]))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("form", ["scalar", "0-d array"])
def test_half_type_scalars_are_their_values(dtype, form):
    # a bfloat16 offset or base was "not a real number" (no numbers.Real, dtype kind "V"); float16 was taken
    value = (lambda v: dtype(v)) if form == "scalar" else (lambda v: np.array(v, dtype))
    assert np.array_equal(pf.sinusoidal_table(3, 8, offset=value(2.5)), pf.sinusoidal_table(3, 8, offset=2.5))
    x = np.ones((2, 8), np.float32)
    assert np.array_equal(pf.RotaryEmbedding(8, base=value(100.0)).apply(x, offset=value(3.0)),
                          pf.RotaryEmbedding(8, base=100.0).apply(x, offset=3.0))


@pytest.mark.parametrize("x, error, match", [
    (np.zeros((3, 4), np.int64), TypeError, "x must be a float16, bfloat16, float32 or float64 array, got dtype int64"),
    (np.zeros((3, 4), bool), TypeError, "got dtype bool"),
    (np.zeros((3, 4), ml_dtypes.float8_e4m3fn), TypeError, "got dtype float8_e4m3fn"),
    (np.zeros((3, 4), np.complex64), TypeError, "got dtype complex64"),
    (np.zeros(4), ValueError, "at least 2 dimensions"),
    ("text", TypeError, "x must be a float16, bfloat16, float32 or float64 array"),
])
def test_add_sinusoidal_bad_x(x, error, match):
    with pytest.raises(error, match=match):
        pf.add_sinusoidal(x)


def test_add_sinusoidal_bad_out_writes_nothing():
    x = np.ones((2, 3, 4))
    before = x.copy()
    for out, match in [
        (np.zeros((2, 3, 5)), r"out must have shape \(2, 3, 4\)"),
        (np.zeros((2, 3, 4), np.float32), "out must have dtype float64"),
        (x[:, ::-1], "overlaps an input"),
        (x.reshape(6, 4)[::-1].reshape(2, 3, 4), "overlaps an input"),
    ]:
        out_before = out.copy()
        with pytest.raises(ValueError, match=match):
            pf.add_sinusoidal(x, out=out)
        assert untouched(before, x)
        assert untouched(out_before, out)


def test_add_sinusoidal_bad_positions_write_nothing():
    x = np.ones((2, 3, 4))
    for positions, error, match in [
        (np.array([0.0, np.nan, 1.0]), ValueError, "finite"),
        (np.arange(4), ValueError, r"positions of shape \(4,\) does not broadcast"),
        (np.zeros((3, 3)), ValueError, "does not broadcast"),
    ]:
        with pytest.raises(error, match=match):
            pf.add_sinusoidal(x, positions=positions, out=x)
        assert (x == 1).all()
    wide = np.ones((2, 3, 64))  # (1e-320 ** (-2*i/64) passes float64's range)
    with pytest.raises(ValueError, match="base = 1e-320 gives"):
        pf.add_sinusoidal(wide, base=1e-320, out=wide)
    with pytest.raises(ValueError, match="base = 1e-320 gives"):
        pf.sinusoidal([0.0], 64, base=1e-320)
    assert (wide == 1).all()
