"""Write ``src/posenc_fast/_hf_defaults.py``: the installed transformers' configuration class defaults.

For the text configuration class of each model type of the installed
transformers (``get_text_config(decoder=True)`` of its default config, as
``tests/hf_walk.py`` walks them) that holds a RoPE, and each model type of
``_hf_models.MODEL_RULES``, what it makes of the keys
``RotaryEmbedding.from_hf_config`` reads when a ``config.json`` leaves them out:

- ``FIELDS``: the dataclass default of each such top-level key (``head_dim``,
  ``max_position_embeddings``, ``qk_rope_head_dim``, ...), where it is a value
  (a default of None is the class's "derive it": not listed); ``ALIASES``: the
  ``attribute_map`` entries that name such a key, either side (the field a key is
  stored in: DBRX's ``max_seq_len``; a key stored in it: GLM-4-MoE-Lite's
  ``head_dim`` is its ``qk_rope_head_dim``);
- ``THETA`` / ``PARTIAL`` / ``SECTION``: the ``rope_theta`` /
  ``partial_rotary_factor`` / ``mrope_section`` the class puts into rope
  parameters that give none (``default_theta``, a ``rope_theta`` field,
  ``rotary_pct``'s default, ``__post_init__``'s own), read by building the
  class from its own default ``rope_parameters`` less that key (one layer
  type's at a time where they are per layer type); THETA's None: the class
  fills in none (its rotary module then fails on the missing key);
- ``ROPE``: the ``rope_parameters`` the class builds when the config has none,
  where that is more than those defaults (Apertus' llama3, Gemma 4's per layer
  type); a ``rope_theta`` that follows one of the config's flat keys is left
  out of it (a sentinel value given for each flat key shows which);
- ``DERIVED``: what the class derives instead: an entry above that changes with
  the config's sizes (each built again with them resized), or a field whose
  default ``__post_init__`` rewrites.
- ``MLA_HEAD_DIM``: whether an MLA model's class keeps a ``head_dim`` the config
  gives (its rotary module then builds cos/sin that wide) or rewrites it to
  ``qk_rope_head_dim``, read by building the class with another.

Needs transformers (its configuration classes only: no model is built)::

    PYTHONPATH=src python tests/make_hf_defaults.py          # print it
    PYTHONPATH=src python tests/make_hf_defaults.py --write  # write src/posenc_fast/_hf_defaults.py

``tests/test_hf_defaults.py`` fails when the checked-in module differs from
what this writes with the installed transformers.
"""

import argparse
import copy
import dataclasses
import functools
import logging
import sys
import warnings
from pathlib import Path

import transformers
from transformers.models.auto import configuration_auto

from posenc_fast._hf_models import MODEL_RULES
from posenc_fast._hf_towers import NAMED_TOWERS

TARGET = Path(__file__).resolve().parents[1] / "src" / "posenc_fast" / "_hf_defaults.py"

# top-level keys from_hf_config reads whose class default FIELDS lists (rope_theta / partial_rotary_factor and
# their per-model flat keys are THETA's and PARTIAL's)
FIELD_KEYS = ("head_dim", "kv_channels", "attention_head_dim", "global_head_dim", "qk_rope_head_dim",
              "qk_nope_head_dim", "index_head_dim", "rope_interleave", "rotary_dim", "max_position_embeddings",
              "n_positions", "original_max_position_embeddings", "no_rope_layer_interval", "mrope_section",
              "mrope_interleaved", "use_dsa", "use_sliding_window", "compress_rope_theta")
# flat keys the classes read a rope_theta / partial_rotary_factor from
THETA_KEYS = ("rope_theta", "rotary_emb_base", "global_rope_theta", "local_rope_theta", "rope_local_base_freq")
PARTIAL_KEYS = ("partial_rotary_factor", "rotary_pct")
SENTINEL = 12345.0  # a flat rope_theta no class defaults to
_LEFT_OUT = object()  # no entry (THETA's None is an entry: the class fills in no rope_theta)


@functools.lru_cache(maxsize=None)
def text_configs():
    """The text config of each model type of CONFIG_MAPPING (``get_text_config(decoder=True)`` of its default
    config, as the walk of tests/hf_walk.py reads them) by its model type, sorted; and the model types not built.
    (Cached: not to be changed.)"""
    found, skipped = {}, []
    for name in sorted(configuration_auto.CONFIG_MAPPING_NAMES):
        try:
            text = _build(configuration_auto.CONFIG_MAPPING[name], {}).get_text_config(decoder=True)
        except Exception as error:  # noqa: BLE001  (a class that cannot be built from its own defaults)
            skipped.append(name)
            continue
        model_type = getattr(text, "model_type", None)
        if isinstance(model_type, str) and model_type and model_type not in NAMED_TOWERS:
            found.setdefault(model_type, text)
    return dict(sorted(found.items())), skipped


def _nested(instance, params):
    if not isinstance(params, dict):
        return []
    return [key for key in instance.nested_rope_parameter_keys(params)]


def _axial(params):
    values = [params] + [value for value in params.values() if isinstance(value, dict)]
    return any(value.get("rope_type") == "axial" for value in values)


def _build(cls, data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(**copy.deepcopy(data))


def _aliases(cls):
    """{key: the field the class stores it in} (``attribute_map``) where either is a FIELD_KEYS key: DBRX's
    max_position_embeddings is its max_seq_len, GLM-4-MoE-Lite's head_dim its qk_rope_head_dim."""
    mapped = getattr(cls, "attribute_map", None) or {}
    return {key: field for key, field in sorted(mapped.items())
            if isinstance(field, str) and field != key and (key in FIELD_KEYS or field in FIELD_KEYS)}


def _field_defaults(cls, instance):
    """{key: dataclass default} of FIELD_KEYS (and the fields they are aliases of), and the keys whose default the
    class rewrites (``__post_init__``: HY-V4-VL's head_dim is its qk_rope_head_dim)."""
    out, rewritten = {}, []
    names = set(FIELD_KEYS) | set(_aliases(cls).values())
    for field in dataclasses.fields(cls):
        if field.name not in names:
            continue
        if field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            continue
        if value is None or not (isinstance(value, (bool, int, float, str))
                                 or isinstance(value, list) and all(isinstance(v, int) for v in value)):
            continue
        if instance.get(field.name, value) != value:  # (to_dict: a heterogeneous config's global value)
            rewritten.append(field.name)
        else:
            out[field.name] = value
    return out, rewritten


def _probe(cls, base, rule):
    """(THETA, PARTIAL, ROPE) entries of `cls` built around the config dict `base`."""
    stripped = {key: value for key, value in base.items()
                if key not in ("rope_parameters", "rope_scaling") + THETA_KEYS + PARTIAL_KEYS}
    own = _build(cls, stripped)
    p0 = copy.deepcopy(own.rope_parameters)
    nested = _nested(own, p0)
    # what the class fills in for a rope_theta / partial_rotary_factor / mrope_section left out of its own
    # parameters: all at once, else one key of one layer type at a time (none where it refuses the parameters
    # without it: proportional RoPE needs its rope_theta)
    found = {"rope_theta": {}, "partial_rotary_factor": {}, "mrope_section": {}}
    names = [name for name in nested if isinstance(p0.get(name), dict)] if nested else [None]

    def left_out(keys, types):
        given = copy.deepcopy(p0)
        for name in types:
            for key in keys:
                (given if name is None else given[name]).pop(key, None)
        filled = _build(cls, {**stripped, "rope_parameters": given}).rope_parameters
        for name in types:
            for key in keys:
                found[key][name] = (filled if name is None else filled.get(name) or {}).get(key)

    try:
        left_out(list(found), names)
    except Exception:  # noqa: BLE001
        for key in found:
            for name in names:
                try:
                    left_out([key], [name])
                except Exception:  # noqa: BLE001  (refused without it: no default)
                    found[key][name] = None
    # rope_theta: None where the class fills in none (transformers' rotary module then fails on the missing key);
    # partial_rotary_factor: None where it fills in none (the rotary modules' 1.0)
    theta = found["rope_theta"].get(None, found["rope_theta"])
    partial, section = ({name: value for name, value in found[key].items() if value is not None}
                        for key in ("partial_rotary_factor", "mrope_section"))
    partial, section = (values.get(None, values or None) for values in (partial, section))
    plain = not nested and set(p0) <= {"rope_type", "rope_theta", "partial_rotary_factor"} \
        and p0.get("rope_type") == "default"
    if plain and p0.get("rope_theta") == theta and p0.get("partial_rotary_factor") == partial:
        return theta, partial, section, None
    rope = copy.deepcopy(p0)
    # a rope_theta one of the config's flat keys sets (self.rope_theta fills the class's own dict) is no default
    for number, key in enumerate(THETA_KEYS):
        try:
            followed = _build(cls, {**stripped, key: SENTINEL + number}).rope_parameters
        except Exception:  # noqa: BLE001  (its flat key is no number: UltraBERT's one rope_theta per layer)
            continue
        for name in nested or [None]:
            mine, theirs = (rope, followed) if name is None else (rope.get(name), followed.get(name))
            if isinstance(mine, dict) and isinstance(theirs, dict) and theirs.get("rope_theta") == SENTINEL + number:
                mine.pop("rope_theta", None)
    return theta, partial, section, rope


# sizes a class may derive a RoPE default from, and the factors that tell a derived default from a constant one
# (unlike factors: a ratio of two of them changes too)
SIZES = {"hidden_size": 2, "head_dim": 4, "qk_rope_head_dim": 2, "qk_nope_head_dim": 3, "max_position_embeddings": 2}


def _rope_defaults(cls, model_type, base):
    """(THETA, PARTIAL, SECTION, ROPE, derived) entries of `cls`, whose default config dict is `base`."""
    rule = MODEL_RULES.get(model_type)
    entries = _probe(cls, base, rule)
    resized = {key: factor * base[key] for key, factor in SIZES.items()
               if isinstance(base.get(key), int) and not isinstance(base[key], bool) and base[key] > 0}
    others = []
    for changes in ([resized], [{key: value} for key, value in resized.items()]):
        for change in changes:  # all at once where the class takes them, else one at a time
            try:
                others.append(_probe(cls, {**base, **change}, rule))
            except Exception:  # noqa: BLE001  (a class that refuses those sizes)
                continue
        if others:
            break
    if not others and resized:
        raise SystemExit(f"{model_type}: refuses every resized config {resized}")
    derived = [name for index, name in enumerate(("THETA", "PARTIAL", "SECTION", "ROPE"))
               if any(other[index] != entries[index] for other in others)]
    entries = tuple(_LEFT_OUT if name in derived else value
                    for name, value in zip(("THETA", "PARTIAL", "SECTION", "ROPE"), entries))
    return (*entries, derived or None)


def _mla_head_dim(cls, base):
    """"kept" where the class keeps a head_dim the config gives apart from qk_rope_head_dim, "rewritten" where it
    sets its own (DeepSeek-V2's qk_rope_head_dim), None where it cannot be built so."""
    rope = base.get("qk_rope_head_dim")
    if type(rope) is not int or rope < 1:
        return None
    given = 2 * rope + 8
    try:
        built = _build(cls, {**base, "head_dim": given}).to_dict()
    except Exception:  # noqa: BLE001  (a class that refuses it, or keeps it per layer: Dots 3's)
        return None
    if built.get("qk_rope_head_dim") != rope:  # one field under two names (GLM-4-MoE-Lite's)
        return None
    return "kept" if built.get("head_dim") == given else "rewritten"


def tables():
    """{"FIELDS": ..., "THETA": ..., "PARTIAL": ..., "ROPE": ...}, each {model type: value}, and skipped notes."""
    out = {name: {} for name in ("FIELDS", "ALIASES", "THETA", "PARTIAL", "SECTION", "ROPE",
                                          "DERIVED", "MLA_HEAD_DIM")}
    texts, skipped = text_configs()
    skipped = list(skipped)
    for model_type, text in texts.items():
        params = getattr(text, "rope_parameters", None)
        if (not isinstance(params, dict) or not params or _axial(params)) and model_type not in MODEL_RULES:
            continue  # no RoPE, or a vision tower's
        cls = type(text)
        try:
            base = _build(cls, {}).to_dict()  # (its own defaults: a composite may build its text part otherwise)
            if isinstance(params, dict) and params and not _axial(params):
                entries = _rope_defaults(cls, model_type, base)
            else:  # a rule without rope_parameters (GPT-J's rotary_dim, ESM's fixed base)
                entries = (_LEFT_OUT,) * 4 + (None,)
        except Exception as error:  # noqa: BLE001  (a class that cannot be built from its own defaults)
            if model_type in MODEL_RULES:
                raise SystemExit(f"{model_type}: {type(error).__name__}: {error}") from None
            skipped.append(model_type)
            continue
        fields, rewritten = _field_defaults(cls, base)
        if _aliases(cls):
            out["ALIASES"][model_type] = _aliases(cls)
        if rewritten:
            entries = (*entries[:4], (entries[4] or []) + rewritten)
        kept = _mla_head_dim(cls, base) if model_type in MODEL_RULES and MODEL_RULES[model_type].mla else None
        if kept:
            out["MLA_HEAD_DIM"][model_type] = kept
        for name, value in zip(("FIELDS", "THETA", "PARTIAL", "SECTION", "ROPE", "DERIVED"), (fields, *entries)):
            if value is not _LEFT_OUT and value != {} and (value is not None or name == "THETA"):
                out[name][model_type] = value
    return out, skipped


def _literal(value):
    if isinstance(value, dict):  # sorted: a class may build it from a set (dots3's layer types)
        return "{" + ", ".join(f"{key!r}: {_literal(value[key])}" for key in sorted(value)) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_literal(item) for item in value) + "]"
    return repr(value)


def _table(name, rows, doc, width=116):
    lines = [f"# {line}" for line in doc] + [f"{name} = {{"]
    line = "   "
    for model_type, value in rows.items():
        item = f" {model_type!r}: {_literal(value)},"
        if len(line) + len(item) > width and line.strip():
            lines.append(line)
            line = "   "
        line += item
    if line.strip():
        lines.append(line)
    lines.append("}")
    return "\n".join(lines)


HEADER = '''"""Defaults of transformers' configuration classes for the keys ``from_hf_config`` reads (generated).

Generated by ``tests/make_hf_defaults.py`` from transformers {version}'s configuration classes: do not edit by
hand; rerun ``PYTHONPATH=src python tests/make_hf_defaults.py --write`` with another transformers
(``tests/test_hf_defaults.py`` fails while this module differs from what that writes).  Plain data: posenc_fast
reads it without transformers installed (``_hf_layers.canonical_config`` fills in FIELDS and ALIASES,
``class_default`` reads THETA, PARTIAL and SECTION, ``class_rope`` ROPE).  Keyed by the ``model_type`` of each
text configuration class (a flat transformers-4 composite config, Qwen2-VL's, takes its ``<model_type>_text``
row).  A model type missing here (a newer transformers' family) gets ``RotaryEmbeddingConfigMixin``'s
defaults: ``rope_theta`` 10000, ``partial_rotary_factor`` 1.0, a ``head_dim`` of
``hidden_size // num_attention_heads``; any other key it needs must be in its config.
"""

TRANSFORMERS_VERSION = {version!r}
'''

DOCS = {
    "FIELDS": ["Each model type's dataclass default of the top-level keys from_hf_config reads (None defaults, which",
               "the class derives, are left out: from_hf_config derives them as its class does, or asks for them)."],
    "ALIASES": ["The attribute_map entries of a class that name a key from_hf_config reads, either side: a config.json",
                "giving the key sets the field (it wins over the field given too), and the field reads as the key",
                "(DBRX's max_position_embeddings is its max_seq_len, GLM-4-MoE-Lite's head_dim its qk_rope_head_dim)."],
    "THETA": ["rope_theta where neither the config's rope parameters nor its flat key (rope_theta, rotary_emb_base,",
              "global_rope_theta, ...) give one: a number, or one per layer type; None where the class fills in none",
              "(its rotary module then fails: from_hf_config asks for it)."],
    "PARTIAL": ["partial_rotary_factor where neither the config's rope parameters nor its flat key give one (a number,",
                "or one per layer type); a model type missing here: 1.0."],
    "SECTION": ["mrope_section where the config's rope parameters give none, for the classes that fill one in (the",
                "others' rotary module defaults: ModelRule.default_section)."],
    "DERIVED": ["What the tables above leave out: a THETA, PARTIAL, SECTION or ROPE entry the class derives from",
                "the config's sizes (a doubled hidden_size / head_dim / qk_rope_head_dim / max_position_embeddings",
                "changes it: from_hf_config asks for it), and a field whose default __post_init__ rewrites (HY-V4-VL's",
                "head_dim is its qk_rope_head_dim: the rule in _hf_models / _hf_config says how)."],
    "ROPE": ["rope_parameters where the config has neither rope_parameters nor rope_scaling, for the classes that",
             "build their own (else only THETA and PARTIAL fill in); a rope_theta the flat key sets is left out."],
    "MLA_HEAD_DIM": ["Per MLA model type: 'kept' where its class keeps a head_dim the config gives apart from",
                     "qk_rope_head_dim (its rotary module then builds cos/sin that wide, and the model fails on them:",
                     "from_hf_config refuses such a config), 'rewritten' where it sets head_dim itself; a type missing",
                     "here is not built so (Dots 3 keeps sizes per layer; GLM-4-MoE-Lite stores both keys in one)."]
}


def module_text():
    found, skipped = tables()
    parts = [HEADER.format(version=transformers.__version__).rstrip("\n")]
    if skipped:
        parts.append(_table("SKIPPED", {name: "not buildable from its own defaults" for name in skipped},
                            ["Model types whose configuration class cannot be built from its own defaults."]))
    for name in ("FIELDS", "ALIASES", "THETA", "PARTIAL", "SECTION", "ROPE", "DERIVED", "MLA_HEAD_DIM"):
        parts.append(_table(name, found[name], DOCS[name]))
    return "\n\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {TARGET.relative_to(TARGET.parents[2])}")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    logging.disable(logging.WARNING)
    text = module_text()
    if args.write:
        TARGET.write_text(text)
        print(f"wrote {TARGET} ({len(text.splitlines())} lines)", file=sys.stderr)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
