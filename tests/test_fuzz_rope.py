"""Fuzz RoPE: RotaryEmbedding, apply_rotary and a caller's cos/sin, with awkward arguments.

As ``test_fuzz.py`` (the other public functions): each call must either
return the reference's result (to the dtype's tolerance) or raise
TypeError/ValueError with nothing written; never crash, never raise anything
else, never let a warning escape.  See ``fuzzing.py`` for the strategies and
the checks, and ``POSENC_FAST_FUZZ_EXAMPLES`` to run more examples.
"""

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import posenc_fast as pf
from posenc_fast import reference as ref

from fuzzing import (DTYPE_ARGS, FUZZ, HUGE_INTS, OUT_KINDS, ROTARY_LAYOUTS, Snapshot, arrays,
                     assert_close, bad_ints, bad_reals, call, check, choose, dtype_ok, int_ok,
                     is_float_data, lead_shapes, magnitude, make_out, maybe, native, out_ok,
                     positions_for, positions_value, real_ok, real_values, table_ok)


# ---------------------------------------------------------------------------
# RoPE

VALID_SCALINGS = [
    None,
    {"rope_type": "default"},
    {"rope_type": "linear", "factor": 4.0},
    {"type": "ntk", "factor": 2.0},
    {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 16},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
]


def _longrope(npairs):
    return {"rope_type": "longrope", "short_factor": [1.0 + i for i in range(npairs)],
            "long_factor": [2.0 + i for i in range(npairs)],
            "original_max_position_embeddings": 32, "factor": 4.0}


@st.composite
def ropes(draw):
    """(RotaryEmbedding, dim) for a valid, drawn configuration."""
    dim = draw(st.integers(2, 10))
    rotary_dim = draw(st.sampled_from([None] + list(range(2, dim + 1, 2))))
    if rotary_dim is None and dim % 2:
        rotary_dim = dim - 1
    rd = dim if rotary_dim is None else rotary_dim
    scaling = draw(st.sampled_from(VALID_SCALINGS + ["longrope"]))
    if scaling == "longrope":
        scaling = _longrope(rd // 2)
    if scaling and scaling.get("rope_type", scaling.get("type")) in ("dynamic", "ntk") and rd < 4:
        scaling = None
    base = draw(st.sampled_from([10000.0, 500000.0, 10.0, 2.0]))
    layout = draw(st.sampled_from(["interleaved", "half"]))
    rope = pf.RotaryEmbedding(dim, base=base, rotary_dim=rotary_dim, layout=layout,
                              scaling=scaling)
    return rope


def _seq_len(values):
    return max(1, math.floor(values.max()) + 1) if values.size else 1


def _frequencies_exist(rope, *values):
    """False where the call's positions are too large for its frequencies (dynamic NTK:
    the base for that length overflows float64), which the call must refuse."""
    try:
        rope.inv_freq_for(max(_seq_len(v) for v in values))
    except ValueError:
        return False
    return True


def _rope_reference(rope, x, values, inverse):
    """The reference rotation of x by float64 positions `values` (broadcast to x.shape[:-1])."""
    seq_len = _seq_len(values)
    inv_freq = rope.inv_freq_for(seq_len)
    want = ref.apply_rotary(x, values, list(inv_freq), layout=rope.layout,
                            attention_factor=rope.attention_factor, inverse=inverse)
    angle = float(np.abs(values).max() * inv_freq.max()) if values.size else 0.0
    factor = max(rope.attention_factor, 1 / rope.attention_factor)
    return want, angle, factor


def _call_positions(rope_lead, positions, offset, seq_axis):
    """Expected float64 positions for apply(), or None if the call must fail."""
    lead = rope_lead
    if positions is None:
        if not lead or not int_ok(seq_axis):
            return None
        axis = int(seq_axis)
        axis = axis + len(lead) + 1 if axis < 0 else axis
        if not 0 <= axis < len(lead):
            return None
        shape = (lead[axis],) + (1,) * (len(lead) - 1 - axis)
        values = np.arange(lead[axis], dtype=np.float64).reshape(shape)
        values = np.broadcast_to(values, lead)
    else:
        parsed = positions_value(positions, lead)
        if parsed is None:
            return None
        values = parsed[0]
    with np.errstate(over="ignore"):
        values = values + float(offset)
    return values if np.isfinite(values).all() else None


SEQ_AXES = choose([-2, -2, -3, 0, 1, np.int64(-2)], [-1, 5, -7, True, 1.0, None])


@FUZZ
@given(data=st.data(), rope=ropes(), offset=maybe(real_values(), bad_reals()),
       seq_axis=SEQ_AXES, inverse=choose([False, True, np.bool_(True)], [0, None]),
       out_kind=OUT_KINDS)
def test_rotary_apply(data, rope, offset, seq_axis, inverse, out_kind):
    lead = data.draw(lead_shapes(min_dims=0, max_dims=5, max_rows=32))
    last = data.draw(maybe(st.just(rope.dim), st.integers(0, 12)))
    x = data.draw(arrays(lead + (last,)))
    positions = data.draw(positions_for(lead))
    dtype = native(x.dtype) if is_float_data(x) else np.float32
    out = make_out(out_kind, x.shape, dtype, x)
    valid = (is_float_data(x) and x.ndim >= 1 and x.shape[-1] == rope.dim and real_ok(offset)
             and isinstance(inverse, (bool, np.bool_)))
    values = _call_positions(lead, positions, offset, seq_axis) if valid else None
    valid = (valid and values is not None and _frequencies_exist(rope, values)
             and out_ok(out, x.shape, dtype, may_be=x)[0])
    x0 = np.array(x, copy=True)
    snap = Snapshot(x, out, positions)
    outcome = call(rope.apply, x, positions, offset=offset, seq_axis=seq_axis, inverse=inverse,
                   out=out)
    if check(outcome, not valid, snap, written=(out,)):
        want, angle, factor = _rope_reference(rope, x0, values, bool(inverse))
        assert_close(outcome.result, want, dtype, magnitude(x0) * 2 * factor, angle)
        if out is not None:
            assert outcome.result is out


@FUZZ
@given(data=st.data(), rope=ropes(), offset=maybe(st.integers(-5, 5), bad_reals()),
       seq_axis=SEQ_AXES,
       k_kind=choose(["own", "other_heads", "same"], ["overlap"]),
       outs=choose([("none", "none"), ("in_place", "in_place"), ("fresh", "fresh"),
                    ("in_place", "none")],
                   [("k", "none"), ("none", "q"), ("wrong_dtype", "fresh"), ("fresh", "readonly"),
                    ("same", "same")], one_in=4))
def test_rotary_apply_qk(data, rope, offset, seq_axis, k_kind, outs):
    lead = data.draw(lead_shapes(min_dims=1, max_dims=4, max_rows=24))
    q = data.draw(arrays(lead + (rope.dim,), dtype=data.draw(choose(
        ["float32", "float64", ">f4"], ["int32"]))))
    if k_kind == "same":
        k = q
    elif k_kind == "overlap" and q.flags.c_contiguous and q.flags.writeable and q.size > rope.dim:
        k = q.reshape(-1)[rope.dim:].reshape((q.size // rope.dim - 1, rope.dim))
    elif k_kind == "other_heads" and len(lead) >= 2:
        k = data.draw(arrays(lead[:-2] + (1,) + lead[-1:] + (rope.dim,)))
    else:
        k = data.draw(arrays(lead + (rope.dim,), dtype=data.draw(st.sampled_from(
            ["float32", "float64"]))))
    positions = data.draw(positions_for(lead))
    q_dtype = native(q.dtype) if is_float_data(q) else np.float32
    k_dtype = native(k.dtype) if is_float_data(k) else np.float32

    def make(kind, shape, dtype, own, other):
        if kind == "k":
            return other
        if kind == "q":
            return other
        if kind == "same":
            return "same"
        return make_out(kind, shape, dtype, own)

    out_q = make(outs[0], q.shape, q_dtype, q, k)
    out_k = make(outs[1], k.shape, k_dtype, k, q)
    if isinstance(out_q, str):
        out_q = out_k = np.zeros(q.shape, q_dtype)

    valid = (is_float_data(q) and is_float_data(k) and real_ok(offset) and q.ndim >= 1
             and k.ndim >= 1)
    q_values = k_values = None
    if valid:
        q_values = _call_positions(q.shape[:-1], positions, offset, seq_axis)
        k_values = _call_positions(k.shape[:-1], positions, offset, seq_axis)
        valid = (q_values is not None and k_values is not None
                 and _frequencies_exist(rope, q_values, k_values))
    if valid and positions is None:
        # Both have the same length along seq_axis.
        axis = int(seq_axis)
        valid = q.shape[axis + q.ndim if axis < 0 else axis] == k.shape[
            axis + k.ndim if axis < 0 else axis]
    valid = (valid and out_ok(out_q, q.shape, q_dtype, may_be=q, must_not_overlap=(k,))[0]
             and out_ok(out_k, k.shape, k_dtype, may_be=k, must_not_overlap=(q, out_q))[0])
    q0, k0 = np.array(q, copy=True), np.array(k, copy=True)
    snap = Snapshot(q, k, out_q, out_k, positions)
    outcome = call(rope.apply_qk, q, k, positions, offset=offset, seq_axis=seq_axis,
                   out_q=out_q, out_k=out_k)
    if check(outcome, not valid, snap, written=(out_q, out_k)):
        q_rot, k_rot = outcome.result
        for got, arr, values, dtype in ((q_rot, q0, q_values, q_dtype),
                                        (k_rot, k0, k_values, k_dtype)):
            # Frequencies follow the positions of the whole call (the same for q and k).
            want, angle, factor = _rope_reference(rope, arr, values, False)
            assert_close(got, want, dtype, magnitude(arr) * 2 * factor, angle)


@FUZZ
@given(data=st.data(), rope=ropes(), dtype=DTYPE_ARGS)
def test_rotary_cos_sin_and_inv_freq_for(data, rope, dtype):
    lead = data.draw(lead_shapes(max_dims=3, max_rows=16))
    positions = data.draw(positions_for(lead, allow_none=False))
    parsed = positions_value(positions, np.shape(positions))
    valid = parsed is not None and dtype_ok(dtype) and _frequencies_exist(rope, parsed[0])
    snap = Snapshot(positions)
    outcome = call(rope.cos_sin, positions, dtype=dtype)
    if check(outcome, not valid, snap):
        values = parsed[0]
        seq_len = _seq_len(values)
        inv_freq = rope.inv_freq_for(seq_len)
        want_cos, want_sin = ref.rope_cos_sin(values, list(inv_freq), rope.attention_factor)
        angle = float(np.abs(values).max() * inv_freq.max()) if values.size else 0.0
        for got, want in zip(outcome.result, (want_cos, want_sin)):
            assert_close(got, want, native(dtype), rope.attention_factor, angle)
    seq_len = data.draw(st.one_of(st.integers(-3, 2**62), bad_ints(), st.sampled_from(HUGE_INTS)))
    outcome = call(rope.inv_freq_for, seq_len)
    expect = not int_ok(seq_len, 1)
    if not expect and (rope.scaling or {}).get("rope_type") == "dynamic" and int(seq_len) > 2**60:
        expect = None  # the grown base may overflow float64: ValueError then
    if check(outcome, expect, Snapshot()):
        freqs = outcome.result
        assert freqs.dtype == np.float64 and freqs.shape == (rope.rotary_dim // 2,)
        assert not freqs.flags.writeable and np.isfinite(freqs).all()


@FUZZ
@given(dim=maybe(st.sampled_from([2, 4, 6, 8, 10]),
                 st.one_of(st.integers(1, 9), bad_ints(), st.sampled_from([0, 2**62, 10**30]))),
       base=maybe(st.sampled_from([10000.0, 2.0, 1.0, 0.5, 1e-300, 1e300, 7]),
                  st.one_of(bad_reals(), st.sampled_from([0.0, -2.0]))),
       rotary_dim=maybe(st.one_of(st.none(), st.sampled_from([2, 4])),
                        st.one_of(st.integers(-2, 12), bad_ints())),
       layout=ROTARY_LAYOUTS,
       scaling=maybe(st.sampled_from(VALID_SCALINGS), st.sampled_from(
           [[1], "linear", 3, {"rope_type": "bogus"}, {"factor": 2.0}, {"rope_type": "linear"},
            {"rope_type": "linear", "factor": float("nan")}, {"rope_type": "linear", "factor": 0.5},
            {"rope_type": "ntk", "factor": 1e300}, {"rope_type": "yarn", "factor": 2.0,
                                                    "original_max_position_embeddings": 0},
            {"rope_type": "yarn", "factor": 10**400, "original_max_position_embeddings": 8},
            {"rope_type": "dynamic", "factor": 1e308, "original_max_position_embeddings": 1},
            {"rope_type": "llama3", "factor": 2.0, "low_freq_factor": 4.0,
             "high_freq_factor": 1.0, "original_max_position_embeddings": 8},
            {"rope_type": "longrope", "short_factor": "ab", "long_factor": [1],
             "original_max_position_embeddings": 8},
            {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8,
             "attention_factor": 1e-300, "beta_fast": 1e300},
            {"rope_type": "linear", "factor": 2.0, "extra": 1}]), one_in=3))
def test_rotary_embedding_constructor(dim, base, rotary_dim, layout, scaling):
    rd = dim if rotary_dim is None else rotary_dim
    impossible = int_ok(rd) and int(rd) > 2**40  # its frequency table cannot be allocated
    outcome = call(pf.RotaryEmbedding, dim, base=base, rotary_dim=rotary_dim, layout=layout,
                   scaling=scaling, allow_memory_error=impossible)
    plain = (int_ok(dim, 1) and real_ok(base) and float(base) > 0
             and layout in ("interleaved", "half") and (rotary_dim is None or int_ok(rotary_dim))
             and int_ok(rd) and int(rd) % 2 == 0 and 2 <= int(rd) <= int(dim)
             and int(dim) < 2**63)
    expect = None if plain and scaling is not None else not plain
    if impossible:
        expect = True
    if check(outcome, expect, Snapshot()):
        rope = outcome.result
        assert rope.dim == dim and rope.rotary_dim == rd and rope.layout == layout
        assert rope.inv_freq.shape == (int(rd) // 2,) and np.isfinite(rope.inv_freq).all()
        assert math.isfinite(rope.attention_factor)
        _smoke_rope(rope)


def _smoke_rope(rope):
    """A built embedding rotates small inputs to finite values, keeping norms (times the factor)."""
    if rope.dim > 2**16:  # valid (e.g. dim 2**62, rotary_dim 2), but no x of that width fits
        return
    x = np.random.default_rng(0).uniform(-1, 1, (2, 3, rope.dim))
    for positions in (None, np.array([0, 5, 1000]), 10**6):
        outcome = call(rope.apply, x, positions)
        if outcome.error is not None:  # e.g. an angle beyond the float range
            assert isinstance(outcome.error, ValueError)
            continue
        y = outcome.result
        if 1e-100 < rope.attention_factor < 1e100:
            assert np.isfinite(y).all()
            r = rope.rotary_dim
            norms = np.linalg.norm(y[..., :r], axis=-1)
            np.testing.assert_allclose(norms, np.linalg.norm(x[..., :r], axis=-1)
                                       * rope.attention_factor, rtol=1e-9)


JUNK_VALUES = st.sampled_from([0, -1, 1, 2, 3, 7, 8, 64, 128, 4096, 2**62, 10**400, 0.0, 0.5, 1.5,
                               float("nan"), float("inf"), -float("inf"), 1e308, 1e-320, True,
                               None, "x", "", "llama", [], [1.0], {}, {"rope_type": "yarn"}])
CONFIG_KEYS = ["model_type", "head_dim", "hidden_size", "num_attention_heads", "n_embd", "n_head",
               "rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor",
               "rotary_pct", "rotary_emb_base", "rotary_dim", "max_position_embeddings",
               "original_max_position_embeddings", "qk_rope_head_dim", "n_positions"]
MODEL_TYPES = st.sampled_from(["llama", "mistral", "qwen2", "qwen3", "gemma", "phi", "phi3",
                               "gpt_neox", "gptj", "stablelm", "deepseek_v3", "bogus", None, 3])
SCALING_KEYS = ["rope_type", "type", "factor", "original_max_position_embeddings", "beta_fast",
                "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate",
                "low_freq_factor", "high_freq_factor", "short_factor", "long_factor",
                "rope_theta", "partial_rotary_factor"]
ROPE_TYPES = st.sampled_from(["default", "linear", "ntk", "dynamic", "yarn", "llama3",
                              "longrope", "su", "bogus", None, 1])


@st.composite
def junk_configs(draw):
    """A config dict: a plausible skeleton with some keys junk, missing or extra."""
    cfg = {"model_type": draw(MODEL_TYPES), "hidden_size": 64, "num_attention_heads": 4,
           "max_position_embeddings": 2048}
    for key in draw(st.lists(st.sampled_from(CONFIG_KEYS), max_size=5)):
        cfg[key] = draw(JUNK_VALUES)
    if draw(st.booleans()):
        scaling = {"rope_type": draw(ROPE_TYPES)}
        for key in draw(st.lists(st.sampled_from(SCALING_KEYS), max_size=5)):
            scaling[key] = draw(st.one_of(JUNK_VALUES, st.floats(0.5, 64)))
        cfg[draw(st.sampled_from(["rope_scaling", "rope_parameters"]))] = scaling
    for key in draw(st.lists(st.sampled_from(list(cfg)), max_size=2)):
        cfg.pop(key, None)
    return cfg


@FUZZ
@given(config=st.one_of(junk_configs(), junk_configs(),
                        st.sampled_from([[], "", "/nonexistent/config.json", 3, None, b"x"])))
def test_from_hf_config_junk(config):
    # A junk head size may ask for a frequency table no machine can hold:
    # NumPy's MemoryError is then the answer, as for np.empty.
    outcome = call(pf.RotaryEmbedding.from_hf_config, config, allow_memory_error=True)
    if outcome.error is None:
        rope = outcome.result
        assert isinstance(rope, pf.RotaryEmbedding)
        assert np.isfinite(rope.inv_freq).all() and math.isfinite(rope.attention_factor)
        if rope.dim <= 4096:
            _smoke_rope(rope)


@FUZZ
@given(data=st.data(), base=maybe(st.sampled_from([10000.0, 10, 2.0]), bad_reals()),
       factor=maybe(st.sampled_from([1.0, 2, 4.0, 1e6]),
                    st.one_of(bad_reals(), st.sampled_from([0.5, 0.0, -1.0]))),
       layout=ROTARY_LAYOUTS,
       rotary_dim=maybe(st.one_of(st.none(), st.sampled_from([2, 4])),
                        st.one_of(st.integers(-2, 10), bad_ints())),
       seq_axis=SEQ_AXES, offset=maybe(real_values(), bad_reals()),
       inverse=choose([False, True], [1]), out_kind=OUT_KINDS)
def test_apply_rotary(data, base, factor, layout, rotary_dim, seq_axis, offset, inverse,
                      out_kind):
    lead = data.draw(lead_shapes(min_dims=0, max_dims=4, max_rows=24))
    dim = data.draw(maybe(st.sampled_from([4, 6, 8]), st.integers(0, 9)))
    x = data.draw(arrays(lead + (dim,)))
    positions = data.draw(positions_for(lead))
    dtype = native(x.dtype) if is_float_data(x) else np.float32
    out = make_out(out_kind, x.shape, dtype, x)
    rd = dim if rotary_dim is None else rotary_dim
    valid = (is_float_data(x) and real_ok(factor) and float(factor) >= 1 and real_ok(base)
             and float(base) > 0 and layout in ("interleaved", "half")
             and (rotary_dim is None or int_ok(rotary_dim)) and dim >= 1 and int_ok(rd)
             and int(rd) % 2 == 0 and 2 <= int(rd) <= dim and real_ok(offset)
             and isinstance(inverse, bool))
    values = _call_positions(lead, positions, offset, seq_axis) if valid else None
    valid = valid and values is not None and out_ok(out, x.shape, dtype, may_be=x)[0]
    x0 = np.array(x, copy=True)
    snap = Snapshot(x, out, positions)
    outcome = call(pf.apply_rotary, x, positions, base=base, interpolation_factor=factor,
                   layout=layout, rotary_dim=rotary_dim, offset=offset, seq_axis=seq_axis,
                   inverse=inverse, out=out)
    if check(outcome, not valid, snap, written=(out,)):
        inv_freq = [w / float(factor) for w in ref.rope_inv_freq(int(rd), float(base))]
        want = ref.apply_rotary(x0, values, inv_freq, layout=layout, inverse=inverse)
        angle = float(np.abs(values).max() * max(inv_freq)) if values.size else 0.0
        assert_close(outcome.result, want, dtype, magnitude(x0) * 2, angle)


def _cache_reference(x, cos, sin, index_rows, half, inverse):
    """Rotate x (float64) by cos/sin rows given per row of x (already broadcast)."""
    x = np.asarray(x, dtype=np.float64)
    h = cos.shape[-1]
    c, s = index_rows(np.asarray(cos, np.float64)), index_rows(np.asarray(sin, np.float64))
    if inverse:
        s = -s
    out = x.copy()
    ia = np.arange(h) if half else 2 * np.arange(h)
    ib = ia + h if half else ia + 1
    a, b = x[..., ia], x[..., ib]
    out[..., ia] = a * c - b * s
    out[..., ib] = b * c + a * s
    return out


@st.composite
def cos_sin_args(draw, lead, dim):
    """(cos, sin, positions) for x with leading shape `lead` and last axis `dim`."""
    h = draw(maybe(st.integers(1, max(dim // 2, 1)), st.sampled_from([0, dim // 2 + 1])))
    dtype = draw(choose(["float32", "float64", ">f8"], ["int64"]))
    sin_dtype = draw(maybe(st.just(dtype), st.sampled_from(["float32", "float64"]), one_in=5))
    if draw(st.booleans()):  # table + positions form
        n = draw(st.integers(0, 8))
        cos = draw(arrays((n, h), dtype=dtype))
        sin = draw(arrays(draw(choose([(n, h)], [(n, h + 1)])), dtype=sin_dtype))
        positions = draw(positions_for(lead, allow_none=False, integral=True))
        if isinstance(positions, np.ndarray) and positions.dtype.kind in "iu" and draw(st.booleans()):
            positions = np.abs(positions.astype(np.int64)) % max(n, 1)
        return cos, sin, positions
    k = draw(st.integers(0, len(lead)))
    shape = tuple(1 if draw(st.booleans()) else m for m in lead[len(lead) - k:]) + (h,)
    cos = draw(arrays(shape, dtype=dtype))
    sin = draw(arrays(shape, dtype=sin_dtype))
    return cos, sin, None


def _cache_expectation(x, cos, sin, positions, lead):
    """(valid, index_rows function) for apply_rotary_cos_sin's cache arguments."""
    if not (is_float_data(cos) and is_float_data(sin)) or cos.shape != sin.shape:
        return False, None
    table = cos.dtype if cos.dtype == sin.dtype else np.float64  # mixed: used as float64
    if not table_ok(x.dtype, table):
        return False, None
    if cos.ndim < 1 or cos.shape[-1] < 1 or 2 * cos.shape[-1] > x.shape[-1]:
        return False, None
    h = cos.shape[-1]
    if positions is None:
        try:
            if np.broadcast_shapes(cos.shape[:-1], lead) != tuple(lead):
                return False, None
        except ValueError:
            return False, None
        return True, lambda t: np.broadcast_to(t, tuple(lead) + (h,))
    if cos.ndim != 2:
        return False, None
    parsed = positions_value(positions, lead, integral=True)
    if parsed is None:
        return False, None
    given = np.asarray(parsed[1])  # every position given is checked, even unused ones
    if given.size and (int(given.min()) < 0 or int(given.max()) >= cos.shape[0]):
        return False, None
    index = np.broadcast_to(given, lead)
    return True, lambda t: t[index.astype(np.intp)]


@FUZZ
@given(data=st.data(), layout=ROTARY_LAYOUTS, inverse=choose([False, True], ["yes"]),
       out_kind=maybe(OUT_KINDS, st.just("cos")))
def test_apply_rotary_cos_sin(data, layout, inverse, out_kind):
    lead = data.draw(lead_shapes(min_dims=0, max_dims=4, max_rows=24))
    dim = data.draw(maybe(st.sampled_from([2, 4, 6, 8]), st.integers(0, 8)))
    x = data.draw(arrays(lead + (dim,)))
    cos, sin, positions = data.draw(cos_sin_args(lead, dim))
    dtype = native(x.dtype) if is_float_data(x) else np.float32
    out = cos if out_kind == "cos" else make_out(out_kind, x.shape, dtype, x)
    valid = (is_float_data(x) and x.ndim >= 1 and layout in ("interleaved", "half")
             and isinstance(inverse, bool))
    index_rows = None
    if valid:
        valid, index_rows = _cache_expectation(x, cos, sin, positions, lead)
    valid = valid and out_ok(out, x.shape, dtype, may_be=x, must_not_overlap=(cos, sin))[0]
    x0 = np.array(x, copy=True)
    snap = Snapshot(x, cos, sin, out, positions)
    outcome = call(pf.apply_rotary_cos_sin, x, cos, sin, positions, layout=layout,
                   inverse=inverse, out=out)
    if check(outcome, not valid, snap, written=(out,)):
        want = _cache_reference(x0, cos, sin, index_rows, layout == "half", inverse)
        assert_close(outcome.result, want, dtype, magnitude(x0) * magnitude(cos, sin) * 4)


@FUZZ
@given(data=st.data(), layout=choose(["half", "interleaved"], ["x"]),
       outs=choose([("none", "none"), ("in_place", "in_place"), ("fresh", "fresh")],
                   [("k", "none"), ("cos", "none"), ("none", "wrong_shape")], one_in=4))
def test_apply_rotary_cos_sin_qk(data, layout, outs):
    lead = data.draw(lead_shapes(min_dims=1, max_dims=4, max_rows=24))
    dim = data.draw(maybe(st.sampled_from([2, 4, 6, 8]), st.integers(1, 8)))
    q = data.draw(arrays(lead + (dim,), dtype=data.draw(st.sampled_from(["float32", "float64"]))))
    k = data.draw(arrays(lead + (data.draw(choose([dim], [dim + 1])),),
                         dtype=data.draw(choose(["float32", "float64"], ["bool"]))))
    cos, sin, positions = data.draw(cos_sin_args(lead, dim))
    q_dtype, k_dtype = native(q.dtype), native(k.dtype) if is_float_data(k) else np.float32

    def make(kind, arr, dtype):
        return {"k": k, "cos": cos}.get(kind) if kind in ("k", "cos") else make_out(
            kind, arr.shape, dtype, arr)

    out_q, out_k = make(outs[0], q, q_dtype), make(outs[1], k, k_dtype)
    valid = is_float_data(k) and k.shape[-1] == dim and layout in ("half", "interleaved")
    q_rows = k_rows = None
    if valid:
        valid, q_rows = _cache_expectation(q, cos, sin, positions, lead)
    if valid:
        valid, k_rows = _cache_expectation(k, cos, sin, positions, k.shape[:-1])
    valid = (valid and out_ok(out_q, q.shape, q_dtype, may_be=q, must_not_overlap=(k, cos, sin))[0]
             and out_ok(out_k, k.shape, k_dtype, may_be=k,
                        must_not_overlap=(q, out_q, cos, sin))[0])
    q0, k0 = np.array(q, copy=True), np.array(k, copy=True)
    snap = Snapshot(q, k, cos, sin, out_q, out_k, positions)
    outcome = call(pf.apply_rotary_cos_sin_qk, q, k, cos, sin, positions, layout=layout,
                   out_q=out_q, out_k=out_k)
    if check(outcome, not valid, snap, written=(out_q, out_k)):
        for got, arr, rows, dtype in ((outcome.result[0], q0, q_rows, q_dtype),
                                      (outcome.result[1], k0, k_rows, k_dtype)):
            want = _cache_reference(arr, cos, sin, rows, layout == "half", False)
            assert_close(got, want, dtype, magnitude(arr) * magnitude(cos, sin) * 4)
