"""Tests of reading Hugging Face configs, against transformers 5 and 4 fixtures.

The fixtures hold tiny configs with real RoPE parameters, in transformers-4
form and in the form transformers 5 saves, with the dims, frequencies and
attention factor transformers computes for them (see
``fixtures/make_rope_fixtures.py``). Frequencies are compared within
transformers' float32 error budget, as in ``test_frequencies.py``.
"""

import copy
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from helpers import float32_ulp_distance, hf_inv_freq_budget

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


def assert_matches_hf(ours: np.ndarray, hf, rotary_dim: int) -> None:
    """float32(ours) within transformers' float32 error budget of hf (see test_frequencies.py)."""
    assert ours.dtype == np.float64 and ours.shape == (len(hf),)
    distance = float32_ulp_distance(ours, hf)
    budget = hf_inv_freq_budget(ours, rotary_dim)
    assert np.all(distance <= budget), f"{np.max(distance - budget)} float32 ulps over budget"


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
        ({"model_type": "hunyuan_vl_text", "hidden_size": 128, "num_attention_heads": 2,
          "rope_parameters": {"rope_type": "default", "mrope_section": [16, 16]}},
         r"two features of pair 0 the angles of streams 0 and 1.*not a rotation of pairs"),
        ({"model_type": "hunyuan_vl_text", "hidden_size": 128, "num_attention_heads": 2,
          "rope_parameters": {"rope_type": "default"}}, "no mrope_section"),
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
    import posenc_fast as pf

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


# --------------------------------------------------------------------------- model rules, layer types, composites

GEMMA3_FLAT = {"model_type": "gemma3_text", "head_dim": 256, "hidden_size": 2560, "num_attention_heads": 8,
               "rope_theta": 1e6, "rope_local_base_freq": 1e4, "max_position_embeddings": 131072,
               "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
GEMMA3_NESTED = {"model_type": "gemma3_text", "head_dim": 256, "hidden_size": 2560, "num_attention_heads": 8,
                 "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
                 "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}


@pytest.mark.parametrize("config", [GEMMA3_FLAT, GEMMA3_NESTED], ids=["flat", "nested"])
def test_gemma3_one_rope_per_layer_type(config):
    full = rotary_kwargs_from_hf_config(config, layer_type="full_attention")
    sliding = rotary_kwargs_from_hf_config(config, layer_type="sliding_attention")
    assert full == dict(dim=256, rotary_dim=256, base=1e6, layout="half",
                        scaling={"rope_type": "linear", "factor": 8.0})
    assert sliding == dict(dim=256, rotary_dim=256, base=1e4, layout="half", scaling=None)
    with pytest.raises(ValueError, match="one RoPE per layer type.*pass layer_type="):
        rotary_kwargs_from_hf_config(config)
    if "layer_types" not in config:  # layer= cannot say which type a layer is then, and the message says so
        with pytest.raises(ValueError, match="pass layer_type= to choose one .* so layer= cannot"):
            rotary_kwargs_from_hf_config(dict(config, num_hidden_layers=8), layer=5)
    with pytest.raises(ValueError, match=r"layer_type='chunked' is not a layer type"):
        rotary_kwargs_from_hf_config(config, layer_type="chunked")
    with pytest.raises(TypeError, match="layer_type must be a str"):
        rotary_kwargs_from_hf_config(config, layer_type=1)


def test_gemma3_flat_config_reads_as_transformers_converts_it():
    transformers = pytest.importorskip("transformers")
    flat = dict(GEMMA3_FLAT, rope_scaling=dict(GEMMA3_FLAT["rope_scaling"]))
    converted = transformers.Gemma3TextConfig(**{k: v for k, v in flat.items() if k != "model_type"}).to_dict()
    for layer_type in ("full_attention", "sliding_attention"):
        assert rotary_kwargs_from_hf_config(flat, layer_type=layer_type) == rotary_kwargs_from_hf_config(
            converted, layer_type=layer_type)


@pytest.mark.parametrize("config, key", [
    # a key the class stores in another field sets that field, as transformers' attribute_map does
    ({"model_type": "glm4_moe_lite", "head_dim": 40}, "qk_rope_head_dim"),
    ({"model_type": "glm4_moe_lite", "head_dim": 40, "qk_rope_head_dim": 16}, "qk_rope_head_dim"),  # it wins
    ({"model_type": "jetmoe", "kv_channels": 48}, "head_dim"),
    ({"model_type": "zamba2", "head_dim": 48}, "attention_head_dim")])
def test_a_key_read_under_another_name_reads_as_the_class_stores_it(config, key):
    config = dict(config, hidden_size=256, num_attention_heads=4)
    got = rotary_kwargs_from_hf_config(config)
    assert got["rotary_dim"] == 40 if config["model_type"] == "glm4_moe_lite" else got["dim"] == 48
    transformers = pytest.importorskip("transformers")
    built = transformers.AutoConfig.for_model(**config)
    assert getattr(built, key) == got["rotary_dim"]
    assert rotary_kwargs_from_hf_config(built) == got


@pytest.mark.parametrize("model_type", ["deepseek_v3", "axk1", "longcat_flash", "youtu", "mistral4"])
def test_a_latent_attentions_head_dim_apart_from_its_rotation_is_refused(model_type):
    # their classes keep a head_dim the config gives, their rotary module builds cos/sin that wide, and the
    # model fails on them (its attention rotates qk_rope_head_dim features)
    rope = {"rope_type": "default", "rope_theta": 1e4}
    if model_type == "mistral4":  # its class derives rope_parameters; it rotates half of head_dim
        rope["partial_rotary_factor"] = 0.5
    config = {"model_type": model_type, "hidden_size": 256, "num_attention_heads": 2, "qk_rope_head_dim": 16,
              "qk_nope_head_dim": 16, "head_dim": 40, "rope_parameters": rope}
    with pytest.raises(ValueError, match="head_dim = 40 gives its rotary module"):
        rotary_kwargs_from_hf_config(config)
    transformers = pytest.importorskip("transformers")
    assert transformers.AutoConfig.for_model(**config).head_dim == 40
    fits = dict(config, head_dim=32 if model_type == "mistral4" else 16)  # Mistral 4 rotates half its head_dim
    assert rotary_kwargs_from_hf_config(fits)["rotary_dim"] == 16
    # a class that sets head_dim itself (DeepSeek-V2's qk_rope_head_dim) ignores the key
    rewritten = dict(config, model_type="deepseek_v2")
    assert rotary_kwargs_from_hf_config(rewritten)["rotary_dim"] == 16
    assert transformers.AutoConfig.for_model(**rewritten).head_dim == 16


def test_same_rope_for_every_layer_type_needs_no_layer_type():
    config = dict(GEMMA3_NESTED, rope_parameters={key: {"rope_type": "default", "rope_theta": 1e4}
                                                  for key in ("full_attention", "sliding_attention")})
    assert rotary_kwargs_from_hf_config(config)["base"] == 1e4


def test_composite_config_reads_its_text_config():
    composite = {"model_type": "llava", "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024},
                 "text_config": {"model_type": "cohere", "hidden_size": 256, "num_attention_heads": 2,
                                 "rope_theta": 8e6}}
    assert rotary_kwargs_from_hf_config(composite) == dict(dim=128, rotary_dim=128, base=8e6,
                                                           layout="interleaved", scaling=None)


def test_unknown_model_type_is_refused_unless_layout_is_given():
    import posenc_fast as pf

    config = {"model_type": "brand_new", "hidden_size": 256, "num_attention_heads": 2}
    with pytest.raises(ValueError, match=r"no rule for model_type 'brand_new'.*pass layout='half'.*"
                                         r"layout='interleaved'"):
        pf.RotaryEmbedding.from_hf_config(config)
    assert pf.RotaryEmbedding.from_hf_config(config, layout="interleaved").layout == "interleaved"
    with pytest.raises(ValueError, match="layout='half' contradicts model_type 'cohere'"):
        rotary_kwargs_from_hf_config(dict(config, model_type="cohere"), layout="half")
    with pytest.raises(ValueError, match="layout must be"):
        rotary_kwargs_from_hf_config(config, layout="rotate_half")


def test_interleaved_and_mla_families():
    cohere = {"model_type": "cohere", "hidden_size": 256, "num_attention_heads": 2}
    assert rotary_kwargs_from_hf_config(cohere)["layout"] == "interleaved"
    youtu = {"model_type": "youtu", "hidden_size": 256, "num_attention_heads": 2, "qk_rope_head_dim": 32}
    assert rotary_kwargs_from_hf_config(youtu)[("layout")] == "interleaved"
    assert rotary_kwargs_from_hf_config(dict(youtu, rope_interleave=False))["layout"] == "half"
    assert rotary_kwargs_from_hf_config(youtu)["dim"] == rotary_kwargs_from_hf_config(youtu)["rotary_dim"] == 32


# Llama-4-Scout's rope_scaling: low_freq_factor == high_freq_factor
LLAMA4_SCOUT = {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                "original_max_position_embeddings": 8192}


def test_llama3_with_equal_factors_has_no_medium_band():
    freqs = resolve_rope_scaling(LLAMA4_SCOUT, rotary_dim=128, base=500000.0)
    plain = 500000.0 ** (-np.arange(0, 128, 2) / 128)
    expected = np.where(2 * np.pi / plain > 8192, plain / 16.0, plain)
    np.testing.assert_allclose(freqs.inv_freq, expected, rtol=1e-15)


@pytest.mark.parametrize("params", [
    {**LLAMA4_SCOUT, "rope_theta": 500000.0},
    {"rope_type": "proportional", "rope_theta": 1e6, "factor": 1.0, "partial_rotary_factor": 0.25},
    {"rope_type": "proportional", "rope_theta": 1e4, "factor": 8.0, "partial_rotary_factor": 0.5},
], ids=["llama4-scout", "proportional-gemma4", "proportional-scaled"])
def test_rope_init_functions_of_transformers(params):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(hidden_size=512, num_attention_heads=4, head_dim=128,
                                      max_position_embeddings=131072, rope_parameters=dict(params))
    hf_inv_freq, hf_factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")
    kwargs = rotary_kwargs_from_hf_config(config.to_dict())
    assert (kwargs["dim"], kwargs["rotary_dim"]) == (128, 128)
    freqs = resolve_rope_scaling(kwargs["scaling"], rotary_dim=128, base=kwargs["base"])
    assert_matches_hf(freqs.inv_freq[freqs.inv_freq > 0], hf_inv_freq.numpy()[hf_inv_freq.numpy() > 0], 128)
    assert np.array_equal(freqs.inv_freq == 0, hf_inv_freq.numpy() == 0)
    assert freqs.attention_factor == hf_factor


def test_mrope_configs():
    # transformers 4's Qwen2-VL form: "type": "mrope" is default RoPE with t/h/w sections
    qwen2_vl = {"model_type": "qwen2_vl", "hidden_size": 3584, "num_attention_heads": 28, "rope_theta": 1e6,
                "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
    kwargs = rotary_kwargs_from_hf_config(qwen2_vl)
    assert kwargs["pair_streams"] == [0] * 16 + [1] * 24 + [2] * 24
    assert (kwargs["layout"], kwargs["base"], kwargs["scaling"]) == ("half", 1e6, None)
    # a composite Qwen3-VL config: the text model's interleaved sections, the class default without one
    qwen3_vl = {"model_type": "qwen3_vl", "text_config": {"model_type": "qwen3_vl_text", "head_dim": 128,
                                                         "hidden_size": 4096, "num_attention_heads": 32,
                                                         "rope_parameters": {"rope_type": "default",
                                                                             "rope_theta": 5e6}}}
    rope = pf.RotaryEmbedding.from_hf_config(qwen3_vl)
    want = pf.RotaryEmbedding(128, base=5e6, layout="half", mrope_section=[24, 20, 20], mrope_interleaved=True)
    assert repr(rope) == repr(want) and rope.n_streams == 3
    # ERNIE-4.5-VL: h and w alternate over the first 44 pairs, then t; interleaved pairs
    ernie = {"model_type": "ernie4_5_vl_moe_text", "hidden_size": 2560, "num_attention_heads": 20}
    kwargs = rotary_kwargs_from_hf_config(ernie)
    assert kwargs["layout"] == "interleaved"
    assert kwargs["pair_streams"] == [1, 2] * 22 + [0] * 20


DSA = {"model_type": "deepseek_v32", "hidden_size": 256, "num_attention_heads": 2, "qk_rope_head_dim": 32,
       "index_head_dim": 64, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}


def test_dsa_attention_and_indexer_rotate_differently():
    # DeepseekV32Attention calls apply_rotary_pos_emb_interleave whatever rope_interleave says; its indexer
    # rotates the leading qk_rope_head_dim of index_head_dim features with apply_rotary_pos_emb (half)
    for config in (DSA, dict(DSA, rope_interleave=False), dict(DSA, model_type="axk2")):
        assert rotary_kwargs_from_hf_config(config) == dict(dim=32, rotary_dim=32, base=1e4,
                                                            layout="interleaved", scaling=None)
        assert rotary_kwargs_from_hf_config(config, attention="indexer") == dict(
            dim=64, rotary_dim=32, base=1e4, layout="half", scaling=None)
    dots3 = dict(DSA, model_type="dots3_note_text", layer_types=["indexed_attention", "sliding_attention"])
    assert rotary_kwargs_from_hf_config(dots3, attention="indexer", layer_type="indexed_attention")["layout"] \
        == "interleaved"
    with pytest.raises(ValueError, match="only the 'indexed_attention' layers have an indexer"):
        rotary_kwargs_from_hf_config(dots3, attention="indexer", layer_type="sliding_attention")
    # HYV4Indexer: `q_pass, q_rot = torch.split(...)`, its last qk_rope_head_dim features rotate (half)
    assert rotary_kwargs_from_hf_config(dict(DSA, model_type="hy_v4"), attention="indexer") == dict(
        dim=64, rotary_dim=32, rotary_start=32, base=1e4, layout="half", scaling=None)
    llama = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 2}
    with pytest.raises(ValueError, match="reads no indexer of model_type 'llama'"):
        pf.RotaryEmbedding.from_hf_config(llama, attention="indexer")
    with pytest.raises(ValueError, match="attention must be one of"):
        rotary_kwargs_from_hf_config(llama, attention="vision")


GEMMA4 = {"model_type": "gemma4_text", "hidden_size": 512, "num_attention_heads": 2, "head_dim": 64,
          "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
          "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                              "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                 "rope_theta": 1e6}},
          "per_layer_config": {"01": {"head_dim": 128}, "03": {"head_dim": 128, "sliding_window": None}}}


def test_per_layer_config_gives_each_layer_type_its_head_dim():
    sliding = rotary_kwargs_from_hf_config(GEMMA4, layer_type="sliding_attention")
    assert sliding == dict(dim=64, rotary_dim=64, base=1e4, layout="half", scaling=None)
    full = rotary_kwargs_from_hf_config(GEMMA4, layer_type="full_attention")
    assert (full["dim"], full["rotary_dim"], full["base"]) == (128, 128, 1e6)
    assert full["scaling"] == {"rope_type": "proportional", "partial_rotary_factor": 0.25}
    with pytest.raises(ValueError, match="pass layer_type="):
        rotary_kwargs_from_hf_config(GEMMA4)
    uneven = dict(GEMMA4, per_layer_config={"01": {"head_dim": 128}})  # layer 3 keeps head_dim 64
    with pytest.raises(ValueError, match="layers of type 'full_attention' differ in 'per_layer_config'"):
        rotary_kwargs_from_hf_config(uneven, layer_type="full_attention")
    same_rope = dict(GEMMA4, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    with pytest.raises(ValueError, match="different configs .*pass layer_type="):
        rotary_kwargs_from_hf_config(same_rope)
    with pytest.raises(ValueError, match="layer_type='chunked_attention' is not a layer type"):
        rotary_kwargs_from_hf_config(GEMMA4, layer_type="chunked_attention")


def test_config_key_names_and_composites():
    dbrx = {"model_type": "dbrx", "d_model": 256, "n_heads": 4, "rope_parameters": {"rope_theta": 5e5}}
    assert rotary_kwargs_from_hf_config(dbrx)["dim"] == 64
    codegen = {"model_type": "codegen", "n_embd": 256, "n_head": 4, "rotary_dim": 32}
    assert rotary_kwargs_from_hf_config(codegen) == dict(dim=64, rotary_dim=32, base=1e4, layout="interleaved",
                                                         scaling=None)
    moonshine = {"model_type": "moonshine", "hidden_size": 288, "decoder_num_attention_heads": 8,
                 "encoder_num_attention_heads": 4, "partial_rotary_factor": 0.9}
    assert rotary_kwargs_from_hf_config(moonshine) == dict(dim=36, rotary_dim=32, base=1e4, layout="interleaved",
                                                           scaling=None)
    text = {"model_type": "qwen2_5_omni_text", "hidden_size": 256, "num_attention_heads": 2,
            "rope_parameters": {"rope_theta": 1e6, "mrope_section": [16, 24, 24]}}
    omni = {"model_type": "qwen2_5_omni", "talker_config": {"model_type": "qwen2_5_omni_talker"},
            "thinker_config": {"model_type": "qwen2_5_omni_thinker", "text_config": text}}
    assert rotary_kwargs_from_hf_config(omni)["base"] == 1e6
    voxtral = {"model_type": "voxtral_realtime", "hidden_size": 3072,  # the top level has no attention heads
               "audio_config": {"model_type": "voxtral_realtime_encoder"},
               "text_config": {"model_type": "voxtral_realtime_text", "hidden_size": 256, "num_attention_heads": 2}}
    assert rotary_kwargs_from_hf_config(voxtral)["dim"] == 128
    dia = {"model_type": "dia", "encoder_config": {"model_type": "dia_encoder"},
           "decoder_config": {"model_type": "dia_decoder", "hidden_size": 256, "num_attention_heads": 4}}
    assert rotary_kwargs_from_hf_config(dia)["dim"] == 128  # DiaDecoderConfig's head_dim default, not 256 // 4


def test_odd_partial_width_rotates_what_transformers_rotates():
    # GLM-4.5's default: head_dim 42, int(42 * 0.5) = 21: transformers computes base ** (-arange(0, 21, 2) / 21)
    # (11 frequencies) and rotates cos.shape[-1] = 22 features
    glm = {"model_type": "glm4_moe", "hidden_size": 4032, "num_attention_heads": 96,
           "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}}
    rope = pf.RotaryEmbedding.from_hf_config(glm)
    assert (rope.dim, rope.rotary_dim) == (42, 22)
    want = 1.0 / 1e4 ** (np.arange(0, 21, 2) / 21)
    np.testing.assert_allclose(rope.inv_freq, want, rtol=1e-14, atol=0)
    scaled = dict(glm, rope_parameters=dict(glm["rope_parameters"], rope_type="linear", factor=2.0))
    with pytest.raises(ValueError, match="rotated width must be even"):
        rotary_kwargs_from_hf_config(scaled)
    llama = {"model_type": "llama", "hidden_size": 4032, "num_attention_heads": 64}  # a whole odd head: refused
    with pytest.raises(ValueError, match="rotated width must be even"):
        rotary_kwargs_from_hf_config(llama)


def test_nanochat_rotates_by_minus_theta():
    # NanoChat's rotate_half is cat(x2, -x1): q * cos + rotate_half(q) * sin rotates each pair by -theta
    config = {"model_type": "nanochat", "hidden_size": 128, "num_attention_heads": 2}
    assert rotary_kwargs_from_hf_config(config) == dict(dim=64, rotary_dim=64, base=1e4, layout="half",
                                                        scaling=None, reverse=True)
    rope = pf.RotaryEmbedding.from_hf_config(config)
    forward = pf.RotaryEmbedding(64, layout="half")
    x = np.random.default_rng(0).standard_normal((2, 5, 64))
    assert rope.reverse and np.array_equal(rope.inv_freq, -forward.inv_freq)
    np.testing.assert_array_equal(rope.apply(x), forward.apply(x, inverse=True))
    x1, x2 = x[..., :32], x[..., 32:]
    theta = np.arange(5)[:, None] * forward.inv_freq
    want = np.concatenate([x1 * np.cos(theta) + x2 * np.sin(theta), x2 * np.cos(theta) - x1 * np.sin(theta)], -1)
    np.testing.assert_allclose(rope.apply(x), want, rtol=0, atol=1e-12)
    halves = np.arange(5) + 0.5  # the general path, and the cos/sin table
    np.testing.assert_array_equal(rope.apply(x, halves), forward.apply(x, halves, inverse=True))
    np.testing.assert_array_equal(rope.cos_sin(halves)[1], -forward.cos_sin(halves)[1])
    copy = pickle.loads(pickle.dumps(rope))
    assert copy.reverse and "reverse=True" in repr(copy)
    np.testing.assert_array_equal(copy.apply(x), rope.apply(x))


def test_hunyuan_vl_full_width_sections_with_one_stream_per_pair():
    # one section: every pair's two features take stream 0 (plain RoPE with one stream)
    config = {"model_type": "hunyuan_vl_text", "hidden_size": 128, "num_attention_heads": 2,
              "rope_parameters": {"rope_type": "default", "mrope_section": [32]}}
    assert rotary_kwargs_from_hf_config(config)["pair_streams"] == [0] * 32


def test_layer_types_without_rope_parameters_have_no_rope():
    # Cohere-Compass: a layer type without its own rope_parameters entry is NoPE (None: its rotary module skips
    # it; absent: its rotary module fails), never the default RoPE
    compass = {"model_type": "cohere_compass_text", "hidden_size": 256, "num_attention_heads": 2,
               "layer_types": ["sliding_attention", "full_attention"], "rope_parameters": {}}
    with pytest.raises(ValueError, match="give no layer type a RoPE"):
        rotary_kwargs_from_hf_config(compass)
    compass["rope_parameters"] = {"sliding_attention": {"rope_type": "default", "rope_theta": 5e4},
                                  "full_attention": None}
    with pytest.raises(ValueError, match="has no RoPE for layer_type='full_attention'"):
        rotary_kwargs_from_hf_config(compass, layer_type="full_attention")
    sliding = rotary_kwargs_from_hf_config(compass, layer_type="sliding_attention")
    assert sliding["base"] == 5e4 and sliding["dim"] == 128 and len(sliding["pair_streams"]) == 64
    assert rotary_kwargs_from_hf_config(compass) == sliding  # the config's one RoPE is the default


def test_a_falcon_head_dim_other_than_its_property_is_refused():
    # FalconConfig.head_dim is hidden_size // num_attention_heads (a property transformers refuses to set)
    config = {"model_type": "falcon", "hidden_size": 36, "num_attention_heads": 6}
    assert rotary_kwargs_from_hf_config(config)["dim"] == 6
    assert rotary_kwargs_from_hf_config(dict(config, head_dim=6))["dim"] == 6
    with pytest.raises(ValueError, match="head_dim = 50, but a Falcon config's head_dim is hidden_size // "
                                         "num_attention_heads = 6"):
        rotary_kwargs_from_hf_config(dict(config, head_dim=50))


@pytest.mark.parametrize("model_type, rope_type, read_as", [
    ("phi3", "su", "longrope"), ("phi3", "yarn", "longrope"), ("phi4_multimodal", "su", "longrope"),
    ("phi4_multimodal", "yarn", "longrope"), ("llama", "yarn", "yarn"), ("llama", "su", None), ("phimoe", "su", None),
    ("llama", "ntk", None)])
def test_legacy_and_foreign_rope_types_as_transformers_reads_them(model_type, rope_type, read_as):
    # Phi3Config and Phi4MultimodalConfig rename "su" and "yarn" to "longrope"; no other class knows "su",
    # and none posenc_fast's own "ntk"
    scaling = {"rope_type": rope_type, "factor": 2.0, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
               "original_max_position_embeddings": 4096}
    config = {"model_type": model_type, "hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 8192,
              "rope_scaling": scaling}
    if read_as is None:
        with pytest.raises(ValueError, match=f"rope_type '{rope_type}' is not one transformers reads"):
            rotary_kwargs_from_hf_config(config)
        return
    assert rotary_kwargs_from_hf_config(config)["scaling"]["rope_type"] == read_as
    transformers = pytest.importorskip("transformers")
    own = transformers.AutoConfig.for_model(model_type, hidden_size=64, num_attention_heads=4,
                                            max_position_embeddings=8192, rope_scaling=dict(scaling))
    assert own.rope_parameters["rope_type"] == read_as
