"""A config.json that leaves a key out reads as transformers' configuration class reads it (_hf_defaults).

For every text model type of the installed transformers that from_hf_config
reads (the text config of each model type, as tests/hf_walk.py builds it),
each key from_hf_config reads is left out of the config in turn, in the form
a checkpoint would have it: transformers 5's (``rope_parameters``, a key of
it left out too) and transformers 4's (flat ``rope_theta`` + ``rope_scaling``,
the per-model flat keys).  ``from_hf_config`` of that config must give the
same RoPE as ``from_hf_config`` of what the configuration class makes of it
(``ConfigClass(**config).to_dict()``: its defaults filled in), or refuse it
naming the key left out; never another RoPE.  Skipped without torch and
transformers; nothing is downloaded.
"""

import ast
import copy
import logging
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_walk  # noqa: E402  (needs torch)
import transformers  # noqa: E402

import posenc_fast as pf  # noqa: E402
from posenc_fast import _hf_defaults  # noqa: E402
from posenc_fast._hf_models import MODEL_RULES  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import make_hf_defaults  # noqa: E402

CONFIG_MAPPING = hf_walk.configuration_auto.CONFIG_MAPPING
# the top-level keys left out (each where the config has it): every key from_hf_config reads
TOP_KEYS = (make_hf_defaults.FIELD_KEYS + make_hf_defaults.THETA_KEYS + make_hf_defaults.PARTIAL_KEYS
            + ("rope_parameters", "hidden_size", "num_attention_heads", "num_hidden_layers", "layer_types",
               "no_rope_layers", "rope_scaling_layers", "per_layer_config", "partial_rotary_factors"))


def _quiet():
    transformers.logging.set_verbosity_error()
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")


def _text_configs():
    """{text model type: (its configuration class, its default config dict, options, outcomes)} for the model
    types from_hf_config reads (the walk's default configs: CONFIG_OVERRIDES where it has one)."""
    _quiet()
    read = {}
    for model_type, text in make_hf_defaults.text_configs()[0].items():
        if model_type not in MODEL_RULES and model_type not in _hf_defaults.THETA:
            continue  # no RoPE from_hf_config reads (a model type without RoPE, or a vision tower's)
        if model_type in hf_walk.CONFIG_OVERRIDES and model_type in CONFIG_MAPPING:
            text = CONFIG_MAPPING[model_type](**hf_walk.CONFIG_OVERRIDES[model_type])
        data = copy.deepcopy(text.to_dict())
        options = _options(model_type, data)
        outcomes = {repr(option): _outcome(data, option) for option in options}
        if any(not isinstance(value, str) and value["kind"] == "rope" for value in outcomes.values()):
            read[model_type] = (type(text), data, options, outcomes)
    return read


def _options(model_type, data):
    """The from_hf_config keyword arguments to compare: each layer type, an indexer, a NoPE layer."""
    rule = MODEL_RULES.get(model_type)
    names = sorted({name for name in data.get("layer_types") or () if isinstance(name, str)})
    if rule is not None and rule.rope_of_layer:
        names += sorted(set(rule.rope_of_layer.values()))
    options = [{}] + [{"layer_type": name} for name in names]
    if rule is not None and rule.indexer:
        options.append({"attention": "indexer"})
    if rule is not None and rule.rope_layers:
        options += [{"layer": 0}, {"layer": 3}]  # interval 4: layer 3 is a NoPE layer
    return options


def _outcome(data, option):
    """The RoPE from_hf_config gives (as a dict of what it is), or the ValueError's message."""
    try:
        rope = pf.RotaryEmbedding.from_hf_config(data, **option)
    except ValueError as error:
        return str(error)
    if rope.__class__.__name__ != "RotaryEmbedding" or getattr(rope, "_axial", None) is not None:
        return {"kind": "tower"}
    return {"kind": "rope", "dim": rope.dim, "rotary_dim": rope.rotary_dim, "rotary_start": rope.rotary_start,
            "base": rope.base, "layout": rope.layout, "scaling": rope.scaling, "reverse": rope.reverse,
            "inv_freq": rope.inv_freq.tobytes(), "attention_factor": rope.attention_factor,
            "pair_streams": None if rope.pair_streams is None else np.asarray(rope.pair_streams).tolist()}


def _variants(model_type, data, pairs=None):
    """(what is left out, the config.json without it) in each form a checkpoint has it (`pairs`: how many pairs
    its default RoPE rotates, for a LongRoPE's factors)."""
    rule = MODEL_RULES.get(model_type)
    keys = TOP_KEYS + tuple(key for key in ((rule.head_dim_key, rule.theta_key, rule.local_theta_key) if rule else ())
                            if key and key not in TOP_KEYS)
    for key in keys:
        if key in data:
            yield key, key, {name: value for name, value in data.items() if name != key}
    params = data.get("rope_parameters")
    if not isinstance(params, dict):
        return
    nested = [name for name, value in params.items() if isinstance(value, dict)]
    for name in nested or [None]:
        for key in (params[name] if name else params):
            if key not in ("rope_type", "type"):
                changed = copy.deepcopy(params)
                (changed[name] if name else changed).pop(key)
                where = f"rope_parameters[{name!r}]" if name else "rope_parameters"
                yield f"{where}[{key!r}]", key, {**data, "rope_parameters": changed}
    # transformers 4's flat form: rope_theta (or the model's own keys) beside rope_scaling
    flat = {name: value for name, value in data.items() if name != "rope_parameters"}
    theta_key = rule.theta_key if rule else "rope_theta"
    if nested and rule is not None and rule.local_theta_key and set(nested) == {"full_attention", "sliding_attention"}:
        full, sliding = dict(params["full_attention"]), params["sliding_attention"]
        flat[rule.local_theta_key] = sliding.get("rope_theta")
    elif not nested:
        full = dict(params)
    else:
        return  # per layer type: transformers 5's form only
    flat[theta_key] = full.pop("rope_theta", None)
    if full.get("partial_rotary_factor") is not None:
        flat["partial_rotary_factor"] = full.pop("partial_rotary_factor")
    full.pop("partial_rotary_factor", None)
    if full.get("rope_type", full.get("type", "default")) != "default" or set(full) - {"rope_type", "type"}:
        flat["rope_scaling"] = full
    flat = {name: value for name, value in flat.items() if value is not None}
    yield "transformers-4 form", None, flat
    for key in (theta_key, rule.local_theta_key if rule else None, "partial_rotary_factor", "rope_scaling",
                "max_position_embeddings"):
        if key in flat:
            yield f"transformers-4 form without {key!r}", key, {name: value for name, value in flat.items()
                                                               if name != key}
    for key in flat.get("rope_scaling") or ():
        if key not in ("rope_type", "type"):
            scaling = {name: value for name, value in flat["rope_scaling"].items() if name != key}
            yield f"transformers-4 form without rope_scaling[{key!r}]", key, {**flat, "rope_scaling": scaling}
    if "rope_scaling" in flat:
        return
    # a scaled RoPE, where the defaults of max_position_embeddings and original_max_position_embeddings count (a
    # context extended past the class's max_position_embeddings, so that the two differ)
    longer = {key: 2 * flat[key] for key in ("max_position_embeddings",) if isinstance(flat.get(key), int)}
    longrope = {"rope_type": "longrope", "short_factor": [1.0] * (pairs or 0), "long_factor": [2.0] * (pairs or 0)}
    for scaling in ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
                    {"rope_type": "dynamic", "factor": 2.0}) + ((longrope,) if pairs else ()):
        label = f"transformers-4 form with {scaling['rope_type']} rope_scaling"
        scaled = {**flat, **longer, "rope_scaling": {**full, **scaling}}
        yield label, None, scaled
        for key in ("max_position_embeddings", "original_max_position_embeddings"):
            if key in scaled:
                yield f"{label} without {key!r}", key, {name: value for name, value in scaled.items() if name != key}


def _shown(outcome):
    if isinstance(outcome, dict) and "inv_freq" in outcome:
        outcome = {**outcome, "inv_freq": np.frombuffer(outcome["inv_freq"])[:3].tolist() + ["..."]}
    return outcome


def _lacks_theta(filled, option):
    """The RoPE `option` reads has no rope_theta in the class's config (its rotary module fails on it)."""
    params = filled.get("rope_parameters")
    if not isinstance(params, dict) or not params:
        return False
    nested = {name: value for name, value in params.items() if isinstance(value, dict)}
    if not nested:
        return "rope_theta" not in params
    name = option.get("layer_type")
    declared = set(filled.get("layer_types") or ()) & set(nested)  # (the layer types its layers are)
    chosen = [nested[name]] if name in nested else [nested[key] for key in declared] if name is None else []
    return any("rope_theta" not in value for value in chosen)


# (model type, what is left out): where from_hf_config reads a RoPE that transformers' reading has none of, and why
UNLIKE_TRANSFORMERS = {
    ("cohere2_moe", "rope_parameters['rope_theta']"):
        "Cohere2MoeConfig does not put its top-level rope_theta into rope_parameters that lack one (its rotary "
        "module then fails on the missing key); from_hf_config reads that rope_theta, as the other classes do",
}

TEXT_CONFIGS = _text_configs()


def test_the_table_is_what_the_script_writes():
    _quiet()
    assert _hf_defaults.TRANSFORMERS_VERSION == transformers.__version__, (
        f"_hf_defaults was generated from transformers {_hf_defaults.TRANSFORMERS_VERSION}, transformers "
        f"{transformers.__version__} is installed: rerun PYTHONPATH=src python tests/make_hf_defaults.py --write")
    written = Path(_hf_defaults.__file__).read_text()
    assert make_hf_defaults.module_text() == written, (
        "src/posenc_fast/_hf_defaults.py differs from what tests/make_hf_defaults.py writes with the installed "
        "transformers: rerun PYTHONPATH=src python tests/make_hf_defaults.py --write")


def test_the_table_is_plain_data():
    tree = ast.parse(Path(_hf_defaults.__file__).read_text())
    assert not [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def test_every_rule_has_class_defaults():
    assert set(MODEL_RULES) - set(_hf_defaults.THETA) - set(_hf_defaults.FIELDS) == set()
    # (HunYuan-VL's default config has no mrope_section, which its rotary module needs: the walk's override
    # gives HunyuanOCR's four axes)
    assert set(MODEL_RULES) - set(TEXT_CONFIGS) == set()


@pytest.mark.parametrize("model_type", sorted(TEXT_CONFIGS))
def test_a_key_left_out_reads_as_the_class_fills_it(model_type):
    _quiet()
    cls, data, options, outcomes = TEXT_CONFIGS[model_type]
    wrong, unlike = [], set()
    pairs = outcomes[repr({})]["rotary_dim"] // 2 if isinstance(outcomes[repr({})], dict) else None
    for label, key, stripped in _variants(model_type, data, pairs):
        try:
            filled = cls(**copy.deepcopy(stripped)).to_dict()
        except Exception:  # noqa: BLE001  (transformers refuses that config.json: nothing to agree with)
            continue
        same = filled == data  # (its class fills in what was left out: what transformers saved)
        for option in options:
            want = outcomes[repr(option)] if same else _outcome(filled, option)
            got = _outcome(stripped, option)
            if not isinstance(want, str) and _lacks_theta(filled, option):
                want = "its rotary module fails: the class leaves rope_theta out"
            if want == got or isinstance(want, str) and isinstance(got, str):
                continue  # agrees, or refused both ways
            if isinstance(got, str) and key is not None and repr(key) in got:
                continue  # refused, naming the key the config must give
            if isinstance(got, dict) and isinstance(want, dict):
                got = {name: value for name, value in got.items() if want.get(name) != value}
                want = {name: want[name] for name in got}
            if (model_type, label) in UNLIKE_TRANSFORMERS:
                unlike.add(label)
                continue
            want, got = (_shown(value) for value in (want, got))
            wrong.append(f"{label} {option or ''}: transformers {want}, from_hf_config {got}")
    assert not wrong, "\n".join(wrong)
    listed = {label for listed_type, label in UNLIKE_TRANSFORMERS if listed_type == model_type}
    assert listed == unlike, f"listed in UNLIKE_TRANSFORMERS but agrees now: {sorted(listed - unlike)}"
