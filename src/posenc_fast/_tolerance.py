"""How far a result may be from the float64 reference: the error measures of tests, check and bench.

`tolerance` is the rule ``python -m posenc_fast check`` and the benchmarks
apply to every element: float32 within ``2e-6 * (|want| + scale)``, where
``scale`` is the magnitude of the inputs behind the element (about 17 float32
ulps); float64 within ``1e-12 * (|want| + scale)`` plus ``4 * 2**-52 * |angle|
* scale``: the kernels advance angles by a recurrence, so they may differ from
the reference's ``sin(fl(p * w))`` by about one ulp of the angle.  float16
and bfloat16 within one of their ulps of ``|want| + scale`` (float32
arithmetic, rounded once).

The tests use the finer measures: `float32_ulps`, `float32_ulp_distance` and
`angle_atol`.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

EPS64 = 2.0**-52
# Our float64 cos/sin are within ~30 steps of recurrence of the exact value.
RECURRENCE_ATOL = 64 * EPS64
# Half types: one ulp of |want| + scale (float32 arithmetic, one rounding).
RTOL = {np.dtype(np.float32): 2e-6, np.dtype(np.float64): 1e-12, np.dtype(np.float16): 2.0**-10,
        np.dtype(ml_dtypes.bfloat16): 2.0**-7}
ANGLE_ULPS = 4


def tolerance(want, dtype, *, scale=1.0, angle=0.0) -> np.ndarray:
    """The largest |got - want| allowed for each element of a `dtype` result.

    Parameters
    ----------
    want : array_like
        The float64 reference values.
    dtype : numpy dtype
        The dtype of the result (float16, bfloat16, float32 or float64).
    scale : float or array_like
        Magnitude of the inputs behind each element (broadcasts to `want`).
    angle : float or array_like
        Largest ``|position * frequency|`` behind each element.
    """
    dtype = np.dtype(dtype)
    if dtype not in RTOL:
        raise ValueError(f"dtype must be one of {sorted(map(str, RTOL))}, got {dtype}")
    want = np.asarray(want, dtype=np.float64)
    tol = RTOL[dtype] * (np.abs(want) + scale)
    if dtype == np.float64:
        tol = tol + ANGLE_ULPS * EPS64 * np.abs(np.asarray(angle, dtype=np.float64)) * scale
    return np.broadcast_to(tol, want.shape)


def half_type_tolerance(want, dtype, scale=1.0) -> np.ndarray:
    """The largest |got - want| allowed for a float16/bfloat16 result of float64 value `want`.

    One ulp of the half type at `want` (the one rounding, from a value that
    float32 arithmetic may have moved) plus float32's own error, 2**-20 of
    the magnitude `scale` of the inputs behind the element.
    """
    want = np.abs(np.asarray(want, dtype=np.float64))
    ulp = np.spacing(want.astype(dtype)).astype(np.float64)
    return ulp + 2.0**-20 * np.asarray(scale, dtype=np.float64)


def float32_ulp(exact) -> np.ndarray:
    """The float32 ulp at each |value| of `exact`, as float64."""
    return np.spacing(np.abs(np.asarray(exact, dtype=np.float64)).astype(np.float32)).astype(
        np.float64)


def float32_ulps(got, exact, angle=0.0) -> np.ndarray:
    """Error of float32 `got` in float32 ulps of `exact`, the unit widened by the angle's precision.

    With `angle` (the float64 angle behind each value), the unit also holds
    half a float64 ulp of the angle: near a zero of sin/cos the value is only
    known to the precision of its angle, where even the correctly rounded
    ``sin(fl(p*w))`` is several float32 ulps from ``sin(p*w)``.
    """
    exact = np.asarray(exact, dtype=np.float64)
    unit = float32_ulp(exact) + np.abs(np.asarray(angle, dtype=np.float64)) * (EPS64 / 2)
    return np.abs(np.asarray(got).astype(np.float64) - exact) / unit


def float32_ulp_distance(a, b) -> np.ndarray:
    """How many float32 values lie between float32(a) and float32(b) (same signs), as int64."""
    bits_a = np.asarray(a, dtype=np.float32).view(np.int32).astype(np.int64)
    bits_b = np.asarray(b, dtype=np.float32).view(np.int32).astype(np.int64)
    return np.abs(bits_a - bits_b)


def angle_atol(max_angle: float) -> float:
    """Allowed |ours - reference| in float64 for angles up to `max_angle` (the tests' bound).

    The reference evaluates sin(fl(p*w)); ours is sin of the exact product,
    so they may differ by up to half an ulp of the angle, plus our recurrence
    error.
    """
    return EPS64 * abs(max_angle) + RECURRENCE_ATOL
