# RoPE fast path: RotaryBase, the compiled base class of RotaryEmbedding.
#
# `apply` and `apply_qk` try a path that does all its checks in C: exact,
# C-contiguous ndarrays of a kernel dtype, an integer offset, positions None /
# an int / an int64 array that varies along one axis, and positions covered
# by a per-instance cos/sin cache.  Anything else (and every error) declines,
# having written nothing, to the subclass's general path (rotary.py), which
# validates fully and raises the documented errors.  Both paths use the same
# canonical cos/sin values and row kernels: bitwise the same results.

from cpython.long cimport PyLong_CheckExact, PyLong_AsLongLongAndOverflow


cdef inline bint _fits(long long a, long long b) noexcept nogil:
    # True if a + b cannot overflow for |a|, |b| < 2**61.
    return -(1LL << 61) < a < (1LL << 61) and -(1LL << 61) < b < (1LL << 61)


cdef bint _plan_rows(cnp.ndarray x, object positions, object seq_axis, long long offset,
                     RowPlan* plan) except -1:
    """Fill `plan` for x's rows; return False if the fast path does not apply."""
    cdef int nd = cnp.PyArray_NDIM(x), pnd, k, axis, varying
    cdef cnp.npy_intp* shape = cnp.PyArray_DIMS(x)
    cdef cnp.npy_intp* pshape
    cdef cnp.ndarray parr
    cdef long long value
    cdef int overflow = 0
    cdef Py_ssize_t j, lead = nd - 1
    plan.positions = NULL
    plan.base = offset
    if positions is None:
        if lead < 1 or not PyLong_CheckExact(seq_axis):
            return False
        axis = PyLong_AsLongLongAndOverflow(seq_axis, &overflow)
        if overflow:
            return False
        if axis < 0:
            axis += nd
        if axis < 0 or axis >= lead:
            return False
    elif PyLong_CheckExact(positions):
        value = PyLong_AsLongLongAndOverflow(positions, &overflow)
        if overflow or not _fits(value, offset):
            return False
        plan.base = offset + value
        axis = lead  # no sequence axis: every row has the same position
    elif cnp.PyArray_CheckExact(positions):
        parr = <cnp.ndarray>positions
        pnd = cnp.PyArray_NDIM(parr)
        if (cnp.PyArray_TYPE(parr) != cnp.NPY_INT64 or not cnp.PyArray_ISCARRAY_RO(parr)
                or not cnp.PyArray_ISNOTSWAPPED(parr) or pnd > lead):
            return False
        pshape = cnp.PyArray_DIMS(parr)
        axis = lead
        varying = 0
        for k in range(pnd):
            j = lead - pnd + k
            if pshape[k] != 1:
                if pshape[k] != shape[j]:
                    return False
                axis = j
                varying += 1
        if varying > 1:
            return False
        plan.positions = <const long long*>cnp.PyArray_DATA(parr)
        if cnp.PyArray_SIZE(parr) == 0:
            plan.positions = NULL
    else:
        return False
    plan.outer = 1
    plan.inner = 1
    for k in range(axis):
        plan.outer *= shape[k]
    for k in range(axis + 1, lead):
        plan.inner *= shape[k]
    plan.seq = shape[axis] if axis < lead else 1
    if plan.positions != NULL and axis == lead:  # a single position, any shape of ones
        value = plan.positions[0]
        plan.positions = NULL
        if not _fits(value, offset):
            return False
        plan.base = offset + value
    # Range of the cache rows used.
    if plan.positions == NULL:
        if not _fits(plan.base, plan.seq):
            return False
        plan.lowest = plan.base
        plan.highest = plan.base + plan.seq - 1
    else:
        _position_range(plan.positions, plan.seq, &plan.lowest, &plan.highest)
        if not (_fits(plan.lowest, offset) and _fits(plan.highest, offset)):
            return False
        plan.lowest += offset
        plan.highest += offset
        for j in range(1, plan.seq):  # consecutive positions (an arange) plan as None's
            if plan.positions[j] != plan.positions[0] + j:
                break
        else:
            plan.base = offset + plan.positions[0]
            plan.positions = NULL
    return True


cdef inline bint _fast_array(object x, Py_ssize_t dim):
    # A C-contiguous, aligned, native ndarray of a kernel dtype, shape (..., dim).
    cdef cnp.ndarray arr
    if not cnp.PyArray_CheckExact(x):
        return False
    arr = <cnp.ndarray>x
    return (posenc_dtype_index(cnp.PyArray_TYPE(arr)) >= 0
            and cnp.PyArray_ISCARRAY_RO(arr) and cnp.PyArray_ISNOTSWAPPED(arr)
            and cnp.PyArray_NDIM(arr) >= 1
            and cnp.PyArray_DIMS(arr)[cnp.PyArray_NDIM(arr) - 1] == dim)


cdef inline void _byte_range(char* data, int nd, const cnp.npy_intp* dims, const cnp.npy_intp* steps,
                             Py_ssize_t itemsize, char** low, char** high) noexcept nogil:
    # The lowest byte of an array's items (none of size 0) and one past the
    # highest, whatever its strides (a sliced or reversed cos/sin cache
    # reaches past its nbytes, or below its data pointer).
    cdef char* lo = data
    cdef char* hi = data + itemsize
    cdef Py_ssize_t extent
    cdef int k
    for k in range(nd):
        extent = steps[k] * (dims[k] - 1)
        if extent < 0:
            lo += extent
        else:
            hi += extent
    low[0] = lo
    high[0] = hi


cdef inline bint _disjoint(cnp.ndarray a, cnp.ndarray b):
    # True if a and b cannot share memory (False may be a false alarm).
    cdef char* a_low
    cdef char* a_high
    cdef char* b_low
    cdef char* b_high
    if cnp.PyArray_SIZE(a) == 0 or cnp.PyArray_SIZE(b) == 0:
        return True
    _byte_range(_data(a), cnp.PyArray_NDIM(a), cnp.PyArray_DIMS(a), cnp.PyArray_STRIDES(a),
                cnp.PyArray_ITEMSIZE(a), &a_low, &a_high)
    _byte_range(_data(b), cnp.PyArray_NDIM(b), cnp.PyArray_DIMS(b), cnp.PyArray_STRIDES(b),
                cnp.PyArray_ITEMSIZE(b), &b_low, &b_high)
    return a_high <= b_low or b_high <= a_low


cdef inline tuple _with_positions(tuple others, object positions, const RowPlan* plan):
    # `others`, and the positions array where the walk reads it while it writes (an alias of
    # the result would change them under it).
    return others + (positions,) if plan.positions != NULL else others


cdef object _fast_out(cnp.ndarray x, object out, tuple others):
    """The array to write: new, x itself, or a valid `out`; None to fall back."""
    cdef cnp.ndarray arr
    cdef int k
    if out is None:
        return cnp.PyArray_EMPTY(cnp.PyArray_NDIM(x), cnp.PyArray_DIMS(x), cnp.PyArray_TYPE(x), 0)
    if not cnp.PyArray_CheckExact(out):
        return None
    arr = <cnp.ndarray>out
    if (cnp.PyArray_TYPE(arr) != cnp.PyArray_TYPE(x) or not cnp.PyArray_ISCARRAY(arr)
            or not cnp.PyArray_ISNOTSWAPPED(arr) or cnp.PyArray_NDIM(arr) != cnp.PyArray_NDIM(x)):
        return None
    for k in range(cnp.PyArray_NDIM(x)):
        if cnp.PyArray_DIMS(arr)[k] != cnp.PyArray_DIMS(x)[k]:
            return None
    if arr is not x and not _disjoint(arr, x):
        return None
    for other in others:
        if other is not None and not _disjoint(arr, <cnp.ndarray>other):
            return None
    return arr


cdef inline int _table_of(cnp.ndarray x):
    # The cos/sin cache dtype for x (a kernel dtype, checked by _fast_array).
    return posenc_table_dtype(posenc_dtype_index(cnp.PyArray_TYPE(x)))


cdef int _inverse_flag(object inverse, double factor):
    # 0/1, or -1 to fall back (not a bool, or an inverse that divides by the factor).
    if inverse is False:
        return 0
    if inverse is True and factor == 1.0:
        return 1
    return -1


cdef bint _offset_value(object offset, long long* value):
    cdef int overflow = 0
    if not PyLong_CheckExact(offset):
        return False
    value[0] = PyLong_AsLongLongAndOverflow(offset, &overflow)
    return not overflow and _fits(value[0], 0)


cdef object _empty_aligned(tuple shape, object dtype, Py_ssize_t offset):
    # An empty C-contiguous array starting `offset` bytes past a 64-byte
    # boundary (NumPy gives 16-byte alignment).  See _table_offset.
    import numpy
    count = 1
    for side in shape:
        count *= side
    buffer = numpy.empty(count * dtype.itemsize + 64, dtype=numpy.uint8)
    start = (offset - buffer.ctypes.data) % 64
    return buffer[start:start + count * dtype.itemsize].view(dtype).reshape(shape)


cdef inline Py_ssize_t _table_offset(cnp.ndarray x, bint in_place) noexcept:
    # Where a cos/sin cache created for a call on x starts, past a 64-byte
    # boundary.  0 for rows in blocks (below POSENC_STREAM_BYTES): with its
    # rows (multiples of 64 bytes) never split under 64-byte loads, W1
    # (1,32,32,128) float32 in place ran 1.00-1.49x np.multiply, 1.25-1.78x
    # with NumPy's 16-byte alignment (by x's own).  x's own offset for an
    # in-place call past the caches: its rows peel to x's alignment, and the
    # loads of a table 16 bytes off x's lines split (W1 (1,32,4096,128)
    # float32 in place 1.30-1.31x against 1.18-1.27x).  The call that creates
    # or grows the cache decides; results are bitwise the same either way.
    if in_place and cnp.PyArray_NBYTES(x) >= POSENC_STREAM_BYTES:
        return <Py_ssize_t>(<size_t>cnp.PyArray_DATA(x) % 64)
    return 0


# Every fast path of _core (this one, the cos/sin walk, the fused KV write)
# declines all calls while this is False: tests compare each with its general
# path (set_fast_paths).
cdef bint _fast_paths_on = True


def set_fast_paths(bint on):
    """Turn every compiled fast path on or off (for tests); off, calls take their general paths."""
    global _fast_paths_on
    _fast_paths_on = on


def fast_paths_enabled():
    """Whether the compiled fast paths take the calls they accept (`set_fast_paths`)."""
    return _fast_paths_on


@cython.auto_pickle(False)
cdef class RotaryBase:
    """The compiled part of RotaryEmbedding: its fast path and cos/sin caches.

    ``RotaryEmbedding`` (rotary.py) subclasses it and calls `_init_rotary`
    from its constructor; the calls the fast path leaves go to the
    subclass's ``_apply_general``/``_apply_qk_general``/``_apply_streams``
    methods of the same object (no reference back, no cycle).
    """

    cdef Py_ssize_t dim
    cdef Py_ssize_t npairs
    cdef Py_ssize_t start  # the first feature that rotates
    cdef bint half
    cdef bint streams  # several position streams: explicit positions take _apply_streams
    cdef double factor
    cdef long long valid_below
    cdef object freqs
    # cos/sin caches of positions 0 .. rows-1 (canonical values, attention
    # factor applied), per dtype: arrays (rows, 2, npairs) or None.  Replaced
    # (never changed) under the lock; read as list items, which stay safe
    # without the GIL (a reader holds its own reference).
    cdef list caches
    cdef cython.pymutex lock

    def _init_rotary(self, Py_ssize_t dim, Py_ssize_t rotary_dim, Py_ssize_t start, bint half,
                     freqs, double attention_factor, long long valid_below, bint streams):
        """Set the fast path's state (from RotaryEmbedding's constructor, its arguments checked).

        Features [start, start + rotary_dim) rotate; `freqs` are the
        rotary_dim // 2 float64 frequencies of positions p
        with p + 1 <= `valid_below` (others take the general path);
        `attention_factor` is folded into the cached cos/sin values.
        """
        self.dim = dim
        self.npairs = rotary_dim // 2
        self.start = start
        self.half = half
        self.streams = streams
        self.factor = attention_factor
        self.valid_below = valid_below
        self.freqs = freqs
        self.caches = [None] * POSENC_NUM_DTYPES

    cdef object _cache_for(self, int table, long long highest, Py_ssize_t offset=0):
        """The cos/sin cache of dtype `table` covering row `highest`, or None.

        A cache created or grown now starts `offset` bytes past a 64-byte
        boundary (_table_offset).
        """
        cdef Py_ssize_t itemsize = 8 if table == POSENC_F64 else 4
        cdef Py_ssize_t limit = POSENC_CACHE_BYTES // (2 * itemsize * max(self.npairs, 1))
        cdef Py_ssize_t rows, new_rows
        cdef object cache = self.caches[table]  # a list item: read safely without the lock
        if cache is not None and highest < (<cnp.ndarray>cache).shape[0]:
            return cache
        with self.lock:
            cache = self.caches[table]
            rows = 0 if cache is None else (<cnp.ndarray>cache).shape[0]
            if highest < rows:
                return cache
            if highest >= limit:
                return None
            new_rows = min(limit, max(2 * rows, (highest // POSENC_CACHE_GROWTH + 1)
                                      * POSENC_CACHE_GROWTH))
            cache = self._grow_cache("float64" if table == POSENC_F64 else "float32", cache,
                                     rows, new_rows, offset)
            self.caches[table] = cache
            return cache

    cdef object _grow_cache(self, dtype, object old, Py_ssize_t rows, Py_ssize_t new_rows,
                            Py_ssize_t offset):
        # One array (rows, 2, npairs): a position's cos and sin rows side by
        # side, so that the rotation reads one stream of table rows, not two.
        import numpy
        table = _empty_aligned((new_rows, 2, self.npairs), numpy.dtype(dtype), offset)
        if old is not None:
            table[:rows] = old
        threads = _threads_for((new_rows - rows) * self.npairs)
        work = numpy.empty((trig_work_rows(threads), max(self.npairs, 1)))
        cos_sin_rows(numpy.arange(rows, new_rows, dtype=numpy.float64), self.freqs,
                     self.factor, table[rows:, 0], table[rows:, 1], work, threads)
        table.flags.writeable = False
        return table

    cdef void _run(self, cnp.ndarray x, cnp.ndarray out, cnp.ndarray table, RowPlan plan,
                   bint inverse):
        cdef Py_ssize_t size = cnp.PyArray_SIZE(x)
        cdef int d = posenc_dtype_index(cnp.PyArray_TYPE(x))
        cdef int threads = _threads_for(size)
        cdef CosSinTable rows = _stacked_table(_data(table), self.npairs, cnp.PyArray_ITEMSIZE(table),
                                               posenc_table_dtype(d))
        cdef RowCall call = _row_call(d, rows.dtype, cnp.PyArray_ITEMSIZE(x), rows.itemsize, self.npairs,
                                      self.dim, self.half, inverse, _data(x) == _data(out),
                                      cnp.PyArray_NBYTES(x), self.start)
        cdef const char* xp = _data(x)
        cdef char* op = _data(out)
        if size == 0:
            return
        with nogil:
            _rotate_planned(xp, op, &rows, &plan, &call, threads)

    cdef bint _usable(self, RowPlan* plan):
        return plan.lowest >= 0 and plan.highest < self.valid_below

    @cython.annotation_typing(False)  # the annotations are the public API's, for inspect
    def apply(self, x: ArrayLike, positions: ArrayLike | None = None, *, offset: float = 0,
              seq_axis: int = -2, inverse: bool = False,
              out: NDArray[np.floating[Any]] | None = None) -> NDArray[np.floating[Any]]:
        """Rotate the pairs of `x` by their positions.

        Parameters
        ----------
        x : ndarray of shape (..., dim), float16, bfloat16, float32 or float64
            Queries or keys (never values).  Half types are computed in
            float32 (cos/sin in float32 from the float64 angles) and rounded
            once.
        positions : array_like of real numbers, optional
            Broadcasts against ``x.shape[:-1]``: ``(seq,)``, ``(batch, 1,
            seq)``, ``(tokens, 1)`` for ``(tokens, heads, dim)``, or a scalar.
            Default ``arange(n)`` laid along `seq_axis`.  With several
            position streams (`n_streams` > 1), one such array per stream
            stacked on a leading axis: ``(n_streams, seq)`` etc.
        offset : float, optional
            Added to every position (the KV-cache length when decoding).
        seq_axis : int, optional
            The sequence axis when `positions` is None: -2 for ``(batch,
            heads, seq, dim)``, -3 for ``(batch, seq, heads, dim)``.
        inverse : bool, optional
            Rotate by ``-theta`` and divide by the attention factor.
        out : ndarray of x's shape and dtype, optional
            May be `x` itself (in place).

        Returns
        -------
        ndarray of x's shape and dtype
        """
        if self.streams and positions is not None:
            return self._apply_streams((x,), positions, offset, inverse, (out,))[0]
        result = self._fast_apply(x, positions, offset, seq_axis, inverse, out)
        if result is None:
            result = self._apply_general(x, positions, offset, seq_axis, inverse, out)
        return result

    @cython.annotation_typing(False)
    def apply_qk(self, q: ArrayLike, k: ArrayLike, positions: ArrayLike | None = None, *,
                 offset: float = 0, seq_axis: int = -2, inverse: bool = False,
                 out_q: NDArray[np.floating[Any]] | None = None,
                 out_k: NDArray[np.floating[Any]] | None = None
                 ) -> tuple[NDArray[np.floating[Any]], NDArray[np.floating[Any]]]:
        """Rotate queries and keys with one cos/sin computation.

        `q` and `k` may have different head counts (grouped-query attention)
        and dtypes; their positions (explicit, or along `seq_axis`) must agree.
        Arguments as in `apply`; `out_q` may be `q` and `out_k` may be `k`.

        Returns
        -------
        (q_rot, k_rot)
        """
        if self.streams and positions is not None:
            return self._apply_streams((q, k), positions, offset, inverse, (out_q, out_k))
        result = self._fast_apply_qk(q, k, positions, offset, seq_axis, inverse, out_q, out_k)
        if result is None:
            result = self._apply_qk_general(q, k, positions, offset, seq_axis, inverse, out_q,
                                            out_k)
        return result

    cdef object _fast_apply(self, x, positions, offset, seq_axis, inverse, out):
        # The fast path of apply; None (nothing written) to fall back.
        cdef RowPlan plan
        cdef long long offset_value = 0
        cdef int flag
        cdef object cache, result
        if (not _fast_paths_on or not _fast_array(x, self.dim)
                or not _offset_value(offset, &offset_value)):
            return None
        flag = _inverse_flag(inverse, self.factor)
        if (flag < 0 or not _plan_rows(<cnp.ndarray>x, positions, seq_axis, offset_value, &plan)
                or not self._usable(&plan)):
            return None
        result = _fast_out(<cnp.ndarray>x, out, _with_positions((), positions, &plan))
        if result is None:
            return None
        cache = self._cache_for(_table_of(x), plan.highest,
                                _table_offset(<cnp.ndarray>x, result is x))
        if cache is None:
            return None
        self._run(<cnp.ndarray>x, <cnp.ndarray>result, <cnp.ndarray>cache, plan, flag)
        return result

    cdef object _fast_apply_qk(self, q, k, positions, offset, seq_axis, inverse, out_q, out_k):
        # The fast path of apply_qk; None (nothing written) to fall back.
        cdef RowPlan q_plan, k_plan
        cdef long long offset_value = 0
        cdef int flag
        cdef object q_cache, k_cache, q_out, k_out
        if (not _fast_paths_on or not _fast_array(q, self.dim) or not _fast_array(k, self.dim)
                or not _offset_value(offset, &offset_value)):
            return None
        flag = _inverse_flag(inverse, self.factor)
        if (flag < 0
                or not _plan_rows(<cnp.ndarray>q, positions, seq_axis, offset_value, &q_plan)
                or not _plan_rows(<cnp.ndarray>k, positions, seq_axis, offset_value, &k_plan)
                or q_plan.seq != k_plan.seq
                or not self._usable(&q_plan) or not self._usable(&k_plan)
                or not _disjoint(<cnp.ndarray>q, <cnp.ndarray>k)):
            return None
        q_out = _fast_out(<cnp.ndarray>q, out_q, _with_positions((k,), positions, &q_plan))
        k_out = _fast_out(<cnp.ndarray>k, out_k,
                          _with_positions((q,) if q_out is None else (q, q_out), positions, &k_plan))
        if q_out is None or k_out is None:
            return None
        q_cache = self._cache_for(_table_of(q), q_plan.highest,
                                  _table_offset(<cnp.ndarray>q, q_out is q))
        k_cache = self._cache_for(_table_of(k), k_plan.highest)
        if q_cache is None or k_cache is None:
            return None
        self._run(<cnp.ndarray>q, <cnp.ndarray>q_out, <cnp.ndarray>q_cache, q_plan, flag)
        self._run(<cnp.ndarray>k, <cnp.ndarray>k_out, <cnp.ndarray>k_cache, k_plan, flag)
        return q_out, k_out
