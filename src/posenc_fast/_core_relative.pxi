# Kernels of the relative schemes: ALiBi biases, Shaw clipped distances, T5
# buckets.  The ALiBi rows are kernels of csrc/posenc_kernels.h (per ISA
# variant); the integer schemes are compiled once, here.
#
# Every scheme depends on a query and a key only through their distance
# ``d = k_pos - q_pos``, and along a row of a ``(q_len, k_len)`` matrix ``d``
# grows by one per column.
#
# * ALiBi rows are computed on the fly: ``slope * d`` with ``d`` formed
#   exactly in double as ``base + ramp[t]`` (``ramp`` = 0, 1, 2, ... kept in
#   L1), added to the scores in double and rounded once.  In the baseline
#   build the double arithmetic of a float32 row costs more than the memory
#   traffic; the AVX2/AVX-512 variants keep up with memory.
# * Integer schemes (clipped distances, T5 buckets) fill a short vector with
#   one entry per distance that occurs (``q_len + k_len - 1`` of them: entry
#   ``t`` holds ``d = dstart + t``, ``dstart = -(offset + q_len - 1)``), and
#   row ``i`` of the matrix is the slice of it starting at ``t = q_len - 1 - i``.
#
# The kernels trust their inputs: ``relative.py`` has checked types, shapes,
# ranges (every position and distance below 2**53 in magnitude, so exact in
# double) and aliasing, and allocated every array.  They never raise, never
# allocate and run without the GIL; no result depends on the thread count.

from libc.math cimport logf
from libc.stdint cimport int64_t

# 0, 1, 2, ... and 0, -1, -2, ...: read-only after import.
cdef double _RAMP_UP[POSENC_RAMP]
cdef double _RAMP_DOWN[POSENC_RAMP]
for _t in range(POSENC_RAMP):
    _RAMP_UP[_t] = _t
    _RAMP_DOWN[_t] = -_t


# ---------------------------------------------------------------------------
# ALiBi

cdef struct AlibiCall:
    posenc_alibi_fn span    # fill, add, or add in place
    Py_ssize_t itemsize


cdef inline void _alibi_span(const AlibiCall* call, const char* x, char* out, double slope,
                             double start, double step, Py_ssize_t n) noexcept nogil:
    # out[j] = (x[j] +) slope * (start + step*j).
    call.span(x, out, slope, start, step, &_RAMP_UP[0] if step > 0 else &_RAMP_DOWN[0], n)


cdef inline void _alibi_row(const AlibiCall* call, const char* x, char* out, double slope,
                            double q_pos, bint causal, Py_ssize_t k_len) noexcept nogil:
    # Bias slope * d with d = j - q_pos (causal) or -|j - q_pos|.  Right of the
    # diagonal the non-causal distance is q_pos - j, formed by counting down
    # so that the diagonal holds +0.0 as in the causal case.
    cdef Py_ssize_t split
    if causal:
        _alibi_span(call, x, out, slope, -q_pos, 1.0, k_len)
        return
    split = <Py_ssize_t>min(max(q_pos, 0.0), <double>k_len)
    _alibi_span(call, x, out, slope, -q_pos, 1.0, split)
    _alibi_span(call, x + split * call.itemsize if x != NULL else NULL,
                out + split * call.itemsize, slope, q_pos - split, -1.0, k_len - split)


cdef struct AlibiJob:
    # _alibi_rows' call, for the pool: items of rows_per_item rows.
    const AlibiCall* call
    const char* x
    char* out
    Py_ssize_t nrows
    Py_ssize_t rows_per_item
    Py_ssize_t k_len
    const double* slopes
    Py_ssize_t heads
    Py_ssize_t q_len
    int64_t offset
    bint causal


cdef void _alibi_item(void* job_, Py_ssize_t item, int slot) noexcept nogil:
    # Row r is query q of head h: counted along the rows, not divided per row.
    cdef const AlibiJob* job = <const AlibiJob*>job_
    cdef Py_ssize_t r = item * job.rows_per_item, row_bytes = job.k_len * job.call.itemsize
    cdef Py_ssize_t q = r % job.q_len, h = (r // job.q_len) % job.heads
    for r in range(r, min(r + job.rows_per_item, job.nrows)):
        _alibi_row(job.call, job.x + r * row_bytes if job.x != NULL else NULL,
                   job.out + r * row_bytes, job.slopes[h], <double>(job.offset + q), job.causal,
                   job.k_len)
        q += 1
        if q == job.q_len:
            q = 0
            h = h + 1 if h + 1 < job.heads else 0


cdef void _alibi_rows(const AlibiCall* call, const char* x, char* out, Py_ssize_t nrows,
                      Py_ssize_t k_len, const double* slopes, Py_ssize_t heads,
                      Py_ssize_t q_len, int64_t offset, bint causal,
                      int num_threads) noexcept nogil:
    # Rows of k_len values, C-contiguous; x is NULL (fill) or may be out.
    cdef Py_ssize_t per_item = _rows_per_item(k_len)
    cdef AlibiJob job = AlibiJob(call, x, out, nrows, per_item, k_len, slopes, heads, q_len,
                                 offset, causal)
    posenc_parallel_for((nrows + per_item - 1) // per_item, num_threads, _alibi_item, &job)


def alibi_fill_rows(cnp.ndarray out not None, cnp.ndarray slopes not None, Py_ssize_t q_len,
                    int64_t offset, bint causal, int num_threads):
    """out[r, j] = the ALiBi bias of row r, column j, rounded once to out's dtype.

    Row r is query i = r % q_len (position offset + i) of head
    h = (r // q_len) % len(slopes); the bias is ``slopes[h] * d`` with
    ``d = j - (offset + i)``, or ``slopes[h] * -|d|`` if not causal, formed in
    double.  out: C-contiguous (rows, k_len); slopes: contiguous float64.
    """
    cdef AlibiCall call
    call.span = K.alibi_fill[_dtype(out)]
    call.itemsize = cnp.PyArray_ITEMSIZE(out)
    cdef char* op = _data(out)
    cdef const double* sp = <const double*>_data(slopes)
    if out.shape[0] == 0 or out.shape[1] == 0:
        return
    with nogil:
        _alibi_rows(&call, NULL, op, out.shape[0], out.shape[1], sp, slopes.shape[0], q_len,
                    offset, causal, num_threads)


def alibi_add_rows(cnp.ndarray x not None, cnp.ndarray out not None, cnp.ndarray slopes not None,
                   Py_ssize_t q_len, int64_t offset, bint causal, int num_threads):
    """out[r, j] = x[r, j] + the bias of `alibi_fill_rows`, in double, rounded once.

    x, out: C-contiguous (rows, k_len) of one dtype; `out` may be `x` (in place).
    """
    cdef AlibiCall call
    cdef int d = _dtype(x)
    call.span = K.alibi_add_in_place[d] if _data(x) == _data(out) else K.alibi_add[d]
    call.itemsize = cnp.PyArray_ITEMSIZE(x)
    cdef const char* xp = _data(x)
    cdef char* op = _data(out)
    cdef const double* sp = <const double*>_data(slopes)
    if x.shape[0] == 0 or x.shape[1] == 0:
        return
    with nogil:
        _alibi_rows(&call, xp, op, x.shape[0], x.shape[1], sp, slopes.shape[0], q_len, offset,
                    causal, num_threads)


# ---------------------------------------------------------------------------
# integer schemes: one vector entry per distance, then rows are slices of it

def clipped_vector(int64_t dstart, int64_t max_distance, int64_t[::1] out):
    """out[t] = clip(d, -max_distance, max_distance) + max_distance; d = dstart + t."""
    cdef Py_ssize_t t
    cdef int64_t d
    with nogil:
        for t in range(out.shape[0]):
            d = dstart + t
            out[t] = min(max(d, -max_distance), max_distance) + max_distance


def t5_bucket_vector(int64_t dstart, bint bidirectional, int64_t num_buckets, float log_ratio,
                     int64_t[::1] out):
    """out[t] = T5's bucket of the relative position d = dstart + t.

    The arithmetic is transformers' ``T5Attention._relative_position_bucket``
    step by step in float32 (torch computes it so; a bucket boundary that
    falls exactly on an integer distance depends on those roundings):
    ``max_exact + int(log(float(r) / max_exact) / log_ratio * (n - max_exact))``
    with ``log_ratio`` = float32 of ``math.log(max_distance / max_exact)``.
    Requires max_exact >= 1 and log_ratio > 0 (checked by the caller).
    """
    cdef int64_t n = num_buckets // 2 if bidirectional else num_buckets
    cdef int64_t max_exact = n // 2
    cdef int64_t d, r, first, bucket
    cdef float scaled
    cdef Py_ssize_t t
    with nogil:
        for t in range(out.shape[0]):
            d = dstart + t
            first = 0
            if bidirectional:
                if d > 0:
                    first = n
                r = -d if d < 0 else d
            else:
                r = -d if d < 0 else 0
            if r < max_exact:
                bucket = r
            else:
                scaled = logf(<float>r / <float>max_exact) / log_ratio
                scaled = scaled * <float>(n - max_exact)
                # min(max_exact + int(scaled), n - 1), without converting a
                # scaled beyond the int64 range (undefined behaviour in C).
                if <double>scaled >= <double>(n - 1 - max_exact):
                    bucket = n - 1
                else:
                    bucket = max_exact + <int64_t>scaled
            out[t] = first + bucket


cdef struct DiagonalJob:
    # diagonal_rows' call, for the pool.
    const int64_t* vector
    int64_t* out
    Py_ssize_t q_len
    Py_ssize_t k_len
    Py_ssize_t rows_per_item


cdef void _diagonal_item(void* job_, Py_ssize_t item, int slot) noexcept nogil:
    cdef const DiagonalJob* job = <const DiagonalJob*>job_
    cdef Py_ssize_t i
    for i in range(item * job.rows_per_item, min((item + 1) * job.rows_per_item, job.q_len)):
        memcpy(job.out + i * job.k_len, job.vector + job.q_len - 1 - i, job.k_len * sizeof(int64_t))


def diagonal_rows(const int64_t[::1] vector, int64_t[:, ::1] out, int num_threads):
    """out[i, :] = vector[q_len - 1 - i : q_len - 1 - i + k_len] for out of shape (q_len, k_len).

    `vector` has q_len + k_len - 1 entries.
    """
    if out.shape[0] == 0 or out.shape[1] == 0:
        return  # before &vector[0]: an empty vector has no element 0
    cdef DiagonalJob job = DiagonalJob(&vector[0], &out[0, 0], out.shape[0], out.shape[1],
                                       _rows_per_item(out.shape[1]))
    with nogil:
        posenc_parallel_for((job.q_len + job.rows_per_item - 1) // job.rows_per_item, num_threads,
                            _diagonal_item, &job)
