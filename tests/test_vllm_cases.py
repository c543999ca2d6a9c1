"""The cases of vLLM's own rotary test, run through `posenc_fast.vllm.rotary_embedding`.

vllm-project/vllm ``tests/kernels/core/test_pos_encoding.py::test_rotary_embedding``:
both pair layouts; q/k as ``(batch, seq, heads, head_size)``, flat
``(batch, seq, heads * head_size)`` and sliced out of heads padded by 64;
head sizes 64, 80, 120, 256; the whole head or 32 features rotating; bfloat16
and float32; with and without key; 17 heads, batch 5, seq 11 and 8192 (8192
with batch 1 and one head here: the full case holds 178M entries a tensor).
The cache is vLLM's (float32 angles, cast to the data's dtype).  Checked
against a float64 rotation of the same inputs, to vLLM's float32 tolerance,
and in bfloat16 against the rounding: posenc_fast rounds each result once
(<= 0.5 ulp), vLLM's native formula rounds three times (its bfloat16 cases
fail vLLM's tolerance against it for that reason).
"""

import functools

import ml_dtypes
import numpy as np
import pytest

from posenc_fast import vllm
from helpers import untouched

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
SHAPES = ["batch", "flat", "padded"]


@functools.lru_cache
def vllm_cache(rot_dim, dtype, max_position=8192, base=10000.0):
    inv_freq = (1.0 / base ** (np.arange(0, rot_dim, 2, dtype=np.float32) / rot_dim)).astype(np.float32)
    freqs = np.arange(max_position, dtype=np.float32)[:, None] * inv_freq
    cache = np.concatenate((np.cos(freqs), np.sin(freqs)), -1).astype(dtype)
    cache.flags.writeable = False
    return cache


def tensor(rng, shape_kind, batch, seq, heads, head_size, dtype):
    if shape_kind == "flat":
        return rng.standard_normal((batch, seq, heads * head_size)).astype(dtype)
    if shape_kind == "padded":  # vLLM slices [..., :head_size] of heads padded by 64
        return rng.standard_normal((batch, seq, heads, head_size + 64)).astype(dtype)[..., :head_size]
    return rng.standard_normal((batch, seq, heads, head_size)).astype(dtype)


def exact_rotation(x, cache, positions, head_size, rot_dim, is_neox):
    """float64 rotation of x (as given) by the cache's values (as given); returns its heads."""
    heads = np.asarray(x, np.float64).reshape(positions.shape + (-1, head_size)).copy()
    c64 = cache.astype(np.float64)[positions][..., None, :]
    cos, sin = c64[..., :rot_dim // 2], c64[..., rot_dim // 2:]
    if is_neox:
        a, b = heads[..., :rot_dim // 2].copy(), heads[..., rot_dim // 2:rot_dim].copy()
        heads[..., :rot_dim // 2], heads[..., rot_dim // 2:rot_dim] = a * cos - b * sin, b * cos + a * sin
    else:
        a, b = heads[..., 0:rot_dim:2].copy(), heads[..., 1:rot_dim:2].copy()
        heads[..., 0:rot_dim:2], heads[..., 1:rot_dim:2] = a * cos - b * sin, b * cos + a * sin
    return heads


def bf16_ulps(got, exact):
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(exact), 2.0 ** -126))) - 7)
    return np.abs(got.astype(np.float64) - exact) / ulp


def three_roundings(x, cache, positions, head_size, rot_dim, is_neox):
    """vLLM's forward_native in bfloat16: x*cos, x*sin and their sum each rounded to bfloat16."""
    heads = np.asarray(x).reshape(positions.shape + (-1, head_size)).astype(np.float32)
    c = cache[positions][..., None, :].astype(np.float32)
    cos, sin = c[..., :rot_dim // 2], c[..., rot_dim // 2:]
    if is_neox:
        a, b = heads[..., :rot_dim // 2], heads[..., rot_dim // 2:rot_dim]
    else:
        a, b = heads[..., 0:rot_dim:2], heads[..., 1:rot_dim:2]

    def r(v):
        return v.astype(BF16).astype(np.float32)
    return r(r(a * cos) - r(b * sin)), r(r(b * cos) + r(a * sin))


@pytest.mark.parametrize("use_key", [True, False])
@pytest.mark.parametrize("dtype", [BF16, F32], ids=str)
@pytest.mark.parametrize("rotary_dim", [None, 32])
@pytest.mark.parametrize("head_size", [64, 80, 120, 256])
@pytest.mark.parametrize("seq_len", [11, 8192])
@pytest.mark.parametrize("shape_kind", SHAPES)
@pytest.mark.parametrize("is_neox", [True, False])
def test_vllms_rotary_embedding_cases(is_neox, shape_kind, seq_len, head_size, rotary_dim, dtype, use_key):
    rot_dim = head_size if rotary_dim is None else rotary_dim
    batch, heads = (5, 17) if seq_len == 11 else (1, 1)
    rng = np.random.default_rng(head_size * 7 + rot_dim)
    positions = rng.integers(0, 8192, (batch, seq_len))
    query = tensor(rng, shape_kind, batch, seq_len, heads, head_size, dtype)
    key = tensor(rng, shape_kind, batch, seq_len, heads, head_size, dtype) if use_key else None
    cache = vllm_cache(rot_dim, dtype)
    inputs = [x.copy() for x in (query, key) if x is not None]
    padding = query.base[..., head_size:].copy() if shape_kind == "padded" else None
    vllm.rotary_embedding(positions, query, key, head_size, cache, is_neox)
    for got, x in zip([q for q in (query, key) if q is not None], inputs):
        exact = exact_rotation(x, cache, positions, head_size, rot_dim, is_neox)
        got_heads = np.asarray(got).reshape(exact.shape)
        assert untouched(np.asarray(x).reshape(exact.shape)[..., rot_dim:], got_heads[..., rot_dim:])
        if dtype == F32:  # vLLM's float32 tolerance (tests/kernels/allclose_default.py)
            np.testing.assert_allclose(got_heads, exact, rtol=1.3e-6, atol=1e-5)
        else:
            ours = bf16_ulps(got_heads[..., :rot_dim], exact[..., :rot_dim])
            assert ours.max() <= 0.5 + 2.0 ** -15, f"posenc_fast {ours.max():.3f} bf16 ulps"
            if seq_len == 11:  # the formula vLLM's test compares with: three roundings
                first, second = three_roundings(x, cache, positions, head_size, rot_dim, is_neox)
                theirs = np.concatenate([bf16_ulps(first, exact[..., :rot_dim // 2] if is_neox else
                                                   exact[..., 0:rot_dim:2]).ravel(),
                                         bf16_ulps(second, exact[..., rot_dim // 2:rot_dim] if is_neox else
                                                   exact[..., 1:rot_dim:2]).ravel()])
                assert theirs.max() > 1.0 > ours.max()
    if padding is not None:
        assert untouched(padding, query.base[..., head_size:])
