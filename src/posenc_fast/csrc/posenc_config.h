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

/* Rows per parallel work item of the general rotation kernel. */
#ifndef POSENC_ROW_CHUNK
#define POSENC_ROW_CHUNK 256
#endif
/* Results at least this large are written with non-temporal stores, and
   their rows take the scalar half-layout loops (faster past the caches). */
#ifndef POSENC_STREAM_BYTES
#define POSENC_STREAM_BYTES (16 * 1024 * 1024)
#endif
/* Inputs at least this large (past L2) are prefetched ahead of each row. */
#ifndef POSENC_PREFETCH_BYTES
#define POSENC_PREFETCH_BYTES (1024 * 1024)
#endif
/* 6-8 KiB was best for both dtypes in a sweep from 2 to 16 KiB (W1, 64 MiB). */
#ifndef POSENC_PREFETCH_DISTANCE
#define POSENC_PREFETCH_DISTANCE 8192
#endif
/* Bytes of cos/sin rows per work item of the blocked walks: half an L2, the
   other half holds the rows of x streaming through (with 1 MiB, float64 in
   place ran ~10% slower on a 1 MiB L2). */
#ifndef POSENC_POSITION_BLOCK_BYTES
#define POSENC_POSITION_BLOCK_BYTES (512 * 1024)
#endif
/* Elements per pool work item of the loops whose rows are short (ALiBi,
   T5 buckets: _ELEMENTS_PER_ITEM of _core). */
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
