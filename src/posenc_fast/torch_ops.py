"""posenc_fast's kernels as torch custom ops, which ``torch.compile`` keeps in its graph.

Importing this module registers, through `torch.library`:

``torch.ops.posenc_fast.rotary_embedding``
    ``(positions, query, key, head_size, cos_sin_cache, is_neox,
    rope_dim_offset=0, inverse=False) -> ()`` (vLLM's op of 2026):
    `posenc_fast.vllm.rotary_embedding`, rotating `query` and `key` (or
    None) in place.

``torch.ops.posenc_fast.apply_rotary``
    ``(positions, x, head_size, cos_sin_cache, is_neox, rope_dim_offset=0,
    inverse=False) -> Tensor``: the same rotation into a new tensor, with a
    gradient (its backward the op with `inverse` flipped): for training.

``torch.ops.posenc_fast.fused_qk_norm_rope``
    ``(positions, query, key, q_weight, k_weight, head_size, cos_sin_cache,
    is_neox, eps=1e-6, weight_offset=0.0) -> ()``:
    `posenc_fast.vllm.fused_qk_norm_rope`, q/k RMSNorm and RoPE in place.

``torch.ops.posenc_fast.apply_qk_to_cache``
    ``(positions, query, key, value, key_cache, value_cache, slot_mapping,
    head_size, cos_sin_cache, is_neox, kv_cache_layout="NHD") -> ()``:
    `posenc_fast.vllm.apply_qk_to_cache`, rotating `query` in place and
    writing the rotated key and the value into their cache slots.

A torch function that calls a NumPy-backed function directly breaks its
compiled graph at that call (or fails under ``fullgraph=True``); calling the
op instead compiles, and runs posenc_fast's kernel on CPU tensors.  Each op
is a `torch.library.custom_op` over a posenc_fast function, declaring what
it mutates, plus a fake implementation that tells the compiler the result's
shapes without running it.

Raises ImportError when torch is missing (posenc_fast itself never needs it).

Examples
--------
>>> import torch
>>> import posenc_fast.torch_ops
>>> cache = torch.cat((torch.ones(16, 4), torch.zeros(16, 4)), dim=1)
>>> q, k = torch.randn(3, 2 * 8), torch.randn(3, 8)
>>> torch.ops.posenc_fast.rotary_embedding(torch.tensor([0, 4, 9]), q, k, 8, cache, True)
"""

try:
    import torch
except ImportError:
    raise ImportError("posenc_fast.torch_ops needs torch: pip install torch") from None

from . import vllm

__all__ = ["apply_qk_to_cache", "apply_rotary", "fused_qk_norm_rope", "rotary_embedding"]


@torch.library.custom_op("posenc_fast::rotary_embedding", mutates_args=("query", "key"),
                         device_types="cpu")
def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
                     head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool,
                     rope_dim_offset: int = 0, inverse: bool = False) -> None:
    """Rotate `query` and `key` in place (see `posenc_fast.vllm.rotary_embedding`)."""
    vllm.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox,
                          rope_dim_offset, inverse)


@rotary_embedding.register_fake
def _(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset=0,
      inverse=False) -> None:
    return None  # only mutates its inputs: no result to describe


@torch.library.custom_op("posenc_fast::apply_rotary", mutates_args=(), device_types="cpu")
def apply_rotary(positions: torch.Tensor, x: torch.Tensor, head_size: int,
                 cos_sin_cache: torch.Tensor, is_neox: bool, rope_dim_offset: int = 0,
                 inverse: bool = False) -> torch.Tensor:
    """`x` rotated as `posenc_fast.vllm.rotary_embedding` rotates a query, into a new tensor.

    The functional op, with a gradient: its backward is the same op with
    `inverse` flipped (the rotation's transpose), so it trains, also under
    ``torch.compile``.  `cos_sin_cache` gets no gradient.
    """
    out = x.detach().clone(memory_format=torch.contiguous_format)
    vllm.rotary_embedding(positions, out, None, head_size, cos_sin_cache, is_neox,
                          rope_dim_offset, inverse)
    return out


@apply_rotary.register_fake
def _(positions, x, head_size, cos_sin_cache, is_neox, rope_dim_offset=0, inverse=False):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _apply_rotary_context(ctx, inputs, output):
    positions, _, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse = inputs
    ctx.save_for_backward(positions, cos_sin_cache)
    ctx.arguments = (head_size, is_neox, rope_dim_offset, inverse)


def _apply_rotary_backward(ctx, grad):
    positions, cos_sin_cache = ctx.saved_tensors
    head_size, is_neox, rope_dim_offset, inverse = ctx.arguments
    return (None, apply_rotary(positions, grad, head_size, cos_sin_cache, is_neox,
                               rope_dim_offset, not inverse), None, None, None, None, None)


apply_rotary.register_autograd(_apply_rotary_backward, setup_context=_apply_rotary_context)


@torch.library.custom_op("posenc_fast::fused_qk_norm_rope", mutates_args=("query", "key"),
                         device_types="cpu")
def fused_qk_norm_rope(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                       q_weight: torch.Tensor, k_weight: torch.Tensor, head_size: int,
                       cos_sin_cache: torch.Tensor, is_neox: bool, eps: float = 1e-6,
                       weight_offset: float = 0.0) -> None:
    """RMSNorm and rotate `query` and `key` in place (see `posenc_fast.vllm.fused_qk_norm_rope`)."""
    vllm.fused_qk_norm_rope(positions, query, key, q_weight, k_weight, head_size, cos_sin_cache,
                            is_neox, eps, weight_offset)


@fused_qk_norm_rope.register_fake
def _(positions, query, key, q_weight, k_weight, head_size, cos_sin_cache, is_neox, eps=1e-6,
      weight_offset=0.0) -> None:
    return None  # only mutates its inputs


@torch.library.custom_op("posenc_fast::apply_qk_to_cache",
                         mutates_args=("query", "key_cache", "value_cache"), device_types="cpu")
def apply_qk_to_cache(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, head_size: int, cos_sin_cache: torch.Tensor,
                      is_neox: bool, kv_cache_layout: str = "NHD") -> None:
    """Rotate `query` in place, write the rotated key and the value into their cache slots
    (see `posenc_fast.vllm.apply_qk_to_cache`)."""
    vllm.apply_qk_to_cache(positions, query, key, value, key_cache, value_cache, slot_mapping,
                           head_size, cos_sin_cache, is_neox, kv_cache_layout)


@apply_qk_to_cache.register_fake
def _(positions, query, key, value, key_cache, value_cache, slot_mapping, head_size,
      cos_sin_cache, is_neox, kv_cache_layout="NHD") -> None:
    return None  # only mutates its inputs
