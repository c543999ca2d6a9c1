"""Tiny random models of any transformers model type, from its shrunk default config.

Used by ``test_hf_install_models.py``; needs torch and transformers.  A
default config is shrunk by changing only the sizes it has (layers,
hidden size, heads, vocabulary, experts, MLA ranks), keeping one layer of
each layer type, its rotary settings valid (mRoPE sections scaled to the
smaller head) and its own constraints (widths tied to a hidden size,
multi-head attention without grouped keys); composite configs shrink each
sub-config the same way.  MODEL_CHANGES completes the default configs that
do not run as they are; INPUTS builds the inputs of models that take no
token ids (features, images, audio, embeddings).
"""

import importlib
import inspect
import re

import pytest
import torch
import transformers
from transformers.models.auto import configuration_auto, modeling_auto

import hf_walk
from posenc_fast import _hf_drop_in
from posenc_fast._hf_models import MODEL_RULES

HEAD_DIM = 32
# config key -> its tiny value (an existing value is only ever made smaller, head_dim and None excepted)
SIZES = dict(num_hidden_layers=2, hidden_size=4 * HEAD_DIM, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, head_dim=HEAD_DIM, vocab_size=128, moe_intermediate_size=64,
             num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2,
             n_shared_experts=1, shared_expert_intermediate_size=64, kv_lora_rank=32, q_lora_rank=32,
             qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=32, n_group=1, topk_group=1,
             first_k_dense_replace=1, num_expert_group=1, depth=1, embed_dim=64, num_heads=4, num_layers=2,
             d_model=128, encoder_layers=1, decoder_layers=1, num_experts_per_token=2, encoder_attention_heads=4,
             decoder_attention_heads=4)
EXACT = ("hidden_size", "head_dim")
# keys a default config may leave None though its model needs them (real checkpoints set them)
REQUIRED = ("head_dim", "vocab_size", "num_key_value_heads", "n_routed_experts", "num_experts_per_tok")
# a width named so and equal to a hidden size of the config tree is that hidden size (an adapter's input,
# a codebook dim, a head's condition, a depthwise convolution's groups): it shrinks with it
TIED_WIDTH = re.compile(r"(_dim|hidden_size|_input_size|embedding_size|_groups)$")
# Model types whose default config needs more than smaller sizes: the changes, and why
MODEL_CHANGES = {
    # hybrids whose attention layers are picked by index or period: one among the tiny layers
    "bamba": {"attn_layer_indices": [1]},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},
    "recurrent_gemma": {"num_hidden_layers": 3},  # block_types cycles recurrent, recurrent, attention
    "zamba2": {"hybrid_layer_ids": [1], "use_mem_rope": True},  # its default config applies no RoPE
    # its default rotates the trailing 64 of 512 features; the MLA rule alone would make head_dim the rope part
    # (qk_rope_head_dim 16: the whole head): the trailing 16 of 32
    "deepseek_v4": {"head_dim": 32},
    # the default has only mamba layers (slow on the CPU) and no RoPE; Granite 4.0's dense models use "rope"
    "granitemoehybrid": {"num_hidden_layers": 1, "layer_types": ["full_attention"], "position_embedding_type": "rope"},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},  # the default leaves them None
    # to_dict doubles the layer list (an "mlp" after each); one input, recurrent and output layer
    "dory": {"num_hidden_layers": 6, "n_input_layers": 2, "n_recurrent_layers": 2, "n_output_layers": 2,
             "layer_types": ["sliding_attention", "mlp", "full_attention", "mlp", "sliding_attention", "mlp"]},
    # MoE and sparse-attention settings the default config leaves None
    "dots1": {"n_shared_experts": 1},
    "deepseek_ocr2_text": {"mlp_layer_types": ["dense", "sparse"]},
    "qwen3_omni_moe_talker_text": {"shared_expert_intermediate_size": 64},
    "qwen4_exp_text": {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 32, "indexer_budget": 8,
                       "indexer_compress_ratio": 4},
    "step3p5": {"sliding_window": 16},  # its mask builder asks for one even with no sliding layers
    # its MoE sizes the default config leaves None (every layer builds the router and experts)
    "diffusion_gemma_text": {"num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 64},
    # its last num_kv_shared_layers (default 15) reuse the keys of the last earlier layer of their type:
    # two of each, the second pair sharing
    "gemma3n_text": {"num_hidden_layers": 4, "num_kv_shared_layers": 2, "activation_sparsity_pattern": [0.0] * 4,
                     "intermediate_size": [128] * 4, "layer_types": ["sliding_attention", "full_attention"] * 2},
    # keys the modeling code reads but the config class does not define
    "moonshine_streaming": {"num_key_value_heads": 4},
    **dict.fromkeys(("t5gemma2_decoder", "t5gemma2_encoder", "t5gemma2_text"), {"dropout_rate": 0.0}),
    # ESM-2's checkpoints use rotary positions (the default: absolute); its default leaves the special ids None
    "esm": {"position_embedding_type": "rotary", "pad_token_id": 1, "mask_token_id": 2},
    # as the walk's override (hf_walk.CONFIG_OVERRIDES: RoPE on the sliding layers, none on the full
    # ones), the rotary module's own default mrope_section [24, 20, 20] scaled to the tiny head
    "cohere_compass_text": {"rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 5e4, "mrope_section": [6, 5, 5]},
        "full_attention": None}},
    "molmo2_adapter": {"vision_feature_layer": [1, 0]},  # the vision layers it reads: the tiny tower has 2
    # the audio padding id is the embedding's last row: text vocabulary + codebooks x codebook vocabulary
    "kyutai_speech_to_text": {"audio_pad_token_id": SIZES["vocab_size"] + 32 * 2049},
    # GPT-2's config keys (attribute_map'd, so to_dict keeps them); rotary_dim 16 of the 32-wide head
    **dict.fromkeys(("codegen", "gptj"), {"n_embd": 4 * HEAD_DIM, "n_layer": 2, "n_head": 4, "rotary_dim": 16}),
    # CLVP pads its text and speech tokens with bos/eos ids past the tiny vocabulary: its last ids
    "clvp_encoder": {"bos_token_id": 127, "eos_token_id": 0},
    "clvp_decoder": {"bos_token_id": 126, "eos_token_id": 127},
    # its key heads per layer, kept from the default's first layers (16), would outnumber the tiny heads
    "sapiens2": {"num_key_value_heads_per_layer": [4, 2]},
    # the image-token ids these VLMs look up in their vocabulary map
    "chameleon": {"vocabulary_map": {"<image>": 127}},
    "emu3": {"vocabulary_map": {"<image>": 127, "<|extra_200|>": 126}},
}
LAYER_TYPES = ("layer_types", "layers_block_type", "block_types")  # per-layer lists that name a layer's kind
SEQ = 24
BATCH = 2


def model_module(model_type):
    name = configuration_auto.model_type_to_module_name(model_type)
    return f"transformers.models.{name}.modeling_{name}"


def _hidden_sizes(config):
    """Every hidden_size in the config tree (the root and its sub-configs, nested)."""
    sizes = {config["hidden_size"]} if _is_int(config.get("hidden_size")) else set()
    for value in config.values():
        if isinstance(value, dict) and "model_type" in value:
            sizes |= _hidden_sizes(value)
    return sizes


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def shrink(config, hidden_sizes=None):
    """The config changes (a dict, nested for sub-configs) that make the default `config` dict tiny."""
    hidden_sizes = _hidden_sizes(config) if hidden_sizes is None else hidden_sizes
    changes = {}
    for key, value in SIZES.items():
        if key in config and (_is_int(config[key]) or key in REQUIRED and config[key] is None):
            changes[key] = value if key in EXACT or config[key] is None else min(config[key], value)
    heads = config.get("num_attention_heads")
    if "num_key_value_heads" in changes and config["num_key_value_heads"] in (None, heads):
        changes["num_key_value_heads"] = changes["num_attention_heads"]  # multi-head attention stays so
    for key, value in config.items():
        if key not in SIZES and _is_int(value) and value in hidden_sizes and TIED_WIDTH.search(key):
            changes[key] = SIZES["hidden_size"]
    if config.get("qk_rope_head_dim"):  # MLA: no grouped keys; head_dim is the rope part, or rope + nope
        whole = config.get("head_dim") == config["qk_rope_head_dim"] + config.get("qk_nope_head_dim", 0)
        if "head_dim" in changes:
            changes["head_dim"] = changes["qk_rope_head_dim"] + whole * changes.get("qk_nope_head_dim", 0)
        if "num_key_value_heads" in changes:
            changes["num_key_value_heads"] = changes["num_attention_heads"]
    layers = config.get("num_hidden_layers")
    if isinstance(layers, int) and layers > 2:
        kinds = next((config[key] for key in LAYER_TYPES
                      if isinstance(config.get(key), list) and len(config[key]) == layers), None)
        keep = [0, 1] if kinds is None else sorted({kinds.index(t) for t in kinds})  # one layer of each kind
        for key, value in config.items():
            if isinstance(value, list) and len(value) == layers:
                changes[key] = [value[i] for i in keep]
        changes["num_hidden_layers"] = len(keep)
    vocab = changes.get("vocab_size", config.get("vocab_size"))
    if isinstance(config.get("pad_token_id"), int) and vocab and config["pad_token_id"] >= vocab:
        changes["pad_token_id"] = 0
    if _is_int(config.get("vocab_size")) and config.get("blank_token_id") == config["vocab_size"] - 1:
        changes["blank_token_id"] = vocab - 1  # CTC's blank is the last class
    _shrink_mrope_section(config, changes)
    changes.update(MODEL_CHANGES.get(config.get("model_type"), {}))
    for key, value in config.items():
        if isinstance(value, dict) and "model_type" in value:
            changes[key] = {"model_type": value["model_type"], **shrink(value, hidden_sizes)}
    return changes


def _shrink_mrope_section(config, changes):
    rule = MODEL_RULES.get(config.get("model_type"))
    params = config.get("rope_parameters")
    if rule is None or not rule.streams or not isinstance(params, dict):
        return
    section = params.get("mrope_section") or rule.default_section
    if not section:
        return

    def head(c):
        return c.get("head_dim") or c.get("hidden_size") // c.get("num_attention_heads")

    old, new = head(config), head({**config, **changes})
    scaled = [s * new // old for s in section]
    unique = [i for i, s in enumerate(section) if section.count(s) == 1]  # keeps equal sections equal
    scaled[unique[0] if unique else 0] += sum(section) * new // old - sum(scaled)
    changes["rope_parameters"] = {**params, "mrope_section": scaled}


def tiny_config(model_type, **extra):
    """The shrunk default config of `model_type`, with the top-level keys `extra` set."""
    config_class = configuration_auto.CONFIG_MAPPING[model_type]
    base = hf_walk.CONFIG_OVERRIDES.get(model_type, {})  # defaults the walk also corrects
    changes = shrink(config_class(**base).to_dict())
    for key, value in base.items():
        changes[key] = {**value, **changes[key]} if isinstance(changes.get(key), dict) else changes.get(key, value)
    return config_class(**changes, **extra)


_AUTO = ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
         "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "MODEL_MAPPING_NAMES")


def tiny_model(model_type, **extra):
    """A tiny random model of `model_type`, in eval mode (seeded: the same weights every time);
    `extra`: top-level config keys."""
    config = tiny_config(model_type, **extra)
    model_class = None
    for mapping in _AUTO:
        name = getattr(modeling_auto, mapping).get(model_type)
        if name is not None:
            model_class = getattr(transformers, name if isinstance(name, str) else name[0])
            break
    if model_class is None:  # a sub-config: the modeling module's model for it
        module = importlib.import_module(model_module(model_type))
        found = sorted((c for c in vars(module).values()
                        if inspect.isclass(c) and issubclass(c, transformers.PreTrainedModel)
                        and c.__module__ == module.__name__ and c.config_class is type(config)
                        and not c.__name__.endswith("PreTrainedModel")),  # no forward of its own
                       key=lambda c: (not c.__name__.endswith("ForCausalLM"),
                                      not c.__name__.endswith("Model"), c.__name__))
        if not found:
            raise LookupError(f"no model class for {model_type}")
        model_class = found[0]
    torch.manual_seed(0)
    return model_class(config).eval()


def _noise(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(3))


def _image(config):
    """A 4 x 4-patch image, (batch, channels, height, width)."""
    side = 4 * config.patch_size
    return _noise(BATCH, getattr(config, "num_channels", 3), side, side)


def _patches(config, name="pixel_values", temporal=1):
    """A 4 x 4-patch image as the Qwen-VL vision towers take it: flattened patches (each `temporal` frames
    deep, the image repeated) and their (t, h, w) grid."""
    return {name: _noise(16, 3 * temporal * config.patch_size ** 2), "grid_thw": torch.tensor([[1, 4, 4]])}


def _audio(config):
    """8 frames of a codec's audio: (batch, channels, samples), 1920 samples (24 kHz, 12.5 Hz) a frame."""
    return _noise(BATCH, getattr(config, "audio_channels", 1), 1920 * 8)


def _mel(config, frames=64):
    """Log-mel features, (batch, mel bins, frames)."""
    return _noise(BATCH, config.num_mel_bins, frames)


def _frames(config, frames=64):
    """Log-mel features, (batch, frames, mel bins)."""
    return _mel(config, frames).transpose(1, 2)


# model type -> its forward's inputs, from its config and the token ids (the default: input_ids alone)
INPUTS = {
    **{model_type: lambda config, ids: {"inputs_embeds": _noise(BATCH, SEQ, config.hidden_size)}
       for model_type in ("blt_global_transformer", "nemotron3_5_transcribe_word_timestamp",
                          "qwen3_omni_moe_talker_code_predictor")},  # models that take embeddings, not ids
    # the same inputs for several model types
    **dict.fromkeys(("glmasr_encoder", "voxtral_realtime_encoder"),
                    lambda config, ids: {"input_features": _mel(config)}),
    **dict.fromkeys(("lasr_encoder", "nemotron3_5_transcribe_asr_audio", "nemotron3_diarization_audio",
                     "nemotron_asr_streaming_encoder", "parakeet_encoder"),
                    lambda config, ids: {"input_features": _frames(config)}),
    **dict.fromkeys(("mimi", "mimi_encoder", "pocket_tts_audio_tokenizer", "pocket_tts_audio_tokenizer_encoder"),
                    lambda config, ids: {"input_values": _audio(config)}),
    **dict.fromkeys(("mimi_decoder", "pocket_tts_audio_tokenizer_decoder"),
                    lambda config, ids: {"latents": _noise(BATCH, config.hidden_size, 8)}),
    **dict.fromkeys(("moonshine", "moonshine_streaming"),
                    lambda config, ids: {"input_values": _noise(BATCH, 4000), "decoder_input_ids": ids}),
    # (DiffusionGemma's canvas: random tokens each forward unless given)
    **dict.fromkeys(("t5gemma", "t5gemma2", "diffusion_gemma"),
                    lambda config, ids: {"input_ids": ids, "decoder_input_ids": ids}),
    **dict.fromkeys(("pixtral", "phi4_multimodal_vision", "step3p5_vision"),
                    lambda config, ids: {"pixel_values": _image(config)}),
    # a drafter: 8 noisy embeddings, its keys also the main model's context (its selected layers' hidden states)
    "muse_glimmer_assistant": lambda config, ids: {
        "noise_embeds": _noise(BATCH, 8, config.hidden_size),
        "context_hidden_states": _noise(BATCH, SEQ, len(config.target_layer_ids) * config.hidden_size)},
    # CLVP: text ids and a log-mel spectrogram, scored against each other by its text and speech encoders
    "clvp": lambda config, ids: {"input_ids": ids,
                                 "input_features": _noise(BATCH, config.decoder_config.feature_size, 64)},
    # PE's audio encoder (its DAC codec's frames), alone and beside the text encoder
    "pe_audio_encoder": lambda config, ids: {"input_values": _audio(config)},
    "pe_audio": lambda config, ids: {"input_ids": ids, "input_values": _audio(config.audio_config)},
    # ViTs with cls and register tokens before the patches (the patches alone rotated)
    **dict.fromkeys(("dinov3_vit", "eomt_dinov3", "sapiens2"), lambda config, ids: {"pixel_values": _image(config)}),
    **dict.fromkeys(("cosmos3_edge_vision", "glm_image_vision", "hunyuan_vl_vision", "hy_v4_vl_vision",
                     "dots3_note_vision_encoder"), lambda config, ids: _patches(config)),
    # Dia: text ids in, a code per audio channel out
    "dia": lambda config, ids: {"input_ids": ids,
                                "decoder_input_ids": ids[..., None].expand(-1, -1, config.decoder_config.num_channels)},
    "dia_decoder": lambda config, ids: {"input_ids": ids[..., None].expand(-1, -1, config.num_channels),
                                        "encoder_hidden_states": _noise(BATCH, SEQ, config.cross_hidden_size)},
    "idefics": lambda config, ids: {  # one image per sample, seen by every token
        "input_ids": ids, "image_attention_mask": torch.ones(BATCH, SEQ, 1, dtype=torch.long),
        "pixel_values": _noise(BATCH, 1, 3, config.vision_config.image_size, config.vision_config.image_size)},
    # a text token and the 32 codebooks' audio codes at each step
    "kyutai_speech_to_text": lambda config, ids: {"input_ids": ids[..., None] + torch.arange(1 + config.num_codebooks)},
    "lasr_ctc": lambda config, ids: {"input_features": _frames(config.encoder_config)},
    "nemotron3_5_transcribe_audio": lambda config, ids: {"input_features": _frames(config.asr_config)},
    "nemotron3_diarization": lambda config, ids: {"input_features": _frames(config.audio_config)},
    "t5gemma2_decoder": lambda config, ids: {"input_ids": ids,
                                             "encoder_hidden_states": _noise(BATCH, SEQ, config.hidden_size)},
    "timesfm2_5": lambda config, ids: {"past_values": _noise(BATCH, 4 * config.patch_length)},
    # 64 frames become 8 audio embeddings, added to the embeddings of 8 tokens
    "voxtral_realtime": lambda config, ids: {"input_ids": ids[:, :8], "input_features": _mel(config.audio_config)},
    # models that, given their inputs, call no function install patches (listed in NOT_RUN)
    "parakeet_ctc": lambda config, ids: {"input_features": _frames(config.encoder_config)},
    "muse_spark_audio": lambda config, ids: {"input_values": _noise(BATCH, 96 * 100)},  # a multiple of 96 samples
    "moonshine_streaming_encoder": lambda config, ids: {"input_values": _noise(BATCH, 4000)},
    "qwen2_5_omni_audio_encoder": lambda config, ids: {  # one clip of 200 frames, (mel bins, frames)
        "input_features": _noise(config.num_mel_bins, 200), "feature_lens": torch.tensor([200]),
        "aftercnn_lens": torch.tensor([100])},
    "minimax_m3_vl_vision": lambda config, ids: _patches(config, temporal=config.temporal_patch_size),
    "muse_glimmer_vision": lambda config, ids: _patches(config, temporal=config.patch_temporal),
    # a 6 x 6-patch image, flattened patches and their (x, y) positions: its pooler joins 3 x 3 patches
    "gemma4_vision": lambda config, ids: {
        "pixel_values": _noise(BATCH, 36, 3 * config.patch_size ** 2),
        "pixel_position_ids": torch.stack((torch.arange(6).repeat(6), torch.arange(6).repeat_interleave(6)),
                                          -1).expand(BATCH, -1, -1)},
    "granite_docling_vision": lambda config, ids: {  # its position embedding is for the whole 512 x 512 image
        "pixel_values": _noise(BATCH, 3, config.image_size, config.image_size)},
    "molmo2_vision": lambda config, ids: {  # the 27 x 27 patches of its 378 x 378 image, flattened
        "pixel_values": _noise(BATCH, (config.image_size[0] // config.patch_size) ** 2, 3 * config.patch_size ** 2)},
    **dict.fromkeys(("mlcd", "mlcd_vision_model"), lambda config, ids: {"pixel_values": _image(config)}),
    **dict.fromkeys(("lfm3_vl_vision",), lambda config, ids: _patches(config, temporal=config.temporal_patch_size)),
    "kimi_k25_vision": lambda config, ids: {  # its patch embedding is a convolution: (patches, channels, p, p)
        "pixel_values": _noise(16, 3, config.patch_size, config.patch_size), "grid_thw": torch.tensor([[1, 4, 4]])},
    "video_llama_3_vision": lambda config, ids: {**_patches(config), "merge_sizes": torch.tensor([1])},
    "inkling2_vision": lambda config, ids: {  # 2 x 2 language-model tokens, each merge x merge patches of pixels
        "pixel_values": _noise(4, *(2 * [config.patch_size * config.spatial_merge_size]), 3),
        "image_grid_thw": torch.tensor([[1, 2, 2]])},
    **{model_type: lambda config, ids: _patches(config, "hidden_states", getattr(config, "temporal_patch_size", 1))
       for model_type in ("cohere_compass_vision", "ernie4_5_vl_moe_vision", "exaone4_5_vision", "glm4v_moe_vision",
                          "glm4v_vision", "glm5_next_vision", "glm_ocr_vision",
                          "qwen2_5_omni_vision_encoder", "qwen2_5_vl_vision", "qwen2_vl_vision",
                          "qwen3_5_moe_vision", "qwen3_5_vision", "qwen3_omni_moe_vision_encoder",
                          "qwen3_vl_moe_vision", "qwen3_vl_vision", "qwen4_exp_vision")},
}


def model_inputs(model_type, model, ids):
    """The keyword arguments of one forward pass of the tiny `model_type` `model` (`ids`: token ids)."""
    make = INPUTS.get(model_type)
    return {"input_ids": ids} if make is None else make(model.config, ids)


# the special tokens of an image, above the ids of random text (tokens below IMAGE_TOKENS["vision_start_token_id"])
IMAGE_TOKENS = dict(vision_start_token_id=122, vision_end_token_id=123, image_token_id=124, video_token_id=125)


def image_inputs(model, text):
    """A VLM's inputs for `text` (token ids) with a 4 x 4-patch image after its 4th token.

    The model builds the image's t/h/w positions itself from ``image_grid_thw``
    and ``mm_token_type_ids``; its config must have the `IMAGE_TOKENS` ids.
    """
    vision = model.config.vision_config
    merged = 16 // vision.spatial_merge_size ** 2  # the image's tokens once the merger joins patches
    tokens = [IMAGE_TOKENS["vision_start_token_id"]] + [IMAGE_TOKENS["image_token_id"]] * merged + [
        IMAGE_TOKENS["vision_end_token_id"]]
    ids = torch.cat((text[:, :4], torch.tensor(tokens).expand(len(text), -1), text[:, 4:]), dim=1)
    patches = _patches(vision, temporal=getattr(vision, "temporal_patch_size", 1))
    return {"input_ids": ids, "pixel_values": torch.cat([patches["pixel_values"]] * len(text)),
            "image_grid_thw": patches["grid_thw"].expand(len(text), -1),
            "mm_token_type_ids": (ids == IMAGE_TOKENS["image_token_id"]).long()}


def position_ids(model):
    """None for one position stream; for mRoPE, realistic (streams, batch, seq) position ids.

    Text, a 4 x 4 image, text: t stays put over the image while h and w walk
    its rows and columns; text after it continues from the largest position.
    """
    streams = max((hf_walk.position_streams(m) for m in model.modules()
                   if type(m).__name__.endswith("RotaryEmbedding") and getattr(m, "mrope_section", 0) is not None),
                  default=1)  # NeoMME's (row, column) module has no mrope_section
    if streams == 1:
        return None
    text, side = 4, 4
    grid = torch.arange(side)
    image = [torch.full((side * side,), text), text + grid.repeat_interleave(side), text + grid.repeat(side)]
    image = image[1:] if streams == 2 else image + [image[-1]] * (streams - 3)  # rows and columns only
    after = text + side + torch.arange(SEQ - text - side * side)
    rows = [torch.cat((torch.arange(text), image[s], after)) for s in range(streams)]
    return torch.stack(rows)[:, None].expand(streams, BATCH, SEQ)



def full_width_cache(batch, seq, dim, dtype=torch.float32, seed=0):
    """A full-width (batch, seq, dim) cos/sin cache with repeated halves, as transformers' rotary modules build."""
    generator = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 4096, (batch, seq, 1), generator=generator).double()
    angles = positions * 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)

@pytest.fixture
def kernel_calls(monkeypatch):
    """Count the calls that `install`'s functions answered with posenc_fast's kernel (the compiled
    route's answers, then the Python route's answers and refusals)."""
    calls = []
    rotate, compiled = _hf_drop_in._rotate_tensors, _hf_drop_in._compiled_call

    def counting(*args):
        result = rotate(*args)
        calls.append(result is not None)
        return result

    def counting_compiled(*args):
        result = compiled(*args)
        if result is not None:
            calls.append(True)
        return result

    monkeypatch.setattr(_hf_drop_in, "_rotate_tensors", counting)
    monkeypatch.setattr(_hf_drop_in, "_compiled_call", counting_compiled)
    return calls
