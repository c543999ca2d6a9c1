"""posenc_fast.hf against transformers' own apply_rotary_pos_emb and inside real models.

Skipped unless torch and transformers are installed.  Models are built from
small configs with random weights: nothing is downloaded.
"""

import importlib
import sys

import numpy as np
import pytest

import posenc_fast
from posenc_fast import _hf_drop_in, hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
modeling_llama = importlib.import_module("transformers.models.llama.modeling_llama")
from hf_tiny import full_width_cache as hf_cache  # noqa: E402  (needs torch)

# transformers' function, kept even while a test has posenc_fast installed
HF_APPLY = modeling_llama.apply_rotary_pos_emb
TOL = {torch.float32: dict(rtol=0, atol=1e-6), torch.float64: dict(rtol=0, atol=1e-14)}


@pytest.fixture(autouse=True)
def restore_transformers():
    yield
    hf.uninstall()


def qk(shape_q, shape_k, dtype, layout, seed=1):
    """Random q and k of the given logical shapes, laid out as `layout` says."""
    generator = torch.Generator().manual_seed(seed)

    def make(shape):
        if layout == "contiguous":
            return torch.randn(shape, generator=generator, dtype=dtype)
        if layout == "transposed":  # Llama: a (b, h, s, d) view of the (b, s, h, d) projection
            b, h, s, d = shape
            return torch.randn((b, s, h, d), generator=generator, dtype=dtype).transpose(1, 2)
        if layout == "fused qkv":  # the same view of a slice of one q/k/v projection (two heads more)
            b, h, s, d = shape
            qkv = torch.randn((b, s, (h + 2) * d), generator=generator, dtype=dtype)
            return qkv[..., :h * d].view(b, s, h, d).transpose(1, 2)
        return torch.randn(shape[:-1] + (2 * shape[-1],), generator=generator,
                           dtype=dtype)[..., 1::2]  # strided last axis: needs a copy

    return make(shape_q), make(shape_k)


# ---------------------------------------------------------------------------
# the function


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "fused qkv", "strided"])
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_equals_transformers(dtype, unsqueeze_dim, layout):
    b, heads, kv_heads, seq, dim = 2, 8, 2, 7, 32
    if unsqueeze_dim == 1:
        q, k = qk((b, heads, seq, dim), (b, kv_heads, seq, dim), dtype, layout)
    else:
        q, k = qk((b, seq, heads, dim), (b, seq, kv_heads, dim), dtype, layout)
    cos, sin = hf_cache(b, seq, dim, dtype)
    q_before, k_before = q.clone(), k.clone()
    expected = HF_APPLY(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    got = hf.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    for g, e in zip(got, expected):
        assert type(g) is torch.Tensor and g.dtype == dtype and g.shape == e.shape
        torch.testing.assert_close(g, e, **TOL[dtype])
    if layout != "strided":  # torch's output strides follow the input's memory order; so do ours
        assert [g.stride() for g in got] == [e.stride() for e in expected]
    assert torch.equal(q, q_before) and torch.equal(k, k_before)


def test_unsqueeze_dim_0_with_a_cache_without_batch():
    # Pixtral's call: cos (seq, dim) for q (batch, heads, seq, dim).
    q, k = qk((2, 4, 6, 16), (2, 4, 6, 16), torch.float32, "contiguous")
    cos, sin = (t[0] for t in hf_cache(1, 6, 16))
    for g, e in zip(hf.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0),
                    HF_APPLY(q, k, cos, sin, unsqueeze_dim=0)):
        torch.testing.assert_close(g, e, **TOL[torch.float32])


def test_position_ids_is_ignored():
    q, k = qk((1, 2, 5, 8), (1, 2, 5, 8), torch.float32, "contiguous")
    cos, sin = hf_cache(1, 5, 8)
    plain = hf.apply_rotary_pos_emb(q, k, cos, sin)
    with_ids = hf.apply_rotary_pos_emb(q, k, cos, sin, torch.arange(5)[None] + 100)
    assert all(torch.equal(a, b) for a, b in zip(plain, with_ids))


class RecordingKernels:
    """hf's kernel module; `record(x, cos, sin, result)` for each array its compiled path rotates."""

    def __init__(self, kernels, record):
        self._kernels, self._record = kernels, record

    def __getattr__(self, name):
        return getattr(self._kernels, name)

    def rotate_cos_sin_fast(self, xs, cos, sin, *rest):
        result = self._kernels.rotate_cos_sin_fast(xs, cos, sin, *rest)
        for x, x_rot in zip(xs, result or ()):
            self._record(x, cos, sin, x_rot)
        return result


@pytest.fixture
def kernel_calls(monkeypatch):
    """Shapes of the arrays hf rotated with posenc_fast (either path), in call order."""
    calls = []

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return posenc_fast.apply_rotary_cos_sin(*args, **kwargs)

    compiled = _hf_drop_in._compiled_call

    def counting_compiled(torch_, function, xs, *args):
        result = compiled(torch_, function, xs, *args)
        calls.extend(tuple(x.shape) for x in (xs if result is not None else ()))
        return result

    monkeypatch.setattr(_hf_drop_in, "kernels",
                        RecordingKernels(_hf_drop_in.kernels, lambda x, *_: calls.append(x.shape)))
    monkeypatch.setattr(_hf_drop_in, "apply_rotary_cos_sin", counting)
    monkeypatch.setattr(_hf_drop_in, "_compiled_call", counting_compiled)
    return calls


@pytest.mark.parametrize("layout", ["transposed", "contiguous"])
def test_torch_tensors_are_viewed_not_copied(monkeypatch, layout):
    # The Python route (the compiled one is test_the_compiled_route_*): transposed views
    # take apply_rotary_cos_sin, contiguous ones the compiled path of NumPy arrays.
    q, k = qk((1, 4, 6, 16), (1, 2, 6, 16), torch.float32, layout)
    cos, sin = hf_cache(1, 6, 16)
    calls = []
    monkeypatch.setattr(_hf_drop_in, "_compiled_call", lambda *args: None)

    def recording(x, c, s, **kwargs):
        result = posenc_fast.apply_rotary_cos_sin(x, c, s, **kwargs)
        calls.append((x, c, s, result))
        return result

    monkeypatch.setattr(_hf_drop_in, "apply_rotary_cos_sin", recording)
    monkeypatch.setattr(_hf_drop_in, "kernels",
                        RecordingKernels(_hf_drop_in.kernels, lambda *call: calls.append(call)))
    q_rot, k_rot = hf.apply_rotary_pos_emb(q, k, cos, sin)
    (xq, cq, sq, rq), (xk, _, _, rk) = calls
    # The kernel saw q's and the cache's own memory, already in row order ...
    assert np.shares_memory(xq, q.numpy()) and xq.flags.c_contiguous
    assert np.shares_memory(xk, k.numpy()) and xk.flags.c_contiguous
    assert np.shares_memory(cq, cos.numpy()) and np.shares_memory(sq, sin.numpy())
    # ... and the tensors returned are its output arrays.
    assert np.shares_memory(q_rot.numpy(), rq) and np.shares_memory(k_rot.numpy(), rk)


def test_a_cache_whose_halves_differ_takes_the_formula(kernel_calls):
    q, k = qk((1, 4, 5, 16), (1, 2, 5, 16), torch.float32, "contiguous")
    cos, sin = hf_cache(1, 5, 16)
    cos[..., -1] += 0.5
    got = hf.apply_rotary_pos_emb(q, k, cos, sin)
    assert kernel_calls == []
    for g, e in zip(got, HF_APPLY(q, k, cos, sin)):
        assert torch.equal(g, e)


def test_numpy_in_numpy_out():
    q, k = qk((2, 4, 5, 16), (2, 2, 5, 16), torch.float64, "transposed")
    cos, sin = hf_cache(2, 5, 16, torch.float64)
    got = hf.apply_rotary_pos_emb(q.numpy(), k.numpy(), cos.numpy(), sin.numpy())
    expected = HF_APPLY(q, k, cos, sin)
    for g, e in zip(got, expected):
        assert type(g) is np.ndarray
        np.testing.assert_allclose(g, e.numpy(), rtol=0, atol=1e-14)


def test_inference_mode():
    q, k = qk((1, 4, 5, 16), (1, 2, 5, 16), torch.float32, "transposed")
    cos, sin = hf_cache(1, 5, 16)
    with torch.inference_mode():
        got = hf.apply_rotary_pos_emb(q, k, cos, sin)
    for g, e in zip(got, HF_APPLY(q, k, cos, sin)):
        torch.testing.assert_close(g, e, **TOL[torch.float32])


# ---------------------------------------------------------------------------
# what falls back to transformers' formula


@pytest.mark.parametrize("layout", ["transposed", "contiguous"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_takes_the_kernel_and_rounds_once(dtype, layout, kernel_calls):
    q, k = qk((1, 4, 5, 16), (1, 2, 5, 16), dtype, layout)
    cos, sin = hf_cache(1, 5, 16, dtype)
    with torch.inference_mode():
        got = hf.apply_rotary_pos_emb(q, k, cos, sin)
    assert kernel_calls  # not transformers' formula
    for g, x, e in zip(got, (q, k), HF_APPLY(q, k, cos, sin)):
        assert g.dtype == dtype and g.shape == x.shape
        # float32 arithmetic on the half inputs, rounded once
        x32, c32, s32 = x.float(), cos.float()[:, None], sin.float()[:, None]
        half = x.shape[-1] // 2
        rotated = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
        assert torch.equal(g, (x32 * c32 + rotated * s32).to(dtype))
        # closer to the float64 rotation than transformers' own half-precision formula
        exact = x.double() * cos.double()[:, None] + torch.cat(
            (-x.double()[..., half:], x.double()[..., :half]), dim=-1) * sin.double()[:, None]
        assert (g.double() - exact).abs().max() <= (e.double() - exact).abs().max()


def test_wider_cache_promotes_like_torch():
    q, k = qk((1, 4, 5, 16), (1, 2, 5, 16), torch.float32, "contiguous")
    cos, sin = hf_cache(1, 5, 16, torch.float64)
    for g, e in zip(hf.apply_rotary_pos_emb(q, k, cos, sin), HF_APPLY(q, k, cos, sin)):
        assert g.dtype == e.dtype == torch.float64
        torch.testing.assert_close(g, e, **TOL[torch.float64])


def test_narrower_cache_computes_in_the_data_dtype():
    q, k = qk((1, 4, 5, 16), (1, 2, 5, 16), torch.float64, "transposed")
    cos, sin = hf_cache(1, 5, 16, torch.float32)
    for g, e in zip(hf.apply_rotary_pos_emb(q, k, cos, sin), HF_APPLY(q, k, cos, sin)):
        assert g.dtype == torch.float64
        torch.testing.assert_close(g, e, **TOL[torch.float64])


def _grads(function, q, k, cos, sin):
    q_leaf, k_leaf = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
    q_rot, k_rot = function(q_leaf, k_leaf, cos, sin)
    # autograd.grad: the gradients as the backward made them (.grad is laid out as its tensor)
    q_grad, k_grad = torch.autograd.grad(q_rot.square().sum() + k_rot.pow(3).sum(), (q_leaf, k_leaf))
    return q_rot.detach(), k_rot.detach(), q_grad, k_grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_gradients_through_the_kernel_equal_transformers(dtype, layout, kernel_calls):
    # The backward is the kernel's rotation by (cos, -sin): the operations of the formula's
    # backward (g*cos + the other half's g*sin), so bitwise in float32 and float64.
    q, k = qk((1, 4, 5, 16), (1, 2, 5, 16), dtype, layout)
    cos, sin = hf_cache(1, 5, 16, dtype)
    ours, theirs = _grads(hf.apply_rotary_pos_emb, q, k, cos, sin), _grads(HF_APPLY, q, k, cos, sin)
    assert len(kernel_calls) == 4  # q and k forward, q and k backward
    for got, want in zip(ours, theirs):
        assert got.dtype == want.dtype and torch.equal(got, want)
        # (the formula's gradients are contiguous whatever the layout: so are the kernel's)
        assert got.stride() == want.stride()


def test_gradients_of_every_dtype_by_gradcheck_and_rounded_once():
    q = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 5, 8, dtype=torch.float64, requires_grad=True)
    cos, sin = hf_cache(1, 5, 8, torch.float64)
    assert torch.autograd.gradcheck(lambda q, k: hf.apply_rotary_pos_emb(q, k, cos, sin), (q, k))
    # bfloat16 as transformers runs it (the cache in the data's dtype): the kernel both ways
    q16, k16, cos16, sin16 = (t.detach().bfloat16() for t in (q, k, cos, sin))
    q_rot, k_rot, q_grad, k_grad = _grads(hf.apply_rotary_pos_emb, q16, k16, cos16, sin16)
    with torch.no_grad():
        assert torch.equal(q_rot, hf.apply_rotary_pos_emb(q16, k16, cos16, sin16)[0])
    assert q_rot.dtype == q_grad.dtype == k_grad.dtype == torch.bfloat16
    # d(sum(q_rot**2))/dq = R^T (2 q_rot): the exact transpose by the same cos/sin, rounded once
    exact = HF_APPLY(2 * q_rot.double(), 2 * q_rot.double(), cos16.double(), -sin16.double())[0]
    ulp = 2.0 ** (torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - 7)
    assert ((q_grad.double() - exact).abs() <= 0.5 * ulp * (1 + 1e-6) + 1e-6).all()


def test_a_cache_needing_a_gradient_takes_the_formula_and_is_counted(kernel_calls):
    q, k = qk((1, 4, 5, 16), (1, 2, 5, 16), torch.float64, "contiguous")
    cos, sin = hf_cache(1, 5, 16, torch.float64)
    before = hf.FALLBACKS["cos/sin need a gradient"]
    cos.requires_grad_()
    q_rot, _ = hf.apply_rotary_pos_emb(q, k, cos, sin)
    q_rot.sum().backward()
    assert kernel_calls == [] and cos.grad is not None
    assert hf.FALLBACKS["cos/sin need a gradient"] == before + 1


def test_requires_grad_without_autograd_takes_the_kernel(kernel_calls):
    q, k = qk((1, 4, 5, 16), (1, 2, 5, 16), torch.float32, "contiguous")
    cos, sin = hf_cache(1, 5, 16)
    q.requires_grad_()
    with torch.no_grad():
        got = hf.apply_rotary_pos_emb(q, k, cos, sin)
    assert len(kernel_calls) == 2
    torch.testing.assert_close(got[0], HF_APPLY(q.detach(), k, cos, sin)[0],
                               **TOL[torch.float32])


# ---------------------------------------------------------------------------
# errors


def test_errors():
    q, k = qk((1, 4, 5, 16), (1, 2, 5, 16), torch.float32, "contiguous")
    cos, sin = hf_cache(1, 5, 16)
    with pytest.raises(TypeError, match="all torch tensors or all NumPy arrays"):
        hf.apply_rotary_pos_emb(q, k, cos.numpy(), sin.numpy())
    with pytest.raises(TypeError, match="all torch tensors or all NumPy arrays"):
        hf.apply_rotary_pos_emb(q.numpy(), k.numpy(), cos, sin)
    with pytest.raises(ValueError, match=r"same even head_dim, got q \(1, 4, 5, 16\), k "
                                         r"\(1, 2, 5, 16\), cos \(1, 1, 5, 8\)"):
        hf.apply_rotary_pos_emb(q, k, cos[..., :8], sin[..., :8])
    with pytest.raises(ValueError, match=r"cos and sin must have the same shape"):
        hf.apply_rotary_pos_emb(q, k, cos, sin[:, :4])
    with pytest.raises(ValueError, match=r"unsqueezed at 2: their leading shape of shape "
                                         r"\(1, 5, 1\) does not broadcast against q"):
        hf.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    with pytest.raises(ValueError, match=r"unsqueeze_dim must be in \[-4, 3\]"):
        hf.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=4)
    with pytest.raises(ValueError, match=r"unsqueeze_dim must be in \[-1, 0\] for cos of shape \(\)"):
        hf.apply_rotary_pos_emb(q, k, torch.tensor(1.0), torch.tensor(0.0))
    with pytest.raises(TypeError, match="q must be a float16, bfloat16, float32 or float64 array, got dtype int64"):
        hf.apply_rotary_pos_emb(np.zeros((1, 4, 5, 16), int), k.numpy(), cos.numpy(),
                                sin.numpy())


# ---------------------------------------------------------------------------
# install


def test_install_and_uninstall():
    mistral = importlib.import_module("transformers.models.mistral.modeling_mistral")
    mistral_apply = mistral.apply_rotary_pos_emb
    installation = hf.install()
    assert modeling_llama.apply_rotary_pos_emb.__wrapped__ is HF_APPLY
    assert mistral.apply_rotary_pos_emb.__wrapped__ is mistral_apply
    assert "transformers.models.qwen3.modeling_qwen3" in installation.modules
    assert hf.install().modules == ()  # already in place
    hf.uninstall()
    assert modeling_llama.apply_rotary_pos_emb is HF_APPLY
    assert mistral.apply_rotary_pos_emb is mistral_apply


def test_install_for_a_model_patches_its_family_only():
    model = transformers.Qwen3ForCausalLM(small_config("qwen3"))
    qwen3 = importlib.import_module("transformers.models.qwen3.modeling_qwen3")
    qwen3_apply = qwen3.apply_rotary_pos_emb
    with hf.install(model) as installation:
        assert installation.modules == ("transformers.models.qwen3.modeling_qwen3",)
        assert qwen3.apply_rotary_pos_emb.__wrapped__ is qwen3_apply
        assert modeling_llama.apply_rotary_pos_emb is HF_APPLY
    assert qwen3.apply_rotary_pos_emb is qwen3_apply


def test_nested_installs_restore_only_their_own():
    hf.install()
    with hf.install(transformers.LlamaForCausalLM(small_config("llama"))) as inner:
        assert inner.modules == ()
    assert modeling_llama.apply_rotary_pos_emb.__wrapped__ is HF_APPLY


def test_install_errors():
    with pytest.raises(ValueError, match=r"Linear has no part from a supported module \(no part "
                                         r"defines apply_rotary_pos_emb\)"):
        hf.install(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="model must be a torch.nn.Module or None, got str"):
        hf.install("llama")


@pytest.mark.parametrize("missing, match", [
    ("torch", "posenc_fast.hf needs torch: pip install torch"),
    ("transformers", "posenc_fast.hf.install needs transformers: pip install transformers"),
])
def test_install_says_what_is_missing(monkeypatch, missing, match):
    monkeypatch.setitem(sys.modules, missing, None)  # makes `import missing` fail
    with pytest.raises(ImportError, match=match):
        hf.install()


def test_numpy_inputs_need_no_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    q, k = qk((1, 2, 5, 8), (1, 2, 5, 8), torch.float64, "contiguous")
    cos, sin = hf_cache(1, 5, 8, torch.float64)
    expected = HF_APPLY(q, k, cos, sin)
    got = hf.apply_rotary_pos_emb(q.numpy(), k.numpy(), cos.numpy(), sin.numpy())
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e.numpy(), rtol=0, atol=1e-14)


# ---------------------------------------------------------------------------
# inside models

ROPE_PARAMETERS = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
             "original_max_position_embeddings": 16},
}
CONFIGS = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config",
           "qwen3": "Qwen3Config"}


def small_config(family, rope="default"):
    return getattr(transformers, CONFIGS[family])(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=256,
        rope_parameters=ROPE_PARAMETERS[rope], pad_token_id=0)


def small_model(family, rope="default"):
    torch.manual_seed(0)
    model_class = getattr(transformers, CONFIGS[family].replace("Config", "ForCausalLM"))
    return model_class(small_config(family, rope)).eval()




def generate(model, ids, attention_mask=None):
    return model.generate(ids, attention_mask=attention_mask, max_new_tokens=6, do_sample=False,
                          use_cache=True, output_logits=True, return_dict_in_generate=True)


@pytest.mark.parametrize("family, rope", [("llama", "default"), ("llama", "llama3"),
                                          ("llama", "yarn"), ("mistral", "default"),
                                          ("qwen2", "default"), ("qwen3", "default")])
def test_model_logits_unchanged(family, rope, kernel_calls):
    model = small_model(family, rope)
    ids = torch.randint(1, 128, (2, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model(ids).logits
        with hf.install(model):
            got = model(ids).logits
    assert kernel_calls == [(2, 40, 4, 16), (2, 40, 2, 16)] * 2  # q, k in each layer
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family, rope", [("llama", "default"), ("llama", "llama3"),
                                          ("qwen3", "default")])
def test_cached_generation_unchanged(family, rope, kernel_calls):
    model = small_model(family, rope)
    ids = torch.randint(1, 128, (1, 12), generator=torch.Generator().manual_seed(3))
    expected = generate(model, ids)
    with hf.install(model):
        got = generate(model, ids)
    assert len(kernel_calls) == 2 * 2 * 6  # q and k, 2 layers, 6 forward passes
    assert torch.equal(got.sequences, expected.sequences)
    for step_got, step_expected in zip(got.logits, expected.logits, strict=True):
        torch.testing.assert_close(step_got, step_expected, rtol=0, atol=1e-5)


def test_left_padded_batch_generation_unchanged(kernel_calls):
    # Padding gives each sequence its own positions: per-sequence caches.
    model = small_model("llama")
    ids = torch.randint(1, 128, (2, 10), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    ids[0, :4], mask[0, :4] = 0, 0
    expected = generate(model, ids, mask)
    with hf.install(model):
        got = generate(model, ids, mask)
    assert kernel_calls
    assert torch.equal(got.sequences, expected.sequences)
    for step_got, step_expected in zip(got.logits, expected.logits, strict=True):
        torch.testing.assert_close(step_got, step_expected, rtol=0, atol=1e-5)


def test_a_cache_changed_in_place_is_checked_again(kernel_calls):
    # The check that cos/sin repeat is remembered for the last tensors, until they change.
    q, k = qk((1, 4, 5, 16), (1, 2, 5, 16), torch.float32, "contiguous")
    cos, sin = hf_cache(1, 5, 16)
    hf.apply_rotary_pos_emb(q, k, cos, sin)
    assert len(kernel_calls) == 2
    cos[..., -1] += 0.5  # its halves now differ: transformers' formula, which rotates no pairs
    got = hf.apply_rotary_pos_emb(q, k, cos, sin)
    assert len(kernel_calls) == 2
    torch.testing.assert_close(got[0], HF_APPLY(q, k, cos, sin)[0], rtol=0, atol=0)
