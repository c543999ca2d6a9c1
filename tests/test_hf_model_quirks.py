"""``from_hf_config``'s rules read from one family's own code, each against that code: HunYuan's NTK-alpha,
PhiMoE's mscales, OLMo 3's and Gemma 3's nesting of flat keys, the NoPE layers of Cohere2 and EXAONE 4,
UltraBERT's list of thetas, MiMo-V2-Flash's default partial factor.

Skipped without torch and transformers where the check runs their code.
"""

import importlib
import logging

import numpy as np
import pytest
from helpers import assert_matches_hf

import posenc_fast as pf


@pytest.fixture
def transformers():
    pytest.importorskip("torch")
    module = pytest.importorskip("transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)  # its warnings about the configs' values
    return module


def _rotary_module(transformers, config, family):
    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    cls = next(value for name, value in vars(modeling).items()
               if name.endswith("RotaryEmbedding") and "Vision" not in name and "Text" not in name or
               name.endswith("TextRotaryEmbedding"))
    return cls(transformers.AutoConfig.for_model(**config))


@pytest.mark.parametrize("family", ["hunyuan_v1_dense", "hunyuan_v1_moe"])
def test_hunyuans_dynamic_rope_with_alpha_is_its_fixed_ntk_alpha(transformers, family):
    config = {"model_type": family, "head_dim": 128, "rope_theta": 1e4,
              "rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0}}
    rope = pf.RotaryEmbedding.from_hf_config(config)
    module = _rotary_module(transformers, config, family)
    assert module.rope_type == "ntk_alpha" and rope.scaling is None
    assert_matches_hf(rope.inv_freq, module.inv_freq.numpy(), 128)


def _phimoe(short_mscale=1.243, long_mscale=1.243):
    short, long = [1 + 0.05 * i for i in range(64)], [1 + 0.3 * i for i in range(64)]
    return {"model_type": "phimoe", "hidden_size": 1024, "num_attention_heads": 8, "max_position_embeddings": 512,
            "rope_scaling": {"type": "longrope", "short_factor": short, "long_factor": long,
                             "short_mscale": short_mscale, "long_mscale": long_mscale,
                             "original_max_position_embeddings": 128}}


def test_phimoe_takes_the_short_factors_at_every_length_and_its_mscale(transformers):
    import torch

    rope = pf.RotaryEmbedding.from_hf_config(_phimoe())
    module = _rotary_module(transformers, _phimoe(), "phimoe")
    for position in (5, 1000):  # below and past original_max_position_embeddings
        cos, sin = module(torch.zeros(1, 1, 1, 128), torch.tensor([[position]]))
        ours_cos, ours_sin = rope.cos_sin(np.array([position]), dtype=np.float64)
        tolerance = 2e-7 * position + 1e-6  # transformers' float32 angles
        np.testing.assert_allclose(ours_cos[0], cos[0, 0, :64].double().numpy(), atol=tolerance)
        np.testing.assert_allclose(ours_sin[0], sin[0, 0, :64].double().numpy(), atol=tolerance)
    with pytest.raises(ValueError, match=r"\['short_mscale'\] 1.0 and \['long_mscale'\] 1.243 differ"):
        pf.RotaryEmbedding.from_hf_config(_phimoe(short_mscale=1.0))
    with pytest.raises(ValueError, match="no 'short_mscale' / 'long_mscale'"):
        pf.RotaryEmbedding.from_hf_config(_phimoe(short_mscale=None))


_OLMO3 = {"model_type": "olmo3", "hidden_size": 1024, "num_attention_heads": 8, "num_hidden_layers": 4,
          "layer_types": ["sliding_attention"] * 3 + ["full_attention"], "rope_theta": 1e4,
          "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192}}


def test_olmo3s_flat_keys_are_its_full_attention_layers(transformers):
    # its configuration class nests them: the sliding-window layers keep its default RoPE (theta 500000)
    built = transformers.AutoConfig.for_model(**_OLMO3)
    for layer_type in ("full_attention", "sliding_attention"):
        got = pf.RotaryEmbedding.from_hf_config(dict(_OLMO3), layer_type=layer_type)
        want = pf.RotaryEmbedding.from_hf_config(built, layer_type=layer_type)
        assert repr(got) == repr(want)
    sliding = pf.RotaryEmbedding.from_hf_config(dict(_OLMO3), layer_type="sliding_attention")
    assert sliding.scaling is None and sliding.base == built.rope_parameters["sliding_attention"]["rope_theta"]


def _layers(model_type, **more):
    return {"model_type": model_type, "hidden_size": 1024, "num_attention_heads": 8, "num_hidden_layers": 4,
            "layer_types": ["sliding_attention"] * 3 + ["full_attention"], **more}


@pytest.mark.parametrize("model_type", ["gemma3_text", "olmo3"])
def test_a_flat_rope_parameters_the_class_reads_as_no_layer_types_is_refused(model_type):
    config = _layers(model_type, rope_parameters={"rope_type": "default", "rope_theta": 54321.0})
    with pytest.raises(ValueError, match="rope_parameters is one flat dict, which this model's configuration class "
                                         "reads as no layer type's RoPE"):
        pf.RotaryEmbedding.from_hf_config(config, layer_type="full_attention")


@pytest.mark.parametrize("model_type", ["cohere2", "cohere2_moe", "flint", "exaone4", "exaone_moe", "kolibri1"])
def test_the_full_attention_layers_without_rope_are_refused(transformers, model_type):
    # their attention rotates in the sliding-window layers only (a config without sliding_window has its
    # class's, a window)
    assert transformers.AutoConfig.for_model(model_type).sliding_window is not None
    config = _layers(model_type, mlp_layer_types=["sparse"] * 4, rope_theta=1e4)
    assert pf.RotaryEmbedding.from_hf_config(config, layer=0).rotary_dim == 128
    assert pf.RotaryEmbedding.from_hf_config(config).rotary_dim == 128  # the layers with a RoPE
    with pytest.raises(ValueError, match=r"layer 3 \(a 'full_attention' layer\) has no RoPE"):
        pf.RotaryEmbedding.from_hf_config(config, layer=3)
    with pytest.raises(ValueError, match="'full_attention' layers has no RoPE|rotate only where mlp_layer_types"):
        pf.RotaryEmbedding.from_hf_config(config, layer_type="full_attention")
    if model_type.startswith("exaone") or model_type == "kolibri1":  # without a window every layer rotates
        assert pf.RotaryEmbedding.from_hf_config(dict(config, sliding_window=None), layer=3).rotary_dim == 128
    if model_type == "cohere2_moe":  # force_rope: a layer of a dense MLP rotates, with or without a window
        assert transformers.AutoConfig.for_model(model_type).prefix_dense_sliding_window_pattern == 1
        dense = dict(config, mlp_layer_types=["dense"] + ["sparse"] * 2 + ["dense"])
        assert pf.RotaryEmbedding.from_hf_config(dense, layer=3).rotary_dim == 128
        assert pf.RotaryEmbedding.from_hf_config(dict(dense, sliding_window=None), layer=0).rotary_dim == 128
        with pytest.raises(ValueError, match=r"layer 1 \(a 'sliding_attention' layer\) has no RoPE: .* sliding_window is None"):
            pf.RotaryEmbedding.from_hf_config(dict(dense, sliding_window=None), layer=1)


def test_ultraberts_list_of_thetas_is_one_per_layer_type(transformers):
    config = {"model_type": "ultrabert", "hidden_size": 1024, "num_attention_heads": 8, "num_hidden_layers": 3,
              "layer_types": ["sliding_attention", "sliding_attention", "full_attention"], "rope_theta": [1e4, 2e4, 3e5]}
    built = transformers.AutoConfig.for_model(**config)
    for layer_type in ("full_attention", "sliding_attention"):
        got = pf.RotaryEmbedding.from_hf_config(dict(config), layer_type=layer_type).base
        assert got == built.rope_parameters[layer_type]["rope_theta"] == {"full_attention": 3e5}.get(layer_type, 2e4)
    with pytest.raises(ValueError, match="a list rope_theta is one per layer, read by 'layer_types'"):
        pf.RotaryEmbedding.from_hf_config({k: v for k, v in config.items() if k != "layer_types"})


def test_mimos_entries_without_a_partial_factor_take_its_default(transformers):
    config = {"model_type": "mimo_v2_flash", "partial_rotary_factor": 0.5, "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.334},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    module = _rotary_module(transformers, config, "mimo_v2_flash")
    for layer_type in ("full_attention", "sliding_attention"):
        rope = pf.RotaryEmbedding.from_hf_config(config, layer_type=layer_type)
        assert_matches_hf(rope.inv_freq, getattr(module, f"{layer_type}_inv_freq").numpy(), rope.rotary_dim)


_NESTED = {"full_attention": {"rope_type": "default", "rope_theta": 5e5},
           "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}


@pytest.mark.parametrize("model_type", ["laguna", "neomme", "mimo_v2_flash"])
def test_a_top_level_partial_factor_beside_layer_types_entries_reads_as_the_class_nests_it(transformers, model_type):
    # Laguna's and MiMo-V2-Flash's classes nest no top-level key, NeoMME's rope_theta only (each type's factor
    # its class default): the module reads the entries
    config = _layers(model_type, head_dim=64, num_hidden_layers=2, layer_types=list(_NESTED), partial_rotary_factor=0.5,
                     rope_parameters=_NESTED)
    module = _rotary_module(transformers, config, model_type)
    for layer_type in _NESTED:
        rope = pf.RotaryEmbedding.from_hf_config(dict(config), layer_type=layer_type)
        assert_matches_hf(rope.inv_freq, getattr(module, f"{layer_type}_inv_freq").numpy(), rope.rotary_dim)
    scaled = dict(config, rope_parameters={**_NESTED, "sliding_attention": {**_NESTED["sliding_attention"],
                                                                            "rope_type": "linear", "factor": 2.0}})
    if model_type != "neomme":  # a scaled RoPE's init fills the top-level keys into the types built after it
        with pytest.raises(ValueError, match=r"top-level \['partial_rotary_factor'\] beside per-layer-type"):
            pf.RotaryEmbedding.from_hf_config(scaled, layer_type="full_attention")


def test_rope_scaling_beside_layer_types_entries_updates_the_full_attention_layers(transformers):
    config = {"model_type": "gemma3_text", "hidden_size": 256, "num_attention_heads": 4, "head_dim": 64,
              "num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"],
              "rope_scaling": {"rope_type": "linear", "factor": 4.0},
              "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 2e4}}}
    built = transformers.AutoConfig.for_model(**config)
    for layer_type in ("full_attention", "sliding_attention"):
        rope = pf.RotaryEmbedding.from_hf_config(dict(config), layer_type=layer_type)
        assert repr(rope) == repr(pf.RotaryEmbedding.from_hf_config(built, layer_type=layer_type))
    assert pf.RotaryEmbedding.from_hf_config(dict(config), layer_type="sliding_attention").base == 2e4
    # OLMo 3 without layer_types: its class's layer types, as Gemma 3's
    olmo3 = {k: v for k, v in _OLMO3.items() if k != "layer_types"}
    assert pf.RotaryEmbedding.from_hf_config(olmo3, layer_type="sliding_attention").scaling is None


@pytest.mark.parametrize("alpha, head_dim, match", [(-2.0, 128, r"rope_parameters\['alpha'\] must be a number > 0"),
                                                    ("2", 128, r"rope_parameters\['alpha'\] must be a number > 0"),
                                                    (2.0, 2, "needs head_dim > 2, got 2")])
def test_hunyuans_alpha_is_checked(alpha, head_dim, match):
    config = {"model_type": "hunyuan_v1_dense", "head_dim": head_dim, "rope_theta": 1e4,
              "rope_scaling": {"type": "dynamic", "alpha": alpha, "factor": 1.0}}
    with pytest.raises(ValueError, match=match):
        pf.RotaryEmbedding.from_hf_config(config)
