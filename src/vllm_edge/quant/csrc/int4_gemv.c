/* Few-row W4A16 product straight from the CPU tinygemm int4 layout: Y[M, N] = X[M, K] W^T.
 *
 * Layout as in int4_dequant.c: blocks of 64 output rows stored [K][32] bytes, byte (k, j) =
 * row j (low nibble) | row j+32 (high nibble); scales_and_zeros bf16 [K/kg][N][2];
 * w = (q - 8) * scale + zero.
 *
 * Why not tinygemm for decode: it converts every nibble to fp32 and runs at ~11 GB/s of
 * weights on two cores here, a quarter of the memory bandwidth. This kernel keeps the
 * weights in bf16 form: two k-steps of 64 rows are one 64-byte load; two zero-masked byte
 * permutes (VBMI) turn it into words pairing (k, k+1) per row, and each nibble becomes the
 * bf16 value 128 + q by OR-ing 0x4300 into it, so VDPBF16PS (AVX512-BF16) multiplies two
 * k-steps of 16 rows per instruction with no conversion. The x pair is an embedded
 * {1to16} broadcast operand (inline asm: compilers emit a separate broadcast otherwise).
 * Per group, sum_k w x = s * sum (128 + q) x + (z - 136 s) * sum x, in fp32. The 128
 * offset is exact in bf16 and costs ~7 bits of the fp32 accumulator, far below the bf16
 * output rounding.
 *
 * Variants timed while writing it (docs/design/cpu-int4.md): the masked permutes, the embedded broadcast and
 * the two-FMA group epilogue each shaved time; 6 rows per pass instead of 4, or unpacking
 * each group once into an L1 tile for all row chunks, did not.
 *
 * With AVX512-VNNI and the switch on (edge_int4_set_act8), each row of X is rounded to int8
 * per group instead, as llama.cpp rounds the activations it multiplies a 4-bit block by, and
 * VPDPBUSD multiplies four k-steps of 16 rows per instruction, nibble against int8: two
 * two-source byte permutes put four k-steps in its order and a mask or a shift and a mask
 * splits the nibbles, about half the instructions of the bf16 route. Per group, sum_k w x =
 * s d (sum q xq - 8 sum xq) + z sum x, d the row's step and xq its int8 values. Why: on a CPU
 * whose last-level cache holds a small model, the bf16 route is bound by instructions.
 *
 * Without AVX512-BF16 and VBMI edge_int4_gemv_supported() is 0 and the caller keeps tinygemm.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "edge_bf16.h"

/* groups ahead (0: no prefetch); set once at load (envs VLLM_EDGE_SCALE_PREFETCH), never
   while a product runs */
static int64_t edge_sz_ahead = 4;

void edge_int4_set_prefetch(int groups_ahead) { edge_sz_ahead = groups_ahead < 0 ? 0 : groups_ahead; }
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512BF16__) && defined(__AVX512VBMI__)
#include <immintrin.h>
#define EDGE_GEMV 1
#endif

#if defined(EDGE_GEMV) && defined(__AVX512VNNI__)
#define EDGE_INT4_ACT8 1
#endif

/* rows of X per pass over a block: 4 x 4 fp32 accumulators stay in registers */
#define GEMV_MAX_M 4

/* int8 activations and VPDPBUSD: set once at load (envs VLLM_EDGE_INT4_ACT8), never while a
   product runs */
static int act8_wanted = 0;

void edge_int4_set_act8(int on) { act8_wanted = on != 0; }

/* whether the product takes int8 activations here (wanted, and built with VNNI) */
int edge_int4_act8(void) {
#ifdef EDGE_INT4_ACT8
  return act8_wanted;
#else
  return 0;
#endif
}


int edge_int4_gemv_supported(void) {
#ifdef EDGE_GEMV
  return 1;
#else
  return 0;
#endif
}

#ifdef EDGE_GEMV
/* A block's scales are not next to its codes: group g of rows b*64.. sits at (g*N + b*64)*2,
   one 256-byte run every N*4 bytes, a stride the hardware prefetchers lose at page bounds.
   Fetched edge_sz_ahead groups early, they arrive with the codes. */
#define EDGE_SZ_PREFETCH(sz, gg, groups, n, b)                                            \
  do {                                                                                    \
    if (edge_sz_ahead && (gg) < (groups)) {                                                                \
      const char* pf_ = (const char*)((sz) + ((gg) * (n) + (b) * 64) * 2);                \
      _mm_prefetch(pf_, _MM_HINT_T0); _mm_prefetch(pf_ + 64, _MM_HINT_T0);               \
      _mm_prefetch(pf_ + 128, _MM_HINT_T0); _mm_prefetch(pf_ + 192, _MM_HINT_T0);        \
    }                                                                                     \
  } while (0)
/* sum of kg (a multiple of 32) bf16 values, in fp32 */
static inline float group_sum(const uint16_t* v, int64_t kg) {
  __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
  for (int64_t i = 0; i < kg; i += 32) {
    a = _mm512_add_ps(a, _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(v + i))), 16)));
    b = _mm512_add_ps(b, _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(v + i + 16))), 16)));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a, b));
}

/* Block b (64 output rows) for M rows of X (M <= GEMV_MAX_M); sx[m * groups + g] = sum of
   group g of x_m; pick0/pick1 from edge_pair_indices(). */
static inline __attribute__((always_inline)) void gemv_block_m(
    const uint8_t* packed, const uint16_t* sz, const uint16_t* x, const float* sx, uint16_t* y,
    int64_t n, int64_t k, int64_t kg, int64_t b, const int M, const __m512i pick0, const __m512i pick1) {
  const __m512i hi16 = _mm512_set1_epi32((int)0xFFFF0000u);
  const int64_t groups = k / kg;
  const uint8_t* pb = packed + b * k * 32;
  __m512 out[GEMV_MAX_M][4];
  for (int m = 0; m < M; m++)
    for (int i = 0; i < 4; i++) out[m][i] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; g++) {
    EDGE_SZ_PREFETCH(sz, g + edge_sz_ahead, groups, n, b);
    __m512 acc[GEMV_MAX_M][4];
    for (int m = 0; m < M; m++)
      for (int i = 0; i < 4; i++) acc[m][i] = _mm512_setzero_ps();
    for (int64_t kk = g * kg; kk < (g + 1) * kg; kk += 2) {
      __m512i a[4];
      edge_nibble_words(pb + kk * 32, pick0, pick1, a);
      for (int m = 0; m < M; m++) edge_dot4(acc[m], x + m * k + kk, a);
    }
    const uint16_t* szr = sz + (g * n + b * 64) * 2;
    for (int i = 0; i < 4; i++) {
      /* rows 16i..16i+15: accumulator i is low nibbles of rows 0-15, 16-31, high of 32-47, 48-63 */
      __m512i t = _mm512_loadu_si512((const void*)(szr + i * 32));
      __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(t, 16));
      __m512 z = _mm512_castsi512_ps(_mm512_and_si512(t, hi16));
      __m512 c = _mm512_fnmadd_ps(_mm512_set1_ps(136.0f), s, z);
      for (int m = 0; m < M; m++)
        out[m][i] = _mm512_fmadd_ps(c, _mm512_set1_ps(sx[m * groups + g]), _mm512_fmadd_ps(s, acc[m][i], out[m][i]));
    }
  }
  for (int m = 0; m < M; m++)
    for (int i = 0; i < 4; i++) edge_store_bf16x16(y + m * n + b * 64 + i * 16, out[m][i]);
}
#ifdef EDGE_INT4_ACT8
/* Block b (64 output rows) for M <= GEMV_MAX_M rows of X rounded to int8: xq their int8
   values, dx[m * groups + g] the step of group g of row m, sq the groups' sums of xq, sx their
   exact sums of x. */
static inline __attribute__((always_inline)) void act8_block_m(
    const uint8_t* packed, const uint16_t* sz, const int8_t* xq, const float* dx, const int32_t* sq,
    const float* sx, uint16_t* y, int64_t n, int64_t k, int64_t kg, int64_t b, const int M,
    const __m512i idx_lo, const __m512i idx_hi) {
  const __m512i hi16 = _mm512_set1_epi32((int)0xFFFF0000u);
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int64_t groups = k / kg;
  const uint8_t* pb = packed + b * k * 32;
  /* the fp32 sums live in memory between groups, as in lowbit_gemv.c's twin, where kept in
     registers beside the 16 accumulators they pushed the accumulators out to the stack around
     every VPDPBUSD at four rows */
  float out[GEMV_MAX_M * 64] __attribute__((aligned(64)));
  for (int j = 0; j < M * 64; j += 16) _mm512_store_ps(out + j, _mm512_setzero_ps());
  for (int64_t g = 0; g < groups; g++) {
    EDGE_SZ_PREFETCH(sz, g + edge_sz_ahead, groups, n, b);
    __m512i acc[GEMV_MAX_M][4];
    for (int m = 0; m < M; m++)
      for (int i = 0; i < 4; i++) acc[m][i] = _mm512_setzero_si512();
    for (int64_t kk = g * kg; kk < (g + 1) * kg; kk += 4) {
      const __m512i v0 = _mm512_loadu_si512((const void*)(pb + kk * 32));
      const __m512i v1 = _mm512_loadu_si512((const void*)(pb + kk * 32 + 64));
      const __m512i pa = _mm512_permutex2var_epi8(v0, idx_lo, v1), pc = _mm512_permutex2var_epi8(v0, idx_hi, v1);
      __m512i u[4];
      u[0] = _mm512_and_si512(pa, low);                         /* rows 0-15 */
      u[1] = _mm512_and_si512(pc, low);                         /* rows 16-31 */
      u[2] = _mm512_and_si512(_mm512_srli_epi16(pa, 4), low);   /* rows 32-47 */
      u[3] = _mm512_and_si512(_mm512_srli_epi16(pc, 4), low);   /* rows 48-63 */
      for (int m = 0; m < M; m++) {
        const int8_t* xm = xq + m * k + kk;
        EDGE_ACT8_DOT(acc[m][0], u[0], xm);
        EDGE_ACT8_DOT(acc[m][1], u[1], xm);
        EDGE_ACT8_DOT(acc[m][2], u[2], xm);
        EDGE_ACT8_DOT(acc[m][3], u[3], xm);
      }
    }
    const uint16_t* szr = sz + (g * n + b * 64) * 2;
    /* per row, once for the block's four quarters: its step, the step times the offset's part
       8 sum xq, and the exact sum of x */
    __m512 d[GEMV_MAX_M], dq[GEMV_MAX_M], sxv[GEMV_MAX_M];
    for (int m = 0; m < M; m++) {
      const int64_t mg = m * groups + g;
      d[m] = _mm512_set1_ps(dx[mg]);
      dq[m] = _mm512_set1_ps(dx[mg] * (float)(8 * sq[mg]));
      sxv[m] = _mm512_set1_ps(sx[mg]);
    }
    for (int i = 0; i < 4; i++) {
      const __m512i t = _mm512_loadu_si512((const void*)(szr + i * 32));
      const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(t, 16));
      const __m512 z = _mm512_castsi512_ps(_mm512_and_si512(t, hi16));
      for (int m = 0; m < M; m++) {
        /* the dot is exact in int32 (|q xq| <= 15 * 127 per product) and in fp32 */
        const __m512 dot = _mm512_fmsub_ps(_mm512_cvtepi32_ps(acc[m][i]), d[m], dq[m]);
        float* o = out + (m * 4 + i) * 16;
        _mm512_store_ps(o, _mm512_fmadd_ps(z, sxv[m], _mm512_fmadd_ps(s, dot, _mm512_load_ps(o))));
      }
    }
  }
  for (int m = 0; m < M; m++)
    for (int i = 0; i < 4; i++) edge_store_bf16x16(y + m * n + b * 64 + i * 16, _mm512_load_ps(out + (m * 4 + i) * 16));
}

#define ACT8_CASE(MM) \
  act8_block_m(packed, sz, r.q + m0 * k, r.d + m0 * groups, r.sq + m0 * groups, r.sx + m0 * groups, \
               y + m0 * n, n, k, kg, b, MM, idx_lo, idx_hi)

/* The product through int8 activations; 0, or -1 where it cannot run (no memory) */
static int act8_gemv(const uint8_t* packed, const uint16_t* sz, const uint16_t* x, uint16_t* y,
                     int64_t M, int64_t n, int64_t k, int64_t kg, int64_t threads) {
  const int64_t groups = k / kg, blocks = n / 64;
  edge_act8_rows r;
  if (edge_act8_alloc(&r, M, k, groups)) return -1;
  __m512i idx_lo, idx_hi;
  edge_act8_indices(&idx_lo, &idx_hi);
#pragma omp parallel num_threads((int)(threads < 1 ? 1 : threads))
  {
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; m++) {
      edge_act8_quantize_row(x + m * k, k, kg, r.q + m * k, r.d + m * groups, r.sq + m * groups);
      for (int64_t g = 0; g < groups; g++) r.sx[m * groups + g] = group_sum(x + m * k + g * kg, kg);
    }
#ifdef _OPENMP
    int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
    int64_t t = 0, nt = 1;
#endif
    const int64_t chunks = (M + GEMV_MAX_M - 1) / GEMV_MAX_M, units = blocks * chunks;
    const int64_t lo = units * t / nt, hi = units * (t + 1) / nt;
    for (int64_t u = lo; u < hi; u++) {
      const int64_t b = u / chunks, m0 = (u % chunks) * GEMV_MAX_M;
      switch (M - m0 < GEMV_MAX_M ? M - m0 : GEMV_MAX_M) {
        case 1: ACT8_CASE(1); break;
        case 2: ACT8_CASE(2); break;
        case 3: ACT8_CASE(3); break;
        default: ACT8_CASE(4); break;
      }
    }
  }
  free(r.d);
  return 0;
}
#undef ACT8_CASE
#endif
#endif

/* Y (bf16 [M, N], row stride N) = X (bf16 [M, K]) W^T on `threads` OpenMP threads.
   Rows of X run in chunks of GEMV_MAX_M per 64-row block, so the block (K * 32 bytes) is
   read from memory once and from cache for the other chunks. Returns 0 on success, -1 if
   unsupported (no AVX512-BF16/VBMI, N % 64 != 0, K % 32 != 0); the caller then
   uses tinygemm. */
int edge_int4_gemv(const uint8_t* packed, const uint16_t* sz, const uint16_t* x, uint16_t* y,
                   int64_t M, int64_t n, int64_t k, int64_t kg, int64_t threads) {
#ifdef EDGE_GEMV
  if (M < 1 || n % 64 || k % 32 || kg % 32 || k % kg) return -1;
#ifdef EDGE_INT4_ACT8
  if (act8_wanted && act8_gemv(packed, sz, x, y, M, n, k, kg, threads) == 0) return 0;
#endif
  const int64_t groups = k / kg, blocks = n / 64;
  float* sx = (float*)malloc(sizeof(float) * M * groups);
  if (!sx) return -1;
  __m512i pick0, pick1;
  edge_pair_indices(&pick0, &pick1);
#pragma omp parallel num_threads((int)(threads < 1 ? 1 : threads))
  {
    /* group sums of x, split over the team (one thread took ~8 % of a 512-row SmolLM2 layer) */
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; m++)
      for (int64_t g = 0; g < groups; g++) sx[m * groups + g] = group_sum(x + m * k + g * kg, kg);
#ifdef _OPENMP
    int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
    int64_t t = 0, nt = 1;
#endif
    /* work units are (block, chunk of rows) in block-major order, split evenly: a layer
       with an odd block count (SmolLM2's 576 rows are 9 blocks) keeps both threads busy */
    const int64_t chunks = (M + GEMV_MAX_M - 1) / GEMV_MAX_M, units = blocks * chunks;
    const int64_t lo = units * t / nt, hi = units * (t + 1) / nt;
    for (int64_t u = lo; u < hi; u++) {
      const int64_t b = u / chunks, m0 = (u % chunks) * GEMV_MAX_M;
      const uint16_t* xm = x + m0 * k;
      const float* sxm = sx + m0 * groups;
      uint16_t* ym = y + m0 * n;
      switch (M - m0 < GEMV_MAX_M ? M - m0 : GEMV_MAX_M) {
        case 1: gemv_block_m(packed, sz, xm, sxm, ym, n, k, kg, b, 1, pick0, pick1); break;
        case 2: gemv_block_m(packed, sz, xm, sxm, ym, n, k, kg, b, 2, pick0, pick1); break;
        case 3: gemv_block_m(packed, sz, xm, sxm, ym, n, k, kg, b, 3, pick0, pick1); break;
        default: gemv_block_m(packed, sz, xm, sxm, ym, n, k, kg, b, 4, pick0, pick1); break;
      }
    }
  }
  free(sx);
  return 0;
#else
  (void)packed; (void)sz; (void)x; (void)y; (void)M; (void)n; (void)k; (void)kg; (void)threads;
  return -1;
#endif
}
