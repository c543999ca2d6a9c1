# Compiled path of apply_rotary_cos_sin(_qk) without positions.
#
# A framework's own cos/sin cache (Hugging Face's, sliced to one entry per
# pair) broadcast against x's leading axes: each row of x walks the cache by
# the cache's own strides (0 along broadcast axes), so a sliced or
# non-contiguous cache is read where it lies.  As for RotaryBase, `None`
# sends the call to the general path in rotary.py, which validates fully.

cdef enum:
    MAX_WALK_AXES = 8


cdef struct CacheWalk:
    # x's leading axes, and the cos/sin steps (in bytes) along each.
    int naxes
    Py_ssize_t shape[MAX_WALK_AXES]
    Py_ssize_t cos_step[MAX_WALK_AXES]
    Py_ssize_t sin_step[MAX_WALK_AXES]
    Py_ssize_t rows
    Py_ssize_t npairs


cdef bint _plan_walk(cnp.ndarray x, cnp.ndarray cos_cache, cnp.ndarray sin_cache,
                     CacheWalk* walk):
    """Fill `walk` for x's rows; False if cos/sin do not broadcast as required."""
    return _walk_plan(cnp.PyArray_NDIM(x), cnp.PyArray_DIMS(x), cnp.PyArray_NDIM(cos_cache),
                      cnp.PyArray_DIMS(cos_cache), cnp.PyArray_STRIDES(cos_cache),
                      cnp.PyArray_STRIDES(sin_cache), cnp.PyArray_ITEMSIZE(cos_cache), walk)


cdef bint _walk_plan(int xnd, const cnp.npy_intp* xshape, int cnd, const cnp.npy_intp* cshape,
                     const cnp.npy_intp* cos_steps, const cnp.npy_intp* sin_steps, Py_ssize_t itemsize,
                     CacheWalk* walk) noexcept nogil:
    # _plan_walk of shapes and byte steps (cos and sin of one shape and itemsize).
    cdef int k, j
    cdef Py_ssize_t cs, ss
    if xnd - 1 > MAX_WALK_AXES or cnd > xnd or cnd < 1 or cshape[cnd - 1] < 1:
        return False
    walk.naxes = xnd - 1
    walk.rows = 1
    walk.npairs = cshape[cnd - 1]
    for k in range(xnd - 1):
        walk.shape[k] = xshape[k]
        walk.rows *= xshape[k]
        walk.cos_step[k] = 0
        walk.sin_step[k] = 0
        j = k - (xnd - cnd)  # the cache's axis under x's axis k, if any
        if j < 0 or cshape[j] == 1:
            continue
        if cshape[j] != xshape[k]:
            return False
        cs = cos_steps[j]
        ss = sin_steps[j]
        if cs % itemsize or ss % itemsize:
            return False
        walk.cos_step[k] = cs
        walk.sin_step[k] = ss
    return True


cdef inline void _walk_start(const CacheWalk* walk, Py_ssize_t row, Py_ssize_t* index,
                             Py_ssize_t* co, Py_ssize_t* so) noexcept nogil:
    # Row `row`'s index along each leading axis and its cos/sin offsets.
    cdef Py_ssize_t rest = row
    cdef int k
    co[0] = 0
    so[0] = 0
    for k in range(walk.naxes - 1, -1, -1):
        index[k] = rest % walk.shape[k]
        rest //= walk.shape[k]
        co[0] += index[k] * walk.cos_step[k]
        so[0] += index[k] * walk.sin_step[k]


cdef void _rotate_walk_rows(const char* x, char* out, const CosSinTable* table,
                            const CacheWalk* walk, Py_ssize_t first, Py_ssize_t stop,
                            const RowCall* call) noexcept nogil:
    # Rows first .. stop-1 of x; an odometer over the leading axes tracks the
    # cache offsets.
    cdef Py_ssize_t index[MAX_WALK_AXES]
    cdef Py_ssize_t co, so, r
    cdef const char* c = table.cos  # held in registers: the row calls through pointers could change *table
    cdef const char* s = table.sin
    cdef int k
    _walk_start(walk, first, index, &co, &so)
    for r in range(first, stop):
        _rotate_row(x + r * call.row_bytes, out + r * call.row_bytes, c + co, s + so, call)
        k = walk.naxes - 1
        while k >= 0:
            index[k] += 1
            co += walk.cos_step[k]
            so += walk.sin_step[k]
            if index[k] < walk.shape[k]:
                break
            co -= walk.shape[k] * walk.cos_step[k]
            so -= walk.shape[k] * walk.sin_step[k]
            index[k] = 0
            k -= 1
    if call.stream:
        posenc_sfence()


cdef struct WalkJob:
    # _rotate_walk's call, for the pool.
    Py_ssize_t table_step   # != 0: a block's rows step the cos/sin by it (elements), one kernel call
    Py_ssize_t heads
    Py_ssize_t inner
    Py_ssize_t block
    Py_ssize_t nblocks
    const char* x
    char* out
    const CosSinTable* table
    const CacheWalk* walk
    const RowCall* call


cdef void _rotate_walk_item(void* job_, Py_ssize_t item, int slot) noexcept nogil:
    # Item = (outer index, block, head), head fastest: one contiguous range of rows.
    cdef const WalkJob* job = <const WalkJob*>job_
    cdef Py_ssize_t head = item % job.heads, rest = item // job.heads
    cdef Py_ssize_t start = (rest // job.nblocks * job.heads + head) * job.inner
    cdef Py_ssize_t b = rest % job.nblocks, first = start + b * job.block
    cdef Py_ssize_t stop = start + min((b + 1) * job.block, job.inner), co, so
    cdef Py_ssize_t index[MAX_WALK_AXES]
    if job.table_step == 0:
        _rotate_walk_rows(job.x, job.out, job.table, job.walk, first, stop, job.call)
        return
    _walk_start(job.walk, first, index, &co, &so)
    _rotate_block(job.x + first * job.call.row_bytes, job.out + first * job.call.row_bytes,
                  stop - first, job.table.cos + co, job.table.sin + so, job.table_step, job.call)


cdef void _rotate_walk(const char* x, char* out, const CosSinTable* table, const CacheWalk* walk,
                       const RowCall* call, int num_threads) noexcept nogil:
    # Rows as (outer, heads, inner): `heads` is the last axis along which the
    # cache does not change but changes after it (e.g. x (batch, heads, seq,
    # dim) with a (seq, pairs) cache).  Work items are blocks of inner rows,
    # one head at a time, heads innermost: a block's cache rows (half an L2)
    # serve every head in turn, as in _rotate_item.  Without such an axis the
    # rows are taken in order, in chunks.  Below POSENC_STREAM_BYTES, when
    # `inner` is x's last leading axis and cos and sin step alike along it
    # (a (seq, pairs) cache), a block is one kernel call over
    # _row_block_bytes of cos/sin rows, as in _rotate_blocks.
    cdef Py_ssize_t outer = 1, heads = 1, inner = walk.rows, block = POSENC_ROW_CHUNK
    cdef Py_ssize_t nblocks, table_step = 0
    cdef int k, j, last
    cdef bint varies_after = False
    for k in range(walk.naxes - 1, -1, -1):
        if walk.cos_step[k] != 0 or walk.sin_step[k] != 0:
            varies_after = True
        elif varies_after and walk.shape[k] > 1:
            heads = walk.shape[k]
            inner = 1
            for j in range(k + 1, walk.naxes):
                inner *= walk.shape[j]
            outer = walk.rows // (heads * inner)
            block = _positions_in(_block_bytes(call), 16, walk.npairs, table.itemsize)
            last = walk.naxes - 1
            if call.blocks and k + 1 == last and walk.cos_step[last] == walk.sin_step[last]:
                table_step = walk.cos_step[last] // table.itemsize
                block = _positions_in(_row_block_bytes, 1, walk.npairs, table.itemsize)
            break
    nblocks = (inner + block - 1) // block
    cdef WalkJob job = WalkJob(table_step, heads, inner, block, nblocks, x, out, table, walk, call)
    posenc_parallel_for(outer * nblocks * heads, num_threads, _rotate_walk_item, &job)


cdef void _run_walk(cnp.ndarray x, cnp.ndarray out, cnp.ndarray cos_cache, cnp.ndarray sin_cache,
                    const CacheWalk* walk, bint half, bint inverse, Py_ssize_t start):
    # (dtypes the callers checked)
    cdef CosSinTable table = _walk_table(_data(cos_cache), _data(sin_cache), walk, cnp.PyArray_ITEMSIZE(cos_cache),
                                         posenc_dtype_index(cnp.PyArray_TYPE(cos_cache)))
    cdef int d = posenc_dtype_index(cnp.PyArray_TYPE(x))
    cdef Py_ssize_t itemsize = cnp.PyArray_ITEMSIZE(x), dim = cnp.PyArray_DIMS(x)[cnp.PyArray_NDIM(x) - 1]
    cdef const char* data = _data(x)
    cdef char* into = _data(out)
    with nogil:
        _walk_rows(data, into, d, itemsize, dim, &table, walk, half, inverse, start)


cdef inline CosSinTable _walk_table(const char* c, const char* s, const CacheWalk* walk, Py_ssize_t itemsize,
                                    int dtype) noexcept nogil:
    # A caller's cos/sin as the table the walk reads: its rows lie where the walk's per-axis steps
    # say (no row strides of its own).
    return CosSinTable(c, s, 0, 0, walk.npairs, itemsize, dtype)


cdef void _walk_rows(const char* x, char* out, int d, Py_ssize_t itemsize, Py_ssize_t dim,
                     const CosSinTable* table, const CacheWalk* walk, bint half, bint inverse,
                     Py_ssize_t start) noexcept nogil:
    # x's walk.rows rows of dim items (C-contiguous, dtype index d) rotated into out by `table`.
    cdef Py_ssize_t nbytes = walk.rows * dim * itemsize
    cdef RowCall call = _row_call(d, table.dtype, itemsize, table.itemsize, walk.npairs, dim, half, inverse,
                                  x == out, nbytes, start)
    cdef int threads = _threads_for(walk.rows * dim)
    if walk.rows == 0 or dim == 0:
        return
    _rotate_walk(x, out, table, walk, &call, threads)


cdef inline bint _fast_cache(object a):
    # An aligned, native ndarray of a kernel dtype with unit stride along its
    # last axis (any stride if no two entries are read along it).
    cdef cnp.ndarray arr
    cdef int last
    if not cnp.PyArray_CheckExact(a):
        return False
    arr = <cnp.ndarray>a
    last = cnp.PyArray_NDIM(arr) - 1
    return (posenc_dtype_index(cnp.PyArray_TYPE(arr)) >= 0
            and cnp.PyArray_ISALIGNED(arr) and cnp.PyArray_ISNOTSWAPPED(arr) and last >= 0
            and (cnp.PyArray_STRIDE(arr, last) == cnp.PyArray_ITEMSIZE(arr)
                 or cnp.PyArray_DIMS(arr)[last] == 1 or cnp.PyArray_SIZE(arr) == 0))


def rotate_cos_sin_fast(tuple xs, cos_cache, sin_cache, layout, inverse, tuple outs,
                        Py_ssize_t start=0):
    """The compiled path of apply_rotary_cos_sin(_qk) with positions None.

    Rotates features [start, start + 2 * pairs) of every array of `xs` (one,
    or q and k) into the matching entry of `outs` (None: a new array) and
    returns the results as a tuple, or returns None, having written nothing,
    when the call is not one this path takes.
    """
    if (not (inverse is True or inverse is False)
            or type(layout) is not str or layout not in ("half", "interleaved")):
        return None
    return _rotate_cos_sin(xs, cos_cache, sin_cache, layout == "half", inverse, outs, start)


cdef object _rotate_cos_sin(tuple xs, object cos_cache, object sin_cache, bint half, bint inverse,
                            tuple outs, Py_ssize_t start):
    # rotate_cos_sin_fast's work, once its flags are checked.
    cdef CacheWalk walks[2]
    cdef Py_ssize_t n = len(xs), j, dim = 0
    cdef int table
    cdef list results = []
    cdef cnp.ndarray c, s, x
    if (not _fast_paths_on or n > 2 or len(outs) != n or start < 0
            or not (_fast_cache(cos_cache) and _fast_cache(sin_cache))):
        return None
    c, s = cos_cache, sin_cache
    if cnp.PyArray_TYPE(c) != cnp.PyArray_TYPE(s) or not cnp.PyArray_SAMESHAPE(c, s):
        return None
    table = posenc_dtype_index(cnp.PyArray_TYPE(c))
    for j in range(n):
        if not cnp.PyArray_CheckExact(xs[j]) or cnp.PyArray_NDIM(<cnp.ndarray>xs[j]) < 1:
            return None
        x = xs[j]
        if j == 0:  # k must end in q's dim
            dim = cnp.PyArray_DIMS(x)[cnp.PyArray_NDIM(x) - 1]
        if (not _fast_array(x, dim)
                or start + 2 * cnp.PyArray_DIMS(c)[cnp.PyArray_NDIM(c) - 1] > dim
                or K.rotate[posenc_dtype_index(cnp.PyArray_TYPE(x))][table][0] == NULL
                or not _plan_walk(x, c, s, &walks[j])):
            return None
    if n == 2 and not _disjoint(<cnp.ndarray>xs[0], <cnp.ndarray>xs[1]):
        return None
    for j in range(n):
        # out must not overlap the cache, the other input or an earlier output.
        result = _fast_out(<cnp.ndarray>xs[j], outs[j],
                           (c, s) + xs[:j] + xs[j + 1:] + tuple(results))
        if result is None:
            return None
        results.append(result)
    for j in range(n):
        _run_walk(<cnp.ndarray>xs[j], <cnp.ndarray>results[j], c, s, &walks[j], half, inverse,
                  start)
    return tuple(results)


def entries_repeat(cache, bint pairs):
    """Whether a C-contiguous cache's rows repeat bit for bit: entry 2i equals 2i + 1
    (`pairs`) or the first half equals the second (else); None for any other array."""
    cdef int same = _entries_repeat(cache, pairs)
    return None if same < 0 else bool(same)


cdef int _entries_repeat(object cache, bint pairs):
    # entries_repeat's answer as 1 / 0, or -1 for an array it does not read.
    cdef cnp.ndarray a
    cdef Py_ssize_t width
    if not cnp.PyArray_CheckExact(cache):
        return -1
    a = <cnp.ndarray>cache
    if cnp.PyArray_NDIM(a) < 1 or not cnp.PyArray_ISCARRAY_RO(a):
        return -1
    width = cnp.PyArray_DIMS(a)[cnp.PyArray_NDIM(a) - 1]
    if width % 2:
        return -1
    return _rows_repeat(_data(a), cnp.PyArray_SIZE(a) // width if width else 0, width,
                        cnp.PyArray_ITEMSIZE(a), pairs)


cdef bint _rows_repeat(const char* row, Py_ssize_t rows, Py_ssize_t width, Py_ssize_t itemsize,
                       bint pairs) noexcept nogil:
    # Whether each of `rows` consecutive rows of `width` items repeats (see entries_repeat).
    cdef Py_ssize_t r, i
    for r in range(rows):
        if pairs:
            for i in range(0, width, 2):
                if memcmp(row + i * itemsize, row + (i + 1) * itemsize, itemsize):
                    return False
        elif memcmp(row, row + width // 2 * itemsize, width // 2 * itemsize):
            return False
        row += width * itemsize
    return True
