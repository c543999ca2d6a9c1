# The planned walks over many rows: rows (outer, seq, inner) by blocks of positions and groups
# of heads, the block sizes they take (the build's, or this CPU's), and the blocked walk of
# consecutive positions below the caches.  RotaryBase, the C API and the q/k norm walk their
# rows through them; each row or block of rows is one call of _core_rotate.pxi.

# Bytes of cos/sin rows per work item of the blocked walks past the caches that are not streamed
# (_block_bytes), per kernel call of the walks below them, and the longest half-layout and
# interleaved row (bytes) that the walks past the caches take in groups of POSENC_HEAD_GROUP heads
# (0: none): the build's POSENC_POSITION_BLOCK_BYTES, POSENC_ROW_BLOCK_BYTES,
# POSENC_GROUP_ROW_BYTES and POSENC_GROUP_INTERLEAVED_ROW_BYTES, or this CPU's measured values (set
# once, at import, by _dispatch).
cdef Py_ssize_t _position_block_bytes = POSENC_POSITION_BLOCK_BYTES
cdef Py_ssize_t _row_block_bytes = POSENC_ROW_BLOCK_BYTES
cdef Py_ssize_t _group_row_bytes = POSENC_GROUP_ROW_BYTES
cdef Py_ssize_t _group_interleaved_row_bytes = POSENC_GROUP_INTERLEAVED_ROW_BYTES


def set_block_bytes(Py_ssize_t position, Py_ssize_t row, Py_ssize_t group,
                    Py_ssize_t group_interleaved, Py_ssize_t scalar_in_place, Py_ssize_t add,
                    Py_ssize_t stream, Py_ssize_t lines):
    """Set the bytes of cos/sin rows per work item of the in-place walks past the caches
    (`position`), per kernel call of the walks below them (`row`), the longest half-layout
    (`group`) and interleaved (`group_interleaved`) row the walks past the caches take in groups
    of heads (0: none), the shortest half-layout row they rotate in place by the scalar kernel
    (`scalar_in_place`; shorter ones by the vectors), and the bytes of table rows per turn of
    add_position_table's walk over batches (`add`; 0: each batch whole), and the least size of
    an out-of-place rotation's result written with non-temporal stores (`stream`) and of an
    out-of-place half-type result written by whole lines (`lines`; 0: never), at import or
    between calls (none running: ``tune`` times each); return the eight before.  Results do not
    depend on them."""
    global _position_block_bytes, _row_block_bytes, _group_row_bytes, _group_interleaved_row_bytes
    global _scalar_in_place_row_bytes, _add_block_bytes, _stream_bytes, _line_rows_bytes
    if position < 1 or row < 1 or stream < 1 or min(group, group_interleaved, scalar_in_place, add, lines) < 0:
        raise ValueError(f"position, row and stream must be >= 1, group, group_interleaved, scalar_in_place, "
                         f"add and lines >= 0, got {position}, {row}, {stream}, {group}, {group_interleaved}, "
                         f"{scalar_in_place}, {add} and {lines}")
    before = (_position_block_bytes, _row_block_bytes, _group_row_bytes, _group_interleaved_row_bytes,
              _scalar_in_place_row_bytes, _add_block_bytes, _stream_bytes, _line_rows_bytes)
    _position_block_bytes, _row_block_bytes = position, row
    _group_row_bytes, _group_interleaved_row_bytes = group, group_interleaved
    _scalar_in_place_row_bytes, _add_block_bytes, _stream_bytes = scalar_in_place, add, stream
    _line_rows_bytes = lines
    return before


def block_bytes():
    """{"position": (bytes, given), "row": ..., "group": ..., "group_interleaved": ...,
    "scalar_in_place": ..., "add": ..., "stream": ..., "lines": ...}: the eight sizes in use, and
    whether the build was given each (-DPOSENC_POSITION_BLOCK_BYTES, -DPOSENC_ROW_BLOCK_BYTES,
    -DPOSENC_GROUP_ROW_BYTES, -DPOSENC_GROUP_INTERLEAVED_ROW_BYTES,
    -DPOSENC_SCALAR_IN_PLACE_ROW_BYTES, -DPOSENC_ADD_BLOCK_BYTES, -DPOSENC_STREAM_BYTES,
    -DPOSENC_LINE_ROWS_BYTES: then it stands)."""
    return {"position": (_position_block_bytes, bool(POSENC_POSITION_BLOCK_BYTES_GIVEN)),
            "row": (_row_block_bytes, bool(POSENC_ROW_BLOCK_BYTES_GIVEN)),
            "group": (_group_row_bytes, bool(POSENC_GROUP_ROW_BYTES_GIVEN)),
            "group_interleaved": (_group_interleaved_row_bytes,
                                  bool(POSENC_GROUP_INTERLEAVED_ROW_BYTES_GIVEN)),
            "scalar_in_place": (_scalar_in_place_row_bytes, bool(POSENC_SCALAR_IN_PLACE_ROW_BYTES_GIVEN)),
            "add": (_add_block_bytes, bool(POSENC_ADD_BLOCK_BYTES_GIVEN)),
            "stream": (_stream_bytes, bool(POSENC_STREAM_BYTES_GIVEN)),
            "lines": (_line_rows_bytes, bool(POSENC_LINE_ROWS_BYTES_GIVEN))}


cdef inline Py_ssize_t _block_bytes(const RowCall* call) noexcept nogil:
    # Cos/sin bytes per work item of a blocked walk: this CPU's value, but the build's for streamed
    # (out-of-place) results: on the Zen 4 4 MiB blocks ran head_dim 100 out of place beside a busy
    # neighbour at 3.8-4.2x its copy in some processes (1.1x with 512 KiB), and gained little there.
    return POSENC_POSITION_BLOCK_BYTES if call.stream else _position_block_bytes


cdef inline Py_ssize_t _positions_in(Py_ssize_t nbytes, Py_ssize_t least, Py_ssize_t npairs,
                                      Py_ssize_t itemsize) noexcept nogil:
    # Positions whose cos/sin rows take about nbytes, at least `least`:
    # _block_bytes for the blocked walks,
    # _row_block_bytes (in L1) for the blocks of one kernel call.
    return max(least, nbytes // (2 * max(npairs, <Py_ssize_t>1) * itemsize))


cdef struct RowPlan:
    # Rows of x as (outer, seq, inner); row (o, s, i) uses cache row
    # base + (positions[s] if positions else s).
    Py_ssize_t outer
    Py_ssize_t seq
    Py_ssize_t inner
    const long long* positions
    long long base
    long long lowest
    long long highest


cdef inline void _rotate_position(const char* x, char* out, Py_ssize_t nrows, long long t,
                                  const CosSinTable* table, const RowCall* call) noexcept nogil:
    # nrows consecutive rows by table row t.
    _rotate_position_rows(x, out, nrows, table.cos + t * table.cos_stride, table.sin + t * table.sin_stride,
                          call)


cdef struct PlannedJob:
    # _rotate_planned's call, for the pool.
    Py_ssize_t block_size
    Py_ssize_t group        # outer indices (heads) per work item
    Py_ssize_t ngroups
    Py_ssize_t step         # positions of a head before the next head of its group
    const char* x
    char* out
    const CosSinTable* table
    const RowPlan* plan
    const RowCall* call
    bint whole_blocks  # each head's `step` rows in one kernel call (short rows, not streamed)


cdef void _rotate_item(void* job_, Py_ssize_t item, int slot) noexcept nogil:
    # Work item = (block of block_size positions, group of outer indices): the
    # cache rows of a block serve every group in turn; in a group, its heads
    # take `step` positions each in turn, so that every head of the group reads
    # a cos/sin row from L1 (_group_row_bytes, _group_interleaved_row_bytes).
    cdef const PlannedJob* job = <const PlannedJob*>job_
    cdef const RowPlan* plan = job.plan
    cdef const RowCall* call = job.call
    cdef Py_ssize_t g = item % job.ngroups, block = item // job.ngroups, s, s0, r, o, n
    cdef Py_ssize_t first = block * job.block_size, stop = min(first + job.block_size, plan.seq)
    cdef Py_ssize_t lo = g * job.group, hi = min(lo + job.group, plan.outer)
    s0 = first
    while s0 < stop:
        n = min(job.step, stop - s0)
        for o in range(lo, hi):
            if job.whole_blocks:
                r = o * plan.seq + s0
                _rotate_block(job.x + r * call.row_bytes, job.out + r * call.row_bytes, n,
                              job.table.cos + (plan.base + s0) * job.table.cos_stride,
                              job.table.sin + (plan.base + s0) * job.table.sin_stride,
                              job.table.cos_stride // job.table.itemsize, call)
                continue
            for s in range(s0, s0 + n):
                r = (o * plan.seq + s) * plan.inner  # the first of the plan.inner rows (o, s, :)
                _rotate_position(job.x + r * call.row_bytes, job.out + r * call.row_bytes, plan.inner,
                                 plan.base + (plan.positions[s] if plan.positions != NULL else s),
                                 job.table, call)
        s0 += n
    if call.stream:
        posenc_sfence()


cdef struct BlockJob:
    # _rotate_blocks' call, for the pool.
    Py_ssize_t block_size   # positions per block
    Py_ssize_t group        # outer indices per work item
    Py_ssize_t ngroups
    const char* x
    char* out
    const CosSinTable* table
    const RowPlan* plan
    const RowCall* call


cdef void _rotate_block_item(void* job_, Py_ssize_t item, int slot) noexcept nogil:
    # Work item = (block of positions, group of outer indices): each index's
    # rows of the block (consecutive rows, consecutive cache rows) are one
    # kernel call, and the block's cache rows stay in L1 across the group.
    cdef const BlockJob* job = <const BlockJob*>job_
    cdef const RowPlan* plan = job.plan
    cdef const RowCall* call = job.call
    cdef Py_ssize_t group = item % job.ngroups, first = item // job.ngroups * job.block_size
    cdef Py_ssize_t rows = min(job.block_size, plan.seq - first), o, r
    cdef const CosSinTable* table = job.table  # cos and sin rows one stride apart (_stacked_table)
    cdef const char* c = table.cos + (plan.base + first) * table.cos_stride
    cdef const char* s = table.sin + (plan.base + first) * table.sin_stride
    for o in range(group * job.group, min((group + 1) * job.group, plan.outer)):
        r = o * plan.seq + first
        _rotate_block(job.x + r * call.row_bytes, job.out + r * call.row_bytes, rows, c, s,
                      table.cos_stride // table.itemsize, call)


cdef void _rotate_blocks(const char* x, char* out, const CosSinTable* table, const RowPlan* plan,
                         const RowCall* call, int num_threads) noexcept nogil:
    # Rows (outer, seq) of consecutive positions (plan.inner 1, no positions
    # array): blocks of _row_block_bytes of cache rows, each serving
    # every outer index (head) in turn.  In cache, a row per kernel call ran
    # W1 1.6-2.4x its limit, a position's heads per call (cos/sin held in
    # registers) 2.2-2.8x out of place: x's and out's rows 128 KiB apart
    # alias in the low 12 address bits, each load waits on the stores.
    cdef Py_ssize_t block = max(<Py_ssize_t>1, min(plan.seq, _positions_in(
        _row_block_bytes, 1, call.npairs, call.table_itemsize)))
    cdef Py_ssize_t group = _rows_per_item(block * call.dim)
    cdef BlockJob job = BlockJob(block, group, (plan.outer + group - 1) // group, x, out, table,
                                 plan, call)
    posenc_parallel_for((plan.seq + block - 1) // block * job.ngroups, num_threads,
                        _rotate_block_item, &job)


cdef void _rotate_planned(const char* x, char* out, const CosSinTable* table, const RowPlan* plan,
                          const RowCall* call, int num_threads) noexcept nogil:
    # table: a _stacked_table (the blocked walk steps its cos and sin rows by one stride).
    cdef Py_ssize_t block, group, step, nblocks
    cdef PlannedJob job
    cdef RowCall unfetched
    cdef bint whole, grouped
    cdef bint consecutive = plan.inner == 1 and plan.positions == NULL  # rows (outer, seq), positions in order
    if num_threads == 1 and plan.seq == 1:  # one position (decode): one call for all its rows
        _rotate_position(x, out, plan.outer * plan.inner,
                         plan.base + (plan.positions[0] if plan.positions != NULL else 0), table,
                         call)
        if call.stream:
            posenc_sfence()
        return
    if call.blocks and consecutive:
        _rotate_blocks(x, out, table, plan, call, num_threads)
        return
    block = _positions_in(_block_bytes(call), 16, call.npairs, call.table_itemsize)
    # Rows of at most _group_row_bytes (interleaved: _group_interleaved_row_bytes) go a few heads
    # at a time, not prefetched: on the AMD Zen 4 a head at a time read each cos/sin row from L2
    # (the rows of x pass through L1 between two heads' reads; posenc_config.h,
    # POSENC_GROUP_ROW_BYTES).  Rows of at most POSENC_BLOCK_ROW_BYTES not streamed (in place) go
    # `step` rows a kernel call.
    grouped = plan.inner == 1 and call.row_bytes <= (
        _group_row_bytes if call.half else _group_interleaved_row_bytes)
    group = min(<Py_ssize_t>(POSENC_HEAD_GROUP if grouped else 1), plan.outer)
    whole = consecutive and not call.stream and call.row_bytes <= POSENC_BLOCK_ROW_BYTES
    step = (plan.seq if group == 1 else
            max(<Py_ssize_t>1, POSENC_GROUP_TURN_BYTES // (group * call.row_bytes)) if whole else 1)
    unfetched = call[0]
    unfetched.prefetch = call.prefetch and not grouped
    job = PlannedJob(block, group, (plan.outer + group - 1) // group, step, x, out, table, plan,
                     &unfetched, whole)
    nblocks = (plan.seq + block - 1) // block
    if job.ngroups * nblocks < 2 * num_threads:  # enough work items for the threads
        nblocks = (2 * num_threads + job.ngroups - 1) // job.ngroups
        job.block_size = max(<Py_ssize_t>16, (plan.seq + nblocks - 1) // nblocks)
        nblocks = (plan.seq + job.block_size - 1) // job.block_size
    posenc_parallel_for(nblocks * job.ngroups, num_threads, _rotate_item, &job)
