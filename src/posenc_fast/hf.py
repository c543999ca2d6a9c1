"""posenc_fast as the rotary kernel of Hugging Face transformers on the CPU.

`apply_rotary_pos_emb` has the signature and results of transformers' Llama
function and takes CPU torch tensors (viewed through NumPy, no copies) or
NumPy arrays; `install` puts it in place of transformers' own in the modeling
modules of the families that share that function.  torch and transformers
stay optional: this module imports neither until a call needs it.
"""

import importlib
import sys

import numpy as np

from . import _validate as v
from ._dispatch import kernels
from ._cos_sin_cache import apply_rotary_cos_sin

SUPPORTED_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
                      "gemma", "gemma2", "granite")
"""Model types whose modeling module defines the Llama ``apply_rotary_pos_emb``."""

# module name -> the function `install` replaced there
_originals: dict = {}


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """Rotate queries and keys exactly as transformers' Llama ``apply_rotary_pos_emb``.

    Computes ``q * cos + rotate_half(q) * sin`` (and the same for `k`) with
    ``cos``/``sin`` unsqueezed at `unsqueeze_dim`, by posenc_fast's kernel:
    one pass, no temporaries of q's size, and the memory order of `q`/`k`
    kept (Llama's ``(batch, heads, seq, dim)`` transposed views are rotated
    where they lie, and the results have the strides torch would give them).

    Parameters
    ----------
    q : torch.Tensor or ndarray of shape (..., head_dim)
        Queries, e.g. ``(batch, heads, seq, head_dim)``; any strides.
    k : torch.Tensor or ndarray of shape (..., head_dim)
        Keys, e.g. ``(batch, kv_heads, seq, head_dim)``.
    cos, sin : torch.Tensor or ndarray of shape (batch, seq, head_dim)
        The full-width cache transformers' rotary embedding module returns,
        whose halves repeat (``cat((freqs, freqs), -1)``).  Only the first
        half is read, as one entry per rotated pair: a cache whose halves
        differ gives a different result than transformers (not checked,
        which would cost a pass over the cache).
    position_ids : ignored
        transformers 4.x passed it but never used it; transformers 5 removed
        it (its signature is ``(q, k, cos, sin, unsqueeze_dim=1)``), so pass
        `unsqueeze_dim` by keyword, as every transformers caller does.
    unsqueeze_dim : int, optional
        Where ``cos``/``sin`` get their heads axis: 1 for ``q`` of shape
        ``(batch, heads, seq, head_dim)``, 2 for ``(batch, seq, heads,
        head_dim)``; any axis for which the unsqueezed cache broadcasts.

    Returns
    -------
    q_embed, k_embed
        Of the same kind as `q` (torch tensors made with
        ``torch.from_numpy``, sharing memory with the kernel's output) and
        with q's and k's shapes and dtypes.

    Raises
    ------
    TypeError
        NumPy data of another dtype than float16, bfloat16, float32 or
        float64, or torch tensors mixed with
        NumPy arrays.
    ValueError
        ``cos``/``sin`` not of shape ``(..., head_dim)`` with an even
        head_dim, or not broadcasting against `q`/`k` once unsqueezed.

    Notes
    -----
    torch tensors take the fast path when they are plain CPU float32,
    float64, bfloat16 or float16 tensors needing no gradient and
    ``cos``/``sin`` are not wider than the data (torch would then promote the
    result).  bfloat16/float16 are computed in float32 and rounded once
    (transformers' own formula rounds every operation to the half type, so
    the results differ in the last bit: ours are the closer ones).
    Everything else (other devices, tensors that require grad while autograd
    is on, tracing by ``torch.compile``) runs transformers' own formula in
    torch, so training and GPUs keep working unchanged.  NumPy inputs follow
    posenc_fast's rule: the result has q's (k's) dtype, computed in the wider
    of its and the cache's dtype (float32 for a half type).  The kernel's thread count is
    `posenc_fast.set_num_threads`, not torch's.

    Examples
    --------
    >>> import torch
    >>> from posenc_fast import hf
    >>> q, k = torch.randn(1, 8, 16, 64), torch.randn(1, 2, 16, 64)
    >>> angles = torch.arange(16.0)[:, None] * 10000.0 ** (-torch.arange(0, 64, 2) / 64)
    >>> emb = torch.cat((angles, angles), dim=-1)[None]
    >>> q_embed, k_embed = hf.apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    >>> q_embed.shape, k_embed.shape
    (torch.Size([1, 8, 16, 64]), torch.Size([1, 2, 16, 64]))
    """
    torch = sys.modules.get("torch")  # a tensor cannot exist before torch is imported
    if torch is not None and isinstance(q, torch.Tensor):
        return _apply_torch(torch, q, k, cos, sin, unsqueeze_dim)
    if torch is not None and any(isinstance(t, torch.Tensor) for t in (k, cos, sin)):
        raise TypeError("q, k, cos and sin must be all torch tensors or all NumPy arrays")
    return _apply_numpy(v.float_array(q, "q"), v.float_array(k, "k"), v.float_array(cos, "cos"),
                        v.float_array(sin, "sin"), unsqueeze_dim)


def _apply_torch(torch, q, k, cos, sin, unsqueeze_dim):
    tensors = (q, k, cos, sin)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        raise TypeError("q, k, cos and sin must be all torch tensors or all NumPy arrays")
    if not _numpy_can_take(torch, tensors):
        return _torch_formula(torch, q, k, cos, sin, unsqueeze_dim)
    q_rot, k_rot = _apply_numpy(*(_numpy_view(torch, t) for t in tensors), unsqueeze_dim)
    return _torch_view(torch, q_rot, q.dtype), _torch_view(torch, k_rot, k.dtype)


def _numpy_view(torch, t):
    # The tensor's memory as an ndarray: half types through int16, since NumPy
    # has no bfloat16 of its own.  (.numpy() refuses tensors that require grad,
    # possible under no_grad.)
    t = t.detach() if t.requires_grad else t
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16).numpy().view(
            v.BFLOAT16 if t.dtype == torch.bfloat16 else np.float16)
    return t.numpy()


def _torch_view(torch, a, dtype):
    # The result's memory as a tensor of `dtype` (q's or k's).
    if dtype in (torch.bfloat16, torch.float16):
        return torch.from_numpy(a.view(np.int16)).view(dtype)
    return torch.from_numpy(a)


def _numpy_can_take(torch, tensors) -> bool:
    """True when NumPy views of the tensors give exactly transformers' result."""
    # Called once per attention layer and step: the cheapest attributes first.
    fast = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    q, k, cos, sin = tensors
    for t in tensors:
        if (type(t) is not torch.Tensor or not t.is_cpu or t.layout != torch.strided
                or t.dtype not in fast):
            return False
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or cos.requires_grad
                                    or sin.requires_grad):
        return False  # detaching would silently cut the graph
    if not q.dtype == k.dtype == cos.dtype == sin.dtype:
        cache = torch.promote_types(cos.dtype, sin.dtype)
        if any(torch.promote_types(t.dtype, cache) != t.dtype for t in (q, k)):
            return False  # torch would return the cache's wider dtype
    return not torch.compiler.is_compiling()


def _torch_formula(torch, q, k, cos, sin, unsqueeze_dim):
    # transformers' own code, for what the NumPy path does not take.
    def rotate_half(x):
        x1, x2 = x[..., :x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _apply_numpy(q, k, cos, sin, unsqueeze_dim):
    unsqueeze_dim = v.integer(unsqueeze_dim, "unsqueeze_dim")
    dim = q.shape[-1] if q.ndim else 0
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {cos.shape} and {sin.shape}")
    if not -cos.ndim - 1 <= unsqueeze_dim <= cos.ndim:
        raise ValueError(f"unsqueeze_dim must be in [{-cos.ndim - 1}, {cos.ndim}] for cos of "
                         f"shape {cos.shape}, got {unsqueeze_dim}")
    axis = unsqueeze_dim + cos.ndim + 1 if unsqueeze_dim < 0 else unsqueeze_dim
    shape = cos.shape[:axis] + (1,) + cos.shape[axis:]
    cos, sin = cos.reshape(shape), sin.reshape(shape)  # np.expand_dims without its overhead
    if dim < 2 or dim % 2 or k.ndim < 1 or k.shape[-1] != dim or cos.shape[-1] != dim:
        raise ValueError(f"q, k and the unsqueezed cos/sin must end in the same even head_dim, "
                         f"got q {q.shape}, k {k.shape}, cos {cos.shape} (a full-width "
                         f"transformers cache, halves repeated)")
    cos, sin = cos[..., :dim // 2], sin[..., :dim // 2]
    # Contiguous q and k (every decode step): the compiled path checks the rest.
    fast = kernels.rotate_cos_sin_fast((q, k), cos, sin, "half", False, (None, None))
    if fast is not None:
        return fast
    for x, name in ((q, "q"), (k, "k")):
        v.broadcast_target(cos.shape[:-1], x.shape[:-1],
                           f"cos/sin unsqueezed at {unsqueeze_dim}: their leading shape",
                           f"{name}.shape[:-1]")
    return _rotate_in_memory_order(q, cos, sin), _rotate_in_memory_order(k, cos, sin)


def _rotate_in_memory_order(x, cos, sin):
    """Rotate `x` after permuting its leading axes into memory order, if that avoids a copy."""
    axes = sorted(range(x.ndim - 1), key=lambda axis: -x.strides[axis]) + [x.ndim - 1]
    x_t = x.transpose(axes)
    if x.flags.c_contiguous or not x_t.flags.c_contiguous:
        return apply_rotary_cos_sin(x, cos, sin)
    lead = (1,) * (x.ndim - cos.ndim)  # broadcasting's implicit leading axes, made explicit
    cos_t, sin_t = (t.reshape(lead + t.shape).transpose(axes) for t in (cos, sin))
    return apply_rotary_cos_sin(x_t, cos_t, sin_t).transpose(np.argsort(axes))


class Installation:
    """What `install` replaced; leaving a ``with`` block puts it back.

    Attributes
    ----------
    modules : tuple of str
        The modeling modules this call patched (those already patched by an
        earlier `install` are not listed and stay patched).
    """

    def __init__(self, modules):
        self.modules = tuple(modules)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        _restore(self.modules)

    def __repr__(self):
        return f"Installation(modules={self.modules!r})"


def install(model=None) -> Installation:
    """Make transformers models on the CPU rotate queries and keys with posenc_fast.

    Replaces ``apply_rotary_pos_emb`` in the modeling modules of the
    supported families (`SUPPORTED_FAMILIES`) by `apply_rotary_pos_emb` of
    this module.  Their attention ``forward`` looks the function up as a
    module global on every call, so models already built are affected too.
    Results are those of transformers' own function (bit for bit in
    float32/float64 on the CPU); other dtypes, devices and training fall back
    to transformers' formula.  Run the model under ``torch.no_grad()`` or
    ``torch.inference_mode()`` (``generate`` does): otherwise q and k require
    grad and every call takes the fallback.

    Parameters
    ----------
    model : torch.nn.Module, optional
        Patch only the modules the model's submodules come from (e.g. a Llama
        inside a larger model).  Default: every supported family present in
        the installed transformers.

    Returns
    -------
    Installation
        A context manager: leaving the ``with`` block restores what this
        call replaced.  `uninstall` restores everything.

    Raises
    ------
    ImportError
        torch or transformers is missing.
    ValueError
        `model` has no submodule from a supported family.

    Examples
    --------
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from posenc_fast import hf
    >>> model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=128))
    >>> with hf.install(model):
    ...     ids = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False)
    """
    installed = []
    for module in _modeling_modules(model):
        if module.__name__ not in _originals:
            _originals[module.__name__] = module.apply_rotary_pos_emb
            module.apply_rotary_pos_emb = apply_rotary_pos_emb
            installed.append(module.__name__)
    return Installation(installed)


def uninstall() -> None:
    """Restore transformers' own ``apply_rotary_pos_emb`` wherever `install` replaced it."""
    _restore(tuple(_originals))


def _restore(names) -> None:
    for name in names:
        original = _originals.pop(name, None)
        if original is not None:
            sys.modules[name].apply_rotary_pos_emb = original


def _module_name(family: str) -> str:
    return f"transformers.models.{family}.modeling_{family}"


def _modeling_modules(model) -> list:
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        raise ImportError("posenc_fast.hf needs torch: pip install torch") from None
    try:
        importlib.import_module("transformers")
    except ImportError:
        raise ImportError("posenc_fast.hf.install needs transformers: "
                          "pip install transformers") from None
    if model is None:
        modules = []
        for family in SUPPORTED_FAMILIES:
            try:
                modules.append(importlib.import_module(_module_name(family)))
            except ModuleNotFoundError as exc:  # a family this transformers lacks
                if not _module_name(family).startswith(str(exc.name)):
                    raise
        return modules
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
    supported = {_module_name(family) for family in SUPPORTED_FAMILIES}
    names = sorted({type(m).__module__ for m in model.modules()} & supported)
    if not names:
        raise ValueError(f"{type(model).__name__} has no part from a supported family "
                         f"({', '.join(SUPPORTED_FAMILIES)})")
    return [sys.modules[name] for name in names]
