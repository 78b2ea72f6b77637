/* Scalar conversions and the AVX-512 nibble-pair decode shared by the kernels in this folder.
 * Static inline, so each kernel library is still one translation unit per source; the native
 * build caches key on this header's text too (quant/native.py). */
#ifndef EDGE_BF16_H
#define EDGE_BF16_H
#include <stdint.h>
#include <string.h>

static inline float edge_bf2f(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static inline uint16_t edge_f2bf(float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x7FFFFFu))
    return (uint16_t)((bits >> 16) | 0x40); /* NaN stays NaN */
  bits += 0x7FFFu + ((bits >> 16) & 1u);    /* round to nearest, ties to even */
  return (uint16_t)(bits >> 16);
}

/* fp16 -> fp32 without F16C (subnormals normalised, inf and NaN kept) */
static inline float edge_h2f_soft(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) { man <<= 1; exp--; }
      bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

#if defined(__AVX512BF16__) && defined(__AVX512VBMI__)
#include <immintrin.h>

/* Byte-permute indices for a 64-row block's 64-byte load of two k-steps: word 2j = byte j
   (row j at k), word 2j+1 = byte 32+j (row j at k+1); the odd bytes are zeroed by the mask. */
static inline void edge_pair_indices(__m512i* pick0, __m512i* pick1) {
  uint8_t idx[2][64] __attribute__((aligned(64)));
  for (int h = 0; h < 2; h++)
    for (int j = 0; j < 16; j++) {
      idx[h][4 * j] = (uint8_t)(16 * h + j); idx[h][4 * j + 1] = 0;
      idx[h][4 * j + 2] = (uint8_t)(32 + 16 * h + j); idx[h][4 * j + 3] = 0;
    }
  *pick0 = _mm512_load_si512((const void*)idx[0]);
  *pick1 = _mm512_load_si512((const void*)idx[1]);
}

/* The 64 bytes of k-steps (k, k+1) of a block as four vectors of bf16 words 128 + nibble,
   (k, k+1) paired per row: rows 0-15, 16-31 (low nibbles), 32-47, 48-63 (high nibbles). */
static inline __attribute__((always_inline)) void edge_nibble_words(const uint8_t* p, __m512i pick0,
                                                                    __m512i pick1, __m512i a[4]) {
  const __mmask64 even = 0x5555555555555555ull;
  const __m512i nib = _mm512_set1_epi16(0x000F);
  const __m512i bias = _mm512_set1_epi16(0x4300);
  const __m512i v = _mm512_loadu_si512((const void*)p);
  const __m512i w0 = _mm512_maskz_permutexvar_epi8(even, pick0, v);
  const __m512i w1 = _mm512_maskz_permutexvar_epi8(even, pick1, v);
  /* (w & 0xF) | 0x4300 in one ternary-logic op: A=w, B=nib, C=bias -> (A & B) | C = 0xEA */
  a[0] = _mm512_ternarylogic_epi32(w0, nib, bias, 0xEA);
  a[1] = _mm512_ternarylogic_epi32(w1, nib, bias, 0xEA);
  a[2] = _mm512_or_si512(_mm512_srli_epi16(w0, 4), bias);
  a[3] = _mm512_or_si512(_mm512_srli_epi16(w1, 4), bias);
}

/* acc[i] += the bf16 pair at xp (broadcast as an embedded {1to16} operand: no separate
   broadcast op) dotted with each pair of w[i], for the four word vectors of a k-pair */
static inline __attribute__((always_inline)) void edge_dot4(__m512 acc[4], const uint16_t* xp,
                                                            const __m512i w[4]) {
  const __m512bh w0 = (__m512bh)w[0], w1 = (__m512bh)w[1], w2 = (__m512bh)w[2], w3 = (__m512bh)w[3];
  __asm__("vdpbf16ps %4%{1to16%}, %5, %0\n\t"
          "vdpbf16ps %4%{1to16%}, %6, %1\n\t"
          "vdpbf16ps %4%{1to16%}, %7, %2\n\t"
          "vdpbf16ps %4%{1to16%}, %8, %3"
          : "+v"(acc[0]), "+v"(acc[1]), "+v"(acc[2]), "+v"(acc[3])
          : "m"(*(const uint32_t*)xp), "v"(w0), "v"(w1), "v"(w2), "v"(w3));
}

/* 16 fp32 lanes rounded to nearest even bf16 and stored */
static inline void edge_store_bf16x16(uint16_t* y, __m512 f) {
  __m512i u = _mm512_castps_si512(f);
  u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF),
                                           _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
  _mm256_storeu_si256((__m256i*)y, _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
}
#endif

#if defined(__AVX512BF16__) && defined(__AVX512VBMI__) && defined(__AVX512VNNI__)
#include <stdlib.h>
/* The int8-activation products (int4_gemv.c, lowbit_gemv.c) */

/* Two-source byte-permute indices for four k-steps of a block (128 bytes: k-step t at 32 t):
   lane j holds the bytes of column j (rows j, j+32) at k-steps 0..3, j = 0..15 for lo, 16..31
   for hi. */
static inline void edge_act8_indices(__m512i* lo, __m512i* hi) {
  uint8_t idx[2][64] __attribute__((aligned(64)));
  for (int h = 0; h < 2; h++)
    for (int j = 0; j < 16; j++)
      for (int t = 0; t < 4; t++) idx[h][4 * j + t] = (uint8_t)(32 * t + 16 * h + j);
  *lo = _mm512_load_si512((const void*)idx[0]);
  *hi = _mm512_load_si512((const void*)idx[1]);
}

/* acc += u . the four int8 activations at xq, broadcast as an embedded {1to16} operand
   (VPDPBUSD: unsigned bytes u against signed bytes xq, four per 32-bit lane) */
#define EDGE_ACT8_DOT(acc, u, xq) \
  __asm__("vpdpbusd %1%{1to16%}, %2, %0" : "+v"(acc) : "m"(*(const int32_t*)(xq)), "v"(u))

/* The int8 form of M activation rows, in one allocation (free(d) releases it): q their int8
   values [M][k]; per group [M][groups], d the steps, sq the sums of q (both from
   edge_act8_quantize_row) and sx the exact sums of x (filled by a kernel that reads them). */
typedef struct {
  float* d;
  float* sx;
  int32_t* sq;
  int8_t* q;
} edge_act8_rows;

static inline int edge_act8_alloc(edge_act8_rows* r, int64_t M, int64_t k, int64_t groups) {
  float* base = (float*)malloc(sizeof(float) * 2 * M * groups + sizeof(int32_t) * M * groups + (size_t)(M * k));
  if (!base) return -1;
  r->d = base;
  r->sx = base + M * groups;
  r->sq = (int32_t*)(base + 2 * M * groups);
  r->q = (int8_t*)(r->sq + M * groups);
  return 0;
}

/* Row m of X rounded to int8 per group of kg (a multiple of 16): the step d = max|x| / 127 (0
   for an all-zero group, whose values are then 0), q = x / d to nearest (ties to even: the
   conversion's default rounding, as nearbyintf), and the group's sum of q. Sixteen values per
   instruction: a prefill call rounds hundreds of rows, a decode call's row sits on the
   critical path before the product. The tests' references read the same rule. */
static inline void edge_act8_quantize_row(const uint16_t* x, int64_t k, int64_t kg, int8_t* q, float* d, int32_t* sq) {
  const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
  for (int64_t g = 0; g < k / kg; g++) {
    const uint16_t* xg = x + g * kg;
    __m512 amax = _mm512_setzero_ps();
    for (int64_t j = 0; j < kg; j += 16)
      amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_castsi512_ps(_mm512_slli_epi32(
                                   _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(xg + j))), 16))));
    const float step = _mm512_reduce_max_ps(amax) / 127.0f, inv = step > 0.0f ? 1.0f / step : 0.0f;
    const __m512 vinv = _mm512_set1_ps(inv);
    __m512i sum = _mm512_setzero_si512();
    for (int64_t j = 0; j < kg; j += 16) {
      const __m512 v = _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(xg + j))), 16));
      __m512i r = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      r = _mm512_max_epi32(_mm512_min_epi32(r, lim), nlim);
      sum = _mm512_add_epi32(sum, r);
      _mm_storeu_si128((__m128i*)(q + g * kg + j), _mm512_cvtepi32_epi8(r));
    }
    d[g] = step;
    sq[g] = _mm512_reduce_add_epi32(sum);
  }
}

#endif

#endif
