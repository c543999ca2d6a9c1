"""posenc_fast.vllm.rotary_embedding against vLLM's semantics, written here in plain NumPy.

vLLM's op (``forward_native`` and the CUDA kernel): token ``t`` at position
``p`` takes row ``p`` of ``cos_sin_cache`` = ``[cos | sin]``; in every head the
first ``rot_dim`` features rotate as pairs ``(i, i + rot_dim/2)`` (neox) or
``(2i, 2i+1)``, ``(a, b) -> (a*cos - b*sin, b*cos + a*sin)``, the rest pass
through; query and key are updated in place.  torch cases skip without torch.
"""

import os
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import general_path_only, int64_inside, server_qkv, untouched
import posenc_fast as pf
from posenc_fast import vllm

# (positions.ndim, query split into (heads, head_size))
FORMS = {"(tokens, heads*head_size)": (1, False), "(batch, seq, heads*head_size)": (2, False),
         "(tokens, heads, head_size)": (1, True), "(batch, seq, heads, head_size)": (2, True)}
EPS = {np.dtype(np.float32): 2.0**-23, np.dtype(np.float64): 2.0**-52}


def reference(positions, x, head_size, cache, is_neox):
    """vLLM's rotation of x in float64, one pair at a time: (result, error bound per entry).

    The bound is what three roundings in x's dtype allow: eps * (|a*cos| + |b*sin|)
    for a*cos - b*sin, the same for b*cos + a*sin; features that pass through must be
    exact (bound 0).
    """
    half = cache.shape[1] // 2
    flat = np.asarray(positions).reshape(-1)
    heads = x.shape[-2] if x.ndim == np.ndim(positions) + 2 else x.shape[-1] // head_size
    rows = np.array(x, dtype=np.float64).reshape(flat.size, heads, head_size)
    result, bound = rows.copy(), np.zeros_like(rows)
    for t, p in enumerate(flat):
        cos, sin = cache[p, :half].astype(np.float64), cache[p, half:].astype(np.float64)
        for h in range(rows.shape[1]):
            for i in range(half):
                ia, ib = (i, i + half) if is_neox else (2 * i, 2 * i + 1)
                a, b = rows[t, h, ia], rows[t, h, ib]
                result[t, h, ia] = a * cos[i] - b * sin[i]
                result[t, h, ib] = b * cos[i] + a * sin[i]
                bound[t, h, ia] = abs(a * cos[i]) + abs(b * sin[i])
                bound[t, h, ib] = abs(b * cos[i]) + abs(a * sin[i])
    eps = EPS[np.dtype(x.dtype)]
    return result.reshape(x.shape), eps * bound.reshape(x.shape)


def assert_matches_reference(got, before, positions, head_size, cache, is_neox):
    expected, bound = reference(positions, before, head_size, cache, is_neox)
    error = np.abs(got.astype(np.float64) - expected)
    assert (error <= bound).all(), f"worst excess {np.max(error - bound):.3g}"


def data(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def make_case(rng, form, tokens, heads, kv_heads, head_size, rot_dim, max_position, dtype):
    """positions, query, key (or None) and cache of one call, as NumPy arrays."""
    positions_ndim, split = FORMS[form]
    lead = (tokens,) if positions_ndim == 1 else (2, tokens)
    positions = rng.integers(0, max_position, lead)

    def qk_shape(h):
        return lead + ((h, head_size) if split else (h * head_size,))

    query = data(rng, qk_shape(heads), dtype)
    key = None if kv_heads is None else data(rng, qk_shape(kv_heads), dtype)
    return positions, query, key, data(rng, (max_position, rot_dim), dtype)


def as_kind(kind, *arrays):
    if kind == "numpy":
        return arrays
    torch = pytest.importorskip("torch")
    return tuple(None if a is None else torch.from_numpy(a) for a in arrays)


@st.composite
def calls(draw):
    head_size = draw(st.integers(2, 12))
    return dict(form=draw(st.sampled_from(sorted(FORMS))), tokens=draw(st.integers(0, 5)),
                heads=draw(st.integers(1, 4)), kv_heads=draw(st.none() | st.integers(1, 3)),
                head_size=head_size, rot_dim=2 * draw(st.integers(1, head_size // 2)),
                max_position=draw(st.integers(1, 20)),
                dtype=draw(st.sampled_from([np.float32, np.float64])))


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@given(call=calls(), is_neox=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_matches_vllm_semantics(kind, call, is_neox, seed):
    positions, query, key, cache = make_case(np.random.default_rng(seed), **call)
    q_before = query.copy()
    k_before = None if key is None else key.copy()
    args = as_kind(kind, positions, query, key, cache)
    assert vllm.rotary_embedding(args[0], args[1], args[2], call["head_size"], args[3],
                                 is_neox) is None
    # query/key are the tensors' memory: the rotation landed where the caller looks.
    assert_matches_reference(query, q_before, positions, call["head_size"], cache, is_neox)
    if key is not None:
        assert_matches_reference(key, k_before, positions, call["head_size"], cache, is_neox)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("is_neox", [True, False])
def test_bitwise_the_native_formula(dtype, is_neox):
    # forward_native computes o1 = x1*cos - x2*sin, o2 = x2*cos + x1*sin in x's dtype:
    # posenc_fast rounds the same three times, so the results are identical.
    rng = np.random.default_rng(7)
    positions, query, key, cache = make_case(rng, "(tokens, heads*head_size)", 64, 4, 2, 32,
                                             24, 4096, dtype)
    expected = [native_formula(positions, x, 32, cache, is_neox) for x in (query, key)]
    vllm.rotary_embedding(positions, query, key, 32, cache, is_neox)
    assert np.array_equal(query, expected[0]) and np.array_equal(key, expected[1])


def native_formula(positions, x, head_size, cache, is_neox):
    """vLLM's forward_native with NumPy ops in x's dtype (vectorised, not a loop)."""
    half = cache.shape[1] // 2
    heads = x.reshape(positions.size, x.size // (positions.size * head_size), head_size).copy()
    cos, sin = cache[positions.reshape(-1), None, :half], cache[positions.reshape(-1), None, half:]
    rot = heads[..., :2 * half]
    x1, x2 = (rot[..., :half], rot[..., half:]) if is_neox else (rot[..., ::2], rot[..., 1::2])
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if is_neox:
        rot[..., :half], rot[..., half:] = o1, o2
    else:
        rot[..., ::2], rot[..., 1::2] = o1, o2
    return heads.reshape(x.shape)


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_q_and_k_rotated_where_a_server_holds_them(is_neox, dtype):
    # vLLM's models pass slices of the fused qkv projection (token stride (heads + 2 *
    # kv_heads) * head_size) and heads padded past head_size: rotated in that memory.
    rng = np.random.default_rng(5)
    tokens, heads, kv_heads, head_size = 7, 4, 2, 16
    positions = rng.integers(0, 50, tokens)
    cache = data(rng, (50, 12), dtype)
    qkv = data(rng, (tokens, (heads + 2 * kv_heads) * head_size), dtype)
    padded = data(rng, (tokens, heads, head_size + 8), dtype)
    for query, key in ((qkv[:, :heads * head_size], qkv[:, heads * head_size:][:, :kv_heads * head_size]),
                       (padded[..., :head_size], _strided(data(rng, (tokens, kv_heads * head_size), dtype)))):
        memory = [a.base.copy() for a in (query, key)]
        q_before, k_before = query.copy(), key.copy()
        vllm.rotary_embedding(positions, query, key, head_size, cache, is_neox)
        assert_matches_reference(query, q_before, positions, head_size, cache, is_neox)
        assert_matches_reference(key, k_before, positions, head_size, cache, is_neox)
        query[...], key[...] = q_before, k_before  # then nothing else of the buffers changed
        for a, before in zip((query, key), memory):
            assert np.array_equal(a.base, before)


@pytest.mark.parametrize("is_neox", [True, False])
def test_rope_dim_offset_rotates_the_features_from_there_and_inverse_undoes_it(is_neox):
    # DeepSeek-V4: the last rot_dim features of each head rotate; the rest pass through.
    rng = np.random.default_rng(6)
    positions = rng.integers(0, 30, 5)
    angles = np.arange(30)[:, None] * 10000.0 ** (-np.arange(0, 8, 2) / 8)
    cache = np.concatenate((np.cos(angles), np.sin(angles)), 1)
    query, key = data(rng, (5, 3 * 16), np.float64), data(rng, (5, 16), np.float64)
    q_before, k_before = query.copy(), key.copy()
    vllm.rotary_embedding(positions, query, key, 16, cache, is_neox, rope_dim_offset=8)
    for got, before in ((query, q_before), (key, k_before)):
        got, before = got.reshape(5, -1, 16), before.reshape(5, -1, 16)
        assert np.array_equal(got[..., :8], before[..., :8])
        assert_matches_reference(got[..., 8:].copy(), before[..., 8:].copy(), positions, 8,
                                 cache, is_neox)
    vllm.rotary_embedding(positions, query, key, 16, cache, is_neox, 8, True)
    np.testing.assert_allclose(query, q_before, rtol=0, atol=1e-14)
    np.testing.assert_allclose(key, k_before, rtol=0, atol=1e-14)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_a_float32_cache_for_half_data_rounds_once(dtype):
    rng = np.random.default_rng(8)
    positions = rng.integers(0, 4000, 6)
    angles = np.arange(4000)[:, None] * 10000.0 ** (-np.arange(0, 16, 2) / 16)
    cache = np.concatenate((np.cos(angles), np.sin(angles)), 1).astype(np.float32)
    query = data(rng, (6, 2 * 16), dtype)
    before = query.astype(np.float64)
    vllm.rotary_embedding(positions, query, None, 16, cache, True)
    exact, _ = reference(positions, before, 16, cache.astype(np.float64), True)
    # float32 arithmetic from the float32 cache, one rounding: within half an ulp of the
    # exact rotation by that cache, plus float32's own error
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(exact), 1e-30))) -
                  (7 if dtype == ml_dtypes.bfloat16 else 10))
    assert (np.abs(query.astype(np.float64) - exact) <= 0.5 * ulp + 1e-6).all()
    with pytest.raises(TypeError, match="query's dtype float16 or float32, got float64"):
        vllm.rotary_embedding(positions, query.astype(np.float16), None, 16,
                              cache.astype(np.float64), True)


def test_features_past_rot_dim_and_other_tokens_untouched():
    rng = np.random.default_rng(3)
    positions, query, key, cache = make_case(rng, "(tokens, heads, head_size)", 6, 3, 1, 16, 6,
                                             9, np.float32)
    before = query.copy()
    vllm.rotary_embedding(positions, query, key, 16, cache, True)
    assert untouched(before[..., 6:], query[..., 6:])
    assert not np.array_equal(before[..., :6], query[..., :6])


def test_ndarray_subclasses_are_rotated_where_they_lie(tmp_path):
    # np.matrix (which refuses the reshapes into heads) and np.memmap: rotated through plain views
    rng = np.random.default_rng(4)
    positions, query, key, cache = make_case(rng, "(tokens, heads*head_size)", 5, 2, 1, 16, 16,
                                             9, np.float32)
    expected_q, expected_k = query.copy(), key.copy()
    vllm.rotary_embedding(positions, expected_q, expected_k, 16, cache, True)
    mapped = np.memmap(tmp_path / "key", np.float32, "w+", shape=key.shape)
    mapped[...] = key
    matrix = np.asmatrix(query.copy())
    vllm.rotary_embedding(positions, matrix, mapped, 16, cache, True)
    assert type(matrix) is np.matrix and np.array_equal(np.asarray(matrix), expected_q)
    assert np.array_equal(np.asarray(mapped), expected_k)


class RecordingKernels:
    """The kernels module, recording what rotate_tokens_fast was given and answered."""

    def __init__(self, kernels, seen):
        self._kernels, self._seen = kernels, seen

    def __getattr__(self, name):
        return getattr(self._kernels, name)

    def rotate_tokens_fast(self, *args):
        self._seen["fast"] = self._kernels.rotate_tokens_fast(*args)
        return self._seen["fast"]


def test_arrays_reach_the_kernel_without_copies(monkeypatch):
    torch = pytest.importorskip("torch")
    seen = {}

    def recording(q, k, cos, sin, positions, **kwargs):
        seen.update(q=q, k=k, cos=cos, sin=sin, **kwargs)
        return real(q, k, cos, sin, positions, **kwargs)

    real = vllm.apply_rotary_cos_sin_qk
    monkeypatch.setattr(vllm, "apply_rotary_cos_sin_qk", recording)
    query, key = torch.randn(5, 4 * 8), torch.randn(5, 2 * 8)
    cache = torch.randn(10, 8)
    monkeypatch.setattr(vllm, "kernels", RecordingKernels(vllm.kernels, seen))
    want_q, want_k = query.clone(), key.clone()
    with general_path_only():
        vllm.rotary_embedding(torch.arange(5), want_q, want_k, 8, cache, False)
    assert seen.pop("fast") is False and "q" in seen
    seen.clear()
    before = query.clone()
    vllm.rotary_embedding(torch.arange(5), query, key, 8, cache, False)
    assert seen.pop("fast") is True and "q" not in seen  # the compiled path took it, in the tensors' memory
    assert torch.equal(query, want_q) and torch.equal(key, want_k) and not torch.equal(query, before)
    with general_path_only():
        vllm.rotary_embedding(torch.arange(5), query, key, 8, cache, False)
    assert seen["out_q"] is seen["q"] and seen["out_k"] is seen["k"]
    assert np.shares_memory(seen["q"], query.numpy()) and seen["q"].shape == (5, 4, 8)
    assert np.shares_memory(seen["k"], key.numpy()) and seen["k"].shape == (5, 2, 8)
    assert np.shares_memory(seen["cos"], cache.numpy())
    assert np.shares_memory(seen["sin"], cache.numpy())


def test_inference_mode_and_no_grad_tensors():
    torch = pytest.importorskip("torch")
    positions, query, key, cache = make_case(np.random.default_rng(4),
                                             "(batch, seq, heads*head_size)", 3, 2, 2, 8, 8, 5,
                                             np.float32)
    expected = [native_formula(positions, x, 8, cache, True) for x in (query, key)]
    with torch.inference_mode():
        q, k = torch.tensor(query), torch.tensor(key)
        vllm.rotary_embedding(torch.tensor(positions), q, k, 8, torch.tensor(cache), True)
    assert np.array_equal(q.numpy(), expected[0]) and np.array_equal(k.numpy(), expected[1])
    q = torch.tensor(query, requires_grad=True)
    with torch.no_grad():
        vllm.rotary_embedding(torch.tensor(positions), q, None, 8, torch.tensor(cache), True)
    assert np.array_equal(q.detach().numpy(), expected[0])


def test_importing_never_imports_torch():
    code = "import sys, posenc_fast.vllm; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert result.stdout.strip() == "False", result.stderr


def test_works_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails
    positions, query, key, cache = make_case(np.random.default_rng(5),
                                             "(tokens, heads*head_size)", 2, 1, 1, 4, 4, 3,
                                             np.float64)
    before = query.copy()
    vllm.rotary_embedding(positions, query, key, 4, cache, True)
    assert_matches_reference(query, before, positions, 4, cache, True)


# ---------------------------------------------------------------------------
# bad input: the right error, nothing written


def valid_call():
    """A valid call's arguments: positions (4,), query (4, 2*8), key (4, 8), cache (6, 8)."""
    rng = np.random.default_rng(11)
    return dict(positions=np.array([0, 5, 2, 1]), query=data(rng, (4, 16), np.float32),
                key=data(rng, (4, 8), np.float32), head_size=8,
                cos_sin_cache=data(rng, (6, 8), np.float32), is_neox=True)


def _strided(a):
    wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    wide[..., :a.shape[-1]] = a
    return wide[..., :a.shape[-1]]


def _read_only(a):
    a.flags.writeable = False
    return a


def _f32(*shape):
    return np.ones(shape, np.float32)


def _positions_in(name):
    """The call's positions (valid values) written into the memory of its argument `name`."""
    return lambda call: int64_inside(call[name], call["positions"])


# name: (change to the valid call: a value, or a function of the call; error; message)
BAD_NUMPY = {
    "position past the cache": (dict(positions=np.array([0, 6, 1, 1])), ValueError,
                                "positions must lie in [0, 6)"),
    "negative position": (dict(positions=np.array([0, -1, 1, 1])), ValueError,
                          "positions must lie in"),
    "float positions": (dict(positions=np.arange(4.0)), TypeError,
                        "positions must be an integer"),
    "positions 3-D": (dict(positions=np.zeros((1, 1, 4), int)), ValueError, "positions must"),
    "token counts differ": (dict(positions=np.arange(3)), ValueError, "query must have shape"),
    "(batch, seq) positions, token-major query": (dict(positions=np.zeros((2, 2), int)),
                                                  ValueError, "query must have shape"),
    "odd rot_dim": (dict(cos_sin_cache=_f32(6, 7)), ValueError, "rot_dim"),
    "rot_dim 0": (dict(cos_sin_cache=_f32(6, 0)), ValueError, "rot_dim"),
    "rot_dim above head_size": (dict(cos_sin_cache=_f32(6, 10)), ValueError, "head_size = 8"),
    "cache 3-D": (dict(cos_sin_cache=_f32(1, 6, 8)), ValueError, "cos_sin_cache must have shape"),
    "cache float64": (dict(cos_sin_cache=np.ones((6, 8))), TypeError, "cos_sin_cache must have"),
    "hidden not a multiple of head_size": (dict(head_size=6, cos_sin_cache=_f32(6, 6)),
                                           ValueError, "head_size = 6, got (4, 16)"),
    "split heads of another size": (dict(query=_f32(4, 4, 4)), ValueError,
                                    "head_size = 8, got (4, 4, 4)"),
    "rope_dim_offset past the head": (dict(rope_dim_offset=2), ValueError,
                                      "rot_dim <= head_size - rope_dim_offset = 6"),
    "rope_dim_offset negative": (dict(rope_dim_offset=-1), ValueError,
                                 "rope_dim_offset must be >= 0"),
    "inverse a string": (dict(inverse="yes"), TypeError, "inverse must be a bool"),
    "float32 cache for float64 data": (dict(query=np.ones((4, 16)), key=np.ones((4, 8))),
                                       TypeError, "cos_sin_cache must have query's dtype float64,"),
    "key of another dtype": (dict(key=np.ones((4, 8))), TypeError, "key must have query's dtype"),
    "float8 query": (dict(query=np.ones((4, 16), ml_dtypes.float8_e4m3fn)), TypeError,
                     "float16, bfloat16, float32 or float64"),
    "query a list": (dict(query=[[0.0] * 16] * 4), TypeError, "query must be a numpy.ndarray"),
    "query read-only": (dict(query=lambda c: _read_only(c["query"])), ValueError,
                        "query must be writeable"),
    "query byte-swapped": (dict(query=lambda c: c["query"].astype(">f4")), ValueError,
                           "native byte order"),
    "key inside query": (dict(key=lambda c: c["query"].reshape(-1)[:32].reshape(4, 8)),
                         ValueError, "query and key share memory"),
    "cache inside query": (dict(cos_sin_cache=lambda c: c["query"].reshape(-1)[:48].reshape(6, 8)),
                           ValueError, "query shares memory with cos_sin_cache"),
    "positions inside query": (dict(positions=_positions_in("query")), ValueError,
                               "positions shares memory with query"),
    "positions inside key": (dict(positions=_positions_in("key")), ValueError, "positions shares memory with key"),
    "head_size past int64": (dict(head_size=2**70), ValueError, "head_size = 1180591620717411303424"),
    "rope_dim_offset past int64": (dict(rope_dim_offset=2**70), ValueError, "rope_dim_offset = 1180591620717411303424"),
    "head_size a bool": (dict(head_size=True), TypeError, "head_size must be an integer"),
    "head_size 0": (dict(head_size=0), ValueError, "head_size must be >= 1"),
    "is_neox a string": (dict(is_neox="neox"), TypeError, "is_neox must be a bool"),
}


@pytest.mark.parametrize("case", sorted(BAD_NUMPY))
def test_bad_input_refused_with_nothing_written(case):
    change, error, words = BAD_NUMPY[case]
    call = valid_call()
    for name, value in change.items():
        call[name] = value(call) if callable(value) else value
    before = {name: np.array(a, copy=True) for name, a in call.items()
              if name in ("query", "key", "cos_sin_cache")}
    with pytest.raises(error, match=re.escape(words)):
        vllm.rotary_embedding(**call)
    for name, a in before.items():
        assert untouched(a, np.asarray(call[name])), f"{name} was written"


def test_arrays_of_more_than_32_axes_refused_by_the_checks():
    """NumPy 2 makes arrays of up to 64 axes; the compiled paths read at most 32 and leave others to the checks.

    Without that limit the reader writes past a stack array: a build with
    ``-fsanitize=address`` fails here (a plain build may not notice).
    """
    if np.lib.NumpyVersion(np.__version__) < "2.0.0":
        pytest.skip("NumPy 1 makes arrays of at most 32 axes: no such array exists there")
    call = valid_call()
    value, weight = np.ones((4, 8), np.float32), np.ones(8, np.float32)
    calls = {
        "rotary_embedding": (vllm.rotary_embedding, call),
        "fused_qk_norm_rope": (vllm.fused_qk_norm_rope, dict(call, q_weight=weight, k_weight=weight)),
        "apply_qk_to_cache": (vllm.apply_qk_to_cache, dict(
            call, value=value, key_cache=np.zeros((2, 4, 1, 8), np.float32),
            value_cache=np.zeros((2, 4, 1, 8), np.float32), slot_mapping=np.arange(4))),
    }
    for function, args in calls.values():
        function(**{name: np.array(a, copy=True) if isinstance(a, np.ndarray) else a for name, a in args.items()})
        for name, a in args.items():
            if isinstance(a, np.ndarray) and a.ndim:
                deep = dict(args, **{name: a.reshape((1,) * (64 - a.ndim) + a.shape)})
                with pytest.raises((TypeError, ValueError)):
                    function(**deep)


def _TensorSubclass(torch):
    class Subclass(torch.Tensor):  # what a subclass holds is its own business (a compiler's fake tensor)
        pass
    return Subclass


def test_bad_torch_input_refused_with_nothing_written():
    torch = pytest.importorskip("torch")
    base = {name: (torch.from_numpy(a) if isinstance(a, np.ndarray) else a)
            for name, a in valid_call().items()}
    qkv = torch.zeros(4, 16 + 8 + 8)
    cases = [
        (dict(query=qkv[:, :16].t()), ValueError, "query must have shape"),
        (dict(query=base["query"].clone().requires_grad_()), ValueError, "requires grad"),
        (dict(query=base["query"].to(torch.bfloat16)), TypeError, "key must have query's dtype"),
        (dict(query=base["query"].to(torch.int16)), TypeError, "float16, bfloat16, float32"),
        (dict(query=base["query"].numpy()), TypeError, "all torch tensors or all NumPy"),
        (dict(positions=base["positions"].numpy()), TypeError, "positions must be a torch"),
        (dict(positions=torch.tensor([0, 9, 1, 1])), ValueError, "positions must lie in"),
        (dict(query=base["query"].clone().as_subclass(_TensorSubclass(torch))), TypeError, "plain torch.Tensor"),
        (dict(cos_sin_cache=torch.empty(2**40, 2**20, 0, 8)), ValueError,
         "cos_sin_cache of shape .* cannot be viewed as a NumPy array"),  # a size NumPy cannot hold
    ]
    for change, error, words in cases:
        call = dict(base, **change)
        before = {name: call[name].detach().clone() for name in ("query", "key")
                  if isinstance(call[name], torch.Tensor)}
        with pytest.raises(error, match=words):
            vllm.rotary_embedding(**call)
        for name, t in before.items():
            assert torch.equal(t, call[name].detach()), f"{name} was written ({words})"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_torch_half_tensors_rotate_in_place_as_their_numpy_views(dtype):
    torch = pytest.importorskip("torch")
    call = valid_call()
    tdtype = getattr(torch, dtype)
    tensors = {name: (torch.from_numpy(a).to(tdtype) if name != "positions" else
                      torch.from_numpy(a)) if isinstance(a, np.ndarray) else a
               for name, a in call.items()}
    arrays = {name: (a.view(torch.int16).numpy().view(
        ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16).copy()
        if isinstance(a, torch.Tensor) and name != "positions" else
        (a.numpy() if isinstance(a, torch.Tensor) else a)) for name, a in tensors.items()}
    query_memory = tensors["query"].data_ptr()
    vllm.rotary_embedding(**tensors)
    vllm.rotary_embedding(**arrays)
    assert tensors["query"].data_ptr() == query_memory and tensors["query"].dtype == tdtype
    for name in ("query", "key"):
        got = tensors[name].view(torch.int16).numpy()
        assert np.array_equal(got, arrays[name].view(np.int16))



@given(seed=st.integers(0, 2**32 - 1), layout=st.sampled_from(["contiguous", "fused qkv", "padded"]),
       dtype=st.sampled_from(["float32", "float64", "bfloat16", "float16"]), is_neox=st.booleans(),
       float32_cache=st.booleans(), weight_dtype=st.sampled_from(["float32", "float64", "bfloat16"]),
       weight_offset=st.sampled_from([0.0, 1]))
def test_the_compiled_norm_equals_the_general_path_bitwise(seed, layout, dtype, is_neox, float32_cache,
                                                           weight_dtype, weight_offset):
    # fused_qk_norm_rope's compiled path (query and key where the server holds them, a half-type
    # cache's rows widened) against the general path, switched off
    dtype = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    weight_dtype = np.dtype(ml_dtypes.bfloat16 if weight_dtype == "bfloat16" else weight_dtype)
    rng = np.random.default_rng(seed)
    tokens, heads, kv_heads, head_size = int(rng.integers(0, 6)), 3, 2, 16
    positions = rng.integers(0, 40, tokens)
    cache_dtype = np.float32 if float32_cache and dtype.itemsize == 2 else dtype
    cache = data(rng, (40, 2 * int(rng.integers(1, head_size // 2 + 1))), cache_dtype)
    query, key, _ = server_qkv(rng, layout, dtype, tokens, heads, kv_heads, head_size)
    weights = [data(rng, head_size, weight_dtype) for _ in range(2)]
    args = (*weights, head_size, cache, is_neox, 1e-5, weight_offset)
    general = [a.copy() for a in (query, key)]
    with general_path_only():
        vllm.fused_qk_norm_rope(positions, *general, *args)
    took = vllm.kernels.fused_qk_norm_rope_fast(positions, query, key, *args)
    assert took or tokens == 0  # no token: either path does nothing
    for got, want in zip((query, key), general):
        assert got.tobytes() == want.tobytes()


@given(seed=st.integers(0, 2**32 - 1), layout=st.sampled_from(["contiguous", "fused qkv", "padded"]),
       dtype=st.sampled_from(["float32", "float64", "bfloat16", "float16"]),
       offset=st.sampled_from([0, 4]), inverse=st.booleans(), is_neox=st.booleans(),
       with_key=st.booleans(), float32_cache=st.booleans())
def test_the_compiled_path_equals_the_general_path_bitwise(seed, layout, dtype, offset, inverse,
                                                           is_neox, with_key, float32_cache):
    dtype = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    rng = np.random.default_rng(seed)
    tokens, heads, kv_heads, head_size = int(rng.integers(0, 6)), 3, 2, 16
    positions = rng.integers(0, 40, tokens)
    cache_dtype = np.float32 if float32_cache and dtype.itemsize == 2 else dtype
    cache = data(rng, (40, 2 * int(rng.integers(1, (head_size - offset) // 2 + 1))), cache_dtype)
    query, key, _ = server_qkv(rng, layout, dtype, tokens, heads, kv_heads, head_size)
    key = key if with_key else None
    args = (head_size, cache, is_neox, offset, inverse)
    general = [None if a is None else a.copy() for a in (query, key)]
    with general_path_only():
        vllm.rotary_embedding(positions, general[0], general[1], *args)
    took = vllm.kernels.rotate_tokens_fast(positions, query, key, head_size, cache, is_neox, offset, inverse)
    assert took or tokens == 0  # no token: either path does nothing
    for got, want in zip((query, key), general):
        assert want is None or got.tobytes() == want.tobytes()


def test_a_prefill_takes_the_compiled_path_on_threads_bitwise_the_general_path():
    # 4096 tokens: the token walk splits them among threads, each token by one (the same bits)
    rng = np.random.default_rng(6)
    positions = rng.integers(0, 5000, 4096)
    cache = data(rng, (5000, 48), np.float32)
    query, key, _ = server_qkv(rng, "fused qkv", np.float32, 4096, 4, 2, 64)
    general = [query.copy(), key.copy()]
    with general_path_only():
        vllm.rotary_embedding(positions, *general, 64, cache, True)
    before = pf.get_num_threads()
    try:
        for threads in (1, 3):
            pf.set_num_threads(threads)
            q, k = query.copy(), key.copy()
            assert vllm.kernels.rotate_tokens_fast(positions, q, k, 64, cache, True, 0, False)
            assert q.tobytes() == general[0].tobytes() and k.tobytes() == general[1].tobytes()
    finally:
        pf.set_num_threads(before)
