"""A model type without a rule in the table: from_hf_config probes the installed transformers' own code.

Every model type the table has a rule for is probed as if it had none: a
probed rule must give exactly the table's RotaryEmbedding for the model's
default config, or the probe refuses with what it found (never a guess).
"""

import collections
import re
import warnings

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers.models.auto import configuration_auto  # noqa: E402

import posenc_fast as pf  # noqa: E402
from posenc_fast import _hf_models, _hf_probe  # noqa: E402


def _default(model_type):
    return configuration_auto.CONFIG_MAPPING[model_type]().to_dict()


def _without_rule(monkeypatch, model_type):
    rules = dict(_hf_models.MODEL_RULES)
    rules.pop(model_type)
    monkeypatch.setattr("posenc_fast._hf_config.MODEL_RULES", rules)


def _rope_or_error(model_type, layer_type):
    # refused with the table's rule: refused without it too
    try:
        return repr(pf.RotaryEmbedding.from_hf_config(_default(model_type), layer_type=layer_type))
    except ValueError as error:
        return type(error)


def test_every_probed_rule_gives_the_tables_rotary_embedding(monkeypatch):
    agreed, refused = [], collections.Counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for model_type in sorted(_hf_models.MODEL_RULES):
            try:
                rule = _hf_probe.probed_rule(model_type)
            except ValueError as error:
                reason = re.sub(r"model_type '[^']*', probed in transformers [0-9.]*:? ?", "", str(error))
                refused[re.sub(r"\d+|\[.*?\]|'.*?'", "_", reason)[:60]] += 1
                continue
            # the default call, and each layer type's where the config names them
            layer_types = [None] + sorted(set(_default(model_type).get("layer_types") or ()))
            with monkeypatch.context() as patch:
                want = [_rope_or_error(model_type, layer_type) for layer_type in layer_types]
                _without_rule(patch, model_type)
                got = [_rope_or_error(model_type, layer_type) for layer_type in layer_types]
            assert got == want, f"{model_type}: probed {rule} gives {got}, the table {want} ({layer_types})"
            agreed.append(model_type)
    print(f"{len(agreed)} of {len(_hf_models.MODEL_RULES)} rules probed and agreeing; refused: {dict(refused)}")
    assert len(agreed) >= 150  # the probe reads most families: a broken probe refuses them all
    assert {"llama", "cohere", "phi", "gpt_neox", "nanochat", "stablelm", "glm", "deepseek_v3", "deepseek_v32"} <= set(agreed)
    # NoPE layers read off the attention's condition on its sliding window
    assert {"cohere2", "cohere2_moe", "exaone4", "flint"} <= set(agreed)
    # keys their configuration classes rename (attribute_map): d_model, kv_channels, decoder heads
    assert {"dbrx", "jetmoe", "moonshine", "zamba2"} <= set(agreed)
    # one RoPE per layer type, probed on the first layer type that has one: LFM3's (after convolutions)
    # is proportional RoPE, pairs (i, i + dim/2) of which the last turn at angle 0
    assert "lfm3" in agreed
    # per-layer head_dim (a heterogeneous config: Gemma 4's full layers have their own), read for the layer
    # type probed
    assert {"gemma4_text", "gemma4_unified_text", "diffusion_gemma_text", "embedding_gemma2_text"} <= set(agreed)
    # GPT-J's (batch, seq, heads, head_dim) rotation given (sin, cos); complex freqs_cis (DeepSeek-V2, Llama 4,
    # whose full_attention layers are NoPE by no_rope_layers)
    assert {"gptj", "codegen", "deepseek_v2", "llama4_text"} <= set(agreed)
    # multimodal RoPE, each form of dealing pairs to position streams
    assert {"qwen2_vl_text", "qwen3_vl_text", "qwen3_5_text", "ernie4_5_vl_moe_text", "neomme",
            "hy_v4_vl_text"} <= set(agreed)


@pytest.mark.parametrize("model_type, layout, whole_head, reversed_", [
    ("llama", "half", True, False), ("cohere", "interleaved", True, False), ("phi", "half", False, False),
    ("nanochat", "half", True, True), ("glm", "interleaved", False, False),
])
def test_a_model_type_without_a_rule_is_probed(monkeypatch, model_type, layout, whole_head, reversed_):
    _without_rule(monkeypatch, model_type)
    rule = _hf_probe.probed_rule(model_type)
    assert (rule.layout, rule.whole_head, rule.reversed) == (layout, whole_head, reversed_)
    assert rule.source.endswith("(probed)")
    rope = pf.RotaryEmbedding.from_hf_config({**_default(model_type), "partial_rotary_factor": 0.5})
    assert rope.layout == layout and (rope.rotary_dim == rope.dim) == whole_head


# deepseek_v2 rotates by complex freqs_cis (refused below)
_MLA = sorted(t for t, rule in _hf_models.MODEL_RULES.items() if rule.mla and t != "deepseek_v2")


def _readings(config, kinds):
    """from_hf_config's RoPE (or the error type) for each layer type and attention kind of `config`."""
    found = []
    for layer_type in sorted(set(config.get("layer_types") or [None]), key=str):
        for kind in kinds:
            try:
                found.append(repr(pf.RotaryEmbedding.from_hf_config(config, attention=kind, layer_type=layer_type)))
            except ValueError as error:
                found.append(type(error))
    return found


@pytest.mark.parametrize("model_type", _MLA)
def test_latent_attention_is_probed_as_the_table_states_it(monkeypatch, model_type):
    # the probe reads the rotation of q_rot / k_rot in the features' own order (DeepSeek's interleave
    # function permutes them, as q and k alike), the choice by rope_interleave, and the indexer's
    table = _hf_models.MODEL_RULES[model_type]
    rule = _hf_probe.probed_rule(model_type)
    assert (rule.mla, rule.layout, rule.reads_rope_interleave, rule.indexer) == (
        True, table.layout, table.reads_rope_interleave, table.indexer)
    configs = [_default(model_type)]
    if table.reads_rope_interleave:
        configs += [{**configs[0], "rope_interleave": flag} for flag in (False, True)]
    kinds = ["main"] + (["indexer"] if table.indexer else [])
    want = [_readings(config, kinds) for config in configs]
    _without_rule(monkeypatch, model_type)
    assert [_readings(config, kinds) for config in configs] == want
    assert all(isinstance(found, str) for found in want[0][:1])
    if table.reads_rope_interleave:  # the flag switches the layout
        assert want[1] != want[2] == want[0]


def test_the_rotation_a_class_picks_by_default_is_the_rules_layout(monkeypatch):
    # a latent attention whose configuration class defaults to rope_interleave=False rotates in halves
    config_class = configuration_auto.CONFIG_MAPPING["deepseek_v3"]
    monkeypatch.setitem(configuration_auto.CONFIG_MAPPING._extra_content, "deepseek_v3",
                        lambda **kwargs: config_class(**{"rope_interleave": False, **kwargs}))
    _hf_probe.probed_rule.cache_clear()
    try:
        rule = _hf_probe.probed_rule("deepseek_v3")
    finally:
        _hf_probe.probed_rule.cache_clear()
    assert (rule.layout, rule.reads_rope_interleave) == ("half", True)


@pytest.mark.parametrize("model_type, reason", [
    # its rotary module names no layer type of its default config's layer_types
    ("deepseek_v4", "apply_rotary_pos_emb cannot be run on a probe"),
])
def test_what_the_probe_cannot_state_is_refused_with_the_reason(monkeypatch, model_type, reason):
    _without_rule(monkeypatch, model_type)
    with pytest.raises(ValueError, match=f"no rule for model_type '{model_type}', and probing .*{reason}"):
        pf.RotaryEmbedding.from_hf_config(_default(model_type))


@pytest.mark.parametrize("model_type, section, forms", [
    ("qwen2_vl_text", [8, 28, 28], "chunked"), ("qwen3_vl_text", [16, 24, 24], "thw_interleaved"),
    ("ernie4_5_vl_moe_text", [20, 20, 24], "hw_interleaved_t"), ("neomme", None, "row_col"),
])
def test_multimodal_rope_is_probed_by_how_it_deals_pairs_to_streams(monkeypatch, model_type, section, forms):
    # the probe turns each position stream alone; the form found deals another mrope_section as the table does
    config = _default(model_type)
    if section is not None:
        config["rope_parameters"] = {**config["rope_parameters"], "mrope_section": section}
    want = [_readings(c, ["main"]) for c in (_default(model_type), config)]
    assert section is None or want[0] != want[1]  # the section changes the RoPE
    _without_rule(monkeypatch, model_type)
    assert _hf_probe.probed_rule(model_type).streams == forms
    assert [_readings(c, ["main"]) for c in (_default(model_type), config)] == want
    assert all(isinstance(found, str) for found in want[0])


def _probed_with_default(monkeypatch, model_type, **defaults):
    """The probe of `model_type` whose configuration class defaults to `defaults`."""
    config_class = configuration_auto.CONFIG_MAPPING[model_type]
    monkeypatch.setitem(configuration_auto.CONFIG_MAPPING._extra_content, model_type,
                        lambda **kwargs: config_class(**{**defaults, **kwargs}))
    _hf_probe.probed_rule.cache_clear()
    try:
        return _hf_probe.probed_rule(model_type)
    finally:
        _hf_probe.probed_rule.cache_clear()


def test_a_pair_whose_features_turn_with_two_streams_is_probed(monkeypatch):
    # HunYuan-VL's rotary module splits cat(freqs, freqs) by 2 * mrope_section: features 0 and 64 of a
    # rotate_half pair take streams 0 and 2, a stream each (full_width); with every pair on stream 1 of its
    # four rows of positions, no form deals it so (pair_streams uses every row it is given)
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    rule = _probed_with_default(monkeypatch, "hunyuan_vl_text", rope_parameters={**rope, "mrope_section": [16] * 4})
    assert rule.streams == "full_width" and rule.default_section is None
    with pytest.raises(ValueError, match=r"none of posenc_fast's forms .* deal its default config"):
        _probed_with_default(monkeypatch, "hunyuan_vl_text", rope_parameters={**rope, "mrope_section": [0, 64, 0, 0]})


def test_a_default_config_two_forms_deal_alike_is_refused(monkeypatch):
    # three pairs, mrope_section [1, 1, 1]: Qwen2-VL's chunks and Qwen3-VL's interleaving both give t, h, w
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 1]}
    with pytest.raises(ValueError, match=r"chunked and thw_interleaved of posenc_fast's forms .* deal its default"):
        _probed_with_default(monkeypatch, "qwen2_vl_text", hidden_size=12, num_attention_heads=2,
                             num_key_value_heads=2, rope_parameters=rope)


def test_two_rotations_not_picked_by_rope_interleave_are_refused(monkeypatch):
    # latent attention may pick one of two rotations by config.rope_interleave; any other pair is refused
    calls = {"apply_rotary_pos_emb": ["LlamaAttention"], "rotate_half": ["LlamaAttention"]}
    monkeypatch.setattr(_hf_probe, "attention_rotations", lambda module, kind="main": calls)
    _hf_probe.probed_rule.cache_clear()
    try:
        _without_rule(monkeypatch, "llama")
        with pytest.raises(ValueError, match=r"call \['apply_rotary_pos_emb', 'rotate_half'\], not one rotation"):
            pf.RotaryEmbedding.from_hf_config(_default("llama"))
    finally:
        _hf_probe.probed_rule.cache_clear()


def test_a_rotation_method_is_refused_not_an_attribute_error():
    # V-JEPA 2's attention calls self.apply_rotary_embeddings (no rule, no module function to probe)
    assert "vjepa2" not in _hf_models.MODEL_RULES
    with pytest.raises(ValueError, match="call 'apply_rotary_embeddings', which is not a function of .* to probe"):
        pf.RotaryEmbedding.from_hf_config(_default("vjepa2"))


def test_without_transformers_the_table_alone(monkeypatch):
    _without_rule(monkeypatch, "llama")
    monkeypatch.setitem(__import__("sys").modules, "transformers", None)
    _hf_probe.probed_rule.cache_clear()
    try:
        with pytest.raises(ValueError, match="nor probed: transformers does not know it, or is not installed"):
            pf.RotaryEmbedding.from_hf_config({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2})
    finally:
        _hf_probe.probed_rule.cache_clear()


def test_a_config_whose_model_builds_a_non_text_rotary_is_not_probed_with_another_configs():
    # Qwen2.5-Omni's module holds the thinker's text rotary (multimodal) and the DiT's: the DiT's config
    # is refused naming its own class, not probed (or refused) as the thinker's
    _hf_probe.probed_rule.cache_clear()
    try:
        with pytest.raises(ValueError, match="its model builds Qwen2_5OmniDiTRotaryEmbedding, a vision, audio"):
            _hf_probe.probed_rule("qwen2_5_omni_dit")
    finally:
        _hf_probe.probed_rule.cache_clear()


@pytest.mark.parametrize("model_type, own", [
    ("qwen3_omni_moe_talker_text", "Qwen3OmniMoeTalkerRotaryEmbedding"),
    ("deepseek_ocr2_encoder", "DeepseekOcr2VisionRotaryEmbedding"),
    ("qwen2_vl_text", "Qwen2VLRotaryEmbedding"),
])
def test_a_configs_rotary_class_is_the_one_its_model_builds_whatever_its_name(model_type, own):
    # the walk runs these against their own classes, not the module's text class of another configuration
    from transformers.models.auto import configuration_auto

    config = configuration_auto.CONFIG_MAPPING[model_type]()
    assert _hf_probe.text_rotary_class(_hf_probe.modeling_module(model_type), config).__name__ == own
