"""hf.install under torch.compile: a compiled training step runs posenc_fast's kernel inside its graph.

Under ``torch.compile`` the drop-ins call ``torch.ops.posenc_fast.hf_rotate``
(`posenc_fast.torch_ops`), whose CPU kernel is the eager drop-in's kernel and
whose backward is the same op rotating back, so the graph keeps the rotation
(no graph break, ``fullgraph=True`` compiles) and the kernel runs when the graph
does.  With the ``aot_eager`` backend (AOTAutograd's forward and backward graphs
run op by op, as eager does) a tiny Llama's and Cohere's step (forward,
backward, SGD) equals the eager step under `install` bit for bit: the loss,
every gradient, every updated parameter.  With inductor (its own C++ kernels
for the rest of the model) the step is close, not bitwise (see
`test_inductor_step_is_close_to_the_eager_one`).  DeepSeek-V4's function (the
trailing features, one tensor) and the vision towers' compile to the op too,
bitwise the eager drop-in (`test_the_new_kinds_compile_to_the_op`).  A graph
needing no gradient calls the op's twin without a backward.  Skipped without
torch and transformers.
"""

import copy
import os
import warnings

import pytest

from posenc_fast import _hf_drop_in as _drop_in, hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_calls  # noqa: E402  (needs torch)
import hf_tiny  # noqa: E402  (needs torch)
from helpers import general_path_only  # noqa: E402


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    # A graph found in inductor's on-disk cache (from an earlier run) was seen not to reach a
    # patched function (test_torch_ops.py): compile afresh, into an empty cache.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    hf.FALLBACKS.clear()
    yield
    hf.uninstall()
    torch._dynamo.reset()


@pytest.fixture
def kernel_runs(monkeypatch):
    """The kernel's runs, when they happen (a compiled graph's, not its tracing): "forward" for a
    rotation, "backward" for gradients rotated back; on NumPy views, the compiled fast paths turned
    off (the common call in C, the eager drop-in's and the op's C++ kernel's, runs no Python to count:
    test_a_graph_needing_no_gradient_calls_the_op_without_one takes it)."""
    runs = []
    rotated, transposed = _drop_in._rotated, _drop_in._transposed

    def forward(*args):
        runs.append("forward")
        return rotated(*args)

    def backward(*args):
        runs.append("backward")
        monkeypatch.setattr(_drop_in, "_rotated", rotated)  # which the backward calls
        try:
            return transposed(*args)
        finally:
            monkeypatch.setattr(_drop_in, "_rotated", forward)

    monkeypatch.setattr(_drop_in, "_rotated", forward)
    monkeypatch.setattr(_drop_in, "_transposed", backward)
    with general_path_only():
        yield runs


def _model(model_type):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = hf_tiny.tiny_model(model_type)
    model.train()
    model.config.attention_dropout = 0.0
    return model


def _ids():
    return torch.randint(1, 128, (hf_tiny.BATCH, hf_tiny.SEQ), generator=torch.Generator().manual_seed(3))


def _step(model, optimizer, ids):
    """One training step: forward, the language-model loss, backward, SGD."""
    optimizer.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    optimizer.step()
    return loss.detach()


def _run(model, step, ids):
    """(loss, {name: gradient}, {name: parameter after the step}) of `step` on a copy of `model`."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = step(model, optimizer, ids)
    return (loss, {name: p.grad.clone() for name, p in model.named_parameters()},
            {name: p.detach().clone() for name, p in model.named_parameters()})


def _recording(backend, graphs):
    """`backend` (by name), recording the graphs dynamo hands it."""
    def compile_graph(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)
    return compile_graph


def _op_calls(graphs, op="hf_rotate"):
    packet = getattr(torch.ops.posenc_fast, op)
    return sum(node.target is packet.default or node.target is packet
               for gm in graphs for node in gm.graph.nodes if node.op == "call_function")


@pytest.mark.parametrize("grad", [False, True])
def test_a_graph_needing_no_gradient_calls_the_op_without_one(grad, monkeypatch):
    # torch's Python layer of an op's backward costs ~10 us a call even under no_grad: a graph whose
    # inputs need no gradient holds _hf_rotate_no_grad (the same kernel), one that does hf_rotate;
    # either op's kernel rotates the common call in C, as the eager drop-in does
    q, k = (torch.randn(1, 1, n, 16).transpose(1, 2).requires_grad_(grad) for n in (4, 2))
    angles = 7 * 500.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    cos, sin = (f(torch.cat((angles, angles)))[None, None].float() for f in (torch.cos, torch.sin))
    want = hf.apply_rotary_pos_emb(q, k, cos, sin)
    graphs = []
    compiled = torch.compile(hf.apply_rotary_pos_emb, fullgraph=True, backend=_recording("aot_eager", graphs))
    monkeypatch.setattr(_drop_in, "_rotated", None)  # not the route on NumPy views
    got = compiled(q, k, cos, sin)
    assert (_op_calls(graphs), _op_calls(graphs, "_hf_rotate_no_grad")) == ((1, 0) if grad else (0, 1))
    assert all(torch.equal(g, w) and g.stride() == w.stride() and g.requires_grad == grad
               for g, w in zip(got, want))
    if not grad:  # its fake's layout is its kernel's
        torch.library.opcheck(torch.ops.posenc_fast._hf_rotate_no_grad,
                              ([q, k], cos, sin, "llama", "apply_rotary_pos_emb", 1, False))


def _graph_breaks():
    return dict(torch._dynamo.utils.counters["graph_break"])


def _compiled_step(model, ids, backend, graphs, kernel_runs):
    """The compiled step's results, after checking where the kernel ran."""
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(_step, backend=_recording(backend, graphs))
    got = _run(model, compiled, ids)
    layers = model.config.num_hidden_layers
    # the graphs hold the op (one call per attention layer, q and k together) ...
    assert _op_calls(graphs) == layers
    # ... and it ran: each layer's rotation, and its gradients rotated back
    assert sorted(kernel_runs) == ["backward"] * layers + ["forward"] * layers, kernel_runs
    # one graph holds every layer's rotation, and dynamo stops only where it stops without
    # install: at loss.backward() (not traced), Optimizer.zero_grad (skipped) and the
    # optimizer's own torch._dynamo.graph_break() calls
    assert max(_op_calls([gm]) for gm in graphs) == layers
    expected = ("Tensor.backward()", "Optimizer.zero_grad", "Call to `torch._dynamo.graph_break()`")
    assert all(any(e in reason for e in expected) for reason in _graph_breaks()), _graph_breaks()
    assert not hf.FALLBACKS
    return got


def _assert_equal(got, want):
    (got_loss, got_grads, got_params), (want_loss, want_grads, want_params) = got, want
    assert torch.equal(got_loss, want_loss), (got_loss, want_loss)
    assert got_grads.keys() == want_grads.keys() and len(want_grads) > 4
    for name in want_grads:
        assert torch.equal(got_grads[name], want_grads[name]), name
        assert torch.equal(got_params[name], want_params[name]), name


@pytest.mark.parametrize("model_type", ["llama", "cohere"])
def test_compiled_step_equals_the_eager_one(model_type, kernel_runs):
    model, ids = _model(model_type), _ids()
    hf.install(model)
    want = _run(model, _step, ids)
    layers = model.config.num_hidden_layers
    assert sorted(kernel_runs) == ["backward"] * layers + ["forward"] * layers
    kernel_runs.clear()
    got = _compiled_step(model, ids, "aot_eager", [], kernel_runs)
    _assert_equal(got, want)
    # and the eager step under install is the model's own step (as test_hf_training.py finds)
    hf.uninstall()
    _assert_equal(want, _run(model, _step, ids))


def test_model_forward_compiles_in_one_graph(kernel_runs):
    # fullgraph=True: an error at any graph break; the loss's backward then runs the op's backward
    model, ids = _model("llama"), _ids()
    hf.install(model)
    want = _run(model, _step, ids)
    kernel_runs.clear()
    loss = torch.compile(lambda ids: model(input_ids=ids, labels=ids, use_cache=False).loss,
                         fullgraph=True, backend="aot_eager")
    model.zero_grad(set_to_none=True)
    got = loss(ids)
    got.backward()
    assert torch.equal(got.detach(), want[0])
    assert sorted(kernel_runs) == ["backward"] * 2 + ["forward"] * 2
    for name, p in model.named_parameters():
        assert torch.equal(p.grad, want[1][name]), name


@pytest.fixture
def one_thread():
    # with the machine's threads, inductor's embedding gradient (a scatter-add of the rows'
    # gradients) was seen to differ in the last bits from one compiled run to the next: one thread
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("POSENC_FAST_TEST_BIG", "") in ("", "0"),
                    reason="inductor compiles for about a minute: set POSENC_FAST_TEST_BIG=1")
def test_inductor_step_is_close_to_the_eager_one(kernel_runs, one_thread):
    # Inductor writes its own C++ for the rest of the step (RMSNorm, softmax, SiLU, the loss,
    # the SGD update), reducing in another order than eager: its loss and gradients differ from
    # eager's in the last bits (relative 1e-7 to 1e-6), with install or without.  The rotation
    # does not: the step with install (the kernel inside the graph) is bitwise inductor's step
    # without it (inductor's own code for transformers' formula).
    model, ids = _model("llama"), _ids()
    hf.install(model)
    eager = _run(model, _step, ids)
    kernel_runs.clear()
    got = _compiled_step(model, ids, "inductor", [], kernel_runs)
    torch.testing.assert_close(got[0], eager[0], rtol=1e-6, atol=0)
    for name in eager[1]:
        torch.testing.assert_close(got[1][name], eager[1][name], rtol=1e-5, atol=1e-6 * eager[1][name].abs().max())
        torch.testing.assert_close(got[2][name], eager[2][name], rtol=1e-5, atol=1e-7)
    hf.uninstall()
    torch._dynamo.reset()
    kernel_runs.clear()
    without = _run(model, torch.compile(_step), ids)
    assert not kernel_runs
    _assert_equal(got, without)


def test_the_op_names_each_patched_function():
    # _compiled_rotation hands the op (module, function name) read off the function's flags
    for name, table in hf._PATCHED.items():
        for module, function in table.items():
            assert _drop_in._patched_as(function) == (module, name)


@pytest.mark.parametrize("module, name, width", [("deepseek_v4", "apply_rotary_pos_emb", 8),
                                                 ("qwen2_vl", "apply_rotary_pos_emb_vision", 16),
                                                 ("inkling2", "apply_rotary_pos_emb_vision", 16),
                                                 ("minimax_m3_vl", "apply_rotary_pos_emb_vision", 8),
                                                 ("gptj", "apply_rotary_pos_emb", 16),
                                                 ("dinov3_vit", "apply_rotary_pos_emb", 16),
                                                 ("muse_glimmer_assistant", "apply_rotary_pos_emb", 16),
                                                 ("pe_audio", "apply_rotary_pos_emb", 16),
                                                 ("clvp", "apply_rotary_pos_emb", 16)])
def test_the_new_kinds_compile_to_the_op(module, name, width, kernel_runs):
    # DeepSeek-V4's one-tensor function of the trailing features (a half-width cache, in float32) and
    # the vision towers' (q, k, cos, sin) ones (float32, interleaved, partial with cos[:, None, :]), GPT-J's
    # (tensor, sin, cos) with its half-width cache, DINOv3's of the patch tokens after the prefix ones, and
    # Muse-Glimmer's assistant's (q by the cache's last rows), PE's (sums of rotation matrices), CLVP's
    # (q, k and v by cos[position_ids]):
    # under torch.compile (fullgraph) the op in the graph, the kernel and its backward running, the
    # results and gradients the eager drop-in's bit for bit, and the module's own function's
    import importlib

    function = hf._PATCHED[name][module]
    own = getattr(importlib.import_module(hf._module_name(module)), name)
    patched = hf._replacement(own, function)
    case = hf_calls.cases(function)[0]  # float32 data needing a gradient, a cache `width` wide
    xs = hf_calls.data(case, torch.float32, requires_grad=True)
    cos, sin = hf_calls.cache(function, case.lead, width, torch.float32, seed=width)

    def call(*xs):
        return hf_calls.call(function, patched, xs, cos, sin, case)

    want = call(*xs)
    want_grads = torch.autograd.grad(sum(w.square().sum() for w in want), xs)
    own_result = hf_calls.call(function, own, xs, cos, sin, case)
    own_grads = torch.autograd.grad(sum(o.square().sum() for o in own_result), xs)
    for w, o in zip((*want, *want_grads), (*own_result, *own_grads)):
        assert torch.equal(w, o)
    calls = len(xs) if function.one_tensor else 1
    assert sorted(kernel_runs) == ["backward"] * calls + ["forward"] * calls
    kernel_runs.clear()
    graphs = []
    compiled = torch.compile(call, fullgraph=True, backend=_recording("aot_eager", graphs))
    got = compiled(*xs)
    grads = torch.autograd.grad(sum(g.square().sum() for g in got), xs)
    assert _op_calls(graphs) == calls
    assert sorted(kernel_runs) == ["backward"] * calls + ["forward"] * calls, kernel_runs
    for g, w in zip((*got, *grads), (*want, *want_grads)):
        assert torch.equal(g, w) and g.stride() == w.stride()
    assert not hf.FALLBACKS
