/* Dequantize the CPU tinygemm int4 layout straight to row-major bf16 W [rows, K].
 *
 * Layout (measured, see pack.py): full blocks of 64 output rows, each [K][32] bytes, byte
 * (k, j) = row j (low nibble) | row j+32 (high nibble); a tail of N % 64 rows is [K][nb/2]
 * bytes, byte (k, j) = row 2j (low) | row 2j+1 (high). scales_and_zeros is bf16 [K/kg][N][2];
 * w = (q - 8) * scale + zero, computed in fp32 and rounded to nearest even, which is
 * bit-identical to pack.dequantize_packed.
 *
 * Row-major W (not W^T) because oneDNN's bf16 GEMM runs ~10% faster on it here.
 * Plain C with no torch headers so it builds in well under a second (quant/native.py).
 * Built with -fopenmp when the compiler can: the library then needs libgomp.so.1, which
 * resolves to the one torch already loaded, so edge_int4_dequant_team runs on torch's own
 * OpenMP team instead of threads that fight it for the cores.
 */
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512BW__)
#include <immintrin.h>
#endif

static inline float bf2f(uint16_t v) { uint32_t u = (uint32_t)v << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t f2bf(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* Full blocks [b0, b1) -> out rows [(b - b0) * 64, ...), each row K long. */
void edge_int4_dequant_blocks(const uint8_t* packed, const uint16_t* sz, uint16_t* out,
                              int64_t n, int64_t k, int64_t kg, int64_t b0, int64_t b1) {
  /* 32 k-steps x 32 byte columns, transposed so each output row reads 32 contiguous bytes */
  uint8_t tile[32][32] __attribute__((aligned(64)));
  /* per row of the block: the 16 possible values of its current group (a lookup table) */
  uint16_t lut[64][32] __attribute__((aligned(64)));
#if defined(__AVX512BW__)
  const __m512 qm8 = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
#endif
#if defined(__AVX512VBMI__)
  /* byte t of row j (t < 32) sits at byte 4t of the first gather (t < 16) or 4(t-16) of the
     second (index + 64); row j+1 at +1; rows j+2, j+3 at +2, +3 */
  uint8_t idx[2][64] __attribute__((aligned(64)));
  for (int h = 0; h < 2; h++)
    for (int r = 0; r < 2; r++)
      for (int t = 0; t < 32; t++)
        idx[h][r * 32 + t] = (uint8_t)((t < 16 ? 4 * t : 64 + 4 * (t - 16)) + 2 * h + r);
  const __m512i pick01 = _mm512_load_si512((const void*)idx[0]);
  const __m512i pick23 = _mm512_load_si512((const void*)idx[1]);
#endif
  for (int64_t b = b0; b < b1; b++) {
    const uint8_t* pb = packed + b * k * 32;
    uint16_t* ob = out + (b - b0) * 64 * k;
    int64_t gprev = -1;
    for (int64_t k0 = 0; k0 < k; k0 += 32) {
#if defined(__AVX512VBMI__)
      {
        /* gather dword (k0 + kk, j..j+3) for kk in 0..15 and 16..31, then pick bytes */
        const __m512i vidx = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(32));
        for (int j = 0; j < 32; j += 4) {
          const uint8_t* base = pb + k0 * 32 + j;
          __m512i a = _mm512_i32gather_epi32(vidx, (const void*)base, 1);
          __m512i c = _mm512_i32gather_epi32(vidx, (const void*)(base + 16 * 32), 1);
          _mm512_store_si512((void*)tile[j], _mm512_permutex2var_epi8(a, pick01, c));
          _mm512_store_si512((void*)tile[j + 2], _mm512_permutex2var_epi8(a, pick23, c));
        }
      }
#else
      for (int kk = 0; kk < 32; kk++)
        for (int j = 0; j < 32; j++) tile[j][kk] = pb[(k0 + kk) * 32 + j];
#endif
      int64_t g = k0 / kg;
      if (g != gprev) {
        const uint16_t* szr = sz + (g * n + b * 64) * 2;
        for (int r = 0; r < 64; r++) {
          float s = bf2f(szr[2 * r]), z = bf2f(szr[2 * r + 1]);
#if defined(__AVX512BW__)
          /* the 16 entries at once; the same fp32 multiply-add and rounding as f2bf */
          __m512 v = _mm512_add_ps(_mm512_mul_ps(qm8, _mm512_set1_ps(s)), _mm512_set1_ps(z));
          __m512i u = _mm512_castps_si512(v);
          u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF),
                                                   _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
          _mm256_store_si256((__m256i*)lut[r], _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
#else
          for (int q = 0; q < 16; q++) lut[r][q] = f2bf((float)(q - 8) * s + z);
#endif
        }
        gprev = g;
      }
      for (int j = 0; j < 32; j++) {
        uint16_t* d0 = ob + (int64_t)j * k + k0;
        uint16_t* d1 = ob + (int64_t)(j + 32) * k + k0;
#if defined(__AVX512BW__)
        __m512i x = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i*)tile[j]));
        __m512i lo = _mm512_and_si512(x, _mm512_set1_epi16(15));
        __m512i hi = _mm512_srli_epi16(x, 4);
        _mm512_storeu_si512((void*)d0, _mm512_permutexvar_epi16(lo, _mm512_load_si512((const void*)lut[j])));
        _mm512_storeu_si512((void*)d1, _mm512_permutexvar_epi16(hi, _mm512_load_si512((const void*)lut[j + 32])));
#else
        for (int kk = 0; kk < 32; kk++) {
          uint8_t v = tile[j][kk];
          d0[kk] = lut[j][v & 15];
          d1[kk] = lut[j + 32][v >> 4];
        }
#endif
      }
    }
  }
}

/* The tail rows [full, n) -> out rows [0, n - full). */
void edge_int4_dequant_tail(const uint8_t* packed, const uint16_t* sz, uint16_t* out,
                            int64_t n, int64_t k, int64_t kg) {
  int64_t full = n / 64 * 64, tail = n - full, half = tail / 2;
  const uint8_t* pt = packed + full * k / 2;
  for (int64_t r = 0; r < tail; r++) {
    int shift = (int)(r % 2) * 4;
    for (int64_t kk = 0; kk < k; kk++) {
      int64_t g = kk / kg;
      const uint16_t* p = sz + (g * n + full + r) * 2;
      int q = (pt[kk * half + r / 2] >> shift) & 15;
      out[r * k + kk] = f2bf((float)(q - 8) * bf2f(p[0]) + bf2f(p[1]));
    }
  }
}

/* 1 when built with OpenMP (edge_int4_dequant_team then splits its rows over a team). */
int edge_int4_openmp(void) {
#ifdef _OPENMP
  return 1;
#else
  return 0;
#endif
}

/* Full blocks [b0, b1) (then the tail rows if with_tail) over `threads` OpenMP threads:
   the calling thread's team, which for torch's calling thread is the team its GEMMs use. */
void edge_int4_dequant_team(const uint8_t* packed, const uint16_t* sz, uint16_t* out,
                            int64_t n, int64_t k, int64_t kg, int64_t b0, int64_t b1,
                            int64_t with_tail, int64_t threads) {
#pragma omp parallel num_threads((int)threads)
  {
#ifdef _OPENMP
    int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
    int64_t t = 0, nt = 1;
#endif
    int64_t lo = b0 + (b1 - b0) * t / nt, hi = b0 + (b1 - b0) * (t + 1) / nt;
    if (hi > lo) edge_int4_dequant_blocks(packed, sz, out + (lo - b0) * 64 * k, n, k, kg, lo, hi);
    if (with_tail && t == nt - 1) edge_int4_dequant_tail(packed, sz, out + (b1 - b0) * 64 * k, n, k, kg);
  }
}

/* Embedding lookup: out[t] = row ids[t] of W, K values each, from the same layout. The
   caller checks 0 <= ids[t] < n. */
void edge_int4_gather_rows(const uint8_t* packed, const uint16_t* sz, const int64_t* ids,
                           uint16_t* out, int64_t n, int64_t k, int64_t kg, int64_t count) {
  int64_t full = n / 64 * 64, half = (n - full) / 2;
  const uint8_t* pt = packed + full * k / 2;
  for (int64_t t = 0; t < count; t++) {
    int64_t r = ids[t];
    uint16_t* o = out + t * k;
    const uint8_t* src;
    int64_t stride;
    int shift;
    if (r < full) {  /* byte (k, r % 32) of block r / 64; high nibble for its upper 32 rows */
      src = packed + (r / 64) * k * 32 + r % 32;
      stride = 32;
      shift = (int)((r % 64) / 32) * 4;
    } else {
      src = pt + (r - full) / 2;
      stride = half;
      shift = (int)((r - full) % 2) * 4;
    }
    for (int64_t k0 = 0; k0 < k; k0 += kg) {
      const uint16_t* p = sz + ((k0 / kg) * n + r) * 2;
      float s = bf2f(p[0]), z = bf2f(p[1]);
      for (int64_t kk = k0; kk < k0 + kg && kk < k; kk++)
        o[kk] = f2bf((float)(((src[kk * stride] >> shift) & 15) - 8) * s + z);
    }
  }
}
