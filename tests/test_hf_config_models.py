"""``from_hf_config``'s model rules: layer types, composite configs, the families that rotate otherwise.

(test_hf_config.py's companion, kept apart for its length: that file checks the keys and scalings of
every fixture config against transformers; this one the rules of particular model types.)
"""

import pickle

import numpy as np
import pytest
from helpers import assert_matches_hf

import posenc_fast as pf
from posenc_fast._frequencies import resolve_rope_scaling
from posenc_fast._hf_config import rotary_kwargs_from_hf_config


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


_GEMMA3_SCALED = {"model_type": "gemma3_text", "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4,
                  "head_dim": 64, "num_hidden_layers": 2, "max_position_embeddings": 8192,
                  "layer_types": ["sliding_attention", "full_attention"]}


@pytest.mark.parametrize("config", [
    # one dict per layer type: a layer type's truncate is not read by transformers' YaRN (it reads the top of
    # rope_parameters), and a top-level original_max_position_embeddings does not override a layer type's own
    {**_GEMMA3_SCALED, "rope_parameters": {
        "full_attention": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 1024,
                           "truncate": False, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
    {**_GEMMA3_SCALED, "rope_theta": 1e6, "rope_local_base_freq": 1e4, "original_max_position_embeddings": 4096,
     "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 1024}},
    {**_GEMMA3_SCALED, "rope_theta": 1e6, "rope_local_base_freq": 1e4, "original_max_position_embeddings": 4096,
     "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 1024,
                      "low_freq_factor": 1.0, "high_freq_factor": 4.0}},
    {**_GEMMA3_SCALED, "rope_theta": 1e6, "rope_local_base_freq": 1e4, "original_max_position_embeddings": 4096,
     "rope_scaling": {"rope_type": "yarn", "factor": 8.0}},
], ids=["nested-truncate", "flat-yarn", "flat-llama3", "flat-yarn-no-inner-length"])
def test_a_layer_types_scaling_reads_as_transformers_reads_it(config):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    rope = pf.RotaryEmbedding.from_hf_config(dict(config), layer_type="full_attention")
    built = transformers.AutoConfig.for_model(**config)
    module = Gemma3RotaryEmbedding(built)
    assert_matches_hf(rope.inv_freq, module.full_attention_inv_freq.numpy(), 64)
    cos, _ = module(torch.zeros(1), torch.tensor([[3000]]), layer_type="full_attention")
    assert np.isclose(float(cos[0, 0, 0]), rope.cos_sin(np.array([3000]), dtype=np.float64)[0][0, 0], atol=1e-4)


def test_an_aliased_field_given_keeps_its_value():
    # BailingHybrid stores max_position_embeddings in model_max_length: the class default of
    # max_position_embeddings, filled in first, overwrote the config's model_max_length
    config = {"model_type": "bailing_hybrid", "hidden_size": 128, "num_attention_heads": 4, "model_max_length": 4096,
              "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 6e6}}
    assert pf.RotaryEmbedding.from_hf_config(config).scaling["original_max_position_embeddings"] == 4096
    transformers = pytest.importorskip("transformers")
    built = transformers.AutoConfig.for_model(**config)
    assert built.max_position_embeddings == 4096
    assert pf.RotaryEmbedding.from_hf_config(built).scaling["original_max_position_embeddings"] == 4096


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


def test_hunyuan_vl_full_width_sections():
    # its rotary module splits cat(freqs, freqs) by 2 * mrope_section, chunk i taking stream i of the
    # len(mrope_section) rows of position_ids: one section, one row (a plain RoPE); two, pair j's features
    # take streams 0 and 1 (two rows of streams)
    config = {"model_type": "hunyuan_vl_text", "hidden_size": 128, "num_attention_heads": 2,
              "rope_parameters": {"rope_type": "default", "mrope_section": [32]}}
    assert rotary_kwargs_from_hf_config(config)["pair_streams"] is None
    assert repr(pf.RotaryEmbedding.from_hf_config(config)) == repr(pf.RotaryEmbedding(64, layout="half"))
    config["rope_parameters"]["mrope_section"] = [16, 16]
    assert rotary_kwargs_from_hf_config(config)["pair_streams"] == [[0] * 32, [1] * 32]
    config["rope_parameters"]["mrope_section"] = [8, 16, 8]
    assert rotary_kwargs_from_hf_config(config)["pair_streams"] == [[0] * 16 + [1] * 16, [1] * 16 + [2] * 16]


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
