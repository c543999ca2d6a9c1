"""Fuzz vLLM's MLA cache writes: their compiled path against their general path.

`concat_and_cache_mla` and `concat_and_cache_mla_rope_fused` are called
twice on the same drawn arguments (what a server passes -- q_pe a slice of
the query, kv_c and k_pe the two parts of one latent projection, caches of
padded rows or with their axes swapped -- now and then another dtype, shape
or value, and each odd case of `ODD` in turn), once as they are and once with
every fast path off (`fuzzing.agree`): both raise a TypeError or ValueError
with nothing written, or both write the same bits.  The general path is
checked against the float64 reference in test_vllm_mla.py.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzzing import EXAMPLES, FUZZ, agree, choose
from helpers import int64_inside
from posenc_fast import vllm
from test_fuzz_vllm import DTYPES

BLOCKS, BLOCK_SIZE, MAX_POSITION = 3, 4, 24
ODD = [None, "a slot twice", "slot past the cache", "int32 slots", "position past the table",
       "kv_c inside k_pe", "kv_c inside q_pe", "kv_c over the cache", "slots inside k_pe",
       "positions inside q_pe", "table inside the cache", "read-only cache", "expanded cache", "cache of 4 axes",
       "cache a row too wide", "byte-swapped k_pe", "reversed kv_c", "k_pe of another dtype"]
EACH = settings(FUZZ, max_examples=max(EXAMPLES // 6, 8))  # per odd case


@st.composite
def calls(draw, odd):
    """What one call is made of: every choice, so that `build` makes the same arguments again."""
    return dict(
        odd=odd, seed=draw(st.integers(0, 2**32 - 1)), tokens=draw(st.integers(0, 5)),
        heads=draw(st.integers(1, 3)), rank=draw(st.sampled_from([0, 4, 6])),
        rot_dim=draw(choose([4, 8], [3, 0])),
        dtype=draw(choose(["float32", "float64", "bfloat16", "float16"], [">f4", "int32"])),
        table=draw(choose(["data", "float32"], ["float64"])),
        layout=draw(st.sampled_from(["contiguous", "server"])),
        cache=draw(st.sampled_from(["plain", "padded rows", "swapped axes"])),
        k_axes=draw(st.sampled_from([2, 3])), is_neox=draw(choose([True, False], [1, None])),
        kv_cache_dtype=draw(choose(["auto"], ["fp8", None])))


def build(c):
    """The arguments of call `c` as a dict, made afresh (the same bits each time)."""
    rng = np.random.default_rng(c["seed"])
    dtype, t, rank, rot = DTYPES[c["dtype"]], c["tokens"], c["rank"], max(c["rot_dim"], 0)

    def data(shape):
        return rng.standard_normal(shape).astype(dtype)

    if c["layout"] == "server":
        q_pe = data((t, c["heads"], 5 + rot))[..., 5:]
        latent = data((t, rot + rank))
        k_pe, kv_c = latent[:, :rot], latent[:, rot:]
    else:
        q_pe, k_pe, kv_c = data((t, c["heads"], rot)), data((t, rot)), data((t, rank))
    if c["k_axes"] == 3:
        k_pe = k_pe[:, None]
    entry, fill = rank + rot, np.nan if dtype.kind == "f" else 0
    if c["cache"] == "padded rows":
        kv_cache = np.full((BLOCKS, BLOCK_SIZE, entry + 3), fill, dtype)[..., :entry]
    elif c["cache"] == "swapped axes":
        kv_cache = np.full((BLOCK_SIZE, BLOCKS, entry), fill, dtype).transpose(1, 0, 2)
    else:
        kv_cache = np.full((BLOCKS, BLOCK_SIZE, entry), fill, dtype)
    table_dtype = dtype if c["table"] == "data" or dtype.kind != "f" else DTYPES[c["table"]]
    a = dict(positions=rng.integers(0, MAX_POSITION, t), q_pe=q_pe, k_pe=k_pe, kv_c=kv_c,
             cos_sin_cache=rng.standard_normal((MAX_POSITION, c["rot_dim"] if c["rot_dim"] > 0 else 4))
             .astype(table_dtype), slot_mapping=rng.permutation(BLOCKS * BLOCK_SIZE)[:t], kv_cache=kv_cache)
    if t:
        a["slot_mapping"][-1] = -1 if t > 2 else a["slot_mapping"][-1]  # a token skipped
    changes = {
        "a slot twice": lambda: a["slot_mapping"].__setitem__(slice(None), a["slot_mapping"][0]),
        "slot past the cache": lambda: a["slot_mapping"].__setitem__(0, BLOCKS * BLOCK_SIZE),
        "int32 slots": lambda: a.update(slot_mapping=a["slot_mapping"].astype(np.int32)),
        "position past the table": lambda: a["positions"].__setitem__(-1, MAX_POSITION),
        "kv_c inside k_pe": lambda: a.update(kv_c=a["k_pe"].reshape(t, -1)[:, :rank]),
        "kv_c inside q_pe": lambda: a.update(kv_c=a["q_pe"].reshape(t, -1)[:, :rank]),
        "kv_c over the cache": lambda: a.update(kv_c=kv_cache.reshape(-1, kv_cache.shape[-1])[:t, :rank]),
        "slots inside k_pe": lambda: a.update(slot_mapping=int64_inside(a["k_pe"], a["slot_mapping"])),
        "positions inside q_pe": lambda: a.update(positions=int64_inside(a["q_pe"], a["positions"])),
        "table inside the cache": lambda: a.update(cos_sin_cache=kv_cache[0, :, :a["cos_sin_cache"].shape[1]],
                                                   positions=np.zeros(t, np.int64)),
        "read-only cache": lambda: kv_cache.setflags(write=False),
        "expanded cache": lambda: a.update(kv_cache=np.broadcast_to(kv_cache[:1], kv_cache.shape)),
        "cache of 4 axes": lambda: a.update(kv_cache=kv_cache[:, :, None]),
        "cache a row too wide": lambda: a.update(kv_cache=np.zeros((BLOCKS, BLOCK_SIZE, entry + 1), dtype)),
        "byte-swapped k_pe": lambda: a.update(k_pe=a["k_pe"].astype(a["k_pe"].dtype.newbyteorder())),
        "reversed kv_c": lambda: a.update(kv_c=a["kv_c"][::-1]),
        "k_pe of another dtype": lambda: a.update(k_pe=a["k_pe"].astype(np.float64 if dtype.itemsize != 8
                                                                       else np.float32)),
    }
    if c["odd"] is not None and t and q_pe.size and k_pe.size and kv_c.size:
        try:
            changes[c["odd"]]()
        except ValueError:  # a view the drawn shapes cannot give (int64 slots inside 2-byte rows)
            pass
    return a


# name: (call, the arrays of `build`) -> (the function's arguments, the arrays it may write)
ARGUMENTS = {
    "concat_and_cache_mla": lambda c, a: (
        (a["kv_c"], a["k_pe"], a["kv_cache"], a["slot_mapping"], c["kv_cache_dtype"]), (a["kv_cache"],)),
    "concat_and_cache_mla_rope_fused": lambda c, a: (
        (a["positions"], a["q_pe"], a["k_pe"], a["kv_c"], a["cos_sin_cache"], c["is_neox"], a["slot_mapping"],
         a["kv_cache"], c["kv_cache_dtype"]), (a["q_pe"], a["k_pe"], a["kv_cache"])),
}


@pytest.mark.parametrize("name", sorted(ARGUMENTS))
@pytest.mark.parametrize("odd", ODD)
@EACH
@given(data=st.data())
def test_the_compiled_path_agrees_with_the_general_path(name, odd, data):
    c = data.draw(calls(odd))
    agree(getattr(vllm, name), lambda: ARGUMENTS[name](c, build(c)))
