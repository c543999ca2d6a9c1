"""posenc_fast.reference itself: its angles are those of the exact product (mpmath says so), so it is
the kernels' oracle at every position, and it refuses what the library refuses."""

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, strategies as st

import posenc_fast as pf
from posenc_fast import reference as ref

POINTS = [(1e22, 1.0), (1e6 + 0.1, 0.7), (5e15 + 0.5, 1.0), (2.0**62, 1e-4), (1e300, 1e-5), (-1e22, 1.0),
          (1.7e308, 1.0), (3.0000001, 1.0), (2.9, 1.0), (0.0, 5.0), (-7.5, 0.3)]


def _mp_cos_sin(position, frequency):
    with mpmath.workprec(2600):  # past 1024 bits of turns and 53 of fraction
        angle = mpmath.mpf(position) * mpmath.mpf(frequency)
        return float(mpmath.cos(angle)), float(mpmath.sin(angle))


@pytest.mark.parametrize("position, frequency", POINTS)
def test_cos_sin_of_the_exact_product(position, frequency):
    # it was libm's of the rounded product: 1.6 off at 1e300 * 1e-5, 1.7e-12 at (1e6 + 0.1) * 0.7
    for got, want in zip(ref.cos_sin_of(position, frequency), _mp_cos_sin(position, frequency)):
        assert abs(got - want) <= 2.3e-16


@given(st.floats(-2.0**64, 2.0**64, allow_nan=False), st.floats(1e-9, 10.0))
def test_cos_sin_of_random_products(position, frequency):
    for got, want in zip(ref.cos_sin_of(position, frequency), _mp_cos_sin(position, frequency)):
        assert abs(got - want) <= 2.3e-16


def test_an_angle_past_float64_is_refused():
    with pytest.raises(ValueError, match="is not finite"):
        ref.cos_sin_of(1e308, 1e10)


@pytest.mark.parametrize("position", [1e22, 5e15 + 0.5, 1e6 + 0.1])
def test_the_kernels_agree_with_it_at_large_positions(position):
    want = ref.sinusoidal([position], 6)
    assert np.abs(pf.sinusoidal([position], 6, dtype=np.float64) - want).max() <= 1e-15
    rope = pf.RotaryEmbedding(8, layout="half")
    x = np.linspace(-1.0, 1.0, 8)
    want = ref.apply_rotary(x[None], [position], list(rope.inv_freq), layout="half")
    assert np.abs(rope.apply(x[None], [position]) - want).max() <= 1e-15
    assert math.isfinite(want.sum())


X4 = np.ones((2, 4))
BAD = {
    "no heads": (lambda: ref.alibi_slopes(0), "num_heads must be >= 1"),
    "a negative max_distance": (lambda: ref.relative_position_index(2, 3, max_distance=-1), "max_distance"),
    "a negative length": (lambda: ref.sinusoidal_table(-1, 4), "length must be >= 0"),
    "a sinusoidal layout it lacks": (lambda: ref.sinusoidal_table(2, 4, layout="bogus"), "layout must be one of"),
    "a rotary layout it lacks": (lambda: ref.apply_rotary(X4, 0, [1.0, 0.5], layout="bogus"), "layout must be one of"),
    "axial pairs it lacks": (lambda: ref.axial_pairs(8, 2, pairs="bogus"), "pairs must be one of"),
    "float positions into a cache": (lambda: ref.apply_rotary_cos_sin(X4[:1], np.ones((3, 2)), np.ones((3, 2)), [1.7]),
                                     "positions must be integers"),
    "float positions into a table": (lambda: ref.add_position_table(X4, np.ones((5, 4)), [0.9, 1.9]),
                                     "positions must be integers"),
    "a table of another width": (lambda: ref.add_position_table(X4, np.ones((5, 6))), "must end in the same dim"),
    "too few T5 buckets": (lambda: ref.t5_relative_bucket(2, 3, num_buckets=2), "num_buckets must be >= 4"),
    "a T5 max_distance inside the exact buckets": (
        lambda: ref.t5_relative_bucket(2, 9, num_buckets=8, max_distance=2), "max_distance must be >"),
    "more pairs than features": (lambda: ref.apply_rotary(np.ones((2, 3)), 0, ref.rope_inv_freq(4)),
                                 "must be <= the vector's 3 features"),
    "a stream it lacks": (lambda: ref.apply_rotary_streams(X4, np.zeros((2, 2)), [1.0, 0.5], [0, 5]),
                          "pair_streams must name rows"),
    "scores without heads": (lambda: ref.add_alibi(np.ones((2, 2))), "scores must have shape"),
    "a negative key length": (lambda: ref.alibi_bias(2, 2, offset=-5), "must be >= 0"),
    "one row for add_sinusoidal": (lambda: ref.add_sinusoidal(np.ones(4)), "x must have shape"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_what_the_library_refuses_it_refuses(case):
    # it returned an answer (one ALiBi slope for no heads, the interleaved layout for "bogus", row 1 for 1.7)
    # or an IndexError / ZeroDivisionError from inside
    call, match = BAD[case]
    with pytest.raises(ValueError, match=match):
        call()
