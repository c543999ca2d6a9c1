# The hot loops of posenc_fast, included by every _kernels_<variant>.pyx so
# that the same source is compiled once per instruction set (see setup.py).
#
# Kernels trust their inputs: the Python layer has already checked dtypes,
# shapes, contiguity, ranges and aliasing, and allocated every output.  They
# never raise, never allocate and run without the GIL.
#
# Angles are formed in double precision, exactly: the anchors take the
# rounding error of p*w into account, so a value is cos/sin of the exact
# product of the position and the float64 frequency.  Rows of consecutive positions use
# the angle-addition recurrence (rotate the previous row's (cos, sin) by the
# step angle), re-anchored with libm sin/cos every ANCHOR_ROWS rows and at
# every position that does not follow its predecessor by exactly 1.  The
# anchors sit at fixed row numbers, so results do not depend on the number of
# threads.

from cython.parallel cimport prange, threadid
from libc.math cimport sin, cos, fma
from libc.string cimport memcpy

ctypedef fused data_t:
    float
    double

ctypedef fused table_t:
    float
    double

cdef extern from *:
    """
    #if defined(_OPENMP)
    #define POSENC_OPENMP 1
    #else
    #define POSENC_OPENMP 0
    #endif
    #if defined(__AVX512F__)
    #define POSENC_SIMD "avx512"
    #elif defined(__AVX2__)
    #define POSENC_SIMD "avx2"
    #elif defined(__AVX__)
    #define POSENC_SIMD "avx"
    #elif defined(__SSE2__)
    #define POSENC_SIMD "sse2"
    #elif defined(__ARM_NEON)
    #define POSENC_SIMD "neon"
    #else
    #define POSENC_SIMD "scalar"
    #endif
    #define POSENC_CHUNK 64
    #define POSENC_ANCHOR_ROWS 32
    """
    int POSENC_OPENMP
    const char* POSENC_SIMD
    # Pairs a row function copies to local arrays at a time.
    enum: POSENC_CHUNK
    # Rows between two exact (libm) anchors of the recurrence: 32 steps keep
    # the accumulated error near 1e-14, far below a float32 ulp, while libm
    # runs on only 1/32 of the rows.
    enum: ANCHOR_ROWS "POSENC_ANCHOR_ROWS"


def openmp_enabled():
    """Return True if this module was compiled with OpenMP."""
    return bool(POSENC_OPENMP)


def simd_level():
    """Return the widest SIMD instruction set this module was compiled for."""
    return POSENC_SIMD.decode()


def anchor_rows():
    """Return the number of rows between exact anchors of the recurrence."""
    return ANCHOR_ROWS


# ---------------------------------------------------------------------------
# sin/cos of position * frequency, row by row

cdef inline void _trig_anchor(double p, const double* w, double* c, double* s,
                              Py_ssize_t n) noexcept nogil:
    # cos/sin of the exact product p*w[i] = hi + lo (fma gives the rounding
    # error lo exactly): sin(hi + lo) = sin(hi) + lo*cos(hi) to ~1e-21.
    cdef Py_ssize_t i
    cdef double hi, lo, ch, sh
    for i in range(n):
        hi = p * w[i]
        lo = fma(p, w[i], -hi)
        ch = cos(hi)
        sh = sin(hi)
        c[i] = ch - lo * sh
        s[i] = sh + lo * ch


cdef inline void _trig_step(const double* cw, const double* sw, double* c, double* s,
                            Py_ssize_t n) noexcept nogil:
    # (c, s) <- rotation of (c, s) by the step angle w: cos/sin of angle + w.
    cdef Py_ssize_t i
    cdef double ci, si
    for i in range(n):
        ci = c[i]
        si = s[i]
        c[i] = ci * cw[i] - si * sw[i]
        s[i] = si * cw[i] + ci * sw[i]


cdef inline void _trig_row(Py_ssize_t r, Py_ssize_t block_start, const double* pos,
                           const double* w, const double* cw, const double* sw,
                           double* c, double* s, Py_ssize_t n) noexcept nogil:
    # Fill (c, s) for row r, given that they hold row r - 1 unless r starts a block.
    if r == block_start or pos[r] - pos[r - 1] != 1.0:
        _trig_anchor(pos[r], w, c, s, n)
    else:
        _trig_step(cw, sw, c, s, n)


cdef inline void _step_tables(const double* w, double* cw, double* sw, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        cw[i] = cos(w[i])
        sw[i] = sin(w[i])


cdef inline void _emit_cos_sin(const double* c, const double* s, double scale,
                               data_t* cos_row, data_t* sin_row, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        cos_row[i] = <data_t>(c[i] * scale)
        sin_row[i] = <data_t>(s[i] * scale)


cdef inline void _emit_interleaved(const double* c, const double* s, data_t* row,
                                   Py_ssize_t dim) noexcept nogil:
    # row[2i] = sin, row[2i+1] = cos; an odd dim ends with the sin of the last pair.
    cdef Py_ssize_t i, npairs = dim // 2
    for i in range(npairs):
        row[2 * i] = <data_t>s[i]
        row[2 * i + 1] = <data_t>c[i]
    if dim & 1:
        row[dim - 1] = <data_t>s[npairs]


cdef inline void _emit_split(const double* c, const double* s, data_t* row,
                             Py_ssize_t dim) noexcept nogil:
    # All ceil(dim/2) sin columns, then the dim//2 cos columns.
    cdef Py_ssize_t i, nsin = dim - dim // 2
    for i in range(nsin):
        row[i] = <data_t>s[i]
    for i in range(dim // 2):
        row[nsin + i] = <data_t>c[i]


def cos_sin_rows(const double[::1] positions, const double[::1] freqs, double scale,
                 data_t[:, ::1] cos_out, data_t[:, ::1] sin_out, double[:, ::1] work,
                 int num_threads):
    """cos_out[r, i] = scale*cos(positions[r]*freqs[i]); sin_out likewise.

    `work` has shape (2 + 2*num_threads, len(freqs)).
    """
    cdef Py_ssize_t nrows = positions.shape[0], n = freqs.shape[0]
    cdef Py_ssize_t nblocks = (nrows + ANCHOR_ROWS - 1) // ANCHOR_ROWS
    cdef Py_ssize_t b, r, r0, r1
    cdef double* c
    cdef double* s
    if nrows == 0 or n == 0:
        return
    with nogil:
        _step_tables(&freqs[0], &work[0, 0], &work[1, 0], n)
        for b in prange(nblocks, num_threads=num_threads, schedule="static"):
            c = &work[2 + 2 * threadid(), 0]
            s = &work[3 + 2 * threadid(), 0]
            r0 = b * ANCHOR_ROWS
            r1 = min(r0 + ANCHOR_ROWS, nrows)
            for r in range(r0, r1):
                _trig_row(r, r0, &positions[0], &freqs[0], &work[0, 0], &work[1, 0], c, s, n)
                _emit_cos_sin(c, s, scale, &cos_out[r, 0], &sin_out[r, 0], n)


def sinusoidal_rows(const double[::1] positions, const double[::1] freqs, data_t[:, ::1] out,
                    bint split, double[:, ::1] work, int num_threads):
    """out[r] = the sinusoidal encoding of positions[r] (len(freqs) == ceil(dim/2)).

    `work` has shape (2 + 2*num_threads, len(freqs)).
    """
    cdef Py_ssize_t nrows = positions.shape[0], n = freqs.shape[0], dim = out.shape[1]
    cdef Py_ssize_t nblocks = (nrows + ANCHOR_ROWS - 1) // ANCHOR_ROWS
    cdef Py_ssize_t b, r, r0, r1
    cdef double* c
    cdef double* s
    if nrows == 0 or n == 0:
        return
    with nogil:
        _step_tables(&freqs[0], &work[0, 0], &work[1, 0], n)
        for b in prange(nblocks, num_threads=num_threads, schedule="static"):
            c = &work[2 + 2 * threadid(), 0]
            s = &work[3 + 2 * threadid(), 0]
            r0 = b * ANCHOR_ROWS
            r1 = min(r0 + ANCHOR_ROWS, nrows)
            for r in range(r0, r1):
                _trig_row(r, r0, &positions[0], &freqs[0], &work[0, 0], &work[1, 0], c, s, n)
                if split:
                    _emit_split(c, s, &out[r, 0], dim)
                else:
                    _emit_interleaved(c, s, &out[r, 0], dim)


# ---------------------------------------------------------------------------
# rotation of rows by a cos/sin table
#
# Each row function copies a chunk of the pairs into local arrays before it
# writes, so the same code is correct in place (out == x) and the compiler
# can vectorise the arithmetic without runtime alias checks.  Arithmetic runs
# in the wider of data_t and table_t (C's usual promotion), rounded once.

cdef inline void _rotate_half(const data_t* x, data_t* out, const table_t* c, const table_t* s,
                              Py_ssize_t npairs, bint inverse) noexcept nogil:
    # Pair i is (x[i], x[i + npairs]).
    cdef data_t a[POSENC_CHUNK]
    cdef data_t b[POSENC_CHUNK]
    cdef Py_ssize_t i0 = 0, i, m
    while i0 < npairs:
        m = min(<Py_ssize_t>POSENC_CHUNK, npairs - i0)
        memcpy(a, x + i0, m * sizeof(data_t))
        memcpy(b, x + npairs + i0, m * sizeof(data_t))
        if inverse:
            for i in range(m):
                out[i0 + i] = <data_t>(a[i] * c[i0 + i] + b[i] * s[i0 + i])
                out[npairs + i0 + i] = <data_t>(b[i] * c[i0 + i] - a[i] * s[i0 + i])
        else:
            for i in range(m):
                out[i0 + i] = <data_t>(a[i] * c[i0 + i] - b[i] * s[i0 + i])
                out[npairs + i0 + i] = <data_t>(b[i] * c[i0 + i] + a[i] * s[i0 + i])
        i0 += m


cdef inline void _rotate_interleaved(const data_t* x, data_t* out, const table_t* c,
                                     const table_t* s, Py_ssize_t npairs,
                                     bint inverse) noexcept nogil:
    # Pair i is (x[2i], x[2i + 1]).
    cdef data_t v[2 * POSENC_CHUNK]
    cdef Py_ssize_t i0 = 0, i, m
    while i0 < npairs:
        m = min(<Py_ssize_t>POSENC_CHUNK, npairs - i0)
        memcpy(v, x + 2 * i0, 2 * m * sizeof(data_t))
        if inverse:
            for i in range(m):
                out[2 * (i0 + i)] = <data_t>(v[2 * i] * c[i0 + i] + v[2 * i + 1] * s[i0 + i])
                out[2 * (i0 + i) + 1] = <data_t>(v[2 * i + 1] * c[i0 + i] - v[2 * i] * s[i0 + i])
        else:
            for i in range(m):
                out[2 * (i0 + i)] = <data_t>(v[2 * i] * c[i0 + i] - v[2 * i + 1] * s[i0 + i])
                out[2 * (i0 + i) + 1] = <data_t>(v[2 * i + 1] * c[i0 + i] + v[2 * i] * s[i0 + i])
        i0 += m


def rotate_rows(const data_t[:, ::1] x, data_t[:, ::1] out,
                const table_t[:, :] cos_table, const table_t[:, :] sin_table,
                const Py_ssize_t[::1] row_table, bint half_layout, bint inverse,
                int num_threads):
    """Rotate every row r of x by table row row_table[r]; write to out.

    The first 2*cos_table.shape[1] features rotate (pairs by `half_layout`),
    the rest are copied.  cos/sin tables need unit stride along their last
    axis; their row stride is free.  `out` may be `x` (in place).
    """
    cdef Py_ssize_t nrows = x.shape[0], dim = x.shape[1], npairs = cos_table.shape[1]
    cdef Py_ssize_t rot = 2 * npairs, r, t
    cdef Py_ssize_t cstride = cos_table.strides[0] // <Py_ssize_t>sizeof(table_t)
    cdef Py_ssize_t sstride = sin_table.strides[0] // <Py_ssize_t>sizeof(table_t)
    cdef const table_t* cbase
    cdef const table_t* sbase
    cdef bint in_place
    if nrows == 0 or dim == 0:
        return
    in_place = &x[0, 0] == &out[0, 0]
    cbase = &cos_table[0, 0] if npairs > 0 else NULL
    sbase = &sin_table[0, 0] if npairs > 0 else NULL
    with nogil:
        for r in prange(nrows, num_threads=num_threads, schedule="static"):
            t = row_table[r]
            if npairs > 0:
                if half_layout:
                    _rotate_half(&x[r, 0], &out[r, 0], cbase + t * cstride, sbase + t * sstride,
                                 npairs, inverse)
                else:
                    _rotate_interleaved(&x[r, 0], &out[r, 0], cbase + t * cstride,
                                        sbase + t * sstride, npairs, inverse)
            if rot < dim and not in_place:
                memcpy(&out[r, rot], &x[r, rot], (dim - rot) * sizeof(data_t))


# ---------------------------------------------------------------------------
# adding a table row to every row (sinusoidal and learned absolute positions)

def add_table_rows(const data_t[:, ::1] x, data_t[:, ::1] out, const table_t[:, :] table,
                   const Py_ssize_t[::1] row_table, int num_threads):
    """out[r] = x[r] + table[row_table[r]], in the wider dtype, rounded once.

    `table` needs unit stride along its last axis; `out` may be `x`.
    """
    cdef Py_ssize_t nrows = x.shape[0], dim = x.shape[1], r, i
    cdef Py_ssize_t tstride = table.strides[0] // <Py_ssize_t>sizeof(table_t)
    cdef const table_t* tbase
    cdef const table_t* trow
    cdef const data_t* xrow
    cdef data_t* orow
    if nrows == 0 or dim == 0:
        return
    tbase = &table[0, 0]
    with nogil:
        for r in prange(nrows, num_threads=num_threads, schedule="static"):
            xrow = &x[r, 0]
            orow = &out[r, 0]
            trow = tbase + row_table[r] * tstride
            for i in range(dim):
                orow[i] = <data_t>(xrow[i] + trow[i])
