/* float16 and bfloat16: 16-bit storage, float arithmetic.

   A value is widened to float exactly on load and rounded once, to nearest
   even, on store; from double (the tables' canonical values) it is rounded
   once too, through a float rounded to odd (float's 24 bits are enough for
   a correct second rounding to 11 or 8 bits).  NaN stays NaN, overflow gives
   inf.  Every ISA variant rounds alike: _Float16 where the compiler has it
   (F16C instructions with -mf16c), integer code otherwise. */
#ifndef POSENC_HALF_TYPES_H
#define POSENC_HALF_TYPES_H

#include "posenc_config.h"

/* float rounded to odd: the float nearest d toward zero, its last bit set
   if that is inexact. */
static inline float posenc_float_round_to_odd(double d) {
    float f = (float)d;
    if ((double)f != d && d == d && f - f == 0.0f) {  /* inexact, not NaN, f finite */
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        if (fabs((double)f) > fabs(d)) u -= 1;  /* rounded away from zero: step back */
        u |= 1;
        memcpy(&f, &u, sizeof f);
    }
    return f;
}

/* ---- bfloat16 (ml_dtypes.bfloat16: NumPy type number known at run time) ---- */
typedef uint16_t posenc_bf16;
static int posenc_bf16_typenum = -1;

static inline float posenc_load_bf16(posenc_bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline posenc_bf16 posenc_store_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (posenc_bf16)((u >> 16) | 0x0040u);  /* quiet NaN */
    return (posenc_bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline posenc_bf16 posenc_from_double_bf16(double d) {
    return posenc_store_bf16(posenc_float_round_to_odd(d));
}

/* ---- float16 (NumPy's float16) ---- */
#if defined(__FLT16_MANT_DIG__) && !defined(POSENC_SOFT_FLOAT16)
typedef _Float16 posenc_f16;
#define posenc_load_f16(h) ((float)(h))
#define posenc_store_f16(f) ((posenc_f16)(float)(f))
#else
typedef uint16_t posenc_f16;
static inline float posenc_load_f16(posenc_f16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu, u;
    float f;
    if (exponent == 0x1f) {
        u = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0) {
        u = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else {  /* zero or subnormal: mantissa * 2**-24, exact */
        f = (float)mantissa * 5.9604644775390625e-08f;
        memcpy(&u, &f, sizeof u);
        u |= sign;
    }
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline posenc_f16 posenc_store_f16(float f) {
    uint32_t u, a, sign, q, rest, half;
    int shift;
    memcpy(&u, &f, sizeof u);
    sign = (u >> 16) & 0x8000u;
    a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (posenc_f16)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  /* NaN */
    if (a >= 0x477ff000u) return (posenc_f16)(sign | 0x7c00u);  /* >= 65520: inf */
    if (a >= 0x38800000u) {  /* normal: rebias the exponent, round 13 bits away */
        a -= 0x38000000u;
        q = a >> 13;
        rest = a & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (q & 1u))) q++;
        return (posenc_f16)(sign | q);
    }
    if (a <= 0x33000000u) return (posenc_f16)sign;  /* <= 2**-25: zero (ties to even) */
    shift = 126 - (int)(a >> 23);  /* subnormal: units of 2**-24 */
    a = (a & 0x7fffffu) | 0x800000u;
    q = a >> shift;
    rest = a & ((1u << shift) - 1);
    half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) q++;
    return (posenc_f16)(sign | q);
}
#endif
#define posenc_from_double_f16(d) posenc_store_f16(posenc_float_round_to_odd(d))

/* ---- rows of half values widened to float and narrowed back ----
   The rotation of half rows runs the float32 row kernels on chunks widened
   into local arrays (bitwise the arithmetic of loading each value as float),
   then narrows once.  F16C converts 8 float16 values per instruction; GCC 12
   does not vectorise _Float16 conversions by itself.  The bfloat16 loops
   follow the vectors below. */
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif
static inline void posenc_widen_f16(const posenc_f16* src, float* dst, Py_ssize_t n) {
    Py_ssize_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(src + i))));
#endif
    for (; i < n; i++) dst[i] = posenc_load_f16(src[i]);
}
static inline void posenc_narrow_f16(const float* src, posenc_f16* dst, Py_ssize_t n) {
    Py_ssize_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)  /* 0: round to nearest even */
        _mm_storeu_si128((__m128i*)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), 0));
#endif
    for (; i < n; i++) dst[i] = posenc_store_f16(src[i]);
}

/* ---- half rows in vector registers ----------------------------------------
   For the rotation rows (posenc_kernels.h): POSENC_HV_LANES floats per
   vector (16 with AVX-512, 8 with AVX2) loaded from half values, rotated,
   rounded as above lane by lane, two vectors packed into posenc_hv_packed
   (2 * POSENC_HV_LANES half values) to store; interleaved pairs through
   load_pairs/pack_pairs (float16's: posenc_kernels.h).  bfloat16 rounds with
   integer operations, or in the avx512bf16 variant (-mavx512bf16) by
   vcvtne2ps2bf16: it gives these bits for every float32 but the nonzero
   subnormals, which it reads as zero (all 2^32 inputs on an AMD Zen 4,
   bench/README.md), so a pack whose result holds a zero takes the integer
   way (a test of the result, not of each input: a 16-token bfloat16 decode
   step 7.3-8.0 -> 6.6-6.8 us on an Intel Xeon model 0xA7). */
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define POSENC_HV_LANES 16
#define POSENC_HV_BF16 1
#define POSENC_HV_F16 1
typedef __m512 posenc_hv;
typedef __m512i posenc_hv_packed;
#define posenc_hv_load_f32 _mm512_loadu_ps
#define posenc_hv_store_f32 _mm512_storeu_ps
#define posenc_hv_mul _mm512_mul_ps
#define posenc_hv_add _mm512_add_ps
#define posenc_hv_sub _mm512_sub_ps
#define posenc_hv_set1 _mm512_set1_ps
static inline posenc_hv posenc_hv_load_bf16(const posenc_bf16* p) {
    __m256i h = _mm256_loadu_si256((const __m256i*)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
/* The bfloat16 bit patterns of v, rounded to nearest even, in the high
   16 bits of each 32-bit lane (a NaN: its high bits, the quiet bit set). */
static inline __m512i posenc_hv_round_bf16(posenc_hv v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_mask_or_epi32(rounded, nan, u, _mm512_set1_epi32(0x400000));
}
#if defined(__AVX512BF16__)
/* Whether vcvtne2ps2bf16's result holds no zero of either sign: it reads a
   subnormal as zero, and rounds no other float32 to zero, so a result
   without zeros is the rounding's (one test of the result, not one of each
   input; a pack holding a true zero takes the integer way too). */
static inline int posenc_hv_no_zero_bf16(__m512i packed) {
    return _mm512_testn_epi16_mask(packed, _mm512_set1_epi16(0x7fff)) == 0;
}
#endif
static inline posenc_hv_packed posenc_hv_pack2_bf16(posenc_hv v0, posenc_hv v1) {
    const __m512i high_words = _mm512_set_epi16(  /* the odd 16-bit lanes of v0, then of v1 */
        63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33,
        31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
#if defined(__AVX512BF16__)
    __m512i fast = (__m512i)_mm512_cvtne2ps_pbh(v1, v0);
    if (__builtin_expect(posenc_hv_no_zero_bf16(fast), 1))
        return fast;
#endif
    return _mm512_permutex2var_epi16(posenc_hv_round_bf16(v0), high_words,
                                     posenc_hv_round_bf16(v1));
}
/* Interleaved pairs: 2 * POSENC_HV_LANES bfloat16 values as 32-bit lanes,
   the first of a pair in the low half: widened by a shift and a mask. */
static inline void posenc_hv_load_pairs_bf16(const posenc_bf16* p, posenc_hv* a, posenc_hv* b) {
    __m512i x = _mm512_loadu_si512(p);
    *a = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    *b = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
}
static inline posenc_hv_packed posenc_hv_pack_pairs_bf16(posenc_hv ra, posenc_hv rb) {
#if defined(__AVX512BF16__)
    const __m512i zip = _mm512_set_epi16(  /* ra's value k to lane 2k, rb's to lane 2k + 1 */
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
        23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512i fast = (__m512i)_mm512_cvtne2ps_pbh(rb, ra);
    if (__builtin_expect(posenc_hv_no_zero_bf16(fast), 1))
        return _mm512_permutexvar_epi16(zip, fast);
#endif
    return _mm512_mask_blend_epi16(0xAAAAAAAAu, _mm512_srli_epi32(posenc_hv_round_bf16(ra), 16),
                                   posenc_hv_round_bf16(rb));
}
static inline posenc_hv posenc_hv_load_f16(const posenc_f16* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}
static inline posenc_hv_packed posenc_hv_pack2_f16(posenc_hv v0, posenc_hv v1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtps_ph(v0, 0)),
                              _mm512_cvtps_ph(v1, 0), 1);  /* 0: to nearest even */
}
static inline void posenc_hv_store(void* p, posenc_hv_packed v) {
    _mm512_storeu_si512(p, v);
}
/* The first POSENC_HV_LANES half values of v. */
static inline void posenc_hv_store_low(void* p, posenc_hv_packed v) {
    _mm256_storeu_si256((__m256i*)p, _mm512_castsi512_si256(v));
}
/* Non-temporal stores to a 16-byte aligned p. */
static inline void posenc_hv_stream(void* p, posenc_hv_packed v) {
    _mm_stream_si128((__m128i*)p, _mm512_castsi512_si128(v));
    _mm_stream_si128((__m128i*)p + 1, _mm512_extracti32x4_epi32(v, 1));
    _mm_stream_si128((__m128i*)p + 2, _mm512_extracti32x4_epi32(v, 2));
    _mm_stream_si128((__m128i*)p + 3, _mm512_extracti32x4_epi32(v, 3));
}
#elif defined(__AVX2__)
#define POSENC_HV_LANES 8
#define POSENC_HV_BF16 1
typedef __m256 posenc_hv;
typedef __m256i posenc_hv_packed;
#define posenc_hv_load_f32 _mm256_loadu_ps
#define posenc_hv_store_f32 _mm256_storeu_ps
#define posenc_hv_mul _mm256_mul_ps
#define posenc_hv_add _mm256_add_ps
#define posenc_hv_sub _mm256_sub_ps
#define posenc_hv_set1 _mm256_set1_ps
/* Eight bfloat16 values into the high halves of eight float lanes: the 16 bytes in both 128-bit
   lanes (a broadcast load), one byte shuffle (zero-extending and shifting took two operations:
   a row of bfloat16 in cache 2-4% faster, AMD Zen 3). */
static inline posenc_hv posenc_hv_load_bf16(const posenc_bf16* p) {
    const __m256i high_halves = _mm256_setr_epi8(
        -128, -128, 0, 1, -128, -128, 2, 3, -128, -128, 4, 5, -128, -128, 6, 7,
        -128, -128, 8, 9, -128, -128, 10, 11, -128, -128, 12, 13, -128, -128, 14, 15);
    __m256i h = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)p));
    return _mm256_castsi256_ps(_mm256_shuffle_epi8(h, high_halves));
}
/* The bfloat16 bit patterns of v, rounded to nearest even, in the high 16 bits of each 32-bit lane
   (as AVX-512's); `nan`: its NaN lanes made quiet NaNs (else the rounding of a NaN may carry into
   its sign). */
static inline __m256i posenc_hv_round_bf16(posenc_hv v, int nan) {
    __m256i u = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
    if (!nan) return rounded;
    __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
    return _mm256_blendv_epi8(rounded, quiet, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
/* Whether a lane of v0 or v1 is NaN: one comparison for both (a NaN is rare; its blend is not). */
static inline int posenc_hv_any_nan(posenc_hv v0, posenc_hv v1) {
    return __builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(v0, v1, _CMP_UNORD_Q)) != 0, 0);
}
/* packus works within 128-bit lanes, the permute puts them in order. */
static inline posenc_hv_packed posenc_hv_pack2_bf16(posenc_hv v0, posenc_hv v1) {
    int nan = posenc_hv_any_nan(v0, v1);
    return _mm256_permute4x64_epi64(
        _mm256_packus_epi32(_mm256_srli_epi32(posenc_hv_round_bf16(v0, nan), 16),
                            _mm256_srli_epi32(posenc_hv_round_bf16(v1, nan), 16)), 0xD8);
}
static inline void posenc_hv_load_pairs_bf16(const posenc_bf16* p, posenc_hv* a, posenc_hv* b) {
    __m256i x = _mm256_loadu_si256((const __m256i*)p);
    *a = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    *b = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xffff0000u)));
}
/* A pair's second value is in the high halves already: a shift and a blend (was a shift back and
   an OR). */
static inline posenc_hv_packed posenc_hv_pack_pairs_bf16(posenc_hv ra, posenc_hv rb) {
    int nan = posenc_hv_any_nan(ra, rb);
    return _mm256_blend_epi16(_mm256_srli_epi32(posenc_hv_round_bf16(ra, nan), 16),
                              posenc_hv_round_bf16(rb, nan), 0xAA);
}
#if defined(__F16C__)
#define POSENC_HV_F16 1
static inline posenc_hv posenc_hv_load_f16(const posenc_f16* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
}
static inline posenc_hv_packed posenc_hv_pack2_f16(posenc_hv v0, posenc_hv v1) {
    return _mm256_set_m128i(_mm256_cvtps_ph(v1, 0), _mm256_cvtps_ph(v0, 0));  /* 0: to nearest even */
}
#endif
static inline void posenc_hv_store(void* p, posenc_hv_packed v) {
    _mm256_storeu_si256((__m256i*)p, v);
}
static inline void posenc_hv_store_low(void* p, posenc_hv_packed v) {
    _mm_storeu_si128((__m128i*)p, _mm256_castsi256_si128(v));
}
static inline void posenc_hv_stream(void* p, posenc_hv_packed v) {
    _mm_stream_si128((__m128i*)p, _mm256_castsi256_si128(v));
    _mm_stream_si128((__m128i*)p + 1, _mm256_extracti128_si256(v, 1));
}
#endif
#if defined(POSENC_HV_LANES)
/* One vector of pairs (a, b) rotated by (c, s): the scalar loops' operations. */
POSENC_ALWAYS_INLINE void posenc_hv_rotate(posenc_hv a, posenc_hv b, posenc_hv c, posenc_hv s,
                                          int inverse, posenc_hv* ra, posenc_hv* rb) {
    if (inverse) {
        *ra = posenc_hv_add(posenc_hv_mul(a, c), posenc_hv_mul(b, s));
        *rb = posenc_hv_sub(posenc_hv_mul(b, c), posenc_hv_mul(a, s));
    } else {
        *ra = posenc_hv_sub(posenc_hv_mul(a, c), posenc_hv_mul(b, s));
        *rb = posenc_hv_add(posenc_hv_mul(b, c), posenc_hv_mul(a, s));
    }
}
#endif
/* bfloat16 rows widened and narrowed by the vectors above where the variant has them (bitwise the
   scalar loops: the rotation rows' conversions).  GCC's own vectors of the narrowing loop took a
   third of the fused q/k norm of a bfloat16 row (AMD Zen 3). */
static inline void posenc_widen_bf16(const posenc_bf16* POSENC_R src, float* POSENC_R dst,
                                     Py_ssize_t n) {
    Py_ssize_t i = 0;
#if defined(POSENC_HV_BF16)
    for (; i + POSENC_HV_LANES <= n; i += POSENC_HV_LANES)
        posenc_hv_store_f32(dst + i, posenc_hv_load_bf16(src + i));
#endif
    for (; i < n; i++) dst[i] = posenc_load_bf16(src[i]);
}
static inline void posenc_narrow_bf16(const float* POSENC_R src, posenc_bf16* POSENC_R dst,
                                      Py_ssize_t n) {
    Py_ssize_t i = 0;
#if defined(POSENC_HV_BF16)
    for (; i + 2 * POSENC_HV_LANES <= n; i += 2 * POSENC_HV_LANES)
        posenc_hv_store(dst + i, posenc_hv_pack2_bf16(posenc_hv_load_f32(src + i),
                                                      posenc_hv_load_f32(src + i + POSENC_HV_LANES)));
#endif
    for (; i < n; i++) dst[i] = posenc_store_bf16(src[i]);
}

/* ---- float32, float64: their own arithmetic types ---- */
#define posenc_load_f32(v) (v)
#define posenc_load_f64(v) (v)
#define posenc_store_f32(v) ((float)(v))
#define posenc_store_f64(v) ((double)(v))
#define posenc_from_double_f32(d) ((float)(d))
#define posenc_from_double_f64(d) (d)

#endif
