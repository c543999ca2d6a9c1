# Tables: cos/sin and sinusoidal rows (the canonical values of
# csrc/posenc_trig.h), and adding a table row to every row of x.


cdef struct TrigJob:
    # A cos/sin (cos_sin set) or sinusoidal (sinusoidal set) fill, for the pool.
    posenc_cos_sin_fn cos_sin
    posenc_sinusoidal_fn sinusoidal
    const double* positions
    Py_ssize_t nrows
    Py_ssize_t nfreqs
    const posenc_trig_steps* steps
    double* work            # trig_work_rows(threads) rows of nfreqs
    double scale
    void* out               # cos_sin: the cos rows
    Py_ssize_t out_stride   # cos_sin: elements; sinusoidal: dim
    void* sin_out
    Py_ssize_t sin_stride
    bint split
    bint stream             # sinusoidal: a table of POSENC_STREAM_BYTES or more


cdef void _trig_chunk(void* job_, Py_ssize_t b, int slot) noexcept nogil:
    cdef const TrigJob* job = <const TrigJob*>job_
    cdef Py_ssize_t first = b * POSENC_TRIG_CHUNK_ROWS
    cdef Py_ssize_t stop = min(first + POSENC_TRIG_CHUNK_ROWS, job.nrows)
    cdef double* w = job.work + (POSENC_TRIG_SHARED_ROWS + POSENC_TRIG_THREAD_ROWS * slot) * job.nfreqs
    if job.cos_sin != NULL:
        job.cos_sin(job.positions, first, stop, job.steps, w, job.scale, job.out, job.out_stride,
                    job.sin_out, job.sin_stride)
    else:
        job.sinusoidal(job.positions, first, stop, job.steps, w, job.out, job.out_stride, job.split,
                       job.stream)


cdef void _fill_trig(TrigJob* job, const double* freqs, int num_threads) noexcept nogil:
    # job without its steps: the shared rows of job.work are set up here.
    cdef posenc_trig_steps steps
    posenc_trig_steps_init(&steps, freqs, job.work, job.nfreqs)
    job.steps = &steps
    posenc_parallel_for((job.nrows + POSENC_TRIG_CHUNK_ROWS - 1) // POSENC_TRIG_CHUNK_ROWS,
                        num_threads, _trig_chunk, job)


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
    cdef Py_ssize_t itemsize = cnp.PyArray_ITEMSIZE(cos_out)
    cdef TrigJob job = TrigJob(K.cos_sin[_dtype(cos_out)], NULL, <const double*>_data(positions),
                               positions.shape[0], freqs.shape[0], NULL, <double*>_data(work),
                               scale, _data(cos_out), cnp.PyArray_STRIDE(cos_out, 0) // itemsize,
                               _data(sin_out), cnp.PyArray_STRIDE(sin_out, 0) // itemsize, False,
                               False)
    cdef const double* f = <const double*>_data(freqs)
    if job.nrows == 0 or job.nfreqs == 0:
        return
    with nogil:
        _fill_trig(&job, f, num_threads)


def sinusoidal_rows(cnp.ndarray positions not None, cnp.ndarray freqs not None,
                    cnp.ndarray out not None, bint split, cnp.ndarray work not None,
                    int num_threads):
    """out[r] = the sinusoidal encoding of positions[r] (len(freqs) == ceil(dim/2)).

    `out`: C-contiguous (rows, dim); `work` as for `cos_sin_rows`.
    """
    cdef TrigJob job = TrigJob(NULL, K.sinusoidal[_dtype(out)], <const double*>_data(positions),
                               positions.shape[0], freqs.shape[0], NULL, <double*>_data(work),
                               1.0, _data(out), out.shape[1], NULL, 0, split,
                               cnp.PyArray_NBYTES(out) >= POSENC_STREAM_BYTES)
    cdef const double* f = <const double*>_data(freqs)
    if job.nrows == 0 or job.nfreqs == 0:
        return
    with nogil:
        _fill_trig(&job, f, num_threads)


cdef struct AddJob:
    # add_table_rows' call, for the pool.
    posenc_add_fn add
    const Py_ssize_t* rows
    const char* x
    char* out
    const char* table
    Py_ssize_t table_stride
    Py_ssize_t nrows
    Py_ssize_t dim
    Py_ssize_t row_bytes
    bint contiguous         # table rows follow each other in memory


cdef void _add_chunk(void* job_, Py_ssize_t chunk, int slot) noexcept nogil:
    # A run of rows that read consecutive table rows (the default positions)
    # is one call: add_position_table (8,2048,1024) float32 in place ran 1.75x
    # an in-place pass with a call per row, 1.35x with a call per run (AVX2
    # 2.01x -> 1.42x; AMD EPYC Zen 3).
    cdef const AddJob* job = <const AddJob*>job_
    cdef Py_ssize_t r = chunk * POSENC_ROW_CHUNK, stop = min(r + POSENC_ROW_CHUNK, job.nrows)
    cdef Py_ssize_t run
    while r < stop:
        run = 1
        if job.contiguous:
            while r + run < stop and job.rows[r + run] == job.rows[r] + run:
                run += 1
        job.add(job.x + r * job.row_bytes, job.out + r * job.row_bytes,
                job.table + job.rows[r] * job.table_stride, run * job.dim)
        r += run


def add_table_rows(cnp.ndarray x not None, cnp.ndarray out not None, cnp.ndarray table not None,
                   cnp.ndarray row_table not None, int num_threads):
    """out[r] = x[r] + table[row_table[r]], in the wider dtype, rounded once.

    x, out: C-contiguous (rows, dim) of one dtype, `out` may be `x`; `table`
    needs unit stride along its last axis; row_table: contiguous intp.
    """
    cdef bint in_place = _data(x) == _data(out)
    cdef int d = _dtype(x), t = _dtype(table)
    cdef posenc_add_fn add = K.add_in_place[d][t] if in_place else K.add[d][t]
    cdef AddJob job = AddJob(add,
                             <const Py_ssize_t*>_data(row_table), _data(x), _data(out),
                             _data(table), cnp.PyArray_STRIDE(table, 0), x.shape[0], x.shape[1],
                             x.shape[1] * cnp.PyArray_ITEMSIZE(x),
                             cnp.PyArray_STRIDE(table, 0) == x.shape[1] * cnp.PyArray_ITEMSIZE(table))
    if job.nrows == 0 or job.dim == 0:
        return
    cdef Py_ssize_t period = (_batch_rows(job.rows, job.nrows) if _add_block_bytes > 0 and job.contiguous
                              else 0)
    cdef TurnJob turns
    if period:
        turns = TurnJob(&job, period, job.nrows // period,
                        max(<Py_ssize_t>1, min(period, _add_block_bytes // cnp.PyArray_STRIDE(table, 0))))
        with nogil:
            posenc_parallel_for((period + turns.turn - 1) // turns.turn * turns.nbatches, num_threads,
                                _add_turn, &turns)
        return
    with nogil:
        posenc_parallel_for((job.nrows + POSENC_ROW_CHUNK - 1) // POSENC_ROW_CHUNK, num_threads,
                            _add_chunk, &job)


# Bytes of table rows per turn of the walk over batches at the same positions (0: none): the build's
# POSENC_ADD_BLOCK_BYTES, or this CPU's measured value (set once, at import, by _dispatch;
# set_block_bytes).
cdef Py_ssize_t _add_block_bytes = POSENC_ADD_BLOCK_BYTES


def add_batch_rows(cnp.ndarray row_table not None):
    """The rows of a batch where `row_table` (contiguous intp) is two or more batches that each read
    the same consecutive table rows (add_position_table's default positions), else 0."""
    return _batch_rows(<const Py_ssize_t*>_data(row_table), row_table.shape[0])


cdef Py_ssize_t _batch_rows(const Py_ssize_t* rows, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t p = 1, r
    while p < n and rows[p] == rows[0] + p:
        p += 1
    if p >= n or n % p:
        return 0
    for r in range(p, n):
        if rows[r] != rows[r - p]:
            return 0
    return p


cdef struct TurnJob:
    # add_table_rows' call as turns over batches, for the pool.
    const AddJob* job
    Py_ssize_t period       # rows of a batch
    Py_ssize_t nbatches
    Py_ssize_t turn         # rows of a turn


cdef void _add_turn(void* job_, Py_ssize_t item, int slot) noexcept nogil:
    # Work item = (turn, batch): the turn's consecutive rows of that batch, one call; the batches
    # of a turn follow each other, so that its table rows are read from L2.
    cdef const TurnJob* t = <const TurnJob*>job_
    cdef const AddJob* job = t.job
    cdef Py_ssize_t first = item // t.nbatches * t.turn
    cdef Py_ssize_t r = item % t.nbatches * t.period + first
    job.add(job.x + r * job.row_bytes, job.out + r * job.row_bytes,
            job.table + job.rows[r] * job.table_stride, min(t.turn, t.period - first) * job.dim)
