"""Features [rotary_start, rotary_start + rotary_dim) rotate, every other one passes through bit for bit.

For each rotation path (apply and apply_qk, in place and not, several position
streams, a caller's cos/sin, the fused KV-cache write, the streamed stores of a
large call; compiled and general paths) the rotated features equal the same
call with ``rotary_start=0`` on those features alone (the same cos/sin and row
kernels: bitwise), and the features outside come out with their input's bits:
NaN payloads, infinities and signed zeros included (no cos = 1, sin = 0 pass
over them).  One float64 reference anchors the rotation itself.
"""

import pickle

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc_fast as pf
from posenc_fast import reference
from helpers import general_path_only, untouched

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), BF16]
UINT = {8: np.uint64, 4: np.uint32, 2: np.uint16}

# (head_dim, rotary_dim, rotary_start, layout) of models with partial or offset rotation
MODEL_SHAPES = {
    "deepseek_v4": (512, 64, 448, "interleaved"),   # the last 64 of 512 (x[..., -64:])
    "gemma4 full layers": (512, 128, 0, "half"),
    "phi": (80, 32, 0, "half"),
    "gpt_neox 20b": (96, 24, 0, "half"),
    "stablelm": (80, 20, 0, "half"),
    "chatglm / glm4": (128, 64, 0, "interleaved"),
    "glm4_moe (odd width)": (42, 22, 0, "half"),
}


def make_x(rng, shape, dtype, start, rotary_dim):
    """Normal values on the rotated features, random bit patterns (NaNs, infs, -0) elsewhere."""
    x = rng.standard_normal(shape).astype(dtype)
    bits = x.view(UINT[dtype.itemsize])
    noise = rng.integers(0, np.iinfo(bits.dtype).max, shape, dtype=bits.dtype, endpoint=True)
    outside = np.ones(shape[-1], bool)
    outside[start:start + rotary_dim] = False
    bits[..., outside] = noise[..., outside]
    return x


def passed_through(x, y, start, rotary_dim):
    outside = np.ones(x.shape[-1], bool)
    outside[start:start + rotary_dim] = False
    return untouched(x[..., outside], y[..., outside])


def ropes(dim, rotary_dim, start, layout, **kwargs):
    """The embedding under test and its rotary_start=0 twin over the rotated features alone."""
    return (pf.RotaryEmbedding(dim, rotary_dim=rotary_dim, rotary_start=start, layout=layout,
                               **kwargs),
            pf.RotaryEmbedding(rotary_dim, layout=layout, **kwargs))


def check(x, y, twin_y, start, rotary_dim):
    assert y.dtype == x.dtype and y.shape == x.shape
    assert passed_through(x, y, start, rotary_dim)
    assert untouched(twin_y, y[..., start:start + rotary_dim])


def paths(rope, twin, x, rng):
    """(name, input, result, twin's result on the rotated features) for every rotation path of x."""
    start, rd = rope.rotary_start, rope.rotary_dim
    part = np.ascontiguousarray(x[..., start:start + rd])
    positions = rng.integers(0, 3000, x.shape[-2])
    yield "apply", x, rope.apply(x, offset=5), twin.apply(part, offset=5)
    inplace = x.copy()
    rope.apply(inplace, positions, inverse=True, out=inplace)
    yield "apply in place", x, inplace, twin.apply(part, positions, inverse=True)
    k = x[:, :1].copy()
    q_rot, k_rot = rope.apply_qk(x, k, positions)
    twin_q, twin_k = twin.apply_qk(part, np.ascontiguousarray(part[:, :1]), positions)
    yield "apply_qk q", x, q_rot, twin_q
    yield "apply_qk k", k, k_rot, twin_k
    cos, sin = twin.cos_sin(np.arange(x.shape[-2]), dtype=np.float32)
    yield ("apply_rotary_cos_sin", x, pf.apply_rotary_cos_sin(x, cos, sin, layout=rope.layout,
                                                           rotary_start=start),
           pf.apply_rotary_cos_sin(part, cos, sin, layout=rope.layout))
    table_positions = positions % x.shape[-2]
    yield ("apply_rotary_cos_sin positions", x,
           pf.apply_rotary_cos_sin(x, cos, sin, table_positions, layout=rope.layout,
                                   rotary_start=start),
           pf.apply_rotary_cos_sin(part, cos, sin, table_positions, layout=rope.layout))


@pytest.mark.parametrize("model", MODEL_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("route", ["fast", "general"])
def test_model_shapes_rotate_their_features_and_pass_the_rest(model, dtype, route):
    dim, rotary_dim, start, layout = MODEL_SHAPES[model]
    rope, twin = ropes(dim, rotary_dim, start, layout)
    rng = np.random.default_rng(dim + start)
    x = make_x(rng, (2, 3, 7, dim), dtype, start, rotary_dim)
    before = x.copy()
    with general_path_only() if route == "general" else np.errstate():
        for _, given_x, y, twin_y in paths(rope, twin, x, rng):
            check(given_x, y, twin_y, start, rotary_dim)
    assert untouched(before, x)


@settings(max_examples=60, deadline=None)
@given(pairs=st.integers(1, 20), start=st.integers(0, 9), extra=st.integers(0, 9),
       layout=st.sampled_from(["half", "interleaved"]), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**32 - 1), general=st.booleans())
def test_any_start_and_width(pairs, start, extra, layout, dtype, seed, general):
    rotary_dim = 2 * pairs
    dim = start + rotary_dim + extra
    rope, twin = ropes(dim, rotary_dim, start, layout)
    rng = np.random.default_rng(seed)
    x = make_x(rng, (1, 2, 5, dim), dtype, start, rotary_dim)
    with general_path_only() if general else np.errstate():
        for _, given_x, y, twin_y in paths(rope, twin, x, rng):
            check(given_x, y, twin_y, start, rotary_dim)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_float64_reference(layout):
    rope = pf.RotaryEmbedding(20, rotary_dim=8, rotary_start=6, layout=layout, base=500.0)
    x = np.random.default_rng(1).standard_normal((2, 3, 5, 20))
    want = reference.apply_rotary(x, 9.0 + np.arange(5), list(rope.inv_freq), layout=layout,
                                  rotary_start=6)
    np.testing.assert_allclose(rope.apply(x, offset=9), want, rtol=0, atol=1e-14)
    assert untouched(x[..., :6], rope.apply(x)[..., :6])


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_streamed_stores_of_a_large_call(layout):
    # 17 MiB out of place: past POSENC_STREAM_BYTES, non-temporal stores from the offset on
    rope, twin = ropes(264, 64, 200, layout)
    rng = np.random.default_rng(2)
    x = make_x(rng, (1, 4, 4096, 264), np.dtype(np.float32), 200, 64)
    check(x, rope.apply(x), twin.apply(np.ascontiguousarray(x[..., 200:264])), 200, 64)


def test_several_position_streams():
    rope, twin = ropes(40, 24, 10, "half", mrope_section=[4, 4, 4])
    rng = np.random.default_rng(3)
    x = make_x(rng, (6, 2, 40), np.dtype(np.float32), 10, 24)  # (tokens, heads, dim)
    thw = rng.integers(0, 50, (3, 6, 1))
    for route in (np.errstate(), general_path_only()):
        with route:
            check(x, rope.apply(x, thw), twin.apply(np.ascontiguousarray(x[..., 10:34]), thw),
                  10, 24)


@pytest.mark.parametrize("dtype, cache_dtype", [(np.float32, np.float32), (np.float64, np.float64),
                                                (BF16, BF16), (np.float32, BF16)])
def test_kv_cache_write(dtype, cache_dtype):
    rope = pf.RotaryEmbedding(48, rotary_dim=16, rotary_start=32, layout="interleaved")
    rng = np.random.default_rng(4)
    q = make_x(rng, (5, 4, 48), np.dtype(dtype), 32, 16)
    k, v = make_x(rng, (5, 2, 48), np.dtype(dtype), 32, 16), make_x(rng, (5, 2, 48),
                                                                   np.dtype(dtype), 32, 16)
    positions, slots = rng.integers(0, 100, 5), np.array([3, 0, -1, 7, 5])
    for route in (np.errstate(), general_path_only()):
        k_cache = np.zeros((2, 4, 2, 48), cache_dtype)
        v_cache = np.zeros_like(k_cache)
        with route:
            got_q = rope.apply_qk_to_cache(q, k, v, positions, k_cache, v_cache, slots)
        rows = positions[:, None]
        assert untouched(rope.apply(q, rows), got_q)
        want_k, want_v = rope.apply(k, rows).astype(cache_dtype), v.astype(cache_dtype)
        flat_k, flat_v = k_cache.reshape(8, 2, 48), v_cache.reshape(8, 2, 48)
        # a narrowing store keeps NaN a NaN, not its payload (ml_dtypes' astype makes another)
        same = untouched if cache_dtype == dtype else (
            lambda a, b: np.array_equal(a.astype(np.float64), b.astype(np.float64), equal_nan=True))
        for t, slot in enumerate(slots):
            if slot >= 0:
                assert same(want_k[t], flat_k[slot]) and same(want_v[t], flat_v[slot])
        if cache_dtype == dtype:
            assert passed_through(k[slots >= 0], flat_k[slots[slots >= 0]], 32, 16)


def test_qk_norm_rotates_from_the_start():
    rope = pf.RotaryEmbedding(24, rotary_dim=8, rotary_start=16, layout="half")
    rng = np.random.default_rng(5)
    q, k, wq, wk = (rng.standard_normal(s) for s in ((1, 4, 3, 24), (1, 2, 3, 24), 24, 24))
    got_q, got_k = rope.apply_qk_norm(q, k, wq, wk, offset=40)
    for x, w, got in ((q, wq, got_q), (k, wk, got_k)):
        normed = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w
        want = reference.apply_rotary(normed, 40.0 + np.arange(3), list(rope.inv_freq),
                                      layout="half", rotary_start=16)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)


def test_the_embedding_keeps_its_start():
    rope = pf.RotaryEmbedding(20, rotary_dim=8, rotary_start=6)
    assert rope.rotary_start == 6 and "rotary_start=6" in repr(rope)
    again = pickle.loads(pickle.dumps(rope))
    x = np.random.default_rng(6).standard_normal((3, 20))
    assert again.rotary_start == 6 and untouched(rope.apply(x), again.apply(x))
    assert pf.RotaryEmbedding(20, rotary_start=4).rotary_dim == 16  # the rest of the head
    assert "rotary_start" not in repr(pf.RotaryEmbedding(20))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(rotary_start=-1), ValueError, "rotary_start must be >= 0"),
    (dict(rotary_start=True), TypeError, "rotary_start must be an integer"),
    (dict(rotary_start=1.0), TypeError, "rotary_start must be an integer"),
    (dict(rotary_dim=8, rotary_start=13), ValueError, r"rotary_start \+ rotary_dim must be <= dim=20"),
    (dict(rotary_start=3), ValueError, r"dim - rotary_start = 20 - 3"),
])
def test_bad_starts_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        pf.RotaryEmbedding(20, **kwargs)


@pytest.mark.parametrize("start, error, match", [
    (13, ValueError, r"rotary_start \+ rotary_dim = 13 \+ 8"),
    (-1, ValueError, "rotary_start must be >= 0"),
    (2**70, ValueError, "exceeds"),
    ("1", TypeError, "rotary_start must be an integer"),
])
def test_a_bad_start_with_a_callers_cos_sin_writes_nothing(start, error, match):
    cos, sin = pf.RotaryEmbedding(8).cos_sin(np.arange(5))
    x = np.ones((2, 5, 20), np.float32)
    out = np.full_like(x, 7.0)
    for qk in (False, True):
        with pytest.raises(error, match=match):
            if qk:
                pf.apply_rotary_cos_sin_qk(x, x.copy(), cos, sin, rotary_start=start, out_q=out)
            else:
                pf.apply_rotary_cos_sin(x, cos, sin, rotary_start=start, out=out)
        assert (out == 7.0).all()
