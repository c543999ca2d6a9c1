"""Walk every model type of the installed transformers that defines a text rotary embedding.

For each one: its default config, the model's own rotary module and the
rotation function its attention classes call (read from their source), on
random q/k at random positions, compared with
``RotaryEmbedding.from_hf_config(config).apply_qk`` through the attention
scores q·k (which do not depend on where a model writes each rotated pair);
per layer type (each with its own head_dim, from ``per_layer_config``), and
for a DSA indexer as ``attention="indexer"``.
Used by ``test_hf_models.py`` and ``make_models_table.py``; needs torch and
transformers.
"""

import inspect
import re
import warnings

import numpy as np
import torch
from transformers.models.auto import configuration_auto

import posenc_fast as pf
from posenc_fast import _hf_models, _hf_towers
from posenc_fast._hf_probe import (  # noqa: F401  (the walk's names for them)
    _not_text, attention_rotations, layer_config, modeling_module, rotary_classes, text_rotary_class)

SEQ = 12
HEADS = 2
MAX_POSITION = 1024
# |score error| allowed, relative to |q_i| |k_j|: transformers forms float32
# angles up to MAX_POSITION rad (half an ulp: 6e-5 rad) and float32 products.
SCORE_RTOL = 1e-3

def model_types():
    """Model types whose modeling module defines a rotary embedding class, sorted."""
    types = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for model_type in sorted(configuration_auto.CONFIG_MAPPING_NAMES):
            module = modeling_module(model_type)
            if module is not None and rotary_classes(module):
                types.append(model_type)
    return types


def head_dim(config, kind="main"):
    """The width of the q/k the model's attention (`kind`: "main" or "indexer") rotates."""
    if kind == "indexer":
        return config.index_head_dim  # its leading qk_rope_head_dim features rotate
    if _mla(config):
        return config.qk_rope_head_dim  # MLA: only the rope part of q/k rotates
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _mla(config):
    # DeepSeek-V4's qk_rope_head_dim is not MLA's: its heads hold [nope | rope] (no qk_nope_head_dim)
    return bool(getattr(config, "qk_rope_head_dim", None) and getattr(config, "qk_nope_head_dim", None))


def attention_kinds(module):
    """"main", and "indexer" where the module has an indexer class that rotates."""
    return ["main"] + (["indexer"] if attention_rotations(module, "indexer") else [])


class Skip(Exception):
    """The family is out of the walk's reach; the message says why."""


def check(model_type, partial_rotary_factor=None, seed=0, rope_interleave=None):
    """Compare one model type; return [(layer_type, attention kind, worst score error relative to |q_i| |k_j|)].

    With `partial_rotary_factor`, its default config gets that factor first
    (a family that rotates the whole head ignores it); with
    `rope_interleave`, an MLA config's ``rope_interleave`` is set to it.
    """
    config = configuration_auto.CONFIG_MAPPING[model_type](**CONFIG_OVERRIDES.get(model_type, {}))
    text = config.get_text_config(decoder=True)
    if rope_interleave is not None:
        if not getattr(text, "qk_rope_head_dim", None):
            raise Skip("not MLA: no rope_interleave to set")
        text.rope_interleave = rope_interleave  # where the attention's code does not read it, it changes nothing
        if text is not config and getattr(config, "rope_interleave", None) is not None:
            config.rope_interleave = rope_interleave
    # a composite model's text part rotates as its own model type does (GLM-ASR's text model is a Llama)
    module = modeling_module(text.model_type) if text is not config else None
    if module is None or not rotary_classes(module):
        module = modeling_module(model_type)
    if partial_rotary_factor is not None:
        params = getattr(text, "rope_parameters", None)
        if params and all(isinstance(value, dict) or value is None for value in params.values()):
            # one RoPE per layer type: each default one gets the factor
            changed = {key: {**value, "partial_rotary_factor": partial_rotary_factor}
                       if isinstance(value, dict) and value.get("rope_type") == "default" else value
                       for key, value in params.items()}
            if changed == params:
                raise Skip("no default RoPE to give a partial rotary factor")
        elif not params or "rope_type" not in params or params["rope_type"] != "default":
            raise Skip("no single default RoPE to give a partial rotary factor")
        else:
            changed = {**params, "partial_rotary_factor": partial_rotary_factor}
        if text is not config and getattr(config, "rope_parameters", None) == params:
            # get_text_config made a copy of a flat encoder/decoder config (Moonshine): from_hf_config reads the top
            config.rope_parameters = changed
        text.rope_parameters = changed
    if text.model_type in _hf_models.NO_ROPE:
        raise Skip("its text attention has no RoPE (from_hf_config refuses it with that reason)")
    if text.model_type in _hf_models.REFUSED_MODELS:
        raise Skip("refused with its reason and recipe (test_hf_models.py checks both)")
    if text.model_type in _hf_towers.TOWER_RULES or text.model_type in _hf_towers.REFUSED_TOWERS:
        raise Skip("a vision tower's 2-D RoPE (test_hf_towers.py runs its own rotary module against it)")
    rotary_class = text_rotary_class(module, text)
    if rotary_class is None:
        raise Skip("no text rotary embedding (vision/audio only)")
    if _not_text(module, rotary_class.__name__):  # its own audio/vision/talker rotary: walked where accepted
        try:
            pf.RotaryEmbedding.from_hf_config(config.to_dict())
        except ValueError as error:
            raise Skip(f"its own rotary is {rotary_class.__name__}, which from_hf_config refuses: {error}") from None
    try:
        rotary = rotary_class(config=text)
    except Exception as error:  # a vision/audio sub-config: the text rotary module does not take it
        raise Skip(f"{rotary_class.__name__}(config) fails: {type(error).__name__}") from None
    rng = np.random.default_rng(seed)
    limit = min(MAX_POSITION, getattr(text, "max_position_embeddings", None) or MAX_POSITION)
    streams = position_streams(rotary)
    positions = np.stack([np.sort(rng.choice(limit, SEQ, replace=False)) for _ in range(streams)])
    model_positions = torch.from_numpy(positions)[:, None] if streams > 1 else torch.from_numpy(positions)
    positions = positions if streams > 1 else positions[0]
    layer_types = [None]
    if "layer_type" in inspect.signature(rotary.forward).parameters:
        layer_types = sorted(set(getattr(text, "layer_types", None) or ())) or [None]
        named = getattr(rotary, "layer_types", None)
        if named and not set(layer_types) & set(named):
            layer_types = sorted(named)  # its RoPEs have names of their own (DeepSeek-V4: main, compress)
    rule = _hf_models.MODEL_RULES.get(text.model_type)
    results = []
    params = getattr(text, "rope_parameters", None) or {}
    per_type = any(isinstance(value, dict) for value in params.values())
    for layer_type, kind in ((t, kind) for t in layer_types for kind in attention_kinds(module)):
        extra = {} if layer_type is None else {"layer_type": layer_type}
        # must be refused, never answered with another's RoPE: a layer type without RoPE (Beam's NoPE full
        # attention, LFM3's convolutions), an indexer posenc_fast does not read or a layer type without one
        no_rope = layer_type is not None and per_type and not isinstance(params.get(layer_type), dict)
        unread = kind == "indexer" and (rule is None or rule.indexer is None
                                        or layer_type not in (None, "indexed_attention", rule.indexer_rope))
        if no_rope or unread:
            try:
                pf.RotaryEmbedding.from_hf_config(config.to_dict(), attention=kind, **extra)
            except ValueError:
                results.append((layer_type, kind, None))
                continue
            raise AssertionError(f"from_hf_config gave a RoPE for layer_type={layer_type!r}, attention={kind!r}, "
                                 f"which has none it reads")
        layer = layer_config(text, layer_type)
        dim = head_dim(layer, kind)
        q = rng.standard_normal((1, HEADS, SEQ, dim)).astype(np.float32)
        k = rng.standard_normal((1, HEADS, SEQ, dim)).astype(np.float32)
        with torch.no_grad():
            try:
                rotary_out = rotary(torch.from_numpy(q), model_positions, **extra)
            except RuntimeError as error:
                if partial_rotary_factor is None:
                    raise
                raise Skip(f"its rotary module fails with partial_rotary_factor={partial_rotary_factor}") from error
            try:
                q_hf, k_hf = _model_rotation(module, layer, rotary_out, torch.from_numpy(q), torch.from_numpy(k), kind)
            except RuntimeError as error:
                if partial_rotary_factor is None:
                    raise
                raise Skip(f"its attention fails with partial_rotary_factor={partial_rotary_factor}") from error
        rope = pf.RotaryEmbedding.from_hf_config(config.to_dict(), attention=kind, **extra)
        assert rope.dim == dim, f"dim {rope.dim}, the model rotates {dim}"
        assert rope.n_streams == streams, f"{rope.n_streams} position streams, the model has {streams}"
        q_ours, k_ours = rope.apply_qk(q.astype(np.float64), k.astype(np.float64), positions)
        results.append((layer_type, kind, _score_error(q_hf, k_hf, q_ours, k_ours, q, k)))
    return results


def position_streams(rotary):
    """How many position rows the rotary module's forward expands position_ids to (1: plain RoPE)."""
    source = inspect.getsource(type(rotary).forward)
    found = re.search(r"position_ids\.expand\((\d+|len\(self\.mrope_section\))", source)
    if found is None:
        return 1
    return len(rotary.mrope_section) if found.group(1).startswith("len") else int(found.group(1))


_COMPASS_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 5e4, "mrope_section": [24, 20, 20]},
                 "full_attention": None}
_HUNYUAN_VL_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [16, 16, 16, 16]}
_GLM4V_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "mrope_section": [8, 12, 12]}
# Default configs that cannot be compared as they are, and the change that makes them comparable
CONFIG_OVERRIDES = {
    # GLM-4V's default mrope_section [8, 12, 12] covers 32 pairs, its default RoPE 64 (its own rotary module
    # fails, as from_hf_config refuses): its released checkpoints rotate half the head
    "glm4v": {"text_config": {"rope_parameters": _GLM4V_ROPE}},
    "glm4v_text": {"rope_parameters": _GLM4V_ROPE},
    # GLM-4.5V's default head_dim 4096 // 96 = 42 rotates 11 pairs (int(42 * 0.5) = 21 features, as glm4_moe's
    # default does), which [8, 12, 12] does not cover (its rotary module fails); the checkpoints set 128
    "glm4v_moe": {"text_config": {"head_dim": 128}},
    "glm4v_moe_text": {"head_dim": 128},
    "glm_image": {"text_config": {"rope_parameters": _GLM4V_ROPE}},
    "glm_image_text": {"rope_parameters": _GLM4V_ROPE},
    # Qwen3-Omni's default text head_dim is 2048 // 28 = 73, odd (its own rotation fails, from_hf_config
    # refuses it); the released checkpoints set head_dim = 128
    "qwen3_omni_moe": {"thinker_config": {"text_config": {"head_dim": 128}}},
    "qwen3_omni_moe_thinker": {"text_config": {"head_dim": 128}},
    "qwen3_omni_moe_text": {"head_dim": 128},
    # Cohere-Compass' default rope_parameters are empty (its rotary module fails, from_hf_config refuses); walked
    # as sliding layers with a RoPE and NoPE full layers (None, which its rotary module skips)
    "cohere_compass": {"text_config": {"layer_types": ["sliding_attention", "full_attention"] * 2,
                                       "num_hidden_layers": 4, "rope_parameters": _COMPASS_ROPE}},
    "cohere_compass_text": {"layer_types": ["sliding_attention", "full_attention"] * 2, "num_hidden_layers": 4,
                            "rope_parameters": _COMPASS_ROPE},
    # HunYuan-VL's default config has no mrope_section (its rotary module fails, from_hf_config refuses);
    # HunyuanOCR's four axes (position, width, height, image index): each rotate_half pair's features take two
    "hunyuan_vl": {"text_config": {"rope_parameters": _HUNYUAN_VL_ROPE}},
    "hunyuan_vl_text": {"rope_parameters": _HUNYUAN_VL_ROPE},
}


def rotation_function(module, config, kind="main"):
    """The rotation function the module's `kind` attention classes call for `config` (read from their code)."""
    calls = attention_rotations(module, kind)
    if set(calls) == {"apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave"}:
        # MLA: `if self.config.rope_interleave:` chooses between them in the attention's code
        sources = [inspect.getsource(getattr(module, name)) for name in set(sum(calls.values(), []))]
        if not all("rope_interleave" in source for source in sources):
            raise RuntimeError(f"{module.__name__}'s {kind} classes call both rotations: {calls}")
        calls = {"apply_rotary_pos_emb_interleave" if config.rope_interleave else "apply_rotary_pos_emb": None}
    if len(calls) != 1:
        raise RuntimeError(f"{module.__name__}'s {kind} attention classes call {calls or 'no rotation function'}")
    return getattr(module, next(iter(calls)))


_SLICES_ROTARY = re.compile(r"\[(?:\.\.\.|:, :, :), *: *self\.rotary_\w+\]")


def _attention_slices_rotary_features(module):
    """The module's text attention cuts the rotated features out of q/k itself (Phi, GPT-J) before rotating."""
    return any(_SLICES_ROTARY.search(inspect.getsource(cls)) for name, cls in vars(module).items()
               if inspect.isclass(cls) and cls.__module__ == module.__name__ and name.endswith("Attention")
               and not _not_text(module, name))


def _model_rotation(module, config, rotary_out, q, k, kind="main"):
    """q and k (batch, heads, seq, dim) rotated by the model's own function, as its attention calls it."""
    function = rotation_function(module, config, kind)
    tables = (rotary_out,) if isinstance(rotary_out, torch.Tensor) else rotary_out  # complex freqs_cis: one
    names = list(inspect.signature(function).parameters)
    pairwise = names[1] in ("k", "xk", "key", "k_embed")
    cos = tables[0] if len(tables) == 1 or names.index("cos") < names.index("sin") else tables[1]
    widths = [q.shape[-1]]
    if _attention_slices_rotary_features(module):
        # the attention itself passes the leading rotary features (query[..., : self.rotary_ndims], GPT-J's
        # query[:, :, :, : self.rotary_dim]): as wide as the cos/sin cache, or twice (half-width caches)
        widths += [w for w in (cos.shape[-1], 2 * cos.shape[-1]) if w < q.shape[-1]]
    trailing = False  # the rotated features are the last `width`, not the first
    if kind == "indexer":
        # it splits off and rotates its leading qk_rope_head_dim features (HY-V4's rotates its trailing ones)
        classes = sum(attention_rotations(module, kind).values(), [])
        sources = [inspect.getsource(getattr(module, name)) for name in classes]
        if all(re.search(r"q_rot, q_pass = torch\.split\(", source) for source in sources):
            widths = [config.qk_rope_head_dim]
        elif all(re.search(r"q_pass, q_rot = torch\.split\(", source) for source in sources):
            widths, trailing = [config.qk_rope_head_dim], True
        elif all(re.search(r"\bq = apply_rotary_pos_emb\(q, ", source) for source in sources):
            widths = [q.shape[-1]]  # the whole q: its function rotates the trailing features (DeepSeek-V4)
        else:
            raise RuntimeError(f"{module.__name__}'s indexer neither splits off its leading rotated features nor "
                               f"passes its whole q")
    elif _mla(config):
        widths = [q.shape[-1]]  # MLA: the attention rotates the whole rope part
    errors = []
    for width in widths:  # the attention passes the leading `width` features
        for axes in ((1, 2), None):  # (batch, heads, seq, dim) or (batch, seq, heads, dim)
            parts = [x[..., x.shape[-1] - width:] if trailing else x[..., :width] for x in (q, k)]
            qq, kk = (x if axes is None else x.transpose(1, 2) for x in parts)
            args = tuple(tables)  # in the order the rotary module returns and the function takes them
            try:
                if pairwise:
                    q_rot, k_rot = function(qq, kk, *args)
                else:
                    q_rot, k_rot = function(qq, *args), function(kk, *args)
            except (RuntimeError, IndexError) as error:
                errors.append(str(error)[:80])
                continue
            if q_rot.shape != qq.shape:
                continue
            if axes is not None:
                q_rot, k_rot = q_rot.transpose(1, 2), k_rot.transpose(1, 2)
            rest = q.shape[-1] - width
            if rest and trailing:
                q_rot, k_rot = torch.cat((q[..., :rest], q_rot), -1), torch.cat((k[..., :rest], k_rot), -1)
            elif rest:
                q_rot, k_rot = torch.cat((q_rot, q[..., width:]), -1), torch.cat((k_rot, k[..., width:]), -1)
            return q_rot.double().numpy(), k_rot.double().numpy()
    raise RuntimeError(f"cannot call {function.__name__}: {errors}")


def _score_error(q_hf, k_hf, q_ours, k_ours, q, k):
    scores_hf = np.einsum("bhid,bhjd->bhij", q_hf, k_hf)
    scores_ours = np.einsum("bhid,bhjd->bhij", q_ours, k_ours)
    norms = np.linalg.norm(q.astype(np.float64), axis=-1)[..., :, None] * np.linalg.norm(
        k.astype(np.float64), axis=-1)[..., None, :]
    return float(np.max(np.abs(scores_hf - scores_ours) / norms))
