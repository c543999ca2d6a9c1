"""What hf.install puts in place of the vision towers' ``apply_rotary_pos_emb_vision(q, k, cos, sin)``.

Qwen2-VL's form (and that of 24 more modules): q, k, cos and sin taken to
float32 (``.float()``), cos/sin unsqueezed at -2, ``x * cos + rotate_half(x)
* sin``, each result cast back to its input's dtype; Inkling2's the same on
interleaved pairs (``rotate_pairwise``), MiniMax-M3-VL's on the leading
``cos.shape[-1]`` features without the casts.  The replacement must give
each module's results bit for bit (half types too: one float32 rounding, as
theirs), its gradients, and its fallbacks.  Skipped unless torch and
transformers are installed; nothing is downloaded.
"""

import importlib
import warnings

import pytest

from posenc_fast import hf
from posenc_fast._hf_functions import VISION_FUNCTIONS

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_tiny  # noqa: E402  (needs torch)
from hf_tiny import kernel_calls  # noqa: E402,F401  (a fixture)


def own(name):
    """The module's own function (kept while a test has posenc_fast installed)."""
    function = importlib.import_module(hf._module_name(name)).apply_rotary_pos_emb_vision
    return getattr(function, "__wrapped__", function)


def patched(name="qwen2_vl"):
    """What install puts in the module's place."""
    return hf._replacement(own(name), VISION_FUNCTIONS[name])


QWEN2_VL = own("qwen2_vl")


@pytest.fixture(autouse=True)
def restore_transformers():
    yield
    hf.uninstall()


def cache(patches, rotated, function=VISION_FUNCTIONS["qwen2_vl"], dtype=torch.float32, seed=0):
    """A (patches, rotated) cos/sin cache in the form `function` reads (halves or pairs repeated)."""
    generator = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 64, (patches, 1), generator=generator).double()
    angles = positions * 10000.0 ** (-torch.arange(0, rotated, 2, dtype=torch.float64) / rotated)
    angles = angles.repeat_interleave(2, -1) if function.cache == "pairs" else torch.cat((angles, angles), -1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def qkv(patches, heads, dim, dtype=torch.float32, seed=1):
    """q and k as a tower's attention makes them: strided views of one fused projection, (patches, heads, dim)."""
    fused = torch.randn(patches, 3 * heads * dim, generator=torch.Generator().manual_seed(seed)).to(dtype)
    q, k, _ = fused.reshape(patches, 3, heads, dim).permute(1, 0, 2, 3).unbind(0)
    return q, k


def assert_same(got, want):
    for g, w in zip(got, want, strict=True):
        assert type(g) is torch.Tensor and g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g, w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["qwen2_vl", "inkling2", "minimax_m3_vl"])
def test_equals_the_modules_own_bitwise(name, dtype, kernel_calls):
    function = VISION_FUNCTIONS[name]
    q, k = qkv(12, 3, 16, dtype)
    widths = (16, 10) if function.partial else (16,)  # MiniMax-M3-VL: the leading 10 of 16
    # MiniMax-M3-VL computes in a half type itself, op by op (its cache in x's dtype): the kernel, in float32
    # and rounded once, is within a rounding of it there (as for Llama's half types), bitwise in float32
    bitwise = function.compute == "float32" or dtype == torch.float32
    for width in widths:
        cos, sin = cache(12, width, function, torch.float32 if function.compute == "float32" else dtype)
        q_before = q.clone()
        want = own(name)(q, k, cos, sin)
        for got in (patched(name)(q, k, cos, sin), patched(name)(q=q, k=k, cos=cos, sin=sin)):
            if bitwise:
                assert_same(got, want)
            else:
                for g, w in zip(got, want, strict=True):
                    assert g.dtype == w.dtype
                    torch.testing.assert_close(g, w, rtol=2 * torch.finfo(dtype).eps, atol=2 * torch.finfo(dtype).eps)
        assert torch.equal(q, q_before)
    assert kernel_calls == [True] * 2 * len(widths)


def test_each_result_in_its_inputs_dtype(kernel_calls):
    # a float32 cache, as the towers build it, with bfloat16 data: bfloat16 results, rounded once
    (q, k), (cos, sin) = qkv(8, 2, 16, torch.bfloat16), cache(8, 16)
    got = patched()(q, k, cos, sin)
    assert_same(got, QWEN2_VL(q, k, cos, sin))
    c, s = cos[:, None], sin[:, None]
    q32 = q.float()
    assert torch.equal(got[0], (q32 * c + torch.cat((-q32[..., 8:], q32[..., :8]), -1) * s).bfloat16())
    assert kernel_calls == [True]


def test_what_the_kernel_cannot_take_exactly_runs_the_modules_own(kernel_calls):
    (q, k), (cos, sin) = qkv(8, 2, 16), cache(8, 16)
    uneven = cos.clone()
    uneven[:, -1] += 0.5  # halves differ: no rotation of pairs
    # .float() would round float64 data or a float64 cache first; q and k of two dtypes; a half cache
    # of another half type
    cases = [(q.double(), k.double(), cos, sin), (q, k, cos.double(), sin.double()), (q, k.bfloat16(), cos, sin),
             (q.half(), k.half(), cos.bfloat16(), sin.bfloat16()), (q, k, uneven, sin)]
    for args in cases:
        assert_same(patched()(*args), QWEN2_VL(*args))
    assert kernel_calls == [False] * len(cases)
    # the towers' functions take no unsqueeze_dim: a call passing one is theirs, and so is its error
    with pytest.raises(TypeError, match="unsqueeze_dim"):
        patched()(q, k, cos, sin, unsqueeze_dim=1)
    # MiniMax-M3-VL's cos[:, None, :] on a 1-D cache: its own IndexError
    with pytest.raises(IndexError):
        patched("minimax_m3_vl")(q, k, cos[0], sin[0])
    assert len(kernel_calls) == len(cases)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_through_the_kernel_equal_the_modules_own(dtype, kernel_calls):
    # its backward casts the float32 gradient of q.float() back once: the kernel's rounding
    (q, k), (cos, sin) = qkv(8, 2, 16, dtype), cache(8, 16)

    def grads(function):
        q_leaf, k_leaf = (t.detach().clone().requires_grad_() for t in (q, k))
        q_rot, k_rot = function(q_leaf, k_leaf, cos, sin)
        loss = (q_rot.float().pow(3) + 2 * k_rot.float()).sum()
        return (q_rot, k_rot), torch.autograd.grad(loss, (q_leaf, k_leaf))

    (got, got_grads), (want, want_grads) = grads(patched()), grads(QWEN2_VL)
    assert kernel_calls == [True]
    assert type(got[0].grad_fn).__name__ == "RotationBackward"
    assert_same([t.detach() for t in got], [t.detach() for t in want])
    assert_same(got_grads, want_grads)


@pytest.mark.parametrize("model_type, calls", [
    ("qwen2_vl_vision", 1),  # hf_tiny's tower has one block: one call for q and k
    ("glm4v_vision", 1),
])
def test_a_tiny_tower_takes_the_kernel_in_every_call(model_type, calls, kernel_calls):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = hf_tiny.tiny_model(model_type)
    inputs = hf_tiny.model_inputs(model_type, model, None)
    with torch.no_grad():
        want = model(**inputs).last_hidden_state
        with hf.install(model) as installation:
            got = model(**inputs).last_hidden_state
    assert installation.modules == (hf_tiny.model_module(model_type),)
    assert kernel_calls == [True] * calls
    assert torch.equal(got, want)
