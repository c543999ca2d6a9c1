"""Logits of a tiny random model of every model type whose function hf.install patches.

Skipped unless torch and transformers are installed.  Nothing is downloaded:
each model type of the installed transformers whose modeling module is in
``hf.SUPPORTED_FAMILIES`` gets a tiny model from its shrunk default config
(``hf_tiny.py``), one forward pass with and one without ``install`` on the
same token ids (mRoPE models with distinct t/h/w position ids; the image,
audio or series of ``hf_tiny.INPUTS`` for models that take no tokens), and
the logits must agree to float32 rounding with every rotation taken by the
kernel (FORMULA: model types some of whose calls take transformers' formula,
and why).  A model type that cannot be run this way is in NOT_RUN with the
reason, and must still fail to run or call no patched function (so the list
cannot go stale); its
function keeps the function-level check of ``test_hf_install.py``.
"""

import inspect
import warnings

import pytest

from posenc_fast import hf
from posenc_fast._hf_models import MODEL_RULES

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_tiny  # noqa: E402  (needs torch)
from hf_tiny import kernel_calls  # noqa: E402,F401  (a fixture)
from hf_walk import configuration_auto  # noqa: E402


def model_types():
    """Model types of the installed transformers whose modeling module `install` patches."""
    return sorted(t for t in configuration_auto.CONFIG_MAPPING_NAMES
                  if configuration_auto.model_type_to_module_name(t) in hf.SUPPORTED_FAMILIES)


_INPUTS = "its forward needs {} (vision/audio/codec inputs of model-specific shapes, not token ids)"
_NO_FORWARD = "no forward of its own (an image/audio tokenizer: encode/decode only)"
_VISION = ("a vision tower: given an image (hf_tiny.INPUTS) it runs but calls no function install patches "
           "(its attention applies no RoPE)")
_AUDIO = "an audio encoder: given features (hf_tiny.INPUTS) it runs but applies no RoPE"
_NO_ROPE = "its attention applies no RoPE (the module defines apply_rotary_pos_emb but never calls it)"
_NO_ROPE_HERE = "given token ids it runs but calls no function install patches: {} applies no RoPE"
_TEXT_NO_ROPE = ("given token ids it calls no function install patches: its text model applies no RoPE "
                 "(_hf_models.NO_ROPE); its vision tower's apply_rotary_pos_emb_vision runs in its _vision model type")
_SLOW = "its tiny model takes about 30 s (BLT's patcher and byte-level encoders do not shrink with these keys)"
_CONFIG = "its shrunk default config is refused: {}"
_FAILS = "its shrunk default config does not run: {}"
# model type -> why it is not run (its function is still checked by test_hf_install.py)
NOT_RUN = {
    "apertus1p5": _CONFIG.format("the audio token range ends at 266440, beyond the vocabulary (`text_config.vocab_size` = 128)"),
    "apertus1p5_vision_tokenizer": _NO_FORWARD,
    "blt": _SLOW,
    "blt_local_decoder": _FAILS.format("AttributeError: 'NoneType' object has no attribute 'shape'"),
    "blt_local_encoder": _FAILS.format("AttributeError: 'NoneType' object has no attribute 'unsqueeze'"),
    "blt_patcher": _FAILS.format("AttributeError: 'tuple' object has no attribute 'last_hidden_state'"),
    "chameleon_vqgan": _NO_FORWARD,
    "clvp_decoder": _NO_ROPE_HERE.format("its decoder (learned positions; CLVP's encoders rotate)"),
    "cosmos3_edge_vision": _VISION,
    "dbrx": _FAILS.format("AttributeError: 'DbrxAttentionConfig' object has no attribute 'rope_theta'"),
    "deepseek_ocr2_encoder": _INPUTS.format("inputs_embeds, num_patches"),
    "deepseek_ocr2_sam_vision_model": _INPUTS.format("pixel_values"),
    "deepseek_ocr2_vision": _INPUTS.format("pixel_values"),
    "dots3_note_audio_encoder": _INPUTS.format("input_features, chunk_sample_lengths"),
    "efficientloftr": _CONFIG.format("hidden_size should be equal to the last value in out_features. hidden_size = 128, out_features = 256"),
    "emu3_vqgan": _NO_FORWARD,
    "eomt_dinov3": _FAILS.format("ImportError: EomtDinov3Loss requires the scipy library"),
    "esmfold2": _CONFIG.format("The atom_encoder.output_dim (128) is not single_inputs_size (451) - (2 * num_res_types + 1) = 384"),
    "glm5_next": _TEXT_NO_ROPE,
    "glm5_next_text": _TEXT_NO_ROPE,
    "glm_image_vision": _VISION,
    "glm_image_vqmodel": _NO_FORWARD,
    "gemma3n": _FAILS.format("ImportError: TimmWrapperModel requires the PIL library (its vision tower)"),
    "gemma3n_audio": _INPUTS.format("audio_mel, audio_mel_mask"),
    "gemma3n_vision": _FAILS.format("ImportError: TimmWrapperModel requires the PIL library"),
    "gemma4_audio": _INPUTS.format("input_features"),
    "gemma4_unified_audio": _FAILS.format("LookupError: no model class for gemma4_unified_audio"),
    "gemma4_unified_vision": _FAILS.format("LookupError: no model class for gemma4_unified_vision"),
    "granite4_vision": _FAILS.format("TypeError: object of type 'NoneType' has no len()"),
    "granite_docling_vision": _VISION,
    "hunyuan_vl_vision": _VISION,
    "hy_v4_vl_vision": _VISION,
    "idefics_perciever": _FAILS.format("LookupError: no model class for idefics_perciever"),
    "idefics_vision": _FAILS.format("LookupError: no model class for idefics_vision"),
    "inkling2": _TEXT_NO_ROPE,
    "inkling2_text": _TEXT_NO_ROPE,
    "jamba": _NO_ROPE,
    "lightglue": _INPUTS.format("pixel_values"),
    "mllama_vision_model": _INPUTS.format("pixel_values, aspect_ratio_ids, aspect_ratio_mask"),
    "molmo2_adapter": _INPUTS.format("image_features, pooled_patches_idx"),
    "molmo2_vision": _VISION,
    "moonshine_streaming_encoder": _AUDIO,
    "moshi_depth": _FAILS.format("IndexError: index 7 is out of range"),
    "muse_spark_audio": _AUDIO,
    "muse_spark_vision": _INPUTS.format("pixel_values, grid_thw"),
    "nemo_speechlm": _INPUTS.format("input_features (its text model, Nemotron-H, applies no RoPE)"),
    "nemotron_asr_streaming": _INPUTS.format("input_features and decoder_input_ids (a transducer; its encoder applies no RoPE)"),
    "nemotron_asr_streaming_encoder": _NO_ROPE,
    "nemotron_h": _NO_ROPE,
    "neucodec": _INPUTS.format("input_values, input_features"),
    "paddleocr_vl_vision": _INPUTS.format("pixel_values"),
    "parakeet_ctc": _NO_ROPE,
    "parakeet_encoder": _NO_ROPE,
    "parakeet_rnnt": _INPUTS.format("input_features and decoder_input_ids (a transducer; its encoder applies no RoPE)"),
    "parakeet_tdt": _INPUTS.format("input_features and decoder_input_ids (a transducer; its encoder applies no RoPE)"),
    **dict.fromkeys(("pe_audio_video", "pe_audio_video_encoder", "pe_video", "pe_video_encoder"), _FAILS.format(
        "ImportError: TimmWrapperForImageClassification requires the PIL library (its video encoder)")),
    "phi4_multimodal_audio": _INPUTS.format("hidden_states, mask"),
    "phi4_multimodal_vision": _VISION,
    "qwen2_5_omni": _NO_FORWARD,
    "qwen2_5_omni_audio_encoder": _AUDIO,
    "qwen2_5_omni_bigvgan": _INPUTS.format("mel_spectrogram"),
    "qwen2_5_omni_dit": _INPUTS.format("hidden_states, condition_vector, speaker_embedding, quantized_code, and"),
    "qwen2_5_omni_token2wav": _INPUTS.format("code, conditioning, reference_mel"),
    "qwen3_omni_moe": _NO_FORWARD,
    "qwen3_omni_moe_audio_encoder": _INPUTS.format("input_features, feature_lens"),
    "qwen3_omni_moe_talker_text": _INPUTS.format("inputs_embeds (not built: transformers leaves its MoE experts "
                                                  "uninitialized, torch.empty, so its output can be NaN)"),
    "sapiens2_head": _FAILS.format("LookupError: no model class for sapiens2_head"),
    "t5_gemma_module": _FAILS.format("LookupError: no model class for t5_gemma_module"),
    "unlimited_ocr_sam_vision_model": _INPUTS.format("pixel_values"),
    "unlimited_ocr_vision": _INPUTS.format("pixel_values"),
    "unlimited_ocr_vision_encoder": _INPUTS.format("patch_embeds"),
    "voxtral_realtime_text": _FAILS.format("AttributeError: module transformers has no attribute VoxtralRealtimeTextModel"),
    "xcodec2": _INPUTS.format("input_values, input_features"),
}

# model type -> why some of its calls take transformers' formula (its logits are still checked, and a call must
# still fall back, so the list cannot go stale)
FORMULA = dict.fromkeys(("hunyuan_vl", "hunyuan_vl_text"), (
    "with distinct position streams a rotate_half pair's two features take two streams' angles (its cos/sin "
    "halves differ): no rotation of pairs, which the drop-in computes, so it takes the formula there; "
    "RotaryEmbedding with pair_streams of two rows computes it (test_hf_models.py)"))

MODEL_TYPES = model_types()


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models gain nothing from threads; one leaves the other cores to the neighbours."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def restore_transformers():
    yield
    hf.uninstall()


def logits(model, inputs, positions):
    kwargs = dict(inputs)
    parameters = inspect.signature(model.forward).parameters
    if positions is not None:
        kwargs["position_ids"] = positions
    if "use_cache" in parameters:
        kwargs["use_cache"] = False
    output = model(**kwargs)
    if isinstance(output, torch.Tensor):  # BLT's global transformer returns its hidden states alone
        return output
    for name in ("logits", "last_hidden_state", "audio_values"):
        if output.get(name) is not None:
            return output[name]
    return output[0]


def _tiny(model_type, **changes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hf_tiny.tiny_model(model_type, **changes)


def _token_ids(high):
    return torch.randint(1, high, (hf_tiny.BATCH, hf_tiny.SEQ), generator=torch.Generator().manual_seed(2))


def _with_and_without_install(model, inputs, positions, kernel_calls):
    """(logits without install, logits with install, the installation)."""
    with torch.no_grad():
        expected = logits(model, inputs, positions)
        with hf.install(model) as installation:
            kernel_calls.clear()
            got = logits(model, inputs, positions)
    return expected, got, installation


def run(model_type, kernel_calls):
    """(logits without install, logits with install) of a tiny model; kernel_calls gets one entry a call."""
    model = _tiny(model_type)
    vocab = min(128, getattr(model.config.get_text_config(decoder=True), "vocab_size", None) or 128)
    inputs = hf_tiny.model_inputs(model_type, model, _token_ids(vocab))
    positions = hf_tiny.position_ids(model)
    rule = MODEL_RULES.get(model.config.get_text_config(decoder=True).model_type)
    if rule is not None and rule.streams and positions is None:
        raise LookupError(f"{model_type} has mRoPE ({rule.streams}) but no position streams were built")
    expected, got, installation = _with_and_without_install(model, inputs, positions, kernel_calls)
    assert hf_tiny.model_module(model_type) in installation.modules
    return expected, got


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_logits_unchanged(model_type, kernel_calls):
    if NOT_RUN.get(model_type) == _SLOW:
        pytest.skip(_SLOW)
    if model_type in NOT_RUN:
        try:
            run(model_type, kernel_calls)
        except Exception:
            if (NOT_RUN[model_type] in (_VISION, _AUDIO, _NO_ROPE, _TEXT_NO_ROPE)  # listed as running without a call
                    or NOT_RUN[model_type].startswith(_NO_ROPE_HERE.split("{")[0])):
                raise
            return
        assert not kernel_calls, f"{model_type} now runs: remove it from NOT_RUN"
        return
    expected, got = run(model_type, kernel_calls)
    assert kernel_calls, "install's function was never called"
    if model_type in FORMULA:
        assert not all(kernel_calls), f"{model_type}: every call takes the kernel now: remove it from FORMULA"
    else:
        assert all(kernel_calls), "the patched function took the fallback"
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


# VLMs whose language model computes its mRoPE positions from an image's grid: checked with an image too
# (Qwen3-VL and Qwen3.5 not yet: their tiny vision tower's features do not match the text width)
IMAGE_MODEL_TYPES = ("glm4v", "glm4v_moe", "qwen2_5_vl", "qwen2_vl")


@pytest.mark.parametrize("model_type", IMAGE_MODEL_TYPES)
def test_logits_unchanged_with_an_image(model_type, kernel_calls):
    model = _tiny(model_type, **hf_tiny.IMAGE_TOKENS)
    inputs = hf_tiny.image_inputs(model, _token_ids(hf_tiny.IMAGE_TOKENS["vision_start_token_id"]))
    expected, got, _ = _with_and_without_install(model, inputs, None, kernel_calls)
    assert kernel_calls and all(kernel_calls)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_not_run_lists_only_model_types_it_walks():
    assert set(NOT_RUN) | set(FORMULA) <= set(MODEL_TYPES) and not set(NOT_RUN) & set(FORMULA)
