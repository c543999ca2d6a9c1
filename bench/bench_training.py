"""A training step of a small Llama with and without ``hf.install`` (one thread, CPU).

    PYTHONPATH=src python3 bench/bench_training.py [--rounds N] [--dtype float32|bfloat16]

Times forward + backward of a random Llama (hidden 512, 8 heads of 64, 4
layers, batch 2 x 512 tokens) in interleaved rounds, with transformers'
rotation and with posenc_fast's kernel (its backward the transposed
rotation), and the time transformers' ``apply_rotary_pos_emb`` takes inside
the step (its forward and backward on the same q/k shapes); prints medians
and the share of the step spent in RoPE.  Needs torch and transformers.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

try:
    from posenc_fast import hf
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from posenc_fast import hf

import posenc_fast as pf
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pf.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=8, vocab_size=1024)
    model = LlamaForCausalLM(config).to(dtype)
    ids = torch.randint(0, 1024, (2, 512))
    q = torch.randn(2, 8, 512, 64, dtype=dtype)
    angles = torch.arange(512.0)[:, None] * 10000.0 ** (-torch.arange(0, 64, 2) / 64)
    emb = torch.cat((angles, angles), -1)[None].to(dtype)
    cos, sin = emb.cos(), emb.sin()

    def step():
        model.zero_grad(set_to_none=True)
        model(ids, labels=ids).loss.backward()

    def rope(function):
        def call():
            q_leaf, k_leaf = q.clone().requires_grad_(), q.clone().requires_grad_()
            a, b = function(q_leaf, k_leaf, cos, sin)
            torch.autograd.backward((a, b), (q, q))
        return call

    calls = {"step, transformers' rotation": step, "step, hf.install": step,
             "RoPE fwd+bwd x layers, transformers": rope(modeling_llama.apply_rotary_pos_emb),
             "RoPE fwd+bwd x layers, posenc_fast": rope(hf.apply_rotary_pos_emb)}
    times = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, call in calls.items():
            with (hf.install(model) if "install" in name else _nothing()):
                call()  # warm
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    layers = config.num_hidden_layers
    median = {name: statistics.median(t) for name, t in times.items()}
    for name, t in median.items():
        scale = layers if name.startswith("RoPE") else 1
        print(f"{name:40s} {1e3 * t * scale:8.2f} ms")
    for who, step_name, rope_name in (("transformers", "step, transformers' rotation",
                                       "RoPE fwd+bwd x layers, transformers"),
                                      ("posenc_fast", "step, hf.install",
                                       "RoPE fwd+bwd x layers, posenc_fast")):
        print(f"RoPE share of the step, {who}: {100 * layers * median[rope_name] / median[step_name]:.1f}%")
    ratio = median["step, hf.install"] / median["step, transformers' rotation"]
    print(f"{args.dtype}, one thread; the step with install / without: {ratio:.3f}")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
