"""The shared path of posenc_fast.hf's drop-ins: transformers' rotation functions by the kernel.

`RotaryFunction` (``_hf_functions``) says what a module's function computes; `_rotate_tensors` gives that
result for CPU torch tensors through NumPy views (None where it would not be exact), with the autograd
`Rotation` when the data needs a gradient, and `_apply_numpy` for NumPy arrays.  hf.py's public functions
and what `install` puts in transformers' modules all call these.  Under ``torch.compile`` `_rotate_tensors`
calls the op ``torch.ops.posenc_fast.hf_rotate`` instead (`_compiled_rotation`; ``torch_ops`` registers it
and runs `_rotated` and `_transposed`, `Rotation`'s backward, in it).
"""

import collections
import sys

import numpy as np

from . import _validate as v
from ._dispatch import kernels
from ._cos_sin import apply_rotary_cos_sin
from ._hf_functions import INTERLEAVE_FUNCTIONS, ROTARY_FUNCTIONS, VISION_FUNCTIONS

_LLAMA = ROTARY_FUNCTIONS["llama"]

# function name -> {module: what that module's function of the name computes}
_PATCHED = {"apply_rotary_pos_emb": ROTARY_FUNCTIONS, "apply_rotary_pos_emb_interleave": INTERLEAVE_FUNCTIONS,
            "apply_rotary_pos_emb_vision": VISION_FUNCTIONS}

FALLBACKS: collections.Counter = collections.Counter()
"""Calls that needed a gradient and took transformers' formula, by reason: ``"cos/sin need a
gradient"`` (the kernel's backward carries the data's gradients only); ``"data the kernel does not
compute exactly"`` (other devices, dtypes or tensor kinds, float64 data or caches of a function
computing in float32, q and k of two dtypes there, a result torch would promote to the cache's wider
dtype, sin's dtype not cos's, a half cache not of the data's dtype); ``"cos/sin entries do not
repeat"`` (no rotation of pairs; under ``torch.compile`` counted when the op's backward runs);
``"arguments or shapes it does not take"`` (not the tensors of the function's parameters,
``unsqueeze_dim`` aside where the function has it, shapes the function rotates no pairs of, a
vision tower's cos of one dimension, data of another rank than GPT-J's or PE's formula indexes,
more patch rows than tokens for DINOv3's); ``"a forward-mode AD or torch.func transform"`` (dual tensors,
``torch.func.grad``/``vmap``/...).  Every other call with the data needing a gradient runs the
kernel, with its backward (under ``torch.compile`` the op ``hf_rotate``)."""


def _apply(function, xs, cos, sin, unsqueeze_dim):
    """The public drop-ins: `function` of `xs` (q and k, or one tensor) as torch tensors or NumPy arrays."""
    torch = sys.modules.get("torch")  # a tensor cannot exist before torch is imported
    rotated = _compiled_call(torch, function, xs, cos, sin, unsqueeze_dim)
    if rotated is not None:
        return rotated
    names = _names(xs)
    tensors = (*xs, cos, sin)
    if torch is not None and any(isinstance(t, torch.Tensor) for t in tensors):
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            raise TypeError(f"{', '.join(names)}, cos and sin must be all torch tensors or all NumPy arrays")
        rotated = _rotate_tensors(torch, function, xs, cos, sin, unsqueeze_dim)
        return rotated if rotated is not None else _torch_formula(torch, xs, cos, sin, unsqueeze_dim)
    arrays = [v.float_array(t, name) for t, name in zip(tensors, names + ("cos", "sin"))]
    return _apply_numpy(arrays[:-2], *arrays[-2:], unsqueeze_dim, function)


def _names(xs) -> tuple:
    # What the error messages call the data arrays: q and k (and CLVP's v), or a one-tensor function's x.
    return ("x",) if len(xs) == 1 else ("q", "k", "v")[:len(xs)]


def _transformed(torch) -> bool:
    """True inside a forward-mode AD level (``dual_level()``: dual tensors, whose tangents a kernel reading their
    memory would drop) or a ``torch.func`` transform (``grad``, ``vmap``, ...: wrapped tensors without memory of
    their own).  (The level, not each tensor: two attribute reads a call.)"""
    return (torch.autograd.forward_ad._current_level >= 0
            or torch._C._functorch.peek_interpreter_stack() is not None)


def _rotate_tensors(torch, function, xs, cos, sin, unsqueeze_dim):
    """What `function` computes for the tensors `xs` (q and k, or one tensor), by the kernel on
    NumPy views, as a tuple; None when that would not be exact."""
    if not _numpy_can_take(torch, function, xs, cos, sin):
        if not (cos.requires_grad or sin.requires_grad):  # else counted already
            _fell_back(torch, xs, "data the kernel does not compute exactly")
        return None
    if torch.compiler.is_compiling():  # no NumPy in a graph: posenc_fast's op, which the graph keeps
        return _compiled_rotation(torch, function, xs, cos, sin, unsqueeze_dim)
    if _transformed(torch):
        _fell_back(torch, xs, "a forward-mode AD or torch.func transform")
        return None
    if any(t.is_neg() for t in (*xs, cos, sin)):  # a negative view: its memory holds the values negated
        _fell_back(torch, xs, "data the kernel does not compute exactly")
        return None
    arrays = [numpy_view(torch, t) for t in (*xs, cos, sin)]
    if (cos.ndim and _fits(function, [x.shape for x in xs], cos.shape[-1])  # else _apply_numpy says what is wrong
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
    kernel as an op with its backward (where no input needs a gradient, its twin without one,
    ``_hf_rotate_no_grad``); it checks the cache's repeats when it runs."""
    if not _fits(function, [x.shape for x in xs], cos.shape[-1]):
        return None  # the formula, which says what is wrong
    from . import torch_ops  # noqa: F401  (registers the op)
    family, name = _patched_as(function)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (*xs, cos, sin))
    op = torch.ops.posenc_fast.hf_rotate if grad else torch.ops.posenc_fast._hf_rotate_no_grad
    return tuple(op(list(xs), cos, sin, family, name, unsqueeze_dim, False))


def _patched_as(function):
    """(module, function name): where `function` is in `_PATCHED` (its module read off its source, the
    name off its flags and its module's vision row, which a ``torch.compile`` trace reads as constants)."""
    family = function.source.split("/")[0]
    if function.deinterleaves:
        return family, "apply_rotary_pos_emb_interleave"
    vision = function.unsqueeze is not None and function == VISION_FUNCTIONS.get(family)
    return family, "apply_rotary_pos_emb_vision" if vision else "apply_rotary_pos_emb"


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
    deinterleaving function's (MLA's) gradients are interleaved back; where
    those need a gradient themselves (a double backward), the backward is
    this Function again.  A result that reaches no loss gives its data no
    gradient (None).  cos and sin get no gradient (calls whose cos/sin need one take
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
            ctx.shapes = [(x.shape, x.dtype) for x in xs]
            ctx.set_materialize_grads(False)  # a result that reaches no loss gives its data no gradient (None)
            return _rotated(torch, function, arrays, [x.dtype for x in xs], unsqueeze_dim)

        @staticmethod
        def backward(ctx, *grads):
            cos, sin = ctx.saved_tensors  # raises if cos/sin changed in place since the forward
            needed = [g is not None and need for g, need in zip(grads, ctx.needs_input_grad[5:])]
            if not any(needed):
                return (None,) * (5 + len(grads))
            grads = [torch.zeros(shape, dtype=dtype) if g is None else g
                     for g, (shape, dtype) in zip(grads, ctx.shapes)]
            grads = _transposed(torch, ctx.function, grads, ctx.tables, ctx.unsqueeze_dim, (cos, sin))
            return (None,) * 5 + tuple(g if need else None for g, need in zip(grads, needed))

    _ROTATION.append(Rotation)
    return Rotation


def _transposed(torch, function, grads, tables, unsqueeze_dim, cos_sin=None):
    """The gradients of `function`'s results rotated back: the backward of `Rotation` (and of the op
    ``hf_rotate``), `tables` the NumPy views of cos and sin; with `cos_sin` (the tensors) and gradients
    that need one (a double backward), through `Rotation`, which records its own backward."""
    # A deinterleaving function rotates (x[0::2] | x[1::2]) in halves: its transpose
    # rotates back in halves, then interleaves.
    transpose = function._replace(inverse=not function.inverse, deinterleaves=False,
                                  layout=function.kernel_layout)
    # The formula's backward returns contiguous gradients (its slices' backwards are zeros of
    # x's shape), and what follows reduces in memory order (a norm's weight gradient): the
    # kernel rotates contiguous gradients, so the layout, and the sums, are the same.
    grads = [g.contiguous() for g in grads]
    arrays = [numpy_view(torch, g) for g in grads] + list(tables)
    if cos_sin is not None and torch.is_grad_enabled() and any(g.requires_grad for g in grads):
        grads = _rotation(torch).apply(transpose, unsqueeze_dim, arrays, *cos_sin, *grads)
    else:
        grads = _rotated(torch, transpose, arrays, [g.dtype for g in grads], unsqueeze_dim)
    if function.deinterleaves:
        grads = [torch.stack(g.chunk(2, -1), -1).flatten(-2) for g in grads]
    return grads


def numpy_view(torch, t):
    """A CPU tensor's memory as an ndarray (no copy): half types through int16,
    since NumPy has no bfloat16 of its own.  (.numpy() refuses tensors that
    require grad, possible under no_grad: they are detached.)"""
    if not _REGISTERED:
        _register(torch)
    t = t.detach() if t.requires_grad else t
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16).numpy().view(
            v.BFLOAT16 if t.dtype == torch.bfloat16 else np.float16)
    return t.numpy()


_REGISTERED = []


def _register(torch, by_dlpack=True):
    # The compiled glue reads tensors from now on (_core_torch.pxi); `by_dlpack` for tests.
    descrs = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64),
              torch.float16: np.dtype(np.float16), torch.bfloat16: np.dtype(v.BFLOAT16),
              torch.int64: np.dtype(np.int64), torch.int32: np.dtype(np.int32),
              torch.int16: np.dtype(np.int16), torch.int8: np.dtype(np.int8),
              torch.uint8: np.dtype(np.uint8), torch.bool: np.dtype(np.bool_)}
    kernels.register_torch(torch, descrs, by_dlpack)
    _REGISTERED.append(True)


def _torch_view(torch, a, dtype):
    # The result's memory as a tensor of `dtype` (q's or k's).
    if dtype in (torch.bfloat16, torch.float16):
        return torch.from_numpy(a.view(np.int16)).view(dtype)
    return torch.from_numpy(a)


def _kernel_dtypes(torch) -> tuple:
    """The torch dtypes the row kernels take."""
    return torch.float32, torch.float64, torch.bfloat16, torch.float16


def _numpy_can_take(torch, function, xs, cos, sin) -> bool:
    """True when NumPy views of the tensors `xs` (q and k, or one), cos and sin give exactly
    `function`'s result dtypes and values."""
    # Called once per attention layer and step: the cheapest attributes first.
    fast = _kernel_dtypes(torch)
    for t in (*xs, cos, sin):
        if (type(t) is not torch.Tensor or not t.is_cpu or t.layout != torch.strided
                or t.dtype not in fast):
            return False
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        FALLBACKS["cos/sin need a gradient"] += 1  # Rotation carries the data's gradients only
        return False
    return _cache_fits(torch, function, xs, cos, sin)


def _cache_fits(torch, function, xs, cos, sin) -> bool:
    """True when, the tensors being of kernel dtypes, the kernel gives `function`'s result dtypes for
    them: sin of cos's dtype, and `_dtypes_fit`."""
    return sin.dtype == cos.dtype and _dtypes_fit(torch, function, [t.dtype for t in xs], cos.dtype)


def _dtypes_fit(torch, function, dtypes, cache) -> bool:
    """True when the kernel gives `function`'s result for data of `dtypes` (q's and k's, or one)
    and a cos/sin cache of dtype `cache` (all kernel dtypes)."""
    for dtype in dtypes:  # the kernel takes half data with a float32 cache or one of its own dtype
        if dtype in (torch.bfloat16, torch.float16) and cache not in (torch.float32, dtype):
            return False
    if function.compute == "float32":  # q.float(), k.float(): float64 would be rounded first
        if any(dtype != dtypes[0] for dtype in dtypes) or torch.float64 in (dtypes[0], cache):
            return False
    elif function.compute == "torch" and any(dtype != cache for dtype in dtypes):
        if any(torch.promote_types(dtype, cache) != dtype for dtype in dtypes):
            return False  # torch would return the cache's wider dtype
    return True


def _compiled_call(torch, function, xs, cos, sin, unsqueeze_dim):
    """The common call of `function` on CPU tensors, checked and rotated in C: the results, or None."""
    if torch is None or torch.compiler.is_compiling() or _transformed(torch):  # (in a graph: _compiled_rotation)
        return None
    rotation = compiled(torch, function)
    return None if rotation is None else rotation(xs, cos, sin, unsqueeze_dim)


_COMPILED = {}  # id(RotaryFunction) -> (it, its TensorRotation or None)
# The RotaryFunction fields TensorRotation reads; a function with any other field not at its default
# (e.g. deinterleaves) takes the Python route whole.
_COMPILED_FIELDS = ("source", "layout", "cache", "partial", "compute", "inverse", "one_tensor", "trailing",
                    "unsqueeze")
_PLAIN = type(_LLAMA)(source="")  # every field at its default


def compiled(torch, function):
    """`function`'s `_core.TensorRotation`: the common call, checked in C, on the dtypes `_dtypes_fit`
    admits (the rule stated once, read into its table here); None for a function with a field outside
    `_COMPILED_FIELDS` at other than its default, or a pairs cache (read by a strided [..., 0::2])."""
    entry = _COMPILED.get(id(function))
    if entry is not None and entry[0] is function:
        return entry[1]
    rotation = None
    plain = function._replace(**{field: getattr(_PLAIN, field) for field in _COMPILED_FIELDS}) == _PLAIN
    if plain and function.cache != "pairs":
        if not _REGISTERED:
            _register(torch)
        dtypes = kernels.torch_kernel_dtypes()
        fits = bytes(_dtypes_fit(torch, function, (q,) if function.one_tensor else (q, k), cache)
                     and (k is q or not function.one_tensor)
                     for q in dtypes for k in dtypes for cache in dtypes)
        rotation = kernels.TensorRotation(function.layout, function.cache, function.partial,
                                          function.trailing, function.inverse, fits, 1 if function.one_tensor else 2)
    _COMPILED[id(function)] = (function, rotation)
    return rotation


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
    if function.prefix_tokens:  # the rows of axis -2 before the cache's (cls and register tokens) pass
        prefix = xs[0].shape[-2] - cos.shape[-2] if xs[0].ndim >= 2 else -1
        if prefix < 0 or any(x.shape[-2:] != xs[0].shape[-2:] for x in xs):
            raise ValueError(f"{', '.join(names)} must have the same tokens (axis -2), at least as many as "
                             f"cos/sin's rows, got {', '.join(str(x.shape) for x in xs)}, cos {cos.shape}")
        patches = _rotate_arrays([x[..., prefix:, :] for x in xs], cos, sin, unsqueeze_dim, function, names)
        return tuple(np.concatenate((x[..., :prefix, :], r), axis=-2) for x, r in zip(xs, patches))
    if function.sums_pairs:  # torch's sum of each pair's two products starts from +0: no -0, contiguous
        return tuple(_positive_zeros(np.ascontiguousarray(r))
                     for r in _rotate_arrays(xs, cos, sin, unsqueeze_dim, function, names))
    if function.query_rows:  # q by the cache's last q.shape[-2] rows (as torch slices them), k by all of it
        rows = xs[0].shape[-2] if xs[0].ndim >= 2 else 0
        return (_rotate_arrays(xs[:1], cos[..., -rows:, :], sin[..., -rows:, :], unsqueeze_dim, function, names)
                + _rotate_arrays(xs[1:], cos, sin, unsqueeze_dim, function, names[1:]))
    return _rotate_arrays(xs, cos, sin, unsqueeze_dim, function, names)


def _positive_zeros(a):
    # `a` with its -0 made +0 (what adding +0 does), in place: by the bits, for every dtype.
    bits = a.view(np.dtype(f"i{a.itemsize}"))
    bits[bits == np.iinfo(bits.dtype).min] = 0
    return a


def _rotate_arrays(xs, cos, sin, unsqueeze_dim, function, names):
    # The kernel for the arrays `xs` and the unsqueezed cos and sin that fit them.
    width = cos.shape[-1]
    if function.cache == "halves":
        cos, sin = cos[..., :width // 2], sin[..., :width // 2]
    elif function.cache == "pairs":
        cos, sin = cos[..., 0::2], sin[..., 0::2]
    xs, outs = tuple(xs), (None,) * len(xs)
    start = xs[0].shape[-1] - 2 * cos.shape[-1] if function.trailing else 0  # the first rotated feature
    if function.deinterleaves:  # its pairs (x[2i], x[2i + 1]) laid out in halves, then rotated there, in place
        xs = outs = tuple(np.concatenate((x[..., 0::2], x[..., 1::2]), axis=-1) for x in xs)
    # Contiguous data (every decode step): the compiled path checks the rest.
    fast = kernels.rotate_cos_sin_fast(xs, cos, sin, function.kernel_layout, function.inverse, outs, start)
    if fast is not None:
        return fast
    for x, name in zip(xs, names):
        v.broadcast_target(cos.shape[:-1], x.shape[:-1],
                           f"cos/sin unsqueezed at {unsqueeze_dim}: their leading shape",
                           f"{name}.shape[:-1]")
    return tuple(_rotate_in_memory_order(x, cos, sin, function, start) for x in xs)


def _rotate_in_memory_order(x, cos, sin, function, start):
    """Rotate `x` (features from `start` on) after permuting its leading axes into memory order: the
    result then has x's order of axes in memory, as torch's elementwise result (a transposed view
    of a fused qkv projection, too)."""
    axes = sorted(range(x.ndim - 1), key=lambda axis: -x.strides[axis]) + [x.ndim - 1]
    kwargs = dict(layout=function.kernel_layout, inverse=function.inverse, rotary_start=start)
    if x.flags.c_contiguous or axes == list(range(x.ndim)):
        return apply_rotary_cos_sin(x, cos, sin, **kwargs)
    x_t = x.transpose(axes)
    lead = (1,) * (x.ndim - cos.ndim)  # broadcasting's implicit leading axes, made explicit
    cos_t, sin_t = (t.reshape(lead + t.shape).transpose(axes) for t in (cos, sin))
    return apply_rotary_cos_sin(x_t, cos_t, sin_t, **kwargs).transpose(np.argsort(axes))
