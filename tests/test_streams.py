"""Several position streams per token (mRoPE, axial RoPE) against the reference and transformers."""

import pickle

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from helpers import assert_rotation_close, untouched
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc_fast as pf
from posenc_fast import reference

LAYOUTS = ["interleaved", "half"]
DTYPES = [np.float32, np.float64]


def random(shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def expected(x, positions, rope, inverse=False):
    return reference.apply_rotary_streams(x, positions, list(rope.inv_freq), rope.pair_streams,
                                          layout=rope.layout,
                                          attention_factor=rope.attention_factor, inverse=inverse)


@st.composite
def stream_cases(draw):
    npairs = draw(st.integers(2, 12))
    n_streams = draw(st.integers(2, min(4, npairs)))
    streams = draw(st.lists(st.integers(0, n_streams - 1), min_size=npairs, max_size=npairs))
    streams[:n_streams] = range(n_streams)  # every stream used
    streams = draw(st.permutations(streams))
    tail = draw(st.integers(0, 3))
    seq = draw(st.integers(0, 6))
    positions = draw(st.lists(st.integers(-50, 5000), min_size=n_streams * seq,
                              max_size=n_streams * seq))
    return (list(streams), 2 * npairs + tail, seq, np.array(positions).reshape(n_streams, seq),
            draw(st.sampled_from(LAYOUTS)), draw(st.sampled_from(DTYPES)),
            draw(st.sampled_from([None, {"rope_type": "linear", "factor": 2.0},
                                  {"rope_type": "yarn", "factor": 4.0,
                                   "original_max_position_embeddings": 64}])))


@settings(max_examples=60, deadline=None)
@given(stream_cases(), st.booleans(), st.integers(0, 7))
def test_apply_matches_reference(case, inverse, offset):
    streams, dim, seq, positions, layout, dtype, scaling = case
    rope = pf.RotaryEmbedding(dim, rotary_dim=2 * len(streams), layout=layout, scaling=scaling,
                              pair_streams=streams)
    x = random((2, 3, seq, dim), dtype)
    got = rope.apply(x, positions, offset=offset, inverse=inverse)
    assert got.dtype == dtype
    assert_rotation_close(got, expected(x, positions + offset, rope, inverse), x, positions + offset, rope)
    np.testing.assert_array_equal(got[..., rope.rotary_dim:], x[..., rope.rotary_dim:])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_equal_streams_are_bitwise_the_one_stream_rope(layout, dtype):
    positions = np.random.default_rng(1).integers(0, 3000, 9)
    one = pf.RotaryEmbedding(128, layout=layout)
    for kwargs in ({"mrope_section": [16, 24, 24]},
                   {"mrope_section": [24, 20, 20], "mrope_interleaved": True},
                   {"pair_streams": np.arange(64) % 4}):
        rope = pf.RotaryEmbedding(128, layout=layout, **kwargs)
        x = random((2, 4, 9, 128), dtype)
        streams = np.stack([positions] * rope.n_streams)
        assert untouched(rope.apply(x, streams), one.apply(x, positions))
        assert untouched(rope.apply(x, streams, inverse=True), one.apply(x, positions, inverse=True))
        assert untouched(rope.apply(x), one.apply(x))  # no positions: arange in every stream
        for got, want in zip(rope.cos_sin(streams, dtype=dtype), one.cos_sin(positions, dtype=dtype)):
            assert untouched(got, want)


@pytest.mark.parametrize("two_streams_a_pair", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_thread_count_does_not_change_results(dtype, two_streams_a_pair):
    from posenc_fast._dispatch import kernels

    rng = np.random.default_rng(2)
    x = random((3000, 70), dtype)  # features 3 .. 66 rotate
    cos, sin = random((50, 32), dtype), random((50, 32), dtype)
    row_token = np.repeat(np.arange(1500), 2).astype(np.intp)
    token_rows = rng.integers(0, 50, (1500, 3)).astype(np.intp)
    streams = np.arange(32) % 3 if not two_streams_a_pair else np.stack([np.arange(32) % 3, np.arange(32) // 11])
    results = []
    for threads in (1, 2, 3, 8):
        out = np.empty_like(x)
        kernels.rotate_stream_rows(x, out, cos, sin, row_token, token_rows, streams.astype(np.intp), True, False,
                                   threads, 3)
        results.append(out)
    assert all(untouched(results[0], r) for r in results[1:])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_token_major_apply_qk_in_place_and_out(layout):
    rope = pf.RotaryEmbedding(32, layout=layout, mrope_section=[6, 5, 5])
    positions = np.random.default_rng(3).integers(0, 100, (3, 7, 1))  # (streams, tokens, 1)
    q, k = random((7, 4, 32)), random((7, 2, 32), np.float32, seed=1)
    want_q, want_k = expected(q, positions, rope), expected(k, positions, rope)
    got_q, got_k = rope.apply_qk(q, k, positions)
    assert_rotation_close(got_q, want_q, q, positions, rope)
    assert_rotation_close(got_k, want_k, k, positions, rope)
    out = np.empty_like(q)
    assert rope.apply(q, positions, out=out) is out and untouched(out, got_q)
    q_copy, k_copy = q.copy(), k.copy()
    rope.apply_qk(q_copy, k_copy, positions, out_q=q_copy, out_k=k_copy)
    assert untouched(q_copy, got_q) and untouched(k_copy, got_k)
    strided = np.empty((7, 4, 64))[..., ::2]  # a non-contiguous out
    rope.apply(q, positions, out=strided)
    assert untouched(np.ascontiguousarray(strided), got_q)


def test_cos_sin_gathers_per_pair():
    rope = pf.RotaryEmbedding(16, layout="half", pair_streams=[0, 1, 0, 1, 2, 2, 0, 1],
                              scaling={"rope_type": "linear", "factor": 2.0})
    positions = np.array([[1, 2, 30], [4, 5, 60], [7, 800, 9]])
    cos, sin = rope.cos_sin(positions, dtype=np.float64)
    assert cos.shape == sin.shape == (3, 8)
    for t in range(3):
        for j, s in enumerate(rope.pair_streams):
            want = reference.rope_cos_sin([positions[s, t]], [rope.inv_freq[j]])
            np.testing.assert_allclose((cos[t, j], sin[t, j]), (want[0][0, 0], want[1][0, 0]),
                                       rtol=0, atol=1e-13)
    out = (np.empty((3, 8), np.float32), np.empty((3, 8), np.float32))
    result = rope.cos_sin(positions, out=out)
    assert result[0] is out[0] and result[1] is out[1]
    np.testing.assert_array_equal(out[0], cos.astype(np.float32))


def test_section_forms():
    chunked = pf.RotaryEmbedding(128, mrope_section=[16, 24, 24])
    assert chunked.pair_streams.tolist() == [0] * 16 + [1] * 24 + [2] * 24
    interleaved = pf.RotaryEmbedding(128, mrope_section=[24, 20, 20], mrope_interleaved=True)
    streams = interleaved.pair_streams
    assert streams[:6].tolist() == [0, 1, 2, 0, 1, 2] and streams[60:].tolist() == [0] * 4
    assert np.bincount(streams).tolist() == [24, 20, 20]
    axial = pf.RotaryEmbedding.axial(80)
    assert axial.pair_streams.tolist() == [0] * 20 + [1] * 20 and axial.n_streams == 2
    np.testing.assert_array_equal(axial.inv_freq[:20], axial.inv_freq[20:])
    np.testing.assert_allclose(axial.inv_freq[:20], reference.rope_inv_freq(40), rtol=1e-15)
    for rope in (chunked, interleaved, axial):
        clone = pickle.loads(pickle.dumps(rope))
        assert repr(clone) == repr(rope)
        np.testing.assert_array_equal(clone.pair_streams, rope.pair_streams)
        np.testing.assert_array_equal(clone.inv_freq, rope.inv_freq)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"mrope_section": [16, 24, 20]}, ValueError, "sum to rotary_dim // 2 = 64"),
    ({"mrope_section": [64]}, ValueError, "at least 2"),
    ({"mrope_section": [0, 32, 32]}, ValueError, r"the pair streams of mrope_section=\[0, 32, 32\] must use every"),
    ({"mrope_section": "16"}, TypeError, "mrope_section"),
    ({"mrope_section": [16, 24, 24], "pair_streams": [0] * 64}, ValueError, "not both"),
    ({"mrope_interleaved": True}, ValueError, "needs mrope_section"),
    ({"mrope_section": [32, 32], "mrope_interleaved": True}, ValueError, "3-entry"),
    ({"pair_streams": [0] * 63 + [1]}, None, None),
    ({"pair_streams": [0] * 63 + [2]}, ValueError, "every stream"),
    ({"pair_streams": [0] * 64}, ValueError, "at least two"),
    ({"pair_streams": [0] * 62 + [1]}, ValueError, "one entry per pair"),
    ({"pair_streams": [-1] * 32 + [0] * 32}, ValueError, ">= 0"),
    ({"pair_streams": [0.5] * 64}, TypeError, "pair_streams"),
])
def test_bad_stream_arguments(kwargs, error, match):
    if error is None:
        assert pf.RotaryEmbedding(128, **kwargs).n_streams == 2
        return
    with pytest.raises(error, match=match):
        pf.RotaryEmbedding(128, **kwargs)


def test_bad_positions_write_nothing():
    rope = pf.RotaryEmbedding(16, mrope_section=[4, 2, 2])
    x, out = random((2, 5, 16)), np.full((2, 5, 16), 7.0)
    before = out.copy()
    for positions, match in [(np.arange(5), "leading axis of n_streams = 3"),
                             (np.zeros((2, 5)), "leading axis of n_streams = 3"),
                             (np.zeros((3, 4)), r"positions\[i\]"),
                             (np.array([[0, 1, 2, 3, np.nan]] * 3), "finite")]:
        with pytest.raises(ValueError, match=match):
            rope.apply(x, positions, out=out)
        with pytest.raises(ValueError, match=match):
            rope.apply_qk(x, x.copy(), positions, out_q=out)
        assert untouched(before, out)
    with pytest.raises(ValueError, match="leading axis"):
        rope.cos_sin(np.arange(4))


# ---------------------------------------------------------------------------
# two streams a pair (HunYuan-VL): pair_streams of two rows, a stream per feature


@st.composite
def feature_stream_cases(draw):
    npairs = draw(st.integers(1, 10))
    n_streams = draw(st.integers(2, 4))
    rows = draw(st.lists(st.integers(0, n_streams - 1), min_size=2 * npairs, max_size=2 * npairs)
                .filter(lambda r: set(r) == set(range(n_streams)) and r[:npairs] != r[npairs:]))
    seq = draw(st.integers(0, 5))
    positions = draw(st.lists(st.integers(-50, 5000), min_size=n_streams * seq, max_size=n_streams * seq))
    return ([rows[:npairs], rows[npairs:]], draw(st.integers(0, 3)), draw(st.integers(0, 3)), seq,
            np.array(positions).reshape(n_streams, seq), draw(st.sampled_from(LAYOUTS)),
            draw(st.sampled_from(DTYPES)), draw(st.sampled_from([None, {"rope_type": "linear", "factor": 2.0}])))


@settings(max_examples=60, deadline=None)
@given(feature_stream_cases())
def test_two_streams_a_pair_match_the_reference(case):
    streams, start, tail, seq, positions, layout, dtype, scaling = case
    npairs = len(streams[0])
    rope = pf.RotaryEmbedding(start + 2 * npairs + tail, rotary_dim=2 * npairs, rotary_start=start,
                              layout=layout, scaling=scaling, pair_streams=streams)
    assert rope.pair_streams.shape == (2, npairs)
    x = random((2, 3, seq, rope.dim), dtype)
    got = rope.apply(x, positions)
    want = reference.apply_rotary_streams(x, positions, list(rope.inv_freq), streams, layout=layout,
                                          attention_factor=rope.attention_factor, rotary_start=start)
    assert_rotation_close(got, want, x, positions, rope)
    in_place = x.copy()
    assert rope.apply(in_place, positions, out=in_place) is in_place and untouched(in_place, got)
    q, k = rope.apply_qk(x, x[:, :1].copy(), positions)
    assert untouched(q, got) and untouched(k, got[:, :1])


HALF_DTYPES = [np.float16, ml_dtypes.bfloat16]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES + HALF_DTYPES)
def test_two_streams_a_pair_turn_each_feature_by_its_own(layout, dtype):
    dtype = np.dtype(dtype)
    streams = [[0] * 8 + [1] * 8, [2] * 8 + [3] * 8]  # HunYuan-VL's four sections of 8 pairs
    rope = pf.RotaryEmbedding(40, rotary_dim=32, rotary_start=4, layout=layout, pair_streams=streams)
    plain = pf.RotaryEmbedding(40, rotary_dim=32, rotary_start=4, layout=layout)
    x = random((5, 3, 40), dtype)  # (tokens, heads, head_dim)
    positions = np.random.default_rng(5).integers(0, 4000, (4, 5, 1))
    got = rope.apply(x, positions)
    # a feature turns by its own stream: where all four carry one position, the plain rotation bitwise,
    # and each feature as the plain rotation by its stream's position turns it
    assert untouched(rope.apply(x, np.stack([positions[1]] * 4)), plain.apply(x, positions[1]))
    assert untouched(rope.apply(x), plain.apply(x))  # no positions: arange in every stream
    first, second = reference.rope_pair_indices(0, 32, layout, 4)
    for feature, stream in ((first, 0), (second, 2)):
        np.testing.assert_array_equal(got[..., feature], plain.apply(x, positions[stream])[..., feature])
    half = float(ml_dtypes.finfo(dtype).eps) if dtype.itemsize == 2 else 0  # one rounding of a float32 result
    want = reference.apply_rotary_streams(x.astype(np.float64), positions, list(rope.inv_freq), streams,
                                          layout=layout, rotary_start=4)
    if half:
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=half * np.abs(want).max())
    else:
        assert_rotation_close(got, want, x, positions, rope)


def test_two_streams_a_pair_cos_sin_refusals_and_pickle():
    streams = [[0, 1, 0, 1], [2, 2, 1, 0]]
    rope = pf.RotaryEmbedding(8, layout="half", pair_streams=streams)
    assert rope.n_streams == 3 and "pair_streams=[[0, 1, 0, 1], [2, 2, 1, 0]]" in repr(rope)
    clone = pickle.loads(pickle.dumps(rope))
    assert repr(clone) == repr(rope) and untouched(clone.pair_streams, rope.pair_streams)
    positions = np.array([[1, 2], [40, 5], [7, 800]])
    cos, sin = rope.cos_sin(positions, dtype=np.float64)
    assert cos.shape == sin.shape == (2, 2, 4)
    for t, f, j in np.ndindex(2, 2, 4):
        want = reference.rope_cos_sin([positions[streams[f][j], t]], [rope.inv_freq[j]])
        np.testing.assert_allclose((cos[t, f, j], sin[t, f, j]), (want[0][0, 0], want[1][0, 0]), atol=1e-13)
    out = (np.empty((2, 2, 4), np.float32), np.empty((2, 2, 4), np.float32))
    assert rope.cos_sin(positions, out=out)[1] is out[1] and untouched(out[1], sin.astype(np.float32))
    x, out = random((2, 8)), np.full((2, 8), 7.0)
    with pytest.raises(ValueError, match="inverse=True: this embedding's pairs take two streams each"):
        rope.apply(x, positions, out=out, inverse=True)
    assert (out == 7.0).all()
    same = pf.RotaryEmbedding(8, layout="half", pair_streams=[streams[0], streams[0]])
    assert same.pair_streams.shape == (4,) and repr(same).endswith("pair_streams=[0, 1, 0, 1])")
    with pytest.raises(ValueError, match=r"shape \(4,\), or one per feature of each pair, shape \(2, 4\), "
                                         r"got \(3, 4\)"):
        pf.RotaryEmbedding(8, layout="half", pair_streams=[streams[0]] * 3)
    with pytest.raises(ValueError, match="every stream"):
        pf.RotaryEmbedding(8, layout="half", pair_streams=[[0, 0, 0, 0], [2, 2, 2, 2]])


# ---------------------------------------------------------------------------
# against transformers' own rotary modules


def _hf_rotation(module, rotary, q, k, position_ids):
    import torch

    with torch.no_grad():
        cos, sin = rotary(torch.from_numpy(q), torch.from_numpy(position_ids))
        q_rot, k_rot = module.apply_rotary_pos_emb(torch.from_numpy(q), torch.from_numpy(k), cos, sin)
    return q_rot.numpy(), k_rot.numpy()


def _assert_hf_close(got, want, x):
    # transformers forms float32 angles (up to 512 rad here: 3e-5 rad) and float32 cos/sin
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * float(np.abs(x).max()))


def _thw_positions(seed, seq=20):
    rng = np.random.default_rng(seed)
    return np.stack([np.sort(rng.choice(512, seq, replace=False)) for _ in range(3)])[:, None]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_text_mrope_matches_transformers(family, dtype):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import importlib

    from transformers import Qwen2_5_VLTextConfig, Qwen3VLTextConfig

    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    if family == "qwen2_5_vl":
        config = Qwen2_5_VLTextConfig()
        rotary = module.Qwen2_5_VLRotaryEmbedding(config)
        rope = pf.RotaryEmbedding(128, base=config.rope_parameters["rope_theta"], layout="half",
                                  mrope_section=[16, 24, 24])
    else:
        config = Qwen3VLTextConfig()
        rotary = module.Qwen3VLTextRotaryEmbedding(config)
        rope = pf.RotaryEmbedding(128, base=config.rope_parameters["rope_theta"], layout="half",
                                  mrope_section=[24, 20, 20], mrope_interleaved=True)
    positions = _thw_positions(4)  # (3, batch 1, seq): distinct t, h and w
    q, k = random((1, 4, 20, 128), dtype), random((1, 2, 20, 128), dtype, seed=1)
    want_q, want_k = _hf_rotation(module, rotary, q, k, positions)
    got_q, got_k = rope.apply_qk(q, k, positions[:, :, None, :])
    _assert_hf_close(got_q, want_q, q)
    _assert_hf_close(got_k, want_k, k)
    assert_rotation_close(got_q, expected(q, positions[:, :, None, :], rope), q, positions, rope)


@pytest.mark.parametrize("dtype", DTYPES)
def test_vision_axial_rope_matches_qwen2_vl(dtype):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch
    from transformers.models.qwen2_vl import modeling_qwen2_vl as module
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig

    config = Qwen2VLVisionConfig()
    head_dim = config.embed_dim // config.num_heads
    rotary = module.Qwen2VLVisionRotaryEmbedding(config)
    hw = np.stack(np.divmod(np.arange(48), 8))  # a 6 x 8 grid of patches: (2, patches)
    q, k = random((48, 3, head_dim), dtype), random((48, 3, head_dim), dtype, seed=1)
    with torch.no_grad():
        cos, sin = rotary(torch.from_numpy(q), torch.from_numpy(hw.T))
        want_q, want_k = module.apply_rotary_pos_emb_vision(torch.from_numpy(q), torch.from_numpy(k),
                                                            cos, sin)
    rope = pf.RotaryEmbedding.axial(head_dim, base=config.rope_parameters["rope_theta"])
    got_q, got_k = rope.apply_qk(q, k, hw[:, :, None])
    _assert_hf_close(got_q, want_q.numpy(), q)
    _assert_hf_close(got_k, want_k.numpy(), k)
    assert_rotation_close(got_q, expected(q, hw[:, :, None], rope), q, hw, rope)


RECIPES = Path(__file__).resolve().parent.parent / "docs" / "recipes.md"


@pytest.mark.skipif(not RECIPES.is_file(), reason="needs the source tree (docs/)")
def test_recipes_run_and_mean_what_they_say():
    import re

    text = RECIPES.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 3
    scope: dict = {}
    exec(blocks[0], scope)
    vision: dict = dict(scope)
    exec(blocks[1], vision)
    gemma: dict = dict(scope)
    exec(blocks[2], gemma)
    rope = scope["rope"]
    assert repr(rope) == repr(pf.RotaryEmbedding(128, base=1e6, layout="half",
                                                 mrope_section=[16, 24, 24]))
    q, positions = scope["q"], scope["positions"]
    assert_rotation_close(scope["q_rot"], expected(q, positions[:, None, None, :], rope), q, positions, rope)
    assert vision["rotated"].shape == (48, 16, 80)
    ropes = gemma["ropes"]
    assert ropes["sliding_attention"].base == 1e4 and ropes["sliding_attention"].scaling is None
    assert ropes["full_attention"].base == 1e6 and ropes["full_attention"].scaling["factor"] == 8.0
