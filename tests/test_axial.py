"""RotaryEmbedding.axial's options (rotary_dim, layout, axis_order, pairs, frequencies) against the reference.

``reference.axial_pairs`` states each pair's frequency and axis from the
definition (per-axis frequency lists, concatenated or taken in turns); the
rotation is ``reference.apply_rotary_streams`` by those.
"""

import itertools
import pickle

import numpy as np
import pytest
from helpers import assert_rotation_close, untouched

import posenc_fast as pf
from posenc_fast import reference
from posenc_fast.rotary import _rebuild

CASES = [  # (dim, n_axes, rotary_dim, layout, axis_order, pairs, frequencies)
    (dim, n_axes, rotary_dim, layout, order, pairs, frequencies)
    for dim, n_axes, rotary_dim in ((24, 2, None), (26, 2, 24), (20, 3, 18), (16, 2, 8))
    for layout in ("half", "interleaved")
    for order in itertools.permutations(range(n_axes))
    for pairs in ("blocks", "alternating")
    for frequencies in ("shared", "split")
]


def _kwargs(n_axes, rotary_dim, layout, order, pairs, frequencies):
    return dict(n_axes=n_axes, rotary_dim=rotary_dim, layout=layout, axis_order=order, pairs=pairs,
                frequencies=frequencies)


@pytest.mark.parametrize("dim, n_axes, rotary_dim, layout, order, pairs, frequencies", CASES)
def test_axial_matches_reference(dim, n_axes, rotary_dim, layout, order, pairs, frequencies):
    rope = pf.RotaryEmbedding.axial(dim, base=100.0, **_kwargs(n_axes, rotary_dim, layout, order, pairs,
                                                                frequencies))
    width = dim if rotary_dim is None else rotary_dim
    inv_freq, streams = reference.axial_pairs(width, n_axes, 100.0, order, pairs, frequencies)
    assert rope.rotary_dim == width and rope.layout == layout and rope.n_streams == n_axes
    assert rope.pair_streams.tolist() == streams
    np.testing.assert_allclose(rope.inv_freq, inv_freq, rtol=1e-15, atol=0)
    rng = np.random.default_rng(0)
    positions = rng.integers(0, 60, (n_axes, 7))
    for dtype in (np.float64, np.float32):
        x = rng.standard_normal((7, 3, dim)).astype(dtype)
        want = reference.apply_rotary_streams(x, positions[:, :, None], inv_freq, streams, layout=layout)
        got = rope.apply(x, positions[:, :, None])
        assert_rotation_close(got, want, x, positions, rope)
        assert untouched(got[..., width:], x[..., width:])  # the features past rotary_dim pass through
        back = rope.apply(got, positions[:, :, None], inverse=True)
        np.testing.assert_allclose(back, x, rtol=0, atol=1e-5 if dtype == np.float32 else 1e-12)
    cos, sin = rope.cos_sin(positions, dtype=np.float64)
    for t in range(positions.shape[1]):
        for j, (frequency, axis) in enumerate(zip(inv_freq, streams)):
            want_cos, want_sin = reference.rope_cos_sin([positions[axis, t]], [frequency])
            np.testing.assert_allclose((cos[t, j], sin[t, j]), (want_cos[0, 0], want_sin[0, 0]),
                                       rtol=0, atol=1e-13)


def test_the_options_change_the_rope():
    # each option away from its default changes the frequencies or the streams (none is a no-op)
    default = pf.RotaryEmbedding.axial(32)
    for kwargs in ({"axis_order": (1, 0)}, {"pairs": "alternating"}, {"frequencies": "split"}):
        other = pf.RotaryEmbedding.axial(32, **kwargs)
        assert (other.pair_streams.tolist() != default.pair_streams.tolist()
                or not np.array_equal(other.inv_freq, default.inv_freq)), kwargs
    x, hw = np.ones((4, 1, 32)), np.stack([np.arange(4), np.arange(4)[::-1]])[:, :, None]
    assert not np.array_equal(pf.RotaryEmbedding.axial(32, layout="interleaved").apply(x, hw),
                              default.apply(x, hw))


def test_defaults_are_qwen2_vl_axial():
    rope = pf.RotaryEmbedding.axial(80)
    assert repr(rope) == "RotaryEmbedding.axial(80, base=10000.0, n_axes=2)"
    assert rope.pair_streams.tolist() == [0] * 20 + [1] * 20 and rope.layout == "half"
    np.testing.assert_array_equal(rope.inv_freq[:20], rope.inv_freq[20:])
    np.testing.assert_allclose(rope.inv_freq[:20], reference.rope_inv_freq(40), rtol=1e-15)


@pytest.mark.parametrize("kwargs", [
    {}, {"n_axes": 3, "rotary_dim": 78, "axis_order": [2, 0, 1]},
    {"layout": "interleaved", "pairs": "alternating", "frequencies": "split"},
])
def test_pickle_and_repr_keep_the_options(kwargs):
    rope = pf.RotaryEmbedding.axial(80, base=500.0, **kwargs)
    clone = pickle.loads(pickle.dumps(rope))
    assert repr(clone) == repr(rope)
    assert eval(repr(rope), {"RotaryEmbedding": pf.RotaryEmbedding}).pair_streams.tolist() == \
        rope.pair_streams.tolist()
    np.testing.assert_array_equal(clone.inv_freq, rope.inv_freq)
    np.testing.assert_array_equal(clone.pair_streams, rope.pair_streams)
    assert clone.rotary_dim == rope.rotary_dim and clone.layout == rope.layout


def test_a_pickle_from_before_the_options_rebuilds_qwen2_vl_axial():
    # the unpickling call of earlier versions: (dim, base, rotary_dim, layout, scaling, streams, axes,
    # reverse, start)
    old = _rebuild(80, 10000.0, 80, "half", None, [0] * 20 + [1] * 20, 2, False, 0)
    assert repr(old) == repr(pf.RotaryEmbedding.axial(80))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"dim": 30}, ValueError, r"dim must be a multiple of 2 \* n_axes = 4, got 30"),
    ({"rotary_dim": 30}, ValueError, r"rotary_dim must be a multiple of 2 \* n_axes = 4, got 30"),
    ({"rotary_dim": 48}, ValueError, "rotary_dim must be <= dim = 40, got 48"),
    ({"rotary_dim": 4.0}, TypeError, "rotary_dim must be an integer"),
    ({"rotary_dim": 0}, ValueError, "rotary_dim must be >= 1"),
    ({"n_axes": 1}, ValueError, "n_axes must be >= 2"),
    ({"n_axes": True}, TypeError, "n_axes must be an integer"),
    ({"layout": "split"}, ValueError, "layout must be one of"),
    ({"axis_order": (0, 0)}, ValueError, r"axis_order must be a permutation of range\(n_axes\) = \[0, 1\]"),
    ({"axis_order": (0, 1, 2)}, ValueError, "axis_order must be a permutation"),
    ({"axis_order": "10"}, TypeError, "axis_order must be a sequence of ints"),
    ({"axis_order": 1}, TypeError, "axis_order must be a sequence of ints"),
    ({"axis_order": (1.0, 0)}, TypeError, r"axis_order\[0\] must be an integer"),
    ({"pairs": "interleaved"}, ValueError, "pairs must be one of"),
    ({"frequencies": "per_axis"}, ValueError, "frequencies must be one of"),
    ({"base": -1.0}, ValueError, "base"),
])
def test_bad_axial_arguments(kwargs, error, match):
    kwargs = {"dim": 40, **kwargs}
    with pytest.raises(error, match=match):
        pf.RotaryEmbedding.axial(kwargs.pop("dim"), **kwargs)
