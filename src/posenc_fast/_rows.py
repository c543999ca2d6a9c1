"""Plumbing between validated arrays and the row kernels.

The kernels work on C-contiguous 2-D arrays of rows plus a row table that
says which table row each data row uses.  This module builds those views
(copying only what is not contiguous) and writes results back into a
non-contiguous ``out``.
"""

import math

import numpy as np

from . import _validate as v
from ._dispatch import kernels
from ._threads import threads_for


def row_index(index: np.ndarray, rows_shape: tuple) -> np.ndarray:
    """Broadcast integer table rows `index` to `rows_shape`: the contiguous intp
    row table the kernels take (one entry per row, C order)."""
    broadcast = np.broadcast_to(index.astype(np.intp, copy=False), rows_shape)
    return np.ascontiguousarray(broadcast).reshape(-1)


def row_table(index_shape: tuple, rows_shape: tuple) -> np.ndarray:
    """Map every row of an array with leading shape `rows_shape` to a table row.

    The table has one row per element of an array of shape `index_shape`
    (which broadcasts to `rows_shape`), in C order.
    """
    return row_index(np.arange(math.prod(index_shape)).reshape(index_shape), rows_shape)


def as_rows(a: np.ndarray) -> np.ndarray:
    """View `a` of shape (..., n) as C-contiguous (rows, n); copy if it is not C-contiguous."""
    a = np.ascontiguousarray(a)
    return a.reshape(math.prod(a.shape[:-1]), a.shape[-1])


class RowOutput:
    """Where a row kernel writes, and how that becomes the returned array.

    Parameters
    ----------
    x : ndarray
        The validated input, of the result's shape and dtype.
    out : ndarray or None
        The validated ``out`` (None: allocate).
    in_place : bool
        True when ``out`` is ``x`` itself.
    """

    def __init__(self, x: np.ndarray, out: np.ndarray | None, in_place: bool):
        self.x_rows = as_rows(x)
        self.out = out
        if out is not None and in_place:
            # Contiguous x: rotate in x's own memory; else in the copy as_rows made.
            self.rows = self.x_rows
        elif out is not None and out.flags.c_contiguous:
            self.rows = out.reshape(self.x_rows.shape)
        else:
            self.rows = np.empty(self.x_rows.shape, dtype=x.dtype)
        self.shape = x.shape

    def result(self) -> np.ndarray:
        """Return the result array, copying into a non-contiguous ``out`` if needed."""
        if self.out is None:
            return self.rows.reshape(self.shape)
        if not np.shares_memory(self.rows, self.out):
            np.copyto(self.out, self.rows.reshape(self.shape))
        return self.out


def trig_work(nfreqs: int, num_threads: int) -> np.ndarray:
    """Scratch for the trig kernels: shared step rotations plus per-thread state."""
    return np.empty((kernels.trig_work_rows(num_threads), max(nfreqs, 1)), dtype=np.float64)


def cos_sin_table(positions: np.ndarray, freqs: np.ndarray, scale: float, dtype: np.dtype,
                  out: tuple[np.ndarray, np.ndarray] | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Return (cos, sin) of shape (len(positions), len(freqs)): scale * cos/sin(p * f).

    `out`: two (len(positions), len(freqs)) arrays to fill; either is used
    directly when its last axis is contiguous, else a new array is returned
    in its place (the caller copies).
    """
    v.finite_angles(positions, freqs)
    nrows, nfreqs = positions.shape[0], freqs.shape[0]
    targets = []
    for given in (None, None) if out is None else out:
        usable = given is not None and (given.shape[1] <= 1 or given.strides[1] == given.itemsize)
        targets.append(given if usable else np.empty((nrows, nfreqs), dtype=dtype))
    threads = threads_for(nrows * nfreqs)
    kernels.cos_sin_rows(positions, freqs, scale, targets[0], targets[1],
                         trig_work(nfreqs, threads), threads)
    return targets[0], targets[1]


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, index: np.ndarray, half: bool,
            inverse: bool, out: np.ndarray | None, in_place: bool, start: int = 0) -> np.ndarray:
    """Rotate every row of `x` by cos/sin row `index[r]` (rows in C order) into `out`
    (features from `start` on rotate)."""
    rows = RowOutput(x, out, in_place)
    kernels.rotate_rows(rows.x_rows, rows.rows, cos, sin, index, half, inverse,
                        threads_for(x.size), start)
    return rows.result()
