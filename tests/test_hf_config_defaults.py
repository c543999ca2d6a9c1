"""config.json dicts that leave keys out read with their configuration class's defaults (_hf_defaults).

Plain dicts, no transformers needed: the values are transformers 5.24's (its
configuration classes, as ``tests/make_hf_defaults.py`` reads them;
``tests/test_hf_defaults.py`` checks every model type against transformers).
"""

import pytest

import posenc_fast as pf
from posenc_fast import _hf_defaults

SMALL = {"hidden_size": 256, "num_attention_heads": 2}


def _rope(config, **kwargs):
    return pf.RotaryEmbedding.from_hf_config(config, **kwargs)


@pytest.mark.parametrize("model_type, theta", [("smollm3", 2e6), ("llama4_text", 5e5), ("apertus", 1.2e7),
                                               ("cohere", 5e5), ("ernie4_5", 5e5), ("bitnet", 5e5),
                                               ("qwen2_vl", 1e6), ("llama", 1e4)])
def test_rope_theta_left_out_is_the_class_default(model_type, theta):
    # transformers 4's flat form (qwen2_vl: a flat composite config, read by its text model's class) and
    # transformers 5's rope_parameters without a rope_theta; Apertus' own default RoPE is llama3-scaled
    for config in ({"model_type": model_type, **SMALL, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
                   {"model_type": model_type, **SMALL, "rope_parameters": {"rope_type": "linear", "factor": 2.0}}):
        if model_type == "qwen2_vl":
            config["rope_scaling" if "rope_scaling" in config else "rope_parameters"]["mrope_section"] = [16, 24, 24]
        assert _rope(config).base == theta


def test_other_keys_left_out_are_the_class_defaults():
    assert _rope({"model_type": "qwen3", **SMALL}).dim == 128  # Qwen3Config.head_dim
    assert _rope({"model_type": "gemma", **SMALL}).dim == 256  # GemmaConfig.head_dim
    assert _rope({"model_type": "dia_decoder", **SMALL}).dim == 128  # DiaDecoderConfig.head_dim
    for model_type, factor in (("phi", 0.5), ("stablelm", 0.25), ("glm", 0.5), ("persimmon", 0.5),
                               ("qwen3_next", 0.25), ("nemotron", 0.5), ("gpt_neox", 0.25)):
        rope = _rope({"model_type": model_type, **SMALL})
        assert rope.rotary_dim == int(rope.dim * factor), model_type
    yarn = {"rope_type": "yarn", "factor": 4.0}
    # CohereConfig.max_position_embeddings (8192) is YaRN's original length; Phi3Config's own one (4096)
    assert _rope({"model_type": "cohere", **SMALL, "rope_scaling": yarn}).scaling[
        "original_max_position_embeddings"] == 8192
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    assert _rope({"model_type": "phi3", **SMALL, "max_position_embeddings": 16384, "rope_scaling": llama3}).scaling[
        "original_max_position_embeddings"] == 4096
    # MLA: DeepseekV3Config.qk_rope_head_dim (64); Mistral-Large-4's default rope_parameters (YaRN)
    assert _rope({"model_type": "deepseek_v2", **SMALL}).dim == 64
    assert _rope({"model_type": "mistral_large4_text", **SMALL}).scaling["factor"] == 2048.0


def test_per_layer_type_defaults():
    gemma3 = {"model_type": "gemma3_text", "head_dim": 64, "rope_theta": 5e5, "rope_local_base_freq": 5e4}
    for left_out, layer_type, base in (("rope_theta", "full_attention", 1e6),
                                       ("rope_local_base_freq", "sliding_attention", 1e4)):
        config = {key: value for key, value in gemma3.items() if key != left_out}
        assert _rope(config, layer_type=layer_type).base == base
    # Gemma 4's class fills no rope_theta into a layer type's parameters that lack one (its rotary module fails)
    gemma4 = {"model_type": "gemma4_text", "head_dim": 64, "global_head_dim": 64,
              "rope_parameters": {"sliding_attention": {"rope_type": "default"},
                                  "full_attention": {"rope_type": "default", "rope_theta": 1e6}}}
    assert _rope(gemma4, layer_type="full_attention").base == 1e6
    with pytest.raises(ValueError, match="no 'rope_theta' for its 'sliding_attention' layers"):
        _rope(gemma4, layer_type="sliding_attention")
    # Zaya's class names its layer types: a config without layer_types still has them
    zaya = {"model_type": "zaya", **SMALL, "head_dim": 64}
    assert _rope(zaya, layer_type="hybrid").base == 5e6
    with pytest.raises(ValueError, match="'layer_types'"):
        _rope(zaya)


def test_defaults_the_classes_derive():
    # HYV4VLTextConfig.__post_init__ sets head_dim = qk_rope_head_dim, whatever the config says
    hy = {"model_type": "hy_v4_vl_text", **SMALL, "head_dim": 256, "qk_rope_head_dim": 64,
          "rope_parameters": {"rope_type": "default", "mrope_section": [12, 10, 10]}}
    assert _rope(hy).dim == 64
    assert _rope({**hy, "rope_parameters": {"rope_type": "default"}}).pair_streams is not None  # its [12, 10, 10]
    # Zamba2Config.__post_init__: attention_head_dim = 2 * hidden_size // num_attention_heads
    assert _rope({"model_type": "zamba2", **SMALL}).dim == 256
    # Ministral-3 builds its default rope_parameters from other sizes: the config must give them
    assert "ROPE" in _hf_defaults.DERIVED["ministral3"]
    with pytest.raises(ValueError, match="neither 'rope_parameters' nor 'rope_scaling'"):
        _rope({"model_type": "ministral3", **SMALL})


def test_a_model_type_the_table_lacks_gets_the_mixin_defaults():
    assert "no_such_model" not in _hf_defaults.THETA
    rope = _rope({"model_type": "no_such_model", **SMALL}, layout="half")
    assert (rope.base, rope.rotary_dim) == (1e4, 128)
    with pytest.raises(ValueError, match="missing 'max_position_embeddings'"):
        _rope({"model_type": "no_such_model", **SMALL, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
              layout="half")
