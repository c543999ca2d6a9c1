"""Tests of reading Hugging Face configs, against transformers 5 and 4 fixtures.

The fixtures hold tiny configs with real RoPE parameters, in transformers-4
form and in the form transformers 5 saves, with the dims, frequencies and
attention factor transformers computes for them (see
``fixtures/make_rope_fixtures.py``). Frequencies are compared within
transformers' float32 error budget, as in ``test_frequencies.py``.
"""

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_matches_hf

import posenc_fast as pf
from posenc_fast._frequencies import resolve_rope_scaling
from posenc_fast._hf_config import rotary_kwargs_from_hf_config

FIXTURES = Path(__file__).parent / "fixtures"
TF5 = json.loads((FIXTURES / "rope_models_tf5.json").read_text())["cases"]
TF4 = json.loads((FIXTURES / "rope_models_tf4.json").read_text())["cases"]

# (fixture set, case, config form, expected key) for every config transformers could read
FORMS = (
    [("tf5", c, "config_v4", "expected") for c in TF5 if "expected" in c]
    + [("tf5", c, "config_v5", "expected_v5") for c in TF5 if "expected" in c]
    # transformers 4 computes fewer frequencies than Llama rotates here (it would fail at apply time);
    # transformers 5 ignores partial_rotary_factor for Llama's default RoPE, and so does this reader
    + [("tf4", c, "config_v4", "expected") for c in TF4 if "expected" in c and c["name"] != "llama_partial_ignored"]
)


def _form_id(form):
    return f"{form[0]}-{form[1]['name']}-{form[2]}"


def test_fixture_versions_and_coverage():
    families = {c["config_v4"]["model_type"] for c in TF5}
    assert families >= {"llama", "mistral", "qwen2", "qwen3", "gemma", "phi", "phi3", "gpt_neox", "gptj",
                        "stablelm", "deepseek_v3"}
    # transformers 5.24 cannot read Phi-3's legacy "su" without an inner original_max_position_embeddings;
    # transformers 4 can, and that case is checked against transformers 4
    assert [c["name"] for c in TF5 if "expected" not in c] == ["phi3_su"]
    assert any(c["name"] == "phi3_su" and "expected" in c for c in TF4)


@pytest.mark.parametrize("form", FORMS, ids=[_form_id(f) for f in FORMS])
def test_config_matches_transformers(form):
    _, case, config_key, expected_key = form
    config = copy.deepcopy(case[config_key])
    expected = case[expected_key]
    kwargs = rotary_kwargs_from_hf_config(config)
    assert config == case[config_key]  # input untouched
    assert set(kwargs) == {"dim", "rotary_dim", "base", "layout", "scaling"}
    assert (kwargs["dim"], kwargs["rotary_dim"], kwargs["layout"]) == (
        expected["dim"], expected["rotary_dim"], expected["layout"])
    assert isinstance(kwargs["base"], float)
    freqs = resolve_rope_scaling(kwargs["scaling"], rotary_dim=kwargs["rotary_dim"], base=kwargs["base"])
    assert_matches_hf(freqs.inv_freq, expected["inv_freq"], kwargs["rotary_dim"])
    assert freqs.attention_factor == pytest.approx(expected["attention_factor"], rel=1e-7)
    if "long_seq_len" in expected:
        assert freqs.depends_on_length and freqs.rope_type == expected["rope_type"]
        assert freqs.inv_freq_for(expected["original"]) is freqs.inv_freq
        assert_matches_hf(freqs.inv_freq_for(expected["long_seq_len"]), expected["long_inv_freq"], kwargs["rotary_dim"])
        assert freqs.attention_factor_for(expected["long_seq_len"]) == pytest.approx(
            expected["long_attention_factor"], rel=1e-7)


def _case(name, fixtures=TF5):
    return copy.deepcopy(next(c for c in fixtures if c["name"] == name))


@pytest.mark.parametrize(
    "name,dim,rotary_dim,base,layout,scaling",
    [
        ("llama31_llama3", 128, 128, 500000.0, "half",
         {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}),
        ("llama_dynamic", 64, 64, 10000.0, "half",
         {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4096}),
        ("qwen2_yarn", 128, 128, 1000000.0, "half",
         {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
        ("qwen3_no_head_dim", 128, 128, 1000000.0, "half", None),
        ("gemma_default_head_dim", 256, 256, 10000.0, "half", None),
        ("mistral_nemo_head_dim", 128, 128, 1000000.0, "half", None),
        ("phi1_default_partial", 64, 32, 10000.0, "half", None),
        ("gpt_neox_pythia", 64, 16, 10000.0, "half", None),
        ("gptj", 128, 64, 10000.0, "interleaved", None),
        ("stablelm_3b", 80, 20, 10000.0, "half", None),
        ("deepseek_v3_yarn", 64, 64, 10000.0, "interleaved",
         {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
          "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}),
    ],
)
def test_expected_kwargs(name, dim, rotary_dim, base, layout, scaling):
    for key in ("config_v4", "config_v5"):
        kwargs = rotary_kwargs_from_hf_config(_case(name)[key])
        assert kwargs == dict(dim=dim, rotary_dim=rotary_dim, base=base, layout=layout, scaling=scaling)


def test_phi3_su_reads_top_level_original_and_derives_factor():
    case = _case("phi3_su", TF4)
    kwargs = rotary_kwargs_from_hf_config(case["config_v4"])
    scaling = kwargs["scaling"]
    assert scaling["rope_type"] == "longrope"
    assert scaling["original_max_position_embeddings"] == 4096
    assert scaling["factor"] == 131072 / 4096
    assert scaling["short_factor"] == case["config_v4"]["rope_scaling"]["short_factor"]
    # Phi3Config's class default of 4096 applies when the top level leaves it out
    del case["config_v4"]["original_max_position_embeddings"]
    case["config_v4"]["rope_scaling"]["original_max_position_embeddings"] = 8192
    assert rotary_kwargs_from_hf_config(case["config_v4"])["scaling"]["original_max_position_embeddings"] == 4096


def test_top_level_original_wins_and_dynamic_uses_max_positions():
    config = {"model_type": "llama", "hidden_size": 128, "num_attention_heads": 2, "max_position_embeddings": 16384,
              "original_max_position_embeddings": 2048,
              "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}}
    assert rotary_kwargs_from_hf_config(config)["scaling"]["original_max_position_embeddings"] == 2048
    config["rope_scaling"] = {"type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 1024}
    assert rotary_kwargs_from_hf_config(config)["scaling"] == {
        "rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 16384}


def test_yarn_and_longrope_derive_factor_and_original():
    # YaRN's factor None is max_position_embeddings / original (transformers' _compute_yarn_parameters);
    # without the key transformers refuses the config (it reads rope_parameters["factor"])
    config = {"model_type": "llama", "head_dim": 64, "hidden_size": 128, "num_attention_heads": 2,
              "max_position_embeddings": 32768,
              "rope_parameters": {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 4096,
                                  "rope_theta": 1e4}}
    assert rotary_kwargs_from_hf_config(config)["scaling"]["factor"] == 8.0
    del config["rope_parameters"]["factor"]
    with pytest.raises(ValueError, match="rope_parameters has no 'factor' \\(rope_type 'yarn'\\)"):
        rotary_kwargs_from_hf_config(config)
    config["rope_parameters"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0}
    assert rotary_kwargs_from_hf_config(config)["scaling"]["original_max_position_embeddings"] == 32768


def test_rope_scaling_wins_over_rope_parameters_and_extra_keys_are_dropped():
    config = {"model_type": "qwen2", "hidden_size": 128, "num_attention_heads": 2,
              "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
              "rope_scaling": {"type": "linear", "factor": 2.0, "finetuned": True, "rope_theta": 1e6}}
    kwargs = rotary_kwargs_from_hf_config(config)
    assert kwargs["base"] == 1e6 and kwargs["scaling"] == {"rope_type": "linear", "factor": 2.0}


def test_model_rules():
    neox = {"model_type": "gpt_neox", "hidden_size": 256, "num_attention_heads": 4, "rope_theta": 5.0,
            "partial_rotary_factor": 1.0}
    # GPT-NeoX ignores top-level rope_theta / partial_rotary_factor: rotary_emb_base and rotary_pct, defaults
    assert rotary_kwargs_from_hf_config(neox) == dict(dim=64, rotary_dim=16, base=10000.0, layout="half",
                                                      scaling=None)
    japanese = dict(neox, model_type="gpt_neox_japanese")  # GPTNeoXJapaneseConfig: rotary_pct default 1.0
    assert rotary_kwargs_from_hf_config(japanese)["rotary_dim"] == 64
    assert rotary_kwargs_from_hf_config(dict(japanese, rotary_pct=0.5, rotary_emb_base=5e4)) == dict(
        dim=64, rotary_dim=32, base=5e4, layout="half", scaling=None)
    llama = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 2, "partial_rotary_factor": 0.5}
    assert rotary_kwargs_from_hf_config(llama)["rotary_dim"] == 128
    qwen3 = {"model_type": "qwen3", "hidden_size": 256, "num_attention_heads": 4, "head_dim": None}
    assert rotary_kwargs_from_hf_config(qwen3)["dim"] == 64
    deepseek = {"model_type": "deepseek_v3", "hidden_size": 256, "num_attention_heads": 2, "rope_interleave": False}
    assert rotary_kwargs_from_hf_config(deepseek) == dict(dim=64, rotary_dim=64, base=10000.0, layout="half",
                                                          scaling=None)
    other = {"hidden_size": 256, "num_attention_heads": 2, "partial_rotary_factor": 0.5, "rope_theta": 1e6}
    for layout in ("half", "interleaved"):
        assert rotary_kwargs_from_hf_config(other, layout=layout) == dict(
            dim=128, rotary_dim=64, base=1e6, layout=layout, scaling=None)


def test_path_input(tmp_path):
    case = _case("phi4_mini_longrope_partial")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(case["config_v5"]))
    expected = rotary_kwargs_from_hf_config(case["config_v5"])
    assert rotary_kwargs_from_hf_config(path) == expected
    assert rotary_kwargs_from_hf_config(str(path)) == expected


@pytest.mark.parametrize("config", [42, None, ["config.json"], b"config.json"])
def test_wrong_type_raises_type_error(config):
    with pytest.raises(TypeError, match="config must be a dict, a transformers config or a path"):
        rotary_kwargs_from_hf_config(config)


def test_unreadable_paths_raise_value_error(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(ValueError, match="cannot read config file.*nope.json"):
        rotary_kwargs_from_hf_config(missing)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json.*not valid JSON"):
        rotary_kwargs_from_hf_config(bad)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ValueError, match="list.json.*JSON object, got list"):
        rotary_kwargs_from_hf_config(listed)


@pytest.mark.parametrize(
    "config,match",
    [
        ({"model_type": "llama", "num_attention_heads": 2}, "missing 'hidden_size'"),
        ({"model_type": "llama", "hidden_size": 128}, "missing 'num_attention_heads'"),
        ({"model_type": "gptj", "n_head": 2}, "missing 'hidden_size'"),
        ({"model_type": "llama", "hidden_size": 128, "num_attention_heads": 0}, "'num_attention_heads'.*>= 1"),
        ({"model_type": "llama", "hidden_size": 128, "num_attention_heads": 2, "rope_theta": None}, "'rope_theta'"),
        ({"model_type": "llama", "hidden_size": 128, "num_attention_heads": 2, "rope_theta": "1e4"}, "'rope_theta'"),
        ({"model_type": "llama", "hidden_size": 128, "num_attention_heads": 2,
          "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}, "no stream rule for this model type"),
        ({"model_type": "qwen2_vl_text", "hidden_size": 128, "num_attention_heads": 2,
          "rope_parameters": {"rope_type": "default", "mrope_section": [16, 24, 20]}}, r"must sum to the 32 rotated"),
        ({"model_type": "qwen3_vl_text", "hidden_size": 256, "num_attention_heads": 2,
          "rope_parameters": {"rope_type": "default", "mrope_section": [32, 32]}}, "3 entries"),
        ({"model_type": "qwen2_vl_text", "hidden_size": 128, "num_attention_heads": 2,
          "rope_parameters": {"rope_type": "default", "mrope_section": "16"}}, "list of ints"),
        ({"model_type": "qwen2_vl_text", "hidden_size": 128, "num_attention_heads": 2,
          "rope_parameters": {"rope_type": "default", "mrope_section": [32]}},
         r"mrope_section \[32\] gives no pair to position stream\(s\) \[1, 2\] of the 3 rows"),
        ({"model_type": "qwen3_vl_text", "hidden_size": 256, "num_attention_heads": 2,
          "rope_parameters": {"rope_type": "default", "mrope_section": [32, 32, 0]}}, r"stream\(s\) \[2\]"),
        ({"model_type": "hunyuan_vl_text", "hidden_size": 128, "num_attention_heads": 2,
          "rope_parameters": {"rope_type": "default"}}, "no mrope_section"),
        ({"model_type": "ernie4_5_vl_moe_text", "hidden_size": 256, "num_attention_heads": 2,
          "rope_parameters": {"rope_type": "default", "mrope_section": [20, 24, 20]}},
         r"mrope_section \[20, 24, 20\] must give h and w as many pairs"),
        ({"model_type": "llama", "hidden_size": 128, "num_attention_heads": 2, "rope_scaling": "linear"},
         "must be an object"),
        ({"model_type": "gemma3_text", "head_dim": 64, "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
         r"one RoPE per layer type \['full_attention', 'sliding_attention'\]; pass layer_type="),
        ({"model_type": "llama", "hidden_size": 256, "num_attention_heads": 2, "partial_rotary_factor": 0.5,
          "rope_scaling": {"type": "linear", "factor": 2.0}}, "partial_rotary_factor=0.5 with rope_type 'linear'"),
        ({"model_type": "phi", "hidden_size": 160, "num_attention_heads": 2, "partial_rotary_factor": 0.2625},
         "even.*rotary_dim=21"),
        ({"model_type": "phi", "hidden_size": 160, "num_attention_heads": 2, "partial_rotary_factor": 1.5},
         r"partial_rotary_factor must be in \(0, 1\]"),
        ({"model_type": "llama", "hidden_size": 130, "num_attention_heads": 2}, "even.*rotary_dim=65"),
        ({"model_type": "cohere2_moe", "hidden_size": 128, "num_attention_heads": 2,
          "rope_parameters": {"rope_type": "default"}}, "no 'rope_theta'.*its configuration class fills in none"),
        ({"model_type": 7}, "'model_type' must be a string"),
        ({"model_type": "gemma4_text", "head_dim": 64, "layer_types": [{"a": 1}],
          "per_layer_config": {"0": {"head_dim": 8}}}, "'layer_types' list of strings"),
        ({"model_type": "gemma4_text", "head_dim": 64, "layer_types": ["x"], "per_layer_config": [1]},
         "'per_layer_config' must be an object"),
        ({"model_type": "gemma4_text", "head_dim": 64, "layer_types": ["x"], "per_layer_config": {"a": {}}},
         "keys of 'per_layer_config' must be layer indices"),
        ({"model_type": "gemma4_text", "head_dim": 64, "layer_types": ["x"], "per_layer_config": {"0": 3}},
         "each 'per_layer_config' entry must be an object"),
    ],
)
def test_bad_configs_raise_value_error(config, match):
    with pytest.raises(ValueError, match=match):
        rotary_kwargs_from_hf_config(config)


def test_invalid_scaling_values_surface_from_resolve():
    config = {"model_type": "llama", "hidden_size": 128, "num_attention_heads": 2,
              "rope_scaling": {"type": "linear", "factor": 0.5}}
    kwargs = rotary_kwargs_from_hf_config(config)
    with pytest.raises(ValueError, match="'factor'.*>= 1"):
        resolve_rope_scaling(kwargs["scaling"], rotary_dim=kwargs["rotary_dim"], base=kwargs["base"])


# --------------------------------------------------------------------------- through the public API

ROTATIONS = [(c, r) for c in TF5 for r in c.get("rotations", [])]


@pytest.mark.parametrize("case,rotation", ROTATIONS,
                         ids=[f"{c['name']}-max{max(r['positions'])}" for c, r in ROTATIONS])
def test_rotation_matches_transformers(case, rotation):
    """``RotaryEmbedding.from_hf_config(cfg).apply_qk`` against the model's own transformers rotation.

    transformers forms angles, cos and sin in float32 from its float32
    inv_freq, so its output is not bitwise what float64 angles give. Each
    rotated pair of amplitude ``A`` may differ by ``A * (dtheta + 2**-20)``,
    where ``dtheta`` is how far transformers' float32 angle
    ``float32(p * inv_hf)`` is from ours (``p * inv_freq_for(seq_len)``), and
    ``2**-20`` (8 float32 eps) covers its float32 cos, sin, products and sum.
    Features that do not rotate must come back unchanged.
    """
    rope = pf.RotaryEmbedding.from_hf_config(copy.deepcopy(case["config_v5"]))
    expected = case["expected_v5"]
    q = np.asarray(rotation["q"], dtype=np.float32)
    k = np.asarray(rotation["k"], dtype=np.float32)
    positions = np.asarray(rotation["positions"])
    q_rot, k_rot = rope.apply_qk(q, k, positions)
    assert q_rot.dtype == np.float32 and q_rot.shape == q.shape and k_rot.shape == k.shape

    r = expected["rotary_dim"]
    ours_inv = rope.inv_freq_for(int(positions.max()) + 1)
    hf_inv = np.asarray(rotation["hf_inv_freq"], dtype=np.float32)
    p = positions.astype(np.float32)[:, None]
    dtheta = np.abs((p * hf_inv[None, :]).astype(np.float64) - positions[:, None] * ours_inv[None, :])

    for x, ours, hf in ((q, q_rot, rotation["q_rot"]), (k, k_rot, rotation["k_rot"])):
        hf = np.asarray(hf, dtype=np.float32)
        if expected["layout"] == "interleaved":
            pairs = (slice(0, r, 2), slice(1, r, 2))
        else:
            pairs = (slice(0, r // 2), slice(r // 2, r))
        if rotation["hf_output"] == "deinterleaved":
            # DeepSeek-V3 writes rotated pairs as [all firsts, all seconds]; dot products are the same
            hf_pairs = (hf[..., : r // 2], hf[..., r // 2 : r])
        else:
            hf_pairs = (hf[..., pairs[0]], hf[..., pairs[1]])
        amplitude = rope.attention_factor * np.hypot(x[..., pairs[0]].astype(np.float64),
                                                     x[..., pairs[1]].astype(np.float64))
        tolerance = amplitude * (dtheta + 2.0**-20)
        for ours_part, hf_part in zip((ours[..., pairs[0]], ours[..., pairs[1]]), hf_pairs):
            error = np.abs(ours_part.astype(np.float64) - hf_part)
            assert np.all(error <= tolerance), f"worst excess {np.max(error - tolerance):.3g}"
        np.testing.assert_array_equal(ours[..., r:], hf[..., r:])
