"""hf.FALLBACKS: every call that needs a gradient and takes transformers' formula is counted,
under a reason its docstring lists; a call without a gradient, or one the kernel takes, is not.

Skipped without torch and transformers.
"""

import importlib
import re
from pathlib import Path

import pytest

from posenc_fast import hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_tiny import kernel_calls  # noqa: E402,F401  (a fixture)

# _hf_drop_in.py first: FALLBACKS and its docstring are there
SOURCES = [Path(hf.__file__).with_name(name) for name in ("_hf_drop_in.py", "hf.py", "torch_ops.py")]


@pytest.fixture(autouse=True)
def clear():
    hf.FALLBACKS.clear()
    yield
    hf.FALLBACKS.clear()
    hf.uninstall()


def _docstring():
    text = SOURCES[0].read_text()
    return re.search(r'^FALLBACKS: .*?\n"""(.*?)"""', text, re.S | re.M).group(1)


def _reasons_in_the_code():
    found = set()
    for path in SOURCES:
        text = path.read_text()
        found |= set(re.findall(r'FALLBACKS\["([^"]+)"\]', text))
        found |= set(re.findall(r'_fell_back\([^"]*"([^"]+)"\)', text))
    return found


def test_every_reason_in_the_code_is_in_the_docstring():
    reasons = _reasons_in_the_code()
    assert len(reasons) == 5, reasons
    doc = " ".join(_docstring().split())
    for reason in reasons:
        assert f'``"{reason}"``' in doc, reason


def cache(width=16, seq=5, dtype=torch.float32, repeat=True):
    angles = torch.arange(seq, dtype=torch.float64)[None, :, None] * 0.3 ** torch.arange(width // 2)
    angles = torch.cat((angles, angles + (0 if repeat else 0.5)), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def qk(dtype=torch.float32, dim=16):
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(1, 2, 5, dim, generator=generator).to(dtype).requires_grad_(),
            torch.randn(1, 1, 5, dim, generator=generator).to(dtype).requires_grad_())


def _cohere():
    module = importlib.import_module(hf._module_name("cohere"))
    return hf._replacement(module.apply_rotary_pos_emb, hf._PATCHED["apply_rotary_pos_emb"]["cohere"])


def _pairs(width=16, dtype=torch.float32):
    cos, sin = cache(width, dtype=dtype)
    half = width // 2
    return cos[..., :half].repeat_interleave(2, -1), sin[..., :half].repeat_interleave(2, -1)


def _llama():
    module = importlib.import_module(hf._module_name("llama"))
    return hf._replacement(module.apply_rotary_pos_emb, hf._PATCHED["apply_rotary_pos_emb"]["llama"])


def _dual():
    import torch.autograd.forward_ad as fwad

    q, k = qk()
    with fwad.dual_level():
        return _llama()(fwad.make_dual(q, torch.ones_like(q)), k, *cache())


CASES = {
    "a forward-mode AD or torch.func transform": _dual,
    "cos/sin need a gradient": lambda: _llama()(*qk(), *(t.requires_grad_() for t in cache())),
    # Cohere computes in float32 (q.float()): float64 data would be rounded first
    "data the kernel does not compute exactly": lambda: _cohere()(*qk(torch.float64), *_pairs(dtype=torch.float64)),
    "cos/sin entries do not repeat": lambda: _llama()(*qk(), *cache(repeat=False)),
    # unsqueeze_dim by position: not the call it takes (transformers 4 had position_ids there)
    "arguments or shapes it does not take": lambda: _llama()(*qk(), *cache(), 1),
}


@pytest.mark.parametrize("reason", list(CASES))
def test_each_fallback_is_counted_with_a_gradient_only(reason, kernel_calls):
    out = CASES[reason]()
    assert out[0].requires_grad and out[0].grad_fn.name() != "RotationBackward"
    assert hf.FALLBACKS == {reason: 1}
    assert not any(kernel_calls)
    with torch.no_grad():
        CASES[reason]()
    assert hf.FALLBACKS == {reason: 1}


@pytest.mark.parametrize("form", ["a batch q broadcasts to", "sin of another shape"])
def test_a_cache_the_formula_broadcasts_q_against_takes_the_formula(form, kernel_calls):
    # transformers' product broadcasts q (or cos against sin): its result has another shape than q's,
    # which the kernel does not give (it raised where transformers computes)
    cos, sin = cache()
    if form == "a batch q broadcasts to":
        cos, sin = cos.repeat(3, 1, 1), sin.repeat(3, 1, 1)
    else:
        sin = sin.repeat(3, 1, 1)
    module = importlib.import_module(hf._module_name("llama"))
    got = _llama()(*qk(), cos, sin)
    want = module.apply_rotary_pos_emb(*qk(), cos, sin)
    assert [g.shape for g in got] == [w.shape for w in want] == [(3, 2, 5, 16), (3, 1, 5, 16)]
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert hf.FALLBACKS == {"arguments or shapes it does not take": 1} and not any(kernel_calls)


def test_the_kernel_is_no_fallback(kernel_calls):
    q_embed, _ = _llama()(*qk(), *cache())
    q_embed, _ = _llama()(*qk(torch.float64), *cache(dtype=torch.float64))
    assert q_embed.grad_fn.name() == "RotationBackward"
    assert kernel_calls == [True, True] and not hf.FALLBACKS


def test_a_negative_view_takes_the_formula(kernel_calls):
    # its memory holds the values negated (torch resolves the bit in its own operations)
    generator = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 5, 16, dtype=torch.complex64, generator=generator).conj().imag
    _, k = qk()
    assert q.is_neg()
    got = _llama()(q, k.detach(), *cache())
    want = _llama()(q.resolve_neg(), k.detach(), *cache())
    assert kernel_calls == [False, True]
    torch.testing.assert_close(got, want)


def test_the_compiled_ops_formula_is_counted_when_its_backward_runs():
    import posenc_fast.torch_ops  # noqa: F401

    compiled = torch.compile(lambda q, k, cos, sin: hf.apply_rotary_pos_emb(q, k, cos, sin),
                             fullgraph=True, backend="aot_eager")
    torch._dynamo.reset()
    q_embed, k_embed = compiled(*qk(), *cache(repeat=False))
    assert not hf.FALLBACKS  # the forward cannot know a gradient will be asked for
    (q_embed.sum() + k_embed.sum()).backward()
    assert hf.FALLBACKS == {"cos/sin entries do not repeat": 1}
    hf.FALLBACKS.clear()
    q_embed, k_embed = compiled(*qk(), *cache())
    (q_embed.sum() + k_embed.sum()).backward()
    assert not hf.FALLBACKS
    torch._dynamo.reset()
