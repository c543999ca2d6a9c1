# Token-major rows: TokenRows (a token's heads where they lie), the one walk
# over tokens that rotate_rows, vLLM's rotation and the KV-cache write share
# (each token's rows rotated by one cos/sin table row; with a KV cache, its
# key rotated into its slot and its value copied there), and the compiled
# path of vLLM's token-major rotation in place (posenc_fast.vllm).
#
# vLLM's query and key where a server holds them (any token stride: slices
# of a fused qkv projection; any head stride: heads padded past head_size;
# the features from rope_dim_offset on), one int64 position per token, the
# [cos | sin] cache read where it lies.  All checks in C; a call it does not
# take returns False, having written nothing, and vllm.py's general path
# validates and raises.  The arrays are read as `Strided` (an ndarray's or a
# plain CPU tensor's memory; _core_torch.pxi reads tensors), so a call on
# tensors makes no ndarray.

from cpython.object cimport PyObject
from libc.stdlib cimport free, malloc
from libc.string cimport memset


cdef inline bint _size_int(object x):
    # An int argument the fast paths take (head_size, rope_dim_offset): a Python int that _fits
    # (|x| < 2**61, so that no product of sizes overflows); larger ones go to the general path's error.
    cdef int overflow = 0
    cdef long long value
    if type(x) is not int:
        return False
    value = PyLong_AsLongLongAndOverflow(x, &overflow)
    return not overflow and _fits(value, 0)


cdef enum:
    STRIDED_AXES = 32  # NumPy 1's limit (NumPy 2's is 64): arrays of more axes are not read


cdef struct Strided:
    # An ndarray's or a tensor's memory as read here: its NumPy dtype (borrowed; NULL where the compiled
    # torch kernel made it, _tensor_view), that dtype's number and size, shape, byte steps.
    PyObject* descr
    int type_num
    Py_ssize_t itemsize
    char* data
    int nd
    bint writeable
    cnp.npy_intp dims[STRIDED_AXES]
    cnp.npy_intp steps[STRIDED_AXES]


cdef bint _array_strided(object a, Strided* v):
    # An exact, aligned, native ndarray of at most STRIDED_AXES axes: its memory into v, or False.
    if not (cnp.PyArray_CheckExact(a) and cnp.PyArray_NDIM(<cnp.ndarray>a) <= STRIDED_AXES
            and cnp.PyArray_ISALIGNED(<cnp.ndarray>a)
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a)):
        return False
    _fill_strided(<cnp.ndarray>a, v)
    return True


cdef void _fill_strided(cnp.ndarray a, Strided* v) noexcept:
    # a's memory into v, whatever it is but for its axes (at most STRIDED_AXES).
    cdef int k
    v.descr, v.data, v.nd = <PyObject*>cnp.PyArray_DESCR(a), _data(a), cnp.PyArray_NDIM(a)
    v.type_num, v.itemsize = cnp.PyArray_TYPE(a), cnp.PyArray_ITEMSIZE(a)
    v.writeable = cnp.PyArray_ISWRITEABLE(a)
    for k in range(v.nd):
        v.dims[k], v.steps[k] = cnp.PyArray_DIMS(a)[k], cnp.PyArray_STRIDES(a)[k]


cdef inline void _swap_axes(Strided* v, int i, int j) noexcept nogil:
    v.dims[i], v.dims[j] = v.dims[j], v.dims[i]
    v.steps[i], v.steps[j] = v.steps[j], v.steps[i]


cdef inline bint _strided_of(object a, bint tensor, bint grad, bint floats_only, Strided* v):
    # A plain CPU tensor's (tensor) or an ndarray's memory into v, or False.
    return _tensor_strided(a, grad, floats_only, v) if tensor else _array_strided(a, v)


cdef inline int _strided_dtype(const Strided* v) noexcept nogil:
    # v's kernel dtype index, or -1.
    return posenc_dtype_index(v.type_num)


cdef inline Py_ssize_t _itemsize(const Strided* v) noexcept nogil:
    return v.itemsize


cdef Py_ssize_t _count(const Strided* v) noexcept nogil:
    # v's number of items.
    cdef Py_ssize_t count = 1
    cdef int k
    for k in range(v.nd):
        count *= v.dims[k]
    return count


cdef bint _strided_disjoint(const Strided* a, const Strided* b) noexcept nogil:
    # _disjoint of two Strided.
    cdef char* a_low
    cdef char* a_high
    cdef char* b_low
    cdef char* b_high
    if _count(a) == 0 or _count(b) == 0:
        return True
    _byte_range(a.data, a.nd, a.dims, a.steps, _itemsize(a), &a_low, &a_high)
    _byte_range(b.data, b.nd, b.dims, b.steps, _itemsize(b), &b_low, &b_high)
    return a_high <= b_low or b_high <= a_low


cdef struct TokenRows:
    # Token t's head h starts at data + t * token_stride + h * head_stride (a row's items contiguous).
    char* data
    Py_ssize_t token_stride
    Py_ssize_t head_stride
    Py_ssize_t heads
    Py_ssize_t extent  # bytes a token's heads span


cdef bint _token_rows(const Strided* a, Py_ssize_t tokens, Py_ssize_t head_size, Py_ssize_t offset,
                      TokenRows* rows) noexcept nogil:
    # vLLM's (tokens, heads * head_size) or (tokens, heads, head_size): aligned,
    # writeable, of a kernel dtype, with unit stride within a head and
    # non-negative token and head strides; the features from `offset` on.
    cdef int nd = a.nd
    cdef Py_ssize_t itemsize = _itemsize(a)
    if (nd < 2 or nd > 3 or a.dims[0] != tokens or _strided_dtype(a) < 0 or not a.writeable
            or <size_t>a.data % itemsize or a.steps[nd - 1] != itemsize or a.steps[0] < 0):
        return False
    if nd == 2:
        if a.dims[1] % head_size:
            return False
        rows.heads = a.dims[1] // head_size
        rows.head_stride = head_size * itemsize
    else:
        if a.dims[2] != head_size or a.steps[1] < head_size * itemsize:
            return False
        rows.heads = a.dims[1]
        rows.head_stride = a.steps[1]
    rows.data = a.data + offset * itemsize
    rows.token_stride = a.steps[0]
    rows.extent = max(rows.heads - 1, 0) * rows.head_stride + head_size * itemsize
    # tokens that share memory (an expanded view) would rotate twice: vllm.py refuses them
    return tokens < 2 or rows.token_stride >= rows.extent


cdef bint _rows_disjoint(const TokenRows* a, const TokenRows* b, Py_ssize_t tokens) noexcept nogil:
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


cdef struct SlotLayout:
    # Where a cache's slot (block * block_size + offset) and head h start:
    # data + block * block_stride + offset * offset_stride + h * head_stride;
    # a row's dim items are contiguous.  C-contiguous (num_blocks, block_size,
    # kv_heads, dim) is vLLM's flash layout; other strides name other layouts.
    char* data
    Py_ssize_t block_size
    Py_ssize_t block_stride
    Py_ssize_t offset_stride
    Py_ssize_t head_stride


cdef struct TokenWalk:
    # Token t's rows and where they go: q's heads rotated into out_q's; with a KV cache (k.heads > 0),
    # its key heads rotated into, its value heads copied into, its slot (see rotate_into_kv_cache).
    TokenRows q
    TokenRows out_q             # q's result (q itself: in place)
    TokenRows k
    TokenRows v
    Py_ssize_t tokens
    Py_ssize_t dim
    Py_ssize_t itemsize         # of the data dtype
    Py_ssize_t row_bytes        # a q/k/v row (dim items of the data dtype)
    Py_ssize_t cache_row_bytes  # a cache row (dim items of the cache dtype)
    int data                    # the dtype indices of q, k, v and of the caches
    int cache
    posenc_convert_fn narrow    # float32 -> cache dtype; NULL: same dtype, direct
    SlotLayout k_layout
    SlotLayout v_layout


cdef inline SlotLayout _slot_layout(const Strided* cache) noexcept nogil:
    # A (num_blocks, block_size, kv_heads, dim) cache's layout.
    cdef SlotLayout layout
    layout.data = cache.data
    layout.block_size = cache.dims[1]
    layout.block_stride = cache.steps[0]
    layout.offset_stride = cache.steps[1]
    layout.head_stride = cache.steps[2]
    return layout


cdef inline bint _cache_takes(int data, int cache) noexcept nogil:
    # A KV cache of dtype index `cache` takes rows of `data`: its own dtype, or a half type for float32.
    return cache == data or (data == POSENC_F32 and K.from_f32[cache] != NULL)


cdef inline char* _slot_row(const SlotLayout* layout, long long slot) noexcept nogil:
    return (layout.data + (slot // layout.block_size) * layout.block_stride
            + (slot % layout.block_size) * layout.offset_stride)


cdef inline void _copy_values(Py_ssize_t t, char* v_slot, const TokenWalk* w) noexcept nogil:
    # Token t's value rows into its slot (cast to the cache dtype).
    cdef Py_ssize_t h
    cdef const char* v_row = w.v.data + t * w.v.token_stride
    if w.v.head_stride == w.row_bytes and w.v_layout.head_stride == w.cache_row_bytes:
        if w.narrow == NULL:
            memcpy(v_slot, v_row, w.v.heads * w.row_bytes)
        else:
            w.narrow(v_row, v_slot, w.v.heads * w.dim)
        return
    for h in range(w.v.heads):
        if w.narrow == NULL:
            memcpy(v_slot + h * w.v_layout.head_stride, v_row + h * w.v.head_stride, w.row_bytes)
        else:
            w.narrow(v_row + h * w.v.head_stride, v_slot + h * w.v_layout.head_stride, w.dim)


cdef inline void _walk_token(Py_ssize_t t, long long slot, const void* c, const void* s, float* scratch,
                             const TokenWalk* w, const RowCall* q_call, const RowCall* k_call) noexcept nogil:
    cdef Py_ssize_t h
    cdef const char* k_row
    cdef char* k_slot
    _rotate_heads(w.q.data + t * w.q.token_stride, w.q.head_stride, w.out_q.data + t * w.out_q.token_stride,
                  w.out_q.head_stride, w.q.heads, c, s, q_call)
    if slot < 0:
        return
    k_row = w.k.data + t * w.k.token_stride
    k_slot = _slot_row(&w.k_layout, slot)
    if w.narrow == NULL:
        _rotate_heads(k_row, w.k.head_stride, k_slot, w.k_layout.head_stride, w.k.heads, c, s, k_call)
    else:
        for h in range(w.k.heads):  # a half cache: rotated in float32, rounded once on store
            _rotate_row(k_row + h * w.k.head_stride, <char*>scratch, c, s, k_call)
            w.narrow(scratch, k_slot + h * w.k_layout.head_stride, w.dim)
    _copy_values(t, _slot_row(&w.v_layout, slot), w)


cdef struct TokenJob:
    # _walk_tokens' call, for the pool.
    const long long* slot_of  # NULL: no cache
    const long long* row_of
    const CosSinTable* table
    float* scratch          # a float32 row (w.dim) per thread, or NULL
    const TokenWalk* w
    const RowCall* q_call
    const RowCall* k_call


cdef void _walk_chunk(void* job_, Py_ssize_t chunk, int slot) noexcept nogil:
    cdef const TokenJob* job = <const TokenJob*>job_
    cdef const CosSinTable* table = job.table
    cdef const TokenWalk* w = job.w
    cdef float* scratch = NULL if job.scratch == NULL else job.scratch + slot * w.dim
    cdef Py_ssize_t t, row
    for t in range(chunk * POSENC_ROW_CHUNK, min((chunk + 1) * POSENC_ROW_CHUNK, w.tokens)):
        row = job.row_of[t]
        _walk_token(t, -1 if job.slot_of == NULL else job.slot_of[t], table.cos + row * table.cos_stride,
                    table.sin + row * table.sin_stride, scratch, w, job.q_call, job.k_call)
    if job.q_call.stream or job.k_call.stream:
        posenc_sfence()


cdef TokenWalk _rows_walk(const TokenRows* x, const TokenRows* out, Py_ssize_t tokens, Py_ssize_t dim, int data,
                          Py_ssize_t itemsize) noexcept nogil:
    # A walk rotating x's rows into out's (out may be x), no cache.
    cdef TokenWalk w
    memset(&w, 0, sizeof(w))
    w.q, w.out_q = x[0], out[0]
    w.tokens, w.dim, w.data, w.cache, w.itemsize, w.row_bytes = tokens, dim, data, data, itemsize, dim * itemsize
    return w


cdef int _walk_tokens_nogil(const TokenWalk* w, const long long* slot_of, const long long* row_of,
                            const CosSinTable* table, bint half, bint inverse, Py_ssize_t start,
                            int threads) noexcept nogil:
    # Token t: its q rows rotated by table row row_of[t] (inverse: by -theta); with a cache, its k rows
    # rotated into slot slot_of[t] (-1: none), its v rows copied there.  Each token by one thread:
    # bitwise the same for any count.  0, or (nothing written) 1 where the data has no kernel with this
    # table, 2 without memory for a half cache's scratch rows.
    cdef Py_ssize_t q_bytes = w.tokens * w.q.heads * w.row_bytes, k_bytes = w.tokens * w.k.heads * w.row_bytes
    cdef RowCall q_call, k_call
    cdef float* scratch = NULL
    cdef TokenJob job
    q_call = _row_call(w.data, table.dtype, w.itemsize, table.itemsize, table.npairs, w.dim, half, inverse,
                       w.q.data == w.out_q.data, q_bytes, start)
    # A key row goes to its slot (streamed when large: the cache is not read
    # back soon) or, for a half cache, to a float32 scratch row in L1.
    k_call = _row_call(w.data, table.dtype, w.itemsize, table.itemsize, table.npairs, w.dim, half, False, False,
                       k_bytes if w.narrow == NULL else 0, start)
    if q_call.rotate == NULL or (w.k.heads and k_call.rotate == NULL):
        return 1
    if w.tokens == 0:
        return 0
    if w.narrow != NULL:
        scratch = <float*>malloc(max(threads, 1) * w.dim * sizeof(float))
        if scratch == NULL:
            return 2
    job = TokenJob(slot_of, row_of, table, scratch, w, &q_call, &k_call)
    posenc_parallel_for((w.tokens + POSENC_ROW_CHUNK - 1) // POSENC_ROW_CHUNK, threads, _walk_chunk, &job)
    free(scratch)
    return 0


cdef int _walk_tokens(const TokenWalk* w, const long long* slot_of, const long long* row_of,
                      const CosSinTable* table, bint half, bint inverse, Py_ssize_t start, int threads) except -1:
    # _walk_tokens_nogil without the GIL, its failures raised.
    cdef int status
    with nogil:
        status = _walk_tokens_nogil(w, slot_of, row_of, table, half, inverse, start, threads)
    if status == 1:
        raise TypeError("no rotation kernel for this data with this cos/sin table")
    if status == 2:
        raise MemoryError()
    return 0


def rotate_rows(cnp.ndarray x not None, cnp.ndarray out not None,
                cnp.ndarray cos_table not None, cnp.ndarray sin_table not None,
                cnp.ndarray row_table not None, bint half_layout, bint inverse,
                int num_threads, Py_ssize_t start=0):
    """Rotate every row r of x by table row row_table[r]; write to out.

    x, out: C-contiguous (rows, dim) of one dtype; `out` may be `x` (in
    place).  row_table: C-contiguous int64 (intp) (rows,).  Features
    [start, start + 2*cos_table.shape[1]) rotate (pairs by `half_layout`),
    the rest are copied.  cos/sin tables (2-D, one dtype) need unit stride
    along their last axis; their row stride is free.
    """
    cdef CosSinTable table = _table_from(cos_table, sin_table)
    cdef TokenRows rows[2]
    cdef TokenWalk w
    rows[0], rows[1] = _array_rows(x), _array_rows(out)
    w = _rows_walk(&rows[0], &rows[1], x.shape[0], x.shape[1], _dtype(x), cnp.PyArray_ITEMSIZE(x))
    _walk_tokens(&w, NULL, <const long long*>_data(row_table), &table, half_layout, inverse, start, num_threads)


cdef inline TokenRows _array_rows(cnp.ndarray a) noexcept:
    # A (tokens, heads, dim) array's rows, or a (rows, dim) array's as tokens of one head.
    cdef TokenRows rows
    cdef int nd = cnp.PyArray_NDIM(a)
    cdef Py_ssize_t row_bytes = a.shape[nd - 1] * cnp.PyArray_ITEMSIZE(a)
    rows.data = _data(a)
    rows.token_stride = cnp.PyArray_STRIDE(a, 0)
    rows.heads = a.shape[1] if nd == 3 else 1
    rows.head_stride = cnp.PyArray_STRIDE(a, 1) if nd == 3 else row_bytes
    rows.extent = max(rows.heads - 1, 0) * rows.head_stride + row_bytes
    return rows


cdef inline bint _index_strided(const Strided* a, Py_ssize_t n) noexcept nogil:
    # A contiguous, aligned int64 array of shape (n,); n < 0: any length.
    return (a.type_num == cnp.NPY_INT64 and a.nd == 1 and <size_t>a.data % 8 == 0
            and (a.dims[0] < 2 or a.steps[0] == 8) and (n < 0 or a.dims[0] == n))


cdef inline bint _vllm_table_takes(int data, int table) noexcept nogil:
    # vllm.py's rule: the [cos | sin] cache in the data's dtype, or float32 for a half type.
    return table == data or (table == POSENC_F32 and (data == POSENC_F16 or data == POSENC_BF16))


cdef bint _token_table(const Strided* c, const Strided* positions, Py_ssize_t width, CosSinTable* table,
                       Py_ssize_t* tokens, const long long** pos) noexcept nogil:
    # vLLM's [cos | sin] cache (n, rot_dim), rot_dim even with 2 <= rot_dim <= width, as a table
    # (a position's cos entries, then its sin entries), and the positions: contiguous int64
    # (tokens,), each entry a row of it.
    cdef Py_ssize_t npairs, itemsize = _itemsize(c)
    cdef long long lowest = 0, highest = 0
    if (not _index_strided(positions, -1) or c.nd != 2 or _strided_dtype(c) < 0 or <size_t>c.data % itemsize
            or c.steps[0] % itemsize or c.steps[1] != itemsize):
        return False
    npairs = c.dims[1] // 2
    tokens[0] = positions.dims[0]
    pos[0] = <const long long*>positions.data
    _position_range(pos[0], tokens[0], &lowest, &highest)
    if (c.dims[1] % 2 or npairs < 1 or 2 * npairs > width
            or tokens[0] and (lowest < 0 or highest >= c.dims[0])):
        return False
    table[0] = CosSinTable(c.data, c.data + npairs * itemsize, c.steps[0], c.steps[0], npairs, itemsize,
                           _strided_dtype(c))
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
    tensors (read in C; `key` may be None): query and key; the ``[cos |
    sin]`` table (n, rot_dim) in their dtype (float32 also for half types); a
    contiguous int64 array of positions (tokens,); an int head_size and
    rope_dim_offset, bool is_neox and inverse.  Each head's features
    ``offset .. offset + rot_dim`` rotate in place by its token's row.
    """
    cdef Strided v[4]  # query, key, the cache, the positions
    cdef bint grad, tensors
    if (not _size_int(head_size) or not _size_int(rope_dim_offset) or type(is_neox) is not bool
            or type(inverse) is not bool or not _token_arrays(query, key, cos_sin_cache, positions, v, &grad)):
        return False
    tensors = type(query) is _Tensor
    if tensors and not _writable((query, key)):
        return False
    cdef Py_ssize_t n = 1 if key is None else 2, size = head_size, offset = rope_dim_offset
    cdef bint half = is_neox, backwards = inverse, done
    with nogil:
        done = _rotate_tokens(v, n, size, offset, half, backwards)
    if not done:
        return False
    if tensors:
        _count_writes((query,) if key is None else (query, key))
    return True


cdef bint _token_arrays(query, key, cos_sin_cache, positions, Strided* v, bint* grad):
    # vLLM's arrays into v[0..3] (query, key (None: v[1] unread), the cache, the positions), all
    # exact ndarrays or all plain CPU tensors, the positions apart from query and key (the walk
    # reads them while it writes); grad: tensors while autograd records.
    cdef bint tensors = _Tensor is not None and type(query) is _Tensor
    grad[0] = tensors and _grad_enabled() is True
    return (_strided_of(query, tensors, grad[0], True, &v[0])
            and (key is None or _strided_of(key, tensors, grad[0], True, &v[1]))
            and _strided_of(cos_sin_cache, tensors, grad[0], True, &v[2])
            and _strided_of(positions, tensors, grad[0], False, &v[3])
            and _positions_apart(v, key is not None))


cdef inline bint _positions_apart(const Strided* v, bint with_key) noexcept nogil:
    # v's positions (v[3]) apart from its query (v[0]) and key (v[1]): the walk reads them while it writes.
    return _strided_disjoint(&v[3], &v[0]) and (not with_key or _strided_disjoint(&v[3], &v[1]))


cdef bint _rotate_tokens(const Strided* v, Py_ssize_t n, Py_ssize_t head_size, Py_ssize_t offset, bint half,
                         bint inverse) noexcept nogil:
    # rotate_tokens_fast's call on _token_arrays' v (and the compiled torch kernel's): its first n,
    # query or query and key; False, nothing written, where it does not take them.
    cdef Py_ssize_t j, tokens = 0, size = 0
    cdef const long long* pos = NULL
    cdef int d[2]
    cdef TokenRows rows[2]
    cdef TokenWalk w[2]
    cdef CosSinTable cos_sin
    if (not _fast_paths_on or head_size < 1 or offset < 0
            or not _token_table(&v[2], &v[3], head_size - offset, &cos_sin, &tokens, &pos)):
        return False
    for j in range(n):
        if not _token_rows(&v[j], tokens, head_size, offset, &rows[j]):
            return False
        d[j] = _strided_dtype(&v[j])
        if (not _vllm_table_takes(d[j], cos_sin.dtype) or K.rotate[d[j]][cos_sin.dtype][0] == NULL
                or not _strided_disjoint(&v[j], &v[2]) or d[j] != d[0]):
            return False
        w[j] = _rows_walk(&rows[j], &rows[j], tokens, head_size - offset, d[j], _itemsize(&v[j]))
        size += _count(&v[j])
    if n == 2 and not _rows_disjoint(&rows[0], &rows[1], tokens):
        return False
    for j in range(n):  # each in place, its token's rows by its position's row (no scratch: never fails)
        _walk_tokens_nogil(&w[j], NULL, pos, &cos_sin, half, inverse, 0, _threads_for(size))
    return True
