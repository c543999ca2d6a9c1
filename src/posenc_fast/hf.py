"""posenc_fast as the rotary kernel of Hugging Face transformers on the CPU.

`apply_rotary_pos_emb` has the signature and results of transformers' Llama
function and takes CPU torch tensors (viewed through NumPy, no copies) or
NumPy arrays, and `apply_rotary_pos_emb_single` those of Gemma 4's one-tensor
``apply_rotary_pos_emb(x, cos, sin)``; `install` puts posenc_fast in place of the
``apply_rotary_pos_emb`` of every modeling module whose function it computes
exactly (Llama's and its partial, interleaved, float32 and mRoPE variants, and
the one-tensor form: ``_hf_models.ROTARY_FUNCTIONS``), and MLA's
``apply_rotary_pos_emb_interleave`` (``_hf_models.INTERLEAVE_FUNCTIONS``).  torch and transformers stay optional: this
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
_ONE_TENSOR = ROTARY_FUNCTIONS["gemma4"]

FALLBACKS: collections.Counter = collections.Counter()
"""Calls that needed a gradient and took transformers' formula, by reason: ``"cos/sin need a
gradient"`` (the kernel's backward carries the data's gradients only); ``"data the kernel does not
compute exactly"`` (other devices, dtypes or tensor kinds, float64 data of a function computing in
float32, a result torch would promote to the cache's wider dtype, sin's dtype not cos's); ``"cos/sin
entries do not repeat"`` (no rotation of pairs; under ``torch.compile`` counted when the op's
backward runs); ``"arguments or shapes it does not take"`` (not (q, k, cos, sin) tensors,
``unsqueeze_dim`` aside, or shapes the function rotates no pairs of).  Every other call with the
data needing a gradient runs the kernel, with its backward (under ``torch.compile`` the op
``hf_rotate``)."""

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


def _apply(function, xs, cos, sin, unsqueeze_dim):
    """The public drop-ins: `function` of `xs` (q and k, or one tensor) as torch tensors or NumPy arrays."""
    names = _names(xs)
    tensors = (*xs, cos, sin)
    torch = sys.modules.get("torch")  # a tensor cannot exist before torch is imported
    if torch is not None and any(isinstance(t, torch.Tensor) for t in tensors):
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            raise TypeError(f"{', '.join(names)}, cos and sin must be all torch tensors or all NumPy arrays")
        rotated = _rotate_tensors(torch, function, xs, cos, sin, unsqueeze_dim)
        return rotated if rotated is not None else _torch_formula(torch, xs, cos, sin, unsqueeze_dim)
    arrays = [v.float_array(t, name) for t, name in zip(tensors, names + ("cos", "sin"))]
    return _apply_numpy(arrays[:-2], *arrays[-2:], unsqueeze_dim, function)


def _names(xs) -> tuple:
    # What the error messages call the data arrays: q and k, or a one-tensor function's x.
    return ("q", "k") if len(xs) == 2 else ("x",)


def _rotate_tensors(torch, function, xs, cos, sin, unsqueeze_dim):
    """What `function` computes for the tensors `xs` (q and k, or one tensor), by the kernel on
    NumPy views, as a tuple; None when that would not be exact."""
    if not _numpy_can_take(torch, function, xs, cos, sin):
        if not (cos.requires_grad or sin.requires_grad):  # else counted already
            _fell_back(torch, xs, "data the kernel does not compute exactly")
        return None
    if torch.compiler.is_compiling():  # no NumPy in a graph: posenc_fast's op, which the graph keeps
        return _compiled_rotation(torch, function, xs, cos, sin, unsqueeze_dim)
    arrays = [numpy_view(torch, t) for t in (*xs, cos, sin)]
    if (_fits(function, [x.shape for x in xs], cos.shape[-1])  # else _apply_numpy says what is wrong
            and not (_cache_repeats(function, arrays[-2]) and _cache_repeats(function, arrays[-1]))):
        _fell_back(torch, xs, "cos/sin entries do not repeat")
        return None  # its formula is then no rotation of pairs
    if torch.is_grad_enabled() and any(x.requires_grad for x in xs):
        return _rotation(torch).apply(function, unsqueeze_dim, arrays, cos, sin, *xs)
    return _rotated(torch, function, arrays, [x.dtype for x in xs], unsqueeze_dim)


def _fell_back(torch, xs, reason):
    # Count a call that takes the formula though the data `xs` need a gradient.
    if torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in xs):
        FALLBACKS[reason] += 1


def _compiled_rotation(torch, function, xs, cos, sin, unsqueeze_dim):
    """Under ``torch.compile``: ``torch.ops.posenc_fast.hf_rotate`` (`posenc_fast.torch_ops`), the
    kernel as an op with its backward; it checks the cache's repeats when it runs."""
    if not _fits(function, [x.shape for x in xs], cos.shape[-1]):
        return None  # the formula, which says what is wrong
    from . import torch_ops  # noqa: F401  (registers the op)
    name = "apply_rotary_pos_emb_interleave" if function.deinterleaves else "apply_rotary_pos_emb"
    return tuple(torch.ops.posenc_fast.hf_rotate(list(xs), cos, sin, function.source.split("/")[0], name,
                                                 unsqueeze_dim, False))


def _rotated(torch, function, arrays, dtypes, unsqueeze_dim):
    # The kernel on NumPy views (the data, then cos and sin); the results as tensors of `dtypes`.
    rotated = _apply_numpy(arrays[:-2], *arrays[-2:], unsqueeze_dim, function)
    return tuple(_torch_view(torch, a, dtype) for a, dtype in zip(rotated, dtypes))


_ROTATION = []


def _rotation(torch):
    """The kernel's rotation as a ``torch.autograd.Function`` (made once torch is imported).

    Its backward is the transpose of the forward's rotation: the rotation of
    the incoming gradients by ``(cos, -sin)`` (the function with `inverse`
    flipped), the same kernel, float32 arithmetic and one rounding for half
    types, into contiguous gradients as the formula's backward returns; a
    deinterleaving function's (MLA's) gradients are interleaved back.  cos
    and sin get no gradient (calls whose cos/sin need one take
    the module's own formula: `FALLBACKS`).
    """
    if _ROTATION:
        return _ROTATION[0]

    class Rotation(torch.autograd.Function):
        @staticmethod
        def forward(ctx, function, unsqueeze_dim, arrays, cos, sin, *xs):
            # arrays: the NumPy views of xs, cos and sin the caller already made
            ctx.save_for_backward(cos, sin)
            ctx.function, ctx.unsqueeze_dim, ctx.tables = function, unsqueeze_dim, arrays[-2:]
            return _rotated(torch, function, arrays, [x.dtype for x in xs], unsqueeze_dim)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, *grads):
            ctx.saved_tensors  # raises if cos/sin changed in place since the forward
            grads = _transposed(torch, ctx.function, grads, ctx.tables, ctx.unsqueeze_dim)
            return (None,) * 5 + tuple(g if needed else None
                                       for g, needed in zip(grads, ctx.needs_input_grad[5:]))

    _ROTATION.append(Rotation)
    return Rotation


def _transposed(torch, function, grads, tables, unsqueeze_dim):
    """The gradients of `function`'s results rotated back: the backward of `Rotation` (and of the op
    ``hf_rotate``), `tables` the NumPy views of cos and sin."""
    # A deinterleaving function rotates (x[0::2] | x[1::2]) in halves: its transpose
    # rotates back in halves, then interleaves.
    transpose = function._replace(inverse=not function.inverse, deinterleaves=False,
                                  layout=function.kernel_layout)
    # The formula's backward returns contiguous gradients (its slices' backwards are zeros of
    # x's shape), and what follows reduces in memory order (a norm's weight gradient): the
    # kernel rotates contiguous gradients, so the layout, and the sums, are the same.
    arrays = [numpy_view(torch, g.contiguous()) for g in grads] + list(tables)
    grads = _rotated(torch, transpose, arrays, [g.dtype for g in grads], unsqueeze_dim)
    if function.deinterleaves:
        grads = [torch.stack(g.chunk(2, -1), -1).flatten(-2) for g in grads]
    return grads


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


def _numpy_can_take(torch, function, xs, cos, sin) -> bool:
    """True when NumPy views of the tensors `xs` (q and k, or one), cos and sin give exactly
    `function`'s result dtypes and values."""
    # Called once per attention layer and step: the cheapest attributes first.
    fast = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    for t in (*xs, cos, sin):
        if (type(t) is not torch.Tensor or not t.is_cpu or t.layout != torch.strided
                or t.dtype not in fast):
            return False
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        FALLBACKS["cos/sin need a gradient"] += 1  # Rotation carries the data's gradients only
        return False
    cache = cos.dtype
    if sin.dtype != cache:
        return False
    for t in xs:  # the kernel takes half data with a float32 cache or one of its own dtype
        if t.dtype in (torch.bfloat16, torch.float16) and cache not in (torch.float32, t.dtype):
            return False
    if function.compute == "float32":  # q.float(), k.float(): float64 would be rounded first
        if any(t.dtype != xs[0].dtype for t in xs) or torch.float64 in (xs[0].dtype, cache):
            return False
    elif function.compute == "torch" and any(t.dtype != cache for t in xs):
        if any(torch.promote_types(t.dtype, cache) != t.dtype for t in xs):
            return False  # torch would return the cache's wider dtype
    return True


def _fits(function, shapes, width) -> bool:
    """True when `function` rotates pairs of data of these shapes (q's and k's, or one) with a
    cache `width` wide."""
    dim = shapes[0][-1] if shapes[0] else 0
    rotated = 2 * width if function.cache == "half_width" else width
    return (dim >= 2 and dim % 2 == 0 and rotated % 2 == 0
            and all(len(shape) >= 1 and shape[-1] == dim for shape in shapes[1:])
            and (rotated == dim or function.partial and 2 <= rotated <= dim))


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


def _torch_formula(torch, xs, cos, sin, unsqueeze_dim):
    # transformers' own code, for what the NumPy path does not take.
    def rotate_half(x):
        x1, x2 = x[..., :x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return tuple(x * cos + rotate_half(x) * sin for x in xs)


def _apply_numpy(xs, cos, sin, unsqueeze_dim, function=_LLAMA):
    unsqueeze_dim = v.integer(unsqueeze_dim, "unsqueeze_dim")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {cos.shape} and {sin.shape}")
    if not -cos.ndim - 1 <= unsqueeze_dim <= cos.ndim:
        raise ValueError(f"unsqueeze_dim must be in [{-cos.ndim - 1}, {cos.ndim}] for cos of "
                         f"shape {cos.shape}, got {unsqueeze_dim}")
    axis = unsqueeze_dim + cos.ndim + 1 if unsqueeze_dim < 0 else unsqueeze_dim
    shape = cos.shape[:axis] + (1,) + cos.shape[axis:]
    cos, sin = cos.reshape(shape), sin.reshape(shape)  # np.expand_dims without its overhead
    width, names = cos.shape[-1], _names(xs)
    if not _fits(function, [x.shape for x in xs], width):
        got = ", ".join(f"{name} {x.shape}" for name, x in zip(names, xs))
        raise ValueError(f"{', '.join(names)} and the unsqueezed cos/sin must end in the same "
                         f"even head_dim, got {got}, cos {cos.shape} (a full-width "
                         f"transformers cache, halves repeated)")
    if function.cache == "halves":
        cos, sin = cos[..., :width // 2], sin[..., :width // 2]
    elif function.cache == "pairs":
        cos, sin = cos[..., 0::2], sin[..., 0::2]
    xs, outs = tuple(xs), (None,) * len(xs)
    if function.deinterleaves:  # its pairs (x[2i], x[2i + 1]) laid out in halves, then rotated there, in place
        xs = outs = tuple(np.concatenate((x[..., 0::2], x[..., 1::2]), axis=-1) for x in xs)
    # Contiguous data (every decode step): the compiled path checks the rest.
    fast = kernels.rotate_cos_sin_fast(xs, cos, sin, function.kernel_layout, function.inverse, outs)
    if fast is not None:
        return fast
    for x, name in zip(xs, names):
        v.broadcast_target(cos.shape[:-1], x.shape[:-1],
                           f"cos/sin unsqueezed at {unsqueeze_dim}: their leading shape",
                           f"{name}.shape[:-1]")
    return tuple(_rotate_in_memory_order(x, cos, sin, function) for x in xs)


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
    its partial, interleaved, float32 and mRoPE variants, and the one-tensor
    ``(x, cos, sin)`` form of Gemma 3n, Gemma 4 and DiffusionGemma, which
    rotate q and k in separate calls), and MLA's
    ``apply_rotary_pos_emb_interleave`` (DeepSeek-V3's, used when the config
    sets ``rope_interleave``, and always by Bailing-hybrid, GLM-MoE-DSA,
    LongCat-Flash and Mistral-Large-4).  Their attention
    ``forward`` looks the function up as a module global on every call, so
    models already built are affected too.  Results are those of the
    module's own function (bit for bit in float32/float64 on the CPU); other
    dtypes, devices and caches whose
    entries do not repeat as the function expects fall back to the module's
    own function.  Under ``torch.compile`` the functions call posenc_fast's
    op ``hf_rotate``, which the graph keeps and which runs the same kernel.  With parameters that need a gradient (training, or a
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

    def apply_rotary_pos_emb(*args, **kwargs):
        # Every transformers caller passes (q, k, cos, sin) or (x, cos, sin), by position or
        # keyword, and perhaps unsqueeze_dim=.
        call = _arguments(args, kwargs, names)
        if call is not None:
            rotated = _rotate_if_fits(function, *call)
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
    return ("x", "cos", "sin") if function.one_tensor else ("q", "k", "cos", "sin")


def _arguments(args, kwargs, names):
    """(the arguments `names`, unsqueeze_dim) of a call that passes them by position or keyword and
    perhaps unsqueeze_dim= (as transformers' callers do); None for any other call."""
    if len(args) == len(names) and (not kwargs or kwargs.keys() == {"unsqueeze_dim"}):
        return args, kwargs.get("unsqueeze_dim", 1)  # the usual call
    rest = names[len(args):]
    if len(args) < len(names) and kwargs.keys() - {"unsqueeze_dim"} == set(rest):
        return args + tuple(kwargs[name] for name in rest), kwargs.get("unsqueeze_dim", 1)
    return None


def _rotate_if_fits(function, tensors, unsqueeze_dim):
    torch = sys.modules["torch"]
    *xs, cos, sin = tensors
    if not (all(isinstance(x, torch.Tensor) for x in xs) and isinstance(cos, torch.Tensor)
            and _fits(function, [x.shape for x in xs], cos.shape[-1])):
        _fell_back(torch, xs, "arguments or shapes it does not take")
        return None
    return _rotate_tensors(torch, function, tuple(xs), cos, sin, unsqueeze_dim)


def _module_name(family: str) -> str:
    return f"transformers.models.{family}.modeling_{family}"


def _why_not_patched(module, name):
    """None when `install` can patch the module's function `name`, else why not."""
    family = module.__name__.split(".")[2]
    table = _PATCHED[name]
    if module.__name__ != _module_name(family) or family not in table:
        return f"{family}: {NOT_PATCHED.get(family, f'its {name} is not classified')}"
    signature = inspect.signature(getattr(module, name))
    params, expected = signature.parameters, _parameters(table[family])
    if (tuple(params)[:len(expected)] != expected or "unsqueeze_dim" not in params
            or params["unsqueeze_dim"].default != 1):
        return (f"{family}: its {name}{signature} is not the ({', '.join(expected)}, "
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
