"""The C and Cython API from Python: its include folder and the capsules it takes.

The API itself (``include/posenc_fast.h``, ``include/posenc_fast/capi.pxd``)
is a table of C functions in ``_core`` (``_core_capi.pxi``), lent to other
extensions through the capsule ``posenc_fast._C_API``; docs/capi.md has the
recipes.
"""

from pathlib import Path
from typing import Any

from numpy.typing import DTypeLike

from . import _validate as v
from ._dispatch import kernels
from .rotary import RotaryEmbedding

_C_API = kernels._C_API


def get_include() -> str:
    """Return the folder of ``posenc_fast.h`` and of ``posenc_fast/capi.pxd``.

    Pass it as ``include_dirs`` of a C extension and as ``include_path`` of
    ``cythonize`` (then ``cimport posenc_fast.capi``).
    """
    return str(Path(__file__).resolve().parent / "include")


def rotary_table_capsule(rope: RotaryEmbedding, num_positions: int, *,
                         dtype: DTypeLike = "float32") -> Any:
    """Lend `rope`'s canonical cos/sin table to compiled code (``rotate_rotary``).

    Parameters
    ----------
    rope : RotaryEmbedding
    num_positions : int
        The table covers positions ``[0, num_positions)``; a C call with
        another position returns ``POSENC_FAST_ERR_RANGE``.
    dtype : {"float32", "float64", "float16", "bfloat16"}, optional
        The dtype of the rows it will rotate (the table is float32 for the
        half types).

    Returns
    -------
    capsule named ``"posenc_fast.rotary_table"``
        Its pointer (``PyCapsule_GetPointer(capsule,
        POSENC_FAST_ROTARY_CAPSULE)``) is valid while the capsule lives.

    Raises
    ------
    ValueError
        If `num_positions` reaches positions whose frequencies differ
        (dynamic scalings) or past the table size a RotaryEmbedding caches,
        or `rope` has several position streams (its rows need a position
        per stream, not one per row).
    """
    if not isinstance(rope, RotaryEmbedding):
        raise TypeError(f"rope must be a RotaryEmbedding, got {type(rope).__name__}")
    if rope.n_streams != 1:
        raise ValueError(f"rotary_table_capsule rotates a row by one position; this embedding has {rope.n_streams} "
                         f"position streams (rotate its rows by apply, with a position per stream)")
    num_positions = v.integer(num_positions, "num_positions", minimum=1)
    return kernels.rotary_table_capsule(rope, v.table_dtype(dtype), num_positions)
