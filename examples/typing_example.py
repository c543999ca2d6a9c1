"""Every public name of posenc_fast in one typed script.

``tests/test_typing.py`` checks it with ``mypy --strict``: the annotations
and stubs of the package must let ordinary code type-check.  It also runs:
``python examples/typing_example.py`` prints what it made.
"""

from typing import Any

import numpy as np
from numpy.typing import NDArray

import posenc_fast as pf

Floats = NDArray[np.floating[Any]]


def absolute() -> list[Floats]:
    """Sinusoidal tables and learned position tables."""
    table = pf.sinusoidal_table(16, 8, offset=4, layout="split", dtype=np.float64)
    timesteps = pf.sinusoidal([0.5, 10.0, 999.0], 8, base=10000.0)
    x = np.zeros((2, 16, 8), dtype=np.float32)
    pf.add_sinusoidal(x, offset=3, out=x)
    wpe = np.ones((64, 8), dtype=np.float32)
    learned = pf.add_position_table(x, wpe, np.arange(16), offset=1)
    return [table, timesteps, x, learned]


def rotary() -> list[Floats]:
    """RotaryEmbedding, its attributes and methods, and the one-call shortcuts."""
    rope = pf.RotaryEmbedding(64, base=500000.0, rotary_dim=32, layout="half",
                              scaling={"rope_type": "linear", "factor": 2.0})
    facts: tuple[int, int, str, float, float] = (rope.dim, rope.rotary_dim, rope.layout,
                                                 rope.base, rope.attention_factor)
    scaling: dict[str, Any] | None = rope.scaling
    inv_freq: NDArray[np.float64] = rope.inv_freq
    longest: NDArray[np.float64] = rope.inv_freq_for(4096)
    print(facts, scaling, inv_freq.shape, longest.shape)

    q = np.ones((1, 8, 10, 64), dtype=np.float32)
    k = np.ones((1, 2, 10, 64), dtype=np.float32)
    q_rot = rope.apply(q, offset=100)
    rope.apply(q_rot, np.arange(10), inverse=True, out=q_rot)
    q_rot, k_rot = rope.apply_qk(q, k, offset=5, seq_axis=-2)
    cos, sin = rope.cos_sin(np.arange(10), dtype=np.float32)
    tokens = pf.apply_rotary(np.ones((5, 4, 64), dtype=np.float64), np.arange(5)[:, None],
                             interpolation_factor=4.0, rotary_dim=32)

    config = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4,
              "max_position_embeddings": 2048, "rope_theta": 10000.0}
    llama = pf.RotaryEmbedding.from_hf_config(config)
    print(repr(llama))

    # Bring your own cos/sin (Hugging Face's apply_rotary_pos_emb arguments).
    half_cos, half_sin = cos[:, :16], sin[:, :16]
    own = pf.apply_rotary_cos_sin(q, half_cos, half_sin, layout="half")
    own_q, own_k = pf.apply_rotary_cos_sin_qk(q, k, half_cos, half_sin, np.arange(10),
                                              inverse=True)
    return [q_rot, k_rot, cos, sin, tokens, own, own_q, own_k]


def relative() -> list[NDArray[Any]]:
    """ALiBi and relative position buckets."""
    slopes: NDArray[np.float64] = pf.alibi_slopes(12)
    bias = pf.alibi_bias(12, 1, 20, offset=19, causal=True, dtype=np.float32)
    scores = np.zeros((2, 12, 20, 20), dtype=np.float32)
    pf.add_alibi(scores, out=scores)
    shaw = pf.relative_position_index(8, 10, max_distance=4)
    t5 = pf.t5_relative_bucket(8, bidirectional=False, num_buckets=32, max_distance=128)
    return [slopes, bias, scores, shaw, t5]


def main() -> None:
    """Use every public name once and print what came out."""
    info: dict[str, Any] = pf.build_info()
    previous: int = pf.get_num_threads()
    pf.set_num_threads(1)
    print(f"posenc_fast {pf.__version__} ({info['isa_in_use']})")
    for array in absolute() + rotary() + relative():
        print(array.dtype, array.shape)
    include: str = pf.get_include()  # the C API: its header's folder, and a table lent to compiled code
    capsule: Any = pf.rotary_table_capsule(pf.RotaryEmbedding(64), 128, dtype=np.float32)
    print(include.endswith("include"), type(capsule).__name__)
    pf.set_num_threads(previous)


if __name__ == "__main__":
    main()
