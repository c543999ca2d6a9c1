"""Tests of the relative schemes: ALiBi, Shaw's clipped distances, T5 buckets.

The oracle is ``posenc_fast.reference`` (plain loops over Python ints and
floats) for every size, offset and flag; ``fixtures/relative_fixtures.json``
holds what transformers' BLOOM, MPT and T5 code computes (made by
``fixtures/make_relative_fixtures.py``), so these tests need no torch.
"""

import json
import math
from pathlib import Path

import ml_dtypes
import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc_fast
from posenc_fast import reference
from posenc_fast.relative import (add_alibi, alibi_bias, alibi_slopes, relative_position_index,
                                  t5_relative_bucket)

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "relative_fixtures.json").read_text())
FLOATS = [np.float32, np.float64]
# Example counts come from the loaded hypothesis profile (100 by default).
HYPOTHESIS = settings(deadline=None)


@pytest.fixture
def threads():
    """Restore the thread count a test changes."""
    before = posenc_fast.get_num_threads()
    yield posenc_fast.set_num_threads
    posenc_fast.set_num_threads(before)


def expected(reference_float64: np.ndarray, dtype) -> np.ndarray:
    """The reference rounded once to `dtype`: what the library must return bitwise."""
    return reference_float64.astype(dtype)


def assert_same(actual: np.ndarray, wanted: np.ndarray) -> None:
    """Equal shape, dtype and values, and the same sign on zeros."""
    assert actual.shape == wanted.shape
    assert actual.dtype == wanted.dtype
    np.testing.assert_array_equal(actual, wanted)
    np.testing.assert_array_equal(np.signbit(actual), np.signbit(wanted))


def scores_array(shape, dtype, seed=0) -> np.ndarray:
    """Random scores with some exact zeros of both signs."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(scale=4.0, size=shape)
    flat = scores.reshape(-1)
    flat[::7] = 0.0
    flat[3::7] = -0.0
    return scores.astype(dtype)


# ---------------------------------------------------------------------------
# slopes


def test_slopes_of_eight_heads():
    assert_same(alibi_slopes(8), np.array([1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64,
                                           1 / 128, 1 / 256]))


@pytest.mark.parametrize("num_heads", [1, 2, 4, 8, 16, 32, 64, 128, 256])
def test_slopes_of_power_of_two_heads(num_heads):
    slopes = alibi_slopes(num_heads)
    assert_same(slopes, np.array([2.0 ** (-8 * (h + 1) / num_heads) for h in range(num_heads)]))
    # Where the exponent -8*(h+1)/n is an integer the slope is that power of two.
    integral = [h for h in range(num_heads) if 8 * (h + 1) % num_heads == 0]
    assert_same(slopes[integral], np.array([2.0 ** (-8 * (h + 1) // num_heads) for h in integral]))


@pytest.mark.parametrize("num_heads", list(range(1, 70)) + [80, 96, 112, 200])
def test_slopes_match_reference(num_heads):
    assert_same(alibi_slopes(num_heads), reference.alibi_slopes(num_heads))


@pytest.mark.parametrize("num_heads", [3, 5, 12, 20, 24, 40, 48, 80, 112])
def test_slopes_are_the_exact_values_rounded(num_heads):
    closest = 2 ** (num_heads.bit_length() - 1)
    with mpmath.workprec(200):
        exact = [mpmath.power(2, mpmath.mpf(-8 * (h + 1)) / closest) for h in range(closest)]
        exact += [mpmath.power(2, mpmath.mpf(-8 * (2 * h + 1)) / (2 * closest))
                  for h in range(num_heads - closest)]
    slopes = alibi_slopes(num_heads)
    for slope, value in zip(slopes, exact):
        # libm's pow is within an ulp everywhere (glibc: correctly rounded here).
        assert abs(slope - float(value)) <= np.spacing(slope)


def test_slopes_return_a_fresh_array():
    first = alibi_slopes(12)
    first[:] = 0
    assert alibi_slopes(12)[0] == 2.0**-1
    assert first.flags.writeable


@pytest.mark.parametrize("entry", FIXTURES["bloom"], ids=lambda e: f"heads{e['num_heads']}")
def test_slopes_match_bloom(entry):
    bloom = np.array(entry["slopes"], dtype=np.float32)
    ours = alibi_slopes(entry["num_heads"])
    # BLOOM raises a float32-rounded base to integer powers in float32, which
    # drifts by up to ~1e-6 relative; ours are the exact values rounded once.
    np.testing.assert_allclose(ours, bloom, rtol=2e-6, atol=0)
    if entry["num_heads"] <= 8:  # then BLOOM's bases 2**(-8/m) are exact powers of two
        assert_same(ours.astype(np.float32), bloom)


@pytest.mark.parametrize("entry", [e for e in FIXTURES["bloom"] if "alibi" in e],
                         ids=lambda e: f"heads{e['num_heads']}")
def test_bias_matches_bloom_up_to_a_constant_per_row(entry):
    # BLOOM's tensor is slope * k_pos for every query; ours for query i is
    # slope * (k_pos - i): the same row shifted by a constant, so a causal
    # softmax over keys 0..i gives the same attention.
    heads, keys = entry["num_heads"], FIXTURES["bloom_keys"]
    bloom = np.array(entry["alibi"], dtype=np.float64)
    ours = alibi_bias(heads, keys, dtype=np.float64)
    np.testing.assert_allclose(ours[:, 0, :], bloom, rtol=2e-6, atol=0)  # query 0: equal

    def softmax(logits):
        weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return weights / weights.sum(axis=-1, keepdims=True)

    for i in range(keys):
        np.testing.assert_allclose(softmax(ours[:, i, :i + 1]), softmax(bloom[:, :i + 1]),
                                   rtol=1e-5)


@pytest.mark.parametrize("entry", FIXTURES["mpt"], ids=lambda e: f"heads{e['num_heads']}")
def test_bias_matches_mpt_last_query(entry):
    # MPT's tensor is the bias row of the last query, at position keys - 1.
    heads, keys = entry["num_heads"], FIXTURES["mpt_keys"]
    mpt = np.array(entry["alibi"], dtype=np.float32)
    ours = alibi_bias(heads, 1, keys, offset=keys - 1)[:, 0, :]
    np.testing.assert_allclose(ours, mpt, rtol=2e-6, atol=0)


# ---------------------------------------------------------------------------
# alibi_bias

BIAS_SIZES = [(0, 0), (0, 4), (4, 0), (1, 1), (1, 9), (9, 1), (3, 3), (5, 11), (11, 5),
              (3, 1030)]


@pytest.mark.parametrize("q_len,k_len", BIAS_SIZES)
@pytest.mark.parametrize("offset", [0, 3, -2, 1000])
@pytest.mark.parametrize("causal", [True, False])
def test_alibi_bias_matches_reference(q_len, k_len, offset, causal):
    heads = 3
    wanted = reference.alibi_bias(heads, q_len, k_len, offset=offset, causal=causal)
    for dtype in FLOATS:
        result = alibi_bias(heads, q_len, k_len, offset=offset, causal=causal, dtype=dtype)
        assert_same(result, expected(wanted, dtype))


@pytest.mark.parametrize("offset", [0, 2, 7])
@pytest.mark.parametrize("q_len", [0, 1, 5])
def test_alibi_bias_default_keys_end_with_the_queries(offset, q_len):
    result = alibi_bias(4, q_len, offset=offset, dtype=np.float64)
    assert result.shape == (4, q_len, offset + q_len)
    assert_same(result, reference.alibi_bias(4, q_len, offset=offset))
    if q_len:
        assert np.all(result[:, -1, -1] == 0.0)  # last query is the last key


def test_alibi_bias_closed_form():
    bias = alibi_bias(2, 3, 4, offset=1, dtype=np.float64)
    slope = 2.0**-4
    q = 1 + np.arange(3)[:, None]
    k = np.arange(4)[None, :]
    assert_same(bias[0], slope * (k - q).astype(np.float64))
    noncausal = alibi_bias(2, 3, 4, offset=1, causal=False, dtype=np.float64)
    assert_same(noncausal[0], slope * (-np.abs(k - q)).astype(np.float64))
    assert np.all(noncausal <= 0)


@pytest.mark.parametrize("offset", [2**52, -2**52, 2**52 - 5])
@pytest.mark.parametrize("causal", [True, False])
def test_alibi_bias_extreme_offsets(offset, causal):
    # Positions and distances near 2**52 are still exact in float64.
    wanted = reference.alibi_bias(3, 2, 4, offset=offset, causal=causal)
    assert_same(alibi_bias(3, 2, 4, offset=offset, causal=causal, dtype=np.float64), wanted)


@pytest.mark.parametrize("dtype", FLOATS)
def test_alibi_bias_out(dtype):
    wanted = expected(reference.alibi_bias(3, 4, 5, offset=1), dtype)
    out = np.full((3, 4, 5), 7, dtype)
    assert alibi_bias(3, 4, 5, offset=1, dtype=dtype, out=out) is out
    assert_same(out, wanted)
    strided = np.full((5, 4, 3), 7, dtype).T  # shape (3, 4, 5), not C-contiguous
    assert alibi_bias(3, 4, 5, offset=1, dtype=dtype, out=strided) is strided
    assert_same(strided, wanted)


def test_alibi_bias_threads_agree(threads):
    threads(1)
    one = alibi_bias(6, 300, 500, offset=11, causal=False)
    threads(4)
    many = alibi_bias(6, 300, 500, offset=11, causal=False)
    assert_same(many, one)


# ---------------------------------------------------------------------------
# add_alibi

SCORE_SHAPES = [(1, 1, 1), (3, 1, 7), (2, 5, 1), (2, 3, 4, 5), (2, 1, 3, 4, 6), (0, 2, 3),
                (2, 0, 3), (2, 3, 0), (1, 2, 3, 600)]


@pytest.mark.parametrize("shape", SCORE_SHAPES, ids=str)
@pytest.mark.parametrize("offset", [0, 2, -3, 50])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", FLOATS)
def test_add_alibi_matches_reference(shape, offset, causal, dtype):
    scores = scores_array(shape, dtype)
    before = scores.copy()
    wanted = expected(reference.add_alibi(scores, offset=offset, causal=causal), dtype)
    assert_same(add_alibi(scores, offset=offset, causal=causal), wanted)
    assert_same(scores, before)  # not in place
    assert add_alibi(scores, offset=offset, causal=causal, out=scores) is scores
    assert_same(scores, wanted)


@pytest.mark.parametrize("dtype", FLOATS)
def test_add_alibi_is_scores_plus_bias(dtype):
    scores = scores_array((2, 4, 6, 9), dtype, seed=3)
    bias = alibi_bias(4, 6, 9, offset=3, dtype=np.float64)
    wanted = (scores.astype(np.float64) + bias).astype(dtype)
    assert_same(add_alibi(scores, offset=3), wanted)


NON_CONTIGUOUS = [lambda a: a[:, :, ::2, :], lambda a: a[..., ::3], lambda a: np.swapaxes(a, 0, 1),
                  lambda a: a[..., ::-1]]


@pytest.mark.parametrize("view", NON_CONTIGUOUS, ids=["rows", "columns", "swapped", "reversed"])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("causal", [True, False])
def test_add_alibi_non_contiguous(view, dtype, causal):
    base = scores_array((2, 3, 8, 10), dtype, seed=1)
    scores = view(base)
    wanted = expected(reference.add_alibi(scores, offset=4, causal=causal), dtype)
    assert_same(add_alibi(scores, offset=4, causal=causal), wanted)
    untouched = base.copy()
    assert add_alibi(scores, offset=4, causal=causal, out=scores) is scores
    assert_same(scores, wanted)
    outside = np.ones(base.shape, bool)
    view(outside)[...] = False
    assert_same(base[outside], untouched[outside])


@pytest.mark.parametrize("dtype", FLOATS)
def test_add_alibi_out(dtype):
    scores = scores_array((2, 3, 4, 5), dtype)
    wanted = expected(reference.add_alibi(scores, offset=1), dtype)
    out = np.full(scores.shape, 7, dtype)
    assert add_alibi(scores, offset=1, out=out) is out
    assert_same(out, wanted)
    strided = np.full(scores.shape[::-1], 7, dtype).T
    assert add_alibi(scores, offset=1, out=strided) is strided
    assert_same(strided, wanted)


def test_add_alibi_big_endian_scores():
    scores = scores_array((2, 3, 4), np.float64).astype(">f8")
    wanted = reference.add_alibi(scores.astype(np.float64), offset=2)
    assert_same(add_alibi(scores, offset=2), wanted)


def test_add_alibi_threads_agree(threads):
    scores = scores_array((2, 4, 130, 300), np.float32, seed=5)
    threads(1)
    one = add_alibi(scores, offset=9, causal=False)
    threads(3)
    many = add_alibi(scores, offset=9, causal=False)
    assert_same(many, one)
    in_place = scores.copy()
    add_alibi(in_place, offset=9, causal=False, out=in_place)
    assert_same(in_place, one)


@pytest.mark.parametrize("heads", [8, 12, 32])
@pytest.mark.parametrize("offset", [0, 5, 2**24 - 150, -2**24 - 40])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("k_len", [301, 1100])
@pytest.mark.parametrize("in_place", [True, False])
def test_add_alibi_float32_bitwise(heads, offset, causal, k_len, in_place):
    # The float32 rows of the AVX-512 and AVX2 variants add a power-of-two
    # slope's biases in float (exact floats while |d| < 2**24) and convert the
    # others to double: both must give the reference rounded once, also for
    # scores whose sum with the bias lies near a rounding tie, zeros of either
    # sign and rows whose distances cross 2**24; rows longer than the ramp
    # of 512 distances are walked in ramp-long chunks.
    rng = np.random.default_rng(heads + offset % 97 + k_len)
    scores = (rng.standard_normal((heads, 3, k_len))
              * 2.0 ** rng.integers(-30, 30, (heads, 3, k_len))).astype(np.float32)
    scores[:, 0, :40] = -0.0
    scores[:, 1, :40] = np.float32(2**24 + 2) * np.sign(scores[:, 1, :40])
    wanted = expected(reference.add_alibi(scores, offset=offset, causal=causal), np.float32)
    out = scores if in_place else np.empty_like(scores)
    assert add_alibi(scores, offset=offset, causal=causal, out=out) is out
    assert_same(out, wanted)


@pytest.mark.parametrize("offset", [2**52, -2**52])
def test_add_alibi_extreme_offsets(offset):
    scores = scores_array((2, 3, 4), np.float64)
    for causal in (True, False):
        wanted = reference.add_alibi(scores, offset=offset, causal=causal)
        assert_same(add_alibi(scores, offset=offset, causal=causal), wanted)


@HYPOTHESIS
@given(lead=st.lists(st.integers(1, 3), max_size=2), heads=st.integers(1, 5),
       q_len=st.integers(0, 6), k_len=st.integers(0, 40), offset=st.integers(-50, 50),
       causal=st.booleans(), double=st.booleans(), seed=st.integers(0, 2**16))
def test_add_alibi_random(lead, heads, q_len, k_len, offset, causal, double, seed):
    dtype = np.float64 if double else np.float32
    scores = scores_array((*lead, heads, q_len, k_len), dtype, seed)
    wanted = expected(reference.add_alibi(scores, offset=offset, causal=causal), dtype)
    assert_same(add_alibi(scores, offset=offset, causal=causal), wanted)


@HYPOTHESIS
@given(heads=st.integers(1, 40), q_len=st.integers(0, 8), extra=st.integers(0, 8),
       offset=st.integers(0, 3000), causal=st.booleans())
def test_alibi_bias_depends_only_on_distance(heads, q_len, extra, offset, causal):
    # Shifting queries and keys together does not change the bias.
    k_len = q_len + extra
    near = alibi_bias(heads, q_len, k_len, causal=causal, dtype=np.float64)
    far = alibi_bias(heads, q_len, offset + k_len, offset=offset, causal=causal,
                     dtype=np.float64)
    assert_same(far[:, :, offset:], near)


# ---------------------------------------------------------------------------
# relative_position_index


@pytest.mark.parametrize("q_len,k_len", BIAS_SIZES[:-1] + [(7, 30)])
@pytest.mark.parametrize("offset", [0, 3, -4, 100])
@pytest.mark.parametrize("max_distance", [0, 1, 2, 5, 64])
def test_relative_position_index_matches_reference(q_len, k_len, offset, max_distance):
    result = relative_position_index(q_len, k_len, max_distance=max_distance, offset=offset)
    assert_same(result, reference.relative_position_index(q_len, k_len,
                                                          max_distance=max_distance,
                                                          offset=offset))


@pytest.mark.parametrize("k", [0, 1, 3, 8])
def test_relative_position_index_range_diagonal_and_clipping(k):
    index = relative_position_index(20, max_distance=k)
    assert index.shape == (20, 20)
    assert index.dtype == np.int64
    assert index.min() == 0 and index.max() == 2 * k
    assert np.all(np.diagonal(index) == k)
    distance = np.arange(20)[None, :] - np.arange(20)[:, None]
    assert np.all(index[distance >= k] == 2 * k)
    assert np.all(index[distance <= -k] == 0)
    inside = np.abs(distance) < k
    assert_same(index[inside], distance[inside] + k)


def test_relative_position_index_default_keys():
    index = relative_position_index(2, max_distance=3, offset=4)
    assert index.shape == (2, 6)
    assert index[-1, -1] == 3


# ---------------------------------------------------------------------------
# t5_relative_bucket


def expand_runs(runs) -> np.ndarray:
    return np.concatenate([np.full(last - first + 1, bucket, dtype=np.int64)
                           for first, last, bucket in runs])


T5_ENTRIES = FIXTURES["t5"]


def t5_id(entry) -> str:
    kind = "bidirectional" if entry["bidirectional"] else "causal"
    return f"{kind}-{entry['num_buckets']}-{entry['max_distance']}"


@pytest.mark.parametrize("entry", T5_ENTRIES, ids=t5_id)
def test_t5_matches_transformers(entry):
    span = FIXTURES["t5_span"]
    options = dict(bidirectional=entry["bidirectional"], num_buckets=entry["num_buckets"],
                   max_distance=entry["max_distance"])
    wanted = expand_runs(entry["runs"])  # relative positions -span .. span
    # One query at position span against keys 0 .. 2*span.
    assert_same(t5_relative_bucket(1, 2 * span + 1, offset=span, **options)[0], wanted)
    # A block of queries: row i holds the relative positions -offset-i .. k_len-1-offset-i.
    block = t5_relative_bucket(40, 90, offset=25, **options)
    distance = np.arange(90)[None, :] - 25 - np.arange(40)[:, None]
    assert_same(block, wanted[distance + span])
    for position, bucket in entry["large"]:
        assert t5_relative_bucket(1, 1, offset=-position, **options)[0, 0] == bucket
        assert reference.t5_bucket(position, **options) == bucket


@pytest.mark.parametrize("entry", T5_ENTRIES[:3] + T5_ENTRIES[10:13], ids=t5_id)
def test_t5_reference_matches_transformers(entry):
    options = dict(bidirectional=entry["bidirectional"], num_buckets=entry["num_buckets"],
                   max_distance=entry["max_distance"])
    span = FIXTURES["t5_span"]
    wanted = expand_runs(entry["runs"])
    for position in list(range(-600, 601)) + [-span, span, 5000, -5000]:
        assert reference.t5_bucket(position, **options) == wanted[position + span]


@pytest.mark.parametrize("q_len,k_len", BIAS_SIZES[:-1] + [(6, 40)])
@pytest.mark.parametrize("offset", [0, 5, -3])
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (4, 3), (9, 20)])
def test_t5_matches_reference(q_len, k_len, offset, bidirectional, num_buckets, max_distance):
    options = dict(bidirectional=bidirectional, num_buckets=num_buckets,
                   max_distance=max_distance, offset=offset)
    assert_same(t5_relative_bucket(q_len, k_len, **options),
                reference.t5_relative_bucket(q_len, k_len, **options))


@HYPOTHESIS
@given(q_len=st.integers(0, 5), k_len=st.integers(0, 30), offset=st.integers(-10**9, 10**9),
       bidirectional=st.booleans(), num_buckets=st.integers(4, 200),
       extra_distance=st.integers(1, 5000))
def test_t5_random(q_len, k_len, offset, bidirectional, num_buckets, extra_distance):
    max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    options = dict(bidirectional=bidirectional, num_buckets=num_buckets,
                   max_distance=max_exact + extra_distance, offset=offset)
    result = t5_relative_bucket(q_len, k_len, **options)
    assert_same(result, reference.t5_relative_bucket(q_len, k_len, **options))
    assert result.size == 0 or 0 <= result.min() <= result.max() < num_buckets


def test_t5_default_keys_and_defaults():
    buckets = t5_relative_bucket(3, offset=2)
    assert buckets.shape == (3, 5)
    assert_same(buckets, reference.t5_relative_bucket(3, 5, offset=2))
    assert np.all(buckets[np.arange(3), 2 + np.arange(3)] == 0)


# ---------------------------------------------------------------------------
# errors: clear messages, nothing written


@pytest.mark.parametrize("call,error,match", [
    (lambda: alibi_slopes(0), ValueError, r"num_heads must be >= 1, got 0"),
    (lambda: alibi_slopes(-3), ValueError, r"num_heads must be >= 1"),
    (lambda: alibi_slopes(2.0), TypeError, r"num_heads must be an integer, got float"),
    (lambda: alibi_slopes(True), TypeError, r"num_heads must be an integer, got bool"),
    (lambda: alibi_slopes("8"), TypeError, r"num_heads must be an integer, got str"),
    (lambda: alibi_slopes(2**62), ValueError, r"set by num_heads = 4611686018427387904 is more than NumPy can hold"),
    (lambda: alibi_bias(2**62, 0, 1), ValueError, r"set by num_heads, q_len and k_len is more than NumPy"),
    (lambda: alibi_bias(0, 3), ValueError, r"num_heads must be >= 1"),
    (lambda: alibi_bias(2, -1), ValueError, r"q_len must be >= 0, got -1"),
    (lambda: alibi_bias(2, 3, -1), ValueError, r"k_len must be >= 0, got -1"),
    (lambda: alibi_bias(2, 3.0), TypeError, r"q_len must be an integer, got float"),
    (lambda: alibi_bias(2, 3, np.bool_(True)), TypeError, r"k_len must be an integer, got bool"),
    (lambda: alibi_bias(2, 2, offset=-5), ValueError,
     r"k_len defaults to offset \+ q_len = -5 \+ 2 = -3, which is negative"),
    (lambda: alibi_bias(2, 3, offset=1.5), TypeError, r"offset must be an integer, got float"),
    (lambda: alibi_bias(2, 3, offset=False), TypeError, r"offset must be an integer, got bool"),
    (lambda: alibi_bias(2, 3, offset=2**52 + 1), ValueError,
     r"offset must lie in \[-2\*\*52, 2\*\*52\]"),
    (lambda: alibi_bias(2, 3, causal=1), TypeError, r"causal must be a bool, got int"),
    (lambda: alibi_bias(2, 3, dtype=np.int32), TypeError,
     r"dtype must be float16, bfloat16, float32 or float64"),
    (lambda: alibi_bias(2, 3, dtype=ml_dtypes.float8_e4m3fn), TypeError,
     r"dtype must be float16, bfloat16, float32 or float64"),
    (lambda: alibi_bias(2, 3, dtype="nonsense"), TypeError,
     r"dtype must be float16, bfloat16, float32 or float64"),
    (lambda: alibi_bias(2, 3, out=[0.0]), TypeError, r"out must be a numpy.ndarray, got list"),
    (lambda: add_alibi(np.zeros((2, 3, 4), np.int32)), TypeError,
     r"scores must be a float16, bfloat16, float32 or float64 array, got dtype int32"),
    (lambda: add_alibi(np.zeros((2, 3, 4), bool)), TypeError, r"scores must be a float16"),
    (lambda: add_alibi(np.zeros((2, 3, 4), ml_dtypes.float8_e4m3fn)), TypeError,
     r"scores must be a float16, bfloat16, float32 or float64 array, got dtype float8_e4m3fn"),
    (lambda: add_alibi(np.zeros((3, 4))), ValueError,
     r"scores must have shape \(\.\.\., heads, q_len, k_len\) with at least 3 dimensions, "
     r"got shape \(3, 4\)"),
    (lambda: add_alibi(np.zeros((1, 3, 4)), offset=0.5), TypeError, r"offset must be an integer"),
    (lambda: add_alibi(np.zeros((1, 3, 4)), causal=None), TypeError, r"causal must be a bool"),
    (lambda: relative_position_index(3), TypeError, r"max_distance"),
    (lambda: relative_position_index(3, max_distance=-1), ValueError,
     r"max_distance must be >= 0, got -1"),
    (lambda: relative_position_index(3, max_distance=2.0), TypeError,
     r"max_distance must be an integer, got float"),
    (lambda: relative_position_index(3, max_distance=2**53), ValueError,
     r"max_distance must be <= 2\*\*52"),
    (lambda: relative_position_index(-2, max_distance=2), ValueError, r"q_len must be >= 0"),
    (lambda: relative_position_index(True, max_distance=2), TypeError, r"q_len must be an integer"),
    (lambda: t5_relative_bucket(3, num_buckets=3), ValueError,
     r"num_buckets must be >= 4 when bidirectional=True .* got 3"),
    (lambda: t5_relative_bucket(3, num_buckets=1, bidirectional=False), ValueError,
     r"num_buckets must be >= 2 when bidirectional=False .* got 1"),
    (lambda: t5_relative_bucket(3, num_buckets=32.0), TypeError,
     r"num_buckets must be an integer, got float"),
    (lambda: t5_relative_bucket(3, num_buckets=32, max_distance=8), ValueError,
     r"max_distance must be > max_exact = 8 .* got 8"),
    (lambda: t5_relative_bucket(3, num_buckets=4, bidirectional=False, max_distance=1), ValueError,
     r"max_distance must be > max_exact = 2"),
    (lambda: t5_relative_bucket(3, max_distance=-1), ValueError, r"max_distance must be > "),
    (lambda: t5_relative_bucket(3, bidirectional="yes"), TypeError,
     r"bidirectional must be a bool, got str"),
    (lambda: t5_relative_bucket(3, k_len=-1), ValueError, r"k_len must be >= 0"),
    (lambda: t5_relative_bucket(3, offset=-2**60), ValueError, r"offset must lie in"),
    # an empty result whose other axis no array holds: refused before the kernel's int64 arithmetic
    (lambda: t5_relative_bucket(2**63, 0, offset=3), ValueError, r"q_len must be at most 2\*\*52"),
    (lambda: relative_position_index(2**53, 0, max_distance=3), ValueError, r"q_len must be at most 2\*\*52"),
    (lambda: alibi_bias(2, 0, 2**63), ValueError, r"k_len must be at most 2\*\*52"),
])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("out,match", [
    (np.zeros((2, 3, 4), np.float32), r"out must have shape \(2, 3, 5\), got \(2, 3, 4\)"),
    (np.zeros((3, 5), np.float32), r"out must have shape \(2, 3, 5\), got \(3, 5\)"),
    (np.zeros((2, 3, 5), np.float64), r"out must have dtype float32, got float64"),
    (np.zeros((2, 3, 5), np.float32), r"out must be writeable"),
])
def test_alibi_bias_bad_out_is_untouched(out, match):
    out[...] = 7
    if "writeable" in match:
        out.flags.writeable = False
    with pytest.raises(ValueError, match=match):
        alibi_bias(2, 3, 5, out=out)
    assert np.all(out == 7)


def test_alibi_bias_failed_call_writes_nothing():
    out = np.full((2, 3, 5), 7, np.float32)
    for bad in (dict(causal="yes"), dict(offset=0.5), dict(dtype=np.float64)):
        with pytest.raises((TypeError, ValueError)):
            alibi_bias(2, 3, 5, out=out, **bad)
        assert np.all(out == 7)


@pytest.mark.parametrize("make_out,error,match", [
    (lambda s: np.zeros((2, 3, 4), s.dtype), ValueError, r"out must have shape \(2, 3, 4, 5\)"),
    (lambda s: np.zeros(s.shape, np.float64), ValueError, r"out must have dtype float32"),
    (lambda s: s[::-1], ValueError, r"out overlaps an input without being the same array"),
    (lambda s: s.reshape(-1)[::-1].reshape(s.shape), ValueError, r"out overlaps an input"),
    (lambda s: s.tolist(), TypeError, r"out must be a numpy.ndarray, got list"),
])
def test_add_alibi_bad_out_leaves_scores_untouched(make_out, error, match):
    scores = scores_array((2, 3, 4, 5), np.float32)
    before = scores.copy()
    out = make_out(scores)
    out_before = np.array(out, copy=True)
    with pytest.raises(error, match=match):
        add_alibi(scores, out=out)
    assert_same(scores, before)
    np.testing.assert_array_equal(np.asarray(out), out_before)


def test_add_alibi_read_only_out():
    scores = scores_array((2, 3, 4), np.float64)
    before = scores.copy()
    scores.flags.writeable = False
    with pytest.raises(ValueError, match=r"out must be writeable"):
        add_alibi(scores, out=scores)
    assert_same(scores, before)
    # Read-only scores are fine when the result goes elsewhere.
    assert_same(add_alibi(scores), reference.add_alibi(before))


def test_add_alibi_failed_call_leaves_scores_untouched():
    scores = scores_array((2, 3, 4), np.float32)
    before = scores.copy()
    for bad in (dict(causal=0), dict(offset="1"), dict(offset=2**53)):
        with pytest.raises((TypeError, ValueError)):
            add_alibi(scores, out=scores, **bad)
        assert_same(scores, before)


def test_max_offset_is_accepted():
    assert t5_relative_bucket(1, 1, offset=2**52).shape == (1, 1)
    assert relative_position_index(1, 1, max_distance=3, offset=-2**52)[0, 0] == 6
    assert math.isfinite(alibi_bias(1, 1, 1, offset=2**52)[0, 0, 0])


def test_empty_results_with_huge_other_axis():
    # No per-distance vector is built when there are no (query, key) pairs.
    assert relative_position_index(0, 10**15, max_distance=3).shape == (0, 10**15)
    assert t5_relative_bucket(10**15, 0).shape == (10**15, 0)
    assert alibi_bias(2, 0, 10**15).shape == (2, 0, 10**15)
