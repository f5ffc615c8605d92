// Linear layers on GGUF block-quantized weights kept packed in memory, in ggml's block layouts:
// Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (blocks of 32 values with an fp16 scale, and a minimum for
// the _1 formats) and the K formats Q4_K and Q6_K (super-blocks of 256 values: 8 sub-blocks of
// 32 with their own 6-bit scale and minimum in Q4_K, 16 groups of 16 with an int8 scale in
// Q6_K, under an fp16 super-scale).
//
// y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]) (+ y[m, n] when accumulating), x and y fp32;
// K is a multiple of the format's block (32 or 256 values).
// Weights are dequantized 32 values at a time (a block, or a K-format sub-block: a "chunk"),
// exactly as gguf's reference dequantizer does: bit for bit, except Q4_1's fused multiply-add
// (one rounding instead of two); -std=c11 keeps the compiler from contracting the separate
// multiplies and adds of the other formats. For the few activation rows of decode each chunk
// is dequantized in registers and multiplied at once with up to 8 rows, so the weights stream
// through at their packed size, which is what bounds single-stream decode. Larger batches
// dequantize chunks of rows (tm_dequant_matrix) for a BLAS GEMM (linear.py).
// Compiled with -march=native: AVX-512 (16 lanes), AVX2 (8 lanes) or plain C. Every function
// is specialized per format (a switch over always-inlined bodies), so the inner loops carry
// no format branches.
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

enum {  // GGML type ids
    QT_Q4_0 = 2,
    QT_Q4_1 = 3,
    QT_Q5_0 = 6,
    QT_Q5_1 = 7,
    QT_Q8_0 = 8,
    QT_Q4_K = 12,
    QT_Q6_K = 14,
};
#define QK 32     // values per chunk: a whole block, or a sub-block of a K format
#define QK_K 256  // values per K-format super-block
#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline float fp16(const uint8_t* p) {
    _Float16 h;
    memcpy(&h, p, 2);
    return (float)h;
}

static inline int block_bytes(int qt) {
    switch (qt) {
        case QT_Q4_0: return 18;
        case QT_Q4_1: return 20;
        case QT_Q5_0: return 22;
        case QT_Q5_1: return 24;
        case QT_Q8_0: return 34;
        case QT_Q4_K: return 144;
        case QT_Q6_K: return 210;
        default: return 0;
    }
}

static inline int is_k_format(int qt) { return qt == QT_Q4_K || qt == QT_Q6_K; }

static inline int block_values(int qt) {
    if (!block_bytes(qt)) return 0;
    return is_k_format(qt) ? QK_K : QK;
}

int tm_block_bytes(int qt) { return block_bytes(qt); }

int tm_block_values(int qt) { return block_values(qt); }

static inline int64_t row_bytes(int qt, int64_t K) {
    const int values = block_values(qt);
    return values ? K / values * block_bytes(qt) : 0;
}

// Chunks (32-value sub-blocks) per block: 8 in the K formats, else the block itself.
static inline int block_chunks(int qt) { return is_k_format(qt) ? QK_K / QK : 1; }

// Sub-block j's 6-bit scale and minimum from a Q4_K super-block's 12 scale bytes (ggml's
// get_scale_min_k4): j < 4 in the low 6 bits of bytes j and j + 4; j >= 4 from the nibbles
// of byte j + 4 and the top 2 bits of bytes j - 4 and j.
ALWAYS_INLINE void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Where a Q6_K chunk's values come from: value j of sub-block s (h = s / 4, t = s % 4) has its
// low 4 bits in ql[64h + 32(t % 2) + j] >> 4(t / 2), its high 2 bits in qh[32h + j] >> 2t and
// its scale in scales[8h + 2t + j / 16]; the stored 6 bits minus 32 times d * scale.
typedef struct {
    const uint8_t* ql;
    const uint8_t* qh;
    const int8_t* scales;
    int ql_shift, qh_shift;
    float d;
} Q6Chunk;

ALWAYS_INLINE Q6Chunk q6_chunk(const uint8_t* blk, int s) {
    const int h = s >> 2, t = s & 3;
    Q6Chunk c = {blk + 64 * h + 32 * (t & 1), blk + 128 + 32 * h,
                 (const int8_t*)(blk + 192) + 8 * h + 2 * t, 4 * (t >> 1), 2 * t, fp16(blk + 208)};
    return c;
}

// One chunk (32 values) in plain C.
ALWAYS_INLINE void dequant_chunk_c(int qt, const uint8_t* blk, int s, float* o) {
    if (qt == QT_Q8_0) {
        const float d = fp16(blk);
        const int8_t* q = (const int8_t*)(blk + 2);
        for (int j = 0; j < QK; j++) o[j] = d * (float)q[j];
    } else if (qt == QT_Q4_1) {
        const float d = fp16(blk), m = fp16(blk + 2);
        const uint8_t* q = blk + 4;
        for (int j = 0; j < QK / 2; j++) {
            o[j] = d * (float)(q[j] & 0x0F) + m;
            o[j + QK / 2] = d * (float)(q[j] >> 4) + m;
        }
    } else if (qt == QT_Q4_0) {
        const float d = fp16(blk);
        const uint8_t* q = blk + 2;
        for (int j = 0; j < QK / 2; j++) {
            o[j] = d * (float)((int)(q[j] & 0x0F) - 8);
            o[j + QK / 2] = d * (float)((int)(q[j] >> 4) - 8);
        }
    } else if (qt == QT_Q5_0 || qt == QT_Q5_1) {
        const int off = qt == QT_Q5_1 ? 4 : 2;
        const float d = fp16(blk), m = qt == QT_Q5_1 ? fp16(blk + 2) : 0.0f;
        uint32_t qh;
        memcpy(&qh, blk + off, 4);
        const uint8_t* q = blk + off + 4;
        for (int j = 0; j < QK / 2; j++) {
            const int lo = (q[j] & 0x0F) | (int)((qh >> j) & 1) << 4;
            const int hi = (q[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            if (qt == QT_Q5_0) {
                o[j] = d * (float)(lo - 16);
                o[j + QK / 2] = d * (float)(hi - 16);
            } else {
                o[j] = d * (float)lo + m;
                o[j + QK / 2] = d * (float)hi + m;
            }
        }
    } else if (qt == QT_Q4_K) {
        int sc, mn;
        scale_min_k4(s, blk + 4, &sc, &mn);
        const float d = fp16(blk) * (float)sc, m = fp16(blk + 2) * (float)mn;
        const uint8_t* q = blk + 16 + 32 * (s >> 1);
        const int shift = 4 * (s & 1);
        for (int j = 0; j < QK; j++) o[j] = d * (float)((q[j] >> shift) & 0x0F) - m;
    } else {  // Q6_K
        const Q6Chunk k = q6_chunk(blk, s);
        for (int j = 0; j < QK; j++) {
            const int q = ((k.ql[j] >> k.ql_shift) & 0x0F) | ((k.qh[j] >> k.qh_shift) & 3) << 4;
            o[j] = (k.d * (float)k.scales[j >> 4]) * (float)(q - 32);
        }
    }
}

// ---------------------------------------------------------------- few rows: fused GEMV
//
// For decode (a handful of activation rows) each chunk is dequantized in registers and
// multiplied at once with every row: the weights stream through at their packed size.
#define GEMV_MAX_ROWS 8
#define GEMV_WEIGHT_ROWS 4  // weight rows per pass when there is one activation row

#if defined(__AVX512F__)
// One chunk as two 16-lane vectors (values 0..15 and 16..31).
ALWAYS_INLINE void chunk_vec(int qt, const uint8_t* blk, int s, __m512* lo, __m512* hi) {
    const __m512i nib = _mm512_set1_epi32(0x0F);
    if (qt == QT_Q8_0) {
        const __m512 d = _mm512_set1_ps(fp16(blk));
        const __m128i q0 = _mm_loadu_si128((const __m128i*)(blk + 2));
        const __m128i q1 = _mm_loadu_si128((const __m128i*)(blk + 18));
        *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d);
        *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d);
    } else if (qt == QT_Q4_0 || qt == QT_Q4_1) {
        const int offset = qt == QT_Q4_1 ? 4 : 2;
        const float d = fp16(blk);
        const float m = qt == QT_Q4_1 ? fp16(blk + 2) : -8.0f * d;
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(blk + offset)));
        const __m512 vd = _mm512_set1_ps(d), vm = _mm512_set1_ps(m);
        *lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(q, nib)), vd, vm);
        *hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), vd, vm);
    } else if (qt == QT_Q5_0 || qt == QT_Q5_1) {
        const int off = qt == QT_Q5_1 ? 4 : 2;
        uint32_t qh;
        memcpy(&qh, blk + off, 4);
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(blk + off + 4)));
        const __m512i bit4 = _mm512_set1_epi32(16);
        __m512i l = _mm512_and_si512(q, nib), h = _mm512_srli_epi32(q, 4);
        l = _mm512_mask_or_epi32(l, (__mmask16)(qh & 0xFFFF), l, bit4);  // the fifth bits
        h = _mm512_mask_or_epi32(h, (__mmask16)(qh >> 16), h, bit4);
        const __m512 d = _mm512_set1_ps(fp16(blk));
        if (qt == QT_Q5_0) {
            *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(l, bit4)), d);
            *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(h, bit4)), d);
        } else {
            const __m512 m = _mm512_set1_ps(fp16(blk + 2));
            *lo = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(l), d), m);
            *hi = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(h), d), m);
        }
    } else if (qt == QT_Q4_K) {
        int sc, mn;
        scale_min_k4(s, blk + 4, &sc, &mn);
        const __m512 d = _mm512_set1_ps(fp16(blk) * (float)sc);
        const __m512 m = _mm512_set1_ps(fp16(blk + 2) * (float)mn);
        const uint8_t* qs = blk + 16 + 32 * (s >> 1);
        __m512i q0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)qs));
        __m512i q1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(qs + 16)));
        if (s & 1) {
            q0 = _mm512_srli_epi32(q0, 4);
            q1 = _mm512_srli_epi32(q1, 4);
        } else {
            q0 = _mm512_and_si512(q0, nib);
            q1 = _mm512_and_si512(q1, nib);
        }
        *lo = _mm512_sub_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(q0), d), m);
        *hi = _mm512_sub_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(q1), d), m);
    } else {  // Q6_K
        const Q6Chunk k = q6_chunk(blk, s);
        const __m128i lsh = _mm_cvtsi32_si128(k.ql_shift), hsh = _mm_cvtsi32_si128(k.qh_shift);
        __m512 v[2];
        for (int i = 0; i < 2; i++) {
            const __m512i l = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(k.ql + 16 * i)));
            const __m512i h = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(k.qh + 16 * i)));
            const __m512i q = _mm512_or_si512(
                _mm512_and_si512(_mm512_srl_epi32(l, lsh), nib),
                _mm512_slli_epi32(_mm512_and_si512(_mm512_srl_epi32(h, hsh), _mm512_set1_epi32(3)), 4));
            const __m512 d = _mm512_set1_ps(k.d * (float)k.scales[i]);
            v[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(32))), d);
        }
        *lo = v[0];
        *hi = v[1];
    }
}

// Each (activation row, weight row) dot product accumulates values 0..15 and 16..31 of every
// chunk in two separate vectors (two dependency chains), summed at the end, in the same order
// in both kernels below: a row's result does not depend on how many rows run with it.
ALWAYS_INLINE void gemv_rows_t(const float* x, int64_t M, int64_t K, const uint8_t* wrow, int qt,
                               float* dots) {
    __m512 acc_lo[GEMV_MAX_ROWS], acc_hi[GEMV_MAX_ROWS];
    for (int m = 0; m < M; m++) acc_lo[m] = acc_hi[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < K / block_values(qt); b++) {
        const uint8_t* blk = wrow + b * block_bytes(qt);
#pragma GCC unroll 8
        for (int s = 0; s < block_chunks(qt); s++) {
            const int64_t c = b * block_chunks(qt) + s;
            __m512 lo, hi;
            chunk_vec(qt, blk, s, &lo, &hi);
            for (int m = 0; m < M; m++) {
                const float* xb = x + m * K + c * QK;
                acc_lo[m] = _mm512_fmadd_ps(_mm512_loadu_ps(xb), lo, acc_lo[m]);
                acc_hi[m] = _mm512_fmadd_ps(_mm512_loadu_ps(xb + 16), hi, acc_hi[m]);
            }
        }
    }
    for (int m = 0; m < M; m++) dots[m] = _mm512_reduce_add_ps(_mm512_add_ps(acc_lo[m], acc_hi[m]));
}

// One activation row against GEMV_WEIGHT_ROWS weight rows at once (decode): the activation
// chunk is loaded once for all of them and their chains run side by side.
ALWAYS_INLINE void gemv1_t(const float* x, int64_t K, const uint8_t* w, int64_t rb, int qt,
                           float* dots) {
    __m512 acc_lo[GEMV_WEIGHT_ROWS], acc_hi[GEMV_WEIGHT_ROWS];
    for (int r = 0; r < GEMV_WEIGHT_ROWS; r++) acc_lo[r] = acc_hi[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < K / block_values(qt); b++) {
#pragma GCC unroll 8
        for (int s = 0; s < block_chunks(qt); s++) {
            const int64_t c = b * block_chunks(qt) + s;
            const __m512 xlo = _mm512_loadu_ps(x + c * QK), xhi = _mm512_loadu_ps(x + c * QK + 16);
            for (int r = 0; r < GEMV_WEIGHT_ROWS; r++) {
                __m512 lo, hi;
                chunk_vec(qt, w + r * rb + b * block_bytes(qt), s, &lo, &hi);
                acc_lo[r] = _mm512_fmadd_ps(xlo, lo, acc_lo[r]);
                acc_hi[r] = _mm512_fmadd_ps(xhi, hi, acc_hi[r]);
            }
        }
    }
    for (int r = 0; r < GEMV_WEIGHT_ROWS; r++)
        dots[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc_lo[r], acc_hi[r]));
}

ALWAYS_INLINE void dequant_row_t(int qt, const uint8_t* src, int64_t K, float* dst) {
    for (int64_t b = 0; b < K / block_values(qt); b++) {
        const uint8_t* blk = src + b * block_bytes(qt);
#pragma GCC unroll 8
        for (int s = 0; s < block_chunks(qt); s++) {
            const int64_t c = b * block_chunks(qt) + s;
            __m512 lo, hi;
            chunk_vec(qt, blk, s, &lo, &hi);
            _mm512_storeu_ps(dst + c * QK, lo);
            _mm512_storeu_ps(dst + c * QK + 16, hi);
        }
    }
}
#elif defined(__AVX2__)
// One chunk as four 8-lane vectors (values 0..7, 8..15, 16..23, 24..31).
ALWAYS_INLINE void chunk_vec(int qt, const uint8_t* blk, int s, __m256 v[4]) {
    const __m256i nib = _mm256_set1_epi32(0x0F);
    if (qt == QT_Q8_0) {
        const __m256 d = _mm256_set1_ps(fp16(blk));
        for (int i = 0; i < 4; i++) {
            const __m128i q = _mm_loadl_epi64((const __m128i*)(blk + 2 + 8 * i));
            v[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
        }
    } else if (qt == QT_Q4_0 || qt == QT_Q4_1) {
        const int offset = qt == QT_Q4_1 ? 4 : 2;
        const float d = fp16(blk);
        const float m = qt == QT_Q4_1 ? fp16(blk + 2) : -8.0f * d;
        const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
        for (int i = 0; i < 2; i++) {
            const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(blk + offset + 8 * i)));
            v[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q, nib)), vd, vm);
            v[i + 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4)), vd, vm);
        }
    } else if (qt == QT_Q5_0 || qt == QT_Q5_1) {
        const int off = qt == QT_Q5_1 ? 4 : 2;
        uint32_t qh;
        memcpy(&qh, blk + off, 4);
        const __m256i qhv = _mm256_set1_epi32((int)qh);
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i one = _mm256_set1_epi32(1), bit4 = _mm256_set1_epi32(16);
        const __m256 d = _mm256_set1_ps(fp16(blk));
        const __m256 m = _mm256_set1_ps(qt == QT_Q5_1 ? fp16(blk + 2) : 0.0f);
        const uint8_t* qs = blk + off + 4;
        for (int i = 0; i < 4; i++) {  // values 8i .. 8i + 7: nibbles of bytes 8(i % 2) ..
            const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(qs + 8 * (i & 1))));
            const __m256i low = i < 2 ? _mm256_and_si256(q, nib) : _mm256_srli_epi32(q, 4);
            const __m256i shift = _mm256_add_epi32(lane, _mm256_set1_epi32(8 * i));
            const __m256i high = _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(qhv, shift), one), 4);
            const __m256i val = _mm256_or_si256(low, high);
            if (qt == QT_Q5_0)
                v[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(val, bit4)), d);
            else
                v[i] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(val), d), m);
        }
    } else if (qt == QT_Q4_K) {
        int sc, mn;
        scale_min_k4(s, blk + 4, &sc, &mn);
        const __m256 d = _mm256_set1_ps(fp16(blk) * (float)sc);
        const __m256 m = _mm256_set1_ps(fp16(blk + 2) * (float)mn);
        const uint8_t* qs = blk + 16 + 32 * (s >> 1);
        for (int i = 0; i < 4; i++) {
            __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(qs + 8 * i)));
            q = (s & 1) ? _mm256_srli_epi32(q, 4) : _mm256_and_si256(q, nib);
            v[i] = _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), d), m);
        }
    } else {  // Q6_K
        const Q6Chunk k = q6_chunk(blk, s);
        const __m128i lsh = _mm_cvtsi32_si128(k.ql_shift), hsh = _mm_cvtsi32_si128(k.qh_shift);
        for (int i = 0; i < 4; i++) {
            const __m256i l = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(k.ql + 8 * i)));
            const __m256i h = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(k.qh + 8 * i)));
            const __m256i q = _mm256_or_si256(
                _mm256_and_si256(_mm256_srl_epi32(l, lsh), nib),
                _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(h, hsh), _mm256_set1_epi32(3)), 4));
            const __m256 d = _mm256_set1_ps(k.d * (float)k.scales[i >> 1]);
            v[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(32))), d);
        }
    }
}

static inline float hsum256(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// Two chains per dot product (even and odd 8-value quarters of each chunk), summed at the end,
// in the same order in both kernels below (results independent of the rows run together).
ALWAYS_INLINE void gemv_rows_t(const float* x, int64_t M, int64_t K, const uint8_t* wrow, int qt,
                               float* dots) {
    __m256 acc_a[GEMV_MAX_ROWS], acc_b[GEMV_MAX_ROWS];
    for (int m = 0; m < M; m++) acc_a[m] = acc_b[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < K / block_values(qt); b++) {
        const uint8_t* blk = wrow + b * block_bytes(qt);
#pragma GCC unroll 8
        for (int s = 0; s < block_chunks(qt); s++) {
            const int64_t c = b * block_chunks(qt) + s;
            __m256 v[4];
            chunk_vec(qt, blk, s, v);
            for (int m = 0; m < M; m++) {
                const float* xb = x + m * K + c * QK;
                acc_a[m] = _mm256_fmadd_ps(_mm256_loadu_ps(xb), v[0], acc_a[m]);
                acc_b[m] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8), v[1], acc_b[m]);
                acc_a[m] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 16), v[2], acc_a[m]);
                acc_b[m] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 24), v[3], acc_b[m]);
            }
        }
    }
    for (int m = 0; m < M; m++) dots[m] = hsum256(_mm256_add_ps(acc_a[m], acc_b[m]));
}

// One activation row against GEMV_WEIGHT_ROWS weight rows at once (decode).
ALWAYS_INLINE void gemv1_t(const float* x, int64_t K, const uint8_t* w, int64_t rb, int qt,
                           float* dots) {
    __m256 acc_a[GEMV_WEIGHT_ROWS], acc_b[GEMV_WEIGHT_ROWS];
    for (int r = 0; r < GEMV_WEIGHT_ROWS; r++) acc_a[r] = acc_b[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < K / block_values(qt); b++) {
#pragma GCC unroll 8
        for (int s = 0; s < block_chunks(qt); s++) {
            const float* xb = x + (b * block_chunks(qt) + s) * QK;
            for (int r = 0; r < GEMV_WEIGHT_ROWS; r++) {
                __m256 v[4];
                chunk_vec(qt, w + r * rb + b * block_bytes(qt), s, v);
                acc_a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xb), v[0], acc_a[r]);
                acc_b[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8), v[1], acc_b[r]);
                acc_a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 16), v[2], acc_a[r]);
                acc_b[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 24), v[3], acc_b[r]);
            }
        }
    }
    for (int r = 0; r < GEMV_WEIGHT_ROWS; r++) dots[r] = hsum256(_mm256_add_ps(acc_a[r], acc_b[r]));
}

ALWAYS_INLINE void dequant_row_t(int qt, const uint8_t* src, int64_t K, float* dst) {
    for (int64_t b = 0; b < K / block_values(qt); b++) {
        const uint8_t* blk = src + b * block_bytes(qt);
#pragma GCC unroll 8
        for (int s = 0; s < block_chunks(qt); s++) {
            const int64_t c = b * block_chunks(qt) + s;
            __m256 v[4];
            chunk_vec(qt, blk, s, v);
            for (int i = 0; i < 4; i++) _mm256_storeu_ps(dst + c * QK + 8 * i, v[i]);
        }
    }
}
#else
ALWAYS_INLINE void gemv_rows_t(const float* x, int64_t M, int64_t K, const uint8_t* wrow, int qt,
                               float* dots) {
    float row[QK];
    for (int m = 0; m < M; m++) dots[m] = 0.0f;
    for (int64_t b = 0; b < K / block_values(qt); b++) {
        const uint8_t* blk = wrow + b * block_bytes(qt);
#pragma GCC unroll 8
        for (int s = 0; s < block_chunks(qt); s++) {
            const int64_t c = b * block_chunks(qt) + s;
            dequant_chunk_c(qt, blk, s, row);
            for (int m = 0; m < M; m++)
                for (int j = 0; j < QK; j++) dots[m] += x[m * K + c * QK + j] * row[j];
        }
    }
}

ALWAYS_INLINE void dequant_row_t(int qt, const uint8_t* src, int64_t K, float* dst) {
    for (int64_t b = 0; b < K / block_values(qt); b++) {
        const uint8_t* blk = src + b * block_bytes(qt);
#pragma GCC unroll 8
        for (int s = 0; s < block_chunks(qt); s++) {
            const int64_t c = b * block_chunks(qt) + s;
            dequant_chunk_c(qt, blk, s, dst + c * QK);
        }
    }
}

ALWAYS_INLINE void gemv1_t(const float* x, int64_t K, const uint8_t* w, int64_t rb, int qt,
                           float* dots) {
    for (int r = 0; r < GEMV_WEIGHT_ROWS; r++) gemv_rows_t(x, 1, K, w + r * rb, qt, dots + r);
}
#endif

// The per-format bodies (qt a constant in each case, so the format branches fold away).
#define FOR_EACH_FORMAT(qt, CALL)           \
    switch (qt) {                           \
        case QT_Q4_0: CALL(QT_Q4_0); break; \
        case QT_Q4_1: CALL(QT_Q4_1); break; \
        case QT_Q5_0: CALL(QT_Q5_0); break; \
        case QT_Q5_1: CALL(QT_Q5_1); break; \
        case QT_Q8_0: CALL(QT_Q8_0); break; \
        case QT_Q4_K: CALL(QT_Q4_K); break; \
        case QT_Q6_K: CALL(QT_Q6_K); break; \
        default: break;                     \
    }

static void gemv_rows(const float* x, int64_t M, int64_t K, const uint8_t* wrow, int qt,
                      float* dots) {
    for (int m = 0; m < M; m++) dots[m] = 0.0f;
#define GEMV(T) gemv_rows_t(x, M, K, wrow, T, dots)
    FOR_EACH_FORMAT(qt, GEMV)
#undef GEMV
}

static void gemv1(const float* x, int64_t K, const uint8_t* w, int64_t rb, int qt, float* dots) {
#define GEMV1(T) gemv1_t(x, K, w, rb, T, dots)
    FOR_EACH_FORMAT(qt, GEMV1)
#undef GEMV1
}

static void dequant_row(int qt, const uint8_t* src, int64_t K, float* dst) {
#define DEQUANT(T) dequant_row_t(T, src, K, dst)
    FOR_EACH_FORMAT(qt, DEQUANT)
#undef DEQUANT
}

static void qgemv(const float* x, int64_t M, int64_t K, const uint8_t* w, int qt, int64_t N,
                  const float* bias, float* y, int accumulate, int nthreads) {
    const int64_t rb = row_bytes(qt, K);
    if (M == 1 && N % GEMV_WEIGHT_ROWS == 0 && qt != QT_Q8_0) {  // Q8_0: measured slower
#pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int64_t n = 0; n < N; n += GEMV_WEIGHT_ROWS) {
            float dots[GEMV_WEIGHT_ROWS];
            gemv1(x, K, w + n * rb, rb, qt, dots);
            for (int r = 0; r < GEMV_WEIGHT_ROWS; r++) {
                const float v = dots[r] + (bias ? bias[n + r] : 0.0f);
                y[n + r] = accumulate ? y[n + r] + v : v;
            }
        }
        return;
    }
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        float dots[GEMV_MAX_ROWS];
        gemv_rows(x, M, K, w + n * rb, qt, dots);
        for (int64_t m = 0; m < M; m++) {
            const float v = dots[m] + (bias ? bias[n] : 0.0f);
            y[m * N + n] = accumulate ? y[m * N + n] + v : v;
        }
    }
}

// y = x W^T: K a multiple of the format's block values (tm_block_values).
void tm_qlinear(const float* x, int64_t M, int64_t K, const uint8_t* w, int qt, int64_t N,
                const float* bias, float* y, int accumulate, int nthreads) {
    for (int64_t m = 0; m < M; m += GEMV_MAX_ROWS) {
        const int64_t rows = M - m < GEMV_MAX_ROWS ? M - m : GEMV_MAX_ROWS;
        qgemv(x + m * K, rows, K, w, qt, N, bias, y + m * N, accumulate, nthreads);
    }
}

// The whole matrix in fp32 (for large batches, which then run a BLAS GEMM).
void tm_dequant_matrix(const uint8_t* w, int qt, int64_t N, int64_t K, float* out, int nthreads) {
    const int64_t rb = row_bytes(qt, K);
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t n = 0; n < N; n++) dequant_row(qt, w + n * rb, K, out + n * K);
}

// The whole matrix transposed, out[k * N + n] = W[n, k]: the [in, out] layout of the float
// GEMM's weight, written without a separate transpose pass. Tiles of DQ_T_ROWS weight rows
// are dequantized into a buffer and stored a cache line per k.
#define DQ_T_ROWS 16
void tm_dequant_matrix_t(const uint8_t* w, int qt, int64_t N, int64_t K, float* out,
                         int nthreads) {
    const int64_t rb = row_bytes(qt, K);
#pragma omp parallel num_threads(nthreads)
    {
        float* tile = (float*)malloc(sizeof(float) * DQ_T_ROWS * K);
#pragma omp for schedule(static)
        for (int64_t n0 = 0; n0 < N; n0 += DQ_T_ROWS) {
            const int64_t rows = N - n0 < DQ_T_ROWS ? N - n0 : DQ_T_ROWS;
            for (int64_t r = 0; r < rows; r++) dequant_row(qt, w + (n0 + r) * rb, K, tile + r * K);
            for (int64_t k = 0; k < K; k++) {
                float* dst = out + k * N + n0;
                for (int64_t r = 0; r < rows; r++) dst[r] = tile[r * K + k];
            }
        }
        free(tile);
    }
}

// Selected rows (an embedding lookup on a packed table).
void tm_dequant_rows(const uint8_t* w, int qt, int64_t K, const int64_t* ids, int64_t M, float* out,
                     int nthreads) {
    const int64_t rb = row_bytes(qt, K);
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t m = 0; m < M; m++) dequant_row(qt, w + ids[m] * rb, K, out + m * K);
}
