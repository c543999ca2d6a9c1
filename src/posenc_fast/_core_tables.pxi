# Tables: cos/sin and sinusoidal rows (the canonical values of
# csrc/posenc_trig.h), and adding a table row to every row of x.


def trig_work_rows(int num_threads):
    """Rows of the float64 scratch array the trig kernels need for `num_threads`."""
    return POSENC_TRIG_SHARED_ROWS + POSENC_TRIG_THREAD_ROWS * num_threads


def cos_sin_rows(cnp.ndarray positions not None, cnp.ndarray freqs not None, double scale,
                 cnp.ndarray cos_out not None, cnp.ndarray sin_out not None,
                 cnp.ndarray work not None, int num_threads):
    """cos_out[r, i] = scale*cos(positions[r]*freqs[i]); sin_out likewise.

    positions, freqs: contiguous float64.  The outputs (2-D, one dtype) need
    unit stride along their last axis; their row stride is free.  `work`:
    contiguous float64 of shape (trig_work_rows(num_threads), len(freqs)).
    """
    cdef Py_ssize_t nrows = positions.shape[0], n = freqs.shape[0], b
    cdef Py_ssize_t nchunks = (nrows + POSENC_TRIG_CHUNK_ROWS - 1) // POSENC_TRIG_CHUNK_ROWS
    cdef Py_ssize_t itemsize = cnp.PyArray_ITEMSIZE(cos_out)
    cdef Py_ssize_t cos_stride = cnp.PyArray_STRIDE(cos_out, 0) // itemsize
    cdef Py_ssize_t sin_stride = cnp.PyArray_STRIDE(sin_out, 0) // itemsize
    cdef posenc_cos_sin_fn fill = K.cos_sin[_dtype(cos_out)]
    cdef const double* p = <const double*>_data(positions)
    cdef const double* f = <const double*>_data(freqs)
    cdef double* w = <double*>_data(work)
    cdef char* co = _data(cos_out)
    cdef char* so = _data(sin_out)
    cdef posenc_trig_steps steps
    if nrows == 0 or n == 0:
        return
    with nogil:
        posenc_trig_steps_init(&steps, f, w, n)
        for b in prange(nchunks, num_threads=num_threads, schedule="static"):
            fill(p, b * POSENC_TRIG_CHUNK_ROWS, min((b + 1) * POSENC_TRIG_CHUNK_ROWS, nrows),
                 &steps, w + (POSENC_TRIG_SHARED_ROWS + POSENC_TRIG_THREAD_ROWS * threadid()) * n,
                 scale, co, cos_stride, so, sin_stride)


def sinusoidal_rows(cnp.ndarray positions not None, cnp.ndarray freqs not None,
                    cnp.ndarray out not None, bint split, cnp.ndarray work not None,
                    int num_threads):
    """out[r] = the sinusoidal encoding of positions[r] (len(freqs) == ceil(dim/2)).

    `out`: C-contiguous (rows, dim); `work` as for `cos_sin_rows`.
    """
    cdef Py_ssize_t nrows = positions.shape[0], n = freqs.shape[0], dim = out.shape[1], b
    cdef Py_ssize_t nchunks = (nrows + POSENC_TRIG_CHUNK_ROWS - 1) // POSENC_TRIG_CHUNK_ROWS
    cdef posenc_sinusoidal_fn fill = K.sinusoidal[_dtype(out)]
    cdef const double* p = <const double*>_data(positions)
    cdef const double* f = <const double*>_data(freqs)
    cdef double* w = <double*>_data(work)
    cdef char* o = _data(out)
    cdef posenc_trig_steps steps
    if nrows == 0 or n == 0:
        return
    with nogil:
        posenc_trig_steps_init(&steps, f, w, n)
        for b in prange(nchunks, num_threads=num_threads, schedule="static"):
            fill(p, b * POSENC_TRIG_CHUNK_ROWS, min((b + 1) * POSENC_TRIG_CHUNK_ROWS, nrows),
                 &steps, w + (POSENC_TRIG_SHARED_ROWS + POSENC_TRIG_THREAD_ROWS * threadid()) * n,
                 o, dim, split)


def add_table_rows(cnp.ndarray x not None, cnp.ndarray out not None, cnp.ndarray table not None,
                   cnp.ndarray row_table not None, int num_threads):
    """out[r] = x[r] + table[row_table[r]], in the wider dtype, rounded once.

    x, out: C-contiguous (rows, dim) of one dtype, `out` may be `x`; `table`
    needs unit stride along its last axis; row_table: contiguous intp.
    """
    cdef Py_ssize_t nrows = x.shape[0], dim = x.shape[1], r
    cdef Py_ssize_t row_bytes = dim * cnp.PyArray_ITEMSIZE(x)
    cdef Py_ssize_t table_stride = cnp.PyArray_STRIDE(table, 0)
    cdef bint in_place = _data(x) == _data(out)
    cdef int d = _dtype(x), t = _dtype(table)
    cdef posenc_add_fn add = K.add_in_place[d][t] if in_place else K.add[d][t]
    cdef const Py_ssize_t* rows = <const Py_ssize_t*>_data(row_table)
    cdef char* xp = _data(x)
    cdef char* op = _data(out)
    cdef char* tp = _data(table)
    if nrows == 0 or dim == 0:
        return
    with nogil:
        for r in prange(nrows, num_threads=num_threads, schedule="static"):
            add(xp + r * row_bytes, op + r * row_bytes, tp + rows[r] * table_stride, dim)
