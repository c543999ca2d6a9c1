"""What each transformers modeling module's rotation function computes, for ``hf.install``.

``ROTARY_FUNCTIONS`` says, per modeling module, what its
``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` (or Gemma 4's
one-tensor ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1)``) computes,
``INTERLEAVE_FUNCTIONS`` what its MLA ``apply_rotary_pos_emb_interleave``
computes, and ``VISION_FUNCTIONS`` what its vision tower's
``apply_rotary_pos_emb_vision(q, k, cos, sin)`` computes, each as a
`RotaryFunction` read from the module's file; ``NOT_PATCHED`` lists the
modules with a function of one of these names that no row describes, and
why.  ``tests/test_hf_install.py`` runs each module's own function against
posenc_fast's, and lists every module of the installed transformers that
defines one in these tables.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["RotaryFunction", "ROTARY_FUNCTIONS", "INTERLEAVE_FUNCTIONS", "VISION_FUNCTIONS", "NOT_PATCHED"]


class RotaryFunction(NamedTuple):
    """What one modeling module's ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` (or, with
    `one_tensor`, ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1)``; `parameters` and `unsqueeze` say
    where its signature differs) computes."""

    source: str
    """The modeling file it was read from (under ``transformers/models/``)."""
    layout: str = "half"
    """Pairs it rotates: ``"half"`` (``rotate_half``: ``x[i]``, ``x[i + r/2]``) or ``"interleaved"``
    (``x[2i]``, ``x[2i + 1]``)."""
    cache: str = "halves"
    """How it reads cos/sin: ``"halves"``, a full-width cache ``cat((freqs, freqs))`` (the interleaved
    ones repeat_interleave its first half themselves); ``"pairs"``, a cache whose entries are repeated
    pair by pair (``repeat_interleave(freqs, 2)``, made by the rotary module); ``"half_width"``, one
    entry per pair (GPT-OSS)."""
    partial: bool = False
    """True: rotates the leading features the cache covers and passes the rest (``rotary_dim =
    cos.shape[-1]``); False: the cache covers the whole head."""
    compute: str = "torch"
    """Result dtypes: ``"torch"``, torch's promotion of the data and the cache; ``"own_dtype"``, each
    result cast back to its input's dtype; ``"float32"``, computed in float32 (``q.float()``) and rounded once,
    to q's dtype (Cohere) or each input's (the vision towers): the kernel takes only data of one dtype, and
    neither float64 data nor a float64 cache (``.float()`` would round them first)."""
    inverse: bool = False
    """Rotates by ``-theta`` (its ``rotate_half`` is ``cat(x2, -x1)``)."""
    deinterleaves: bool = False
    """Takes interleaved pairs and returns them rotated in the half layout, ``cat(x[0::2] cos - x[1::2]
    sin, x[1::2] cos + x[0::2] sin)`` (MLA's ``apply_rotary_pos_emb_interleave``)."""
    one_tensor: bool = False
    """Its signature is ``(x, cos, sin, unsqueeze_dim=1)``: it rotates one tensor and returns its rotation
    (Gemma 3n's and Gemma 4's, whose attention rotates q and k in separate calls)."""
    trailing: bool = False
    """With `partial`: rotates the trailing features the cache covers, not the leading ones
    (DeepSeek-V4's ``x[..., -rope_dim:]``; ``rotary_start = dim - rotated``)."""
    unsqueeze: int | None = None
    """None: its signature ends in ``unsqueeze_dim=1``; an axis: it has no ``unsqueeze_dim`` and
    unsqueezes cos/sin there itself (the vision towers' ``cos.unsqueeze(-2)``, GPT-J's ``sin[:, :, None,
    :]``; 0 for a function that leaves them as they are, which broadcasting does too: DINOv3's)."""
    parameters: tuple[str, ...] | None = None
    """Its leading parameters where they are not ``(q, k, cos, sin)`` (with `one_tensor`, ``(x, cos,
    sin)``): the data's names, ``cos`` and ``sin`` where it takes them (GPT-J's ``(tensor, sin,
    cos)``), and ``position_ids`` where it indexes cos/sin by them first (CLVP's ``(q, k, v, cos, sin,
    position_ids)``: ``cos[position_ids]``)."""
    dims: int | None = None
    """Its formula indexes axes by number (GPT-J's ``x[:, :, :, ::2]`` and ``sin[:, :, None, :]`` repeated
    along axis 3, PE's ``.sum(5).flatten(3)``): it computes the rotation for data of `dims` dimensions and
    cos/sin of ``dims - 1``, unsqueezed at an axis in ``[0, dims - 1)``, only; None: any."""
    prefix_tokens: bool = False
    """Rotates only the last ``cos.shape[-2]`` tokens (rows of axis -2) of q and k, the patch tokens, and
    passes the ones before them, the cls and register tokens, into its ``torch.cat`` (DINOv3's)."""
    query_rows: bool = False
    """Rotates q by the last ``q.shape[-2]`` rows of the unsqueezed cache and k by all of it (Muse-Glimmer's
    assistant, whose keys hold the main model's context before its own tokens)."""
    sums_pairs: bool = False
    """Adds each pair's two products with torch's ``sum`` over rotation matrices (PE's ``(x_ *
    stack_freqs(cos, sin)).sum(5).flatten(3)`` of interleaved pairs, the cache's first half): a sum from
    +0, so no result is -0 (the kernel's -0 are made +0), and contiguous, as the ``sum`` returns it."""

    @property
    def kernel_layout(self) -> str:
        """The pair layout posenc_fast rotates in (a deinterleaving function rotates what it laid out in halves)."""
        return "half" if self.deinterleaves else self.layout


# GPT-J's apply_rotary_pos_emb(tensor, sin, cos) (and CodeGen's): one (batch, seq, heads, rotary_dim) tensor,
# the (batch, seq, rotary_dim / 2) sin and cos repeat_interleave'd at [:, :, None, :], rotate_every_two's pairs
_GPTJ = dict(one_tensor=True, unsqueeze=2, parameters=("tensor", "sin", "cos"), dims=4)

# DINOv3's apply_rotary_pos_emb(q, k, cos, sin, **kwargs) (and its relatives'): the (patches, head_dim) cos/sin,
# not unsqueezed, rotate the last patches tokens of q and k (batch, heads, tokens, head_dim)
_PREFIX = dict(unsqueeze=0, prefix_tokens=True)

# Module (the folder under transformers/models/) -> its apply_rotary_pos_emb, read from transformers 5.24.
# mRoPE modules are here too: their rotary module recomposes cos/sin before the call.
ROTARY_FUNCTIONS: dict[str, RotaryFunction] = {
    "afmoe": RotaryFunction("afmoe/modeling_afmoe.py"),
    "apertus": RotaryFunction("apertus/modeling_apertus.py"),
    "apertus1p5": RotaryFunction("apertus1p5/modeling_apertus1p5.py"),
    "arcee": RotaryFunction("arcee/modeling_arcee.py"),
    "aria": RotaryFunction("aria/modeling_aria.py"),
    "axk1": RotaryFunction("axk1/modeling_axk1.py"),
    "axk2": RotaryFunction("axk2/modeling_axk2.py"),
    "bamba": RotaryFunction("bamba/modeling_bamba.py", partial=True),
    "beam": RotaryFunction("beam/modeling_beam.py", compute="own_dtype"),
    "bitnet": RotaryFunction("bitnet/modeling_bitnet.py"),
    "blt": RotaryFunction("blt/modeling_blt.py", "interleaved", "pairs"),
    "chameleon": RotaryFunction("chameleon/modeling_chameleon.py"),
    "cohere": RotaryFunction("cohere/modeling_cohere.py", "interleaved", "pairs", compute="float32"),
    "cohere2": RotaryFunction("cohere2/modeling_cohere2.py", "interleaved", "pairs", compute="float32"),
    "cohere2_moe": RotaryFunction("cohere2_moe/modeling_cohere2_moe.py", "interleaved", "pairs", compute="float32"),
    # q, k and v by cos[position_ids], sin[position_ids] (a (seq, rotary_dim) cache)
    "clvp": RotaryFunction("clvp/modeling_clvp.py", parameters=("q", "k", "v", "cos", "sin", "position_ids")),
    "codegen": RotaryFunction("codegen/modeling_codegen.py", "interleaved", "half_width", **_GPTJ),
    "cohere_compass": RotaryFunction("cohere_compass/modeling_cohere_compass.py"),
    "cosmos3_edge": RotaryFunction("cosmos3_edge/modeling_cosmos3_edge.py"),
    "csm": RotaryFunction("csm/modeling_csm.py"),
    "cwm": RotaryFunction("cwm/modeling_cwm.py"),
    "dbrx": RotaryFunction("dbrx/modeling_dbrx.py"),
    "diffusion_gemma": RotaryFunction("diffusion_gemma/modeling_diffusion_gemma.py", one_tensor=True),
    "deepseek_ocr2": RotaryFunction("deepseek_ocr2/modeling_deepseek_ocr2.py"),
    "deepseek_v3": RotaryFunction("deepseek_v3/modeling_deepseek_v3.py"),
    "deepseek_v4": RotaryFunction("deepseek_v4/modeling_deepseek_v4.py", "interleaved", "half_width", partial=True,
                                  compute="float32", one_tensor=True, trailing=True),
    "deepseek_v32": RotaryFunction("deepseek_v32/modeling_deepseek_v32.py"),
    "dia": RotaryFunction("dia/modeling_dia.py"),
    "diffllama": RotaryFunction("diffllama/modeling_diffllama.py"),
    "dinov3_vit": RotaryFunction("dinov3_vit/modeling_dinov3_vit.py", **_PREFIX),
    "doge": RotaryFunction("doge/modeling_doge.py"),
    "dory": RotaryFunction("dory/modeling_dory.py"),
    "dots1": RotaryFunction("dots1/modeling_dots1.py"),
    "dots3_note": RotaryFunction("dots3_note/modeling_dots3_note.py", partial=True),
    "efficientloftr": RotaryFunction("efficientloftr/modeling_efficientloftr.py", "interleaved", "pairs", compute="float32"),
    "embedding_gemma2": RotaryFunction("embedding_gemma2/modeling_embedding_gemma2.py"),
    "emu3": RotaryFunction("emu3/modeling_emu3.py"),
    "eomt_dinov3": RotaryFunction("eomt_dinov3/modeling_eomt_dinov3.py", **_PREFIX),
    "ernie4_5": RotaryFunction("ernie4_5/modeling_ernie4_5.py", "interleaved", compute="float32"),
    "ernie4_5_moe": RotaryFunction("ernie4_5_moe/modeling_ernie4_5_moe.py", "interleaved", compute="float32"),
    "ernie4_5_vl_moe": RotaryFunction("ernie4_5_vl_moe/modeling_ernie4_5_vl_moe.py", "interleaved", "pairs", compute="float32"),
    "esm": RotaryFunction("esm/modeling_esm.py", compute="float32"),
    "esmc": RotaryFunction("esmc/modeling_esmc.py"),
    "esmfold2": RotaryFunction("esmfold2/modeling_esmfold2.py"),
    "eurobert": RotaryFunction("eurobert/modeling_eurobert.py"),
    "evolla": RotaryFunction("evolla/modeling_evolla.py", compute="float32"),
    "exaone4": RotaryFunction("exaone4/modeling_exaone4.py"),
    "exaone4_5": RotaryFunction("exaone4_5/modeling_exaone4_5.py"),
    "exaone_moe": RotaryFunction("exaone_moe/modeling_exaone_moe.py"),
    "falcon": RotaryFunction("falcon/modeling_falcon.py"),
    "falcon_h1": RotaryFunction("falcon_h1/modeling_falcon_h1.py"),
    "flex_olmo": RotaryFunction("flex_olmo/modeling_flex_olmo.py", compute="own_dtype"),
    "flint": RotaryFunction("flint/modeling_flint.py"),
    "gemma": RotaryFunction("gemma/modeling_gemma.py"),
    "gemma2": RotaryFunction("gemma2/modeling_gemma2.py"),
    "gemma3": RotaryFunction("gemma3/modeling_gemma3.py"),
    "gemma3n": RotaryFunction("gemma3n/modeling_gemma3n.py", one_tensor=True),
    "gemma4": RotaryFunction("gemma4/modeling_gemma4.py", one_tensor=True),
    "gemma4_unified": RotaryFunction("gemma4_unified/modeling_gemma4_unified.py", one_tensor=True),
    "glm": RotaryFunction("glm/modeling_glm.py", "interleaved", partial=True),
    "glm4": RotaryFunction("glm4/modeling_glm4.py", "interleaved", partial=True),
    "glm4_moe": RotaryFunction("glm4_moe/modeling_glm4_moe.py", partial=True),
    "glm4_moe_lite": RotaryFunction("glm4_moe_lite/modeling_glm4_moe_lite.py"),
    "glm4v": RotaryFunction("glm4v/modeling_glm4v.py", "interleaved", "pairs", partial=True),
    "glm4v_moe": RotaryFunction("glm4v_moe/modeling_glm4v_moe.py", partial=True),
    "glm_image": RotaryFunction("glm_image/modeling_glm_image.py", partial=True),
    "glm_ocr": RotaryFunction("glm_ocr/modeling_glm_ocr.py", "interleaved", "pairs", partial=True),
    "glmasr": RotaryFunction("glmasr/modeling_glmasr.py", partial=True),
    "gpt_neox": RotaryFunction("gpt_neox/modeling_gpt_neox.py", partial=True),
    "gpt_neox_japanese": RotaryFunction("gpt_neox_japanese/modeling_gpt_neox_japanese.py"),
    "gpt_oss": RotaryFunction("gpt_oss/modeling_gpt_oss.py", cache="half_width"),
    "gptj": RotaryFunction("gptj/modeling_gptj.py", "interleaved", "half_width", **_GPTJ),
    "gradium_phonon_tts": RotaryFunction("gradium_phonon_tts/modeling_gradium_phonon_tts.py"),
    "granite": RotaryFunction("granite/modeling_granite.py"),
    "granite4_vision": RotaryFunction("granite4_vision/modeling_granite4_vision.py"),
    "granite_docling": RotaryFunction("granite_docling/modeling_granite_docling.py"),
    "granite_swa": RotaryFunction("granite_swa/modeling_granite_swa.py"),
    "granitemoe": RotaryFunction("granitemoe/modeling_granitemoe.py"),
    "granitemoe_swa": RotaryFunction("granitemoe_swa/modeling_granitemoe_swa.py"),
    "granitemoehybrid": RotaryFunction("granitemoehybrid/modeling_granitemoehybrid.py"),
    "granitemoeshared": RotaryFunction("granitemoeshared/modeling_granitemoeshared.py"),
    "gte": RotaryFunction("gte/modeling_gte.py"),
    "helium": RotaryFunction("helium/modeling_helium.py", "interleaved"),
    "higgs_audio_v2": RotaryFunction("higgs_audio_v2/modeling_higgs_audio_v2.py"),
    "hrm_text": RotaryFunction("hrm_text/modeling_hrm_text.py"),
    "hunyuan_v1_dense": RotaryFunction("hunyuan_v1_dense/modeling_hunyuan_v1_dense.py"),
    "hunyuan_v1_moe": RotaryFunction("hunyuan_v1_moe/modeling_hunyuan_v1_moe.py"),
    "hunyuan_vl": RotaryFunction("hunyuan_vl/modeling_hunyuan_vl.py", compute="float32"),
    "hy_v3": RotaryFunction("hy_v3/modeling_hy_v3.py"),
    "hy_v4": RotaryFunction("hy_v4/modeling_hy_v4.py"),
    "hy_v4_vl": RotaryFunction("hy_v4_vl/modeling_hy_v4_vl.py", "interleaved", compute="float32"),
    "hyperclovax": RotaryFunction("hyperclovax/modeling_hyperclovax.py"),
    "idefics": RotaryFunction("idefics/modeling_idefics.py"),
    "jais2": RotaryFunction("jais2/modeling_jais2.py"),
    "jamba": RotaryFunction("jamba/modeling_jamba.py"),
    "jetmoe": RotaryFunction("jetmoe/modeling_jetmoe.py"),
    "jina_embeddings_v3": RotaryFunction("jina_embeddings_v3/modeling_jina_embeddings_v3.py"),
    "kolibri1": RotaryFunction("kolibri1/modeling_kolibri1.py"),
    "kyutai_speech_to_text": RotaryFunction("kyutai_speech_to_text/modeling_kyutai_speech_to_text.py"),
    "laguna": RotaryFunction("laguna/modeling_laguna.py", partial=True),
    "lara_mini": RotaryFunction("lara_mini/modeling_lara_mini.py"),
    "lasr": RotaryFunction("lasr/modeling_lasr.py"),
    "lfm2": RotaryFunction("lfm2/modeling_lfm2.py"),
    "lfm2_moe": RotaryFunction("lfm2_moe/modeling_lfm2_moe.py"),
    "lfm3": RotaryFunction("lfm3/modeling_lfm3.py", compute="own_dtype"),
    "lightglue": RotaryFunction("lightglue/modeling_lightglue.py", "interleaved", "pairs", compute="float32"),
    "llama": RotaryFunction("llama/modeling_llama.py"),
    "mellum": RotaryFunction("mellum/modeling_mellum.py"),
    "mimi": RotaryFunction("mimi/modeling_mimi.py"),
    "mimo_v2_flash": RotaryFunction("mimo_v2_flash/modeling_mimo_v2_flash.py", partial=True),
    "minicpm3": RotaryFunction("minicpm3/modeling_minicpm3.py"),
    "minimax": RotaryFunction("minimax/modeling_minimax.py"),
    "minimax_m2": RotaryFunction("minimax_m2/modeling_minimax_m2.py", partial=True),
    "minimax_m3_vl": RotaryFunction("minimax_m3_vl/modeling_minimax_m3_vl.py", partial=True),
    "ministral": RotaryFunction("ministral/modeling_ministral.py"),
    "ministral3": RotaryFunction("ministral3/modeling_ministral3.py"),
    "mistral": RotaryFunction("mistral/modeling_mistral.py"),
    "mistral4": RotaryFunction("mistral4/modeling_mistral4.py"),
    "mixtral": RotaryFunction("mixtral/modeling_mixtral.py"),
    "mllama": RotaryFunction("mllama/modeling_mllama.py"),
    "modernbert": RotaryFunction("modernbert/modeling_modernbert.py", compute="float32"),
    "modernbert_decoder": RotaryFunction("modernbert_decoder/modeling_modernbert_decoder.py", compute="float32"),
    "molmo2": RotaryFunction("molmo2/modeling_molmo2.py"),
    "moonshine": RotaryFunction("moonshine/modeling_moonshine.py", "interleaved", partial=True),
    "moonshine_streaming": RotaryFunction("moonshine_streaming/modeling_moonshine_streaming.py", "interleaved", partial=True),
    "moshi": RotaryFunction("moshi/modeling_moshi.py"),
    "muse_glimmer": RotaryFunction("muse_glimmer/modeling_muse_glimmer.py"),
    "muse_glimmer_assistant": RotaryFunction("muse_glimmer_assistant/modeling_muse_glimmer_assistant.py",
                                             query_rows=True),
    "muse_spark": RotaryFunction("muse_spark/modeling_muse_spark.py"),
    "nanochat": RotaryFunction("nanochat/modeling_nanochat.py", inverse=True),
    "nemotron": RotaryFunction("nemotron/modeling_nemotron.py", partial=True),
    "nemotron3_5_transcribe": RotaryFunction("nemotron3_5_transcribe/modeling_nemotron3_5_transcribe.py", partial=True),
    "nemotron3_diarization": RotaryFunction("nemotron3_diarization/modeling_nemotron3_diarization.py", partial=True),
    "nemotron_asr_streaming": RotaryFunction("nemotron_asr_streaming/modeling_nemotron_asr_streaming.py"),
    "nemotron_h": RotaryFunction("nemotron_h/modeling_nemotron_h.py"),
    "neomme": RotaryFunction("neomme/modeling_neomme.py", partial=True),
    "neucodec": RotaryFunction("neucodec/modeling_neucodec.py"),
    "nomic_bert": RotaryFunction("nomic_bert/modeling_nomic_bert.py"),
    "olmo": RotaryFunction("olmo/modeling_olmo.py", compute="own_dtype"),
    "olmo2": RotaryFunction("olmo2/modeling_olmo2.py", compute="own_dtype"),
    "olmo3": RotaryFunction("olmo3/modeling_olmo3.py", compute="own_dtype"),
    "olmo_hybrid": RotaryFunction("olmo_hybrid/modeling_olmo_hybrid.py", compute="own_dtype"),
    "olmoe": RotaryFunction("olmoe/modeling_olmoe.py"),
    "openai_privacy_filter": RotaryFunction("openai_privacy_filter/modeling_openai_privacy_filter.py", "interleaved", "half_width"),
    "paddleocr_vl": RotaryFunction("paddleocr_vl/modeling_paddleocr_vl.py"),
    "parakeet": RotaryFunction("parakeet/modeling_parakeet.py"),
    **{module: RotaryFunction(f"{module}/modeling_{module}.py", "interleaved", sums_pairs=True, dims=4)
       for module in ("pe_audio", "pe_audio_video", "pe_video")},  # stack_freqs' matrices, then .flatten(3)
    "persimmon": RotaryFunction("persimmon/modeling_persimmon.py"),
    "phi": RotaryFunction("phi/modeling_phi.py"),
    "phi3": RotaryFunction("phi3/modeling_phi3.py", partial=True),
    "phi4_multimodal": RotaryFunction("phi4_multimodal/modeling_phi4_multimodal.py", partial=True),
    "phimoe": RotaryFunction("phimoe/modeling_phimoe.py"),
    "pixtral": RotaryFunction("pixtral/modeling_pixtral.py"),
    "pocket_tts": RotaryFunction("pocket_tts/modeling_pocket_tts.py"),
    "pocket_tts_audio_tokenizer": RotaryFunction("pocket_tts_audio_tokenizer/modeling_pocket_tts_audio_tokenizer.py"),
    "qwen2": RotaryFunction("qwen2/modeling_qwen2.py"),
    "qwen2_5_omni": RotaryFunction("qwen2_5_omni/modeling_qwen2_5_omni.py"),
    "qwen2_5_vl": RotaryFunction("qwen2_5_vl/modeling_qwen2_5_vl.py"),
    "qwen2_moe": RotaryFunction("qwen2_moe/modeling_qwen2_moe.py"),
    "qwen2_vl": RotaryFunction("qwen2_vl/modeling_qwen2_vl.py"),
    "qwen3": RotaryFunction("qwen3/modeling_qwen3.py"),
    "qwen3_5": RotaryFunction("qwen3_5/modeling_qwen3_5.py", partial=True),
    "qwen3_5_moe": RotaryFunction("qwen3_5_moe/modeling_qwen3_5_moe.py", partial=True),
    "qwen3_moe": RotaryFunction("qwen3_moe/modeling_qwen3_moe.py"),
    "qwen3_next": RotaryFunction("qwen3_next/modeling_qwen3_next.py", partial=True),
    "qwen3_omni_moe": RotaryFunction("qwen3_omni_moe/modeling_qwen3_omni_moe.py"),
    "qwen3_vl": RotaryFunction("qwen3_vl/modeling_qwen3_vl.py"),
    "qwen3_vl_moe": RotaryFunction("qwen3_vl_moe/modeling_qwen3_vl_moe.py"),
    "qwen4_exp": RotaryFunction("qwen4_exp/modeling_qwen4_exp.py", partial=True),
    "recurrent_gemma": RotaryFunction("recurrent_gemma/modeling_recurrent_gemma.py", partial=True),
    "sapiens2": RotaryFunction("sapiens2/modeling_sapiens2.py", **_PREFIX),
    "seed_oss": RotaryFunction("seed_oss/modeling_seed_oss.py"),
    "smollm3": RotaryFunction("smollm3/modeling_smollm3.py"),
    "solar_open": RotaryFunction("solar_open/modeling_solar_open.py"),
    "stablelm": RotaryFunction("stablelm/modeling_stablelm.py"),
    "starcoder2": RotaryFunction("starcoder2/modeling_starcoder2.py"),
    "step3p7": RotaryFunction("step3p7/modeling_step3p7.py", partial=True),
    "t5gemma": RotaryFunction("t5gemma/modeling_t5gemma.py"),
    "t5gemma2": RotaryFunction("t5gemma2/modeling_t5gemma2.py"),
    "timesfm2_5": RotaryFunction("timesfm2_5/modeling_timesfm2_5.py"),
    "ultrabert": RotaryFunction("ultrabert/modeling_ultrabert.py"),
    "unlimited_ocr": RotaryFunction("unlimited_ocr/modeling_unlimited_ocr.py"),
    "vaultgemma": RotaryFunction("vaultgemma/modeling_vaultgemma.py"),
    "voxtral_realtime": RotaryFunction("voxtral_realtime/modeling_voxtral_realtime.py"),
    "xcodec2": RotaryFunction("xcodec2/modeling_xcodec2.py"),
    "youtu": RotaryFunction("youtu/modeling_youtu.py"),
    "zamba2": RotaryFunction("zamba2/modeling_zamba2.py"),
    "zaya": RotaryFunction("zaya/modeling_zaya.py", partial=True),
}


def _interleave(module: str) -> RotaryFunction:
    return RotaryFunction(f"{module}/modeling_{module}.py", "interleaved", deinterleaves=True)


# Module -> its apply_rotary_pos_emb_interleave (DeepSeek-V3's: for MLA configs with rope_interleave, or the
# only rotation of the modules whose rule has reads_rope_interleave=False).
INTERLEAVE_FUNCTIONS: dict[str, RotaryFunction] = {module: _interleave(module) for module in (
    "axk1", "axk2", "bailing_hybrid", "deepseek_v3", "deepseek_v32", "dots3_note", "glm4_moe_lite",
    "glm_moe_dsa", "longcat_flash", "mistral4", "mistral_large4", "youtu")}


def _vision(module: str, *args, **kwargs) -> RotaryFunction:
    return RotaryFunction(f"{module}/modeling_{module}.py", *args, unsqueeze=-2, **kwargs)


# Module -> its apply_rotary_pos_emb_vision(q, k, cos, sin) (Qwen2-VL's: q.float(), k.float(), cos/sin
# .float() and unsqueezed at -2, each result cast back to its input's dtype).
VISION_FUNCTIONS: dict[str, RotaryFunction] = {
    **{module: _vision(module, compute="float32") for module in (
        "cohere_compass", "dots3_note", "ernie4_5_vl_moe", "exaone4_5", "glm4v", "glm4v_moe", "glm5_next",
        "glm_ocr", "kimi_k25", "lfm3_vl", "mlcd", "muse_glimmer", "muse_spark", "paddleocr_vl", "qwen2_5_omni",
        "qwen2_5_vl", "qwen2_vl", "qwen3_5", "qwen3_5_moe", "qwen3_omni_moe", "qwen3_vl", "qwen3_vl_moe",
        "qwen4_exp", "step3p7", "video_llama_3")},
    # rotate_pairwise on a repeat_interleave'd cache; otherwise the same body
    "inkling2": _vision("inkling2", "interleaved", "pairs", compute="float32"),
    # no float(): torch's promotion; rotates the leading cos.shape[-1] features; cos[:, None, :]
    "minimax_m3_vl": RotaryFunction("minimax_m3_vl/modeling_minimax_m3_vl.py", partial=True, unsqueeze=1),
}

# Modules with a function of the name of one of the tables above that is not in it, and why.
NOT_PATCHED: dict[str, str] = {}  # (none in transformers 5.24)
