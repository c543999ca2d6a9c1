"""from_hf_config of a vision tower's config: its 2-D (axial) RoPE, checked against the tower's own code.

Every configuration class of the installed transformers whose default RoPE
is ``"axial"``: a tower in ``_hf_towers.TOWER_RULES`` gives
``RotaryEmbedding.axial`` with its rule's options, whose cos/sin equal the
tower's rotary module's (to float32 rounding; both features of each pair)
and whose rotation of random q/k equals the rotation the tower's attention
calls, positions (h, w) (t, h, w) mapped to the module's own
``position_ids`` columns.  A tower in ``REFUSED_TOWERS`` is refused with its
reason (every tower found is in one of the two tables; one they lack is
refused with the message that it has no rule), and no refused tower may agree
with any reading ``RotaryEmbedding.axial`` offers (so the tables cannot go
stale).  The towers of ``NAMED_TOWERS`` (configs saying ``"default"``, rotary
modules of their own shapes) have a test each: Llama 4's and EfficientLoFTR's
against their own cos/sin and rotation, DINOv3's refusal and the recipe it
names.
"""

import copy
import inspect
import itertools
import re
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers.models.auto import configuration_auto  # noqa: E402

import posenc_fast as pf  # noqa: E402
from posenc_fast._hf_probe import modeling_module  # noqa: E402
from posenc_fast._hf_towers import AXIAL_TOWERS, NAMED_TOWERS, REFUSED_TOWERS, TOWER_RULES  # noqa: E402


def _axial_types():
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for model_type in sorted(configuration_auto.CONFIG_MAPPING_NAMES):
            try:
                params = configuration_auto.CONFIG_MAPPING[model_type]().to_dict().get("rope_parameters")
            except Exception:  # a config class that needs arguments: not a tower with a default RoPE
                continue
            if isinstance(params, dict) and params.get("rope_type") == "axial":
                found.append(model_type)
    return found


AXIAL_TYPES = _axial_types()
SAM = ("sam3_vit_model", "sam2_video", "sam3_tracker_video", "edgetam_video")
# the module's position_ids column c holds our axis COLUMNS[c] (SAM's: w, h; see test_sam_position_columns)
COLUMNS = {model_type: (1, 0) for model_type in SAM}
BATCHED = {"gemma4_vision"}  # its rotary module takes (batch, patches, 2) positions


def _heads_first(name, **extra):
    def rotation(module, q, k, cos, sin, _positions):
        q_rot, k_rot = getattr(module, name)(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin, **extra)
        return q_rot[0].transpose(0, 1), k_rot[0].transpose(0, 1)
    return rotation


def _gemma4(module, q, k, cos, sin, positions):
    return tuple(module.apply_multidimensional_rope(x[None], cos, sin, positions)[0] for x in (q, k))


# the rotation each tower's attention calls, on q and k of shape (patches, heads, head_dim); the others call
# apply_rotary_pos_emb_vision(q, k, cos, sin) on that shape
ROTATIONS = {
    "pixtral": _heads_first("apply_rotary_pos_emb", unsqueeze_dim=0),
    "sam3_vit_model": _heads_first("apply_rotary_pos_emb_2d"),
    "sam2_video": _heads_first("apply_rotary_pos_emb_2d"),
    "sam3_tracker_video": _heads_first("apply_rotary_pos_emb_2d"),
    "edgetam_video": _heads_first("apply_rotary_pos_emb_2d_self_attn"),
    "gemma4_vision": _gemma4,
}

# the class whose precompute_positions makes a SAM tower's position_ids, and its arguments after the config
SAM_POSITIONS = {"sam3_vit_model": ("Sam3ViTLayer", (0,)), "sam2_video": ("Sam2VideoMemoryAttention", ()),
                 "sam3_tracker_video": ("Sam3TrackerVideoMemoryAttention", ()),
                 "edgetam_video": ("EdgeTamVideoMemoryAttention", ())}


def _config(model_type):
    return configuration_auto.CONFIG_MAPPING[model_type]()


def _tower(model_type):
    """The tower's rotary module (built from its default config) and its module, or None."""
    module = modeling_module(model_type)
    classes = [] if module is None else [
        c for name, c in vars(module).items() if inspect.isclass(c) and c.__module__ == module.__name__
        and name.endswith("RotaryEmbedding") and "compute_axial_rope_parameters" in vars(c)]
    return (classes[0](_config(model_type)), module) if len(classes) == 1 else (None, module)


def _positions(model_type, n_axes, rng):
    """Our positions of 9 patches, (n_axes, 9): random (h, w) below 40; SAM 3's ViT's own (scaled) ones."""
    if model_type == "sam3_vit_model":
        name, extra = SAM_POSITIONS[model_type]
        own = getattr(modeling_module(model_type), name).precompute_positions(_config(model_type), *extra)
        rows = own.double().numpy()[rng.choice(own.shape[0], 9, replace=False)]
        return rows[:, [1, 0]].T  # its columns are (w, h)
    return rng.integers(0, 40, (n_axes, 9)).astype(np.float64)


def _pair_features(rope):
    half = rope.rotary_dim // 2
    if rope.layout == "half":
        return [(j, j + half) for j in range(half)]
    return [(2 * j, 2 * j + 1) for j in range(half)]


def _agrees(model_type, rope):
    """The tower's cos/sin (both features of each pair) and its rotation equal `rope`'s."""
    rotary, module = _tower(model_type)
    if rotary is None:
        return False
    rng = np.random.default_rng(0)
    ours = _positions(model_type, rope.n_streams, rng)
    theirs = torch.from_numpy(ours[list(COLUMNS.get(model_type, range(len(ours))))].T.copy())
    if model_type in BATCHED:
        theirs = theirs[None]
    try:
        with torch.no_grad():
            out = rotary(torch.zeros(1), theirs)
    except Exception:
        return False
    cos, sin = (t.double().numpy().reshape(-1, t.shape[-1]) for t in out)
    # transformers forms inv_freq (a few float32 ulps off when head_dim / 2 is no power of two, see
    # test_frequencies.py) and the angles (up to 40 rad) in float32
    atol = 40 * 16 * 2.0**-24 + 2.0**-19
    want_cos, want_sin = rope.cos_sin(ours, dtype=np.float64)
    if cos.shape != (9, rope.rotary_dim):
        return False
    for j, (a, b) in enumerate(_pair_features(rope)):
        for theirs_table, want in ((cos, want_cos), (sin, want_sin)):
            if not (np.allclose(theirs_table[:, a], want[:, j], rtol=0, atol=atol)
                    and np.allclose(theirs_table[:, b], want[:, j], rtol=0, atol=atol)):
                return False
    q, k = (rng.standard_normal((9, 3, rope.dim)).astype(np.float32) for _ in range(2))
    rotation = ROTATIONS.get(model_type, lambda module, q, k, cos, sin, _: module.apply_rotary_pos_emb_vision(
        q, k, cos, sin))
    with torch.no_grad():
        q_hf, k_hf = rotation(module, torch.from_numpy(q), torch.from_numpy(k), *out, theirs)
    q_ours, k_ours = rope.apply_qk(q, k, ours[:, :, None])
    scale = 2 * atol * max(np.abs(q).max(), np.abs(k).max()) + 1e-6
    return (np.allclose(q_ours, q_hf.numpy(), rtol=0, atol=scale)
            and np.allclose(k_ours, k_hf.numpy(), rtol=0, atol=scale))


def _readings(config):
    """Every RotaryEmbedding.axial reading of a tower's whole head by 2 axes: none may agree with a refused one."""
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    for layout, order, pairs, frequencies in itertools.product(
            ("half", "interleaved"), ((0, 1), (1, 0)), ("blocks", "alternating"), ("shared", "split")):
        yield pf.RotaryEmbedding.axial(dim, base=config.rope_parameters["rope_theta"], layout=layout,
                                       axis_order=order, pairs=pairs, frequencies=frequencies)


def test_the_walk_found_the_towers():
    assert len(AXIAL_TYPES) >= 30 and {"qwen2_vl_vision", "qwen2_5_vl_vision", "glm4v_vision"} <= set(AXIAL_TYPES)
    assert AXIAL_TOWERS <= set(TOWER_RULES) and not set(TOWER_RULES) & set(REFUSED_TOWERS)
    # every tower has a rule or a reason: a new one is neither read by a guess nor refused without saying why
    assert not NAMED_TOWERS & set(AXIAL_TYPES) and NAMED_TOWERS <= set(configuration_auto.CONFIG_MAPPING_NAMES)
    assert set(TOWER_RULES) | set(REFUSED_TOWERS) == set(AXIAL_TYPES) | NAMED_TOWERS


@pytest.mark.parametrize("model_type", AXIAL_TYPES)
def test_a_towers_axial_rope(model_type):
    config = _config(model_type)
    if model_type in TOWER_RULES:
        rope = pf.RotaryEmbedding.from_hf_config(config.to_dict())
        rule = TOWER_RULES[model_type]
        assert rope.n_streams == rule.n_axes and rope.layout == rule.layout
        assert _agrees(model_type, rope)
        return
    reason = REFUSED_TOWERS.get(model_type, "has not read from its rotary module")
    with pytest.raises(ValueError, match=re.escape(reason)):
        pf.RotaryEmbedding.from_hf_config(config.to_dict())
    agreeing = [repr(rope) for rope in _readings(config) if _agrees(model_type, rope)]
    assert not agreeing, f"{model_type} agrees with {agreeing}: give it that rule in _hf_towers.TOWER_RULES"


@pytest.mark.parametrize("model_type", sorted(TOWER_RULES))
def test_a_tower_config_without_rope_theta_takes_its_classs(model_type):
    # a config.json whose rope parameters leave rope_theta out: the class's default_theta (LFM3-VL's 1e6)
    config_class = configuration_auto.CONFIG_MAPPING[model_type]
    raw = config_class().to_dict()
    raw.pop("rope_theta", None)
    if isinstance(raw.get("rope_parameters"), dict):
        raw["rope_parameters"] = {k: v for k, v in raw["rope_parameters"].items() if k != "rope_theta"}
    given = copy.deepcopy({k: v for k, v in raw.items() if k != "model_type"})  # (the class fills it in place)
    params = config_class(**given).to_dict().get("rope_parameters")
    want = (params or {}).get("rope_theta", getattr(config_class, "default_theta", 10000.0))
    assert pf.RotaryEmbedding.from_hf_config(raw).base == want


@pytest.mark.parametrize("key, value", [("num_attention_heads", "4"), ("num_attention_heads", True),
                                        ("head_dim", "16"), ("num_heads", 2.5)])
def test_a_towers_head_keys_are_checked(key, value):
    # a string was a TypeError from inside, True one head, a string head_dim a message naming dim
    config = {"model_type": "qwen2_vl_vision", "embed_dim": 64, "num_attention_heads": 4,
              "rope_parameters": {"rope_type": "axial", "rope_theta": 1e4}}
    config = {k: v for k, v in {**config, key: value}.items() if not (key == "num_heads" and k == "num_attention_heads")}
    with pytest.raises(ValueError, match=f"'{key}' must be an int >= 1, got {value!r}"):
        pf.RotaryEmbedding.from_hf_config(config)


def test_gemma4_vision_is_the_two_one_dimensional_ropes_its_refusal_names():
    config = _config("gemma4_vision")
    dim, base = config.head_dim, config.rope_parameters["rope_theta"]
    rotary, module = _tower("gemma4_vision")
    hw = np.random.default_rng(1).integers(0, 40, (2, 9))
    q = np.random.default_rng(2).standard_normal((9, 3, dim)).astype(np.float32)
    positions = torch.from_numpy(hw.T.copy())[None]
    with torch.no_grad():
        cos, sin = rotary(torch.zeros(1), positions)
        want = module.apply_multidimensional_rope(torch.from_numpy(q)[None], cos, sin, positions)[0].numpy()
    by_h = pf.RotaryEmbedding(dim, rotary_dim=dim // 2, layout="half", base=base)
    by_w = pf.RotaryEmbedding(dim, rotary_dim=dim // 2, rotary_start=dim // 2, layout="half", base=base)
    got = by_w.apply(by_h.apply(q, hw[0][:, None]), hw[1][:, None])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(q).max())


@pytest.mark.parametrize("model_type", SAM)
def test_sam_position_columns(model_type):
    # the model's own position_ids: column 0 is w (fastest in raster order), column 1 h, hence axis_order (1, 0)
    name, extra = SAM_POSITIONS[model_type]
    positions = getattr(modeling_module(model_type), name).precompute_positions(_config(model_type), *extra)
    positions = positions.double().numpy()
    step = positions[1, 0]
    w, h = np.unique(positions[:, 0]).size, np.unique(positions[:, 1]).size
    assert w > 1 and h > 1 and TOWER_RULES[model_type].axis_order == (1, 0)
    np.testing.assert_allclose(positions[:, 0], np.tile(np.arange(w), h) * step, rtol=1e-6)
    np.testing.assert_allclose(positions[:, 1], np.repeat(np.arange(h), w) * step, rtol=1e-6)


# (transformers forms the angles, up to 40 rad, in float32)
ATOL = 40 * 16 * 2.0**-24 + 2.0**-19


def _same_pairs(theirs, want, features):
    """theirs (tokens, features) holds want (tokens, pairs) at both features of each pair."""
    for j, (a, b) in enumerate(features):
        np.testing.assert_allclose(theirs[:, a], want[:, j], rtol=0, atol=ATOL)
        np.testing.assert_allclose(theirs[:, b], want[:, j], rtol=0, atol=ATOL)


def test_llama4_vision_model():
    config = _config("llama4_vision_model")
    module = modeling_module("llama4_vision_model")
    rope = pf.RotaryEmbedding.from_hf_config(config.to_dict())
    dim = config.hidden_size // config.num_attention_heads
    assert (rope.dim, rope.layout, rope.base) == (dim, "interleaved", config.rope_parameters["rope_theta"])
    grid = config.image_size // config.patch_size
    freqs_ci = module.Llama4VisionRotaryEmbedding(config)(torch.zeros(1)).numpy()  # (grid**2 + 1, 1, dim // 2)
    rng = np.random.default_rng(3)
    tokens = np.append(rng.choice(grid * grid, 8, replace=False), grid * grid)  # and the class token, the last
    row, col = np.divmod(tokens, grid)
    ours = np.stack([row + 1, col + 1]).astype(np.float64)  # its positions are 1-based ...
    ours[:, -1] = 0  # ... and its class token's angles 0
    want_cos, want_sin = rope.cos_sin(ours, dtype=np.float64)
    np.testing.assert_allclose(freqs_ci[tokens, 0].real, want_cos, rtol=0, atol=ATOL)
    np.testing.assert_allclose(freqs_ci[tokens, 0].imag, want_sin, rtol=0, atol=ATOL)
    q, k = (rng.standard_normal((9, 3, dim)).astype(np.float32) for _ in range(2))
    with torch.no_grad():
        q_hf, k_hf = module.vision_apply_rotary_emb(torch.from_numpy(q)[None], torch.from_numpy(k)[None],
                                                    torch.from_numpy(freqs_ci[tokens]))
    q_ours, k_ours = rope.apply_qk(q, k, ours[:, :, None])
    scale = 2 * ATOL * max(np.abs(q).max(), np.abs(k).max())
    np.testing.assert_allclose(q_ours, q_hf[0].numpy(), rtol=0, atol=scale)
    np.testing.assert_allclose(k_ours, k_hf[0].numpy(), rtol=0, atol=scale)
    np.testing.assert_array_equal(q_ours[-1], q[-1])  # the class token passes


def test_efficientloftr():
    config = _config("efficientloftr")
    module = modeling_module("efficientloftr")
    rope = pf.RotaryEmbedding.from_hf_config(config.to_dict())
    # its attention rotates q and k of the whole hidden_size, before they are split into heads
    assert (rope.dim, rope.layout) == (config.hidden_size, "interleaved")
    stride, kernel = config.q_aggregation_stride, config.q_aggregation_kernel_size
    height, width = 6, 7  # the aggregated grid of a (1, c, kernel + 5 * stride, kernel + 6 * stride) feature map
    features = torch.zeros(1, 1, kernel + (height - 1) * stride, kernel + (width - 1) * stride)
    with torch.no_grad():
        cos, sin = module.EfficientLoFTRRotaryEmbedding(config)(features)
    cos, sin = (t.double().numpy().reshape(height * width, -1) for t in (cos, sin))
    rng = np.random.default_rng(4)
    tokens = rng.choice(height * width, 9, replace=False)
    ours = np.stack(np.divmod(tokens, width)).astype(np.float64) + 1  # its positions are 1-based (cumsum)
    want_cos, want_sin = rope.cos_sin(ours, dtype=np.float64)
    pairs = [(2 * j, 2 * j + 1) for j in range(rope.dim // 2)]
    _same_pairs(cos[tokens], want_cos, pairs)
    _same_pairs(sin[tokens], want_sin, pairs)
    q, k = (rng.standard_normal((9, 1, rope.dim)).astype(np.float32) for _ in range(2))
    with torch.no_grad():
        q_hf, k_hf = module.apply_rotary_pos_emb(torch.from_numpy(q)[None], torch.from_numpy(k)[None],
                                                 torch.from_numpy(cos[tokens])[None],
                                                 torch.from_numpy(sin[tokens])[None], unsqueeze_dim=2)
    q_ours, k_ours = rope.apply_qk(q, k, ours[:, :, None])
    scale = 2 * ATOL * max(np.abs(q).max(), np.abs(k).max())
    np.testing.assert_allclose(q_ours, q_hf[0].numpy(), rtol=0, atol=scale)
    np.testing.assert_allclose(k_ours, k_hf[0].numpy(), rtol=0, atol=scale)


@pytest.mark.parametrize("change, message", [
    (dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}), "has no scaled frequencies"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 2.0}),
     r"base \*\* \(-2i / 64\)"),
])
def test_efficientloftr_refused_where_axial_cannot_say_it(change, message):
    config = {**_config("efficientloftr").to_dict(), **change}
    with pytest.raises(ValueError, match=message):
        pf.RotaryEmbedding.from_hf_config(config)


DINOV3 = {"dinov3_vit": "DINOv3ViTRopePositionEmbedding", "eomt_dinov3": "EomtDinov3RotaryEmbedding",
          "sapiens2": "Sapiens2RopePositionEmbedding"}


@pytest.mark.parametrize("model_type", sorted(DINOV3))
def test_dinov3_refused_and_the_recipe_it_names(model_type):
    config = _config(model_type)
    with pytest.raises(ValueError, match=re.escape(REFUSED_TOWERS[model_type])):
        pf.RotaryEmbedding.from_hf_config(config.to_dict())
    assert "normalised to [-1, 1] by the image's patch grid" in REFUSED_TOWERS[model_type]
    # the recipe: RotaryEmbedding.axial(head_dim, base=rope_theta) at 2 * pi * c, the patch tokens only
    module = modeling_module(model_type)
    dim = config.hidden_size // config.num_attention_heads
    theta = getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]
    rope = pf.RotaryEmbedding.axial(dim, base=theta)
    height, width = 3, 5
    rotary = getattr(module, DINOV3[model_type])(config).eval()
    with torch.no_grad():
        cos, sin = rotary(torch.zeros(1, 3, height * config.patch_size, width * config.patch_size))
    c_h, c_w = (2 * (np.arange(n) + 0.5) / n - 1 for n in (height, width))
    ours = 2 * np.pi * np.stack([np.repeat(c_h, width), np.tile(c_w, height)])
    want_cos, want_sin = rope.cos_sin(ours, dtype=np.float64)
    pairs = [(j, j + dim // 2) for j in range(dim // 2)]
    _same_pairs(cos.double().numpy(), want_cos, pairs)
    _same_pairs(sin.double().numpy(), want_sin, pairs)
    prefix = 1 + config.num_register_tokens
    rng = np.random.default_rng(5)
    q, k = (rng.standard_normal((prefix + height * width, 2, dim)).astype(np.float32) for _ in range(2))
    with torch.no_grad():
        q_hf, k_hf = module.apply_rotary_pos_emb(*(torch.from_numpy(x).transpose(0, 1)[None] for x in (q, k)),
                                                 cos, sin)
    scale = 2 * ATOL * max(np.abs(q).max(), np.abs(k).max())
    for x, x_hf in ((q, q_hf), (k, k_hf)):
        x_hf = x_hf[0].transpose(0, 1).numpy()
        np.testing.assert_array_equal(x_hf[:prefix], x[:prefix])
        np.testing.assert_allclose(rope.apply(x[prefix:], ours[:, :, None]), x_hf[prefix:], rtol=0, atol=scale)


@pytest.mark.parametrize("model_type", ["llama4_vision_model", "efficientloftr"])
def test_named_towers_read_the_transformers_4_form(model_type):
    # a config.json of transformers 4: rope_theta (and partial_rotary_factor) at the top, no rope_parameters
    config = _config(model_type).to_dict()
    flat = {key: value for key, value in config.items() if key != "rope_parameters"}
    flat.update({key: value for key, value in config["rope_parameters"].items() if key != "rope_type"})
    flat["rope_theta"] = 500.0
    want = pf.RotaryEmbedding.from_hf_config({**config, "rope_parameters": {**config["rope_parameters"],
                                                                            "rope_theta": 500.0}})
    got = pf.RotaryEmbedding.from_hf_config(flat)
    assert repr(got) == repr(want) and got.base == 500.0
