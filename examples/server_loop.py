"""Continuous-batching decode over a paged KV cache with posenc_fast's fused rotate-and-write.

    PYTHONPATH=src python examples/server_loop.py

A small Llama and a small Qwen3 (transformers, built from configs: random
weights, nothing downloaded) serve requests that arrive at different steps.
Every step runs one batch holding the prompt of each newly arrived request
and the last token of each running one; in every layer
`RotaryEmbedding.apply_qk_to_cache` rotates q, and writes the rotated k and v
into the slots of a paged cache (blocks of BLOCK_SIZE slots, handed out from
a free list and returned when a request finishes) — for Qwen3 with its q/k
RMSNorm in the same pass (``qk_norm=``).  Attention then reads each sequence's keys and values back
through its block table.  Each request's logits are checked at every step
against the model's own forward over the whole sequence.
"""

from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

import posenc_fast as pf

BLOCK_SIZE, NUM_BLOCKS = 4, 12  # few: finished requests' blocks are reused


@dataclass
class Request:
    prompt: list[int]
    max_new_tokens: int
    arrives_at: int
    tokens: list[int] = field(default_factory=list)  # prompt + generated
    blocks: list[int] = field(default_factory=list)  # the block table
    cached: int = 0  # tokens whose k and v are in the cache

    def slot(self, position: int) -> int:
        return self.blocks[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE


class PagedModel:
    """A Llama-shaped model's weights (Llama, Qwen3), run layer by layer over a paged KV cache."""

    def __init__(self, model):
        config = model.config
        self.model = model
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.rope = pf.RotaryEmbedding.from_hf_config(config)
        shape = (NUM_BLOCKS, BLOCK_SIZE, self.kv_heads, self.head_dim)
        self.caches = [(np.zeros(shape, np.float32), np.zeros(shape, np.float32))
                       for _ in model.model.layers]
        self.free_blocks = list(range(NUM_BLOCKS))

    def reserve(self, request: Request, length: int) -> None:
        while len(request.blocks) * BLOCK_SIZE < length:
            request.blocks.append(self.free_blocks.pop())

    def release(self, request: Request) -> None:
        self.free_blocks.extend(request.blocks)
        request.blocks.clear()

    @torch.no_grad()
    def step(self, batch: list[Request]) -> torch.Tensor:
        """Run each request's uncached tokens as one batch; return each one's last logits."""
        spans, positions, slots, tokens = [], [], [], []
        for request in batch:
            new = range(request.cached, len(request.tokens))
            self.reserve(request, len(request.tokens))
            spans.append((len(positions), len(new)))
            positions += new
            slots += [request.slot(p) for p in new]
            tokens += request.tokens[request.cached:]
        positions, slots = np.array(positions), np.array(slots)
        model = self.model.model
        hidden = model.embed_tokens(torch.tensor(tokens))
        for layer, (k_cache, v_cache) in zip(model.layers, self.caches):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q, k, v = (proj(x).view(len(tokens), -1, self.head_dim).numpy()
                       for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
            q = self.rope.apply_qk_to_cache(q, k, v, positions, k_cache, v_cache, slots, **self.qk_norm(attn))
            out = torch.cat([self.attend(q[first:first + n], request, k_cache, v_cache)
                             for request, (first, n) in zip(batch, spans)])
            hidden = hidden + attn.o_proj(out)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        for request in batch:
            request.cached = len(request.tokens)
        last = [first + n - 1 for first, n in spans]
        return self.model.lm_head(model.norm(hidden[last]))

    @staticmethod
    def qk_norm(attn) -> dict:
        """Qwen3's per-head q/k RMSNorm, fused into the rotate-and-write; {} for Llama."""
        if not hasattr(attn, "q_norm"):
            return {}
        weights = (attn.q_norm.weight.numpy(), attn.k_norm.weight.numpy())
        return {"qk_norm": weights, "eps": attn.q_norm.variance_epsilon}

    def attend(self, q: np.ndarray, request: Request, k_cache, v_cache) -> torch.Tensor:
        """Causal attention of q (the request's newest tokens) over its cached keys/values."""
        length = len(request.tokens)
        rows = [request.slot(p) for p in range(length)]
        keys = torch.from_numpy(k_cache.reshape(-1, self.kv_heads, self.head_dim)[rows])
        values = torch.from_numpy(v_cache.reshape(-1, self.kv_heads, self.head_dim)[rows])
        group = self.heads // self.kv_heads
        keys, values = (t.repeat_interleave(group, dim=1).transpose(0, 1) for t in (keys, values))
        q = torch.from_numpy(q).transpose(0, 1)  # (heads, new, head_dim)
        first = length - q.shape[1]
        mask = torch.arange(length)[None, :] <= torch.arange(first, length)[:, None]
        out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return out.transpose(0, 1).reshape(q.shape[1], -1)


def small_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, rope_theta=10000.0)
    return LlamaForCausalLM(config).eval()


def small_qwen3(seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         max_position_embeddings=256, rope_theta=1e6)
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():  # weights away from 1, so that a lost norm weight shows in the logits
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.uniform_(0.5, 1.5)
    return model


def serve(requests: list[Request], model, atol: float = 1e-4) -> int:
    """Run the requests to completion, greedy; check every logit row; return the steps run."""
    server = PagedModel(model)
    waiting, running, step = sorted(requests, key=lambda r: r.arrives_at), [], 0
    while waiting or running:
        while waiting and waiting[0].arrives_at <= step:
            request = waiting.pop(0)
            request.tokens = list(request.prompt)
            running.append(request)
        if running:
            logits = server.step(running)
            for request, row in zip(running, logits):
                with torch.no_grad():
                    want = model(torch.tensor([request.tokens])).logits[0, -1]
                torch.testing.assert_close(row, want, rtol=0, atol=atol)
                request.tokens.append(int(row.argmax()))
            for request in [r for r in running
                            if len(r.tokens) - len(r.prompt) == r.max_new_tokens]:
                running.remove(request)
                server.release(request)
        step += 1
    return step


def main() -> None:
    for name, model in (("Llama", small_llama()), ("Qwen3", small_qwen3())):
        rng = np.random.default_rng(0)
        requests = [Request(rng.integers(0, 96, n).tolist(), new, arrives)
                    for n, new, arrives in ((5, 6, 0), (9, 4, 0), (3, 7, 2), (12, 3, 5))]
        steps = serve(requests, model)
        print(f"{name}: {len(requests)} requests served in {steps} steps; every step's logits match "
              f"the model's own forward")
        for request in requests:
            print(f"  prompt {len(request.prompt):2d} tokens -> generated "
                  f"{request.tokens[len(request.prompt):]}")


if __name__ == "__main__":
    main()
