# RMSNorm of each q/k head row, then RoPE, in one pass over the row
# (posenc_fast._qk_norm: RotaryEmbedding.apply_qk_norm and vLLM-style calls).
#
# A row is widened to float32 (float64 for float64 data) in a per-thread
# scratch row, its sum of squares taken (K.sum_squares: in float64, 32 running
# sums in a fixed order, the same in every variant), scaled by
# 1 / sqrt(sum / dim + eps) and by its weight (K.scale_row), rotated by the
# float32 (float64) row kernel, and stored, a half type rounded once: to the
# next row of `out`, or (a paged KV cache) to the byte offset of its own row.
# Rows rotated whole (the half layout, a float32 table) are scaled, rotated
# and stored by one kernel (K.norm_half) where the variant has vectors, and
# stored in x's dtype the whole loop is a kernel (K.norm_rows: the same
# operations inline, the common head sizes as constants).  A row's scale
# (two divisions and a square root, each waiting on the last) is formed
# while the next row is widened and summed.

from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_CheckExact
from libc.math cimport isfinite


cdef struct NormJob:
    const Py_ssize_t* rows   # the cos/sin table row of each row of x
    const char* x
    char* out
    CosSinTable table
    Py_ssize_t nrows
    Py_ssize_t dim
    Py_ssize_t itemsize
    const long long* in_at   # each row's byte offset in x, or NULL: rows in order
    const long long* out_at  # each row's byte offset in out (-1: not stored), or NULL: rows in order
    int store                # out's dtype index: x's, or a half type for float32 x
    const double* weight     # dim factors: weight_offset + weight
    const float* weight32    # the same rounded to float32 (float32 arithmetic)
    double eps
    int data                 # x's dtype index
    char* scratch            # NORM_SCRATCH_ROWS * dim compute items per thread
    const RowCall* call      # the compute dtype's rotation of one row
    posenc_norm_half_fn fused  # scale, rotation and store in one pass (K.norm_half), or NULL: the passes
    posenc_norm_rows_fn rows_kernel  # the whole loop (K.norm_rows: x's dtype stored), or NULL


cdef enum:
    NORM_SCRATCH_ROWS = 3  # two rows in the compute type (this one, the next), one rotated


cdef inline Py_ssize_t _scratch_row_bytes(Py_ssize_t dim, Py_ssize_t size) noexcept nogil:
    # A scratch row's bytes, whole vectors (64 bytes): each row starts on a vector
    # boundary (stores splitting cache lines cost: posenc_prefetch_for_write).
    return (dim * size + 63) // 64 * 64


cdef inline const char* _norm_input(const NormJob* job, int compute, Py_ssize_t r,
                                    char* widened) noexcept nogil:
    # Row r in the compute type: x's own row, or (a half type) widened into `widened`.
    cdef const char* row = job.x + (job.in_at[r] if job.in_at != NULL else r * job.dim * job.itemsize)
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
    cdef double scale, next_scale = 0.0
    cdef double reciprocal = posenc_norm_reciprocal(dim)
    cdef posenc_norm_job rows_job
    if job.rows_kernel != NULL:
        rows_job = posenc_norm_job(job.x, job.out, job.in_at, job.out_at, job.rows, job.table.cos, job.table.sin,
                                   job.table.cos_stride, job.table.sin_stride, job.weight32, job.eps, dim)
        job.rows_kernel(&rows_job, first, stop, <float*>buffers)
        return
    if first < stop:
        next_row = _norm_input(job, compute, first, buffers)
        next_scale = posenc_norm_scale(K.sum_squares[compute](next_row, dim), dim, reciprocal, job.eps)
    for r in range(first, stop):
        row, scale = next_row, next_scale
        if r + 1 < stop:
            next_row = _norm_input(job, compute, r + 1, buffers + ((r + 1 - first) & 1) * row_bytes)
            next_scale = posenc_norm_scale(K.sum_squares[compute](next_row, dim), dim, reciprocal, job.eps)
        if job.out_at == NULL:
            out_row = job.out + r * dim * job.itemsize
        elif job.out_at[r] < 0:
            continue
        else:
            out_row = job.out + job.out_at[r]
        if job.fused != NULL:
            job.fused(<const float*>row, out_row, job.weight32, scale,
                      <const float*>(job.table.cos + job.rows[r] * job.table.cos_stride),
                      <const float*>(job.table.sin + job.rows[r] * job.table.sin_stride), dim // 2)
            continue
        # a widened row is normalized where it lies; x's own row into the scratch row not holding the next
        normed = <char*>row if job.data != compute else buffers + ((r - first + 1) & 1) * row_bytes
        K.scale_row[compute](row, normed, weight, dim, scale)
        if job.store == compute:
            _rotate_row_by(normed, out_row, &job.table, job.rows[r], job.call)
        else:
            _rotate_row_by(normed, rotated, &job.table, job.rows[r], job.call)
            K.from_f32[job.store](rotated, out_row, dim)


cdef inline bint _norm_takes(int data, int store, int table, bint half_layout, bint at) noexcept:
    # Whether the norm kernels take rows of `data` with a cos/sin table of `table`, stored as `store`
    # (another dtype only through row offsets `at`, narrowed from float32).
    cdef int compute = POSENC_F64 if data == POSENC_F64 else POSENC_F32
    return (K.rotate[compute][table][POSENC_ROW_HALF_VEC if half_layout else POSENC_ROW_INTERLEAVED] != NULL
            and (data == compute or K.to_f32[data] != NULL)
            and (store == data or (at and compute == POSENC_F32 and K.from_f32[store] != NULL)))


cdef cnp.ndarray _norm_block(Py_ssize_t dim, int data, int num_threads):
    # _norm_rows' memory: the float32 weight, then each thread's scratch rows, from a 64-byte boundary.
    cdef Py_ssize_t compute_size = 8 if data == POSENC_F64 else 4
    return cnp.PyArray_EMPTY(1, [_scratch_row_bytes(dim, 4) + max(num_threads, 1) * NORM_SCRATCH_ROWS
                                 * _scratch_row_bytes(dim, compute_size) + 64], cnp.NPY_UINT8, 0)


cdef int _norm_rows(const char* x, char* out, Py_ssize_t nrows, Py_ssize_t dim, int data,
                    Py_ssize_t itemsize, int store, const double* weight, double eps,
                    const CosSinTable* table, const Py_ssize_t* rows, bint half_layout, int num_threads,
                    Py_ssize_t start, const long long* at, const long long* in_at=NULL,
                    cnp.ndarray block=None) except -1:
    # norm_rotate_rows on pointers (`in_at`: each row's byte offset in x; NULL: rows in order), for
    # dtypes _norm_takes; `block`: its _norm_block, made before (None: made here).
    cdef int compute = POSENC_F64 if data == POSENC_F64 else POSENC_F32
    cdef Py_ssize_t compute_size = 8 if compute == POSENC_F64 else 4, i
    cdef Py_ssize_t nchunks = (nrows + POSENC_ROW_CHUNK - 1) // POSENC_ROW_CHUNK
    cdef RowCall call = _row_call(compute, table.dtype, compute_size, table.itemsize, table.npairs, dim,
                                  half_layout, False, False, 0, start)
    cdef Py_ssize_t weight_bytes = _scratch_row_bytes(dim, 4)
    cdef char* aligned
    if nrows == 0 or dim == 0:
        return 0
    if block is None:
        block = _norm_block(dim, data, num_threads)
    aligned = _data(block) + ((64 - (<size_t>_data(block) & 63)) & 63)
    for i in range(dim):
        (<float*>aligned)[i] = <float>weight[i]
    # rows rotated whole by a float32 table (the half layout) in one pass where the variant has it
    cdef posenc_norm_half_fn fused = (K.norm_half[store] if compute == POSENC_F32 and table.dtype == POSENC_F32
                                      and half_layout and 2 * table.npairs == dim and start == 0 else NULL)
    cdef posenc_norm_rows_fn rows_kernel = K.norm_rows[data] if fused != NULL and store == data else NULL
    cdef NormJob job = NormJob(rows, x, out, table[0], nrows, dim, itemsize, in_at, at, store,
                               weight, <const float*>aligned, eps, data, aligned + weight_bytes, &call, fused,
                               rows_kernel)
    with nogil:
        posenc_parallel_for(nchunks, num_threads, _norm_rotate_chunk, &job)
    return 0


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
    cdef CosSinTable table = _table_from(cos_table, sin_table)
    cdef const long long* at = NULL if out_at is None else <const long long*>cnp.PyArray_DATA(out_at)
    if not _norm_takes(_dtype(x), _dtype(out), table.dtype, half_layout, at != NULL):
        raise TypeError(f"no fused norm and rotation for {x.dtype} data with a "
                        f"{cos_table.dtype} table into {out.dtype}")
    _norm_rows(_data(x), _data(out), x.shape[0], x.shape[1], _dtype(x), cnp.PyArray_ITEMSIZE(x), _dtype(out),
               <const double*>_data(weight), eps, &table, <const Py_ssize_t*>_data(row_table), half_layout,
               num_threads, start, at)


cdef bint _finite_real(object value, double* result):
    # A Python float that is finite, or an int float64 holds exactly (v.real's reading of either).
    cdef long long n
    cdef int overflow = 0
    if PyFloat_CheckExact(value):
        result[0] = PyFloat_AS_DOUBLE(value)
        return isfinite(result[0])
    if PyLong_CheckExact(value):
        n = PyLong_AsLongLongAndOverflow(value, &overflow)
        result[0] = <double>n
        return not overflow and -(1LL << 53) <= n <= (1LL << 53)
    return False


cdef object _fast_weight(object weight, Py_ssize_t dim, double offset):
    # _strided_factors of an exact, aligned, native ndarray; None for anything else.
    cdef Strided v
    return _strided_factors(&v, dim, offset) if _array_strided(weight, &v) else None


cdef object _strided_factors(const Strided* w, Py_ssize_t dim, double offset):
    # _qk_norm.norm_weight's float64 factors offset + weight, for (dim,) contiguous, aligned items of a
    # kernel dtype; None for anything else.
    cdef cnp.ndarray factors
    cdef double* f
    cdef float value
    cdef Py_ssize_t i
    cdef int d = _strided_dtype(w)
    if (d < 0 or w.nd != 1 or w.dims[0] != dim or (dim > 1 and w.steps[0] != w.itemsize)
            or <size_t>w.data % <size_t>w.itemsize):
        return None
    factors = cnp.PyArray_EMPTY(1, [dim], cnp.NPY_FLOAT64, 0)
    f = <double*>_data(factors)
    if d == POSENC_F64:
        for i in range(dim):
            f[i] = (<const double*>w.data)[i] + offset
    elif d == POSENC_F32:
        for i in range(dim):
            f[i] = <double>(<const float*>w.data)[i] + offset
    else:  # a half type, widened to float32 (exactly) an item at a time
        for i in range(dim):
            K.to_f32[d](w.data + i * w.itemsize, &value, 1)
            f[i] = <double>value + offset
    return factors


cdef inline bint _norm_values_fit(double eps, double offset) noexcept nogil:
    # eps finite and >= 0, weight_offset finite: the values the fast paths take (the compiled torch
    # kernel's entries receive them as doubles).
    return isfinite(eps) and eps >= 0 and isfinite(offset)


cdef bint _norm_args_fit(object eps, object weight_offset, double* e, double* offset):
    # eps and weight_offset as the fast paths take them (Python reals of _norm_values_fit): their values
    # into e and offset.  Calls without weights check them too (the general paths raise on others).
    return _finite_real(eps, e) and _finite_real(weight_offset, offset) and _norm_values_fit(e[0], offset[0])


cdef tuple _fast_norm_weights(object q_weight, object k_weight, object eps, object weight_offset,
                              Py_ssize_t dim, double* e):
    # (q factors, k factors) and eps in `e` for the fast paths (see apply_qk_norm_fast); None for
    # anything else.
    cdef double offset = 0.0
    if not _norm_args_fit(eps, weight_offset, e, &offset):
        return None
    q_factors = _fast_weight(q_weight, dim, offset)
    k_factors = _fast_weight(k_weight, dim, offset)
    return None if q_factors is None or k_factors is None else (q_factors, k_factors)


cdef cnp.ndarray _planned_rows(const RowPlan* plan):
    # The cos/sin table row of each row of a planned array, in C order.
    cdef cnp.ndarray rows = cnp.PyArray_EMPTY(1, [plan.outer * plan.seq * plan.inner], cnp.NPY_INTP, 0)
    cdef Py_ssize_t* row = <Py_ssize_t*>_data(rows)
    cdef Py_ssize_t o, s, i, t
    for o in range(plan.outer):
        for s in range(plan.seq):
            t = plan.base + (plan.positions[s] if plan.positions != NULL else s)
            for i in range(plan.inner):
                row[0] = t
                row += 1
    return rows


cdef tuple _norm_plan_arrays(RotaryBase fast, cnp.ndarray x, const RowPlan* plan):
    # What _norm_planned needs made for x: its rows' table rows and _norm_rows' block.
    return _planned_rows(plan), _norm_block(fast.dim, _dtype(x), _threads_for(cnp.PyArray_SIZE(x)))


cdef int _norm_planned(RotaryBase fast, cnp.ndarray x, cnp.ndarray out, object cache,
                       cnp.ndarray factors, double eps, tuple made) except -1:
    # The norm and rotation of x's planned rows by `fast`'s cache into out (`made`: _norm_plan_arrays).
    cdef int d = _dtype(x)
    cdef CosSinTable table = _stacked_table(_data(<cnp.ndarray>cache), fast.npairs,
                                            cnp.PyArray_ITEMSIZE(<cnp.ndarray>cache), _table_of(x))
    rows, block = made
    return _norm_rows(_data(x), _data(out), cnp.PyArray_SIZE(x) // fast.dim, fast.dim, d,
                      cnp.PyArray_ITEMSIZE(x), d, <const double*>_data(factors), eps, &table,
                      <const Py_ssize_t*>_data(<cnp.ndarray>rows), fast.half, _threads_for(cnp.PyArray_SIZE(x)),
                      fast.start, NULL, NULL, block)


def apply_qk_norm_fast(RotaryBase fast not None, q, k, q_weight, k_weight, positions, offset, seq_axis,
                       eps, weight_offset, out_q, out_k):
    """RotaryEmbedding.apply_qk_norm on the fast path: (q_out, k_out), or None (nothing written) to
    fall back.

    apply_qk's fast-path rules; the weights C-contiguous (dim,) arrays of a
    kernel dtype; eps and weight_offset Python floats (or ints float64 holds),
    finite, eps >= 0.  A decode step is a few microseconds of checks here.
    """
    cdef RowPlan q_plan, k_plan
    cdef long long offset_value = 0
    cdef double e = 0.0
    if (not _fast_paths_on or fast.streams or not _fast_array(q, fast.dim)
            or not _fast_array(k, fast.dim) or not _offset_value(offset, &offset_value)):
        return None
    if (not _plan_rows(<cnp.ndarray>q, positions, seq_axis, offset_value, &q_plan)
            or not _plan_rows(<cnp.ndarray>k, positions, seq_axis, offset_value, &k_plan)
            or q_plan.seq != k_plan.seq or not fast._usable(&q_plan) or not fast._usable(&k_plan)
            or not _disjoint(<cnp.ndarray>q, <cnp.ndarray>k)):
        return None
    factors = _fast_norm_weights(q_weight, k_weight, eps, weight_offset, fast.dim, &e)
    q_out = _fast_out(<cnp.ndarray>q, out_q, _with_positions((k,), positions, &q_plan))
    k_out = _fast_out(<cnp.ndarray>k, out_k, _with_positions((q,) if q_out is None else (q, q_out), positions,
                                                             &k_plan))
    if factors is None or q_out is None or k_out is None:
        return None
    q_factors, k_factors = factors
    q_cache = fast._cache_for(_table_of(q), q_plan.highest, _table_offset(<cnp.ndarray>q, q_out is q))
    k_cache = fast._cache_for(_table_of(k), k_plan.highest)
    if (q_cache is None or k_cache is None
            or not _norm_takes(_dtype(q), _dtype(q), _table_of(q), fast.half, False)
            or not _norm_takes(_dtype(k), _dtype(k), _table_of(k), fast.half, False)):
        return None
    made = (_norm_plan_arrays(fast, q, &q_plan), _norm_plan_arrays(fast, k, &k_plan))  # before any write
    _norm_planned(fast, q, q_out, q_cache, q_factors, e, made[0])
    _norm_planned(fast, k, k_out, k_cache, k_factors, e, made[1])
    return q_out, k_out


cdef tuple _token_tables(const TokenRows* rows, Py_ssize_t tokens, const long long* pos):
    # Each (token, head) row's byte offset from rows.data (None: the rows follow each other), and its
    # cos/sin table row: pos[t] (NULL: t).
    cdef cnp.ndarray table_rows = cnp.PyArray_EMPTY(1, [tokens * rows.heads], cnp.NPY_INTP, 0)
    cdef cnp.ndarray at = None
    cdef Py_ssize_t t, h, r = 0
    if not rows.extent == rows.heads * rows.head_stride == rows.token_stride:
        at = cnp.PyArray_EMPTY(1, [tokens * rows.heads], cnp.NPY_INT64, 0)
    for t in range(tokens):
        for h in range(rows.heads):
            if at is not None:
                (<long long*>_data(at))[r] = t * rows.token_stride + h * rows.head_stride
            (<Py_ssize_t*>_data(table_rows))[r] = pos[t] if pos != NULL else t
            r += 1
    return at, table_rows


cdef inline const long long* _offsets(object at) noexcept:
    # _token_tables' offsets as _norm_rows takes them.
    return NULL if at is None else <const long long*>_data(<cnp.ndarray>at)


def fused_qk_norm_rope_fast(positions, query, key, q_weight, k_weight, head_size, cos_sin_cache, is_neox,
                            eps, weight_offset):
    """vllm.fused_qk_norm_rope's common call, every check in C: True, or False (nothing written).

    rotate_tokens_fast's arguments and rules (query and key where the server
    holds them; a ``[cos | sin]`` cache in their dtype, or float32 for half
    types; int64 positions (tokens,)), the weights as apply_qk_norm_fast takes
    them.  The cache's rows of the call's positions are widened to the
    compute dtype where they are a half type, as the general path does.
    """
    cdef Strided v[4]  # query, key, the [cos | sin] cache, the positions
    cdef Strided w[2]  # the weights
    cdef double e = 0.0, offset = 0.0
    cdef bint grad, tensors
    if (not _fast_paths_on or not _size_int(head_size) or type(is_neox) is not bool or head_size < 1
            or key is None or not _token_arrays(query, key, cos_sin_cache, positions, v, &grad)
            or not _norm_args_fit(eps, weight_offset, &e, &offset)):
        return False
    tensors = type(query) is _Tensor
    if (tensors and not _writable((query, key)) or not _strided_of(q_weight, tensors, grad, True, &w[0])
            or not _strided_of(k_weight, tensors, grad, True, &w[1])
            or not _norm_tokens(v, w, head_size, is_neox, e, offset)):
        return False
    if tensors:
        _count_writes((query, key))
    return True


cdef bint _norm_tokens(const Strided* v, const Strided* w, Py_ssize_t dim, bint half, double eps,
                       double offset) except -1:
    # fused_qk_norm_rope_fast's call on _token_arrays' v and the weights w (and the compiled torch
    # kernel's): True, or False with nothing written where it does not take them.  Every array it
    # needs is made before the first write.
    cdef TokenRows rows[2]
    cdef CosSinTable cos_sin
    cdef cnp.ndarray widened = None
    cdef Py_ssize_t tokens = 0, j
    cdef const long long* pos = NULL
    cdef int d = _strided_dtype(&v[0]), threads[2]
    cdef int compute = POSENC_F64 if d == POSENC_F64 else POSENC_F32
    if not _token_table(&v[2], &v[3], dim, &cos_sin, &tokens, &pos) or not _vllm_table_takes(d, cos_sin.dtype):
        return False
    for j in range(2):
        if (not _token_rows(&v[j], tokens, dim, 0, &rows[j]) or _strided_dtype(&v[j]) != d
                or not _strided_disjoint(&v[j], &v[2])):
            return False
    factors = (_strided_factors(&w[0], dim, offset), _strided_factors(&w[1], dim, offset))
    if not _rows_disjoint(&rows[0], &rows[1], tokens) or factors[0] is None or factors[1] is None:
        return False
    if cos_sin.dtype != compute:  # a half-type cache: the call's rows, widened (row t for token t)
        widened = _widened_rows(&cos_sin, pos, tokens)
    if not _norm_takes(d, d, cos_sin.dtype, half, True):
        return False
    made = []
    for j in range(2):
        threads[j] = _threads_for(tokens * rows[j].heads * dim)
        made.append((*_token_tables(&rows[j], tokens, NULL if widened is not None else pos),
                     _norm_block(dim, d, threads[j])))
    for j in range(2):
        at, table_rows, block = made[j]
        _norm_rows(rows[j].data, rows[j].data, tokens * rows[j].heads, dim, d, _itemsize(&v[0]), d,
                   <const double*>_data(<cnp.ndarray>factors[j]), eps, &cos_sin,
                   <const Py_ssize_t*>_data(<cnp.ndarray>table_rows), half, threads[j], 0, _offsets(at),
                   _offsets(at), block)
    return True
