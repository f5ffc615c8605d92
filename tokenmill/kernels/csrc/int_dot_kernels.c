// Decode GEMV on Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K weights as integer dot products (VNNI), with the
// activation row rounded to 24-bit integers per 32-value block (or 16 / 8 bits: `bits`).
//
// The fp32 GEMV (quant_kernels.c) spends ~9 vector instructions per 32 weights on unpacking,
// converting and multiplying; integer dot products (AVX-512 VNNI vpdpbusd: 64 u8 x s8
// products per instruction) need a few. The activations must then be integers: each 32-value
// block of a row is scaled by s = amax / 8355711 and rounded to x_int (error <= 6e-8 of the
// block's largest value, the order of fp32 rounding; llama.cpp rounds to 8 bits here), whose
// three balanced base-256 digits (int8 each) are three byte planes. Per block and plane the
// products sum exactly in int32, so the only roundings besides the activation's are a few
// fp32 operations per block: y = sum_b d_b * (s_b * S_b) (+ m_b * s_b * sum x_int).
//
// Weights are repacked once (tm_int_dot_repack) into groups of 16 rows: each 32-value block
// of the 16 rows is stored as dwords interleaved across the rows (lane r of a 64-byte vector
// holds 4 bytes of row r), then the 16 fp16 scales (and minimums). One vector then feeds 16
// rows' dot products. Q8_0 values are stored offset by 128 (u8), corrected per block.
// Every implementation (AVX-512 VNNI, AVX2, plain C) runs the same per-row sequence of fp32
// operations, so all give bit-identical results, independent of how many rows run together.
// Many rows (prefill, batched steps) run the GEMM of int_dot_gemm.c on the same layout
// (int_dot.h). At 16 and 8 bits (int_dot.h's Precision) the GEMV rounds the activations as
// the GEMM does and runs its leading planes only; the planes left out are zero, so a row's
// result is the GEMM's at the same bits, bit for bit, in every build.
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "int_dot.h"

static inline int supported(int qt) {
    return qt == QT_Q4_0 || qt == QT_Q4_1 || qt == QT_Q8_0 || qt == QT_Q4_K || qt == QT_Q6_K;
}

// Which implementation this build runs: 3 AVX-512 VNNI with the GEMM's tiles on AMX, 2
// AVX-512 VNNI, 1 AVX2 (VNNI emulated), 0 plain C.
int tm_int_dot_kind(void) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    return int_dot_amx_ready() ? 3 : 2;
#elif defined(__AVX2__)
    return 1;
#else
    return 0;
#endif
}

int tm_int_dot_supported(int qt, int64_t N, int64_t K) {
    const int k_quant = qt == QT_Q4_K || qt == QT_Q6_K;
    return supported(qt) && N % GROUP == 0 && K % (k_quant ? 256 : QK) == 0;
}

// Bytes of tm_int_dot_repack's output: the source's, but K-quants' (Q4_K: a byte for each
// sub-block's scale and minimum; Q6_K: a byte a value).
int64_t tm_int_dot_repacked_bytes(int qt, int64_t N, int64_t K) {
    return N / GROUP * group_bytes(qt, K / QK);
}

// ggml's get_scale_min_k4: sub-block j's 6-bit scale and minimum in a Q4_K super-block.
static void q4_k_scale_min(int j, const uint8_t* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63, *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Q4_K super-blocks (d, dmin, 12 scale bytes, 128 quant bytes: sub-block j's values are the
// low (j even) or high nibbles of bytes 32 (j / 2) ..) as Q4_1-like group-blocks: each
// sub-block's 32 nibbles in Q4_1's order (byte i: values i and i + 16), then the 16 rows'
// sc, then their m; after a group's blocks, per super-block the rows' fp16 d, then dmin.
static void repack_q4_k(const uint8_t* w, int64_t N, int64_t K, uint8_t* out) {
    const int64_t nb = K / QK, gbb = group_block_bytes(QT_Q4_K), supers = K / 256;
    const int qs = group_qs_bytes(QT_Q4_K);
    for (int64_t g = 0; g < N / GROUP; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t* gw = out + g * group_bytes(QT_Q4_K, nb);
            uint8_t* o = gw + b * gbb;
            uint8_t* s = (uint8_t*)super_scales(QT_Q4_K, gw, nb, b);
            for (int r = 0; r < GROUP; r++) {
                const uint8_t* sup = w + ((g * GROUP + r) * supers + b / 8) * 144;
                const int j = (int)(b % 8);
                int sc, m;
                q4_k_scale_min(j, sup + 4, &sc, &m);
                const uint8_t* q = sup + 16 + 32 * (j / 2);
                uint8_t v[QK];
                for (int l = 0; l < QK; l++) v[l] = j % 2 ? q[l] >> 4 : q[l] & 0x0F;
                for (int i = 0; i < QK / 2; i++)  // dword i / 4, byte i % 4 of row r
                    o[((i / 4) * GROUP + r) * 4 + i % 4] = (uint8_t)(v[i] | (v[i + 16] << 4));
                o[qs + r] = (uint8_t)sc, o[qs + GROUP + r] = (uint8_t)m;
                memcpy(s + 2 * r, sup, 2);                  // d
                memcpy(s + 2 * GROUP + 2 * r, sup + 2, 2);  // dmin
            }
        }
}

// w: N rows of K / 32 ggml blocks; out: N / 16 groups of K / 32 group-blocks.
// Q6_K super-blocks (ql[128] low 4 bits, qh[64] high 2 bits, 16 int8 scales, d; in each
// 128-value half n: value 32 k + l of it reads ql[64 n + l + 32 (k % 2)]'s low (k < 2) or high
// nibble and qh[32 n + l]'s bits 2k, 2k + 1, with scale sc[8 n + l / 16 + 2 k]) as group-blocks:
// the values q (0..63): their low 4 bits as Q4_1's nibbles (byte i of a row: values i and
// i + 16), then two 64-byte vectors of their high 2 bits (value 4 j + t of row r at bits
// 2 (j % 4) of byte t of row r's dword in vector j / 4), then the 16 rows' sc of the first 16
// values, then of the last 16; after a group's blocks, per super-block the rows' fp16 d.
static void repack_q6_k(const uint8_t* w, int64_t N, int64_t K, uint8_t* out) {
    const int64_t nb = K / QK, gbb = group_block_bytes(QT_Q6_K), supers = K / 256;
    const int qs = group_qs_bytes(QT_Q6_K);
    for (int64_t g = 0; g < N / GROUP; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t* gw = out + g * group_bytes(QT_Q6_K, nb);
            uint8_t* o = gw + b * gbb;
            uint8_t* s = (uint8_t*)super_scales(QT_Q6_K, gw, nb, b);
            for (int r = 0; r < GROUP; r++) {
                const uint8_t* sup = w + ((g * GROUP + r) * supers + b / 8) * 210;
                const int n = (int)(b % 8) / 4, k = (int)(b % 4);
                const uint8_t *ql = sup + 64 * n + 32 * (k % 2), *qh = sup + 128 + 32 * n;
                uint8_t v[QK];
                for (int l = 0; l < QK; l++)
                    v[l] = (uint8_t)((k < 2 ? ql[l] & 0x0F : ql[l] >> 4) | (((qh[l] >> (2 * k)) & 3) << 4));
                for (int i = 0; i < QK / 2; i++)  // the low nibbles, as repack_q4_k's
                    o[((i / 4) * GROUP + r) * 4 + i % 4] = (uint8_t)((v[i] & 0x0F) | ((v[i + 16] & 0x0F) << 4));
                for (int t = 0; t < 4; t++)
                    for (int a = 0; a < 2; a++) {
                        uint8_t bits = 0;
                        for (int f = 0; f < 4; f++) bits |= (uint8_t)((v[4 * (4 * a + f) + t] >> 4) << (2 * f));
                        o[256 + (a * GROUP + r) * 4 + t] = bits;
                    }
                for (int h = 0; h < 2; h++) o[qs + GROUP * h + r] = sup[192 + 8 * n + h + 2 * k];
                memcpy(s + 2 * r, sup + 208, 2);  // d
            }
        }
}

void tm_int_dot_repack(const uint8_t* w, int qt, int64_t N, int64_t K, uint8_t* out) {
    if (qt == QT_Q4_K || qt == QT_Q6_K) {
        (qt == QT_Q4_K ? repack_q4_k : repack_q6_k)(w, N, K, out);
        return;
    }
    const int in_block = (int)(group_block_bytes(qt) / GROUP), head = qt == QT_Q4_1 ? 4 : 2;
    const int qs_bytes = in_block - head, dwords = qs_bytes / 4;
    const int64_t nb = K / QK, gbb = group_block_bytes(qt);
    for (int64_t g = 0; g < N / GROUP; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t* o = out + (g * nb + b) * gbb;
            for (int r = 0; r < GROUP; r++) {
                const uint8_t* blk = w + ((g * GROUP + r) * nb + b) * in_block;
                for (int j = 0; j < dwords; j++)
                    for (int t = 0; t < 4; t++) {
                        uint8_t v = blk[head + 4 * j + t];
                        if (qt == QT_Q8_0) v ^= 0x80;  // int8 -> uint8 (value + 128)
                        o[(j * GROUP + r) * 4 + t] = v;
                    }
                memcpy(o + qs_bytes * GROUP + 2 * r, blk, 2);  // d
                if (qt == QT_Q4_1) memcpy(o + qs_bytes * GROUP + 2 * GROUP + 2 * r, blk + 2, 2);  // m
            }
        }
}

// ---------------------------------------------------------------- activation rows

#if defined(__AVX512F__) && defined(__AVX512BW__)
// One 32-value block of an activation row as three byte planes (hi, mid, lo), its scale, its
// scale * sum and its planes' sums; the vector bodies give the plain C body's results bit for
// bit (max skips NaN as the scalar comparison does, and the block's sums are exact integers).
// AVX-512: 16 lanes at a time.
static void quantize_block(const float* xb, int8_t* hi, int8_t* mid, int8_t* lo, float* scale,
                           float* sum, int32_t* psum, Precision pr, int psums) {
    const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
    // max(a, b) returns b when a is NaN: NaN skipped
    const __m512 zero = _mm512_setzero_ps();
    const float amax = _mm512_reduce_max_ps(
        _mm512_max_ps(_mm512_abs_ps(x0), _mm512_max_ps(_mm512_abs_ps(x1), zero)));
    const __mmask16 bad = _mm512_cmp_ps_mask(_mm512_mul_ps(x0, zero), zero, _CMP_NEQ_UQ) |
                          _mm512_cmp_ps_mask(_mm512_mul_ps(x1, zero), zero, _CMP_NEQ_UQ);
    const float nonfinite = bad ? NAN : 0.0f;
    const float inv = amax > 0.0f && !bad ? pr.xmax / amax : 0.0f;
    *scale = amax / pr.divisor + nonfinite;
    const __m512 vinv = _mm512_set1_ps(inv), top = _mm512_set1_ps(pr.xmax), bottom = _mm512_set1_ps(-pr.xmax);
    const __m128i shift = _mm_cvtsi32_si128(pr.shift);
    __m512i sh = _mm512_setzero_si512(), sm = sh, sl = sh, sv = sh;
    for (int half = 0; half < 2; half++) {
        if (half && psums) {  // the first 16 values' plane sums
            psum[3] = _mm512_reduce_add_epi32(sh);
            psum[4] = _mm512_reduce_add_epi32(sm);
            psum[5] = _mm512_reduce_add_epi32(sl);
        }
        __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(half ? x1 : x0, vinv),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm512_min_ps(_mm512_max_ps(r, bottom), top);  // max(NaN, b) = b: NaN -> -xmax
        const __m512i v = _mm512_sll_epi32(_mm512_cvtps_epi32(r), shift);
        const __m512i l = _mm512_srai_epi32(_mm512_slli_epi32(v, 24), 24);
        const __m512i v1 = _mm512_srai_epi32(_mm512_sub_epi32(v, l), 8);
        const __m512i md = _mm512_srai_epi32(_mm512_slli_epi32(v1, 24), 24);
        const __m512i h = _mm512_srai_epi32(_mm512_sub_epi32(v1, md), 8);
        _mm_storeu_si128((__m128i*)(hi + 16 * half), _mm512_cvtepi32_epi8(h));
        _mm_storeu_si128((__m128i*)(mid + 16 * half), _mm512_cvtepi32_epi8(md));
        _mm_storeu_si128((__m128i*)(lo + 16 * half), _mm512_cvtepi32_epi8(l));
        sh = _mm512_add_epi32(sh, h), sm = _mm512_add_epi32(sm, md), sl = _mm512_add_epi32(sl, l);
        sv = _mm512_add_epi32(sv, v);
    }
    *sum = *scale * (float)_mm512_reduce_add_epi32(sv);  // |total| <= 32 * 8355711 < 2^31
    if (!psums) {
        memset(psum, 0, PSUMS * sizeof(int32_t));
        return;
    }
    psum[0] = _mm512_reduce_add_epi32(sh);
    psum[1] = _mm512_reduce_add_epi32(sm);
    psum[2] = _mm512_reduce_add_epi32(sl);
}

#elif defined(__AVX2__)
static inline int32_t hsum8_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

// 32 int32 lanes in [-127, 127] (four vectors) as 32 bytes, in order.
static inline void store_bytes(int8_t* out, const __m256i v[4]) {
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    _mm256_storeu_si256((__m256i*)out,
                        _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// AVX2: 8 lanes at a time.
static void quantize_block(const float* xb, int8_t* hi, int8_t* mid, int8_t* lo, float* scale,
                           float* sum, int32_t* psum, Precision pr, int psums) {
    const __m256 zero = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
    __m256 x[4], amax8 = zero;
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        x[i] = _mm256_loadu_ps(xb + 8 * i);
        amax8 = _mm256_max_ps(_mm256_andnot_ps(sign, x[i]), amax8);  // NaN skipped
        bad |= _mm256_movemask_ps(_mm256_cmp_ps(_mm256_mul_ps(x[i], zero), zero, _CMP_NEQ_UQ));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    const float nonfinite = bad ? NAN : 0.0f;
    const float inv = amax > 0.0f && !bad ? pr.xmax / amax : 0.0f;
    *scale = amax / pr.divisor + nonfinite;
    const __m256 vinv = _mm256_set1_ps(inv), top = _mm256_set1_ps(pr.xmax), bottom = _mm256_set1_ps(-pr.xmax);
    const __m128i shift = _mm_cvtsi32_si128(pr.shift);
    __m256i h[4], md[4], l[4], sv = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) {
        __m256 r = _mm256_round_ps(_mm256_mul_ps(x[i], vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm256_min_ps(_mm256_max_ps(r, bottom), top);  // max(NaN, b) = b: NaN -> -xmax
        const __m256i v = _mm256_sll_epi32(_mm256_cvtps_epi32(r), shift);
        l[i] = _mm256_srai_epi32(_mm256_slli_epi32(v, 24), 24);
        const __m256i v1 = _mm256_srai_epi32(_mm256_sub_epi32(v, l[i]), 8);
        md[i] = _mm256_srai_epi32(_mm256_slli_epi32(v1, 24), 24);
        h[i] = _mm256_srai_epi32(_mm256_sub_epi32(v1, md[i]), 8);
        sv = _mm256_add_epi32(sv, v);
    }
    store_bytes(hi, h), store_bytes(mid, md), store_bytes(lo, l);
    *sum = *scale * (float)hsum8_epi32(sv);
    if (!psums) {
        memset(psum, 0, PSUMS * sizeof(int32_t));
        return;
    }
    psum[0] = hsum8_epi32(_mm256_add_epi32(_mm256_add_epi32(h[0], h[1]), _mm256_add_epi32(h[2], h[3])));
    psum[1] = hsum8_epi32(_mm256_add_epi32(_mm256_add_epi32(md[0], md[1]), _mm256_add_epi32(md[2], md[3])));
    psum[2] = hsum8_epi32(_mm256_add_epi32(_mm256_add_epi32(l[0], l[1]), _mm256_add_epi32(l[2], l[3])));
    psum[3] = hsum8_epi32(_mm256_add_epi32(h[0], h[1]));  // the first 16 values'
    psum[4] = hsum8_epi32(_mm256_add_epi32(md[0], md[1]));
    psum[5] = hsum8_epi32(_mm256_add_epi32(l[0], l[1]));
}
#else
// Plain C.
static void quantize_block(const float* xb, int8_t* hi, int8_t* mid, int8_t* lo, float* scale,
                           float* sum, int32_t* psum, Precision pr, int psums) {
    float amax = 0.0f, nonfinite = 0.0f;  // NaN when the block holds inf or NaN
    for (int j = 0; j < QK; j++) {  // fmaxf's result (NaN skipped), but inlined
        const float a = fabsf(xb[j]);
        amax = a > amax ? a : amax;
        nonfinite += xb[j] * 0.0f;
    }
    const float inv = amax > 0.0f && nonfinite == 0.0f ? pr.xmax / amax : 0.0f;
    const float s = amax / pr.divisor + nonfinite;  // a NaN scale: NaN out, as fp32 would
    int64_t total = 0;
    int32_t sums[PSUMS] = {0};
    for (int j = 0; j < QK; j++) {
        if (j == QK / 2) memcpy(sums + 3, sums, 3 * sizeof(int32_t));  // the first 16 values'

        // fminf(fmaxf(r, -xmax), xmax) (NaN -> -xmax), inlined
        float r = rintf(xb[j] * inv);
        r = r >= -pr.xmax ? r : -pr.xmax;
        r = r <= pr.xmax ? r : pr.xmax;
        const int32_t v = (int32_t)r * (1 << pr.shift);
        // balanced base-256 digits: v = 65536 hi + 256 mid + lo, each in [-127, 127]
        const int32_t l = (int8_t)(uint8_t)(v & 0xFF), v1 = (v - l) / 256;
        const int32_t md = (int8_t)(uint8_t)(v1 & 0xFF), h = (v1 - md) / 256;
        hi[j] = (int8_t)h;
        mid[j] = (int8_t)md;
        lo[j] = (int8_t)l;
        sums[0] += h;
        sums[1] += md;
        sums[2] += l;
        total += v;
    }
    *scale = s;
    *sum = s * (float)total;
    if (!psums) memset(sums, 0, sizeof sums);
    memcpy(psum, sums, sizeof sums);
}
#endif

void int_dot_quantize_rows(const float* x, int64_t M, int64_t K, IntRows* q, Precision pr,
                           int psums, int nthreads) {
    const int64_t nb = K / QK;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M > 1)
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++) {
            int8_t* hi = q->planes + 3 * m * K + b * QK;
            quantize_block(x + m * K + b * QK, hi, hi + K, hi + 2 * K, q->scale + m * nb + b,
                           q->sum + m * nb + b, q->psum + PSUMS * (m * nb + b), pr, psums);
        }
}

IntRows int_dot_alloc_rows(int64_t M, int64_t K, void** buffer) {
    const int64_t nb = K / QK;
    char* p = malloc((size_t)(3 * M * K + sizeof(float) * (2 + PSUMS) * M * nb));
    *buffer = p;
    IntRows q = {(int8_t*)p, (float*)(p + 3 * M * K), (float*)(p + 3 * M * K) + M * nb,
                 (int32_t*)((float*)(p + 3 * M * K) + 2 * M * nb)};
    return q;
}

// One block's contribution to a row's accumulator from its exact integer dot products by
// byte plane, with the same fp32 operations in every implementation:
//   f = fma(S_hi, 65536, 256 S_mid + S_lo)  (planes of Q8_0 corrected by -128 * plane sum)
//   Q4_1: acc = fma(m, sum, fma(f * s, d, acc)); Q4_0: acc = fma(fma(f, s, -8 sum), d, acc);
//   Q8_0: acc = fma(f * s, d, acc); Q6_K: that for the first 16 values (S corrected by
//   -32 * their plane sums, their d), then for the last 16.
static inline float block_term_c(int qt, const int32_t S[3], float s, float sum, float d,
                                 float mn, float acc) {
    const float f = fmaf((float)S[0], 65536.0f, (float)(256 * S[1] + S[2]));
    if (qt == QT_Q4_0) return fmaf(fmaf(f, s, -8.0f * sum), d, acc);
    acc = fmaf(f * s, d, acc);
    return has_min(qt) ? fmaf(mn, sum, acc) : acc;
}

// ---------------------------------------------------------------- plain C

// The stored value of weight 4 j + t of row r in a group-block, as the byte planes multiply
// it: Q8_0's byte (offset by 128), else a nibble (dword j % 4: low nibbles for j < 4, high
// ones for j >= 4).
static inline int stored_weight(int qt, const uint8_t* blk, int r, int j, int t) {
    if (qt == QT_Q8_0) return blk[(j * GROUP + r) * 4 + t];
    const uint8_t byte = blk[((j & 3) * GROUP + r) * 4 + t];
    const int low = j < 4 ? byte & 0x0F : byte >> 4;
    if (qt != QT_Q6_K) return low;
    return low | ((blk[256 + ((j / 4) * GROUP + r) * 4 + t] >> (2 * (j % 4))) & 3) << 4;
}

void int_dot_group_c_planes(int qt, int planes, const uint8_t* gw, int64_t nb, const IntRows* q,
                            int64_t M, int64_t K, float out[][GROUP]) {
    const int64_t gbb = group_block_bytes(qt);
    for (int64_t m = 0; m < M; m++)
        for (int r = 0; r < GROUP; r++) out[m][r] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = gw + b * gbb, *sup = super_scales(qt, gw, nb, b);
        for (int64_t m = 0; m < M; m++)
            for (int r = 0; r < GROUP; r++) {
                int32_t S[2][3] = {{0, 0, 0}, {0, 0, 0}};  // Q6_K: the two halves apart
                const int32_t* psum = q->psum + PSUMS * (m * nb + b);
                for (int j = 0; j < 8; j++)
                    for (int t = 0; t < 4; t++) {
                        const int w = stored_weight(qt, blk, r, j, t);
                        int32_t* Sh = S[qt == QT_Q6_K && j >= 4];
                        for (int p = 0; p < planes; p++) Sh[p] += w * plane(q, m, p, K)[b * QK + 4 * j + t];
                    }
                const float s = q->scale[m * nb + b];
                if (qt == QT_Q6_K) {
                    for (int p = 0; p < planes; p++) {
                        S[0][p] -= 32 * psum[3 + p];
                        S[1][p] -= 32 * (psum[p] - psum[3 + p]);
                    }
                    float acc = block_term_c(qt, S[0], s, 0.0f, block_scale(qt, blk, sup, r), 0.0f,
                                             out[m][r]);
                    out[m][r] = block_term_c(qt, S[1], s, 0.0f, block_scale_high(blk, sup, r), 0.0f,
                                             acc);
                    continue;
                }
                if (qt == QT_Q8_0)
                    for (int p = 0; p < planes; p++) S[0][p] -= 128 * psum[p];
                const float d = block_scale(qt, blk, sup, r), mn = block_min(qt, blk, sup, r);
                out[m][r] = block_term_c(qt, S[0], s, q->sum[m * nb + b], d, mn, out[m][r]);
            }
    }
}

void int_dot_group_c(int qt, const uint8_t* gw, int64_t nb, const IntRows* q, int64_t M, int64_t K,
                    float out[][GROUP]) {
    int_dot_group_c_planes(qt, 3, gw, nb, q, M, K, out);
}



// Rows 8 at a time (decode steps have at most 8): quantize them, then every group of 16
// weight rows with `group`; y[m, n] = x[m] . W[n] (+ bias[n]) (+ y[m, n] when accumulating).
static void int_dot_rows(GroupFn group, const float* x, int64_t M, int64_t K, const uint8_t* w,
                         int qt, int64_t N, const float* bias, float* y, int accumulate,
                         int bits, int nthreads) {
    const int64_t nb = K / QK;
    for (int64_t m0 = 0; m0 < M; m0 += MAX_ROWS) {
        const int64_t rows = M - m0 < MAX_ROWS ? M - m0 : MAX_ROWS;
        void* buffer;
        IntRows q = int_dot_alloc_rows(rows, K, &buffer);
        int_dot_quantize_rows(x + m0 * K, rows, K, &q, precision_of(bits), needs_psums(qt), 1);
        float* yb = y + m0 * N;
#pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int64_t g = 0; g < N / GROUP; g++) {
            float out[MAX_ROWS][GROUP];
            group(qt, w + g * group_bytes(qt, nb), nb, &q, rows, K, out);
            for (int64_t m = 0; m < rows; m++)
                for (int r = 0; r < GROUP; r++) {
                    const int64_t n = g * GROUP + r;
                    const float v = out[m][r] + (bias ? bias[n] : 0.0f);
                    yb[m * N + n] = accumulate ? yb[m * N + n] + v : v;
                }
        }
        free(buffer);
    }
}

// y = x W^T (+ bias) (+ y when accumulating); w repacked by tm_int_dot_repack; bits: the
// activations' precision, 24, 16 or 8 (anything else: 24).
void tm_int_dot_linear(const float* x, int64_t M, int64_t K, const uint8_t* w, int qt, int64_t N,
                       const float* bias, float* y, int accumulate, int bits, int nthreads) {
    int_dot_rows(int_dot_group_planes(planes_of(bits)), x, M, K, w, qt, N, bias, y, accumulate,
                 bits, nthreads);
}

// The plain C implementation whatever the build, all three planes at every precision (tests
// compare the fast one against it).
void tm_int_dot_linear_reference(const float* x, int64_t M, int64_t K, const uint8_t* w, int qt,
                                 int64_t N, float* y, int bits) {
    int_dot_rows(int_dot_group_c, x, M, K, w, qt, N, NULL, y, 0, bits, 1);
}

// ---------------------------------------------------------------- greedy readout

// The bounds tm_int_dot_argmax needs, from the repacked weights, per 16-row group g: out[g nb +
// b] = the largest over its rows of |d| * sum |q| of block b (q the raw values the byte planes
// multiply: nibbles 0..15, Q8_0's int8), which times 32639 s_b bounds what the middle and low
// planes add to that block's dot product; out[N / 16 * nb + g] = the largest over its rows of
// the sum over blocks of that plus 32 |m| (Q4_1's minimums), which times the activation's
// amax bounds every partial sum (so the fp32 rounding). (N / 16) (nb + 1) floats.
void tm_int_dot_bound_table(const uint8_t* w, int qt, int64_t N, int64_t K, float* out) {
    const int64_t nb = K / QK, gbb = group_block_bytes(qt), groups = N / GROUP;
    for (int64_t g = 0; g < groups; g++) {
        float totals[GROUP] = {0.0f};
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t* gw = w + g * group_bytes(qt, nb);
            const uint8_t *blk = gw + b * gbb, *sup = super_scales(qt, gw, nb, b);
            float largest = 0.0f;
            for (int r = 0; r < GROUP; r++) {
                int32_t sum[2] = {0, 0};  // Q6_K: its halves apart
                for (int j = 0; j < 8; j++)
                    for (int t = 0; t < 4; t++) {
                        const int v = stored_weight(qt, blk, r, j, t);
                        sum[qt == QT_Q6_K && j >= 4] +=
                            qt == QT_Q8_0 ? abs(v - 128) : qt == QT_Q6_K ? abs(v - 32) : v;
                    }
                float a = fabsf(block_scale(qt, blk, sup, r)) * (float)sum[0];
                if (qt == QT_Q6_K) a += fabsf(block_scale_high(blk, sup, r)) * (float)sum[1];
                largest = fmaxf(largest, a);
                totals[r] += a;
                if (has_min(qt)) totals[r] += 32.0f * fabsf(block_min(qt, blk, sup, r));
            }
            out[g * nb + b] = largest;
        }
        float largest = 0.0f;
        for (int r = 0; r < GROUP; r++) largest = fmaxf(largest, totals[r]);
        out[groups * nb + g] = largest;
    }
}

// Per activation row, the index of the largest of y = x W^T as tm_int_dot_linear computes it
// at the same bits (bit for bit; the first index on ties), without computing all of y. The
// high byte plane alone estimates every output: the middle and low planes add
// |256 mid + lo| <= 32639 per value times the block scale s_b (at every precision), so an output of group g differs from its estimate by
// at most 32639 sum_b s_b a[g, b] (a: tm_int_dot_bound_table) plus the fp32 rounding of both
// sums (at most 6 per block, each <= 2^-24 of a partial sum, which is <= amax * total[g]).
// Only the groups whose largest estimate could still reach the largest lower bound are
// computed exactly (a few of the lm_head's 3,072). out[m] = -1 where the estimates are not
// all finite (the caller computes that row in full). Rows run in blocks of ARGMAX_ROWS
// quantized together; a thread estimates each of its groups for the whole block, MAX_ROWS
// rows at a time, so the weights stream from memory once a block.
#define ARGMAX_ROWS 64
void tm_int_dot_argmax(const float* x, int64_t M, int64_t K, const uint8_t* w, int qt, int64_t N,
                       const float* bounds, int64_t* out, int bits, int nthreads) {
    const int64_t nb = K / QK, groups = N / GROUP;
    const GroupFn exact_group = int_dot_group_planes(planes_of(bits));
    // X_INT_MAX * s_b >= the block's amax at every precision (their divisors are smaller)
    const float rounding = (float)(12 * nb + 8) * 0x1p-24f * X_INT_MAX;
    const float* total = bounds + groups * nb;
    // per row and group: the largest lower and upper bound of its 16 outputs, and whether
    // its estimates were all finite; per block and row 32639 s_b (rows side by side)
    float* lo = malloc(sizeof(float) * (size_t)(2 * ARGMAX_ROWS * groups + nb * ARGMAX_ROWS));
    float* hi = lo + ARGMAX_ROWS * groups;
    float* spread = hi + ARGMAX_ROWS * groups;
    int8_t* finite = malloc((size_t)(ARGMAX_ROWS * groups));
    for (int64_t b0 = 0; b0 < M; b0 += ARGMAX_ROWS) {
        const int64_t rows = M - b0 < ARGMAX_ROWS ? M - b0 : ARGMAX_ROWS;
        void* buffer;
        IntRows q = int_dot_alloc_rows(rows, K, &buffer);
        int_dot_quantize_rows(x + b0 * K, rows, K, &q, precision_of(bits), needs_psums(qt),
                              nthreads);
        float smax[ARGMAX_ROWS];
        for (int64_t m = 0; m < rows; m++) {
            smax[m] = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const float s = q.scale[m * nb + b];
                smax[m] = s > smax[m] ? s : smax[m];
                spread[b * ARGMAX_ROWS + m] = 32639.0f * s;
            }
        }
#pragma omp parallel num_threads(nthreads)
        {
#pragma omp for schedule(static)
            for (int64_t g = 0; g < groups; g++)
                for (int64_t m0 = 0; m0 < rows; m0 += MAX_ROWS) {
                    const int64_t tile = rows - m0 < MAX_ROWS ? rows - m0 : MAX_ROWS;
                    const IntRows tq = {q.planes + 3 * m0 * K, q.scale + m0 * nb, q.sum + m0 * nb,
                                        q.psum + PSUMS * m0 * nb};
                    float part[MAX_ROWS][GROUP], t[MAX_ROWS];
                    int_dot_group_fast_high(qt, w + g * group_bytes(qt, nb), nb, &tq, tile, K, part);
                    for (int64_t i = 0; i < tile; i++) t[i] = rounding * smax[m0 + i] * total[g];
                    for (int64_t b = 0; b < nb; b++)  // each row's sum over b in order
                        for (int64_t i = 0; i < tile; i++)
                            t[i] += spread[b * ARGMAX_ROWS + m0 + i] * bounds[g * nb + b];
                    for (int64_t i = 0; i < tile; i++) {
                        const int64_t m = m0 + i;
                        // zero: NaN unless every estimate is finite (then e is unused)
                        float e = part[i][0], zero = t[i] - t[i];
                        for (int r = 0; r < GROUP; r++) {
                            e = part[i][r] > e ? part[i][r] : e;
                            zero += part[i][r] - part[i][r];
                        }
                        lo[m * groups + g] = e - t[i];
                        hi[m * groups + g] = e + t[i];
                        finite[m * groups + g] = zero == 0.0f;
                    }
                }
#pragma omp for schedule(dynamic, 1)
            for (int64_t m = 0; m < rows; m++) {
                float lower = -INFINITY;
                int ok = 1;
                for (int64_t g = 0; g < groups; g++) {
                    const float l = lo[m * groups + g];
                    lower = l > lower ? l : lower;
                    ok &= finite[m * groups + g];
                }
                if (!ok) {
                    out[b0 + m] = -1;
                    continue;
                }
                // one activation row on its own (its rows of the planes, scales and sums)
                IntRows one = {q.planes + 3 * m * K, q.scale + m * nb, q.sum + m * nb,
                               q.psum + PSUMS * m * nb};
                float best = -INFINITY;
                int64_t best_n = -1;
                for (int64_t g = 0; g < groups; g++) {
                    if (hi[m * groups + g] < lower) continue;  // no output of it can be the largest
                    float exact[MAX_ROWS][GROUP];
                    exact_group(qt, w + g * group_bytes(qt, nb), nb, &one, 1, K, exact);
                    for (int r = 0; r < GROUP; r++) {
                        const float v = exact[0][r] + 0.0f;  // as tm_int_dot_linear stores it
                        if (v > best || best_n < 0) best = v, best_n = g * GROUP + r;
                    }
                }
                out[b0 + m] = best_n;
            }
        }
        free(buffer);
    }
    free(lo);
    free(finite);
}
