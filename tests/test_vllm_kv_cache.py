"""posenc_fast.vllm.apply_qk_to_cache: its compiled path bit for bit its general path, on the q, k
and v a server holds and either cache layout; bad input refused by both with nothing written.

The rows themselves are checked against the embedding's method and the float64 reference in
test_kv_cache.py and test_qk_norm.py.
"""

import contextlib
import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import general_path_only, int64_inside, server_qkv, taking, untouched
from posenc_fast import vllm

BLOCKS, BLOCK_SIZE = 3, 4
BF16 = np.dtype(ml_dtypes.bfloat16)


def call_args(rng, layout, dtype, cache_dtype, kv_layout, tokens, normed, rot_dim=None, table_dtype=None):
    """A call's arguments after positions and query, key, value: (positions, q, k, v, kv, rest);
    kv holds the key and value caches (kv[0], kv[1]) as vLLM's CPU backend's one tensor, NaN."""
    heads, kv_heads, head_size = 3, 2, 16
    positions = rng.integers(0, 40, tokens)
    slots = rng.permutation(BLOCKS * BLOCK_SIZE)[:tokens]
    slots[rng.random(tokens) < 0.2] = -1
    rot_dim = rot_dim or 2 * int(rng.integers(1, head_size // 2 + 1))
    cos_sin = rng.standard_normal((40, rot_dim)).astype(table_dtype or dtype)
    query, key, value = server_qkv(rng, layout, dtype, tokens, heads, kv_heads, head_size)
    shape = ((BLOCKS, BLOCK_SIZE, kv_heads, head_size) if kv_layout == "NHD"
             else (BLOCKS, kv_heads, BLOCK_SIZE, head_size))
    kv = np.full((2,) + shape, np.nan, cache_dtype)
    weights = tuple(rng.standard_normal(head_size).astype(np.float32) for _ in range(2)) if normed else (None, None)
    rest = (slots, head_size, cos_sin, True, kv_layout, *weights)
    return positions, query, key, value, kv, rest


@given(seed=st.integers(0, 2**32 - 1), layout=st.sampled_from(["contiguous", "fused qkv", "padded"]),
       dtype=st.sampled_from(["float32", "float64", "bfloat16", "float16"]),
       half_cache=st.sampled_from([None, "bfloat16", "float16"]), kv_layout=st.sampled_from(["NHD", "HND"]),
       is_neox=st.booleans(), normed=st.booleans(), weight_offset=st.sampled_from([0.0, 1]),
       float32_table=st.booleans())
def test_the_compiled_path_equals_the_general_path_bitwise(seed, layout, dtype, half_cache, kv_layout, is_neox,
                                                           normed, weight_offset, float32_table):
    dtype = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    cache_dtype = np.dtype(getattr(ml_dtypes, half_cache, half_cache)) if half_cache and dtype == np.float32 else dtype
    rng = np.random.default_rng(seed)
    table_dtype = np.float32 if float32_table and dtype.itemsize == 2 else dtype
    positions, query, key, value, kv, rest = call_args(rng, layout, dtype, cache_dtype, kv_layout,
                                                       int(rng.integers(0, 6)), normed, table_dtype=table_dtype)
    rest = (*rest[:3], is_neox, *rest[4:], 1e-5, weight_offset)
    general_q, general_kv = query.copy(), kv.copy()
    with general_path_only():
        vllm.apply_qk_to_cache(positions, general_q, key, value, general_kv[0], general_kv[1], *rest)
    # the general path's checks fail if they run (NumPy gives an empty array strides 0: declined)
    with taking("fast") if positions.size else contextlib.nullcontext():
        vllm.apply_qk_to_cache(positions, query, key, value, kv[0], kv[1], *rest)
    assert untouched(general_q, query) and untouched(general_kv, kv)


@pytest.mark.parametrize("dtype, table_dtype, cache_dtype", [
    (np.float32, np.float32, np.float32), (np.float64, np.float64, np.float64), (np.float32, np.float32, BF16),
    (BF16, BF16, BF16), (BF16, np.float32, BF16), (np.float16, np.float32, np.float16)])
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_the_rows_are_rotary_embeddings(dtype, table_dtype, cache_dtype, kv_layout):
    # query as rotary_embedding rotates it (checked against the float64 reference in test_vllm.py),
    # each cached key row its rotated key (rounded to the cache dtype), each value row its value
    positions, query, key, value, kv, rest = call_args(np.random.default_rng(3), "fused qkv", dtype, cache_dtype,
                                                       kv_layout, 5, False, table_dtype=table_dtype)
    want_q, want_k = query.copy(), key.copy()
    vllm.rotary_embedding(positions, want_q, want_k, 16, rest[2], True)
    vllm.apply_qk_to_cache(positions, query, key, value, kv[0], kv[1], *rest)
    assert untouched(want_q, query)
    rows = [np.swapaxes(c, 1, 2) if kv_layout == "HND" else c for c in kv]
    rows = [c.reshape(BLOCKS * BLOCK_SIZE, 2, 16) for c in rows]
    for t, slot in enumerate(rest[0]):
        if slot >= 0:
            assert untouched(want_k[t].reshape(2, 16).astype(cache_dtype), rows[0][slot])
            assert untouched(value[t].reshape(2, 16).astype(cache_dtype), rows[1][slot])
    assert (rest[0] >= 0).sum() >= 3


def test_torch_tensors_take_the_compiled_path():
    torch = pytest.importorskip("torch")
    for normed in (False, True):
        positions, query, key, value, kv, rest = call_args(np.random.default_rng(1), "fused qkv", np.float32,
                                                           ml_dtypes.bfloat16, "HND", 5, normed)

        def tensors():  # the call's arguments as tensors; the written ones new each time
            t = torch.from_numpy
            kv_tensor = t(kv.view(np.int16).copy()).view(torch.bfloat16)
            return (t(positions), t(query.copy()), t(key), t(value), kv_tensor[0], kv_tensor[1], t(rest[0]),
                    rest[1], t(rest[2]), *rest[3:5], *(None if w is None else t(w) for w in rest[5:]))

        want, got = tensors(), tensors()
        with general_path_only():  # (its first tensor call also registers torch with the compiled glue)
            vllm.apply_qk_to_cache(*want)
        with taking("fast"):
            vllm.apply_qk_to_cache(*got)
        for w, g in zip(want[1:6], got[1:6]):
            assert torch.equal(w.view(torch.int16), g.view(torch.int16))
        assert not torch.equal(got[1], torch.from_numpy(query))


def test_weights_held_as_parameters():
    # a model's q_norm/k_norm weights are nn.Parameters that require grad: read as the tensors they are
    # under no_grad and inference_mode (by the compiled path), refused while autograd records
    torch = pytest.importorskip("torch")
    positions, query, key, value, kv, rest = call_args(np.random.default_rng(3), "fused qkv", np.float32,
                                                       np.float32, "NHD", 5, True)

    def call(weights):
        t = torch.from_numpy
        return (t(positions), t(query.copy()), t(key), t(value), t(kv[0].copy()), t(kv[1].copy()), t(rest[0]),
                rest[1], t(rest[2]), *rest[3:5], *weights)

    want = call([torch.from_numpy(w) for w in rest[5:]])
    vllm.apply_qk_to_cache(*want)
    parameters = [torch.nn.Parameter(torch.from_numpy(w.copy())) for w in rest[5:]]
    for mode in (torch.no_grad, torch.inference_mode):
        got = call(parameters)
        with mode(), taking("fast"):
            vllm.apply_qk_to_cache(*got)
        for w, g in zip(want[1:6], got[1:6]):
            assert torch.equal(w.view(torch.int32), g.view(torch.int32))  # bitwise (unused slots NaN)
    got = call(parameters)
    with pytest.raises(ValueError, match="q_weight requires grad"):
        vllm.apply_qk_to_cache(*got)
    assert torch.equal(got[1], torch.from_numpy(query))


def _swapped_positions(call):
    return (np.arange(5) * 2**56).astype(">i8")  # its bytes read as native: 0..4, rows of the table


def _query_holds_the_key_cache(call):
    memory = np.zeros(call["query"].size + call["key_cache"].size, np.float32)
    call["query"] = memory[:call["query"].size].reshape(call["query"].shape)
    return memory[call["query"].size - 8:][:call["key_cache"].size].reshape(call["key_cache"].shape)


def _table_holds_the_value_cache(call):
    table, cache = call["cos_sin_cache"], call["value_cache"]
    memory = np.zeros(table.size + cache.size, table.dtype)
    call["cos_sin_cache"] = memory[:table.size].reshape(table.shape)
    call["cos_sin_cache"][...] = table
    return memory[table.size - 8:][:cache.size].reshape(cache.shape)


def _index_in_query(name):
    """The call's `name` (positions or slot_mapping, valid values) written into query's memory."""
    return lambda call: int64_inside(call["query"], call[name])


def _int32_slots_in(name):
    """The call's slots as int32 in `name`'s first bytes (the compiled walk reads an int64 copy, the
    caller's slots are still overwritten)."""
    def place(call):
        inside = call[name].reshape(-1)[:5].view(np.int32)
        inside[:] = call["slot_mapping"]
        return inside
    return place


def _slots_in_a_column_of_query(call):
    column = call["query"].view(np.int64)[:, -1]
    column[:] = call["slot_mapping"]
    return column


# name: (change to a valid call: a value, or a function of the call; error; message)
BAD = {
    "positions inside query": (dict(positions=_index_in_query("positions")), ValueError,
                               "positions shares memory with query"),
    "slots inside query": (dict(slot_mapping=_index_in_query("slot_mapping")), ValueError,
                           "slot_mapping shares memory with query"),
    "int32 slots inside the key cache": (dict(slot_mapping=_int32_slots_in("key_cache")), ValueError,
                                         "key_cache shares memory with slot_mapping"),
    "int32 slots inside query": (dict(slot_mapping=_int32_slots_in("query")), ValueError,
                                 "slot_mapping shares memory with query"),
    "slots in a column of query": (dict(slot_mapping=_slots_in_a_column_of_query), ValueError,
                                   "slot_mapping shares memory with query"),
    "head_size past int64": (dict(head_size=2**70), ValueError, "head_size = 1180591620717411303424"),
    "position past the table": (dict(positions=lambda c: np.where(np.arange(5) == 2, 40, c["positions"])),
                                ValueError, "positions must lie in [0, 40)"),
    "byte-swapped position past the table": (dict(positions=_swapped_positions), ValueError,
                                             "positions must lie in [0, 40)"),
    "a slot twice": (dict(slot_mapping=np.array([1, 1, 2, 3, 4])), ValueError, "uses slot 1 more than once"),
    "a slot past the cache": (dict(slot_mapping=np.array([0, 1, 2, 3, 12])), ValueError,
                              "slot_mapping must hold -1 (skip the token) or slots in [0, 12)"),
    "slots of another shape": (dict(slot_mapping=np.arange(4)), ValueError, "slot_mapping must have"),
    "one cache for keys and values": (dict(value_cache=lambda c: c["key_cache"]), ValueError,
                                      "key_cache and value_cache share memory"),
    "the key cache inside query": (dict(key_cache=_query_holds_the_key_cache), ValueError,
                                   "key_cache shares memory with query, which the call reads"),
    "the value cache inside the table": (dict(value_cache=_table_holds_the_value_cache), ValueError,
                                         "value_cache shares memory with cos_sin_cache, which the call reads"),
    "the value inside query": (dict(value=lambda c: c["query"][:, :32]), ValueError,
                               "query and value share memory"),
    "the key inside query": (dict(key=lambda c: c["query"][:, 16:48]), ValueError, "query and key share memory"),
    "the table inside query": (dict(positions=np.arange(5), cos_sin_cache=lambda c: c["query"][:, :8]),
                               ValueError, "query shares memory with cos_sin_cache"),
    "a float64 cache": (dict(key_cache=lambda c: c["key_cache"].astype(np.float64),
                             value_cache=lambda c: c["value_cache"].astype(np.float64)), TypeError,
                        "the caches must have query's dtype float32"),
    "caches of two dtypes": (dict(value_cache=lambda c: c["value_cache"].astype(np.float16)), TypeError,
                             "value_cache must have key_cache's dtype"),
    "a read-only query": (dict(query=lambda c: _read_only(c["query"])), ValueError, "query must be writeable"),
    "a read-only cache": (dict(key_cache=lambda c: _read_only(c["key_cache"])),
                          ValueError, "key_cache must be writeable"),
    "caches the layout does not fit": (dict(kv_cache_layout="HND"), ValueError, "key_cache must have shape"),
    "a layout in lower case": (dict(kv_cache_layout="nhd"), ValueError, "kv_cache_layout must be one of"),
    "a float64 table for float32 data": (dict(cos_sin_cache=lambda c: c["cos_sin_cache"].astype(np.float64)),
                                         TypeError, "cos_sin_cache must have query's dtype float32,"),
    "a key of another dtype": (dict(key=lambda c: c["key"].astype(np.float64)), TypeError, "one dtype"),
    "values of other heads": (dict(value=lambda c: c["value"][:, :16]), ValueError, "key and value must have shape"),
    "q_weight alone": (dict(k_weight=None), TypeError, "pass both q_weight and k_weight"),
    "a weight of another size": (dict(k_weight=np.ones(15)), ValueError, "k_weight must have shape"),
    "a negative eps": (dict(eps=-1e-6), ValueError, "eps"),
    "a negative eps without weights": (dict(q_weight=None, k_weight=None, eps=-1e-6), ValueError, "eps must be >= 0"),
    "a text weight_offset without weights": (dict(q_weight=None, k_weight=None, weight_offset="1"), TypeError,
                                             "weight_offset"),
    "head_size a float": (dict(head_size=16.0), TypeError, "head_size must be an integer"),
    "is_neox a string": (dict(is_neox="neox"), TypeError, "is_neox must be a bool"),
}


def _read_only(a):
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_refused_with_nothing_written(case):
    change, error, words = BAD[case]
    positions, query, key, value, kv, rest = call_args(np.random.default_rng(2), "fused qkv", np.float32,
                                                       np.float32, "NHD", 5, True, rot_dim=8)
    call = dict(positions=positions, query=query.copy(), key=key, value=value, key_cache=kv[0], value_cache=kv[1],
                slot_mapping=np.arange(5), head_size=16, cos_sin_cache=rest[2], is_neox=True,
                kv_cache_layout="NHD", q_weight=rest[5], k_weight=rest[6], eps=1e-6)
    for name, value in change.items():
        call[name] = value(call) if callable(value) else value
    written = ("query", "key_cache", "value_cache")
    before = [np.array(call[name], copy=True) for name in written]
    assert vllm.kernels.fast_paths_enabled()  # the compiled path must decline it too
    with pytest.raises(error, match=re.escape(words)):
        vllm.apply_qk_to_cache(**call)
    for name, a in zip(written, before):
        assert untouched(a, np.asarray(call[name])), f"{name} was written"


@pytest.mark.parametrize("form", ["Fortran order", "every other column", "reversed halves"])
def test_a_cos_sin_cache_of_any_strides_writes_what_a_contiguous_one_does(form):
    # its cos/sin halves were handed to the kernel as views stepping along their rows: the kernel read
    # them as contiguous (q and the cache rows off by up to 6; reversed: past the buffer)
    positions, query, key, value, kv, rest = call_args(np.random.default_rng(5), "contiguous", np.float32,
                                                       np.float32, "NHD", 5, True, rot_dim=8)
    cache = rest[2]
    strided = {"Fortran order": lambda c: np.asfortranarray(c),
               "every other column": lambda c: np.repeat(c, 2, axis=1)[:, ::2],
               "reversed halves": lambda c: c[:, ::-1].copy()[:, ::-1]}[form](cache)
    assert np.array_equal(strided, cache) and strided.strides != cache.strides
    results = []
    for table in (cache, strided):
        q, k_cache, v_cache = query.copy(), kv[0].copy(), kv[1].copy()
        vllm.apply_qk_to_cache(positions, q, key, value, k_cache, v_cache, np.arange(5), 16, table, True)
        results.append((q, k_cache, v_cache))
    assert all(untouched(a, b) for a, b in zip(*results))


def test_the_kernel_refuses_tables_it_would_misread():
    from posenc_fast._dispatch import kernels

    positions, query, key, value, kv, rest = call_args(np.random.default_rng(5), "contiguous", np.float32,
                                                       np.float32, "NHD", 5, True, rot_dim=8)
    cos = np.asfortranarray(rest[2][:, :4])
    q = query.reshape(5, -1, 16)
    with pytest.raises(ValueError, match="cos/sin tables must be 2-D of one dtype and width, each row contiguous"):
        kernels.rotate_into_kv_cache(q, q.copy(), key.reshape(5, -1, 16), value.reshape(5, -1, 16), kv[0], kv[1],
                                     np.arange(5), positions.astype(np.int64), cos, cos, True, 0)
