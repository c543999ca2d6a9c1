"""The optional PyTorch rows: the NumPy expressions of `cases` written with torch ops.

Each ``*_expression(torch, ...)`` returns the function a row times; it is
called on ``torch.from_numpy`` views of the case's arrays (float64 angles,
as in the NumPy expressions).  `torch_impl` makes the eager or the
``torch.compile`` row of it; compilation is setup (two untimed calls).
torch is imported only here, and only when a torch row is built.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


class Unavailable(Exception):
    """An implementation that cannot run here (torch missing, function not written yet)."""


def torch_or_unavailable():
    """Return the torch module, or raise `Unavailable` saying why not."""
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install
        raise Unavailable(f"torch is not importable ({type(exc).__name__}: {exc})") from None
    return torch


def torch_version() -> str | None:
    try:
        return torch_or_unavailable().__version__
    except Unavailable:
        return None


def _compile(torch, func, *example):
    try:
        compiled = torch.compile(func)
        compiled(*example)
        compiled(*example)
    except Exception as exc:
        raise Unavailable(f"torch.compile failed: {type(exc).__name__}: {exc}"[:300]) from None
    return compiled


def torch_impl(expression: Callable, arrays: tuple, compiled: bool):
    """Return ``run``: `expression(torch)` applied to torch views of `arrays`, eager or compiled.

    ``run()`` returns what the expression returns, as NumPy (one array or a tuple).
    """
    torch = torch_or_unavailable()
    tensors = [torch.from_numpy(a) for a in arrays]
    func = expression(torch)
    if compiled:
        func = _compile(torch, func, *tensors)

    def run():
        return func(*tensors)

    def as_numpy(result):
        if isinstance(result, tuple):
            return tuple(t.numpy() for t in result)
        return result.numpy()
    return run, as_numpy


def _rotate_half(torch, x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_half_expression(torch):
    """``x*cos + rotate_half(x)*sin`` for positions broadcasting against ``x.shape[:-1]``."""
    def rope(x, positions, inv_freq):
        angles = positions[..., None] * inv_freq
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        return x * cos + _rotate_half(torch, x) * sin
    return rope


def apply_qk_expression(torch):
    """HF ``apply_rotary_pos_emb``: one cos/sin (positions along the sequence) for q and k."""
    def apply_qk(q, k, positions, inv_freq):
        angles = positions[:, None] * inv_freq
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
        return q * cos + _rotate_half(torch, q) * sin, k * cos + _rotate_half(torch, k) * sin
    return apply_qk


def cos_sin_expression(dtype: np.dtype):
    def make(torch):
        tdtype = getattr(torch, dtype.name)

        def cos_sin(positions, inv_freq):
            angles = torch.outer(positions, inv_freq)
            return angles.cos().to(tdtype), angles.sin().to(tdtype)
        return cos_sin
    return make


def sinusoidal_expression(dtype: np.dtype, length: int, dim: int):
    def make(torch):
        tdtype = getattr(torch, dtype.name)

        def table(positions, frequencies):
            angles = torch.outer(positions, frequencies)
            result = torch.empty((length, dim), dtype=tdtype)
            result[:, 0::2] = angles.sin()
            result[:, 1::2] = angles[:, : dim // 2].cos()
            return result
        return table
    return make


def alibi_expression(offset: int, q_len: int, k_len: int):
    """``scores[h] += (slope_h * (k_pos - q_pos)).to(dtype)`` head by head, in place."""
    def make(torch):
        rel = (torch.arange(k_len, dtype=torch.float64)
               - (offset + torch.arange(q_len, dtype=torch.float64))[:, None])

        def add_alibi(scores, slopes):
            for h in range(scores.shape[-3]):
                scores[h] += (slopes[h] * rel).to(scores.dtype)
            return scores
        return add_alibi
    return make
