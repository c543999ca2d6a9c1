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


def cache(function, batch, seq, rotated, dtype, seed):
    """A cos/sin cache `rotated` features wide in the form `function` reads."""
    generator = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 4096, (batch, seq, 1), generator=generator).double()
    angles = positions * 10000.0 ** (-torch.arange(0, rotated, 2, dtype=torch.float64) / rotated)
    if function.cache == "pairs":
        angles = angles.repeat_interleave(2, dim=-1)
    elif function.cache == "halves":
        angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def dtypes(function):
    """(dtype, True when the kernel takes it) to compare in."""
    if function.compute == "float32":  # float32 arithmetic rounded once: bitwise for half types too
        return [(torch.float32, True), (torch.bfloat16, True), (torch.float16, True),
                (torch.float64, False)]  # q.float() rounds float64 data first
    return [(torch.float32, True), (torch.float64, True)]


def call(function, apply, q, k, cos, sin, unsqueeze_dim):
    """(q rotated, k rotated) by `apply`, a function of the kind `function` says (one tensor a call, or both;
    a vision tower's without unsqueeze_dim)."""
    if function.unsqueeze is not None:
        return apply(q, k, cos, sin)
    if function.one_tensor:
        return tuple(apply(x, cos, sin, unsqueeze_dim=unsqueeze_dim) for x in (q, k))
    return apply(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)


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
            # (batch, heads, seq, dim) or (batch, seq, heads, dim); one key head
            shapes = ((1, (2, 3, 5, 16), (2, 1, 5, 16)), (2, (2, 5, 3, 16), (2, 5, 1, 16)))
            if function.unsqueeze is not None:  # a vision tower's (patches, heads, dim), cos/sin (patches, dim)
                shapes = ((None, (10, 3, 16), (10, 1, 16)),)
            for unsqueeze_dim, q_shape, k_shape in shapes:
                generator = torch.Generator().manual_seed(width)
                q = torch.randn(q_shape, generator=generator).to(dtype)
                k = torch.randn(k_shape, generator=generator).to(dtype)
                cos, sin = cache(function, 2, 5, width, dtype, seed=unsqueeze_dim or 0)
                if unsqueeze_dim is None:
                    cos, sin = cos.flatten(0, 1), sin.flatten(0, 1)
                with torch.no_grad():
                    expected = call(function, own, q, k, cos, sin, unsqueeze_dim)
                    got = call(function, patched, q, k, cos, sin, unsqueeze_dim)
                assert kernel_calls == [kernel] * (1 + function.one_tensor)
                kernel_calls.clear()
                for g, e in zip(got, expected, strict=True):
                    assert g.dtype == e.dtype and g.shape == e.shape
                    assert torch.equal(g, e), f"{dtype}, width {width}, unsqueeze_dim {unsqueeze_dim}"


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


def test_install_refuses_a_model_it_cannot_take():
    model = transformers.GPTJForCausalLM(transformers.GPTJConfig(
        n_embd=64, n_layer=1, n_head=4, rotary_dim=8, vocab_size=128))
    with pytest.raises(ValueError, match=r"GPTJForCausalLM has no part from a supported module \(gptj: "
                                         r"its apply_rotary_pos_emb rotates one tensor with \(sin, cos\)"):
        hf.install(model)
    assert hf._originals == {}
