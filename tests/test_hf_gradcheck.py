"""torch.autograd.gradcheck, in float64, of every kind of function `hf.install` patches.

One module per distinct ``RotaryFunction`` (the table's rows less their
source: half and interleaved layouts, partial, the cache forms, float32 and
own-dtype arithmetic, inverse, MLA's deinterleaving one, the one-tensor ones,
GPT-J's ``(tensor, sin, cos)``, DINOv3's of the patch tokens, Muse-Glimmer's
assistant's (q by the cache's last rows), PE's sums of rotation matrices, CLVP's (q, k and v by
``cos[position_ids]``), DeepSeek-V4's trailing one, the vision towers' ``(q, k, cos, sin)`` ones), its
replacement called as transformers calls it; the public drop-ins; the op
``hf_rotate`` the drop-ins call under ``torch.compile``, eager and compiled,
also with a cache whose entries do not repeat (the op's formula and its
backward).  Functions computing in float32 (``q.float()``: Cohere's) take
transformers' formula for float64 data (rounding it to float32 first would
not be exact): they are checked all the same, with a step the rounding
does not swamp.  Skipped without torch and transformers.
"""

import importlib

import pytest

from posenc_fast import _hf_drop_in as _drop_in, hf
from posenc_fast._hf_functions import INTERLEAVE_FUNCTIONS, ROTARY_FUNCTIONS, VISION_FUNCTIONS

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_calls  # noqa: E402  (needs torch)
from hf_tiny import kernel_calls  # noqa: E402,F401  (a fixture)


def _kinds():
    """(module, function name) of the first module of each distinct kind of function."""
    kinds = {}
    for name, table in (("apply_rotary_pos_emb", ROTARY_FUNCTIONS),
                        ("apply_rotary_pos_emb_interleave", INTERLEAVE_FUNCTIONS),
                        ("apply_rotary_pos_emb_vision", VISION_FUNCTIONS)):
        for module in sorted(table):
            kinds.setdefault(table[module]._replace(source=""), (module, name))
    return sorted(kinds.values())


KINDS = _kinds()


@pytest.fixture(autouse=True)
def fallbacks():
    hf.FALLBACKS.clear()
    yield
    hf.FALLBACKS.clear()


def test_every_kind_is_checked():
    kinds = {f._replace(source="") for table in (ROTARY_FUNCTIONS, INTERLEAVE_FUNCTIONS, VISION_FUNCTIONS)
             for f in table.values()}
    assert len(KINDS) == len(kinds) >= 13
    checked = {hf._PATCHED[name][module] for module, name in KINDS}
    assert any(f.one_tensor for f in checked) and any(f.deinterleaves for f in checked)
    assert any(f.trailing for f in checked) and {f.unsqueeze for f in checked} >= {None, 1, 2, -2}
    assert any(f.parameters for f in checked) and any(f.dims for f in checked)
    assert any(f.prefix_tokens for f in checked) and any(f.query_rows for f in checked)
    assert any(f.sums_pairs for f in checked)
    assert any(f.partial for f in checked) and any(f.layout == "interleaved" for f in checked)
    assert {f.cache for f in checked} == {"halves", "pairs", "half_width"}


def _inputs(function, width, repeat=True):
    """(the case, float64 data needing a gradient, cos, sin `width` wide) of the first call of
    `function` in ``hf_calls.cases`` (`repeat`=False: entries that do not repeat as it expects)."""
    case = hf_calls.cases(function)[0]
    cos, sin = hf_calls.cache(function, case.lead, width, seed=width, repeat=repeat)
    return case, hf_calls.data(case, requires_grad=True), cos, sin


def _call(function, apply, cos, sin, case):
    """`apply` of the data as transformers' attention calls it (``hf_calls.call``)."""
    return lambda *xs: hf_calls.call(function, apply, xs, cos, sin, case)


def _gradcheck(fn, inputs, float32, twice=True):
    # float32 arithmetic inside: a step of 1e-2 (the function is linear: no truncation error); `twice`: the
    # gradient of the gradient too (a gradient penalty: the backward's own backward)
    options = dict(eps=1e-2, atol=1e-4, rtol=1e-4) if float32 else {}
    assert torch.autograd.gradcheck(fn, inputs, **options)
    assert not twice or torch.autograd.gradgradcheck(fn, inputs, **options)


@pytest.mark.parametrize("module, name", KINDS)
def test_the_drop_in_passes_gradcheck(module, name, kernel_calls):
    function = hf._PATCHED[name][module]
    own = getattr(importlib.import_module(hf._module_name(module)), name)
    patched = hf._replacement(own, function)
    float32 = function.compute == "float32"
    for width in ((16, 8) if function.partial else (16,)):
        case, xs, cos, sin = _inputs(function, width)
        fn = _call(function, patched, cos, sin, case)
        results = fn(*xs)
        calls = len(xs) if function.one_tensor else 1
        # the kernel with its backward, but for q.float(): then the formula (no gradient lost)
        assert kernel_calls == [not float32] * calls
        assert (results[0].grad_fn.name() == "RotationBackward") is not float32
        # listed where it falls back
        assert hf.FALLBACKS == ({"data the kernel does not compute exactly": calls} if float32 else {})
        _gradcheck(fn, xs, float32)
        kernel_calls.clear()
        hf.FALLBACKS.clear()  # gradcheck's calls too


@pytest.mark.parametrize("public", ["apply_rotary_pos_emb", "apply_rotary_pos_emb_single"])
def test_the_public_drop_ins_pass_gradcheck(public, kernel_calls):
    function = hf._ONE_TENSOR if public.endswith("single") else hf._LLAMA
    case, xs, cos, sin = _inputs(function, 16)
    fn = _call(function, getattr(hf, public), cos, sin, case)
    _gradcheck(fn, xs, False)
    assert kernel_calls and all(kernel_calls)


@pytest.mark.parametrize("module, name", [("llama", "apply_rotary_pos_emb"), ("blt", "apply_rotary_pos_emb"),
                                          ("cohere", "apply_rotary_pos_emb"),
                                          ("deepseek_v3", "apply_rotary_pos_emb_interleave"),
                                          ("gemma4", "apply_rotary_pos_emb"), ("deepseek_v4", "apply_rotary_pos_emb"),
                                          ("gptj", "apply_rotary_pos_emb"), ("dinov3_vit", "apply_rotary_pos_emb"),
                                          ("muse_glimmer_assistant", "apply_rotary_pos_emb"),
                                          ("pe_audio", "apply_rotary_pos_emb"), ("clvp", "apply_rotary_pos_emb"),
                                          ("qwen2_vl", "apply_rotary_pos_emb_vision"),
                                          ("minimax_m3_vl", "apply_rotary_pos_emb_vision")])
@pytest.mark.parametrize("repeat", [True, False], ids=["cache", "cache not repeating"])
def test_the_op_passes_gradcheck(module, name, repeat):
    # hf_rotate, called directly: the kernel (or, entries not repeating, the module's formula;
    # float64 data of a function computing in float32: DeepSeek-V4's, Qwen2-VL's, Cohere's)
    import posenc_fast.torch_ops  # noqa: F401

    function = hf._PATCHED[name][module]
    case, xs, cos, sin = _inputs(function, 8 if function.partial else 16, repeat)  # partial: 8 of 16
    # what the drop-in passes the op: the axis, and cos/sin (CLVP's indexed by position_ids)
    dim = function.unsqueeze if case.unsqueeze_dim is None else case.unsqueeze_dim
    rows = hf_calls.indexed(function, cos, sin, case)

    def fn(*xs):
        return tuple(torch.ops.posenc_fast.hf_rotate(list(xs[:1] if function.one_tensor else xs), *rows,
                                                     module, name, dim, False))

    own = getattr(importlib.import_module(hf._module_name(module)), name)
    with torch.no_grad():
        want = _call(function, own, cos, sin, case)(*xs)
        got = fn(*xs)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    _gradcheck(fn, xs, function.compute == "float32")  # Cohere's: its formula (q.float())


@pytest.mark.parametrize("module, name", KINDS)
@pytest.mark.parametrize("data, table", [(("bfloat16", "bfloat16"), "float32"), (("float32", "float32"), "float64"),
                                         (("float16", "float32"), "float32")])
def test_the_ops_fake_gives_its_dtypes(module, name, data, table):
    # hf_rotate called directly with cos/sin wider than the data, or q and k of two dtypes: the
    # module's formula, in the dtypes torch promotes to (or its own); the fake says the same
    # (else a compiled graph computes on in other dtypes than the op returns)
    import posenc_fast.torch_ops  # noqa: F401

    function = hf._PATCHED[name][module]
    case, xs, cos, sin = _inputs(function, 8 if function.partial else 16)
    dim = function.unsqueeze if case.unsqueeze_dim is None else case.unsqueeze_dim
    xs = [x.detach().to(getattr(torch, d)) for x, d in zip(xs[:1] if function.one_tensor else xs, data)]
    rows = [r.to(getattr(torch, table)) for r in hf_calls.indexed(function, cos, sin, case)]
    torch.library.opcheck(torch.ops.posenc_fast.hf_rotate, (xs, *rows, module, name, dim, False),
                          test_utils=("test_faketensor",))


@pytest.mark.parametrize("module, name", [("nosuch", "apply_rotary_pos_emb"), ("llama", "apply_rotary_pos_emb_x")])
def test_the_op_refuses_a_function_it_does_not_patch(module, name):
    import posenc_fast.torch_ops  # noqa: F401

    _, xs, cos, sin = _inputs(hf._LLAMA, 16)
    with pytest.raises(ValueError, match=f"patches no {name!r} of transformers.models.{module}"):
        torch.ops.posenc_fast.hf_rotate(list(xs), cos, sin, module, name, 1, False)


@pytest.mark.parametrize("one_tensor", [False, True])
def test_the_op_refuses_xs_of_another_count(one_tensor):
    # none was an IndexError; two for a one-tensor function were rotated as if it took them (q alone, of q and
    # k, is what the function gives for q)
    import posenc_fast.torch_ops  # noqa: F401

    family = next(f for f, function in hf._PATCHED["apply_rotary_pos_emb"].items()
                  if function.one_tensor == one_tensor and hf._parameters(function)[-2:] == ("cos", "sin"))
    _, (q, k), cos, sin = _inputs(hf._LLAMA, 16)
    most = 1 if one_tensor else 2
    for xs in ([], [q], [q, k], [q, k, q]):
        if 1 <= len(xs) <= most:
            assert len(torch.ops.posenc_fast.hf_rotate(xs, cos, sin, family, "apply_rotary_pos_emb", 1, False)) == len(xs)
        else:
            with pytest.raises(ValueError, match=rf"xs must hold 1 to {most} of the tensors .* got {len(xs)}"):
                torch.ops.posenc_fast.hf_rotate(xs, cos, sin, family, "apply_rotary_pos_emb", 1, False)


def test_the_compiled_drop_in_passes_gradcheck(monkeypatch):
    # under torch.compile (fullgraph: the op in the graph), repeating entries or not
    _, _, cos, sin = _inputs(hf._LLAMA, 16)
    _, _, rand_cos, rand_sin = _inputs(hf._LLAMA, 16, repeat=False)
    runs = []  # the kernel's, when the compiled graph runs (a counter in the traced code would be a guard)
    monkeypatch.setattr(_drop_in, "_rotated", lambda *args, rotated=_drop_in._rotated: runs.append(1) or rotated(*args))
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, cos, sin: hf.apply_rotary_pos_emb(q, k, cos, sin),
                             fullgraph=True, backend="aot_eager")
    for c, s, kernel in ((cos, sin, True), (rand_cos, rand_sin, False)):
        runs.clear()
        # (torch.compile's aot_autograd has no double backward)
        _gradcheck(lambda q, k: compiled(q, k, c, s), _inputs(hf._LLAMA, 16)[1], False, twice=False)
        q, k = _inputs(hf._LLAMA, 16)[1]
        want = _drop_in._torch_formula(torch, (q, k), c, s, 1)
        got = compiled(q, k, c, s)
        for g, w in zip(got, want):
            assert torch.equal(g, w)
        grads = torch.autograd.grad(sum(g.square().sum() for g in got), (q, k))
        for g, w in zip(grads, torch.autograd.grad(sum(w.square().sum() for w in want), (q, k))):
            assert torch.equal(g, w)
        assert bool(runs) is kernel  # entries not repeating: the op's formula
    torch._dynamo.reset()


def test_a_result_reaching_no_loss_gives_its_data_no_gradient(kernel_calls):
    # (a zero gradient would change what weight decay and momentum do to a parameter, and what DDP calls used)
    case, (q, k), cos, sin = _inputs(hf._LLAMA, 16)
    q_embed, _ = hf.apply_rotary_pos_emb(q, k, cos, sin)
    assert q_embed.grad_fn.name() == "RotationBackward"
    q_embed.sum().backward()
    assert q.grad is not None and k.grad is None


def test_forward_mode_ad_and_torch_func_take_the_formula(kernel_calls):
    # the kernel reads a dual tensor's primal only (its tangent was dropped) and has no memory to read
    # under torch.func's transforms (a crash): transformers' formula carries both
    import torch.autograd.forward_ad as fwad

    _, (q, k), cos, sin = _inputs(hf._LLAMA, 16)
    q, k = q.detach(), k.detach()
    own = hf._replacement(importlib.import_module(hf._module_name("llama")).apply_rotary_pos_emb, hf._LLAMA).__wrapped__
    tangent = torch.randn_like(q)
    with fwad.dual_level():
        got = fwad.unpack_dual(hf.apply_rotary_pos_emb(fwad.make_dual(q, tangent), k, cos, sin)[0]).tangent
        want = fwad.unpack_dual(own(fwad.make_dual(q, tangent), k, cos, sin)[0]).tangent
    assert got is not None and torch.equal(got, want)
    grad = torch.func.grad(lambda a: hf.apply_rotary_pos_emb(a, k, cos, sin)[0].pow(2).sum())(q)
    assert torch.equal(grad, torch.func.grad(lambda a: own(a, k, cos, sin)[0].pow(2).sum())(q))
    batch = torch.stack((q, 2 * q))
    batched = torch.func.vmap(lambda a: hf.apply_rotary_pos_emb(a, a, cos, sin)[0])(batch)
    assert torch.equal(batched, torch.func.vmap(lambda a: own(a, a, cos, sin)[0])(batch))
    assert not any(kernel_calls)
    hf.apply_rotary_pos_emb(q, k, cos, sin)  # no transform now: the kernel
    assert kernel_calls[-1]
