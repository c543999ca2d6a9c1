"""Per-model RoPE rules of Hugging Face transformers, one row per ``model_type``.

Each row names the file of ``transformers/models/`` it was read from and is
kept honest by ``tests/test_hf_models.py``, which runs the model's own rotary
module and rotation against ``RotaryEmbedding.from_hf_config`` for every
model type of the installed transformers.  A model type without a row is
refused unless the caller settles its layout (``layout=``).

What each modeling module's rotation function computes, for ``hf.install``
(``ROTARY_FUNCTIONS`` and the other ``RotaryFunction`` tables), is in
``_hf_functions``.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

__all__ = ["ModelRule", "MODEL_RULES", "NO_ROPE", "REFUSED_MODELS", "STREAM_FORMS", "pair_streams"]


class ModelRule(NamedTuple):
    """How one model family rotates queries and keys."""

    source: str
    """The modeling file the rule was read from (under ``transformers/models/``)."""
    layout: str = "half"
    """Pair layout of its rotation: ``"half"`` (``rotate_half``) or ``"interleaved"`` (``x[..., 0::2]``)."""
    whole_head: bool = True
    """True: rotates the whole head, ignoring ``partial_rotary_factor`` for default RoPE (Llama's
    ``compute_default_rope_parameters``); False: rotates ``int(head_dim * partial_rotary_factor)``
    leading features."""
    head_dim_key: str = "head_dim"
    """The config key its ``head_dim`` is stored under (``attribute_map``; HY-V4-VL: ``qk_rope_head_dim``, which its
    configuration class copies into ``head_dim``)."""
    mla: bool = False
    """Multi-head latent attention: rotates the ``qk_rope_head_dim`` features; ``rope_interleave``
    (when the config has it and `reads_rope_interleave`) picks the layout."""
    reads_rope_interleave: bool = True
    """False: its attention always calls the same rotation (`layout`), whatever the config's
    ``rope_interleave`` says."""
    streams: str | None = None
    """Multimodal RoPE: how its ``recomposition_frequencies`` assigns pairs to position streams
    (`pair_streams`): ``"chunked"`` (Qwen2-VL), ``"thw_interleaved"`` (Qwen3-VL),
    ``"hw_interleaved_t"`` (ERNIE-4.5-VL), ``"row_col"`` (NeoMME), ``"full_width"`` (HunYuan-VL: a stream
    per feature, two lists where a pair's features take two)."""
    default_section: tuple[int, ...] | None = None
    """``mrope_section`` when the config has none (the rotary module's default; where the configuration class
    fills one in, ``_hf_defaults.SECTION`` has it)."""
    reversed: bool = False
    """Rotates by ``-theta`` (its ``rotate_half`` is ``cat(x2, -x1)``)."""
    theta_key: str = "rope_theta"
    """The flat (transformers-4) config key of ``rope_theta`` (its class's default: ``_hf_defaults.THETA``)."""
    local_theta_key: str | None = None
    """Flat config key of the sliding-window layers' ``rope_theta`` (one RoPE per layer type)."""
    local_scaled: bool = False
    """A flat ``rope_scaling`` applies to the sliding-window layers too (else to full attention only)."""
    nests_flat: bool = False
    """Its configuration class nests flat keys as `local_theta_key` says, without such a key (OLMo 3): a flat
    ``rope_scaling`` and ``rope_theta`` are the full-attention layers', the sliding-window layers keep its
    default RoPE (`per_type_class`)."""
    ntk_alpha: bool = False
    """HunYuan: a ``"dynamic"`` RoPE with ``alpha`` is a fixed one of base ``rope_theta * alpha ** (head_dim /
    (head_dim - 2))`` (its ``compute_ntk_alpha_rope_parameters``)."""
    mscales: bool = False
    """PhiMoE: a scaled RoPE takes its frequencies without the length (LongRoPE's short factors at every
    length), its cos/sin scaled by ``long_mscale`` past ``original_max_position_embeddings``, else by
    ``short_mscale``."""
    partial_default: float | None = None
    """The ``partial_rotary_factor`` of a default-RoPE layer type's entry without one (MiMo-V2-Flash: 0.334)."""
    nested_top_keys: tuple[str, ...] = ("rope_theta", "partial_rotary_factor")
    """The top-level keys its configuration class fills into each layer type's rope parameters
    (``standardize_rope_params``); MiMo-V2-Flash, Laguna, Zaya: none (their ``convert_rope_params_to_dict`` does
    nothing), NeoMME: ``rope_theta`` (each type's factor its class default)."""
    theta_list: bool = False
    """UltraBERT: a list ``rope_theta`` (without ``rope_parameters``) is one theta per layer, read by layer type
    (the last layer of each type's)."""
    indexer: str | None = None
    """Pair layout of its DSA indexer (``attention="indexer"``), which rotates the leading
    ``qk_rope_head_dim`` of its ``index_head_dim`` features (the trailing ones with `trailing`); None: no
    indexer posenc_fast reads."""
    indexer_layers: str = "indexed_attention"
    """The layer type of the layers that have its indexer, where its ``layer_types`` name it (dots3; DeepSeek-V4:
    ``"compressed_sparse_attention"``, its CSA compressor's); the other layer types have none."""
    indexer_rope: str | None = None
    """The RoPE its indexer uses in every layer (DeepSeek-V4: ``"compress"``), if it has one of its own."""
    hidden_key: str = "hidden_size"
    """The config key of the hidden size (``attribute_map``: ``d_model``, ``n_embd``)."""
    heads_key: str = "num_attention_heads"
    """The config key of the attention head count (``attribute_map``: ``n_heads``, decoder heads)."""
    rope_per_type_only: bool = False
    """Its RoPEs are the per-layer-type entries of ``rope_parameters`` only: a layer type without one is NoPE."""
    global_head_dim: bool = False
    """Without ``per_layer_config``, its full-attention layers' head_dim is ``global_head_dim`` (default 512), as
    Gemma 4's configuration class builds ``per_layer_config`` from it."""
    per_layer_lists: bool = False
    """A checkpoint's ``rope_theta`` / ``partial_rotary_factors`` may be lists, one entry per layer (Step-3.7)."""
    swa_aliases: bool = False
    """Without ``per_layer_config``, its sliding layers' head sizes and rope_theta are the checkpoint's ``swa_*``
    keys (dots3: ``Dots3NoteTextConfig.__post_init__``)."""
    trailing: bool = False
    """Rotates the last ``int(head_dim * partial_rotary_factor)`` features of each head, not the first
    (DeepSeek-V4's ``x[..., -rope_dim:]``): ``rotary_start = head_dim - rotary_dim``; with `mla`, its indexer
    rotates the last ``qk_rope_head_dim`` of its ``index_head_dim`` features (HY-V4's ``q_pass, q_rot``)."""
    rope_of_layer: dict | None = None
    """Its ``rope_parameters`` are keyed by RoPE name, not layer type: each layer type's RoPE name
    (DeepSeek-V4: sliding layers ``"main"``, compressed ones ``"compress"``)."""
    layers_key: str = "num_hidden_layers"
    """The config key of its decoder layer count, which bounds ``layer=`` (``attribute_map``: ``n_layer``)."""
    rope_layers: str | None = None
    """A per-layer list its attention reads by layer index (``config.<list>[layer_idx]``):
    ``"no_rope_layers"`` (SmolLM3, Llama 4, Mistral-Large-4: 0 = that layer is NoPE, 1 = it rotates; when the
    config has none, its configuration class derives ``[int((i + 1) % no_rope_layer_interval != 0) for i in
    range(num_hidden_layers)]``, interval 4 by default) or ``"rope_scaling_layers"`` (Molmo2: the listed layers
    rotate by the scaled RoPE of ``rope_parameters``, the others by an unscaled one of the same ``rope_theta``,
    its ``rotary_emb_unscaled``; default every layer); or by layer type: ``"sliding"`` (Cohere2: only its
    sliding-window layers rotate, ``sliding_window if layer_types[i] == "sliding_attention" else None``),
    ``"sliding_or_dense"`` (Cohere2-MoE: also a full layer whose ``mlp_layer_types[i]`` is ``"dense"`` where
    ``prefix_dense_sliding_window_pattern`` is 1, its default) or ``"sliding_or_no_window"`` (EXAONE 4: every
    layer where ``sliding_window`` is None, else the sliding-window layers)."""

    @property
    def per_type_class(self) -> bool:
        """Its configuration class holds one RoPE per layer type whatever the config's form (Gemma 3, OLMo 3):
        flat keys are nested by `local_theta_key` or `nests_flat`."""
        return self.local_theta_key is not None or self.nests_flat


# The values of ModelRule.streams: the ways pair_streams deals pairs to position streams
STREAM_FORMS = ("chunked", "thw_interleaved", "hw_interleaved_t", "row_col", "full_width")


def pair_streams(rule: ModelRule, section, npairs: int, where: str) -> list[int] | list[list[int]] | None:
    """The position stream of each pair, as the model's ``recomposition_frequencies`` assigns them (of
    each pair's first and second feature, two lists, where they differ); None where the model reads one
    row of positions (a plain RoPE)."""
    if section is None:
        section = rule.default_section
    streams = _deal_pairs(rule, section, npairs, where)
    rows = len(section) if rule.streams == "full_width" else 2 if rule.streams == "row_col" else 3
    if rows == 1:
        return None
    flat = [s for row in streams for s in row] if streams and isinstance(streams[0], list) else streams
    unused = sorted(set(range(rows)).difference(flat))
    if unused:
        raise ValueError(f"{where}: mrope_section {section} gives no pair to position stream(s) {unused} of the "
                         f"{rows} rows of position_ids its rotary module reads, and pair_streams uses every row "
                         f"it is given: build the RotaryEmbedding with pair_streams= over the rows it reads")
    return streams


def _deal_pairs(rule: ModelRule, section, npairs: int, where: str) -> list[int] | list[list[int]]:
    if rule.streams == "row_col":
        # NeoMME: freq[0][..., 0::2] (rows) and freq[1][..., 1::2] (columns), stacked pair by pair
        return [j % 2 for j in range(npairs)]
    if section is None:
        raise ValueError(f"{where}: the config has no mrope_section, which this model's rotary module needs")
    if (isinstance(section, (str, bytes)) or not isinstance(section, (list, tuple))
            or not all(isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 0 for n in section)):
        raise ValueError(f"{where}: mrope_section must be a list of ints >= 0, got {section!r}")
    section = [int(n) for n in section]
    if rule.streams == "thw_interleaved":
        # Qwen3-VL: h takes pairs slice(1, 3*section[1], 3), w slice(2, 3*section[2], 3), t the rest
        if len(section) != 3:
            raise ValueError(f"{where}: mrope_section must have 3 entries (t, h, w), got {section}")
        return [1 if j % 3 == 1 and j < 3 * section[1] else 2 if j % 3 == 2 and j < 3 * section[2] else 0
                for j in range(npairs)]
    if sum(section) != npairs:
        raise ValueError(f"{where}: mrope_section {section} must sum to the {npairs} rotated pairs (its rotary "
                         f"module splits the frequencies by it)")
    if rule.streams == "chunked":
        # Qwen2-VL: torch.cat([m[i % 3] for i, m in enumerate(freq.split(mrope_section, dim=-1))])
        return [i % 3 for i, n in enumerate(section) for _ in range(n)]
    if rule.streams == "full_width":
        # HunYuan-VL: cat((freq, freq)) split by 2 * mrope_section, chunk i taking stream i: feature j's stream.
        # A rotate_half pair (j, j + npairs) takes two streams where its features lie in two chunks.
        feature = [i for i, n in enumerate(section) for _ in range(2 * n)]
        return feature[:npairs] if feature[:npairs] == feature[npairs:] else [feature[:npairs], feature[npairs:]]
    if rule.streams == "hw_interleaved_t" and len(section) == 3:
        # ERNIE-4.5-VL: pre-rotated frequencies, h and w pair by pair over section[0] + section[1] pairs, then t
        if section[0] != section[1]:
            raise ValueError(f"{where}: mrope_section {section} must give h and w as many pairs (its rotary "
                             f"module stacks their frequencies pair by pair, {rule.source})")
        return [(1 if j % 2 == 0 else 2) if j < section[0] + section[1] else 0 for j in range(npairs)]
    raise ValueError(f"{where}: its rotary module assigns pairs to position streams in a way posenc_fast does not "
                     f"read ({rule.streams!r}, {rule.source}); build the RotaryEmbedding with pair_streams=")


# Rows found by running each family's own rotary module (see tests/hf_walk.py) and read back in its file.
MODEL_RULES: dict[str, ModelRule] = {
    "afmoe": ModelRule("afmoe/modeling_afmoe.py"),
    "apertus": ModelRule("apertus/modeling_apertus.py"),
    "apertus1p5_text": ModelRule("apertus1p5/modeling_apertus1p5.py"),
    "arcee": ModelRule("arcee/modeling_arcee.py"),
    "aria_text": ModelRule("aria/modeling_aria.py"),
    "axk1": ModelRule("axk1/modeling_axk1.py", "interleaved", mla=True),
    "axk2": ModelRule("axk2/modeling_axk2.py", "interleaved", mla=True, reads_rope_interleave=False, indexer="half"),
    "bailing_hybrid": ModelRule("bailing_hybrid/modeling_bailing_hybrid.py", "interleaved", mla=True, reads_rope_interleave=False),
    "bamba": ModelRule("bamba/modeling_bamba.py", whole_head=False),
    "beam": ModelRule("beam/modeling_beam.py"),
    "bitnet": ModelRule("bitnet/modeling_bitnet.py"),
    "blt_global_transformer": ModelRule("blt/modeling_blt.py", "interleaved"),
    "blt_local_decoder": ModelRule("blt/modeling_blt.py", "interleaved"),
    "blt_local_encoder": ModelRule("blt/modeling_blt.py", "interleaved"),
    "blt_patcher": ModelRule("blt/modeling_blt.py", "interleaved"),
    "chameleon": ModelRule("chameleon/modeling_chameleon.py"),
    "codegen": ModelRule("codegen/modeling_codegen.py", "interleaved", whole_head=False, layers_key="n_layer"),
    "cohere": ModelRule("cohere/modeling_cohere.py", "interleaved"),
    "cohere2": ModelRule("cohere2/modeling_cohere2.py", "interleaved", rope_layers="sliding"),
    "cohere2_moe": ModelRule("cohere2_moe/modeling_cohere2_moe.py", "interleaved", rope_layers="sliding_or_dense"),
    "cohere_compass_text": ModelRule("cohere_compass/modeling_cohere_compass.py", streams="thw_interleaved", default_section=(24, 20, 20), rope_per_type_only=True),
    "cosmos3_edge_text": ModelRule("cosmos3_edge/modeling_cosmos3_edge.py", streams="thw_interleaved", default_section=(24, 20, 20)),
    "csm": ModelRule("csm/modeling_csm.py"),
    "csm_depth_decoder_model": ModelRule("csm/modeling_csm.py"),
    "cwm": ModelRule("cwm/modeling_cwm.py"),
    "dbrx": ModelRule("dbrx/modeling_dbrx.py", hidden_key="d_model", heads_key="n_heads", layers_key="n_layers"),
    "deepseek_ocr2_encoder": ModelRule("deepseek_ocr2/modeling_deepseek_ocr2.py"),
    "deepseek_ocr2_text": ModelRule("deepseek_ocr2/modeling_deepseek_ocr2.py"),
    "deepseek_v2": ModelRule("deepseek_v2/modeling_deepseek_v2.py", "interleaved", mla=True, reads_rope_interleave=False),
    "deepseek_v3": ModelRule("deepseek_v3/modeling_deepseek_v3.py", "interleaved", mla=True),
    "deepseek_v4": ModelRule("deepseek_v4/modeling_deepseek_v4.py", "interleaved", whole_head=False, trailing=True,
                             indexer="interleaved", indexer_rope="compress", indexer_layers="compressed_sparse_attention", rope_of_layer={"sliding_attention": "main", "compressed_sparse_attention": "compress",
                                            "heavily_compressed_attention": "compress"}),
    "deepseek_v32": ModelRule("deepseek_v32/modeling_deepseek_v32.py", "interleaved", mla=True, reads_rope_interleave=False, indexer="half"),
    "dia_decoder": ModelRule("dia/modeling_dia.py"),
    "dia_encoder": ModelRule("dia/modeling_dia.py"),
    "diffllama": ModelRule("diffllama/modeling_diffllama.py"),
    "diffusion_gemma_text": ModelRule("diffusion_gemma/modeling_diffusion_gemma.py", global_head_dim=True),
    "doge": ModelRule("doge/modeling_doge.py"),
    "dory": ModelRule("dory/modeling_dory.py"),
    "dots1": ModelRule("dots1/modeling_dots1.py"),
    "dots3_note_text": ModelRule("dots3_note/modeling_dots3_note.py", "interleaved", mla=True, reads_rope_interleave=False, indexer="interleaved", swa_aliases=True),
    "embedding_gemma2_text": ModelRule("embedding_gemma2/modeling_embedding_gemma2.py", global_head_dim=True),
    "emu3_text_model": ModelRule("emu3/modeling_emu3.py"),
    "ernie4_5": ModelRule("ernie4_5/modeling_ernie4_5.py", "interleaved"),
    "ernie4_5_moe": ModelRule("ernie4_5_moe/modeling_ernie4_5_moe.py", "interleaved"),
    "ernie4_5_vl_moe_text": ModelRule("ernie4_5_vl_moe/modeling_ernie4_5_vl_moe.py", "interleaved", streams="hw_interleaved_t", default_section=(22, 22, 20)),
    "esm": ModelRule("esm/modeling_esm.py"),
    "esmc": ModelRule("esmc/modeling_esmc.py"),
    "eurobert": ModelRule("eurobert/modeling_eurobert.py"),
    "evolla": ModelRule("evolla/modeling_evolla.py"),
    "exaone4": ModelRule("exaone4/modeling_exaone4.py", rope_layers="sliding_or_no_window"),
    "exaone_moe": ModelRule("exaone_moe/modeling_exaone_moe.py", rope_layers="sliding_or_no_window"),
    "falcon": ModelRule("falcon/modeling_falcon.py"),
    "falcon_h1": ModelRule("falcon_h1/modeling_falcon_h1.py"),
    "flex_olmo": ModelRule("flex_olmo/modeling_flex_olmo.py"),
    "flint": ModelRule("flint/modeling_flint.py", rope_layers="sliding"),
    "gemma": ModelRule("gemma/modeling_gemma.py"),
    "gemma2": ModelRule("gemma2/modeling_gemma2.py"),
    "gemma3_text": ModelRule("gemma3/modeling_gemma3.py", local_theta_key="rope_local_base_freq"),
    "gemma3n_text": ModelRule("gemma3n/modeling_gemma3n.py", local_theta_key="rope_local_base_freq"),
    "gemma4_text": ModelRule("gemma4/modeling_gemma4.py", global_head_dim=True),
    "gemma4_unified_text": ModelRule("gemma4_unified/modeling_gemma4_unified.py", global_head_dim=True),
    "glm": ModelRule("glm/modeling_glm.py", "interleaved", whole_head=False),
    "glm4": ModelRule("glm4/modeling_glm4.py", "interleaved", whole_head=False),
    "glm4_moe": ModelRule("glm4_moe/modeling_glm4_moe.py", whole_head=False),
    "glm4_moe_lite": ModelRule("glm4_moe_lite/modeling_glm4_moe_lite.py", "interleaved", mla=True),
    "glm4v_moe_text": ModelRule("glm4v_moe/modeling_glm4v_moe.py", whole_head=False, streams="chunked", default_section=(8, 12, 12)),
    "glm4v_text": ModelRule("glm4v/modeling_glm4v.py", "interleaved", whole_head=False, streams="chunked", default_section=(8, 12, 12)),
    "glm_image_text": ModelRule("glm_image/modeling_glm_image.py", whole_head=False, streams="chunked", default_section=(8, 12, 12)),
    "glm_moe_dsa": ModelRule("glm_moe_dsa/modeling_glm_moe_dsa.py", "interleaved", mla=True, reads_rope_interleave=False, indexer="interleaved"),
    "glm_ocr_text": ModelRule("glm_ocr/modeling_glm_ocr.py", "interleaved", whole_head=False, streams="chunked", default_section=(8, 12, 12)),
    "glmasr_encoder": ModelRule("glmasr/modeling_glmasr.py", whole_head=False),
    "gpt_neox": ModelRule("gpt_neox/modeling_gpt_neox.py", whole_head=False),
    "gpt_neox_japanese": ModelRule("gpt_neox_japanese/modeling_gpt_neox_japanese.py", whole_head=False),
    "gpt_oss": ModelRule("gpt_oss/modeling_gpt_oss.py"),
    "gptj": ModelRule("gptj/modeling_gptj.py", "interleaved", layers_key="n_layer"),
    "gradium_phonon_tts": ModelRule("gradium_phonon_tts/modeling_gradium_phonon_tts.py"),
    "granite": ModelRule("granite/modeling_granite.py"),
    "granite4_vision_text": ModelRule("granite4_vision/modeling_granite4_vision.py"),
    "granite_docling_text": ModelRule("granite_docling/modeling_granite_docling.py"),
    "granite_swa": ModelRule("granite_swa/modeling_granite_swa.py"),
    "granitemoe": ModelRule("granitemoe/modeling_granitemoe.py"),
    "granitemoe_swa": ModelRule("granitemoe_swa/modeling_granitemoe_swa.py"),
    "granitemoehybrid": ModelRule("granitemoehybrid/modeling_granitemoehybrid.py"),
    "granitemoeshared": ModelRule("granitemoeshared/modeling_granitemoeshared.py"),
    "gte": ModelRule("gte/modeling_gte.py"),
    "helium": ModelRule("helium/modeling_helium.py", "interleaved"),
    "higgs_audio_v2": ModelRule("higgs_audio_v2/modeling_higgs_audio_v2.py"),
    "hrm_text": ModelRule("hrm_text/modeling_hrm_text.py"),
    "hunyuan_v1_dense": ModelRule("hunyuan_v1_dense/modeling_hunyuan_v1_dense.py", ntk_alpha=True),
    "hunyuan_v1_moe": ModelRule("hunyuan_v1_moe/modeling_hunyuan_v1_moe.py", ntk_alpha=True),
    "hunyuan_vl_text": ModelRule("hunyuan_vl/modeling_hunyuan_vl.py", streams="full_width", ntk_alpha=True),
    "hy_v3": ModelRule("hy_v3/modeling_hy_v3.py"),
    "hy_v4": ModelRule("hy_v4/modeling_hy_v4.py", mla=True, reads_rope_interleave=False, indexer="half", trailing=True),
    "hy_v4_vl_text": ModelRule("hy_v4_vl/modeling_hy_v4_vl.py", "interleaved", head_dim_key="qk_rope_head_dim", streams="thw_interleaved", default_section=(24, 20, 20)),
    "hyperclovax": ModelRule("hyperclovax/modeling_hyperclovax.py"),
    "idefics": ModelRule("idefics/modeling_idefics.py"),
    "jais2": ModelRule("jais2/modeling_jais2.py"),
    "jetmoe": ModelRule("jetmoe/modeling_jetmoe.py", head_dim_key="kv_channels"),
    "jina_embeddings_v3": ModelRule("jina_embeddings_v3/modeling_jina_embeddings_v3.py"),
    "kolibri1": ModelRule("kolibri1/modeling_kolibri1.py", rope_layers="sliding_or_no_window"),
    "kyutai_speech_to_text": ModelRule("kyutai_speech_to_text/modeling_kyutai_speech_to_text.py"),
    "laguna": ModelRule("laguna/modeling_laguna.py", whole_head=False, nested_top_keys=()),
    "lara_mini": ModelRule("lara_mini/modeling_lara_mini.py"),
    "lasr_encoder": ModelRule("lasr/modeling_lasr.py"),
    "lfm2": ModelRule("lfm2/modeling_lfm2.py"),
    "lfm2_moe": ModelRule("lfm2_moe/modeling_lfm2_moe.py"),
    "lfm3": ModelRule("lfm3/modeling_lfm3.py"),
    "llama": ModelRule("llama/modeling_llama.py"),
    "llama4_text": ModelRule("llama4/modeling_llama4.py", "interleaved", rope_layers="no_rope_layers"),
    "longcat_flash": ModelRule("longcat_flash/modeling_longcat_flash.py", "interleaved", mla=True, reads_rope_interleave=False, layers_key="num_layers"),
    "mellum": ModelRule("mellum/modeling_mellum.py"),
    "mimi": ModelRule("mimi/modeling_mimi.py"),
    "mimi_decoder": ModelRule("mimi/modeling_mimi.py"),
    "mimi_encoder": ModelRule("mimi/modeling_mimi.py"),
    "mimo_v2_flash": ModelRule("mimo_v2_flash/modeling_mimo_v2_flash.py", whole_head=False, partial_default=0.334, nested_top_keys=()),
    "minicpm3": ModelRule("minicpm3/modeling_minicpm3.py", mla=True, reads_rope_interleave=False),
    "minimax": ModelRule("minimax/modeling_minimax.py"),
    "minimax_m2": ModelRule("minimax_m2/modeling_minimax_m2.py", whole_head=False),
    "minimax_m3_vl_text": ModelRule("minimax_m3_vl/modeling_minimax_m3_vl.py", whole_head=False),
    "ministral": ModelRule("ministral/modeling_ministral.py"),
    "ministral3": ModelRule("ministral3/modeling_ministral3.py"),
    "mistral": ModelRule("mistral/modeling_mistral.py"),
    "mistral4": ModelRule("mistral4/modeling_mistral4.py", "interleaved", whole_head=False, mla=True),
    "mistral_large4_text": ModelRule("mistral_large4/modeling_mistral_large4.py", "interleaved", mla=True, reads_rope_interleave=False, indexer="interleaved", rope_layers="no_rope_layers"),
    "mixtral": ModelRule("mixtral/modeling_mixtral.py"),
    "mllama_text_model": ModelRule("mllama/modeling_mllama.py"),
    "modernbert": ModelRule("modernbert/modeling_modernbert.py", theta_key="global_rope_theta", local_theta_key="local_rope_theta", local_scaled=True),
    "modernbert-decoder": ModelRule("modernbert_decoder/modeling_modernbert_decoder.py", theta_key="global_rope_theta", local_theta_key="local_rope_theta", local_scaled=True),
    "molmo2_text": ModelRule("molmo2/modeling_molmo2.py", rope_layers="rope_scaling_layers"),
    "moonshine": ModelRule("moonshine/modeling_moonshine.py", "interleaved", whole_head=False, heads_key="decoder_num_attention_heads", layers_key="decoder_num_hidden_layers"),
    "moonshine_streaming": ModelRule("moonshine_streaming/modeling_moonshine_streaming.py", "interleaved", whole_head=False),
    "moshi": ModelRule("moshi/modeling_moshi.py"),
    "muse_glimmer_assistant": ModelRule("muse_glimmer_assistant/modeling_muse_glimmer_assistant.py"),
    "muse_glimmer_text": ModelRule("muse_glimmer/modeling_muse_glimmer.py"),
    "muse_spark_text": ModelRule("muse_spark/modeling_muse_spark.py"),
    "nanochat": ModelRule("nanochat/modeling_nanochat.py", reversed=True),
    "nemotron": ModelRule("nemotron/modeling_nemotron.py", whole_head=False),
    "nemotron3_5_transcribe_asr_audio": ModelRule("nemotron3_5_transcribe/modeling_nemotron3_5_transcribe.py", whole_head=False),
    "nemotron3_5_transcribe_word_timestamp": ModelRule("nemotron3_5_transcribe/modeling_nemotron3_5_transcribe.py", whole_head=False),
    "nemotron3_diarization_audio": ModelRule("nemotron3_diarization/modeling_nemotron3_diarization.py", whole_head=False),
    "neomme": ModelRule("neomme/modeling_neomme.py", whole_head=False, streams="row_col", nested_top_keys=("rope_theta",)),
    "neucodec": ModelRule("neucodec/modeling_neucodec.py"),
    "nomic_bert": ModelRule("nomic_bert/modeling_nomic_bert.py"),
    "olmo": ModelRule("olmo/modeling_olmo.py"),
    "olmo2": ModelRule("olmo2/modeling_olmo2.py"),
    "olmo3": ModelRule("olmo3/modeling_olmo3.py", nests_flat=True),
    "olmo_hybrid": ModelRule("olmo_hybrid/modeling_olmo_hybrid.py"),
    "olmoe": ModelRule("olmoe/modeling_olmoe.py"),
    "openai_privacy_filter": ModelRule("openai_privacy_filter/modeling_openai_privacy_filter.py", "interleaved"),
    "paddleocr_vl_text": ModelRule("paddleocr_vl/modeling_paddleocr_vl.py", streams="chunked", default_section=(16, 24, 24)),
    "persimmon": ModelRule("persimmon/modeling_persimmon.py", whole_head=False),
    "phi": ModelRule("phi/modeling_phi.py", whole_head=False),
    "phi3": ModelRule("phi3/modeling_phi3.py", whole_head=False),
    "phi4_multimodal": ModelRule("phi4_multimodal/modeling_phi4_multimodal.py", whole_head=False),
    "phimoe": ModelRule("phimoe/modeling_phimoe.py", mscales=True),
    "pocket_tts": ModelRule("pocket_tts/modeling_pocket_tts.py"),
    "qwen2": ModelRule("qwen2/modeling_qwen2.py"),
    "qwen2_5_omni_talker": ModelRule("qwen2_5_omni/modeling_qwen2_5_omni.py", streams="chunked", default_section=(16, 24, 24)),
    "qwen2_5_omni_text": ModelRule("qwen2_5_omni/modeling_qwen2_5_omni.py", streams="chunked", default_section=(16, 24, 24)),
    "qwen2_5_vl_text": ModelRule("qwen2_5_vl/modeling_qwen2_5_vl.py", streams="chunked", default_section=(16, 24, 24)),
    "qwen2_moe": ModelRule("qwen2_moe/modeling_qwen2_moe.py"),
    "qwen2_vl_text": ModelRule("qwen2_vl/modeling_qwen2_vl.py", streams="chunked", default_section=(16, 24, 24)),
    "qwen3": ModelRule("qwen3/modeling_qwen3.py"),
    "qwen3_5_moe_text": ModelRule("qwen3_5_moe/modeling_qwen3_5_moe.py", whole_head=False, streams="thw_interleaved", default_section=(11, 11, 10)),
    "qwen3_5_text": ModelRule("qwen3_5/modeling_qwen3_5.py", whole_head=False, streams="thw_interleaved", default_section=(11, 11, 10)),
    "qwen3_moe": ModelRule("qwen3_moe/modeling_qwen3_moe.py"),
    "qwen3_next": ModelRule("qwen3_next/modeling_qwen3_next.py", whole_head=False),
    "qwen3_omni_moe_talker_code_predictor": ModelRule("qwen3_omni_moe/modeling_qwen3_omni_moe.py"),
    "qwen3_omni_moe_talker_text": ModelRule("qwen3_omni_moe/modeling_qwen3_omni_moe.py", streams="thw_interleaved", default_section=(24, 20, 20)),
    "qwen3_omni_moe_text": ModelRule("qwen3_omni_moe/modeling_qwen3_omni_moe.py", streams="thw_interleaved", default_section=(24, 20, 20)),
    "qwen3_vl_moe_text": ModelRule("qwen3_vl_moe/modeling_qwen3_vl_moe.py", streams="thw_interleaved", default_section=(24, 20, 20)),
    "qwen3_vl_text": ModelRule("qwen3_vl/modeling_qwen3_vl.py", streams="thw_interleaved", default_section=(24, 20, 20)),
    "qwen4_exp_text": ModelRule("qwen4_exp/modeling_qwen4_exp.py", whole_head=False, streams="thw_interleaved", default_section=(11, 11, 10)),
    "recurrent_gemma": ModelRule("recurrent_gemma/modeling_recurrent_gemma.py", whole_head=False),
    "seed_oss": ModelRule("seed_oss/modeling_seed_oss.py"),
    "smollm3": ModelRule("smollm3/modeling_smollm3.py", rope_layers="no_rope_layers"),
    "solar_open": ModelRule("solar_open/modeling_solar_open.py", whole_head=False),
    "stablelm": ModelRule("stablelm/modeling_stablelm.py", whole_head=False),
    "starcoder2": ModelRule("starcoder2/modeling_starcoder2.py"),
    "step3p5": ModelRule("step3p7/modeling_step3p7.py", whole_head=False, per_layer_lists=True),
    "t5_gemma_module": ModelRule("t5gemma/modeling_t5gemma.py"),
    "t5gemma2_decoder": ModelRule("t5gemma2/modeling_t5gemma2.py"),
    "t5gemma2_text": ModelRule("t5gemma2/modeling_t5gemma2.py", local_theta_key="rope_local_base_freq"),
    "timesfm2_5": ModelRule("timesfm2_5/modeling_timesfm2_5.py"),
    "ultrabert": ModelRule("ultrabert/modeling_ultrabert.py", theta_list=True),
    "unlimited_ocr_text": ModelRule("unlimited_ocr/modeling_unlimited_ocr.py"),
    "vaultgemma": ModelRule("vaultgemma/modeling_vaultgemma.py"),
    "voxtral_realtime_encoder": ModelRule("voxtral_realtime/modeling_voxtral_realtime.py"),
    "voxtral_realtime_text": ModelRule("voxtral_realtime/modeling_voxtral_realtime.py"),
    "xcodec2": ModelRule("xcodec2/modeling_xcodec2.py"),
    "youtu": ModelRule("youtu/modeling_youtu.py", "interleaved", mla=True),
    "zamba2": ModelRule("zamba2/modeling_zamba2.py", head_dim_key="attention_head_dim"),
    "zaya": ModelRule("zaya/modeling_zaya.py", whole_head=False, nested_top_keys=()),
}


# Text model types whose text attention has no RoPE (only their vision tower rotates): what they use instead.
NO_ROPE: dict[str, str] = {
    "glm5_next_text": "glm5_next/modeling_glm5_next.py: MLA with qk_rope_head_dim = 0 beside linear attention",
    "inkling2_text": "inkling2/modeling_inkling2.py: a relative position bias and a log-position scaling",
    "moshi_depth": "moshi/modeling_moshi.py: its depth decoder's layers are built with use_rope=False",
}


# Model types whose attention rotates in a way no RotaryEmbedding states: why, and what gives it instead.
REFUSED_MODELS: dict[str, str] = {
    "qwen2_5_omni_dit": (
        "qwen2_5_omni/modeling_qwen2_5_omni.py: its DiTAttention rotates only the first attention head "
        "(q[:, :1], k[:, :1]; the other heads pass through), by the interleaved pairs (deinterleave_head_dim, "
        "then rotate_half: the same scores); RotaryEmbedding(head_dim, base=rope_theta, layout='interleaved')"
        ".apply_qk on the first head's q and k gives its attention"),
}


def ntk_alpha_base(params, theta: float, head_dim: int, where: str) -> float:
    """HunYuan's NTK-alpha base ``rope_theta * alpha ** (head_dim / (head_dim - 2))`` (ModelRule.ntk_alpha)."""
    alpha = params["alpha"]
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not alpha > 0:
        raise ValueError(f"{where}: rope_parameters['alpha'] must be a number > 0, got {alpha!r}")
    if head_dim <= 2:
        raise ValueError(f"{where}: its NTK-alpha RoPE needs head_dim > 2, got {head_dim}")
    return theta * float(alpha) ** (head_dim / (head_dim - 2))


def phimoe_scaling(params, scaling: dict, rope_type: str, where: str) -> dict:
    """PhiMoE's scaling (ModelRule.mscales): ``PhimoeRotaryEmbedding.forward`` calls ``rope_init_fn(config)``
    without the length (LongRoPE's short factors at every length) and scales cos/sin by ``long_mscale`` where
    ``max(positions) + 1 > original_max_position_embeddings``, else by ``short_mscale``."""
    mscales = [params.get(key) for key in ("short_mscale", "long_mscale")]
    if None in mscales:
        raise ValueError(f"{where}: rope_parameters has no 'short_mscale' / 'long_mscale', which PhiMoE's rotary "
                         f"module reads for a scaled RoPE (a KeyError in transformers)")
    if rope_type != "longrope":
        raise ValueError(f"{where}: PhiMoE's mscales with rope_type {rope_type!r}: posenc_fast reads them with "
                         f"'longrope' only")
    for key, value in zip(("short_mscale", "long_mscale"), mscales):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{where}: rope_parameters[{key!r}] must be a number, got {value!r}")
    short, long = map(float, mscales)
    if short != long:
        raise ValueError(f"{where}: rope_parameters['short_mscale'] {short!r} and ['long_mscale'] {long!r} differ: "
                         f"PhiMoE scales cos/sin by one or the other by the call's length, which posenc_fast does "
                         f"not; build the RotaryEmbedding with scaling={{..., 'attention_factor': ...}}")
    return {**scaling, "long_factor": scaling["short_factor"], "attention_factor": short}
