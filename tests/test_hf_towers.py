"""from_hf_config of a vision tower's config: its 2-D (axial) RoPE, checked against the tower's own code.

Every configuration class of the installed transformers whose default RoPE
is ``"axial"``: a tower in ``_hf_models.AXIAL_TOWERS`` gives
``RotaryEmbedding.axial``, whose cos/sin equal the tower's rotary module's
(to float32 rounding) and whose rotation of random q/k equals the tower's
``apply_rotary_pos_emb_vision``; any other is refused, and must still differ
(so the list cannot go stale).
"""

import inspect
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers.models.auto import configuration_auto  # noqa: E402

import posenc_fast as pf  # noqa: E402
from posenc_fast import _hf_models  # noqa: E402
from posenc_fast._hf_probe import modeling_module  # noqa: E402


def _axial_types():
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for model_type in sorted(configuration_auto.CONFIG_MAPPING_NAMES):
            try:
                params = configuration_auto.CONFIG_MAPPING[model_type]().to_dict().get("rope_parameters")
            except Exception:  # a config class that needs arguments: not a tower with a default RoPE
                continue
            if isinstance(params, dict) and params.get("rope_type") == "axial":
                found.append(model_type)
    return found


AXIAL_TYPES = _axial_types()


def _tower(model_type):
    """The tower's rotary module (built from its default config) and its module, or None."""
    config = configuration_auto.CONFIG_MAPPING[model_type]()
    module = modeling_module(model_type)
    classes = [] if module is None else [
        c for name, c in vars(module).items() if inspect.isclass(c) and c.__module__ == module.__name__
        and name.endswith("RotaryEmbedding") and "compute_axial_rope_parameters" in vars(c)]
    return (classes[0](config), module) if len(classes) == 1 else (None, module)


def _agrees(model_type):
    """The tower's cos equals RotaryEmbedding.axial's (from its config) in halves; and its rotation."""
    rotary, module = _tower(model_type)
    if rotary is None:
        return False
    rope = pf.RotaryEmbedding.from_hf_config(configuration_auto.CONFIG_MAPPING[model_type]().to_dict())
    rng = np.random.default_rng(0)
    hw = np.stack([rng.integers(0, 40, 9), rng.integers(0, 40, 9)])  # (h, w) of 9 patches
    try:
        with torch.no_grad():
            out = rotary(torch.zeros(1), torch.from_numpy(hw.T.copy()))
    except Exception:
        return False
    cos, sin = (t.double().numpy() for t in out)
    half = rope.dim // 2
    # transformers forms inv_freq (a few float32 ulps off when head_dim / 2 is no power of two, see
    # test_frequencies.py) and the angles (up to 40 rad) in float32
    atol = 40 * 16 * 2.0**-24 + 2.0**-19
    want_cos, want_sin = rope.cos_sin(hw)
    if cos.shape != (9, rope.dim) or not (np.array_equal(cos[:, :half], cos[:, half:])
                                          and np.allclose(cos[:, :half], want_cos, rtol=0, atol=atol)
                                          and np.allclose(sin[:, :half], want_sin, rtol=0, atol=atol)):
        return False
    function = getattr(module, "apply_rotary_pos_emb_vision", None)
    if function is None:
        return False
    q, k = (rng.standard_normal((9, 3, rope.dim)).astype(np.float32) for _ in range(2))
    with torch.no_grad():
        q_hf, k_hf = function(torch.from_numpy(q), torch.from_numpy(k), *out)
    q_ours, k_ours = rope.apply_qk(q, k, hw[:, :, None])
    scale = 2 * atol * max(np.abs(q).max(), np.abs(k).max()) + 1e-6
    return (np.allclose(q_ours, q_hf.numpy(), rtol=0, atol=scale)
            and np.allclose(k_ours, k_hf.numpy(), rtol=0, atol=scale))


def test_the_walk_found_the_towers():
    assert len(AXIAL_TYPES) >= 30 and {"qwen2_vl_vision", "qwen2_5_vl_vision", "glm4v_vision"} <= set(AXIAL_TYPES)
    assert _hf_models.AXIAL_TOWERS <= set(AXIAL_TYPES)


@pytest.mark.parametrize("model_type", AXIAL_TYPES)
def test_a_towers_axial_rope(model_type):
    config = configuration_auto.CONFIG_MAPPING[model_type]().to_dict()
    if model_type in _hf_models.AXIAL_TOWERS:
        rope = pf.RotaryEmbedding.from_hf_config(config)
        assert rope.n_streams == 2 and rope.layout == "half"
        assert _agrees(model_type)
        return
    with pytest.raises(ValueError, match="has not checked against its rotary module"):
        pf.RotaryEmbedding.from_hf_config(config)
    with pytest.MonkeyPatch.context() as patch:  # listed, it would be wrong: it must stay refused
        patch.setattr(_hf_models, "AXIAL_TOWERS", _hf_models.AXIAL_TOWERS | {model_type})
        patch.setattr("posenc_fast._hf_config.AXIAL_TOWERS", _hf_models.AXIAL_TOWERS | {model_type})
        try:
            agrees = _agrees(model_type)
        except ValueError:  # its config lacks what the axial reading needs
            agrees = False
    assert not agrees, f"{model_type} agrees with Qwen2-VL's axial RoPE: add it to AXIAL_TOWERS"
