"""``from_hf_config(config, layer=i)``: one decoder layer's RoPE, from plain config.json dicts.

(a companion of test_hf_config.py and test_hf_config_models.py, kept apart for its length;
test_hf_models.py checks the same against transformers' own models: which layers have a RoPE,
Molmo2's scaled and unscaled rotary modules, and ``layer=i`` as ``layer_type=layer_types[i]`` for
every model type with layer types.)
"""

import numpy as np
import pytest

import posenc_fast as pf
from posenc_fast._hf_config import rotary_kwargs_from_hf_config

SMOLLM3 = {"model_type": "smollm3", "hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 8}
# Molmo2: the layers in rope_scaling_layers rotate by the scaled RoPE, the others by a default one of that theta
MOLMO2 = {"model_type": "molmo2_text", "hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 4,
          "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}, "rope_scaling_layers": [1, 3]}
GEMMA3 = {"model_type": "gemma3_text", "head_dim": 256, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
          "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}


@pytest.mark.parametrize("layer", [True, "0", 1.0, [0]])
def test_layer_must_be_an_int(layer):
    with pytest.raises(TypeError, match="layer must be an int or None, got"):
        rotary_kwargs_from_hf_config(SMOLLM3, layer=layer)


def test_layer_in_range_of_the_config_layers():
    assert rotary_kwargs_from_hf_config(SMOLLM3, layer=np.int64(2)) == rotary_kwargs_from_hf_config(SMOLLM3)
    for layer in (-1, 8):
        with pytest.raises(ValueError, match=rf"layer={layer} is out of range: 0 <= layer < 8 \('num_hidden_layers'\)"):
            rotary_kwargs_from_hf_config(SMOLLM3, layer=layer)
    with pytest.raises(ValueError, match=r"layer=6 is out of range: 0 <= layer < 6 \('layer_types'\)"):
        rotary_kwargs_from_hf_config(GEMMA3, layer=6)
    llama = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4}
    with pytest.raises(ValueError, match=r"layer= needs the config's 'num_hidden_layers' \(or 'layer_types'\)"):
        rotary_kwargs_from_hf_config(llama, layer=0)
    for i in (0, 3):  # one RoPE for every layer: the same as without layer=
        assert (rotary_kwargs_from_hf_config({**llama, "num_hidden_layers": 4}, layer=i)
                == rotary_kwargs_from_hf_config(llama))
    gptj = {"model_type": "gptj", "n_embd": 256, "n_head": 4, "n_layer": 2}  # its attribute_map'd layer count
    assert rotary_kwargs_from_hf_config(gptj, layer=1) == rotary_kwargs_from_hf_config(gptj)
    with pytest.raises(ValueError, match=r"0 <= layer < 2 \('n_layer'\)"):
        rotary_kwargs_from_hf_config(gptj, layer=2)


def test_vision_tower_config_refuses_layer():
    tower = {"model_type": "qwen2_vl", "vision_config": {}, "rope_parameters": {"rope_type": "axial"}}
    with pytest.raises(ValueError, match="a vision tower's config gives the one RoPE all its layers rotate by"):
        rotary_kwargs_from_hf_config(tower, layer=0)


@pytest.mark.parametrize("form, nope", [
    ({}, [3, 7]),  # SmolLM3Config: no_rope_layer_interval 4 by default
    ({"no_rope_layer_interval": 3}, [2, 5]),
    ({"no_rope_layers": [1, 0, 0, 1, 1, 1, 1, 0]}, [1, 2, 7]),
])
@pytest.mark.parametrize("model_type", ["smollm3", "llama4_text", "mistral_large4_text"])
def test_no_rope_layers_given_or_derived_from_the_interval(model_type, form, nope):
    config = {**SMOLLM3, "model_type": model_type, **form}
    if model_type == "mistral_large4_text":
        config.update(qk_rope_head_dim=32)
    want = rotary_kwargs_from_hf_config(config)  # without layer=: the RoPE of the layers with one
    for i in range(8):
        if i in nope:
            with pytest.raises(ValueError, match=rf"layer {i} has no RoPE: no_rope_layers\[{i}\] == 0"):
                pf.RotaryEmbedding.from_hf_config(config, layer=i)
        else:
            assert rotary_kwargs_from_hf_config(config, layer=i) == want
    with pytest.raises(ValueError, match="no layer has a RoPE"):
        rotary_kwargs_from_hf_config({**config, "no_rope_layers": [0] * 8})
    with pytest.raises(ValueError, match="has 2 entries, none for layer 4"):
        rotary_kwargs_from_hf_config({**config, "no_rope_layers": [1, 1]}, layer=4)


def test_llama4_layer_types_of_nope_layers_are_refused():
    # Llama4TextConfig names the RoPE layers "chunked_attention", the NoPE ones "full_attention"
    config = {**SMOLLM3, "model_type": "llama4_text", "no_rope_layers": [1, 1, 1, 0] * 2,
              "layer_types": (["chunked_attention"] * 3 + ["full_attention"]) * 2}
    assert rotary_kwargs_from_hf_config(config, layer_type="chunked_attention") == rotary_kwargs_from_hf_config(config)
    with pytest.raises(ValueError, match="the 'full_attention' layers have no RoPE"):
        rotary_kwargs_from_hf_config(config, layer_type="full_attention")
    with pytest.raises(ValueError, match=r"layer=3 is a 'full_attention' layer \(layer_types\[3\]\), not "
                                         r"layer_type='chunked_attention'"):
        rotary_kwargs_from_hf_config(config, layer=3, layer_type="chunked_attention")


def test_molmo2_rope_scaling_layers():
    scaled = rotary_kwargs_from_hf_config({**MOLMO2, "rope_scaling_layers": None})  # default: every layer scaled
    assert scaled["scaling"] == {"rope_type": "linear", "factor": 2.0}
    unscaled = {**scaled, "scaling": None}  # the same theta and head
    assert [rotary_kwargs_from_hf_config(MOLMO2, layer=i) for i in range(4)] == [unscaled, scaled] * 2
    with pytest.raises(ValueError, match=r"layers \[0, 2\] by an unscaled one of the same rope_theta; pass layer="):
        pf.RotaryEmbedding.from_hf_config(MOLMO2)
    assert rotary_kwargs_from_hf_config({**MOLMO2, "rope_scaling_layers": [0, 1, 2, 3]}) == scaled
    default = {**MOLMO2, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}  # nothing scaled
    assert rotary_kwargs_from_hf_config(default) == rotary_kwargs_from_hf_config(default, layer=0) == unscaled
    flat = {key: value for key, value in MOLMO2.items() if key != "rope_parameters"}  # transformers 4's form
    flat.update(rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0})
    assert [rotary_kwargs_from_hf_config(flat, layer=i) for i in range(4)] == [unscaled, scaled] * 2


def test_layer_is_its_layer_type_and_reads_its_own_per_layer_config():
    full = rotary_kwargs_from_hf_config(GEMMA3, layer_type="full_attention")
    assert rotary_kwargs_from_hf_config(GEMMA3, layer=5) == full and full["base"] == 1e6
    assert rotary_kwargs_from_hf_config(GEMMA3, layer=0)["base"] == 1e4
    with pytest.raises(ValueError, match=r"layer=0 is a 'sliding_attention' layer \(layer_types\[0\]\), not "
                                         r"layer_type='full_attention'"):
        rotary_kwargs_from_hf_config(GEMMA3, layer=0, layer_type="full_attention")
    # two full-attention layers of different head sizes: refused per layer type, read per layer
    config = {**GEMMA3, "head_dim": 128, "layer_types": ["sliding_attention", "full_attention"] * 2,
              "per_layer_config": {"1": {"head_dim": 256}, "3": {"head_dim": 512}}}
    with pytest.raises(ValueError, match="the layers of type 'full_attention' differ"):
        rotary_kwargs_from_hf_config(config, layer_type="full_attention")
    assert [rotary_kwargs_from_hf_config(config, layer=i)["dim"] for i in range(4)] == [128, 256, 128, 512]
    # DeepSeek-V4: a layer type or its RoPE's name ("main") agree with layer=
    v4 = {"model_type": "deepseek_v4", "hidden_size": 256, "num_attention_heads": 4, "head_dim": 512,
          "num_hidden_layers": 2, "layer_types": ["sliding_attention", "compressed_sparse_attention"]}
    main = rotary_kwargs_from_hf_config(v4, layer_type="main")
    assert rotary_kwargs_from_hf_config(v4, layer=0, layer_type="main") == main
    assert rotary_kwargs_from_hf_config(v4, layer=1) == rotary_kwargs_from_hf_config(v4, layer_type="compress")
    indexer = rotary_kwargs_from_hf_config({**v4, "index_head_dim": 128}, attention="indexer")
    assert rotary_kwargs_from_hf_config({**v4, "index_head_dim": 128}, attention="indexer", layer=1) == indexer
    # dots3's checkpoint form: its configuration class fills layer_types (layers 0, 1, 5, 9, ... indexed)
    dots3 = {"model_type": "dots3_note_text", "hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 6,
             "qk_rope_head_dim": 64, "index_head_dim": 128}
    assert (rotary_kwargs_from_hf_config(dots3, layer=5, attention="indexer")
            == rotary_kwargs_from_hf_config(dots3, layer_type="indexed_attention", attention="indexer"))
    with pytest.raises(ValueError, match=r"only the 'indexed_attention' layers have an indexer, not "
                                         r"layer_type='sliding_attention' \(layer 2\)"):
        rotary_kwargs_from_hf_config(dots3, layer=2, attention="indexer")


GLM_DSA = {"model_type": "glm_moe_dsa", "hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 4,
           "qk_rope_head_dim": 16, "kv_lora_rank": 32, "index_head_dim": 32}


@pytest.mark.parametrize("form, shared", [({}, []), ({"index_topk_freq": 2}, [2]), ({"index_topk_pattern": "FSSF"}, [1, 2]),
                                          ({"indexer_types": ["full", "full", "full", "shared"]}, [3])])
def test_a_layer_sharing_another_layers_indexer_has_none_to_read(form, shared):
    config = {**GLM_DSA, **form}
    for layer in range(4):
        if layer in shared:
            with pytest.raises(ValueError, match=rf"layer {layer} has no indexer of its own \(indexer_types\[{layer}\]"):
                rotary_kwargs_from_hf_config(config, layer=layer, attention="indexer")
        else:
            assert rotary_kwargs_from_hf_config(config, layer=layer, attention="indexer") == \
                rotary_kwargs_from_hf_config(config, attention="indexer")
        # the main attention rotates in every layer
        assert rotary_kwargs_from_hf_config(config, layer=layer) == rotary_kwargs_from_hf_config(config)


@pytest.mark.parametrize("form, message", [({"index_topk_pattern": "FSXF"}, "a string of 'F' and 'S'"),
                                           ({"indexer_types": ["full"]}, "must list each layer"),
                                           ({"index_topk_freq": "2"}, "must be ints, got '2' and 2")])
def test_indexer_types_that_do_not_say_are_refused(form, message):
    with pytest.raises(ValueError, match=message):
        rotary_kwargs_from_hf_config({**GLM_DSA, **form}, layer=2, attention="indexer")
