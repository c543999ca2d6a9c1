"""posenc_fast: fast, exact positional encodings for transformer models on the CPU."""

from ._capi import _C_API, get_include, rotary_table_capsule  # noqa: F401
from ._cos_sin import apply_rotary_cos_sin, apply_rotary_cos_sin_qk
from ._info import build_info
from ._threads import get_num_threads, set_num_threads
from ._version import __version__
from .absolute import add_position_table, add_sinusoidal, sinusoidal, sinusoidal_table
from .relative import (add_alibi, alibi_bias, alibi_slopes, relative_position_index,
                       t5_relative_bucket)
from .rotary import RotaryEmbedding, apply_rotary

__all__ = [
    "RotaryEmbedding",
    "__version__",
    "add_alibi",
    "add_position_table",
    "add_sinusoidal",
    "alibi_bias",
    "alibi_slopes",
    "apply_rotary",
    "apply_rotary_cos_sin",
    "apply_rotary_cos_sin_qk",
    "build_info",
    "get_include",
    "get_num_threads",
    "relative_position_index",
    "rotary_table_capsule",
    "set_num_threads",
    "sinusoidal",
    "sinusoidal_table",
    "t5_relative_bucket",
]
