"""q/k RMSNorm + RoPE in one pass: against a float64 reference, transformers' own norms, bad input.

`RotaryEmbedding.apply_qk_norm`, `vllm.fused_qk_norm_rope` and the torch op
(torch cases skip without torch/transformers).
"""

import ml_dtypes
import numpy as np
import pytest

import posenc_fast as pf
from posenc_fast import reference, vllm
from helpers import taking, untouched

HALVES = {"bfloat16": (ml_dtypes.bfloat16, 8), "float16": (np.float16, 11)}


def normed(x, weight, eps, weight_offset=0.0):
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * (weight_offset + weight)


def expected(rope, x, weight, positions, eps=1e-6, weight_offset=0.0):
    return reference.apply_rotary(normed(x, weight, eps, weight_offset), positions,
                                  list(rope.inv_freq), layout=rope.layout)


def data(rng, shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim, weight_offset", [(None, 0.0), (12, 1.0)])
def test_float64_is_the_reference(layout, rotary_dim, weight_offset):
    rng = np.random.default_rng(1)
    rope = pf.RotaryEmbedding(16, rotary_dim=rotary_dim, layout=layout)
    q, k = data(rng, (2, 4, 5, 16)), data(rng, (2, 2, 5, 16))
    wq, wk = data(rng, 16), data(rng, 16)
    got_q, got_k = rope.apply_qk_norm(q, k, wq, wk, offset=7, eps=1e-5,
                                      weight_offset=weight_offset)
    positions = 7.0 + np.arange(5)
    np.testing.assert_allclose(got_q, expected(rope, q, wq, positions, 1e-5, weight_offset),
                               rtol=0, atol=1e-13)
    np.testing.assert_allclose(got_k, expected(rope, k, wk, positions, 1e-5, weight_offset),
                               rtol=0, atol=1e-13)
    # in place, and explicit positions, give the same bits
    q2, k2 = q.copy(), k.copy()
    rope.apply_qk_norm(q2, k2, wq, wk, np.arange(7, 12), eps=1e-5, weight_offset=weight_offset,
                       out_q=q2, out_k=k2)
    assert q2.tobytes() == got_q.tobytes() and k2.tobytes() == got_k.tobytes()


@pytest.mark.parametrize("dtype", ["float32", *HALVES])
def test_float32_arithmetic_half_types_rounded_once(dtype):
    rng = np.random.default_rng(2)
    rope = pf.RotaryEmbedding(32, layout="half")
    np_dtype, bits = HALVES.get(dtype, (np.float32, 24))
    q, k = data(rng, (1, 4, 6, 32), np_dtype), data(rng, (1, 2, 6, 32), np_dtype)
    wq, wk = data(rng, 32, np.float32), data(rng, 32, np.float32)
    got_q, _ = rope.apply_qk_norm(q, k, wq, wk, offset=1000)
    assert got_q.dtype == np_dtype
    exact = expected(rope, q.astype(np.float64), wq.astype(np.float64), 1000.0 + np.arange(6))
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(exact), 1e-30))) - (bits - 1))
    # one rounding to the data's type, plus float32's own error in the products and sums
    bound = 0.5 * ulp + 2.0**-21 * np.abs(normed(q, wq, 1e-6)).max()
    assert (np.abs(got_q.astype(np.float64) - exact) <= bound).all()


def sum_of_squares(x):
    # The kernels' sum of squares of each row of x: in float64 by 32 running sums added pairwise.
    squares = x.astype(np.float64) ** 2
    sums = np.zeros(x.shape[:-1] + (32,))
    for first in range(0, x.shape[-1], 32):
        block = squares[..., first:first + 32]
        sums[..., :block.shape[-1]] += block
    for width in (16, 8, 4, 2, 1):
        sums[..., :width] += sums[..., width:2 * width]
    return sums[..., 0]


def the_passes(rope, x, weight, positions, eps):
    # The fused norm's operations in NumPy, each rounded as the kernels round it: the sum of
    # squares in float64 by 32 running sums added pairwise, the scale in float64 (the mean a
    # division by dim), then float32 products and sums (float64 for float64 x), one rounding to
    # x's dtype.
    compute = np.float64 if x.dtype == np.float64 else np.float32
    x32 = x.astype(compute)
    scale = (1.0 / np.sqrt(sum_of_squares(x32) / x.shape[-1] + eps)).astype(compute)
    normed = (x32 * scale[..., None]) * weight.astype(compute)
    cos, sin = rope.cos_sin(positions, dtype=compute)
    cos, sin = cos[:, None], sin[:, None]  # (seq, 1, n): broadcast over heads
    n = x.shape[-1] // 2
    a, b = normed[..., :n], normed[..., n:]
    return np.concatenate((a * cos - b * sin, b * cos + a * sin), axis=-1).astype(x.dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32", *HALVES])
@pytest.mark.parametrize("dim", [56, 100, 128])
def test_half_layout_rows_are_the_passes_bitwise(dtype, dim):
    # half-layout rows take one kernel for scale, rotation and rounding (K.norm_half) where the
    # variant has it: its vector loop, its one vector more and its scalar rest (dims 56, 100
    # cover each with 8 and 16 lanes) give the bits of the passes; float64 rows (the passes),
    # whose scale is not rounded to float32, show a mean of squares formed otherwise than by
    # a division by dim (a power of two is multiplied by its reciprocal: the same bits)
    rng = np.random.default_rng(4)
    np_dtype = HALVES.get(dtype, (np.dtype(dtype).type,))[0]
    rope = pf.RotaryEmbedding(dim, layout="half")
    q, k = data(rng, (3, 4, dim), np_dtype), data(rng, (3, 2, dim), np_dtype)
    wq, wk = data(rng, dim, np.float32), data(rng, dim, np.float32)
    positions = np.array([5, 900, 70000])
    got_q, got_k = rope.apply_qk_norm(q, k, wq, wk, positions[:, None], eps=1e-5)
    for got, x, w in ((got_q, q, wq), (got_k, k, wk)):
        want = the_passes(rope, x, w, positions, 1e-5)
        assert got.view(np.uint8).tobytes() == want.view(np.uint8).tobytes()


def rows_at_a_rounding_boundary(dim, eps, dtype, count=3):
    """Rows of `dtype` whose float32 scale 1 / sqrt(mean of squares + eps) rounds otherwise when the
    mean is formed as sum * (1 / dim) than as sum / dim (dim not a power of two): each row's sum of
    squares aims at a midpoint between two float32 scales, element by element (each the square root
    of the rest, in `dtype`), and is kept where the two means round apart."""
    rng, rows = np.random.default_rng(dim), []
    for _ in range(2000):
        target = float(np.float32(rng.uniform(0.5, 2.0)))
        target += float(np.spacing(np.float32(target))) / 2
        total, row = dim * (1 / target**2 - eps), np.zeros(dim, dtype)
        for i in range(16):
            rest = total - sum_of_squares(row.astype(np.float32))
            if rest <= 0:
                break
            row[i] = np.sqrt(rest)
        s = sum_of_squares(row.astype(np.float32))
        if np.float32(1 / np.sqrt(s / dim + eps)) != np.float32(1 / np.sqrt(s * (1 / dim) + eps)):
            rows.append(row)
            if len(rows) == count:
                return np.stack(rows)
    raise AssertionError(f"no row at a rounding boundary found for dim {dim}, {np.dtype(dtype)}")


@pytest.mark.parametrize("dtype", ["float32", *HALVES])
@pytest.mark.parametrize("dim", [96, 112])
def test_the_mean_of_squares_is_a_division_by_dim(dtype, dim):
    # the float32 scale of rows chosen where sum * (1 / dim) rounds otherwise than sum / dim: every
    # path (the norm's rows kernel, the passes of a variant without vectors) divides by dim
    np_dtype = HALVES.get(dtype, (np.dtype(dtype).type,))[0]
    rope = pf.RotaryEmbedding(dim, layout="half")
    q = rows_at_a_rounding_boundary(dim, 1e-6, np_dtype)[None]
    w = np.linspace(0.5, 1.5, dim).astype(np.float32)
    got_q, _ = rope.apply_qk_norm(q, q.copy(), w, w, np.array([[7]]), eps=1e-6)
    want = the_passes(rope, q, w, np.array([7]), 1e-6)
    assert got_q.view(np.uint8).tobytes() == want.view(np.uint8).tobytes()


def test_the_server_function_is_the_method():
    rng = np.random.default_rng(3)
    rope = pf.RotaryEmbedding(16, rotary_dim=12, layout="interleaved")
    positions = rng.integers(0, 64, 7)
    cos, sin = rope.cos_sin(np.arange(64), dtype=np.float32)
    cache = np.concatenate((cos, sin), 1)
    qkv = data(rng, (7, (4 + 2 * 2) * 16), np.float32)
    query, key = qkv[:, :64], qkv[:, 64:96]  # slices of a fused projection
    wq, wk = data(rng, 16, np.float32), data(rng, 16, np.float32)
    want_q, want_k = rope.apply_qk_norm(query.reshape(7, 4, 16).copy(),
                                        key.reshape(7, 2, 16).copy(), wq, wk, positions[:, None],
                                        weight_offset=1.0)
    rest = qkv[:, 96:].copy()
    vllm.fused_qk_norm_rope(positions, query, key, wq, wk, 16, cache, False, weight_offset=1.0)
    assert query.reshape(7, 4, 16).tobytes() == want_q.tobytes()
    assert key.reshape(7, 2, 16).tobytes() == want_k.tobytes()
    assert qkv[:, 96:].tobytes() == rest.tobytes()  # the value part untouched


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_weights_are_read_by_their_strides(dtype):
    # weights as views with a step (a row of a stacked parameter, every other item): the same
    # results as contiguous copies of them, through the method and the server function
    rng = np.random.default_rng(9)
    rope = pf.RotaryEmbedding(16, layout="half")
    stacked = data(rng, (2, 32), dtype)
    wq, wk = stacked[0, ::2], stacked[1, 1::2]
    q, k = data(rng, (3, 4, 16), dtype), data(rng, (3, 2, 16), dtype)
    got = rope.apply_qk_norm(q, k, wq, wk, np.arange(3)[:, None])
    want = rope.apply_qk_norm(q, k, wq.copy(), wk.copy(), np.arange(3)[:, None])
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want))
    cos, sin = rope.cos_sin(np.arange(3), dtype=np.float32)
    query, key = q.reshape(3, 64).copy(), k.reshape(3, 32).copy()
    vllm.fused_qk_norm_rope(np.arange(3), query, key, wq, wk, 16, np.concatenate((cos, sin), 1), True)
    assert query.tobytes() == want[0].tobytes() and key.tobytes() == want[1].tobytes()


def valid():
    rng = np.random.default_rng(4)
    cache = np.concatenate((np.ones((9, 4)), np.zeros((9, 4))), 1).astype(np.float32)
    return dict(positions=np.arange(3), query=data(rng, (3, 16), np.float32),
                key=data(rng, (3, 8), np.float32), q_weight=np.ones(8), k_weight=np.ones(8),
                head_size=8, cos_sin_cache=cache, is_neox=True)


@pytest.mark.parametrize("change, error, words", [
    (dict(q_weight=np.ones(7)), ValueError, "q_weight must have shape (head_dim,) = (8,)"),
    (dict(eps=-1.0), ValueError, "eps must be >= 0"),
    (dict(eps="small"), TypeError, "eps must be"),
    (dict(key=None), TypeError, "key must be an array"),
    (dict(positions=np.array([0, 9, 1])), ValueError, "positions must lie in [0, 9)"),
    (dict(key=np.ones((3, 8))), TypeError, "key must have query's dtype"),
    (dict(cos_sin_cache=np.ones((9, 10), np.float32)), ValueError, "rot_dim"),
])
def test_bad_input_is_refused_with_nothing_written(change, error, words):
    call = dict(valid(), **change)
    before = {n: np.array(call[n], copy=True) for n in ("query", "key") if call[n] is not None}
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        vllm.fused_qk_norm_rope(**call)
    for name, a in before.items():
        assert untouched(a, call[name])
    rope = pf.RotaryEmbedding(8)
    q = np.ones((1, 2, 3, 8))
    with pytest.raises(ValueError, match="k_weight must have shape"):
        rope.apply_qk_norm(q, q.copy(), np.ones(8), np.ones(9), out_q=q)
    assert (q == 1).all()
    with pytest.raises(ValueError, match="one position stream"):
        pf.RotaryEmbedding(8, mrope_section=[2, 1, 1]).apply_qk_norm(q, q.copy(), np.ones(8),
                                                                     np.ones(8))


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_transformers_norm_then_rotation(family):
    # transformers' own q_norm/k_norm modules, then its own apply_rotary_pos_emb (float32).
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import importlib

    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    norm_class = getattr(module, "Qwen3RMSNorm" if family == "qwen3" else "Gemma3RMSNorm")
    generator = torch.Generator().manual_seed(5)
    norm = norm_class(64, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64, generator=generator))
    rope = pf.RotaryEmbedding(64, layout="half", base=1e6)
    q = torch.randn(1, 4, 9, 64, generator=generator)
    positions = np.arange(100, 109)
    cos, sin = rope.cos_sin(positions)
    cos_full = torch.from_numpy(np.concatenate((cos, cos), -1))[None]
    sin_full = torch.from_numpy(np.concatenate((sin, sin), -1))[None]
    with torch.no_grad():
        want, _ = module.apply_rotary_pos_emb(norm(q), norm(q), cos_full, sin_full)
    offset = 1.0 if family == "gemma3" else 0.0
    got, _ = rope.apply_qk_norm(q.numpy(), q.numpy(), norm.weight.detach().numpy(),
                                norm.weight.detach().numpy(), positions, weight_offset=offset)
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=2e-5 * float(want.abs().max()))


def test_the_torch_op_compiles_and_is_the_function():
    torch = pytest.importorskip("torch")
    import posenc_fast.torch_ops  # noqa: F401

    call = {n: torch.from_numpy(a) if isinstance(a, np.ndarray) else a for n, a in valid().items()}
    call["cos_sin_cache"] = torch.from_numpy(np.concatenate(
        pf.RotaryEmbedding(8).cos_sin(np.arange(9)), 1))
    q, k = call["query"].clone(), call["key"].clone()
    vllm.fused_qk_norm_rope(**dict(call, query=q, key=k))
    op = torch.ops.posenc_fast.fused_qk_norm_rope
    compiled = torch.compile(lambda *a: op(*a), fullgraph=True, backend="aot_eager")
    compiled(*call.values())
    assert torch.equal(call["query"], q) and torch.equal(call["key"], k)
    torch.library.opcheck(op, tuple(dict(call, query=q.clone(), key=k.clone()).values()))


def norm_cache_case(dtype, cache_dtype, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (data(rng, (6, h, 32), dtype) for h in (4, 2, 2))
    weights = data(rng, 32), data(rng, 32)
    positions, slots = rng.integers(0, 300, 6), np.array([5, 0, -1, 9, 2, 11])
    k_cache = np.full((3, 4, 2, 32), np.nan, cache_dtype)
    return q, k, v, weights, positions, slots, k_cache, k_cache.copy()


@pytest.mark.parametrize("dtype, cache_dtype", [(np.float32, np.float32), (np.float64, np.float64),
                                                (ml_dtypes.bfloat16, ml_dtypes.bfloat16),
                                                (np.float32, ml_dtypes.bfloat16), (np.float32, np.float16)])
@pytest.mark.parametrize("layout, start", [("half", 0), ("interleaved", 8)])
@pytest.mark.parametrize("route", ["fast", "general"])
def test_norm_then_rotation_into_the_kv_cache(dtype, cache_dtype, layout, start, route):
    # the cache rows are apply_qk_norm's k (cast to the cache dtype), v cast; q apply_qk_norm's q
    rope = pf.RotaryEmbedding(32, rotary_dim=16, rotary_start=start, layout=layout)
    q, k, v, (wq, wk), positions, slots, k_cache, v_cache = norm_cache_case(dtype, cache_dtype)
    want_q, want_k = rope.apply_qk_norm(q, k, wq, wk, positions[:, None], eps=1e-5, weight_offset=1.0)
    with taking(route):
        got_q = rope.apply_qk_to_cache(q, k, v, positions, k_cache, v_cache, slots, qk_norm=(wq, wk), eps=1e-5,
                                       weight_offset=1.0)
    assert untouched(want_q, got_q)
    flat_k, flat_v = k_cache.reshape(12, 2, 32), v_cache.reshape(12, 2, 32)
    for t, slot in enumerate(slots):
        if slot >= 0:
            assert untouched(want_k[t].astype(cache_dtype), flat_k[slot])
            assert untouched(v[t].astype(cache_dtype), flat_v[slot])
    others = np.setdiff1d(np.arange(12), slots)
    assert np.isnan(flat_k[others].astype(np.float64)).all() and np.isnan(flat_v[others].astype(np.float64)).all()
    if start:
        return  # vllm's apply_qk_to_cache rotates from feature 0 (its cache is rot_dim wide)
    # the vLLM-style call (its cos/sin cache in q's dtype), with the caches as vLLM's CPU backend holds
    # them (the HND halves of one tensor): fused_qk_norm_rope's q and k
    cache = np.concatenate(rope.cos_sin(np.arange(300), dtype=np.float64), 1).astype(q.dtype)
    want_q, want_k = q.copy(), k.copy()
    vllm.fused_qk_norm_rope(positions, want_q, want_k, wq, wk, 32, cache, layout == "half", 1e-5, 1.0)
    kv = np.full((2, 3, 2, 4, 32), np.nan, cache_dtype)
    query = q.copy()
    vllm.apply_qk_to_cache(positions, query, k, v, kv[0], kv[1], slots, 32, cache, layout == "half", "HND",
                           wq, wk, 1e-5, 1.0)
    assert untouched(want_q, query)
    flat_k, flat_v = np.swapaxes(kv[0], 1, 2).reshape(12, 2, 32), np.swapaxes(kv[1], 1, 2).reshape(12, 2, 32)
    for t, slot in enumerate(slots):
        if slot >= 0:
            assert untouched(want_k[t].astype(cache_dtype), flat_k[slot])
            assert untouched(v[t].astype(cache_dtype), flat_v[slot])


def test_norm_into_the_cache_refuses_bad_weights_and_writes_nothing():
    rope = pf.RotaryEmbedding(32)
    q, k, v, (wq, wk), positions, slots, k_cache, v_cache = norm_cache_case(np.float32, np.float32)
    q_before = q.copy()
    for qk_norm, error, match in (((wq, np.ones(31)), ValueError, "k_weight must have shape"),
                                  ([wq, wk], TypeError, "qk_norm must be a tuple"),
                                  ((wq, wk), ValueError, "slot_mapping uses slot")):
        bad_slots = np.array([1, 1, -1, 2, 3, 4]) if match == "slot_mapping uses slot" else slots
        with pytest.raises(error, match=match):
            rope.apply_qk_to_cache(q, k, v, positions, k_cache, v_cache, bad_slots, qk_norm=qk_norm, out_q=q)
        assert untouched(q_before, q) and np.isnan(k_cache).all() and np.isnan(v_cache).all()
    with pytest.raises(TypeError, match="pass both q_weight and k_weight"):
        vllm.apply_qk_to_cache(positions, q, k, v, k_cache, v_cache, slots, 32,
                               np.ones((300, 32), np.float32), True, "NHD", wq)
    assert untouched(q_before, q) and np.isnan(k_cache).all()


def test_the_torch_op_norms_into_the_cache():
    torch = pytest.importorskip("torch")
    import posenc_fast.torch_ops  # noqa: F401

    q, k, v, (wq, wk), positions, slots, k_cache, v_cache = norm_cache_case(np.float32, np.float32)
    cache = np.concatenate(pf.RotaryEmbedding(32).cos_sin(np.arange(300)), 1)
    want = [a.copy() for a in (q, k_cache, v_cache)]
    vllm.apply_qk_to_cache(positions, want[0], k, v, want[1], want[2], slots, 32, cache, True, "NHD", wq, wk)
    got = [torch.from_numpy(a.copy()) for a in (q, k_cache, v_cache)]
    t = torch.from_numpy
    args = (t(positions), got[0], t(k), t(v), got[1], got[2], t(slots), 32, t(cache), True, "NHD", t(wq), t(wk))
    torch.compile(lambda *a: torch.ops.posenc_fast.apply_qk_to_cache(*a), fullgraph=True, backend="aot_eager")(*args)
    for w, g in zip(want, got):
        assert untouched(w, g.numpy())
