"""RotaryEmbedding as a Python object: pickle and copy (a subclass stays one, with its own attributes), and a
second ``__init__`` that fails, which changes nothing."""

import copy
import pickle

import numpy as np
import pytest

import posenc_fast as pf
from posenc_fast import rotary


def random(shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


class _Tagged(pf.RotaryEmbedding):  # a subclass with an argument and a method of its own
    def __init__(self, dim, tag, **kwargs):
        super().__init__(dim, **kwargs)
        self.tag = tag

    def apply(self, x, *args, **kwargs):
        return super().apply(x, *args, **kwargs) * 2


@pytest.mark.parametrize("make", [lambda: _Tagged(64, "t", layout="half", rotary_dim=32),
                                  lambda: _Tagged.axial(80, axis_order=(1, 0))])
def test_pickle_and_copy_keep_a_subclass(make):
    rope = make()
    rope.note = [1, 2]
    x = random((4, 2, rope.dim), np.float32)
    positions = np.arange(4)[:, None] if rope.pair_streams is None else np.stack(np.divmod(np.arange(8), 4))[:, :4, None]
    for clone in (pickle.loads(pickle.dumps(rope)), copy.copy(rope), copy.deepcopy(rope)):
        assert type(clone) is _Tagged and clone.note == [1, 2] and repr(clone) == repr(rope)
        np.testing.assert_array_equal(clone.apply(x, positions), rope.apply(x, positions))


def test_failed_init_changes_nothing():
    rope = pf.RotaryEmbedding(64)
    x = random((1, 2, 8, 64), np.float32)
    before, text = rope.apply(x), repr(rope)
    with pytest.raises(ValueError, match="rope_type"):
        rope.__init__(64, base=500.0, layout="half", scaling={"rope_type": "bogus"})
    assert repr(rope) == text and rope.layout == "interleaved"
    np.testing.assert_array_equal(rope.apply(np.asfortranarray(x)), before)  # the general path
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(rope)).apply(x), before)


def test_a_pickle_carries_what_setup_does_not_set():
    # the attributes _setup sets are what the constructor's arguments stand for in a pickle
    assert set(vars(pf.RotaryEmbedding(8))) == rotary._SETUP_STATE == set(vars(pf.RotaryEmbedding.axial(8)))
