"""Every RoPE model type of the installed transformers against from_hf_config (see hf_walk.py).

Skipped without torch and transformers.  Nothing is downloaded: default
configs (where those cannot run, the change in hf_walk.CONFIG_OVERRIDES),
the model's own rotary module, random q/k.  A model type agrees through the
attention scores, or is refused with its reason (no RoPE, a refused model)
or skipped by the walk with its reason (a vision tower, whose 2-D RoPE
test_hf_towers.py checks; an audio part).
"""

import collections
import re

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_walk  # noqa: E402  (needs torch)

import posenc_fast as pf  # noqa: E402
from posenc_fast._hf_config import _text_part, rotary_kwargs_from_hf_config  # noqa: E402

MODEL_TYPES = hf_walk.model_types()


def _agrees(model_type, partial_rotary_factor=None, **options):
    # error None: refused, as it must be (an indexer without a rule, a layer type without RoPE); agreeing needs
    # at least one RoPE compared
    results = hf_walk.check(model_type, partial_rotary_factor, **options)
    errors = [error for *_, error in results if error is not None]
    return bool(errors) and all(error <= hf_walk.SCORE_RTOL for error in errors), results


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_rope_matches_the_model(model_type):
    try:
        agrees, results = _agrees(model_type)
    except hf_walk.Skip as skip:
        text_type = hf_walk.configuration_auto.CONFIG_MAPPING[model_type]().get_text_config(decoder=True).model_type
        if text_type in pf._hf_models.MODEL_RULES:  # a rule the walk does not check: it could be wrong unseen
            pytest.fail(f"{model_type} has a rule ({text_type}) but the walk skips it: {skip}")
        if "test_hf_towers.py" not in str(skip):  # nor an answer the walk does not check
            with pytest.raises(ValueError):
                pf.RotaryEmbedding.from_hf_config(hf_walk.configuration_auto.CONFIG_MAPPING[model_type]().to_dict())
        pytest.skip(str(skip))
    assert agrees, results
    for flag in (False, True):  # MLA: the attention's code reads rope_interleave, or ignores what it says
        try:
            agrees, results = _agrees(model_type, rope_interleave=flag)
        except hf_walk.Skip:
            break
        assert agrees, f"with rope_interleave={flag}: {results}"
    try:  # the whole-head / partial rule, with a partial rotary factor in the same config
        agrees, results = _agrees(model_type, 0.5)
    except hf_walk.Skip:
        return
    assert agrees, f"with partial_rotary_factor=0.5: {results}"


def test_every_rule_is_walked():
    walked = set()
    for model_type in MODEL_TYPES:
        config = hf_walk.configuration_auto.CONFIG_MAPPING[model_type]()
        walked.add(config.get_text_config(decoder=True).model_type)
    assert set(pf._hf_models.MODEL_RULES) - walked == set()


@pytest.mark.parametrize("model_type", ["bailing_hybrid", "glm_moe_dsa", "longcat_flash", "mistral_large4_text"])
def test_families_that_always_interleave_ignore_rope_interleave(model_type):
    config = hf_walk.configuration_auto.CONFIG_MAPPING[model_type]().to_dict()
    for flag in (False, True):  # their attention calls apply_rotary_pos_emb_interleave whatever the flag says
        assert pf.RotaryEmbedding.from_hf_config({**config, "rope_interleave": flag}).layout == "interleaved"
    deepseek = hf_walk.configuration_auto.CONFIG_MAPPING["deepseek_v3"]().to_dict()
    assert pf.RotaryEmbedding.from_hf_config({**deepseek, "rope_interleave": False}).layout == "half"


@pytest.mark.parametrize("model_type", sorted(pf._hf_models.NO_ROPE))
def test_text_models_without_rope_are_refused_with_that_reason(model_type):
    config = hf_walk.configuration_auto.CONFIG_MAPPING[model_type]()
    module = hf_walk.modeling_module(model_type)
    if model_type == "moshi_depth":  # MoshiAttention rotates where it is built with use_rope=True
        assert "use_rope=False" in hf_walk.inspect.getsource(module.MoshiDepthDecoder.__init__)
    else:
        assert hf_walk.attention_rotations(module) == {}  # no text attention class calls a rotation
        assert hf_walk.text_rotary_class(module, config) is None
    for data in (config.to_dict(), {"model_type": model_type.removesuffix("_text"), "text_config": config.to_dict()}):
        with pytest.raises(ValueError, match="this model's text attention has no RoPE"):
            pf.RotaryEmbedding.from_hf_config(data)


def test_a_config_of_several_transformers_with_differing_ropes_is_refused():
    # BLT's patcher, local encoder, global transformer and local decoder each rotate by their own RoPE (each part's
    # model type is walked on its own); its top config names none of them as the text model
    blt = hf_walk.configuration_auto.CONFIG_MAPPING["blt"]().to_dict()
    parts = ("patcher_config", "encoder_config", "decoder_config", "global_config")
    ropes = {part: pf.RotaryEmbedding.from_hf_config(blt[part]) for part in parts}
    assert len({(rope.dim, rope.base) for rope in ropes.values()}) == 3
    with pytest.raises(ValueError, match=re.escape(f"holds 4 transformers whose RoPEs differ ({', '.join(parts)})")):
        pf.RotaryEmbedding.from_hf_config(blt)
    # Dia's encoder and decoder rotate alike: its decoder's RoPE, as for any composite config
    dia = hf_walk.configuration_auto.CONFIG_MAPPING["dia"]().to_dict()
    decoder_rope = pf.RotaryEmbedding.from_hf_config(dia)
    assert repr(decoder_rope) == repr(pf.RotaryEmbedding.from_hf_config(dia["encoder_config"]))


def test_hunyuan_vl_pairs_whose_features_take_two_streams():
    # its rotary module splits cat(freqs, freqs) by 2 * mrope_section: with two or more sections a rotate_half
    # pair's features take two streams' angles (its own rotation changes the pair's norm wherever those
    # positions differ), which from_hf_config gives as two rows of pair_streams
    torch = hf_walk.torch
    config = hf_walk.configuration_auto.CONFIG_MAPPING["hunyuan_vl_text"](
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [16, 16, 16, 16]})
    module = hf_walk.modeling_module("hunyuan_vl")
    rotary = hf_walk.text_rotary_class(module, config)(config=config)
    q = torch.randn(1, 2, 3, 128, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    positions = np.array([[0, 5, 9], [0, 1, 2], [0, 7, 3], [0, 2, 8]])  # the streams differ past token 0
    cos, sin = rotary(q, torch.from_numpy(positions)[:, None])
    rotated, _ = module.apply_rotary_pos_emb(q, q, cos.double(), sin.double())
    pairs = lambda x: x[..., :64] ** 2 + x[..., 64:] ** 2  # noqa: E731  (rotate_half pairs)
    assert torch.allclose(pairs(rotated)[..., 0, :], pairs(q)[..., 0, :])
    assert not torch.allclose(pairs(rotated)[..., 1:, :], pairs(q)[..., 1:, :], rtol=1e-3)
    rope = pf.RotaryEmbedding.from_hf_config(config.to_dict())
    assert rope.pair_streams.tolist() == [[0] * 32 + [1] * 32, [2] * 32 + [3] * 32]
    ours = rope.apply(q.numpy(), positions)
    # transformers forms float32 angles (at most 9 rad here) and float32 cos/sin
    np.testing.assert_allclose(ours, rotated.numpy(), rtol=0, atol=2e-6 * float(q.abs().max()))


def test_qwen2_5_omni_dit_refused_and_the_recipe_it_names(monkeypatch):
    # its DiTAttention rotates the first head only, deinterleaved then rotate_half: the interleaved pairs' scores
    torch = hf_walk.torch
    heads, dim, seq = 4, 16, 40
    config = hf_walk.configuration_auto.CONFIG_MAPPING["qwen2_5_omni_dit"](
        hidden_size=heads * dim, num_attention_heads=heads, head_dim=dim)
    reason = pf._hf_models.REFUSED_MODELS["qwen2_5_omni_dit"]
    with pytest.raises(ValueError, match=re.escape(reason)):
        pf.RotaryEmbedding.from_hf_config(config.to_dict())
    module = hf_walk.modeling_module("qwen2_5_omni")
    seen = {}

    def attend(attention, query, key, value, **kwargs):  # what the attention function is handed
        seen.update(q=query.double().numpy(), k=key.double().numpy())
        return value.transpose(1, 2), None

    monkeypatch.setattr(module, "ALL_ATTENTION_FUNCTIONS", collections.defaultdict(lambda: attend))
    torch.manual_seed(0)
    attention = module.DiTAttention(config).eval()
    rotary = module.Qwen2_5OmniDiTRotaryEmbedding(config)
    hidden = torch.randn(1, seq, heads * dim)
    with torch.no_grad():
        attention(hidden, rotary(hidden, torch.arange(seq)[None]))
        q, k = (proj(hidden).view(1, seq, heads, dim).transpose(1, 2).double().numpy()
                for proj in (attention.to_q, attention.to_k))
    np.testing.assert_array_equal(seen["q"][:, 1:], q[:, 1:])  # the other heads pass through
    np.testing.assert_array_equal(seen["k"][:, 1:], k[:, 1:])
    rope = pf.RotaryEmbedding(dim, base=config.rope_parameters["rope_theta"], layout="interleaved")
    q0, k0 = rope.apply_qk(q[:, :1], k[:, :1])
    scale = np.linalg.norm(q[:, :1], axis=-1)[..., :, None] * np.linalg.norm(k[:, :1], axis=-1)[..., None, :]
    error = np.abs(q0 @ k0.swapaxes(-1, -2) - seen["q"][:, :1] @ seen["k"][:, :1].swapaxes(-1, -2)) / scale
    assert error.max() <= 1e-5  # its float32 cos/sin and rotation


@pytest.mark.parametrize("model_type", ["gemma4_text", "gemma4_unified_text", "diffusion_gemma_text",
                                        "embedding_gemma2_text"])
@pytest.mark.parametrize("form", ["global_head_dim", "class defaults"])
def test_gemma4_config_json_form_reads_as_its_configuration_class(model_type, form):
    # a checkpoint's config.json holds global_head_dim (no per_layer_config); its configuration class builds
    # per_layer_config from it, and the per-layer-type rope_parameters when there are none
    cls = hf_walk.configuration_auto.CONFIG_MAPPING[model_type]
    raw = {key: value for key, value in cls().to_dict().items() if key != "per_layer_config"}
    if form == "global_head_dim":
        raw["global_head_dim"] = 384
    else:
        del raw["rope_parameters"]
    config = cls(**{key: value for key, value in raw.items() if key != "model_type"})
    for layer_type in ("full_attention", "sliding_attention"):
        ours = pf.RotaryEmbedding.from_hf_config(raw, layer_type=layer_type)
        want = pf.RotaryEmbedding.from_hf_config(config.to_dict(), layer_type=layer_type)  # walked
        assert (ours.dim, ours.rotary_dim, ours.scaling) == (want.dim, want.rotary_dim, want.scaling)
        assert ours.dim == config.per_layer_config[config.layer_types.index(layer_type)].head_dim
        hf_walk.np.testing.assert_array_equal(ours.inv_freq, want.inv_freq)
    with pytest.raises(ValueError, match="pass layer_type="):
        pf.RotaryEmbedding.from_hf_config(raw)


@pytest.mark.parametrize("swa", [{}, {"swa_qk_rope_head_dim": 32, "swa_head_dim": 224, "swa_rope_theta": 4e4,
                                      "rope_theta": 7e7}])
def test_dots3_config_json_form_reads_as_its_configuration_class(swa):
    # the released checkpoint's config.json keeps the sliding layers' sizes and rope_theta in swa_* keys
    cls = hf_walk.configuration_auto.CONFIG_MAPPING["dots3_note_text"]
    raw = {key: value for key, value in cls().to_dict().items() if key not in ("per_layer_config", "rope_parameters")}
    raw.update(swa)
    config = cls(**{key: value for key, value in raw.items() if key != "model_type"})
    for layer_type in ("indexed_attention", "sliding_attention"):
        for attention in ("main", "indexer") if layer_type == "indexed_attention" else ("main",):
            ours = pf.RotaryEmbedding.from_hf_config(raw, layer_type=layer_type, attention=attention)
            want = pf.RotaryEmbedding.from_hf_config(config.to_dict(), layer_type=layer_type, attention=attention)
            assert (ours.dim, ours.rotary_dim, ours.base, ours.layout) == (want.dim, want.rotary_dim, want.base,
                                                                          want.layout)
    assert want.dim == config.per_layer_config[config.layer_types.index("sliding_attention")].qk_rope_head_dim


@pytest.mark.parametrize("form", [
    {"rope_theta": [1e4, 5e5] * 3, "partial_rotary_factors": [0.5, 1.0] * 3},
    {"rope_theta": 5e5, "partial_rotary_factors": [0.5, 1.0] * 3,
     "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    {"rope_theta": [1e4, 5e5] * 3 + [7e5]},  # an MTP layer's entry past the layers
])
def test_step3p5_config_json_form_reads_as_its_configuration_class(form):
    # Step-3.7's checkpoint keeps one rope_theta and one partial rotary factor per layer
    cls = hf_walk.configuration_auto.CONFIG_MAPPING["step3p5"]
    raw = {key: value for key, value in cls().to_dict().items()
           if key not in ("rope_parameters", "mlp_layer_types", "mtp_mlp_layer_types")}
    raw.update(form, num_hidden_layers=6, layer_types=["full_attention", "sliding_attention"] * 3)
    config = cls(**{key: value for key, value in raw.items() if key != "model_type"})
    for layer_type in ("full_attention", "sliding_attention"):
        ours = pf.RotaryEmbedding.from_hf_config(raw, layer_type=layer_type)
        want = pf.RotaryEmbedding.from_hf_config(config.to_dict(), layer_type=layer_type)  # walked
        assert (ours.dim, ours.rotary_dim, ours.base, ours.scaling) == (want.dim, want.rotary_dim, want.base,
                                                                       want.scaling)


@pytest.mark.parametrize("form", [
    {"rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32,
                      "beta_slow": 1}, "qk_rope_head_dim": 64, "compress_ratios": [0, 4, 128, 4]},
    {"rope_theta": 5e4, "compress_rope_theta": 2e5, "partial_rotary_factor": 0.25},
])
def test_deepseek_v4_config_json_form_reads_as_its_configuration_class(form):
    # the checkpoint's flat keys (V4-Flash: YaRN on the compressed layers only) become the "main" and "compress"
    # RoPEs in DeepseekV4Config.__post_init__; both read as its rotary module computes them
    cls = hf_walk.configuration_auto.CONFIG_MAPPING["deepseek_v4"]
    raw = {"model_type": "deepseek_v4", "hidden_size": 256, "num_attention_heads": 4, "head_dim": 512,
           "num_hidden_layers": 4, "index_head_dim": 128, **form}
    config = cls(**{key: value for key, value in raw.items() if key != "model_type"})
    module = hf_walk.modeling_module("deepseek_v4")
    rotary = module.DeepseekV4RotaryEmbedding(config)
    names = {"main": "sliding_attention", "compress": "heavily_compressed_attention"}
    for name, layer_type in names.items():
        for given in (name, layer_type):
            ours = pf.RotaryEmbedding.from_hf_config(raw, layer_type=given)
            want = pf.RotaryEmbedding.from_hf_config(config.to_dict(), layer_type=given)
            assert repr(ours) == repr(want)
        assert (ours.rotary_start, ours.rotary_dim, ours.layout) == (512 - ours.rotary_dim, config.qk_rope_head_dim,
                                                                     "interleaved")
        inv_freq = getattr(rotary, f"{name}_inv_freq").double().numpy()
        # transformers forms them in float32: 3 ulps (see test_frequencies.py's budget)
        hf_walk.np.testing.assert_allclose(ours.inv_freq, inv_freq, rtol=3 * 2.0**-23)
        assert ours.attention_factor == getattr(rotary, f"{name}_attention_scaling")
    indexer = pf.RotaryEmbedding.from_hf_config(raw, attention="indexer")
    assert (indexer.dim, indexer.rotary_start, indexer.base) == (128, 128 - indexer.rotary_dim, ours.base)
    with pytest.raises(ValueError, match="rotates by the 'compress' RoPE in every layer, not layer_type='main'"):
        pf.RotaryEmbedding.from_hf_config(raw, attention="indexer", layer_type="main")


# tiny decoders (random weights) whose layers are read one by one: from_hf_config(config, layer=i)
_TINY = dict(num_hidden_layers=8, hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, vocab_size=64, pad_token_id=None, bos_token_id=None, eos_token_id=None)
_TINY_EXTRA = {
    "llama4_text": dict(intermediate_size_mlp=64, num_local_experts=2),
    "mistral_large4_text": dict(kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                                n_routed_experts=2, moe_intermediate_size=32, index_n_heads=2, index_head_dim=16,
                                num_experts_per_tok=1, n_group=1, topk_group=1),
}


def _tiny_model(model_type, **raw):
    """(the config.json dict, the model built from it by transformers, with random weights)."""
    raw = {**_TINY, **_TINY_EXTRA.get(model_type, {}), **raw}
    config = hf_walk.configuration_auto.CONFIG_MAPPING[model_type](**raw)
    hf_walk.torch.manual_seed(0)
    with hf_walk.warnings.catch_warnings():
        hf_walk.warnings.simplefilter("ignore")
        model = __import__("transformers").AutoModel.from_config(config)
    return {"model_type": model_type, **raw}, config, model


@pytest.mark.parametrize("form", [{}, {"no_rope_layer_interval": 3}, {"no_rope_layers": [1, 0, 0, 1, 1, 1, 1, 0]}],
                         ids=["default interval", "interval 3", "list"])
@pytest.mark.parametrize("model_type", ["smollm3", "llama4_text", "mistral_large4_text"])
def test_layer_without_rope_is_refused_as_the_model_skips_it(model_type, form):
    # their attention: `self.use_rope = config.no_rope_layers[layer_idx]`; the config.json may leave the list
    # to the configuration class (derived from no_rope_layer_interval)
    raw, config, model = _tiny_model(model_type, **form)
    uses_rope = [bool(layer.self_attn.use_rope) for layer in model.layers]
    assert not all(uses_rope) and any(uses_rope)
    for data in (raw, config.to_dict()):
        want = pf.RotaryEmbedding.from_hf_config(data)
        for i, rotates in enumerate(uses_rope):
            if rotates:
                assert repr(pf.RotaryEmbedding.from_hf_config(data, layer=i)) == repr(want)
            else:
                with pytest.raises(ValueError, match=rf"layer {i} has no RoPE: no_rope_layers\[{i}\] == 0"):
                    pf.RotaryEmbedding.from_hf_config(data, layer=i)


_TINY_EXTRA["glm_moe_dsa"] = _TINY_EXTRA["mistral_large4_text"]


@pytest.mark.parametrize("form", [{}, {"index_topk_freq": 3}, {"index_topk_freq": 2, "index_skip_topk_offset": 0},
                                  {"index_topk_pattern": "FFSFSSFS"},
                                  {"indexer_types": ["full", "shared"] * 4}], ids=str)
@pytest.mark.parametrize("model_type", ["glm_moe_dsa", "mistral_large4_text"])
def test_indexer_of_a_layer_that_shares_one_is_refused(model_type, form):
    # their attention: `self.indexer = None if config.indexer_types[layer_idx] == "shared" else ...Indexer(...)`
    raw, config, model = _tiny_model(model_type, **form)
    rotates = [layer.self_attn.indexer is not None and getattr(layer.self_attn, "use_rope", True)
               for layer in model.layers]
    assert any(rotates) and (not all(rotates) or form == {})
    for data in (raw, config.to_dict()):
        for i, own in enumerate(rotates):
            if own:
                assert pf.RotaryEmbedding.from_hf_config(data, layer=i, attention="indexer").layout == "interleaved"
            else:
                with pytest.raises(ValueError, match=rf"layer {i} has no (indexer of its own|RoPE)"):
                    pf.RotaryEmbedding.from_hf_config(data, layer=i, attention="indexer")


@pytest.mark.parametrize("rope", [{"rope_type": "linear", "factor": 4.0},
                                  {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}])
def test_molmo2_layers_rotate_by_the_scaled_or_the_unscaled_rope(rope):
    # Molmo2TextModel: the layers in rope_scaling_layers take rotary_emb's cos/sin, the others rotary_emb_unscaled's
    raw, config, model = _tiny_model("molmo2_text", num_hidden_layers=4, max_position_embeddings=1024,
                                     rope_parameters={**rope, "rope_theta": 1e4}, rope_scaling_layers=[1, 2])
    module = hf_walk.modeling_module("molmo2_text")
    assert model.rope_types == ["unscaled", "scaled", "scaled", "unscaled"]
    rng = hf_walk.np.random.default_rng(0)
    positions = hf_walk.np.sort(rng.choice(1024, hf_walk.SEQ, replace=False))
    q, k = (rng.standard_normal((1, hf_walk.HEADS, hf_walk.SEQ, 16)).astype(hf_walk.np.float32) for _ in "qk")
    for data in (raw, config.to_dict()):
        for i, kind in enumerate(model.rope_types):
            rotary = model.rotary_emb if kind == "scaled" else model.rotary_emb_unscaled
            with hf_walk.torch.no_grad():
                tables = rotary(hf_walk.torch.from_numpy(q), hf_walk.torch.from_numpy(positions)[None])
                q_hf, k_hf = hf_walk._model_rotation(module, config, tables, hf_walk.torch.from_numpy(q),
                                                     hf_walk.torch.from_numpy(k))
            rope = pf.RotaryEmbedding.from_hf_config(data, layer=i)
            q_ours, k_ours = rope.apply_qk(q.astype(hf_walk.np.float64), k.astype(hf_walk.np.float64), positions)
            error = hf_walk._score_error(q_hf, k_hf, q_ours, k_ours, q, k)
            assert error <= hf_walk.SCORE_RTOL, f"layer {i} ({kind}): score error {error}"
        with pytest.raises(ValueError, match="pass layer= to choose one"):
            pf.RotaryEmbedding.from_hf_config(data)


def _outcome(data, **options):
    try:
        return rotary_kwargs_from_hf_config(data, **options)
    except ValueError as error:  # a NoPE layer is named by its index, a NoPE layer type by its name
        text = str(error)
        if "no_rope_layers" in text:
            return "NoPE by no_rope_layers"
        return "NoPE by layer type" if "rotates in sliding-window layers only" in text else text


def test_layer_is_its_layer_type_in_every_model_with_layer_types():
    # layer=i reads as layer_type=layer_types[i] (at each layer type's first layer) in every default config
    # that has layer_types
    walked, differ = set(), []
    for model_type in MODEL_TYPES:
        config = hf_walk.configuration_auto.CONFIG_MAPPING[model_type](**hf_walk.CONFIG_OVERRIDES.get(model_type, {}))
        try:
            data, _ = _text_part(config.to_dict(), "config")
        except ValueError as error:  # BLT: its parts are walked as their own model types
            assert "transformers whose RoPEs differ" in str(error)
            continue
        layer_types = data.get("layer_types")
        if not layer_types or data.get("model_type") in pf._hf_models.NO_ROPE:
            continue
        if "n_axes" in _outcome(data):  # a vision tower's config: one RoPE, layer= refused
            assert "a vision tower's config" in _outcome(data, layer=0)
            continue
        for layer_type in dict.fromkeys(layer_types):
            i = layer_types.index(layer_type)
            by_index, by_type = _outcome(data, layer=i), _outcome(data, layer_type=layer_type)
            if isinstance(by_type, str) and "pass layer=" in by_type:
                continue  # the layer type alone does not say (Cohere2-MoE's full layers of a dense MLP rotate)
            if by_index != by_type:
                differ.append((model_type, i, layer_type, by_index, by_type))
        walked.add(data.get("model_type"))
    assert not differ, '\n'.join(map(repr, differ))
    assert {"gemma3_text", "gemma4_text", "deepseek_v4", "dots3_note_text", "modernbert", "llama4_text",
            "step3p5"} <= walked
