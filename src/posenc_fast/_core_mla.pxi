# vLLM's MLA cache writes (posenc_fast._mla_cache) on the compiled path: each
# token's [kv_c | k_pe] copied into its row of a (num_blocks, block_size,
# kv_lora_rank + pe_dim) cache, q_pe and k_pe first rotated in place by the
# fused call.  Every check in C; a call not taken returns False with nothing
# written, and _mla_cache.py's general path validates it and raises.


cdef bint _parts_apart(const Strided* a, const Strided* b, Py_ssize_t tokens) noexcept nogil:
    # Two (tokens, n) views of unit item stride and non-negative token strides apart: exact for kv_c
    # and k_pe as the two parts of one (tokens, kv_lora_rank + pe_dim) projection (_rows_disjoint).
    cdef Py_ssize_t a_row = a.dims[1] * _itemsize(a), b_row = b.dims[1] * _itemsize(b)
    cdef TokenRows rows[2]
    rows[0] = TokenRows(a.data, a.steps[0], a_row, 1, a_row)  # one head a token
    rows[1] = TokenRows(b.data, b.steps[0], b_row, 1, b_row)
    return _rows_disjoint(&rows[0], &rows[1], tokens)


cdef bint _mla_to_cache(Strided* v, bint rotate, bint half) noexcept nogil:
    # v: q_pe, k_pe, the [cos | sin] cache, positions (_token_arrays' order; read only where `rotate`),
    # kv_c, slot_mapping, kv_cache.  The general path's rules (_mla_cache._mla_call and, rotating,
    # concat_and_cache_mla_rope_fused's); False, nothing written, where the call is not taken.
    cdef Strided* kv_c = &v[4]
    cdef Strided* cache = &v[6]
    cdef Strided* k = &v[1]
    cdef const long long* slots
    cdef char* row
    cdef Py_ssize_t t, tokens, rank, pe, itemsize = _itemsize(kv_c)
    cdef int d = _strided_dtype(kv_c)
    if not _fast_paths_on or kv_c.nd != 2 or d < 0:
        return False
    tokens, rank = kv_c.dims[0], kv_c.dims[1]
    if k.nd == 3 and k.dims[1] == 1:  # (tokens, 1, pe_dim) read as (tokens, pe_dim)
        _swap_axes(k, 1, 2)
        k.nd = 2
    pe = k.dims[1]
    if (k.nd != 2 or k.dims[0] != tokens or _strided_dtype(k) != d or not (k.steps[1] == itemsize or pe <= 1)
            or not (kv_c.steps[1] == itemsize or rank <= 1) or kv_c.steps[0] < 0 or k.steps[0] < 0
            or cache.nd != 3 or _strided_dtype(cache) != d or not cache.writeable or cache.dims[2] != rank + pe
            or <size_t>cache.data % itemsize or not _items_apart(cache)
            or not _index_strided(&v[5], tokens)
            or not _slots_valid(<const long long*>v[5].data, tokens, <long long>cache.dims[0] * cache.dims[1])
            or not (_strided_disjoint(cache, kv_c) and _strided_disjoint(cache, k)
                    and _strided_disjoint(cache, &v[5]))):
        return False
    if rotate:  # q_pe and k_pe rotated before kv_c and the slots are read, the cache written
        if (v[2].nd != 2 or v[2].dims[1] != pe or not _positions_apart(v, True)
                or not (_strided_disjoint(cache, &v[0]) and _strided_disjoint(cache, &v[2])
                        and _strided_disjoint(cache, &v[3]) and _strided_disjoint(kv_c, &v[0])
                        and _parts_apart(kv_c, k, tokens) and _strided_disjoint(&v[5], &v[0])
                        and _strided_disjoint(&v[5], k))
                or not _rotate_tokens(v, 2, pe, 0, half, False)):
            return False
    slots = <const long long*>v[5].data
    for t in range(tokens):
        if slots[t] >= 0:
            row = (cache.data + (slots[t] // cache.dims[1]) * cache.steps[0]
                   + (slots[t] % cache.dims[1]) * cache.steps[1])
            memcpy(row, kv_c.data + t * kv_c.steps[0], rank * itemsize)
            memcpy(row + rank * itemsize, k.data + t * k.steps[0], pe * itemsize)
    return True


def mla_to_cache_fast(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping, kv_cache,
                      kv_cache_dtype):
    """_mla_cache's common calls, every check in C: True, or False (nothing written).

    `positions` None: `concat_and_cache_mla`'s call (`q_pe`, `cos_sin_cache`
    and `is_neox` unread), else `concat_and_cache_mla_rope_fused`'s.  All
    exact native ndarrays or all plain CPU tensors, as `rotate_tokens_fast`
    reads them; kv_c, k_pe and the cache of one kernel dtype with rows of
    unit stride, an int64 slot_mapping (tokens,), kv_cache_dtype "auto".
    """
    cdef Strided v[7]  # as _mla_to_cache's
    cdef bint rotate = positions is not None, half = is_neox is True, done
    cdef bint tensors = _Tensor is not None and type(kv_c) is _Tensor
    cdef bint grad = tensors and _grad_enabled() is True
    if (type(kv_cache_dtype) is not str or kv_cache_dtype != "auto"
            or not (_strided_of(kv_c, tensors, grad, True, &v[4]) and _strided_of(k_pe, tensors, grad, True, &v[1])
                    and _strided_of(slot_mapping, tensors, grad, False, &v[5])
                    and _strided_of(kv_cache, tensors, grad, True, &v[6]))):
        return False
    if rotate and not (type(is_neox) is bool and _strided_of(q_pe, tensors, grad, True, &v[0])
                       and _strided_of(cos_sin_cache, tensors, grad, True, &v[2])
                       and _strided_of(positions, tensors, grad, False, &v[3])):
        return False
    written = (q_pe, k_pe, kv_cache) if rotate else (kv_cache,)
    if tensors and not _writable(written):
        return False
    with nogil:
        done = _mla_to_cache(v, rotate, half)
    if done and tensors:
        _count_writes(written)
    return done
