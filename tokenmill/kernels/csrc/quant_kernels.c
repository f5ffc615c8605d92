// Linear layers on GGUF block-quantized weights kept packed in memory (Q4_0, Q4_1, Q8_0).
//
// y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]) (+ y[m, n] when accumulating), x and y fp32.
// For the few activation rows of decode, each 32-value block is dequantized exactly in
// registers (d * q, d * q + m) and multiplied at once with up to 8 rows, so the weights
// stream through at their packed size, which is what bounds single-stream decode. Larger
// batches dequantize chunks of rows (tm_dequant_matrix) for a BLAS GEMM (linear.py).
// Compiled with -march=native: AVX-512 (16 lanes), AVX2 (8 lanes) or plain C.
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

enum { QT_Q4_0 = 2, QT_Q4_1 = 3, QT_Q8_0 = 8 };  // GGML type ids
#define QK 32

static inline float fp16(const uint8_t* p) {
    _Float16 h;
    memcpy(&h, p, 2);
    return (float)h;
}

int tm_block_bytes(int qt) {
    switch (qt) {
        case QT_Q4_0: return 18;
        case QT_Q4_1: return 20;
        case QT_Q8_0: return 34;
        default: return 0;
    }
}

// One row of K values (K a multiple of 32) from its blocks, in plain C.
static void dequant_row_c(int qt, const uint8_t* src, int64_t K, float* dst) {
    const int64_t nb = K / QK;
    for (int64_t b = 0; b < nb; b++) {
        float* o = dst + b * QK;
        if (qt == QT_Q8_0) {
            const uint8_t* blk = src + b * 34;
            const float d = fp16(blk);
            const int8_t* q = (const int8_t*)(blk + 2);
            for (int j = 0; j < QK; j++) o[j] = d * (float)q[j];
        } else if (qt == QT_Q4_1) {
            const uint8_t* blk = src + b * 20;
            const float d = fp16(blk), m = fp16(blk + 2);
            const uint8_t* q = blk + 4;
            for (int j = 0; j < QK / 2; j++) {
                o[j] = d * (float)(q[j] & 0x0F) + m;
                o[j + QK / 2] = d * (float)(q[j] >> 4) + m;
            }
        } else {  // Q4_0
            const uint8_t* blk = src + b * 18;
            const float d = fp16(blk);
            const uint8_t* q = blk + 2;
            for (int j = 0; j < QK / 2; j++) {
                o[j] = d * (float)((int)(q[j] & 0x0F) - 8);
                o[j + QK / 2] = d * (float)((int)(q[j] >> 4) - 8);
            }
        }
    }
}

// ---------------------------------------------------------------- few rows: fused GEMV
//
// For decode (a handful of activation rows) each block is dequantized in registers and
// multiplied at once with every row: the weights stream through at their packed size.
#define GEMV_MAX_ROWS 8

#if defined(__AVX512F__)
// One block as two 16-lane vectors (values 0..15 and 16..31).
static inline void block_vec(int qt, const uint8_t* blk, __m512* lo, __m512* hi) {
    if (qt == QT_Q8_0) {
        const __m512 d = _mm512_set1_ps(fp16(blk));
        const __m128i q0 = _mm_loadu_si128((const __m128i*)(blk + 2));
        const __m128i q1 = _mm_loadu_si128((const __m128i*)(blk + 18));
        *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d);
        *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d);
        return;
    }
    const int offset = qt == QT_Q4_1 ? 4 : 2;
    const float d = fp16(blk);
    const float m = qt == QT_Q4_1 ? fp16(blk + 2) : -8.0f * d;
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(blk + offset)));
    const __m512i nib = _mm512_set1_epi32(0x0F);
    const __m512 vd = _mm512_set1_ps(d), vm = _mm512_set1_ps(m);
    *lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(q, nib)), vd, vm);
    *hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), vd, vm);
}

static void gemv_rows(const float* x, int64_t M, int64_t K, const uint8_t* wrow, int qt,
                      int bytes, float* dots) {
    __m512 acc[GEMV_MAX_ROWS];
    for (int m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < K / QK; b++) {
        __m512 lo, hi;
        block_vec(qt, wrow + b * bytes, &lo, &hi);
        for (int m = 0; m < M; m++) {
            const float* xb = x + m * K + b * QK;
            acc[m] = _mm512_fmadd_ps(_mm512_loadu_ps(xb), lo, acc[m]);
            acc[m] = _mm512_fmadd_ps(_mm512_loadu_ps(xb + 16), hi, acc[m]);
        }
    }
    for (int m = 0; m < M; m++) dots[m] = _mm512_reduce_add_ps(acc[m]);
}
#elif defined(__AVX2__)
// One block as four 8-lane vectors (values 0..7, 8..15, 16..23, 24..31).
static inline void block_vec(int qt, const uint8_t* blk, __m256 v[4]) {
    if (qt == QT_Q8_0) {
        const __m256 d = _mm256_set1_ps(fp16(blk));
        for (int i = 0; i < 4; i++) {
            const __m128i q = _mm_loadl_epi64((const __m128i*)(blk + 2 + 8 * i));
            v[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
        }
        return;
    }
    const int offset = qt == QT_Q4_1 ? 4 : 2;
    const float d = fp16(blk);
    const float m = qt == QT_Q4_1 ? fp16(blk + 2) : -8.0f * d;
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    const __m256i nib = _mm256_set1_epi32(0x0F);
    for (int i = 0; i < 2; i++) {
        const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(blk + offset + 8 * i)));
        v[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q, nib)), vd, vm);
        v[i + 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4)), vd, vm);
    }
}

static inline float hsum256(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

static void gemv_rows(const float* x, int64_t M, int64_t K, const uint8_t* wrow, int qt,
                      int bytes, float* dots) {
    __m256 acc[GEMV_MAX_ROWS];
    for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < K / QK; b++) {
        __m256 v[4];
        block_vec(qt, wrow + b * bytes, v);
        for (int m = 0; m < M; m++) {
            const float* xb = x + m * K + b * QK;
            for (int i = 0; i < 4; i++) acc[m] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8 * i), v[i], acc[m]);
        }
    }
    for (int m = 0; m < M; m++) dots[m] = hsum256(acc[m]);
}
#else
static void gemv_rows(const float* x, int64_t M, int64_t K, const uint8_t* wrow, int qt,
                      int bytes, float* dots) {
    float row[QK];
    for (int m = 0; m < M; m++) dots[m] = 0.0f;
    for (int64_t b = 0; b < K / QK; b++) {
        dequant_row_c(qt, wrow + b * bytes, QK, row);
        for (int m = 0; m < M; m++)
            for (int j = 0; j < QK; j++) dots[m] += x[m * K + b * QK + j] * row[j];
    }
}
#endif

static void dequant_row(int qt, const uint8_t* src, int64_t K, float* dst) {
    const int bytes = tm_block_bytes(qt);
#if defined(__AVX512F__)
    for (int64_t b = 0; b < K / QK; b++) {
        __m512 lo, hi;
        block_vec(qt, src + b * bytes, &lo, &hi);
        _mm512_storeu_ps(dst + b * QK, lo);
        _mm512_storeu_ps(dst + b * QK + 16, hi);
    }
#elif defined(__AVX2__)
    for (int64_t b = 0; b < K / QK; b++) {
        __m256 v[4];
        block_vec(qt, src + b * bytes, v);
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(dst + b * QK + 8 * i, v[i]);
    }
#else
    (void)bytes;
    dequant_row_c(qt, src, K, dst);
#endif
}

static void qgemv(const float* x, int64_t M, int64_t K, const uint8_t* w, int qt, int64_t N,
                  const float* bias, float* y, int accumulate, int nthreads) {
    const int bytes = tm_block_bytes(qt);
    const int64_t row_bytes = (K / QK) * bytes;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        float dots[GEMV_MAX_ROWS];
        gemv_rows(x, M, K, w + n * row_bytes, qt, bytes, dots);
        for (int64_t m = 0; m < M; m++) {
            const float v = dots[m] + (bias ? bias[n] : 0.0f);
            y[m * N + n] = accumulate ? y[m * N + n] + v : v;
        }
    }
}

void tm_qlinear(const float* x, int64_t M, int64_t K, const uint8_t* w, int qt, int64_t N,
                const float* bias, float* y, int accumulate, int nthreads) {
    for (int64_t m = 0; m < M; m += GEMV_MAX_ROWS) {
        const int64_t rows = M - m < GEMV_MAX_ROWS ? M - m : GEMV_MAX_ROWS;
        qgemv(x + m * K, rows, K, w, qt, N, bias, y + m * N, accumulate, nthreads);
    }
}

// The whole matrix in fp32 (for large batches, which then run a BLAS GEMM).
void tm_dequant_matrix(const uint8_t* w, int qt, int64_t N, int64_t K, float* out, int nthreads) {
    const int64_t row_bytes = (K / QK) * tm_block_bytes(qt);
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t n = 0; n < N; n++) dequant_row(qt, w + n * row_bytes, K, out + n * K);
}

// Selected rows (an embedding lookup on a packed table).
void tm_dequant_rows(const uint8_t* w, int qt, int64_t K, const int64_t* ids, int64_t M, float* out,
                     int nthreads) {
    const int64_t row_bytes = (K / QK) * tm_block_bytes(qt);
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t m = 0; m < M; m++) dequant_row(qt, w + ids[m] * row_bytes, K, out + m * K);
}
