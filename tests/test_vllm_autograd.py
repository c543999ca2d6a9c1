"""The vLLM-style functions and ops write tensors in place as torch's in-place ops do.

Each written tensor's version counter goes up (a graph that saved it then
refuses its backward, where a write through its pointer alone would leave a
wrong gradient), and an inference tensor is written only under
``torch.inference_mode()`` (torch's rule), on the compiled fast paths and the
general paths alike.
"""

import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import posenc_fast.torch_ops  # noqa: E402  (registers the ops)
from posenc_fast import vllm  # noqa: E402
from posenc_fast.hf import numpy_view  # noqa: E402
from helpers import general_path_only  # noqa: E402

TOKENS, HEAD = 3, 8


def _cache():
    angles = torch.arange(16.0)[:, None] * torch.tensor([1.0, 0.1, 0.01, 0.001])
    return torch.cat((angles.cos(), angles.sin()), dim=1)


def _calls():
    """{name: (function name, build)}: build() gives (arguments, names of the written ones)."""
    gen = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    positions, slots = torch.tensor([0, 5, 9]), torch.tensor([1, 6, 3])
    return {
        "rotary_embedding": lambda: (
            dict(positions=positions, query=randn(TOKENS, 2 * HEAD), key=randn(TOKENS, HEAD), head_size=HEAD,
                 cos_sin_cache=_cache(), is_neox=True), ("query", "key")),
        "fused_qk_norm_rope": lambda: (
            dict(positions=positions, query=randn(TOKENS, 2 * HEAD), key=randn(TOKENS, HEAD),
                 q_weight=randn(HEAD), k_weight=randn(HEAD), head_size=HEAD, cos_sin_cache=_cache(),
                 is_neox=True), ("query", "key")),
        "apply_qk_to_cache": lambda: (
            dict(positions=positions, query=randn(TOKENS, 2 * HEAD), key=randn(TOKENS, HEAD),
                 value=randn(TOKENS, HEAD), key_cache=torch.zeros(2, 4, 1, HEAD),
                 value_cache=torch.zeros(2, 4, 1, HEAD), slot_mapping=slots, head_size=HEAD,
                 cos_sin_cache=_cache(), is_neox=True), ("query", "key_cache", "value_cache")),
        "concat_and_cache_mla": lambda: (
            dict(kv_c=randn(TOKENS, 16), k_pe=randn(TOKENS, HEAD), kv_cache=torch.zeros(2, 4, 16 + HEAD),
                 slot_mapping=slots), ("kv_cache",)),
        "concat_and_cache_mla_rope_fused": lambda: (
            dict(positions=positions, q_pe=randn(TOKENS, 2, HEAD), k_pe=randn(TOKENS, HEAD),
                 kv_c=randn(TOKENS, 16), cos_sin_cache=_cache(), is_neox=True, slot_mapping=slots,
                 kv_cache=torch.zeros(2, 4, 16 + HEAD)), ("q_pe", "k_pe", "kv_cache")),
    }


COMPILED = ("apply_qk_to_cache", "fused_qk_norm_rope", "rotary_embedding")  # with a compiled fast path
ROUTES = [(name, route) for name in sorted(_calls()) for route in ("fast", "general")
          if route == "general" or name in COMPILED]


def _general_path(*args, **kwargs):
    raise AssertionError("the general path ran")


@contextlib.contextmanager
def _taking(route):
    """Calls take `route`: "general" (the fast paths off), or "fast" (the general paths fail)."""
    if route == "general":
        with general_path_only():
            yield
        return
    numpy_view(torch, torch.zeros(1))  # the compiled paths read tensors once torch is registered
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vllm, "_as_arrays", _general_path)
        yield


def _run(via, name, args):
    function = getattr(torch.ops.posenc_fast if via == "op" else vllm, name)
    return function(**args)


@pytest.mark.parametrize("via", ["function", "op"])
@pytest.mark.parametrize("name, route", ROUTES)
def test_each_written_tensor_counts_a_version(name, route, via):
    args, written = _calls()[name]()
    before = {key: t._version for key, t in args.items() if isinstance(t, torch.Tensor)}
    with _taking(route):
        _run(via, name, args)
    for key, version in before.items():
        assert (args[key]._version > version) == (key in written), key


def test_a_graph_that_saved_a_rotated_tensor_refuses_its_backward():
    # tanh saves its output: rotating it in place makes its gradient wrong, so autograd must refuse
    args, _ = _calls()["rotary_embedding"]()
    h = args["query"].clone().requires_grad_(True)
    args["query"] = torch.tanh(h)
    with torch.no_grad():
        vllm.rotary_embedding(**args)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        args["query"].sum().backward()


@pytest.mark.parametrize("via", ["function", "op"])
@pytest.mark.parametrize("name, route", ROUTES)
def test_an_inference_tensor_is_written_only_in_inference_mode(name, route, via):
    # the compiled path declines it, and the general path refuses it before its first check
    with torch.inference_mode():
        args, written = _calls()[name]()
    copies = {key: t.clone() for key, t in args.items() if isinstance(t, torch.Tensor)}
    with _taking(route), pytest.raises(ValueError, match=f"{written[0]} is an inference tensor"):
        _run(via, name, args)
    for key, copy in copies.items():  # nothing written
        assert torch.equal(args[key], copy), key
    with _taking(route), torch.inference_mode():
        _run(via, name, args)
    assert not all(torch.equal(args[key], copies[key]) for key in written)


def test_numpy_arrays_are_written_as_before():
    args, _ = _calls()["rotary_embedding"]()
    arrays = {key: t.numpy() if isinstance(t, torch.Tensor) else t for key, t in args.items()}
    query = arrays["query"].copy()
    vllm.rotary_embedding(**arrays)
    assert not np.array_equal(arrays["query"], query)
