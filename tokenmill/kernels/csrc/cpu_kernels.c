// CPU kernels for tokenmill, called through ctypes (plain C ABI, no torch headers, so a
// build takes about a second). Parallel regions use OpenMP: torch's bundled libgomp is
// already loaded when these run, so both share one thread pool.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "poly_exp.h"
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define TM_VNNI512 1
#endif

int tm_has_vnni(void) {
#ifdef TM_VNNI512
    return 1;
#else
    return 0;
#endif
}

// out[m, n] = ((float)sum_k xq[m,k] * w[n,k]) * xs[m] * ws[n] (+ bias[n]).
// The integer sum is exact, so the result equals torch._int_mm followed by the same
// two multiplications, whatever the batch size: the int8 path stays batch-invariant.
// w_colsum[n] = sum_k w[n,k] (used to undo the +128 offset of the VNNI u8 x s8 product).
void tm_int8_linear(const int8_t* xq, const float* xs, const int8_t* w, const int32_t* w_colsum,
                    const float* ws, const float* bias, int64_t M, int64_t N, int64_t K, float* out,
                    int accumulate, int nthreads) {
#ifdef TM_VNNI512
    if (K % 64 == 0) {
        uint8_t* xu = (uint8_t*)malloc((size_t)(M * K));
        for (int64_t i = 0; i < M * K; ++i) xu[i] = (uint8_t)(xq[i] ^ 0x80);  // x + 128
#pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int64_t n = 0; n < N; ++n) {
            const int8_t* wr = w + n * K;
            int64_t m = 0;
            for (; m + 4 <= M; m += 4) {
                __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
                for (int64_t k = 0; k < K; k += 64) {
                    __m512i wv = _mm512_loadu_si512((const void*)(wr + k));
                    a0 = _mm512_dpbusd_epi32(a0, _mm512_loadu_si512((const void*)(xu + (m + 0) * K + k)), wv);
                    a1 = _mm512_dpbusd_epi32(a1, _mm512_loadu_si512((const void*)(xu + (m + 1) * K + k)), wv);
                    a2 = _mm512_dpbusd_epi32(a2, _mm512_loadu_si512((const void*)(xu + (m + 2) * K + k)), wv);
                    a3 = _mm512_dpbusd_epi32(a3, _mm512_loadu_si512((const void*)(xu + (m + 3) * K + k)), wv);
                }
                int32_t acc[4] = {_mm512_reduce_add_epi32(a0), _mm512_reduce_add_epi32(a1),
                                  _mm512_reduce_add_epi32(a2), _mm512_reduce_add_epi32(a3)};
                for (int j = 0; j < 4; ++j) {
                    float y = (float)(acc[j] - 128 * w_colsum[n]) * xs[m + j];
                    y = y * ws[n];
                    if (bias) y = y + bias[n];
                    float* o = out + (m + j) * N + n;
                    *o = accumulate ? *o + y : y;
                }
            }
            for (; m < M; ++m) {
                __m512i a = _mm512_setzero_si512();
                for (int64_t k = 0; k < K; k += 64)
                    a = _mm512_dpbusd_epi32(a, _mm512_loadu_si512((const void*)(xu + m * K + k)),
                                            _mm512_loadu_si512((const void*)(wr + k)));
                float y = (float)(_mm512_reduce_add_epi32(a) - 128 * w_colsum[n]) * xs[m];
                y = y * ws[n];
                if (bias) y = y + bias[n];
                float* o = out + m * N + n;
                *o = accumulate ? *o + y : y;
            }
        }
        free(xu);
        return;
    }
#endif
    (void)w_colsum;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        const int8_t* wr = w + n * K;
        for (int64_t m = 0; m < M; ++m) {
            const int8_t* xr = xq + m * K;
            int32_t acc = 0;
#pragma omp simd reduction(+ : acc)
            for (int64_t k = 0; k < K; ++k) acc += (int32_t)xr[k] * (int32_t)wr[k];
            float y = (float)acc * xs[m];
            y = y * ws[n];
            if (bias) y = y + bias[n];
            float* o = out + m * N + n;
            *o = accumulate ? *o + y : y;
        }
    }
}

// ---------------------------------------------------------------- fused elementwise ops
// Each row is processed independently and identically whatever M is (batch invariance).

static inline float rms_inv(const float* x, int64_t K, float eps) {
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t k = 0; k < K; ++k) ss += x[k] * x[k];
    return 1.0f / sqrtf(ss / (float)K + eps);
}

static inline void quantize_row(const float* v, int64_t K, int8_t* q, float* scale) {
    float amax = 0.f;
    for (int64_t k = 0; k < K; ++k) {
        float a = fabsf(v[k]);
        amax = a > amax ? a : amax;
    }
    if (amax < 1e-12f) amax = 1e-12f;
    float s = amax / 127.0f;
    *scale = s;
    for (int64_t k = 0; k < K; ++k) q[k] = (int8_t)nearbyintf(v[k] / s);
}

// out = x * rsqrt(mean(x^2) + eps) * w
void tm_rmsnorm(const float* x, const float* w, int64_t M, int64_t K, float eps, float* out, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M > 8)
    for (int64_t m = 0; m < M; ++m) {
        const float* xr = x + m * K;
        float inv = rms_inv(xr, K, eps);
        float* o = out + m * K;
#pragma omp simd
        for (int64_t k = 0; k < K; ++k) o[k] = (xr[k] * inv) * w[k];
    }
}

// RMSNorm then per-row int8 quantization (the normalized row never leaves the cache).
void tm_rmsnorm_quant(const float* x, const float* w, int64_t M, int64_t K, float eps, int8_t* q,
                      float* scale, int nthreads) {
#pragma omp parallel num_threads(nthreads) if (M > 8)
    {
        float* tmp = (float*)malloc(sizeof(float) * (size_t)K);
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; ++m) {
            const float* xr = x + m * K;
            float inv = rms_inv(xr, K, eps);
#pragma omp simd
            for (int64_t k = 0; k < K; ++k) tmp[k] = (xr[k] * inv) * w[k];
            quantize_row(tmp, K, q + m * K, scale + m);
        }
        free(tmp);
    }
}

// Per-row quantization of a (possibly strided) [M, K] float matrix.
void tm_quantize_rows_strided(const float* x, int64_t M, int64_t K, int64_t stride, int8_t* q,
                              float* scale, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M > 8)
    for (int64_t m = 0; m < M; ++m) quantize_row(x + m * stride, K, q + m * K, scale + m);
}

// gate_up: [M, 2I] (gate | up) -> silu(gate) * up, quantized per row.
void tm_silu_mul_quant(const float* gu, int64_t M, int64_t I, int8_t* q, float* scale, int nthreads) {
#pragma omp parallel num_threads(nthreads) if (M > 8)
    {
        float* tmp = (float*)malloc(sizeof(float) * (size_t)I);
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; ++m) {
            const float* g = gu + m * 2 * I;
            const float* u = g + I;
#pragma omp simd
            for (int64_t i = 0; i < I; ++i) tmp[i] = (g[i] / (1.0f + poly_expf(-g[i]))) * u[i];
            quantize_row(tmp, I, q + m * I, scale + m);
        }
        free(tmp);
    }
}

// out[m, n] = ((float)acc[m, n] * xs[m]) * ws[n] (+ bias[n]) (+ out[m, n] when accumulate).
void tm_dequant_i32(const int32_t* acc, const float* xs, const float* ws, const float* bias, int64_t M,
                    int64_t N, int accumulate, float* out, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M * N > 65536)
    for (int64_t m = 0; m < M; ++m) {
        const int32_t* a = acc + m * N;
        float* o = out + m * N;
        const float x = xs[m];
        for (int64_t n = 0; n < N; ++n) {
            float y = ((float)a[n] * x) * ws[n];
            if (bias) y = y + bias[n];
            o[n] = accumulate ? o[n] + y : y;
        }
    }
}

// In-place rotate-half RoPE on the first `nheads` heads of each row of x ([T, row_stride]
// floats; heads of hd floats from the row start), on each head's first rotary_dim dims (the
// rest as they are). cos/sin: [max_pos, rotary_dim/2].
void tm_rope_neox(float* x, int64_t T, int64_t row_stride, int64_t nheads, int64_t hd,
                  int64_t rotary_dim, const int64_t* positions, const float* cos_t,
                  const float* sin_t, int nthreads) {
    const int64_t half = rotary_dim / 2;  // the first rotary_dim dims of a head turn (Phi-4)
#pragma omp parallel for num_threads(nthreads) schedule(static) if (T > 8)
    for (int64_t t = 0; t < T; ++t) {
        const float* c = cos_t + positions[t] * half;
        const float* s = sin_t + positions[t] * half;
        for (int64_t h = 0; h < nheads; ++h) {
            float* x1 = x + t * row_stride + h * hd;
            float* x2 = x1 + half;
#pragma omp simd
            for (int64_t i = 0; i < half; ++i) {
                float a = x1[i], b = x2[i];
                x1[i] = a * c[i] - b * s[i];
                x2[i] = b * c[i] + a * s[i];
            }
        }
    }
}

// The float16 conversions of a float16 KV pool (half.h), for tests: the scalar widening, and
// the narrowing the one-call decoder runs (vector != 0) or its scalar form.
void tm_halves_to_floats(const uint16_t* h, int64_t n, float* out) {
    for (int64_t i = 0; i < n; i++) out[i] = half_to_float(h[i]);
}

void tm_floats_to_halves(const float* x, int64_t n, uint16_t* out, int vector) {
    if (vector) {
        floats_to_halves(x, n, out);
        return;
    }
    for (int64_t i = 0; i < n; i++) out[i] = float_to_half(x[i]);
}
