"""posenc_fast.hf's one-tensor drop-in against Gemma 4's own ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim)``.

Gemma 3n, Gemma 4, Gemma 4 unified and DiffusionGemma rotate q and k in
separate calls of this form; `hf.apply_rotary_pos_emb_single` and what
`install` puts in their modules must give their function's results (bit for
bit in float32/float64, one rounding for half types), its gradients, and its
fallbacks.  Skipped unless torch and transformers are installed; nothing is
downloaded.
"""

import importlib
import re
import warnings

import numpy as np
import pytest

from posenc_fast import hf
from posenc_fast._hf_functions import ROTARY_FUNCTIONS

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_tiny  # noqa: E402  (needs torch)
from hf_tiny import full_width_cache as cache, kernel_calls  # noqa: E402,F401  (kernel_calls: a fixture)

# Gemma's form (a full-width cache); DeepSeek-V4's half-width one on trailing features: test_hf_deepseek_v4.py
ONE_TENSOR = sorted(name for name, function in ROTARY_FUNCTIONS.items()
                    if function.one_tensor and function.cache == "halves")


def own(name):
    """The module's own function (kept while a test has posenc_fast installed)."""
    function = importlib.import_module(hf._module_name(name)).apply_rotary_pos_emb
    return getattr(function, "__wrapped__", function)


GEMMA4 = own("gemma4")


@pytest.fixture(autouse=True)
def restore_transformers():
    yield
    hf.uninstall()


def data(shape, dtype=torch.float32, layout="contiguous", seed=1):
    """Random data of the logical `shape`: contiguous, a view with axes 1 and 2 swapped in memory,
    or a strided last axis."""
    generator = torch.Generator().manual_seed(seed)
    if layout == "transposed":
        b, one, two, d = shape
        return torch.randn((b, two, one, d), generator=generator, dtype=dtype).transpose(1, 2)
    if layout == "strided":
        return torch.randn(shape[:-1] + (2 * shape[-1],), generator=generator, dtype=dtype)[..., 1::2]
    return torch.randn(shape, generator=generator, dtype=dtype)


def patched(name="gemma4"):
    """What install puts in the module's place."""
    return hf._replacement(own(name), ROTARY_FUNCTIONS[name])


def assert_same(got, want):
    assert type(got) is torch.Tensor and got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)


# ---------------------------------------------------------------------------
# the results


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ONE_TENSOR)
def test_equals_the_modules_own_bitwise(name, dtype, layout, kernel_calls):
    original, replacement = own(name), patched(name)
    cos, sin = cache(2, 7, 32, dtype)
    # Gemma 4's call: (batch, seq, heads, head_dim) with unsqueeze_dim=2; Llama's order with 1
    for unsqueeze_dim, shape in ((2, (2, 7, 4, 32)), (1, (2, 4, 7, 32))):
        x = data(shape, dtype, layout)
        x_before = x.clone()
        want = original(x, cos, sin, unsqueeze_dim=unsqueeze_dim)
        for got in (replacement(x, cos, sin, unsqueeze_dim=unsqueeze_dim),
                    hf.apply_rotary_pos_emb_single(x, cos, sin, unsqueeze_dim=unsqueeze_dim)):
            assert_same(got, want)
            if layout != "strided":  # torch's output strides follow the input's memory order; so do ours
                assert got.stride() == want.stride()
        assert torch.equal(x, x_before)
    assert kernel_calls == [True] * 4


def test_arguments_by_keyword_take_the_kernel(kernel_calls):
    # Gemma 4's vision tower calls apply_rotary_pos_emb(x=..., cos=..., sin=..., unsqueeze_dim=...)
    x, (cos, sin) = data((2, 7, 4, 16)), cache(2, 7, 16)
    want = GEMMA4(x, cos, sin, unsqueeze_dim=2)
    assert_same(patched()(x=x, cos=cos, sin=sin, unsqueeze_dim=2), want)
    assert_same(patched()(x, sin=sin, cos=cos, unsqueeze_dim=2), want)
    x_heads_first = data((2, 4, 7, 16))
    assert_same(patched()(x_heads_first, cos, sin), GEMMA4(x_heads_first, cos, sin))  # unsqueeze_dim=1
    assert kernel_calls == [True] * 3


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_takes_the_kernel_and_rounds_once(dtype, layout, kernel_calls):
    # the cache in the data's dtype, as Gemma 4's rotary module returns it
    x, (cos, sin) = data((1, 5, 4, 16), dtype, layout), cache(1, 5, 16, dtype)
    with torch.no_grad():
        got = patched()(x, cos, sin, unsqueeze_dim=2)
    assert kernel_calls == [True]
    want = GEMMA4(x, cos, sin, unsqueeze_dim=2)
    assert got.dtype == want.dtype and got.shape == x.shape
    # float32 arithmetic on the half inputs, rounded once
    x32, c32, s32 = x.float(), cos.float()[:, :, None], sin.float()[:, :, None]
    rotated = torch.cat((-x32[..., 8:], x32[..., :8]), dim=-1)
    assert torch.equal(got, (x32 * c32 + rotated * s32).to(want.dtype))
    # within one rounding of the module's own (which rounds each operation to the half type)
    exact = GEMMA4(x.double(), cos.double(), sin.double(), unsqueeze_dim=2)
    assert (got.double() - exact).abs().max() <= (want.double() - exact).abs().max()
    assert (got.double() - want.double()).abs().max() <= 4 * torch.finfo(dtype).eps * exact.abs().max()


def test_numpy_in_numpy_out():
    x, (cos, sin) = data((2, 4, 5, 16), torch.float64, "transposed"), cache(2, 5, 16, torch.float64)
    got = hf.apply_rotary_pos_emb_single(x.numpy(), cos.numpy(), sin.numpy())
    assert type(got) is np.ndarray
    np.testing.assert_array_equal(got, GEMMA4(x, cos, sin).numpy())


# ---------------------------------------------------------------------------
# gradients


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_gradients_through_the_kernel_equal_the_modules_own(dtype, layout, kernel_calls):
    x, (cos, sin) = data((1, 5, 4, 16), dtype, layout), cache(1, 5, 16, dtype)

    def grads(function):
        leaf = x.detach().clone().requires_grad_()
        rotated = function(leaf, cos, sin, unsqueeze_dim=2)
        # Gemma 4 transposes the result to (batch, heads, seq, dim): a transposed incoming gradient;
        # autograd.grad gives the gradient as the backward made it (.grad is laid out as its tensor)
        loss = rotated.transpose(1, 2).contiguous().pow(3).sum()
        return rotated, torch.autograd.grad(loss, leaf)[0]

    (got, got_grad), (want, want_grad) = grads(patched()), grads(GEMMA4)
    assert kernel_calls == [True]
    assert type(got.grad_fn).__name__ == "RotationBackward"  # the kernel's backward, not the formula's
    assert_same(got.detach(), want.detach())
    assert_same(got_grad, want_grad)
    # in the formula's layout (contiguous), so that what reduces them next sums in the same order
    assert got.stride() == want.stride() and got_grad.stride() == want_grad.stride()


def test_gradients_by_gradcheck():
    x = torch.randn(1, 5, 2, 8, dtype=torch.float64, requires_grad=True)
    cos, sin = cache(1, 5, 8, torch.float64)
    assert torch.autograd.gradcheck(
        lambda x: hf.apply_rotary_pos_emb_single(x, cos, sin, unsqueeze_dim=2), (x,))


def test_a_cache_needing_a_gradient_takes_the_formula_and_is_counted(kernel_calls):
    x, (cos, sin) = data((1, 5, 4, 16), torch.float64), cache(1, 5, 16, torch.float64)
    cos_theirs = cos.clone().requires_grad_()
    GEMMA4(x, cos_theirs, sin, unsqueeze_dim=2).sum().backward()
    before = hf.FALLBACKS["cos/sin need a gradient"]
    cos.requires_grad_()
    for function in (patched(), hf.apply_rotary_pos_emb_single):
        cos.grad = None
        got = function(x, cos, sin, unsqueeze_dim=2)
        got.sum().backward()
        assert_same(got.detach(), GEMMA4(x, cos.detach(), sin, unsqueeze_dim=2))
        assert_same(cos.grad, cos_theirs.grad)
    assert kernel_calls == [False, False]
    assert hf.FALLBACKS["cos/sin need a gradient"] == before + 2


# ---------------------------------------------------------------------------
# what falls back, and errors


def test_what_the_kernel_cannot_take_runs_the_modules_own(kernel_calls):
    x, (cos, sin) = data((1, 5, 4, 16)), cache(1, 5, 16)
    uneven = cos.clone()
    uneven[..., -1] += 0.5  # halves differ: its formula is then no rotation of pairs
    # integer data; caches wider than the data (torch returns the cache's dtype)
    cases = [(x, uneven, sin), (x.long(), cos, sin), (x, cos.double(), sin.double()),
             (x.bfloat16(), cos, sin), (x.bfloat16(), cos.double(), sin.double())]
    for args in cases:
        want = GEMMA4(*args, unsqueeze_dim=2)
        assert_same(patched()(*args, unsqueeze_dim=2), want)
        assert_same(hf.apply_rotary_pos_emb_single(*args, unsqueeze_dim=2), want)
    assert kernel_calls == [False] * 2 * len(cases)
    # a call not of transformers' form (unsqueeze_dim by position) is the module's own
    assert_same(patched()(x, cos, sin, 2), GEMMA4(x, cos, sin, 2))
    assert len(kernel_calls) == 2 * len(cases)


def test_a_cache_not_fitting_the_head_is_the_modules_own_or_an_error():
    x, (cos, sin) = data((1, 5, 4, 16)), cache(1, 5, 8)
    with pytest.raises(RuntimeError) as theirs:
        GEMMA4(x, cos, sin, unsqueeze_dim=2)
    with pytest.raises(RuntimeError, match=re.escape(str(theirs.value))):
        patched()(x, cos, sin, unsqueeze_dim=2)
    with pytest.raises(ValueError, match=r"x and the unsqueezed cos/sin must end in the same even head_dim, "
                                         r"got x \(1, 5, 4, 16\), cos \(1, 5, 1, 8\)"):
        hf.apply_rotary_pos_emb_single(x, cos, sin, unsqueeze_dim=2)


def test_errors():
    x, (cos, sin) = data((1, 5, 4, 16)), cache(1, 5, 16)
    with pytest.raises(TypeError, match="x, cos and sin must be all torch tensors or all NumPy arrays"):
        hf.apply_rotary_pos_emb_single(x, cos.numpy(), sin.numpy())
    with pytest.raises(TypeError, match="x, cos and sin must be all torch tensors or all NumPy arrays"):
        hf.apply_rotary_pos_emb_single(x.numpy(), cos, sin)
    with pytest.raises(ValueError, match=r"unsqueezed at 1: their leading shape of shape "
                                         r"\(1, 1, 5\) does not broadcast against x"):
        hf.apply_rotary_pos_emb_single(x.numpy(), cos.numpy(), sin.numpy(), unsqueeze_dim=1)
    with pytest.raises(TypeError, match="x must be a float16, bfloat16, float32 or float64 array, got dtype int64"):
        hf.apply_rotary_pos_emb_single(np.zeros((1, 5, 4, 16), int), cos.numpy(), sin.numpy())


# ---------------------------------------------------------------------------
# inside tiny models (every model type of these modules: test_hf_install_models.py)


@pytest.mark.parametrize("model_type, calls", [
    ("gemma4_text", [True] * 4),  # q and k of its sliding and its full-attention layer
    ("gemma3n_text", [True] * 6),  # its two last layers reuse the keys of the two before: q only
])
def test_install_takes_the_kernel_in_every_call(model_type, calls, kernel_calls):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = hf_tiny.tiny_model(model_type)
    ids = torch.randint(1, 128, (hf_tiny.BATCH, hf_tiny.SEQ), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits
        with hf.install(model) as installation:
            got = model(input_ids=ids, use_cache=False).logits
    assert installation.modules == (hf_tiny.model_module(model_type),)
    assert kernel_calls == calls
    assert torch.equal(got, want)
