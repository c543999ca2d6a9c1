"""vLLM's MLA cache writes: `concat_and_cache_mla` and `concat_and_cache_mla_rope_fused`.

The cases of vLLM's ``tests/kernels/core/test_rotary_embedding_mla_cache_fused.py``
(dtypes, both pair layouts, 11 and 42 tokens, rope dims 64 and 128, 128 query
heads, kv_lora_rank 512, block sizes 16, 1024 and 16384): the rotation against
a float64 reference and bitwise against `rotary_embedding` on copies, each
token's cache row bitwise ``[kv_c | rotated k_pe]``, every other row untouched.
The compiled path (``_core.mla_to_cache_fast``) bitwise against the general
path, and declining, with nothing written, every call the general path refuses.
"""

import ml_dtypes
import numpy as np
import pytest

from posenc_fast import reference, vllm
from posenc_fast._dispatch import kernels
from helpers import general_path_only, int64_inside, untouched

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"float16": np.dtype(np.float16), "bfloat16": BF16, "float32": np.dtype(np.float32)}


def vllm_cache(rot_dim, max_position=8192, base=10000.0, dtype=np.float32):
    """vLLM's RotaryEmbedding.cos_sin_cache: [cos | sin] of float32 angles, cast to `dtype`."""
    inv_freq = (1.0 / base ** (np.arange(0, rot_dim, 2, dtype=np.float32) / rot_dim)).astype(np.float32)
    freqs = np.arange(max_position, dtype=np.float32)[:, None] * inv_freq
    return np.concatenate((np.cos(freqs), np.sin(freqs)), -1).astype(dtype)


def mla_case(dtype, seq_len, rot_dim, heads=128, rank=512, num_blocks=64, block_size=16, seed=0):
    rng = np.random.default_rng(seed)
    positions = rng.integers(0, 8192, seq_len)
    query = rng.standard_normal((seq_len, heads, rot_dim)).astype(dtype)
    key = rng.standard_normal((seq_len, 1, rot_dim + rank)).astype(dtype)
    k_pe, kv_c = key[..., :rot_dim].reshape(seq_len, rot_dim), key[..., rot_dim:].reshape(seq_len, rank)
    slots = rng.choice(num_blocks * block_size, seq_len, replace=False)
    kv_cache = np.full((num_blocks, block_size, rank + rot_dim), np.nan, dtype)
    return positions, query, k_pe.copy(), kv_c.copy(), slots, kv_cache


@pytest.mark.parametrize("block_size", [16, 1024, 16384])
@pytest.mark.parametrize("rot_dim", [64, 128])
@pytest.mark.parametrize("seq_len", [11, 42])
@pytest.mark.parametrize("is_neox", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_vllms_cases(dtype, is_neox, seq_len, rot_dim, block_size):
    dtype = DTYPES[dtype]
    # vLLM's 64 blocks of 16384 rows hold 600M entries; 2 blocks are enough for 42 tokens
    positions, query, k_pe, kv_c, slots, kv_cache = mla_case(dtype, seq_len, rot_dim,
                                                             num_blocks=2 if block_size == 16384 else 64,
                                                             block_size=block_size)
    cache = vllm_cache(rot_dim, dtype=dtype)
    want_q, want_k = query.copy(), k_pe.copy()
    vllm.rotary_embedding(positions, want_q, want_k, rot_dim, cache, is_neox)
    before = kv_cache.copy()
    q_before, k_before, kv_c_before = query.copy(), k_pe.copy(), kv_c.copy()
    vllm.concat_and_cache_mla_rope_fused(positions, query, k_pe, kv_c, cache, is_neox, slots, kv_cache, "auto",
                                         np.float32(0.1))
    assert untouched(want_q, query) and untouched(want_k, k_pe) and untouched(kv_c_before, kv_c)
    # the rotation against float64, to float32's rounding (half types: one rounding more)
    layout = "half" if is_neox else "interleaved"
    c64 = cache.astype(np.float64)
    for got, x in ((query, q_before), (k_pe, k_before)):
        exact = reference.apply_rotary_cos_sin(x.astype(np.float64), c64[:, :rot_dim // 2], c64[:, rot_dim // 2:],
                                               positions.reshape((-1,) + (1,) * (x.ndim - 2)), layout=layout)
        tolerance = 4 * float(ml_dtypes.finfo(dtype).eps) * np.abs(x.astype(np.float64)).max()
        np.testing.assert_allclose(got.astype(np.float64), exact, rtol=0, atol=tolerance)
    rows = kv_cache.reshape(-1, kv_cache.shape[-1])
    for t, slot in enumerate(slots):
        assert untouched(np.concatenate((kv_c[t], k_pe[t])), rows[slot])
    others = np.ones(len(rows), bool)
    others[slots] = False
    assert untouched(before.reshape(len(rows), -1)[others], rows[others])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, BF16])
def test_float32_cache_for_half_data_and_the_write_alone(dtype):
    positions, query, k_pe, kv_c, slots, kv_cache = mla_case(np.dtype(dtype), 5, 64, heads=4, rank=32,
                                                             num_blocks=3)
    slots[2] = -1  # skipped: its row stays as it was
    cache = vllm_cache(64, dtype=np.float32 if np.dtype(dtype).itemsize == 2 else dtype)
    copy = kv_cache.copy()
    k_rot = k_pe.copy()
    vllm.rotary_embedding(positions, query.copy(), k_rot, 64, cache, False)
    vllm.concat_and_cache_mla(kv_c, k_rot[:, None], copy, slots)  # (tokens, 1, pe_dim) too
    vllm.concat_and_cache_mla_rope_fused(positions, query, k_pe, kv_c, cache, False, slots, kv_cache)
    assert untouched(copy, kv_cache)
    assert np.isnan(kv_cache.reshape(-1, 96)[np.setdiff1d(np.arange(48), slots[slots >= 0])]).all()


def test_q_pe_as_a_slice_of_the_query():
    # vLLM hands q[..., qk_nope_head_dim:] of (tokens, heads, nope + rope)
    positions, query, k_pe, kv_c, slots, kv_cache = mla_case(np.float32, 6, 64, heads=8, rank=32)
    q = np.random.default_rng(1).standard_normal((6, 8, 128 + 64)).astype(np.float32)
    nope = q[..., :128].copy()
    want = np.ascontiguousarray(q[..., 128:])
    cache = vllm_cache(64)
    vllm.rotary_embedding(positions, want, None, 64, cache, True)
    vllm.concat_and_cache_mla_rope_fused(positions, q[..., 128:], k_pe, kv_c, cache, True, slots, kv_cache)
    assert untouched(want, q[..., 128:]) and untouched(nope, q[..., :128])


def _bad(case):
    positions, query, k_pe, kv_c, slots, kv_cache = case
    cache = vllm_cache(64)
    return dict(positions=positions, q_pe=query, k_pe=k_pe, kv_c=kv_c, cos_sin_cache=cache, is_neox=True,
                slot_mapping=slots, kv_cache=kv_cache)


@pytest.mark.parametrize("change, error, match", [
    (dict(kv_cache_dtype="fp8"), ValueError, "writes no quantized"),
    (dict(slot_mapping=np.array([0, 0, 1, 2])), ValueError, "more than once"),
    (dict(slot_mapping=np.array([0, 1, 2, 10**6])), ValueError, "slot_mapping must hold -1"),
    (dict(kv_c=np.zeros((4, 31), np.float32)), ValueError, "kv_lora_rank \\+ pe_dim = 95"),
    (dict(kv_c=np.zeros((3, 32), np.float32)), ValueError, "k_pe must have shape"),
    (dict(kv_c=np.zeros((4, 32), np.float64)), TypeError, "k_pe must have kv_c's dtype"),
    (dict(positions=np.array([0, 1, 2, 9000])), ValueError, "positions"),
    (dict(k_pe=np.zeros((4, 32), np.float32), kv_c=np.zeros((4, 64), np.float32)), ValueError,
     "k_pe must have rot_dim"),
    (dict(kv_cache=np.zeros((2, 16, 96), np.float64)), TypeError, "kv_cache must have kv_c's dtype"),
    (dict(kv_cache=[[0.0]]), TypeError, "kv_cache must be a numpy.ndarray"),
    (dict(q_pe=np.zeros((4, 2, 64), np.float64)), TypeError, "k_pe must have q_pe's dtype float64"),
    (dict(q_pe=np.zeros((4, 2, 32), np.float32)), ValueError, "q_pe must have shape"),
    (dict(cos_sin_cache=np.zeros(64, np.float32)), ValueError, "cos_sin_cache must have shape \\(max_position, rot_dim\\)"),
    (dict(kv_cache=np.lib.stride_tricks.as_strided(np.zeros((16, 96), np.float32), (64, 16, 96), (0, 384, 4))),
     ValueError, "kv_cache of strides \\(0, 384, 4\\) has entries that share memory"),
])
def test_bad_input_writes_nothing(change, error, match):
    args = _bad(mla_case(np.float32, 4, 64, heads=2, rank=32))
    args.update(change)
    before = {name: np.array(a, copy=True) for name, a in args.items() if isinstance(a, np.ndarray)}
    assert kernels.mla_to_cache_fast(**{"kv_cache_dtype": "auto", **args}) is False
    with pytest.raises(error, match=match):
        vllm.concat_and_cache_mla_rope_fused(**args)
    for name, a in args.items():
        if isinstance(a, np.ndarray):
            assert untouched(before[name], a), name


@pytest.mark.parametrize("index", ["positions", "slot_mapping"])
@pytest.mark.parametrize("holder", ["q_pe", "k_pe"])
def test_indices_inside_a_rotated_input_are_refused(index, holder):
    # the rotation would change them before they are read (slots: a write past the cache)
    args = _bad(mla_case(np.float32, 4, 64, heads=2, rank=32))
    args[index] = int64_inside(args[holder], args[index])
    before = {name: np.array(a, copy=True) for name, a in args.items() if isinstance(a, np.ndarray)}
    assert kernels.mla_to_cache_fast(**args, kv_cache_dtype="auto") is False
    with pytest.raises(ValueError, match=f"{index} shares memory with {holder}"):
        vllm.concat_and_cache_mla_rope_fused(**args)
    for name, a in args.items():
        if isinstance(a, np.ndarray):
            assert untouched(before[name], a), name


@pytest.mark.parametrize("fused", [False, True])
def test_int32_slots_inside_the_cache_are_refused(fused):
    # the write reads an int64 copy of them, but would still overwrite the caller's slots
    positions, q_pe, k_pe, kv_c, slots, kv_cache = mla_case(np.float32, 4, 64, heads=2, rank=32)
    inside = kv_cache.reshape(-1)[:slots.size].view(np.int32)
    inside[:] = slots
    before = kv_cache.copy()
    with pytest.raises(ValueError, match="kv_cache shares memory with kv_c, k_pe or slot_mapping"):
        if fused:
            table = np.ones((64, k_pe.shape[-1]), np.float32)
            vllm.concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, table, True, inside, kv_cache)
        else:
            vllm.concat_and_cache_mla(kv_c, k_pe, kv_cache, inside)
    assert untouched(before, kv_cache)


def test_the_write_takes_either_byte_order():
    # only what is rotated in place must be native; the write converts what it copies
    positions, query, k_pe, kv_c, slots, kv_cache = mla_case(np.float32, 4, 64, heads=2, rank=32)
    want = kv_cache.copy()
    vllm.concat_and_cache_mla(kv_c, k_pe, want, slots)
    swapped = kv_cache.astype(">f4")
    vllm.concat_and_cache_mla(kv_c.astype(">f4"), k_pe.astype(">f4"), swapped, slots)
    assert swapped.astype(np.float32).tobytes() == want.tobytes()
    with pytest.raises(ValueError, match="k_pe must be in native byte order to be rotated in place"):
        vllm.concat_and_cache_mla_rope_fused(positions, query, k_pe.astype(">f4"), kv_c, vllm_cache(64), True,
                                             slots, kv_cache)


@pytest.mark.parametrize("holder", ["q_pe", "k_pe"])
def test_a_latent_inside_a_rotated_input_is_refused(holder):
    # the rotation would change kv_c before it is written to the cache
    args = _bad(mla_case(np.float32, 4, 64, heads=2, rank=32))
    args["kv_c"] = args[holder].reshape(4, -1)[:, :32]
    before = {name: np.array(a, copy=True) for name, a in args.items() if isinstance(a, np.ndarray)}
    assert kernels.mla_to_cache_fast(**args, kv_cache_dtype="auto") is False
    with pytest.raises(ValueError, match="kv_c shares memory with q_pe or k_pe"):
        vllm.concat_and_cache_mla_rope_fused(**args)
    for name, a in args.items():
        if isinstance(a, np.ndarray):
            assert untouched(before[name], a), name


def server_case(dtype, layout, tokens=9, heads=3, rot_dim=16, rank=24, num_blocks=4, block_size=8):
    """An MLA call as `_bad`'s: "contiguous" arrays, or "slices" as a server holds them: q_pe and
    k_pe the rope parts of fused projections, kv_c beside k_pe, a cache of padded rows with its
    block and offset axes swapped; two tokens skipped."""
    rng = np.random.default_rng(3)
    entry = rank + rot_dim
    if layout == "contiguous":
        q_pe = rng.standard_normal((tokens, heads, rot_dim)).astype(dtype)
        k_pe = rng.standard_normal((tokens, 1, rot_dim)).astype(dtype)
        kv_c = rng.standard_normal((tokens, rank)).astype(dtype)
        kv_cache = np.full((num_blocks, block_size, entry), np.nan, dtype)
    else:
        q_pe = rng.standard_normal((tokens, heads, 8 + rot_dim)).astype(dtype)[..., 8:]
        key = rng.standard_normal((tokens, rot_dim + rank)).astype(dtype)
        k_pe, kv_c = key[:, :rot_dim], key[:, rot_dim:]
        kv_cache = np.full((block_size, num_blocks, entry + 4), np.nan, dtype)[..., :entry].transpose(1, 0, 2)
    slots = rng.choice(num_blocks * block_size, tokens, replace=False)
    slots[[2, 5]] = -1
    table = vllm_cache(rot_dim, dtype=np.float32 if dtype.itemsize == 2 else dtype)
    return dict(positions=rng.integers(0, 8192, tokens), q_pe=q_pe, k_pe=k_pe, kv_c=kv_c, cos_sin_cache=table,
                is_neox=True, slot_mapping=slots, kv_cache=kv_cache)


@pytest.mark.parametrize("dtype", [*DTYPES, "float64"])
@pytest.mark.parametrize("layout", ["contiguous", "slices"])
@pytest.mark.parametrize("is_neox", [True, False])
def test_the_compiled_path_writes_as_the_general_path(dtype, layout, is_neox):
    dtype = np.dtype(DTYPES.get(dtype, dtype))
    args, expected, fast = (dict(server_case(dtype, layout), is_neox=is_neox) for _ in range(3))
    with general_path_only():  # two paths: the switch sends the call to the general one
        assert kernels.mla_to_cache_fast(**server_case(dtype, layout), kv_cache_dtype="auto") is False
        vllm.concat_and_cache_mla_rope_fused(**expected)
    assert kernels.mla_to_cache_fast(**fast, kv_cache_dtype="auto") is True
    for name in ("q_pe", "k_pe", "kv_cache"):
        assert untouched(expected[name], fast[name]), name
    assert not untouched(args["q_pe"], fast["q_pe"])  # rotated
    # the write alone, of the rotated k_pe
    alone = server_case(dtype, layout)["kv_cache"]
    assert kernels.mla_to_cache_fast(None, None, fast["k_pe"], args["kv_c"], None, None, args["slot_mapping"],
                                     alone, "auto") is True
    assert untouched(expected["kv_cache"], alone)


def test_the_compiled_path_on_tensors_counts_its_writes():
    torch = pytest.importorskip("torch")
    args, expected = (server_case(np.dtype(np.float32), "slices") for _ in range(2))
    with general_path_only():  # on tensors: posenc_fast reads them in C from then on
        vllm.concat_and_cache_mla_rope_fused(**{n: torch.from_numpy(a) if isinstance(a, np.ndarray) else a
                                                for n, a in expected.items()})
    given = {name: torch.from_numpy(a) if isinstance(a, np.ndarray) else a for name, a in args.items()}
    versions = [given[name]._version for name in ("q_pe", "k_pe", "kv_cache")]
    assert kernels.mla_to_cache_fast(**given, kv_cache_dtype="auto") is True
    assert [given[n]._version for n in ("q_pe", "k_pe", "kv_cache")] == [v + 1 for v in versions]
    for name in ("q_pe", "k_pe", "kv_cache"):
        assert untouched(expected[name], given[name].numpy()), name
    mixed = dict(given, kv_c=given["kv_c"].numpy())  # an ndarray among tensors: the general path's
    assert kernels.mla_to_cache_fast(**mixed, kv_cache_dtype="auto") is False


def test_a_cache_over_an_input_is_refused():
    positions, query, k_pe, kv_c, slots, kv_cache = mla_case(np.float32, 4, 64, heads=2, rank=32, num_blocks=2)
    before = kv_cache.copy()
    assert kernels.mla_to_cache_fast(None, None, k_pe, kv_cache[0, :4, :32], None, None, slots, kv_cache,
                                     "auto") is False
    with pytest.raises(ValueError, match="kv_cache shares memory"):
        vllm.concat_and_cache_mla(kv_cache[0, :4, :32], k_pe, kv_cache, slots)
    assert untouched(before, kv_cache)


def test_the_torch_ops_under_compile():
    torch = pytest.importorskip("torch")
    import posenc_fast.torch_ops  # noqa: F401  (registers the ops)

    positions, query, k_pe, kv_c, slots, kv_cache = mla_case(np.float32, 7, 64, heads=4, rank=32)
    cache = vllm_cache(64)
    want = [a.copy() for a in (query, k_pe, kv_cache)]
    vllm.concat_and_cache_mla_rope_fused(positions, *want[:2], kv_c, cache, True, slots, want[2])
    tensors = [torch.from_numpy(a.copy()) for a in (query, k_pe, kv_cache)]
    args = (torch.from_numpy(positions), tensors[0], tensors[1], torch.from_numpy(kv_c), torch.from_numpy(cache),
            True, torch.from_numpy(slots), tensors[2])

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(*args):
        torch.ops.posenc_fast.concat_and_cache_mla_rope_fused(*args)

    step(*args)
    for got, w in zip(tensors, want):
        assert untouched(w, got.numpy())
    fresh = [torch.from_numpy(a.copy()) for a in (query, k_pe, kv_cache)]
    torch.library.opcheck(torch.ops.posenc_fast.concat_and_cache_mla_rope_fused,
                          (args[0], fresh[0], fresh[1], args[3], args[4], True, args[6], fresh[2]))
    plain = torch.from_numpy(kv_cache.copy())
    torch.ops.posenc_fast.concat_and_cache_mla(torch.from_numpy(kv_c), torch.from_numpy(want[1]), plain,
                                               torch.from_numpy(slots))
    assert untouched(want[2], plain.numpy())
