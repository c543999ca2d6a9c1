"""Tolerances, exact values and a switch off the compiled path, used by several test files."""

import contextlib

import mpmath
import numpy as np
import pytest

EPS64 = 2.0**-52
# Our float64 cos/sin are within ~30 steps of recurrence of the exact value.
RECURRENCE_ATOL = 64 * EPS64


def angle_atol(max_angle: float) -> float:
    """Allowed |ours - reference| in float64 for angles up to `max_angle`.

    The reference evaluates sin(fl(p*w)); ours is sin of the exact product,
    so they may differ by up to half an ulp of the angle, plus our recurrence
    error.
    """
    return EPS64 * abs(max_angle) + RECURRENCE_ATOL


def assert_float32_rounding(got: np.ndarray, exact: np.ndarray, extra_atol: float = 0.0) -> None:
    """Each float32 value of `got` must be within half a float32 ulp of `exact` (+ extra_atol)."""
    assert got.dtype == np.float32
    exact = np.asarray(exact, dtype=np.float64)
    half_ulp = 0.5 * np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    error = np.abs(got.astype(np.float64) - exact)
    bad = error > half_ulp * (1 + 1e-9) + extra_atol
    assert not bad.any(), (f"{bad.sum()} values not correctly rounded; worst error "
                           f"{error.max():.3g} at {np.unravel_index(error.argmax(), error.shape)}")


def float32_ulps(got: np.ndarray, exact) -> np.ndarray:
    """Error of float32 `got` in ulps of the exact value's float32 neighbourhood."""
    exact = np.asarray(exact, dtype=np.float64)
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - exact) / ulp


def exact_cos_sin(position: float, frequency: float) -> tuple[float, float]:
    """cos and sin of the exact product position * frequency (both float64), by mpmath."""
    with mpmath.workprec(200):
        angle = mpmath.mpf(position) * mpmath.mpf(frequency)
        return float(mpmath.cos(angle)), float(mpmath.sin(angle))


def untouched(before: np.ndarray, after: np.ndarray) -> bool:
    """True if `after` is bitwise the same as `before` (NaNs included)."""
    return before.tobytes() == after.tobytes()


class _WithoutFastPath:
    """The kernels module with a compiled path that declines every call."""

    def __init__(self, kernels):
        self._kernels = kernels

    def __getattr__(self, name):
        return getattr(self._kernels, name)

    @staticmethod
    def rotate_cos_sin_fast(*args):
        return None


@contextlib.contextmanager
def general_path_only():
    """Make apply_rotary_cos_sin(_qk) skip the compiled path."""
    from posenc_fast import rotary

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rotary, "kernels", _WithoutFastPath(rotary.kernels))
        yield
