"""Absolute position encodings: sinusoidal tables and learned position tables.

Both add one row per position to the token embeddings, so they share the
fused gather-and-add kernel; the sinusoidal rows are computed in float64 by
the recurrence kernel first.
"""

import functools
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from . import _validate as v
from ._dispatch import kernels
from ._rows import RowOutput, row_index, row_table, trig_work
from ._threads import threads_for


@functools.lru_cache(maxsize=64)
def _sinusoidal_freqs(dim: int, base: float) -> np.ndarray:
    # w_i = base ** (-2i/dim) for the ceil(dim/2) sin columns.  Python's float
    # pow is libm's; NumPy's SIMD power can differ from it by an ulp.
    # Allocated first: an impossible dim fails at once, not after a long loop.
    freqs = np.empty((dim + 1) // 2, dtype=np.float64)
    try:
        for i in range(freqs.size):
            freqs[i] = base ** (-2 * i / dim)
    except OverflowError:  # a base below 1 whose powers pass float64's range
        raise ValueError(f"base = {base!r} gives frequencies base ** (-2*i/dim) past float64's range "
                         f"for dim = {dim}") from None
    freqs.flags.writeable = False
    return freqs


def _fill_sinusoidal(positions: np.ndarray, dim: int, base: float, split: bool,
                     out: np.ndarray) -> np.ndarray:
    # out: (len(positions), dim), any strides.
    if positions.size == 0:
        return out
    freqs = _sinusoidal_freqs(dim, base)
    v.finite_angles(positions, freqs)
    target = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
    threads = threads_for(target.size)
    kernels.sinusoidal_rows(positions, freqs, target, split, trig_work(freqs.size, threads),
                            threads)
    if target is not out:
        out[...] = target
    return out


def sinusoidal_table(length: int, dim: int, *, offset: float = 0, base: float = 10000.0,
                     layout: Literal["interleaved", "split"] = "interleaved",
                     dtype: DTypeLike = np.float32,
                     out: NDArray[np.floating[Any]] | None = None) -> NDArray[np.floating[Any]]:
    """Return the sinusoidal encodings of positions ``offset, offset+1, ...``.

    Pair ``i`` at position ``p`` uses ``w_i = base ** (-2*i/dim)``.  With
    ``layout="interleaved"``, ``PE[p, 2i] = sin(p*w_i)`` and ``PE[p, 2i+1] =
    cos(p*w_i)`` ("Attention Is All You Need"); an odd ``dim`` ends with the
    sin of pair ``(dim-1)/2``.  ``layout="split"`` puts the ``ceil(dim/2)``
    sin columns first, then the ``dim//2`` cos columns.  Angles and sin/cos
    are computed in float64 and rounded once to `dtype`.

    Parameters
    ----------
    length : int
        Number of positions (rows), >= 0.
    dim : int
        Encoding width (columns), >= 1.
    offset : float, optional
        Position of the first row.
    base : float, optional
        Wavelength base, > 0.
    layout : {"interleaved", "split"}, optional
    dtype : {np.float32, np.float64, np.float16, "bfloat16"}, optional
    out : ndarray of shape (length, dim), optional
        Written and returned.

    Returns
    -------
    ndarray of shape (length, dim)

    Examples
    --------
    >>> import posenc_fast as pf
    >>> pf.sinusoidal_table(4, 6).shape
    (4, 6)
    """
    length = v.integer(length, "length", minimum=0)
    dim = v.integer(dim, "dim", minimum=1)
    offset = v.real(offset, "offset")
    base = v.real(base, "base", positive=True)
    split = v.choice(layout, "layout", v.LAYOUTS_SINUSOIDAL) == "split"
    dtype = v.table_dtype(dtype)
    out, _ = v.output(out, "out", (length, dim), dtype)
    if out is None:
        out = v.empty((length, dim), dtype, "length and dim")
    positions = v.with_offset(np.arange(length, dtype=np.float64), offset)
    return _fill_sinusoidal(positions, dim, base, split, out)


def sinusoidal(positions: ArrayLike, dim: int, *, base: float = 10000.0,
               layout: Literal["interleaved", "split"] = "interleaved",
               dtype: DTypeLike = np.float32,
               out: NDArray[np.floating[Any]] | None = None) -> NDArray[np.floating[Any]]:
    """Return the sinusoidal encoding of arbitrary real positions.

    Parameters
    ----------
    positions : array_like of real numbers, any shape
        Integer or real positions (e.g. diffusion timesteps); finite.
    dim, base, layout, dtype
        As in `sinusoidal_table`.
    out : ndarray of shape positions.shape + (dim,), optional

    Returns
    -------
    ndarray of shape positions.shape + (dim,)

    Examples
    --------
    >>> import posenc_fast as pf
    >>> pf.sinusoidal([0.5, 10.0, 999.0], 8).shape
    (3, 8)
    """
    positions = v.positions_array(positions)
    dim = v.integer(dim, "dim", minimum=1)
    base = v.real(base, "base", positive=True)
    split = v.choice(layout, "layout", v.LAYOUTS_SINUSOIDAL) == "split"
    dtype = v.table_dtype(dtype)
    shape = positions.shape + (dim,)
    out, _ = v.output(out, "out", shape, dtype)
    if out is None:
        out = np.empty(shape, dtype=dtype)
    # out.reshape(-1, dim) would be a copy (written, then lost) for an out whose
    # leading axes cannot merge, e.g. Fortran order: fill a C-order target then.
    target = out if out.flags.c_contiguous else np.empty(shape, dtype=dtype)
    _fill_sinusoidal(positions.reshape(-1), dim, base, split, target.reshape(-1, dim))
    if target is not out:
        out[...] = target
    return out


def _leading_positions(x: np.ndarray, positions: ArrayLike | None, offset: float
                       ) -> tuple[NDArray[np.float64], tuple[int, ...]]:
    """Positions for the rows of x (..., seq, dim): (values, index_shape)."""
    if positions is None:
        seq = x.shape[-2]
        return v.with_offset(np.arange(seq, dtype=np.float64), offset), (seq,)
    values = v.positions_array(positions)
    v.broadcast_target(values.shape, x.shape[:-1], "positions", "x.shape[:-1]")
    return v.with_offset(values, offset), values.shape


def _add_rows(x: np.ndarray, table: np.ndarray, index_shape: tuple[int, ...],
              out: np.ndarray | None, in_place: bool) -> np.ndarray:
    rows = RowOutput(x, out, in_place)
    table_rows = row_table(index_shape, x.shape[:-1])
    kernels.add_table_rows(rows.x_rows, rows.rows, table, table_rows, threads_for(x.size))
    return rows.result()


def add_sinusoidal(x: ArrayLike, *, positions: ArrayLike | None = None, offset: float = 0,
                   base: float = 10000.0,
                   out: NDArray[np.floating[Any]] | None = None) -> NDArray[np.floating[Any]]:
    """Return ``x + PE``: x plus the interleaved sinusoidal encoding of each row's position.

    Parameters
    ----------
    x : ndarray of shape (..., seq, dim), float16, bfloat16, float32 or float64
        Token embeddings; the encoding broadcasts over the leading axes.
    positions : array_like of real numbers, optional
        Default ``arange(seq)``.  Any shape that broadcasts against
        ``x.shape[:-1]``, e.g. ``(seq,)`` or ``(batch, seq)``.
    offset : float, optional
        Added to every position (also to explicit `positions`).
    base : float, optional
    out : ndarray of x's shape and dtype, optional
        May be `x` itself (in place).

    Returns
    -------
    ndarray of x's shape and dtype
        The sum is formed in float64 and rounded once.

    Examples
    --------
    >>> import numpy as np, posenc_fast as pf
    >>> x = np.zeros((2, 5, 8), np.float32)
    >>> np.array_equal(pf.add_sinusoidal(x)[1], pf.sinusoidal_table(5, 8))
    True
    """
    x = v.float_array(x, "x", ("seq", "dim"))
    offset = v.real(offset, "offset")
    base = v.real(base, "base", positive=True)
    values, index_shape = _leading_positions(x, positions, offset)
    out, in_place = v.output(out, "out", x.shape, x.dtype, may_be=(x,))
    table = np.empty((values.size, x.shape[-1]), dtype=np.float64)
    if x.shape[-1]:
        _fill_sinusoidal(values.reshape(-1), x.shape[-1], base, False, table)
    return _add_rows(x, table, index_shape, out, in_place)


def add_position_table(x: ArrayLike, table: ArrayLike, positions: ArrayLike | None = None, *,
                       offset: int = 0,
                       out: NDArray[np.floating[Any]] | None = None) -> NDArray[np.floating[Any]]:
    """Return ``x + table[positions]``: add a learned absolute position table (GPT-2).

    Parameters
    ----------
    x : ndarray of shape (..., seq, dim), float16, bfloat16, float32 or float64
    table : ndarray of shape (max_len, dim), float16, bfloat16, float32 or float64
        One learned row per position.  It is read in place (no copy) when its
        last axis is contiguous.
    positions : array_like of int, optional
        Default ``offset + arange(seq)``.  Otherwise an integer array that
        broadcasts against ``x.shape[:-1]`` (``(batch, seq)`` per sequence,
        ``(batch, 1)`` for one decode step per sequence, ...).
    offset : int, optional
        Added to every position (also to explicit `positions`).
    out : ndarray of x's shape and dtype, optional
        May be `x` itself (in place).

    Returns
    -------
    ndarray of x's shape and dtype
        The sum is formed in the wider of x's and table's dtypes and rounded
        once to x's.

    Raises
    ------
    ValueError
        A position outside ``[0, max_len)`` (learned tables do not
        extrapolate), a table of the wrong width; nothing is written.
    TypeError
        Non-float x or table, non-integer positions.

    Examples
    --------
    >>> import numpy as np, posenc_fast as pf
    >>> wpe = np.ones((1024, 4), np.float32)
    >>> pf.add_position_table(np.zeros((1, 3, 4), np.float32), wpe)[0, 0]
    array([1., 1., 1., 1.], dtype=float32)
    """
    x = v.float_array(x, "x", ("seq", "dim"))
    table = v.float_array(table, "table")
    if table.ndim != 2 or table.shape[1] != x.shape[-1]:
        raise ValueError(f"table must have shape (max_len, {x.shape[-1]}) to match "
                         f"x.shape[-1], got {table.shape}")
    offset = v.integer(offset, "offset")
    if positions is None:
        index = np.arange(x.shape[-2], dtype=np.int64)
    else:
        index = v.integer_array(positions)
        v.broadcast_target(index.shape, x.shape[:-1], "positions", "x.shape[:-1]")
    out, in_place = v.output(out, "out", x.shape, x.dtype, may_be=(x,),
                             must_not_overlap=(table,))
    max_len = table.shape[0]
    if index.size:
        # Python ints: no overflow for huge or unsigned positions.
        lowest, highest = int(index.min()) + offset, int(index.max()) + offset
        if lowest < 0 or highest >= max_len:
            raise ValueError(f"positions (plus offset) must lie in [0, max_len={max_len}), got "
                             f"largest {highest} and smallest {lowest}: a learned table has "
                             f"no row for a position outside it")
    if table.strides[1] != table.itemsize:
        table = np.ascontiguousarray(table)
    # index + offset in wrapping uint64 arithmetic: every sum lies in [0, max_len)
    # (checked above), so it is exact even when offset or an unsigned position
    # alone is beyond the int64 range.
    shifted = (index.astype(np.uint64) + np.uint64(offset % 2**64)).astype(np.intp)
    rows = RowOutput(x, out, in_place)
    kernels.add_table_rows(rows.x_rows, rows.rows, table, row_index(shifted, x.shape[:-1]),
                           threads_for(x.size))
    return rows.result()
