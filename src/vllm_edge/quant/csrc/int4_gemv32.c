/* Few-row W4A16 product for the int4 layout torch packs on a CPU without AVX-512:
 * Y[M, N] = X[M, K] W^T with AVX2 and FMA.
 *
 * Layout (measured, pack.probe_layout): blocks of 32 output rows stored [K][16] bytes, byte
 * (k, j) = row j (low nibble) | row j+16 (high nibble); rows past the last full block are a
 * tail this kernel does not take. scales_and_zeros bf16 [K/kg][N][2]; w = (q - 8) * s + z.
 *
 * Why not tinygemm at one row: on an AVX2 EPYC its int4 product was the costliest single op
 * of a SmolLM2 decode step (`bench profile`), reading weights well under the machine's read
 * bandwidth. Here each k-step of a block is one 16-byte load; its two nibble halves widen to
 * 32 fp32 weights (four 8-lane vectors) that meet x[k] in four FMAs, with no per-weight
 * scale: per group, sum_k w x = s * sum q x + (z - 8 s) * sum x, the group's sum of x taken
 * once per call. One row widens in registers; more rows widen each group once into an L1
 * tile they all read. q is 0..15, exact in fp32, so the only roundings are the fp32 sums and
 * the bf16 output, as in the AVX-512 kernel.
 *
 * Without AVX2 and FMA edge_int4_gemv32_supported() is 0 and the caller keeps tinygemm.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "edge_bf16.h"

/* groups ahead (0: no prefetch); set once at load (envs VLLM_EDGE_SCALE_PREFETCH), never
   while a product runs */
static int64_t gemv32_sz_ahead = 4;

void edge_int4_gemv32_set_prefetch(int groups_ahead) { gemv32_sz_ahead = groups_ahead < 0 ? 0 : groups_ahead; }
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define EDGE_GEMV32 1
#endif

int edge_int4_gemv32_supported(void) {
#ifdef EDGE_GEMV32
  return 1;
#else
  return 0;
#endif
}

int edge_int4_gemv32_openmp(void) {
#ifdef _OPENMP
  return 1;
#else
  return 0;
#endif
}

#ifdef EDGE_GEMV32
/* the four 8-row vectors of one k-step's 16 bytes: rows 0-7, 8-15 (low nibbles), 16-23,
   24-31 (high nibbles), as fp32 */
#define EDGE_WIDEN(v, w0, w1, w2, w3)                                                        \
  do {                                                                                       \
    const __m128i lo_ = _mm_and_si128((v), nib), hi_ = _mm_and_si128(_mm_srli_epi16((v), 4), nib); \
    w0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo_));                                      \
    w1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo_, 8)));                   \
    w2 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi_));                                      \
    w3 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi_, 8)));                   \
  } while (0)

/* out[0..31] += the group's contribution: s * (even + odd) + (z - 8 s) * sum x */
static inline void group_epilogue(const uint16_t* szr, const __m256 e[4], const __m256 o[4], float sxg,
                                  __m256 out[4]) {
  const __m256i hi16 = _mm256_set1_epi32((int)0xFFFF0000u);
  for (int i = 0; i < 4; i++) {
    /* rows 8i..8i+7: their (s, z) bf16 pairs, one per 32-bit lane */
    const __m256i t = _mm256_loadu_si256((const __m256i*)(szr + i * 16));
    const __m256 s = _mm256_castsi256_ps(_mm256_slli_epi32(t, 16));
    const __m256 z = _mm256_castsi256_ps(_mm256_and_si256(t, hi16));
    const __m256 zc = _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), s, z);
    out[i] = _mm256_fmadd_ps(zc, _mm256_set1_ps(sxg), _mm256_fmadd_ps(s, _mm256_add_ps(e[i], o[i]), out[i]));
  }
}

static inline void store_bf16(const __m256 out[4], uint16_t* y) {
  float tmp[32];
  for (int i = 0; i < 4; i++) _mm256_storeu_ps(tmp + 8 * i, out[i]);
  for (int r = 0; r < 32; r++) y[r] = edge_f2bf(tmp[r]);
}

/* A block's scales are not next to its codes: group g of rows b*32.. sits at (g*N + b*32)*2,
   one 128-byte run every N*4 bytes, a stride the hardware prefetchers lose at page bounds.
   Fetched gemv32_sz_ahead groups early, they arrive with the codes. */
#define GEMV32_SZ_PREFETCH(sz, gg, groups, n, b)                                          \
  do {                                                                                    \
    if (gemv32_sz_ahead && (gg) < (groups)) {                                                                \
      const char* pf_ = (const char*)((sz) + ((gg) * (n) + (b) * 32) * 2);                \
      _mm_prefetch(pf_, _MM_HINT_T0); _mm_prefetch(pf_ + 64, _MM_HINT_T0);               \
    }                                                                                     \
  } while (0)

/* Block b (32 output rows) for one row of X (xf in fp32, sx its group sums): each k-step
   widened in registers. Even and odd k-steps feed separate accumulators, so the FMA
   latency is not the bound. */
static void gemv32_block_1(const uint8_t* packed, const uint16_t* sz, const float* xf, const float* sx,
                           uint16_t* y, int64_t n, int64_t k, int64_t kg, int64_t b) {
  const __m128i nib = _mm_set1_epi8(0x0F);
  const uint8_t* pb = packed + b * k * 16;
  __m256 out[4];
  for (int i = 0; i < 4; i++) out[i] = _mm256_setzero_ps();
  for (int64_t g = 0; g < k / kg; g++) {
    GEMV32_SZ_PREFETCH(sz, g + gemv32_sz_ahead, k / kg, n, b);
    __m256 e[4], o[4];
    for (int i = 0; i < 4; i++) e[i] = o[i] = _mm256_setzero_ps();
    for (int64_t kk = g * kg; kk < (g + 1) * kg; kk += 2) {
      __m256 w0, w1, w2, w3;
      const __m256 x0 = _mm256_broadcast_ss(xf + kk), x1 = _mm256_broadcast_ss(xf + kk + 1);
      EDGE_WIDEN(_mm_loadu_si128((const __m128i*)(pb + kk * 16)), w0, w1, w2, w3);
      e[0] = _mm256_fmadd_ps(w0, x0, e[0]);
      e[1] = _mm256_fmadd_ps(w1, x0, e[1]);
      e[2] = _mm256_fmadd_ps(w2, x0, e[2]);
      e[3] = _mm256_fmadd_ps(w3, x0, e[3]);
      EDGE_WIDEN(_mm_loadu_si128((const __m128i*)(pb + kk * 16 + 16)), w0, w1, w2, w3);
      o[0] = _mm256_fmadd_ps(w0, x1, o[0]);
      o[1] = _mm256_fmadd_ps(w1, x1, o[1]);
      o[2] = _mm256_fmadd_ps(w2, x1, o[2]);
      o[3] = _mm256_fmadd_ps(w3, x1, o[3]);
    }
    group_epilogue(sz + (g * n + b * 32) * 2, e, o, sx[g], out);
  }
  store_bf16(out, y + b * 32);
}

/* Block b for M > 1 rows of X (row strides k, groups and n): each group is widened once into
   an L1 tile of fp32 weights that every row then reads, the FMA taking it as a memory
   operand. The products, the even/odd accumulators and the epilogue are those of
   gemv32_block_1 in the same order, and widened codes are exact, so every row's result is
   bit-identical to a one-row call: a row does not depend on the batch around it. */
static void gemv32_block_tile(const uint8_t* packed, const uint16_t* sz, const float* xf, const float* sx,
                              uint16_t* y, int64_t M, int64_t n, int64_t k, int64_t kg, int64_t b,
                              float* tile, __m256* outs) {
  const __m128i nib = _mm_set1_epi8(0x0F);
  const int64_t groups = k / kg;
  const uint8_t* pb = packed + b * k * 16;
  for (int64_t m = 0; m < 4 * M; m++) outs[m] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; g++) {
    GEMV32_SZ_PREFETCH(sz, g + gemv32_sz_ahead, groups, n, b);
    for (int64_t kk = 0; kk < kg; kk++) {
      __m256 w0, w1, w2, w3;
      EDGE_WIDEN(_mm_loadu_si128((const __m128i*)(pb + (g * kg + kk) * 16)), w0, w1, w2, w3);
      _mm256_store_ps(tile + kk * 32, w0);
      _mm256_store_ps(tile + kk * 32 + 8, w1);
      _mm256_store_ps(tile + kk * 32 + 16, w2);
      _mm256_store_ps(tile + kk * 32 + 24, w3);
    }
    const uint16_t* szr = sz + (g * n + b * 32) * 2;
    for (int64_t m = 0; m < M; m++) {
      const float* xg = xf + m * k + g * kg;
      __m256 e[4], o[4];
      for (int i = 0; i < 4; i++) e[i] = o[i] = _mm256_setzero_ps();
      for (int64_t kk = 0; kk < kg; kk += 2) {
        const __m256 x0 = _mm256_broadcast_ss(xg + kk), x1 = _mm256_broadcast_ss(xg + kk + 1);
        const float* t0 = tile + kk * 32;
        e[0] = _mm256_fmadd_ps(_mm256_load_ps(t0), x0, e[0]);
        e[1] = _mm256_fmadd_ps(_mm256_load_ps(t0 + 8), x0, e[1]);
        e[2] = _mm256_fmadd_ps(_mm256_load_ps(t0 + 16), x0, e[2]);
        e[3] = _mm256_fmadd_ps(_mm256_load_ps(t0 + 24), x0, e[3]);
        o[0] = _mm256_fmadd_ps(_mm256_load_ps(t0 + 32), x1, o[0]);
        o[1] = _mm256_fmadd_ps(_mm256_load_ps(t0 + 40), x1, o[1]);
        o[2] = _mm256_fmadd_ps(_mm256_load_ps(t0 + 48), x1, o[2]);
        o[3] = _mm256_fmadd_ps(_mm256_load_ps(t0 + 56), x1, o[3]);
      }
      group_epilogue(szr, e, o, sx[m * groups + g], outs + 4 * m);
    }
  }
  for (int64_t m = 0; m < M; m++) store_bf16(outs + 4 * m, y + m * n + b * 32);
}
#undef EDGE_WIDEN
#endif

/* Y (bf16 [M, N], row stride N) = X (bf16 [M, K]) W^T on `threads` OpenMP threads, the
   32-row blocks split evenly between them; each block is read from memory once for all M
   rows. Returns 0 on success, -1 if unsupported (no AVX2/FMA, N % 32 != 0, an odd group,
   K % group != 0, no memory for the tiles); the caller then uses tinygemm. */
int edge_int4_gemv32(const uint8_t* packed, const uint16_t* sz, const uint16_t* x, uint16_t* y,
                     int64_t M, int64_t n, int64_t k, int64_t kg, int64_t threads) {
#ifdef EDGE_GEMV32
  if (M < 1 || n < 32 || n % 32 || kg < 2 || kg % 2 || k % kg) return -1;
  const int64_t groups = k / kg, blocks = n / 32;
  float* xf = (float*)malloc(sizeof(float) * M * (k + groups));
  if (!xf) return -1;
  float* sx = xf + M * k;
  for (int64_t m = 0; m < M; m++)
    for (int64_t g = 0; g < groups; g++) {
      float t = 0.f;
      for (int64_t j = g * kg; j < (g + 1) * kg; j++) t += (xf[m * k + j] = edge_bf2f(x[m * k + j]));
      sx[m * groups + g] = t;
    }
  (void)threads;
  int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads((int)(threads < 1 ? 1 : threads))
#endif
  {
    float* tile = NULL;
    __m256* outs = NULL;
    if (M > 1) {
      tile = (float*)aligned_alloc(32, sizeof(float) * 32 * (size_t)kg);
      outs = (__m256*)aligned_alloc(32, sizeof(__m256) * 4 * (size_t)M);
      if (!tile || !outs) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
        failed = 1;
      }
    }
#ifdef _OPENMP
#pragma omp barrier
#endif
    if (!failed) {
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
      for (int64_t b = 0; b < blocks; b++) {
        if (M == 1) gemv32_block_1(packed, sz, xf, sx, y, n, k, kg, b);
        else gemv32_block_tile(packed, sz, xf, sx, y, M, n, k, kg, b, tile, outs);
      }
    }
    free(tile);
    free(outs);
  }
  if (failed) { free(xf); return -1; }
  free(xf);
  return 0;
#else
  (void)packed; (void)sz; (void)x; (void)y; (void)M; (void)n; (void)k; (void)kg; (void)threads;
  return -1;
#endif
}
