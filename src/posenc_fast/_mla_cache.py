"""vLLM's MLA cache writes: `concat_and_cache_mla`, and `concat_and_cache_mla_rope_fused`.

A multi-head latent attention cache (DeepSeek-V2/V3/V3.2, Kimi,
GLM-4-MoE-lite) holds one row per token: the compressed latent ``kv_c``
(``kv_lora_rank`` features), then the rope part of the key ``k_pe``.  Every
check runs before anything is written.  Re-exported by `posenc_fast.vllm`.
"""

from typing import Any

import numpy as np

from . import _validate as v
from ._dispatch import kernels
from ._kv_cache import _slots

ArrayOrTensor = Any


def _mla_call(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype) -> tuple:
    """(kv_c, k_pe as (tokens, pe_dim), kv_cache, slots), checked; nothing written."""
    if kv_cache_dtype != "auto":
        raise ValueError(f"kv_cache_dtype must be 'auto' (the cache in kv_c's dtype): posenc_fast "
                         f"writes no quantized (fp8) caches, got {kv_cache_dtype!r}")
    kv_c = v.float_array(kv_c, "kv_c")
    if kv_c.ndim != 2:
        raise ValueError(f"kv_c must have shape (num_tokens, kv_lora_rank), got {kv_c.shape}")
    if not isinstance(k_pe, np.ndarray):
        raise TypeError(f"k_pe must be a numpy.ndarray or torch.Tensor, got {type(k_pe).__name__}")
    if k_pe.ndim == 3 and k_pe.shape[1] == 1:
        k_pe = k_pe[:, 0]
    if k_pe.ndim != 2 or k_pe.shape[0] != kv_c.shape[0]:
        raise ValueError(f"k_pe must have shape (num_tokens, pe_dim) or (num_tokens, 1, pe_dim) with kv_c's "
                         f"{kv_c.shape[0]} tokens, got {k_pe.shape}")
    if k_pe.dtype.newbyteorder("=") != kv_c.dtype:  # either byte order: the write converts it
        raise TypeError(f"k_pe must have kv_c's dtype {kv_c.dtype}, got {k_pe.dtype}")
    if not isinstance(kv_cache, np.ndarray):
        raise TypeError(f"kv_cache must be a numpy.ndarray or torch.Tensor (written in place), "
                        f"got {type(kv_cache).__name__}")
    entry = kv_c.shape[1] + k_pe.shape[1]
    if kv_cache.ndim != 3 or kv_cache.shape[2] != entry:
        raise ValueError(f"kv_cache must have shape (num_blocks, block_size, kv_lora_rank + pe_dim = {entry}), "
                         f"got {kv_cache.shape}")
    if kv_cache.dtype.newbyteorder("=") != kv_c.dtype:
        raise TypeError(f"kv_cache must have kv_c's dtype {kv_c.dtype} (kv_cache_dtype 'auto'), "
                        f"got {kv_cache.dtype}")
    if not kv_cache.flags.writeable:
        raise ValueError("kv_cache must be writeable")
    if kv_cache.size and not v.elements_apart(kv_cache):
        raise ValueError(f"kv_cache of strides {kv_cache.strides} has entries that share memory (an expanded "
                         f"view?): two slots would be one; pass a cache of its own")
    slots = _slots(slot_mapping, kv_c.shape[0], kv_cache.shape[0] * kv_cache.shape[1])
    if any(v.overlaps(kv_cache, x) for x in (kv_c, k_pe, slots)):
        raise ValueError("kv_cache shares memory with kv_c, k_pe or slot_mapping")
    return kv_c, k_pe, kv_cache, slots


def _write(kv_c: np.ndarray, k_pe: np.ndarray, kv_cache: np.ndarray, slots: np.ndarray) -> None:
    used = slots >= 0
    blocks, offsets = np.divmod(slots[used], kv_cache.shape[1])
    rank = kv_c.shape[1]
    kv_cache[blocks, offsets, :rank] = kv_c[used]
    kv_cache[blocks, offsets, rank:] = k_pe[used]


def concat_and_cache_mla(kv_c: ArrayOrTensor, k_pe: ArrayOrTensor, kv_cache: ArrayOrTensor,
                         slot_mapping: ArrayOrTensor, kv_cache_dtype: str = "auto",
                         scale: ArrayOrTensor | None = None) -> None:
    """Write each token's ``[kv_c | k_pe]`` into its row of an MLA cache, as vLLM's op does.

    The signature of vLLM's ``concat_and_cache_mla`` (``_custom_ops``, 2026).

    Parameters
    ----------
    kv_c : torch.Tensor or ndarray, shape (num_tokens, kv_lora_rank)
        The compressed latents; any float dtype of posenc_fast.
    k_pe : torch.Tensor or ndarray, shape (num_tokens, pe_dim) or (num_tokens, 1, pe_dim)
        The (already rotated) rope part of each key, kv_c's dtype.
    kv_cache : torch.Tensor or ndarray, shape (num_blocks, block_size, kv_lora_rank + pe_dim)
        kv_c's dtype; written in place: row ``[slot // block_size, slot %
        block_size]`` of each token, nothing else.
    slot_mapping : torch.Tensor or ndarray of int, shape (num_tokens,)
        Each token's slot, -1 to skip it; no slot twice.
    kv_cache_dtype : {"auto"}, optional
        vLLM's cache type; ``"auto"`` (the data's dtype) only: fp8 caches
        are refused.
    scale : optional
        vLLM's fp8 scale; unused with ``"auto"``.

    Raises
    ------
    TypeError, ValueError
        Shapes, dtypes or slots that do not fit, a cache sharing memory with
        an input; nothing is written then.
    """
    if kernels.mla_to_cache_fast(None, None, k_pe, kv_c, None, None, slot_mapping, kv_cache, kv_cache_dtype):
        return  # the common call: checked, written and its tensor's version counted in C
    from .vllm import _as_arrays, count_writes, tensors_written

    tensors = tensors_written(("kv_cache",), (kv_cache,))
    names = ("kv_c", "k_pe", "kv_cache", "slot_mapping")
    arrays = _as_arrays(names, (kv_c, k_pe, kv_cache, slot_mapping), written=("kv_cache",))
    _write(*_mla_call(*arrays, kv_cache_dtype))
    count_writes(tensors)


def concat_and_cache_mla_rope_fused(positions: ArrayOrTensor, q_pe: ArrayOrTensor, k_pe: ArrayOrTensor,
                                    kv_c: ArrayOrTensor, cos_sin_cache: ArrayOrTensor, is_neox: bool,
                                    slot_mapping: ArrayOrTensor, kv_cache: ArrayOrTensor,
                                    kv_cache_dtype: str = "auto",
                                    kv_cache_scale: ArrayOrTensor | None = None) -> None:
    """Rotate `q_pe` and `k_pe` in place, then write ``[kv_c | k_pe]`` into the MLA cache.

    vLLM's ``concat_and_cache_mla_rope_fused`` (2026): `rotary_embedding`
    of the rope parts (``head_size = rot_dim``), then `concat_and_cache_mla`,
    every check of both made before anything is written.

    Parameters
    ----------
    positions : torch.Tensor or ndarray of int, shape (num_tokens,)
    q_pe : torch.Tensor or ndarray, shape (num_tokens, num_q_heads, rot_dim)
        Any strides with a contiguous last axis (a slice of the query).
    k_pe : torch.Tensor or ndarray, shape (num_tokens, rot_dim) or (num_tokens, 1, rot_dim)
    kv_c, kv_cache, slot_mapping, kv_cache_dtype, kv_cache_scale
        As in `concat_and_cache_mla`.
    cos_sin_cache, is_neox
        As in `rotary_embedding`: ``(max_position, rot_dim)``, q_pe's dtype
        or float32 for float16/bfloat16 data.

    Raises
    ------
    TypeError, ValueError
        As `rotary_embedding` and `concat_and_cache_mla`; nothing is written
        then.
    """
    if kernels.mla_to_cache_fast(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping, kv_cache,
                                 kv_cache_dtype):
        return
    from .vllm import _as_arrays, _rotate_tokens, count_writes, tensors_written

    tensors = tensors_written(("q_pe", "k_pe", "kv_cache"), (q_pe, k_pe, kv_cache))
    names = ("positions", "q_pe", "k_pe", "kv_c", "cos_sin_cache", "slot_mapping", "kv_cache")
    arrays = _as_arrays(names, (positions, q_pe, k_pe, kv_c, cos_sin_cache, slot_mapping, kv_cache),
                        written=("q_pe", "k_pe", "kv_cache"))
    positions, q_pe, k_pe, kv_c, cos_sin_cache, slot_mapping, kv_cache = arrays
    kv_c, k_rows, kv_cache, slots = _mla_call(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype)
    positions = np.asarray(positions)
    if any(v.overlaps(kv_cache, x) for x in (q_pe, positions, np.asarray(cos_sin_cache))):
        raise ValueError("kv_cache shares memory with q_pe, positions or cos_sin_cache")
    if v.overlaps(kv_c, q_pe) or v.overlaps(kv_c, k_rows):  # they are rotated before kv_c is read
        raise ValueError("kv_c shares memory with q_pe or k_pe; pass separate arrays")
    v.indices_apart({"positions": positions, "slot_mapping": slots}, {"q_pe": q_pe, "k_pe": k_rows})
    if np.ndim(cos_sin_cache) != 2:
        raise ValueError(f"cos_sin_cache must have shape (max_position, rot_dim), got {np.shape(cos_sin_cache)}")
    rot_dim = np.shape(cos_sin_cache)[1]
    if k_rows.shape[1] != rot_dim:
        raise ValueError(f"k_pe must have rot_dim = cos_sin_cache.shape[1] = {rot_dim} features, "
                         f"got {k_rows.shape[1]}")
    if not kernels.rotate_tokens_fast(positions, q_pe, k_rows, rot_dim, cos_sin_cache, is_neox, 0, False):
        _rotate_tokens(positions, q_pe, k_rows, rot_dim, cos_sin_cache, is_neox, names=("q_pe", "k_pe"))
    _write(kv_c, k_rows, kv_cache, slots)
    count_writes(tensors)
