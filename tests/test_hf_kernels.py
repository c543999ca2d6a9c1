"""transformers' hub-kernel hooks (``use_kernels=True``) without the ``kernels`` package, and install.

transformers 5.24 needs ``kernels`` >= 0.18.2, < 0.19 (``KERNELS_MIN_VERSION``):
without it (here the registry has none newer than 0.17.2, which it rejects),
``use_kernel_forward_from_hub("rotary_pos_emb")`` and ``use_kernelized_func``
are decorators that return what they decorate, so the modeling modules'
``apply_rotary_pos_emb`` stay plain functions; ``use_kernels=True`` (to
``from_pretrained``, or set on a model) raises ValueError ("Kernels are not
available") and changes nothing.  `install` takes effect all the same, before
or after.  Skipped without torch and transformers, and where a usable
``kernels`` is installed.
"""

import inspect
import warnings

import pytest

from posenc_fast import hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_tiny  # noqa: E402  (needs torch)
from hf_tiny import kernel_calls  # noqa: E402,F401  (a fixture)
from transformers.integrations import hub_kernels  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

pytestmark = pytest.mark.skipif(hub_kernels.is_kernels_available(), reason="a usable kernels is installed")


@pytest.fixture(autouse=True)
def restore_transformers():
    hf.FALLBACKS.clear()
    yield
    hf.uninstall()


def _model():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hf_tiny.tiny_model("llama")


def _forward(model):
    ids = torch.randint(1, 128, (2, 24), generator=torch.Generator().manual_seed(3))
    return model(input_ids=ids, use_cache=False).logits


def test_the_hooks_leave_the_function_plain():
    # the decorators transformers applies are the identity: install finds the function it reads
    function = modeling_llama.apply_rotary_pos_emb
    assert inspect.isfunction(function) and function.__module__ == modeling_llama.__name__
    assert not hasattr(function, "__wrapped__")
    assert not hub_kernels._kernels_enabled
    assert hub_kernels.use_kernel_forward_from_hub("rotary_pos_emb")(function) is function
    assert hub_kernels.use_kernelized_func(function)(modeling_llama.LlamaAttention) is modeling_llama.LlamaAttention


def test_use_kernels_is_refused_and_install_still_takes_effect(kernel_calls):
    model = _model()
    with pytest.raises(ValueError, match="Kernels are not available"):
        model.use_kernels = True
    assert model.use_kernels is False
    with pytest.raises(ImportError, match="`kernels` is either not installed"):
        hub_kernels.kernelize(model)
    with torch.no_grad():
        want = _forward(model)
        with hf.install(model):
            got = _forward(model)
    assert kernel_calls and all(kernel_calls)
    assert torch.equal(got, want)


def test_from_pretrained_with_use_kernels(tmp_path, kernel_calls):
    # a local checkpoint (nothing downloaded): use_kernels=True refuses to load; without it, install works
    _model().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="Kernels are not available"):
        transformers.LlamaForCausalLM.from_pretrained(tmp_path, use_kernels=True)
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path, use_kernels=False)
    hf.install(model)
    with torch.no_grad():
        _forward(model)
    assert kernel_calls and all(kernel_calls)
    model.train()  # training mode: the gradient path too
    _forward(model).sum().backward()
    assert all(kernel_calls) and not hf.FALLBACKS
