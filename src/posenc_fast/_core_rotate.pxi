# Rotation of rows by a cos/sin table: the choice of row kernel for a call,
# one row, and the general kernel (any row -> table row map).


cdef struct RowCall:
    # How a call rotates its rows (see _row_call).
    posenc_rotate_fn rotate
    posenc_position_fn rotate_position  # a block of rows in one call
    Py_ssize_t npairs
    Py_ssize_t itemsize
    Py_ssize_t table_itemsize
    Py_ssize_t dim          # items of a row
    Py_ssize_t row_bytes
    Py_ssize_t start_bytes  # where the rotary pairs begin in a row (rotary_start)
    Py_ssize_t lead_bytes   # bytes before them, copied unless in place
    Py_ssize_t tail_bytes   # bytes past them, copied unless in place
    bint half               # the half layout (else interleaved)
    bint inverse
    bint stream             # non-temporal stores: posenc_sfence at the end of a work item
    bint prefetch           # a row taken alone asks for the lines ahead
    bint blocks             # rows in blocks, one rotate_position call each


# Half-layout rows of at least this many bytes, rotated in place past POSENC_STREAM_BYTES, take the
# scalar row kernel, shorter ones the explicit vectors: the build's POSENC_SCALAR_IN_PLACE_ROW_BYTES,
# or this CPU's measured value (set once, at import, by _dispatch; set_block_bytes).
cdef Py_ssize_t _scalar_in_place_row_bytes = POSENC_SCALAR_IN_PLACE_ROW_BYTES


cdef inline bint _in_place_scalar(Py_ssize_t row_bytes) noexcept nogil:
    return row_bytes >= _scalar_in_place_row_bytes


# Out-of-place results of at least this many bytes are streamed (non-temporal stores, rows by the
# walk past the caches); in place, rows of POSENC_STREAM_BYTES or more take that walk: the build's
# POSENC_STREAM_BYTES, or this CPU's measured value (set once, at import, by _dispatch).
cdef Py_ssize_t _stream_bytes = POSENC_STREAM_BYTES
# Out-of-place half-type results of at least this many bytes, not streamed, are written by whole
# lines where their rows start off one (POSENC_POSITION_HALF_LINES; 0: never): the build's
# POSENC_LINE_ROWS_BYTES, or this CPU's measured value (set once, at import, by _dispatch).
cdef Py_ssize_t _line_rows_bytes = POSENC_LINE_ROWS_BYTES


def in_place_row_kernel(Py_ssize_t row_bytes):
    """Which kernel rotates half-layout rows of `row_bytes` in place past the caches: "scalar" or
    "vectors" (by the size `set_block_bytes` set last)."""
    return "scalar" if _in_place_scalar(row_bytes) else "vectors"


cdef inline bint _line_rows(Py_ssize_t nbytes) noexcept nogil:
    # an out-of-place result of nbytes: by whole lines (not streamed)
    return 0 < _line_rows_bytes <= nbytes < _stream_bytes


cdef inline RowCall _row_call(int data, int table, Py_ssize_t itemsize, Py_ssize_t table_itemsize,
                              Py_ssize_t npairs, Py_ssize_t dim, bint half, bint inverse,
                              bint in_place, Py_ssize_t nbytes, Py_ssize_t start=0) noexcept nogil:
    # Rows of dim items whose features [start, start + 2*npairs) rotate;
    # nbytes: the size of x.  Below POSENC_STREAM_BYTES (out of place:
    # _stream_bytes) rows go in blocks (rotate_position): a position's heads,
    # or a head's positions.  Past the caches a result is written with
    # non-temporal stores (never in place: those lines were just read),
    # half-layout rows in place by the
    # scalar row functions from _scalar_in_place_row_bytes on; from half
    # an L2 (POSENC_PREFETCH_BYTES) a row taken alone prefetches.
    cdef RowCall call
    cdef bint large = nbytes >= (POSENC_STREAM_BYTES if in_place else _stream_bytes)
    cdef int kind
    if half and in_place:
        kind = (POSENC_ROW_HALF_IN_PLACE
                if large and _in_place_scalar(dim * itemsize)
                else POSENC_ROW_HALF_IN_PLACE_VEC)
    elif half:
        kind = POSENC_ROW_HALF_STREAM if large else POSENC_ROW_HALF_VEC
    else:
        kind = POSENC_ROW_INTERLEAVED_STREAM if large and not in_place else POSENC_ROW_INTERLEAVED
    call.rotate = K.rotate[data][table][kind]
    kind = (POSENC_POSITION_INTERLEAVED if not half else
            POSENC_POSITION_HALF_IN_PLACE if in_place else
            POSENC_POSITION_HALF_LINES if _line_rows(nbytes) else POSENC_POSITION_HALF)
    call.rotate_position = K.rotate_position[data][table][kind]
    call.npairs = npairs
    call.itemsize = itemsize
    call.table_itemsize = table_itemsize
    call.dim = dim
    call.row_bytes = dim * itemsize
    call.start_bytes = start * itemsize
    call.lead_bytes = 0 if in_place else call.start_bytes
    call.tail_bytes = 0 if in_place else (dim - start - 2 * npairs) * itemsize
    call.half = half
    call.inverse = inverse
    call.stream = large and not in_place
    call.prefetch = nbytes >= POSENC_PREFETCH_BYTES
    call.blocks = not large
    return call


def writes_lines(Py_ssize_t nbytes):
    """Whether an out-of-place rotation of half-type rows into `nbytes`, not streamed, writes rows
    that start off a 64-byte line by whole lines (by the size `set_block_bytes` set last; AVX-512
    variants: the others' kernels split stores alike)."""
    return _line_rows(nbytes)


def streams(Py_ssize_t nbytes):
    """Whether an out-of-place rotation of float32 rows of 128 into `nbytes` is streamed past
    the caches (`_row_call`'s choice by the size `set_block_bytes` set last)."""
    return _row_call(POSENC_F32, POSENC_F32, 4, 4, 64, 128, True, False, False, nbytes).stream


cdef struct CosSinTable:
    # The cos/sin table every rotation reads: the cos row of table row t at cos + t * cos_stride,
    # its sin row at sin + t * sin_stride (bytes), each npairs entries of one dtype.
    const char* cos
    const char* sin
    Py_ssize_t cos_stride
    Py_ssize_t sin_stride
    Py_ssize_t npairs
    Py_ssize_t itemsize
    int dtype


cdef inline bint _steps_along_rows(cnp.ndarray table, Py_ssize_t itemsize) noexcept:
    # a 2-D table whose rows (of two or more entries, at least one row) are not contiguous
    return table.shape[0] > 0 and table.shape[1] > 1 and cnp.PyArray_STRIDE(table, 1) != itemsize


cdef inline CosSinTable _table_from(cnp.ndarray cos_table, cnp.ndarray sin_table) except *:
    # Two 2-D arrays of one dtype, unit stride along their last axis (the kernels read rows by their
    # first stride only: any other table is a caller's slip, refused rather than misread).
    cdef Py_ssize_t itemsize = cnp.PyArray_ITEMSIZE(cos_table)
    if (cos_table.ndim != 2 or sin_table.ndim != 2 or sin_table.shape[1] != cos_table.shape[1]
            or cnp.PyArray_TYPE(sin_table) != cnp.PyArray_TYPE(cos_table)
            or _steps_along_rows(cos_table, itemsize) or _steps_along_rows(sin_table, itemsize)):
        cos, sin = <object>cos_table, <object>sin_table
        raise ValueError(f"cos/sin tables must be 2-D of one dtype and width, each row contiguous, got shapes "
                         f"{cos.shape}, {sin.shape} and strides {cos.strides}, {sin.strides}")
    return CosSinTable(_data(cos_table), _data(sin_table), cnp.PyArray_STRIDE(cos_table, 0),
                       cnp.PyArray_STRIDE(sin_table, 0), cos_table.shape[1], itemsize, _dtype(cos_table))


cdef inline CosSinTable _stacked_table(const char* table, Py_ssize_t npairs, Py_ssize_t itemsize,
                                       int dtype) noexcept nogil:
    # (rows, 2, npairs): each position's cos row, then its sin row (RotaryBase's and the C API's).
    cdef Py_ssize_t row = npairs * itemsize
    return CosSinTable(table, table + row, 2 * row, 2 * row, npairs, itemsize, dtype)


cdef inline void _position_range(const long long* positions, Py_ssize_t n, long long* lowest,
                                 long long* highest) noexcept nogil:
    # The least and the greatest of n positions (0 and 0 for none): the table rows a call needs.
    cdef Py_ssize_t i
    lowest[0] = highest[0] = positions[0] if n > 0 else 0
    for i in range(1, n):
        lowest[0] = min(lowest[0], positions[i])
        highest[0] = max(highest[0], positions[i])


cdef inline void _rotate_row(const char* x, char* out, const void* c, const void* s,
                             const RowCall* call) noexcept nogil:
    # One row: the rotary pairs, then the features before and past them copied.
    if call.prefetch:
        posenc_prefetch_ahead(x, call.row_bytes)
    if call.npairs > 0:
        call.rotate(x + call.start_bytes, out + call.start_bytes, c, s, call.npairs, call.inverse)
    if call.lead_bytes > 0:
        memcpy(out, x, call.lead_bytes)
    if call.tail_bytes > 0:
        memcpy(out + call.row_bytes - call.tail_bytes, x + call.row_bytes - call.tail_bytes,
               call.tail_bytes)


cdef inline void _rotate_row_by(const char* x, char* out, const CosSinTable* table, Py_ssize_t t,
                                const RowCall* call) noexcept nogil:
    # One row, by table row t.
    _rotate_row(x, out, table.cos + t * table.cos_stride, table.sin + t * table.sin_stride, call)


cdef inline void _rotate_block(const char* x, char* out, Py_ssize_t nrows, const char* c,
                               const char* s, Py_ssize_t table_step,
                               const RowCall* call) noexcept nogil:
    # nrows consecutive rows in one kernel call, row r by the cos/sin rows
    # c, s + r * table_step table elements (0: one position's rows).
    cdef Py_ssize_t r, tail
    if call.npairs > 0:
        call.rotate_position(x + call.start_bytes, out + call.start_bytes, nrows, call.dim, c, s,
                             table_step, call.npairs, call.inverse)
    if call.lead_bytes > 0:
        for r in range(nrows):
            memcpy(out + r * call.row_bytes, x + r * call.row_bytes, call.lead_bytes)
    if call.tail_bytes > 0:
        tail = call.row_bytes - call.tail_bytes
        for r in range(nrows):
            memcpy(out + r * call.row_bytes + tail, x + r * call.row_bytes + tail, call.tail_bytes)


cdef inline void _rotate_position_rows(const char* x, char* out, Py_ssize_t nrows, const void* c,
                                      const void* s, const RowCall* call) noexcept nogil:
    # nrows consecutive rows rotated by one cos/sin row (a token's heads).
    # One call for them all: token-major W1 (1,256,32,128) in place 1.5-1.7x
    # np.multiply row by row with prefetch, 1.06-1.16x so.
    cdef Py_ssize_t r
    if call.blocks:
        _rotate_block(x, out, nrows, <const char*>c, <const char*>s, 0, call)
    else:
        for r in range(nrows):
            _rotate_row(x + r * call.row_bytes, out + r * call.row_bytes, c, s, call)


cdef inline void _rotate_heads(const char* x, Py_ssize_t x_step, char* out, Py_ssize_t out_step,
                               Py_ssize_t heads, const void* c, const void* s, const RowCall* call) noexcept nogil:
    # A token's heads, x_step and out_step bytes apart, by one cos/sin row
    # (one kernel call where both are consecutive rows; a row alone takes the row kernel).
    cdef Py_ssize_t h
    if heads == 1:
        _rotate_row(x, out, c, s, call)
    elif x_step == call.row_bytes and out_step == call.row_bytes:
        _rotate_position_rows(x, out, heads, c, s, call)
    else:
        for h in range(heads):
            _rotate_row(x + h * x_step, out + h * out_step, c, s, call)
