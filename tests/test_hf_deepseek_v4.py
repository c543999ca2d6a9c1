"""What hf.install puts in place of DeepSeek-V4's ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1)``.

Its function rotates the trailing ``2 * cos.shape[-1]`` features of each head
in interleaved pairs, from a half-width cache (one entry per pair), computed
in float32 and rounded once, and passes the leading ones through; its
attention calls it once more with ``-sin`` on the attention output (the
inverse rotation).  The replacement must give its results bit for bit (half
types included: its rounding is the kernel's), its gradients, and its
fallbacks.  Skipped unless torch and transformers are installed; nothing is
downloaded.
"""

import importlib
import warnings

import pytest

import posenc_fast as pf
from posenc_fast import hf
from posenc_fast._hf_functions import ROTARY_FUNCTIONS

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_tiny  # noqa: E402  (needs torch)
from hf_tiny import kernel_calls  # noqa: E402,F401  (a fixture)

MODULE = importlib.import_module(hf._module_name("deepseek_v4"))
OWN = getattr(MODULE.apply_rotary_pos_emb, "__wrapped__", MODULE.apply_rotary_pos_emb)
PATCHED = hf._replacement(OWN, ROTARY_FUNCTIONS["deepseek_v4"])


@pytest.fixture(autouse=True)
def restore_transformers():
    yield
    hf.uninstall()


def cache(batch, seq, pairs, dtype=torch.float32, seed=0):
    """A half-width (batch, seq, pairs) cos/sin cache, as DeepseekV4RotaryEmbedding returns it (x's dtype)."""
    generator = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 4096, (batch, seq, 1), generator=generator).double()
    angles = positions * 10000.0 ** (-torch.arange(0, 2 * pairs, 2, dtype=torch.float64) / (2 * pairs))
    return angles.cos().to(dtype), angles.sin().to(dtype)


def data(shape, dtype=torch.float32, layout="contiguous", seed=1):
    """Random data of the logical `shape`: contiguous, axes 1 and 2 swapped in memory, or a strided last axis."""
    generator = torch.Generator().manual_seed(seed)
    if layout == "transposed":
        b, one, two, d = shape
        return torch.randn((b, two, one, d), generator=generator).to(dtype).transpose(1, 2)
    if layout == "strided":
        return torch.randn(shape[:-1] + (2 * shape[-1],), generator=generator).to(dtype)[..., 1::2]
    return torch.randn(shape, generator=generator).to(dtype)


def assert_same(got, want):
    assert type(got) is torch.Tensor and got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pairs", [4, 8, 12])  # the trailing 8, 16 or 24 of 24 features
def test_equals_the_modules_own_bitwise(pairs, dtype, layout, kernel_calls):
    for inverse in (False, True):  # its attention output is rotated back with -sin
        cos, sin = cache(2, 5, pairs, dtype)
        sin = -sin if inverse else sin
        # its attention's (batch, heads, seq, head_dim) with unsqueeze_dim=1; (batch, seq, heads, dim) with 2
        for unsqueeze_dim, shape in ((1, (2, 3, 5, 24)), (2, (2, 5, 3, 24))):
            x = data(shape, dtype, layout)
            x_before = x.clone()
            want = OWN(x, cos, sin, unsqueeze_dim=unsqueeze_dim)
            got = PATCHED(x, cos, sin, unsqueeze_dim=unsqueeze_dim)
            assert_same(got, want)
            assert torch.equal(x, x_before)
            # the leading features pass through bit for bit (a NaN's payload too)
            lead = x.shape[-1] - 2 * pairs
            assert torch.equal(got[..., :lead].view(torch.int16 if dtype != torch.float32 else torch.int32),
                               x[..., :lead].view(torch.int16 if dtype != torch.float32 else torch.int32))
    assert kernel_calls == [True] * 4


def rotated64(x, cos, sin):
    """The rotation in float64, independent of the module: features lead + 2i and lead + 2i + 1 form pair i."""
    x, c, s = x.double(), cos.double()[:, None], sin.double()[:, None]
    lead, out = x.shape[-1] - 2 * cos.shape[-1], x.clone()
    a, b = x[..., lead::2], x[..., lead + 1::2]
    out[..., lead::2], out[..., lead + 1::2] = a * c - b * s, b * c + a * s
    return out


def test_rotates_the_trailing_pairs_by_the_angle():
    x, (cos, sin) = data((1, 1, 3, 12)), cache(1, 3, 4)
    got = PATCHED(x, cos, sin)
    assert torch.equal(got[..., :4], x[..., :4])
    torch.testing.assert_close(got.double(), rotated64(x, cos, sin), rtol=0, atol=1e-6)


def test_the_inverse_call_undoes_the_rotation():
    x, (cos, sin) = data((2, 3, 5, 24)), cache(2, 5, 8)
    back = PATCHED(PATCHED(x, cos, sin), cos, -sin)
    torch.testing.assert_close(back, x, rtol=0, atol=1e-5)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_gradients_through_the_kernel_equal_the_modules_own(layout, kernel_calls):
    x, (cos, sin) = data((2, 3, 5, 24), torch.float32, layout), cache(2, 5, 8)

    def grads(function):
        leaf = x.detach().clone().requires_grad_()
        rotated = function(function(leaf, cos, sin), cos, -sin)  # forward and inverse, as its attention
        loss = rotated.float().pow(3).sum()
        return rotated, torch.autograd.grad(loss, leaf)[0]

    (got, got_grad), (want, want_grad) = grads(PATCHED), grads(OWN)
    assert kernel_calls == [True, True]
    assert type(got.grad_fn).__name__ == "RotationBackward"  # the kernel's backward, not the formula's
    assert_same(got.detach(), want.detach())
    assert_same(got_grad, want_grad)
    assert got_grad.stride() == want_grad.stride()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_gradients_are_rounded_once(dtype, kernel_calls):
    # The module's backward rounds the gradients of its two products to x's dtype before adding them
    # (rope.float() and rotate_half(rope).float() are separate casts); the kernel's transpose rounds once.
    x, (cos, sin) = data((2, 3, 5, 24), dtype), cache(2, 5, 8, dtype)
    weights = torch.randn(x.shape, generator=torch.Generator().manual_seed(5)).to(dtype)

    def grad(function):
        leaf = x.detach().clone().requires_grad_()
        rotated = function(leaf, cos, sin)
        return rotated, torch.autograd.grad((rotated.float() * weights.float()).sum(), leaf)[0]

    (got, got_grad), (want, want_grad) = grad(PATCHED), grad(OWN)
    assert kernel_calls == [True]
    assert_same(got.detach(), want.detach())
    # the float32 inverse rotation of the incoming gradient, rounded once
    assert_same(got_grad, OWN(weights.float(), cos.float(), -sin.float()).to(dtype))
    exact = rotated64(weights, cos, -sin)
    assert (got_grad.double() - exact).abs().max() <= (want_grad.double() - exact).abs().max()


def test_what_the_kernel_cannot_take_exactly_runs_the_modules_own(kernel_calls):
    x, (cos, sin) = data((1, 3, 5, 24)), cache(1, 5, 8)
    # float64 data or cache: its .float() rounds them to float32 first; fp16 data with a bfloat16 cache;
    # integer data; a cache needing a gradient
    cases = [(x.double(), cos.double(), sin.double()), (x, cos.double(), sin.double()),
             (x.double(), cos, sin), (x.half(), cos.bfloat16(), sin.bfloat16()), (x.long(), cos, sin)]
    for args in cases:
        assert_same(PATCHED(*args), OWN(*args))
    assert kernel_calls == [False] * len(cases)
    before = hf.FALLBACKS["cos/sin need a gradient"]
    cos_grad = cos.clone().requires_grad_()
    assert_same(PATCHED(x, cos_grad, sin).detach(), OWN(x, cos, sin))
    assert hf.FALLBACKS["cos/sin need a gradient"] == before + 1
    # a call not of transformers' form (unsqueeze_dim by position), and a cache wider than the head
    assert_same(PATCHED(x.transpose(1, 2), cos, sin, 2), OWN(x.transpose(1, 2), cos, sin, 2))
    wide = cache(1, 5, 16)
    with pytest.raises(RuntimeError):
        OWN(x, *wide)
    with pytest.raises(RuntimeError):
        PATCHED(x, *wide)
    assert kernel_calls == [False] * (len(cases) + 1)


def test_a_tiny_model_takes_the_kernel_in_every_call(kernel_calls):
    # hf_tiny's DeepSeek-V4: the trailing 16 of 32 features; a heavily compressed layer (q, kv, the output
    # rotated back) and a compressed sparse one (those, its compressor's windows, its indexer's
    # compressor and queries: 128 features, the trailing 16 rotated)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = hf_tiny.tiny_model("deepseek_v4")
    assert (model.config.head_dim, model.config.qk_rope_head_dim) == (32, 16)
    ids = torch.randint(1, 128, (hf_tiny.BATCH, hf_tiny.SEQ), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits
        with hf.install(model) as installation:
            got = model(input_ids=ids, use_cache=False).logits
    assert installation.modules == (hf._module_name("deepseek_v4"),)
    assert kernel_calls == [True] * 9
    assert torch.equal(got, want)


def test_only_the_layers_with_an_indexer_give_its_rope():
    # DeepseekV4Attention: a compressed sparse layer's compressor has the indexer; heavily compressed and
    # sliding layers have none, and from_hf_config(layer=i, attention="indexer") refuses them
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = hf_tiny.tiny_model("deepseek_v4")
    config = model.config.to_dict()
    has = [getattr(layer.self_attn.compressor, "indexer", None) is not None for layer in model.model.layers]
    assert any(has) and not all(has)
    want = repr(pf.RotaryEmbedding.from_hf_config(config, attention="indexer"))
    for i, own in enumerate(has):
        if own:
            assert repr(pf.RotaryEmbedding.from_hf_config(config, attention="indexer", layer=i)) == want
        else:
            with pytest.raises(ValueError, match=rf"only the 'compressed_sparse_attention' layers have an indexer.*\(layer {i}\)"):
                pf.RotaryEmbedding.from_hf_config(config, attention="indexer", layer=i)
