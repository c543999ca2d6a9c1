# Compiled path of vLLM's token-major rotation in place (posenc_fast.vllm).
#
# query and key where a server holds them (any token stride: slices of a
# fused qkv projection; any head stride: heads padded past head_size; the
# features from rope_dim_offset on), one int64 position per token, the
# [cos | sin] cache read where it lies.  All checks in C; a call it does not
# take returns False, having written nothing, and vllm.py's general path
# validates and raises.


cdef struct TokenRows:
    # One of query/key: token t's head h starts at data + t * token_stride + h * head_stride.
    char* data
    Py_ssize_t token_stride
    Py_ssize_t head_stride
    Py_ssize_t heads
    Py_ssize_t extent  # bytes a token's heads span


cdef bint _token_rows(object a, Py_ssize_t tokens, Py_ssize_t head_size, Py_ssize_t offset,
                      TokenRows* rows):
    # vLLM's (tokens, heads * head_size) or (tokens, heads, head_size): an exact,
    # aligned, native, writeable ndarray with unit stride within a head and
    # non-negative token and head strides; the features from `offset` on.
    cdef cnp.ndarray arr
    cdef int nd
    cdef Py_ssize_t itemsize
    if not cnp.PyArray_CheckExact(a):
        return False
    arr = <cnp.ndarray>a
    nd = cnp.PyArray_NDIM(arr)
    itemsize = cnp.PyArray_ITEMSIZE(arr)
    if (nd not in (2, 3) or cnp.PyArray_DIMS(arr)[0] != tokens
            or posenc_dtype_index(cnp.PyArray_TYPE(arr)) < 0 or not cnp.PyArray_ISALIGNED(arr)
            or not cnp.PyArray_ISNOTSWAPPED(arr) or not cnp.PyArray_ISWRITEABLE(arr)
            or cnp.PyArray_STRIDE(arr, nd - 1) != itemsize or cnp.PyArray_STRIDE(arr, 0) < 0):
        return False
    if nd == 2:
        if cnp.PyArray_DIMS(arr)[1] % head_size:
            return False
        rows.heads = cnp.PyArray_DIMS(arr)[1] // head_size
        rows.head_stride = head_size * itemsize
    else:
        if cnp.PyArray_DIMS(arr)[2] != head_size or cnp.PyArray_STRIDE(arr, 1) < head_size * itemsize:
            return False
        rows.heads = cnp.PyArray_DIMS(arr)[1]
        rows.head_stride = cnp.PyArray_STRIDE(arr, 1)
    rows.data = _data(arr) + offset * itemsize
    rows.token_stride = cnp.PyArray_STRIDE(arr, 0)
    rows.extent = max(rows.heads - 1, 0) * rows.head_stride + head_size * itemsize
    # tokens that share memory (an expanded view) would rotate twice: vllm.py refuses them
    return tokens < 2 or rows.token_stride >= rows.extent


cdef bint _rows_disjoint(const TokenRows* a, const TokenRows* b, Py_ssize_t tokens):
    # Exact for two slices of one buffer with the same token stride (a fused qkv
    # projection's q and k), else by the byte ranges they span.
    cdef Py_ssize_t stride = a.token_stride, shift
    cdef Py_ssize_t span_a = max(tokens - 1, 0) * a.token_stride + a.extent
    cdef Py_ssize_t span_b = max(tokens - 1, 0) * b.token_stride + b.extent
    if tokens == 0 or a.heads == 0 or b.heads == 0:
        return True
    if a.data + span_a <= b.data or b.data + span_b <= a.data:
        return True
    if stride <= 0 or stride != b.token_stride or a.extent > stride or b.extent > stride:
        return False
    shift = (<Py_ssize_t>(b.data - a.data)) % stride
    if shift < 0:
        shift += stride
    return shift >= a.extent and stride - shift >= b.extent


cdef inline TokenRows _array_rows(cnp.ndarray a) noexcept:
    # A (tokens, heads, dim) array's rows (unit stride within a head).
    cdef TokenRows rows
    rows.data = _data(a)
    rows.token_stride = cnp.PyArray_STRIDE(a, 0)
    rows.head_stride = cnp.PyArray_STRIDE(a, 1)
    rows.heads = a.shape[1]
    rows.extent = max(rows.heads - 1, 0) * rows.head_stride + a.shape[2] * cnp.PyArray_ITEMSIZE(a)
    return rows


cdef inline bint _index_array(object a, Py_ssize_t n):
    # An exact, C-contiguous, aligned, native int64 ndarray (ISCARRAY_RO: all three) of shape
    # (n,); n < 0: any length.
    return (cnp.PyArray_CheckExact(a) and cnp.PyArray_TYPE(<cnp.ndarray>a) == cnp.NPY_INT64
            and cnp.PyArray_ISCARRAY_RO(<cnp.ndarray>a) and cnp.PyArray_NDIM(<cnp.ndarray>a) == 1
            and (n < 0 or cnp.PyArray_DIMS(<cnp.ndarray>a)[0] == n))


cdef bint _token_table(object cos_sin_cache, object positions, Py_ssize_t width, CosSinTable* table,
                       Py_ssize_t* tokens, const long long** pos):
    # vLLM's [cos | sin] cache (n, rot_dim), rot_dim even with 2 <= rot_dim <= width, as a table
    # (a position's cos entries, then its sin entries), and the positions: an index array each
    # of whose entries is a row of it.
    cdef cnp.ndarray c
    cdef Py_ssize_t npairs
    cdef long long lowest = 0, highest = 0
    if not (_fast_cache(cos_sin_cache) and _index_array(positions, -1)):
        return False
    c = cos_sin_cache
    if cnp.PyArray_NDIM(c) != 2:
        return False
    npairs = cnp.PyArray_DIMS(c)[1] // 2
    tokens[0] = cnp.PyArray_DIMS(<cnp.ndarray>positions)[0]
    pos[0] = <const long long*>_data(<cnp.ndarray>positions)
    _position_range(pos[0], tokens[0], &lowest, &highest)
    if (cnp.PyArray_DIMS(c)[1] % 2 or npairs < 1 or 2 * npairs > width
            or tokens[0] and (lowest < 0 or highest >= cnp.PyArray_DIMS(c)[0])):
        return False
    table[0] = CosSinTable(_data(c), _data(c) + npairs * cnp.PyArray_ITEMSIZE(c), cnp.PyArray_STRIDE(c, 0),
                           cnp.PyArray_STRIDE(c, 0), npairs, cnp.PyArray_ITEMSIZE(c),
                           posenc_dtype_index(cnp.PyArray_TYPE(c)))
    return True


cdef cnp.ndarray _widened_rows(CosSinTable* table, const long long* pos, Py_ssize_t tokens):
    # A half-type table's rows of the positions widened to float32, as the general paths' norm
    # reads them: `table` becomes them (row t: token t's); returns the array holding them.
    cdef Py_ssize_t t, n = table.npairs
    cdef cnp.ndarray rows = cnp.PyArray_EMPTY(2, [max(tokens, 1), 2 * n], cnp.NPY_FLOAT32, 0)
    cdef char* row
    for t in range(tokens):
        row = _data(rows) + t * 8 * n
        K.to_f32[table.dtype](table.cos + pos[t] * table.cos_stride, row, n)
        K.to_f32[table.dtype](table.sin + pos[t] * table.sin_stride, row + 4 * n, n)
    table[0] = CosSinTable(_data(rows), _data(rows) + 4 * n, 8 * n, 8 * n, n, 4, POSENC_F32)
    return rows


def rotate_tokens_fast(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset,
                       inverse):
    """vllm.rotary_embedding's common call, every check in C: True, or False (nothing written).

    Its arguments as it takes them, all exact ndarrays or all plain CPU torch
    tensors (viewed in C; `key` may be None): query and key; the ``[cos |
    sin]`` table (n, rot_dim) in their dtype (float32 also for half types); a
    contiguous int64 array of positions (tokens,); an int head_size and
    rope_dim_offset, bool is_neox and inverse.  Each head's features
    ``offset .. offset + rot_dim`` rotate in place by its token's row.
    """
    cdef bint grad
    if (type(head_size) is not int or type(rope_dim_offset) is not int or type(is_neox) is not bool
            or type(inverse) is not bool):
        return False
    if _Tensor is not None and type(query) is _Tensor:  # viewed as tensor_arrays views them
        grad = _grad_enabled() is True
        query, cos_sin_cache = _tensor_array(query, grad, True), _tensor_array(cos_sin_cache, grad, True)
        key = None if key is None else _tensor_array(key, grad, True) if type(key) is _Tensor else False
        positions = _tensor_array(positions, grad, False)
        if query is None or key is False or cos_sin_cache is None or positions is None:
            return False
    return _rotate_tokens((query,) if key is None else (query, key), cos_sin_cache, positions, head_size,
                          rope_dim_offset, is_neox, inverse)


cdef bint _rotate_tokens(tuple xs, cos_sin_cache, positions, Py_ssize_t head_size, Py_ssize_t offset,
                         bint half, bint inverse):
    # rotate_tokens_fast's call on ndarrays: xs, query or query and key.
    cdef Py_ssize_t n = len(xs), j, t, tokens = 0, itemsize, size = 0
    cdef cnp.ndarray x
    cdef const long long* pos = NULL
    cdef int d
    cdef RowCall calls[2]
    cdef TokenRows rows[2]
    cdef CosSinTable cos_sin
    cdef char* head
    if (not _fast_paths_on or n < 1 or n > 2 or head_size < 1 or offset < 0
            or not _token_table(cos_sin_cache, positions, head_size - offset, &cos_sin, &tokens, &pos)):
        return False
    for j in range(n):
        if not _token_rows(xs[j], tokens, head_size, offset, &rows[j]):
            return False
        x = xs[j]
        d = posenc_dtype_index(cnp.PyArray_TYPE(x))
        itemsize = cnp.PyArray_ITEMSIZE(x)
        # vllm.py's rule: the cache in x's dtype, or float32 for a half type
        if ((d != cos_sin.dtype and not (itemsize == 2 and cos_sin.dtype == POSENC_F32))
                or K.rotate[d][cos_sin.dtype][0] == NULL or not _disjoint(x, cos_sin_cache)):
            return False
        if j == 1 and cnp.PyArray_TYPE(x) != cnp.PyArray_TYPE(<cnp.ndarray>xs[0]):
            return False
        size += cnp.PyArray_SIZE(x)
        calls[j] = _row_call(d, cos_sin.dtype, itemsize, cos_sin.itemsize, cos_sin.npairs,
                             head_size - offset, half, inverse, True, cnp.PyArray_NBYTES(x))
    if n == 2 and not _rows_disjoint(&rows[0], &rows[1], tokens):
        return False
    if _threads_for(size) > 1:
        return False  # a large call: the general path's threads
    with nogil:
        for j in range(n):
            for t in range(tokens):
                head = rows[j].data + t * rows[j].token_stride
                _rotate_heads(head, rows[j].head_stride, head, rows[j].head_stride, rows[j].heads,
                              cos_sin.cos + pos[t] * cos_sin.cos_stride,
                              cos_sin.sin + pos[t] * cos_sin.sin_stride, &calls[j])
    return True
