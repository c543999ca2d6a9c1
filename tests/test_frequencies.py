"""Tests of the RoPE frequency layer against transformers' fixtures and closed forms.

transformers evaluates inv_freq in float32: it rounds the exponent ``2i/d`` to
float32, then takes ``powf``, a reciprocal and (for yarn, llama3, longrope)
a few more float32 operations. None of that is correctly rounded, so our
float64 values rounded to float32 are compared within an error budget of
``3 + |ln(inv_freq_i)|`` float32 ulps when ``d`` is not a power of two (the
exponent's rounding error, ``2i/d * 2**-24`` relative, grows by
``ln(base) * 2i/d = |ln(inv_freq_i)|`` through the power) and 3 ulps when it is
(the exponent is then exact). Attention factors are Python floats in both and
are compared to 1e-7 relative.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_matches_hf

import posenc_fast as pf
from posenc_fast._frequencies import RopeFrequencies, resolve_rope_scaling

FIXTURES = Path(__file__).parent / "fixtures"
METHODS = json.loads((FIXTURES / "rope_methods.json").read_text())["cases"]


def resolve(case) -> RopeFrequencies:
    return resolve_rope_scaling(case["scaling"], rotary_dim=case["rotary_dim"], base=case["rope_theta"])


# --------------------------------------------------------------------------- fixtures


@pytest.mark.parametrize("case", METHODS, ids=[c["name"] for c in METHODS])
def test_inv_freq_matches_transformers(case):
    freqs = resolve(case)
    assert_matches_hf(freqs.inv_freq, case["inv_freq"], case["rotary_dim"])
    assert freqs.attention_factor == pytest.approx(case["attention_scaling"], rel=1e-7)


@pytest.mark.parametrize(
    "case", [c for c in METHODS if c["by_seq_len"]], ids=[c["name"] for c in METHODS if c["by_seq_len"]]
)
def test_length_dependent_matches_transformers(case):
    freqs = resolve(case)
    assert freqs.depends_on_length
    for entry in case["by_seq_len"]:
        assert_matches_hf(freqs.inv_freq_for(entry["seq_len"]), entry["inv_freq"], case["rotary_dim"])
        assert freqs.attention_factor_for(entry["seq_len"]) == pytest.approx(entry["attention_scaling"], rel=1e-7)


def test_fixtures_cover_every_transformers_method():
    methods = {c["scaling"]["rope_type"] if c["scaling"] else "default" for c in METHODS}
    assert methods == {"default", "linear", "dynamic", "yarn", "llama3", "longrope"}


# --------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("rotary_dim,base", [(2, 10000.0), (64, 10000.0), (96, 1e6), (128, 500000.0)])
def test_default_closed_form(rotary_dim, base):
    i = np.arange(rotary_dim // 2)
    expected = base ** (-2.0 * i / rotary_dim)
    freqs = resolve_rope_scaling(None, rotary_dim=rotary_dim, base=base)
    np.testing.assert_allclose(freqs.inv_freq, expected, rtol=4e-16, atol=0)
    assert freqs.rope_type == "default" and freqs.params is None
    assert freqs.attention_factor == 1.0 and not freqs.depends_on_length
    explicit = resolve_rope_scaling({"rope_type": "default"}, rotary_dim=rotary_dim, base=base)
    np.testing.assert_array_equal(explicit.inv_freq, freqs.inv_freq)


def test_linear_is_inv_freq_over_factor():
    plain = resolve_rope_scaling(None, rotary_dim=64, base=10000.0).inv_freq
    one = resolve_rope_scaling({"rope_type": "linear", "factor": 1.0}, rotary_dim=64, base=10000.0)
    np.testing.assert_array_equal(one.inv_freq, plain)
    four = resolve_rope_scaling({"type": "linear", "factor": 4}, rotary_dim=64, base=10000.0)
    np.testing.assert_array_equal(four.inv_freq, plain / 4.0)
    assert four.params == {"rope_type": "linear", "factor": 4.0}


@pytest.mark.parametrize("factor", [1.0, 2.0, 8.0])
def test_ntk_closed_form(factor):
    d, base = 64, 10000.0
    freqs = resolve_rope_scaling({"rope_type": "ntk", "factor": factor}, rotary_dim=d, base=base)
    new_base = base * factor ** (d / (d - 2))
    np.testing.assert_allclose(freqs.inv_freq, new_base ** (-np.arange(0, d, 2) / d), rtol=1e-15)
    assert freqs.attention_factor == 1.0 and not freqs.depends_on_length


def test_dynamic_unchanged_up_to_original_and_grows_after():
    d, base, original = 64, 10000.0, 2048
    freqs = resolve_rope_scaling(
        {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": original},
        rotary_dim=d, base=base,
    )
    plain = resolve_rope_scaling(None, rotary_dim=d, base=base).inv_freq
    np.testing.assert_array_equal(freqs.inv_freq, plain)
    for seq_len in (1, 100, original):
        assert freqs.inv_freq_for(seq_len) is freqs.inv_freq
    previous = plain
    for seq_len in (original + 1, 4096, 10**6):
        grown = freqs.inv_freq_for(seq_len)
        assert grown[0] == 1.0 and np.all(grown[1:] < previous[1:])
        new_base = base * (2.0 * seq_len / original - 1.0) ** (d / (d - 2))
        np.testing.assert_allclose(grown, new_base ** (-np.arange(0, d, 2) / d), rtol=1e-15)
        previous = grown
    assert freqs.inv_freq_for(4096) is freqs.inv_freq_for(4096)  # cached


@pytest.mark.parametrize("seq_len", [10**300, 10**308, 2**1100], ids=["power past float64", "inf product", "past float"])
def test_dynamic_base_that_overflows_is_refused(seq_len):
    # 10**300: the power overflows (OverflowError); 10**308: factor * seq_len is inf, silently
    freqs = resolve_rope_scaling({"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 16},
                                 rotary_dim=8, base=10000.0)
    with pytest.raises(ValueError, match="dynamic NTK: the base for seq_len=.* overflows float64"):
        freqs.inv_freq_for(seq_len)


@pytest.mark.parametrize("scaling", [
    {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 2**63},
    {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
     "original_max_position_embeddings": 2**64}])
def test_an_original_length_past_int64_builds(scaling):
    # it was an OverflowError; its calls rotate as with any original length past their positions
    rope = pf.RotaryEmbedding(8, scaling=scaling)
    shorter = pf.RotaryEmbedding(8, scaling={**scaling, "original_max_position_embeddings": 2**41})
    x = np.ones((3, 8))
    np.testing.assert_array_equal(rope.apply(x, [0, 5, 2**40]), shorter.apply(x, [0, 5, 2**40]))


def test_longrope_switches_exactly_after_original():
    d, base, original = 8, 10000.0, 4096
    short, long = [1.0, 1.5, 2.0, 2.5], [1.0, 4.0, 16.0, 64.0]
    freqs = resolve_rope_scaling(
        {"rope_type": "longrope", "short_factor": short, "long_factor": long,
         "original_max_position_embeddings": original, "factor": 32.0},
        rotary_dim=d, base=base,
    )
    plain = resolve_rope_scaling(None, rotary_dim=d, base=base).inv_freq
    assert freqs.depends_on_length
    np.testing.assert_allclose(freqs.inv_freq, plain / short, rtol=1e-15)
    assert freqs.inv_freq_for(original) is freqs.inv_freq
    np.testing.assert_allclose(freqs.inv_freq_for(original + 1), plain / long, rtol=1e-15)
    assert freqs.attention_factor == pytest.approx(math.sqrt(1 + math.log(32.0) / math.log(original)), rel=1e-15)
    assert freqs.attention_factor_for(original + 1) == freqs.attention_factor


@pytest.mark.parametrize(
    "extra,expected",
    [({"factor": 1.0}, 1.0), ({}, 1.0), ({"factor": 0.5}, 1.0), ({"factor": 32.0, "attention_factor": 1.5}, 1.5)],
)
def test_longrope_attention_factor(extra, expected):
    scaling = {"rope_type": "su", "short_factor": [1.0], "long_factor": [2.0],
               "original_max_position_embeddings": 4096, **extra}
    freqs = resolve_rope_scaling(scaling, rotary_dim=2, base=10000.0)
    assert freqs.rope_type == "longrope"
    assert freqs.attention_factor == expected


@pytest.mark.parametrize(
    "extra,expected",
    [
        ({}, 0.1 * math.log(4.0) + 1.0),
        ({"mscale": 0.707, "mscale_all_dim": 1.0}, (0.0707 * math.log(4.0) + 1) / (0.1 * math.log(4.0) + 1)),
        ({"mscale": 1.0, "mscale_all_dim": 1.0}, 1.0),
        ({"mscale": 0.707}, 0.1 * math.log(4.0) + 1.0),
        ({"mscale": 0, "mscale_all_dim": 1.0}, 0.1 * math.log(4.0) + 1.0),  # 0 counts as absent, as in HF
        ({"attention_factor": 0.8, "mscale": 2.0, "mscale_all_dim": 1.0}, 0.8),
    ],
)
def test_yarn_attention_factor(extra, expected):
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, **extra}
    freqs = resolve_rope_scaling(scaling, rotary_dim=64, base=10000.0)
    assert freqs.attention_factor == pytest.approx(expected, rel=1e-15)


def test_yarn_ramp_ends():
    d, base, factor = 64, 10000.0, 4.0
    plain = resolve_rope_scaling(None, rotary_dim=d, base=base).inv_freq
    freqs = resolve_rope_scaling(
        {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": 4096}, rotary_dim=d, base=base
    )
    # fastest frequencies extrapolate (unchanged), slowest interpolate (divided by factor)
    assert freqs.inv_freq[0] == plain[0]
    assert freqs.inv_freq[-1] == pytest.approx(plain[-1] / factor, rel=1e-15)
    assert freqs.params["beta_fast"] == 32.0 and freqs.params["beta_slow"] == 1.0 and freqs.params["truncate"]
    one = resolve_rope_scaling(
        {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 4096}, rotary_dim=d, base=base
    )
    np.testing.assert_allclose(one.inv_freq, plain, rtol=1e-15)
    assert one.attention_factor == 1.0


def test_llama3_bands():
    d, base = 128, 500000.0
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    plain = resolve_rope_scaling(None, rotary_dim=d, base=base).inv_freq
    freqs = resolve_rope_scaling(scaling, rotary_dim=d, base=base)
    wavelen = 2 * math.pi / plain
    high = wavelen < 8192 / 4.0
    low = wavelen > 8192 / 1.0
    np.testing.assert_array_equal(freqs.inv_freq[high], plain[high])
    np.testing.assert_array_equal(freqs.inv_freq[low], plain[low] / 8.0)
    middle = ~high & ~low
    assert middle.any()
    assert np.all(freqs.inv_freq[middle] < plain[middle]) and np.all(freqs.inv_freq[middle] > plain[middle] / 8.0)


# --------------------------------------------------------------------------- the object


def test_result_is_immutable_and_read_only():
    freqs = resolve_rope_scaling(
        {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 16}, rotary_dim=8, base=100.0
    )
    for array in (freqs.inv_freq, freqs.inv_freq_for(1), freqs.inv_freq_for(100)):
        assert array.dtype == np.float64 and array.shape == (4,) and not array.flags.writeable
        with pytest.raises(ValueError):
            array[0] = 2.0
    with pytest.raises(AttributeError):
        freqs.rope_type = "linear"
    with pytest.raises(AttributeError):
        freqs.inv_freq = np.zeros(4)
    params = freqs.params
    params["factor"] = 99.0
    assert freqs.params["factor"] == 2.0
    assert "dynamic" in repr(freqs)


def test_params_normalised():
    scaling = {"type": "su", "short_factor": [1, 2], "long_factor": (3, 4), "original_max_position_embeddings": 8.0}
    freqs = resolve_rope_scaling(scaling, rotary_dim=4, base=10000)
    assert freqs.params == {"rope_type": "longrope", "original_max_position_embeddings": 8,
                            "short_factor": [1.0, 2.0], "long_factor": [3.0, 4.0]}
    assert scaling["type"] == "su"  # input untouched


def test_rope_theta_equal_to_base_is_accepted():
    freqs = resolve_rope_scaling({"rope_type": "linear", "factor": 2.0, "rope_theta": 10000}, rotary_dim=4, base=1e4)
    assert freqs.params == {"rope_type": "linear", "factor": 2.0}


@pytest.mark.parametrize("seq_len", [np.int64(5), 5.0, np.float64(3.0), 1])
def test_seq_len_accepts_whole_numbers(seq_len):
    freqs = resolve_rope_scaling(None, rotary_dim=4, base=10.0)
    assert freqs.inv_freq_for(seq_len) is freqs.inv_freq
    assert freqs.attention_factor_for(seq_len) == 1.0


# --------------------------------------------------------------------------- errors

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
LONG = {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
        "original_max_position_embeddings": 4096}


@pytest.mark.parametrize(
    "scaling,match",
    [
        ({"factor": 2.0}, "rope_type"),
        ({"rope_type": "fancy"}, "rope_type.*'fancy'"),
        ({"rope_type": 3}, "rope_type"),
        ({"rope_type": "linear"}, "'factor'.*missing"),
        ({"rope_type": "linear", "factor": 0.5}, r"'factor'.*>= 1.*0\.5"),
        ({"rope_type": "linear", "factor": float("nan")}, "'factor'.*finite"),
        ({"rope_type": "linear", "factor": float("inf")}, "'factor'.*finite"),
        ({"rope_type": "linear", "factor": "2"}, "'factor'.*real number"),
        ({"rope_type": "linear", "factor": True}, "'factor'.*real number"),
        ({"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0}, "unknown.*low_freq_factor"),
        ({"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}, "rope_theta.*base"),
        ({"rope_type": "ntk", "factor": 0.9}, "'factor'.*>= 1"),
        ({"rope_type": "dynamic", "factor": 2.0}, "original_max_position_embeddings.*missing"),
        ({"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 0},
         "original_max_position_embeddings.*>= 1.*0"),
        ({"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 10.5},
         "original_max_position_embeddings.*whole number"),
        ({"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": "4096"},
         "original_max_position_embeddings.*int"),
        ({**YARN, "factor": None}, "'factor'.*missing"),
        ({**YARN, "beta_fast": 1.0, "beta_slow": 32.0}, "beta_fast.*beta_slow"),
        ({**YARN, "beta_slow": -1.0}, r"'beta_slow'.*> 0"),
        ({**YARN, "mscale": float("nan")}, "'mscale'.*finite"),
        ({**YARN, "attention_factor": 0.0}, r"'attention_factor'.*> 0"),
        ({**YARN, "truncate": "yes"}, "'truncate'.*bool"),
        ({**LLAMA3, "low_freq_factor": 5.0}, "low_freq_factor.*<= .*high_freq_factor"),
        ({**LLAMA3, "high_freq_factor": None}, "'high_freq_factor'.*missing"),
        ({**LLAMA3, "low_freq_factor": 0.0}, r"'low_freq_factor'.*> 0"),
        ({**LONG, "short_factor": [1.0] * 3}, r"'short_factor'.*rotary_dim // 2 = 4.*got 3"),
        ({**LONG, "long_factor": [2.0] * 5}, r"'long_factor'.*4 entries, got 5"),
        ({**LONG, "long_factor": "abcd"}, "'long_factor'.*list of numbers"),
        ({**LONG, "long_factor": [1.0, 2.0, None, 3.0]}, "'long_factor'.*real numbers"),
        ({**LONG, "short_factor": [1.0, 0.0, 1.0, 1.0]}, "'short_factor'.*> 0"),
        ({**LONG, "short_factor": [1.0, float("inf"), 1.0, 1.0]}, "'short_factor'.*finite"),
        ({**LONG, "factor": -1.0}, r"'factor'.*> 0"),
        ({k: v for k, v in LONG.items() if k != "long_factor"}, "'long_factor'.*missing"),
        # an attention factor the inverse rotation cannot divide by, derived or given; a logarithm's domain
        ({"rope_type": "yarn", "factor": math.e, "original_max_position_embeddings": 10, "mscale": -10.0,
          "mscale_all_dim": 1.0}, "attention factor 0.0: it must be > 0 .* mscale and mscale_all_dim"),
        ({"rope_type": "yarn", "factor": math.e, "original_max_position_embeddings": 10, "mscale": -20.0,
          "mscale_all_dim": 1.0}, "attention factor -0.9.*: it must be > 0"),
        ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 10, "attention_factor": 1e-310},
         "attention factor 1e-310: it must be > 0 with a finite reciprocal"),
        ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 10, "beta_fast": 1e308},
         r"has no finite frequencies \(math domain error\)"),
    ],
)
def test_invalid_scaling_raises_value_error(scaling, match):
    with pytest.raises(ValueError, match=match):
        resolve_rope_scaling(scaling, rotary_dim=8, base=10000.0)


@pytest.mark.parametrize("scaling", [[("rope_type", "linear")], "linear", 2.0])
def test_scaling_of_wrong_type_raises_type_error(scaling):
    with pytest.raises(TypeError, match="scaling must be a dict"):
        resolve_rope_scaling(scaling, rotary_dim=8, base=10000.0)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"rotary_dim": 7, "base": 1e4}, ValueError, "rotary_dim must be an even int >= 2, got 7"),
        ({"rotary_dim": 0, "base": 1e4}, ValueError, "rotary_dim.*got 0"),
        ({"rotary_dim": 8.0, "base": 1e4}, TypeError, "rotary_dim must be an int"),
        ({"rotary_dim": True, "base": 1e4}, TypeError, "rotary_dim must be an int"),
        ({"rotary_dim": 8, "base": 0.0}, ValueError, "base must be finite and > 0, got 0.0"),
        ({"rotary_dim": 8, "base": -5}, ValueError, "base must be finite and > 0"),
        ({"rotary_dim": 8, "base": float("inf")}, ValueError, "base must be finite"),
        ({"rotary_dim": 8, "base": "10000"}, TypeError, "base must be a real number"),
    ],
)
def test_invalid_rotary_dim_or_base(kwargs, error, match):
    with pytest.raises(error, match=match):
        resolve_rope_scaling(None, **kwargs)


@pytest.mark.parametrize("rope_type", ["ntk", "dynamic"])
def test_ntk_needs_rotary_dim_4(rope_type):
    scaling = {"rope_type": rope_type, "factor": 2.0, "original_max_position_embeddings": 16}
    if rope_type == "ntk":
        del scaling["original_max_position_embeddings"]
    with pytest.raises(ValueError, match="rotary_dim >= 4"):
        resolve_rope_scaling(scaling, rotary_dim=2, base=10000.0)


@pytest.mark.parametrize(
    "seq_len,error,match",
    [(0, ValueError, "seq_len must be >= 1, got 0"), (-3, ValueError, "seq_len"),
     (2.5, ValueError, "seq_len must be a whole number"), (float("nan"), ValueError, "seq_len"),
     ("4", TypeError, "seq_len must be an int"), (None, TypeError, "seq_len"), (True, TypeError, "seq_len")],
)
def test_invalid_seq_len(seq_len, error, match):
    freqs = resolve_rope_scaling(LONG, rotary_dim=8, base=10000.0)
    with pytest.raises(error, match=match):
        freqs.inv_freq_for(seq_len)
    with pytest.raises(error, match=match):
        freqs.attention_factor_for(seq_len)
