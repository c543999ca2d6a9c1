# Rotate-and-write into a paged KV cache: queries rotated, keys rotated
# straight into their cache slots, values copied into theirs, in one pass.
# apply_qk_to_cache_fast checks a call in C (None: the general path of
# _kv_cache.py validates it and calls rotate_into_kv_cache).

from libc.stdlib cimport calloc, free


cdef struct SlotLayout:
    # Where a cache's slot (block * block_size + offset) and head h start:
    # block * block_stride + offset * offset_stride + h * head_stride bytes in;
    # a row's dim items are contiguous.  C-contiguous (num_blocks, block_size,
    # kv_heads, dim) is vLLM's flash layout; other strides name other layouts.
    Py_ssize_t block_size
    Py_ssize_t block_stride
    Py_ssize_t offset_stride
    Py_ssize_t head_stride


cdef struct CacheWrite:
    # Where token t's rows are and go (bytes); see rotate_into_kv_cache.
    Py_ssize_t heads
    Py_ssize_t kv_heads
    Py_ssize_t row_bytes        # a q/k/v row (dim items of the data dtype)
    Py_ssize_t cache_row_bytes  # a cache row (dim items of the cache dtype)
    Py_ssize_t dim
    posenc_convert_fn narrow    # float32 -> cache dtype; NULL: same dtype, direct
    SlotLayout k_layout
    SlotLayout v_layout


cdef inline SlotLayout _slot_layout(cnp.ndarray cache) noexcept:
    cdef SlotLayout layout
    layout.block_size = cache.shape[1]
    layout.block_stride = cnp.PyArray_STRIDE(cache, 0)
    layout.offset_stride = cnp.PyArray_STRIDE(cache, 1)
    layout.head_stride = cnp.PyArray_STRIDE(cache, 2)
    return layout


cdef inline bint _cache_takes(int data, int cache) noexcept nogil:
    # A KV cache of dtype index `cache` takes rows of `data`: its own dtype, or a half type for float32.
    return cache == data or (data == POSENC_F32 and K.from_f32[cache] != NULL)


cdef inline char* _slot_row(char* cache, const SlotLayout* layout, long long slot) noexcept nogil:
    return (cache + (slot // layout.block_size) * layout.block_stride
            + (slot % layout.block_size) * layout.offset_stride)


cdef inline void _copy_values(const char* v_row, char* v_slot, const CacheWrite* w) noexcept nogil:
    # A token's value rows into its slot (cast to the cache dtype).
    cdef Py_ssize_t h
    if w.v_layout.head_stride == w.cache_row_bytes:
        if w.narrow == NULL:
            memcpy(v_slot, v_row, w.kv_heads * w.row_bytes)
        else:
            w.narrow(v_row, v_slot, w.kv_heads * w.dim)
        return
    for h in range(w.kv_heads):
        if w.narrow == NULL:
            memcpy(v_slot + h * w.v_layout.head_stride, v_row + h * w.row_bytes, w.row_bytes)
        else:
            w.narrow(v_row + h * w.row_bytes, v_slot + h * w.v_layout.head_stride, w.dim)


cdef CacheWrite _cache_write(cnp.ndarray q, cnp.ndarray k, cnp.ndarray k_cache, cnp.ndarray v_cache) except *:
    cdef CacheWrite w
    cdef int data = _dtype(q), cache = _dtype(k_cache)
    if not _cache_takes(data, cache):
        raise TypeError(f"no cache store of {q.dtype} data into a {k_cache.dtype} cache")
    w.heads = q.shape[1]
    w.kv_heads = k.shape[1]
    w.dim = q.shape[2]
    w.row_bytes = w.dim * cnp.PyArray_ITEMSIZE(q)
    w.cache_row_bytes = w.dim * cnp.PyArray_ITEMSIZE(k_cache)
    w.narrow = NULL if cache == data else K.from_f32[cache]
    w.k_layout = _slot_layout(k_cache)
    w.v_layout = _slot_layout(v_cache)
    return w


cdef inline void _write_token(Py_ssize_t t, long long slot, const char* q, char* out_q,
                              const char* k, const char* v, char* k_cache, char* v_cache,
                              const void* c, const void* s, float* scratch,
                              const CacheWrite* w, const RowCall* q_call,
                              const RowCall* k_call) noexcept nogil:
    cdef Py_ssize_t h
    cdef const char* k_row
    cdef const char* v_row
    cdef char* k_slot
    cdef char* v_slot
    _rotate_position_rows(q + t * w.heads * w.row_bytes, out_q + t * w.heads * w.row_bytes,
                          w.heads, c, s, q_call)
    if slot < 0:
        return
    k_row = k + t * w.kv_heads * w.row_bytes
    v_row = v + t * w.kv_heads * w.row_bytes
    k_slot = _slot_row(k_cache, &w.k_layout, slot)
    v_slot = _slot_row(v_cache, &w.v_layout, slot)
    if w.narrow == NULL and w.k_layout.head_stride == w.cache_row_bytes:
        # the token's key rows go to consecutive rows of its slot
        _rotate_position_rows(k_row, k_slot, w.kv_heads, c, s, k_call)
    else:
        for h in range(w.kv_heads):  # a half cache: rotated in float32, rounded once on store
            if w.narrow == NULL:
                _rotate_row(k_row + h * w.row_bytes, k_slot + h * w.k_layout.head_stride, c, s,
                            k_call)
            else:
                _rotate_row(k_row + h * w.row_bytes, <char*>scratch, c, s, k_call)
                w.narrow(scratch, k_slot + h * w.k_layout.head_stride, w.dim)
    _copy_values(v_row, v_slot, w)


cdef struct CacheJob:
    # _write_all's call, for the pool.
    const long long* slot_of
    const long long* row_of
    const char* q
    char* out_q
    const char* k
    const char* v
    char* k_cache
    char* v_cache
    const CosSinTable* table
    float* scratch          # a float32 row (w.dim) per thread, or NULL
    Py_ssize_t ntokens
    const CacheWrite* w
    const RowCall* q_call
    const RowCall* k_call


cdef void _write_chunk(void* job_, Py_ssize_t chunk, int slot) noexcept nogil:
    cdef const CacheJob* job = <const CacheJob*>job_
    cdef const CosSinTable* table = job.table
    cdef Py_ssize_t t
    for t in range(chunk * POSENC_ROW_CHUNK, min((chunk + 1) * POSENC_ROW_CHUNK, job.ntokens)):
        _write_token(t, job.slot_of[t], job.q, job.out_q, job.k, job.v, job.k_cache, job.v_cache,
                     table.cos + job.row_of[t] * table.cos_stride,
                     table.sin + job.row_of[t] * table.sin_stride,
                     NULL if job.scratch == NULL else job.scratch + slot * job.w.dim,
                     job.w, job.q_call, job.k_call)
    if job.q_call.stream or job.k_call.stream:
        posenc_sfence()


cdef int _write_all(cnp.ndarray q, cnp.ndarray out_q, cnp.ndarray k, cnp.ndarray v,
                    cnp.ndarray k_cache, cnp.ndarray v_cache, const long long* slot_of,
                    const long long* row_of, const CosSinTable* table, bint half,
                    Py_ssize_t start) except -1:
    cdef Py_ssize_t ntokens = q.shape[0], dim = q.shape[2]
    cdef Py_ssize_t size = cnp.PyArray_SIZE(q) + 2 * cnp.PyArray_SIZE(k)
    cdef Py_ssize_t nchunks = (ntokens + POSENC_ROW_CHUNK - 1) // POSENC_ROW_CHUNK
    cdef int data = _dtype(q)
    cdef int threads = _threads_for(size)
    cdef CacheWrite w = _cache_write(q, k, k_cache, v_cache)
    cdef RowCall q_call, k_call
    cdef const char* qp = _data(q)
    cdef char* op = _data(out_q)
    cdef const char* kp = _data(k)
    cdef const char* vp = _data(v)
    cdef char* kc = _data(k_cache)
    cdef char* vc = _data(v_cache)
    cdef float* scratch = NULL
    cdef cnp.ndarray scratch_rows
    q_call = _row_call(data, table.dtype, cnp.PyArray_ITEMSIZE(q), table.itemsize,
                       table.npairs, dim, half, False, qp == op, cnp.PyArray_NBYTES(q), start)
    # A key row goes to its slot (streamed when large: the cache is not read
    # back soon) or, for a half cache, to a float32 scratch row in L1.
    k_call = _row_call(data, table.dtype, cnp.PyArray_ITEMSIZE(k), table.itemsize,
                       table.npairs, dim, half, False, False,
                       cnp.PyArray_NBYTES(k) if w.narrow == NULL else 0, start)
    if q_call.rotate == NULL or k_call.rotate == NULL:
        raise TypeError(f"no rotation kernel for {q.dtype} data with this cos/sin table")
    if ntokens == 0:
        return 0
    if w.narrow != NULL:
        scratch_rows = cnp.PyArray_EMPTY(2, [threads, dim], cnp.NPY_FLOAT32, 0)
        scratch = <float*>_data(scratch_rows)
    cdef CacheJob job = CacheJob(slot_of, row_of, qp, op, kp, vp, kc, vc, table, scratch,
                                 ntokens, &w, &q_call, &k_call)
    with nogil:
        posenc_parallel_for(nchunks, threads, _write_chunk, &job)
    return 0


def rotate_into_kv_cache(cnp.ndarray q not None, cnp.ndarray out_q not None,
                         cnp.ndarray k not None, cnp.ndarray v not None,
                         cnp.ndarray k_cache not None, cnp.ndarray v_cache not None,
                         cnp.ndarray slots not None, cnp.ndarray rows not None,
                         cnp.ndarray cos_table not None, cnp.ndarray sin_table not None,
                         bint half_layout, Py_ssize_t start=0):
    """Rotate q into out_q, and k into its cache slots; copy v into its slots.

    q, out_q: C-contiguous (tokens, heads, dim), `out_q` may be `q`; k, v:
    C-contiguous (tokens, kv_heads, dim), of q's dtype; caches: (num_blocks,
    block_size, kv_heads, dim) views with contiguous rows, no two elements
    in one place, any other strides (vLLM's flash layout, blocks-first, one
    tensor of keys and values), of q's dtype or a half type for float32 q.
    slots, rows: int64 (tokens,): token t's cache slot (-1: none, others
    distinct and in range) and its cos/sin table row.  cos/sin tables: 2-D,
    unit stride along their last axis (npairs entries), any row stride;
    features [start, start + 2*npairs) rotate.  Each token is written by one
    thread: bitwise the same for any count.
    """
    cdef CosSinTable table = _table_from(cos_table, sin_table)
    _write_all(q, out_q, k, v, k_cache, v_cache, <const long long*>_data(slots),
               <const long long*>_data(rows), &table, half_layout, start)


cdef int _write_normed(cnp.ndarray q, cnp.ndarray out_q, cnp.ndarray k, cnp.ndarray v,
                       cnp.ndarray k_cache, cnp.ndarray v_cache, const long long* slot_of,
                       const long long* row_of, const CosSinTable* table, bint half, Py_ssize_t start,
                       cnp.ndarray q_factors, cnp.ndarray k_factors, double eps) except -1:
    # _write_all with each q and k row RMSNormed first (_norm_rows: q's rows to out_q, k's to their
    # slots), then the values copied.  Nothing written where a dtype has no kernel (TypeError).
    cdef CacheWrite w = _cache_write(q, k, k_cache, v_cache)
    cdef Py_ssize_t ntokens = q.shape[0], t, h
    cdef int data = _dtype(q), cache = _dtype(k_cache)
    cdef cnp.ndarray q_rows = cnp.PyArray_EMPTY(1, [ntokens * w.heads], cnp.NPY_INTP, 0)
    cdef cnp.ndarray k_rows = cnp.PyArray_EMPTY(1, [ntokens * w.kv_heads], cnp.NPY_INTP, 0)
    cdef cnp.ndarray k_at = cnp.PyArray_EMPTY(1, [ntokens * w.kv_heads], cnp.NPY_INT64, 0)
    cdef Py_ssize_t* qr = <Py_ssize_t*>_data(q_rows)
    cdef Py_ssize_t* kr = <Py_ssize_t*>_data(k_rows)
    cdef long long* at = <long long*>_data(k_at)
    cdef long long slot
    for t in range(ntokens):
        slot = slot_of[t]
        for h in range(w.heads):
            qr[t * w.heads + h] = row_of[t]
        for h in range(w.kv_heads):
            kr[t * w.kv_heads + h] = row_of[t]
            at[t * w.kv_heads + h] = -1 if slot < 0 else (
                (slot // w.k_layout.block_size) * w.k_layout.block_stride
                + (slot % w.k_layout.block_size) * w.k_layout.offset_stride + h * w.k_layout.head_stride)
    if not (_norm_takes(data, data, table.dtype, half, False) and _norm_takes(data, cache, table.dtype, half, True)):
        raise TypeError(f"no fused norm and rotation for {q.dtype} data into a {k_cache.dtype} cache")
    _norm_rows(_data(q), _data(out_q), ntokens * w.heads, w.dim, data, cnp.PyArray_ITEMSIZE(q), data,
               <const double*>_data(q_factors), eps, table, qr, half, _threads_for(cnp.PyArray_SIZE(q)), start,
               NULL)
    _norm_rows(_data(k), _data(k_cache), ntokens * w.kv_heads, w.dim, data, cnp.PyArray_ITEMSIZE(k), cache,
               <const double*>_data(k_factors), eps, table, kr, half, _threads_for(cnp.PyArray_SIZE(k)), start,
               at)
    for t in range(ntokens):
        if slot_of[t] >= 0:
            _copy_values(_data(v) + t * w.kv_heads * w.row_bytes,
                         _slot_row(_data(v_cache), &w.v_layout, slot_of[t]), &w)
    return 0


def norm_rotate_into_kv_cache(cnp.ndarray q not None, cnp.ndarray out_q not None,
                              cnp.ndarray k not None, cnp.ndarray v not None,
                              cnp.ndarray k_cache not None, cnp.ndarray v_cache not None,
                              cnp.ndarray slots not None, cnp.ndarray rows not None,
                              cnp.ndarray cos_table not None, cnp.ndarray sin_table not None,
                              bint half_layout, Py_ssize_t start, cnp.ndarray q_factors not None,
                              cnp.ndarray k_factors not None, double eps):
    """rotate_into_kv_cache with each q and k row RMSNormed first (norm_rotate_rows' rule:
    q_factors, k_factors C-contiguous float64 (dim,), `eps`)."""
    cdef CosSinTable table = _table_from(cos_table, sin_table)
    _write_normed(q, out_q, k, v, k_cache, v_cache, <const long long*>_data(slots),
                  <const long long*>_data(rows), &table, half_layout, start, q_factors, k_factors, eps)


cdef inline bint _index_array(object a, Py_ssize_t n):
    # An exact, C-contiguous, native int64 ndarray of shape (n,).
    return (cnp.PyArray_CheckExact(a) and cnp.PyArray_TYPE(<cnp.ndarray>a) == cnp.NPY_INT64
            and cnp.PyArray_ISCARRAY_RO(<cnp.ndarray>a)
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a)
            and cnp.PyArray_NDIM(<cnp.ndarray>a) == 1 and cnp.PyArray_DIMS(<cnp.ndarray>a)[0] == n)


cdef inline bint _cache_array(object a, cnp.ndarray k):
    # An exact, writeable, aligned, native ndarray (num_blocks, block_size,
    # kv_heads, dim) for k, whose strides place every element apart
    # (_kv_cache.slot_strides_apart, the general path's rule).
    cdef cnp.ndarray arr
    cdef Py_ssize_t stride[3]
    cdef Py_ssize_t extent[3]
    cdef Py_ssize_t inner, i, j, swap
    if not cnp.PyArray_CheckExact(a):
        return False
    arr = <cnp.ndarray>a
    if not (posenc_dtype_index(cnp.PyArray_TYPE(arr)) >= 0 and cnp.PyArray_ISWRITEABLE(arr)
            and cnp.PyArray_ISALIGNED(arr) and cnp.PyArray_ISNOTSWAPPED(arr)
            and cnp.PyArray_NDIM(arr) == 4 and arr.shape[2] == k.shape[1]
            and arr.shape[3] == k.shape[2]
            and (cnp.PyArray_STRIDE(arr, 3) == cnp.PyArray_ITEMSIZE(arr) or arr.shape[3] <= 1)):
        return False
    if cnp.PyArray_ISCARRAY(arr) or cnp.PyArray_SIZE(arr) == 0:
        return True
    for i in range(3):  # the outer axes by stride, each past the extent of those inside it
        stride[i] = cnp.PyArray_STRIDE(arr, i)
        extent[i] = arr.shape[i]
        if stride[i] < 0:
            return False
    for i in range(3):
        for j in range(2 - i):
            if stride[j] > stride[j + 1]:
                swap = stride[j]; stride[j] = stride[j + 1]; stride[j + 1] = swap
                swap = extent[j]; extent[j] = extent[j + 1]; extent[j + 1] = swap
    inner = arr.shape[3] * cnp.PyArray_ITEMSIZE(arr)
    for i in range(3):
        if extent[i] > 1:
            if stride[i] < inner:
                return False
            inner = stride[i] * extent[i]
    return True


cdef bint _slots_valid(const long long* slots, Py_ssize_t n, long long num_slots):
    # Every slot -1 or in [0, num_slots), no slot twice (pairwise for a few
    # tokens, a bitmap of the cache's slots for many).
    cdef Py_ssize_t i, j
    cdef long long s
    cdef unsigned char* seen
    for i in range(n):
        if slots[i] < -1 or slots[i] >= num_slots:
            return False
    if n <= 64:
        for i in range(n):
            if slots[i] >= 0:
                for j in range(i):
                    if slots[j] == slots[i]:
                        return False
        return True
    seen = <unsigned char*>calloc(num_slots // 8 + 1, 1)
    if seen == NULL:
        return False
    for i in range(n):
        s = slots[i]
        if s >= 0:
            if seen[s >> 3] & (1 << (s & 7)):
                free(seen)
                return False
            seen[s >> 3] |= 1 << (s & 7)
    free(seen)
    return True


def apply_qk_to_cache_fast(RotaryBase fast not None, q, k, v, positions, k_cache, v_cache,
                           slot_mapping, out_q, qk_norm=None, eps=1e-6, weight_offset=0.0):
    """RotaryEmbedding.apply_qk_to_cache on the fast path; None (nothing written) to fall back.

    Takes only calls that pass every rule of the general path (_kv_cache.py)
    with positions covered by `fast`'s cache (`qk_norm`: a tuple of two
    weights, with eps and weight_offset, as apply_qk_norm_fast takes them);
    a decode step is a few microseconds of checks here.
    """
    cdef cnp.ndarray qa, ka, va, kc, vc, pa, sa
    cdef Py_ssize_t n
    cdef long long lowest = 0, highest = 0
    cdef const long long* pos
    cdef CosSinTable table
    cdef double e = 0.0
    cdef tuple factors = None
    if not (_fast_paths_on and _fast_array(q, fast.dim) and _fast_array(k, fast.dim) and _fast_array(v, fast.dim)):
        return None
    if qk_norm is not None:
        if type(qk_norm) is not tuple or len(qk_norm) != 2:
            return None
        factors = _fast_norm_weights(qk_norm[0], qk_norm[1], eps, weight_offset, fast.dim, &e)
        if factors is None:
            return None
    qa, ka, va = <cnp.ndarray>q, <cnp.ndarray>k, <cnp.ndarray>v
    n = qa.shape[0]
    if (qa.ndim != 3 or ka.ndim != 3 or va.ndim != 3 or ka.shape[0] != n
            or va.shape[0] != n or va.shape[1] != ka.shape[1]
            or cnp.PyArray_TYPE(ka) != cnp.PyArray_TYPE(qa)
            or cnp.PyArray_TYPE(va) != cnp.PyArray_TYPE(qa)
            or not _index_array(positions, n) or not _index_array(slot_mapping, n)
            or not _cache_array(k_cache, ka) or not _cache_array(v_cache, ka)):
        return None
    pa, sa, kc, vc = (<cnp.ndarray>positions, <cnp.ndarray>slot_mapping, <cnp.ndarray>k_cache,
                      <cnp.ndarray>v_cache)
    if (cnp.PyArray_TYPE(vc) != cnp.PyArray_TYPE(kc) or vc.shape[0] != kc.shape[0]
            or vc.shape[1] != kc.shape[1]):
        return None
    if not _cache_takes(_dtype(qa), _dtype(kc)):
        return None
    for cache in (kc, vc):
        for other in (qa, ka, va, pa, sa):
            if not _disjoint(<cnp.ndarray>cache, <cnp.ndarray>other):
                return None
    if not _disjoint(kc, vc) or not _slots_valid(<const long long*>_data(sa), n,
                                                 <long long>kc.shape[0] * kc.shape[1]):
        return None
    pos = <const long long*>_data(pa)
    _position_range(pos, n, &lowest, &highest)
    if lowest < 0 or highest >= fast.valid_below:
        return None
    result = _fast_out(qa, out_q, (ka, va, kc, vc))
    if result is None:
        return None
    cache = fast._cache_for(_table_of(qa), highest)
    if cache is None:
        return None
    table = _stacked_table(_data(<cnp.ndarray>cache), fast.npairs, cnp.PyArray_ITEMSIZE(<cnp.ndarray>cache),
                           _table_of(qa))
    if qk_norm is None:
        _write_all(qa, <cnp.ndarray>result, ka, va, kc, vc, <const long long*>_data(sa), pos, &table,
                   fast.half, fast.start)
    else:
        _write_normed(qa, <cnp.ndarray>result, ka, va, kc, vc, <const long long*>_data(sa), pos, &table,
                      fast.half, fast.start, factors[0], factors[1], e)
    return result
