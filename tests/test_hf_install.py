"""hf.install for every modeling module of the installed transformers whose function it can take.

Skipped unless torch and transformers are installed.  Nothing is downloaded:
random tensors, and tiny models built from shrunk default configs.
"""

import importlib
import re
from pathlib import Path

import pytest

from posenc_fast import hf
from posenc_fast._hf_functions import INTERLEAVE_FUNCTIONS, NOT_PATCHED, ROTARY_FUNCTIONS, VISION_FUNCTIONS

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_calls  # noqa: E402  (needs torch)
import hf_tiny  # noqa: E402  (needs torch)
from hf_tiny import kernel_calls  # noqa: E402,F401  (a fixture)

MODELS = Path(transformers.__file__).parent / "models"


@pytest.fixture(autouse=True)
def restore_transformers():
    yield
    hf.uninstall()


# ---------------------------------------------------------------------------
# the table against the source and behaviour of the installed transformers


def modules_with_the_function(name="apply_rotary_pos_emb"):
    """Folders of transformers/models whose modeling module defines the function `name`."""
    return sorted(path.parent.name for path in MODELS.glob("*/modeling_*.py")
                  if path.stem == f"modeling_{path.parent.name}"
                  and re.search(rf"^def {name}\(", path.read_text(), re.M))


def test_every_module_with_the_function_is_classified():
    not_patched = set()  # modules with a function of a patched name that is not in its table
    for name, table in hf._PATCHED.items():
        found = set(modules_with_the_function(name))
        assert found - set(table) - set(NOT_PATCHED) == set(), f"read them into the table of {name}"
        assert set(table) <= found, f"rows of {name} for modules gone"
        not_patched |= found - set(table)
        for module, function in table.items():
            assert function.source == f"{module}/modeling_{module}.py"
    assert set(NOT_PATCHED) == not_patched, "NOT_PATCHED rows for modules gone, or now patched"


def dtypes(function):
    """(dtype, True when the kernel takes it) to compare in."""
    if function.compute == "float32":  # float32 arithmetic rounded once: bitwise for half types too
        return [(torch.float32, True), (torch.bfloat16, True), (torch.float16, True),
                (torch.float64, False)]  # q.float() rounds float64 data first
    return [(torch.float32, True), (torch.float64, True)]


@pytest.mark.parametrize("name, function_name",
                         [(name, "apply_rotary_pos_emb") for name in sorted(ROTARY_FUNCTIONS)]
                         + [(name, "apply_rotary_pos_emb_interleave") for name in sorted(INTERLEAVE_FUNCTIONS)]
                         + [(name, "apply_rotary_pos_emb_vision") for name in sorted(VISION_FUNCTIONS)])
def test_function_equals_the_modules_own(name, function_name, kernel_calls):
    module = importlib.import_module(hf._module_name(name))
    function = hf._PATCHED[function_name][name]
    own = getattr(module, function_name)
    patched = hf._replacement(own, function)
    widths = (16, 8) if function.partial else (16,)
    for dtype, kernel in dtypes(function):
        for width in widths:
            for number, case in enumerate(hf_calls.cases(function)):
                xs = hf_calls.data(case, dtype, seed=width)
                cos, sin = hf_calls.cache(function, case.lead, width, dtype, seed=number)
                with torch.no_grad():
                    expected = hf_calls.call(function, own, xs, cos, sin, case)
                    got = hf_calls.call(function, patched, xs, cos, sin, case)
                assert kernel_calls == [kernel] * (len(xs) if function.one_tensor else 1)
                kernel_calls.clear()
                for g, e in zip(got, expected, strict=True):
                    assert g.dtype == e.dtype and g.shape == e.shape
                    assert torch.equal(g, e), f"{dtype}, width {width}, unsqueeze_dim {case.unsqueeze_dim}"


def test_data_of_another_rank_takes_gptjs_own_function(kernel_calls):
    # GPT-J's formula indexes axes by number (x[:, :, :, ::2], sin[:, :, None, :] repeated along axis 3):
    # only (batch, seq, heads, dim) data with (batch, seq, dim / 2) caches are its rotation
    function = ROTARY_FUNCTIONS["gptj"]
    patched = hf._replacement(importlib.import_module(hf._module_name("gptj")).apply_rotary_pos_emb, function)
    cos, sin = hf_calls.cache(function, (3, 1), 16)
    with pytest.raises(IndexError):  # rotate_every_two's x[:, :, :, ::2]
        patched(torch.randn(5, 3, 16, dtype=torch.float64), sin, cos)
    x = torch.randn(2, 5, 3, 16, dtype=torch.float64)
    cos, sin = hf_calls.cache(function, (1, 2, 5), 16)  # a leading axis more: [:, :, None, :] is not axis 2
    with pytest.raises(RuntimeError):
        patched(x, sin, cos)
    assert kernel_calls == []


def test_more_patches_than_tokens_takes_dinov3s_own_function(kernel_calls):
    # DINOv3's split of q into (tokens - patches, patches) fails: so does the patched function
    function = ROTARY_FUNCTIONS["dinov3_vit"]
    patched = hf._replacement(importlib.import_module(hf._module_name("dinov3_vit")).apply_rotary_pos_emb, function)
    cos, sin = hf_calls.cache(function, (7,), 16)
    q, k = torch.randn(2, 3, 5, 16), torch.randn(2, 3, 5, 16)
    with pytest.raises(RuntimeError, match="split_with_sizes"):
        patched(q, k, cos.float(), sin.float())
    assert kernel_calls == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pe_sums_from_positive_zero_bit_for_bit(dtype, kernel_calls):
    # PE's sum of x0 cos + x1 (-sin) starts from +0: where that is -0 (signed zeros in the data, sin 0 at
    # position 0) its result is +0, and so the patched function's, every bit the same
    function = ROTARY_FUNCTIONS["pe_audio"]
    own = importlib.import_module(hf._module_name("pe_audio")).apply_rotary_pos_emb
    patched = hf._replacement(own, function)
    generator = torch.Generator().manual_seed(5)
    signs = torch.randint(0, 2, (2, 3, 5, 16), generator=generator).to(dtype) * 2 - 1
    q = signs * torch.randint(0, 2, (2, 3, 5, 16), generator=generator).to(dtype)  # ±0 and ±1
    k = -q.transpose(1, 2).contiguous().transpose(1, 2)  # the other signs, (batch, seq, heads, dim) memory
    angles = torch.arange(5, dtype=dtype)[None, :, None].expand(2, 5, 8) * 0.5  # position 0: sin 0
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    with torch.no_grad():
        expected, got = own(q, k, cos, sin), patched(q, k, cos, sin)
    assert kernel_calls == [True]
    bits = torch.int32 if dtype == torch.float32 else torch.int64
    for g, e in zip(got, expected):
        assert (e.view(bits) == torch.zeros((), dtype=dtype).view(bits)).any()  # +0 where the rotation is -0
        assert torch.equal(g.view(bits), e.view(bits)) and g.stride() == e.stride()


# ---------------------------------------------------------------------------
# inside tiny random models (every model type: test_hf_install_models.py)


def test_half_precision_model_unchanged(kernel_calls):
    # Cohere computes in float32 and rounds once, as the kernel does: bitwise the same rotations
    model = hf_tiny.tiny_model("cohere").to(torch.bfloat16)
    ids = torch.randint(1, 128, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        with hf.install(model):
            got = model(input_ids=ids).logits
    assert kernel_calls and all(kernel_calls)
    assert torch.equal(got, expected)


def _gptj_model():
    return transformers.GPTJForCausalLM(transformers.GPTJConfig(
        n_embd=64, n_layer=1, n_head=4, rotary_dim=8, vocab_size=128, bos_token_id=0, eos_token_id=0))


def test_install_refuses_a_model_it_cannot_take(monkeypatch):
    # a module in NOT_PATCHED (GPT-J's, were it not in the table), with the reason
    monkeypatch.delitem(ROTARY_FUNCTIONS, "gptj")
    monkeypatch.setitem(NOT_PATCHED, "gptj", "its apply_rotary_pos_emb does what no row says")
    with pytest.raises(ValueError, match=r"GPTJForCausalLM has no part from a supported module \(gptj: "
                                         r"its apply_rotary_pos_emb does what no row says\)"):
        hf.install(_gptj_model())
    assert hf._originals == {}


def test_install_refuses_a_function_whose_signature_changed(monkeypatch):
    # transformers changed the function after its row was read: install says so, and patches nothing
    module = importlib.import_module(hf._module_name("gptj"))
    monkeypatch.setattr(module, "apply_rotary_pos_emb", lambda tensor, cos, sin: tensor)
    with pytest.raises(ValueError, match=r"\(gptj: its apply_rotary_pos_emb\(tensor, cos, sin\) is not the "
                                         r"\(tensor, sin, cos\) read from gptj/modeling_gptj.py\)"):
        hf.install(_gptj_model())
    assert hf._originals == {}
