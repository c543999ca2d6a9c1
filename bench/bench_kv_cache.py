"""RotaryEmbedding.apply_qk_to_cache against a copy and the two-pass way, one thread.

    PYTHONPATH=src python bench/bench_kv_cache.py [--rounds N]

A Llama-like layer (32 query heads, 8 kv heads, head_dim 128, float32, half
layout) writing a paged KV cache (blocks of 16 slots, the blocks of a
sequence scattered): a prefill of 4096 tokens at positions 0..4095, and a
decode step of 16 sequences, one token each.  Rows:

* ``fused``: ``apply_qk_to_cache(q, k, v, positions, k_cache, v_cache,
  slots, out_q=out)``, and the same into a bfloat16 cache (one rounding);
* ``copy``: ``np.copyto`` of q, k and v into arrays of their shapes: the
  same bytes read and written, the floor for one pass (issue 17's goals:
  fused <= 1.25x copy for the prefill, <= 2x for the decode step);
* ``two-pass``: ``apply_qk`` into q's out and a temporary, then a NumPy
  scatter of k's and v's rows into their slots.

Each line: median time per call and its ratio to the copy (paired per round).
"""

import argparse
import sys
from pathlib import Path

import numpy as np

try:
    import posenc_fast as pf
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import posenc_fast as pf
from posenc_fast._bench import timing
from posenc_fast._validate import BFLOAT16

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 32, 8, 128, 16, 1024


def slots_of(positions: np.ndarray, rng) -> np.ndarray:
    """Each token's slot: its sequence's blocks drawn at random from the whole cache."""
    if positions.size > 16:  # one sequence (the prefill)
        blocks = rng.permutation(NUM_BLOCKS)[:positions.size // BLOCK_SIZE + 1]
        return blocks[positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE
    # One token of each of 16 sequences: 16 distinct blocks.
    blocks = rng.permutation(NUM_BLOCKS)[:positions.size]
    return blocks * BLOCK_SIZE + positions % BLOCK_SIZE


def contenders(positions: np.ndarray) -> dict:
    rng = np.random.default_rng(0)
    tokens = positions.size
    rope = pf.RotaryEmbedding(HEAD_DIM, layout="half")
    q = rng.standard_normal((tokens, HEADS, HEAD_DIM), dtype=np.float32)
    k, v = (rng.standard_normal((tokens, KV_HEADS, HEAD_DIM), dtype=np.float32)
            for _ in range(2))
    slots = slots_of(positions, rng)
    cache_shape = (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    k_cache, v_cache = np.zeros(cache_shape, np.float32), np.zeros(cache_shape, np.float32)
    k_bf16, v_bf16 = np.zeros(cache_shape, BFLOAT16), np.zeros(cache_shape, BFLOAT16)
    out_q, k_tmp = np.empty_like(q), np.empty_like(k)
    q_copy, k_copy, v_copy = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    flat_k = k_cache.reshape(-1, KV_HEADS, HEAD_DIM)
    flat_v = v_cache.reshape(-1, KV_HEADS, HEAD_DIM)

    def two_pass():
        rope.apply_qk(q, k, positions[:, None], out_q=out_q, out_k=k_tmp)
        flat_k[slots] = k_tmp
        flat_v[slots] = v

    return {
        "fused": lambda: rope.apply_qk_to_cache(q, k, v, positions, k_cache, v_cache, slots,
                                                out_q=out_q),
        "fused, bf16 cache": lambda: rope.apply_qk_to_cache(q, k, v, positions, k_bf16, v_bf16,
                                                            slots, out_q=out_q),
        "copy": lambda: (np.copyto(q_copy, q), np.copyto(k_copy, k), np.copyto(v_copy, v)),
        "two-pass": two_pass,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    print(f"posenc_fast {pf.__version__}, one thread, q ({HEADS} x {HEAD_DIM}), k and v "
          f"({KV_HEADS} x {HEAD_DIM}) per token, float32; {timing.machine_line()}")
    workloads = {"prefill, 4096 tokens": np.arange(4096),
                 "decode, 16 sequences": np.random.default_rng(1).integers(0, 4096, 16)}
    for title, positions in workloads.items():
        print(title)
        calls = contenders(positions)
        timing.set_threads(1)
        timings = timing.measure(calls, rounds=args.rounds, target_ns=20_000_000)
        for name, result in timings.items():
            ratio = timing.paired_ratio(result, timings["copy"])
            print(f"  {name:<18} {result.median_ns / 1e3:10.1f} us  {ratio:6.2f}x copy")


if __name__ == "__main__":
    main()
