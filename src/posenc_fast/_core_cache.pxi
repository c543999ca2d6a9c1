# Rotate-and-write into a paged KV cache: queries rotated, keys rotated
# straight into their cache slots, values copied into theirs, in one pass.


def rotary_cache_tables(RotaryFastPath fast not None, cnp.ndarray x not None, long long lowest,
                        long long highest):
    """The (cos, sin) views of `fast`'s cache for rotating x's dtype, or None.

    None when positions lowest..highest are not all covered (below 0, past
    `valid_below`, or past the cache's size limit): build a table instead.
    """
    if lowest < 0 or highest >= fast.valid_below:
        return None
    cache = fast._cache_for(posenc_table_dtype(_dtype(x)), highest)
    return None if cache is None else (cache[:, 0], cache[:, 1])


cdef struct CacheWrite:
    # Where token t's rows are and go (bytes); see rotate_into_kv_cache.
    Py_ssize_t heads
    Py_ssize_t kv_heads
    Py_ssize_t row_bytes        # a q/k/v row (dim items of the data dtype)
    Py_ssize_t cache_row_bytes  # a cache row (dim items of the cache dtype)
    Py_ssize_t dim
    posenc_convert_fn narrow    # float32 -> cache dtype; NULL: same dtype, direct
    bint stream


cdef inline void _write_token(Py_ssize_t t, long long slot, const char* q, char* out_q,
                              const char* k, const char* v, char* k_cache, char* v_cache,
                              const void* c, const void* s, float* scratch,
                              const CacheWrite* w, const RowCall* q_call,
                              const RowCall* k_call) noexcept nogil:
    cdef Py_ssize_t h, r
    cdef const char* k_row
    cdef char* k_slot
    for h in range(w.heads):
        r = t * w.heads + h
        _rotate_row(q + r * w.row_bytes, out_q + r * w.row_bytes, c, s, q_call)
    if slot < 0:
        return
    for h in range(w.kv_heads):
        k_row = k + (t * w.kv_heads + h) * w.row_bytes
        k_slot = k_cache + (slot * w.kv_heads + h) * w.cache_row_bytes
        if w.narrow == NULL:
            _rotate_row(k_row, k_slot, c, s, k_call)
        else:  # rotated in float32, rounded once on store
            _rotate_row(k_row, <char*>scratch, c, s, k_call)
            w.narrow(scratch, k_slot, w.dim)
    if w.narrow == NULL:
        memcpy(v_cache + slot * w.kv_heads * w.cache_row_bytes, v + t * w.kv_heads * w.row_bytes,
               w.kv_heads * w.row_bytes)
    else:
        w.narrow(v + t * w.kv_heads * w.row_bytes, v_cache + slot * w.kv_heads * w.cache_row_bytes,
                 w.kv_heads * w.dim)


def rotate_into_kv_cache(cnp.ndarray q not None, cnp.ndarray out_q not None,
                         cnp.ndarray k not None, cnp.ndarray v not None,
                         cnp.ndarray k_cache not None, cnp.ndarray v_cache not None,
                         cnp.ndarray slots not None, cnp.ndarray rows not None,
                         cnp.ndarray cos_table not None, cnp.ndarray sin_table not None,
                         bint half_layout):
    """Rotate q into out_q, and k into its cache slots; copy v into its slots.

    q, out_q: C-contiguous (tokens, heads, dim), `out_q` may be `q`; k, v:
    C-contiguous (tokens, kv_heads, dim), of q's dtype; caches: C-contiguous
    (slots..., kv_heads, dim), of q's dtype or a half type for float32 q.
    slots, rows: int64 (tokens,): token t's cache slot (-1: none, others
    distinct and in range) and its cos/sin table row.  cos/sin tables: 2-D,
    unit stride along their last axis (npairs entries), any row stride.
    Each token is written by one thread: bitwise the same for any count.
    """
    import numpy
    cdef Py_ssize_t ntokens = q.shape[0], dim = q.shape[2], npairs = cos_table.shape[1]
    cdef Py_ssize_t size = cnp.PyArray_SIZE(q) + 2 * cnp.PyArray_SIZE(k)
    cdef Py_ssize_t nchunks = (ntokens + POSENC_ROW_CHUNK - 1) // POSENC_ROW_CHUNK
    cdef Py_ssize_t cstride = cnp.PyArray_STRIDE(cos_table, 0)
    cdef Py_ssize_t sstride = cnp.PyArray_STRIDE(sin_table, 0)
    cdef int data = _dtype(q), cache = _dtype(k_cache), table = _dtype(cos_table)
    cdef int threads = _threads_for(size)
    cdef Py_ssize_t chunk, t, tid
    cdef CacheWrite w
    cdef RowCall q_call, k_call
    cdef const long long* slot_of = <const long long*>_data(slots)
    cdef const long long* row_of = <const long long*>_data(rows)
    cdef const char* qp = _data(q)
    cdef char* op = _data(out_q)
    cdef const char* kp = _data(k)
    cdef const char* vp = _data(v)
    cdef char* kc = _data(k_cache)
    cdef char* vc = _data(v_cache)
    cdef const char* cbase = _data(cos_table)
    cdef const char* sbase = _data(sin_table)
    cdef float* scratch = NULL
    cdef cnp.ndarray scratch_rows
    w.heads = q.shape[1]
    w.kv_heads = k.shape[1]
    w.dim = dim
    w.row_bytes = dim * cnp.PyArray_ITEMSIZE(q)
    w.cache_row_bytes = dim * cnp.PyArray_ITEMSIZE(k_cache)
    w.narrow = NULL if cache == data else K.from_f32[cache]
    if cache != data and (data != POSENC_F32 or w.narrow == NULL):
        raise TypeError(f"no cache store of {q.dtype} data into a {k_cache.dtype} cache")
    q_call = _row_call(data, table, cnp.PyArray_ITEMSIZE(q), cnp.PyArray_ITEMSIZE(cos_table),
                       npairs, dim, half_layout, False, qp == op, cnp.PyArray_NBYTES(q))
    # A key row goes to its slot (streamed when large: the cache is not read
    # back soon) or, for a half cache, to a float32 scratch row in L1.
    k_call = _row_call(data, table, cnp.PyArray_ITEMSIZE(k), cnp.PyArray_ITEMSIZE(cos_table),
                       npairs, dim, half_layout, False, False,
                       cnp.PyArray_NBYTES(k) if w.narrow == NULL else 0)
    if q_call.rotate == NULL or k_call.rotate == NULL:
        raise TypeError(f"no rotation kernel for {q.dtype} data with a {cos_table.dtype} table")
    if w.narrow != NULL:
        scratch_rows = numpy.empty((threads, dim), numpy.float32)
        scratch = <float*>_data(scratch_rows)
    if ntokens == 0:
        return
    with nogil:
        if threads == 1:  # no parallel region: it costs a microsecond
            for t in range(ntokens):
                _write_token(t, slot_of[t], qp, op, kp, vp, kc, vc,
                             cbase + row_of[t] * cstride, sbase + row_of[t] * sstride,
                             scratch, &w, &q_call, &k_call)
            if q_call.stream or k_call.stream:
                posenc_sfence()
        else:
            for chunk in prange(nchunks, num_threads=threads, schedule="static"):
                tid = threadid()
                for t in range(chunk * POSENC_ROW_CHUNK, min((chunk + 1) * POSENC_ROW_CHUNK,
                                                             ntokens)):
                    _write_token(t, slot_of[t], qp, op, kp, vp, kc, vc,
                                 cbase + row_of[t] * cstride, sbase + row_of[t] * sstride,
                                 NULL if scratch == NULL else scratch + tid * dim,
                                 &w, &q_call, &k_call)
                if q_call.stream or k_call.stream:
                    posenc_sfence()
