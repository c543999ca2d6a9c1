# The hot loops of posenc_fast, included by every _kernels_<variant>.pyx so
# that the same source is compiled once per instruction set (see setup.py).
#
# Kernels trust their inputs: the Python layer has already checked dtypes,
# shapes, contiguity, ranges and aliasing, and allocated every output.  They
# never raise, never allocate and run without the GIL.
#
# Angles are formed in double precision, exactly (see the trig section): a
# cos/sin value depends only on the position and the frequency, never on the
# call, the row or the number of threads.

from cython.parallel cimport prange, threadid
from libc.math cimport sin, cos, fma, floor, fabs
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
    #define POSENC_ROW_CHUNK 256
    #define POSENC_STREAM_BYTES (16 * 1024 * 1024)
    #define POSENC_PREFETCH_BYTES (1024 * 1024)
    #define POSENC_PREFETCH_DISTANCE 8192
    #if defined(__GNUC__) || defined(__clang__)
    #define POSENC_R __restrict__
    #define POSENC_ALWAYS_INLINE static inline __attribute__((always_inline))
    #define POSENC_PREFETCH_LINE(address) __builtin_prefetch((const void*)(address), 0, 3)
    #else
    #define POSENC_R __restrict
    #define POSENC_ALWAYS_INLINE static __forceinline
    #if defined(_M_X64) || defined(_M_IX86)
    #include <xmmintrin.h>
    #define POSENC_PREFETCH_LINE(address) _mm_prefetch((const char*)(address), _MM_HINT_T0)
    #else
    #define POSENC_PREFETCH_LINE(address) ((void)0)
    #endif
    #endif
    #include <stdint.h>
    /* Asks for the cache lines POSENC_PREFETCH_DISTANCE bytes past
       [p, p + nbytes).  A row of pairs (x[i], x[i + n]) is read as two
       interleaved streams, which the hardware prefetchers follow poorly
       (float64 rows ran at half the memory bandwidth); reading ahead of
       the row restores it.  Integer arithmetic: the address may lie past
       the array, and a prefetch never faults. */
    static inline void posenc_prefetch_ahead(const void* p, Py_ssize_t nbytes) {
        uintptr_t ahead = (uintptr_t)p + POSENC_PREFETCH_DISTANCE;
        for (Py_ssize_t k = 0; k < nbytes; k += 64) POSENC_PREFETCH_LINE(ahead + k);
    }
    """
    int POSENC_OPENMP
    const char* POSENC_SIMD
    # Rows per parallel work item of the general rotation kernel.
    enum: ROW_CHUNK "POSENC_ROW_CHUNK"
    # Results at least this large are written with non-temporal stores.
    enum: STREAM_BYTES "POSENC_STREAM_BYTES"
    # Inputs at least this large (past the caches) are prefetched ahead of each row.
    enum: PREFETCH_BYTES "POSENC_PREFETCH_BYTES"
    void posenc_prefetch_ahead(const void* p, Py_ssize_t nbytes) nogil


def openmp_enabled():
    """Return True if this module was compiled with OpenMP."""
    return bool(POSENC_OPENMP)


def simd_level():
    """Return the widest SIMD instruction set this module was compiled for."""
    return POSENC_SIMD.decode()


# ---------------------------------------------------------------------------
# sin/cos of position * frequency, row by row
#
# The value for an integer position k is canonical: a function of k and the
# frequency only, whatever call, row or thread computes it.  With
# k2 = k rounded down to a multiple of 1024 and k1 = k rounded down to a
# multiple of 32, it is the exact cos/sin at k2, rotated (k1-k2)/32 times by
# 32w, then k-k1 times by w: at most 62 rotations (error ~1e-14).  Rows of
# consecutive positions get there incrementally, one rotation per row, so
# libm runs on one row in 1024.  Non-integer positions get exact values.

cdef struct TrigSteps:
    const double* w      # frequencies (n)
    double* c1           # cos/sin of w: one position
    double* s1
    double* c32          # cos/sin of 32*w: one 32-row block
    double* s32
    Py_ssize_t n

cdef struct TrigState:
    double* c            # cos/sin of the current position
    double* s
    double* ca           # cos/sin at the current position's multiple of 32
    double* sa
    double last          # the position (c, s) hold, if `valid`
    bint valid

cdef extern from *:
    """
    #define POSENC_TRIG_SHARED_ROWS 4
    #define POSENC_TRIG_THREAD_ROWS 4
    #define POSENC_TRIG_CHUNK_ROWS 512
    #define POSENC_MAX_EXACT_INTEGER 4503599627370496.0
    #define POSENC_SMALL_ANGLE_ERROR 7.450580596923828e-09
    """
    # Work rows: 4 shared (c1, s1, c32, s32) + 4 per thread (c, s, ca, sa).
    enum: TRIG_SHARED_ROWS "POSENC_TRIG_SHARED_ROWS"
    enum: TRIG_THREAD_ROWS "POSENC_TRIG_THREAD_ROWS"
    # Rows per parallel work item of the table kernels.
    enum: TRIG_CHUNK_ROWS "POSENC_TRIG_CHUNK_ROWS"
    # 2**52: integers up to it are exact in float64, with room for +1.
    double MAX_EXACT_INTEGER "POSENC_MAX_EXACT_INTEGER"
    # 2**-27: the largest rounding error of p*w that _exact corrects to first order.
    double SMALL_ANGLE_ERROR "POSENC_SMALL_ANGLE_ERROR"


def trig_work_rows(int num_threads):
    """Rows of the float64 scratch array the trig kernels need for `num_threads`."""
    return TRIG_SHARED_ROWS + TRIG_THREAD_ROWS * num_threads


cdef inline void _exact(double p, const double* w, double* c, double* s,
                        Py_ssize_t n) noexcept nogil:
    # cos/sin of the exact product p*w[i] = hi + lo (fma gives the rounding
    # error lo exactly): sin(hi + lo) = sin(hi) + lo*cos(hi), off by lo**2/2
    # < 2**-55 while |lo| <= 2**-27 (angles below ~2**26).  Past that (lo
    # reaches 1 and more at angles beyond 2**53) the full angle-addition
    # formula keeps the values exact and within [-1, 1].
    cdef Py_ssize_t i
    cdef double hi, lo, ch, sh, cl, sl
    for i in range(n):
        hi = p * w[i]
        lo = fma(p, w[i], -hi)
        ch = cos(hi)
        sh = sin(hi)
        if fabs(lo) <= SMALL_ANGLE_ERROR:
            c[i] = ch - lo * sh
            s[i] = sh + lo * ch
        else:
            cl = cos(lo)
            sl = sin(lo)
            c[i] = ch * cl - sh * sl
            s[i] = sh * cl + ch * sl


cdef inline void _rotate_by(double* c, double* s, const double* rc, const double* rs,
                            Py_ssize_t n) noexcept nogil:
    # (c, s) <- (c, s) rotated by the angle whose cos/sin are (rc, rs).
    cdef Py_ssize_t i
    cdef double ci, si
    for i in range(n):
        ci = c[i]
        si = s[i]
        c[i] = ci * rc[i] - si * rs[i]
        s[i] = si * rc[i] + ci * rs[i]


cdef inline void _trig_steps_init(TrigSteps* steps, const double* w, double* work,
                                  Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    steps.w = w
    steps.n = n
    steps.c1 = work
    steps.s1 = work + n
    steps.c32 = work + 2 * n
    steps.s32 = work + 3 * n
    for i in range(n):
        steps.c1[i] = cos(w[i])
        steps.s1[i] = sin(w[i])
        steps.c32[i] = cos(32.0 * w[i])  # 32*w is exact
        steps.s32[i] = sin(32.0 * w[i])


cdef inline TrigState _trig_state(double* work, Py_ssize_t n) noexcept nogil:
    # Returned by value so that, assigned inside prange, it is thread-private.
    cdef TrigState state
    state.c = work
    state.s = work + n
    state.ca = work + 2 * n
    state.sa = work + 3 * n
    state.valid = False
    state.last = 0.0
    return state


cdef inline void _canonical_from_scratch(long long k, const TrigSteps* steps,
                                         TrigState* state) noexcept nogil:
    cdef Py_ssize_t n = steps.n
    cdef long long j
    _exact(<double>(k - (k & 1023)), steps.w, state.ca, state.sa, n)
    for j in range((k & 1023) >> 5):
        _rotate_by(state.ca, state.sa, steps.c32, steps.s32, n)
    memcpy(state.c, state.ca, n * sizeof(double))
    memcpy(state.s, state.sa, n * sizeof(double))
    for j in range(k & 31):
        _rotate_by(state.c, state.s, steps.c1, steps.s1, n)


cdef inline void _trig_position(double p, const TrigSteps* steps, TrigState* state) noexcept nogil:
    # Fill state.c / state.s for position p, reusing the previous position's values.
    cdef long long k
    cdef Py_ssize_t n = steps.n
    if p == floor(p) and fabs(p) <= MAX_EXACT_INTEGER:
        k = <long long>p
        if state.valid and p == state.last + 1.0:
            if (k & 31) != 0:
                _rotate_by(state.c, state.s, steps.c1, steps.s1, n)
            else:
                if (k & 1023) == 0:
                    _exact(p, steps.w, state.ca, state.sa, n)
                else:
                    _rotate_by(state.ca, state.sa, steps.c32, steps.s32, n)
                memcpy(state.c, state.ca, n * sizeof(double))
                memcpy(state.s, state.sa, n * sizeof(double))
        else:
            _canonical_from_scratch(k, steps, state)
        state.valid = True
    else:
        _exact(p, steps.w, state.c, state.s, n)
        state.valid = False
    state.last = p


# A row that follows its predecessor by one position and is not a multiple
# of 32 is a single rotation by w; these C loops fuse that rotation with the
# store of the row (one pass over the state instead of two).

cdef extern from *:
    r"""
    #define POSENC_STEP(i)                                                               \
        double ci = c[i], si = s[i];                                                     \
        double nc = ci * c1[i] - si * s1[i], ns = si * c1[i] + ci * s1[i];               \
        c[i] = nc;                                                                       \
        s[i] = ns;
    #define POSENC_STEP_EMIT_FUNCTIONS(T, SFX)                                           \
    static void posenc_step_cos_sin_##SFX(double* POSENC_R c, double* POSENC_R s,      \
            const double* POSENC_R c1, const double* POSENC_R s1, double scale,        \
            T* POSENC_R co, T* POSENC_R so, Py_ssize_t n) {                            \
        if (scale == 1.0) {                                                              \
            for (Py_ssize_t i = 0; i < n; i++) { POSENC_STEP(i) co[i] = (T)nc; so[i] = (T)ns; } \
        } else {                                                                         \
            for (Py_ssize_t i = 0; i < n; i++) {                                         \
                POSENC_STEP(i) co[i] = (T)(nc * scale); so[i] = (T)(ns * scale);         \
            }                                                                            \
        }                                                                                \
    }                                                                                    \
    static void posenc_step_interleaved_##SFX(double* POSENC_R c, double* POSENC_R s,  \
            const double* POSENC_R c1, const double* POSENC_R s1, T* POSENC_R row,    \
            Py_ssize_t dim) {                                                            \
        Py_ssize_t npairs = dim / 2;                                                     \
        for (Py_ssize_t i = 0; i < npairs; i++) {                                        \
            POSENC_STEP(i) row[2 * i] = (T)ns; row[2 * i + 1] = (T)nc;                   \
        }                                                                                \
        if (dim & 1) { POSENC_STEP(npairs) row[dim - 1] = (T)ns; (void)nc; }             \
    }                                                                                    \
    static void posenc_step_split_##SFX(double* POSENC_R c, double* POSENC_R s,        \
            const double* POSENC_R c1, const double* POSENC_R s1, T* POSENC_R row,    \
            Py_ssize_t dim) {                                                            \
        Py_ssize_t npairs = dim / 2, nsin = dim - dim / 2;                               \
        T* POSENC_R cos_part = row + nsin;                                              \
        for (Py_ssize_t i = 0; i < npairs; i++) {                                        \
            POSENC_STEP(i) row[i] = (T)ns; cos_part[i] = (T)nc;                          \
        }                                                                                \
        if (dim & 1) { POSENC_STEP(npairs) row[npairs] = (T)ns; (void)nc; }              \
    }

    POSENC_STEP_EMIT_FUNCTIONS(float, f)
    POSENC_STEP_EMIT_FUNCTIONS(double, d)
    """
    void posenc_step_cos_sin_f(double* c, double* s, const double* c1, const double* s1,
                               double scale, float* co, float* so, Py_ssize_t n) nogil
    void posenc_step_cos_sin_d(double* c, double* s, const double* c1, const double* s1,
                               double scale, double* co, double* so, Py_ssize_t n) nogil
    void posenc_step_interleaved_f(double* c, double* s, const double* c1, const double* s1,
                                   float* row, Py_ssize_t dim) nogil
    void posenc_step_interleaved_d(double* c, double* s, const double* c1, const double* s1,
                                   double* row, Py_ssize_t dim) nogil
    void posenc_step_split_f(double* c, double* s, const double* c1, const double* s1,
                             float* row, Py_ssize_t dim) nogil
    void posenc_step_split_d(double* c, double* s, const double* c1, const double* s1,
                             double* row, Py_ssize_t dim) nogil


cdef inline bint _next_in_block(const TrigState* state, double p) noexcept nogil:
    # True if p is one past the previous integer position and not a multiple of 32.
    return state.valid and p == state.last + 1.0 and ((<long long>p) & 31) != 0


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


cdef inline void _step_sinusoidal(TrigState* state, const TrigSteps* steps, data_t* row,
                                  Py_ssize_t dim, bint split) noexcept nogil:
    if data_t is float:
        if split:
            posenc_step_split_f(state.c, state.s, steps.c1, steps.s1, row, dim)
        else:
            posenc_step_interleaved_f(state.c, state.s, steps.c1, steps.s1, row, dim)
    else:
        if split:
            posenc_step_split_d(state.c, state.s, steps.c1, steps.s1, row, dim)
        else:
            posenc_step_interleaved_d(state.c, state.s, steps.c1, steps.s1, row, dim)


def cos_sin_rows(const double[::1] positions, const double[::1] freqs, double scale,
                 data_t[:, :] cos_out, data_t[:, :] sin_out, double[:, ::1] work,
                 int num_threads):
    """cos_out[r, i] = scale*cos(positions[r]*freqs[i]); sin_out likewise.

    The outputs need unit stride along their last axis; their row stride is
    free.  `work` has shape (trig_work_rows(num_threads), len(freqs)).
    """
    cdef Py_ssize_t nrows = positions.shape[0], n = freqs.shape[0]
    cdef Py_ssize_t nchunks = (nrows + TRIG_CHUNK_ROWS - 1) // TRIG_CHUNK_ROWS
    cdef Py_ssize_t b, r
    cdef TrigSteps steps
    cdef TrigState state
    if nrows == 0 or n == 0:
        return
    with nogil:
        _trig_steps_init(&steps, &freqs[0], &work[0, 0], n)
        for b in prange(nchunks, num_threads=num_threads, schedule="static"):
            state = _trig_state(&work[TRIG_SHARED_ROWS + TRIG_THREAD_ROWS * threadid(), 0], n)
            for r in range(b * TRIG_CHUNK_ROWS, min((b + 1) * TRIG_CHUNK_ROWS, nrows)):
                if _next_in_block(&state, positions[r]):
                    if data_t is float:
                        posenc_step_cos_sin_f(state.c, state.s, steps.c1, steps.s1, scale,
                                              &cos_out[r, 0], &sin_out[r, 0], n)
                    else:
                        posenc_step_cos_sin_d(state.c, state.s, steps.c1, steps.s1, scale,
                                              &cos_out[r, 0], &sin_out[r, 0], n)
                    state.last = positions[r]
                else:
                    _trig_position(positions[r], &steps, &state)
                    _emit_cos_sin(state.c, state.s, scale, &cos_out[r, 0], &sin_out[r, 0], n)


def sinusoidal_rows(const double[::1] positions, const double[::1] freqs, data_t[:, ::1] out,
                    bint split, double[:, ::1] work, int num_threads):
    """out[r] = the sinusoidal encoding of positions[r] (len(freqs) == ceil(dim/2)).

    `work` has shape (trig_work_rows(num_threads), len(freqs)).
    """
    cdef Py_ssize_t nrows = positions.shape[0], n = freqs.shape[0], dim = out.shape[1]
    cdef Py_ssize_t nchunks = (nrows + TRIG_CHUNK_ROWS - 1) // TRIG_CHUNK_ROWS
    cdef Py_ssize_t b, r
    cdef TrigSteps steps
    cdef TrigState state
    if nrows == 0 or n == 0:
        return
    with nogil:
        _trig_steps_init(&steps, &freqs[0], &work[0, 0], n)
        for b in prange(nchunks, num_threads=num_threads, schedule="static"):
            state = _trig_state(&work[TRIG_SHARED_ROWS + TRIG_THREAD_ROWS * threadid(), 0], n)
            for r in range(b * TRIG_CHUNK_ROWS, min((b + 1) * TRIG_CHUNK_ROWS, nrows)):
                if _next_in_block(&state, positions[r]):
                    _step_sinusoidal(&state, &steps, &out[r, 0], dim, split)
                    state.last = positions[r]
                else:
                    _trig_position(positions[r], &steps, &state)
                    if split:
                        _emit_split(state.c, state.s, &out[r, 0], dim)
                    else:
                        _emit_interleaved(state.c, state.s, &out[r, 0], dim)


# ---------------------------------------------------------------------------
# rotation of rows by a cos/sin table
#
# The row functions are C, for `restrict` (no overlap tests in front of the
# vector loops) and for constant-size copies of the loop at the common pair
# counts 32 and 64 (no remainder loops: a row is only a few vectors long).
# Arithmetic runs in the wider of the data type T and the table type C
# (C's usual promotion), rounded once to T.  In place has its own functions:
# `restrict` must not promise that the input and output do not overlap.
#
# Rows of one type go through explicit vectors first (see
# posenc_half_vectors); the pairs past the last full vector, and rows that
# mix float and double, through the scalar loops.  The interleaved scalar
# loop goes through local arrays: de-interleave, rotate, re-interleave.  As
# one loop, GCC 12 turns the alternating -/+ into vfmaddsub, a fused
# multiply-add that -ffp-contract=off does not stop, and the AVX variants
# would no longer round like the baseline.  (The vectors compute the firsts
# and the seconds of the pairs as separate vectors: no alternation.)
#
# The *_stream functions write with non-temporal stores, for results larger
# than the caches (see _row_flags); the caller issues posenc_sfence().

cdef extern from *:
    r"""
    /* Non-temporal stores: a large out-of-place result goes to memory without
       being read into the cache first (as memcpy does above its threshold).
       posenc_sfence() orders them before the kernel returns. */
    #if defined(__SSE2__) || defined(_M_X64)
    #include <emmintrin.h>
    #include <stdint.h>
    static inline void posenc_stream_float(float* dst, const float* src, Py_ssize_t n) {
        Py_ssize_t i = 0;
        for (; i < n && ((uintptr_t)(dst + i) & 15); i++) dst[i] = src[i];
        for (; i + 4 <= n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
        for (; i < n; i++) dst[i] = src[i];
    }
    static inline void posenc_stream_double(double* dst, const double* src, Py_ssize_t n) {
        Py_ssize_t i = 0;
        for (; i < n && ((uintptr_t)(dst + i) & 15); i++) dst[i] = src[i];
        for (; i + 2 <= n; i += 2) _mm_stream_pd(dst + i, _mm_loadu_pd(src + i));
        for (; i < n; i++) dst[i] = src[i];
    }
    static inline void posenc_sfence(void) { _mm_sfence(); }
    #else
    static inline void posenc_stream_float(float* dst, const float* src, Py_ssize_t n) {
        memcpy(dst, src, n * sizeof(float));
    }
    static inline void posenc_stream_double(double* dst, const double* src, Py_ssize_t n) {
        memcpy(dst, src, n * sizeof(double));
    }
    static inline void posenc_sfence(void) {}
    #endif

    /* Rows of one type T (data and table) in cache go through explicit
       vectors, each of x's pairs, c[i], s[i] loaded once into a register.  Left
       to itself GCC folds c[i] and s[i] into both multiplications that use
       them, 6 loads per vector of pairs instead of 4, and a row in cache is
       bound by its memory operations (W2, W3 ~20% slower).  Interleaved pairs
       are split into a vector of firsts and one of seconds by two shuffles, and
       merged back by two.  Past the caches the scalar half-layout loops are
       faster (W1 float64 in place 1.15x against 1.35x of np.multiply), so
       large calls take them.  The arithmetic is the scalar loop's, lane by
       lane. */
    /* x86-64 and aarch64 only: there scalar code rounds as the vector lanes
       do (32-bit x86 may compute scalars in x87 extended precision). */
    #if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__aarch64__))
    #if defined(__AVX512F__)
    #define POSENC_VECTOR_BYTES 64
    #define POSENC_MASK_ff(kind) POSENC_##kind##_16
    #define POSENC_MASK_dd(kind) POSENC_##kind##_8
    #elif defined(__AVX__)
    #define POSENC_VECTOR_BYTES 32
    #define POSENC_MASK_ff(kind) POSENC_##kind##_8
    #define POSENC_MASK_dd(kind) POSENC_##kind##_4
    #else
    #define POSENC_VECTOR_BYTES 16
    #define POSENC_MASK_ff(kind) POSENC_##kind##_4
    #define POSENC_MASK_dd(kind) POSENC_##kind##_2
    #endif
    /* Shuffle masks over two vectors of L lanes: the even and the odd lanes of
       their concatenation, and the interleaving of their low and high halves. */
    #define POSENC_EVEN_2 0, 2
    #define POSENC_ODD_2 1, 3
    #define POSENC_LOW_2 0, 2
    #define POSENC_HIGH_2 1, 3
    #define POSENC_EVEN_4 0, 2, 4, 6
    #define POSENC_ODD_4 1, 3, 5, 7
    #define POSENC_LOW_4 0, 4, 1, 5
    #define POSENC_HIGH_4 2, 6, 3, 7
    #define POSENC_EVEN_8 0, 2, 4, 6, 8, 10, 12, 14
    #define POSENC_ODD_8 1, 3, 5, 7, 9, 11, 13, 15
    #define POSENC_LOW_8 0, 8, 1, 9, 2, 10, 3, 11
    #define POSENC_HIGH_8 4, 12, 5, 13, 6, 14, 7, 15
    #define POSENC_EVEN_16 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
    #define POSENC_ODD_16 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
    #define POSENC_LOW_16 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23
    #define POSENC_HIGH_16 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31
    #if defined(__clang__)
    #define POSENC_SHUFFLE(a, b, IV, mask) __builtin_shufflevector(a, b, mask)
    #else
    #define POSENC_SHUFFLE(a, b, IV, mask) __builtin_shuffle(a, b, (IV){mask})
    #endif
    #if defined(__aarch64__)
    #define POSENC_IN_REGISTERS(a, b, c, d) __asm__("" : "+w"(a), "+w"(b), "+w"(c), "+w"(d))
    #else
    #define POSENC_IN_REGISTERS(a, b, c, d) __asm__("" : "+x"(a), "+x"(b), "+x"(c), "+x"(d))
    #endif

    #define POSENC_VECTOR_ROTATION(T, I, SFX)                                               \
    typedef T posenc_vec_##SFX                                                              \
        __attribute__((vector_size(POSENC_VECTOR_BYTES), aligned(sizeof(T)), may_alias));   \
    typedef I posenc_mask_##SFX __attribute__((vector_size(POSENC_VECTOR_BYTES)));          \
    /* Pairs 0 .. n - n % lanes - 1 of a half-layout row; returns how many.                 \
       oa may be xa, ob xb. */                                                              \
    POSENC_ALWAYS_INLINE Py_ssize_t posenc_half_vectors_##SFX(                              \
            const T* xa, const T* xb, T* oa, T* ob, const T* c, const T* s, Py_ssize_t n,   \
            int inverse) {                                                                  \
        typedef posenc_vec_##SFX V;                                                         \
        const Py_ssize_t lanes = POSENC_VECTOR_BYTES / sizeof(T);                           \
        Py_ssize_t i = 0;                                                                   \
        for (; i + lanes <= n; i += lanes) {                                                \
            V a = *(const V*)(xa + i), b = *(const V*)(xb + i);                             \
            V cv = *(const V*)(c + i), sv = *(const V*)(s + i);                             \
            POSENC_IN_REGISTERS(a, b, cv, sv);                                              \
            if (inverse) {                                                                  \
                *(V*)(oa + i) = a * cv + b * sv;                                            \
                *(V*)(ob + i) = b * cv - a * sv;                                            \
            } else {                                                                        \
                *(V*)(oa + i) = a * cv - b * sv;                                            \
                *(V*)(ob + i) = b * cv + a * sv;                                            \
            }                                                                               \
        }                                                                                   \
        return i;                                                                           \
    }                                                                                       \
    /* The same for an interleaved row; out may be x. */                                    \
    POSENC_ALWAYS_INLINE Py_ssize_t posenc_interleaved_vectors_##SFX(                       \
            const T* x, T* out, const T* c, const T* s, Py_ssize_t n, int inverse) {        \
        typedef posenc_vec_##SFX V;                                                         \
        typedef posenc_mask_##SFX M;                                                        \
        const Py_ssize_t lanes = POSENC_VECTOR_BYTES / sizeof(T);                           \
        Py_ssize_t i = 0;                                                                   \
        for (; i + lanes <= n; i += lanes) {                                                \
            V low = *(const V*)(x + 2 * i), high = *(const V*)(x + 2 * i + lanes);          \
            V cv = *(const V*)(c + i), sv = *(const V*)(s + i), a, b, ra, rb;               \
            POSENC_IN_REGISTERS(low, high, cv, sv);                                         \
            a = POSENC_SHUFFLE(low, high, M, POSENC_MASK_##SFX(EVEN));                      \
            b = POSENC_SHUFFLE(low, high, M, POSENC_MASK_##SFX(ODD));                       \
            if (inverse) {                                                                  \
                ra = a * cv + b * sv;                                                       \
                rb = b * cv - a * sv;                                                       \
            } else {                                                                        \
                ra = a * cv - b * sv;                                                       \
                rb = b * cv + a * sv;                                                       \
            }                                                                               \
            *(V*)(out + 2 * i) = POSENC_SHUFFLE(ra, rb, M, POSENC_MASK_##SFX(LOW));         \
            *(V*)(out + 2 * i + lanes) = POSENC_SHUFFLE(ra, rb, M, POSENC_MASK_##SFX(HIGH)); \
        }                                                                                   \
        return i;                                                                           \
    }
    #else
    #define POSENC_VECTOR_ROTATION(T, I, SFX)                                               \
    POSENC_ALWAYS_INLINE Py_ssize_t posenc_half_vectors_##SFX(                              \
            const T* xa, const T* xb, T* oa, T* ob, const T* c, const T* s, Py_ssize_t n,   \
            int inverse) {                                                                  \
        return 0;                                                                           \
    }                                                                                       \
    POSENC_ALWAYS_INLINE Py_ssize_t posenc_interleaved_vectors_##SFX(                       \
            const T* x, T* out, const T* c, const T* s, Py_ssize_t n, int inverse) {        \
        return 0;                                                                           \
    }
    #endif
    POSENC_VECTOR_ROTATION(float, int32_t, ff)
    POSENC_VECTOR_ROTATION(double, int64_t, dd)
    /* Mixed types convert to the wider one: scalar loops only. */
    #define posenc_interleaved_vectors_fd(x, out, c, s, n, inverse) ((Py_ssize_t)0)
    #define posenc_interleaved_vectors_df(x, out, c, s, n, inverse) ((Py_ssize_t)0)


    #define POSENC_ROTATE_FUNCTIONS(T, C, SFX)                                              \
    /* Pairs first .. n-1 of a half-layout row, scalar (GCC vectorises it). */              \
    POSENC_ALWAYS_INLINE void posenc_half_body_##SFX(                                       \
            const T* POSENC_R xa, const T* POSENC_R xb, T* POSENC_R oa, T* POSENC_R ob,     \
            const C* POSENC_R c, const C* POSENC_R s, Py_ssize_t first, Py_ssize_t n,       \
            int inverse) {                                                                  \
        if (inverse) {                                                                      \
            for (Py_ssize_t i = first; i < n; i++) {                                        \
                T a = xa[i], b = xb[i];                                                     \
                oa[i] = (T)(a * c[i] + b * s[i]);                                           \
                ob[i] = (T)(b * c[i] - a * s[i]);                                           \
            }                                                                               \
        } else {                                                                            \
            for (Py_ssize_t i = first; i < n; i++) {                                        \
                T a = xa[i], b = xb[i];                                                     \
                oa[i] = (T)(a * c[i] - b * s[i]);                                           \
                ob[i] = (T)(b * c[i] + a * s[i]);                                           \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
    POSENC_ALWAYS_INLINE void posenc_half_in_place_body_##SFX(                              \
            T* POSENC_R xa, T* POSENC_R xb, const C* POSENC_R c, const C* POSENC_R s,       \
            Py_ssize_t first, Py_ssize_t n, int inverse) {                                  \
        if (inverse) {                                                                      \
            for (Py_ssize_t i = first; i < n; i++) {                                        \
                T a = xa[i], b = xb[i];                                                     \
                xa[i] = (T)(a * c[i] + b * s[i]);                                           \
                xb[i] = (T)(b * c[i] - a * s[i]);                                           \
            }                                                                               \
        } else {                                                                            \
            for (Py_ssize_t i = first; i < n; i++) {                                        \
                T a = xa[i], b = xb[i];                                                     \
                xa[i] = (T)(a * c[i] - b * s[i]);                                           \
                xb[i] = (T)(b * c[i] + a * s[i]);                                           \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
    POSENC_ALWAYS_INLINE void posenc_interleaved_body_##SFX(                                \
            const T* x, T* out, const C* POSENC_R c, const C* POSENC_R s, Py_ssize_t n,     \
            int inverse) {                                                                  \
        T a[64], b[64], ra[64], rb[64];                                                     \
        for (Py_ssize_t i0 = 0; i0 < n; i0 += 64) {                                         \
            Py_ssize_t m = n - i0 < 64 ? n - i0 : 64;                                       \
            for (Py_ssize_t i = 0; i < m; i++) {                                            \
                a[i] = x[2 * (i0 + i)];                                                     \
                b[i] = x[2 * (i0 + i) + 1];                                                 \
            }                                                                               \
            if (inverse) {                                                                  \
                for (Py_ssize_t i = 0; i < m; i++) {                                        \
                    ra[i] = (T)(a[i] * c[i0 + i] + b[i] * s[i0 + i]);                       \
                    rb[i] = (T)(b[i] * c[i0 + i] - a[i] * s[i0 + i]);                       \
                }                                                                           \
            } else {                                                                        \
                for (Py_ssize_t i = 0; i < m; i++) {                                        \
                    ra[i] = (T)(a[i] * c[i0 + i] - b[i] * s[i0 + i]);                       \
                    rb[i] = (T)(b[i] * c[i0 + i] + a[i] * s[i0 + i]);                       \
                }                                                                           \
            }                                                                               \
            for (Py_ssize_t i = 0; i < m; i++) {                                            \
                out[2 * (i0 + i)] = ra[i];                                                  \
                out[2 * (i0 + i) + 1] = rb[i];                                              \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
    /* x and out do not overlap.  Constant n = 64, 32 copies first. */                      \
    static void posenc_half_##SFX(const T* x, T* out, const C* c, const C* s, Py_ssize_t n, \
                                  int inverse) {                                            \
        if (n == 64)                                                                        \
            posenc_half_body_##SFX(x, x + 64, out, out + 64, c, s, 0, 64, inverse);         \
        else if (n == 32)                                                                   \
            posenc_half_body_##SFX(x, x + 32, out, out + 32, c, s, 0, 32, inverse);         \
        else posenc_half_body_##SFX(x, x + n, out, out + n, c, s, 0, n, inverse);           \
    }                                                                                       \
    static void posenc_half_in_place_##SFX(T* x, const C* c, const C* s, Py_ssize_t n,      \
                                           int inverse) {                                   \
        if (n == 64) posenc_half_in_place_body_##SFX(x, x + 64, c, s, 0, 64, inverse);      \
        else if (n == 32) posenc_half_in_place_body_##SFX(x, x + 32, c, s, 0, 32, inverse); \
        else posenc_half_in_place_body_##SFX(x, x + n, c, s, 0, n, inverse);                \
    }                                                                                       \
    /* out is x or does not overlap it.  Vectors first at every size: for this              \
       layout they were faster from memory too (W1 in place 1.54x -> 1.24x). */             \
    POSENC_ALWAYS_INLINE void posenc_interleaved_row_##SFX(                                 \
            const T* x, T* out, const C* c, const C* s, Py_ssize_t n, int inverse) {        \
        Py_ssize_t first = posenc_interleaved_vectors_##SFX(x, out, c, s, n, inverse);      \
        if (first < n)                                                                      \
            posenc_interleaved_body_##SFX(x + 2 * first, out + 2 * first, c + first, s + first, \
                                          n - first, inverse);                              \
    }                                                                                       \
    static void posenc_interleaved_##SFX(const T* x, T* out, const C* c, const C* s,        \
                                         Py_ssize_t n, int inverse) {                       \
        if (n == 64) posenc_interleaved_row_##SFX(x, out, c, s, 64, inverse);               \
        else if (n == 32) posenc_interleaved_row_##SFX(x, out, c, s, 32, inverse);          \
        else posenc_interleaved_row_##SFX(x, out, c, s, n, inverse);                        \
    }                                                                                       \
    /* As posenc_half / posenc_interleaved, storing with non-temporal stores. */            \
    static void posenc_half_stream_##SFX(const T* x, T* out, const C* c, const C* s,        \
                                         Py_ssize_t n, int inverse) {                       \
        T ra[64], rb[64];                                                                   \
        for (Py_ssize_t i0 = 0; i0 < n; i0 += 64) {                                         \
            Py_ssize_t m = n - i0 < 64 ? n - i0 : 64;                                       \
            if (m == 64)                                                                    \
                posenc_half_body_##SFX(x + i0, x + n + i0, ra, rb, c + i0, s + i0, 0, 64,      \
                                   inverse);                                                \
            else                                                                            \
                posenc_half_body_##SFX(x + i0, x + n + i0, ra, rb, c + i0, s + i0, 0, m,       \
                                   inverse);                                                \
            posenc_stream_##T(out + i0, ra, m);                                             \
            posenc_stream_##T(out + n + i0, rb, m);                                         \
        }                                                                                   \
    }                                                                                       \
    static void posenc_interleaved_stream_##SFX(const T* x, T* out, const C* c, const C* s, \
                                                Py_ssize_t n, int inverse) {                \
        T pairs[128];                                                                       \
        for (Py_ssize_t i0 = 0; i0 < n; i0 += 64) {                                         \
            Py_ssize_t m = n - i0 < 64 ? n - i0 : 64;                                       \
            posenc_interleaved_row_##SFX(x + 2 * i0, pairs, c + i0, s + i0, m, inverse);    \
            posenc_stream_##T(out + 2 * i0, pairs, 2 * m);                                  \
        }                                                                                   \
    }

    POSENC_ROTATE_FUNCTIONS(float, float, ff)
    POSENC_ROTATE_FUNCTIONS(float, double, fd)
    POSENC_ROTATE_FUNCTIONS(double, float, df)
    POSENC_ROTATE_FUNCTIONS(double, double, dd)

    /* Half-layout rows of one type through explicit vectors, for rows in cache. */
    #define POSENC_HALF_VECTOR_FUNCTIONS(T, SFX)                                            \
    POSENC_ALWAYS_INLINE void posenc_half_vec_row_##SFX(                                    \
            const T* x, T* out, const T* c, const T* s, Py_ssize_t n, int inverse) {        \
        Py_ssize_t first = posenc_half_vectors_##SFX(x, x + n, out, out + n, c, s, n, inverse); \
        posenc_half_body_##SFX(x, x + n, out, out + n, c, s, first, n, inverse);            \
    }                                                                                       \
    static void posenc_half_vec_##SFX(const T* x, T* out, const T* c, const T* s, Py_ssize_t n, \
                                      int inverse) {                                        \
        if (n == 64) posenc_half_vec_row_##SFX(x, out, c, s, 64, inverse);                  \
        else if (n == 32) posenc_half_vec_row_##SFX(x, out, c, s, 32, inverse);             \
        else posenc_half_vec_row_##SFX(x, out, c, s, n, inverse);                           \
    }                                                                                       \
    POSENC_ALWAYS_INLINE void posenc_half_in_place_vec_row_##SFX(                           \
            T* x, const T* c, const T* s, Py_ssize_t n, int inverse) {                      \
        Py_ssize_t first = posenc_half_vectors_##SFX(x, x + n, x, x + n, c, s, n, inverse); \
        posenc_half_in_place_body_##SFX(x, x + n, c, s, first, n, inverse);                 \
    }                                                                                       \
    static void posenc_half_in_place_vec_##SFX(T* x, const T* c, const T* s, Py_ssize_t n,  \
                                               int inverse) {                               \
        if (n == 64) posenc_half_in_place_vec_row_##SFX(x, c, s, 64, inverse);              \
        else if (n == 32) posenc_half_in_place_vec_row_##SFX(x, c, s, 32, inverse);         \
        else posenc_half_in_place_vec_row_##SFX(x, c, s, n, inverse);                       \
    }
    POSENC_HALF_VECTOR_FUNCTIONS(float, ff)
    POSENC_HALF_VECTOR_FUNCTIONS(double, dd)
    """
    void posenc_sfence() nogil
    void posenc_half_ff(const float* x, float* out, const float* c, const float* s, Py_ssize_t n,
                          int inverse) nogil
    void posenc_half_in_place_ff(float* x, const float* c, const float* s, Py_ssize_t n,
                                   int inverse) nogil
    void posenc_half_vec_ff(const float* x, float* out, const float* c, const float* s,
                            Py_ssize_t n, int inverse) nogil
    void posenc_half_in_place_vec_ff(float* x, const float* c, const float* s, Py_ssize_t n,
                                       int inverse) nogil
    void posenc_interleaved_ff(const float* x, float* out, const float* c, const float* s,
                                 Py_ssize_t n, int inverse) nogil
    void posenc_half_stream_ff(const float* x, float* out, const float* c, const float* s,
                                 Py_ssize_t n, int inverse) nogil
    void posenc_interleaved_stream_ff(const float* x, float* out, const float* c, const float* s,
                                        Py_ssize_t n, int inverse) nogil
    void posenc_half_fd(const float* x, float* out, const double* c, const double* s, Py_ssize_t n,
                          int inverse) nogil
    void posenc_half_in_place_fd(float* x, const double* c, const double* s, Py_ssize_t n,
                                   int inverse) nogil
    void posenc_interleaved_fd(const float* x, float* out, const double* c, const double* s,
                                 Py_ssize_t n, int inverse) nogil
    void posenc_half_stream_fd(const float* x, float* out, const double* c, const double* s,
                                 Py_ssize_t n, int inverse) nogil
    void posenc_interleaved_stream_fd(const float* x, float* out, const double* c, const double* s,
                                        Py_ssize_t n, int inverse) nogil
    void posenc_half_df(const double* x, double* out, const float* c, const float* s, Py_ssize_t n,
                          int inverse) nogil
    void posenc_half_in_place_df(double* x, const float* c, const float* s, Py_ssize_t n,
                                   int inverse) nogil
    void posenc_interleaved_df(const double* x, double* out, const float* c, const float* s,
                                 Py_ssize_t n, int inverse) nogil
    void posenc_half_stream_df(const double* x, double* out, const float* c, const float* s,
                                 Py_ssize_t n, int inverse) nogil
    void posenc_interleaved_stream_df(const double* x, double* out, const float* c, const float* s,
                                        Py_ssize_t n, int inverse) nogil
    void posenc_half_dd(const double* x, double* out, const double* c, const double* s, Py_ssize_t n,
                          int inverse) nogil
    void posenc_half_in_place_dd(double* x, const double* c, const double* s, Py_ssize_t n,
                                   int inverse) nogil
    void posenc_half_vec_dd(const double* x, double* out, const double* c, const double* s,
                            Py_ssize_t n, int inverse) nogil
    void posenc_half_in_place_vec_dd(double* x, const double* c, const double* s, Py_ssize_t n,
                                       int inverse) nogil
    void posenc_interleaved_dd(const double* x, double* out, const double* c, const double* s,
                                 Py_ssize_t n, int inverse) nogil
    void posenc_half_stream_dd(const double* x, double* out, const double* c, const double* s,
                                 Py_ssize_t n, int inverse) nogil
    void posenc_interleaved_stream_dd(const double* x, double* out, const double* c, const double* s,
                                        Py_ssize_t n, int inverse) nogil


cdef inline void _rotate_half(const data_t* x, data_t* out, const table_t* c, const table_t* s,
                              Py_ssize_t npairs, bint inverse, bint vectors) noexcept nogil:
    # Pair i is (x[i], x[i + npairs]); out does not overlap x.  `vectors`:
    # the explicit-vector functions, for rows in cache.
    if data_t is float and table_t is float:
        if vectors:
            posenc_half_vec_ff(x, out, c, s, npairs, inverse)
        else:
            posenc_half_ff(x, out, c, s, npairs, inverse)
    elif data_t is float:
        posenc_half_fd(x, out, c, s, npairs, inverse)
    elif table_t is float:
        posenc_half_df(x, out, c, s, npairs, inverse)
    elif vectors:
        posenc_half_vec_dd(x, out, c, s, npairs, inverse)
    else:
        posenc_half_dd(x, out, c, s, npairs, inverse)


cdef inline void _rotate_half_in_place(data_t* x, const table_t* c, const table_t* s,
                                       Py_ssize_t npairs, bint inverse,
                                       bint vectors) noexcept nogil:
    if data_t is float and table_t is float:
        if vectors:
            posenc_half_in_place_vec_ff(x, c, s, npairs, inverse)
        else:
            posenc_half_in_place_ff(x, c, s, npairs, inverse)
    elif data_t is float:
        posenc_half_in_place_fd(x, c, s, npairs, inverse)
    elif table_t is float:
        posenc_half_in_place_df(x, c, s, npairs, inverse)
    elif vectors:
        posenc_half_in_place_vec_dd(x, c, s, npairs, inverse)
    else:
        posenc_half_in_place_dd(x, c, s, npairs, inverse)


cdef inline void _rotate_half_stream(const data_t* x, data_t* out, const table_t* c,
                                     const table_t* s, Py_ssize_t npairs,
                                     bint inverse) noexcept nogil:
    if data_t is float and table_t is float:
        posenc_half_stream_ff(x, out, c, s, npairs, inverse)
    elif data_t is float:
        posenc_half_stream_fd(x, out, c, s, npairs, inverse)
    elif table_t is float:
        posenc_half_stream_df(x, out, c, s, npairs, inverse)
    else:
        posenc_half_stream_dd(x, out, c, s, npairs, inverse)


cdef inline void _rotate_interleaved_stream(const data_t* x, data_t* out, const table_t* c,
                                            const table_t* s, Py_ssize_t npairs,
                                            bint inverse) noexcept nogil:
    if data_t is float and table_t is float:
        posenc_interleaved_stream_ff(x, out, c, s, npairs, inverse)
    elif data_t is float:
        posenc_interleaved_stream_fd(x, out, c, s, npairs, inverse)
    elif table_t is float:
        posenc_interleaved_stream_df(x, out, c, s, npairs, inverse)
    else:
        posenc_interleaved_stream_dd(x, out, c, s, npairs, inverse)


cdef struct RowFlags:
    # How a call rotates its rows, from its size (see _row_flags).
    bint in_place  # out is x
    bint stream    # non-temporal stores
    bint prefetch  # ask for the lines ahead of each row
    bint vectors   # explicit-vector half-layout row functions


cdef inline RowFlags _row_flags(Py_ssize_t nbytes, bint in_place) noexcept nogil:
    # nbytes: the size of x.  Past the caches (STREAM_BYTES), a result is
    # written with non-temporal stores (never in place: those lines were just
    # read) and rows take the scalar functions, faster there; past L2
    # (PREFETCH_BYTES) each row prefetches.
    cdef RowFlags flags
    flags.in_place = in_place
    flags.stream = not in_place and nbytes >= STREAM_BYTES
    flags.prefetch = nbytes >= PREFETCH_BYTES
    flags.vectors = nbytes < STREAM_BYTES
    return flags


cdef inline void _rotate_row(const data_t* x, data_t* out, const table_t* c, const table_t* s,
                             Py_ssize_t npairs, Py_ssize_t dim, bint half, bint inverse,
                             RowFlags flags) noexcept nogil:
    # One row: the rotary pairs, then the features past 2*npairs copied.
    if flags.prefetch:
        posenc_prefetch_ahead(x, dim * <Py_ssize_t>sizeof(data_t))
    if npairs > 0:
        if half and flags.in_place:
            _rotate_half_in_place(out, c, s, npairs, inverse, flags.vectors)
        elif half and flags.stream:
            _rotate_half_stream(x, out, c, s, npairs, inverse)
        elif half:
            _rotate_half(x, out, c, s, npairs, inverse, flags.vectors)
        elif flags.stream:
            _rotate_interleaved_stream(x, out, c, s, npairs, inverse)
        else:
            _rotate_interleaved(x, out, c, s, npairs, inverse)
    if 2 * npairs < dim and not flags.in_place:
        memcpy(out + 2 * npairs, x + 2 * npairs, (dim - 2 * npairs) * sizeof(data_t))


cdef inline void _rotate_interleaved(const data_t* x, data_t* out, const table_t* c,
                                     const table_t* s, Py_ssize_t npairs,
                                     bint inverse) noexcept nogil:
    # Pair i is (x[2i], x[2i + 1]); out is x or does not overlap it.
    if data_t is float and table_t is float:
        posenc_interleaved_ff(x, out, c, s, npairs, inverse)
    elif data_t is float:
        posenc_interleaved_fd(x, out, c, s, npairs, inverse)
    elif table_t is float:
        posenc_interleaved_df(x, out, c, s, npairs, inverse)
    else:
        posenc_interleaved_dd(x, out, c, s, npairs, inverse)


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
    cdef Py_ssize_t nchunks = (nrows + ROW_CHUNK - 1) // ROW_CHUNK
    cdef Py_ssize_t cstride = cos_table.strides[0] // <Py_ssize_t>sizeof(table_t)
    cdef Py_ssize_t sstride = sin_table.strides[0] // <Py_ssize_t>sizeof(table_t)
    cdef Py_ssize_t chunk, r, t
    cdef const table_t* cbase
    cdef const table_t* sbase
    cdef RowFlags flags
    if nrows == 0 or dim == 0:
        return
    flags = _row_flags(nrows * dim * <Py_ssize_t>sizeof(data_t), &x[0, 0] == &out[0, 0])
    cbase = &cos_table[0, 0] if npairs > 0 else NULL
    sbase = &sin_table[0, 0] if npairs > 0 else NULL
    with nogil:
        for chunk in prange(nchunks, num_threads=num_threads, schedule="static"):
            for r in range(chunk * ROW_CHUNK, min((chunk + 1) * ROW_CHUNK, nrows)):
                t = row_table[r]
                _rotate_row(&x[r, 0], &out[r, 0], cbase + t * cstride, sbase + t * sstride,
                            npairs, dim, half_layout, inverse, flags)
            if flags.stream:
                posenc_sfence()


# ---------------------------------------------------------------------------
# adding a table row to every row (sinusoidal and learned absolute positions)

cdef inline void _add_row(const data_t* x, data_t* out, const table_t* row,
                          Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        out[i] = <data_t>(x[i] + row[i])


cdef inline void _add_row_in_place(data_t* x, const table_t* row, Py_ssize_t n) noexcept nogil:
    # One pointer, so that the vector loop needs no overlap test (see _rotate_half_in_place).
    cdef Py_ssize_t i
    for i in range(n):
        x[i] = <data_t>(x[i] + row[i])


def add_table_rows(const data_t[:, ::1] x, data_t[:, ::1] out, const table_t[:, :] table,
                   const Py_ssize_t[::1] row_table, int num_threads):
    """out[r] = x[r] + table[row_table[r]], in the wider dtype, rounded once.

    `table` needs unit stride along its last axis; `out` may be `x`.
    """
    cdef Py_ssize_t nrows = x.shape[0], dim = x.shape[1], r
    cdef Py_ssize_t tstride = table.strides[0] // <Py_ssize_t>sizeof(table_t)
    cdef const table_t* tbase
    cdef bint in_place
    if nrows == 0 or dim == 0:
        return
    tbase = &table[0, 0]
    in_place = &x[0, 0] == &out[0, 0]
    with nogil:
        for r in prange(nrows, num_threads=num_threads, schedule="static"):
            if in_place:
                _add_row_in_place(&out[r, 0], tbase + row_table[r] * tstride, dim)
            else:
                _add_row(&x[r, 0], &out[r, 0], tbase + row_table[r] * tstride, dim)


# ---------------------------------------------------------------------------
# RoPE fast path: RotaryBase, the compiled half of RotaryEmbedding
#
# RotaryEmbedding (rotary.py) derives from this class.  `apply` and
# `apply_qk` first try a path that does all its checks in C: contiguous
# native float arrays, an integer offset, positions None / an int / an int64
# array that varies along one axis, and positions covered by a per-instance
# cos/sin cache.  Anything else (and every error) goes to the general path
# in Python, which validates fully and raises the documented errors.  Both
# paths use the same canonical cos/sin values and row functions, so they give
# bitwise the same results.

cimport cython
cimport numpy as cnp
from cpython.long cimport PyLong_CheckExact, PyLong_AsLongLongAndOverflow

cnp.import_array()

cdef extern from *:
    """
    /* Bytes of cos/sin rows per work item of the fast path: half an L2, the
       other half holds the rows of x streaming through (with 1 MiB, float64
       in place ran ~10% slower on a 1 MiB L2). */
    #define POSENC_POSITION_BLOCK_BYTES (512 * 1024)
    /* Rows by which a cos/sin cache grows, at least. */
    #define POSENC_CACHE_GROWTH 1024
    /* Largest cos/sin cache per dtype, in bytes. */
    #define POSENC_CACHE_BYTES (64 * 1024 * 1024)
    /* Elements below which a call stays on one thread (as _threads.py). */
    #define POSENC_MIN_ELEMENTS_PER_THREAD 65536
    """
    enum: POSITION_BLOCK_BYTES "POSENC_POSITION_BLOCK_BYTES"
    enum: CACHE_GROWTH "POSENC_CACHE_GROWTH"
    enum: CACHE_BYTES "POSENC_CACHE_BYTES"
    enum: MIN_ELEMENTS_PER_THREAD "POSENC_MIN_ELEMENTS_PER_THREAD"

cdef int _thread_limit = 1


def set_thread_limit(int n):
    """Mirror of posenc_fast.set_num_threads for the fast path (called by _threads.py)."""
    global _thread_limit
    _thread_limit = max(1, n)


cdef inline int _threads_for(Py_ssize_t elements) noexcept nogil:
    cdef Py_ssize_t n = elements // MIN_ELEMENTS_PER_THREAD
    return <int>max(<Py_ssize_t>1, min(<Py_ssize_t>_thread_limit, n))


cdef inline Py_ssize_t _positions_per_block(Py_ssize_t npairs, Py_ssize_t itemsize) noexcept nogil:
    # Positions whose cos/sin rows take about POSITION_BLOCK_BYTES (half an L2).
    return max(<Py_ssize_t>16, POSITION_BLOCK_BYTES // (2 * max(npairs, <Py_ssize_t>1) * itemsize))


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


cdef void _rotate_planned(const data_t* x, data_t* out, const data_t* table, RowPlan plan,
                          Py_ssize_t dim, Py_ssize_t npairs, bint half, bint inverse,
                          int num_threads) noexcept nogil:
    # table: (rows, 2, npairs), the cos then the sin row of each position.
    cdef Py_ssize_t block = _positions_per_block(npairs, sizeof(data_t))
    cdef Py_ssize_t nitems = (plan.seq + block - 1) // block * plan.outer
    cdef Py_ssize_t item
    cdef RowFlags flags = _row_flags(plan.outer * plan.seq * plan.inner * dim
                                     * <Py_ssize_t>sizeof(data_t), x == out)
    if num_threads == 1:  # no parallel region: it costs a microsecond
        for item in range(nitems):
            _rotate_item(item, block, x, out, table, &plan, dim, npairs, half, inverse, flags)
    else:
        for item in prange(nitems, num_threads=num_threads, schedule="static"):
            _rotate_item(item, block, x, out, table, &plan, dim, npairs, half, inverse, flags)


cdef inline void _rotate_item(Py_ssize_t item, Py_ssize_t block_size, const data_t* x,
                              data_t* out, const data_t* table, const RowPlan* plan, Py_ssize_t dim,
                              Py_ssize_t npairs, bint half, bint inverse,
                              RowFlags flags) noexcept nogil:
    # Work item = (block of block_size positions, outer index): the cache
    # rows of a block (half an L2) serve every head of every batch in turn,
    # while each head's rows of the block are one long contiguous stream.
    cdef Py_ssize_t o = item % plan.outer, block = item // plan.outer, s, i, r
    cdef long long t
    for s in range(block * block_size, min((block + 1) * block_size, plan.seq)):
        t = plan.base + (plan.positions[s] if plan.positions != NULL else s)
        for i in range(plan.inner):
            r = (o * plan.seq + s) * plan.inner + i
            _rotate_row(x + r * dim, out + r * dim, table + 2 * t * npairs,
                        table + (2 * t + 1) * npairs, npairs, dim, half, inverse, flags)
    if flags.stream:
        posenc_sfence()


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
        plan.lowest = plan.positions[0]
        plan.highest = plan.positions[0]
        for j in range(plan.seq):
            plan.lowest = min(plan.lowest, plan.positions[j])
            plan.highest = max(plan.highest, plan.positions[j])
        if not (_fits(plan.lowest, offset) and _fits(plan.highest, offset)):
            return False
        plan.lowest += offset
        plan.highest += offset
    return True


cdef inline bint _fast_array(object x, Py_ssize_t dim):
    # A C-contiguous, aligned, native float32/float64 ndarray of shape (..., dim).
    cdef cnp.ndarray arr
    cdef int typenum
    if not cnp.PyArray_CheckExact(x):
        return False
    arr = <cnp.ndarray>x
    typenum = cnp.PyArray_TYPE(arr)
    return ((typenum == cnp.NPY_FLOAT32 or typenum == cnp.NPY_FLOAT64)
            and cnp.PyArray_ISCARRAY_RO(arr) and cnp.PyArray_ISNOTSWAPPED(arr)
            and cnp.PyArray_NDIM(arr) >= 1
            and cnp.PyArray_DIMS(arr)[cnp.PyArray_NDIM(arr) - 1] == dim)


cdef inline void _byte_range(cnp.ndarray a, char** low, char** high):
    # The lowest byte of a's elements and one past the highest, whatever its
    # strides (a sliced or reversed cos/sin cache reaches past its nbytes, or
    # below its data pointer).
    cdef char* lo = <char*>cnp.PyArray_DATA(a)
    cdef char* hi = lo + cnp.PyArray_ITEMSIZE(a)
    cdef Py_ssize_t extent
    cdef int k
    for k in range(cnp.PyArray_NDIM(a)):
        extent = cnp.PyArray_STRIDE(a, k) * (cnp.PyArray_DIMS(a)[k] - 1)
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
    _byte_range(a, &a_low, &a_high)
    _byte_range(b, &b_low, &b_high)
    return a_high <= b_low or b_high <= a_low


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


@cython.auto_pickle(False)  # RotaryEmbedding pickles by its constructor arguments
cdef class RotaryBase:
    """Compiled state and fast path of RotaryEmbedding (see rotary.py)."""

    cdef Py_ssize_t _fast_dim
    cdef Py_ssize_t _fast_npairs
    cdef bint _fast_half
    cdef double _fast_factor
    cdef long long _fast_valid_below
    cdef object _fast_freqs
    # cos/sin caches of positions 0 .. rows-1 (canonical values, attention
    # factor applied), per dtype: arrays (rows, 2, npairs) or None.
    cdef object _cache32
    cdef object _cache64

    def _init_fast_path(self, Py_ssize_t dim, Py_ssize_t rotary_dim, bint half, freqs,
                        double attention_factor, long long valid_below):
        """Set the state the fast path uses (called by RotaryEmbedding.__init__).

        `valid_below`: positions p with p + 1 <= valid_below use `freqs`.
        """
        self._fast_dim = dim
        self._fast_npairs = rotary_dim // 2
        self._fast_half = half
        self._fast_factor = attention_factor
        self._fast_valid_below = valid_below
        self._fast_freqs = freqs
        self._cache32 = None
        self._cache64 = None

    cdef object _cache_for(self, int typenum, long long highest):
        """The cos/sin cache of the dtype covering row `highest`, or None."""
        cdef object cache = self._cache32 if typenum == cnp.NPY_FLOAT32 else self._cache64
        cdef Py_ssize_t itemsize = 4 if typenum == cnp.NPY_FLOAT32 else 8
        cdef Py_ssize_t limit = CACHE_BYTES // (2 * itemsize * max(self._fast_npairs, 1))
        cdef Py_ssize_t rows = 0 if cache is None else (<cnp.ndarray>cache).shape[0]
        cdef Py_ssize_t new_rows
        if highest < rows:
            return cache
        if highest >= limit:
            return None
        new_rows = min(limit, max(2 * rows, (highest // CACHE_GROWTH + 1) * CACHE_GROWTH))
        cache = self._grow_cache(typenum, cache, rows, new_rows)
        if typenum == cnp.NPY_FLOAT32:
            self._cache32 = cache
        else:
            self._cache64 = cache
        return cache

    cdef object _grow_cache(self, int typenum, object old, Py_ssize_t rows, Py_ssize_t new_rows):
        # One array (rows, 2, npairs): a position's cos and sin rows side by
        # side, so that the rotation reads one stream of table rows, not two.
        import numpy
        dtype = numpy.float32 if typenum == cnp.NPY_FLOAT32 else numpy.float64
        table = numpy.empty((new_rows, 2, self._fast_npairs), dtype=dtype)
        if old is not None:
            table[:rows] = old
        threads = _threads_for((new_rows - rows) * self._fast_npairs)
        work = numpy.empty((trig_work_rows(threads), max(self._fast_npairs, 1)))
        cos_sin_rows(numpy.arange(rows, new_rows, dtype=numpy.float64), self._fast_freqs,
                     self._fast_factor, table[rows:, 0], table[rows:, 1], work, threads)
        table.flags.writeable = False
        return table

    cdef bint _run(self, cnp.ndarray x, cnp.ndarray out, object cache, RowPlan plan, bint inverse):
        cdef cnp.ndarray table = <cnp.ndarray>cache
        cdef Py_ssize_t size = cnp.PyArray_SIZE(x), n = self._fast_npairs
        cdef int threads = _threads_for(size)
        if size == 0:
            return True
        if cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT32:
            with nogil:
                _rotate_planned(<const float*>cnp.PyArray_DATA(x), <float*>cnp.PyArray_DATA(out),
                                <const float*>cnp.PyArray_DATA(table), plan, self._fast_dim, n,
                                self._fast_half, inverse, threads)
        else:
            with nogil:
                _rotate_planned(<const double*>cnp.PyArray_DATA(x),
                                <double*>cnp.PyArray_DATA(out),
                                <const double*>cnp.PyArray_DATA(table), plan, self._fast_dim, n,
                                self._fast_half, inverse, threads)
        return True

    cdef int _fast_flags(self, object offset, object inverse, long long* offset_value):
        # -1: fall back; else inverse as 0/1.
        cdef int overflow = 0
        if not PyLong_CheckExact(offset):
            return -1
        offset_value[0] = PyLong_AsLongLongAndOverflow(offset, &overflow)
        if overflow or not _fits(offset_value[0], 0):
            return -1
        if inverse is False:
            return 0
        if inverse is True and self._fast_factor == 1.0:
            return 1
        return -1

    cdef bint _usable(self, RowPlan* plan):
        return plan.lowest >= 0 and plan.highest < self._fast_valid_below

    def apply(self, x, positions=None, *, offset=0, seq_axis=-2, inverse=False, out=None):
        """Rotate the pairs of `x` by their positions.

        Parameters
        ----------
        x : ndarray of shape (..., dim), float32 or float64
            Queries or keys (never values).
        positions : array_like of real numbers, optional
            Broadcasts against ``x.shape[:-1]``: ``(seq,)``, ``(batch, 1,
            seq)``, ``(tokens, 1)`` for ``(tokens, heads, dim)``, or a scalar.
            Default ``arange(n)`` laid along `seq_axis`.
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
        cdef RowPlan plan
        cdef long long offset_value = 0
        cdef int flags
        cdef object cache, result
        if _fast_array(x, self._fast_dim):
            flags = self._fast_flags(offset, inverse, &offset_value)
            if (flags >= 0 and _plan_rows(<cnp.ndarray>x, positions, seq_axis, offset_value, &plan)
                    and self._usable(&plan)):
                result = _fast_out(<cnp.ndarray>x, out, ())
                if result is not None:
                    cache = self._cache_for(cnp.PyArray_TYPE(<cnp.ndarray>x), plan.highest)
                    if cache is not None:
                        self._run(<cnp.ndarray>x, <cnp.ndarray>result, cache, plan, flags)
                        return result
        return self._apply_general(x, positions, offset, seq_axis, inverse, out)

    def apply_qk(self, q, k, positions=None, *, offset=0, seq_axis=-2, inverse=False,
                 out_q=None, out_k=None):
        """Rotate queries and keys with one cos/sin computation.

        `q` and `k` may have different head counts (grouped-query attention)
        and dtypes; their positions (explicit, or along `seq_axis`) must agree.
        Arguments as in `apply`; `out_q` may be `q` and `out_k` may be `k`.

        Returns
        -------
        (q_rot, k_rot)
        """
        cdef RowPlan q_plan, k_plan
        cdef long long offset_value = 0
        cdef int flags
        cdef object q_cache, k_cache, q_out, k_out
        if _fast_array(q, self._fast_dim) and _fast_array(k, self._fast_dim):
            flags = self._fast_flags(offset, inverse, &offset_value)
            if (flags >= 0
                    and _plan_rows(<cnp.ndarray>q, positions, seq_axis, offset_value, &q_plan)
                    and _plan_rows(<cnp.ndarray>k, positions, seq_axis, offset_value, &k_plan)
                    and q_plan.seq == k_plan.seq
                    and self._usable(&q_plan) and self._usable(&k_plan)
                    and _disjoint(<cnp.ndarray>q, <cnp.ndarray>k)):
                q_out = _fast_out(<cnp.ndarray>q, out_q, (k,))
                k_out = _fast_out(<cnp.ndarray>k, out_k, (q,) if q_out is None else (q, q_out))
                if q_out is not None and k_out is not None:
                    q_cache = self._cache_for(cnp.PyArray_TYPE(<cnp.ndarray>q), q_plan.highest)
                    k_cache = self._cache_for(cnp.PyArray_TYPE(<cnp.ndarray>k), k_plan.highest)
                    if q_cache is not None and k_cache is not None:
                        self._run(<cnp.ndarray>q, <cnp.ndarray>q_out, q_cache, q_plan, flags)
                        self._run(<cnp.ndarray>k, <cnp.ndarray>k_out, k_cache, k_plan, flags)
                        return q_out, k_out
        return self._apply_qk_general(q, k, positions, offset, seq_axis, inverse, out_q, out_k)


# ---------------------------------------------------------------------------
# Compiled path of apply_rotary_cos_sin(_qk) without positions
#
# A framework's own cos/sin cache (Hugging Face's, sliced to one entry per
# pair) broadcast against x's leading axes: each row of x walks the cache by
# the cache's own strides (0 along broadcast axes), so a sliced or
# non-contiguous cache is read where it lies.  As for RotaryBase, `None`
# sends the call to the general path in rotary.py, which validates fully.

DEF MAX_WALK_AXES = 8


cdef struct CacheWalk:
    # x's leading axes, and the cos/sin steps (in elements) along each.
    int naxes
    Py_ssize_t shape[MAX_WALK_AXES]
    Py_ssize_t cos_step[MAX_WALK_AXES]
    Py_ssize_t sin_step[MAX_WALK_AXES]
    Py_ssize_t rows
    Py_ssize_t npairs


cdef bint _plan_walk(cnp.ndarray x, cnp.ndarray cos_cache, cnp.ndarray sin_cache,
                     CacheWalk* walk):
    """Fill `walk` for x's rows; False if cos/sin do not broadcast as required."""
    cdef int xnd = cnp.PyArray_NDIM(x), cnd = cnp.PyArray_NDIM(cos_cache), k, j
    cdef cnp.npy_intp* xshape = cnp.PyArray_DIMS(x)
    cdef cnp.npy_intp* cshape = cnp.PyArray_DIMS(cos_cache)
    cdef Py_ssize_t itemsize = cnp.PyArray_ITEMSIZE(cos_cache), cs, ss
    if xnd - 1 > MAX_WALK_AXES or cnd > xnd or cshape[cnd - 1] < 1:
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
        cs = cnp.PyArray_STRIDE(cos_cache, j)
        ss = cnp.PyArray_STRIDE(sin_cache, j)
        if cs % itemsize or ss % itemsize:
            return False
        walk.cos_step[k] = cs // itemsize
        walk.sin_step[k] = ss // itemsize
    return True


cdef void _rotate_walk_rows(const data_t* x, data_t* out, const table_t* c, const table_t* s,
                            const CacheWalk* walk, Py_ssize_t first, Py_ssize_t stop,
                            Py_ssize_t dim, bint half, bint inverse,
                            RowFlags flags) noexcept nogil:
    # Rows first .. stop-1 of x; an odometer over the leading axes tracks the
    # cache offsets.
    cdef Py_ssize_t index[MAX_WALK_AXES]
    cdef Py_ssize_t rest = first, co = 0, so = 0, r
    cdef int k
    for k in range(walk.naxes - 1, -1, -1):
        index[k] = rest % walk.shape[k]
        rest //= walk.shape[k]
        co += index[k] * walk.cos_step[k]
        so += index[k] * walk.sin_step[k]
    for r in range(first, stop):
        _rotate_row(x + r * dim, out + r * dim, c + co, s + so, walk.npairs, dim, half, inverse,
                    flags)
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
    if flags.stream:
        posenc_sfence()


cdef void _rotate_walk(const data_t* x, data_t* out, const table_t* c, const table_t* s,
                       const CacheWalk* walk, Py_ssize_t dim, bint half, bint inverse,
                       int num_threads) noexcept nogil:
    # Rows as (outer, heads, inner): `heads` is the last axis along which the
    # cache does not change but changes after it (e.g. x (batch, heads, seq,
    # dim) with a (seq, pairs) cache).  Work items are blocks of inner rows,
    # one head at a time, heads innermost: a block's cache rows (half an L2)
    # serve every head in turn, as in _rotate_item.  Without such an axis the
    # rows are taken in order, in chunks.
    cdef RowFlags flags = _row_flags(walk.rows * dim * <Py_ssize_t>sizeof(data_t), x == out)
    cdef Py_ssize_t outer = 1, heads = 1, inner = walk.rows, block = ROW_CHUNK
    cdef Py_ssize_t nblocks, item
    cdef int k, j
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
            block = _positions_per_block(walk.npairs, sizeof(table_t))
            break
    nblocks = (inner + block - 1) // block
    if num_threads == 1:
        for item in range(outer * nblocks * heads):
            _rotate_walk_item(item, heads, inner, block, nblocks, x, out, c, s, walk, dim, half,
                              inverse, flags)
    else:
        for item in prange(outer * nblocks * heads, num_threads=num_threads, schedule="static"):
            _rotate_walk_item(item, heads, inner, block, nblocks, x, out, c, s, walk, dim, half,
                              inverse, flags)


cdef inline void _rotate_walk_item(Py_ssize_t item, Py_ssize_t heads, Py_ssize_t inner,
                                   Py_ssize_t block, Py_ssize_t nblocks, const data_t* x,
                                   data_t* out, const table_t* c, const table_t* s,
                                   const CacheWalk* walk, Py_ssize_t dim, bint half, bint inverse,
                                   RowFlags flags) noexcept nogil:
    # Item = (outer index, block, head), head fastest: one contiguous range of rows.
    cdef Py_ssize_t head = item % heads, rest = item // heads
    cdef Py_ssize_t start = (rest // nblocks * heads + head) * inner, b = rest % nblocks
    _rotate_walk_rows(x, out, c, s, walk, start + b * block, start + min((b + 1) * block, inner),
                      dim, half, inverse, flags)


cdef void _run_walk(cnp.ndarray x, cnp.ndarray out, cnp.ndarray cos_cache, cnp.ndarray sin_cache,
                    const CacheWalk* walk, bint half, bint inverse):
    cdef Py_ssize_t dim = cnp.PyArray_DIMS(x)[cnp.PyArray_NDIM(x) - 1]
    cdef int threads = _threads_for(cnp.PyArray_SIZE(x))
    cdef void* xp = cnp.PyArray_DATA(x)
    cdef void* op = cnp.PyArray_DATA(out)
    cdef void* cp = cnp.PyArray_DATA(cos_cache)
    cdef void* sp = cnp.PyArray_DATA(sin_cache)
    cdef bint x32 = cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT32
    cdef bint c32 = cnp.PyArray_TYPE(cos_cache) == cnp.NPY_FLOAT32
    if walk.rows == 0 or dim == 0:
        return
    with nogil:
        if x32 and c32:
            _rotate_walk(<const float*>xp, <float*>op, <const float*>cp, <const float*>sp, walk,
                         dim, half, inverse, threads)
        elif x32:
            _rotate_walk(<const float*>xp, <float*>op, <const double*>cp, <const double*>sp,
                         walk, dim, half, inverse, threads)
        elif c32:
            _rotate_walk(<const double*>xp, <double*>op, <const float*>cp, <const float*>sp,
                         walk, dim, half, inverse, threads)
        else:
            _rotate_walk(<const double*>xp, <double*>op, <const double*>cp, <const double*>sp,
                         walk, dim, half, inverse, threads)


cdef inline bint _fast_cache(object a):
    # An aligned, native float32/float64 ndarray with unit stride along its
    # last axis (any stride if no two entries are read along it).
    cdef cnp.ndarray arr
    cdef int typenum, last
    if not cnp.PyArray_CheckExact(a):
        return False
    arr = <cnp.ndarray>a
    typenum = cnp.PyArray_TYPE(arr)
    last = cnp.PyArray_NDIM(arr) - 1
    return ((typenum == cnp.NPY_FLOAT32 or typenum == cnp.NPY_FLOAT64)
            and cnp.PyArray_ISALIGNED(arr) and cnp.PyArray_ISNOTSWAPPED(arr) and last >= 0
            and (cnp.PyArray_STRIDE(arr, last) == cnp.PyArray_ITEMSIZE(arr)
                 or cnp.PyArray_DIMS(arr)[last] == 1 or cnp.PyArray_SIZE(arr) == 0))


def rotate_cos_sin_fast(tuple xs, cos_cache, sin_cache, layout, inverse, tuple outs):
    """The compiled path of apply_rotary_cos_sin(_qk) with positions None.

    Rotates every array of `xs` (one, or q and k) into the matching entry of
    `outs` (None: a new array) and returns the results as a tuple, or returns
    None, having written nothing, when the call is not one this path takes.
    """
    cdef CacheWalk walks[2]
    cdef Py_ssize_t n = len(xs), j, dim = 0
    cdef list results = []
    cdef cnp.ndarray c, s, x
    if (n > 2 or len(outs) != n or not (inverse is True or inverse is False)
            or type(layout) is not str or layout not in ("half", "interleaved")
            or not (_fast_cache(cos_cache) and _fast_cache(sin_cache))):
        return None
    c, s = cos_cache, sin_cache
    if cnp.PyArray_TYPE(c) != cnp.PyArray_TYPE(s) or not cnp.PyArray_SAMESHAPE(c, s):
        return None
    for j in range(n):
        if not cnp.PyArray_CheckExact(xs[j]) or cnp.PyArray_NDIM(<cnp.ndarray>xs[j]) < 1:
            return None
        x = xs[j]
        if j == 0:  # k must end in q's dim
            dim = cnp.PyArray_DIMS(x)[cnp.PyArray_NDIM(x) - 1]
        if (not _fast_array(x, dim) or 2 * cnp.PyArray_DIMS(c)[cnp.PyArray_NDIM(c) - 1] > dim
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
        _run_walk(<cnp.ndarray>xs[j], <cnp.ndarray>results[j], c, s, &walks[j],
                  layout == "half", inverse)
    return tuple(results)


include "_relative.pxi"
