"""Vision towers' 2-D (axial) RoPE: one rule per ``model_type`` whose config's ``rope_type`` is ``"axial"``.

(and per model type of `NAMED_TOWERS`, whose configs say ``"default"``: Llama 4's vision tower, EfficientLoFTR,
DINOv3 and the towers that copy its rotary.)

A tower's rotary module (``compute_axial_rope_parameters`` and
``recomposition_frequencies``) and the rotation its attention calls say which
features pair, which axis each pair turns by, with which frequency; each rule
states that as ``RotaryEmbedding.axial``'s options, with positions always
``(h, w)`` (``(t, h, w)`` for three axes), whatever order the tower's own
``position_ids`` columns take.  ``tests/test_hf_towers.py`` runs each tower's
rotary module and rotation against ``from_hf_config(config)``; a tower with
a rule in neither table is refused, one in `REFUSED_TOWERS` with its reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from ._hf_config import _DEFAULT_THETA, _int, _real

__all__ = ["TowerRule", "TOWER_RULES", "REFUSED_TOWERS", "NAMED_TOWERS", "tower_kwargs"]


class TowerRule(NamedTuple):
    """How one tower's rotary module shares the head's pairs out among the axes (``RotaryEmbedding.axial``)."""

    source: str
    """Its rotary module and the rotation its attention calls (under ``transformers/models/``)."""
    layout: str = "half"
    """``"half"`` (``rotate_half`` on ``cat(freqs, freqs)``) or ``"interleaved"`` (``rotate_pairwise`` on
    ``repeat_interleave(freqs, 2)``)."""
    axis_order: tuple[int, ...] = (0, 1)
    """The axis of each block of pairs, of positions (h, w): ``(1, 0)`` where the w pairs come first."""
    pairs: str = "blocks"
    """``"blocks"``: one axis's pairs after the other's; ``"alternating"``: pair by pair."""
    frequencies: str = "shared"
    """``"shared"``: each axis the frequencies of a ``head_dim / n_axes`` RoPE; ``"split"``: the head's own,
    dealt to the axes in turn."""
    n_axes: int = 2
    partial: bool = False
    """Each axis rotates ``2 * ((head_dim // n_axes) // 2)`` features, the rest pass through (MiniMax-M3-VL)."""
    head_dim: str = "heads"
    """``"heads"``: ``head_dim``, else ``embed_dim`` or ``hidden_size`` over the heads; ``"memory"``: SAM 2
    video's memory attention, ``memory_attention_hidden_size // (memory_attention_downsample_rate *
    memory_attention_num_attention_heads)``; ``"hidden"``: ``hidden_size`` (EfficientLoFTR rotates q and k before
    it splits them into heads)."""
    default_theta: float = _DEFAULT_THETA
    """``rope_theta`` where the config gives none: its configuration class's ``default_theta``."""


# Qwen2-VL's (the defaults): base ** (-2i / (head_dim / 2)) for the h pairs, then the same for the w pairs, in
# halves (cat(freq_hw, freq_hw)), rotated by apply_rotary_pos_emb_vision's rotate_half.
AXIAL_TOWERS = frozenset((
    "cohere_compass_vision", "dots3_note_vision_encoder", "ernie4_5_vl_moe_vision", "exaone4_5_vision",
    "glm4v_moe_vision", "glm4v_vision", "glm5_next_vision", "glm_ocr_vision", "lfm3_vl_vision", "mlcd",
    "mlcd_vision_model", "muse_glimmer_vision", "muse_spark_vision", "paddleocr_vl_vision",
    "qwen2_5_omni_vision_encoder", "qwen2_5_vl_vision", "qwen2_vl_vision", "qwen3_5_moe_vision", "qwen3_5_vision",
    "qwen3_omni_moe_vision_encoder", "qwen3_vl_moe_vision", "qwen3_vl_vision", "qwen4_exp_vision",
    "video_llama_3_vision"))
_QWEN2_VL = TowerRule("Qwen2-VL's (qwen2_vl/modeling_qwen2_vl.py), in its own module")

# SAM 2's memory attention and SAM 3's ViT: cat(freq[:, 0], freq[:, 1]).repeat_interleave(2), rotate_pairwise;
# their position_ids put w in column 0 (precompute_positions: stack([wpos_ids, hpos_ids])), so the w pairs lead.
# Which keys rotate (SAM 2's object pointers pass, its memory frames repeat the positions) is the caller's choice
# of rows and positions, as SAM 3's ViT's scaled positions (window_size / grid) are.
_SAM_MEMORY = dict(layout="interleaved", axis_order=(1, 0), head_dim="memory")

TOWER_RULES: dict[str, TowerRule] = {
    **{model_type: _QWEN2_VL for model_type in AXIAL_TOWERS},
    "lfm3_vl_vision": _QWEN2_VL._replace(default_theta=1_000_000.0),
    # inv_freq of the whole head, cat(inv_freq[0::2], inv_freq[1::2]): h takes the even, w the odd frequencies
    "pixtral": TowerRule("pixtral/modeling_pixtral.py", frequencies="split"),
    # freq.transpose(1, 2).flip(-1).flatten(1): w, h, w, h, ... pair by pair, one frequency per (w, h) turn
    "kimi_k25_vision": TowerRule("kimi_k25/modeling_kimi_k25.py", axis_order=(1, 0), pairs="alternating"),
    # cat([freq_w, freq_h]).repeat_interleave(2), rotate_pairwise
    "inkling2_vision": TowerRule("inkling2/modeling_inkling2.py", layout="interleaved", axis_order=(1, 0)),
    # freq.flip(1).flatten(1): the w pairs, then the h pairs, in halves
    "step3p5_vision": TowerRule("step3p7/modeling_step3p7.py", axis_order=(1, 0)),
    # t, h, w blocks of 2 * ((head_dim // 3) // 2) features each, in halves of their 3 blocks; the rest passes
    "minimax_m3_vl_vision": TowerRule("minimax_m3_vl/modeling_minimax_m3_vl.py", axis_order=(0, 1, 2), n_axes=3,
                                      partial=True),
    "sam3_vit_model": TowerRule("sam3/modeling_sam3.py", layout="interleaved", axis_order=(1, 0)),
    "sam2_video": TowerRule("sam2_video/modeling_sam2_video.py", **_SAM_MEMORY),
    "sam3_tracker_video": TowerRule("sam3_tracker_video/modeling_sam3_tracker_video.py", **_SAM_MEMORY),
    "edgetam_video": TowerRule("edgetam_video/modeling_edgetam_video.py", **_SAM_MEMORY),
    # Llama4VisionRotaryEmbedding: freqs_x (x = column) then freqs_y (y = row) of base ** (-2i / (head_dim / 2)),
    # repeat_interleave(2) then [..., ::2], as complex pairs (x[2j], x[2j + 1]): interleaved, the w pairs first.
    # Its positions are 1-based, (row + 1, col + 1); its class token (the last) has 0 angles: it passes at (0, 0)
    "llama4_vision_model": TowerRule("llama4/modeling_llama4.py", layout="interleaved", axis_order=(1, 0)),
    # compute_embeddings: emb[..., 0::2] = (row + 1) * inv_freq, emb[..., 1::2] = (col + 1) * inv_freq, then
    # repeat_interleave(2), rotated by Cohere's (interleaved) rotate_half on the whole hidden_size, before the heads
    # split; inv_freq = base ** (-2i / int(head_dim * partial_rotary_factor)), hidden_size // 4 of them
    "efficientloftr": TowerRule("efficientloftr/modeling_efficientloftr.py", layout="interleaved",
                                pairs="alternating", head_dim="hidden"),
}

_DINOV3 = (
    "{name}'s rotary ({source}) turns the k-th pair of each axis by 2 * pi * c * base ** (-4k / head_dim), c "
    "the patch centre normalised to [-1, 1] by the image's patch grid (c = 2 * (i + 0.5) / n - 1 for patch i of "
    "n along that axis, n = the image's height or width // patch_size; in training also shifted, jittered and "
    "rescaled at random): in patch coordinates i its frequencies are (4 * pi / n) * base ** (-4k / head_dim), "
    "which depend on the image's grid, not on the config, and are not base ** (-2k / d) as RotaryEmbedding.axial's "
    "are, so from_hf_config cannot build it for (h, w) patch coordinates. It is RotaryEmbedding.axial(head_dim, "
    "base=rope_theta) (half layout, the h pairs then the w pairs) at float positions 2 * pi * c (h, w), on the "
    "patch tokens only (the class and register tokens before them pass unrotated)")

REFUSED_TOWERS: dict[str, str] = {
    "dinov3_vit": _DINOV3.format(name="DINOv3", source="DINOv3ViTRopePositionEmbedding, "
                                                       "dinov3_vit/modeling_dinov3_vit.py"),
    "eomt_dinov3": _DINOV3.format(name="EoMT-DINOv3", source="EomtDinov3RotaryEmbedding, "
                                                             "eomt_dinov3/modeling_eomt_dinov3.py"),
    "sapiens2": _DINOV3.format(name="Sapiens2", source="Sapiens2RopePositionEmbedding, "
                                                       "sapiens2/modeling_sapiens2.py"),
    "gemma4_vision": (
        "Gemma 4's vision attention (apply_multidimensional_rope, gemma4/modeling_gemma4.py) splits the head into "
        "one block of head_dim // 2 features per axis and rotates each block in its own half layout (h pairs "
        "(i, i + head_dim // 4), w pairs (head_dim // 2 + i, 3 * head_dim // 4 + i)): one RotaryEmbedding pairs "
        "its rotated features in one layout across them all (half: i with i + rotary_dim // 2), so it cannot "
        "express this. It is two 1-D RoPEs: RotaryEmbedding(head_dim, rotary_dim=head_dim // 2, layout='half', "
        "base=rope_theta) by the h positions, then the same with rotary_start=head_dim // 2 by the w positions"),
}

# towers whose config's rope_type is "default" (their rotary modules ignore it or allow no other): routed here
# by model_type, not by rope_type
NAMED_TOWERS = frozenset(("llama4_vision_model", "efficientloftr", "dinov3_vit", "eomt_dinov3", "sapiens2"))


def _loftr_check(cfg: dict, params, dim: int, heads: int, where: str) -> None:
    # EfficientLoFTRRotaryEmbedding: ROPE_INIT_FUNCTIONS[rope_type] for a scaled RoPE; its hidden_size // 4 angles
    # of each axis take inv_freq's int(head_dim * partial_rotary_factor) / 2 (broadcast)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"{where}: EfficientLoFTR with rope_type {rope_type!r}: RotaryEmbedding.axial has no "
                         f"scaled frequencies (its rotary module then takes ROPE_INIT_FUNCTIONS[{rope_type!r}])")
    factor = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 4.0))
    width = int((cfg.get("head_dim") or dim // heads) * _real(factor, "partial_rotary_factor", where))
    if width != dim // 2 or dim % 4:
        raise ValueError(f"{where}: EfficientLoFTR's frequencies base ** (-2i / {width}) (int(head_dim * "
                         f"partial_rotary_factor)) for its {dim // 4} pairs per axis: RotaryEmbedding.axial's are "
                         f"base ** (-2i / (hidden_size / 2)); it reads only int(head_dim * partial_rotary_factor) "
                         f"== hidden_size / 2 (hidden_size a multiple of 4), got {width} and {dim}")


def tower_kwargs(cfg: dict, model_type, params, where: str) -> dict:
    """``RotaryEmbedding.axial`` keyword arguments (``dim``, ``n_axes``, ...) of a tower's config, by its rule."""
    if model_type in REFUSED_TOWERS:
        raise ValueError(f"{where}: {REFUSED_TOWERS[model_type]}")
    rule = TOWER_RULES.get(model_type)
    if rule is None:
        raise ValueError(f"{where}: a vision tower's 2-D (axial) RoPE whose pairs and frequencies posenc_fast has "
                         f"not read from its rotary module (the {len(TOWER_RULES)} towers of "
                         f"_hf_towers.TOWER_RULES are checked against theirs); build it with RotaryEmbedding.axial's "
                         f"options (axis_order, pairs, frequencies, layout) as its rotary module shares the pairs out")
    if model_type in NAMED_TOWERS:  # their configs' rope_theta may still be top-level (transformers 4)
        params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
        if not isinstance(params, Mapping):
            raise ValueError(f"{where}: 'rope_scaling' / 'rope_parameters' must be an object, got {params!r}")
        params = {"rope_theta": cfg.get("rope_theta", rule.default_theta), **params}
    heads_key = "num_attention_heads" if cfg.get("num_attention_heads") else "num_heads"  # 0 or None: the other
    heads = None if rule.head_dim == "memory" else _int(cfg, heads_key, where)
    if rule.head_dim == "hidden":
        dim = _int(cfg, "hidden_size", where)
        _loftr_check(cfg, params, dim, heads, where)
    elif rule.head_dim == "memory":
        dim = _int(cfg, "memory_attention_hidden_size", where) // (
            _int(cfg, "memory_attention_downsample_rate", where)
            * _int(cfg, "memory_attention_num_attention_heads", where))
    else:
        # compute_axial_rope_parameters: head_dim, else embed_dim (Qwen2-VL) or hidden_size over the heads
        dim = (_int(cfg, "head_dim", where) if cfg.get("head_dim")
               else _int(cfg, "embed_dim" if "embed_dim" in cfg else "hidden_size", where) // heads)
    kwargs = dict(dim=dim, base=_real(params.get("rope_theta", rule.default_theta), "rope_theta", where),
                  n_axes=rule.n_axes, layout=rule.layout, axis_order=rule.axis_order, pairs=rule.pairs,
                  frequencies=rule.frequencies)
    if rule.partial:
        kwargs["rotary_dim"] = rule.n_axes * 2 * ((dim // rule.n_axes) // 2)
    return kwargs
