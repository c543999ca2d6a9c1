"""RotaryEmbedding and apply_rotary against the reference, properties and bad input."""

import numpy as np
import pytest
from helpers import angle_atol, assert_rotation_close, exact_cos_sin, float32_ulps, untouched
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import posenc_fast as pf
from posenc_fast import reference

LAYOUTS = ["interleaved", "half"]
DTYPES = [np.float32, np.float64]


def random(shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def expected(x, positions, rope: pf.RotaryEmbedding, inverse=False):
    return reference.apply_rotary(x, positions, list(rope.inv_freq), layout=rope.layout,
                                  attention_factor=rope.attention_factor, inverse=inverse)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim, rotary_dim", [(2, None), (8, None), (16, 6), (64, None),
                                             (64, 32), (80, 80), (128, None), (130, 64)])
def test_apply_matches_reference(layout, dtype, dim, rotary_dim):
    rope = pf.RotaryEmbedding(dim, rotary_dim=rotary_dim, layout=layout)
    x = random((2, 3, 7, dim), dtype)
    got = rope.apply(x, offset=5)
    assert got.shape == x.shape and got.dtype == dtype
    positions = 5 + np.arange(7)
    assert_rotation_close(got, expected(x, positions, rope), x, positions, rope)
    # The tail past rotary_dim is bit-identical.
    np.testing.assert_array_equal(got[..., rope.rotary_dim:], x[..., rope.rotary_dim:])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_shape, positions, seq_axis", [
    ((2, 4, 6, 16), None, -2),                       # (batch, heads, seq, dim)
    ((2, 6, 4, 16), None, -3),                       # (batch, seq, heads, dim)
    ((6, 16), None, -2),                             # (seq, dim)
    ((2, 4, 6, 16), np.array([3, 1, 4, 1, 5, 9]), -2),  # (seq,)
    ((2, 4, 6, 16), np.array([[[0, 1, 2, 3, 4, 5]], [[9, 10, 11, 12, 13, 14]]]), -2),  # (b,1,s)
    ((5, 3, 16), np.array([[7], [0], [100], [3], [3]]), -2),  # tokens x heads, (tokens, 1)
    ((2, 4, 1, 16), 17, -2),                         # scalar: one decode step
    ((2, 4, 1, 16), np.array([[[40]], [[7]]]), -2),  # a position per sequence
    ((16,), 3, -2),                                  # one vector
    ((3, 5, 16), np.arange(15).reshape(3, 5), -2),   # a full position grid
    ((3, 5, 16), np.array([0.5, 1.25, 2.0, -3.5, 1e5]), -2),  # real positions
])
def test_position_forms(layout, dtype, x_shape, positions, seq_axis):
    rope = pf.RotaryEmbedding(16, layout=layout, rotary_dim=12)
    x = random(x_shape, dtype, seed=len(x_shape))
    got = rope.apply(x, positions, offset=2, seq_axis=seq_axis)
    if positions is None:
        axis = seq_axis % len(x_shape)
        n = x_shape[axis]
        full = np.arange(n).reshape((n,) + (1,) * (len(x_shape) - 2 - axis))
    else:
        full = np.asarray(positions)
    full = np.broadcast_to(full + 2, x_shape[:-1])
    assert_rotation_close(got, expected(x, full, rope), x, full, rope)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_inverse_undoes_apply(layout, dtype):
    rope = pf.RotaryEmbedding(32, layout=layout, scaling={"rope_type": "linear", "factor": 2.0})
    x = random((3, 9, 32), dtype)
    positions = np.array([0, 1, 2, 10, 100, 1000, 2**20, 5, 6])
    rotated = rope.apply(x, positions)
    back = rope.apply(rotated, positions, inverse=True)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(back, x, rtol=0, atol=tol * np.abs(x).max())
    assert_rotation_close(back, expected(rotated, positions, rope, inverse=True), rotated,
                          positions, rope)


def test_inverse_divides_by_attention_factor():
    rope = pf.RotaryEmbedding(16, scaling={"rope_type": "yarn", "factor": 4.0,
                                           "original_max_position_embeddings": 64})
    assert rope.attention_factor > 1
    x = random((5, 16))
    positions = np.arange(5)
    np.testing.assert_allclose(rope.apply(x, positions, inverse=True),
                               expected(x, positions, rope, inverse=True), atol=1e-13)
    np.testing.assert_allclose(rope.apply(rope.apply(x, positions), positions, inverse=True), x,
                               atol=1e-13)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place_equals_out_of_place(layout, dtype):
    rope = pf.RotaryEmbedding(24, layout=layout, rotary_dim=20)
    x = random((2, 3, 11, 24), dtype)
    want = rope.apply(x, offset=9)
    y = x.copy()
    assert rope.apply(y, offset=9, out=y) is y
    np.testing.assert_array_equal(y, want)
    out = np.full_like(x, np.nan)
    assert rope.apply(x, offset=9, out=out) is out
    np.testing.assert_array_equal(out, want)


def test_non_contiguous_inputs_and_outputs():
    rope = pf.RotaryEmbedding(16, layout="half")
    base = random((4, 10, 32))
    x = base[:, ::2, ::2]  # strided along seq and features
    want = expected(x, np.arange(5), rope)
    np.testing.assert_allclose(rope.apply(x), want, atol=1e-13)
    fortran = np.asfortranarray(random((3, 5, 16)))
    np.testing.assert_allclose(rope.apply(fortran), expected(fortran, np.arange(5), rope),
                               atol=1e-13)
    out = np.zeros((5, 3, 16)).transpose(1, 0, 2)
    assert rope.apply(fortran, out=out) is out
    np.testing.assert_allclose(out, expected(fortran, np.arange(5), rope), atol=1e-13)
    # In place through a strided view touches only that view.
    before = base.copy()
    view = base[:, ::2, ::2]
    rope.apply(view, out=view)
    np.testing.assert_allclose(view, want, atol=1e-13)
    np.testing.assert_array_equal(base[:, 1::2], before[:, 1::2])
    np.testing.assert_array_equal(base[:, :, 1::2], before[:, :, 1::2])


def test_big_endian_input():
    rope = pf.RotaryEmbedding(8)
    x = random((3, 8)).astype(">f8")
    got = rope.apply(x)
    assert got.dtype == np.float64 and got.dtype.isnative
    np.testing.assert_array_equal(got, rope.apply(x.astype(np.float64)))


def test_position_zero_is_identity_and_factor_one_is_a_no_op():
    x = random((4, 1, 32))
    for layout in LAYOUTS:
        rope = pf.RotaryEmbedding(32, layout=layout)
        np.testing.assert_array_equal(rope.apply(x, 0), x)
        linear = pf.RotaryEmbedding(32, layout=layout,
                                    scaling={"rope_type": "linear", "factor": 1.0})
        np.testing.assert_array_equal(linear.apply(x, 77), rope.apply(x, 77))
        np.testing.assert_array_equal(pf.apply_rotary(x, 77, layout=layout), rope.apply(x, 77))


def test_relative_property():
    rope = pf.RotaryEmbedding(64)
    q, k = random((64,), seed=1), random((64,), seed=2)

    def score(m, n):
        return float(np.dot(rope.apply(q, m), rope.apply(k, n)))

    base_score = score(9, 5)
    for shift in (1, 10, 500):
        assert score(9 + shift, 5 + shift) == pytest.approx(base_score, rel=1e-12, abs=1e-12)
    assert abs(score(9, 4) - base_score) > 1e-3
    assert abs(score(19, 5) - base_score) > 1e-3


@given(dim=st.sampled_from([2, 4, 8, 32]), position=st.floats(-1e6, 1e6),
       layout=st.sampled_from(LAYOUTS))
def test_rotation_keeps_each_pair_norm(dim, position, layout):
    rope = pf.RotaryEmbedding(dim, layout=layout)
    x = random((dim,), seed=dim)
    y = rope.apply(x, position)
    for i in range(dim // 2):
        a, b = reference.rope_pair_indices(i, dim, layout)
        assert np.hypot(y[a], y[b]) == pytest.approx(np.hypot(x[a], x[b]), rel=1e-13)


def test_layouts_agree_after_permutation():
    dim = 16
    x = random((3, 5, dim))
    interleaved = pf.RotaryEmbedding(dim, layout="interleaved")
    half = pf.RotaryEmbedding(dim, layout="half")
    # interleaved pair i = (2i, 2i+1) sits at (i, i + dim/2) in the half layout
    to_half = np.concatenate([np.arange(0, dim, 2), np.arange(1, dim, 2)])
    np.testing.assert_array_equal(half.apply(x[..., to_half])[..., np.argsort(to_half)],
                                  interleaved.apply(x))


def test_interpolation_8000_with_factor_4_is_2000_unscaled():
    x = random((2, 64))
    scaled = pf.RotaryEmbedding(64, scaling={"rope_type": "linear", "factor": 4.0})
    plain = pf.RotaryEmbedding(64)
    # Equal to rounding: the two cos/sin values come from different anchors.
    np.testing.assert_allclose(scaled.apply(x, 8000), plain.apply(x, 2000), rtol=0, atol=1e-13)
    np.testing.assert_array_equal(pf.apply_rotary(x, 8000, interpolation_factor=4.0),
                                  scaled.apply(x, 8000))
    factor3 = pf.RotaryEmbedding(64, scaling={"rope_type": "linear", "factor": 3.0})
    np.testing.assert_allclose(factor3.apply(x, 6000), plain.apply(x, 2000), atol=1e-12)


def test_float32_within_a_few_ulps_of_mpmath_at_large_positions():
    dim = 64
    rope = pf.RotaryEmbedding(dim, layout="half")
    x = random((1, dim), np.float32, seed=5)
    worst = 0.0
    for p in [2**20, 2**20 - 1, 10**6, 654321, 2**19 + 17]:
        got = rope.apply(x, p)[0]
        exact = np.zeros(dim)
        for i, w in enumerate(rope.inv_freq):
            c, s = exact_cos_sin(p, w)
            a, b = float(x[0, i]), float(x[0, i + dim // 2])
            exact[i], exact[i + dim // 2] = a * c - b * s, a * s + b * c
        # ulps of the output's magnitude scale (cancellation can make a value tiny)
        ulps = np.abs(got - exact) / np.spacing(np.float32(np.abs(x).max()))
        worst = max(worst, float(ulps.max()))
    assert worst <= 3.0


def test_float32_angle_implementation_would_fail():
    # The same check applied to a float32-angle implementation is far off.
    p, w = np.float32(2**20), np.float32(pf.RotaryEmbedding(64).inv_freq[1])
    naive_cos = float(np.cos(p * w))
    c, _ = exact_cos_sin(2**20, float(pf.RotaryEmbedding(64).inv_freq[1]))
    assert float32_ulps(np.float32(naive_cos), c) > 1000


@pytest.mark.parametrize("q_heads, k_heads", [(4, 4), (8, 2), (3, 1)])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_apply_qk_equals_two_applies(q_heads, k_heads, layout):
    rope = pf.RotaryEmbedding(32, layout=layout, rotary_dim=24)
    q = random((2, q_heads, 6, 32), np.float32, seed=1)
    k = random((2, k_heads, 6, 32), np.float32, seed=2)
    q_rot, k_rot = rope.apply_qk(q, k, offset=11)
    np.testing.assert_array_equal(q_rot, rope.apply(q, offset=11))
    np.testing.assert_array_equal(k_rot, rope.apply(k, offset=11))
    positions = np.array([[[5, 6, 7, 100, 101, 102]], [[0, 1, 2, 3, 4, 5]]])
    q_rot, k_rot = rope.apply_qk(q, k, positions, inverse=True)
    np.testing.assert_array_equal(q_rot, rope.apply(q, positions, inverse=True))
    np.testing.assert_array_equal(k_rot, rope.apply(k, positions, inverse=True))
    # In place, token-major, different dtypes.
    q_tok = random((6, q_heads, 32), seed=3)
    k_tok = random((6, k_heads, 32), np.float32, seed=4)
    want_q = rope.apply(q_tok, offset=3, seq_axis=-3)
    want_k = rope.apply(k_tok, offset=3, seq_axis=-3)
    got_q, got_k = rope.apply_qk(q_tok, k_tok, offset=3, seq_axis=-3, out_q=q_tok, out_k=k_tok)
    assert got_q is q_tok and got_k is k_tok
    np.testing.assert_array_equal(q_tok, want_q)
    np.testing.assert_array_equal(k_tok, want_k)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cos_sin(dtype):
    rope = pf.RotaryEmbedding(20, rotary_dim=12,
                              scaling={"rope_type": "yarn", "factor": 2.0,
                                       "original_max_position_embeddings": 32})
    positions = np.array([[0, 5], [31, 1000]])
    cos, sin = rope.cos_sin(positions, dtype=dtype)
    assert cos.shape == sin.shape == (2, 2, 6) and cos.dtype == sin.dtype == dtype
    want_cos, want_sin = reference.rope_cos_sin(positions, list(rope.inv_freq),
                                                rope.attention_factor)
    tol = 1e-6 if dtype == np.float32 else angle_atol(1000)
    np.testing.assert_allclose(cos, want_cos, rtol=0, atol=tol)
    np.testing.assert_allclose(sin, want_sin, rtol=0, atol=tol)


def test_dynamic_uses_the_calls_length():
    rope = pf.RotaryEmbedding(16, scaling={"rope_type": "dynamic", "factor": 2.0,
                                           "original_max_position_embeddings": 100})
    x = random((1, 16))
    plain = pf.RotaryEmbedding(16)
    # Within the original length the frequencies are unchanged.
    np.testing.assert_array_equal(rope.apply(x, 50), plain.apply(x, 50))
    # Beyond it they depend on max(positions) + 1 of the call.
    grown = rope.inv_freq_for(401)
    assert not np.array_equal(grown, rope.inv_freq)
    want = reference.apply_rotary(x, 400, list(grown))
    np.testing.assert_allclose(rope.apply(x, 400), want, atol=1e-12)
    # Stateless: a short call after a long one is unaffected.
    np.testing.assert_array_equal(rope.apply(x, 50), plain.apply(x, 50))


def test_attributes():
    rope = pf.RotaryEmbedding(64, base=500000.0, rotary_dim=32, layout="half",
                              scaling={"type": "linear", "factor": 2.0})
    assert (rope.dim, rope.rotary_dim, rope.layout, rope.base) == (64, 32, "half", 500000.0)
    assert rope.scaling["factor"] == 2.0
    assert rope.inv_freq.dtype == np.float64 and rope.inv_freq.shape == (16,)
    assert not rope.inv_freq.flags.writeable
    np.testing.assert_array_equal(rope.inv_freq,
                                  np.array(reference.rope_inv_freq(32, 500000.0)) / 2.0)
    assert rope.attention_factor == 1.0
    assert "RotaryEmbedding(64" in repr(rope)
    assert pf.RotaryEmbedding(8).scaling is None


@given(data=st.data(), layout=st.sampled_from(LAYOUTS), double=st.booleans(),
       half_dim=st.integers(1, 12), extra=st.integers(0, 3))
def test_random_arrays_and_positions(data, layout, double, half_dim, extra):
    dtype = np.float64 if double else np.float32
    rotary_dim = 2 * half_dim
    dim = rotary_dim + extra
    lead = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5))
    x = data.draw(hnp.arrays(dtype, lead + (dim,), elements=st.floats(-10, 10, width=32)))
    # A shape that broadcasts *to* lead: a suffix of it, some sides set to 1.
    suffix = lead[data.draw(st.integers(0, len(lead))):]
    pos_shape = tuple(side if data.draw(st.booleans()) else 1 for side in suffix)
    positions = data.draw(hnp.arrays(np.int64, pos_shape, elements=st.integers(-5000, 10**6)))
    offset = data.draw(st.integers(-100, 100))
    rope = pf.RotaryEmbedding(dim, rotary_dim=rotary_dim, layout=layout)
    got = rope.apply(x, positions, offset=offset)
    full = np.broadcast_to(positions + offset, lead)
    assert_rotation_close(got, expected(x, full, rope), x, full, rope)


@given(threads=st.integers(2, 4), rows=st.integers(1, 3000))
def test_threads_bitwise_equal(threads, rows):
    rope = pf.RotaryEmbedding(64, layout="half")
    x = random((rows, 64), np.float32)
    previous = pf.get_num_threads()
    try:
        pf.set_num_threads(1)
        single = rope.apply(x, np.arange(rows) * 3)
        pf.set_num_threads(threads)
        np.testing.assert_array_equal(rope.apply(x, np.arange(rows) * 3), single)
    finally:
        pf.set_num_threads(previous)


# --- bad input -------------------------------------------------------------


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(dim=0), ValueError, "dim must be >= 1"),
    (dict(dim=2**62), ValueError, "set by rotary_dim = 4611686018427387904 is more than NumPy can hold"),
    (dict(dim=7), ValueError, "dim must be even when rotary_dim is not given"),
    (dict(dim=8, rotary_dim=3), ValueError, "rotary_dim must be even"),
    (dict(dim=8, rotary_dim=10), ValueError, "rotary_dim must be even with 2 <= rotary_dim <= dim=8"),
    (dict(dim=8, rotary_dim=0), ValueError, "rotary_dim must be even"),
    (dict(dim=8.0), TypeError, "dim must be an integer"),
    (dict(dim=8, base=-1.0), ValueError, "base must be > 0"),
    (dict(dim=8, layout="neox"), ValueError, "layout must be one of"),
    (dict(dim=8, scaling="linear"), TypeError, "scaling must be a dict or None"),
    (dict(dim=8, scaling={"rope_type": "magic"}), ValueError, "magic"),
    (dict(dim=8, scaling={"rope_type": "linear"}), ValueError, "factor"),
    (dict(dim=8, scaling={"rope_type": "linear", "factor": 0.5}), ValueError, "factor"),
])
def test_constructor_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        pf.RotaryEmbedding(**kwargs)


def bad_apply_calls():
    x = np.ones((2, 3, 4, 8))
    return [
        (dict(x=np.ones((2, 3, 4, 6))), ValueError, r"x must have shape \(\.\.\., 8\)"),
        (dict(x=np.ones((2, 8), np.int32)), TypeError, "x must be a float16, bfloat16, float32 or float64 array"),
        (dict(x=np.ones(8)), ValueError, "no sequence axis"),
        (dict(x=x, positions=np.arange(5)), ValueError, "does not broadcast"),
        (dict(x=x, positions=np.array([0, np.nan, 1, 2])), ValueError, "finite"),
        (dict(x=x, positions=np.array([0, np.inf, 1, 2])), ValueError, "finite"),
        (dict(x=x, positions=np.array([True, False, True, False])), TypeError, "bool"),
        (dict(x=x, offset=np.nan), ValueError, "offset must be finite"),
        (dict(x=x, seq_axis=-1), ValueError, "seq_axis must name an axis"),
        (dict(x=x, seq_axis=4), ValueError, "seq_axis must name an axis"),
        (dict(x=x, seq_axis=1.0), TypeError, "seq_axis must be an integer"),
        (dict(x=x, inverse=1), TypeError, "inverse must be a bool"),
        (dict(x=x, out=np.ones((2, 3, 4, 8), np.float32)), ValueError, "out must have dtype"),
        (dict(x=x, out=np.ones((2, 3, 4, 9))), ValueError, "out must have shape"),
        (dict(x=x, out=x[::-1]), ValueError, "overlaps an input"),
        (dict(x=x, out=x.tolist()), TypeError, "out must be a numpy.ndarray"),
    ]


@pytest.mark.parametrize("call, error, match", bad_apply_calls())
def test_apply_errors_write_nothing(call, error, match):
    rope = pf.RotaryEmbedding(8)
    call = dict(call)
    x = call.pop("x")
    positions = call.pop("positions", None)
    before = x.copy()
    out = call.get("out")
    out_before = out.copy() if isinstance(out, np.ndarray) else None
    with pytest.raises(error, match=match):
        rope.apply(x, positions, **call)
    assert untouched(before, x)
    if out_before is not None:
        assert untouched(out_before, out)
    # The in-place form fails the same way and leaves x untouched.
    if "out" not in call and x.ndim and x.dtype.kind == "f" and x.flags.writeable:
        with pytest.raises((TypeError, ValueError)):
            rope.apply(x, positions, out=x, **call)
        assert untouched(before, x)


def test_read_only_out_and_read_only_input():
    rope = pf.RotaryEmbedding(8)
    x = np.ones((3, 8))
    x.flags.writeable = False
    assert rope.apply(x).shape == (3, 8)  # read-only input is fine
    with pytest.raises(ValueError, match="out must be writeable"):
        rope.apply(x, out=x)


def test_apply_qk_errors_write_nothing():
    rope = pf.RotaryEmbedding(8)
    q, k = np.ones((1, 4, 5, 8)), np.ones((1, 2, 5, 8))
    q0, k0 = q.copy(), k.copy()
    with pytest.raises(ValueError, match=r"k must have shape \(\.\.\., 8\)"):
        rope.apply_qk(q, np.ones((1, 2, 5, 6)), out_q=q)
    with pytest.raises(ValueError, match="same length along seq_axis"):
        rope.apply_qk(q, np.ones((1, 2, 6, 8)), out_q=q)
    with pytest.raises(ValueError, match="k.shape"):
        rope.apply_qk(np.ones((1, 4, 5, 8)), np.ones((1, 2, 3, 8)), np.arange(5), out_q=q)
    with pytest.raises(ValueError, match="out_q overlaps"):
        rope.apply_qk(q, q, out_q=q)
    with pytest.raises(ValueError, match="out_k overlaps"):
        rope.apply_qk(q, k, out_q=q, out_k=q[:, :2])
    assert untouched(q0, q) and untouched(k0, k)


def test_inv_freq_for_and_cos_sin_errors():
    rope = pf.RotaryEmbedding(8)
    with pytest.raises(ValueError, match="seq_len must be >= 1"):
        rope.inv_freq_for(0)
    with pytest.raises(TypeError, match="dtype must be float16, bfloat16, float32 or float64"):
        rope.cos_sin([1, 2], dtype=np.int64)
    with pytest.raises(ValueError, match="positions must be finite"):
        rope.cos_sin([1, np.nan])


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(interpolation_factor=0.5), ValueError, "interpolation_factor must be >= 1"),
    (dict(interpolation_factor="2"), TypeError, "interpolation_factor must be a real number"),
    (dict(rotary_dim=5), ValueError, "rotary_dim must be even"),
    (dict(layout="split"), ValueError, "layout must be one of"),
    (dict(base=0), ValueError, "base must be > 0"),
])
def test_apply_rotary_errors(kwargs, error, match):
    x = np.ones((3, 8))
    with pytest.raises(error, match=match):
        pf.apply_rotary(x, out=x, **kwargs)
    assert (x == 1).all()


def test_apply_rotary_of_an_odd_width_names_x():
    x = np.ones((3, 7))
    with pytest.raises(ValueError, match=r"^x.shape\[-1\] must be even when rotary_dim is not given, got 7"):
        pf.apply_rotary(x, out=x)
    assert (x == 1).all() and pf.apply_rotary(x, rotary_dim=6)[:, 6].tolist() == [1, 1, 1]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_shape, positions, seq_axis", [
    ((2, 4, 300, 64), None, -2),
    ((2, 300, 4, 64), None, -3),
    ((2, 300, 16, 64), None, -3),  # past POSENC_PREFETCH_BYTES: still a position's heads per call
    ((7, 4, 64), np.arange(7, dtype=np.int64).reshape(7, 1) * 31, -2),
    ((3, 5, 1, 64), np.array([[[9]], [[0]], [[4000]]]), -2),
    ((2, 3, 1, 64), 77, -2),
    ((2, 3, 9, 64), np.arange(9, dtype=np.int64) + 1020, -2),
])
def test_compiled_fast_path_equals_general_path(layout, dtype, x_shape, positions, seq_axis):
    # An int offset with int64 positions takes the compiled path; a float
    # offset sends the same call through the general Python path.
    rope = pf.RotaryEmbedding(64, layout=layout, rotary_dim=48)
    x = random(x_shape, dtype, seed=9)
    fast = rope.apply(x, positions, offset=3, seq_axis=seq_axis)
    general = rope.apply(x, positions, offset=3.0, seq_axis=seq_axis)
    np.testing.assert_array_equal(fast, general)
    fast_q, fast_k = rope.apply_qk(x, x.copy(), positions, offset=3, seq_axis=seq_axis,
                                   inverse=True)
    np.testing.assert_array_equal(fast_q, rope.apply(x, positions, offset=3.0,
                                                     seq_axis=seq_axis, inverse=True))
    np.testing.assert_array_equal(fast_k, fast_q)
    in_place = x.copy()
    rope.apply(in_place, positions, offset=3, seq_axis=seq_axis, out=in_place)
    np.testing.assert_array_equal(in_place, general)


@given(heads=st.integers(1, 40), seq=st.integers(1, 300), threads=st.sampled_from([1, 3]),
       dtype=st.sampled_from([np.float32, np.float64]), layout=st.sampled_from(LAYOUTS),
       rotary_dim=st.sampled_from([64, 40]), arange=st.booleans(), in_place=st.booleans())
def test_blocks_of_positions_equal_general_path(heads, seq, threads, dtype, layout, rotary_dim,
                                                arange, in_place):
    # Heads of consecutive positions (None, or an int64 arange) rotate in
    # blocks of positions, on any number of threads: bitwise the row kernels'
    # results (the general path, taken by a float offset).
    rope = pf.RotaryEmbedding(64, layout=layout, rotary_dim=rotary_dim)
    x = random((2, heads, seq, 64), dtype, seed=seq)
    positions = np.arange(seq, dtype=np.int64) + 5 if arange else None
    general = rope.apply(x, positions, offset=7.0)
    previous = pf.get_num_threads()
    try:
        pf.set_num_threads(threads)
        fast = x.copy() if in_place else np.empty_like(x)
        rope.apply(fast if in_place else x, positions, offset=7, out=fast)
    finally:
        pf.set_num_threads(previous)
    np.testing.assert_array_equal(fast, general)


def test_cache_grows_and_stays_consistent():
    rope = pf.RotaryEmbedding(32, layout="half")
    x = random((2, 8, 32), np.float32)
    early = rope.apply(x, offset=5)
    rope.apply(x, offset=50_000)  # grows the cache far beyond the first rows
    np.testing.assert_array_equal(rope.apply(x, offset=5), early)
    np.testing.assert_array_equal(rope.apply(x, offset=5.0), early)  # general path


def test_pickle_round_trip():
    import pickle

    rope = pf.RotaryEmbedding(64, base=500000.0, rotary_dim=32, layout="half",
                              scaling={"rope_type": "yarn", "factor": 4.0,
                                       "original_max_position_embeddings": 256})
    x = random((2, 5, 64), np.float32)
    clone = pickle.loads(pickle.dumps(rope))
    assert repr(clone) == repr(rope)
    np.testing.assert_array_equal(clone.apply(x, offset=3), rope.apply(x, offset=3))


@pytest.mark.parametrize("streams", [None, [0, 1, 1, 0, 1, 0]])
def test_cos_sin_out(streams):
    rope = pf.RotaryEmbedding(16, rotary_dim=12, pair_streams=streams)
    positions = np.array([[0, 3, 9], [100, 101, 5000]])
    if streams is not None:  # two streams of those positions
        positions = np.stack((positions, positions[::-1]))
    want_cos, want_sin = rope.cos_sin(positions, dtype=np.float64)
    cos, sin = np.empty((2, 3, 6)), np.empty((6, 3, 2)).T  # one contiguous, one strided
    got = rope.cos_sin(positions, dtype=np.float64, out=(cos, sin))
    assert got[0] is cos and got[1] is sin
    np.testing.assert_array_equal(cos, want_cos)
    np.testing.assert_array_equal(sin, want_sin)
    for j in range(2):  # None: that result a new array, as np.divmod's out=(None, r)
        given = np.zeros((2, 3, 6))
        got = rope.cos_sin(positions, dtype=np.float64, out=(given, None) if j == 0 else (None, given))
        assert got[j] is given and got[1 - j] is not given
        np.testing.assert_array_equal(got[0], want_cos)
        np.testing.assert_array_equal(got[1], want_sin)
    for out, error, match in [
        ([cos, sin], TypeError, "out must be a tuple"),
        ((cos,), TypeError, "out must be a tuple"),
        ((cos, np.empty((2, 3, 6), np.float32)), ValueError, r"out\[1\] must have dtype"),
        ((cos, np.empty((2, 3, 5))), ValueError, r"out\[1\] must have shape"),
        ((cos, cos), ValueError, "overlaps"),
    ]:
        before = cos.copy()
        with pytest.raises(error, match=match):
            rope.cos_sin(positions, dtype=np.float64, out=out)
        np.testing.assert_array_equal(cos, before)


@pytest.mark.parametrize("streams", [None, [2, 1, 1]])
def test_an_embedding_is_freed_without_the_cyclic_collector(streams):
    # Its cos/sin caches (up to 64 MiB per dtype) go with its last reference.
    import gc
    import weakref

    x = random((1, 2, 5, 8), np.float32)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        rope = pf.RotaryEmbedding(8, mrope_section=streams)
        positions = np.arange(5) if streams is None else np.tile(np.arange(5), (3, 1))
        rope.cos_sin(positions)
        rope.apply(x)
        rope.apply_qk(x, x.copy(), positions)
        freed = weakref.ref(rope)
        del rope
        assert freed() is None
    finally:
        if was_enabled:
            gc.enable()


def test_help_shows_the_public_docstrings():
    rope = pf.RotaryEmbedding(8)
    assert "Rotate the pairs of `x` by their positions." in rope.apply.__doc__
    assert "Rotate queries and keys with one cos/sin computation." in rope.apply_qk.__doc__
    assert "out : ndarray of x's shape and dtype" in pf.RotaryEmbedding.apply.__doc__
