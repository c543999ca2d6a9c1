"""RoPE frequencies and attention factor for each scaling method (float64).

Placeholder with "default" and "linear" only; the full set of methods lands
with the long-context issue.
"""

import numpy as np


class RopeFrequencies:
    """Frequencies of one rotary embedding configuration."""

    depends_on_length = False

    def __init__(self, rope_type, params, inv_freq, attention_factor):
        self.rope_type = rope_type
        self.params = params
        inv_freq.flags.writeable = False
        self.inv_freq = inv_freq
        self.attention_factor = attention_factor

    def inv_freq_for(self, seq_len):
        return self.inv_freq

    def attention_factor_for(self, seq_len):
        return self.attention_factor


def resolve_rope_scaling(scaling, *, rotary_dim, base):
    inv_freq = base ** (-2 * np.arange(rotary_dim // 2) / rotary_dim)
    if scaling is None:
        return RopeFrequencies("default", None, inv_freq, 1.0)
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type == "default":
        return RopeFrequencies("default", dict(scaling), inv_freq, 1.0)
    if rope_type == "linear":
        return RopeFrequencies("linear", dict(scaling), inv_freq / float(scaling["factor"]), 1.0)
    raise ValueError(f"scaling: unknown rope_type {rope_type!r}")
