"""posenc_fast as the rotary kernel of Hugging Face transformers on the CPU.

`apply_rotary_pos_emb` has the signature and results of transformers' Llama
function and takes CPU torch tensors (viewed through NumPy, no copies) or
NumPy arrays, and `apply_rotary_pos_emb_single` those of Gemma 4's one-tensor
``apply_rotary_pos_emb(x, cos, sin)``; `install` puts posenc_fast in place of the
``apply_rotary_pos_emb`` of every modeling module of transformers 5.24 that has
one (Llama's and its partial, interleaved, float32 and mRoPE variants, the
one-tensor forms of Gemma 4 and DeepSeek-V4, GPT-J's, DINOv3's, PE's, CLVP's:
``_hf_functions.ROTARY_FUNCTIONS``, each computed exactly), MLA's
``apply_rotary_pos_emb_interleave`` (``_hf_functions.INTERLEAVE_FUNCTIONS``)
and the vision towers' ``apply_rotary_pos_emb_vision``
(``_hf_functions.VISION_FUNCTIONS``).  The kernel path they share is
``_hf_drop_in``.  torch and transformers stay optional: this module imports
neither until a call needs it.
"""

import importlib
import inspect
import sys

from . import _hf_drop_in as _drop_in
from ._hf_drop_in import _PATCHED, FALLBACKS, _apply, _fell_back, _fits, numpy_view
from ._hf_functions import NOT_PATCHED, ROTARY_FUNCTIONS

__all__ = ["FALLBACKS", "Installation", "SUPPORTED_FAMILIES", "apply_rotary_pos_emb", "apply_rotary_pos_emb_single",
           "install", "numpy_view", "uninstall"]

# _PATCHED (_hf_drop_in's): function name -> {module: what that module's function of the name computes}

SUPPORTED_FAMILIES = tuple(sorted(set().union(*_PATCHED.values())))
"""Modeling modules (``transformers/models/<name>``) whose ``apply_rotary_pos_emb`` (or MLA's
``apply_rotary_pos_emb_interleave``, or a vision tower's ``apply_rotary_pos_emb_vision``) `install`
replaces."""

_LLAMA = ROTARY_FUNCTIONS["llama"]
_ONE_TENSOR = ROTARY_FUNCTIONS["gemma4"]

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
        Of the same kind as `q` (new torch tensors, the kernel's output
        written into their memory) and with q's and k's shapes and dtypes.

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
    Under ``torch.compile`` the call is the op
    ``torch.ops.posenc_fast.hf_rotate`` (`posenc_fast.torch_ops`): the same
    kernel and backward, kept in the graph (no graph break).
    Everything else (other devices, cos/sin that need a gradient) runs
    transformers' own formula in torch, so GPUs keep
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
    return _apply(_LLAMA, (q, k), cos, sin, unsqueeze_dim)


def apply_rotary_pos_emb_single(x, cos, sin, unsqueeze_dim=1):
    """Rotate one tensor exactly as Gemma 4's (and Gemma 3n's) ``apply_rotary_pos_emb``.

    Computes ``x * cos + rotate_half(x) * sin`` with ``cos``/``sin``
    unsqueezed at `unsqueeze_dim`: the one-tensor form of
    `apply_rotary_pos_emb`, whose callers rotate queries and keys in
    separate calls (Gemma 4's attention, with ``unsqueeze_dim=2`` on
    ``(batch, seq, heads, head_dim)``), under the same rules: the kernel for
    plain CPU tensors (and NumPy arrays), in x's memory order, with its
    exact backward when `x` needs a gradient, transformers' formula
    otherwise (cos/sin needing a gradient counted in `FALLBACKS`).

    Parameters
    ----------
    x : torch.Tensor or ndarray of shape (..., head_dim)
        The queries or the keys; any strides.
    cos, sin : torch.Tensor or ndarray of shape (batch, seq, head_dim)
        The full-width cache, halves repeated (see `apply_rotary_pos_emb`).
    unsqueeze_dim : int, optional
        Where ``cos``/``sin`` get their heads axis.

    Returns
    -------
    x_embed
        Of x's kind, shape and dtype (torch's promotion with a wider cache).

    Raises
    ------
    TypeError, ValueError
        As `apply_rotary_pos_emb`, naming ``x``.

    Examples
    --------
    >>> import torch
    >>> from posenc_fast import hf
    >>> x = torch.randn(1, 16, 8, 64)  # (batch, seq, heads, head_dim)
    >>> angles = torch.arange(16.0)[:, None] * 10000.0 ** (-torch.arange(0, 64, 2) / 64)
    >>> emb = torch.cat((angles, angles), dim=-1)[None]
    >>> hf.apply_rotary_pos_emb_single(x, emb.cos(), emb.sin(), unsqueeze_dim=2).shape
    torch.Size([1, 16, 8, 64])
    """
    return _apply(_ONE_TENSOR, (x,), cos, sin, unsqueeze_dim)[0]


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
    posenc_fast computes exactly (`SUPPORTED_FAMILIES`): Llama's half layout
    and its partial, interleaved, float32 and mRoPE variants; the one-tensor
    ``(x, cos, sin)`` form of Gemma 3n, Gemma 4 and DiffusionGemma, which
    rotate q and k in separate calls; DeepSeek-V4's, which rotates the
    trailing features of a head, and its attention output back with
    ``-sin``; GPT-J's and CodeGen's ``(tensor, sin, cos)``, one tensor with
    caches of one entry per pair; DINOv3's, EoMT-DINOv3's and Sapiens2's,
    which rotate the patch tokens after the cls and register tokens;
    Muse-Glimmer's assistant's, which rotates q by the last rows of k's
    cache; PE's (audio, video), which sums rotation matrices of interleaved
    pairs; and CLVP's, which rotates q, k and v by ``cos[position_ids]``.  It
    replaces MLA's ``apply_rotary_pos_emb_interleave`` too (DeepSeek-V3's,
    used when the config sets ``rope_interleave``, and always by
    Bailing-hybrid, GLM-MoE-DSA, LongCat-Flash and Mistral-Large-4), and the
    vision towers' ``apply_rotary_pos_emb_vision(q, k, cos, sin)`` (Qwen2-VL's
    and its relatives', Inkling2's interleaved one and MiniMax-M3-VL's
    partial one).
    Their attention ``forward`` looks the function up as a module global on
    every call, so models already built are affected too.  Results are those
    of the module's own function (bit for bit in float32/float64 on the CPU,
    and in bfloat16/float16 for the functions that compute in float32 and
    round once, as the kernel does); other dtypes, devices and caches whose
    entries do not repeat as the function expects fall back to the module's
    own function, and so do float64 data or caches for the functions that
    compute in float32 (their ``.float()`` rounds them first: DeepSeek-V4,
    the vision towers, Cohere), and half-precision data that a wider cache
    promotes (CodeGen's float32 cache).  Under ``torch.compile`` the functions call
    posenc_fast's op ``hf_rotate``, which the graph keeps and which runs the
    same kernel.  With parameters that need a gradient (training, or a
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
    names, one = _parameters(function), function.one_tensor
    torch, axis = sys.modules["torch"], 1 if function.unsqueeze is None else function.unsqueeze

    def apply_rotary_pos_emb(*args, **kwargs):
        if len(args) == len(names) and not kwargs:  # the usual call, first in C
            rotated = _drop_in._compiled_call(torch, function, args[:-2], args[-2], args[-1], axis)
            if rotated is not None:
                return rotated[0] if one else rotated
        # Every transformers caller passes (q, k, cos, sin) or (x, cos, sin), by position or
        # keyword, and perhaps unsqueeze_dim= (where the function has it).
        call = _arguments(args, kwargs, names, function.unsqueeze)
        if call is not None:
            rotated = _rotate_if_fits(function, names, *call)
            if rotated is not None:
                return rotated[0] if one else rotated
        else:
            _fell_back(sys.modules["torch"], (*args, *kwargs.values()), "arguments or shapes it does not take")
        return original(*args, **kwargs)

    apply_rotary_pos_emb.__doc__ = f"posenc_fast's kernel for {original.__module__}'s function."
    apply_rotary_pos_emb.__wrapped__ = original
    return apply_rotary_pos_emb


def _parameters(function) -> tuple:
    # The leading parameters of the function `function` describes.
    if function.parameters is not None:
        return function.parameters
    return ("x", "cos", "sin") if function.one_tensor else ("q", "k", "cos", "sin")


def _arguments(args, kwargs, names, fixed=None):
    """(the arguments `names`, unsqueeze_dim) of a call that passes them by position or keyword and
    perhaps unsqueeze_dim= (as transformers' callers do); None for any other call.  `fixed`: the
    axis of a function without ``unsqueeze_dim`` (a call passing it is then none of the above)."""
    optional = {"unsqueeze_dim"} if fixed is None else set()
    unsqueeze_dim = kwargs.get("unsqueeze_dim", 1) if fixed is None else fixed
    if len(args) == len(names) and (not kwargs or kwargs.keys() == optional):
        return args, unsqueeze_dim  # the usual call
    rest = names[len(args):]
    if len(args) < len(names) and kwargs.keys() - optional == set(rest):
        return args + tuple(kwargs[name] for name in rest), unsqueeze_dim
    return None


def _rotate_if_fits(function, names, tensors, unsqueeze_dim):
    """What `function` returns for the arguments `tensors` (of the parameters `names`) by the kernel; None
    where it takes the module's own function."""
    torch = sys.modules["torch"]
    if function.parameters is None:
        *xs, cos, sin = tensors
    else:  # by name: GPT-J's (tensor, sin, cos), CLVP's (q, k, v, cos, sin, position_ids)
        named = dict(zip(names, tensors))
        cos, sin = named.pop("cos"), named.pop("sin")
        if "position_ids" in named:  # CLVP's cos[position_ids]: the same indexing, first
            positions = named.pop("position_ids")
            if isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor):
                cos, sin = cos[positions], sin[positions]
        xs = list(named.values())
    if not (all(isinstance(x, torch.Tensor) for x in xs) and isinstance(cos, torch.Tensor)
            and _fits(function, [x.shape for x in xs], cos.shape[-1])
            and (function.unsqueeze is None or cos.ndim >= 2)  # MiniMax-M3-VL's cos[:, None, :]
            and (function.dims is None or _has_dims(function.dims, xs, cos, sin, unsqueeze_dim))
            and (not function.prefix_tokens or _has_the_patches(xs, cos, sin))
            and (not function.query_rows or xs[0].ndim >= 2)  # q.size(-2)
            and _cache_broadcasts_into(function, xs, cos, sin, unsqueeze_dim)):
        _fell_back(torch, xs, "arguments or shapes it does not take")
        return None
    return _drop_in._rotate_tensors(torch, function, tuple(xs), cos, sin, unsqueeze_dim)


def _cache_broadcasts_into(function, xs, cos, sin, unsqueeze_dim) -> bool:
    # sin of cos's shape, whose leading axes unsqueezed broadcast into each x's: transformers' product
    # then has x's shape (else it broadcasts x too, or cos against sin). The token axis of a function that
    # picks cache rows by tokens is its own rule's (prefix_tokens: both; query_rows: q's).
    if (getattr(sin, "shape", None) != cos.shape or type(unsqueeze_dim) is not int
            or not -cos.ndim - 1 <= unsqueeze_dim <= cos.ndim):
        return False
    axis = unsqueeze_dim + cos.ndim + 1 if unsqueeze_dim < 0 else unsqueeze_dim
    lead = (cos.shape[:axis] + (1,) + cos.shape[axis:])[:-1]
    for n, x in enumerate(xs):
        free = function.prefix_tokens or function.query_rows and n == 0
        if len(lead) > x.ndim - 1 or any(c not in (1, t) and not (free and i == 0)
                                         for i, (c, t) in enumerate(zip(lead[::-1], x.shape[-2::-1]))):
            return False
    return True


def _has_the_patches(xs, cos, sin) -> bool:
    # q and k of the same tokens (q's split is k's), at least as many as sin's rows (its patches).
    tokens = xs[0].shape[-2] if xs[0].ndim >= 2 else -1
    return (getattr(sin, "shape", None) == cos.shape and tokens >= cos.shape[-2]
            and all(x.shape[-2:] == xs[0].shape[-2:] for x in xs))


def _has_dims(dims, xs, cos, sin, unsqueeze_dim) -> bool:
    # The shapes a function that indexes axes by number (`RotaryFunction.dims`) rotates.
    return (all(x.ndim == dims for x in xs) and cos.ndim == getattr(sin, "ndim", None) == dims - 1
            and type(unsqueeze_dim) is int and 0 <= unsqueeze_dim < dims - 1)


def _module_name(family: str) -> str:
    return f"transformers.models.{family}.modeling_{family}"


def _why_not_patched(module, name):
    """None when `install` can patch the module's function `name`, else why not."""
    family = module.__name__.split(".")[2]
    table = _PATCHED[name]
    if module.__name__ != _module_name(family) or family not in table:
        return f"{family}: {NOT_PATCHED.get(family, f'its {name} is not classified')}"
    signature, function = inspect.signature(getattr(module, name)), table[family]
    params, expected = signature.parameters, _parameters(function)
    names = tuple(p for p in params if params[p].kind != params[p].VAR_KEYWORD)  # DINOv3's **kwargs: ignored
    if function.unsqueeze is None:
        fits = ("unsqueeze_dim" in params and params["unsqueeze_dim"].default == 1
                and names[:len(expected)] == expected)
        expected += ("unsqueeze_dim=1",)
    else:
        fits = names == expected
    if not fits:
        return f"{family}: its {name}{signature} is not the ({', '.join(expected)}) read from {function.source}"
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
