/* cpu_int8's packed runtime layout (llama.cpp's Q5_0, Q5_1, Q5_K and Q6_K blocks, and 8-bit
 * codes such as Q8_0): Y[M, N] = X[M, K] W^T reading about 5 or 6 bits per weight where the
 * codes fit, in the int4 product's 64-row layout in every case.
 *
 * A weight is w = (u - off) * s + z, u the unsigned code (0..15, 0..31 or 0..63), off 8, 16 or
 * 32, s and z fp16 per group of kg input columns (z absent: 0). The codes are split in two:
 *  - the low nibbles in the AVX-512 int4 product's layout (int4_gemv.c): blocks of 64 output
 *    rows stored [K][32] bytes, byte (k, j) = row j (low nibble) | row j+32 (high nibble);
 *  - the high bits as bit planes, one 64-bit mask per (block, k-quad, plane, row quarter):
 *    bit 4j+t of mask (b, q, plane, i) is bit 4+plane of u at row 64b+16i+j, column 4q+t.
 *    4-bit codes (a Q4_K part of a layer fused with a 6-bit one) have no plane: planes == 0.
 *    That is the byte order of VPDPBUSD's operands (four k-steps per 32-bit lane), so with
 *    int8 activations a plane is one masked byte add of 16 << plane. The bf16 product takes
 *    a k-pair's half of the mask with one PEXT (BMI2): bit 2j+t, the word order of its bf16
 *    vectors, and adds 16 << plane to the (128 + nibble) words before VDPBF16PS.
 * 128 + u stays exact in bf16 for u < 128, so the products are those of the int4 kernel:
 * per group, sum_k w x = s * sum (128 + u) x + (z - (128 + off) s) * sum x, in fp32.
 *
 * 8-bit codes (planes == 4, off 128) cannot take that path: 128 + u is not exact in bf16 once
 * u reaches 128. They are two nibble planes in the same layout instead, u = 16 h + l, and each
 * k-pair takes two VDPBF16PS passes: (128 + l) against x and (128 + h) against 16 x (exact, a
 * power of two). Their sum is (u + 2176) x, so the base is 128 + off + 2048 = 2304.
 * Scales and offsets are group-major, [K/kg][N] fp16, so a group's 16 rows are one load.
 *
 * With AVX512-VNNI (edge_lowbit_set_act8) every width takes int8 activations: each row of X
 * is rounded to int8 per weight group, as llama.cpp rounds the activations it multiplies its
 * Q5_0, Q6_K or Q8_0 blocks by (step max|x| / 127, nearest), and VPDPBUSD multiplies four
 * k-steps of 16 rows, unsigned codes against signed activations, per instruction. Two
 * two-source byte permutes put four k-steps of the nibble layout in VPDPBUSD's order; for
 * 8-bit codes one ternary-logic blend joins the two nibble planes into the byte u = code + 128,
 * for 5- and 6-bit codes each plane is one masked byte add. Per group,
 * sum_k w x = s d (sum u q - off sum q) + z sum x, d the row's step and q its int8 values.
 * Why: a small model's tied Q8_0 head is the largest matrix of a decode step and its Q5_0 and
 * Q6_K layers most of the rest (a Q4_K_M file falls back to them where a row is not a multiple
 * of 256); the bf16 products issue about twice the instructions (two VDPBF16PS passes for 8-bit
 * codes, a masked word add per plane and k-pair for 5- and 6-bit ones), and on a CPU whose
 * last-level cache holds the model they are bound by instructions, not memory. A row's
 * result does not depend on the rows beside it.
 *
 * Without AVX512-BF16, VBMI, BW and BMI2 edge_lowbit_supported() is 0 and the caller keeps the
 * row-major int8 codes (int8_gemv.c). The dequantizer is portable C.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "edge_bf16.h"

/* groups ahead (0: no prefetch); set once at load (envs VLLM_EDGE_SCALE_PREFETCH), never
   while a product runs */
static int64_t lowbit_sz_ahead = 4;

void edge_lowbit_set_prefetch(int groups_ahead) { lowbit_sz_ahead = groups_ahead < 0 ? 0 : groups_ahead; }

#if defined(__AVX512BF16__) && defined(__AVX512VBMI__) && defined(__AVX512BW__) && defined(__BMI2__)
#define EDGE_LOWBIT 1
#endif

#if defined(EDGE_LOWBIT) && defined(__AVX512VNNI__)
#define EDGE_ACT8 1
#endif

#define LOWBIT_MAX_M 4

/* int8 activations and VPDPBUSD: set once at load (envs VLLM_EDGE_LOWBIT_ACT8), never while a
   product runs */
static int act8_wanted = 0;

void edge_lowbit_set_act8(int on) { act8_wanted = on != 0; }

/* whether the products take int8 activations here (wanted, and built with VNNI) */
int edge_lowbit_act8(void) {
#ifdef EDGE_ACT8
  return act8_wanted;
#else
  return 0;
#endif
}

int edge_lowbit_supported(void) {
#ifdef EDGE_LOWBIT
  return 1;
#else
  return 0;
#endif
}

int edge_lowbit_openmp(void) {
#ifdef _OPENMP
  return 1;
#else
  return 0;
#endif
}

static int shape_ok(int64_t M, int64_t n, int64_t k, int64_t kg, int64_t planes, int64_t off) {
  return M >= 1 && n >= 64 && n % 64 == 0 && k >= 32 && k % 32 == 0 && kg >= 16 && kg % 16 == 0 &&
         k % kg == 0 && (planes == 0 || planes == 1 || planes == 2 || planes == 4) &&
         off == (planes == 4 ? 128 : planes == 0 ? 8 : 16 << (planes - 1));
}

/* what sum (words) x adds to sum u x per unit of sum x: 128 + off, plus 16 * 128 for the
   second nibble plane of 8-bit codes */
static float lowbit_base(int64_t planes, int64_t off) {
  return 128.0f + (float)off + (planes == 4 ? 2048.0f : 0.0f);
}

/* the unsigned code u at row r, column c (portable: the dequantizer and the gather) */
static inline int lowbit_code(const uint8_t* nib, const uint8_t* hib, int64_t k, int64_t planes,
                              int64_t r, int64_t c) {
  const int64_t b = r / 64, jj = r % 64;
  const int shift = jj < 32 ? 0 : 4;
  const int64_t at = b * k * 32 + c * 32 + (jj % 32);
  int u = (nib[at] >> shift) & 15;
  if (planes == 4) return u | (((hib[at] >> shift) & 15) << 4);
  if (planes == 0) return u;
  const uint64_t* hm = (const uint64_t*)hib + (b * (k / 4) + c / 4) * planes * 4 + (jj % 64) / 16;
  const int bit = (int)(4 * (jj % 16) + (c & 3));
  u |= (int)((hm[0] >> bit) & 1u) << 4;
  if (planes == 2) u |= (int)((hm[4] >> bit) & 1u) << 5;
  return u;
}

#ifdef EDGE_LOWBIT
/* CASE(MM, PL) for a chunk of mm rows of X (1 to 4) and the weight's planes (0, 1, 2 or 4): the
   block kernels take both as compile-time constants, so each product dispatches through these */
#define EDGE_BY_ROWS(CASE, PL)       \
  switch (mm) {                      \
    case 1: CASE(1, PL); break;      \
    case 2: CASE(2, PL); break;      \
    case 3: CASE(3, PL); break;      \
    default: CASE(4, PL); break;     \
  }
#define EDGE_BY_PLANES_AND_ROWS(CASE) \
  if (planes == 0) {                  \
    EDGE_BY_ROWS(CASE, 0)             \
  } else if (planes == 1) {           \
    EDGE_BY_ROWS(CASE, 1)             \
  } else if (planes == 2) {           \
    EDGE_BY_ROWS(CASE, 2)             \
  } else {                            \
    EDGE_BY_ROWS(CASE, 4)             \
  }

/* sum of kg (a multiple of 16) bf16 values, in fp32 */
static inline float group_sum(const uint16_t* v, int64_t kg) {
  __m512 a = _mm512_setzero_ps();
  for (int64_t i = 0; i < kg; i += 16)
    a = _mm512_add_ps(a, _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(v + i))), 16)));
  return _mm512_reduce_add_ps(a);
}

/* The four (128 + u) word vectors of k-steps (kk, kk+1) of a block: the nibble words with each
   high-bit plane added in (16 << plane where its mask bit is set). The k-quad's masks hold
   bit 4j+t for k-step t; PEXT keeps the pair's two bits of each row, bit 2j+t. */
static inline __attribute__((always_inline)) void lowbit_words(const uint8_t* pb, const uint64_t* hb,
                                                               int64_t kk, const int planes, __m512i pick0,
                                                               __m512i pick1, __m512i a[4]) {
  edge_nibble_words(pb + kk * 32, pick0, pick1, a);
  const uint64_t* hm = hb + (kk / 4) * planes * 4;
  const uint64_t half = (kk & 2) ? 0xCCCCCCCCCCCCCCCCull : 0x3333333333333333ull;
  const __m512i add16 = _mm512_set1_epi16(16), add32 = _mm512_set1_epi16(32);
  if (planes >= 1)
    for (int i = 0; i < 4; i++)
      a[i] = _mm512_mask_add_epi16(a[i], _cvtu32_mask32((uint32_t)_pext_u64(hm[i], half)), a[i], add16);
  if (planes == 2)
    for (int i = 0; i < 4; i++)
      a[i] = _mm512_mask_add_epi16(a[i], _cvtu32_mask32((uint32_t)_pext_u64(hm[4 + i], half)), a[i], add32);
}

/* A block's fp16 scales and offsets are not next to its codes: group g of rows b*64.. sits
   at g*N + b*64, one 128-byte run every N*2 bytes, a stride the hardware prefetchers lose at
   page bounds (int4_gemv.c's twin). Fetched lowbit_sz_ahead groups early. */
#define LOWBIT_SZ_PREFETCH(s, z, gg, groups, n, b)                                        \
  do {                                                                                    \
    if (lowbit_sz_ahead && (gg) < (groups)) {                                                                \
      const char* ps_ = (const char*)((s) + (gg) * (n) + (b) * 64);                       \
      _mm_prefetch(ps_, _MM_HINT_T0); _mm_prefetch(ps_ + 64, _MM_HINT_T0);               \
      if (z) {                                                                            \
        const char* pz_ = (const char*)((z) + (gg) * (n) + (b) * 64);                     \
        _mm_prefetch(pz_, _MM_HINT_T0); _mm_prefetch(pz_ + 64, _MM_HINT_T0);             \
      }                                                                                   \
    }                                                                                     \
  } while (0)

/* rows 16i..16i+15 of block b in group g: the fp32 scales and c = z - base * s */
static inline void lowbit_scales(const uint16_t* s, const uint16_t* z, int64_t n, int64_t g, int64_t b, int i,
                                 float base, __m512* sc, __m512* c) {
  const int64_t at = g * n + b * 64 + i * 16;
  *sc = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(s + at)));
  const __m512 zc = z ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(z + at))) : _mm512_setzero_ps();
  *c = _mm512_fnmadd_ps(_mm512_set1_ps(base), *sc, zc);
}

/* Block b (64 output rows) for M <= LOWBIT_MAX_M rows of X; sx[m * groups + g] = sum of group g of x_m */
static inline __attribute__((always_inline)) void lowbit_block_m(
    const uint8_t* nib, const uint8_t* hib, const uint16_t* s, const uint16_t* z, const float base,
    const uint16_t* x, const uint16_t* x16, const float* sx, uint16_t* y, int64_t n, int64_t k, int64_t kg,
    int64_t b, const int M, const int planes, const __m512i pick0, const __m512i pick1) {
  const int64_t groups = k / kg;
  const uint8_t* pb = nib + b * k * 32;
  const uint8_t* hn = hib + b * k * 32; /* planes == 4: the high nibbles */
  const uint64_t* hb = (const uint64_t*)hib + b * (k / 4) * (planes & 3) * 4;
  __m512 out[LOWBIT_MAX_M][4];
  for (int m = 0; m < M; m++)
    for (int i = 0; i < 4; i++) out[m][i] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; g++) {
    LOWBIT_SZ_PREFETCH(s, z, g + lowbit_sz_ahead, groups, n, b);
    __m512 acc[LOWBIT_MAX_M][4];
    for (int m = 0; m < M; m++)
      for (int i = 0; i < 4; i++) acc[m][i] = _mm512_setzero_ps();
    for (int64_t kk = g * kg; kk < (g + 1) * kg; kk += 2) {
      __m512i a[4];
      if (planes == 4) {
        edge_nibble_words(pb + kk * 32, pick0, pick1, a);
        __m512i h[4];
        edge_nibble_words(hn + kk * 32, pick0, pick1, h);
        for (int m = 0; m < M; m++) edge_dot4(acc[m], x16 + m * k + kk, h);
      } else {
        lowbit_words(pb, hb, kk, planes, pick0, pick1, a);
      }
      for (int m = 0; m < M; m++) edge_dot4(acc[m], x + m * k + kk, a);
    }
    for (int i = 0; i < 4; i++) {
      __m512 sc, c;
      lowbit_scales(s, z, n, g, b, i, base, &sc, &c);
      for (int m = 0; m < M; m++)
        out[m][i] = _mm512_fmadd_ps(c, _mm512_set1_ps(sx[m * groups + g]), _mm512_fmadd_ps(sc, acc[m][i], out[m][i]));
    }
  }
  for (int m = 0; m < M; m++)
    for (int i = 0; i < 4; i++) edge_store_bf16x16(y + m * n + b * 64 + i * 16, out[m][i]);
}

#ifdef EDGE_ACT8
/* Block b (64 output rows) for M <= LOWBIT_MAX_M rows of X rounded to int8: xq the rows' int8
   values, dx[m * groups + g] the step of group g of row m, sq the groups' sums of xq, sx their
   exact sums of x (read only where z is set). u = code + off in every byte VPDPBUSD reads. */
static inline __attribute__((always_inline)) void act8_block_m(
    const uint8_t* nib, const uint8_t* hib, const uint16_t* s, const uint16_t* z, const int8_t* xq,
    const float* dx, const int32_t* sq, const float* sx, uint16_t* y, int64_t n, int64_t k, int64_t kg,
    int64_t b, const int M, const int planes, const int32_t off, const __m512i idx_lo, const __m512i idx_hi) {
  const int64_t groups = k / kg;
  const uint8_t* pn = nib + b * k * 32;
  const uint8_t* ph = hib + b * k * 32; /* planes == 4: the high nibbles */
  const uint64_t* hb = (const uint64_t*)hib + b * (k / 4) * (planes & 3) * 4;
  const __m512i low = _mm512_set1_epi8(0x0F), add16 = _mm512_set1_epi8(16), add32 = _mm512_set1_epi8(32);
  /* the fp32 sums live in memory between groups: kept in registers beside the 16
     accumulators they pushed the accumulators themselves out to the stack, a load and a store
     around every VPDPBUSD */
  float out[LOWBIT_MAX_M * 64] __attribute__((aligned(64)));
  for (int j = 0; j < M * 64; j += 16) _mm512_store_ps(out + j, _mm512_setzero_ps());
  for (int64_t g = 0; g < groups; g++) {
    LOWBIT_SZ_PREFETCH(s, z, g + lowbit_sz_ahead, groups, n, b);
    __m512i acc[LOWBIT_MAX_M][4];
    for (int m = 0; m < M; m++)
      for (int i = 0; i < 4; i++) acc[m][i] = _mm512_setzero_si512();
    for (int64_t kk = g * kg; kk < (g + 1) * kg; kk += 4) {
      const __m512i n0 = _mm512_loadu_si512((const void*)(pn + kk * 32));
      const __m512i n1 = _mm512_loadu_si512((const void*)(pn + kk * 32 + 64));
      const __m512i pa = _mm512_permutex2var_epi8(n0, idx_lo, n1), pb = _mm512_permutex2var_epi8(n0, idx_hi, n1);
      __m512i u[4];
      if (planes == 4) {
        const __m512i h0 = _mm512_loadu_si512((const void*)(ph + kk * 32));
        const __m512i h1 = _mm512_loadu_si512((const void*)(ph + kk * 32 + 64));
        const __m512i qa = _mm512_permutex2var_epi8(h0, idx_lo, h1), qb = _mm512_permutex2var_epi8(h0, idx_hi, h1);
        /* u = low nibble | high nibble << 4, blended under the 0x0F mask (0xE4: C ? A : B):
           rows 0-31 hold their nibbles low in pa/pb and qa/qb, rows 32-63 high */
        u[0] = _mm512_ternarylogic_epi32(pa, _mm512_slli_epi16(qa, 4), low, 0xE4);
        u[1] = _mm512_ternarylogic_epi32(pb, _mm512_slli_epi16(qb, 4), low, 0xE4);
        u[2] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(pa, 4), qa, low, 0xE4);
        u[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(pb, 4), qb, low, 0xE4);
      } else {
        /* the nibbles, then each plane's bit as 16 << plane: the masks are in this byte order */
        const uint64_t* hm = hb + (kk / 4) * planes * 4;
        u[0] = _mm512_and_si512(pa, low);
        u[1] = _mm512_and_si512(pb, low);
        u[2] = _mm512_and_si512(_mm512_srli_epi16(pa, 4), low);
        u[3] = _mm512_and_si512(_mm512_srli_epi16(pb, 4), low);
        if (planes >= 1)
          for (int i = 0; i < 4; i++) u[i] = _mm512_mask_add_epi8(u[i], _cvtu64_mask64(hm[i]), u[i], add16);
        if (planes == 2)
          for (int i = 0; i < 4; i++) u[i] = _mm512_mask_add_epi8(u[i], _cvtu64_mask64(hm[4 + i]), u[i], add32);
      }
      for (int m = 0; m < M; m++) {
        const int8_t* xm = xq + m * k + kk;
        EDGE_ACT8_DOT(acc[m][0], u[0], xm);
        EDGE_ACT8_DOT(acc[m][1], u[1], xm);
        EDGE_ACT8_DOT(acc[m][2], u[2], xm);
        EDGE_ACT8_DOT(acc[m][3], u[3], xm);
      }
    }
    /* per row, once for the block's four quarters: its step, the step times the offset's part
       off sum xq, and the exact sum of x */
    __m512 d[LOWBIT_MAX_M], dq[LOWBIT_MAX_M], sxv[LOWBIT_MAX_M];
    for (int m = 0; m < M; m++) {
      const int64_t mg = m * groups + g;
      d[m] = _mm512_set1_ps(dx[mg]);
      dq[m] = _mm512_set1_ps(dx[mg] * (float)(off * sq[mg]));
      sxv[m] = _mm512_set1_ps(z ? sx[mg] : 0.0f);
    }
    for (int i = 0; i < 4; i++) {
      const int64_t at = g * n + b * 64 + i * 16;
      const __m512 sc = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(s + at)));
      const __m512 zc = z ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(z + at))) : _mm512_setzero_ps();
      for (int m = 0; m < M; m++) {
        /* the dot is exact in int32 (|u q| <= 255 * 127 per product, groups of at most 256) */
        const __m512 dot = _mm512_fmsub_ps(_mm512_cvtepi32_ps(acc[m][i]), d[m], dq[m]);
        float* o = out + (m * 4 + i) * 16;
        __m512 v = _mm512_fmadd_ps(sc, dot, _mm512_load_ps(o));
        if (z) v = _mm512_fmadd_ps(zc, sxv[m], v);
        _mm512_store_ps(o, v);
      }
    }
  }
  for (int m = 0; m < M; m++)
    for (int i = 0; i < 4; i++) edge_store_bf16x16(y + m * n + b * 64 + i * 16, _mm512_load_ps(out + (m * 4 + i) * 16));
}

#define ACT8_CASE(MM, PL) \
  act8_block_m(nib, hib, s, z, r.q + m0 * k, r.d + m0 * groups, r.sq + m0 * groups, r.sx + m0 * groups, \
               y + m0 * n, n, k, kg, b, MM, PL, (int32_t)off, idx_lo, idx_hi)

/* The product through int8 activations (see the top of this file), for a shape shape_ok took
   (its groups are whole multiples of 16, so of VPDPBUSD's 4 k-steps); 0, or -1 where it cannot
   run (no memory) */
static int act8_gemv(const uint8_t* nib, const uint8_t* hib, const uint16_t* s, const uint16_t* z,
                     const uint16_t* x, uint16_t* y, int64_t M, int64_t n, int64_t k, int64_t kg,
                     int64_t planes, int64_t off, int64_t threads) {
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
      if (z)
        for (int64_t g = 0; g < groups; g++) r.sx[m * groups + g] = group_sum(x + m * k + g * kg, kg);
    }
#ifdef _OPENMP
    int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
    int64_t t = 0, nt = 1;
#endif
    const int64_t chunks = (M + LOWBIT_MAX_M - 1) / LOWBIT_MAX_M, units = blocks * chunks;
    const int64_t lo = units * t / nt, hi = units * (t + 1) / nt;
    for (int64_t u = lo; u < hi; u++) {
      const int64_t b = u / chunks, m0 = (u % chunks) * LOWBIT_MAX_M;
      const int64_t mm = M - m0 < LOWBIT_MAX_M ? M - m0 : LOWBIT_MAX_M;
      EDGE_BY_PLANES_AND_ROWS(ACT8_CASE)
    }
  }
  free(r.d);
  return 0;
}
#undef ACT8_CASE
#endif

/* Block b of the weight transposed, as bf16 rows of W^T [K][N]: each k-pair's four vectors of
   (128 + u) words split into their k and k+1 halves, scaled in fp32, rounded once, and stored
   as 16 contiguous bf16 per row quarter. */
static void lowbit_dequant_t_block(const uint8_t* nib, const uint8_t* hib, const uint16_t* s,
                                   const uint16_t* z, float base, uint16_t* outT, int64_t n, int64_t k,
                                   int64_t kg, int64_t b, int planes, __m512i pick0, __m512i pick1) {
  const __m512i hi16 = _mm512_set1_epi32((int)0xFFFF0000u);
  const __m512 sixteen = _mm512_set1_ps(16.0f);
  const uint8_t* pb = nib + b * k * 32;
  const uint8_t* hn = hib + b * k * 32;
  const uint64_t* hb = (const uint64_t*)hib + b * (k / 4) * (planes & 3) * 4;
  const __m512 basev = _mm512_set1_ps(base);
  for (int64_t g = 0; g < k / kg; g++) {
    __m512 sc[4], zc[4];
    for (int i = 0; i < 4; i++) {
      const int64_t at = g * n + b * 64 + i * 16;
      sc[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(s + at)));
      zc[i] = z ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(z + at))) : _mm512_setzero_ps();
    }
    for (int64_t kk = g * kg; kk < (g + 1) * kg; kk += 2) {
      __m512i a[4], h[4];
      if (planes == 4) {
        edge_nibble_words(pb + kk * 32, pick0, pick1, a);
        edge_nibble_words(hn + kk * 32, pick0, pick1, h);
      } else {
        lowbit_words(pb, hb, kk, planes, pick0, pick1, a);
      }
      for (int i = 0; i < 4; i++) {
        __m512 v0 = _mm512_castsi512_ps(_mm512_slli_epi32(a[i], 16));
        __m512 v1 = _mm512_castsi512_ps(_mm512_and_si512(a[i], hi16));
        if (planes == 4) { /* (128 + l) + 16 (128 + h), exact in fp32 */
          v0 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(h[i], 16)), sixteen, v0);
          v1 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(h[i], hi16)), sixteen, v1);
        }
        /* the signed code (exact), times s, plus z: cpu_int8's own two roundings, so W^T
           holds the int8 dequantizer's bf16 values */
        v0 = _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(v0, basev), sc[i]), zc[i]);
        v1 = _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(v1, basev), sc[i]), zc[i]);
        edge_store_bf16x16(outT + kk * n + b * 64 + i * 16, v0);
        edge_store_bf16x16(outT + (kk + 1) * n + b * 64 + i * 16, v1);
      }
    }
  }
}

#define LOWBIT_CASE(MM, PL) \
  lowbit_block_m(nib, hib, s, z, base, xm, x16m, sxm, ym, n, k, kg, b, MM, PL, pick0, pick1)
#endif

/* Y (bf16 [M, N], row stride N) = X (bf16 [M, K]) W^T on `threads` OpenMP threads, each
   64-row block read from memory once for every chunk of 4 rows of X. Returns 0, or -1 if
   unsupported (no AVX512-BF16/VBMI/BW, or a shape shape_ok refuses). */
int edge_lowbit_gemv(const uint8_t* nib, const uint8_t* hib, const uint16_t* s, const uint16_t* z,
                     const uint16_t* x, uint16_t* y, int64_t M, int64_t n, int64_t k, int64_t kg,
                     int64_t planes, int64_t off, int64_t threads) {
#ifdef EDGE_LOWBIT
  if (!shape_ok(M, n, k, kg, planes, off)) return -1;
#ifdef EDGE_ACT8
  if (act8_wanted && act8_gemv(nib, hib, s, z, x, y, M, n, k, kg, planes, off, threads) == 0) return 0;
#endif
  const int64_t groups = k / kg, blocks = n / 64;
  const float base = lowbit_base(planes, off);
  float* sx = (float*)malloc(sizeof(float) * M * groups);
  /* 16 x for the high nibble plane of 8-bit codes: exact, x is bf16 and 16 a power of two */
  uint16_t* x16 = planes == 4 ? (uint16_t*)malloc(sizeof(uint16_t) * M * k) : NULL;
  if (!sx || (planes == 4 && !x16)) {
    free(sx);
    free(x16);
    return -1;
  }
  if (x16)
    for (int64_t i = 0; i < M * k; i++) x16[i] = edge_f2bf(edge_bf2f(x[i]) * 16.0f);
  __m512i pick0, pick1;
  edge_pair_indices(&pick0, &pick1);
#pragma omp parallel num_threads((int)(threads < 1 ? 1 : threads))
  {
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; m++)
      for (int64_t g = 0; g < groups; g++) sx[m * groups + g] = group_sum(x + m * k + g * kg, kg);
#ifdef _OPENMP
    int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
    int64_t t = 0, nt = 1;
#endif
    /* (block, chunk of rows) units in block-major order, split evenly over the team */
    const int64_t chunks = (M + LOWBIT_MAX_M - 1) / LOWBIT_MAX_M, units = blocks * chunks;
    const int64_t lo = units * t / nt, hi = units * (t + 1) / nt;
    for (int64_t u = lo; u < hi; u++) {
      const int64_t b = u / chunks, m0 = (u % chunks) * LOWBIT_MAX_M;
      const uint16_t* xm = x + m0 * k;
      const uint16_t* x16m = x16 ? x16 + m0 * k : NULL;
      const float* sxm = sx + m0 * groups;
      uint16_t* ym = y + m0 * n;
      const int64_t mm = M - m0 < LOWBIT_MAX_M ? M - m0 : LOWBIT_MAX_M;
      EDGE_BY_PLANES_AND_ROWS(LOWBIT_CASE)
    }
  }
  free(sx);
  free(x16);
  return 0;
#else
  (void)nib; (void)hib; (void)s; (void)z; (void)x; (void)y; (void)M; (void)n; (void)k; (void)kg;
  (void)planes; (void)off; (void)threads;
  return -1;
#endif
}

/* The weight transposed, W^T as row-major bf16 [K][N], for a bf16 GEMM x @ W^T on prefill:
   every store is 16 contiguous values. Each value is (u - off) * s + z in fp32, then rounded
   to bf16: the value edge_lowbit_dequant gives.
   Returns -1 where the product is unsupported. */
int edge_lowbit_dequant_t(const uint8_t* nib, const uint8_t* hib, const uint16_t* s, const uint16_t* z,
                          uint16_t* outT, int64_t n, int64_t k, int64_t kg, int64_t planes, int64_t off,
                          int64_t threads) {
#ifdef EDGE_LOWBIT
  if (!shape_ok(1, n, k, kg, planes, off)) return -1;
  __m512i pick0, pick1;
  edge_pair_indices(&pick0, &pick1);
  const float base = lowbit_base(planes, off);
#pragma omp parallel for schedule(static) num_threads((int)(threads < 1 ? 1 : threads))
  for (int64_t b = 0; b < n / 64; b++)
    lowbit_dequant_t_block(nib, hib, s, z, base, outT, n, k, kg, b, (int)planes, pick0, pick1);
  return 0;
#else
  (void)nib; (void)hib; (void)s; (void)z; (void)outT; (void)n; (void)k; (void)kg; (void)planes;
  (void)off; (void)threads;
  return -1;
#endif
}

/* The whole weight as row-major bf16 [N][K]: w = (u - off) * s + z in fp32, rounded once, the
   same value cpu_int8's dequantizer gives for the signed code u - off. Portable C: the
   reference the tests hold the products to. */
int edge_lowbit_dequant(const uint8_t* nib, const uint8_t* hib, const uint16_t* s, const uint16_t* z,
                        uint16_t* out, int64_t n, int64_t k, int64_t kg, int64_t planes, int64_t off,
                        int64_t threads) {
  if (!shape_ok(1, n, k, kg, planes, off)) return -1;
  (void)threads;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads((int)(threads < 1 ? 1 : threads))
#endif
  for (int64_t r = 0; r < n; r++) {
    uint16_t* o = out + r * k;
    for (int64_t c = 0; c < k; c++) {
      const int64_t at = (c / kg) * n + r;
      const float zf = z ? edge_h2f_soft(z[at]) : 0.0f;
      o[c] = edge_f2bf((float)(lowbit_code(nib, hib, k, planes, r, c) - off) * edge_h2f_soft(s[at]) + zf);
    }
  }
  return 0;
}

/* Rows ids[0..T) of the weight as row-major bf16 [T][K], the values edge_lowbit_dequant gives:
   an embedding looked up from the packed table (a head tied to it reads the same tensors).
   Returns -1 for a shape the layout refuses or an id outside [0, n). Portable C. */
int edge_lowbit_gather(const uint8_t* nib, const uint8_t* hib, const uint16_t* s, const uint16_t* z,
                       const int64_t* ids, uint16_t* out, int64_t T, int64_t n, int64_t k, int64_t kg,
                       int64_t planes, int64_t off) {
  if (!shape_ok(1, n, k, kg, planes, off)) return -1;
  for (int64_t t = 0; t < T; t++)
    if (ids[t] < 0 || ids[t] >= n) return -1;
  for (int64_t t = 0; t < T; t++) {
    const int64_t r = ids[t];
    uint16_t* o = out + t * k;
    for (int64_t c = 0; c < k; c++) {
      const int64_t at = (c / kg) * n + r;
      const float zf = z ? edge_h2f_soft(z[at]) : 0.0f;
      o[c] = edge_f2bf((float)(lowbit_code(nib, hib, k, planes, r, c) - off) * edge_h2f_soft(s[at]) + zf);
    }
  }
  return 0;
}
