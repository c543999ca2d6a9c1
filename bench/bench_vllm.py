"""posenc_fast.vllm.rotary_embedding against a copy and vLLM's native formula, one thread.

    PYTHONPATH=src python bench/bench_vllm.py [--rounds N] [--dtype float32 bfloat16]

Two calls of a Llama-like layer (32 query heads, 8 kv heads, head_size 128,
neox pairs, a (8192, 128) cos/sin cache), in float32 and in bfloat16 (its
cache float32): a prefill of 4096 tokens at positions 0..4095, and a decode
step of 16 sequences, one token each.  Rows:

* ``posenc_fast numpy`` / ``posenc_fast torch``: the in-place call on NumPy
  arrays / on CPU tensors over the same memory (read in C, not copied); ``torch.ops`` through the
  custom op of `posenc_fast.torch_ops` (dispatcher overhead included);
  ``torch.ops no-op``: an op of the same schema whose kernel does nothing,
  what torch's call of the op costs by itself (the floor of ``torch.ops``
  with a Python kernel); ``torch.ops Python`` and ``KV write Python op``,
  where the ops' C++ kernels are loaded (``python -m posenc_fast
  build-torch-kernel``): their Python kernels, through the same dispatcher;
* ``apply_qk``: `RotaryEmbedding.apply_qk` rotating the same NumPy arrays in
  place, as (tokens, heads, head_size) with a position per token: the kernel
  behind the op without the op's glue;
* ``copy``: ``np.copyto`` of q and k into other arrays, the same bytes read
  and written: the floor for a pass over q and k;
* ``vLLM native``: vLLM's ``forward_native`` formula in torch eager
  (index_select, chunk, products, cat), which returns new tensors;
* ``KV write ...``: `posenc_fast.vllm.apply_qk_to_cache`, the rotation with
  k rotated into and v copied into vLLM's CPU cache ``(2, num_blocks,
  kv_heads, 16, head_size)`` (``"HND"``), on NumPy arrays, on tensors,
  through ``torch.ops``; ``KV write method``: `RotaryEmbedding.apply_qk_to_cache`
  on the same arrays; their limit ``copy q, k, v``;
* ``MLA ...``, decode only: DeepSeek-V3's MLA cache write (128 query heads, rope dim 64,
  kv_lora_rank 512, a (num_blocks, 16, 576) cache):
  `posenc_fast.vllm.concat_and_cache_mla_rope_fused` on NumPy arrays, on
  tensors, through ``torch.ops``; ``MLA unfused``: `rotary_embedding` then
  `concat_and_cache_mla` (what vLLM's CPU backend runs); their limit ``copy
  MLA``, a copy of q_pe, k_pe and kv_c.

Each line: median time per call and its ratio to the copy (paired per round;
the KV write rows to the copy of q, k and v, the MLA rows to theirs), and the
rotations' to ``apply_qk``.
The torch rows appear only when torch imports.
"""

import argparse
import itertools
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

try:
    import posenc_fast as pf
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import posenc_fast as pf
from posenc_fast import reference, vllm
from posenc_fast._bench.timing import measure, paired_ratio, set_threads
from posenc_fast._bench.torch_rows import Unavailable, torch_or_unavailable

HEADS, KV_HEADS, HEAD_SIZE, MAX_POSITION = 32, 8, 128, 8192
MLA_HEADS, ROPE_DIM, KV_LORA_RANK, MLA_TOKENS = 128, 64, 512, 64  # the MLA rows: decode only
DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def cos_sin_cache(rot_dim: int = HEAD_SIZE) -> np.ndarray:
    angles = np.arange(MAX_POSITION)[:, None] * np.array(reference.rope_inv_freq(rot_dim))
    return np.concatenate((np.cos(angles), np.sin(angles)), axis=1).astype(np.float32)


def native_formula(torch, positions, query, key, cache):
    """vLLM's forward_native (neox, rot_dim = head_size): new query and key tensors."""
    cos, sin = cache.index_select(0, positions.flatten()).chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)

    def rotate(x):
        heads = x.view(positions.numel(), -1, HEAD_SIZE)
        x1, x2 = torch.chunk(heads, 2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).reshape(x.shape)

    return rotate(query), rotate(key)


_NO_OP = {}  # the torch.library.Library of the no-op op, kept alive


def no_op(torch):
    """An op of ``torch.ops.posenc_fast.rotary_embedding``'s schema whose kernel does nothing."""
    if not _NO_OP:
        _NO_OP["library"] = torch.library.Library("posenc_fast_bench", "DEF")
        schema = str(torch.ops.posenc_fast.rotary_embedding.default._schema)
        _NO_OP["library"].define(schema.removeprefix("posenc_fast::"))
        _NO_OP["library"].impl("rotary_embedding", lambda *args: None, "CPU")
    return torch.ops.posenc_fast_bench.rotary_embedding


def contenders(positions: np.ndarray, dtype: str) -> dict:
    rng = np.random.default_rng(0)
    tokens = positions.size
    query = rng.standard_normal((tokens, HEADS * HEAD_SIZE), dtype=np.float32).astype(DTYPES[dtype])
    key = rng.standard_normal((tokens, KV_HEADS * HEAD_SIZE), dtype=np.float32).astype(query.dtype)
    cache = cos_sin_cache()
    value = rng.standard_normal(key.shape, dtype=np.float32).astype(query.dtype)
    kv = np.zeros((2, MAX_POSITION // 16, KV_HEADS, 16, HEAD_SIZE), query.dtype)  # vLLM's CPU cache
    slots = np.arange(tokens) * 3 % MAX_POSITION  # distinct slots, not in order
    q_copy, k_copy, v_copy = np.empty_like(query), np.empty_like(key), np.empty_like(value)
    rope = pf.RotaryEmbedding(HEAD_SIZE, layout="half")
    q_heads, k_heads = query.reshape(tokens, HEADS, HEAD_SIZE), key.reshape(tokens, KV_HEADS, HEAD_SIZE)
    token_positions = positions.reshape(tokens, 1)
    calls = {
        "posenc_fast numpy": lambda: vllm.rotary_embedding(positions, query, key, HEAD_SIZE,
                                                           cache, True),
        "apply_qk": lambda: rope.apply_qk(q_heads, k_heads, token_positions, out_q=q_heads, out_k=k_heads),
        "copy": lambda: (np.copyto(q_copy, query), np.copyto(k_copy, key)),
        "KV write numpy": lambda: vllm.apply_qk_to_cache(positions, query, key, value, kv[0], kv[1], slots,
                                                         HEAD_SIZE, cache, True, "HND"),
        "KV write method": lambda: rope.apply_qk_to_cache(
            q_heads, k_heads, value.reshape(k_heads.shape), positions, *(np.swapaxes(c, 1, 2) for c in kv), slots,
            out_q=q_heads),
        "copy q, k, v": lambda: (np.copyto(q_copy, query), np.copyto(k_copy, key), np.copyto(v_copy, value)),
    }
    mla = mla_arrays(rng, tokens, query.dtype) if tokens <= MLA_TOKENS else None
    if mla is not None:
        mla_args = (positions, mla["q_pe"], mla["k_pe"], mla["kv_c"], cos_sin_cache(ROPE_DIM), True, slots,
                    mla["cache"])
        mla_copies = {name: np.empty_like(mla[name]) for name in ("q_pe", "k_pe", "kv_c")}
        calls.update({
            "MLA numpy": lambda: vllm.concat_and_cache_mla_rope_fused(*mla_args),
            "MLA unfused": lambda: (vllm.rotary_embedding(*mla_args[:3], ROPE_DIM, *mla_args[4:6]),
                                    vllm.concat_and_cache_mla(mla["kv_c"], mla["k_pe"], mla["cache"], slots)),
            "copy MLA": lambda: [np.copyto(mla_copies[name], mla[name]) for name in mla_copies],
        })
    try:
        torch = torch_or_unavailable()
    except Unavailable as exc:
        print(f"  (torch rows skipped: {exc})")
        return calls
    import posenc_fast.torch_ops  # registers torch.ops.posenc_fast

    t_dtype = getattr(torch, dtype)
    t_positions, t_cache = torch.from_numpy(positions), torch.from_numpy(cache)
    def tensor(a):  # over the NumPy array's memory: the torch rows and apply_qk rotate the same bytes
        return torch.from_numpy(a.view(np.int16)).view(t_dtype) if t_dtype is torch.bfloat16 else torch.from_numpy(a)

    t_query, t_key = tensor(query), tensor(key)
    if dtype == "float32":  # the native formula rounds bfloat16 three times
        check_q, check_k = t_query.clone(), t_key.clone()
        expected = native_formula(torch, t_positions, check_q, check_k, t_cache)
        vllm.rotary_embedding(t_positions, check_q, check_k, HEAD_SIZE, t_cache, True)
        same = torch.equal(check_q, expected[0]) and torch.equal(check_k, expected[1])
        print(f"  posenc_fast == vLLM native formula, bitwise: {same}")
    op, op_no_op = torch.ops.posenc_fast.rotary_embedding, no_op(torch)
    t_kv, t_slots = tensor(kv), torch.from_numpy(slots)
    t_value = tensor(value)
    kv_args = (t_positions, t_query, t_key, t_value, t_kv[0], t_kv[1], t_slots, HEAD_SIZE, t_cache, True, "HND")
    if mla is not None:
        t_mla = (t_positions, *(tensor(mla[name]) for name in ("q_pe", "k_pe", "kv_c")),
                 torch.from_numpy(mla_args[4]), True, t_slots, tensor(mla["cache"]))
        calls.update({
            "MLA torch": lambda: vllm.concat_and_cache_mla_rope_fused(*t_mla),
            "MLA torch.ops": lambda: torch.ops.posenc_fast.concat_and_cache_mla_rope_fused(*t_mla),
        })
    calls.update({
        "KV write torch": lambda: vllm.apply_qk_to_cache(*kv_args),
        "KV write torch.ops": lambda: torch.ops.posenc_fast.apply_qk_to_cache(*kv_args),
        "posenc_fast torch": lambda: vllm.rotary_embedding(t_positions, t_query, t_key,
                                                           HEAD_SIZE, t_cache, True),
        "torch.ops": lambda: op(t_positions, t_query, t_key, HEAD_SIZE, t_cache, True),
        "torch.ops no-op": lambda: op_no_op(t_positions, t_query, t_key, HEAD_SIZE, t_cache, True),
        "vLLM native": lambda: native_formula(torch, t_positions, t_query, t_key, t_cache),
    })
    if posenc_fast.torch_ops.compiled_kernels:  # the ops' Python kernels, through the same dispatcher
        calls.update({
            "KV write Python op": lambda: torch.ops.posenc_fast._apply_qk_to_cache_general(*kv_args),
            "torch.ops Python": lambda: torch.ops.posenc_fast._rotary_embedding_general(
                t_positions, t_query, t_key, HEAD_SIZE, t_cache, True),
        })
    return calls


def mla_arrays(rng, tokens: int, dtype: np.dtype) -> dict:
    """q_pe, the rope part of each query head, as vLLM slices it; k_pe and kv_c, the two parts of one
    latent projection; a cache of (num_blocks, 16, kv_lora_rank + rope dim)."""
    def normal(*shape):
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype)

    latent = normal(tokens, ROPE_DIM + KV_LORA_RANK)
    return dict(q_pe=normal(tokens, MLA_HEADS, 128 + ROPE_DIM)[..., 128:], k_pe=latent[:, :ROPE_DIM],
                kv_c=latent[:, ROPE_DIM:], cache=np.zeros((MAX_POSITION // 16, 16, KV_LORA_RANK + ROPE_DIM), dtype))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--dtype", nargs="+", choices=("float32", "bfloat16"),
                        default=["float32", "bfloat16"])
    args = parser.parse_args()
    print(f"posenc_fast {pf.__version__}, one thread, q ({HEADS} x {HEAD_SIZE}), "
          f"k ({KV_HEADS} x {HEAD_SIZE}) per token, cpu {pf.build_info()['cpu']}")
    try:
        from posenc_fast import torch_ops
        print(f"torch.ops.posenc_fast.rotary_embedding: {torch_ops.kernel_reason}")
    except ImportError:
        pass
    workloads = {"prefill, 4096 tokens": np.arange(4096),
                 "decode, 16 sequences": np.random.default_rng(1).integers(0, 4096, 16)}
    for (title, positions), dtype in itertools.product(workloads.items(), args.dtype):
        print(f"{title}, {dtype}")
        calls = contenders(positions, dtype)
        set_threads(1)  # posenc_fast's and torch's (imported by now)
        timings = measure(calls, rounds=args.rounds, target_ns=20_000_000)
        for name, timing in timings.items():
            limit = ("copy q, k, v" if name.startswith("KV write")
                     else "copy MLA" if "MLA" in name else "copy")
            ratio = paired_ratio(timing, timings[limit])
            kernel = "" if limit != "copy" else f"  {paired_ratio(timing, timings['apply_qk']):6.2f}x apply_qk"
            print(f"  {name:<18} {timing.median_ns / 1e3:10.1f} us  {ratio:6.2f}x copy{kernel}")


if __name__ == "__main__":
    main()
