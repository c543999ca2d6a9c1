"""posenc_fast as vLLM's ``rotary_embedding`` op on the CPU, and its cache writes.

`rotary_embedding` has the signature and in-place semantics of vLLM's custom
op (``torch.ops._C.rotary_embedding``): token-major queries and keys, one
position per token, a ``[cos | sin]`` cache of the server's own.
`concat_and_cache_mla` and `concat_and_cache_mla_rope_fused` are vLLM's MLA
cache writes (``_custom_ops``, 2026); `apply_qk_to_cache` and
`fused_qk_norm_rope` fuse what a server runs around the op.  It takes CPU
torch tensors (viewed through NumPy, no copies) or NumPy arrays, and rotates
them with `apply_rotary_cos_sin_qk`.  Tensors written in place count a version,
as torch's in-place ops do (a graph that saved one then refuses its
backward), and an inference tensor is written only under
``torch.inference_mode()`` (torch's rule).  torch stays optional: this module
never imports it.  Under ``torch.compile`` call the registered op instead
(see `posenc_fast.torch_ops`).
"""

import math
import sys
from typing import Any

import numpy as np

from . import _validate as v
from ._dispatch import kernels
from ._cos_sin import _as_table, apply_rotary_cos_sin, apply_rotary_cos_sin_qk
from ._mla_cache import concat_and_cache_mla, concat_and_cache_mla_rope_fused
from .hf import numpy_view

__all__ = ["apply_qk_to_cache", "concat_and_cache_mla", "concat_and_cache_mla_rope_fused",
           "fused_qk_norm_rope", "rotary_embedding"]

ArrayOrTensor = Any
"""An ndarray or a CPU torch.Tensor (torch is optional, so not named in the types)."""


def rotary_embedding(positions: ArrayOrTensor, query: ArrayOrTensor, key: ArrayOrTensor | None,
                     head_size: int, cos_sin_cache: ArrayOrTensor, is_neox: bool,
                     rope_dim_offset: int = 0, inverse: bool = False) -> None:
    """Rotate `query` and `key` in place, as vLLM's ``rotary_embedding`` op does.

    The signature of vLLM's op of 2026 (its wrapper passes eight arguments;
    the last two, DeepSeek-V4's, default to the six-argument op of 2025).

    Parameters
    ----------
    positions : torch.Tensor or ndarray of int, shape (num_tokens,) or (batch, seq)
        The position of each token: a row of `cos_sin_cache`.
    query : torch.Tensor or ndarray, float16, bfloat16, float32 or float64
        ``positions.shape + (heads * head_size,)`` or ``positions.shape +
        (heads, head_size)``; e.g. ``(num_tokens, heads * head_size)``,
        ``(batch, seq, heads * head_size)`` or ``(num_tokens, heads,
        head_size)``.  Any strides (a slice of a fused qkv projection, heads
        padded past head_size): rotated where it lies (a contiguous last
        axis takes the compiled path).
    key : torch.Tensor or ndarray or None
        Like `query`, with its own head count and query's dtype; rotated in
        place.  None rotates `query` alone.
    head_size : int
        Features per head.
    cos_sin_cache : torch.Tensor or ndarray, shape (max_position, rot_dim)
        Row ``p`` is ``[cos | sin]`` of position ``p``, ``rot_dim/2`` entries
        each; query's dtype, or float32 for float16/bfloat16 data (as
        flashinfer and vLLM's DeepSeek-V4 keep it).  ``rot_dim`` is even and
        ``rope_dim_offset + rot_dim <= head_size``; the other features of
        each head pass through.
    is_neox : bool
        True: pair ``i`` is ``(x[i], x[i + rot_dim/2])`` (GPT-NeoX, Llama).
        False: pair ``i`` is ``(x[2i], x[2i+1])`` (GPT-J).  Each pair becomes
        ``(a*cos - b*sin, b*cos + a*sin)``, computed in query's dtype (float32
        for float16/bfloat16, rounded once); indices counted from
        `rope_dim_offset`.
    rope_dim_offset : int, optional
        The first rotated feature of each head (DeepSeek-V4 rotates the last
        ``rot_dim``: ``head_size - rot_dim``).
    inverse : bool, optional
        Rotate by ``-theta`` (``(cos, -sin)``): undoes the rotation
        (DeepSeek-V4's attention output).

    Raises
    ------
    TypeError
        An argument of the wrong kind or dtype (torch tensors mixed with
        NumPy arrays, another dtype, a cache not of query's dtype).
    ValueError
        Shapes that do not fit, a position outside the cache, ``rot_dim``
        odd or past `head_size`, `query`/`key` that cannot be rotated where
        they lie (a view that cannot be split into heads, read-only,
        sharing memory, or torch tensors that need grad or are not on the
        CPU).

    Nothing is written when an error is raised.

    Examples
    --------
    >>> import numpy as np
    >>> from posenc_fast import vllm
    >>> inv_freq = 10000.0 ** (-np.arange(0, 64, 2) / 64)
    >>> angles = np.arange(2048)[:, None] * inv_freq
    >>> cache = np.concatenate((np.cos(angles), np.sin(angles)), axis=1).astype(np.float32)
    >>> q, k = np.ones((3, 8 * 64), np.float32), np.ones((3, 2 * 64), np.float32)
    >>> vllm.rotary_embedding(np.array([5, 0, 17]), q, k, 64, cache, True)
    """
    if kernels.rotate_tokens_fast(positions, query, key, head_size, cos_sin_cache, is_neox,
                                  rope_dim_offset, inverse):
        return  # the common call: checked, rotated and its tensors' versions counted in C
    _rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse)


def _rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset=0,
                      inverse=False, names=("query", "key")) -> None:
    """`rotary_embedding` past its fast path, on tensors or arrays (`names`: the caller's names of
    query and key)."""
    tensors = tensors_written(names, (query, key))
    positions, query, key, cos_sin_cache = _as_arrays(
        ("positions", *names, "cos_sin_cache"), (positions, query, key, cos_sin_cache), written=names)
    _rotate_tokens(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse, names)
    count_writes(tensors)


def _rotate_tokens(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset=0,
                   inverse=False, names=("query", "key")) -> None:
    """`rotary_embedding`'s general path on arrays (`names`: the caller's names of query and key)."""
    head_size = v.integer(head_size, "head_size", minimum=1)
    is_neox = v.flag(is_neox, "is_neox")
    offset = v.integer(rope_dim_offset, "rope_dim_offset", minimum=0)
    inverse = v.flag(inverse, "inverse")
    positions = _token_positions(positions)
    query, key, cos, sin = _query_key_cache(positions, query, key, head_size, cos_sin_cache,
                                            offset, names)
    if offset:  # the features from the offset on: rot_dim of them rotate, the rest pass
        query = query[..., offset:]
        key = None if key is None else key[..., offset:]
    # One table row per token, broadcast over the heads; apply_rotary_cos_sin
    # checks every position against the cache before it writes anything.
    index = positions.reshape(-1, 1)
    layout = "half" if is_neox else "interleaved"
    if key is None:
        apply_rotary_cos_sin(query, cos, sin, index, layout=layout, inverse=inverse, out=query)
    else:
        apply_rotary_cos_sin_qk(query, key, cos, sin, index, layout=layout, inverse=inverse,
                                out_q=query, out_k=key)


def _query_key_cache(positions: np.ndarray, query, key, head_size: int, cache, offset: int = 0,
                     names: tuple = ("query", "key")):
    """query and key (or None) as (tokens, heads, head_size) views rotated in place, and the
    cos and sin halves of `cache`, all checked: one dtype, no shared memory (`names`: the caller's
    names of query and key, for the messages)."""
    q_name, k_name = names
    query = _heads_view(query, q_name, positions.shape, head_size)
    if key is not None:
        key = _heads_view(key, k_name, positions.shape, head_size)
        if key.dtype != query.dtype:
            raise TypeError(f"{k_name} must have {q_name}'s dtype {query.dtype}, got {key.dtype}")
        if v.overlaps(query, key):
            raise ValueError(f"{q_name} and {k_name} share memory; pass separate arrays")
    v.indices_apart({"positions": positions}, {q_name: query, k_name: key})
    cache = np.asarray(cache)
    cos, sin = _cos_sin(cache, query.dtype, head_size - offset, offset, q_name)
    for x, name in ((query, q_name), (key, k_name)):
        if x is not None and v.overlaps(x, cache):
            raise ValueError(f"{name} shares memory with cos_sin_cache")
    return query, key, cos, sin


_OPTIONAL = ("key", "q_weight", "k_weight")
_INTEGERS = ("positions", "slot_mapping")  # tensors of any dtype (checked as integers later)
_MASKS: dict = {}  # names -> the bits of _OPTIONAL and _INTEGERS (kernels.tensor_arrays)


def _as_arrays(names: tuple, args: tuple, written: tuple) -> tuple:
    """NumPy views of the arguments: all torch tensors or all NumPy arrays (those named in
    `_OPTIONAL` may be None).

    The arguments named in `written` must be ndarrays already: a converted
    copy would take the result and be lost.
    """
    torch = sys.modules.get("torch")  # a tensor cannot exist before torch is imported
    if torch is not None and isinstance(args[1], torch.Tensor):
        masks = _MASKS.get(names)
        if masks is None:
            masks = _MASKS[names] = (sum(1 << i for i, name in enumerate(names) if name in _OPTIONAL),
                                     sum(1 << i for i, name in enumerate(names) if name in _INTEGERS))
        arrays = kernels.tensor_arrays(args, *masks)  # every plain CPU tensor, viewed in C
        if arrays is not None:
            return arrays
        return tuple(None if t is None and name in _OPTIONAL else _tensor_view(torch, t, name)
                     for name, t in zip(names, args))
    if torch is not None and any(isinstance(t, torch.Tensor) for t in args):
        raise TypeError(f"{', '.join(names)} must be all torch tensors or all NumPy arrays")
    for x, name in zip(args, names):
        if name in written and not isinstance(x, np.ndarray) and not (x is None and name in _OPTIONAL):
            raise TypeError(f"{name} must be a numpy.ndarray or torch.Tensor (it is written in "
                            f"place), got {type(x).__name__}")
    # a subclass (np.matrix, np.memmap) as a plain view of its memory: np.matrix refuses the reshapes
    return tuple(x.view(np.ndarray) if isinstance(x, np.ndarray) and type(x) is not np.ndarray else x
                 for x in args)


def tensors_written(names: tuple, args: tuple) -> tuple:
    """The torch tensors among `args` (named `names`) that a call writes in place, checked as torch
    checks its in-place ops: an inference tensor only under ``torch.inference_mode()``.  () for
    NumPy arrays."""
    torch = sys.modules.get("torch")  # a tensor cannot exist before torch is imported
    if torch is None or not isinstance(args[0], torch.Tensor):
        return ()
    tensors = tuple(t for t in args if isinstance(t, torch.Tensor))
    if not torch.is_inference_mode_enabled():
        for name, t in zip(names, args):
            if isinstance(t, torch.Tensor) and t.is_inference():
                raise ValueError(f"{name} is an inference tensor (made under torch.inference_mode()), "
                                 f"which torch updates in place only under inference mode; call "
                                 f"under torch.inference_mode(), or pass a clone")
    return tensors


def count_writes(tensors: tuple) -> None:
    """Tell autograd that `tensors_written`'s tensors were written (their version counters, as
    torch's own in-place ops bump them): a graph that saved one refuses its backward."""
    if tensors:
        sys.modules["torch"].autograd.graph.increment_version(tensors)


def _token_positions(positions) -> np.ndarray:
    """vLLM's positions: integers of shape (num_tokens,) or (batch, seq)."""
    positions = v.integer_array(positions)
    if positions.ndim not in (1, 2):
        raise ValueError(f"positions must have shape (num_tokens,) or (batch, seq), "
                         f"got {positions.shape}")
    return positions


def _tensor_view(torch: Any, t: ArrayOrTensor, name: str) -> np.ndarray:
    """The NumPy view of a CPU tensor's memory (never a copy)."""
    if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:  # a model's weights are Parameters
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor like query (or all NumPy arrays), "
                            f"got {type(t).__name__}")
        raise TypeError(f"{name} must be a plain torch.Tensor, got {type(t).__name__}; inside "
                        f"torch.compile call torch.ops.posenc_fast.rotary_embedding "
                        f"(import posenc_fast.torch_ops)")
    if not t.is_cpu or t.layout != torch.strided:
        raise ValueError(f"{name} must be a strided CPU tensor, got device {t.device}, "
                         f"layout {t.layout}")
    if (name not in _INTEGERS
            and t.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16)):
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {t.dtype}")
    if t.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{name} requires grad, and this call records no gradient (it runs in C, outside "
                         f"autograd); call under torch.no_grad() or torch.inference_mode()")
    try:
        return numpy_view(torch, t)
    except (TypeError, RuntimeError) as exc:  # e.g. a conjugate or negative view
        raise TypeError(f"{name} cannot be viewed as a NumPy array: {exc}") from None
    except ValueError as exc:  # e.g. a shape whose product NumPy cannot hold, even with a zero in it
        raise ValueError(f"{name} of shape {tuple(t.shape)} cannot be viewed as a NumPy array: {exc}") from None


def _heads_view(x: np.ndarray, name: str, lead: tuple, head_size: int) -> np.ndarray:
    """`x`, rotated in place, as a (num_tokens, heads, head_size) view of its own memory."""
    if not x.dtype.isnative:  # float_array would convert it: a copy, rotated and lost
        raise ValueError(f"{name} must be in native byte order to be rotated in place")
    x = _token_heads(x, name, lead, head_size)
    if not x.flags.writeable:
        raise ValueError(f"{name} must be writeable")
    return _apart(x, name)


def _apart(x: np.ndarray, name: str) -> np.ndarray:
    """`x`, rotated in place, checked to hold each element once."""
    if x.size and not v.elements_apart(x):
        raise ValueError(f"{name} of strides {x.strides} has elements that share memory (an "
                         f"expanded view?): rotated in place it would be rotated twice; pass "
                         f"a tensor of its own")
    return x


def _cos_sin(cache: np.ndarray, dtype: np.dtype, width: int, offset: int = 0, q_name: str = "query") -> tuple:
    """The cos and sin halves of a (max_position, rot_dim) cache, as views; `width`: the
    features of a head from `offset` on; the cache in `dtype` (`q_name`'s), or float32 for a half type."""
    cache = v.float_array(cache, "cos_sin_cache")
    if cache.ndim != 2:
        raise ValueError(f"cos_sin_cache must have shape (max_position, rot_dim), "
                         f"got {cache.shape}")
    rot_dim = cache.shape[1]
    if rot_dim % 2 or not 2 <= rot_dim <= width:
        where = f"head_size = {width}" if not offset else (
            f"head_size - rope_dim_offset = {width} (rope_dim_offset = {offset})")
        raise ValueError(f"cos_sin_cache.shape[1] is rot_dim, which must be even with 2 <= "
                         f"rot_dim <= {where}, got {rot_dim}")
    half_type = dtype.itemsize == 2
    if cache.dtype != dtype and not (half_type and cache.dtype == np.float32):
        allowed = f"{q_name}'s dtype {dtype}" + (" or float32" if half_type else "")
        raise TypeError(f"cos_sin_cache must have {allowed}, got {cache.dtype}; convert it "
                        f"once, as vLLM's RotaryEmbedding does")
    return cache[:, :rot_dim // 2], cache[:, rot_dim // 2:]


def apply_qk_to_cache(positions: ArrayOrTensor, query: ArrayOrTensor, key: ArrayOrTensor,
                      value: ArrayOrTensor, key_cache: ArrayOrTensor, value_cache: ArrayOrTensor,
                      slot_mapping: ArrayOrTensor, head_size: int, cos_sin_cache: ArrayOrTensor,
                      is_neox: bool, kv_cache_layout: str = "NHD", q_weight: ArrayOrTensor | None = None,
                      k_weight: ArrayOrTensor | None = None, eps: float = 1e-6,
                      weight_offset: float = 0.0) -> None:
    """`rotary_embedding` and vLLM's ``reshape_and_cache_flash`` in one pass (optionally q/k RMSNorm first).

    `query` is rotated in place; `key` is rotated straight into its slots of
    `key_cache` and `value` copied into `value_cache` (both left unchanged),
    as `RotaryEmbedding.apply_qk_to_cache` does with the server's own cos/sin
    cache.

    Parameters
    ----------
    positions, query, head_size, cos_sin_cache, is_neox
        As in `rotary_embedding` (without an offset: the first ``rot_dim``
        features of a head rotate).
    key, value : torch.Tensor or ndarray
        ``positions.shape + (kv_heads * head_size,)`` or ``positions.shape +
        (kv_heads, head_size)``, query's dtype; any strides (e.g. slices of
        a fused qkv projection).
    key_cache, value_cache : torch.Tensor or ndarray
        Laid out as `kv_cache_layout` says, any strides that keep each row
        (head_size features) contiguous and apart (e.g. ``kv_cache[0]`` and
        ``kv_cache[1]`` of vLLM's CPU cache ``(2, num_blocks, kv_heads,
        block_size, head_size)`` with ``"HND"``); query's dtype or
        float16/bfloat16 for float32 query (rounded once).
    slot_mapping : torch.Tensor or ndarray of int, positions.shape
        Each token's slot ``block * block_size + offset``; -1 skips it.
    kv_cache_layout : {"NHD", "HND"}, optional
        The caches' axes: ``"NHD"`` ``(num_blocks, block_size, kv_heads,
        head_size)`` (vLLM's flash layout), ``"HND"`` ``(num_blocks,
        kv_heads, block_size, head_size)`` (its CPU backend's, flashinfer's
        HND).  Never read from the shapes: they can fit both.
    q_weight, k_weight, eps, weight_offset : optional
        Both weights given: each q and k head is RMSNormed first, in the same
        pass, as `fused_qk_norm_rope` does (its cache rows then equal
        `fused_qk_norm_rope`'s key).

    Raises
    ------
    TypeError, ValueError
        As `rotary_embedding` and `RotaryEmbedding.apply_qk_to_cache`;
        nothing is written then.
    """
    if kernels.tokens_to_cache_fast(positions, query, key, value, key_cache, value_cache, slot_mapping, head_size,
                                    cos_sin_cache, is_neox, kv_cache_layout, q_weight, k_weight, eps, weight_offset):
        return  # the common call: checked, written and its tensors' versions counted in C
    tensors = tensors_written(("query", "key_cache", "value_cache"), (query, key_cache, value_cache))
    from . import _kv_cache

    names = ("positions", "query", "key", "value", "key_cache", "value_cache", "slot_mapping",
             "cos_sin_cache", "q_weight", "k_weight")
    arrays = _as_arrays(names, (positions, query, key, value, key_cache, value_cache,
                                slot_mapping, cos_sin_cache, q_weight, k_weight),
                        written=("query", "key_cache", "value_cache"))
    positions, query, key, value, key_cache, value_cache, slot_mapping, cache, q_weight, k_weight = arrays
    if (q_weight is None) != (k_weight is None):
        raise TypeError("pass both q_weight and k_weight (q/k RMSNorm first), or neither")
    if v.choice(kv_cache_layout, "kv_cache_layout", ("NHD", "HND")) == "HND":
        key_cache, value_cache = (np.swapaxes(c, 1, 2) if isinstance(c, np.ndarray) and c.ndim == 4
                                  else c for c in (key_cache, value_cache))
    head_size = v.integer(head_size, "head_size", minimum=1)
    is_neox = v.flag(is_neox, "is_neox")
    positions = _token_positions(positions)
    if isinstance(query, np.ndarray) and not query.dtype.isnative:  # a converted copy is lost
        raise ValueError("query must be in native byte order to be rotated in place")
    query = _apart(_token_heads(query, "query", positions.shape, head_size), "query")
    key = _token_heads(key, "key", positions.shape, head_size)
    value = _token_heads(value, "value", positions.shape, head_size)
    cos, sin = _cos_sin(cache, query.dtype, head_size)
    if v.overlaps(query, cos) or v.overlaps(query, sin):
        raise ValueError("query shares memory with cos_sin_cache")
    for x, name in ((key, "key"), (value, "value")):
        if v.overlaps(query, x):
            raise ValueError(f"query and {name} share memory; pass separate arrays")
    tokens = positions.reshape(-1)
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= cache.shape[0]):
        raise ValueError(f"positions must lie in [0, {cache.shape[0]}) (rows of cos_sin_cache), "
                         f"got values from {int(tokens.min())} to {int(tokens.max())}")
    slot_mapping = v.integer_array(slot_mapping, "slot_mapping")
    if slot_mapping.shape != positions.shape:
        raise ValueError(f"slot_mapping must have positions' shape {positions.shape}, "
                         f"got {slot_mapping.shape}")
    normed = _kv_cache._norm_weights(None if q_weight is None else (q_weight, k_weight), head_size, eps,
                                     weight_offset)
    call = _kv_cache.check_call(query, key, value, tokens, key_cache, value_cache,
                                slot_mapping.reshape(-1), query, head_size, {"cos_sin_cache": cache}, _kv_cache.Names(
                                    "query", "key", "value", "key_cache", "value_cache", "query"))
    if normed is None:
        # its halves as tables whose rows the kernel reads (a cache may step along them)
        _kv_cache.write(call, np.ascontiguousarray(tokens, dtype=np.int64), _as_table(cos), _as_table(sin),
                        is_neox)
    else:  # the norm computes in float32 (float64): the call's cos/sin rows, widened
        cos, sin = _rows_in(cos, sin, tokens, query.dtype)
        _kv_cache.write_normed(call, np.arange(tokens.size, dtype=np.int64), cos, sin, is_neox, 0, *normed)
    count_writes(tensors)


def _rows_in(cos: np.ndarray, sin: np.ndarray, tokens: np.ndarray, dtype: np.dtype) -> tuple:
    """Row t of each: token t's cos/sin row in `dtype`'s compute dtype (float32 for half types)."""
    compute = v.compute_dtype(dtype)
    return cos[tokens].astype(compute, copy=False), sin[tokens].astype(compute, copy=False)


def _token_heads(x, name: str, lead: tuple, head_size: int) -> np.ndarray:
    """`x` as a (num_tokens, heads, head_size) view of its own memory, any strides."""
    x = v.float_array(x, name)
    rest = x.shape[len(lead):]
    if (x.shape[:len(lead)] != lead or len(rest) not in (1, 2) or rest[-1] % head_size
            or (len(rest) == 2 and rest[-1] != head_size)):
        raise ValueError(f"{name} must have shape positions.shape + (heads * head_size,) or "
                         f"positions.shape + (heads, head_size), with positions.shape = "
                         f"{lead} and head_size = {head_size}, got {x.shape}")
    view = x.reshape(math.prod(lead), math.prod(rest) // head_size, head_size)
    if view.size and not np.may_share_memory(view, x):  # reshape had to copy
        raise ValueError(f"{name} of strides {x.strides} cannot be viewed as (num_tokens, "
                         f"heads, head_size); pass a contiguous array")
    return view



def fused_qk_norm_rope(positions: ArrayOrTensor, query: ArrayOrTensor, key: ArrayOrTensor,
                       q_weight: ArrayOrTensor, k_weight: ArrayOrTensor, head_size: int,
                       cos_sin_cache: ArrayOrTensor, is_neox: bool, eps: float = 1e-6,
                       weight_offset: float = 0.0) -> None:
    """RMSNorm each head of `query` and `key` and rotate it, in place, in one pass.

    What a server runs as ``q_norm``/``k_norm`` followed by `rotary_embedding`
    (SGLang's CPU ``fused_qk_norm_rope``): each head row ``x`` becomes
    ``rotate(x / sqrt(mean(x**2) + eps) * (weight_offset + weight))``, computed
    in float32 (float64 for float64 data), half types rounded once.

    Parameters
    ----------
    positions, query, key, head_size, cos_sin_cache, is_neox
        As in `rotary_embedding` (key required).
    q_weight, k_weight : torch.Tensor or ndarray of shape (head_size,)
        The norms' weights (any float dtype).
    eps : float, optional
        As in `RotaryEmbedding.apply_qk_norm`.
    weight_offset : float, optional
        1.0 for Gemma's ``(1 + weight)``.

    Raises
    ------
    TypeError, ValueError
        As `rotary_embedding`, and weights not of shape (head_size,), eps
        below 0; nothing is written then.
    """
    if kernels.fused_qk_norm_rope_fast(positions, query, key, q_weight, k_weight, head_size, cos_sin_cache,
                                       is_neox, eps, weight_offset):
        return  # the common call: checked, normalised, rotated and its tensors' versions counted in C
    tensors = tensors_written(("query", "key"), (query, key))
    from ._qk_norm import norm_args, norm_rotate, norm_weight, token_rows

    names = ("positions", "query", "key", "q_weight", "k_weight", "cos_sin_cache")
    positions, query, key, q_weight, k_weight, cache = _as_arrays(
        names, (positions, query, key, q_weight, k_weight, cos_sin_cache),
        written=("query", "key"))
    if key is None:
        raise TypeError("key must be an array (fused_qk_norm_rope normalises both)")
    head_size = v.integer(head_size, "head_size", minimum=1)
    is_neox = v.flag(is_neox, "is_neox")
    eps, weight_offset = norm_args(eps, weight_offset)
    positions = _token_positions(positions)
    query, key, cos, sin = _query_key_cache(positions, query, key, head_size, cache)
    tokens = positions.reshape(-1)
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= cos.shape[0]):
        raise ValueError(f"positions must lie in [0, {cos.shape[0]}) (rows of cos_sin_cache), "
                         f"got values from {int(tokens.min())} to {int(tokens.max())}")
    weights = (norm_weight(q_weight, "q_weight", head_size, weight_offset),
               norm_weight(k_weight, "k_weight", head_size, weight_offset))
    cos, sin = _rows_in(cos, sin, tokens, query.dtype)  # never the whole cache: O(tokens) a call
    for x, weight in zip((query, key), weights):
        norm_rotate(x, x, True, weight, eps, cos, sin, token_rows(np.arange(tokens.size), x.shape[1]),
                    is_neox)
    count_writes(tensors)
