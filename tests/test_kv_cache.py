"""RotaryEmbedding.apply_qk_to_cache: against apply + a NumPy scatter, and its refusals."""


import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import posenc_fast as pf
from posenc_fast import _kv_cache, reference
from posenc_fast._validate import BFLOAT16

from helpers import taking, untouched

CACHE_DTYPES = [np.float32, np.float16, BFLOAT16]
ROUTES = ["fast", "general"]


@pytest.fixture(params=ROUTES)
def route(request):
    with taking(request.param):
        yield request.param


def bits(a):
    return a.view(np.uint8)


def case(tokens=6, heads=4, kv_heads=2, dim=32, blocks=3, block_size=4, dtype=np.float32,
         cache_dtype=np.float32, seed=0):
    """q, k, v, positions, slots (one -1) and NaN-filled caches."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((tokens, h, dim)).astype(dtype)
               for h in (heads, kv_heads, kv_heads))
    positions = rng.integers(0, 300, tokens)
    slots = rng.permutation(blocks * block_size)[:tokens]
    slots[tokens // 2] = -1
    k_cache = np.full((blocks, block_size, kv_heads, dim), np.nan, cache_dtype)
    return q, k, v, positions, slots, k_cache, k_cache.copy()


def expected(rope, q, k, v, positions, slots, k_cache, v_cache):
    """apply, then a NumPy scatter of k's rotated rows and v's rows into copies of the caches."""
    rows = positions[:, None]
    want_q, want_k = rope.apply(q, rows), rope.apply(k, rows)
    want_kc, want_vc = k_cache.copy(), v_cache.copy()
    used = slots >= 0
    flat_k = want_kc.reshape(-1, *k_cache.shape[2:])
    flat_v = want_vc.reshape(-1, *k_cache.shape[2:])
    flat_k[slots[used]] = want_k[used].astype(k_cache.dtype)
    flat_v[slots[used]] = v[used].astype(k_cache.dtype)
    return want_q, want_kc, want_vc


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_float32_data_any_cache_is_apply_then_scatter(cache_dtype, layout, route):
    rope = pf.RotaryEmbedding(32, rotary_dim=24, layout=layout)
    q, k, v, positions, slots, k_cache, v_cache = case(cache_dtype=cache_dtype)
    want = expected(rope, q, k, v, positions, slots, k_cache, v_cache)
    k_before, v_before = k.copy(), v.copy()
    got_q = rope.apply_qk_to_cache(q, k, v, positions, k_cache, v_cache, slots)
    for got, w in zip((got_q, k_cache, v_cache), want):
        assert bits(got).tobytes() == bits(w).tobytes()  # NaN slots untouched too
    assert untouched(k_before, k) and untouched(v_before, v)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, BFLOAT16])
def test_all_of_one_dtype_is_direct(dtype, route):
    rope = pf.RotaryEmbedding(32, layout="half")
    q, k, v, positions, slots, k_cache, v_cache = case(dtype=dtype, cache_dtype=dtype)
    want = expected(rope, q, k, v, positions, slots, k_cache, v_cache)
    with taking(route):
        got_q = rope.apply_qk_to_cache(q, k, v, positions, k_cache, v_cache, slots)
    for got, w in zip((got_q, k_cache, v_cache), want):
        assert bits(got).tobytes() == bits(w).tobytes()


def _layouts(blocks, block_size, kv_heads, dim, dtype):
    """(name, key cache, value cache): the same logical (num_blocks, block_size, kv_heads, dim)
    caches in the memory orders servers use, NaN-filled."""
    nan = np.array(np.nan, dtype)
    flash = (np.full((blocks, block_size, kv_heads, dim), nan),) * 2
    hnd = [np.full((blocks, kv_heads, block_size, dim), nan).transpose(0, 2, 1, 3) for _ in "kv"]
    one = np.full((2, blocks, kv_heads, block_size, dim), nan).transpose(0, 1, 3, 2, 4)
    padded = [np.full((blocks, block_size, kv_heads, dim + 8), nan)[..., :dim] for _ in "kv"]
    return [("flash", flash[0], flash[1].copy()), ("blocks, heads, offsets", *hnd),
            ("one tensor (2, blocks, heads, offsets, dim)", one[0], one[1]),
            ("padded rows", *padded)]


@pytest.mark.parametrize("cache_dtype", [np.float32, BFLOAT16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_every_cache_layout_gets_the_flash_layouts_rows(cache_dtype, layout, route):
    # A layout is named by the view's axes (num_blocks, block_size, kv_heads, dim); its
    # strides say where each row lies. Rows bitwise those of the flash layout, nothing
    # else of the memory written.
    rope = pf.RotaryEmbedding(32, rotary_dim=24, layout=layout)
    q, k, v, positions, slots, _, _ = case(cache_dtype=cache_dtype)
    results = []
    for name, k_cache, v_cache in _layouts(3, 4, 2, 32, cache_dtype):
        caches = (k_cache, v_cache)
        memory = {id(m): m for m in (c.base if c.base is not None else c for c in caches)}
        before = {key: bits(m).copy() for key, m in memory.items()}
        results.append((name, rope.apply_qk_to_cache(q.copy(), k, v, positions, k_cache,
                                                      v_cache, slots),
                        np.ascontiguousarray(k_cache), np.ascontiguousarray(v_cache)))
        for key, m in memory.items():
            inside = np.zeros(m.nbytes, bool)  # the bytes of the caches' elements
            for c in caches:
                start = c.ctypes.data - m.ctypes.data
                if 0 <= start < m.nbytes:
                    np.lib.stride_tricks.as_strided(inside[start:], c.shape + (c.itemsize,),
                                                    c.strides + (1,), writeable=True)[...] = True
            assert (bits(m).reshape(-1)[~inside].tobytes()
                    == before[key].reshape(-1)[~inside].tobytes()), name
    for name, *arrays in results[1:]:
        for got, want in zip(arrays, results[0][1:]):
            assert bits(got).tobytes() == bits(want).tobytes(), name


def test_against_the_float64_reference():
    rope = pf.RotaryEmbedding(16, layout="interleaved", base=500.0)
    q, k, v, positions, slots, k_cache, v_cache = case(dim=16, dtype=np.float64,
                                                       cache_dtype=np.float64)
    got_q = rope.apply_qk_to_cache(q, k, v, positions, k_cache, v_cache, slots)
    inv_freq = list(rope.inv_freq)
    np.testing.assert_allclose(got_q, reference.apply_rotary(q, positions[:, None], inv_freq),
                               rtol=0, atol=1e-12)
    used = slots >= 0
    want_k = reference.apply_rotary(k[used], positions[used, None], inv_freq)
    np.testing.assert_allclose(k_cache.reshape(-1, 2, 16)[slots[used]], want_k, rtol=0,
                               atol=1e-12)


def test_out_q_in_place_and_given(route):
    rope = pf.RotaryEmbedding(32)
    q, k, v, positions, slots, k_cache, v_cache = case()
    want_q = rope.apply(q, positions[:, None])
    out = np.empty_like(q)
    assert rope.apply_qk_to_cache(q, k, v, positions, k_cache, v_cache, slots, out_q=out) is out
    assert np.array_equal(out, want_q)
    assert rope.apply_qk_to_cache(q, k, v, positions, k_cache, v_cache, slots, out_q=q) is q
    assert np.array_equal(q, want_q)


def test_strided_inputs_and_out_q():
    rope = pf.RotaryEmbedding(32, layout="half")
    q, k, v, positions, slots, k_cache, v_cache = case()
    wide = np.zeros(q.shape[:-1] + (64,), np.float32)
    wide[..., ::2] = q
    wide_k = np.zeros(k.shape[:-1] + (64,), np.float32)
    wide_k[..., ::2] = k
    out = np.zeros_like(wide)
    want = expected(rope, q, k, v, positions, slots, k_cache, v_cache)
    got = rope.apply_qk_to_cache(wide[..., ::2], wide_k[..., ::2], v, positions, k_cache,
                                 v_cache, slots, out_q=out[..., 1::2])
    assert np.array_equal(got, want[0]) and np.array_equal(out[..., 1::2], want[0])
    assert not out[..., ::2].any()
    assert untouched(k_cache, want[1]) and untouched(v_cache, want[2])


@pytest.mark.parametrize("positions", [[-3, 0, 5, 9], [0, 5, 9, 2**40]])
def test_positions_the_cache_does_not_cover_take_a_table(positions):
    rope = pf.RotaryEmbedding(32, layout="half")
    q, k, v, _, slots, k_cache, v_cache = case(tokens=4)
    positions = np.array(positions)
    want = expected(rope, q, k, v, positions, slots, k_cache, v_cache)
    got_q = rope.apply_qk_to_cache(q, k, v, positions, k_cache, v_cache, slots)
    for got, w in zip((got_q, k_cache, v_cache), want):
        assert untouched(got, w)


def test_dynamic_scaling_past_its_base_range_uses_the_call_frequencies():
    rope = pf.RotaryEmbedding(32, layout="half", scaling={
        "rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64})
    q, k, v, _, slots, k_cache, v_cache = case(tokens=4)
    for positions in (np.array([1, 2, 3, 40]), np.array([1, 2, 3, 200])):
        want = expected(rope, q, k, v, positions, slots, k_cache, v_cache)
        got_q = rope.apply_qk_to_cache(q, k, v, positions, k_cache, v_cache, slots)
        for got, w in zip((got_q, k_cache, v_cache), want):
            assert untouched(got, w)


def test_attention_factor_is_applied_to_k_in_the_cache(route):
    rope = pf.RotaryEmbedding(32, layout="half", scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})
    assert rope.attention_factor != 1.0
    q, k, v, positions, slots, k_cache, v_cache = case()
    want = expected(rope, q, k, v, positions, slots, k_cache, v_cache)
    rope.apply_qk_to_cache(q, k, v, positions, k_cache, v_cache, slots)
    assert untouched(k_cache, want[1]) and untouched(v_cache, want[2])


def test_bitwise_the_same_for_1_2_3_threads(route):
    # Large enough that the kernel may use several threads (65536 elements each).
    rope = pf.RotaryEmbedding(64, layout="half")
    results = []
    before = pf.get_num_threads()
    try:
        for threads in (1, 2, 3):
            pf.set_num_threads(threads)
            for cache_dtype in (np.float32, BFLOAT16):
                q, k, v, positions, slots, k_cache, v_cache = case(
                    tokens=300, heads=8, kv_heads=4, dim=64, blocks=40, block_size=16,
                    cache_dtype=cache_dtype)
                got_q = rope.apply_qk_to_cache(q, k, v, positions, k_cache, v_cache, slots)
                results.append((threads, cache_dtype, got_q.tobytes() + k_cache.tobytes()
                                + v_cache.tobytes()))
    finally:
        pf.set_num_threads(before)
    for cache_dtype in (np.float32, BFLOAT16):
        runs = {r for t, d, r in results if d is cache_dtype}
        assert len(runs) == 1


def test_no_tokens():
    rope = pf.RotaryEmbedding(32)
    q, k, v, positions, slots, k_cache, v_cache = case()
    got = rope.apply_qk_to_cache(q[:0], k[:0], v[:0], positions[:0], k_cache, v_cache,
                                 slots[:0])
    assert got.shape == (0, 4, 32) and np.isnan(k_cache).all() and np.isnan(v_cache).all()


def bad_calls():
    """(description, changes to the arguments, error, message) of refused calls."""
    q, k, v, positions, slots, k_cache, v_cache = case()
    half_cache = k_cache.astype(np.float16)
    yield "slot past the cache", {"slot_mapping": np.where(slots == slots.max(), 12, slots)}, \
        ValueError, r"slots in \[0, 12\)"
    yield "slot below -1", {"slot_mapping": np.where(slots == -1, -2, slots)}, ValueError, \
        "slot_mapping must hold -1"
    yield "slot twice", {"slot_mapping": np.array([3, 1, -1, 3, 4, 5])}, ValueError, \
        "slot 3 more than once"
    yield "float slots", {"slot_mapping": slots.astype(float)}, TypeError, "slot_mapping"
    yield "slots of another length", {"slot_mapping": slots[:5]}, ValueError, "slot_mapping"
    yield "positions of another length", {"positions": positions[:, None]}, ValueError, \
        "positions must have shape"
    yield "float positions", {"positions": positions + 0.5}, TypeError, "positions"
    yield "q of another dim", {"q": np.zeros((6, 4, 16), np.float32)}, ValueError, "q must"
    yield "k of other tokens", {"k": k[:5]}, ValueError, "k and v must"
    yield "v of other heads", {"v": np.zeros((6, 3, 32), np.float32)}, ValueError, "k and v"
    yield "k float64", {"k": k.astype(np.float64)}, TypeError, "one dtype"
    yield "cache of other heads", {"k_cache": np.zeros((3, 4, 3, 32), np.float32),
                                   "v_cache": np.zeros((3, 4, 3, 32), np.float32)}, \
        ValueError, "k_cache must have shape"
    yield "3-D cache", {"k_cache": k_cache[0]}, ValueError, "k_cache must have shape"
    yield "caches of two dtypes", {"v_cache": half_cache}, TypeError, "v_cache must have"
    yield "float64 cache for float32 data", {"k_cache": k_cache.astype(np.float64),
                                             "v_cache": v_cache.astype(np.float64)}, \
        TypeError, "the caches must have q's dtype"
    yield "half data, float32 cache", {"q": q.astype(np.float16), "k": k.astype(np.float16),
                                       "v": v.astype(np.float16)}, TypeError, "the caches"
    yield "cache rows of stride 2", {"k_cache": np.zeros((3, 4, 2, 64), np.float32)[..., ::2]}, \
        ValueError, "own contiguous memory"
    yield "cache blocks in one place", {"k_cache": np.lib.stride_tricks.as_strided(
        np.zeros((4, 2, 32), np.float32), (3, 4, 2, 32), (0, 256, 128, 4))}, \
        ValueError, "own contiguous memory"
    yield "list cache", {"k_cache": k_cache.tolist()}, TypeError, "numpy.ndarray"
    yield "byte-swapped cache", {"v_cache": v_cache.astype(">f4")}, TypeError, "native"
    yield "read-only cache", {"v_cache": np.broadcast_to(v_cache, v_cache.shape)}, \
        ValueError, "writeable"
    yield "caches sharing memory", {"v_cache": "k_cache"}, ValueError, "share memory"
    yield "cache over k", {"k": "k_cache.reshape(12, 2, 32)[:6]"}, ValueError, "shares"
    yield "out_q over k_cache", {"out_q": "k_cache.reshape(6, 4, 32)"}, ValueError, "out_q"
    yield "out_q of another shape", {"out_q": np.zeros((6, 4, 16), np.float32)}, ValueError, \
        "out_q must have shape"
    yield "a NaN eps without weights", {"eps": float("nan")}, ValueError, "eps must be finite"
    yield "a negative eps without weights", {"eps": -1.0}, ValueError, "eps must be >= 0"
    yield "eps a list without weights", {"eps": [1e-6]}, TypeError, "eps must be a real number"


@pytest.mark.parametrize("what, changes, error, message", list(bad_calls()),
                         ids=[c[0] for c in bad_calls()])
def test_bad_calls_are_refused_with_nothing_written(what, changes, error, message):
    # The fast path declines each (it would not raise), the general path refuses it.
    rope = pf.RotaryEmbedding(32)
    q, k, v, positions, slots, k_cache, v_cache = case()
    args = dict(q=q, k=k, v=v, positions=positions, k_cache=k_cache, v_cache=v_cache,
                slot_mapping=slots, out_q=None)
    for name, value in changes.items():  # strings name arrays built from the others
        args[name] = eval(value, {"np": np}, dict(args)) if isinstance(value, str) else value
    snapshots = {name: np.array(a, copy=True) for name, a in args.items()
                 if isinstance(a, np.ndarray)}
    with pytest.raises(error, match=message):
        rope.apply_qk_to_cache(**args)
    for name, before in snapshots.items():
        assert untouched(before, args[name]), f"{name} was written"


def test_norm_weights_may_lie_in_a_slot_the_call_writes(route):
    # they are read (into factors) before anything is written, as the docstring says
    rope = pf.RotaryEmbedding(32, layout="half")
    q, k, v, positions, slots, k_cache, v_cache = case()
    weights = np.linspace(0.5, 1.5, 32).astype(np.float32), np.linspace(1.5, 0.5, 32).astype(np.float32)
    want = [a.copy() for a in (q, k_cache, v_cache)]
    rope.apply_qk_to_cache(q.copy(), k, v, positions, want[1], want[2], slots, out_q=want[0], qk_norm=weights)
    written = k_cache[np.unravel_index(slots[0], k_cache.shape[:2])]  # (kv_heads, dim) of a slot the call writes
    written[0], written[1] = weights
    rope.apply_qk_to_cache(q, k, v, positions, k_cache, v_cache, slots, out_q=q, qk_norm=(written[0], written[1]))
    assert all(bits(got).tobytes() == bits(w).tobytes() for got, w in zip((q, k_cache, v_cache), want))


def test_several_position_streams_are_refused():
    rope = pf.RotaryEmbedding(32, layout="half", mrope_section=[4, 6, 6])
    q, k, v, positions, slots, k_cache, v_cache = case()
    with pytest.raises(ValueError, match="one position per token"):
        rope.apply_qk_to_cache(q, k, v, positions, k_cache, v_cache, slots)
    assert np.isnan(k_cache).all()


@pytest.mark.parametrize("route", ROUTES)
@given(tokens=st.integers(1, 12), heads=st.integers(1, 4), kv_heads=st.integers(1, 3),
       pairs=st.integers(1, 9), extra=st.integers(0, 3), layout=st.sampled_from(["half",
                                                                               "interleaved"]),
       cache_dtype=st.sampled_from(CACHE_DTYPES), block_size=st.integers(1, 5),
       seed=st.integers(0, 2**16), data=st.data())
def test_hypothesis_shapes_and_slots(route, tokens, heads, kv_heads, pairs, extra, layout,
                                     cache_dtype, block_size, seed, data):
    dim = 2 * pairs + extra
    rope = pf.RotaryEmbedding(dim, rotary_dim=2 * pairs, layout=layout)
    fewest = -(-tokens // block_size)
    blocks = data.draw(st.integers(fewest, fewest + 3))
    q, k, v, positions, _, k_cache, v_cache = case(tokens, heads, kv_heads, dim, blocks,
                                                   block_size, cache_dtype=cache_dtype,
                                                   seed=seed)
    slots = np.array(data.draw(st.lists(st.integers(-1, blocks * block_size - 1),
                                        min_size=tokens, max_size=tokens,
                                        unique_by=lambda s: s if s >= 0 else object())))
    want = expected(rope, q, k, v, positions, slots, k_cache, v_cache)
    with taking(route):
        got_q = rope.apply_qk_to_cache(q, k, v, positions, k_cache, v_cache, slots)
    for got, w in zip((got_q, k_cache, v_cache), want):
        assert bits(got).tobytes() == bits(w).tobytes()


def test_a_slot_twice_among_many_tokens_is_refused():
    # Past 64 tokens the fast path checks duplicates with a bitmap of the slots.
    rope = pf.RotaryEmbedding(32)
    q, k, v, positions, slots, k_cache, v_cache = case(tokens=100, blocks=30)
    slots[99] = slots[0]
    with pytest.raises(ValueError, match=f"slot {slots[0]} more than once"):
        rope.apply_qk_to_cache(q, k, v, positions, k_cache, v_cache, slots)
    assert np.isnan(k_cache).all() and np.isnan(v_cache).all()


@pytest.mark.parametrize("model", ["small_llama", "small_qwen3"])
def test_example_server_loop_matches_the_models_forward(model):
    # Runs examples/server_loop.py: its logits are checked against transformers' own forward
    # (Qwen3: its q/k norm fused into the rotate-and-write).
    import importlib.util
    from pathlib import Path

    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    path = Path(__file__).resolve().parents[1] / "examples" / "server_loop.py"
    spec = importlib.util.spec_from_file_location("server_loop", path)
    server_loop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(server_loop)
    requests = [server_loop.Request(list(range(n)), new, arrives)
                for n, new, arrives in ((5, 3, 0), (9, 4, 1), (2, 5, 1))]
    assert server_loop.serve(requests, getattr(server_loop, model)()) >= 5
    assert all(len(r.tokens) == len(r.prompt) + r.max_new_tokens for r in requests)


@pytest.mark.parametrize("is_neox", [True, False])
def test_vllm_entry_with_the_embeddings_cos_sin_is_bitwise_the_method(is_neox):
    from posenc_fast import vllm

    rope = pf.RotaryEmbedding(32, rotary_dim=24, layout="half" if is_neox else "interleaved")
    cos_sin_cache = np.concatenate(rope.cos_sin(np.arange(300)), axis=1)
    q, k, v, positions, slots, k_cache, v_cache = case(cache_dtype=BFLOAT16)
    want_kc, want_vc = k_cache.copy(), v_cache.copy()
    want_q = rope.apply_qk_to_cache(q, k, v, positions, want_kc, want_vc, slots)
    qkv = np.concatenate([a.reshape(6, -1) for a in (q, k, v)], axis=1)
    query = qkv[:, :128].copy()
    key, value = qkv[:, 128:192], qkv[:, 192:]  # strided slices, read only
    vllm.apply_qk_to_cache(positions, query, key, value, k_cache, v_cache, slots, 32,
                           cos_sin_cache, is_neox)
    assert untouched(query.reshape(q.shape), want_q)
    assert untouched(k_cache, want_kc) and untouched(v_cache, want_vc)
    bad = positions.copy()
    bad[0] = 300
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 300\)"):
        vllm.apply_qk_to_cache(bad, query, key, value, k_cache, v_cache, slots, 32,
                               cos_sin_cache, is_neox)
    assert untouched(query.reshape(q.shape), want_q) and untouched(k_cache, want_kc)
    with pytest.raises(ValueError, match="native byte order"):
        vllm.apply_qk_to_cache(positions, query.astype(">f4"), key, value, k_cache, v_cache,
                               slots, 32, cos_sin_cache, is_neox)


def test_vllm_cpu_cache_layout_is_named_not_guessed():
    # vLLM's CPU cache (2, num_blocks, kv_heads, block_size, head_size): kv_cache_layout="HND"
    # writes the rows the flash layout gets; the shapes alone would also fit "NHD".
    from posenc_fast import vllm

    q, k, v, positions, slots, flash_k, flash_v = case(blocks=3, block_size=2, kv_heads=2)
    inv_freq = 10000.0 ** (-np.arange(0, 32, 2) / 32)
    angles = np.arange(300)[:, None] * inv_freq
    cos_sin = np.concatenate((np.cos(angles), np.sin(angles)), 1).astype(np.float32)
    q_flash = q.copy()
    vllm.apply_qk_to_cache(positions, q_flash, k, v, flash_k, flash_v, slots, 32, cos_sin, True)
    cpu = np.full((2, 3, 2, 2, 32), np.nan, np.float32)  # heads == block_size: shapes fit both
    q_cpu = q.copy()
    vllm.apply_qk_to_cache(positions, q_cpu, k, v, cpu[0], cpu[1], slots, 32, cos_sin, True,
                           kv_cache_layout="HND")
    assert bits(q_cpu).tobytes() == bits(q_flash).tobytes()
    for got, want in zip(cpu, (flash_k, flash_v)):
        assert bits(np.ascontiguousarray(got.transpose(0, 2, 1, 3))).tobytes() == bits(want).tobytes()
    with pytest.raises(ValueError, match="kv_cache_layout must be one of"):
        vllm.apply_qk_to_cache(positions, q.copy(), k, v, cpu[0], cpu[1], slots, 32, cos_sin,
                               True, kv_cache_layout="nhd")
