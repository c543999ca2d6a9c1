"""Training with hf.install: the kernel with its backward where parameters need gradients.

A tiny random model of each kind of function `install` patches (Llama's half
layout, an interleaved one, an mRoPE one, MLA's deinterleaving one, Gemma 4's
one-tensor one, GPT-J's ``(tensor, sin, cos)``), built
from its default config (``hf_tiny``), nothing downloaded.  With parameters
needing gradients every call takes the kernel; a float32 loss's gradients
equal the model's own for every parameter, bitwise (the backward does the
formula's backward's operations), and a bfloat16 forward equals the
inference-mode forward under `install` bitwise (the same kernel).  Skipped
without torch and transformers.
"""

import warnings

import pytest

from posenc_fast import hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_tiny  # noqa: E402  (needs torch)
from hf_tiny import kernel_calls  # noqa: E402,F401  (a fixture)

# model type -> what kind of function its attention calls
KINDS = {"llama": "half layout", "cohere": "interleaved", "qwen2_vl": "mRoPE",
         "deepseek_v3": "MLA's apply_rotary_pos_emb_interleave",
         "gemma4_text": "one-tensor apply_rotary_pos_emb(x, cos, sin), q and k in separate calls",
         "gptj": "GPT-J's apply_rotary_pos_emb(tensor, sin, cos) of the leading rotary_dim features"}
EXTRA = {"deepseek_v3": {"rope_interleave": True}}


@pytest.fixture(autouse=True)
def restore_transformers():
    yield
    hf.uninstall()


def _model(model_type, dtype=torch.float32):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = hf_tiny.tiny_model(model_type, **EXTRA.get(model_type, {}))
    return model.to(dtype)


def _inputs(model):
    vocab = min(128, model.config.get_text_config(decoder=True).vocab_size)
    ids = torch.randint(1, vocab, (hf_tiny.BATCH, hf_tiny.SEQ),
                        generator=torch.Generator().manual_seed(3))
    kwargs = {"input_ids": ids, "use_cache": False}
    positions = hf_tiny.position_ids(model)
    if positions is not None:
        kwargs["position_ids"] = positions
    return kwargs


def _step(model, inputs):
    """Logits and every parameter's gradient of one loss (the logits' squares' mean)."""
    model.zero_grad(set_to_none=True)
    out = model(**inputs).logits
    out.float().square().mean().backward()
    return out.detach(), {name: p.grad.clone() for name, p in model.named_parameters()
                          if p.grad is not None}


@pytest.mark.parametrize("model_type", list(KINDS))
def test_float32_gradients_equal_the_models_own(model_type, kernel_calls):
    model = _model(model_type)
    inputs = _inputs(model)
    want_logits, want = _step(model, inputs)
    with hf.install(model):
        kernel_calls.clear()
        got_logits, got = _step(model, inputs)
    assert kernel_calls and all(kernel_calls), "a call took transformers' formula"
    assert torch.equal(got_logits, want_logits)
    assert got.keys() == want.keys() and len(got) > 2
    for name in want:
        assert torch.equal(got[name], want[name]), name


@pytest.mark.parametrize("model_type", list(KINDS))
def test_bfloat16_forward_with_gradients_takes_the_kernel(model_type, kernel_calls):
    model = _model(model_type, torch.bfloat16)
    inputs = _inputs(model)
    with hf.install(model):
        kernel_calls.clear()
        training = model(**inputs).logits
        assert kernel_calls and all(kernel_calls), "a call took transformers' formula"
        with torch.inference_mode():
            inference = model(**inputs).logits
    assert training.requires_grad
    assert torch.equal(training.detach(), inference)
