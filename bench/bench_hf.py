"""posenc_fast.hf.apply_rotary_pos_emb vs transformers' own, on one CPU thread.

A plain script (needs torch and transformers):

    PYTHONPATH=src python bench/bench_hf.py [--repeats N]

Part 1 times the rotation alone for q (1, 32, 4096, 128) and k (1, 8, 4096,
128) float32, both as contiguous tensors and as Llama's (batch, heads, seq,
dim) views of (batch, seq, heads, dim) projections, then for one decode step
(seq 1), where the per-call overhead shows; the one-token call again in
float32 and bfloat16 beside the compiled call alone on NumPy views made once
(``kernel``: what the drop-in's glue adds to) and the ops a ``torch.compile``
graph calls in its place (``op``: ``_hf_rotate_no_grad``, a graph needing no
gradient; ``op, backward``: ``hf_rotate``); then the functions `install`
puts in three other modules (Cohere's interleaved pairs, Qwen2-VL's mRoPE,
DeepSeek-V3's MLA ``apply_rotary_pos_emb_interleave``) against their
originals, on the same q/k views.  Part 2 times the forward
pass of small random Llama models on a 512-token prompt with and without
`hf.install`.  Each line is the median over interleaved rounds of
``posenc_fast._bench.timing.measure`` (the start rotating each round), so
drifts in machine speed hit both alike.
"""

import argparse
import importlib

import torch
import transformers
from transformers.models.llama import modeling_llama

import posenc_fast as pf
from posenc_fast import _hf_drop_in, hf, torch_ops  # noqa: F401  (torch_ops registers the ops)
from posenc_fast._dispatch import kernels
from posenc_fast._hf_functions import INTERLEAVE_FUNCTIONS, ROTARY_FUNCTIONS
from posenc_fast._bench.timing import measure, paired_ratio


def report(title: str, timings: dict, nbytes: int | None = None) -> None:
    """One line per contender: median time, speed-up over transformers, GB/s."""
    print(title)
    for name, timing in timings.items():
        seconds = timing.median_ns / 1e9
        speedup = paired_ratio(timings["transformers"], timing)
        rate = f"  {nbytes / seconds / 1e9:6.2f} GB/s" if nbytes else ""
        print(f"  {name:<14} {seconds * 1e3:9.3f} ms  {speedup:5.2f}x{rate}")


def rotation(repeats: int) -> None:
    batch, heads, kv_heads, seq, dim = 1, 32, 8, 4096, 128
    rope = modeling_llama.LlamaRotaryEmbedding(transformers.LlamaConfig(
        hidden_size=heads * dim, num_attention_heads=heads, max_position_embeddings=seq))
    x = torch.empty(batch, seq, dim)
    cos, sin = rope(x, torch.arange(seq)[None])
    generator = torch.Generator().manual_seed(0)
    for layout in ("contiguous", "llama view", "decode step"):
        if layout == "decode step":  # one new token: per-call overhead
            q = torch.randn(batch, 1, heads, dim, generator=generator).transpose(1, 2)
            k = torch.randn(batch, 1, kv_heads, dim, generator=generator).transpose(1, 2)
            cos, sin = cos[:, -1:], sin[:, -1:]
        elif layout == "contiguous":
            q = torch.randn(batch, heads, seq, dim, generator=generator)
            k = torch.randn(batch, kv_heads, seq, dim, generator=generator)
        else:
            q = torch.randn(batch, seq, heads, dim, generator=generator).transpose(1, 2)
            k = torch.randn(batch, seq, kv_heads, dim, generator=generator).transpose(1, 2)
        with torch.no_grad():
            timings = measure({
                "transformers": lambda: modeling_llama.apply_rotary_pos_emb(q, k, cos, sin),
                "posenc_fast": lambda: hf.apply_rotary_pos_emb(q, k, cos, sin),
            }, rounds=repeats)
        # read q and k, write both results (the cache is small next to them)
        nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
        report(f"apply_rotary_pos_emb, q {tuple(q.shape)} k {tuple(k.shape)} float32, "
               f"{layout}", timings, nbytes)


LLAMA_OP = ("llama", "apply_rotary_pos_emb", 1, False)  # the ops' family, name, unsqueeze_dim, transpose


def decode_step(repeats: int) -> None:
    """The one-token call (q (1,32,1,128) as Llama's transposed view), its glue against the kernel."""
    heads, kv_heads, dim = 32, 8, 128
    generator = torch.Generator().manual_seed(0)
    angles = 4095 * 500000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    emb = torch.cat((angles, angles))[None, None]
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(1, 1, heads, dim, generator=generator).transpose(1, 2).to(dtype)
        k = torch.randn(1, 1, kv_heads, dim, generator=generator).transpose(1, 2).to(dtype)
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
        # The compiled call alone on NumPy views made once: no glue (what the drop-in adds to).
        views = [_hf_drop_in.numpy_view(torch, t) for t in (q, k, cos, sin)]
        halves = [t.reshape(1, 1, 1, dim)[..., :dim // 2] for t in views[2:]]
        with torch.no_grad():
            timings = measure({
                "transformers": lambda: modeling_llama.apply_rotary_pos_emb(q, k, cos, sin),
                "posenc_fast": lambda: hf.apply_rotary_pos_emb(q, k, cos, sin),
                "kernel": lambda: kernels.rotate_cos_sin_fast(tuple(views[:2]), *halves, "half", False,
                                                              (None, None)),
                "op": lambda: torch.ops.posenc_fast._hf_rotate_no_grad([q, k], cos, sin, *LLAMA_OP),
                "op, backward": lambda: torch.ops.posenc_fast.hf_rotate([q, k], cos, sin, *LLAMA_OP),
            }, rounds=repeats)
        print(f"apply_rotary_pos_emb, one token, q {tuple(q.shape)} k {tuple(k.shape)} {dtype}")
        for name, timing in timings.items():
            print(f"  {name:<14} {timing.median_ns / 1e3:8.2f} us  "
                  f"{paired_ratio(timing, timings['kernel']):5.2f}x the kernel")


# (module, function name, table): a replacement `install` puts in, timed against the module's own
REPLACEMENTS = [("cohere", "apply_rotary_pos_emb", ROTARY_FUNCTIONS),
                ("qwen2_vl", "apply_rotary_pos_emb", ROTARY_FUNCTIONS),
                ("deepseek_v3", "apply_rotary_pos_emb_interleave", INTERLEAVE_FUNCTIONS)]


def replacements(repeats: int) -> None:
    batch, heads, kv_heads, seq, dim = 1, 32, 8, 4096, 64
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(batch, seq, heads, dim, generator=generator).transpose(1, 2)
    k = torch.randn(batch, seq, kv_heads, dim, generator=generator).transpose(1, 2)
    angles = torch.arange(seq)[:, None] * 10000.0 ** (-torch.arange(0, dim, 2) / dim)
    for family, name, table in REPLACEMENTS:
        function = table[family]
        own = getattr(importlib.import_module(hf._module_name(family)), name)
        patched = hf._replacement(own, function)
        emb = (angles.repeat_interleave(2, dim=-1) if function.cache == "pairs"
               else torch.cat((angles, angles), dim=-1))[None]
        cos, sin = emb.cos(), emb.sin()
        with torch.no_grad():
            timings = measure({"transformers": lambda: own(q, k, cos, sin),
                               "posenc_fast": lambda: patched(q, k, cos, sin)}, rounds=repeats)
        nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
        report(f"{family}'s {name} as install replaces it, q {tuple(q.shape)} k {tuple(k.shape)} "
               f"float32, llama view", timings, nbytes)


def forward(repeats: int, prompt: int = 512) -> None:
    original = modeling_llama.apply_rotary_pos_emb
    configs = {
        "2 layers, hidden 64, 4 heads (head_dim 16)":
            dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
        "4 layers, hidden 1024, 16 heads (head_dim 64)":
            dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                 num_attention_heads=16, num_key_value_heads=4),
    }
    for title, sizes in configs.items():
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=128, max_position_embeddings=prompt, **sizes)).eval()
        ids = torch.randint(0, 128, (1, prompt))

        def run(patched):
            # What hf.install does, without its one-off module walk inside the timing.
            modeling_llama.apply_rotary_pos_emb = hf.apply_rotary_pos_emb if patched else original
            try:
                with torch.no_grad():
                    model(ids)
            finally:
                modeling_llama.apply_rotary_pos_emb = original

        timings = measure({"transformers": lambda: run(False), "posenc_fast": lambda: run(True)},
                          rounds=repeats)
        report(f"LlamaForCausalLM forward, {title}, prompt {prompt}", timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pf.set_num_threads(1)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"posenc_fast {pf.build_info()}")
    rotation(args.repeats)
    decode_step(args.repeats)
    replacements(args.repeats)
    forward(args.repeats)


if __name__ == "__main__":
    main()
