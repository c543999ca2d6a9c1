# The C API (include/posenc_fast.h): the table of functions the capsule
# posenc_fast._C_API lends to compiled callers, and the capsules of
# RotaryEmbedding tables.
#
# Unlike the loops above, these functions trust nothing: they check every
# pointer, size, stride, value and overlap (returning a posenc_fast_status,
# having written nothing), then run the loops of the Python API on the
# kernel table K in use, so that results are bitwise the Python API's.

include "include/posenc_fast/capi.pxd"

from cpython.pycapsule cimport PyCapsule_New
from cpython.pyport cimport PY_SSIZE_T_MAX
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
from libc.math cimport fabs, isfinite, pow
from libc.stdlib cimport free, malloc

cdef extern from *:
    """
    struct posenc_fast_rotary {
        int dtype;                /* posenc_fast_dtype */
        Py_ssize_t dim, npairs, start, rows;  /* features [start, start + 2*npairs) rotate */
        int half, unit_factor;
        const char* table;        /* (rows, 2, npairs): the cos then the sin row of each position */
        PyObject* owner;          /* the table's array (a reference) */
    };
    """
    ctypedef struct RotaryTable "struct posenc_fast_rotary":
        int dtype
        Py_ssize_t dim, npairs, start, rows
        int half, unit_factor
        const char* table
        PyObject* owner

# |offset| of ALiBi (relative.MAX_OFFSET): distances stay exact in double.
cdef long long _MAX_ALIBI_OFFSET = 1LL << 52


cdef inline int _kernel_dtype(int dtype, Py_ssize_t* itemsize) noexcept nogil:
    # A posenc_fast_dtype -> its row of the kernel table (and its size), or -1.
    if dtype == POSENC_FAST_FLOAT32:
        itemsize[0] = 4
        return POSENC_F32
    if dtype == POSENC_FAST_FLOAT64:
        itemsize[0] = 8
        return POSENC_F64
    if dtype == POSENC_FAST_FLOAT16 or dtype == POSENC_FAST_BFLOAT16:
        itemsize[0] = 2
        return POSENC_F16 if dtype == POSENC_FAST_FLOAT16 else POSENC_BF16
    return -1


# NumPy dtype name -> posenc_fast_dtype (the dtypes _kernel_dtype knows).
_PUBLIC_DTYPES = {"float32": POSENC_FAST_FLOAT32, "float64": POSENC_FAST_FLOAT64,
                  "float16": POSENC_FAST_FLOAT16, "bfloat16": POSENC_FAST_BFLOAT16}


cdef extern from *:
    """
    /* a * b for a, b >= 0; 0 past PY_SSIZE_T_MAX (no division: a call's checks cost ns). */
    static inline int posenc_product(int64_t a, int64_t b, int64_t* result) {
    #if defined(__GNUC__) || defined(__clang__)
        return !__builtin_mul_overflow(a, b, result) && *result <= PY_SSIZE_T_MAX;
    #else
        if (a != 0 && b > PY_SSIZE_T_MAX / a) return 0;
        *result = a * b;
        return 1;
    #endif
    }
    """
    bint _product "posenc_product"(int64_t a, int64_t b, int64_t* result) noexcept nogil


cdef inline bint _table_bytes(int64_t rows, int64_t stride, int64_t width, Py_ssize_t itemsize,
                              int64_t* result) noexcept nogil:
    # Bytes from the first element of a (rows, width) table with row stride
    # `stride` (elements) to one past its last; False on overflow.
    cdef int64_t span
    if rows == 0 or width == 0:
        result[0] = 0
        return True
    if not _product(rows - 1, stride, &span) or span > PY_SSIZE_T_MAX - width:
        return False
    return _product(span + width, itemsize, result)


cdef inline bint _overlap(const void* a, int64_t a_bytes, const void* b,
                          int64_t b_bytes) noexcept nogil:
    cdef const char* pa = <const char*>a
    cdef const char* pb = <const char*>b
    return a_bytes > 0 and b_bytes > 0 and pa < pb + b_bytes and pb < pa + a_bytes


cdef inline int64_t _floor_div(int64_t a, int64_t b) noexcept nogil:
    # floor(a / b) for b > 0 (the build's cdivision truncates)
    return a // b if a >= 0 else -((-a + b - 1) // b)


cdef inline bint _rows_overlap(const void* a, int64_t n, int64_t row_bytes, int64_t width,
                               const void* b, int64_t b_bytes) noexcept nogil:
    # Rows r < n of a table, [a + r*row_bytes, + width), against b_bytes from b: row r meets them
    # when d - width < r*row_bytes < d + b_bytes (d = b - a): a range in the table's gaps is apart.
    cdef int64_t d = <int64_t>(<const char*>b - <const char*>a)
    if n <= 0 or width <= 0 or b_bytes <= 0:
        return False
    if n == 1 or row_bytes <= width:
        return _overlap(a, (n - 1) * row_bytes + width, b, b_bytes)
    return (max(<int64_t>0, _floor_div(d - width, row_bytes) + 1)
            <= min(n - 1, _floor_div(d + b_bytes - 1, row_bytes)))


cdef inline bint _tables_overlap(const void* a, const void* b, int64_t n, int64_t row_bytes,
                                 int64_t width) noexcept nogil:
    # Two tables of n rows of `width` bytes, `row_bytes` apart (>= width): row r2 of b meets row r1
    # of a when |d + k*row_bytes| < width for k = r2 - r1 in [-(n-1), n-1] (d = b - a), as
    # [cos | sin] halves of one row do not.
    cdef int64_t d = <int64_t>(<const char*>b - <const char*>a)
    if n <= 0 or width <= 0:
        return False
    return (max(1 - n, _floor_div(-width - d, row_bytes) + 1)
            <= min(n - 1, _floor_div(width - d - 1, row_bytes)))


cdef inline bint _finite_angles(const double* positions, int64_t n, const double* freqs,
                                int64_t m) noexcept nogil:
    # _validate.finite_angles: every position * frequency finite in double.
    cdef double largest_position = 0.0, largest_freq = 0.0
    cdef int64_t i
    if n == 0 or m == 0:
        return True
    for i in range(n):
        if not isfinite(positions[i]):
            return False
        largest_position = max(largest_position, fabs(positions[i]))
    for i in range(m):
        if not isfinite(freqs[i]):
            return False
        largest_freq = max(largest_freq, fabs(freqs[i]))
    return isfinite(largest_position * largest_freq)


cdef int _check_rows(const posenc_fast_rows* rows, int* kernel, Py_ssize_t* itemsize,
                     int64_t* nbytes, RowPlan* plan) noexcept nogil:
    # Sizes and overlap of the rows of a rotation, and the positions they use.
    cdef int64_t count
    kernel[0] = _kernel_dtype(rows.dtype, itemsize)
    if kernel[0] < 0:
        return POSENC_FAST_ERR_DTYPE
    if rows.outer < 0 or rows.seq < 0 or rows.inner < 0 or rows.dim < 0:
        return POSENC_FAST_ERR_SIZE
    if not (_product(rows.outer, rows.seq, &count) and _product(count, rows.inner, &count)
            and _product(count, rows.dim, &count) and _product(count, itemsize[0], nbytes)):
        return POSENC_FAST_ERR_SIZE
    if rows.out != rows.x and _overlap(rows.x, nbytes[0], rows.out, nbytes[0]):
        return POSENC_FAST_ERR_OVERLAP
    plan.outer = rows.outer
    plan.seq = rows.seq
    plan.inner = rows.inner
    plan.positions = <const long long*>rows.positions
    plan.base = rows.offset
    plan.lowest = rows.offset
    plan.highest = rows.offset
    if not _fits(rows.offset, 0):
        return POSENC_FAST_ERR_RANGE
    if rows.seq == 0:
        return POSENC_FAST_OK
    if rows.positions == NULL:
        if not _fits(rows.offset, rows.seq):
            return POSENC_FAST_ERR_RANGE
        plan.highest = rows.offset + rows.seq - 1
        return POSENC_FAST_OK
    if _overlap(rows.out, nbytes[0], rows.positions, rows.seq * <int64_t>sizeof(long long)):
        return POSENC_FAST_ERR_OVERLAP  # the kernels read positions while they write out
    _position_range(<const long long*>rows.positions, rows.seq, &plan.lowest, &plan.highest)
    if not (_fits(plan.lowest, rows.offset) and _fits(plan.highest, rows.offset)):
        return POSENC_FAST_ERR_RANGE
    plan.lowest += rows.offset
    plan.highest += rows.offset
    return POSENC_FAST_OK


cdef int _capi_rotate(const posenc_fast_rows* rows, const posenc_fast_cos_sin* table,
                      posenc_fast_layout layout, int inverse) noexcept nogil:
    cdef int d, t, status
    cdef Py_ssize_t itemsize, table_itemsize, nrows
    cdef int64_t nbytes, table_bytes, table_width, table_row
    cdef RowPlan plan
    cdef RowCall call
    if (rows == NULL or rows.x == NULL or rows.out == NULL or table == NULL
            or table.cos == NULL or table.sin == NULL):
        return POSENC_FAST_ERR_NULL
    status = _check_rows(rows, &d, &itemsize, &nbytes, &plan)
    if status != POSENC_FAST_OK:
        return status
    t = _kernel_dtype(table.dtype, &table_itemsize)
    if t < 0:
        return POSENC_FAST_ERR_DTYPE
    if (layout != POSENC_FAST_HALF and layout != POSENC_FAST_INTERLEAVED) or inverse not in (0, 1):
        return POSENC_FAST_ERR_ARGUMENT
    if (table.rows < 0 or table.npairs < 1 or table.npairs > rows.dim // 2 or table.stride < 0
            or (table.rows > 1 and table.stride < table.npairs)
            or not _table_bytes(table.rows, table.stride, table.npairs, table_itemsize,
                                &table_bytes)):
        return POSENC_FAST_ERR_SIZE
    table_width = table.npairs * table_itemsize
    table_row = table.stride * table_itemsize
    if (_rows_overlap(table.cos, table.rows, table_row, table_width, rows.out, nbytes)
            or _rows_overlap(table.sin, table.rows, table_row, table_width, rows.out, nbytes)):
        return POSENC_FAST_ERR_OVERLAP
    if rows.seq > 0 and (plan.lowest < 0 or plan.highest >= table.rows):
        return POSENC_FAST_ERR_RANGE
    nrows = rows.outer * rows.seq * rows.inner
    if nrows == 0 or rows.dim == 0:
        return POSENC_FAST_OK
    call = _row_call(d, t, itemsize, table_itemsize, table.npairs, rows.dim,
                     layout == POSENC_FAST_HALF, inverse, rows.x == rows.out, nbytes)
    if call.rotate == NULL:  # no kernel for this (data, table) pair
        return POSENC_FAST_ERR_DTYPE
    # cos and sin rows one stride apart, as the blocked walk steps them
    cdef CosSinTable cos_sin = CosSinTable(<const char*>table.cos, <const char*>table.sin,
                                           table.stride * table_itemsize, table.stride * table_itemsize,
                                           table.npairs, table_itemsize, t)
    _rotate_planned(<const char*>rows.x, <char*>rows.out, &cos_sin, &plan, &call,
                    _threads_for(nrows * rows.dim))
    return POSENC_FAST_OK


cdef int _capi_rotate_rotary(const posenc_fast_rows* rows, const posenc_fast_rotary* rotary,
                             int inverse) noexcept nogil:
    # RotaryBase._run on the table of a rotary_table_capsule.
    cdef const RotaryTable* table = <const RotaryTable*>rotary
    cdef int d, status
    cdef Py_ssize_t itemsize
    cdef int64_t nbytes
    cdef RowPlan plan
    cdef RowCall call
    if rows == NULL or rows.x == NULL or rows.out == NULL or rotary == NULL:
        return POSENC_FAST_ERR_NULL
    status = _check_rows(rows, &d, &itemsize, &nbytes, &plan)
    if status != POSENC_FAST_OK:
        return status
    if <int>rows.dtype != table.dtype:
        return POSENC_FAST_ERR_DTYPE
    if rows.dim != table.dim:
        return POSENC_FAST_ERR_SIZE
    if inverse not in (0, 1):
        return POSENC_FAST_ERR_ARGUMENT
    if inverse and not table.unit_factor:
        return POSENC_FAST_ERR_UNSUPPORTED
    if rows.seq > 0 and (plan.lowest < 0 or plan.highest >= table.rows):
        return POSENC_FAST_ERR_RANGE
    if nbytes == 0:
        return POSENC_FAST_OK
    # The cache is float32 for half data (posenc_table_dtype).
    cdef int cache = posenc_table_dtype(d)
    cdef CosSinTable cos_sin = _stacked_table(table.table, table.npairs, 8 if cache == POSENC_F64 else 4, cache)
    call = _row_call(d, cos_sin.dtype, itemsize, cos_sin.itemsize, table.npairs, table.dim,
                     table.half, inverse, rows.x == rows.out, nbytes, table.start)
    _rotate_planned(<const char*>rows.x, <char*>rows.out, &cos_sin, &plan, &call,
                    _threads_for(nbytes // itemsize))
    return POSENC_FAST_OK


cdef int _capi_fill_cos_sin(posenc_fast_dtype dtype, void* cos, void* sin, int64_t stride,
                            const double* positions, int64_t n, const double* freqs,
                            int64_t npairs, double scale) noexcept nogil:
    # cos_sin_rows on pointers.
    cdef int d
    cdef Py_ssize_t itemsize
    cdef int64_t nbytes, width, row
    cdef int threads
    cdef double* work
    if cos == NULL or sin == NULL or positions == NULL or freqs == NULL:
        return POSENC_FAST_ERR_NULL
    d = _kernel_dtype(dtype, &itemsize)
    if d < 0:
        return POSENC_FAST_ERR_DTYPE
    if (n < 0 or npairs < 0 or stride < 0 or (n > 1 and stride < npairs)
            or not _table_bytes(n, stride, npairs, itemsize, &nbytes)
            or n > PY_SSIZE_T_MAX // 8 or npairs > PY_SSIZE_T_MAX // 8):
        return POSENC_FAST_ERR_SIZE
    width, row = npairs * itemsize, stride * itemsize
    if (_tables_overlap(cos, sin, n, row, width)
            or _rows_overlap(cos, n, row, width, positions, n * 8)
            or _rows_overlap(sin, n, row, width, positions, n * 8)
            or _rows_overlap(cos, n, row, width, freqs, npairs * 8)
            or _rows_overlap(sin, n, row, width, freqs, npairs * 8)):
        return POSENC_FAST_ERR_OVERLAP
    if not isfinite(scale) or not _finite_angles(positions, n, freqs, npairs):
        return POSENC_FAST_ERR_RANGE
    if n == 0 or npairs == 0:
        return POSENC_FAST_OK
    threads = _threads_for(n * npairs)
    work = <double*>malloc((POSENC_TRIG_SHARED_ROWS + POSENC_TRIG_THREAD_ROWS * threads)
                           * npairs * sizeof(double))
    if work == NULL:
        return POSENC_FAST_ERR_MEMORY
    cdef TrigJob job = TrigJob(K.cos_sin[d], NULL, positions, n, npairs, NULL, work, scale, cos,
                               stride, sin, stride, False, False)
    _fill_trig(&job, freqs, threads)
    free(work)
    return POSENC_FAST_OK


cdef int _capi_fill_sinusoidal(posenc_fast_dtype dtype, void* out, const double* positions,
                               int64_t n, int64_t dim, double base,
                               posenc_fast_layout layout) noexcept nogil:
    # sinusoidal_rows on pointers, the frequencies of absolute._sinusoidal_freqs.
    cdef int d, threads
    cdef Py_ssize_t itemsize, i, nfreqs
    cdef int64_t count, nbytes
    cdef double* freqs
    cdef double* work
    if out == NULL or positions == NULL:
        return POSENC_FAST_ERR_NULL
    d = _kernel_dtype(dtype, &itemsize)
    if d < 0:
        return POSENC_FAST_ERR_DTYPE
    if layout != POSENC_FAST_INTERLEAVED and layout != POSENC_FAST_SPLIT:
        return POSENC_FAST_ERR_ARGUMENT
    if (n < 0 or dim < 1 or n > PY_SSIZE_T_MAX // 8 or not _product(n, dim, &count)
            or not _product(count, itemsize, &nbytes)):
        return POSENC_FAST_ERR_SIZE
    if _overlap(out, nbytes, positions, n * 8):
        return POSENC_FAST_ERR_OVERLAP
    if not (isfinite(base) and base > 0):
        return POSENC_FAST_ERR_RANGE
    if n == 0:
        return POSENC_FAST_OK
    nfreqs = (dim + 1) // 2
    threads = _threads_for(n * dim)
    freqs = <double*>malloc(nfreqs * sizeof(double))
    work = <double*>malloc((POSENC_TRIG_SHARED_ROWS + POSENC_TRIG_THREAD_ROWS * threads)
                           * nfreqs * sizeof(double))
    if freqs == NULL or work == NULL:
        free(freqs)
        free(work)
        return POSENC_FAST_ERR_MEMORY
    for i in range(nfreqs):
        # Python's base ** (-2 * i / dim): a correctly rounded quotient, libm's pow.
        freqs[i] = pow(base, <double>(-2 * i) / <double>dim)
    if not _finite_angles(positions, n, freqs, nfreqs):
        free(freqs)
        free(work)
        return POSENC_FAST_ERR_RANGE
    cdef TrigJob job = TrigJob(NULL, K.sinusoidal[d], positions, n, nfreqs, NULL, work, 1.0, out,
                               dim, NULL, 0, layout == POSENC_FAST_SPLIT,
                               nbytes >= POSENC_STREAM_BYTES)
    _fill_trig(&job, freqs, threads)
    free(freqs)
    free(work)
    return POSENC_FAST_OK


cdef int _capi_add_alibi(posenc_fast_dtype dtype, const void* scores, void* out, int64_t batch,
                         int64_t heads, int64_t q_len, int64_t k_len, const double* slopes,
                         int64_t offset, int causal) noexcept nogil:
    # alibi_add_rows on pointers.
    cdef AlibiCall call
    cdef int d
    cdef int64_t nrows, nbytes
    cdef Py_ssize_t h
    if scores == NULL or out == NULL or slopes == NULL:
        return POSENC_FAST_ERR_NULL
    d = _kernel_dtype(dtype, &call.itemsize)
    if d < 0:
        return POSENC_FAST_ERR_DTYPE
    if causal not in (0, 1):
        return POSENC_FAST_ERR_ARGUMENT
    if (batch < 0 or heads < 0 or q_len < 0 or k_len < 0 or heads > PY_SSIZE_T_MAX // 8
            or not (_product(batch, heads, &nrows) and _product(nrows, q_len, &nrows)
                    and _product(nrows, k_len, &nbytes)
                    and _product(nbytes, call.itemsize, &nbytes))):
        return POSENC_FAST_ERR_SIZE
    if ((scores != out and _overlap(scores, nbytes, out, nbytes))
            or _overlap(out, nbytes, slopes, heads * 8)):
        return POSENC_FAST_ERR_OVERLAP
    if offset < -_MAX_ALIBI_OFFSET or offset > _MAX_ALIBI_OFFSET:
        return POSENC_FAST_ERR_RANGE
    for h in range(heads):
        if not isfinite(slopes[h]):
            return POSENC_FAST_ERR_RANGE
    if nbytes == 0:
        return POSENC_FAST_OK
    call.span = K.alibi_add_in_place[d] if scores == out else K.alibi_add[d]
    _alibi_rows(&call, <const char*>scores, <char*>out, nrows, k_len, slopes, heads, q_len,
                offset, causal, _threads_for(nrows * k_len))
    return POSENC_FAST_OK


cdef const char* _capi_status_message(int status) noexcept nogil:
    if status == POSENC_FAST_OK:
        return "success"
    if status == POSENC_FAST_ERR_NULL:
        return "a required pointer is NULL"
    if status == POSENC_FAST_ERR_DTYPE:
        return "a dtype outside posenc_fast_dtype, not in this build, or not the table's"
    if status == POSENC_FAST_ERR_SIZE:
        return "a negative, inconsistent or overflowing size, stride or count"
    if status == POSENC_FAST_ERR_RANGE:
        return ("a position outside the table, a non-finite angle, scale or slope, a base "
                "<= 0 or an ALiBi offset beyond 2**52")
    if status == POSENC_FAST_ERR_ARGUMENT:
        return "a layout or flag outside its values"
    if status == POSENC_FAST_ERR_OVERLAP:
        return "an output overlaps an input without being x itself"
    if status == POSENC_FAST_ERR_MEMORY:
        return "scratch memory could not be allocated"
    if status == POSENC_FAST_ERR_UNSUPPORTED:
        return ("inverse through a RotaryEmbedding table with an attention factor != 1 "
                "(use RotaryEmbedding.apply)")
    return "unknown posenc_fast status"


cdef posenc_fast_api _API
_API.abi_version = POSENC_FAST_ABI_VERSION
_API.status_message = _capi_status_message
_API.rotate = _capi_rotate
_API.rotate_rotary = _capi_rotate_rotary
_API.fill_cos_sin = _capi_fill_cos_sin
_API.fill_sinusoidal = _capi_fill_sinusoidal
_API.add_alibi = _capi_add_alibi
_C_API = PyCapsule_New(<void*>&_API, POSENC_FAST_CAPSULE, NULL)


cdef void _free_rotary_table(object capsule) noexcept:
    cdef RotaryTable* table = <RotaryTable*>PyCapsule_GetPointer(capsule,
                                                                 POSENC_FAST_ROTARY_CAPSULE)
    Py_XDECREF(table.owner)
    free(table)


def rotary_table_capsule(RotaryBase fast not None, dtype, num_positions):
    """The canonical cos/sin table of `fast` for positions [0, num_positions), as a capsule.

    `dtype` (a NumPy float dtype) and `num_positions` (>= 1) are validated by
    posenc_fast._capi; raises ValueError where `fast` cannot cover them.
    """
    import numpy
    cdef cnp.ndarray like = numpy.empty(0, dtype)  # posenc_fast._capi checked the dtype
    cdef RotaryTable* table
    if num_positions > fast.valid_below:
        raise ValueError(f"num_positions must be <= {fast.valid_below}: further positions use "
                         f"other frequencies (a dynamic scaling), got {num_positions}")
    cache = fast._cache_for(_table_of(like), num_positions - 1)
    if cache is None:
        raise ValueError(f"num_positions={num_positions} exceeds the {POSENC_CACHE_BYTES >> 20}"
                         f" MiB a RotaryEmbedding caches for dtype {like.dtype}")
    table = <RotaryTable*>malloc(sizeof(RotaryTable))
    if table == NULL:
        raise MemoryError()
    table.dtype = _PUBLIC_DTYPES[like.dtype.name]
    table.dim = fast.dim
    table.npairs = fast.npairs
    table.start = fast.start
    table.rows = num_positions
    table.half = fast.half
    table.unit_factor = fast.factor == 1.0
    table.table = _data(<cnp.ndarray>cache)
    table.owner = <PyObject*>cache
    Py_INCREF(cache)
    try:
        return PyCapsule_New(table, POSENC_FAST_ROTARY_CAPSULE, _free_rotary_table)
    except BaseException:
        Py_XDECREF(table.owner)
        free(table)
        raise
