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

#if defined(__AVX512BF16__)  /* implies __AVX512F__ */
#define POSENC_SIMD "avx512bf16"
#elif defined(__AVX512F__)
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
/* The cache level the rows' prefetches fill (__builtin_prefetch's locality:
   3 all levels, 2 and 1 L2 and below).  Sweep on the Intel Xeon of
   bench/README.md (bench/sweep.py, 3 processes, one thread, quiet), 3 / 2 / 1:
   W1 float64 out of place 1.47 / 1.35 / 1.25, in place 1.12 / 1.03 / 1.02,
   float32 in place 1.13 / 1.09 / 1.09, bfloat16 out of place 1.19 / 1.26 /
   1.33, the rest within noise.  Kept at 3: mixed there, and on Zen 4 and later
   the L2 hints put lines in L2 only and are sometimes dropped (not measured
   on the AMD EPYC). */
#ifndef POSENC_PREFETCH_LOCALITY
#define POSENC_PREFETCH_LOCALITY 3
#endif
#define POSENC_PREFETCH_LINE(address) __builtin_prefetch((const void*)(address), 0, POSENC_PREFETCH_LOCALITY)
#define POSENC_NOINLINE __attribute__((noinline))
#define POSENC_ALIGNED(n) __attribute__((aligned(n)))
#else
#define POSENC_NOINLINE __declspec(noinline)
#define POSENC_ALIGNED(n) __declspec(align(n))
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
   caches (of POSENC_SCALAR_IN_PLACE_ROW_BYTES or more) start where x
   reaches a multiple of it (posenc_peel: a scalar head first), so that no
   full-width store splits a cache line: NumPy aligns
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

/* Fetch the cache lines of `nbytes` from `out` for writing.  Out of place, vector stores
   that split cache lines the result does not hold yet stall: W1 half layout in cache,
   out 16 bytes past a line, ran 2.4x a copy on an Intel Xeon (model 0xcf; AVX2 2.8x);
   with the row's lines fetched first 1.1x, as an aligned out (AMD not measured). */
static inline void posenc_prefetch_for_write(const void* out, Py_ssize_t nbytes) {
#if defined(__GNUC__) || defined(__clang__)
    for (Py_ssize_t k = 0; k <= nbytes; k += 64)
        __builtin_prefetch((const char*)out + k, 1);
#else
    (void)out;
    (void)nbytes;
#endif
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
   Sweep 2026-12-01 of 4 MiB, 16 MiB, 32 MiB, 1 GiB (load average 0-2;
   bench/sweeps.md "POSENC_STREAM_BYTES: again"): never streaming (1 GiB)
   loses 30-70% on the 64M rows out of place (W1 f32 1.48/1.12 against
   0.87/0.87, quiet/hog); streaming from 4 MiB loses 20-45% on the 4M rows
   (W1 oop 2.17/2.24 against 1.61/1.56); 16M and 32M differ only in
   apply_qk's 16 MiB k, mixed.  Kept at 16 MiB.  On the Intel Xeon (2026-12-02,
   bench/sweeps.md) 16 MiB and never streaming run every 64M row alike; on the
   Intel Xeon model 0xA7 (2026-12-07, a 480 MiB L3: glibc's memcpy streams from
   181 MiB) 16 MiB / 256 MiB / never read W1 float32 out of place 0.93 / 1.05 /
   1.01, W5 (131072,128) 0.75 / 1.51 / 1.53, the half types out of place
   1.09-1.68 / 1.47-1.54 / 1.40-1.50: 16 MiB for the tables and in place on
   both CPUs, not derived from the L3's size.  Out-of-place rotations there
   stream from 48 MiB (_dispatch.block_bytes, "stream": into a result the
   call before had left in the cache, non-temporal stores of 32-40 MiB ran
   2.2x slower than plain ones; from 64 MiB they win); the build's value, a
   CPU measured otherwise takes its own at import, unless the build was
   given one (-D). */
#ifndef POSENC_STREAM_BYTES
#define POSENC_STREAM_BYTES (16 * 1024 * 1024)
#define POSENC_STREAM_BYTES_GIVEN 0
#else
#define POSENC_STREAM_BYTES_GIVEN 1
#endif
/* Inputs at least this large are prefetched ahead of each row they rotate
   one by one (rows not taken by the block walks).  Sweeps 2026-12-01 of
   256 KiB-8 MiB, then 512 KiB against 1 MiB three times (AVX-512 and AVX2,
   5 and 7 processes; bench/sweeps.md): on the row walk of that day 512 KiB
   ran the 512K rows 2-16% faster in all 18 pairs (W1 in place 512K
   1.98/2.34 against 2.30/2.68, quiet/hog), 8 MiB lost up to 35% on the 4M
   rows; 512 KiB since (was 1 MiB).  After the in-cache block walk took those
   rows (commit 90551d9), 256 KiB / 512 KiB / 1 MiB ran every cache row
   within noise (W1 oop 4M 1.31/1.14/1.13 quiet).  Zen 4 (2026-12-06):
   never prefetching loses float64 in place 1.70 -> 2.39. */
#ifndef POSENC_PREFETCH_BYTES
#define POSENC_PREFETCH_BYTES (512 * 1024)
#endif
/* How far ahead of a row its prefetches reach.  Sweep 2026-12-01 of 4, 6,
   8, 16 KiB (load average 2-6; bench/sweeps.md): 8192 is best quiet on all
   8 rows (W1 in place 64M f32 1.42/1.29/1.24/1.28, f64 1.24/1.19/1.16/1.23)
   and best or within the spread under the hog, except W1 in place 4M (2.06
   against 1.87 at 4 KiB, ranges 1.86-10.1 and 1.84-2.04).  An earlier sweep
   from 2 to 16 KiB found 6-8 KiB best.  AMD EPYC Zen 4 (2026-12-06, quiet,
   bench/sweeps.md): 4 KiB 0.03-0.18 better on float32 rows, worse on float64
   in place (1.62 against 1.41) and head_dim 256; 16-32 KiB worse.  Intel
   Xeon model 0xA7 (2026-12-07, bench/sweeps.md): 4 / 8 / 16 KiB within each
   other's ranges on the in-place rows but float64 (1.38 / 1.46 / 1.41). */
#ifndef POSENC_PREFETCH_DISTANCE
#define POSENC_PREFETCH_DISTANCE 8192
#endif
/* Bytes of cos/sin rows per work item of the blocked walks: half an L2, the
   other half holds the rows of x streaming through.  Sweep 2026-12-01 of
   128 KiB-1 MiB (7 processes, load average 2-3; bench/sweeps.md): 512 KiB
   is best or within 0.03 of it on every 64M row; 1 MiB loses in place f64
   (1.21/1.24 against 1.13/1.18, quiet/hog), 128-256 KiB lose in place f32
   quiet (1.30-1.33 against 1.24).  Kept at 512 KiB.  The build's value: in
   place, a CPU measured otherwise takes its own at import
   (_dispatch.block_bytes: 4 MiB on AMD Zen 4), unless the build was
   given one (-D, as bench/sweep.py does). */
#ifndef POSENC_POSITION_BLOCK_BYTES
#define POSENC_POSITION_BLOCK_BYTES (512 * 1024)
#define POSENC_POSITION_BLOCK_BYTES_GIVEN 0
#else
#define POSENC_POSITION_BLOCK_BYTES_GIVEN 1
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
   the blocks still beat the row walk (1.1-1.5x against 1.4-1.6x).  On the
   AMD EPYC Zen 3 (32 KiB L1d; bench/sweeps.md, 2026-12-06, quiet and hog)
   8, 16 and 32 KiB run the cache rows within each other's ranges.  On the AMD
   EPYC Zen 4 8 KiB runs them 0.05-0.35x lower (bench/sweeps.md): the build's
   value, a CPU measured otherwise takes its own at import
   (_dispatch.block_bytes), unless the build was given one (-D). */
#ifndef POSENC_ROW_BLOCK_BYTES
#define POSENC_ROW_BLOCK_BYTES (16 * 1024)
#define POSENC_ROW_BLOCK_BYTES_GIVEN 0
#else
#define POSENC_ROW_BLOCK_BYTES_GIVEN 1
#endif
/* The walks past the caches take half-layout rows of at most
   POSENC_GROUP_ROW_BYTES (interleaved ones: POSENC_GROUP_INTERLEAVED_ROW_BYTES)
   POSENC_HEAD_GROUP heads at a time (each head a position in turn, or a few
   rows of POSENC_BLOCK_ROW_BYTES or less), without software prefetch, so
   that a cos/sin row read by one head is still in L1 for the others.  On
   the AMD EPYC Zen 4 (bench/sweeps.md, 2026-12-06) a head at a time read
   each cos/sin row from L2 or L3 and ran W1 float32 in place at 1.4x its
   limit, out of place at 1.25x its copy, bfloat16 out of place at 1.55x;
   four heads 1.05-1.1x, 0.9x and 1.15x; 2 and 8 heads between.  Rows of
   768 bytes gained too (head_dim 192 float32 in place 1.46x -> 1.16x), but
   half-layout float32 / float64 rows of 1 KiB lost (head_dim 256 in place
   1.57x -> 2.46x, out of place 1.24x -> 1.76x: kept a head at a time,
   prefetched), where interleaved ones of 1 and 2 KiB gained (head_dim 256
   in place 1.68x -> 1.33x, out of place 1.11x -> 0.91x): one size per
   layout.  0 (no grouping) is the build's value: a CPU measured otherwise
   takes its own at import (_dispatch.block_bytes: 768 and 2048 bytes on AMD
   Zen 4), unless the build was given one (-D). */
#ifndef POSENC_HEAD_GROUP
#define POSENC_HEAD_GROUP 4
#endif
/* Bytes of a group's rows per turn (rows of POSENC_BLOCK_ROW_BYTES or less
   go a few positions of a head per kernel call): on the Zen 4, W1 head_dim 64
   float32 in place (rows of 256 bytes) ran 1.11-1.14x its limit with 2 KiB
   turns, 1.12-1.16x with 4 KiB, 1.15-1.20x with 8 KiB, 1.37-1.41x with 16 KiB
   (a head at a time: 1.25-1.27x). */
#ifndef POSENC_GROUP_TURN_BYTES
#define POSENC_GROUP_TURN_BYTES 2048
#endif
#ifndef POSENC_GROUP_ROW_BYTES
#define POSENC_GROUP_ROW_BYTES 0
#define POSENC_GROUP_ROW_BYTES_GIVEN 0
#else
#define POSENC_GROUP_ROW_BYTES_GIVEN 1
#endif
#ifndef POSENC_GROUP_INTERLEAVED_ROW_BYTES
#define POSENC_GROUP_INTERLEAVED_ROW_BYTES 0
#define POSENC_GROUP_INTERLEAVED_ROW_BYTES_GIVEN 0
#else
#define POSENC_GROUP_INTERLEAVED_ROW_BYTES_GIVEN 1
#endif
/* Half-layout rows of at least this many bytes rotated in place past
   POSENC_STREAM_BYTES take the scalar row kernel (GCC's own vectors of a
   plain loop, after a scalar head to the vector width's alignment); shorter
   ones the explicit vectors (posenc_half_vectors: no head, the pairs past the
   last whole vector by one overlapping vector).  On a short row the scalar
   head and GCC's remainder loop cost more than the lines the unaligned
   vectors split.  Sweep on the AMD EPYC Zen 4 (2026-12-06, bench/sweeps.md,
   quiet, 3 processes): 0 / 448 / 2^30 read float32 head_dim 80 1.61 / 1.33 /
   1.32x, 96 1.37 / 1.22 / 1.26x, 100 1.51 / 1.29 / 1.21x, but 192 1.30 /
   1.36 / 1.69x, 256 1.39 / 1.47 / 2.15x and float64 128 1.29 / 1.51 (range
   1.25-1.53) / 1.78x.  Before the overlapping vector (the scalar kernel
   everywhere or nowhere): on the Zen 3 the vectors read head_dim 100 1.33x ->
   1.19x, 80 0.03-0.07x higher.  On the Intel Xeon model 0xA7 (2026-12-07,
   one process, the size switched between interleaved rounds) the vectors won
   rows of 512 bytes to 2 KiB (float64 head_dim 128 1.42 -> 1.27x, 256 1.50
   -> 1.34x, float32 128 1.17 -> 1.08x): the build's value, a CPU measured
   otherwise takes its own at import (_dispatch.block_bytes: 4096 there),
   unless the build was given one (-D). */
#ifndef POSENC_SCALAR_IN_PLACE_ROW_BYTES
#define POSENC_SCALAR_IN_PLACE_ROW_BYTES 512
#define POSENC_SCALAR_IN_PLACE_ROW_BYTES_GIVEN 0
#else
#define POSENC_SCALAR_IN_PLACE_ROW_BYTES_GIVEN 1
#endif
/* Rows of at most this many bytes, rotated in place past POSENC_STREAM_BYTES
   (the walk of position blocks across heads), go a head's rows of a block in
   one rotate_position call, not one row kernel call (and prefetch) a row: a
   row's own cost weighs most on short rows.  Sweep of 0, 256, 512 on the AMD
   EPYC Zen 3 (2026-12-06, bench/sweeps.md): 256 meets the in-place goals on
   every row quiet and beside the hog (0 misses float32 head_dim 64 and
   bfloat16 128 quiet: 1.39x, 1.37x against 1.26x, 1.09x), though beside the
   hog those rows read 0.1-0.16 higher than with 0 (within the ranges); 512
   loses head_dim 80, 96 and float32 128 (longer rows: their row kernel and
   prefetch run better past the caches).  Not measured on the Zen 5 or the
   Intel Xeon.  0: never. */
#ifndef POSENC_BLOCK_ROW_BYTES
#define POSENC_BLOCK_ROW_BYTES 256
#endif
/* Elements per pool work item of the loops whose rows are short (ALiBi,
   T5 buckets, the heads of a block of the in-cache RoPE walk:
   _rows_per_item of _core).  Sweep 2026-12-01 of 4096,
   16384, 65536 on add_alibi (32,256,256) in place (16, 64, 256 rows an
   item), load average 8-9: noise only (ranges over processes up to
   0.3-22x); again with 7 processes, load average 0-1: 2.65/2.86,
   2.73/2.92, 2.64/2.90 (quiet/hog; ranges 0.3-0.6): equal.  No row of
   report.py runs these loops on more threads (the 2-thread row is W1 at
   64 MiB, past the block walk); kept at 16384. */
/* Bytes of table rows per turn of add_position_table's walk over batches at
   the same positions: each batch adds a turn's rows while they are in L2,
   then the next turn (0: each batch whole, in turn).  On the Intel Xeon model
   0xA7 (2026-12-07, one process, interleaved) (8,2048,1024) float32 in place
   ran 1.54-1.79x its limit whole, 1.13-1.23x with turns of 128-512 KiB (1.30-
   1.43x with 1 MiB); on the AMD EPYC Zen 3 blocks of 64 KiB - 1 MiB ran 1.5-1.7x
   against 1.35x, on the Zen 4 turns of 8-16 KiB lost: 0 is the build's value,
   a CPU measured otherwise takes its own at import (_dispatch.block_bytes:
   256 KiB there), unless the build was given one (-D). */
#ifndef POSENC_ADD_BLOCK_BYTES
#define POSENC_ADD_BLOCK_BYTES 0
#define POSENC_ADD_BLOCK_BYTES_GIVEN 0
#else
#define POSENC_ADD_BLOCK_BYTES_GIVEN 1
#endif
/* Out-of-place half-type results (float16, bfloat16) of at least this many
   bytes, not streamed, whose rows would start off a 64-byte line, are written
   by whole lines (posenc_line_rows_ of posenc_position.h: no 64-byte store
   splits two lines; AVX-512 builds).  On the Intel Xeon model 0xA7
   (2026-12-07, NumPy's arrays 16 bytes past a line; each setting timed
   against its own copy, the settings alternating, 4 runs each / two builds
   alternating, 3 processes each), by lines / split: bfloat16 (1,32,4096,128)
   1.17-1.18x / 1.24-1.32x its copy and 1.24-1.25x / 1.31-1.37x, float16
   1.11-1.24x / 1.19-1.30x and 1.20-1.25x / 1.29-1.36x, head_dim 256
   1.23-1.24x / 1.22-1.25x (no gain), (1,32,256,128) 1.05-1.06x /
   1.10-1.13x, (1,32,128,128) 1.31-1.51x / 1.45-1.58x, 512 KiB and 256 KiB
   within noise (in cache a split store costs about the line's shift);
   report.py's rows 1.24-1.26x / 1.25-1.30x before, 1.13-1.15x / 1.09-1.11x
   after.  Interleaved rows gained nothing measurable: not taken.  0 (never)
   is the build's value: a CPU measured otherwise takes its own at import
   (_dispatch.block_bytes: 2 MiB there), unless the build was given one
   (-D). */
#ifndef POSENC_LINE_ROWS_BYTES
#define POSENC_LINE_ROWS_BYTES 0
#define POSENC_LINE_ROWS_BYTES_GIVEN 0
#else
#define POSENC_LINE_ROWS_BYTES_GIVEN 1
#endif
#ifndef POSENC_ELEMENTS_PER_ITEM
#define POSENC_ELEMENTS_PER_ITEM (1 << 14)
#endif
/* Rows by which a RotaryEmbedding's cos/sin cache grows, at least. */
#define POSENC_CACHE_GROWTH 1024
/* Largest cos/sin cache per dtype, in bytes. */
#define POSENC_CACHE_BYTES (64 * 1024 * 1024)

/* Asks for the cache lines of [from, from + nbytes) (posenc_prefetch_at), or
   POSENC_PREFETCH_DISTANCE bytes past [p, p + nbytes).  A row of pairs (x[i], x[i + n]) is read as two
   interleaved streams, which the hardware prefetchers follow poorly (float64
   rows ran at half the memory bandwidth); reading ahead of the row restores
   it.  Integer arithmetic: the address may lie past the array, and a
   prefetch never faults.  An unsigned address runs the loop, not a signed
   count: under the -fwrapv that Python's CFLAGS add, the counted loop
   compiled so that on an AMD EPYC Zen 3 W1 float64 in place ran 1.54x its
   limit against 1.38x (medians over 32 stack positions of the process, which
   move it by up to 0.4x; bench/sweeps.md 2026-12-05). */
static inline void posenc_prefetch_at(uintptr_t from, Py_ssize_t nbytes) {
    for (uintptr_t end = from + (uintptr_t)nbytes; from < end; from += 64) POSENC_PREFETCH_LINE(from);
}
static inline void posenc_prefetch_ahead(const void* p, Py_ssize_t nbytes) {
    posenc_prefetch_at((uintptr_t)p + POSENC_PREFETCH_DISTANCE, nbytes);
}

/* Orders the non-temporal stores of a work item before it ends. */
#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
static inline void posenc_sfence(void) { _mm_sfence(); }
#else
static inline void posenc_sfence(void) {}
#endif

#endif
