/* Build facts, portability macros and the tuning constants of the kernels.

   Included by every compiled module: the per-ISA kernel modules
   (_isa_<variant>.pyx, through posenc_kernels.h) and the module compiled once
   (_core.pyx).  Nothing here may emit an instruction the baseline lacks
   unless the compiler was told the CPU has it (the ISA flags of setup.py). */
#ifndef POSENC_CONFIG_H
#define POSENC_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

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

#if defined(__GNUC__) || defined(__clang__)
#define POSENC_R __restrict__
#define POSENC_ALWAYS_INLINE static inline __attribute__((always_inline))
#define POSENC_PREFETCH_LINE(address) __builtin_prefetch((const void*)(address), 0, 3)
#define POSENC_NOINLINE __attribute__((noinline))
#else
#define POSENC_NOINLINE __declspec(noinline)
#define POSENC_R __restrict
#define POSENC_ALWAYS_INLINE static __forceinline
#if defined(_M_X64) || defined(_M_IX86)
#include <xmmintrin.h>
#define POSENC_PREFETCH_LINE(address) _mm_prefetch((const char*)(address), _MM_HINT_T0)
#else
#define POSENC_PREFETCH_LINE(address) ((void)0)
#endif
#endif

/* The width of this variant's widest vectors.  The in-place rows past the
   caches start where x reaches a multiple of it (posenc_peel: a scalar head
   first), so that no full-width store splits a cache line: NumPy aligns
   arrays to 16 bytes, and 64-byte stores 16 bytes past a line ran W1 in
   place (64 MiB) 1.07-1.14x slower than AVX2, 0.95-0.96x with the head
   (bench/bench_isa.py).  Rows in cache do without: there the scalar head cost
   more than the split lines (W1 float32 (1,32,256,128) 1.11-1.12x AVX2). */
#if defined(__AVX512F__)
#define POSENC_VECTOR_BYTES 64
#elif defined(__AVX__)
#define POSENC_VECTOR_BYTES 32
#else
#define POSENC_VECTOR_BYTES 16
#endif

/* How many of n elements of `size` bytes lie before `out` reaches a
   multiple of POSENC_VECTOR_BYTES (at most n). */
static inline Py_ssize_t posenc_peel(const void* out, Py_ssize_t size, Py_ssize_t n) {
    Py_ssize_t head = (Py_ssize_t)((0 - (uintptr_t)out) & (POSENC_VECTOR_BYTES - 1)) / size;
    return head < n ? head : n;
}

/* The tuning constants.  Each is defined under #ifndef, so that
   bench/sweep.py can build the package with -DNAME=VALUE; each carries the
   sweep that chose it: on the 2-core AMD EPYC of bench/README.md shared with
   other jobs, AVX-512, the median over 5 processes (7 interleaved rounds
   each) of report.py's time / limit, quiet / with the memory-bandwidth hog,
   on the code of commit 050b03a (main 5877b00 with these guards).
   Rows: 64M is (1,32,4096,128) (128 MiB in f64), 4M (1,32,256,128), 512K
   (1,32,32,128); apply_qk's k has 8 heads.  Full tables: bench/sweeps.md. */

/* Rows per parallel work item of the row loops (general rotation, add a
   table, streams, the fused cache write).  Sweep 2026-12-01 of 64, 256,
   1024 on add_position_table (8,2048,1024) in place, load average 8-9:
   noise only (ranges over processes 0.7-11x); again with 7 processes,
   load average 0-1: 1.57/1.26, 1.55/1.26, 1.56/1.27 (quiet/hog; ranges
   0.03-0.2), equal.  At one thread the chunk changes only the item loop
   (an item of 256 rows is 256K elements there), so report.py's rows
   cannot rank it; kept at 256. */
#ifndef POSENC_ROW_CHUNK
#define POSENC_ROW_CHUNK 256
#endif
/* Results at least this large are written with non-temporal stores, and
   their rows take the scalar half-layout loops (faster past the caches).
   A first sweep 2026-12-01 (load average 7-11) was very noisy; a second
   (load average 0-2; where two values run the same code their medians
   still differ by up to 0.13 quiet, 0.17 under the hog):
   value                 4194304   16777216   33554432  1073741824   (quiet/hog)
   W1 oop 64M f32      0.92/0.86  0.87/0.87  0.91/0.70  1.48/1.12
   W1 oop 64M f64      0.89/0.80  0.87/0.84  0.88/0.85  1.37/1.39
   W1 in place 64M f32 1.25/1.14  1.23/1.18  1.20/1.13  1.22/1.20
   W1 in place 64M f64 1.11/1.18  1.15/1.16  1.13/1.20  1.25/1.26
   apply_qk 64M f32    0.90/0.71  0.86/0.85  0.92/0.79  1.34/1.32
   W1 oop 4M f32       2.17/2.24  1.61/1.56  1.64/1.48  1.59/1.42
   W1 in place 4M f32  2.94/2.40  2.17/1.83  2.07/1.82  2.20/1.85
   apply_qk 4M f32     1.95/1.98  1.60/1.44  1.56/1.47  1.59/1.54
   Never streaming (1G) loses 30-70% on the 64M rows out of place and 10%
   in place f64; streaming at 4 MiB loses 20-45% on the 4M rows.  16M and
   32M differ only in apply_qk's k (16 MiB), mixed (0.86/0.85 against
   0.92/0.79), as in the first sweep.  Kept at 16 MiB. */
#ifndef POSENC_STREAM_BYTES
#define POSENC_STREAM_BYTES (16 * 1024 * 1024)
#endif
/* Inputs at least this large are prefetched ahead of each row they rotate
   one by one (rows not taken by the block walks).  Sweeps 2026-12-01 (load
   average 5-9), time / limit quiet/hog:
   value                  262144     1048576    2097152    8388608
   W1 oop 4M f32        1.60/1.56  1.63/1.43  1.63/1.48  1.76/1.67
   W1 in place 4M f32   1.93/1.74  1.70/1.95  1.71/1.72  2.29/2.29
   apply_qk 4M f32      1.59/1.43  1.58/1.52  1.58/1.57  1.72/1.52
   W1 oop 512K f32      1.67/1.47  1.72/1.67  1.75/1.62  1.70/1.96
   W1 in place 512K f32 1.90/9.43  2.26/2.36  2.31/1.99  2.08/2.01
   apply_qk 512K f32    1.54/1.68  1.70/1.53  1.67/1.66  1.71/1.70
   The 4M rows want the prefetching rows (8M loses up to 35%), and so do
   the 512K ones; three more sweeps of 524288 against 1048576 on them
   (5 and 7 processes, the last also with POSENC_FAST_ISA=avx2), 524288
   then 1048576, quiet/hog:
                        AVX-512 (5)          AVX-512 (7)          AVX2 (7)
   W1 oop 512K f32      2.09/2.11 2.39/2.31  2.03/2.07 2.32/2.17  2.28/2.25 2.45/2.61
   W1 in place 512K f32 2.00/2.05 2.21/2.44  1.98/2.34 2.30/2.68  2.96/2.85 3.28/3.21
   apply_qk 512K f32    1.76/1.44 1.94/1.60  1.69/1.73 1.84/1.82  1.79/1.79 1.88/1.83
   524288 is 2-16% faster in all 18 pairs (and 262144 in 4 of 6 above);
   the decode calls (W2 256 KiB, W3) stay below it.  512 KiB since this
   sweep (was 1 MiB).  Those sweeps predate the in-cache block walk
   (POSENC_ROW_BLOCK_BYTES), which now takes these rows; after it
   (commit 90551d9, 3 processes, load average ~2) 262144 / 524288 / 1048576
   ran every cache row within noise of each other, e.g. W1 oop 4M
   1.31/1.14/1.13, in place 4M 1.26/1.22/1.24, apply_qk 512K 1.25/1.25/1.27
   quiet; under the hog 1.19/1.28/1.25, 1.17/1.17/1.15, 1.23/1.21/1.21:
   the threshold is left to the rows walked one by one. */
#ifndef POSENC_PREFETCH_BYTES
#define POSENC_PREFETCH_BYTES (512 * 1024)
#endif
/* How far ahead of a row its prefetches reach.  Sweep 2026-12-01, load
   average 2-6; ranges over processes 0.03-0.2 quiet, outliers to 3-10x
   under the hog:
   value                    4096       6144       8192      16384   (quiet/hog)
   W1 oop 64M f32      0.92/0.88  0.93/0.85  0.92/0.86  0.96/0.92
   W1 oop 64M f64      0.94/0.95  0.91/0.88  0.88/0.89  1.00/0.96
   W1 in place 64M f32 1.42/1.31  1.29/1.17  1.24/1.18  1.28/1.19
   W1 in place 64M f64 1.24/1.25  1.19/1.16  1.16/1.13  1.23/1.24
   apply_qk 64M f32    0.89/0.86  0.87/0.87  0.87/0.86  0.91/0.91
   W1 oop 4M f32       1.59/1.50  1.57/1.54  1.44/1.57  1.82/1.73
   W1 in place 4M f32  2.20/1.87  2.22/1.91  2.06/2.06  2.39/2.10
   apply_qk 4M f32     1.56/1.55  1.60/1.50  1.44/1.56  1.76/1.63
   8192 is best quiet on every row; under the hog it is best or within the
   spread except W1 in place 4M (2.06 against 1.87 at 4096, ranges 1.86-10.1
   and 1.84-2.04).  An earlier sweep from 2 to 16 KiB found 6-8 KiB best. */
#ifndef POSENC_PREFETCH_DISTANCE
#define POSENC_PREFETCH_DISTANCE 8192
#endif
/* Bytes of cos/sin rows per work item of the blocked walks: half an L2, the
   other half holds the rows of x streaming through (with 1 MiB, float64 in
   place ran ~10% slower on a 1 MiB L2).  A first sweep 2026-12-01 (load
   average 8-11) could not rank most rows; a second (7 processes, load
   average 2-3; ranges over processes 0.05-0.3):
   value                  131072     262144     524288    1048576   (quiet/hog)
   W1 oop 64M f32      0.97/0.71  0.94/0.71  0.94/0.70  0.95/0.70
   W1 oop 64M f64      0.93/0.82  0.91/0.78  0.92/0.77  0.90/0.80
   W1 in place 64M f32 1.30/1.12  1.33/1.13  1.24/1.10  1.21/1.13
   W1 in place 64M f64 1.14/1.19  1.15/1.15  1.13/1.18  1.21/1.24
   apply_qk 64M f32    0.91/0.75  0.90/0.74  0.88/0.71  0.91/0.71
   512 KiB is best or within 0.03 of it on every row; 1 MiB loses in place
   f64 (1.21/1.24), 128-256 KiB lose in place f32 quiet (1.30-1.33).
   Kept at 512 KiB. */
#ifndef POSENC_POSITION_BLOCK_BYTES
#define POSENC_POSITION_BLOCK_BYTES (512 * 1024)
#endif
/* Bytes of cos/sin rows per block of positions of the prefill walk below
   POSENC_STREAM_BYTES: a head's rows of a block are one kernel call, the
   block's cos/sin rows stay in L1 across the heads.  Sweep (W1 float32
   (1,32,32,128) and (1,32,256,128), time / limit, one thread, AVX-512,
   Zen 5 with a 48 KiB L1): 4, 8, 16, 32, 64 KiB gave out-of-place 1.65 1.59
   1.51 1.50 1.53 and 1.28 1.15 1.17 1.30 1.30, in place 1.21 1.15 1.02 1.01
   0.99 and 1.42 1.17 1.11 1.56 1.83; beside the hog 8, 16, 32 KiB gave 1.58
   1.49 1.44 and 1.25 1.30 1.48, in place 1.20 1.04 1.04 and 1.58 1.46 1.70;
   AVX2 and float64 also best or within noise of best at 16 KiB.  At 6-8 MiB
   the blocks still beat the row walk (1.1-1.5x against 1.4-1.6x). */
#ifndef POSENC_ROW_BLOCK_BYTES
#define POSENC_ROW_BLOCK_BYTES (16 * 1024)
#endif
/* Elements per pool work item of the loops whose rows are short (ALiBi,
   T5 buckets, the heads of a block of the in-cache RoPE walk:
   _ELEMENTS_PER_ITEM of _core).  Sweep 2026-12-01 of 4096,
   16384, 65536 on add_alibi (32,256,256) in place (16, 64, 256 rows an
   item), load average 8-9: noise only (ranges over processes up to
   0.3-22x); again with 7 processes, load average 0-1: 2.65/2.86,
   2.73/2.92, 2.64/2.90 (quiet/hog; ranges 0.3-0.6): equal.  No row of
   report.py runs these loops on more threads (the 2-thread row is W1 at
   64 MiB, past the block walk); kept at 16384. */
#ifndef POSENC_ELEMENTS_PER_ITEM
#define POSENC_ELEMENTS_PER_ITEM (1 << 14)
#endif
/* Rows by which a RotaryEmbedding's cos/sin cache grows, at least. */
#define POSENC_CACHE_GROWTH 1024
/* Largest cos/sin cache per dtype, in bytes. */
#define POSENC_CACHE_BYTES (64 * 1024 * 1024)

/* Asks for the cache lines POSENC_PREFETCH_DISTANCE bytes past
   [p, p + nbytes).  A row of pairs (x[i], x[i + n]) is read as two
   interleaved streams, which the hardware prefetchers follow poorly (float64
   rows ran at half the memory bandwidth); reading ahead of the row restores
   it.  Integer arithmetic: the address may lie past the array, and a
   prefetch never faults. */
static inline void posenc_prefetch_ahead(const void* p, Py_ssize_t nbytes) {
    uintptr_t ahead = (uintptr_t)p + POSENC_PREFETCH_DISTANCE;
    for (Py_ssize_t k = 0; k < nbytes; k += 64) POSENC_PREFETCH_LINE(ahead + k);
}

/* Orders the non-temporal stores of a work item before it ends. */
#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
static inline void posenc_sfence(void) { _mm_sfence(); }
#else
static inline void posenc_sfence(void) {}
#endif

#endif
