# Rotation with several position streams per token (multimodal RoPE, axial
# RoPE): pair j of a token takes the position of stream pair_streams[j].
#
# Per token, the canonical cos/sin of (its stream's position, pair j) are
# gathered from tables of the call's distinct positions into a scratch row
# of the thread, then the row kernels of rotate_rows rotate every row of that
# token with it.  Gathering copies bits: a token whose streams all carry one
# position gets exactly the one-stream values.  Where a pair's two features
# take two streams (HunYuan-VL: pair_streams of two rows), a row is rotated
# twice, by the first features' cos/sin into `out` and by the second
# features' into the thread's scratch, whose second features are then
# copied over: each feature gets the row kernel's operations, so where the
# two streams agree the result is bitwise the one-stream rotation's.

from libc.stdint cimport uint16_t, uint32_t, uint64_t


cdef inline void _gather_pairs(char* row, const char* table, Py_ssize_t stride,
                               const Py_ssize_t* stream_rows, const Py_ssize_t* pair_streams,
                               Py_ssize_t npairs, Py_ssize_t itemsize) noexcept nogil:
    # row[j] = table[stream_rows[pair_streams[j]], j], copied as bits.
    cdef Py_ssize_t j
    if itemsize == 8:
        for j in range(npairs):
            (<uint64_t*>row)[j] = (<const uint64_t*>(table + stream_rows[pair_streams[j]]
                                                     * stride))[j]
    elif itemsize == 4:
        for j in range(npairs):
            (<uint32_t*>row)[j] = (<const uint32_t*>(table + stream_rows[pair_streams[j]]
                                                     * stride))[j]
    elif itemsize == 2:
        for j in range(npairs):
            (<uint16_t*>row)[j] = (<const uint16_t*>(table + stream_rows[pair_streams[j]]
                                                     * stride))[j]
    else:
        for j in range(npairs):
            memcpy(row + j * itemsize,
                   table + stream_rows[pair_streams[j]] * stride + j * itemsize, itemsize)


cdef struct StreamsJob:
    # rotate_rows_streams' call, for the pool.
    const Py_ssize_t* tokens
    const Py_ssize_t* streams
    const Py_ssize_t* pairs
    const Py_ssize_t* seconds  # the streams of the pairs' second features (NULL: pairs')
    Py_ssize_t nstreams
    const char* x
    char* out
    const CosSinTable* table
    char* scratch           # per thread slot_bytes: (cos row, sin row), with seconds two more and a row
    Py_ssize_t slot_bytes
    Py_ssize_t nrows
    const RowCall* call
    const RowCall* apart    # with seconds: the rotation into the scratch row (out of place)


cdef inline void _rotate_features(const char* x, char* out, const char* row, const StreamsJob* job) noexcept nogil:
    # A row whose pairs' features take two streams: by the second features' cos/sin (row's third
    # and fourth rows) into the scratch row past them, then by the first features' into out; the
    # scratch row's second features copied over (x read whole before out is written: in place too).
    cdef const RowCall* call = job.call
    cdef Py_ssize_t n = call.npairs, size = call.itemsize, half = n * job.table.itemsize, j
    cdef char* second = <char*>row + 4 * half
    if n > 0:
        job.apart.rotate(x + call.start_bytes, second, row + 2 * half, row + 3 * half, n, call.inverse)
    _rotate_row(x, out, row, row + half, call)
    if call.half:
        memcpy(out + call.start_bytes + n * size, second + n * size, n * size)
    else:
        for j in range(n):
            memcpy(out + call.start_bytes + (2 * j + 1) * size, second + (2 * j + 1) * size, size)


cdef void _streams_chunk(void* job_, Py_ssize_t chunk, int slot) noexcept nogil:
    cdef const StreamsJob* job = <const StreamsJob*>job_
    cdef const CosSinTable* table = job.table
    cdef Py_ssize_t r, token, last = -1, half = table.npairs * table.itemsize
    cdef char* row = job.scratch + slot * job.slot_bytes
    cdef Py_ssize_t row_bytes = job.call.row_bytes
    cdef const Py_ssize_t* token_streams
    for r in range(chunk * POSENC_ROW_CHUNK, min((chunk + 1) * POSENC_ROW_CHUNK, job.nrows)):
        token = job.tokens[r]
        if token != last:  # rows of one token (its heads) share the gathered row
            token_streams = job.streams + token * job.nstreams
            _gather_pairs(row, table.cos, table.cos_stride, token_streams, job.pairs, table.npairs,
                          table.itemsize)
            _gather_pairs(row + half, table.sin, table.sin_stride, token_streams, job.pairs,
                          table.npairs, table.itemsize)
            if job.seconds != NULL:
                _gather_pairs(row + 2 * half, table.cos, table.cos_stride, token_streams, job.seconds,
                              table.npairs, table.itemsize)
                _gather_pairs(row + 3 * half, table.sin, table.sin_stride, token_streams, job.seconds,
                              table.npairs, table.itemsize)
            last = token
        if job.seconds != NULL:
            _rotate_features(job.x + r * row_bytes, job.out + r * row_bytes, row, job)
        else:
            _rotate_row(job.x + r * row_bytes, job.out + r * row_bytes, row, row + half, job.call)
    if job.call.stream:
        posenc_sfence()


def rotate_stream_rows(cnp.ndarray x not None, cnp.ndarray out not None,
                       cnp.ndarray cos_table not None, cnp.ndarray sin_table not None,
                       cnp.ndarray row_token not None, cnp.ndarray token_rows not None,
                       cnp.ndarray pair_streams not None, bint half_layout, bint inverse,
                       int num_threads, Py_ssize_t start=0):
    """Rotate every row r of x by the positions of token row_token[r]; write to out.

    x, out: C-contiguous (rows, dim) of one dtype; `out` may be `x`.  Pair j
    of token t uses column j of table row token_rows[t, pair_streams[j]]
    (pair_streams of two rows: its first feature row 0's stream, its second
    row 1's).  cos/sin tables: 2-D, one dtype, unit stride along their last
    axis (npairs entries); row_token: C-contiguous intp (rows,); token_rows:
    C-contiguous intp (tokens, streams); pair_streams: C-contiguous intp
    (npairs,) or (2, npairs).  Features [start, start + 2*npairs) rotate,
    the rest are copied.
    """
    cdef Py_ssize_t nrows = x.shape[0], dim = x.shape[1]
    cdef Py_ssize_t nstreams = token_rows.shape[1]
    cdef Py_ssize_t nchunks = (nrows + POSENC_ROW_CHUNK - 1) // POSENC_ROW_CHUNK
    cdef CosSinTable table = _table_from(cos_table, sin_table)
    cdef const Py_ssize_t* tokens = <const Py_ssize_t*>_data(row_token)
    cdef const Py_ssize_t* streams = <const Py_ssize_t*>_data(token_rows)
    cdef const Py_ssize_t* pairs = <const Py_ssize_t*>_data(pair_streams)
    cdef const Py_ssize_t* seconds = pairs + table.npairs if pair_streams.ndim == 2 else NULL
    # two streams a pair: a row written twice, so never by non-temporal stores (nbytes 0)
    cdef Py_ssize_t nbytes = 0 if seconds != NULL else cnp.PyArray_NBYTES(x)
    # per thread: a (cos row, sin row); two streams a pair: two more, and the row by the second streams
    cdef Py_ssize_t slot_bytes = 2 * table.npairs * (table.itemsize if seconds == NULL
                                                     else 2 * table.itemsize + cnp.PyArray_ITEMSIZE(x))
    cdef char* xp = _data(x)
    cdef char* op = _data(out)
    cdef RowCall call = _row_call(_dtype(x), table.dtype, cnp.PyArray_ITEMSIZE(x), table.itemsize,
                                  table.npairs, dim, half_layout, inverse, xp == op, nbytes, start)
    cdef RowCall apart  # with seconds: the out-of-place call into the scratch row
    if seconds != NULL:
        apart = _row_call(_dtype(x), table.dtype, cnp.PyArray_ITEMSIZE(x), table.itemsize,
                          table.npairs, dim, half_layout, inverse, False, 0, start)
    if call.rotate == NULL:
        raise TypeError(f"no rotation kernel for {x.dtype} data with a {cos_table.dtype} table")
    if nrows == 0 or dim == 0:
        return
    num_threads = max(1, min(num_threads, <int>nchunks))
    # slot_bytes per thread; the pool's slot picks them.
    scratch = cnp.PyArray_EMPTY(1, [num_threads * slot_bytes], cnp.NPY_UINT8, 0)
    cdef StreamsJob job = StreamsJob(tokens, streams, pairs, seconds, nstreams, xp, op, &table,
                                     _data(scratch), slot_bytes, nrows, &call, &apart)
    with nogil:
        posenc_parallel_for(nchunks, num_threads, _streams_chunk, &job)
