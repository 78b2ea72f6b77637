/* cpu_int8: signed 8-bit codes with an fp16 scale and offset per group of input columns,
 * w[n][k] = q[n][k] * s[n][k / g] + z[n][k / g]; activations and outputs in bf16.
 *
 * The product reads each weight row once for up to ROWS activation rows: 16 codes at a time
 * are widened to fp32, scaled, and multiplied into one accumulator per activation row
 * (AVX-512; AVX2 takes 8 at a time, into four accumulators per row where the group is a
 * multiple of 32; any other CPU runs the portable loop). The offset term
 * needs only the activation's sum over each group, computed once per call.
 *
 * Plain C, no torch headers: built by quant/int8.py with the system compiler.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "edge_bf16.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__F16C__) || defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#define ROWS 8
#define MAX_GROUP 256

static inline float h2f(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return edge_h2f_soft(h);
#endif
}

int edge_int8_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

#if defined(__AVX512F__)
/* One activation row: four accumulators, so the FMA latency is not the bound. Inlined with a
 * constant group where it is 16 or 32, so finding a chunk's scale is a shift. */
static inline __attribute__((always_inline)) float dot1_512(const int8_t *qr, const uint16_t *sr,
                                                            const float *xf, int64_t k, int64_t g) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t j = 0;
#define EDGE_W(at) _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32( \
        _mm_loadu_si128((const __m128i *)(qr + (at))))), _mm512_set1_ps(h2f(sr[(at) / g])))
    for (; j + 64 <= k; j += 64) {
        a0 = _mm512_fmadd_ps(EDGE_W(j), _mm512_loadu_ps(xf + j), a0);
        a1 = _mm512_fmadd_ps(EDGE_W(j + 16), _mm512_loadu_ps(xf + j + 16), a1);
        a2 = _mm512_fmadd_ps(EDGE_W(j + 32), _mm512_loadu_ps(xf + j + 32), a2);
        a3 = _mm512_fmadd_ps(EDGE_W(j + 48), _mm512_loadu_ps(xf + j + 48), a3);
    }
    for (; j < k; j += 16) a0 = _mm512_fmadd_ps(EDGE_W(j), _mm512_loadu_ps(xf + j), a0);
#undef EDGE_W
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}
#endif

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define EDGE_DOT_AVX2 1
/* tot[i] = sum over k of x[i][k] * (q[k] * scale + offset) for M (1 or 2) activation rows, g a
 * multiple of 32; xs holds the rows' group sums. Four accumulators per row, one per 8-column
 * slot of every 32 columns: with one, a decode row waits on the FMA latency every 8 weights.
 * Two rows share each widened weight vector (2 x 4 accumulators and 4 weight vectors fit the
 * 16 registers). A row's sums run in the same order whether it shares its pass or not, so its
 * result does not depend on the batch around it. The offset term is 8 groups per FMA: summed
 * one group at a time in a scalar chain it was a latency chain as long as the product's. */
static inline __attribute__((always_inline)) void dot_avx2(const int8_t *qr, const uint16_t *sr,
                                                           const uint16_t *zr, const float *xf,
                                                           const float *xs, float *tot, int64_t k,
                                                           int64_t g, const int M) {
    const int64_t ng = k / g;
    __m256 a[2][4];
    for (int m = 0; m < M; m++)
        for (int c = 0; c < 4; c++) a[m][c] = _mm256_setzero_ps();
    for (int64_t j0 = 0; j0 < k; j0 += g) {
        const __m256 sc = _mm256_set1_ps(h2f(sr[j0 / g]));
        for (int64_t j = j0; j < j0 + g; j += 32) {
            __m256 w[4];
            for (int c = 0; c < 4; c++)
                w[c] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                           _mm_loadl_epi64((const __m128i *)(qr + j + 8 * c)))), sc);
            for (int m = 0; m < M; m++)
                for (int c = 0; c < 4; c++)
                    a[m][c] = _mm256_fmadd_ps(w[c], _mm256_loadu_ps(xf + m * k + j + 8 * c), a[m][c]);
        }
    }
    /* the offset term, sum over groups of z * (the group's sum of x), 8 groups at a time */
    int64_t gi = 0;
    if (zr)
        for (; gi + 8 <= ng; gi += 8) {
            const __m256 zc = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(zr + gi)));
            for (int m = 0; m < M; m++)
                a[m][0] = _mm256_fmadd_ps(zc, _mm256_loadu_ps(xs + m * ng + gi), a[m][0]);
        }
    for (int m = 0; m < M; m++) {
        const __m256 t = _mm256_add_ps(_mm256_add_ps(a[m][0], a[m][1]), _mm256_add_ps(a[m][2], a[m][3]));
        __m128 v = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        v = _mm_add_ss(v, _mm_movehdup_ps(v));
        float t1 = _mm_cvtss_f32(v);
        if (zr)
            for (int64_t r = gi; r < ng; r++) t1 += h2f(zr[r]) * xs[m * ng + r];
        tot[m] = t1;
    }
}
#endif

/* tot[i] = sum over k of x[i][k] * w[k] for one weight row and mm <= ROWS activation rows.
 * The scale is folded into the widened codes (one multiply per 16 weights) so each row keeps
 * one vector accumulator and reduces once; the offset needs only xs, the group sums. */
static void row_dot(const int8_t *qr, const uint16_t *sr, const uint16_t *zr, const float *xf,
                    const float *xs, float *tot, int64_t mm, int64_t k, int64_t g) {
    const int64_t ng = k / g;
    for (int64_t i = 0; i < mm; i++) tot[i] = 0.f;
#if defined(__AVX512F__)
    if (g % 16 == 0) {
        if (mm == 1) {  /* decode */
            float t = g == 32 ? dot1_512(qr, sr, xf, k, 32)
                    : g == 16 ? dot1_512(qr, sr, xf, k, 16) : dot1_512(qr, sr, xf, k, g);
            if (zr)
                for (int64_t gi = 0; gi < ng; gi++) t += h2f(zr[gi]) * xs[gi];
            tot[0] = t;
            return;
        }
        __m512 acc[ROWS];
        for (int64_t i = 0; i < mm; i++) acc[i] = _mm512_setzero_ps();
        for (int64_t gi = 0; gi < ng; gi++) {
            const __m512 sc = _mm512_set1_ps(h2f(sr[gi]));
            for (int64_t j = gi * g; j < (gi + 1) * g; j += 16) {
                const __m128i c = _mm_loadu_si128((const __m128i *)(qr + j));
                const __m512 w = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c)), sc);
                for (int64_t i = 0; i < mm; i++)
                    acc[i] = _mm512_fmadd_ps(w, _mm512_loadu_ps(xf + i * k + j), acc[i]);
            }
            if (zr) {
                const float zc = h2f(zr[gi]);
                for (int64_t i = 0; i < mm; i++) tot[i] += zc * xs[i * ng + gi];
            }
        }
        for (int64_t i = 0; i < mm; i++) tot[i] += _mm512_reduce_add_ps(acc[i]);
        return;
    }
#elif defined(__AVX2__) && defined(__FMA__)
#ifdef EDGE_DOT_AVX2
    if (g % 32 == 0) {
        for (int64_t i0 = 0; i0 < mm; i0 += 2) {
            if (mm - i0 >= 2) dot_avx2(qr, sr, zr, xf + i0 * k, xs + i0 * ng, tot + i0, k, g, 2);
            else dot_avx2(qr, sr, zr, xf + i0 * k, xs + i0 * ng, tot + i0, k, g, 1);
        }
        return;
    }
#endif
    if (g % 8 == 0) {
        __m256 acc[ROWS];
        for (int64_t i = 0; i < mm; i++) acc[i] = _mm256_setzero_ps();
        for (int64_t gi = 0; gi < ng; gi++) {
            const __m256 sc = _mm256_set1_ps(h2f(sr[gi]));
            for (int64_t j = gi * g; j < (gi + 1) * g; j += 8) {
                const __m128i c = _mm_loadl_epi64((const __m128i *)(qr + j));
                const __m256 w = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c)), sc);
                for (int64_t i = 0; i < mm; i++)
                    acc[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xf + i * k + j), acc[i]);
            }
            if (zr) {
                const float zc = h2f(zr[gi]);
                for (int64_t i = 0; i < mm; i++) tot[i] += zc * xs[i * ng + gi];
            }
        }
        for (int64_t i = 0; i < mm; i++) {
            __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc[i]), _mm256_extractf128_ps(acc[i], 1));
            v = _mm_add_ps(v, _mm_movehl_ps(v, v));
            v = _mm_add_ss(v, _mm_movehdup_ps(v));
            tot[i] += _mm_cvtss_f32(v);
        }
        return;
    }
#endif
    /* portable: any group size, any CPU */
    for (int64_t gi = 0; gi < ng; gi++) {
        const float sc = h2f(sr[gi]), zc = zr ? h2f(zr[gi]) : 0.f;
        for (int64_t i = 0; i < mm; i++) {
            const float *xp = xf + i * k + gi * g;
            float d = 0.f;
            for (int64_t j = 0; j < g; j++) d += (float)qr[gi * g + j] * xp[j];
            tot[i] += sc * d + zc * xs[i * ng + gi];
        }
    }
}

/* y[m][n] (bf16) = x[m][k] (bf16) . w[n][k]^T; z may be NULL (symmetric codes).
 * Returns 0, or 1 when the shapes are not ones it takes (nothing written). */
int edge_int8_gemv(const int8_t *q, const uint16_t *s, const uint16_t *z, const uint16_t *x,
                   uint16_t *y, int64_t m, int64_t n, int64_t k, int64_t g, int64_t threads) {
    if (g < 1 || g > MAX_GROUP || k % g || m < 1 || n < 1) return 1;
    const int64_t ng = k / g;
    float *xf = malloc(sizeof(float) * (size_t)(m * k));
    float *xs = malloc(sizeof(float) * (size_t)(m * ng));
    if (!xf || !xs) { free(xf); free(xs); return 1; }
    for (int64_t i = 0; i < m * k; i++) xf[i] = edge_bf2f(x[i]);
    for (int64_t i = 0; i < m; i++)
        for (int64_t gi = 0; gi < ng; gi++) {
            const float *xp = xf + i * k + gi * g;
            float t = 0.f;
            for (int64_t j = 0; j < g; j++) t += xp[j];
            xs[i * ng + gi] = t;
        }
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads((int)(threads > 0 ? threads : 1)) schedule(static)
#endif
    for (int64_t r = 0; r < n; r++) {
        const int8_t *qr = q + r * k;
        const uint16_t *sr = s + r * ng, *zr = z ? z + r * ng : NULL;
        for (int64_t m0 = 0; m0 < m; m0 += ROWS) {
            const int64_t mm = m - m0 < ROWS ? m - m0 : ROWS;
            float tot[ROWS];
            row_dot(qr, sr, zr, xf + m0 * k, xs + m0 * ng, tot, mm, k, g);
            for (int64_t i = 0; i < mm; i++) y[(m0 + i) * n + r] = edge_f2bf(tot[i]);
        }
    }
    free(xf);
    free(xs);
    return 0;
}

static void dequant_row(const int8_t *qr, const uint16_t *sr, const uint16_t *zr, uint16_t *out,
                        int64_t k, int64_t g) {
    for (int64_t gi = 0; gi < k / g; gi++) {
        const float sc = h2f(sr[gi]), zc = zr ? h2f(zr[gi]) : 0.f;
        for (int64_t j = 0; j < g; j++) out[gi * g + j] = edge_f2bf((float)qr[gi * g + j] * sc + zc);
    }
}

/* rows [r0, r1) of w as row-major bf16 into out[r1 - r0][k] */
int edge_int8_dequant(const int8_t *q, const uint16_t *s, const uint16_t *z, uint16_t *out,
                      int64_t r0, int64_t r1, int64_t k, int64_t g, int64_t threads) {
    if (g < 1 || k % g || r1 < r0) return 1;
    const int64_t ng = k / g;
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads((int)(threads > 0 ? threads : 1)) schedule(static)
#endif
    for (int64_t r = r0; r < r1; r++)
        dequant_row(q + r * k, s + r * ng, z ? z + r * ng : NULL, out + (r - r0) * k, k, g);
    return 0;
}

/* out[i] = row ids[i] of w (an embedding lookup); ids are checked by the caller */
int edge_int8_gather(const int8_t *q, const uint16_t *s, const uint16_t *z, const int64_t *ids,
                     uint16_t *out, int64_t count, int64_t k, int64_t g) {
    if (g < 1 || k % g) return 1;
    const int64_t ng = k / g;
    for (int64_t i = 0; i < count; i++) {
        const int64_t r = ids[i];
        dequant_row(q + r * k, s + r * ng, z ? z + r * ng : NULL, out + i * k, k, g);
    }
    return 0;
}
