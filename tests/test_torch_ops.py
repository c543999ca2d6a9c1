"""posenc_fast.torch_ops: the registered ops, eager and under torch.compile(fullgraph=True).

Skipped without torch, except the check that importing without torch fails clearly.
"""

import importlib
import sys
import warnings

import numpy as np
import pytest
from helpers import general_path_only


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    importlib.import_module("posenc_fast.torch_ops")
    return torch


def test_import_without_torch_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails
    monkeypatch.delitem(sys.modules, "posenc_fast.torch_ops", raising=False)
    with pytest.raises(ImportError, match="posenc_fast.torch_ops needs torch"):
        importlib.import_module("posenc_fast.torch_ops")


def test_schema_declares_the_mutations(torch):
    schema = str(torch.ops.posenc_fast.rotary_embedding.default._schema)
    assert "Tensor(a!) query" in schema and "Tensor(b!)? key" in schema
    assert schema.endswith("-> ()")


def test_the_op_takes_vllms_eight_arguments(torch):
    # rope_dim_offset and inverse (vLLM's 2026 op): the last rot_dim features rotate, and back.
    from posenc_fast import vllm

    schema = str(torch.ops.posenc_fast.rotary_embedding.default._schema)
    assert schema.endswith("SymInt rope_dim_offset=0, bool inverse=False) -> ()")
    positions, query, key, cache = case(torch)
    q, k = query.clone(), key.clone()
    torch.ops.posenc_fast.rotary_embedding(positions, query, key, 16, cache, True, 4, False)
    vllm.rotary_embedding(positions.numpy(), q.numpy(), k.numpy(), 16, cache.numpy(), True,
                          rope_dim_offset=4)
    assert torch.equal(query, q) and torch.equal(key, k)
    assert torch.equal(query.view(7, 4, 16)[..., :4], case(torch)[1].view(7, 4, 16)[..., :4])
    torch.ops.posenc_fast.rotary_embedding(positions, query, key, 16, cache, True, 4, True)
    torch.testing.assert_close(query, case(torch)[1], rtol=0, atol=1e-5)


def case(torch, tokens=7, heads=4, kv_heads=2, head_size=16, rot_dim=12, seed=0):
    """positions, query, key and a [cos | sin] cache of 64 positions."""
    generator = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 64, (tokens,), generator=generator)
    angles = torch.arange(64.0)[:, None] * 10000.0 ** (-torch.arange(0, rot_dim, 2) / rot_dim)
    cache = torch.cat((angles.cos(), angles.sin()), dim=1)
    return (positions, torch.randn(tokens, heads * head_size, generator=generator),
            torch.randn(tokens, kv_heads * head_size, generator=generator), cache)


@pytest.mark.parametrize("is_neox", [True, False])
def test_eager_op_is_the_function(torch, is_neox):
    from posenc_fast import vllm

    positions, query, key, cache = case(torch)
    q, k = query.clone(), key.clone()
    torch.ops.posenc_fast.rotary_embedding(positions, query, key, 16, cache, is_neox)
    vllm.rotary_embedding(positions.numpy(), q.numpy(), k.numpy(), 16, cache.numpy(), is_neox)
    assert torch.equal(query, q) and torch.equal(key, k)
    assert not torch.equal(query, case(torch)[1])


def test_compiled_fullgraph_gives_the_eager_result(torch, monkeypatch, tmp_path):
    from posenc_fast import vllm

    def attention_inputs(positions, hidden, w_q, w_k, cache):
        # A layer's projections, rotated by the op inside the graph.
        q, k = hidden @ w_q, hidden @ w_k
        torch.ops.posenc_fast.rotary_embedding(positions, q, k, 16, cache, True)
        return q * 0.25, k

    def query_only(positions, query, cache):
        query = query + 1.0
        torch.ops.posenc_fast.rotary_embedding(positions, query, None, 16, cache, False)
        return query

    calls = []
    monkeypatch.setattr(vllm, "rotary_embedding",
                        lambda *args, real=vllm.rotary_embedding: calls.append(1) or real(*args))
    # A graph found in inductor's on-disk cache (from an earlier run) was seen
    # not to reach the patched function: compile afresh, into an empty cache.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    positions, query, _, cache = case(torch)
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(7, 32, generator=generator)
    w_q, w_k = torch.randn(32, 64, generator=generator), torch.randn(32, 32, generator=generator)
    torch._dynamo.reset()
    expected = attention_inputs(positions, hidden, w_q, w_k, cache)
    compiled = torch.compile(attention_inputs, fullgraph=True)
    calls.clear()
    with general_path_only():  # a C++ kernel of the op (where one was built) hands the call to the function
        got = compiled(positions, hidden, w_q, w_k, cache)
    assert calls, "the compiled graph did not run posenc_fast's kernel"
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    compiled = torch.compile(query_only, fullgraph=True)
    torch.testing.assert_close(compiled(positions, query, cache),
                               query_only(positions, query, cache), rtol=0, atol=0)


def test_compiled_op_mutates_graph_inputs_like_eager(torch):
    positions, query, key, cache = case(torch)
    eager_q, eager_k = query.clone(), key.clone()

    def rotate(positions, query, key, cache):
        torch.ops.posenc_fast.rotary_embedding(positions, query, key, 16, cache, True)

    torch._dynamo.reset()
    torch.compile(rotate, fullgraph=True)(positions, query, key, cache)
    rotate(positions, eager_q, eager_k, cache)
    assert torch.equal(query, eager_q) and torch.equal(key, eager_k)
    assert not np.array_equal(query.numpy(), case(torch)[1].numpy())


def cache_case(torch, tokens=5, heads=4, kv_heads=2, head_size=16, cache_dtype=None):
    """A RotaryEmbedding, its [cos | sin] cache, a fused qkv's slices and empty paged caches."""
    import posenc_fast as pf

    rope = pf.RotaryEmbedding(head_size, rotary_dim=12, layout="half")
    cos, sin = rope.cos_sin(np.arange(64))
    generator = torch.Generator().manual_seed(2)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_size, generator=generator)
    query, key, value = qkv.split([heads * head_size, kv_heads * head_size,
                                   kv_heads * head_size], dim=-1)
    k_cache = torch.zeros(3, 4, kv_heads, head_size, dtype=cache_dtype or torch.float32)
    return (rope, torch.from_numpy(np.concatenate((cos, sin), axis=1)), query.contiguous(),
            key, value, torch.tensor([3, 9, 0, 40, 7]), torch.tensor([1, -1, 5, 11, 0]),
            k_cache, k_cache.clone())


def test_cache_op_schema_declares_the_mutations(torch):
    schema = str(torch.ops.posenc_fast.apply_qk_to_cache.default._schema)
    for name in ("query", "key_cache", "value_cache"):
        assert f"!) {name}" in schema
    assert "!) key," not in schema and schema.endswith("-> ()")


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16", "float16"])
def test_cache_op_is_the_embeddings_apply_qk_to_cache(torch, cache_dtype):
    from posenc_fast import hf

    rope, cache, query, key, value, positions, slots, k_cache, v_cache = cache_case(
        torch, cache_dtype=getattr(torch, cache_dtype))
    shape = (5, -1, 16)
    want_kc, want_vc = k_cache.clone(), v_cache.clone()
    want_q = rope.apply_qk_to_cache(
        query.numpy().reshape(shape), key.numpy().reshape(shape), value.numpy().reshape(shape),
        positions.numpy(), hf.numpy_view(torch, want_kc), hf.numpy_view(torch, want_vc),
        slots.numpy())
    key_before, value_before = key.clone(), value.clone()
    torch.ops.posenc_fast.apply_qk_to_cache(positions, query, key, value, k_cache, v_cache,
                                            slots, 16, cache, True)
    assert np.array_equal(query.numpy().reshape(shape), want_q)
    assert torch.equal(k_cache, want_kc) and torch.equal(v_cache, want_vc)
    assert torch.equal(key, key_before) and torch.equal(value, value_before)
    assert k_cache.any() and not k_cache[0, 2].any()  # slot 2 unused


def test_cache_op_compiled_fullgraph_gives_the_eager_result(torch, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # compile afresh

    def layer(positions, hidden, w_qkv, k_cache, v_cache, slots, cos_sin_cache):
        qkv = hidden @ w_qkv
        query, key, value = qkv.split([64, 32, 32], dim=-1)
        query = query.contiguous()
        torch.ops.posenc_fast.apply_qk_to_cache(positions, query, key, value, k_cache, v_cache,
                                                slots, 16, cos_sin_cache, True)
        return query * 0.25

    rope, cache, _, _, _, positions, slots, k_cache, v_cache = cache_case(torch)
    generator = torch.Generator().manual_seed(3)
    hidden, w_qkv = torch.randn(5, 32, generator=generator), torch.randn(32, 128,
                                                                         generator=generator)
    eager_kc, eager_vc = k_cache.clone(), v_cache.clone()
    torch._dynamo.reset()
    expected = layer(positions, hidden, w_qkv, eager_kc, eager_vc, slots, cache)
    got = torch.compile(layer, fullgraph=True)(positions, hidden, w_qkv, k_cache, v_cache,
                                               slots, cache)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert torch.equal(k_cache, eager_kc) and torch.equal(v_cache, eager_vc)
    assert eager_kc.any()


@pytest.mark.parametrize("is_neox", [True, False])
def test_the_functional_op_trains(torch, is_neox):
    # apply_rotary: a new tensor, a gradient by the op with inverse flipped; gradcheck in
    # float64, opcheck, and a compiled training step equal to the eager one.
    from posenc_fast import vllm

    positions, query, _, cache = case(torch)
    x = query.double().requires_grad_()
    op = torch.ops.posenc_fast.apply_rotary
    assert torch.autograd.gradcheck(lambda x: op(positions, x, 16, cache.double(), is_neox), (x,))
    q = query.clone()
    vllm.rotary_embedding(positions, q, None, 16, cache, is_neox)
    assert torch.equal(op(positions, query, 16, cache, is_neox), q)
    torch.library.opcheck(op, (positions, query.requires_grad_(), 16, cache, is_neox))

    weight = torch.randn(64, 64, generator=torch.Generator().manual_seed(4))

    def loss(w, hidden):
        return op(positions, hidden @ w, 16, cache, is_neox, 4).square().sum()

    hidden = torch.randn(7, 64, generator=torch.Generator().manual_seed(5))
    grads = []
    for fn in (loss, torch.compile(loss, fullgraph=True, backend="aot_eager")):
        w = weight.clone().requires_grad_()
        fn(w, hidden).backward()
        grads.append(w.grad)
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("change, match", [(dict(x="int32"), "^x must be float16, bfloat16, float32 or float64"),
                                           (dict(head_size=5), "x"), (dict(head_size=0), "head_size must be >= 1")])
def test_the_functional_ops_messages_name_x(torch, change, match):
    # its data is x (it was named query, vLLM's in-place op's name)
    positions, query, _, cache = case(torch)
    x = query.to(torch.int32) if change.get("x") else query
    with pytest.raises((TypeError, ValueError), match=match) as error:
        torch.ops.posenc_fast.apply_rotary(positions, x, change.get("head_size", 16), cache, True)
    assert "query" not in str(error.value)


def test_a_meta_tensor_beside_cpu_ones_is_refused(torch):
    # torch sends such a call to the op's fake, which writes nothing: each op refuses it, naming the
    # tensor, and writes nothing; all on meta (shape propagation) stays the fake's no-op.
    positions, query, key, cache = case(torch)
    meta = {name: t.to("meta") for name, t in (("positions", positions), ("query", query), ("key", key),
                                                ("cos_sin_cache", cache))}
    ops = torch.ops.posenc_fast
    for name in ("query", "key", "cos_sin_cache"):
        args = {"positions": positions, "query": query.clone(), "key": key.clone(), "cos_sin_cache": cache,
                name: meta[name]}
        with pytest.raises(ValueError, match=f"^{name} must be a strided CPU tensor, got device meta"):
            ops.rotary_embedding(args["positions"], args["query"], args["key"], 16, args["cos_sin_cache"], True)
        assert all(torch.equal(args[n], t) for n, t in (("query", query), ("key", key)) if n != name)
    with pytest.raises(ValueError, match="^cos_sin_cache must be a strided CPU tensor, got device meta"):
        ops.apply_rotary(positions, query, 16, meta["cos_sin_cache"], True)
    key_cache, value_cache = torch.zeros(4, 4, 2, 16), torch.zeros(4, 4, 2, 16, device="meta")
    with pytest.raises(ValueError, match="^value_cache must be a strided CPU tensor, got device meta"):
        ops.apply_qk_to_cache(positions, query.clone(), key.clone(), key.clone(), key_cache, value_cache,
                              torch.arange(7), 16, cache, True)
    assert not key_cache.any()
    ops.rotary_embedding(meta["positions"], meta["query"], meta["key"], 16, meta["cos_sin_cache"], True)


def _negated_view(torch, t):
    """A view holding `t`'s values through torch's negative bit (as ``z.conj().imag`` is)."""
    view = torch.complex(torch.zeros_like(t), -t).conj().imag
    assert view.is_neg() and torch.equal(view, t)
    return view


def test_a_negated_view_is_refused_where_written_and_read_where_read(torch):
    # torch's fallback for such views ran the kernel on a copy of query, wrote key, failed, and the next
    # call crashed the interpreter: a written one is refused before anything is written
    ops = torch.ops.posenc_fast
    positions, query, key, cache = case(torch)
    want_q, want_k = query.clone(), key.clone()
    ops.rotary_embedding(positions, want_q, want_k, 16, cache, True)
    for name in ("query", "key"):
        q, k = query.clone(), key.clone()
        args = {"query": _negated_view(torch, q) if name == "query" else q,
                "key": _negated_view(torch, k) if name == "key" else k}
        with pytest.raises(ValueError, match=f"^{name} is a negated or conjugated view"):
            ops.rotary_embedding(positions, args["query"], args["key"], 16, cache, True)
        assert torch.equal(q, query) and torch.equal(k, key)
    q, k = query.clone(), key.clone()
    ops.rotary_embedding(positions, q, k, 16, _negated_view(torch, cache), True)  # read: its values
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    key_cache, value_cache = torch.zeros(4, 4, 2, 16), torch.zeros(4, 4, 2, 16)
    with pytest.raises(ValueError, match="^value_cache is a negated or conjugated view"):
        ops.apply_qk_to_cache(positions, query.clone(), key.clone(), key.clone(), key_cache,
                              _negated_view(torch, value_cache), torch.arange(7), 16, cache, True)
    assert not key_cache.any()


def test_a_tensor_of_another_layout_is_refused_by_name(torch):
    # torch's dispatcher has no kernel of the op for them (NotImplementedError): the op refuses them
    ops = torch.ops.posenc_fast
    positions, query, key, cache = case(torch)
    k = key.clone()
    with pytest.raises(ValueError, match="^query must be a strided CPU tensor, got layout torch.sparse_coo"):
        ops.rotary_embedding(positions, query.to_sparse(), k, 16, cache, True)
    assert torch.equal(k, key)
    with pytest.raises(ValueError, match="^positions must be a strided CPU tensor, got layout torch.sparse_coo"):
        ops.rotary_embedding(positions.to_sparse(), query.clone(), k, 16, cache, True)
    with pytest.raises(ValueError, match="^x must be a strided CPU tensor, got layout torch.sparse_coo"):
        ops.apply_rotary(positions, query.to_sparse(), 16, cache, True)
    with warnings.catch_warnings():  # (torch's: a prototype)
        warnings.simplefilter("ignore")
        nested = torch.nested.nested_tensor([query[:3], query[3:]])
    with pytest.raises(ValueError, match="^query must be a strided CPU tensor, got a nested tensor"):
        ops.rotary_embedding(positions, nested, k, 16, cache, True)
    assert torch.equal(k, key)
    q = query.reshape(1, 7, 4, 16).transpose(1, 2)  # hf_rotate's tensors are a list
    cos, sin = torch.ones(1, 7, 16), torch.zeros(1, 7, 16)
    with pytest.raises(ValueError, match=r"^xs\[0\] must be a strided CPU tensor, got layout torch.sparse_coo"):
        ops.hf_rotate([q.to_sparse(), q], cos, sin, "llama", "apply_rotary_pos_emb", 1, False)
