"""apply_rotary_cos_sin and apply_rotary_cos_sin_qk against the plain-loop reference.

Where the arithmetic runs in float64 (any float64 operand) the kernel does
the reference's operations in the reference's order, so the result must be
the reference rounded once to x's dtype, bit for bit.  Only float32 data with
a float32 cache computes in float32 and is compared to a tolerance.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose, assert_array_equal

import posenc_fast as pf
from posenc_fast import reference

DTYPES = (np.float32, np.float64)
LAYOUTS = ("half", "interleaved")


def random(shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def true_cos_sin(positions, half, base=10000.0):
    """float64 cos/sin of the RoPE angles, shape positions.shape + (half,)."""
    return reference.rope_cos_sin(positions, reference.rope_inv_freq(2 * half, base))


def check(got, expected, x_dtype, cache_dtype, scale=None):
    """Bitwise against the rounded reference unless the arithmetic is float32.

    `scale` bounds the products a*cos, b*sin (default: the largest result).
    """
    assert got.dtype == x_dtype
    if np.dtype(x_dtype) == np.dtype(cache_dtype) == np.float32:
        scale = np.abs(expected).max(initial=1.0) if scale is None else max(scale, 1.0)
        assert_allclose(got, expected, rtol=0, atol=4e-7 * scale)
    else:
        assert_array_equal(got, expected.astype(x_dtype))


# ---------------------------------------------------------------------------
# values


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_true_cos_sin_matches_rope_reference(layout, dtype):
    x = random((2, 3, 7, 16), dtype)
    cos, sin = true_cos_sin(np.arange(7), 8)
    got = pf.apply_rotary_cos_sin(x, cos.astype(dtype), sin.astype(dtype), layout=layout)
    expected = reference.apply_rotary(x, np.arange(7), reference.rope_inv_freq(16),
                                      layout=layout)
    tol = {np.float32: 2e-6, np.float64: 1e-14}[dtype]
    assert_allclose(got, expected, rtol=0, atol=tol * np.abs(expected).max())


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_same_kernel_as_rotary_embedding(layout, dtype):
    # The cache RotaryEmbedding builds for itself gives its result bit for bit.
    rope = pf.RotaryEmbedding(32, layout=layout, base=500000.0)
    x = random((2, 4, 9, 32), dtype)
    positions = np.arange(100, 109)
    cos, sin = rope.cos_sin(positions, dtype=dtype)
    assert_array_equal(pf.apply_rotary_cos_sin(x, cos, sin, layout=layout),
                       rope.apply(x, positions))


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cache_dtype", DTYPES)
@pytest.mark.parametrize("x_dtype", DTYPES)
def test_dtype_mixes(x_dtype, cache_dtype, layout, inverse):
    x = random((3, 5, 12), x_dtype, seed=1)
    cos = random((5, 6), cache_dtype, seed=2)
    sin = random((5, 6), cache_dtype, seed=3)
    got = pf.apply_rotary_cos_sin(x, cos, sin, layout=layout, inverse=inverse)
    expected = reference.apply_rotary_cos_sin(x, cos, sin, layout=layout, inverse=inverse)
    check(got, expected, x_dtype, cache_dtype)


def test_float32_data_with_float64_cache_is_rounded_once():
    # Rounding the float64 product once differs from rounding the cache first.
    x = random((64, 64), np.float32, seed=4)
    cos, sin = true_cos_sin(np.arange(64) * 1000.0, 32)
    got = pf.apply_rotary_cos_sin(x, cos, sin)
    exact = reference.apply_rotary_cos_sin(x, cos, sin)
    assert_array_equal(got, exact.astype(np.float32))
    rounded_cache = pf.apply_rotary_cos_sin(x, cos.astype(np.float32), sin.astype(np.float32))
    assert not np.array_equal(got, rounded_cache)


def test_cos_and_sin_of_different_dtypes_compute_in_float64():
    x = random((4, 8), np.float32)
    cos, sin = random((4, 4), seed=1), random((4, 4), seed=2)
    got = pf.apply_rotary_cos_sin(x, cos.astype(np.float32), sin)
    expected = reference.apply_rotary_cos_sin(x, cos.astype(np.float32), sin)
    assert_array_equal(got, expected.astype(np.float32))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_partial_rotary_passes_the_rest_through(layout, dtype):
    x = random((2, 5, 20), dtype)
    cos, sin = random((5, 3), dtype, seed=1), random((5, 3), dtype, seed=2)  # r = 6
    got = pf.apply_rotary_cos_sin(x, cos, sin, layout=layout)
    assert_array_equal(got[..., 6:], x[..., 6:])
    check(got, reference.apply_rotary_cos_sin(x, cos, sin, layout=layout), dtype, dtype)


# ---------------------------------------------------------------------------
# the broadcast form (positions=None)


@pytest.mark.parametrize("cache_shape", [(7, 4), (2, 1, 7, 4), (1, 3, 1, 4), (4,)])
def test_broadcast_caches(cache_shape):
    x = random((2, 3, 7, 8))
    cos, sin = random(cache_shape, seed=1), random(cache_shape, seed=2)
    got = pf.apply_rotary_cos_sin(x, cos, sin)
    assert_array_equal(got, reference.apply_rotary_cos_sin(x, cos, sin))


def hf_cache(batch, seq, dim, dtype, seed=0):
    """A transformers-style full-width (batch, seq, dim) cache whose halves repeat."""
    positions = np.random.default_rng(seed).integers(0, 5000, (batch, seq))
    cos, sin = true_cos_sin(positions, dim // 2)
    full = [np.concatenate([t, t], axis=-1).astype(dtype) for t in (cos, sin)]
    for t in full:
        t.setflags(write=False)
    return full


@pytest.mark.parametrize("dtype", DTYPES)
def test_transformers_full_width_cache_view(dtype):
    dim = 16
    cos_full, sin_full = hf_cache(2, 6, dim, dtype)
    x = random((2, 4, 6, dim), dtype, seed=1)
    cos, sin = cos_full[:, None, :, :dim // 2], sin_full[:, None, :, :dim // 2]
    # The view flattens to (rows, dim/2) with unit stride: usable without a copy.
    assert np.shares_memory(cos.reshape(-1, dim // 2), cos_full)
    got = pf.apply_rotary_cos_sin(x, cos, sin)
    assert_array_equal(got, pf.apply_rotary_cos_sin(x, cos.copy(), sin.copy()))
    expected = reference.apply_rotary_cos_sin(x, cos, sin)
    check(got, expected, dtype, dtype)
    # transformers' formula: x * cos + rotate_half(x) * sin on the full cache.
    rotate_half = np.concatenate([-x[..., dim // 2:], x[..., :dim // 2]], axis=-1)
    hf = x * cos_full[:, None] + rotate_half * sin_full[:, None]
    assert_allclose(got, hf, rtol=0, atol=4e-6 if dtype == np.float32 else 1e-14)


def test_transformers_cache_for_seq_major_layout():
    dim = 8
    cos_full, sin_full = hf_cache(2, 5, dim, np.float64)
    x = random((2, 5, 3, dim))  # (batch, seq, heads, dim): HF's unsqueeze_dim=2
    cos, sin = cos_full[:, :, None, :dim // 2], sin_full[:, :, None, :dim // 2]
    got = pf.apply_rotary_cos_sin(x, cos, sin)
    assert_array_equal(got, reference.apply_rotary_cos_sin(x, cos, sin))


# ---------------------------------------------------------------------------
# the table + positions form


@pytest.mark.parametrize("x_shape, positions", [
    ((2, 3, 5, 8), np.array([4, 0, 9, 9, 2])),
    ((2, 3, 5, 8), np.array([[[1, 2, 3, 4, 5]], [[7, 8, 9, 10, 11]]])),
    ((6, 4, 8), np.array([[3], [0], [11], [5], [5], [1]])),
    ((2, 4, 1, 8), np.int64(11)),
    ((3, 8), [0, 1, 2]),
    ((3, 8), np.array([2])),
    ((3, 8), np.arange(6)[::2]),
])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_table_and_positions(x_shape, positions, layout):
    x = random(x_shape)
    table_cos, table_sin = true_cos_sin(np.arange(12), 4)
    got = pf.apply_rotary_cos_sin(x, table_cos, table_sin, positions, layout=layout)
    expected = reference.apply_rotary_cos_sin(x, table_cos, table_sin, positions,
                                              layout=layout)
    assert_array_equal(got, expected)
    # Same as gathering the rows first and using the broadcast form.
    index = np.asarray(positions)
    gathered = pf.apply_rotary_cos_sin(x, table_cos[index], table_sin[index], layout=layout)
    assert_array_equal(got, gathered)


@pytest.mark.parametrize("positions_dtype", [np.int32, np.uint8, np.int64])
def test_integer_position_dtypes(positions_dtype):
    x = random((4, 8))
    cos, sin = true_cos_sin(np.arange(10), 4)
    positions = np.array([9, 0, 3, 3], dtype=positions_dtype)
    assert_array_equal(pf.apply_rotary_cos_sin(x, cos, sin, positions),
                       reference.apply_rotary_cos_sin(x, cos, sin, positions))


# ---------------------------------------------------------------------------
# inverse, out=, in place, layouts of x


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_inverse_undoes_the_rotation(layout, dtype):
    x = random((3, 10, 16), dtype)
    cos, sin = (t.astype(dtype) for t in true_cos_sin(np.arange(10) * 97, 8))
    y = pf.apply_rotary_cos_sin(x, cos, sin, layout=layout)
    back = pf.apply_rotary_cos_sin(y, cos, sin, layout=layout, inverse=True)
    assert_allclose(back, x, rtol=0, atol={np.float32: 2e-6, np.float64: 1e-14}[dtype] * 8)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_in_place_and_out(layout):
    x = random((2, 3, 6, 10))
    cos, sin = random((6, 4), seed=1), random((6, 4), seed=2)
    expected = pf.apply_rotary_cos_sin(x, cos, sin, layout=layout)
    out = np.full_like(x, np.nan)
    assert pf.apply_rotary_cos_sin(x, cos, sin, layout=layout, out=out) is out
    assert_array_equal(out, expected)
    strided_out = np.full((2, 6, 3, 10), np.nan).transpose(0, 2, 1, 3)
    assert pf.apply_rotary_cos_sin(x, cos, sin, layout=layout, out=strided_out) is strided_out
    assert_array_equal(strided_out, expected)
    assert pf.apply_rotary_cos_sin(x, cos, sin, layout=layout, out=x) is x
    assert_array_equal(x, expected)


def test_in_place_on_a_non_contiguous_view():
    base = random((2, 6, 3, 8))
    x = base.transpose(0, 2, 1, 3)  # (batch, heads, seq, dim) view of seq-major memory
    cos, sin = random((6, 4), seed=1), random((6, 4), seed=2)
    expected = reference.apply_rotary_cos_sin(x, cos, sin)
    assert pf.apply_rotary_cos_sin(x, cos, sin, out=x) is x
    assert_array_equal(x, expected)


@pytest.mark.parametrize("make_view", [
    lambda a: a.transpose(0, 2, 1, 3),
    lambda a: a[:, :, ::2],
    lambda a: a[..., ::-1],
    lambda a: np.asfortranarray(a),
])
def test_non_contiguous_x(make_view):
    x = make_view(random((2, 4, 8, 12)))
    cos, sin = random(x.shape[-2:-1] + (5,), seed=1), random(x.shape[-2:-1] + (5,), seed=2)
    got = pf.apply_rotary_cos_sin(x, cos, sin)
    assert_array_equal(got, pf.apply_rotary_cos_sin(np.ascontiguousarray(x), cos, sin))
    assert_array_equal(got, reference.apply_rotary_cos_sin(x, cos, sin))


def test_read_only_inputs():
    x, cos, sin = random((3, 8)), random((3, 4), seed=1), random((3, 4), seed=2)
    for a in (x, cos, sin):
        a.setflags(write=False)
    assert_array_equal(pf.apply_rotary_cos_sin(x, cos, sin),
                       reference.apply_rotary_cos_sin(x, cos, sin))


def test_byte_swapped_inputs():
    x, cos, sin = random((3, 8)), random((3, 4), seed=1), random((3, 4), seed=2)
    swapped = [a.astype(a.dtype.newbyteorder()) for a in (x, cos, sin)]
    assert_array_equal(pf.apply_rotary_cos_sin(*swapped), pf.apply_rotary_cos_sin(x, cos, sin))


def test_empty_x():
    cos, sin = random((0, 4)), random((0, 4))
    assert pf.apply_rotary_cos_sin(np.zeros((2, 0, 8)), cos, sin).shape == (2, 0, 8)


def test_threads_do_not_change_the_result():
    x = random((1, 8, 512, 64), np.float32)
    cos, sin = (t.astype(np.float32) for t in true_cos_sin(np.arange(512), 32))
    before = pf.get_num_threads()
    try:
        pf.set_num_threads(1)
        one = pf.apply_rotary_cos_sin(x, cos, sin)
        pf.set_num_threads(4)
        many = pf.apply_rotary_cos_sin(x, cos, sin)
    finally:
        pf.set_num_threads(before)
    assert_array_equal(one, many)


@given(heads=st.integers(1, 12), seq=st.integers(1, 200), threads=st.sampled_from([1, 3]),
       dtype=st.sampled_from(DTYPES), layout=st.sampled_from(LAYOUTS),
       pairs=st.sampled_from([32, 20]), halves_view=st.booleans(), in_place=st.booleans())
@settings(deadline=None)
def test_blocks_of_positions_equal_the_table_path(heads, seq, threads, dtype, layout, pairs,
                                                  halves_view, in_place):
    # A (seq, pairs) cache walks x's heads in blocks of positions (a block one
    # kernel call), on any number of threads: bitwise the row kernels' results
    # (the positions path looks each row up in the same tables).
    x = random((2, heads, seq, 64), dtype, seed=seq)
    cos, sin = (t.astype(dtype) for t in true_cos_sin(np.arange(seq) + 3, pairs))
    if halves_view:  # transformers' full-width cache, sliced to one entry per pair
        cos, sin = (np.concatenate((t, t), axis=-1)[:, :pairs] for t in (cos, sin))
    want = pf.apply_rotary_cos_sin(x, cos, sin, np.arange(seq), layout=layout)
    before = pf.get_num_threads()
    try:
        pf.set_num_threads(threads)
        got = x.copy() if in_place else np.empty_like(x)
        pf.apply_rotary_cos_sin(got if in_place else x, cos, sin, layout=layout, out=got)
    finally:
        pf.set_num_threads(before)
    assert_array_equal(got, want)


# ---------------------------------------------------------------------------
# queries and keys together


@pytest.mark.parametrize("use_positions", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_qk_equals_two_single_calls(layout, use_positions):
    q, k = random((2, 8, 5, 16), np.float32), random((2, 2, 5, 16), np.float64, seed=1)
    if use_positions:
        cos, sin = true_cos_sin(np.arange(20), 8)
        positions = np.array([[[3, 4, 5, 6, 7]], [[0, 1, 2, 3, 19]]])
    else:
        cos, sin = true_cos_sin(np.arange(5), 8)
        positions = None
    q_rot, k_rot = pf.apply_rotary_cos_sin_qk(q, k, cos, sin, positions, layout=layout)
    assert_array_equal(q_rot, pf.apply_rotary_cos_sin(q, cos, sin, positions, layout=layout))
    assert_array_equal(k_rot, pf.apply_rotary_cos_sin(k, cos, sin, positions, layout=layout))
    assert (q_rot.dtype, k_rot.dtype) == (np.float32, np.float64)


def test_qk_in_place_and_out():
    q, k = random((1, 4, 3, 8)), random((1, 2, 3, 8), seed=1)
    cos, sin = random((3, 4), seed=2), random((3, 4), seed=3)
    q_expected, k_expected = pf.apply_rotary_cos_sin_qk(q, k, cos, sin)
    out_k = np.empty_like(k)
    q_rot, k_rot = pf.apply_rotary_cos_sin_qk(q, k, cos, sin, out_q=q, out_k=out_k)
    assert q_rot is q and k_rot is out_k
    assert_array_equal(q, q_expected)
    assert_array_equal(out_k, k_expected)


def test_qk_on_slices_of_one_fused_buffer():
    qkv = random((2, 5, 6, 8))  # (batch, seq, 4 q heads + 2 k heads, dim)
    q, k = qkv[:, :, :4].transpose(0, 2, 1, 3), qkv[:, :, 4:].transpose(0, 2, 1, 3)
    cos, sin = random((5, 4), seed=1), random((5, 4), seed=2)
    q_expected = reference.apply_rotary_cos_sin(q, cos, sin)
    k_expected = reference.apply_rotary_cos_sin(k, cos, sin)
    pf.apply_rotary_cos_sin_qk(q, k, cos, sin, out_q=q, out_k=k)
    assert_array_equal(q, q_expected)
    assert_array_equal(k, k_expected)


# ---------------------------------------------------------------------------
# errors: each raises before anything is written

ERROR_CASES = {
    "position too large": (
        dict(positions=np.array([0, 1, 5])), ValueError,
        r"positions must lie in \[0, 5\) .* from 0 to 5"),
    "negative position": (
        dict(positions=np.array([0, -1, 2])), ValueError,
        r"positions must lie in \[0, 5\) .* from -1 to 2"),
    "float positions": (
        dict(positions=np.array([0.0, 1.0, 2.0])), TypeError,
        "positions must be an integer array, got dtype float64"),
    "positions do not broadcast": (
        dict(positions=np.array([0, 1])), ValueError,
        r"positions of shape \(2,\) does not broadcast against x.shape\[:-1\] = \(2, 3\)"),
    "cache too wide": (
        dict(cos=np.zeros((3, 5)), sin=np.zeros((3, 5))), ValueError,
        r"rotary_dim = 10, which exceeds x.shape\[-1\] = 8"),
    "full-width transformers cache": (
        dict(cos=np.zeros((3, 8)), sin=np.zeros((3, 8))), ValueError,
        r"cos\[..., :dim//2\]"),
    "cos/sin shapes differ": (
        dict(sin=np.zeros((3, 3))), ValueError,
        r"cos and sin must have the same shape, got \(3, 4\) and \(3, 3\)"),
    "cache does not broadcast": (
        dict(cos=np.zeros((4, 4)), sin=np.zeros((4, 4))), ValueError,
        r"leading shape of shape \(4,\) does not broadcast against x.shape\[:-1\] = \(2, 3\)"),
    "3-D cache with positions": (
        dict(cos=np.zeros((1, 5, 4)), sin=np.zeros((1, 5, 4)), positions=np.array([0, 1, 2])),
        ValueError, r"2-D tables \(n, rotary_dim/2\), got shape \(1, 5, 4\)"),
    "empty cache axis": (
        dict(cos=np.zeros((3, 0)), sin=np.zeros((3, 0))), ValueError,
        "last axis of rotary_dim/2 >= 1 entries"),
    "integer cache": (
        dict(cos=np.zeros((3, 4), int), sin=np.zeros((3, 4), int)), TypeError,
        "cos must be a float16, bfloat16, float32 or float64 array, got dtype int64"),
    "bad layout": (dict(layout="neox"), ValueError, "layout must be one of"),
    "inverse not a bool": (dict(inverse=1), TypeError, "inverse must be a bool"),
}


def error_call(changes):
    x = random((2, 3, 8))
    cos, sin = random((3, 4), seed=1), random((3, 4), seed=2)
    kwargs = dict(cos=cos, sin=sin)
    if "positions" in changes:
        kwargs["cos"], kwargs["sin"] = random((5, 4), seed=1), random((5, 4), seed=2)
    kwargs.update(changes)
    return x, kwargs


@pytest.mark.parametrize("case", list(ERROR_CASES))
@pytest.mark.parametrize("in_place", [False, True])
def test_errors_write_nothing(case, in_place):
    changes, error, match = ERROR_CASES[case]
    x, kwargs = error_call(changes)
    x_before = x.copy()
    out = x if in_place else np.full_like(x, 7.0)
    out_before = out.copy()
    with pytest.raises(error, match=match):
        pf.apply_rotary_cos_sin(x, out=out, **kwargs)
    assert_array_equal(x, x_before)
    assert_array_equal(out, out_before)


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_qk_errors_write_nothing(case):
    changes, error, match = ERROR_CASES[case]
    x, kwargs = error_call(changes)
    q, k = x, random((2, 3, 8), seed=9)
    q_before, k_before = q.copy(), k.copy()
    with pytest.raises(error, match=match.replace("x.shape", "q.shape")):
        pf.apply_rotary_cos_sin_qk(q, k, out_q=q, out_k=k, **kwargs)
    assert_array_equal(q, q_before)
    assert_array_equal(k, k_before)


def test_qk_error_from_k_leaves_q_untouched():
    q, k = random((2, 4, 5, 8)), random((2, 3, 5, 8), seed=1)
    cos, sin = random((9, 4), seed=2), random((9, 4), seed=3)
    q_before = q.copy()
    with pytest.raises(ValueError, match=r"does not broadcast against k.shape\[:-1\]"):
        pf.apply_rotary_cos_sin_qk(q, k, cos, sin, np.zeros((4, 5), int), out_q=q, out_k=k)
    assert_array_equal(q, q_before)


def test_out_overlapping_the_cache():
    x = random((3, 8))
    arena = random((3, 8), seed=1)
    cos, sin = arena[:, :4], random((3, 4), seed=2)
    arena_before = arena.copy()
    with pytest.raises(ValueError, match="out overlaps another input or output"):
        pf.apply_rotary_cos_sin(x, cos, sin, out=arena)
    assert_array_equal(arena, arena_before)
    k = random((3, 8), seed=3)
    with pytest.raises(ValueError, match="out_k overlaps another input or output"):
        pf.apply_rotary_cos_sin_qk(x, k, cos, sin, out_k=arena)
    assert_array_equal(arena, arena_before)


@pytest.mark.parametrize("where", ["out", "x in place", "out_q", "out_k"])
def test_positions_inside_what_the_call_writes(where):
    # the walk reads each token's position while it writes: a rotation would change them (it read the
    # cos/sin table past its end)
    x, out, q = np.full((4, 8), -1e300), np.zeros((4, 8)), random((4, 8), seed=1)
    holder = x if where == "x in place" else out
    positions = holder[0, :4].view(np.int64)
    positions[:] = [0, 1, 2, 3]
    cos, sin = np.zeros((4, 4)), np.ones((4, 4))
    before = holder.copy()
    name = "out" if where == "x in place" else where
    with pytest.raises(ValueError, match=f"positions shares memory with {name}, which the call writes"):
        if where in ("out", "x in place"):
            pf.apply_rotary_cos_sin(x, cos, sin, positions, out=holder)
        elif where == "out_q":
            pf.apply_rotary_cos_sin_qk(q, x, cos, sin, positions, out_q=out)
        else:
            pf.apply_rotary_cos_sin_qk(q, x, cos, sin, positions, out_k=out)
    assert_array_equal(holder, before)


def _strided_cache_sharing_memory(kind):
    """(x, cos, sin, out) where out shares memory with a non-contiguous cos.

    A sliced or reversed cache reaches past its nbytes, or below its data
    pointer: the overlap must still be seen.
    """
    sin = np.full((8, 4), 0.5)
    if kind == "every other row":  # cos rows 4..7 lie inside out
        arena = np.arange(256, dtype=np.float64) * 0.01
        return np.ones((8, 8)), arena[:64].reshape(16, 4)[::2], sin, arena[32:96].reshape(8, 8)
    if kind == "reversed, in place":  # cos lies below its data pointer, inside x
        arena = np.linspace(0.1, 0.9, 128)
        x = arena[:64].reshape(8, 8)
        return x, arena.reshape(8, 16)[::-1, :4], sin, x
    arena = random((8, 16), seed=3)  # "full-width slice": transformers' cos[..., :dim//2]
    return np.ones((8, 8)), arena[:, :4], sin, arena.reshape(-1)[32:96].reshape(8, 8)


@pytest.mark.parametrize("kind", ["every other row", "reversed, in place", "full-width slice"])
@pytest.mark.parametrize("qk", [False, True])
def test_out_overlapping_a_strided_cache(kind, qk):
    x, cos, sin, out = _strided_cache_sharing_memory(kind)
    assert np.shares_memory(out, cos)
    cos_before, out_before = cos.copy(), out.copy()
    if qk:
        q = np.ones((2, 8, 8))
        with pytest.raises(ValueError, match="overlaps"):
            pf.apply_rotary_cos_sin_qk(q, x, cos, sin, out_k=out)
    else:
        with pytest.raises(ValueError, match="overlaps"):
            pf.apply_rotary_cos_sin(x, cos, sin, out=out)
    assert_array_equal(cos, cos_before)
    assert_array_equal(out, out_before)


@pytest.mark.parametrize("out, match", [
    (np.zeros((3, 8), np.float32), "out must have dtype float64"),
    (np.zeros((3, 9)), r"out must have shape \(3, 8\)"),
    ([[0.0] * 8] * 3, "out must be a numpy.ndarray"),
])
def test_bad_out(out, match):
    x = random((3, 8))
    with pytest.raises((ValueError, TypeError), match=match):
        pf.apply_rotary_cos_sin(x, random((3, 4)), random((3, 4)), out=out)


def test_integer_x():
    with pytest.raises(TypeError, match="x must be a float16, bfloat16, float32 or float64 array, got dtype int64"):
        pf.apply_rotary_cos_sin(np.zeros((3, 8), int), random((3, 4)), random((3, 4)))


# ---------------------------------------------------------------------------
# random cases


@st.composite
def cases(draw):
    lead = tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=3)))
    dim = draw(st.integers(2, 12))
    half = draw(st.integers(1, dim // 2))
    use_positions = draw(st.booleans())
    if use_positions:
        n = draw(st.integers(1, 6))
        cache_shape = (n, half)
        index_shape = tuple(draw(st.sampled_from([1, s])) for s in lead)
        positions = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(
            0, n, index_shape[draw(st.integers(0, len(lead))):])
    else:
        drop = draw(st.integers(0, len(lead)))
        cache_shape = tuple(draw(st.sampled_from([1, s])) for s in lead[drop:]) + (half,)
        positions = None
    return dict(lead=lead, dim=dim, cache_shape=cache_shape, positions=positions,
                x_dtype=draw(st.sampled_from(DTYPES)), cache_dtype=draw(st.sampled_from(DTYPES)),
                layout=draw(st.sampled_from(LAYOUTS)), inverse=draw(st.booleans()),
                seed=draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=100, deadline=None)
@given(cases())
def test_random_cases_match_reference(case):
    rng = np.random.default_rng(case["seed"])
    x = rng.standard_normal(case["lead"] + (case["dim"],)).astype(case["x_dtype"])
    cos = rng.standard_normal(case["cache_shape"]).astype(case["cache_dtype"])
    sin = rng.standard_normal(case["cache_shape"]).astype(case["cache_dtype"])
    options = dict(layout=case["layout"], inverse=case["inverse"])
    got = pf.apply_rotary_cos_sin(x, cos, sin, case["positions"], **options)
    expected = reference.apply_rotary_cos_sin(x, cos, sin, case["positions"], **options)
    scale = np.abs(x).max(initial=0) * (np.abs(cos).max(initial=0) + np.abs(sin).max(initial=0))
    check(got, expected, case["x_dtype"], case["cache_dtype"], scale)
    in_place = x.copy()
    pf.apply_rotary_cos_sin(in_place, cos, sin, case["positions"], out=in_place, **options)
    assert_array_equal(in_place, got)
