"""The compiled route of CPU torch tensors (``_core_torch.pxi``) against the Python route it shortens.

`kernels.tensor_arrays` must give exactly the views `numpy_view` gives (or None, for whatever the
Python layer has to judge), through DLPack's C exchange table and through the tensors' attributes alike
(the `reader` fixture), and `TensorRotation`, hf's drop-ins checked and rotated in C, exactly the
results of the Python route (`_rotate_tensors`) wherever it answers, declining everything else.
"""

import gc
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

torch = pytest.importorskip("torch")

from posenc_fast import _hf_drop_in, hf, vllm  # noqa: E402
from posenc_fast._dispatch import kernels  # noqa: E402
from posenc_fast._hf_functions import INTERLEAVE_FUNCTIONS, ROTARY_FUNCTIONS, VISION_FUNCTIONS  # noqa: E402

_hf_drop_in.numpy_view(torch, torch.zeros(1))  # registers torch with the compiled layer

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
HAS_TABLE = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")  # DLPack's C exchange table


@pytest.fixture(params=["dlpack", "attributes"])
def reader(request):
    """Each way the compiled layer reads a tensor: DLPack's C table (where torch has one) and the
    tensor's attributes; the switch shown to switch."""
    by_dlpack = request.param == "dlpack"
    if by_dlpack and not HAS_TABLE:
        pytest.skip("this torch has no DLPack C exchange table")
    _hf_drop_in._register(torch, by_dlpack)
    assert kernels.torch_reads_by_dlpack() == by_dlpack
    yield request.param
    _hf_drop_in._register(torch)


def views(*tensors, optional=0, integers=0):
    return kernels.tensor_arrays(tensors, optional, integers)


def same_view(a, b):
    return (a.dtype == b.dtype and a.shape == b.shape and a.strides == b.strides
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


@pytest.mark.parametrize("make", [
    lambda: torch.randn(3, 8),
    lambda: torch.randn(2, 5, 8).transpose(0, 1),
    lambda: torch.randn(6, 10)[1:, 2:7],
    lambda: torch.randn(12)[::3],
    lambda: torch.randn(1, 8).expand(4, 8),
    lambda: torch.tensor(2.5),
    lambda: torch.randn(2, 3, 4, 5, 6, 7),
    *(lambda dtype=dtype: torch.randn(4, 6).to(dtype) for dtype in DTYPES),
], ids=["contiguous", "transposed", "sliced", "stepped", "expanded", "0-d", "6-d",
        "float32", "float64", "float16", "bfloat16"])
def test_views_are_the_numpy_views(make, reader):
    t = make()
    (a,) = views(t)
    assert same_view(a, _hf_drop_in.numpy_view(torch, t))
    assert a.base is t and a.flags.writeable
    a[...] = 0  # the tensor's own memory
    assert not t.any()


def test_integers_only_where_named(reader):
    positions, x = torch.arange(4), torch.randn(4, 8)
    assert views(x, positions) is None  # an int64 tensor where a float one belongs
    got = views(x, positions, integers=0b10)
    assert same_view(got[1], positions.numpy())
    assert views(x, None) is None and views(x, None, optional=0b10)[1] is None


@pytest.mark.parametrize("make", [
    lambda: torch.nn.Parameter(torch.randn(3, 4)),          # a subclass
    lambda: torch.randn(3, 4).to_sparse(),                   # another layout
    lambda: torch.randn(3, 4, device="meta"),               # another device
    lambda: torch._neg_view(torch.randn(3, 4)),              # memory holding -x
    lambda: torch.randn(3, 4, dtype=torch.complex64).conj().imag,  # the same, by public functions
    lambda: torch.randn(3, 4, dtype=torch.complex64),        # no kernel dtype
    lambda: torch.randn(3, 4, requires_grad=True),           # needs a gradient (grad mode on)
    lambda: torch.empty(0, 4),                               # no memory
    lambda: torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)]),  # no strides
], ids=["parameter", "sparse", "meta", "negated", "conj-imag", "complex", "requires-grad", "empty", "nested"])
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_what_the_python_layer_judges_is_declined(make, reader):
    assert views(make()) is None


def test_requires_grad_is_viewed_without_grad_mode(reader):
    t = torch.randn(3, 4, requires_grad=True)
    with torch.no_grad():
        (a,) = views(t)
    assert same_view(a, t.detach().numpy())


def test_a_view_keeps_its_tensor_alive(reader):
    (a,) = views(torch.full((1000,), 3.0))
    gc.collect()
    assert a.sum() == 3000.0


# ---- TensorRotation: one function of each kind in install's tables
KINDS = {}
for table in (ROTARY_FUNCTIONS, VISION_FUNCTIONS, INTERLEAVE_FUNCTIONS):
    for function in table.values():
        KINDS.setdefault(function._replace(source=""), function)
FUNCTIONS = list(KINDS.values())


def cache_for(function, lead, rotated, dtype, rng):
    """transformers' form of the cos/sin of `rotated` features: full width, pairs or half width."""
    angles = torch.from_numpy(rng.uniform(-50, 50, lead + (rotated // 2,)))
    if function.cache == "halves":
        angles = torch.cat((angles, angles), -1)
    elif function.cache == "pairs":
        angles = angles.repeat_interleave(2, -1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def call(function, dtypes, cache_dtype, seq, heads, dim, rotated, rng):
    """(xs, cos, sin, unsqueeze_dim) as the function's callers pass them."""
    if function.unsqueeze == -2:  # a tower's (seq, heads, dim) with a (seq, dim) cache
        shapes, lead, axis = [(seq, heads, dim)] * 2, (seq,), -2
    else:  # Llama's (batch, heads, seq, dim) with a (batch, seq, dim) cache
        shapes, lead, axis = [(1, heads, seq, dim), (1, max(heads // 2, 1), seq, dim)], (1, seq), 1
    n = 1 if function.one_tensor else 2
    xs = tuple(torch.from_numpy(rng.standard_normal(shape)).to(dtype)
               for shape, dtype in zip(shapes[:n], dtypes[:n]))
    if axis == 1 and rng.random() < 0.3:  # Llama's own: (batch, seq, heads, dim) projections transposed
        xs = tuple(x.transpose(1, 2).contiguous().transpose(1, 2) for x in xs)
    return xs, *cache_for(function, lead, rotated, cache_dtype, rng), axis


def python_route(function, xs, cos, sin, axis):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_hf_drop_in, "_compiled_call", lambda *args: None)
        return _hf_drop_in._rotate_tensors(torch, function, xs, cos, sin, axis)


def bits(t):
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same_tensors(a, b):
    """Bit for bit, with the same dtypes, shapes and strides."""
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride() and torch.equal(bits(x), bits(y))
        for x, y in zip(a, b))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FUNCTIONS), st.tuples(st.sampled_from(DTYPES), st.sampled_from(DTYPES)),
       st.sampled_from(DTYPES), st.integers(1, 5), st.integers(1, 4), st.sampled_from([8, 12, 16]),
       st.integers(1, 4), st.integers(0, 2 ** 32 - 1))
def test_the_compiled_route_gives_the_python_route(function, dtypes, cache_dtype, seq, heads, dim,
                                                   cut, seed):
    rng = np.random.default_rng(seed)
    if function.one_tensor or rng.random() < 0.6:
        dtypes = (dtypes[0], dtypes[0])
    half_width = function.cache == "half_width"
    rotated = dim - 2 * (cut % (dim // 4)) if function.partial else dim
    xs, cos, sin, axis = call(function, dtypes, cache_dtype, seq, heads, dim, rotated, rng)
    before = [x.clone() for x in xs]
    rotation = _hf_drop_in.compiled(torch, function)
    if rotation is None:
        return  # the Python route's alone (test_the_compiled_route_answers_where_the_python_route_does)
    with torch.no_grad():
        got = rotation(xs, cos, sin, axis)
        want = python_route(function, xs, cos, sin, axis)

    assert all(torch.equal(x, b) for x, b in zip(xs, before))  # never written
    if got is None:
        return  # declined: the Python route answers (or takes the formula)
    assert want is not None, "the compiled route took a call the Python route does not take"
    assert same_tensors(got, want)
    assert not any(np.shares_memory(bits(g).numpy(), bits(x).numpy()) for g in got for x in xs)
    assert not half_width or cos.shape[-1] * 2 == rotated


@pytest.mark.parametrize("function", FUNCTIONS, ids=lambda f: f.source.split("/")[0])
def test_the_compiled_route_answers_where_the_python_route_does(function):
    # Every dtype combination on a decode step: the C table is the Python rule.  The Python route
    # alone takes a pairs cache (a strided read), a deinterleaving function, and a half cache for
    # data of another dtype (no kernel row: its general path converts the cache).
    rng = np.random.default_rng(1)
    rotation = _hf_drop_in.compiled(torch, function)
    plain = function._replace(**{f: getattr(_hf_drop_in._PLAIN, f) for f in _hf_drop_in._COMPILED_FIELDS})
    if plain != _hf_drop_in._PLAIN:  # a field TensorRotation does not read (MLA's, GPT-J's, ...)
        assert rotation is None
        return
    answered = 0
    for q in DTYPES:
        for k in DTYPES:
            for cache in DTYPES:
                if function.one_tensor and k is not q:
                    continue
                xs, cos, sin, axis = call(function, (q, k), cache, 1, 4, 16, 8 if function.partial else 16, rng)
                with torch.no_grad():
                    got = None if rotation is None else rotation(xs, cos, sin, axis)
                    want = python_route(function, xs, cos, sin, axis)
                if function.cache == "pairs":
                    assert got is None
                    continue
                no_row = cache in (torch.float16, torch.bfloat16) and {q, k} != {cache}
                assert (got is None) == (want is None) or no_row, (q, k, cache)
                assert got is None or same_tensors(got, want)
                answered += got is not None
    assert answered or function.cache == "pairs"


def llama_decode(dtype):
    rng = np.random.default_rng(0)
    return call(ROTARY_FUNCTIONS["llama"], (dtype, dtype), dtype, 1, 8, 64, 64, rng)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_decode_step_takes_the_compiled_route(dtype, reader):
    # The switch switches: the decode step is answered in C, and with the fast paths off it is not.
    xs, cos, sin, axis = llama_decode(dtype)
    rotation = _hf_drop_in.compiled(torch, ROTARY_FUNCTIONS["llama"])
    with torch.no_grad():
        assert same_tensors(rotation(xs, cos, sin, axis), python_route(ROTARY_FUNCTIONS["llama"], xs, cos, sin, axis))
        kernels.set_fast_paths(False)
        try:
            assert rotation(xs, cos, sin, axis) is None
        finally:
            kernels.set_fast_paths(True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_results_are_cpu_tensors_whatever_the_default_device(dtype, reader):
    xs, cos, sin, axis = llama_decode(dtype)
    rotation = _hf_drop_in.compiled(torch, ROTARY_FUNCTIONS["llama"])
    with torch.no_grad():
        want = rotation(xs, cos, sin, axis)
        with torch.device("meta"):  # torch.empty's default device: never where the kernel writes
            got = rotation(xs, cos, sin, axis)
    assert all(g.device.type == "cpu" for g in got) and same_tensors(got, want)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads Linux's resident set size")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_results_memory_is_freed(dtype, reader):
    # Results handed to torch as blocks of our own (DLPack's table) or from NumPy: freed with them.
    xs, cos, sin, axis = llama_decode(dtype)
    xs = tuple(x.repeat(1, 1, 64, 1) for x in xs)  # 64 KiB of results a call
    cos, sin = cos.repeat(1, 64, 1), sin.repeat(1, 64, 1)
    rotation = _hf_drop_in.compiled(torch, ROTARY_FUNCTIONS["llama"])

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    with torch.no_grad():
        for _ in range(200):
            assert rotation(xs, cos, sin, axis) is not None
        before = rss()
        for _ in range(3000):  # a leak: 190 MiB
            rotation(xs, cos, sin, axis)
        gc.collect()
    assert rss() - before < 32 * 1024 * 1024


@pytest.mark.parametrize("case", ["float64 cache", "cache halves differ", "grad mode", "unsqueeze last",
                                  "deinterleaves", "float keyword"])
def test_the_compiled_route_declines(case):
    function = ROTARY_FUNCTIONS["llama"]
    xs, cos, sin, axis = llama_decode(torch.float32)
    if case == "float64 cache":  # torch would promote to float64
        cos, sin = cos.double(), sin.double()
    elif case == "cache halves differ":  # the formula then rotates no pairs
        cos = cos.clone()
        cos[..., -1] += 0.5
    elif case == "grad mode":  # the autograd Function's business
        xs = tuple(x.requires_grad_() for x in xs)
    elif case == "unsqueeze last":
        axis = -1
    elif case == "deinterleaves":
        assert _hf_drop_in.compiled(torch, INTERLEAVE_FUNCTIONS["deepseek_v3"]) is None
        return
    else:
        axis = 1.0
    assert _hf_drop_in.compiled(torch, function)(xs, cos, sin, axis) is None


def test_the_compiled_route_takes_at_most_the_functions_tensors():
    # two tensors for a one-tensor function were rotated (the C++ kernel's entry too, past the op's check)
    xs, cos, sin, axis = llama_decode(torch.float32)
    one = next(f for f in ROTARY_FUNCTIONS.values() if f.one_tensor and _hf_drop_in.compiled(torch, f) is not None)
    with torch.no_grad():
        assert _hf_drop_in.compiled(torch, one)(xs[:1], cos, sin, axis) is not None
        assert _hf_drop_in.compiled(torch, one)(xs[:1] * 2, cos, sin, axis) is None
        assert _hf_drop_in.compiled(torch, ROTARY_FUNCTIONS["llama"])(xs[:1], cos, sin, axis) is not None


def test_installed_functions_take_the_compiled_route(monkeypatch):
    from transformers.models.llama import modeling_llama

    function = ROTARY_FUNCTIONS["llama"]
    answered = []
    compiled = _hf_drop_in._compiled_call
    monkeypatch.setattr(_hf_drop_in, "_compiled_call",
                        lambda *args: answered.append(compiled(*args)) or answered[-1])
    patched = hf._replacement(modeling_llama.apply_rotary_pos_emb, function)
    xs, cos, sin, _ = llama_decode(torch.float32)  # (transformers rounds bfloat16 three times)
    with torch.no_grad():
        got = patched(*xs, cos, sin)
        assert answered and answered[-1] is not None
        assert same_tensors(got, modeling_llama.apply_rotary_pos_emb(*xs, cos, sin))


def test_vllm_op_views_in_c_and_refuses_an_expanded_query():
    positions = torch.tensor([1, 2, 3])
    inv_freq = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    angles = torch.arange(16, dtype=torch.float64)[:, None] * inv_freq
    cache = torch.cat((angles.cos(), angles.sin()), 1).float()
    q, k = torch.randn(3, 16), torch.randn(3, 8)
    arrays = vllm._as_arrays(("positions", "query", "key", "cos_sin_cache"), (positions, q, k, cache),
                             written=("query", "key"))
    assert all(a.base is t for a, t in zip(arrays, (positions, q, k, cache)))
    expanded = torch.randn(1, 16).expand(3, 16)
    before = expanded.clone()
    with pytest.raises(ValueError, match="query of strides .* share memory"):
        vllm.rotary_embedding(positions, expanded, k, 8, cache, True)
    assert torch.equal(expanded, before)
