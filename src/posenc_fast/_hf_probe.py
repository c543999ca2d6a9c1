"""A model rule read from the installed transformers' own code, for a model type the table lacks.

`probed_rule` builds the model type's rotary module from its default config,
finds the one rotation function its attention classes call (read from their
source), and runs it on the basis vectors of a head at positions 0 and 1 (with
whatever its rotary module returns: cos and sin, GPT-J's sin and cos on
(batch, seq, heads, head_dim), a complex ``freqs_cis``): the
map from one to the other (what the attention scores see: a function that
also permutes the features, as q and k alike, such as DeepSeek's
``apply_rotary_pos_emb_interleave``, shows the rotation in the features' own
order) says which features pair (interleaved or half layout),
which pass through (partial rotary, or the trailing features), which way it
turns and by which angles (the pairs read at position 4096 too, or the last
the module has, where the slowest frequencies turn far enough to be seen).  A second probe with ``partial_rotary_factor=0.5``
tells a model that reads the factor from one that rotates its whole head.
Multi-head latent attention (a config with ``kv_lora_rank`` and
``qk_rope_head_dim``) is probed on its ``qk_rope_head_dim`` features: one
rotation, or two its attention picks by ``config.rope_interleave`` (which must
read as the interleaved and the half layout), and its DSA indexer's own.
Multimodal RoPE (a rotary module that expands position_ids to several
streams) is run once more per stream, that stream alone moving: each pair
must turn with exactly one, as with all together, and the one form of
``pair_streams`` (`STREAM_FORMS`) that deals the default config's pairs so
is the rule's.  The rule found is then checked by reading the default config
with it: the frequencies and attention factor must be the module's own (to
float32 rounding).  Anything else -- several rotation functions, a feature
mixed with more than one other, a pair turned by two streams, a rotary module
that cannot be built from the default config -- raises with what was found:
never a guess.
torch and transformers are imported only here, and only when asked.
"""

import copy
import functools
import importlib
import inspect
import itertools
import re

import numpy as np

from ._hf_models import STREAM_FORMS, ModelRule

_NOT_TEXT = re.compile(r"Vision|ViT|DiT|Talker|Audio|Video")
_ROTATION_CALL = re.compile(r"\b(apply_rotary_pos_emb\w*|apply_rotary_emb\w*)\s*\(")
_INDEXER_SPLIT = re.compile(r"\b(q_rot, q_pass|q_pass, q_rot) = torch\.split\(")  # its rotated part, first or last
_TOLERANCE = 1e-6  # of an angle (rad) and of the attention factor: float32 cos/sin at position 1


def _not_text(module, name):
    """`name` is a vision/audio/talker class: past the module's own model name (Granite4Vision, HiggsAudioV2)."""
    prefixes = [n[: -len("PreTrainedModel")] for n in vars(module) if n.endswith("PreTrainedModel")] + [""]
    prefixes = [p for p in prefixes if p] or [""]
    prefix = min((p for p in prefixes if name.startswith(p)), key=len, default="")
    return bool(_NOT_TEXT.search(name[len(prefix):]))


def modeling_module(model_type):
    """transformers' modeling module of `model_type`, or None."""
    from transformers.models.auto import configuration_auto

    name = configuration_auto.model_type_to_module_name(model_type)
    try:
        return importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    except ImportError:
        return None


def rotary_classes(module):
    return [c for n, c in vars(module).items()
            if n.endswith("RotaryEmbedding") and inspect.isclass(c) and c.__module__ == module.__name__]


def _built_rotary_classes(module, config):
    """The rotary classes the module's models for `config`'s class build (`self.rotary_emb = X(...)`)."""
    built = set()
    for cls in vars(module).values():
        if not (inspect.isclass(cls) and cls.__module__ == module.__name__ and "__init__" in vars(cls)):
            continue
        annotation = inspect.signature(cls.__init__).parameters.get("config")
        annotation = getattr(annotation, "annotation", None)
        if getattr(annotation, "__name__", annotation) == type(config).__name__:
            built |= set(re.findall(r"=\s*(\w+RotaryEmbedding)\(", inspect.getsource(cls.__init__)))
    return [getattr(module, name) for name in sorted(built) if hasattr(module, name)]


def text_rotary_class(module, config=None):
    """The module's text rotary embedding (None when it only has vision/audio ones).

    With `config`, the one the model of its configuration class builds, where the module says, whatever
    its name (Qwen3-Omni's talker builds a ``...TalkerRotaryEmbedding``).
    """
    built = _built_rotary_classes(module, config) if config is not None else []
    if len(built) == 1:
        return built[0]
    classes = rotary_classes(module)
    text = [c for c in classes if not _not_text(module, c.__name__)]
    if len(text) > 1:
        text = [c for c in text if "Text" in c.__name__] or text
    return text[0] if len(text) == 1 else None


def layer_config(config, layer_type):
    """The config of `layer_type`'s layers (a heterogeneous config's per_layer_config), else `config`."""
    if (layer_type is None or not getattr(config, "is_heterogeneous", False)
            or layer_type not in config.layer_types):
        return config
    # its first layer's: from_hf_config refuses a layer type whose layers differ in what a RoPE reads
    return config.per_layer_config[config.layer_types.index(layer_type)]


def attention_rotations(module, kind="main"):
    """{function name: [class names]}: the rotations the module's text attention (or indexer) classes call."""
    suffixes = ("Indexer",) if kind == "indexer" else ("Attention", "MLA")
    found = {}
    for name, cls in vars(module).items():
        if (inspect.isclass(cls) and cls.__module__ == module.__name__ and name.endswith(suffixes)
                and not _not_text(module, name)):
            for function in sorted(set(_ROTATION_CALL.findall(inspect.getsource(cls)))):
                found.setdefault(function, []).append(name)
    return found


@functools.lru_cache(maxsize=None)
def probed_rule(model_type: str) -> ModelRule | None:
    """The rule of `model_type` read from the installed transformers' code (see the module docstring).

    None where transformers (or torch) is not installed or does not know
    the model type; ValueError naming what the probe found where that is not
    a rule posenc_fast can state.
    """
    try:
        import torch  # noqa: F401  (the rotary module and the function run on tensors)
        import transformers
        from transformers.models.auto import configuration_auto
    except ImportError:
        return None
    if model_type not in configuration_auto.CONFIG_MAPPING_NAMES:
        return None
    where = f"model_type {model_type!r}, probed in transformers {transformers.__version__}"
    module = modeling_module(model_type)
    config_class = configuration_auto.CONFIG_MAPPING[model_type]
    text_defaults = config_class().get_text_config(decoder=True)
    defaults = text_defaults.to_dict()
    mla = _is_mla(defaults)
    functions = _main_rotations(module, mla, where)
    found = [_probe(module, function, config_class(), None, where, mla) for function in functions]
    if len(found) == 2 and ([f["layout"] for f in found] != ["interleaved", "half"]
                            or not _same_rotation(*found)):
        raise ValueError(f"{where}: its attention picks {functions[0].__name__} or {functions[1].__name__} by "
                         f"config.rope_interleave, which do not read as the interleaved and the half layout of one "
                         f"rotation; pass layout= as its attention rotates")
    # the rotation the default config's rope_interleave picks (a config without the key: the class's default)
    found = found[0] if len(found) == 1 or defaults.get("rope_interleave") else found[1]
    if found["rotary_dim"] == found["dim"] and not mla:
        whole_head = _probe(module, functions[0], config_class(), 0.5, where)["rotary_dim"] == found["dim"]
    else:
        whole_head = mla  # latent attention rotates qk_rope_head_dim features whatever the factor
    source = module.__name__.split(".")[2] + "/" + module.__name__.split(".")[3] + ".py"
    indexer, indexer_trailing = _indexer(module, config_class, mla, where)
    rule = ModelRule(source=f"{source} (probed)", layout=found["layout"], whole_head=whole_head,
                     trailing=indexer_trailing if mla else found["start"] > 0, reversed=found["reversed"],
                     mla=mla, reads_rope_interleave=len(functions) == 2, indexer=indexer,
                     rope_layers=_rope_layers(module), **_renamed_keys(type(text_defaults)))
    if "streams" in found:
        rule = _stream_rule(config_class(), rule, found, where)
    _check_frequencies(config_class(), rule, found, where)
    return rule


# ModelRule's key fields -> the standard name a configuration class's attribute_map may rename
_KEYS = {"hidden_key": "hidden_size", "heads_key": "num_attention_heads", "head_dim_key": "head_dim",
         "layers_key": "num_hidden_layers"}


def _renamed_keys(text_class) -> dict:
    """The ModelRule key fields where the text configuration class stores a standard name under its
    own (``attribute_map``: DBRX's ``d_model``, JetMoE's ``kv_channels``, Moonshine's decoder keys)."""
    renamed = getattr(text_class, "attribute_map", None) or {}
    return {field: renamed[name] for field, name in _KEYS.items() if isinstance(renamed.get(name), str)}


# The conditions under which a module's text attention rotates, as its source writes them (ModelRule.rope_layers)
_THEN_ROTATES = r":\s*\n(?:[^\n]*\n)?[^\n]*apply_rotary"  # the condition's block calls the rotation
_ROTATES_WHERE = {"no_rope_layers": r"config\.no_rope_layers\[",
                  "sliding": r"if self\.sliding_window is not None" + _THEN_ROTATES,
                  "sliding_or_dense": r"if self\.sliding_window is not None or self\.force_rope" + _THEN_ROTATES,
                  "sliding_or_no_window": r"if self\.sliding_window is None or self\.is_sliding" + _THEN_ROTATES}


def _rope_layers(module) -> str | None:
    """``ModelRule.rope_layers``: ``"no_rope_layers"`` where the module's text layers rotate or not by it
    (``self.use_rope = config.no_rope_layers[layer_idx]``: SmolLM3, Llama 4, Mistral-Large-4), or the rule by
    layer type its attention's condition on ``self.sliding_window`` writes (Cohere2, EXAONE 4)."""
    source = "\n".join(inspect.getsource(cls) for name, cls in vars(module).items()
                       if inspect.isclass(cls) and cls.__module__ == module.__name__ and not _not_text(module, name))
    return next((rule for rule, pattern in _ROTATES_WHERE.items() if re.search(pattern, source)), None)


def _same_rotation(a: dict, b: dict) -> bool:
    """Two probes read the same features, direction, angles and factor (their layouts aside)."""
    return (all(a[key] == b[key] for key in ("dim", "rotary_dim", "start", "reversed"))
            and np.allclose(a["angles"], b["angles"], rtol=0, atol=_TOLERANCE)
            and abs(a["factor"] - b["factor"]) <= _TOLERANCE)


def _is_mla(text: dict) -> bool:
    """Multi-head latent attention: the text config (as a dict) has ``kv_lora_rank`` and ``qk_rope_head_dim``."""
    return text.get("kv_lora_rank") is not None and text.get("qk_rope_head_dim") is not None


def _module_function(module, name, where):
    function = getattr(module, name, None)
    if not callable(function):  # V-JEPA 2: a method of the attention class (a 3-D rotary)
        raise ValueError(f"{where}: its attention classes call {name!r}, which is not a function of "
                         f"{module.__name__} to probe; pass layout= as its attention rotates")
    return function


def _main_rotations(module, mla, where) -> list:
    """The rotation function the attention calls; latent attention: or the two it picks by
    ``config.rope_interleave`` (the one it calls when true first)."""
    calls = {} if module is None else attention_rotations(module)
    if len(calls) == 2 and mla:
        sources = {inspect.getsource(getattr(module, name)) for names in calls.values() for name in names}
        chosen = {m.group(1) for source in sources for m in re.finditer(
            r"if self\.config\.rope_interleave:[^\n]*\n[^\n]*?\b(apply_rotary\w*)\s*\(", source)}
        if len(sources) == 1 and len(chosen) == 1:
            [first] = chosen
            return [_module_function(module, name, where) for name in (first, *(set(calls) - chosen))]
    if len(calls) != 1:
        raise ValueError(f"{where}: its attention classes call {sorted(calls) or 'no rotation function'}, not "
                         f"one rotation to probe; pass layout= as its attention rotates")
    return [_module_function(module, next(iter(calls)), where)]


def _indexer(module, config_class, mla, where) -> tuple[str | None, bool]:
    """The pair layout of a latent attention's DSA indexer (None: it has none, or splits off its
    ``qk_rope_head_dim`` rotated features otherwise than first or last: ``attention="indexer"`` then
    refuses to read it), and whether they are its last features (HY-V4's ``q_pass, q_rot``)."""
    calls = attention_rotations(module, "indexer") if mla else {}
    sources = [inspect.getsource(getattr(module, name)) for names in calls.values() for name in names]
    splits = {found.group(1) if (found := _INDEXER_SPLIT.search(source)) else None for source in sources}
    if len(splits) != 1 or None in splits:
        return None, False
    if len(calls) != 1:
        raise ValueError(f"{where}: its indexer calls {sorted(calls)}, not one rotation to probe; pass layout= "
                         f"as its attention rotates")
    found = _probe(module, _module_function(module, next(iter(calls)), where), config_class(), None, where, mla)
    return found["layout"], splits == {"q_pass, q_rot"}


def _text_config(config, partial, where):
    """The text config, with `partial` as the partial_rotary_factor of its RoPE (with one RoPE per layer
    type: of the layer type probed; without rope_parameters, ESM's: the flat key)."""
    text = config.get_text_config(decoder=True)
    if partial is not None:
        params = getattr(text, "rope_parameters", None)
        if not isinstance(params, dict):
            text.partial_rotary_factor = partial
        elif _per_layer_type(params):
            name = _probed_layer_type(text.to_dict(), where)
            text.rope_parameters = {**params, name: {**params[name], "partial_rotary_factor": partial}}
        else:
            text.rope_parameters = {**params, "partial_rotary_factor": partial}
    return text


def _probe(module, function, config, partial, where, mla=False) -> dict:
    """What `function` applies from position 0 to 1 to the basis vectors of a head (see the module
    docstring); `mla`: of its ``qk_rope_head_dim`` features."""
    import torch

    text = _text_config(config, partial, where)
    own = [c.__name__ for c in _built_rotary_classes(module, text)]
    if own and all(_not_text(module, name) for name in own):  # not another configuration's text rotary
        raise ValueError(f"{where}: its model builds {', '.join(own)}, a vision, audio, talker or DiT "
                         f"rotary: not probed")
    rotary_class = text_rotary_class(module, text)
    if rotary_class is None:
        raise ValueError(f"{where}: no single text rotary embedding class to probe")
    forward = inspect.signature(rotary_class.forward).parameters
    pairwise = list(inspect.signature(function).parameters)[1] in ("k", "xk", "key", "k_embed")
    try:
        extra = {}
        if "layer_type" in forward:
            extra = {"layer_type": _probed_layer_type(text.to_dict(), where)}
        heads = layer_config(text, extra.get("layer_type"))  # Gemma 4's head_dim is its layers'
        dim = (text.to_dict()["qk_rope_head_dim"] if mla else
               getattr(heads, "head_dim", None) or heads.hidden_size // heads.num_attention_heads)
        basis = torch.eye(dim).reshape(1, dim, 1, dim).expand(1, dim, 3, dim).contiguous()
        far = min(4096, getattr(text, "max_position_embeddings", 4096) - 1)
        rotary = rotary_class(config=text)
        streams = _position_streams(rotary)
        moving = [[(0, 1, far)] * streams]  # every stream at positions (0, 1, far), then
        if streams > 1:  # (multimodal RoPE) each stream alone
            moving += [[(0, 1, far) if s == t else (0, 0, 0) for t in range(streams)] for s in range(streams)]
        with torch.no_grad():
            # (cos, sin); GPT-J's (sin, cos), which its rotation takes in that order; DeepSeek-V2's and
            # Llama 4's complex freqs_cis
            runs = []
            for positions in moving:
                positions = torch.tensor(positions)[:, None] if streams > 1 else torch.tensor(positions)
                tables = rotary(basis, positions, **extra)
                tables = (tables,) if isinstance(tables, torch.Tensor) else tuple(tables)
                if not runs:
                    width, seq_axis, rotated = _first_call(function, basis, dim, tables, pairwise)
                else:
                    rotated = _call(function, basis, width, seq_axis, tables, pairwise)
                runs.append(rotated)
    except Exception as error:  # its module fails on the default config or the probe's shapes
        raise ValueError(f"{where}: its rotary module ({rotary_class.__name__}) or {function.__name__} cannot be "
                         f"run on a probe ({type(error).__name__}: {str(error)[:120]})") from None
    matrices = []
    for rotated in runs:
        matrices.append(np.tile(np.eye(dim), (3, 1, 1)))
        matrices[-1][:, :width, :width] = rotated.double().numpy()[0].transpose(1, 0, 2)
    # at position 0: the identity or a permutation it applies to q and k alike, each row times its factor
    # (the attention factor; 1 on the features passed through)
    unit = matrices[0][0] / np.linalg.norm(matrices[0][0], axis=1, keepdims=True)
    order = np.round(unit)
    if not (np.abs(unit - order).max() < _TOLERANCE and set(order.flat) <= {0.0, 1.0}
            and (order.sum(axis=0) == 1).all() and (order.sum(axis=1) == 1).all()):
        raise ValueError(f"{where}: at position 0 its rotation is not a permutation of the features")
    matrices = [m @ order.T for m in matrices]
    found = _read_matrix(matrices[0][1], matrices[0][2], where)
    if streams > 1:
        found["streams"] = _read_streams(found, matrices, where)
        found["section"] = _own_section(rotary_class, text, extra)
    return found


def _position_streams(rotary) -> int:
    """How many rows of positions the rotary module's forward expands position_ids to (1: one stream)."""
    source = inspect.getsource(type(rotary).forward)
    found = re.search(r"position_ids\.expand\((\d+|len\(self\.mrope_section\))", source)
    if found is None:
        return 1
    return len(rotary.mrope_section) if found.group(1).startswith("len") else int(found.group(1))


def _call(function, basis, width, seq_axis, tables, pairwise):
    """`function` on the basis vectors' leading `width` features, laid (batch, heads, seq, head_dim) or
    (seq_axis 1) GPT-J's (batch, seq, heads, head_dim); its result in the first layout."""
    part = basis[:, :width, :, :width]
    part = part if seq_axis == 2 else part.transpose(1, 2)
    rotated = function(part, part.clone(), *tables)[0] if pairwise else function(part, *tables)
    return rotated if seq_axis == 2 else rotated.transpose(1, 2)


def _first_call(function, basis, dim, tables, pairwise) -> tuple:
    """The width and sequence axis `function` takes (the whole head, or the leading features its
    attention cuts out for the call: Phi, GPT-J), and its result there."""
    errors = []
    for width, seq_axis in itertools.product(dict.fromkeys(
            w for w in (dim, tables[0].shape[-1], 2 * tables[0].shape[-1]) if w <= dim), (2, 1)):
        try:
            return width, seq_axis, _call(function, basis, width, seq_axis, tables, pairwise)
        except RuntimeError as error:
            errors.append(error)
    raise errors[-1]


def _read_streams(found: dict, matrices: list, where: str) -> list:
    """The position stream of each pair (None: a pair at angle 0, which any stream leaves still): the one
    stream whose positions alone turn it as all streams together do, the others leaving it as at position 0;
    where its two features turn so by one stream each (HunYuan-VL), the two (first feature's, second's).
    `matrices`: the maps at positions (0, 1, far) of every stream, then of each stream alone."""
    whole, alone = matrices[0], matrices[1:]  # row i of a map: where it takes basis vector i

    def turned_by(rows, features):  # the one stream that turns these rows' features as all do, else None
        part = lambda m: m[:, rows][:, :, features]  # noqa: E731
        turning = [s for s, m in enumerate(alone)
                   if not np.allclose(part(m)[1:], part(m)[0], rtol=0, atol=_TOLERANCE)]
        one = len(turning) == 1 and np.allclose(part(alone[turning[0]]), part(whole), rtol=0, atol=_TOLERANCE)
        return turning, turning[0] if one else None

    assigned = []
    for j, rows in enumerate(found["pairs"]):
        rows = sorted(rows)
        turning, stream = turned_by(rows, rows)
        features = [turned_by(rows, [row])[1] for row in rows] if stream is None and turning else None
        if not turning and found["angles"][j] <= _TOLERANCE:
            assigned.append(None)
        elif stream is not None:
            assigned.append(stream)
        elif features is not None and None not in features:
            assigned.append(tuple(features))
        else:
            raise ValueError(f"{where}: its pair of features {rows} takes its angles from position streams "
                             f"{turning}, not one for the pair or one for each feature")
    return assigned


def _own_section(rotary_class, text, extra) -> tuple | None:
    """The ``mrope_section`` the rotary module takes where the config gives none (None: it takes none)."""
    text = copy.deepcopy(text)
    params = getattr(text, "rope_parameters", None)
    key = extra.get("layer_type") if _per_layer_type(params) else None
    own = params.get(key) if key is not None else params
    if isinstance(own, dict) and "mrope_section" in own:
        own = {name: value for name, value in own.items() if name != "mrope_section"}
        text.rope_parameters = {**params, key: own} if key is not None else own
    try:
        section = rotary_class(config=text).mrope_section
    except Exception:  # it needs one from the config
        return None
    return tuple(int(n) for n in section) if isinstance(section, (list, tuple)) else None


def _read_matrix(m: np.ndarray, far: np.ndarray, where: str) -> dict:
    """Pairs, layout, start, direction and angles of the map whose row h is the image of e_h at
    position 1 (`m`); `far`, the map at position 4096 (or the last the module has), shows the pairs
    that turn slowly."""
    dim = m.shape[0]
    partner = {}
    for h in range(dim):
        others = [j for j in range(dim) if j != h and max(abs(m[h, j]), abs(far[h, j])) > _TOLERANCE]
        if len(others) > 1:
            raise ValueError(f"{where}: its rotation mixes feature {h} with features {others}: not a rotation "
                             f"of pairs")
        if others:
            partner[h] = others[0]
        elif max(abs(m[h, h] - 1.0), abs(far[h, h] - 1.0)) > _TOLERANCE:
            raise ValueError(f"{where}: its rotation scales feature {h} by {m[h, h]!r} without a partner")
    rotated = sorted(partner)
    half, leading = dim // 2, rotated[:len(rotated) // 2]
    if (rotated and dim % 2 == 0 and len(rotated) < dim and leading == list(range(len(leading)))
            and all(partner[h] == h + half for h in leading)):
        # pairs (i, i + dim/2) of a prefix of i: the half layout over the whole head, the other pairs
        # at angle 0 (proportional RoPE's zero frequencies)
        partner.update({h: h + half for h in range(half)} | {h + half: h for h in range(half)})
        rotated = sorted(partner)
    if not rotated or any(partner[partner[h]] != h for h in rotated) or rotated != list(
            range(rotated[0], rotated[0] + len(rotated))):
        raise ValueError(f"{where}: its rotated features {rotated} are not contiguous pairs")
    start, width = rotated[0], len(rotated)
    if start and start + width != dim:
        raise ValueError(f"{where}: it rotates features [{start}, {start + width}) of {dim}: neither the "
                         f"leading nor the trailing ones")
    if all(partner[start + 2 * i] == start + 2 * i + 1 for i in range(width // 2)):
        layout, firsts = "interleaved", [start + 2 * i for i in range(width // 2)]
    elif all(partner[start + i] == start + i + width // 2 for i in range(width // 2)):
        layout, firsts = "half", [start + i for i in range(width // 2)]
    else:
        raise ValueError(f"{where}: its pairs {sorted(partner.items())[:4]}... are neither interleaved nor "
                         f"halves")
    cos = np.array([m[a, a] for a in firsts])
    sin = np.array([m[a, partner[a]] for a in firsts])
    angles = np.arctan2(sin, cos)
    return {"dim": dim, "rotary_dim": width, "start": start, "layout": layout, "reversed": bool(angles[0] < 0),
            "angles": np.abs(angles), "factor": float(np.hypot(cos[0], sin[0])),
            "pairs": [(a, partner[a]) for a in firsts]}


def _per_layer_type(params) -> bool:
    """Rope parameters holding one RoPE per layer type (a dict of dicts)."""
    return isinstance(params, dict) and any(isinstance(value, dict) for value in params.values())


def _probed_layer_type(text: dict, where: str):
    """The layer type probed: the first of ``layer_types``, or with one RoPE per layer type in
    ``rope_parameters``, the first of ``layer_types`` that has one (LFM3's first layers are convolutions)."""
    names = text.get("layer_types") or [None]
    params = text.get("rope_parameters")
    if not _per_layer_type(params):
        return names[0]
    for name in names:
        if isinstance(params.get(name), dict):
            return name
    raise ValueError(f"{where}: no layer type of layer_types {sorted(set(names))} names a RoPE of rope_parameters "
                     f"{sorted(params)}: not probed")


def _kwargs(config, rule: ModelRule, where: str) -> dict:
    """The RotaryEmbedding arguments of the default `config` read by `rule` (its first layer type with a RoPE)."""
    from ._hf_config import _text_part, kwargs_by_rule

    cfg, _ = _text_part(config.to_dict(), where)
    layer_type = _probed_layer_type(cfg, where) if _per_layer_type(cfg.get("rope_parameters")) else None
    return kwargs_by_rule(cfg, where, rule, layer_type, "main")


def _stream_rule(config, rule: ModelRule, found: dict, where: str) -> ModelRule:
    """`rule` with the one form of ``pair_streams`` that deals the default config's pairs to the position
    streams found (a pair at angle 0 to any); refused where none does, or several do (the default config
    then does not tell them apart)."""
    matches = []
    for form in STREAM_FORMS:
        candidate = rule._replace(streams=form, default_section=found["section"])
        try:
            dealt = _kwargs(config, candidate, where)["pair_streams"]
        except ValueError:  # the form does not take the config's mrope_section
            continue
        if dealt is None:  # the form reads one row of positions here
            continue
        by_feature = list(zip(*dealt)) if dealt and isinstance(dealt[0], list) else [(d, d) for d in dealt]
        if len(by_feature) == len(found["streams"]) and all(
                stream is None or (stream if isinstance(stream, tuple) else (stream, stream)) == d
                for stream, d in zip(found["streams"], by_feature)):
            matches.append(candidate)
    if len(matches) != 1:
        forms = " and ".join(m.streams for m in matches) or "none"
        raise ValueError(f"{where}: its rotary module deals pairs to position streams {found['streams'][:12]}...: "
                         f"{forms} of posenc_fast's forms ({', '.join(STREAM_FORMS)}) deal its default config so; "
                         f"build the RotaryEmbedding with pair_streams=")
    return matches[0]


def _check_frequencies(config, rule: ModelRule, found: dict, where: str) -> None:
    """The default config read by `rule` gives the module's own angles at position 1 and its factor."""
    from .rotary import RotaryEmbedding

    kwargs = _kwargs(config, rule, where)
    rope = RotaryEmbedding(kwargs.pop("dim"), **kwargs)
    ours = np.abs(rope.inv_freq_for(2))
    if (rope.rotary_dim, rope.rotary_start) != (found["rotary_dim"], found["start"]) or not (
            np.allclose(ours, found["angles"], rtol=0, atol=_TOLERANCE)
            and abs(rope.attention_factor - found["factor"]) <= _TOLERANCE):
        raise ValueError(f"{where}: it rotates {found['rotary_dim']} features from {found['start']} with angles "
                         f"{found['angles'][:3]}... (factor {found['factor']:.6g}); its config read by the probed rule "
                         f"gives {rope.rotary_dim} from {rope.rotary_start}, {ours[:3]}... (factor "
                         f"{rope.attention_factor:.6g})")
