"""Tolerances, exact values and a switch off the compiled path, used by several test files."""

import contextlib

import mpmath
import numpy as np
import pytest

from posenc_fast._tolerance import (  # noqa: F401  (re-exported for the tests)
    angle_atol, float32_ulp, float32_ulp_distance, float32_ulps)


def assert_float32_rounding(got: np.ndarray, exact: np.ndarray, extra_atol: float = 0.0) -> None:
    """Each float32 value of `got` must be within half a float32 ulp of `exact` (+ extra_atol)."""
    assert got.dtype == np.float32
    exact = np.asarray(exact, dtype=np.float64)
    half_ulp = 0.5 * float32_ulp(exact)
    error = np.abs(got.astype(np.float64) - exact)
    bad = error > half_ulp * (1 + 1e-9) + extra_atol
    assert not bad.any(), (f"{bad.sum()} values not correctly rounded; worst error "
                           f"{error.max():.3g} at {np.unravel_index(error.argmax(), error.shape)}")


def hf_inv_freq_budget(ours: np.ndarray, rotary_dim: int) -> np.ndarray:
    """transformers' float32 error budget, in ulps, for each frequency (see test_frequencies.py)."""
    if rotary_dim & (rotary_dim - 1) == 0:
        return np.full(ours.shape, 3.0)
    return 3.0 + np.ceil(np.abs(np.log(ours)))


def assert_matches_hf(ours: np.ndarray, hf, rotary_dim: int) -> None:
    """float32(ours) within transformers' float32 error budget of hf, in ulps (hf_inv_freq_budget)."""
    assert ours.dtype == np.float64
    assert ours.shape == (len(hf),)
    distance = float32_ulp_distance(ours, hf)
    budget = hf_inv_freq_budget(ours, rotary_dim)
    worst = int(np.argmax(distance - budget))
    assert np.all(distance <= budget), (
        f"inv_freq[{worst}] = {ours[worst]!r} is {distance[worst]} float32 ulps from transformers' "
        f"{np.float32(hf[worst])!r} (budget {budget[worst]})"
    )


def exact_cos_sin(position: float, frequency: float) -> tuple[float, float]:
    """cos and sin of the exact product position * frequency (both float64), by mpmath."""
    with mpmath.workprec(200):
        angle = mpmath.mpf(position) * mpmath.mpf(frequency)
        return float(mpmath.cos(angle)), float(mpmath.sin(angle))


def untouched(before: np.ndarray, after: np.ndarray) -> bool:
    """True if `after` is bitwise the same as `before` (NaNs included)."""
    return before.tobytes() == after.tobytes()


def int64_inside(array: np.ndarray, values) -> np.ndarray:
    """`values` written as int64 into the first bytes of `array` (a float array a call writes): an
    index array (positions, slots) that shares its memory; returned as that view."""
    values = np.asarray(values)
    inside = array.reshape(-1)[:2 * values.size].view(np.int64)
    inside[:] = values
    return inside


@contextlib.contextmanager
def general_path_only():
    """Turn every compiled fast path off (``_core.set_fast_paths``): calls take their general paths."""
    from posenc_fast._dispatch import kernels

    kernels.set_fast_paths(False)
    try:
        yield
    finally:
        kernels.set_fast_paths(True)


def assert_rotation_close(got, want, x, positions, rope):
    """float64: reference to angle rounding; float32: a few ulps of the largest input."""
    scale = float(np.abs(x).max()) if x.size else 1.0
    positions = np.asarray(positions, dtype=np.float64)
    max_angle = float(np.abs(positions).max() * rope.inv_freq.max()) if positions.size else 0.0
    if got.dtype == np.float64:
        atol = 4 * angle_atol(max_angle) * scale * rope.attention_factor
    else:
        # float32 products of subnormal inputs lose bits absolutely, not relatively
        atol = (4 * np.finfo(np.float32).eps * scale * max(rope.attention_factor, 1.0)
                + 4 * np.finfo(np.float32).smallest_subnormal)
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)


@contextlib.contextmanager
def taking(route):
    """apply_qk_to_cache calls take `route`: ``"fast"``, the compiled fast path (the general path's
    checks then fail if they run), or ``"general"``, the path it declines to."""
    from posenc_fast import _kv_cache

    with pytest.MonkeyPatch.context() as patch:
        if route == "general":
            patch.setattr(_kv_cache.kernels, "apply_qk_to_cache_fast", lambda *args: None)
        else:
            patch.setattr(_kv_cache, "check_call", None)
        yield


def server_qkv(rng, layout, dtype, tokens, heads, kv_heads, head_size):
    """query, key and value (standard normal) as a server holds them: ``"contiguous"``, slices of one
    ``"fused qkv"`` projection, or heads ``"padded"`` past head_size."""
    def data(shape):
        return rng.standard_normal(shape).astype(dtype)

    if layout == "fused qkv":
        qkv = data((tokens, (heads + 2 * kv_heads) * head_size))
        q_end, k_end = heads * head_size, (heads + kv_heads) * head_size
        return qkv[:, :q_end], qkv[:, q_end:k_end], qkv[:, k_end:]
    if layout == "padded":
        return tuple(data((tokens, n, head_size + pad))[..., :head_size]
                     for n, pad in ((heads, 4), (kv_heads, 2), (kv_heads, 6)))
    return tuple(data((tokens, n * head_size)) for n in (heads, kv_heads, kv_heads))
