"""The compiled fast paths apply the general paths' rules and give their messages.

``RotaryEmbedding.apply``/``apply_qk`` and ``apply_rotary_cos_sin(_qk)``
without positions run compiled code for the common case and hand anything
else to the general path, which validates.  Each case here is a call that
looks like the common case (C-contiguous float32 arrays of the right width)
with one thing wrong or unusual; the call must end as the general path's own
call does: the same exception type and message and nothing written, or the
same result bit for bit.
"""

import ml_dtypes
import numpy as np
import pytest
from helpers import general_path_only, int64_inside

import posenc_fast as pf

BF16 = np.dtype(ml_dtypes.bfloat16)

DIM = 8


def data(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def overlapping_pair(shape, shift):
    """Two C-contiguous float32 arrays of `shape` in one buffer, `shift` elements apart."""
    size = int(np.prod(shape))
    buffer = data(size + shift)
    return buffer[:size].reshape(shape), buffer[shift:].reshape(shape)


def read_only(a):
    a.flags.writeable = False
    return a


def positions_inside(array):
    """Five valid positions (3, 1, 4, 1, 5) as int64 in the first bytes of `array`, which the call
    rotates in place: read while the kernels write, they would change under them."""
    return int64_inside(array, [3, 1, 4, 1, 5])


def outcome(call, args):
    """What `call(**args)` returned, or the TypeError/ValueError it raised."""
    try:
        return call(**args)
    except (TypeError, ValueError) as error:
        return error


def assert_same_outcome(fast_call, general_call, arrays_of):
    """`fast_call` ends as `general_call`, each on fresh arguments from `arrays_of()`."""
    fast_args = arrays_of()
    watched = [a for a in fast_args.values() if isinstance(a, np.ndarray)]
    before = [a.tobytes() for a in watched]
    fast = outcome(fast_call, fast_args)
    general = outcome(general_call, arrays_of())
    if isinstance(general, Exception):
        assert isinstance(fast, Exception), f"fast path returned, general raised {general!r}"
        assert (type(fast), str(fast)) == (type(general), str(general))
        assert [a.tobytes() for a in watched] == before, "a failing call wrote into an argument"
    else:
        assert not isinstance(fast, Exception), f"fast path raised {fast!r}, general did not"
        for got, want in zip(fast if isinstance(fast, tuple) else (fast,),
                             general if isinstance(general, tuple) else (general,)):
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


# ---------------------------------------------------------------------------
# RotaryEmbedding.apply


def apply_args(**change):
    """Arguments of a common-case apply(), with `change` applied (callables get x)."""
    def make():
        args = dict(x=data((2, 3, 5, DIM)), positions=None, offset=0, seq_axis=-2,
                    inverse=False, out=None)
        for key, value in change.items():
            args[key] = value(args["x"]) if callable(value) else value
        return args
    return make


def x_and_out_overlapping():
    x, out = overlapping_pair((2, 3, 5, DIM), shift=4)
    return dict(x=x, positions=None, offset=0, seq_axis=-2, inverse=False, out=out)


APPLY_CASES = {
    "offset a bool": apply_args(offset=True),
    "offset a NumPy bool": apply_args(offset=np.True_),
    "offset a NumPy int64": apply_args(offset=np.int64(3)),
    "offset a str": apply_args(offset="3"),
    "offset None": apply_args(offset=None),
    "offset nan": apply_args(offset=float("nan")),
    "offset an array": apply_args(offset=np.array([3])),
    "offset beyond the compiled range": apply_args(offset=2**62),
    "offset far beyond float64": apply_args(offset=10**400),
    "positions of the wrong length": apply_args(positions=np.arange(4)),
    "positions with more axes than x": apply_args(positions=np.zeros((1, 2, 3, 5, 1), np.int64)),
    "positions varying along two axes": apply_args(positions=np.arange(15).reshape(3, 5)),
    "positions negative": apply_args(positions=np.arange(-5, 0)),
    "positions a bool": apply_args(positions=True),
    "positions a bool array": apply_args(positions=np.ones(5, bool)),
    "positions int32": apply_args(positions=np.arange(5, dtype=np.int32)),
    "positions big-endian": apply_args(positions=np.arange(5).astype(">i8")),
    "positions strided": apply_args(positions=np.arange(10)[::2]),
    "positions a list": apply_args(positions=[0, 1, 2, 3, 4]),
    "positions an int beyond the compiled range": apply_args(positions=2**62),
    "positions an int beyond float64": apply_args(positions=10**400),
    "positions with nan": apply_args(positions=np.array([0.0, np.nan, 1.0, 2.0, 3.0])),
    "seq_axis a bool": apply_args(seq_axis=True),
    "seq_axis a NumPy int64": apply_args(seq_axis=np.int64(-3)),
    "seq_axis a float": apply_args(seq_axis=1.0),
    "seq_axis the last axis": apply_args(seq_axis=-1),
    "seq_axis past the last axis": apply_args(seq_axis=4),
    "inverse 1": apply_args(inverse=1),
    "inverse None": apply_args(inverse=None),
    "inverse a NumPy bool": apply_args(inverse=np.True_),
    "out float64": apply_args(out=lambda x: np.zeros(x.shape)),
    "out of another shape": apply_args(out=lambda x: np.zeros((2, 3, 5, DIM + 1), np.float32)),
    "out flattened": apply_args(out=lambda x: np.zeros(x.size, np.float32)),
    "out read-only": apply_args(out=lambda x: read_only(np.zeros_like(x))),
    "out Fortran order": apply_args(out=lambda x: np.zeros(x.shape, np.float32, order="F")),
    "out a list": apply_args(out=lambda x: x.tolist()),
    "out x reversed": apply_args(out=lambda x: x[::-1]),
    "out x read-only": apply_args(x=lambda x: read_only(x), out=lambda x: x),
    "out another view of x": apply_args(out=lambda x: x.reshape(x.shape)),
    "out overlapping x, both contiguous": x_and_out_overlapping,
    "positions inside x, in place": apply_args(positions=positions_inside, out=lambda x: x),
    "x of the wrong width": apply_args(x=data((2, 3, 5, DIM - 2))),
    "x float16": apply_args(x=lambda x: x.astype(np.float16)),
    "x without a sequence axis": apply_args(x=data((DIM,))),
}


@pytest.mark.parametrize("arrays_of", APPLY_CASES.values(), ids=APPLY_CASES.keys())
@pytest.mark.parametrize("scaling", [None, {"rope_type": "dynamic", "factor": 2.0,
                                            "original_max_position_embeddings": 4}])
def test_apply_ends_as_the_general_path(arrays_of, scaling):
    rope = pf.RotaryEmbedding(DIM, scaling=scaling)
    assert_same_outcome(lambda x, **kw: rope.apply(x, kw.pop("positions"), **kw),
                        lambda x, positions, offset, seq_axis, inverse, out:
                            rope._apply_general(x, positions, offset, seq_axis, inverse, out),
                        arrays_of)


# ---------------------------------------------------------------------------
# RotaryEmbedding.apply_qk


def qk_args(**change):
    def make():
        args = dict(q=data((2, 4, 5, DIM)), k=data((2, 2, 5, DIM), seed=1), positions=None,
                    offset=0, seq_axis=-2, inverse=False, out_q=None, out_k=None)
        for key, value in change.items():
            args[key] = value(args) if callable(value) else value
        return args
    return make


def q_and_k_overlapping():
    q, k = overlapping_pair((2, 2, 5, DIM), shift=DIM)
    return dict(q=q, k=k, positions=None, offset=0, seq_axis=-2, inverse=False, out_q=None,
                out_k=None)


QK_CASES = {
    "offset a bool": qk_args(offset=True),
    "offset a NumPy int64": qk_args(offset=np.int64(3)),
    "inverse 1": qk_args(inverse=1),
    "k of another length": qk_args(k=data((2, 2, 6, DIM))),
    "k of the wrong width": qk_args(k=data((2, 2, 5, DIM + 2))),
    "k float64": qk_args(k=data((2, 2, 5, DIM), dtype=np.float64)),
    "positions not broadcasting to k": qk_args(k=data((2, 2, 3, DIM)),
                                               positions=np.arange(5)),
    "out_q k itself": qk_args(k=data((2, 4, 5, DIM)), out_q=lambda a: a["k"]),
    "out_k q itself": qk_args(k=data((2, 4, 5, DIM)), out_k=lambda a: a["q"]),
    "out_k out_q": qk_args(k=data((2, 4, 5, DIM)), out_q=lambda a: np.zeros_like(a["q"]),
                           out_k=lambda a: a["out_q"]),
    "out_q read-only": qk_args(out_q=lambda a: read_only(np.zeros_like(a["q"]))),
    "out_k of another dtype": qk_args(out_k=lambda a: np.zeros(a["k"].shape)),
    "q and k overlapping": q_and_k_overlapping,
    "q and k the same array": qk_args(k=lambda a: a["q"]),
    "positions inside q, in place": qk_args(positions=lambda a: positions_inside(a["q"]), out_q=lambda a: a["q"],
                                            out_k=lambda a: a["k"]),
    "positions inside out_k": qk_args(out_k=lambda a: np.zeros_like(a["k"]),
                                      positions=lambda a: positions_inside(a["out_k"])),
}


@pytest.mark.parametrize("arrays_of", QK_CASES.values(), ids=QK_CASES.keys())
def test_apply_qk_ends_as_the_general_path(arrays_of):
    rope = pf.RotaryEmbedding(DIM, layout="half")
    assert_same_outcome(lambda q, k, **kw: rope.apply_qk(q, k, kw.pop("positions"), **kw),
                        lambda q, k, positions, offset, seq_axis, inverse, out_q, out_k:
                            rope._apply_qk_general(q, k, positions, offset, seq_axis, inverse,
                                                   out_q, out_k),
                        arrays_of)


# ---------------------------------------------------------------------------
# RotaryEmbedding.apply_qk_norm


def norm_call_args(**change):
    def make():
        args = dict(q=data((2, 4, 5, DIM)), k=data((2, 2, 5, DIM), seed=1), q_weight=data(DIM, seed=2),
                    k_weight=data(DIM, seed=3), positions=None, offset=0, seq_axis=-2, eps=1e-6,
                    weight_offset=0.0, out_q=None, out_k=None)
        for key, value in change.items():
            args[key] = value(args) if callable(value) else value
        return args
    return make


def weight_inside_out_q():
    args = norm_call_args(out_q=lambda a: np.zeros_like(a["q"]))()
    args["q_weight"] = args["out_q"].reshape(-1)[:DIM]
    args["q_weight"][:] = data(DIM, seed=2)
    return args


NORM_TAKEN = {  # by the compiled path
    "the common case": norm_call_args(),
    "in place": norm_call_args(out_q=lambda a: a["q"], out_k=lambda a: a["k"]),
    "into outputs": norm_call_args(out_q=lambda a: np.zeros_like(a["q"]), out_k=lambda a: np.zeros_like(a["k"])),
    "positions reversed": norm_call_args(positions=np.arange(5)[::-1].copy()),
    "positions an int": norm_call_args(positions=3),
    "positions (seq, 1) along heads": norm_call_args(q=data((5, 4, DIM)), k=data((5, 2, DIM), seed=1),
                                                     positions=np.arange(2, 7).reshape(5, 1)),
    "offset": norm_call_args(offset=7),
    "eps 0 and Gemma's weight_offset 1": norm_call_args(eps=0.0, weight_offset=1),
    "weights float16 and float64": norm_call_args(q_weight=lambda a: a["q_weight"].astype(np.float16),
                                                  k_weight=lambda a: a["k_weight"].astype(np.float64)),
    "weight bfloat16": norm_call_args(q_weight=lambda a: a["q_weight"].astype(BF16)),
    "q bfloat16, k float64": norm_call_args(q=lambda a: a["q"].astype(BF16), k=lambda a: a["k"].astype(np.float64)),
    "q float16": norm_call_args(q=lambda a: a["q"].astype(np.float16)),
    "a weight inside out_q": weight_inside_out_q,
}
NORM_DECLINED = {
    "weight_offset an int float64 rounds": norm_call_args(weight_offset=2**60 + 1),
    "weight a list": norm_call_args(q_weight=lambda a: a["q_weight"].tolist()),
    "weight strided": norm_call_args(k_weight=data(2 * DIM)[::2]),
    "weight 2-D": norm_call_args(q_weight=lambda a: a["q_weight"].reshape(1, DIM)),
    "weight of the wrong length": norm_call_args(k_weight=data(DIM + 2)),
    "weight of ints": norm_call_args(q_weight=np.ones(DIM, np.int32)),
    "eps negative": norm_call_args(eps=-1e-6),
    "eps nan": norm_call_args(eps=float("nan")),
    "eps inf": norm_call_args(eps=float("inf")),
    "eps a bool": norm_call_args(eps=True),
    "eps a NumPy float": norm_call_args(eps=np.float32(1e-5)),
    "weight_offset nan": norm_call_args(weight_offset=float("nan")),
    "weight_offset a str": norm_call_args(weight_offset="1"),
    "offset a bool": norm_call_args(offset=True),
    "offset beyond the cache": norm_call_args(offset=2**40),
    "k of another length": norm_call_args(k=data((2, 2, 6, DIM))),
    "q and k overlapping": lambda: {**norm_call_args()(), **dict(zip("qk", overlapping_pair((2, 2, 5, DIM), DIM)))},
    "out_k q itself": norm_call_args(k=data((2, 4, 5, DIM)), out_k=lambda a: a["q"]),
    "out_q read-only": norm_call_args(out_q=lambda a: read_only(np.zeros_like(a["q"]))),
    "out_q k reversed": norm_call_args(k=data((2, 4, 5, DIM)), out_q=lambda a: a["k"][::-1]),
    "positions inside k, in place": norm_call_args(positions=lambda a: positions_inside(a["k"]),
                                                   out_q=lambda a: a["q"], out_k=lambda a: a["k"]),
}
NORM_CASES = {**NORM_TAKEN, **NORM_DECLINED}


@pytest.mark.parametrize("arrays_of", NORM_CASES.values(), ids=NORM_CASES.keys())
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_apply_qk_norm_ends_as_the_general_path(arrays_of, layout):
    from posenc_fast import _qk_norm

    rope = pf.RotaryEmbedding(DIM, layout=layout, rotary_dim=DIM - 2, rotary_start=1)
    assert_same_outcome(lambda q, k, q_weight, k_weight, **kw: rope.apply_qk_norm(
                            q, k, q_weight, k_weight, kw.pop("positions"), **kw),
                        lambda **kw: _qk_norm.apply_qk_norm_general(rope, **kw),
                        arrays_of)


@pytest.mark.parametrize("name", NORM_CASES)
def test_the_norm_cases_compare_two_paths(name):
    # the first group is taken by the compiled path, the second declined (then the general path decides)
    from posenc_fast._dispatch import kernels

    rope = pf.RotaryEmbedding(DIM, layout="half")
    taken = kernels.apply_qk_norm_fast(rope, **NORM_CASES[name]()) is not None
    assert taken == (name in NORM_TAKEN)


# ---------------------------------------------------------------------------
# apply_rotary_cos_sin(_qk) without positions


def cache_args(**change):
    def make():
        args = dict(x=data((2, 3, 5, DIM)), cos=data((5, DIM // 2), seed=1),
                    sin=data((5, DIM // 2), seed=2), layout="half", inverse=False, out=None)
        for key, value in change.items():
            args[key] = value(args) if callable(value) else value
        return args
    return make


def out_overlapping_cos():
    x = data((2, 3, 5, DIM))
    out, shifted = overlapping_pair(x.shape, shift=x.size - 20)
    cos = shifted.reshape(-1)[:20].reshape(5, 4)
    return dict(x=x, cos=cos, sin=data((5, 4), seed=2), layout="half", inverse=False, out=out)


COS_SIN_CASES = {
    "inverse 1": cache_args(inverse=1),
    "inverse a NumPy bool": cache_args(inverse=np.True_),
    "layout unknown": cache_args(layout="neox"),
    "layout None": cache_args(layout=None),
    "cos and sin wider than x's pairs": cache_args(cos=data((5, DIM // 2 + 1)),
                                                   sin=data((5, DIM // 2 + 1))),
    "cos and sin not broadcasting": cache_args(cos=data((6, DIM // 2)), sin=data((6, DIM // 2))),
    "cos and sin of two shapes": cache_args(sin=data((1, DIM // 2))),
    "cos and sin of two dtypes": cache_args(sin=data((5, DIM // 2), dtype=np.float64)),
    "cos of ints": cache_args(cos=np.ones((5, DIM // 2), np.int32)),
    "cos without axes": cache_args(cos=np.float32(1.0), sin=np.float32(0.0)),
    "out float64": cache_args(out=lambda a: np.zeros(a["x"].shape)),
    "out read-only": cache_args(out=lambda a: read_only(np.zeros_like(a["x"]))),
    "out of another shape": cache_args(out=lambda a: np.zeros((2, 3, 5, DIM + 2), np.float32)),
    "out x reversed": cache_args(out=lambda a: a["x"][::-1]),
    "out cos's memory": out_overlapping_cos,
    "x of ints": cache_args(x=np.ones((2, 3, 5, DIM), np.int64)),
}


@pytest.mark.parametrize("arrays_of", COS_SIN_CASES.values(), ids=COS_SIN_CASES.keys())
def test_apply_rotary_cos_sin_ends_as_the_general_path(arrays_of):
    def general(**args):
        with general_path_only():
            return pf.apply_rotary_cos_sin(**args)

    assert_same_outcome(pf.apply_rotary_cos_sin, general, arrays_of)


def cache_qk_args(**change):
    def make():
        args = dict(q=data((2, 4, 5, DIM)), k=data((2, 2, 5, DIM), seed=1),
                    cos=data((5, DIM // 2), seed=2), sin=data((5, DIM // 2), seed=3),
                    layout="half", inverse=False, out_q=None, out_k=None)
        for key, value in change.items():
            args[key] = value(args) if callable(value) else value
        return args
    return make


COS_SIN_QK_CASES = {
    "inverse 1": cache_qk_args(inverse=1),
    "k of another width": cache_qk_args(k=data((2, 2, 5, DIM + 2))),
    "k not broadcasting against cos": cache_qk_args(k=data((2, 2, 6, DIM))),
    "out_q k itself": cache_qk_args(k=data((2, 4, 5, DIM)), out_q=lambda a: a["k"]),
    "out_k out_q": cache_qk_args(k=data((2, 4, 5, DIM)), out_q=lambda a: np.zeros_like(a["q"]),
                                 out_k=lambda a: a["out_q"]),
    "out_k sin itself": cache_qk_args(out_k=lambda a: a["sin"]),
    "q and k the same array": cache_qk_args(k=lambda a: a["q"]),
}


@pytest.mark.parametrize("arrays_of", COS_SIN_QK_CASES.values(), ids=COS_SIN_QK_CASES.keys())
def test_apply_rotary_cos_sin_qk_ends_as_the_general_path(arrays_of):
    def general(**args):
        with general_path_only():
            return pf.apply_rotary_cos_sin_qk(**args)

    assert_same_outcome(pf.apply_rotary_cos_sin_qk, general, arrays_of)


def test_the_common_cases_take_the_compiled_path(monkeypatch):
    # Otherwise the cases above would compare the general path with itself.
    from posenc_fast._dispatch import kernels

    args = cache_args()()
    assert kernels.rotate_cos_sin_fast((args["x"],), args["cos"], args["sin"], "half", False,
                                       (None,)) is not None
    rope = pf.RotaryEmbedding(DIM)

    def no_general_path(*args):
        raise AssertionError("the general path ran")

    monkeypatch.setattr(rope, "_apply_general", no_general_path)
    monkeypatch.setattr(rope, "_apply_qk_general", no_general_path)
    x = apply_args()()["x"]
    rope.apply(x)
    rope.apply_qk(x, x.copy())
    with pytest.raises(AssertionError, match="the general path ran"):
        rope.apply(x, offset=True)


def test_the_switch_turns_every_fast_path_off(monkeypatch):
    # general_path_only() must make the comparisons above compare two paths.
    from posenc_fast._dispatch import kernels

    args = cache_args()()
    rope = pf.RotaryEmbedding(DIM)
    x = apply_args()()["x"]
    general_ran = []
    monkeypatch.setattr(rope, "_apply_general",
                        lambda *a: general_ran.append("apply") or np.zeros_like(x))
    monkeypatch.setattr(rope, "_apply_qk_general",
                        lambda *a: general_ran.append("apply_qk") or (x, x))
    tokens = np.ones((2, 1, DIM), np.float32)
    cache = np.zeros((4, 4, 1, DIM), np.float32)
    cache_call = (rope, tokens, tokens.copy(), tokens.copy(), np.arange(2), cache, cache.copy(),
                  np.arange(2), None)
    assert kernels.apply_qk_to_cache_fast(*cache_call) is not None
    assert kernels.apply_qk_norm_fast(rope, **norm_call_args()()) is not None
    weights = (np.ones(DIM), np.ones(DIM))
    assert kernels.apply_qk_to_cache_fast(*cache_call, weights) is not None
    vllm_norm = (np.arange(2), tokens.reshape(2, DIM), tokens.reshape(2, DIM).copy(), *weights, DIM,
                 np.ones((4, DIM), np.float32), True, 1e-6, 0.0)
    assert kernels.fused_qk_norm_rope_fast(*vllm_norm)
    vllm_cache = (np.arange(2), tokens.reshape(2, DIM), *(tokens.reshape(2, DIM).copy() for _ in range(2)), cache,
                  cache.copy(), np.arange(2), DIM, np.ones((4, DIM), np.float32), True, "NHD", *weights, 1e-6, 0.0)
    assert kernels.tokens_to_cache_fast(*vllm_cache)
    with general_path_only():
        assert not kernels.tokens_to_cache_fast(*vllm_cache)
        assert not kernels.fused_qk_norm_rope_fast(*vllm_norm)
        assert not kernels.fast_paths_enabled()
        assert kernels.apply_qk_norm_fast(rope, **norm_call_args()()) is None
        assert kernels.apply_qk_to_cache_fast(*cache_call, weights) is None
        assert kernels.rotate_cos_sin_fast((args["x"],), args["cos"], args["sin"], "half", False,
                                           (None,)) is None
        assert kernels.apply_qk_to_cache_fast(*cache_call) is None
        rope.apply(x)
        rope.apply_qk(x, x.copy())
    assert kernels.fast_paths_enabled()
    assert general_ran == ["apply", "apply_qk"]
    rope.apply(x)
    assert general_ran == ["apply", "apply_qk"]
