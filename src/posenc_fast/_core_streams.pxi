# Rotation with several position streams per token (multimodal RoPE, axial
# RoPE): pair j of a token takes the position of stream pair_streams[j].
#
# Per token, the canonical cos/sin of (its stream's position, pair j) are
# gathered from tables of the call's distinct positions into a scratch row
# of the thread, then the row kernels of rotate_rows rotate every row of that
# token with it.  Gathering copies bits: a token whose streams all carry one
# position gets exactly the one-stream values.

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
    Py_ssize_t nstreams
    const char* x
    char* out
    const CosSinTable* table
    char* scratch           # a (cos row, sin row) per thread
    Py_ssize_t nrows
    const RowCall* call


cdef void _streams_chunk(void* job_, Py_ssize_t chunk, int slot) noexcept nogil:
    cdef const StreamsJob* job = <const StreamsJob*>job_
    cdef const CosSinTable* table = job.table
    cdef Py_ssize_t r, token, last = -1, half = table.npairs * table.itemsize
    cdef char* row = job.scratch + slot * 2 * half
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
            last = token
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
    of token t uses column j of table row token_rows[t, pair_streams[j]].
    cos/sin tables: 2-D, one dtype, unit stride along their last axis
    (npairs entries); row_token: C-contiguous intp (rows,); token_rows:
    C-contiguous intp (tokens, streams); pair_streams: C-contiguous intp
    (npairs,).  Features [start, start + 2*npairs) rotate, the rest are
    copied.
    """
    cdef Py_ssize_t nrows = x.shape[0], dim = x.shape[1]
    cdef Py_ssize_t nstreams = token_rows.shape[1]
    cdef Py_ssize_t nchunks = (nrows + POSENC_ROW_CHUNK - 1) // POSENC_ROW_CHUNK
    cdef CosSinTable table = _table_from(cos_table, sin_table)
    cdef Py_ssize_t scratch_bytes = 2 * table.npairs * table.itemsize
    cdef const Py_ssize_t* tokens = <const Py_ssize_t*>_data(row_token)
    cdef const Py_ssize_t* streams = <const Py_ssize_t*>_data(token_rows)
    cdef const Py_ssize_t* pairs = <const Py_ssize_t*>_data(pair_streams)
    cdef char* xp = _data(x)
    cdef char* op = _data(out)
    cdef RowCall call = _row_call(_dtype(x), table.dtype, cnp.PyArray_ITEMSIZE(x), table.itemsize,
                                  table.npairs, dim, half_layout, inverse, xp == op,
                                  cnp.PyArray_NBYTES(x), start)
    if call.rotate == NULL:
        raise TypeError(f"no rotation kernel for {x.dtype} data with a {cos_table.dtype} table")
    if nrows == 0 or dim == 0:
        return
    num_threads = max(1, min(num_threads, <int>nchunks))
    # One (cos row, sin row) per thread; the pool's slot picks it.
    scratch = cnp.PyArray_EMPTY(1, [num_threads * scratch_bytes], cnp.NPY_UINT8, 0)
    cdef StreamsJob job = StreamsJob(tokens, streams, pairs, nstreams, xp, op, &table,
                                     _data(scratch), nrows, &call)
    with nogil:
        posenc_parallel_for(nchunks, num_threads, _streams_chunk, &job)
