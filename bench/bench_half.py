"""Half precision: posenc_fast in float16/bfloat16 against a copy of the same bytes and torch.

    PYTHONPATH=src python3 bench/bench_half.py [--rounds N]

One thread.  Rows (time / limit, medians of interleaved rounds):

* W1 (1,32,4096,128) out-of-place into ``out=`` against ``np.copyto`` of
  the same half-precision array, and in place against the same copy;
* W3 (1,32,1,128) at offset 4096, and apply_qk (1,32,4096,128) +
  (1,8,4096,128), against ``np.copyto`` of the bytes written;
* with torch: transformers' Llama ``apply_rotary_pos_emb`` formula in the same
  dtype (torch eager, one thread) against ``posenc_fast.hf``'s drop-in on a
  prefill (1,32,2048,128) + (1,8,2048,128), and the largest error of each
  against the float64 rotation of the same inputs.
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

from posenc_fast._bench.timing import measure, paired_ratio

DTYPES = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def numpy_rows(dtype, rounds):
    rng = np.random.default_rng(0)
    rope = pf.RotaryEmbedding(128, layout="half")
    x = rng.standard_normal((1, 32, 4096, 128)).astype(dtype)
    k = rng.standard_normal((1, 8, 4096, 128)).astype(dtype)
    out, out_k, dst, dst_k = (np.empty_like(x), np.empty_like(k), np.empty_like(x),
                              np.empty_like(k))
    token = rng.standard_normal((1, 32, 1, 128)).astype(dtype)
    token_out, token_dst = np.empty_like(token), np.empty_like(token)
    funcs = {
        "w1_oop": lambda: rope.apply(x, out=out),
        "w1_in_place": lambda: rope.apply(out, out=out),
        "w1_copy": lambda: np.copyto(dst, x),
        "w3": lambda: rope.apply(token, offset=4096, out=token_out),
        "w3_copy": lambda: np.copyto(token_dst, token),
        "qk": lambda: rope.apply_qk(x, k, out_q=out, out_k=out_k),
        "qk_copy": lambda: (np.copyto(dst, x), np.copyto(dst_k, k)),
    }
    t = measure(funcs, rounds=rounds)
    return [("W1 out-of-place (1,32,4096,128)", paired_ratio(t["w1_oop"], t["w1_copy"]), 1.2),
            ("W1 in place (1,32,4096,128)", paired_ratio(t["w1_in_place"], t["w1_copy"]), 1.3),
            ("W3 one token, offset 4096", paired_ratio(t["w3"], t["w3_copy"]), None),
            ("apply_qk (1,32,4096,128) + (1,8,4096,128)", paired_ratio(t["qk"], t["qk_copy"]),
             None)]


def torch_rows(name, rounds):
    try:
        import torch
        from transformers.models.llama import modeling_llama
    except ImportError:
        return []
    from posenc_fast import hf

    torch.set_num_threads(1)
    dtype = getattr(torch, name)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 32, 2048, 128, generator=g).to(dtype)
    k = torch.randn(1, 8, 2048, 128, generator=g).to(dtype)
    angles = torch.arange(2048, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    emb = torch.cat((angles, angles), dim=-1)[None]
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    theirs = modeling_llama.apply_rotary_pos_emb
    with torch.inference_mode():
        t = measure({"ours": lambda: hf.apply_rotary_pos_emb(q, k, cos, sin),
                     "theirs": lambda: theirs(q, k, cos, sin)}, rounds=rounds)
        ours_q, _ = hf.apply_rotary_pos_emb(q, k, cos, sin)
        theirs_q, _ = theirs(q, k, cos, sin)
    q64, c64, s64 = q.double(), cos.double()[:, None], sin.double()[:, None]
    exact = q64 * c64 + torch.cat((-q64[..., 64:], q64[..., :64]), dim=-1) * s64
    ours_err = float((ours_q.double() - exact).abs().max())
    theirs_err = float((theirs_q.double() - exact).abs().max())
    return [(f"drop-in prefill vs transformers' formula in {name} (speedup)",
             paired_ratio(t["theirs"], t["ours"]), 3.0),
            (f"largest error vs float64 rotation: ours {ours_err:.4g}, transformers "
             f"{theirs_err:.4g}", None, None)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    pf.set_num_threads(1)
    print(f"posenc_fast {pf.__version__}, {pf.build_info()['isa_in_use']}, one thread")
    for name, dtype in DTYPES.items():
        for label, ratio, goal in numpy_rows(dtype, args.rounds) + torch_rows(name, args.rounds):
            if ratio is None:
                print(f"  {name:8s} {label}")
                continue
            met = "" if goal is None else (
                "  goal <= %.2fx: %s" % (goal, "met" if ratio <= goal else "NOT met")
                if "speedup" not in label else
                "  goal >= %.1fx: %s" % (goal, "met" if ratio >= goal else "NOT met"))
            print(f"  {name:8s} {label}: {ratio:.2f}x{met}")


if __name__ == "__main__":
    main()
