/* sin/cos of position * frequency, row by row: the canonical values.

   The value for an integer position k is canonical: a function of k and the
   frequency only, whatever call, row, thread or ISA variant computes it.
   With k2 = k rounded down to a multiple of 1024 and k1 = k rounded down to
   a multiple of 32, it is the exact cos/sin at k2, rotated (k1-k2)/32 times
   by 32w, then k-k1 times by w: at most 62 rotations (error ~1e-14).  Rows of
   consecutive positions get there incrementally, one rotation per row, so
   libm runs on one row in 1024.  Non-integer positions get exact values.

   Every path rotates with posenc_rotate_step, the one definition of the
   step: bitwise reproducibility depends on it. */
#ifndef POSENC_TRIG_H
#define POSENC_TRIG_H

#include "posenc_config.h"

/* Work rows of the float64 scratch array: 4 shared (c1, s1, c32, s32), and 4
   per thread (c, s, ca, sa). */
#define POSENC_TRIG_SHARED_ROWS 4
#define POSENC_TRIG_THREAD_ROWS 4
/* Rows per parallel work item of the table kernels.  Each item starts from
   scratch (libm at its multiple of 1024) and ends with a store fence.  W5 one
   thread, float32, (131072,128) and (8192,1024), ratio to a fill (CPU time,
   medians of 30-40 rounds; one build per value, so between-run noise of up to
   0.4x under the hog): 512 rows 1.68-1.84x 1.22-1.31x, hog 1.71x 1.26x;
   1024 rows 1.62-1.70x 1.14-1.31x, hog 1.67-1.75x 1.23-1.60x; 4096 rows
   1.60-1.66x 1.13-1.30x, hog 1.68x 1.23x.  No clear winner: 1024 keeps 8
   items for (8192,1024) where 4096 would leave threads idle.  (On the kernel
   before the column blocks, bench/sweeps.md, longer items won W4 by ~10% and
   lost W5 (8192,1024) by 30-50%.) */
#ifndef POSENC_TRIG_CHUNK_ROWS
#define POSENC_TRIG_CHUNK_ROWS 1024
#endif
/* Rows per pass over the columns of a streamed float32 table: W5 (131072,128)
   and (8192,1024), one thread, ratio to a fill (CPU time, medians of 30),
   quiet / under the hog: 1: 1.88x 1.40x / 2.14x 1.59x; 2: 1.70x 1.22x /
   1.77x 1.38x; 4: 1.65x 1.17x / 1.67x 1.23x; 8: 2.04x 1.63x / 2.07x 1.73x
   (an earlier build, quiet: 3: 1.81x 1.41x; 32: 2.16x 1.82x). */
#ifndef POSENC_TRIG_STREAM_ROWS
#define POSENC_TRIG_STREAM_ROWS 4
#endif
/* 2**52: integers up to it are exact in float64, with room for +1. */
#define POSENC_MAX_EXACT_INTEGER 4503599627370496.0
/* 2**-27: the largest rounding error of p*w that posenc_exact corrects to
   first order. */
#define POSENC_SMALL_ANGLE_ERROR 7.450580596923828e-09

typedef struct {
    const double* w;     /* frequencies (n) */
    double* c1;          /* cos/sin of w: one position */
    double* s1;
    double* c32;         /* cos/sin of 32*w: one 32-row block */
    double* s32;
    Py_ssize_t n;
} posenc_trig_steps;

typedef struct {
    double* c;           /* cos/sin of the current position */
    double* s;
    double* ca;          /* cos/sin at the current position's multiple of 32 */
    double* sa;
    double last;         /* the position (c, s) hold, if `valid` */
    int valid;
} posenc_trig_state;

/* (c[i], s[i]) <- (c[i], s[i]) rotated by the angle whose cos/sin are (rc[i], rs[i]). */
POSENC_ALWAYS_INLINE void posenc_rotate_step(double* POSENC_R c, double* POSENC_R s,
                                             const double* POSENC_R rc,
                                             const double* POSENC_R rs, Py_ssize_t i) {
    double ci = c[i], si = s[i];
    c[i] = ci * rc[i] - si * rs[i];
    s[i] = si * rc[i] + ci * rs[i];
}

static inline void posenc_rotate_by(double* POSENC_R c, double* POSENC_R s,
                                    const double* POSENC_R rc, const double* POSENC_R rs,
                                    Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) posenc_rotate_step(c, s, rc, rs, i);
}

/* cos/sin of the exact product p*w[i] = hi + lo (fma gives the rounding error
   lo exactly): sin(hi + lo) = sin(hi) + lo*cos(hi), off by lo**2/2 < 2**-55
   while |lo| <= 2**-27 (angles below ~2**26).  Past that (lo reaches 1 and
   more at angles beyond 2**53) the full angle-addition formula keeps the
   values exact and within [-1, 1]. */
static inline void posenc_exact(double p, const double* w, double* c, double* s, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        double hi = p * w[i];
        double lo = fma(p, w[i], -hi);
        double ch = cos(hi), sh = sin(hi);
        if (fabs(lo) <= POSENC_SMALL_ANGLE_ERROR) {
            c[i] = ch - lo * sh;
            s[i] = sh + lo * ch;
        } else {
            double cl = cos(lo), sl = sin(lo);
            c[i] = ch * cl - sh * sl;
            s[i] = sh * cl + ch * sl;
        }
    }
}

/* The shared rows of `work` ((POSENC_TRIG_SHARED_ROWS, n) doubles). */
static inline void posenc_trig_steps_init(posenc_trig_steps* steps, const double* w,
                                          double* work, Py_ssize_t n) {
    steps->w = w;
    steps->n = n;
    steps->c1 = work;
    steps->s1 = work + n;
    steps->c32 = work + 2 * n;
    steps->s32 = work + 3 * n;
    for (Py_ssize_t i = 0; i < n; i++) {
        steps->c1[i] = cos(w[i]);
        steps->s1[i] = sin(w[i]);
        steps->c32[i] = cos(32.0 * w[i]);  /* 32*w is exact */
        steps->s32[i] = sin(32.0 * w[i]);
    }
}

/* A state over one thread's rows of `work` ((POSENC_TRIG_THREAD_ROWS, n) doubles). */
static inline posenc_trig_state posenc_trig_state_init(double* work, Py_ssize_t n) {
    posenc_trig_state state;
    state.c = work;
    state.s = work + n;
    state.ca = work + 2 * n;
    state.sa = work + 3 * n;
    state.last = 0.0;
    state.valid = 0;
    return state;
}

static inline void posenc_canonical_from_scratch(long long k, const posenc_trig_steps* steps,
                                                 posenc_trig_state* state) {
    Py_ssize_t n = steps->n;
    posenc_exact((double)(k - (k & 1023)), steps->w, state->ca, state->sa, n);
    for (long long j = 0; j < ((k & 1023) >> 5); j++)
        posenc_rotate_by(state->ca, state->sa, steps->c32, steps->s32, n);
    memcpy(state->c, state->ca, n * sizeof(double));
    memcpy(state->s, state->sa, n * sizeof(double));
    for (long long j = 0; j < (k & 31); j++)
        posenc_rotate_by(state->c, state->s, steps->c1, steps->s1, n);
}

/* True if p is one past the state's integer position and not a multiple of
   32: the row is a single rotation by w (callers fuse it with the store). */
static inline int posenc_next_in_block(const posenc_trig_state* state, double p) {
    return state->valid && p == state->last + 1.0 && (((long long)p) & 31) != 0;
}

/* How many of p[0..n-1] make one run, p[0] being next in block: each one
   past the previous, none a multiple of 32 (at most 31). */
static inline Py_ssize_t posenc_block_run(const double* p, Py_ssize_t n) {
    Py_ssize_t m = 1;
    while (m < n && p[m] == p[m - 1] + 1.0 && (((long long)p[m]) & 31) != 0) m++;
    return m;
}

/* Fill state->c / state->s for position p: a new 32-row block of the
   previous position's run, or from scratch.  (Callers have taken the
   next-in-block case already.) */
static inline void posenc_trig_position(double p, const posenc_trig_steps* steps,
                                        posenc_trig_state* state) {
    Py_ssize_t n = steps->n;
    if (p == floor(p) && fabs(p) <= POSENC_MAX_EXACT_INTEGER) {
        long long k = (long long)p;
        if (state->valid && p == state->last + 1.0) {  /* k is a multiple of 32 */
            if ((k & 1023) == 0)
                posenc_exact(p, steps->w, state->ca, state->sa, n);
            else
                posenc_rotate_by(state->ca, state->sa, steps->c32, steps->s32, n);
            memcpy(state->c, state->ca, n * sizeof(double));
            memcpy(state->s, state->sa, n * sizeof(double));
        } else {
            posenc_canonical_from_scratch(k, steps, state);
        }
        state->valid = 1;
    } else {
        posenc_exact(p, steps->w, state->c, state->s, n);
        state->valid = 0;
    }
    state->last = p;
}

#endif
