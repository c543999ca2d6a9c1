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

``torch.ops.posenc_fast.hf_rotate``
    ``(xs, cos, sin, family, name, unsqueeze_dim, transpose) -> Tensor[]``:
    what `posenc_fast.hf`'s replacement of a transformers module's function
    returns, with a gradient, for every kind `install` patches (the one-tensor,
    MLA, DeepSeek-V4 and vision ones too); the drop-ins call it under
    ``torch.compile``.

``torch.ops.posenc_fast.fused_qk_norm_rope``
    ``(positions, query, key, q_weight, k_weight, head_size, cos_sin_cache,
    is_neox, eps=1e-6, weight_offset=0.0) -> ()``:
    `posenc_fast.vllm.fused_qk_norm_rope`, q/k RMSNorm and RoPE in place.

``torch.ops.posenc_fast.apply_qk_to_cache``
    ``(positions, query, key, value, key_cache, value_cache, slot_mapping,
    head_size, cos_sin_cache, is_neox, kv_cache_layout="NHD", q_weight=None,
    k_weight=None, eps=1e-6, weight_offset=0.0) -> ()``:
    `posenc_fast.vllm.apply_qk_to_cache`, rotating `query` in place and
    writing the rotated key and the value into their cache slots (with
    both weights, q/k RMSNorm first, in the same pass).

``torch.ops.posenc_fast.concat_and_cache_mla``, ``concat_and_cache_mla_rope_fused``
    vLLM's MLA cache writes (`posenc_fast.vllm.concat_and_cache_mla`,
    `posenc_fast.vllm.concat_and_cache_mla_rope_fused`), in place.

A torch function that calls a NumPy-backed function directly breaks its
compiled graph at that call (or fails under ``fullgraph=True``); calling the
op instead compiles, and runs posenc_fast's kernel on CPU tensors.  Each op
is defined on a `torch.library.Library` by its schema (which declares what
it mutates), with a posenc_fast function as its CPU kernel and a fake
implementation that tells the compiler the result's shapes without running
it.  (``torch.library.custom_op`` wraps its kernel in Python layers that
cost ~35 us a call: a decode step's op took 49-59 us against 18-20 us so,
the function alone 15 us.)  The in-place ops (``rotary_embedding``,
``apply_qk_to_cache``, ``fused_qk_norm_rope``, the MLA cache writes) and
``hf_rotate``, a decode step's per-token ops, take C++ kernels instead where
``python -m posenc_fast build-torch-kernel`` built them for this torch
(`posenc_fast._torch_kernel`; `kernel_reason` says which serve them): torch
calls a C++ kernel for ~0.7 us less.

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

from . import _torch_kernel, vllm
from ._dispatch import kernels as _kernels

__all__ = ["apply_qk_to_cache", "apply_rotary", "concat_and_cache_mla", "concat_and_cache_mla_rope_fused",
           "fused_qk_norm_rope", "hf_rotate", "rotary_embedding"]

_LIBRARY = torch.library.Library("posenc_fast", "DEF")


def _define(schema: str, kernel, fake):
    """posenc_fast::<name> of `schema`: `kernel` on CPU tensors (None: one registered in C++), `fake`
    for the compiler."""
    name = schema.split("(", 1)[0]
    _LIBRARY.define(schema)
    if kernel is not None:
        _LIBRARY.impl(name, kernel, "CPU")
    names = [argument.name for argument in torch._C.parse_schema(f"posenc_fast::{schema}").arguments]
    torch.library.register_fake(f"posenc_fast::{name}", _on_one_device(fake, names), lib=_LIBRARY)
    return getattr(torch.ops.posenc_fast, name)


def _named_tensors(bound: dict) -> list:
    """The tensors among a call's arguments `bound` (by name), with their names (a list's as ``name[i]``)."""
    return [(f"{name}[{i}]" if isinstance(value, (list, tuple)) else name, tensor)
            for name, value in bound.items()
            for i, tensor in enumerate(value if isinstance(value, (list, tuple)) else (value,))
            if isinstance(tensor, torch.Tensor)]


def _on_one_device(fake, names):
    """`fake` (of the arguments `names`), refusing tensors on two devices: a meta tensor beside CPU ones
    sends the call to the fake, which would write nothing into the CPU ones and return no values."""
    def checked(*args, **kwargs):
        first = None
        for name, tensor in _named_tensors({**dict(zip(names, args)), **kwargs}):
            if first is None:
                first = (name, tensor.device)
            elif tensor.device != first[1]:
                name, device = (name, tensor.device) if first[1].type == "cpu" else first
                raise ValueError(f"{name} must be a strided CPU tensor, got device {device}")
        return fake(*args, **kwargs)
    return checked


def _mutates_only(*args, **kwargs) -> None:
    return None  # only mutates its inputs: no result to describe


def _function(name: str):
    """A kernel calling `posenc_fast.vllm`'s function `name` (looked up at each call)."""
    def kernel(*args):
        return getattr(vllm, name)(*args)
    kernel.__name__ = name
    return kernel


_ROTARY_ARGUMENTS = ("(Tensor positions, Tensor(a!) query, Tensor(b!)? key, SymInt head_size, Tensor cos_sin_cache, "
                     "bool is_neox, SymInt rope_dim_offset=0, bool inverse=False) -> ()")
rotary_embedding = _define("rotary_embedding" + _ROTARY_ARGUMENTS, None, _mutates_only)
"""Rotate `query` and `key` in place (see `posenc_fast.vllm.rotary_embedding`)."""


def _apply_rotary(positions, x, head_size, cos_sin_cache, is_neox, rope_dim_offset=0,
                  inverse=False):
    out = x.detach().clone(memory_format=torch.contiguous_format)
    if not _kernels.rotate_tokens_fast(positions, out, None, head_size, cos_sin_cache, is_neox, rope_dim_offset,
                                       inverse):  # vllm.rotary_embedding's general path, its messages naming x
        vllm._rotary_embedding(positions, out, None, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse,
                               names=("x", "key"))
    return out


def _apply_rotary_fake(positions, x, head_size, cos_sin_cache, is_neox, rope_dim_offset=0,
                       inverse=False):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


_APPLY_ROTARY_ARGUMENTS = ("(Tensor positions, Tensor x, SymInt head_size, Tensor cos_sin_cache, "
                           "bool is_neox, SymInt rope_dim_offset=0, bool inverse=False) -> Tensor")
apply_rotary = _define("apply_rotary" + _APPLY_ROTARY_ARGUMENTS, _apply_rotary, _apply_rotary_fake)
"""`x` rotated as `posenc_fast.vllm.rotary_embedding` rotates a query, into a new tensor.

The functional op, with a gradient: its backward is the same op with
`inverse` flipped (the rotation's transpose), so it trains, also under
``torch.compile``.  `cos_sin_cache` gets no gradient.
"""


def _apply_rotary_context(ctx, inputs, output):
    positions, _, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse = inputs
    ctx.save_for_backward(positions, cos_sin_cache)
    ctx.arguments = (head_size, is_neox, rope_dim_offset, inverse)


def _apply_rotary_backward(ctx, grad):
    positions, cos_sin_cache = ctx.saved_tensors
    head_size, is_neox, rope_dim_offset, inverse = ctx.arguments
    return (None, apply_rotary(positions, grad, head_size, cos_sin_cache, is_neox,
                               rope_dim_offset, not inverse), None, None, None, None, None)


torch.library.register_autograd("posenc_fast::apply_rotary", _apply_rotary_backward,
                                setup_context=_apply_rotary_context, lib=_LIBRARY)

_NAMED = set()  # the (family, name) pairs named for the C++ kernel of hf_rotate (or with no rotation to name)


def _hf_function(family, name, xs):
    from . import _hf_drop_in, hf
    function = _hf_drop_in._PATCHED.get(name, {}).get(family)
    if function is None:
        raise ValueError(f"hf_rotate: posenc_fast.hf patches no {name!r} of transformers.models.{family} (name: "
                         f"one of {sorted(_hf_drop_in._PATCHED)}, family: a module that has it)")
    parameters = hf._parameters(function)
    most = len(parameters) - 2 - ("position_ids" in parameters)  # the data among them: not cos, sin, position_ids
    if not 1 <= len(xs) <= most:
        data = [p for p in parameters if p not in ("cos", "sin", "position_ids")]
        raise ValueError(f"hf_rotate: xs must hold 1 to {most} of the tensors transformers.models.{family}'s "
                         f"{name} rotates ({', '.join(data)}), got {len(xs)}")
    return _hf_drop_in, function


def _hf_formula(drop_in, function, family, name):
    """The modeling module's own function (the public drop-ins': `_hf_drop_in._torch_formula`), on a
    tuple: ``unsqueeze_dim`` passed where it has one (not the vision towers')."""
    from . import hf

    if function in (hf._LLAMA, hf._ONE_TENSOR) or "position_ids" in hf._parameters(function):
        # (CLVP's, of the cache the drop-in indexed by position_ids already: Llama's formula for q, k and v)
        return lambda xs, cos, sin, dim: drop_in._torch_formula(torch, xs, cos, sin, dim)
    import importlib

    module = importlib.import_module(hf._module_name(family))
    original = hf._originals.get((module.__name__, name), getattr(module, name))
    parameters = hf._parameters(function)

    def formula(xs, cos, sin, dim):
        data = iter(xs)  # its arguments in its order (GPT-J's (tensor, sin, cos))
        args = [cos if p == "cos" else sin if p == "sin" else next(data) for p in parameters]
        if function.unsqueeze is not None:  # it unsqueezes at its own axis, the one `dim` is
            result = original(*args)
        else:
            result = original(*args, unsqueeze_dim=dim)
        return (result,) if function.one_tensor else tuple(result)

    return formula


def _hf_strides(function, x, transpose) -> list:
    """The strides of posenc_fast.hf's result for `x`: x's memory order where its leading axes permuted
    are contiguous (`_hf_drop_in._rotate_in_memory_order`), else contiguous, and so a gradient's and
    a deinterleaving, prefix-token or pair-summing function's result."""
    axes = sorted(range(x.dim() - 1), key=lambda axis: -x.stride(axis)) + [x.dim() - 1]
    if (transpose or function.deinterleaves or function.prefix_tokens or function.sums_pairs or x.is_contiguous()
            or not x.permute(axes).is_contiguous()):
        axes = range(x.dim())
    strides, step = [0] * x.dim(), 1
    for axis in reversed(axes):  # as torch lays out a contiguous tensor: size-0 and size-1 axes step 1
        strides[axis] = step
        step = step * torch.sym_max(x.shape[axis], 1)
    return strides


def _hf_layout(function, x, transpose, dtype):
    """An empty tensor of `dtype` laid out as posenc_fast.hf's result for `x` (`_hf_strides`)."""
    return torch.empty_strided(x.shape, _hf_strides(function, x, transpose), dtype=dtype, device=x.device)


def _in_layout(result, strides):
    # `result` with `strides` (those of size-1 axes do not address memory: a view)
    if list(result.stride()) == strides:
        return result
    if all(a == b or n == 1 for a, b, n in zip(result.stride(), strides, result.shape)):
        return result.as_strided(result.shape, strides)
    return torch.empty_strided(result.shape, strides, dtype=result.dtype, device=result.device).copy_(result)


def _hf_rotate(xs, cos, sin, family, name, unsqueeze_dim, transpose):
    drop_in, function = _hf_function(family, name, xs)
    if compiled_kernels is not None and (family, name) not in _NAMED:  # for the C++ kernel's next calls
        rotation = drop_in.compiled(torch, function)
        if rotation is None or _kernels.register_hf_rotation(family, name, rotation):
            _NAMED.add((family, name))
    results = None if transpose else drop_in._compiled_call(torch, function, tuple(xs), cos, sin, unsqueeze_dim)
    if results is not None:  # the eager drop-ins' common call, checked and rotated in C: it takes
        return list(results)  # contiguous data only, and its results are contiguous, as _hf_strides says
    if transpose:
        xs = [g.contiguous() for g in xs]
    with torch.no_grad():  # (called directly) data the kernel does not compute as the module does?
        exact = drop_in._numpy_can_take(torch, function, xs, cos, sin)
    arrays = [drop_in.numpy_view(torch, t) for t in (*xs, cos, sin)] if exact else None
    if not (exact and drop_in._cache_repeats(function, arrays[-2]) and drop_in._cache_repeats(function, arrays[-1])):
        # no rotation of pairs: the module's formula, or its backward (a linear map's: at zeros)
        formula = _hf_formula(drop_in, function, family, name)
        if not transpose:
            with torch.no_grad():
                results = formula(tuple(xs), cos, sin, unsqueeze_dim)
        else:
            drop_in.FALLBACKS["cos/sin entries do not repeat"] += 1  # a gradient was needed: counted now
            _, vjp = torch.func.vjp(lambda *zs: formula(zs, cos, sin, unsqueeze_dim),
                                    *[torch.zeros_like(g) for g in xs])
            results = vjp(tuple(xs))
    elif transpose:
        results = drop_in._transposed(torch, function, xs, arrays[-2:], unsqueeze_dim)
    else:
        results = drop_in._rotated(torch, function, arrays, [x.dtype for x in xs], unsqueeze_dim)
    return [_in_layout(r, _hf_strides(function, x, transpose)) for r, x in zip(results, xs)]


def _hf_rotate_fake(xs, cos, sin, family, name, unsqueeze_dim, transpose):
    drop_in, function = _hf_function(family, name, xs)
    dtypes = [x.dtype for x in xs]
    kernel = drop_in._kernel_dtypes(torch)
    if not transpose and not (all(t.dtype in kernel for t in (*xs, cos, sin))
                              and drop_in._cache_fits(torch, function, xs, cos, sin)):
        # the module's formula computes it, in the dtypes torch promotes to: as it does on these
        dtypes = [r.dtype for r in _hf_formula(drop_in, function, family, name)(tuple(xs), cos, sin, unsqueeze_dim)]
    return [_hf_layout(function, x, transpose, dtype) for x, dtype in zip(xs, dtypes)]


_HF_ARGUMENTS = ("(Tensor[] xs, Tensor cos, Tensor sin, str family, str name, SymInt unsqueeze_dim, "
                 "bool transpose) -> Tensor[]")
hf_rotate = _define("hf_rotate" + _HF_ARGUMENTS, None, _hf_rotate_fake)
"""What `posenc_fast.hf`'s replacement of ``transformers.models.<family>``'s function `name`
returns for `xs` (q and k, or one tensor: 1 to as many as it rotates), with a gradient: the drop-ins under ``torch.compile``.

`name` is ``apply_rotary_pos_emb``, ``apply_rotary_pos_emb_interleave`` or
``apply_rotary_pos_emb_vision``; `unsqueeze_dim` is the call's (a vision
tower's function: its own axis).  `transpose` rotates gradients back (its
backward).  cos/sin whose entries do not repeat as the function expects, and
data the kernel does not compute as the module does (called directly), take
the module's own formula (and its backward), as the drop-in does.  cos/sin
get no gradient.  Its kernel rotates the eager drop-in's common call in C
(`posenc_fast._hf_drop_in.compiled`; the C++ kernel, where built, by the
rotation the Python kernel named for (family, name) on its first call).
"""


_hf_rotate_no_grad = _define("_hf_rotate_no_grad" + _HF_ARGUMENTS, None, _hf_rotate_fake)
"""`hf_rotate` without its gradient, for a graph in which no input needs one: torch's Python layer of
an op's backward (`torch.library.register_autograd`) costs ~10 us a call, even under ``no_grad``."""


def _hf_rotate_context(ctx, inputs, output):
    _, cos, sin, family, name, unsqueeze_dim, transpose = inputs
    ctx.save_for_backward(cos, sin)
    ctx.arguments = (family, name, unsqueeze_dim, not transpose)  # the backward of the transpose: the rotation


def _hf_rotate_backward(ctx, grads):
    cos, sin = ctx.saved_tensors
    return (hf_rotate(list(grads), cos, sin, *ctx.arguments),) + (None,) * 6


torch.library.register_autograd("posenc_fast::hf_rotate", _hf_rotate_backward,
                                setup_context=_hf_rotate_context, lib=_LIBRARY)

_NORM_ARGUMENTS = ("(Tensor positions, Tensor(a!) query, Tensor(b!) key, Tensor q_weight, Tensor k_weight, "
                   "SymInt head_size, Tensor cos_sin_cache, bool is_neox, float eps=1e-06, "
                   "float weight_offset=0.0) -> ()")
fused_qk_norm_rope = _define("fused_qk_norm_rope" + _NORM_ARGUMENTS, None, _mutates_only)
"""RMSNorm and rotate `query` and `key` in place (see `posenc_fast.vllm.fused_qk_norm_rope`)."""

_CACHE_ARGUMENTS = ("(Tensor positions, Tensor(a!) query, Tensor key, Tensor value, Tensor(b!) key_cache, "
                    "Tensor(c!) value_cache, Tensor slot_mapping, SymInt head_size, Tensor cos_sin_cache, "
                    "bool is_neox, str kv_cache_layout=\"NHD\", Tensor? q_weight=None, Tensor? k_weight=None, "
                    "float eps=1e-06, float weight_offset=0.0) -> ()")
apply_qk_to_cache = _define("apply_qk_to_cache" + _CACHE_ARGUMENTS, None, _mutates_only)
"""Rotate `query` in place, write the rotated key and the value into their cache slots
(see `posenc_fast.vllm.apply_qk_to_cache`)."""

_MLA_ARGUMENTS = ("(Tensor kv_c, Tensor k_pe, Tensor(a!) kv_cache, Tensor slot_mapping, "
                  "str kv_cache_dtype=\"auto\", Tensor? scale=None) -> ()")
concat_and_cache_mla = _define("concat_and_cache_mla" + _MLA_ARGUMENTS, None, _mutates_only)
"""Write ``[kv_c | k_pe]`` into each token's MLA cache row (see `posenc_fast.vllm.concat_and_cache_mla`)."""

_MLA_FUSED_ARGUMENTS = ("(Tensor positions, Tensor(a!) q_pe, Tensor(b!) k_pe, Tensor kv_c, Tensor cos_sin_cache, "
                        "bool is_neox, Tensor slot_mapping, Tensor(c!) kv_cache, str kv_cache_dtype=\"auto\", "
                        "Tensor? kv_cache_scale=None) -> ()")
concat_and_cache_mla_rope_fused = _define("concat_and_cache_mla_rope_fused" + _MLA_FUSED_ARGUMENTS, None,
                                          _mutates_only)
"""Rotate `q_pe` and `k_pe` in place and write the MLA cache rows
(see `posenc_fast.vllm.concat_and_cache_mla_rope_fused`)."""


def _refuse_what_no_kernel_takes(name: str, arguments: str) -> None:
    """Kernels of the op `name` for the tensors torch would not hand to its CPU kernel as they are.

    Other layouts (sparse, MKL-DNN, nested tensors) have no kernel, and torch raised NotImplementedError:
    refused, naming the argument.  For an in-place op, tensors with torch's negative or conjugate bit (a
    view such as ``z.conj().imag``): torch's own fallback ran the kernel on a resolved copy of a written
    tensor, wrote the other tensors, then failed (and the next call crashed the interpreter); a written one
    is refused before anything is written, a read one resolved (a copy) and the op called with it.
    """
    parsed = torch._C.parse_schema(f"posenc_fast::{name}{arguments}").arguments
    names = [argument.name for argument in parsed]
    written = {argument.name for argument in parsed if argument.alias_info is not None
               and argument.alias_info.is_write}
    op = getattr(torch.ops.posenc_fast, name)

    def other_layout(*args, **kwargs):
        for arg_name, tensor in _named_tensors({**dict(zip(names, args)), **kwargs}):
            if tensor.layout != torch.strided or tensor.is_nested:
                got = "a nested tensor" if tensor.is_nested else f"layout {tensor.layout}"
                raise ValueError(f"{arg_name} must be a strided CPU tensor, got {got}")
        raise AssertionError(f"posenc_fast::{name} was dispatched for another layout, but every tensor is strided")

    def math_bits(*args, **kwargs):
        bound = {**dict(zip(names, args)), **kwargs}
        for arg_name, tensor in _named_tensors(bound):
            if tensor.is_neg() or tensor.is_conj():
                if arg_name in written:
                    raise ValueError(f"{arg_name} is a negated or conjugated view (is_neg() or is_conj()), "
                                     f"which this call cannot write through; pass a tensor of its own")
                bound[arg_name] = tensor.resolve_conj().resolve_neg()
        return op(**bound)
    for key in ("SparseCPU", "SparseCsrCPU", "MkldnnCPU", "NestedTensorCPU", "AutogradNestedTensor"):
        _LIBRARY.impl(name, other_layout, key)
    if written:
        for key in ("Negative", "Conjugate"):
            _LIBRARY.impl(name, math_bits, key)


compiled_kernels, kernel_reason = _torch_kernel.load(torch)
"""The C++ kernels of the in-place ops and of `hf_rotate` loaded (`posenc_fast._torch_kernel`): their
library's path, or None; and which kernels serve those ops, and why."""
for _name, _arguments, _kernel, _fake in (
        ("rotary_embedding", _ROTARY_ARGUMENTS, _function("rotary_embedding"), _mutates_only),
        ("apply_qk_to_cache", _CACHE_ARGUMENTS, _function("apply_qk_to_cache"), _mutates_only),
        ("fused_qk_norm_rope", _NORM_ARGUMENTS, _function("fused_qk_norm_rope"), _mutates_only),
        ("concat_and_cache_mla", _MLA_ARGUMENTS, _function("concat_and_cache_mla"), _mutates_only),
        ("concat_and_cache_mla_rope_fused", _MLA_FUSED_ARGUMENTS, _function("concat_and_cache_mla_rope_fused"),
         _mutates_only),
        ("hf_rotate", _HF_ARGUMENTS, lambda *args: _hf_rotate(*args), _hf_rotate_fake),
        ("_hf_rotate_no_grad", _HF_ARGUMENTS, lambda *args: _hf_rotate(*args), _hf_rotate_fake)):
    if compiled_kernels is None:
        _LIBRARY.impl(_name, _kernel, "CPU")
    else:  # the calls a C++ kernel does not take itself go to the Python one, as this op
        _define(f"_{_name}_general" + _arguments, _kernel, _fake)
    _refuse_what_no_kernel_takes(_name, _arguments)
_refuse_what_no_kernel_takes("apply_rotary", _APPLY_ROTARY_ARGUMENTS)
