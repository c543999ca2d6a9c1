# RMSNorm of each q/k head row, then RoPE, in one pass over the row
# (posenc_fast._qk_norm: RotaryEmbedding.apply_qk_norm and vLLM-style calls).
#
# A row is widened to float32 (float64 for float64 data) in a per-thread
# scratch row, its sum of squares taken (K.sum_squares: in float64, 32 running
# sums in a fixed order, the same in every variant), scaled by
# 1 / sqrt(sum / dim + eps) and by its weight (K.scale_row), rotated by the
# float32 (float64) row kernel, and stored, a half type rounded once: to the
# next row of `out`, or (a paged KV cache) to the byte offset of its own row.
# A row's scale (two divisions and a square root, each waiting on the last)
# is formed before the next row's sum, which runs meanwhile.

from libc.math cimport sqrt


cdef struct NormJob:
    const Py_ssize_t* rows   # the cos/sin table row of each row of x
    const char* x
    char* out
    CosSinTable table
    Py_ssize_t nrows
    Py_ssize_t dim
    Py_ssize_t itemsize
    const long long* out_at  # each row's byte offset in out (-1: not stored), or NULL: rows in order
    int store                # out's dtype index: x's, or a half type for float32 x
    const double* weight     # dim factors: weight_offset + weight
    const float* weight32    # the same rounded to float32 (float32 arithmetic)
    double eps
    int data                 # x's dtype index
    char* scratch            # NORM_SCRATCH_ROWS * dim compute items per thread
    const RowCall* call      # the compute dtype's rotation of one row


cdef enum:
    NORM_SCRATCH_ROWS = 3  # two rows in the compute type (this one, the next), one rotated


cdef inline Py_ssize_t _scratch_row_bytes(Py_ssize_t dim, Py_ssize_t size) noexcept nogil:
    # A scratch row's bytes, whole vectors (64 bytes): each row starts on a vector
    # boundary (stores splitting cache lines cost: posenc_prefetch_for_write).
    return (dim * size + 63) // 64 * 64


cdef inline const char* _norm_input(const NormJob* job, int compute, Py_ssize_t r,
                                    char* widened) noexcept nogil:
    # Row r in the compute type: x's own row, or (a half type) widened into `widened`.
    cdef const char* row = job.x + r * job.dim * job.itemsize
    if job.data == compute:
        return row
    K.to_f32[job.data](row, widened, job.dim)
    return widened


@cython.cdivision(True)
cdef void _norm_rotate_chunk(void* job_, Py_ssize_t chunk, int slot) noexcept nogil:
    # Each row: in the compute type (widened into a scratch row: a half type), its sum
    # of squares taken while the row before is scaled, normalized into a scratch row,
    # rotated into its output row, or into a scratch row narrowed on store (a half type).
    cdef const NormJob* job = <const NormJob*>job_
    cdef Py_ssize_t r, dim = job.dim
    cdef Py_ssize_t first = chunk * POSENC_ROW_CHUNK, stop = min(first + POSENC_ROW_CHUNK, job.nrows)
    cdef int compute = POSENC_F64 if job.data == POSENC_F64 else POSENC_F32
    cdef Py_ssize_t row_bytes = _scratch_row_bytes(dim, 8 if compute == POSENC_F64 else 4)
    cdef char* buffers = job.scratch + slot * NORM_SCRATCH_ROWS * row_bytes
    cdef char* rotated = buffers + 2 * row_bytes
    cdef const void* weight = (<const void*>job.weight if compute == POSENC_F64
                               else <const void*>job.weight32)
    cdef const char* row
    cdef const char* next_row = NULL
    cdef char* normed
    cdef char* out_row
    cdef double total, next_total = 0.0, scale
    if first < stop:
        next_row = _norm_input(job, compute, first, buffers)
        next_total = K.sum_squares[compute](next_row, dim)
    for r in range(first, stop):
        row, total = next_row, next_total
        scale = 1.0 / sqrt(total / <double>dim + job.eps)
        if r + 1 < stop:
            next_row = _norm_input(job, compute, r + 1, buffers + ((r + 1 - first) & 1) * row_bytes)
            next_total = K.sum_squares[compute](next_row, dim)
        if job.out_at == NULL:
            out_row = job.out + r * dim * job.itemsize
        elif job.out_at[r] < 0:
            continue
        else:
            out_row = job.out + job.out_at[r]
        # a widened row is normalized where it lies; x's own row into the scratch row not holding the next
        normed = <char*>row if job.data != compute else buffers + ((r - first + 1) & 1) * row_bytes
        K.scale_row[compute](row, normed, weight, dim, scale)
        if job.store == compute:
            _rotate_row_by(normed, out_row, &job.table, job.rows[r], job.call)
        else:
            _rotate_row_by(normed, rotated, &job.table, job.rows[r], job.call)
            K.from_f32[job.store](rotated, out_row, dim)


def norm_rotate_rows(cnp.ndarray x not None, cnp.ndarray out not None,
                     cnp.ndarray weight not None, double eps, cnp.ndarray cos_table not None,
                     cnp.ndarray sin_table not None, cnp.ndarray row_table not None,
                     bint half_layout, int num_threads, Py_ssize_t start=0,
                     cnp.ndarray out_at=None):
    """RMSNorm each row r of x over its dim features (scaled by `weight`), rotate it by table
    row row_table[r], write it to out.

    x, out: C-contiguous (rows, dim) of one dtype, `out` may be `x`; or, with
    `out_at` (C-contiguous int64 (rows,)), row r goes to byte out_at[r] of
    `out` (-1: nowhere), any array of x's dtype or a half type for float32
    x (rows contiguous, apart, in bounds: the caller's checks); weight:
    C-contiguous float64 (dim,), the factors (Gemma's ``1 + w`` already
    added); cos/sin tables: 2-D float32 (float64 for float64 x), unit stride
    along their last axis; row_table: intp (rows,); features [start, start +
    2 * cos_table.shape[1]) rotate.
    """
    cdef Py_ssize_t nrows = x.shape[0], dim = x.shape[1]
    cdef Py_ssize_t nchunks = (nrows + POSENC_ROW_CHUNK - 1) // POSENC_ROW_CHUNK
    cdef int data = _dtype(x), store = _dtype(out)
    cdef int compute = POSENC_F64 if data == POSENC_F64 else POSENC_F32
    cdef Py_ssize_t compute_size = 8 if compute == POSENC_F64 else 4
    cdef RowCall call = _row_call(compute, _dtype(cos_table), compute_size,
                                  cnp.PyArray_ITEMSIZE(cos_table), cos_table.shape[1], dim,
                                  half_layout, False, False, 0, start)
    cdef cnp.ndarray scratch
    cdef cnp.ndarray weight32
    cdef const long long* at = NULL if out_at is None else <const long long*>cnp.PyArray_DATA(out_at)
    if (call.rotate == NULL or (data != compute and K.to_f32[data] == NULL)
            or (store != data and (out_at is None or compute != POSENC_F32 or K.from_f32[store] == NULL))):
        raise TypeError(f"no fused norm and rotation for {x.dtype} data with a "
                        f"{cos_table.dtype} table into {out.dtype}")
    if nrows == 0 or dim == 0:
        return
    import numpy
    weight32 = weight.astype(numpy.float32)
    scratch = cnp.PyArray_EMPTY(
        1, [max(num_threads, 1) * NORM_SCRATCH_ROWS * _scratch_row_bytes(dim, compute_size) + 64],
        cnp.NPY_UINT8, 0)
    cdef NormJob job = NormJob(<const Py_ssize_t*>_data(row_table), _data(x), _data(out),
                               _table_from(cos_table, sin_table), nrows, dim, cnp.PyArray_ITEMSIZE(x),
                               at, store,
                               <const double*>_data(weight), <const float*>_data(weight32), eps,
                               data, _data(scratch) + ((64 - (<size_t>_data(scratch) & 63)) & 63), &call)
    with nogil:
        posenc_parallel_for(nchunks, num_threads, _norm_rotate_chunk, &job)
