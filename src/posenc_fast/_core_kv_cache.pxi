# Rotate-and-write into a paged KV cache: queries rotated, keys rotated
# straight into their cache slots, values copied into theirs, in one pass.
# apply_qk_to_cache_fast checks a call in C (None: the general path of
# _kv_cache.py validates it and calls rotate_into_kv_cache).

from libc.stdlib cimport calloc, free


cdef TokenWalk _cache_walk(const TokenRows* rows, Py_ssize_t tokens, Py_ssize_t dim, int data,
                            Py_ssize_t itemsize, const Strided* k_cache, const Strided* v_cache) except *:
    # _cache_walk_of, for caches that take the data.
    if not _cache_takes(data, _strided_dtype(k_cache)):
        raise TypeError(f"no cache store of this data into a {<object>k_cache.descr} cache")
    return _cache_walk_of(rows, tokens, dim, data, itemsize, k_cache, v_cache)


cdef TokenWalk _cache_walk_of(const TokenRows* rows, Py_ssize_t tokens, Py_ssize_t dim, int data,
                              Py_ssize_t itemsize, const Strided* k_cache, const Strided* v_cache) noexcept nogil:
    # rows: q, out_q, k, v; the caches (num_blocks, block_size, kv_heads, dim) views, taking the data.
    cdef TokenWalk w
    cdef int cache = _strided_dtype(k_cache)
    w = _rows_walk(&rows[0], &rows[1], tokens, dim, data, itemsize)
    w.k, w.v = rows[2], rows[3]
    w.cache = cache
    w.cache_row_bytes = dim * _itemsize(k_cache)
    w.narrow = NULL if cache == data else K.from_f32[cache]
    w.k_layout = _slot_layout(k_cache)
    w.v_layout = _slot_layout(v_cache)
    return w


cdef inline int _cache_threads(const TokenWalk* w) noexcept nogil:
    # The threads for a walk's q, k and v items.
    return _threads_for(w.tokens * (w.q.heads + 2 * w.k.heads) * w.dim)


cdef TokenWalk _arrays_walk(cnp.ndarray q, cnp.ndarray out_q, cnp.ndarray k, cnp.ndarray v,
                            const Strided* caches) except *:
    # _cache_walk of (tokens, heads, dim) arrays; caches: the key's, then the value's.
    cdef TokenRows rows[4]
    rows[0], rows[1], rows[2], rows[3] = _array_rows(q), _array_rows(out_q), _array_rows(k), _array_rows(v)
    return _cache_walk(rows, q.shape[0], q.shape[2], _dtype(q), cnp.PyArray_ITEMSIZE(q), &caches[0], &caches[1])


cdef inline TokenWalk _cache_arrays_walk(cnp.ndarray q, cnp.ndarray out_q, cnp.ndarray k, cnp.ndarray v,
                                         cnp.ndarray k_cache, cnp.ndarray v_cache) except *:
    # _arrays_walk of caches given as ndarrays.
    cdef Strided caches[2]
    _fill_strided(k_cache, &caches[0])
    _fill_strided(v_cache, &caches[1])
    return _arrays_walk(q, out_q, k, v, caches)


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
    cdef TokenWalk w = _cache_arrays_walk(q, out_q, k, v, k_cache, v_cache)
    _walk_tokens(&w, <const long long*>_data(slots), <const long long*>_data(rows), &table, half_layout, False, start,
                 _cache_threads(&w))


cdef int _write_normed(const TokenWalk* w, const long long* slot_of, const long long* row_of,
                       const CosSinTable* table, bint half, Py_ssize_t start, cnp.ndarray q_factors,
                       cnp.ndarray k_factors, double eps) except -1:
    # _walk_tokens with each q and k row RMSNormed first (_norm_rows: q's rows to out_q, k's to their
    # slots), then the values copied; row_of NULL: table row t for token t.  Nothing written where
    # a dtype has no kernel (TypeError).
    cdef Py_ssize_t t, h
    cdef cnp.ndarray k_at = cnp.PyArray_EMPTY(1, [w.tokens * w.k.heads], cnp.NPY_INT64, 0)
    cdef long long* at = <long long*>_data(k_at)
    cdef long long slot
    if not (_norm_takes(w.data, w.data, table.dtype, half, False)
            and _norm_takes(w.data, w.cache, table.dtype, half, True)):
        raise TypeError("no fused norm and rotation for this data into this cache")
    cdef int q_threads = _threads_for(w.tokens * w.q.heads * w.dim)
    cdef int k_threads = _threads_for(w.tokens * w.k.heads * w.dim)
    q_in, q_rows = _token_tables(&w.q, w.tokens, row_of)
    q_out = q_in if w.out_q.data == w.q.data else _token_tables(&w.out_q, w.tokens, row_of)[0]
    k_in, k_rows = _token_tables(&w.k, w.tokens, row_of)
    # every array made before the first write (the compiled torch kernel falls back on a failure)
    q_block, k_block = _norm_block(w.dim, w.data, q_threads), _norm_block(w.dim, w.data, k_threads)
    for t in range(w.tokens):  # each key row's byte offset in the key cache, -1: not stored
        slot = slot_of[t]
        for h in range(w.k.heads):
            at[t * w.k.heads + h] = -1 if slot < 0 else (
                _slot_row(&w.k_layout, slot) - w.k_layout.data + h * w.k_layout.head_stride)
    _norm_rows(w.q.data, w.out_q.data, w.tokens * w.q.heads, w.dim, w.data, w.itemsize, w.data,
               <const double*>_data(q_factors), eps, table, <const Py_ssize_t*>_data(<cnp.ndarray>q_rows), half,
               q_threads, start, _offsets(q_out), _offsets(q_in), q_block)
    _norm_rows(w.k.data, w.k_layout.data, w.tokens * w.k.heads, w.dim, w.data, w.itemsize, w.cache,
               <const double*>_data(k_factors), eps, table, <const Py_ssize_t*>_data(<cnp.ndarray>k_rows), half,
               k_threads, start, at, _offsets(k_in), k_block)
    for t in range(w.tokens):
        if slot_of[t] >= 0:
            _copy_values(t, _slot_row(&w.v_layout, slot_of[t]), w)
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
    cdef TokenWalk w = _cache_arrays_walk(q, out_q, k, v, k_cache, v_cache)
    _write_normed(&w, <const long long*>_data(slots), <const long long*>_data(rows), &table, half_layout, start,
                  q_factors, k_factors, eps)


cdef bint _items_apart(const Strided* a) noexcept nogil:
    # Every item of `a` in a place of its own (_validate.elements_apart's rule), its last axis of unit
    # stride: the other axes by stride, none negative, each past the extent of those inside it.
    cdef Py_ssize_t stride[STRIDED_AXES]
    cdef Py_ssize_t extent[STRIDED_AXES]
    cdef Py_ssize_t inner, i, j, swap, outer = a.nd - 1
    if outer < 0 or not (a.steps[outer] == _itemsize(a) or a.dims[outer] <= 1):
        return False
    if _count(a) == 0:
        return True
    for i in range(outer):
        stride[i] = a.steps[i]
        extent[i] = a.dims[i]
        if stride[i] < 0:
            return False
    for i in range(outer):
        for j in range(outer - 1 - i):
            if stride[j] > stride[j + 1]:
                swap = stride[j]; stride[j] = stride[j + 1]; stride[j + 1] = swap
                swap = extent[j]; extent[j] = extent[j + 1]; extent[j + 1] = swap
    inner = a.dims[outer] * _itemsize(a)
    for i in range(outer):
        if extent[i] > 1:
            if stride[i] < inner:
                return False
            inner = stride[i] * extent[i]
    return True


cdef inline bint _cache_array(const Strided* a, Py_ssize_t kv_heads, Py_ssize_t dim) noexcept nogil:
    # A writeable, aligned array of a kernel dtype (num_blocks, block_size, kv_heads, dim), its
    # items apart (_kv_cache.slot_strides_apart, the general path's rule).
    return (a.nd == 4 and _strided_dtype(a) >= 0 and a.writeable and <size_t>a.data % _itemsize(a) == 0
            and a.dims[2] == kv_heads and a.dims[3] == dim and _items_apart(a))


cdef bint _slots_valid(const long long* slots, Py_ssize_t n, long long num_slots) noexcept nogil:
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


cdef bint _caches_valid(const Strided* kc, const Strided* vc, Py_ssize_t kv_heads, Py_ssize_t dim, int data,
                        const Strided* inputs, Py_ssize_t n_inputs, const long long* slots,
                        Py_ssize_t tokens) noexcept nogil:
    # The general path's rules (_kv_cache.check_call) for a key and a value cache of the call's
    # rows: each a _cache_array of one dtype and shape, taking `data`, apart from each other and
    # from every input array; every slot -1 or in them, none twice.
    cdef Py_ssize_t j
    if not (_cache_array(kc, kv_heads, dim) and _cache_array(vc, kv_heads, dim)):
        return False
    if (_strided_dtype(vc) != _strided_dtype(kc) or vc.dims[0] != kc.dims[0] or vc.dims[1] != kc.dims[1]
            or not _cache_takes(data, _strided_dtype(kc)) or not _strided_disjoint(kc, vc)):
        return False
    for j in range(n_inputs):
        if not (_strided_disjoint(kc, &inputs[j]) and _strided_disjoint(vc, &inputs[j])):
            return False
    return _slots_valid(slots, tokens, <long long>kc.dims[0] * kc.dims[1])


def apply_qk_to_cache_fast(RotaryBase fast not None, q, k, v, positions, k_cache, v_cache,
                           slot_mapping, out_q, qk_norm=None, eps=1e-6, weight_offset=0.0):
    """RotaryEmbedding.apply_qk_to_cache on the fast path; None (nothing written) to fall back.

    Takes only calls that pass every rule of the general path (_kv_cache.py)
    with positions covered by `fast`'s cache (`qk_norm`: a tuple of two
    weights, with eps and weight_offset, as apply_qk_norm_fast takes them);
    a decode step is a few microseconds of checks here.
    """
    cdef cnp.ndarray qa, ka, va
    cdef Strided s[7]  # q, k, v, positions, slot_mapping, then the key and value caches
    cdef Py_ssize_t n
    cdef long long lowest = 0, highest = 0
    cdef const long long* pos
    cdef CosSinTable table
    cdef TokenWalk w
    cdef double e = 0.0, offset
    cdef tuple factors = None
    if not (_fast_paths_on and _fast_array(q, fast.dim) and _fast_array(k, fast.dim) and _fast_array(v, fast.dim)):
        return None
    if qk_norm is not None:
        if type(qk_norm) is not tuple or len(qk_norm) != 2:
            return None
        factors = _fast_norm_weights(qk_norm[0], qk_norm[1], eps, weight_offset, fast.dim, &e)
        if factors is None:
            return None
    elif not _norm_args_fit(eps, weight_offset, &e, &offset):
        return None
    qa, ka, va = <cnp.ndarray>q, <cnp.ndarray>k, <cnp.ndarray>v
    n = qa.shape[0]
    if (qa.ndim != 3 or ka.ndim != 3 or va.ndim != 3 or ka.shape[0] != n
            or va.shape[0] != n or va.shape[1] != ka.shape[1]
            or cnp.PyArray_TYPE(ka) != cnp.PyArray_TYPE(qa)
            or cnp.PyArray_TYPE(va) != cnp.PyArray_TYPE(qa)
            or not (_array_strided(positions, &s[3]) and _index_strided(&s[3], n))
            or not (_array_strided(slot_mapping, &s[4]) and _index_strided(&s[4], n))
            or not (_array_strided(k_cache, &s[5]) and _array_strided(v_cache, &s[6]))):
        return None
    _fill_strided(qa, &s[0])
    _fill_strided(ka, &s[1])
    _fill_strided(va, &s[2])
    if not _caches_valid(&s[5], &s[6], ka.shape[1], fast.dim, _dtype(qa), s, 5, <const long long*>s[4].data, n):
        return None
    pos = <const long long*>s[3].data
    _position_range(pos, n, &lowest, &highest)
    if lowest < 0 or highest >= fast.valid_below:
        return None
    result = _fast_out(qa, out_q, (ka, va, k_cache, v_cache, positions, slot_mapping))
    if result is None:
        return None
    cache = fast._cache_for(_table_of(qa), highest)
    if cache is None:
        return None
    table = _stacked_table(_data(<cnp.ndarray>cache), fast.npairs, cnp.PyArray_ITEMSIZE(<cnp.ndarray>cache),
                           _table_of(qa))
    w = _arrays_walk(qa, <cnp.ndarray>result, ka, va, &s[5])
    if qk_norm is None:
        _walk_tokens(&w, <const long long*>s[4].data, pos, &table, fast.half, False, fast.start, _cache_threads(&w))
    else:
        _write_normed(&w, <const long long*>s[4].data, pos, &table, fast.half, fast.start, factors[0], factors[1], e)
    return result


cdef bint _cache_call(Strided* v, Py_ssize_t head_size, bint hnd, TokenRows* rows, CosSinTable* table,
                      Py_ssize_t* tokens, const long long** pos, int* d) noexcept nogil:
    # tokens_to_cache_fast's checks of v (query, key, the [cos | sin] cache, positions, value,
    # slot_mapping, the key and value caches; hnd: the caches (num_blocks, kv_heads, block_size, dim),
    # read as NHD after): rows q, out_q (q), k, v, the table, the positions, the data's dtype index;
    # False where the call is not taken.
    cdef Py_ssize_t j, i
    if not _token_table(&v[2], &v[3], head_size, table, tokens, pos):
        return False
    d[0] = _strided_dtype(&v[0])
    for j in range(3):  # query, key, value as rows 1-3; rows[0], the query's result, is the query
        i = 4 if j == 2 else j
        if not _token_rows(&v[i], tokens[0], head_size, 0, &rows[j + 1]) or _strided_dtype(&v[i]) != d[0]:
            return False
    rows[0] = rows[1]
    if (not _vllm_table_takes(d[0], table.dtype) or v[6].nd != 4 or v[7].nd != 4
            or not _strided_disjoint(&v[0], &v[2]) or rows[2].heads != rows[3].heads
            or not _rows_disjoint(&rows[0], &rows[2], tokens[0]) or not _rows_disjoint(&rows[0], &rows[3], tokens[0])
            or not _index_strided(&v[5], tokens[0]) or not _strided_disjoint(&v[5], &v[0])):
        return False
    if hnd:  # (num_blocks, kv_heads, block_size, dim) read as NHD
        _swap_axes(&v[6], 1, 2)
        _swap_axes(&v[7], 1, 2)
    return _caches_valid(&v[6], &v[7], rows[2].heads, head_size, d[0], v, 6, <const long long*>v[5].data,
                         tokens[0])


def tokens_to_cache_fast(positions, query, key, value, key_cache, value_cache, slot_mapping, head_size,
                         cos_sin_cache, is_neox, kv_cache_layout, q_weight, k_weight, eps, weight_offset):
    """vllm.apply_qk_to_cache's common call, every check in C: True, or False (nothing written).

    rotate_tokens_fast's rules for query, key and value (where the server
    holds them) and for the ``[cos | sin]`` cache; the key and value caches as apply_qk_to_cache_fast takes
    them, named "NHD" or "HND" by a str; an int64 slot_mapping (tokens,);
    q_weight and k_weight both None, or both as apply_qk_norm_fast takes them.
    """
    cdef TokenRows rows[4]
    cdef Strided v[8]  # query, key, the [cos | sin] cache, positions, value, slot_mapping, the key and value caches
    cdef CosSinTable table
    cdef TokenWalk w
    cdef Py_ssize_t tokens = 0
    cdef const long long* pos = NULL
    cdef const long long* slots
    cdef Strided weights[2]
    cdef double e = 0.0, offset
    cdef int d
    cdef bint grad, tensors
    if (not _fast_paths_on or not _size_int(head_size) or type(is_neox) is not bool or head_size < 1
            or type(kv_cache_layout) is not str or kv_cache_layout not in ("NHD", "HND")
            or (q_weight is None) != (k_weight is None) or key is None
            or not _token_arrays(query, key, cos_sin_cache, positions, v, &grad)):
        return False
    tensors = type(query) is _Tensor
    if not (_strided_of(value, tensors, grad, True, &v[4]) and _strided_of(slot_mapping, tensors, grad, False, &v[5])
            and _strided_of(key_cache, tensors, grad, True, &v[6])
            and _strided_of(value_cache, tensors, grad, True, &v[7])
            and _cache_call(v, head_size, kv_cache_layout == "HND", rows, &table, &tokens, &pos, &d)
            and not (tensors and not _writable((query, key_cache, value_cache)))):
        return False
    slots = <const long long*>v[5].data
    w = _cache_walk(rows, tokens, head_size, d, _itemsize(&v[0]), &v[6], &v[7])
    if not _norm_args_fit(eps, weight_offset, &e, &offset):
        return False
    if q_weight is None:
        if K.rotate[d][table.dtype][0] == NULL:
            return False
        _walk_tokens(&w, slots, pos, &table, is_neox, False, 0, _cache_threads(&w))
    elif not (_strided_of(q_weight, tensors, grad, True, &weights[0])
              and _strided_of(k_weight, tensors, grad, True, &weights[1])
              and _normed_to_cache(&w, slots, pos, &table, is_neox, weights, e, offset)):
        return False
    if tensors:
        _count_writes((query, key_cache, value_cache))
    return True


cdef bint _normed_to_cache(const TokenWalk* w, const long long* slots, const long long* pos, CosSinTable* table,
                           bint half, const Strided* weights, double eps, double offset) except -1:
    # tokens_to_cache_fast's call with weights (and the compiled torch kernel's): True, or False with
    # nothing written where it does not take them.
    cdef cnp.ndarray widened = None
    factors = (_strided_factors(&weights[0], w.dim, offset), _strided_factors(&weights[1], w.dim, offset))
    if factors[0] is None or factors[1] is None:
        return False
    if table.dtype != POSENC_F64 and table.dtype != POSENC_F32:  # a half-type table: the call's rows, widened
        widened = _widened_rows(table, pos, w.tokens)
    if not (_norm_takes(w.data, w.data, table.dtype, half, False) and _norm_takes(w.data, w.cache, table.dtype, half, True)):
        return False
    _write_normed(w, slots, NULL if widened is not None else pos, table, half, 0, factors[0], factors[1], eps)
    return True
