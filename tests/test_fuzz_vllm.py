"""Fuzz the vLLM-style functions: their compiled paths against their general paths.

Each of `rotary_embedding`, `fused_qk_norm_rope` and `apply_qk_to_cache` is
called twice on the same drawn arguments (what a server passes, drawn with
now and then another dtype, shape or value, and with each odd case of
`ODD` in turn: strides, overlaps, slots, positions, weights), once as it is
and once with every fast path off.  The two calls must agree:
both raise a TypeError or ValueError, nothing written; or both succeed,
writing the same bits.  Never a crash, another exception or an escaping
warning.  The general paths are checked against the float64 reference in
test_vllm.py, test_kv_cache.py and test_qk_norm.py.
"""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzzing import EXAMPLES, FUZZ, agree, choose
from helpers import server_qkv
from posenc_fast import vllm

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64), "float16": np.dtype(np.float16),
          "bfloat16": BF16, ">f4": np.dtype(">f4"), "int32": np.dtype(np.int32)}
BLOCKS, BLOCK_SIZE, MAX_POSITION = 3, 4, 24
ODD = [None, "read-only query", "reversed query", "expanded query", "fortran key", "table inside query",
       "value inside query", "key inside query", "one cache for both", "a slot twice", "slot past the cache",
       "position past the table", "negative position", "float positions", "byte-swapped positions",
       "strided positions", "2-D positions", "positions as a list", "weights of another size", "one weight",
       "eps negative", "read-only cache", "cache of 3 axes"]
EACH = settings(FUZZ, max_examples=max(EXAMPLES // 4, 10))  # per odd case


@st.composite
def calls(draw, odd):
    """What one call is made of: every choice, so that `build` makes the same arguments again."""
    return dict(
        odd=odd, seed=draw(st.integers(0, 2**32 - 1)),
        tokens=draw(st.integers(0, 5)), heads=draw(st.integers(1, 3)), kv_heads=draw(st.integers(1, 2)),
        head_size=draw(choose([8, 8, 16, 6], [2, 0, 5, -2, 8.0, True, "8"])),
        layout=draw(st.sampled_from(["contiguous", "fused qkv", "padded"])),
        dtype=draw(choose(["float32", "float64", "bfloat16", "float16"], [">f4", "int32"])),
        table=draw(choose(["data", "data", "float32"], ["float64"])),
        cache=draw(choose(["data", "data", "bfloat16", "float16"], ["float64"])),
        rot_dim=draw(choose([2, 4, 6], [8, 3, 0, 10, 18])),
        is_neox=draw(choose([True, False], [1, "yes", None])),
        offset=draw(choose([0, 0, 2], [-1, 7, 2.0])), inverse=draw(choose([False, True], [0, "no"])),
        kv_layout=draw(choose(["NHD", "HND"], ["nhd", None, 2])),
        normed=draw(st.booleans()), eps=draw(choose([1e-6, 0.0, 1], [float("nan"), float("inf"), "1e-6"])),
        weight_offset=draw(choose([0.0, 1.0, 1], [float("nan"), None])))


def build(c):
    """The arguments of call `c`, made afresh (the same bits each time)."""
    rng = np.random.default_rng(c["seed"])
    odd, dtype = c["odd"], DTYPES[c["dtype"]]
    hs = c["head_size"] if type(c["head_size"]) is int and c["head_size"] > 0 else 8
    query, key, value = server_qkv(rng, c["layout"], dtype, c["tokens"], c["heads"], c["kv_heads"], hs)
    table_dtype = dtype if c["table"] == "data" else DTYPES[c["table"]]
    table = rng.standard_normal((MAX_POSITION, c["rot_dim"])).astype(table_dtype)
    positions = rng.integers(0, MAX_POSITION, c["tokens"])
    cache_dtype = DTYPES[c["cache"]] if c["cache"] != "data" else dtype if dtype.kind == "f" else np.float32
    shape = ((BLOCKS, BLOCK_SIZE, c["kv_heads"], hs) if c["kv_layout"] != "HND"
             else (BLOCKS, c["kv_heads"], BLOCK_SIZE, hs))
    kv = np.full((2,) + shape, np.nan, cache_dtype)
    slots = rng.permutation(BLOCKS * BLOCK_SIZE)[:c["tokens"]]
    weights = [rng.standard_normal(hs).astype(np.float32) for _ in range(2)]
    a = dict(positions=positions, query=query, key=key, value=value, key_cache=kv[0], value_cache=kv[1],
             slot_mapping=slots, cos_sin_cache=table, weights=weights)
    flat_query = query.reshape(c["tokens"], -1) if query.size else query
    changes = {
        "read-only query": lambda: query.setflags(write=False),
        "reversed query": lambda: a.update(query=query[::-1]),
        "expanded query": lambda: a.update(query=np.broadcast_to(query[:1], query.shape)),
        "fortran key": lambda: a.update(key=np.asfortranarray(key)),
        "table inside query": lambda: a.update(cos_sin_cache=flat_query[:, :c["rot_dim"]],
                                               positions=np.arange(c["tokens"])),
        "value inside query": lambda: a.update(value=flat_query[:, :value.shape[-1]]),
        "key inside query": lambda: a.update(key=flat_query[:, -key.shape[-1]:]),
        "one cache for both": lambda: a.update(value_cache=kv[0]),
        "a slot twice": lambda: slots.__setitem__(slice(None), slots[0]),
        "slot past the cache": lambda: slots.__setitem__(-1, BLOCKS * BLOCK_SIZE),
        "position past the table": lambda: positions.__setitem__(-1, MAX_POSITION),
        "negative position": lambda: positions.__setitem__(0, -1),
        "float positions": lambda: a.update(positions=positions.astype(np.float64)),
        "byte-swapped positions": lambda: a.update(positions=positions.astype(">i8")),
        "strided positions": lambda: a.update(positions=np.repeat(positions, 2)[::2]),
        "2-D positions": lambda: a.update(positions=positions[None]),
        "positions as a list": lambda: a.update(positions=positions.tolist()),
        "weights of another size": lambda: a.update(weights=[weights[0], weights[1][:-1]]),
        "one weight": lambda: a.update(weights=[weights[0], None]),
        "eps negative": lambda: c.update(eps=-1e-6),
        "read-only cache": lambda: a["key_cache"].setflags(write=False),
        "cache of 3 axes": lambda: a.update(key_cache=kv[0].reshape(kv[0].shape[0], -1, hs)),
    }
    if odd is not None and (query.size or odd in ("eps negative", "one weight")):
        changes[odd]()
    return a


# name: (call, the arrays of `build`) -> (the function's arguments, the arrays it may write)
ARGUMENTS = {
    "rotary_embedding": lambda c, a: (
        (a["positions"], a["query"], None if c["normed"] else a["key"],  # half the calls without a key
         c["head_size"], a["cos_sin_cache"], c["is_neox"], c["offset"], c["inverse"]), (a["query"], a["key"])),
    "fused_qk_norm_rope": lambda c, a: (
        (a["positions"], a["query"], a["key"], *a["weights"], c["head_size"], a["cos_sin_cache"], c["is_neox"],
         c["eps"], c["weight_offset"]), (a["query"], a["key"])),
    "apply_qk_to_cache": lambda c, a: (
        (a["positions"], a["query"], a["key"], a["value"], a["key_cache"], a["value_cache"], a["slot_mapping"],
         c["head_size"], a["cos_sin_cache"], c["is_neox"], c["kv_layout"],
         *(a["weights"] if c["normed"] else (None, None)), c["eps"], c["weight_offset"]),
        (a["query"], a["key_cache"], a["value_cache"])),
}


@pytest.mark.parametrize("name", sorted(ARGUMENTS))
@pytest.mark.parametrize("odd", ODD)
@EACH
@given(data=st.data())
def test_the_compiled_path_agrees_with_the_general_path(name, odd, data):
    c = data.draw(calls(odd))
    agree(getattr(vllm, name), lambda: ARGUMENTS[name](c, build(c)))
