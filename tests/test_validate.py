"""The argument rules of _validate, through the public functions, on every NumPy.

NumPy 1.x lets ``np.bool_`` through ``operator.index`` and ``float()`` with at
most a DeprecationWarning; the rules must refuse it with TypeError there too
(CI runs this file on the oldest NumPy declared as well as the newest).
"""

import warnings

import numpy as np
import pytest

import posenc_fast as pf
from posenc_fast._frequencies import resolve_rope_scaling

X = np.zeros((2, 3, 8), np.float32)
SCORES = np.zeros((1, 2, 3, 3), np.float32)
TABLE = np.zeros((10, 8), np.float32)

BOOL_ARGUMENTS = {
    "length": lambda b: pf.sinusoidal_table(b, 4),
    "dim": lambda b: pf.sinusoidal_table(3, b),
    "offset": lambda b: pf.sinusoidal_table(3, 4, offset=b),
    "base": lambda b: pf.sinusoidal([1.0], 4, base=b),
    "RotaryEmbedding dim": lambda b: pf.RotaryEmbedding(b),
    "rotary_dim": lambda b: pf.RotaryEmbedding(8, rotary_dim=b),
    "interpolation_factor": lambda b: pf.apply_rotary(X, interpolation_factor=b),
    "apply offset": lambda b: pf.RotaryEmbedding(8).apply(X, offset=b),
    "seq_axis": lambda b: pf.RotaryEmbedding(8).apply(X, seq_axis=b),
    "inv_freq_for seq_len": lambda b: pf.RotaryEmbedding(8).inv_freq_for(b),
    "table offset": lambda b: pf.add_position_table(X, TABLE, offset=b),
    "num_heads": lambda b: pf.alibi_slopes(b),
    "q_len": lambda b: pf.alibi_bias(2, b),
    "k_len": lambda b: pf.relative_position_index(2, b, max_distance=2),
    "max_distance": lambda b: pf.relative_position_index(2, max_distance=b),
    "num_buckets": lambda b: pf.t5_relative_bucket(2, num_buckets=b),
    "alibi offset": lambda b: pf.add_alibi(SCORES, offset=b),
    "n": lambda b: pf.set_num_threads(b),
    "resolve_rope_scaling rotary_dim": lambda b: resolve_rope_scaling(None, rotary_dim=b,
                                                                      base=1e4),
    "resolve_rope_scaling base": lambda b: resolve_rope_scaling(None, rotary_dim=8, base=b),
}


@pytest.mark.parametrize("flag", [True, np.True_], ids=["bool", "numpy.bool_"])
@pytest.mark.parametrize("call", BOOL_ARGUMENTS.values(), ids=BOOL_ARGUMENTS.keys())
def test_a_bool_is_not_a_number(call, flag):
    threads = pf.get_num_threads()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(TypeError, match="must be an integer, got bool|"
                                                "must be a real number, got bool"):
                call(flag)
    finally:
        pf.set_num_threads(threads)


@pytest.mark.parametrize("call", [
    lambda: pf.alibi_bias(2, 3, causal=1),
    lambda: pf.t5_relative_bucket(2, bidirectional=np.int64(1)),
    lambda: pf.RotaryEmbedding(8).apply(X, inverse=0),
    lambda: pf.apply_rotary_cos_sin(X, np.ones((3, 4)), np.zeros((3, 4)), inverse="no"),
])
def test_a_flag_is_a_bool(call):
    with pytest.raises(TypeError, match="must be a bool, got"):
        call()


@pytest.mark.parametrize("value", [np.float64(4096.0), np.int32(4096), np.array(4096), 4096.0])
def test_scaling_entries_take_numpy_scalars_and_whole_floats(value):
    scaling = {"rope_type": "yarn", "factor": np.float32(4.0), "beta_fast": np.array(32.0),
               "original_max_position_embeddings": value}
    plain = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    got = resolve_rope_scaling(scaling, rotary_dim=8, base=1e4)
    assert got.params == resolve_rope_scaling(plain, rotary_dim=8, base=1e4).params
    assert type(got.params["original_max_position_embeddings"]) is int


@pytest.mark.parametrize("entry, match", [
    ({"truncate": np.True_}, None),
    ({"truncate": None},
     r"scaling\['truncate'\] \(rope_type 'yarn'\) must be a bool, got NoneType"),
    ({"truncate": 1}, r"'truncate'.* must be a bool, got int"),
    ({"beta_fast": np.array([32.0])}, r"'beta_fast'.* must be a real number, got ndarray"),
    ({"factor": np.True_}, r"'factor'.* must be a real number, got bool"),
])
def test_scaling_entries_follow_the_same_rules(entry, match):
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
               **entry}
    if match is None:
        assert resolve_rope_scaling(scaling, rotary_dim=8, base=1e4).params["truncate"] is True
    else:
        with pytest.raises(ValueError, match=match):
            resolve_rope_scaling(scaling, rotary_dim=8, base=1e4)


def _overlapping(shape):
    """A writeable float32 array of `shape` whose rows overlap by half (a row's stride half its bytes)."""
    strides = (4 * shape[-1] // 2,) * (len(shape) - 1) + (4,)
    return np.lib.stride_tricks.as_strided(np.zeros(4 * int(np.prod(shape)), np.float32), shape, strides)


OVERLAPPING_OUT = {
    "apply": lambda out: pf.RotaryEmbedding(8).apply(X, out=out),
    "apply in place": lambda out: pf.RotaryEmbedding(8).apply(out, out=out),
    "add_alibi": lambda out: pf.add_alibi(SCORES, out=out),
    "add_position_table": lambda out: pf.add_position_table(X, TABLE, out=out),
}


@pytest.mark.parametrize("call", OVERLAPPING_OUT.values(), ids=OVERLAPPING_OUT.keys())
def test_an_out_whose_elements_share_memory_is_refused(call):
    # each result would depend on the order of the writes
    shape = SCORES.shape if call is OVERLAPPING_OUT["add_alibi"] else X.shape
    out = _overlapping(shape)
    before = out.copy()
    with pytest.raises(ValueError, match="out of strides .* has elements that share memory"):
        call(out)
    np.testing.assert_array_equal(out, before)


@pytest.mark.parametrize("call", OVERLAPPING_OUT.values(), ids=OVERLAPPING_OUT.keys())
def test_a_byte_swapped_out_is_named_so(call):
    # '>f4' is float32 too: the message says what differs
    shape = SCORES.shape if call is OVERLAPPING_OUT["add_alibi"] else X.shape
    out = np.ones(shape, np.dtype(np.float32).newbyteorder())
    before = out.copy()
    with pytest.raises(ValueError, match="out must be float32 in native byte order, got >f4"):
        call(out)
    np.testing.assert_array_equal(out, before)


def test_positions_of_an_ndarray_subclass_are_their_values():
    # np.matrix stays 2-D through reshape(-1): a one-row table read past its end (a crash at 400000
    # positions), one row of sinusoids filled, the rest np.empty's memory
    p = np.arange(12).reshape(3, 4)
    m = np.asmatrix(p)
    x = np.ones((3, 4, 8), np.float32)
    rope = pf.RotaryEmbedding(8)
    w = np.linspace(0.5, 1.5, 8).astype(np.float32)
    for call in (lambda q: rope.apply(x, q), lambda q: rope.apply_qk(x, x, q)[1], lambda q: rope.cos_sin(q)[1],
                 lambda q: rope.apply_qk_norm(x, x, w, w, q)[0], lambda q: pf.sinusoidal(q, 8),
                 lambda q: pf.add_sinusoidal(x, positions=q), lambda q: pf.apply_rotary(x, q)):
        assert np.array_equal(call(m), call(p))
    long = np.arange(400000)[None]
    x = np.ones((1, 400000, 16), np.float32)
    assert np.array_equal(pf.RotaryEmbedding(16).apply(x, np.asmatrix(long)), pf.RotaryEmbedding(16).apply(x, long))
