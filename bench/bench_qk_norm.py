"""q/k RMSNorm + RoPE: the fused pass against one copy of q and k, and the unfused alternative.

    PYTHONPATH=src python3 bench/bench_qk_norm.py [--rounds N]

One thread; a 4096-token prefill, 32 query and 8 key heads of 128, float32
and bfloat16: ``RotaryEmbedding.apply_qk_norm`` in place, the limit
``np.copyto`` of q and k, and (with torch) transformers' Qwen3 norm in torch
followed by posenc_fast's rotation; then the same with the KV write
(``apply_qk_to_cache(qk_norm=...)``, token-major) against a copy of q, k, v.  Medians of interleaved per-round ratios.
Then a decode step's one-token calls (position 4096), with and without the norm: medians in microseconds
(context: the ratio between them is the claim).
"""

import argparse
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

try:
    import posenc_fast as pf
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import posenc_fast as pf

from posenc_fast._bench.timing import machine_line, measure, paired_ratio


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    pf.set_num_threads(1)
    rng = np.random.default_rng(0)
    rope = pf.RotaryEmbedding(128, layout="half", base=1e6)
    print(f"{machine_line()}; one thread; medians of {args.rounds} interleaved rounds")
    for name, dtype in (("float32", np.float32), ("bfloat16", ml_dtypes.bfloat16)):
        q = rng.standard_normal((1, 32, 4096, 128)).astype(dtype)
        k = rng.standard_normal((1, 8, 4096, 128)).astype(dtype)
        # weights of magnitude 1: the in-place calls repeat on the same q and k, and weights below 1
        # would shrink their features into float32 subnormals round after round (slow to multiply)
        wq, wk = rng.choice((-1.0, 1.0), 128), rng.choice((-1.0, 1.0), 128)
        dq, dk = np.empty_like(q), np.empty_like(k)
        funcs = {"fused": lambda: rope.apply_qk_norm(q, k, wq, wk, out_q=q, out_k=k),
                 "copy": lambda: (np.copyto(dq, q), np.copyto(dk, k))}
        try:
            import torch

            torch.set_num_threads(1)
            from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

            norm = Qwen3RMSNorm(128)
            tq, tk = (torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if dtype != np.float32
                      else torch.from_numpy(a) for a in (q, k))
            norm = norm.to(tq.dtype)

            def unfused():
                with torch.inference_mode():
                    nq, nk = norm(tq), norm(tk)
                from posenc_fast.hf import numpy_view
                rope.apply_qk(numpy_view(torch, nq), numpy_view(torch, nk),
                              out_q=numpy_view(torch, nq), out_k=numpy_view(torch, nk))
            funcs["unfused (torch norm, then apply_qk)"] = unfused
        except ImportError:
            pass
        t = measure(funcs, rounds=args.rounds)
        for label in funcs:
            if label != "copy":
                print(f"{name:9s} {label:38s} {paired_ratio(t[label], t['copy']):.2f}x a copy of q and k")
        # with the KV write: token-major q, k, v into a paged cache, against one copy of q, k and v
        tq, tk = (np.ascontiguousarray(a[0].transpose(1, 0, 2)) for a in (q, k))
        tv = tk.copy()
        k_cache = np.zeros((256, 16, 8, 128), dtype)
        v_cache = np.zeros_like(k_cache)
        positions = slots = np.arange(4096)
        copies = [np.empty_like(a) for a in (tq, tk, tv)]
        funcs = {"fused with the KV write": lambda: rope.apply_qk_to_cache(
                     tq, tk, tv, positions, k_cache, v_cache, slots, out_q=tq, qk_norm=(wq, wk)),
                 "copy": lambda: [np.copyto(c, a) for c, a in zip(copies, (tq, tk, tv))]}
        t = measure(funcs, rounds=args.rounds)
        print(f"{name:9s} {'fused with the KV write':38s} "
              f"{paired_ratio(t['fused with the KV write'], t['copy']):.2f}x a copy of q, k and v")
        # a decode step's call (one token at position 4096): what the checks and glue add to the kernel
        q1, k1 = q[:, :, :1].copy(), k[:, :, :1].copy()
        t1q, t1k, t1v = (a[:1].copy() for a in (tq, tk, tv))
        slot = np.array([7])
        funcs = {"decode apply_qk_norm": lambda: rope.apply_qk_norm(q1, k1, wq, wk, offset=4096, out_q=q1, out_k=k1),
                 "decode apply_qk": lambda: rope.apply_qk(q1, k1, offset=4096, out_q=q1, out_k=k1),
                 "decode KV write with the norm": lambda: rope.apply_qk_to_cache(
                     t1q, t1k, t1v, np.array([4096]), k_cache, v_cache, slot, out_q=t1q, qk_norm=(wq, wk)),
                 "decode KV write": lambda: rope.apply_qk_to_cache(
                     t1q, t1k, t1v, np.array([4096]), k_cache, v_cache, slot, out_q=t1q)}
        t = measure(funcs, rounds=args.rounds)
        for label in funcs:
            print(f"{name:9s} {label:38s} {t[label].median_ns / 1e3:.1f} us")


if __name__ == "__main__":
    main()
