"""Per-layer configs: one layer's (``layer=``: its layer type, NoPE layers, Molmo2's unscaled layers), a layer
type's (a heterogeneous config's ``per_layer_config``; its rope parameters as its class nests them, with the
``rope_theta`` / ``partial_rotary_factor`` they lack: `rope_parameters`), and a config as its configuration class
stores it: the class's defaults of the keys it leaves out (``_hf_defaults``), and the checkpoint forms classes turn
into one (Gemma 4's ``global_head_dim``, dots3's ``swa_*`` keys, Step-3.7's per-layer ``rope_theta`` and
``partial_rotary_factors``, UltraBERT's list of thetas)."""

from __future__ import annotations

import copy
from collections.abc import Mapping

from . import _hf_defaults
from ._hf_models import ModelRule

__all__ = ["canonical_config", "class_default", "class_layer_types", "class_rope", "layer_config", "layer_of_index",
           "own_indexer", "layer_type_params"]


def _defaults_of(model_type) -> str | None:
    """The row of _hf_defaults a config of `model_type` takes (a transformers-4 flat composite config, Qwen2-VL's:
    its text model's), as `_rule` finds its rule; None where the table has none."""
    if not isinstance(model_type, str):
        return None
    return next((name for name in (model_type, f"{model_type}_text") if name in _hf_defaults.THETA
                 or name in _hf_defaults.FIELDS), None)


def _with_class_fields(cfg: dict, model_type) -> dict:
    """`cfg` with its configuration class's defaults of the top-level keys it leaves out (_hf_defaults.FIELDS), and
    the keys it stores under other names (_hf_defaults.ALIASES: DBRX's max_seq_len) under both names, as the class
    stores them: a key given sets its field (GLM-4-MoE-Lite's head_dim its qk_rope_head_dim), a class default
    only a field the config leaves out (BailingHybrid's model_max_length)."""
    row = _defaults_of(model_type)
    fields = _hf_defaults.FIELDS.get(row)
    given, cfg = cfg, {**fields, **cfg} if fields else dict(cfg)
    for key, field in _hf_defaults.ALIASES.get(row, {}).items():
        if key in given or (key in cfg and field not in given):
            cfg[field] = cfg[key]
        elif field in cfg:
            cfg[key] = cfg[field]
    return cfg


def class_default(table: str, key: str, model_type, layer_type, where: str):
    """The configuration class's `key` (_hf_defaults.THETA or PARTIAL) for `layer_type`'s rope parameters (None: a
    config with one RoPE), or None where the table has no row for the model type."""
    row = _defaults_of(model_type)
    if table in _hf_defaults.DERIVED.get(row, ()):
        raise ValueError(f"{where}: the config gives no {key!r}, which its configuration class derives from its other "
                         f"keys: give it")
    values = getattr(_hf_defaults, table)
    if row not in values:
        return None
    value = values[row]
    if isinstance(value, Mapping):
        if layer_type in value:
            value = value[layer_type]
        elif layer_type is None and len(set(value.values())) == 1:
            value = next(iter(value.values()))
        else:
            raise ValueError(f"{where}: the config gives no {key!r}, which its configuration class sets per layer "
                             f"type ({value}): give it")
    if value is None:  # (THETA) transformers' rotary module fails on the key its class does not fill in
        raise ValueError(f"{where}: the config gives no {key!r}" + ("" if layer_type is None else
                         f" for its {layer_type!r} layers") + ", and its configuration class fills in none: give it")
    return value


def class_rope(model_type, where: str) -> dict | None:
    """The rope_parameters the configuration class builds for a config without any (_hf_defaults.ROPE), or None;
    refused where the class derives them from other keys."""
    row = _defaults_of(model_type)
    if "ROPE" in _hf_defaults.DERIVED.get(row, ()):
        raise ValueError(f"{where}: the config gives neither 'rope_parameters' nor 'rope_scaling', which its "
                         f"configuration class derives from its other keys: give them")
    rope = _hf_defaults.ROPE.get(row)
    return copy.deepcopy(rope) if rope else None


def class_keeps_head_dim(model_type) -> bool:
    """True where an MLA model's configuration class keeps a ``head_dim`` the config gives apart from its
    ``qk_rope_head_dim`` (_hf_defaults.MLA_HEAD_DIM), which its rotary module then reads."""
    return _hf_defaults.MLA_HEAD_DIM.get(_defaults_of(model_type)) == "kept"


def class_layer_types(model_type) -> set:
    """The layer types whose RoPE (or None: NoPE) the configuration class's rope_parameters name (Zaya's
    "hybrid")."""
    rope = _hf_defaults.ROPE.get(_defaults_of(model_type)) or {}
    return {key for key, value in rope.items() if value is None or isinstance(value, Mapping)}


def layer_type_params(cfg: Mapping, rule: ModelRule, layer_type: str, given: Mapping, where: str) -> dict:
    """`given`, `layer_type`'s rope parameters, with the rope_theta / partial_rotary_factor it lacks: the config's
    top-level keys' (standardize_rope_params), else its configuration class's (_hf_defaults)."""
    filled = {**_top_level(cfg, rule, layer_type), **given}
    for table, key in (("THETA", "rope_theta"), ("PARTIAL", "partial_rotary_factor")):
        if filled.get(key) is None:
            value = class_default(table, key, cfg.get("model_type"), layer_type, where)
            if value is not None:
                filled[key] = value
    return filled


def _top_level(cfg: Mapping, rule: ModelRule, layer_type=None) -> dict:
    # Gemma 3 / ModernBERT: the sliding-window layers' rope_theta is the flat `local_theta_key` (OLMo 3: none)
    sliding = layer_type == "sliding_attention" and rule.per_type_class
    top = {"rope_theta": cfg.get(rule.local_theta_key if sliding else rule.theta_key),
           "partial_rotary_factor": cfg.get("partial_rotary_factor")}
    return {key: value for key, value in top.items() if value is not None and key in rule.nested_top_keys}


def canonical_config(cfg: dict, rule: ModelRule, where: str) -> dict:
    """`cfg` as its configuration class stores it: its class's defaults of the top-level keys it leaves out filled
    in, and the checkpoint's keys that class rewrites rewritten."""
    cfg = _with_class_fields(cfg, cfg.get("model_type"))
    if rule.theta_list and isinstance(cfg.get("rope_theta"), list) and cfg.get("rope_parameters") is None:
        # UltraBERT's __post_init__: {kind: theta for kind, theta in zip(layer_types, rope_theta)}
        if not isinstance(cfg.get("layer_types"), (list, tuple)):
            raise ValueError(f"{where}: a list rope_theta is one per layer, read by 'layer_types', which the config "
                             f"does not give (its configuration class derives them): give them")
        cfg = {**cfg, "rope_parameters": {kind: {"rope_type": "default", "rope_theta": theta}
                                          for kind, theta in zip(cfg["layer_types"], cfg["rope_theta"])}}
        del cfg["rope_theta"]
    if rule.swa_aliases and "per_layer_config" not in cfg:
        return _dots3_config(cfg)
    if rule.per_layer_lists:
        return _step3p5_config(cfg)
    if rule.rope_of_layer:
        return _deepseek_v4_config(cfg, rule)
    return cfg


def _deepseek_v4_config(cfg: dict, rule: ModelRule) -> dict:
    # DeepseekV4Config.__post_init__: a checkpoint's flat RoPE keys become the two named RoPEs, "main" (rope_theta,
    # unscaled) and "compress" (compress_rope_theta, the checkpoint's scaling; YaRN with attention_factor 1);
    # partial_rotary_factor defaults to qk_rope_head_dim / head_dim, else 64 / 512
    names = sorted(set(rule.rope_of_layer.values()))
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(params, Mapping) or all(isinstance(params.get(name), Mapping) for name in names):
        return cfg  # already named (as transformers saves it), or refused later
    partial = cfg.get("partial_rotary_factor")
    if partial is None:
        rope_dim, head_dim = cfg.get("qk_rope_head_dim"), cfg.get("head_dim", 512)
        partial = rope_dim / head_dim if isinstance(rope_dim, int) and isinstance(head_dim, int) else 64 / 512
    scaled = {key: value for key, value in params.items() if key not in names}
    if "type" in scaled:  # transformers 4's key for the method
        scaled.setdefault("rope_type", scaled.pop("type"))
    main = {"rope_type": "default", "rope_theta": cfg.get("rope_theta", 10000.0), "partial_rotary_factor": partial}
    compress = {"rope_type": "default", **scaled, "rope_theta": cfg.get("compress_rope_theta", 160000.0),
                "partial_rotary_factor": partial}
    if compress["rope_type"] == "yarn":
        compress.setdefault("attention_factor", 1.0)
    cfg = {key: value for key, value in cfg.items() if key not in ("rope_scaling", "rope_theta")}
    return {**cfg, "rope_parameters": {"main": main, "compress": compress}}


def _step3p5_config(cfg: dict) -> dict:
    # Step3p7TextConfig.__post_init__: a checkpoint's rope_theta (a number or one per layer) and
    # partial_rotary_factors (one per layer) give each layer type its RoPE, read at its first layer;
    # rope_scaling applies to the full-attention layers only
    params = cfg.get("rope_parameters") or {}
    layer_types = cfg.get("layer_types")
    if layer_types is None and isinstance(cfg.get("num_hidden_layers"), int):
        layer_types = ["full_attention"] * cfg["num_hidden_layers"]
    if (not isinstance(layer_types, list) or not all(isinstance(name, str) for name in layer_types)
            or all(isinstance(params.get(name), Mapping) for name in layer_types)):
        return cfg  # already one dict per layer type (as transformers saves it), or refused later
    theta, partials = cfg.get("rope_theta", 10000.0), cfg.get("partial_rotary_factors")
    per_type = {}
    for name in set(layer_types):
        index = layer_types.index(name)
        value = theta[index] if isinstance(theta, list) and index < len(theta) else theta
        per_type[name] = {"rope_type": "default", "rope_theta": value}
        if partials:
            if not isinstance(partials, list) or index >= len(partials):
                raise ValueError(f"config (model_type {cfg.get('model_type')!r}): 'partial_rotary_factors' must be "
                                 f"a list with one factor per layer, got {partials!r}")
            per_type[name]["partial_rotary_factor"] = partials[index]
    if isinstance(cfg.get("rope_scaling"), Mapping) and "full_attention" in per_type:
        per_type["full_attention"].update(cfg["rope_scaling"])
    cfg = {key: value for key, value in cfg.items() if key not in ("rope_theta", "rope_scaling")}
    return {**cfg, "layer_types": layer_types, "rope_parameters": per_type}


def _dots3_config(cfg: dict) -> dict:
    # Dots3NoteTextConfig.__post_init__ / convert_rope_params_to_dict: the released checkpoint's swa_* keys are
    # the sliding layers' config, swa_rope_theta (default 50000) their rope_theta
    cfg = dict(cfg)
    layer_types = cfg.get("layer_types")
    use_dsa = cfg.get("use_dsa", True)
    if layer_types is None and isinstance(cfg.get("num_hidden_layers", 46), int):
        full = "full_attention" if use_dsa is False else "indexed_attention"
        sliding = cfg.get("use_sliding_window", True)
        layer_types = [full if not sliding or i < 2 or i % 4 == 1 else "sliding_attention"
                       for i in range(cfg.get("num_hidden_layers", 46))]
    if isinstance(layer_types, (list, tuple)) and use_dsa is not None:
        old, new = ("full_attention", "indexed_attention") if use_dsa else ("indexed_attention", "full_attention")
        layer_types = [new if name == old else name for name in layer_types]
    if not isinstance(layer_types, list) or not all(isinstance(name, str) for name in layer_types):
        return cfg  # layer_config refuses what is not a list of layer type names
    cfg["layer_types"] = layer_types

    def swa(name, default):
        return cfg[f"swa_{name}"] if f"swa_{name}" in cfg else default

    head_dim, nope = swa("head_dim", 256), swa("qk_nope_head_dim", 192)
    qk_rope = swa("qk_rope_head_dim", head_dim - nope if isinstance(head_dim, int) and isinstance(nope, int)
                  else None)
    cfg["per_layer_config"] = {index: {"head_dim": head_dim, "qk_rope_head_dim": qk_rope}
                               for index, name in enumerate(layer_types) if name == "sliding_attention"}
    if not (cfg.get("rope_scaling") or cfg.get("rope_parameters")):
        theta = cfg.get("rope_theta", 80_000_000.0)
        cfg["rope_parameters"] = {name: {"rope_type": "default", "rope_theta": swa("rope_theta", 50_000.0)
                                         if name == "sliding_attention" else theta} for name in set(layer_types)}
    return cfg


def layer_of_index(cfg: dict, rule: ModelRule, layer, layer_type, where: str) -> tuple[dict, str | None]:
    """`cfg` and `layer_type` of layer `layer` (an int, checked in range), or of the layers with a RoPE (None).

    ``layer=i`` is ``layer_type=layer_types[i]`` where the config has ``layer_types`` (refused where the two
    disagree); `rule.rope_layers` refuses a NoPE layer and reads Molmo2's unscaled layers.
    """
    declared = cfg.get("layer_types")
    if declared is not None and (not isinstance(declared, (list, tuple))
                                 or not all(isinstance(name, str) for name in declared)):
        declared = None  # refused later, where a layer type is read
    if layer is not None:
        count, key = (len(declared), "layer_types") if declared else (cfg.get(rule.layers_key), rule.layers_key)
        if count is None:
            raise ValueError(f"{where}: layer= needs the config's {key!r} (or 'layer_types'): how many layers it has")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"{where}: {key!r} must be an int >= 1, got {count!r}")
        if not 0 <= layer < count:
            raise ValueError(f"{where}: layer={layer} is out of range: 0 <= layer < {count} ({key!r})")
        if declared:
            own = declared[layer]
            if layer_type not in (None, own, (rule.rope_of_layer or {}).get(own)):
                raise ValueError(f"{where}: layer={layer} is a {own!r} layer (layer_types[{layer}]), not "
                                 f"layer_type={layer_type!r}")
            layer_type = own
    if rule.rope_layers == "no_rope_layers":
        _no_rope_layers(cfg, rule, layer, layer_type, declared, where)
    elif rule.rope_layers == "rope_scaling_layers":
        cfg = _rope_scaling_layers(cfg, rule, layer, where)
    elif rule.rope_layers is not None:
        _sliding_layers(cfg, rule, layer, layer_type, where)
    return cfg, layer_type


def own_indexer(cfg: Mapping, layer: int, where: str) -> None:
    """Refuses ``attention="indexer"`` for layer `layer` where it has no indexer of its own.

    GLM-MoE-DSA / Mistral-Large-4: ``indexer_types[i] == "shared"`` reuses the previous full layer's
    selection; without the list, their configuration classes derive it from ``index_topk_pattern``
    (``"F"``/``"S"`` per layer) or from ``index_topk_freq`` and ``index_skip_topk_offset`` (default 1, 2).
    """
    kinds = cfg.get("indexer_types")
    if kinds is None and cfg.get("index_topk_pattern") is not None:
        pattern = cfg["index_topk_pattern"]
        if isinstance(pattern, str) and set(pattern) - {"F", "S"}:
            raise ValueError(f"{where}: 'index_topk_pattern' must be a string of 'F' and 'S', got {pattern!r}")
        kinds = [{"F": "full", "S": "shared"}[c] for c in pattern] if isinstance(pattern, str) else pattern
    elif kinds is None and cfg.get("index_topk_freq") is not None:
        freq, offset = cfg["index_topk_freq"], cfg.get("index_skip_topk_offset", 2)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (freq, offset)):
            raise ValueError(f"{where}: 'index_topk_freq' and 'index_skip_topk_offset' must be ints, got "
                             f"{freq!r} and {offset!r}")
        kinds = ["full" if max(i - offset + 1, 0) % max(freq, 1) == 0 else "shared" for i in range(layer + 1)]
    if kinds is not None and not (isinstance(kinds, (list, tuple)) and len(kinds) > layer):
        raise ValueError(f"{where}: 'indexer_types' (or 'index_topk_pattern') must list each layer, got {kinds!r}")
    if kinds is not None and kinds[layer] == "shared":
        raise ValueError(f"{where}: attention='indexer', but layer {layer} has no indexer of its own "
                         f"(indexer_types[{layer}] == 'shared': it reuses the previous full layer's selection)")


def _index_list(cfg: Mapping, key: str, where: str) -> list | None:
    value = cfg.get(key)
    if value is not None and (not isinstance(value, (list, tuple)) or not all(
            isinstance(entry, int) for entry in value)):
        raise ValueError(f"{where}: {key!r} must be a list of ints, got {value!r}")
    return None if value is None else list(value)


def _no_rope_layers(cfg: Mapping, rule: ModelRule, layer, layer_type, declared, where: str) -> None:
    # SmolLM3 / Llama 4 / Mistral-Large-4 attention: `self.use_rope = config.no_rope_layers[layer_idx]`
    flags, derived = _index_list(cfg, "no_rope_layers", where), ""
    count = cfg.get(rule.layers_key, len(declared or ()))
    if not flags:  # their configuration classes derive it (Llama 4's an empty list too; the others fail on one)
        interval = cfg.get("no_rope_layer_interval", 4)
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"{where}: 'no_rope_layer_interval' must be an int >= 1, got {interval!r}")
        if isinstance(count, bool) or not isinstance(count, int):
            return  # without layer=, no layer count to derive them from: the RoPE of the layers with one
        flags = [int((i + 1) % interval != 0) for i in range(count)]
        derived = f" (derived from no_rope_layer_interval={interval})"
    if layer is not None:
        if layer >= len(flags):
            raise ValueError(f"{where}: 'no_rope_layers' has {len(flags)} entries, none for layer {layer}")
        if not flags[layer]:
            raise ValueError(f"{where}: layer {layer} has no RoPE: no_rope_layers[{layer}] == 0{derived}; its "
                             f"attention skips the rotation")
    elif layer_type is not None and layer_type in (declared or ()):
        if not any(flag for flag, name in zip(flags, declared) if name == layer_type):
            raise ValueError(f"{where}: the {layer_type!r} layers have no RoPE: no_rope_layers is 0 at each{derived}")
    elif flags and not any(flags):
        raise ValueError(f"{where}: no layer has a RoPE: no_rope_layers is 0 at each{derived}")


def _sliding_layers(cfg: Mapping, rule: ModelRule, layer, layer_type, where: str) -> None:
    # Cohere2 / EXAONE 4 attention: the sliding-window layers rotate, the others are NoPE (ModelRule.rope_layers);
    # a config without sliding_window or prefix_dense_sliding_window_pattern has its class's: a window, and 1
    # (tests/test_hf_model_quirks.py)
    window = cfg.get("sliding_window", "its class's")
    if rule.rope_layers == "sliding_or_no_window" and window is None:
        return  # every layer rotates
    if layer is not None and layer_type is None:
        raise ValueError(f"{where}: layer= needs the config's 'layer_types': only its sliding-window layers rotate")
    if layer_type in (None, "sliding_attention") and window is not None:
        return  # (without layer= or layer_type=: the RoPE of the layers with one)
    if rule.rope_layers == "sliding_or_dense" and cfg.get("prefix_dense_sliding_window_pattern", 1) == 1:
        # Cohere2-MoE's force_rope: mlp_layer_types[i] == "dense" (its class derives the list otherwise)
        kinds = cfg.get("mlp_layer_types")
        if layer is None or not isinstance(kinds, (list, tuple)) or len(kinds) <= layer:
            raise ValueError(f"{where}: its layers without a sliding window rotate only where mlp_layer_types[i] is "
                             f"'dense' (force_rope): pass layer=, with the config's 'mlp_layer_types'")
        if kinds[layer] == "dense":
            return
    reason = "its attention rotates in sliding-window layers only" + (
        ", and sliding_window is None" if window is None else
        " where sliding_window is set" if rule.rope_layers == "sliding_or_no_window" else "")
    if layer_type is None:
        raise ValueError(f"{where}: no layer has a RoPE: {reason}")
    what = f"layer {layer} (a {layer_type!r} layer)" if layer is not None else f"the {layer_type!r} layers"
    raise ValueError(f"{where}: {what} has no RoPE: {reason}")


def _rope_scaling_layers(cfg: dict, rule: ModelRule, layer, where: str) -> dict:
    # Molmo2TextModel: rope_types[i] = "scaled" if i in rope_scaling_layers else "unscaled", the unscaled one
    # Molmo2RotaryEmbedding(config, scaled=False): rope_type "default", the same rope_theta
    scaled = _index_list(cfg, "rope_scaling_layers", where)
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    rope_type = params.get("rope_type", params.get("type", "default")) if isinstance(params, Mapping) else None
    if scaled is None or rope_type in (None, "default"):
        return cfg  # every layer scaled (its default), or nothing to scale
    if layer is None:
        count = cfg.get(rule.layers_key)
        if isinstance(count, bool) or not isinstance(count, int):
            raise ValueError(f"{where}: 'rope_scaling_layers' needs the config's {rule.layers_key!r} to say "
                             f"which layers are unscaled")
        unscaled = sorted(set(range(count)) - set(scaled))
        if unscaled:
            raise ValueError(f"{where}: the layers in 'rope_scaling_layers' rotate by the scaled {rope_type!r} "
                             f"RoPE, layers {unscaled[:8]}{'...' if len(unscaled) > 8 else ''} by an unscaled "
                             f"one of the same rope_theta; pass layer= to choose one")
        return cfg
    if layer in scaled:
        return cfg
    unscaled = {"rope_type": "default", "rope_theta": params.get("rope_theta")}
    cfg = {key: value for key, value in cfg.items() if key != "rope_scaling"}
    return {**cfg, "rope_parameters": {key: value for key, value in unscaled.items() if value is not None}}


# the keys a RoPE is read from (per_layer_config overrides of others, a sliding window, do not matter here)
_ROPE_KEYS = frozenset({"head_dim", "kv_channels", "attention_head_dim", "hidden_size", "d_model", "n_embd",
                        "num_attention_heads", "n_heads", "n_head", "decoder_num_attention_heads",
                        "qk_rope_head_dim", "index_head_dim", "rope_interleave", "partial_rotary_factor",
                        "rotary_dim", "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings",
                        "original_max_position_embeddings", "mrope_section", "mrope_interleaved"})


def layer_config(cfg: Mapping, rule: ModelRule, layer_type, where: str, layer=None) -> dict:
    """The config of `layer_type`'s layers (of layer `layer`, given): `per_layer_config`'s overrides applied."""
    overrides = cfg.get("per_layer_config")
    if rule.global_head_dim and "per_layer_config" not in cfg:
        # Gemma4TextConfig.__post_init__: per_layer_config = {full-attention layer: {"head_dim": global_head_dim}}
        global_head_dim = cfg["global_head_dim"] if "global_head_dim" in cfg else 512
        if layer_type == "full_attention":
            return {**cfg, "head_dim": global_head_dim}
        if layer_type is None and global_head_dim != cfg.get("head_dim"):
            raise ValueError(f"{where}: the full-attention layers have head_dim global_head_dim={global_head_dim}, "
                             f"the others head_dim={cfg.get('head_dim')}; pass layer_type= (or layer=) to choose one")
    if not overrides:
        return dict(cfg)
    declared = cfg.get("layer_types")
    if (not isinstance(overrides, Mapping) or not isinstance(declared, (list, tuple))
            or not all(isinstance(name, str) for name in declared)):
        raise ValueError(f"{where}: 'per_layer_config' must be an object of per-layer overrides beside a "
                         f"'layer_types' list of strings")
    try:
        by_index = {int(index): value for index, value in overrides.items()}
    except (TypeError, ValueError):
        raise ValueError(f"{where}: the keys of 'per_layer_config' must be layer indices") from None
    if any(not isinstance(value, Mapping) for value in by_index.values()):
        raise ValueError(f"{where}: each 'per_layer_config' entry must be an object")
    by_index = {index: {key: value[key] for key in value if key in _ROPE_KEYS} for index, value in by_index.items()}
    if layer is not None:
        return {**cfg, **by_index.get(layer, {})}  # that layer's own overrides
    per_type: dict = {}
    for index, name in enumerate(declared):
        found = per_type.setdefault(name, by_index.get(index, {}))
        if found != by_index.get(index, {}):
            # transformers' per_layer_config[layer_type] refuses the same
            raise ValueError(f"{where}: the layers of type {name!r} differ in 'per_layer_config' (layer {index}); "
                             f"posenc_fast reads one config per layer type")
    if layer_type is None:
        if len({repr(sorted(value.items())) for value in per_type.values()}) > 1:
            raise ValueError(f"{where}: 'per_layer_config' gives the layer types {sorted(per_type)} different "
                             f"configs (head sizes); pass layer_type= (or layer=) to choose one")
        return {**cfg, **next(iter(per_type.values()), {})}
    if layer_type not in per_type:
        raise ValueError(f"{where}: layer_type={layer_type!r} is not a layer type of this config; "
                         f"expected one of {sorted(per_type)}")
    return {**cfg, **per_type[layer_type]}


_TOP_KEYS = ("rope_theta", "partial_rotary_factor")  # what standardize_rope_params fills in from the top level


def _per_type_scaling(given: Mapping, scaling, rule: ModelRule, where: str) -> Mapping:
    """A class of one RoPE per layer type given rope_scaling beside per-layer-type rope_parameters: its
    convert_rope_params_to_dict updates the full-attention layers' entry (ModernBERT's: every entry) with it."""
    if not isinstance(given.get("full_attention"), Mapping):
        raise ValueError(f"{where}: rope_scaling beside rope_parameters updates rope_parameters['full_attention'], "
                         f"which must be an object (a KeyError in transformers)")
    return {key: {**value, **scaling} if key == "full_attention" or rule.local_scaled and isinstance(value, Mapping)
            else value for key, value in given.items()}


def rope_parameters(cfg: Mapping, rule: ModelRule, layer_type, where: str) -> tuple[dict, bool]:
    """The rope parameter dict transformers standardises for `layer_type` (rope_scaling wins over rope_parameters),
    and whether its class holds one such dict per layer type."""
    # convert_rope_params_to_dict: `rope_scaling or rope_parameters` (one RoPE per layer type: rope_scaling
    # updates the full-attention layers' entry, `_per_type_scaling`)
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or class_rope(cfg.get("model_type"), where) or {}
    scaling, given = cfg.get("rope_scaling"), cfg.get("rope_parameters")
    if (rule.per_type_class and isinstance(scaling, Mapping) and scaling and isinstance(given, Mapping)
            and not any(isinstance(value, Mapping) for value in scaling.values())):
        params = _per_type_scaling(given, scaling, rule, where)
    if not isinstance(params, Mapping):
        raise ValueError(f"{where}: 'rope_scaling' / 'rope_parameters' must be an object, got {params!r}")
    declared = cfg.get("layer_types") if isinstance(cfg.get("layer_types"), (list, tuple)) else ()
    names = rule.rope_of_layer or {}
    # the layer types its class names (Zaya's "hybrid") count where the config gives no layer_types
    labels = (set(declared) | {"full_attention", "sliding_attention"} | set(names.values())
              | (set() if declared else class_layer_types(cfg.get("model_type"))))
    nested = {key: value for key, value in params.items() if key in labels and isinstance(value, Mapping)}
    if layer_type is not None:
        if not isinstance(layer_type, str):
            raise TypeError(f"layer_type must be a str or None, got {type(layer_type).__name__}")
        known = sorted(set(declared) | set(nested) | set(names)
                       | ({"full_attention", "sliding_attention"} if rule.per_type_class else set()))
        if layer_type not in known:
            raise ValueError(f"{where}: layer_type={layer_type!r} is not a layer type of this config; "
                             f"expected one of {known}" + ("" if declared else " (it gives no 'layer_types', which "
                                                           "its configuration class derives: give them)"))
        layer_type = names.get(layer_type, layer_type)  # DeepSeek-V4: a layer type -> its RoPE's name
    if rule.rope_per_type_only and not nested:
        # a layer type without its own rope_parameters entry has no RoPE (Cohere-Compass: None is NoPE)
        raise ValueError(f"{where}: the config's rope_parameters give no layer type a RoPE (this model reads "
                         f"only per-layer-type entries)")
    if rule.per_type_class and not nested and not cfg.get("rope_scaling") and cfg.get("rope_parameters"):
        # convert_rope_params_to_dict keeps a flat rope_parameters as it is and adds the layer types' entries:
        # transformers' model reads its class's defaults, not this dict
        raise ValueError(f"{where}: rope_parameters is one flat dict, which this model's configuration class "
                         f"reads as no layer type's RoPE (transformers keeps its defaults); give one entry per "
                         f"layer type ({{'full_attention': {{...}}, 'sliding_attention': {{...}}}}), or the flat "
                         f"keys as rope_scaling (the full-attention layers')")
    if nested and not rule.nested_top_keys and any(cfg.get(key) is not None for key in _TOP_KEYS) and any(
            value.get("rope_type", value.get("type", "default")) != "default" for value in nested.values()):
        # a class that nests nothing, but a scaled RoPE's init function standardises the config once its module
        # is built: the top-level keys then fill the layer types built after it, in sorted order
        raise ValueError(f"{where}: top-level {[key for key in _TOP_KEYS if cfg.get(key) is not None]} beside "
                         f"per-layer-type rope_parameters with a scaled RoPE: transformers fills them into the layer "
                         f"types its rotary module builds after that one; give them in each layer type's entry")
    if nested:
        # standardize_rope_params: top-level rope_theta / partial_rotary_factor (else the class's) fill each layer
        # type's dict (only the one asked for, where one is)
        per_type = {key: layer_type_params(cfg, rule, key, value, where) if layer_type in (None, key) else value
                    for key, value in nested.items()}
    elif rule.per_type_class:
        # the flat transformers-4 form (Gemma 3): rope_scaling and rope_theta are the full-attention layers',
        # `local_theta_key` (or the class default) the sliding-window layers' default RoPE
        full = layer_type_params(cfg, rule, "full_attention", params, where)
        sliding = {**params} if rule.local_scaled else {"rope_type": "default"}
        sliding["rope_theta"] = cfg.get(rule.local_theta_key) if rule.local_theta_key else None
        sliding = layer_type_params(cfg, rule, "sliding_attention", sliding, where)
        per_type = {"full_attention": full, "sliding_attention": sliding}
    else:
        return dict(params), False
    if layer_type is None:
        distinct = {repr(sorted(value.items())) for value in per_type.values()}
        if len(distinct) > 1:
            raise ValueError(f"{where}: the config holds one RoPE per layer type {sorted(per_type)}; pass "
                             + ("layer_type= (or layer=) to choose one" if declared else
                                "layer_type= to choose one (it gives no 'layer_types' to say which its layers "
                                "are, so layer= cannot: give them, as its configuration class derives them)"))
        return dict(next(iter(per_type.values()))), True
    if layer_type not in per_type:
        raise ValueError(f"{where}: the config has no RoPE for layer_type={layer_type!r}; "
                         f"it has {sorted(per_type)}")
    return dict(per_type[layer_type]), True
