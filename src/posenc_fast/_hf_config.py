"""Read a Hugging Face ``config.json`` into ``RotaryEmbedding`` keyword arguments.

The rules follow transformers 5's configuration classes and rotary modules for
each ``model_type`` (``RotaryEmbeddingConfigMixin`` plus the per-model
overrides), and accept both the transformers-4 form (``rope_theta`` +
``rope_scaling``) and the transformers-5 form (``rope_parameters``).  A key the
config leaves out takes its configuration class's default (``_hf_defaults``,
generated from transformers' classes), or is asked for where the class has
none or derives it.
"""

from __future__ import annotations

import functools
import json
import numbers
import os
import re
from collections.abc import Mapping

from ._frequencies import ROPE_TYPES
from ._hf_layers import (canonical_config, class_default, class_keeps_head_dim, layer_config, layer_of_index,
                         own_indexer, rope_parameters)
from ._hf_functions import ROTARY_FUNCTIONS
from ._hf_models import MODEL_RULES, NO_ROPE, REFUSED_MODELS, ModelRule, ntk_alpha_base, pair_streams, phimoe_scaling
from ._hf_probe import probed_rule

__all__ = ["rotary_kwargs_from_hf_config"]

_DEFAULT_THETA = 10000.0  # RotaryEmbeddingConfigMixin.default_theta

# model types that read rotary_pct and rotary_emb_base for partial_rotary_factor and rope_theta
_ROTARY_PCT = frozenset({"gpt_neox", "gpt_neox_japanese"})

_SCALED_WITH_ORIGINAL = ("llama3", "yarn", "longrope")


def _load(config) -> tuple[dict, str]:
    """Return (config dict, description for messages)."""
    if isinstance(config, Mapping):
        return dict(config), "config"
    if callable(getattr(config, "to_dict", None)):  # a transformers PretrainedConfig
        data = config.to_dict()
        if isinstance(data, Mapping):
            return dict(data), "config"
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except OSError as error:
            raise ValueError(f"cannot read config file {path!r}: {error}") from error
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"config file {path!r} is not valid JSON: {error}") from error
        if not isinstance(data, dict):
            raise ValueError(f"config file {path!r} must hold a JSON object, got {type(data).__name__}")
        return data, f"config file {path!r}"
    raise TypeError(f"config must be a dict, a transformers config or a path to a config.json, "
                    f"got {type(config).__name__}")


def _int(cfg: Mapping, key: str, where: str, default=None) -> int:
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise ValueError(f"{where} is missing {key!r}")
        return default
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{where}: {key!r} must be an int >= 1, got {value!r}")
    return int(value)


def _real(value, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{where}: {key!r} must be a number, got {value!r}")
    return float(value)


def _head_dim(cfg: Mapping, model_type: str, rule: ModelRule, where: str) -> int:
    if model_type == "zamba2" and cfg.get("attention_head_dim") is None:
        # Zamba2Config.__post_init__: attention_head_dim = 2 * hidden_size // num_attention_heads
        return 2 * _int(cfg, "hidden_size", where) // _int(cfg, "num_attention_heads", where)
    if model_type in ("gptj", "codegen"):
        # GPTJConfig / CodeGenConfig.attribute_map: hidden_size -> n_embd, num_attention_heads -> n_head
        hidden = _int(cfg, "n_embd", where) if "n_embd" in cfg else _int(cfg, "hidden_size", where)
        heads = _int(cfg, "n_head", where) if "n_head" in cfg else _int(cfg, "num_attention_heads", where)
        return hidden // heads
    if model_type == "falcon":  # FalconConfig.head_dim is a property: transformers refuses the key
        derived = _int(cfg, rule.hidden_key, where) // _int(cfg, rule.heads_key, where)
        if cfg.get("head_dim") not in (None, derived):
            raise ValueError(f"{where}: head_dim = {cfg['head_dim']!r}, but a Falcon config's head_dim is "
                             f"hidden_size // num_attention_heads = {derived}: remove the key")
        return derived
    if cfg.get(rule.head_dim_key) is not None:
        return _int(cfg, rule.head_dim_key, where)
    # `getattr(config, "head_dim", None) or hidden_size // num_attention_heads` in every rotary module
    return _int(cfg, rule.hidden_key, where) // _int(cfg, rule.heads_key, where)


def _theta(cfg: Mapping, params: Mapping, model_type: str, rule: ModelRule, where: str) -> float:
    if params.get("rope_theta") is not None:
        return _real(params["rope_theta"], "rope_theta", where)
    # GPTNeoX(Japanese)Config.convert_rope_params_to_dict reads rotary_emb_base; a top-level rope_theta is ignored
    key = "rotary_emb_base" if model_type in _ROTARY_PCT else rule.theta_key
    if key in cfg:
        value = cfg[key]
    else:  # its class's default_theta (or rope_theta field), else RotaryEmbeddingConfigMixin's
        value = class_default("THETA", "rope_theta", model_type, None, where)
        value = _DEFAULT_THETA if value is None else value
    if value is None:
        raise ValueError(f"{where}: {key!r} is null")
    return _real(value, key, where)


def _partial_factor(cfg: Mapping, params: Mapping, model_type: str, per_layer_type: bool, where: str) -> float:
    if params.get("partial_rotary_factor") is not None:
        value, key = params["partial_rotary_factor"], "rope_parameters['partial_rotary_factor']"
    else:
        # GPTNeoXConfig: rope_parameters.setdefault("partial_rotary_factor", kwargs.pop("rotary_pct", 0.25)); a
        # layer type's entry took what its class fills in from the top level already (layer_type_params)
        key = "rotary_pct" if model_type in _ROTARY_PCT else "partial_rotary_factor"
        value = None if per_layer_type else cfg.get(key)
        if value is None:  # its class's (a field's default, __post_init__'s setdefault), else 1.0
            value = class_default("PARTIAL", "partial_rotary_factor", model_type, None, where)
            value = 1.0 if value is None else value
    value = _real(value, key, where)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{where}: {key} must be in (0, 1], got {value!r}")
    return value


# Phi3Config / Phi4MultimodalConfig.convert_rope_params_to_dict rename the legacy "su" and "yarn" to "longrope"
_LEGACY_LONGROPE = ("phi3", "phi4_multimodal")


def _rope_type(params: Mapping, model_type: str, where: str) -> str:
    rope_type = params.get("rope_type", params.get("type", "default"))
    if not isinstance(rope_type, str):
        raise ValueError(f"{where}: rope_type must be a string, got {rope_type!r}")
    if model_type in _LEGACY_LONGROPE and rope_type in ("su", "yarn"):
        return "longrope"
    if rope_type in ("su", "ntk"):  # transformers has no such rope_type for this model (a KeyError there)
        raise ValueError(f"{where}: rope_type {rope_type!r} is not one transformers reads for model_type "
                         f"{model_type!r}" + (" ('su' is Phi-3's legacy name of 'longrope')" if rope_type == "su"
                                              else " ('ntk' is posenc_fast's own static NTK scaling)"))
    return rope_type


def _scaling(cfg: Mapping, params: Mapping, rope_type: str, model_type: str, per_layer_type: bool,
             where: str) -> dict | None:
    if rope_type == "default":
        return None
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"{where}: rope_type {rope_type!r} is not supported; expected one of {sorted(ROPE_TYPES)}"
        )
    # transformers ignores (with a warning) keys the method does not use
    scaling = {key: params[key] for key in ROPE_TYPES[rope_type] if params.get(key) is not None}
    scaling["rope_type"] = rope_type

    def max_positions() -> int:
        return _int(cfg, "max_position_embeddings", where)  # (its class's default filled in: canonical_config)

    if rope_type == "dynamic":
        # _compute_dynamic_ntk_parameters uses max_position_embeddings as the original length, whatever else is set
        scaling["original_max_position_embeddings"] = max_positions()
    elif rope_type in _SCALED_WITH_ORIGINAL:
        # standardize_rope_params: a top-level original_max_position_embeddings wins over the one in one dict for
        # all layers (Phi3Config always has one: its class default, 4096, is filled in), not over a layer type's
        # own; else max_position_embeddings
        if not per_layer_type and cfg.get("original_max_position_embeddings") is not None:
            scaling["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
        elif "original_max_position_embeddings" not in scaling:
            scaling["original_max_position_embeddings"] = max_positions()
        if rope_type == "yarn" and "factor" not in params:  # transformers reads rope_parameters["factor"]
            raise ValueError(f"{where}: rope_parameters has no 'factor' (rope_type 'yarn'), which transformers "
                             f"requires; set it, or set it to None for max_position_embeddings / "
                             f"original_max_position_embeddings")
        if rope_type == "yarn" and per_layer_type:
            # _compute_yarn_parameters reads truncate from the top of rope_parameters, which then holds the layer
            # types' dicts: a layer type's own truncate is not read (True)
            scaling.pop("truncate", None)
        if rope_type in ("yarn", "longrope") and "factor" not in scaling:
            # _compute_yarn_parameters / _compute_longrope_parameters: factor None = max_pos / original
            scaling["factor"] = max_positions() / _real(
                scaling["original_max_position_embeddings"], "original_max_position_embeddings", where
            )
    return scaling


def _arithmetic_as_value_error(function):
    # Numbers beyond the float range (an int like 10**400) or a zero that a
    # rule divides by (original_max_position_embeddings = 0.0) are bad values.
    @functools.wraps(function)
    def checked(config, **kwargs):
        try:
            return function(config, **kwargs)
        except (OverflowError, ZeroDivisionError) as error:
            raise ValueError(f"config: a value is out of range ({error})") from None

    return checked


# where composite configs (vision-language, speech, omni) keep their text model's config, in that order
_TEXT_CONFIG_KEYS = ("thinker_config", "text_config", "decoder_config", "decoder", "generator", "text_encoder")
_MROPE_KEYS = ("mrope_section", "mrope_interleaved")


_OTHER_MODALITY = re.compile(r"vision|audio|video|image|codec|speech")


def _text_part(cfg: dict, where: str) -> tuple[dict, str]:
    # a top level without its own attention heads holds no text model (VoxtralRealtime keeps a hidden_size)
    while "num_attention_heads" not in cfg or "hidden_size" not in cfg:
        key = next((key for key in _TEXT_CONFIG_KEYS if isinstance(cfg.get(key), Mapping)), None)
        if key is None:
            break
        _one_rope_among_parts(cfg, where)
        cfg, where = dict(cfg[key]), f"{where}[{key!r}]"
    return cfg, where


def _one_rope_among_parts(cfg: dict, where: str) -> None:
    """Refuse a config of several text transformers whose RoPEs differ (BLT's patcher, local encoder, global
    transformer and local decoder): which one is rotated is the caller's to say."""
    ropes = {}
    for key, part in cfg.items():
        if isinstance(part, Mapping) and "num_attention_heads" in part and not _OTHER_MODALITY.search(key):
            try:
                ropes[key] = rotary_kwargs_from_hf_config(part)
            except ValueError:  # a part without a RoPE posenc_fast reads: it cannot be the one meant
                continue
    if len({repr(rope) for rope in ropes.values()}) > 1:
        raise ValueError(f"{where} holds {len(ropes)} transformers whose RoPEs differ ({', '.join(ropes)}): pass "
                         f"the config of the one whose attention is rotated, e.g. config[{next(iter(ropes))!r}]")


def _rule(model_type, layout, where: str) -> ModelRule:
    # transformers 4's flat composite configs (Qwen2-VL's config.json) hold the text model's keys at the top
    rule = MODEL_RULES.get(model_type) or MODEL_RULES.get(f"{model_type}_text")
    if layout is not None and layout not in ("half", "interleaved"):
        raise ValueError(f"layout must be 'half', 'interleaved' or None, got {layout!r}")
    no_rope = NO_ROPE.get(model_type) or NO_ROPE.get(f"{model_type}_text")
    if no_rope is not None:
        raise ValueError(f"{where}: this model's text attention has no RoPE ({no_rope}); only its vision tower "
                         f"rotates")
    if model_type in REFUSED_MODELS:
        raise ValueError(f"{where}: model_type {model_type!r} is refused: {REFUSED_MODELS[model_type]}")
    if rule is None:
        if layout is not None:
            return ModelRule(source="", layout=layout, whole_head=False)  # the config's partial_rotary_factor holds
        try:
            rule = probed_rule(model_type) if isinstance(model_type, str) else None
        except ValueError as error:
            raise ValueError(f"{where}: no rule for model_type {model_type!r}, and probing the installed "
                             f"transformers' code found no rule: {error}") from None
        if rule is None:
            raise ValueError(
                f"{where}: no rule for model_type {model_type!r}, and its pair layout cannot be read from the "
                f"config (nor probed: transformers does not know it, or is not installed); pass layout='half' "
                f"(transformers' rotate_half) or layout='interleaved' (x[..., 0::2]) as its attention rotates")
        return rule
    if layout is not None and layout != rule.layout and not rule.mla:
        raise ValueError(f"{where}: layout={layout!r} contradicts model_type {model_type!r}, which rotates "
                         f"{rule.layout!r} pairs ({rule.source})")
    return rule


ATTENTION_KINDS = ("main", "indexer")


@_arithmetic_as_value_error
def rotary_kwargs_from_hf_config(config, *, layer_type: str | None = None, layout: str | None = None,
                                 attention: str = "main", layer: int | None = None) -> dict:
    """Keyword arguments for ``RotaryEmbedding`` from a Hugging Face model config.

    Parameters
    ----------
    config : dict or str or os.PathLike or transformers config
        A parsed ``config.json``, the path to one, or a transformers
        configuration object (read through its ``to_dict()``).  Both the
        transformers-4 form (``rope_theta`` + ``rope_scaling``) and the
        transformers-5 form (``rope_parameters``) are read.  A composite
        config (vision-language, speech) gives its text model's RoPE
        (``text_config``).
    layer_type : str, optional
        For configs with one RoPE per layer type (Gemma 3, ModernBERT, ...):
        which one, e.g. ``"sliding_attention"``.  Required when the layer
        types' RoPEs differ.
    layout : {"half", "interleaved"}, optional
        The pair layout, for a ``model_type`` without a rule in
        ``_hf_models.MODEL_RULES``.  Without it such a model type's rule is
        probed in the installed transformers' own code (`_hf_probe`: its
        rotary module and rotation function run on basis vectors, the rule
        found checked against their frequencies), else refused.
    attention : {"main", "indexer"}, optional
        Which attention's RoPE: ``"main"`` (default), the model's attention;
        ``"indexer"``, the DSA indexer of DeepSeek-V3.2-style models (its
        ``index_head_dim`` features, the leading ``qk_rope_head_dim`` of
        them rotating, in its own pair layout; HY-V4's and DeepSeek-V4's: the
        trailing ones, DeepSeek-V4's by its ``"compress"`` RoPE).  Refused for a model without an
        indexer posenc_fast reads, and for a layer without one of its own.
    layer : int, optional
        The RoPE of decoder layer `layer` (0-based, below the config's
        ``num_hidden_layers``, or the length of its ``layer_types``), for a
        server that builds one per layer: ``layer_type=layer_types[layer]``
        where the config has ``layer_types`` (a ``layer_type`` given too must
        agree), that layer's own ``per_layer_config`` entry; refused for a
        layer without RoPE (``no_rope_layers[layer] == 0``: SmolLM3, Llama 4,
        Mistral-Large-4); Molmo2's layers outside ``rope_scaling_layers``
        give its unscaled RoPE.  The same as without it for a model whose
        layers all rotate alike.  Without it: the RoPE of the layers that
        have one.  Refused for a vision tower's config (one RoPE for all its
        layers).

    Returns
    -------
    dict
        ``dim`` (int, the last axis of the q/k the model rotates),
        ``rotary_dim`` (int, how many of those rotate), ``rotary_start``
        where they are not the leading ones (DeepSeek-V4), ``base`` (float),
        ``layout`` (``"half"`` or ``"interleaved"``) and ``scaling`` (None or
        a self-contained dict for ``resolve_rope_scaling``: the method's keys
        only, ``original_max_position_embeddings`` and ``factor`` filled in
        as transformers derives them); for multimodal RoPE also
        ``pair_streams`` (a list: each pair's position stream, from the
        config's ``mrope_section`` or the model's default; two lists, of the
        pairs' first and second features, where those differ); ``reverse=True``
        for a model that rotates by ``-theta`` (NanoChat).

    Raises
    ------
    TypeError
        If ``config`` is neither a mapping, a config object nor a path, or
        ``layer`` is not an int (nor None).
    ValueError
        If the file cannot be read or is not a JSON object, a needed key is
        missing (named in the message), a value is invalid, the RoPE type is
        unsupported, the model's text attention has no RoPE (GLM-5-next,
        Inkling2), the model type has no rule and no ``layout`` was given,
        a composite config holds several text transformers whose RoPEs
        differ (BLT: pass the part's config),
        ``attention="indexer"`` names an indexer the model lacks,
        the model rotates in a way ``RotaryEmbedding`` does not (an unread
        assignment of pairs to position streams; Gemma 4's vision tower), a
        vision tower has no rule, the config holds differing RoPEs per
        layer type and no ``layer_type`` was given, or differing RoPEs per
        layer (Molmo2's ``rope_scaling_layers``) and no ``layer``; or
        ``layer`` is out of range, disagrees with ``layer_type``, names a
        layer without RoPE, is given for a vision tower, or the config
        lacks ``num_hidden_layers`` and ``layer_types`` to bound it.

    Notes
    -----
    - A key the config leaves out is read as its ``model_type``'s
      configuration class fills it in (``_hf_defaults``, generated from
      transformers 5.24's classes): ``rope_theta`` (SmolLM3's 2e6, Llama 4's
      5e5, ...; per layer type for Gemma 3 and others), ``head_dim``,
      ``partial_rotary_factor``, ``max_position_embeddings`` (a scaled RoPE's
      original length), ``qk_rope_head_dim``, the whole ``rope_parameters``
      where a class builds its own (Apertus' llama3, Gemma 4's per layer
      type), ``mrope_section``.  Where the class fills in nothing (Gemma 4's
      per-layer-type ``rope_theta``), or derives it from other keys
      (Ministral-3's default ``rope_parameters``), the config must give it:
      refused, naming the key.  A model type transformers 5.24 lacks gets
      ``RotaryEmbeddingConfigMixin``'s defaults (``rope_theta`` 10000).
    - Phi-3 and Phi-4-multimodal rename ``"su"`` (and ``"yarn"``) to
      ``"longrope"`` (other models refuse ``"su"``, as transformers does,
      and posenc_fast's own ``"ntk"``), and Phi-3's
      top-level ``original_max_position_embeddings`` (class default 4096)
      wins. transformers 5.24 itself rejects a ``"su"`` dict that lacks
      ``original_max_position_embeddings``; this reads it as transformers 4
      did.
    - GPT-NeoX reads ``rotary_emb_base`` and ``rotary_pct`` (default 0.25),
      GPT-NeoX-Japanese the same (default 1.0).
    - GPT-J rotates ``rotary_dim`` (default 64) features in interleaved
      pairs with a fixed base of 10000 and no scaling.
    - Multi-head latent attention (DeepSeek-V3 and others) rotates the
      ``qk_rope_head_dim`` features, interleaved unless ``rope_interleave``
      is false (for the families that read it); those features are the
      whole array it rotates, so ``dim == rotary_dim``.  DeepSeek-V3.2's
      and AXK2's indexer rotates in the half layout, their MLA attention
      interleaved pairs: ``attention=`` chooses.
    - DeepSeek-V4 rotates the last ``int(head_dim * partial_rotary_factor)``
      features of each head (``rotary_start = head_dim - rotary_dim``) in
      interleaved pairs; its ``rope_parameters`` are named ``"main"``
      (sliding-window layers) and ``"compress"`` (compressed layers):
      ``layer_type`` takes either name or a layer type.  Its attention
      output is rotated back by the same RoPE: ``apply(..., inverse=True)``.
    - A vision tower's config (``rope_type`` ``"axial"``, e.g. Qwen2-VL's
      ``vision_config``) gives ``dim``, ``base``, ``n_axes`` and the other
      arguments of ``RotaryEmbedding.axial`` (``_hf_towers.TOWER_RULES``:
      Pixtral's split frequencies, Kimi-K2.5's alternating pairs, SAM's
      and Inkling2's interleaved pairs, w before h, MiniMax-M3-VL's three
      axes), whose positions are each patch's (h, w) (t, h, w), from the
      image grid, not the config (SAM 3's ViT scales them; Llama 4's and
      EfficientLoFTR's are 1-based; their configs say ``"default"``, read by
      ``model_type``).  Gemma 4's tower (a half layout per axis), DINOv3's
      (patch centres normalised to [-1, 1]) and towers without a rule are
      refused.
    - A heterogeneous config's ``per_layer_config`` (Gemma 4's full
      attention layers have their own ``head_dim``) is read for
      `layer_type` (for `layer`: that layer's own entry); ``layer_type`` or
      ``layer`` is then required where layer types differ.
    - ``no_rope_layers`` (SmolLM3, Llama 4, Mistral-Large-4) is derived as
      their configuration classes do when the config has none:
      ``int((i + 1) % no_rope_layer_interval != 0)`` (interval 4 by
      default).  Without ``layer`` a ``layer_type`` whose layers are all
      NoPE is refused (Llama 4's ``"full_attention"``).  Cohere2 and Flint
      rotate in their sliding-window layers only, EXAONE 4 too where
      ``sliding_window`` is set, Cohere2-MoE also in a full layer of a dense
      MLP: their other layers are refused as NoPE.
    - Gemma 3, OLMo 3 and others nest flat keys per layer type: a flat
      ``rope_scaling`` is the full-attention layers', a flat
      ``rope_parameters`` (which their classes read as no layer type's) is
      refused.  HunYuan's ``"dynamic"`` RoPE with ``alpha`` is its fixed
      one of base ``rope_theta * alpha ** (head_dim / (head_dim - 2))``;
      PhiMoE's LongRoPE takes its short factors at every length and
      ``short_mscale`` (refused where ``long_mscale`` differs).
    - Models that rotate the whole head (Llama and most others) ignore
      ``partial_rotary_factor`` for default RoPE; with a scaled RoPE and
      ``partial_rotary_factor < 1`` transformers computes fewer frequencies
      than they rotate, which is rejected here.
    - ``"proportional"`` RoPE (Gemma 4) rotates the whole head with zero
      frequencies past ``partial_rotary_factor``.
    - An odd partial width ``w = int(head_dim * partial_rotary_factor)``
      (GLM-4.5's default, 21) rotates ``w + 1`` features with transformers'
      frequencies ``base ** (-2i / w)``: ``base`` is then
      ``rope_theta ** ((w + 1) / w)``.  Refused with a scaled RoPE.
    """
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {list(ATTENTION_KINDS)}, got {attention!r}")
    if layer_type is not None and not isinstance(layer_type, str):
        raise TypeError(f"layer_type must be a str or None, got {type(layer_type).__name__}")
    if layer is not None and (isinstance(layer, bool) or not isinstance(layer, numbers.Integral)):
        raise TypeError(f"layer must be an int or None, got {type(layer).__name__}")
    cfg, where = _load(config)
    cfg, where = _text_part(cfg, where)
    model_type = cfg.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ValueError(f"{where}: 'model_type' must be a string, got {model_type!r}")
    where = f"{where} (model_type {model_type!r})"
    params = cfg.get("rope_parameters")
    from ._hf_towers import NAMED_TOWERS, tower_kwargs  # (it reads the config with this module's helpers)

    if isinstance(params, Mapping) and params.get("rope_type") == "axial" or model_type in NAMED_TOWERS:
        if layer is not None:
            raise ValueError(f"{where}: layer= picks a text model's decoder layer; a vision tower's config gives the "
                             f"one RoPE all its layers rotate by: leave layer= out")
        return tower_kwargs(cfg, model_type, params, where)
    layer = None if layer is None else int(layer)
    return kwargs_by_rule(cfg, where, _rule(model_type, layout, where), layer_type, attention, layer)


def kwargs_by_rule(cfg: dict, where: str, rule: ModelRule, layer_type, attention: str, layer=None) -> dict:
    """`rotary_kwargs_from_hf_config` of a text model's config read by `rule` (_hf_probe checks a probed rule so)."""
    model_type = cfg.get("model_type")
    if attention == "indexer" and rule.indexer is None:
        raise ValueError(f"{where}: attention='indexer', but posenc_fast reads no indexer of model_type "
                         f"{model_type!r}; its main attention is attention='main'")
    cfg = canonical_config(cfg, rule, where)
    declared = cfg.get("layer_types") if isinstance(cfg.get("layer_types"), (list, tuple)) else ()
    own_rope = attention == "indexer" and rule.indexer_rope is not None
    if own_rope and layer_type not in (None, rule.indexer_rope):
        raise ValueError(f"{where}: attention='indexer' rotates by the {rule.indexer_rope!r} RoPE in every layer, "
                         f"not layer_type={layer_type!r}")
    cfg, layer_type = layer_of_index(cfg, rule, layer, None if own_rope else layer_type, where)
    has_indexer = rule.indexer_layers
    if attention == "indexer" and layer_type not in (None, has_indexer) and has_indexer in declared:
        raise ValueError(f"{where}: attention='indexer', but only the {has_indexer!r} layers have an indexer, "
                         f"not layer_type={layer_type!r}" + ("" if layer is None else f" (layer {layer})"))
    layer_type = rule.indexer_rope if own_rope else layer_type  # (layer= then only checked)
    if attention == "indexer" and layer is not None:
        own_indexer(cfg, layer, where)
    cfg = layer_config(cfg, rule, layer_type, where, layer)

    if model_type in ("gptj", "codegen"):
        # GPTJRotaryEmbedding / CodeGenRotaryEmbedding: create_sinusoidal_positions(n_positions,
        # rotary_dim or hidden_size), base 10000
        head_dim = _head_dim(cfg, model_type, rule, where)
        rotary_dim = cfg.get("rotary_dim")  # (its class default, 64, filled in)
        rotary_dim = head_dim if rotary_dim is None else _int({"rotary_dim": rotary_dim}, "rotary_dim", where)
        return dict(dim=head_dim, rotary_dim=rotary_dim, base=_DEFAULT_THETA, layout="interleaved", scaling=None)

    params, per_layer_type = rope_parameters(cfg, rule, layer_type, where)
    if rule.streams is None:
        streams = [key for key in _MROPE_KEYS if params.get(key) or cfg.get(key)]
        if streams or params.get("rope_type", params.get("type")) == "mrope":
            raise ValueError(f"{where}: the config has multimodal RoPE keys ({streams or 'rope_type mrope'}) but "
                             f"posenc_fast has no stream rule for this model type; build the RotaryEmbedding with "
                             f"mrope_section= / pair_streams= as its rotary module assigns pairs to streams")
    elif params.get("rope_type", params.get("type")) == "mrope":
        params = {**params, "rope_type": "default"}  # transformers 5 reads transformers 4's "mrope" as default
    base = _theta(cfg, params, model_type, rule, where)
    rope_type = _rope_type(params, model_type, where)
    if rule.ntk_alpha and rope_type == "dynamic" and params.get("alpha"):
        base, rope_type = ntk_alpha_base(params, base, _head_dim(cfg, model_type, rule, where), where), "default"
    scaling = _scaling(cfg, params, rope_type, model_type, per_layer_type, where)
    if rule.mscales and scaling is not None:
        scaling = phimoe_scaling(params, scaling, rope_type, where)
    default = rule.partial_default is not None and params.get("partial_rotary_factor") is None and scaling is None
    partial = rule.partial_default if default else _partial_factor(cfg, params, model_type, per_layer_type, where)

    start = 0
    if rule.mla:
        # the attention rotates q_rot / k_rot, the qk_rope_head_dim features, only
        dim = rotary_dim = _int(cfg, "qk_rope_head_dim", where)
        kept = class_keeps_head_dim(model_type) and cfg.get("head_dim") is not None
        head_dim = _int(cfg, "head_dim", where) if kept else None
        # its rotary module builds cos/sin of head_dim features (Mistral 4's: int(head_dim * partial))
        if kept and rotary_dim not in (head_dim, int(head_dim * partial)):
            raise ValueError(f"{where}: head_dim = {head_dim!r} gives its rotary module cos/sin of other than the "
                             f"qk_rope_head_dim = {rotary_dim} features its attention rotates (transformers' model "
                             f"fails on this config): give a head_dim that fits qk_rope_head_dim, or remove it")
        interleave = cfg.get("rope_interleave") if rule.reads_rope_interleave else None
        layout = rule.layout if interleave is None else "interleaved" if interleave else "half"
        if attention == "indexer":
            # the indexer splits its index_head_dim features into [qk_rope_head_dim rotated, the rest passed]
            # (HY-V4's: [the rest passed, qk_rope_head_dim rotated])
            dim, layout = _int(cfg, "index_head_dim", where), rule.indexer
            start = dim - rotary_dim if rule.trailing else 0
    else:
        dim = _head_dim(cfg, model_type, rule, where)
        layout = rule.layout
        rotary_dim = dim if rule.whole_head or rope_type == "proportional" else int(dim * partial)
        if attention == "indexer":  # DeepSeek-V4's: the head's RoPE on its index_head_dim features
            dim = _int(cfg, "index_head_dim", where)
        start = dim - rotary_dim if rule.trailing else 0
    if rope_type == "proportional":
        scaling["partial_rotary_factor"] = partial
    elif rule.whole_head and not rule.mla and partial < 1.0 and scaling is not None:
        raise ValueError(
            f"{where}: partial_rotary_factor={partial!r} with rope_type {rope_type!r}: transformers computes "
            f"int(head_dim * partial_rotary_factor) frequencies but this model rotates all {dim} head features"
        )
    if rotary_dim % 2 and rotary_dim < dim and scaling is None and _rotates_the_cache_width(rule):
        # compute_default_rope_parameters gives the ceil(w / 2) frequencies base ** (-2i / w) of an odd width w,
        # and its apply_rotary_pos_emb rotates cos.shape[-1] = w + 1 features (GLM-4.5: w = 21, 11 pairs):
        # base ** (-2i / w) is (base ** ((w + 1) / w)) ** (-2i / (w + 1))
        base, rotary_dim = base ** ((rotary_dim + 1) / rotary_dim), rotary_dim + 1
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(
            f"{where}: the rotated width must be even and >= 2, got rotary_dim={rotary_dim} "
            f"(head_dim={dim}, partial_rotary_factor={partial!r})"
        )
    kwargs = dict(dim=dim, rotary_dim=rotary_dim, base=base, layout=layout, scaling=scaling)
    if start:
        kwargs["rotary_start"] = start
    if rule.reversed:
        kwargs["reverse"] = True  # its rotate_half is cat(x2, -x1): it rotates by -theta
    if rule.streams is not None:
        section = params.get("mrope_section")
        if section is None:  # its class's (HY-V4-VL's setdefault), else its rotary module's
            section = class_default("SECTION", "mrope_section", model_type, None, where)
        kwargs["pair_streams"] = pair_streams(rule, section, rotary_dim // 2, where)
    return kwargs


def _rotates_the_cache_width(rule: ModelRule) -> bool:
    """The model's apply_rotary_pos_emb rotates as many leading features as its cos/sin cache is wide."""
    function = ROTARY_FUNCTIONS.get(rule.source.split("/")[0])
    return function is not None and function.partial and function.cache == "halves"
