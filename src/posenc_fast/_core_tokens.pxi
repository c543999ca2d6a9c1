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
    cdef Py_ssize_t n = len(xs), j, t, h, tokens, npairs, itemsize, size = 0
    cdef cnp.ndarray c, p, x
    cdef long long lowest = 0, highest = 0
    cdef const long long* pos
    cdef int table, d
    cdef RowCall calls[2]
    cdef TokenRows rows[2]
    cdef char* head
    if (not _fast_paths_on or n < 1 or n > 2 or head_size < 1 or offset < 0
            or not _fast_cache(cos_sin_cache) or not cnp.PyArray_CheckExact(positions)):
        return False
    c, p = cos_sin_cache, positions
    if (cnp.PyArray_NDIM(c) != 2 or cnp.PyArray_TYPE(p) != cnp.NPY_INT64
            or cnp.PyArray_NDIM(p) != 1 or not cnp.PyArray_ISCARRAY_RO(p)):
        return False
    npairs = cnp.PyArray_DIMS(c)[1] // 2
    if cnp.PyArray_DIMS(c)[1] % 2 or npairs < 1 or offset + 2 * npairs > head_size:
        return False
    tokens = cnp.PyArray_DIMS(p)[0]
    table = posenc_dtype_index(cnp.PyArray_TYPE(c))
    pos = <const long long*>_data(p)
    _position_range(pos, tokens, &lowest, &highest)
    if tokens and (lowest < 0 or highest >= cnp.PyArray_DIMS(c)[0]):
        return False
    for j in range(n):
        if not _token_rows(xs[j], tokens, head_size, offset, &rows[j]):
            return False
        x = xs[j]
        d = posenc_dtype_index(cnp.PyArray_TYPE(x))
        itemsize = cnp.PyArray_ITEMSIZE(x)
        # vllm.py's rule: the cache in x's dtype, or float32 for a half type
        if ((cnp.PyArray_TYPE(x) != cnp.PyArray_TYPE(c)
                and not (itemsize == 2 and table == POSENC_F32))
                or K.rotate[d][table][0] == NULL or not _disjoint(x, c)):
            return False
        if j == 1 and cnp.PyArray_TYPE(x) != cnp.PyArray_TYPE(<cnp.ndarray>xs[0]):
            return False
        size += cnp.PyArray_SIZE(x)
        calls[j] = _row_call(d, table, itemsize, cnp.PyArray_ITEMSIZE(c), npairs,
                             head_size - offset, half, inverse, True, cnp.PyArray_NBYTES(x))
    if n == 2 and not _rows_disjoint(&rows[0], &rows[1], tokens):
        return False
    if _threads_for(size) > 1:
        return False  # a large call: the general path's threads
    # vLLM's cache row: a position's cos entries, then its sin entries
    cdef CosSinTable cos_sin = CosSinTable(_data(c), _data(c) + npairs * cnp.PyArray_ITEMSIZE(c),
                                           cnp.PyArray_STRIDE(c, 0), cnp.PyArray_STRIDE(c, 0), npairs,
                                           cnp.PyArray_ITEMSIZE(c), table)
    with nogil:
        for j in range(n):
            for t in range(tokens):
                head = rows[j].data + t * rows[j].token_stride
                if rows[j].head_stride == calls[j].row_bytes:  # consecutive rows
                    _rotate_position(head, head, rows[j].heads, pos[t], &cos_sin, &calls[j])
                else:
                    for h in range(rows[j].heads):
                        _rotate_row_by(head + h * rows[j].head_stride, head + h * rows[j].head_stride,
                                       &cos_sin, pos[t], &calls[j])
    return True
