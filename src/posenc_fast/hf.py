"""posenc_fast as the rotary kernel of Hugging Face transformers on the CPU.

`apply_rotary_pos_emb` has the signature and results of transformers' Llama
function and takes CPU torch tensors (viewed through NumPy, no copies) or
NumPy arrays; `install` puts posenc_fast in place of the ``apply_rotary_pos_emb``
of every modeling module whose function it computes exactly (Llama's and its
partial, interleaved, float32 and mRoPE variants:
``_hf_models.ROTARY_FUNCTIONS``), and MLA's ``apply_rotary_pos_emb_interleave``
(``_hf_models.INTERLEAVE_FUNCTIONS``).  torch and transformers stay optional: this
module imports neither until a call needs it.
"""

import collections
import importlib
import inspect
import sys

import numpy as np

from . import _validate as v
from ._dispatch import kernels
from ._cos_sin_cache import apply_rotary_cos_sin
from ._hf_models import INTERLEAVE_FUNCTIONS, NOT_PATCHED, ROTARY_FUNCTIONS

# function name -> {module: what that module's function of the name computes}
_PATCHED = {"apply_rotary_pos_emb": ROTARY_FUNCTIONS, "apply_rotary_pos_emb_interleave": INTERLEAVE_FUNCTIONS}

SUPPORTED_FAMILIES = tuple(sorted(set(ROTARY_FUNCTIONS) | set(INTERLEAVE_FUNCTIONS)))
"""Modeling modules (``transformers/models/<name>``) whose ``apply_rotary_pos_emb`` (or MLA's
``apply_rotary_pos_emb_interleave``) `install` replaces."""

_LLAMA = ROTARY_FUNCTIONS["llama"]

FALLBACKS: collections.Counter = collections.Counter()
"""Calls that needed a gradient and took transformers' formula, by reason (every other call
with q/k needing a gradient runs the kernel, with its backward)."""

# (module name, function name) -> the function `install` replaced there
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
        half is read, as one entry per rotated pair.  torch tensors whose
        halves differ take transformers' formula (which then rotates no
        pairs); NumPy arrays are not checked (a different result).
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
    float64, bfloat16 or float16 tensors and ``cos``/``sin`` are not wider
    than the data (torch would then promote the result).  q and k may need a
    gradient (training): the backward is the kernel's rotation of the
    gradients by ``(cos, -sin)``, the transpose of the forward, as exact.
    bfloat16/float16 are computed in float32 and rounded once
    (transformers' own formula rounds every operation to the half type, so
    the results differ in the last bit: ours are the closer ones).
    Everything else (other devices, cos/sin that need a gradient, tracing by
    ``torch.compile``) runs transformers' own formula in torch, so GPUs keep
    working unchanged; calls that fell back for a gradient are counted in
    `FALLBACKS`.  NumPy inputs follow
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
    if not all(isinstance(t, torch.Tensor) for t in (q, k, cos, sin)):
        raise TypeError("q, k, cos and sin must be all torch tensors or all NumPy arrays")
    rotated = _rotate_tensors(torch, _LLAMA, q, k, cos, sin, unsqueeze_dim)
    return rotated if rotated is not None else _torch_formula(torch, q, k, cos, sin, unsqueeze_dim)


def _rotate_tensors(torch, function, q, k, cos, sin, unsqueeze_dim):
    """What `function` computes, by the kernel on NumPy views; None when that would not be exact."""
    tensors = (q, k, cos, sin)
    if not _numpy_can_take(torch, function, tensors):
        return None
    arrays = [numpy_view(torch, t) for t in tensors]
    if (_fits(function, q.shape, k.shape, cos.shape[-1])  # else _apply_numpy says what is wrong
            and not (_cache_repeats(function, arrays[2]) and _cache_repeats(function, arrays[3]))):
        return None  # its formula is then no rotation of pairs
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        return _rotation(torch).apply(q, k, cos, sin, function, unsqueeze_dim, arrays)
    return _rotated(torch, function, arrays, (q.dtype, k.dtype), unsqueeze_dim)


def _rotated(torch, function, arrays, dtypes, unsqueeze_dim):
    # The kernel on NumPy views (q, k, cos, sin); the results as tensors of `dtypes`.
    q_rot, k_rot = _apply_numpy(*arrays, unsqueeze_dim, function)
    return _torch_view(torch, q_rot, dtypes[0]), _torch_view(torch, k_rot, dtypes[1])


_ROTATION = []


def _rotation(torch):
    """The kernel's rotation as a ``torch.autograd.Function`` (made once torch is imported).

    Its backward is the transpose of the forward's rotation: the rotation of
    the incoming gradients by ``(cos, -sin)`` (the function with `inverse`
    flipped), the same kernel, float32 arithmetic and one rounding for half
    types; a deinterleaving function's (MLA's) gradients are interleaved
    back.  cos and sin get no gradient (calls whose cos/sin need one take
    the module's own formula: `FALLBACKS`).
    """
    if _ROTATION:
        return _ROTATION[0]

    class Rotation(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, cos, sin, function, unsqueeze_dim, arrays):
            # arrays: the NumPy views of q, k, cos, sin the caller already made
            ctx.save_for_backward(cos, sin)
            ctx.function, ctx.unsqueeze_dim, ctx.tables = function, unsqueeze_dim, arrays[2:]
            return _rotated(torch, function, arrays, (q.dtype, k.dtype), unsqueeze_dim)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad_q, grad_k):
            ctx.saved_tensors  # raises if cos/sin changed in place since the forward
            function = ctx.function
            # A deinterleaving function rotates (x[0::2] | x[1::2]) in halves: its transpose
            # rotates back in halves, then interleaves.
            transpose = function._replace(inverse=not function.inverse, deinterleaves=False,
                                          layout=function.kernel_layout)
            grads = [numpy_view(torch, g) for g in (grad_q, grad_k)]
            grad_q, grad_k = _rotated(torch, transpose, grads + list(ctx.tables),
                                      (grad_q.dtype, grad_k.dtype), ctx.unsqueeze_dim)
            if function.deinterleaves:
                grad_q, grad_k = (torch.stack(g.chunk(2, -1), -1).flatten(-2)
                                  for g in (grad_q, grad_k))
            return (grad_q if ctx.needs_input_grad[0] else None,
                    grad_k if ctx.needs_input_grad[1] else None, None, None, None, None, None)

    _ROTATION.append(Rotation)
    return Rotation


def numpy_view(torch, t):
    """A CPU tensor's memory as an ndarray (no copy): half types through int16,
    since NumPy has no bfloat16 of its own.  (.numpy() refuses tensors that
    require grad, possible under no_grad: they are detached.)"""
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


def _numpy_can_take(torch, function, tensors) -> bool:
    """True when NumPy views of the tensors give exactly `function`'s result dtypes and values."""
    # Called once per attention layer and step: the cheapest attributes first.
    fast = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    q, k, cos, sin = tensors
    for t in tensors:
        if (type(t) is not torch.Tensor or not t.is_cpu or t.layout != torch.strided
                or t.dtype not in fast):
            return False
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or cos.requires_grad
                                    or sin.requires_grad):
        if cos.requires_grad or sin.requires_grad:  # Rotation carries q's and k's gradients only
            FALLBACKS["cos/sin need a gradient"] += 1
            return False
    cache = cos.dtype
    if sin.dtype != cache:
        return False
    for t in (q, k):  # the kernel takes half data with a float32 cache or one of its own dtype
        if t.dtype in (torch.bfloat16, torch.float16) and cache not in (torch.float32, t.dtype):
            return False
    if function.compute == "float32":  # q.float(), k.float(): float64 would be rounded first
        if k.dtype != q.dtype or torch.float64 in (q.dtype, cache):
            return False
    elif function.compute == "torch" and not q.dtype == k.dtype == cache:
        if any(torch.promote_types(t.dtype, cache) != t.dtype for t in (q, k)):
            return False  # torch would return the cache's wider dtype
    return not torch.compiler.is_compiling()


def _fits(function, q_shape, k_shape, width) -> bool:
    """True when `function` rotates pairs of q and k with a cache `width` wide."""
    dim = q_shape[-1] if q_shape else 0
    rotated = 2 * width if function.cache == "half_width" else width
    return (dim >= 2 and dim % 2 == 0 and rotated % 2 == 0 and len(k_shape) >= 1
            and k_shape[-1] == dim and (rotated == dim or function.partial and 2 <= rotated <= dim))


def _cache_repeats(function, cache) -> bool:
    """True when `cache` has the repeated entries `function`'s formula needs to rotate pairs."""
    pairs = function.cache == "pairs"
    if not (pairs or function.cache == "halves" and function.layout == "half"):
        return True  # one entry per pair, or only the first half read
    same = kernels.entries_repeat(cache, pairs)  # bitwise, in C (NumPy's compare costs a decode step ~10 us)
    if same is not None:
        return same
    width = cache.shape[-1] if cache.ndim else 0
    if pairs:
        return np.array_equal(cache[..., 0::2], cache[..., 1::2])
    return np.array_equal(cache[..., :width // 2], cache[..., width // 2:])


def _torch_formula(torch, q, k, cos, sin, unsqueeze_dim):
    # transformers' own code, for what the NumPy path does not take.
    def rotate_half(x):
        x1, x2 = x[..., :x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _apply_numpy(q, k, cos, sin, unsqueeze_dim, function=_LLAMA):
    unsqueeze_dim = v.integer(unsqueeze_dim, "unsqueeze_dim")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {cos.shape} and {sin.shape}")
    if not -cos.ndim - 1 <= unsqueeze_dim <= cos.ndim:
        raise ValueError(f"unsqueeze_dim must be in [{-cos.ndim - 1}, {cos.ndim}] for cos of "
                         f"shape {cos.shape}, got {unsqueeze_dim}")
    axis = unsqueeze_dim + cos.ndim + 1 if unsqueeze_dim < 0 else unsqueeze_dim
    shape = cos.shape[:axis] + (1,) + cos.shape[axis:]
    cos, sin = cos.reshape(shape), sin.reshape(shape)  # np.expand_dims without its overhead
    width = cos.shape[-1]
    if not _fits(function, q.shape, k.shape, width):
        raise ValueError(f"q, k and the unsqueezed cos/sin must end in the same even head_dim, "
                         f"got q {q.shape}, k {k.shape}, cos {cos.shape} (a full-width "
                         f"transformers cache, halves repeated)")
    if function.cache == "halves":
        cos, sin = cos[..., :width // 2], sin[..., :width // 2]
    elif function.cache == "pairs":
        cos, sin = cos[..., 0::2], sin[..., 0::2]
    outs = (None, None)
    if function.deinterleaves:  # its pairs (x[2i], x[2i + 1]) laid out in halves, then rotated there, in place
        q, k = outs = tuple(np.concatenate((x[..., 0::2], x[..., 1::2]), axis=-1) for x in (q, k))
    # Contiguous q and k (every decode step): the compiled path checks the rest.
    fast = kernels.rotate_cos_sin_fast((q, k), cos, sin, function.kernel_layout, function.inverse, outs)
    if fast is not None:
        return fast
    for x, name in ((q, "q"), (k, "k")):
        v.broadcast_target(cos.shape[:-1], x.shape[:-1],
                           f"cos/sin unsqueezed at {unsqueeze_dim}: their leading shape",
                           f"{name}.shape[:-1]")
    return (_rotate_in_memory_order(q, cos, sin, function),
            _rotate_in_memory_order(k, cos, sin, function))


def _rotate_in_memory_order(x, cos, sin, function):
    """Rotate `x` after permuting its leading axes into memory order, if that avoids a copy."""
    axes = sorted(range(x.ndim - 1), key=lambda axis: -x.strides[axis]) + [x.ndim - 1]
    x_t = x.transpose(axes)
    if x.flags.c_contiguous or not x_t.flags.c_contiguous:
        return apply_rotary_cos_sin(x, cos, sin, layout=function.kernel_layout, inverse=function.inverse)
    lead = (1,) * (x.ndim - cos.ndim)  # broadcasting's implicit leading axes, made explicit
    cos_t, sin_t = (t.reshape(lead + t.shape).transpose(axes) for t in (cos, sin))
    return apply_rotary_cos_sin(x_t, cos_t, sin_t, layout=function.kernel_layout,
                                inverse=function.inverse).transpose(np.argsort(axes))


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

    Replaces ``apply_rotary_pos_emb`` in the modeling modules whose function
    posenc_fast computes exactly (`SUPPORTED_FAMILIES`: Llama's half layout,
    its partial, interleaved, float32 and mRoPE variants), and MLA's
    ``apply_rotary_pos_emb_interleave`` (DeepSeek-V3's, used when the config
    sets ``rope_interleave``, and always by Bailing-hybrid, GLM-MoE-DSA,
    LongCat-Flash and Mistral-Large-4).  Their attention
    ``forward`` looks the function up as a module global on every call, so
    models already built are affected too.  Results are those of the
    module's own function (bit for bit in float32/float64 on the CPU); other
    dtypes, devices, ``torch.compile`` tracing and caches whose
    entries do not repeat as the function expects fall back to the module's
    own function.  With parameters that need a gradient (training, or a
    forward outside ``torch.no_grad()``) the kernel runs too, with its exact
    backward (see `apply_rotary_pos_emb`); what still falls back for a
    gradient is counted in `FALLBACKS`.

    Parameters
    ----------
    model : torch.nn.Module, optional
        Patch only the modules the model's submodules come from (e.g. a Llama
        inside a larger model); parts whose module has another function keep
        it.  Default: every supported module of the installed transformers
        (importing them all takes seconds).

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
        `model` has no part from a supported module (the message says why
        for each module of its parts that defines ``apply_rotary_pos_emb``).

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
    for module, name, function in _functions_to_patch(model):
        if (module.__name__, name) not in _originals:
            original = getattr(module, name)
            _originals[module.__name__, name] = original
            setattr(module, name, _replacement(original, function))
            installed.append(module.__name__)
    return Installation(dict.fromkeys(installed))


def uninstall() -> None:
    """Restore transformers' own functions wherever `install` replaced them."""
    _restore({module for module, _ in _originals})


def _restore(modules) -> None:
    for key in [key for key in _originals if key[0] in modules]:
        setattr(sys.modules[key[0]], key[1], _originals.pop(key))


def _replacement(original, function):
    """`original` computed by posenc_fast when it can be exactly, else `original` itself."""
    def apply_rotary_pos_emb(*args, **kwargs):
        # Every transformers caller passes (q, k, cos, sin) and perhaps unsqueeze_dim=.
        if len(args) == 4 and (not kwargs or kwargs.keys() == {"unsqueeze_dim"}):
            rotated = _rotate_if_fits(function, *args, kwargs.get("unsqueeze_dim", 1))
            if rotated is not None:
                return rotated
        return original(*args, **kwargs)

    apply_rotary_pos_emb.__doc__ = f"posenc_fast's kernel for {original.__module__}'s function."
    apply_rotary_pos_emb.__wrapped__ = original
    return apply_rotary_pos_emb


def _rotate_if_fits(function, q, k, cos, sin, unsqueeze_dim):
    torch = sys.modules["torch"]
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
            and isinstance(cos, torch.Tensor) and _fits(function, q.shape, k.shape, cos.shape[-1])):
        return None
    return _rotate_tensors(torch, function, q, k, cos, sin, unsqueeze_dim)


def _module_name(family: str) -> str:
    return f"transformers.models.{family}.modeling_{family}"


def _why_not_patched(module, name):
    """None when `install` can patch the module's function `name`, else why not."""
    family = module.__name__.split(".")[2]
    table = _PATCHED[name]
    if module.__name__ != _module_name(family) or family not in table:
        return f"{family}: {NOT_PATCHED.get(family, f'its {name} is not classified')}"
    signature = inspect.signature(getattr(module, name))
    params = signature.parameters
    if (list(params)[:4] != ["q", "k", "cos", "sin"] or "unsqueeze_dim" not in params
            or params["unsqueeze_dim"].default != 1):
        return (f"{family}: its {name}{signature} is not the (q, k, cos, sin, "
                f"unsqueeze_dim=1) read from {table[family].source}")
    return None


def _functions_to_patch(model) -> list:
    """[(module, function name, RotaryFunction)] for `install`."""
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
    else:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
        names = sorted({type(m).__module__ for m in model.modules()})
        modules = [sys.modules[name] for name in names if name.startswith("transformers.models.")]
    found = [(module, name) for module in modules for name in _PATCHED if hasattr(module, name)]
    reasons = [_why_not_patched(module, name) for module, name in found]
    patchable = [(module, name, _PATCHED[name][module.__name__.split(".")[2]])
                 for (module, name), reason in zip(found, reasons) if reason is None]
    reasons = [reason for reason in reasons if reason is not None]
    if model is None and reasons:  # the table no longer matches this transformers
        raise ValueError("; ".join(reasons))
    if not patchable and model is not None:
        why = "; ".join(reasons) or "no part defines apply_rotary_pos_emb"
        raise ValueError(f"{type(model).__name__} has no part from a supported module ({why})")
    return patchable
