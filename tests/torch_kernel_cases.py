"""Cases of the C++ kernels of torch.ops.posenc_fast.rotary_embedding, apply_qk_to_cache,
fused_qk_norm_rope, the MLA cache writes and hf_rotate, in a process that loaded them.

Run by tests/test_torch_kernel.py with XDG_CACHE_HOME where it built the kernel (a kernel
registered with torch stays for the process, so the other tests keep the Python one).  The
kernels hand every call _core's entries do not take to ``_<op>_general``, whose Python kernel
looks the `posenc_fast.vllm` function up at each call: counting those calls shows which path ran.
"""

import pytest
import torch

import hf_calls
import posenc_fast.torch_ops as torch_ops
from helpers import general_path_only
from posenc_fast import _hf_drop_in, hf, vllm

OP = torch.ops.posenc_fast.rotary_embedding
FUNCTION = vllm.rotary_embedding  # the expected results and errors, not counted


CACHE_FUNCTION = vllm.apply_qk_to_cache
NORM_OP = torch.ops.posenc_fast.fused_qk_norm_rope
NORM_FUNCTION = vllm.fused_qk_norm_rope
MLA_OP = torch.ops.posenc_fast.concat_and_cache_mla_rope_fused
MLA_FUNCTION = vllm.concat_and_cache_mla_rope_fused
MLA_WRITE_OP = torch.ops.posenc_fast.concat_and_cache_mla
MLA_WRITE_FUNCTION = vllm.concat_and_cache_mla


@pytest.fixture
def general_calls(monkeypatch):
    """The calls that reached the Python functions, as (name, arguments)."""
    calls = []

    def counted(name, function):
        def call(*args):
            calls.append((name, args))
            return function(*args)
        return call

    monkeypatch.setattr(vllm, "rotary_embedding", counted("rotary_embedding", FUNCTION))
    monkeypatch.setattr(vllm, "apply_qk_to_cache", counted("apply_qk_to_cache", CACHE_FUNCTION))
    monkeypatch.setattr(vllm, "fused_qk_norm_rope", counted("fused_qk_norm_rope", NORM_FUNCTION))
    monkeypatch.setattr(vllm, "concat_and_cache_mla_rope_fused", counted("mla_rope_fused", MLA_FUNCTION))
    monkeypatch.setattr(vllm, "concat_and_cache_mla", counted("mla", MLA_WRITE_FUNCTION))
    return calls


def cache(dtype, rot_dim, rows=64):
    angles = torch.arange(float(rows), dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    return torch.cat((angles.cos(), angles.sin()), dim=1).to(dtype)


def tensors(dtype, tokens=5, heads=4, kv_heads=2, head_size=16, layout="2d", seed=0):
    """query and key as a server holds them: `layout` 2d, 3d, fused (slices of one qkv
    projection) or padded (heads past head_size)."""
    g = torch.Generator().manual_seed(seed)
    if layout == "fused":
        qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_size, generator=g).to(dtype)
        return qkv[:, :heads * head_size], qkv[:, heads * head_size:(heads + kv_heads) * head_size]
    if layout == "padded":
        q = torch.randn(tokens, heads, head_size + 8, generator=g).to(dtype)
        k = torch.randn(tokens, kv_heads, head_size + 8, generator=g).to(dtype)
        return q[..., :head_size], k[..., :head_size]
    q = torch.randn(tokens, heads * head_size, generator=g).to(dtype)
    k = torch.randn(tokens, kv_heads * head_size, generator=g).to(dtype)
    if layout == "3d":
        return q.view(tokens, heads, head_size), k.view(tokens, kv_heads, head_size)
    return q, k


@pytest.mark.parametrize("op", ["rotary_embedding", "apply_qk_to_cache", "fused_qk_norm_rope", "concat_and_cache_mla",
                                "concat_and_cache_mla_rope_fused", "hf_rotate", "_hf_rotate_no_grad"])
def test_the_op_is_served_by_the_cpp_kernel(op):
    assert torch_ops.compiled_kernels is not None, torch_ops.kernel_reason
    assert "C++" in torch_ops.kernel_reason
    cpu = [line for line in torch._C._dispatch_dump(f"posenc_fast::{op}").splitlines() if line.startswith("CPU:")]
    assert len(cpu) == 1 and "posenc_torch_kernel.cpp" in cpu[0]


@pytest.mark.parametrize("dtype, table", [(torch.float32, torch.float32), (torch.float64, torch.float64),
                                          (torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
                                          (torch.float16, torch.float32), (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("layout", ["2d", "3d", "fused", "padded"])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rot_dim, offset, inverse, with_key",
                         [(16, 0, False, True), (10, 4, False, True), (8, 0, True, False), (12, 2, True, True)])
def test_the_kernel_rotates_as_the_function(general_calls, dtype, table, layout, is_neox, rot_dim, offset,
                                            inverse, with_key):
    positions = torch.tensor([3, 0, 63, 17, 17])
    q, k = tensors(dtype, layout=layout)
    expected_q, expected_k = tensors(dtype, layout=layout)  # views of their own buffer, as q and k
    counted = expected_q._version, expected_k._version
    FUNCTION(positions, expected_q, expected_k if with_key else None, 16, cache(table, rot_dim),
                          is_neox, offset, inverse)
    general_calls.clear()
    before = q._version, k._version
    OP(positions, q, k if with_key else None, 16, cache(table, rot_dim), is_neox, offset, inverse)
    assert general_calls == []  # _core's entry took it
    assert torch.equal(q, expected_q) and torch.equal(k, expected_k)
    # written in place as torch counts it (views of one fused buffer share their counter)
    assert (q._version - before[0], k._version - before[1]) == (expected_q._version - counted[0],
                                                              expected_k._version - counted[1])
    assert q._version > before[0]


def assert_same_error(call, arguments, written, function=FUNCTION, keywords=None):
    """`call` and `function` raise alike on `arguments` (and `keywords`), writing nothing of `written`."""
    kept = [t.clone() for t in written]
    with pytest.raises((TypeError, ValueError)) as ours:
        call(*arguments, **(keywords or {}))
    with pytest.raises(type(ours.value)) as theirs:
        function(*arguments, **(keywords or {}))
    assert str(ours.value) == str(theirs.value)
    assert all(torch.equal(t, k) for t, k in zip(written, kept))


def test_what_the_entry_declines_goes_to_the_function(general_calls):
    positions, table = torch.tensor([3, 0, 63]), cache(torch.float32, 16)
    q, k = tensors(torch.float32, tokens=3)
    # taken by the function, not refused: int32 and (batch, seq) positions
    for p in (positions.int(), positions.view(1, 3)):
        q = tensors(torch.float32, tokens=3)[0].view(*p.shape, 64)
        expected = q.clone()
        FUNCTION(p, expected, None, 16, table, True)
        general_calls.clear()
        OP(p, q, None, 16, table, True)
        assert len(general_calls) == 1 and torch.equal(q, expected)
    q = tensors(torch.float32, tokens=3)[0]
    # refused, by the function's error, nothing written
    cases = [(positions + 64, q, k, 16, table, True),              # past the cache
             (positions, q, k, 16, table[:, :15], True),           # odd rot_dim
             (positions, q, k, 16, table, True, 4),                # offset + rot_dim past head_size
             (positions, q, k.double(), 16, table, True),          # key of another dtype
             (positions, q.requires_grad_(), k, 16, table, True)]  # a tensor autograd records
    for arguments in cases:
        general_calls.clear()
        assert_same_error(OP, arguments, [t for t in arguments[1:3] if t is not None])
        assert len(general_calls) == 1
    shared = torch.randn(64 * 16 + 64)  # the cache overlapping query's memory
    assert_same_error(OP, (positions, shared[:192].view(3, 64), None, 16, shared[64:].view(64, 16), True), [shared])
    with torch.inference_mode():
        inference = torch.randn(3, 64)
    assert_same_error(OP, (positions, inference, None, 16, table, True), [inference])
    with general_path_only():  # _core's entry declines every call
        expected = tensors(torch.float32, tokens=3)[0]
        FUNCTION(positions, expected, None, 16, table, True)
        general_calls.clear()
        q = tensors(torch.float32, tokens=3)[0]
        OP(positions, q, None, 16, table, True)
        assert len(general_calls) == 1 and torch.equal(q, expected)


def test_opcheck_and_fullgraph():
    positions, table = torch.tensor([3, 0, 63, 5]), cache(torch.bfloat16, 16)
    q, k = tensors(torch.bfloat16, tokens=4, layout="fused")
    torch.library.opcheck(OP, (positions, q.clone(), k.clone(), 16, table, True, 0, False))

    @torch.compile(fullgraph=True, backend="inductor")
    def step(positions, qkv):
        q, k = qkv[:, :64], qkv[:, 64:96]
        OP(positions, q, k, 16, table, False)
        return qkv * 1

    qkv = torch.randn(4, 128).to(torch.bfloat16)
    expected = qkv.clone()
    FUNCTION(positions, expected[:, :64], expected[:, 64:96], 16, table, False)
    assert torch.equal(step(positions, qkv), expected)


CACHE_OP = torch.ops.posenc_fast.apply_qk_to_cache


def cache_call(dtype, cache_dtype, layout, is_neox, one_tensor, seed=0):
    """apply_qk_to_cache's arguments: q, k, v slices of one qkv projection (5 tokens, 4 + 2 heads of 16),
    vLLM's caches (8 blocks of 4 slots) as `layout` says, one tensor of keys and values or two."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(5, (4 + 2 * 2) * 16, generator=g).to(dtype)
    shape = (8, 2, 4, 16) if layout == "HND" else (8, 4, 2, 16)
    kv = torch.zeros((2, *shape), dtype=cache_dtype)
    caches = (kv[0], kv[1]) if one_tensor else (kv[0].clone(), kv[1].clone())
    return dict(positions=torch.tensor([3, 0, 63, 17, 17]), query=qkv[:, :64], key=qkv[:, 64:96],
                value=qkv[:, 96:], key_cache=caches[0], value_cache=caches[1],
                slot_mapping=torch.tensor([5, -1, 30, 0, 12]), head_size=16,
                cos_sin_cache=cache(dtype, 16), is_neox=is_neox,
                kv_cache_layout=layout)


def norm_weights(dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(16, generator=g) + 0.5).to(dtype), (torch.rand(16, generator=g) + 0.5).to(dtype)


def cloned(call):
    """`call` with its written tensors copied (their buffers of their own, as the originals')."""
    copies = dict(call)
    qkv = call["query"]._base.clone()
    copies.update(query=qkv[:, :64], key=qkv[:, 64:96], value=qkv[:, 96:])
    if call["key_cache"]._base is not None:
        kv = call["key_cache"]._base.clone()
        copies.update(key_cache=kv[0], value_cache=kv[1])
    else:
        copies.update(key_cache=call["key_cache"].clone(), value_cache=call["value_cache"].clone())
    return copies


def versions(call):
    return [call[name]._version for name in ("query", "key_cache", "value_cache")]


@pytest.mark.parametrize("dtype, cache_dtype", [(torch.float32, torch.float32), (torch.float64, torch.float64),
                                                (torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
                                                (torch.float32, torch.bfloat16), (torch.float32, torch.float16)])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("one_tensor", [True, False])
@pytest.mark.parametrize("normed", [False, True])  # q/k RMSNorm first (Gemma's 1 + weight)
def test_the_cache_kernel_writes_as_the_function(general_calls, dtype, cache_dtype, layout, is_neox, one_tensor,
                                                 normed):
    call = cache_call(dtype, cache_dtype, layout, is_neox, one_tensor)
    if normed:
        call.update(zip(("q_weight", "k_weight"), norm_weights(torch.float32)), eps=1e-5, weight_offset=1.0)
    expected = cloned(call)
    counted = versions(expected)
    CACHE_FUNCTION(**expected)
    before = versions(call)
    CACHE_OP(**call)
    assert general_calls == []  # _core's entry took it
    for name in ("query", "key", "value", "key_cache", "value_cache"):
        assert torch.equal(call[name], expected[name]), name
    assert [a - b for a, b in zip(versions(call), before)] == [a - b for a, b in zip(versions(expected), counted)]
    assert versions(call) != before


def test_what_the_cache_entry_declines_goes_to_the_function(general_calls):
    call = cache_call(torch.float32, torch.float32, "NHD", True, False)
    weights = dict(q_weight=(torch.rand(32) + 0.5)[::2], k_weight=torch.rand(16) + 0.5)
    expected = cloned(call)
    CACHE_FUNCTION(*expected.values(), *weights.values())
    CACHE_OP(**call, **weights)  # a weight with a step: the Python kernel
    assert [name for name, _ in general_calls] == ["apply_qk_to_cache"]
    assert all(torch.equal(call[n], expected[n]) for n in ("query", "key_cache", "value_cache"))
    refused = [dict(slot_mapping=torch.tensor([5, 5, 30, 0, 12])),   # a slot twice
               dict(slot_mapping=torch.tensor([5, 1, 32, 0, 12])),   # past the cache
               dict(kv_cache_layout="NDH"),
               dict(eps=-1.0),
               dict(positions=torch.tensor([3, 0, 64, 1, 2])),       # past the cos/sin cache
               dict(value=torch.randn(5, 32, dtype=torch.float64)),
               dict(q_weight=torch.ones(16)),                        # one weight of two
               dict(q_weight=torch.ones(15), k_weight=torch.ones(16)),
               dict(q_weight=torch.ones(16), k_weight=torch.ones(16), eps=-1.0)]
    for change in refused:
        bad = dict(cache_call(torch.float32, torch.float32, "NHD", True, False), **change)
        general_calls.clear()
        assert_same_error(CACHE_OP, (), [bad[n] for n in ("query", "key_cache", "value_cache")], CACHE_FUNCTION, bad)
        assert len(general_calls) == 1, change


@pytest.mark.parametrize("dtype, table", [(torch.float32, torch.float32), (torch.float64, torch.float64),
                                          (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                          (torch.float16, torch.float32)])
@pytest.mark.parametrize("layout", ["2d", "3d", "fused", "padded"])
@pytest.mark.parametrize("is_neox, weight_dtype, weight_offset", [(True, None, 0.0), (False, torch.float32, 1.0)])
def test_the_norm_kernel_normalises_as_the_function(general_calls, dtype, table, layout, is_neox, weight_dtype,
                                                    weight_offset):
    positions = torch.tensor([3, 0, 63, 17, 17])
    q, k = tensors(dtype, layout=layout)
    expected_q, expected_k = tensors(dtype, layout=layout)
    wq, wk = norm_weights(weight_dtype or dtype)
    counted = expected_q._version, expected_k._version
    NORM_FUNCTION(positions, expected_q, expected_k, wq, wk, 16, cache(table, 16), is_neox, 1e-5, weight_offset)
    general_calls.clear()
    before = q._version, k._version
    NORM_OP(positions, q, k, wq, wk, 16, cache(table, 16), is_neox, 1e-5, weight_offset)
    assert general_calls == []  # _core's entry took it
    assert torch.equal(q, expected_q) and torch.equal(k, expected_k)
    assert (q._version - before[0], k._version - before[1]) == (expected_q._version - counted[0],
                                                              expected_k._version - counted[1])
    assert q._version > before[0]


def test_what_the_norm_entry_declines_goes_to_the_function(general_calls):
    positions, table = torch.tensor([3, 0, 63]), cache(torch.float32, 16)
    wq, wk = norm_weights(torch.float32)
    # taken by the function, not refused: int32 positions, (batch, seq) positions
    for p in (positions.int(), positions.view(1, 3)):
        q, k = (t.view(*p.shape, -1) for t in tensors(torch.float32, tokens=3))
        expected_q, expected_k = (t.view(*p.shape, -1) for t in tensors(torch.float32, tokens=3))
        NORM_FUNCTION(p, expected_q, expected_k, wq, wk, 16, table, True)
        general_calls.clear()
        NORM_OP(p, q, k, wq, wk, 16, table, True)
        assert len(general_calls) == 1 and torch.equal(q, expected_q) and torch.equal(k, expected_k)
    q, k = tensors(torch.float32, tokens=3)
    # refused, by the function's error, nothing written
    cases = [((positions, q, k, wq[:15], wk, 16, table, True), {}),        # a weight of 15
             ((positions, q, k, wq, wk, 16, table, True), dict(eps=-1.0)),
             ((positions, q, k, wq, wk, 16, table, True), dict(weight_offset=float("nan"))),
             ((positions + 64, q, k, wq, wk, 16, table, True), {}),        # past the cache
             ((positions, q, k.double(), wq, wk, 16, table, True), {}),    # key of another dtype
             ((positions, q, k, wq.clone().requires_grad_(), wk, 16, table, True), {})]  # autograd records
    for arguments, keywords in cases:
        general_calls.clear()
        assert_same_error(NORM_OP, arguments, [q, k], NORM_FUNCTION, keywords)
        assert len(general_calls) == 1
    with general_path_only():  # _core's entry declines every call
        expected_q, expected_k = tensors(torch.float32, tokens=3)
        NORM_FUNCTION(positions, expected_q, expected_k, wq, wk, 16, table, True)
        general_calls.clear()
        q, k = tensors(torch.float32, tokens=3)
        NORM_OP(positions, q, k, wq, wk, 16, table, True)
        assert len(general_calls) == 1 and torch.equal(q, expected_q) and torch.equal(k, expected_k)


def test_the_norm_op_under_opcheck_and_fullgraph():
    positions, table = torch.tensor([3, 0, 63, 5]), cache(torch.float32, 16)
    q, k = tensors(torch.bfloat16, tokens=4, layout="fused")
    wq, wk = norm_weights(torch.bfloat16)
    torch.library.opcheck(NORM_OP, (positions, q.clone(), k.clone(), wq, wk, 16, table, True, 1e-6, 1.0))

    @torch.compile(fullgraph=True, backend="inductor")
    def step(positions, qkv):
        NORM_OP(positions, qkv[:, :64], qkv[:, 64:96], wq, wk, 16, table, False)
        return qkv * 1

    qkv = torch.randn(4, 128).to(torch.bfloat16)
    expected = qkv.clone()
    NORM_FUNCTION(positions, expected[:, :64], expected[:, 64:96], wq, wk, 16, table, False)
    assert torch.equal(step(positions, qkv), expected)


def mla_call(dtype, table, is_neox, seed=2):
    """An MLA call as a server makes it: q_pe the rope part of the query, k_pe and kv_c the two parts
    of one latent projection, a token skipped."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(6, 3, 8 + 16, generator=g).to(dtype)
    latent = torch.randn(6, 16 + 24, generator=g).to(dtype)
    return dict(positions=torch.tensor([3, 0, 63, 17, 17, 9]), q_pe=q[..., 8:], k_pe=latent[:, :16],
                kv_c=latent[:, 16:], cos_sin_cache=cache(table, 16), is_neox=is_neox,
                slot_mapping=torch.tensor([5, -1, 30, 0, 12, 31]),
                kv_cache=torch.full((4, 8, 40), 123.0, dtype=dtype))


@pytest.mark.parametrize("dtype, table", [(torch.float32, torch.float32), (torch.float64, torch.float64),
                                          (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                          (torch.float16, torch.float32)])
@pytest.mark.parametrize("is_neox", [True, False])
def test_the_mla_kernels_write_as_the_functions(general_calls, dtype, table, is_neox):
    call, expected = mla_call(dtype, table, is_neox), mla_call(dtype, table, is_neox)
    MLA_FUNCTION(**expected)
    general_calls.clear()
    before = [call[n]._version for n in ("q_pe", "k_pe", "kv_cache")]
    MLA_OP(**call)
    assert general_calls == []  # _core's entry took it
    assert all(torch.equal(call[n], expected[n]) for n in ("q_pe", "k_pe", "kv_c", "positions"))
    assert torch.equal(call["kv_cache"], expected["kv_cache"])
    assert all(call[n]._version > v for n, v in zip(("q_pe", "k_pe", "kv_cache"), before))
    alone = torch.full_like(call["kv_cache"], 123.0)
    version = alone._version
    MLA_WRITE_OP(call["kv_c"], call["k_pe"], alone, call["slot_mapping"])
    assert general_calls == [] and alone._version > version
    assert torch.equal(alone, expected["kv_cache"])


def test_what_the_mla_entry_declines_goes_to_the_function(general_calls):
    call = mla_call(torch.float32, torch.float32, True)
    expected = mla_call(torch.float32, torch.float32, True)
    MLA_FUNCTION(**dict(expected, positions=expected["positions"].int()))
    general_calls.clear()
    MLA_OP(**dict(call, positions=call["positions"].int()))  # int32 positions: taken by the function
    assert [name for name, _ in general_calls] == ["mla_rope_fused"]
    assert torch.equal(call["kv_cache"], expected["kv_cache"])
    refused = [dict(slot_mapping=torch.tensor([5, 5, 30, 0, 12, 31])),   # a slot twice
               dict(slot_mapping=torch.tensor([5, 1, 32, 0, 12, 99])),   # past the cache
               dict(kv_cache_dtype="fp8"),
               dict(positions=torch.tensor([3, 0, 64, 1, 2, 5])),        # past the cos/sin cache
               dict(kv_c=torch.randn(6, 24, dtype=torch.float64)),
               dict(kv_cache=torch.zeros(4, 8, 41))]
    for change in refused:
        bad = dict(mla_call(torch.float32, torch.float32, True), **change)
        general_calls.clear()
        assert_same_error(MLA_OP, (), [bad[n] for n in ("q_pe", "k_pe", "kv_cache")], MLA_FUNCTION, bad)
        assert len(general_calls) == 1, change
    bad = mla_call(torch.float32, torch.float32, True)
    general_calls.clear()
    assert_same_error(MLA_WRITE_OP, (bad["kv_c"], bad["k_pe"], bad["kv_cache"], torch.tensor([5, 5, 0, 1, 2, 3])),
                      [bad["kv_cache"]], MLA_WRITE_FUNCTION)
    assert len(general_calls) == 1


def test_the_mla_ops_under_opcheck():
    call = mla_call(torch.bfloat16, torch.float32, False)
    torch.library.opcheck(MLA_OP, tuple(call.values()))
    torch.library.opcheck(MLA_WRITE_OP, (call["kv_c"], call["k_pe"], call["kv_cache"], call["slot_mapping"]))


@pytest.fixture
def python_hf_calls(monkeypatch):
    """The calls that reached the hf ops' Python kernel."""
    calls, python = [], torch_ops._hf_rotate
    monkeypatch.setattr(torch_ops, "_hf_rotate", lambda *args: calls.append(args) or python(*args))
    return calls


def hf_call(family, dtype):
    """An hf_rotate call of install's apply_rotary_pos_emb of `family` (q and k, or one tensor) as its
    module makes it, and that function."""
    function = hf._PATCHED["apply_rotary_pos_emb"][family]
    case = hf_calls.cases(function)[0]
    xs = hf_calls.data(case, dtype)[:1 if function.one_tensor else 2]
    cos, sin = hf_calls.cache(function, case.lead, 8 if function.trailing else 16, dtype)
    return [xs, cos, sin, family, "apply_rotary_pos_emb", case.unsqueeze_dim, False], function


@pytest.mark.parametrize("family", ["llama", "deepseek_v4", "cohere"])  # half, interleaved trailing, pairs
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("name", ["hf_rotate", "_hf_rotate_no_grad"])
def test_the_hf_kernel_rotates_as_the_python_one(python_hf_calls, family, dtype, name):
    op = getattr(torch.ops.posenc_fast, name)
    args, function = hf_call(family, dtype)
    with general_path_only():  # the C++ entry and TensorRotation decline: the Python kernel's NumPy route
        expected = op(*args)
        assert len(python_hf_calls) == 1
    op(*args)  # the first call names the function's rotation (by family and name) for the C++ kernel
    python_hf_calls.clear()
    with torch.no_grad():
        got = op(*args)
    rotation = _hf_drop_in.compiled(torch, function)
    taken = rotation is not None and rotation(tuple(args[0]), *args[1:3], args[5]) is not None
    # (DeepSeek-V4's float64 data: not the kernel's result, `_hf_drop_in._dtypes_fit`; Cohere's pairs cache is
    # read by a strided [..., 0::2]: no TensorRotation)
    assert taken == (family == "llama" or family == "deepseek_v4" and dtype != torch.float64)
    assert len(python_hf_calls) == (0 if taken else 1)  # the C++ kernel took what the eager drop-in takes
    assert all(torch.equal(g, e) and g.stride() == e.stride() and g.dtype == e.dtype for g, e in zip(got, expected))


def test_what_the_hf_entry_declines_goes_to_the_python_kernel(python_hf_calls):
    args, _ = hf_call("llama", torch.float32)
    torch.ops.posenc_fast._hf_rotate_no_grad(*args)  # named
    with general_path_only():
        expected = torch.ops.posenc_fast._hf_rotate_no_grad(*args[:-1], True)
    python_hf_calls.clear()
    got = torch.ops.posenc_fast._hf_rotate_no_grad(*args[:-1], True)  # a gradient rotated back
    assert len(python_hf_calls) == 1 and all(torch.equal(g, e) for g, e in zip(got, expected))
    with pytest.raises(ValueError, match="patches no 'apply_rotary_pos_emb' of transformers.models.nothing"):
        torch.ops.posenc_fast._hf_rotate_no_grad(*args[:3], "nothing", *args[4:])
    with pytest.raises(ValueError, match=r"xs must hold 1 to 2 of the tensors .* got 3"):  # declined in C too
        torch.ops.posenc_fast._hf_rotate_no_grad([*args[0], args[0][0]], *args[1:])
    torch.library.opcheck(torch.ops.posenc_fast._hf_rotate_no_grad, tuple(args))
