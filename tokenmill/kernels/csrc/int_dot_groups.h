// The integer-dot GEMV's tiles (int_dot.h's layout): up to 8 rows x a 16-row weight group
// on the leading GROUP_PLANES digit planes, in AVX-512 VNNI, AVX2 (VNNI emulated, or
// AVX-VNNI) and plain C (int_dot_kernels.c's reference). Built once per plane count
// (int_dot_group_p1.c, _p2.c, _p3.c: int_dot_group_fast_high, _two and int_dot_group_fast), so
// the three compile side by side; every build gives the plain C reference's bits.
#pragma once
#include <stdint.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "int_dot.h"

#if !defined(GROUP_PLANES)
#error "int_dot_groups.h: define GROUP_PLANES (1, 2 or 3) before including it"
#elif GROUP_PLANES == 1
#define GROUP_FN int_dot_group_fast_high
#elif GROUP_PLANES == 2
#define GROUP_FN int_dot_group_fast_two
#else
#define GROUP_FN int_dot_group_fast
#endif

#define PREFETCH_BYTES 4096  // how far ahead of the weight stream to prefetch (measured)

// ---------------------------------------------------------------- AVX-512 VNNI

// The vector bodies are instantiated per format and per row count (1..8), so the row loops
// unroll and every row's accumulators stay in registers.
#define FOR_ROWS(T, M, CALL)      \
    switch (M) {                  \
        case 1: CALL(T, 1); break; \
        case 2: CALL(T, 2); break; \
        case 3: CALL(T, 3); break; \
        case 4: CALL(T, 4); break; \
        case 5: CALL(T, 5); break; \
        case 6: CALL(T, 6); break; \
        case 7: CALL(T, 7); break; \
        default: CALL(T, 8); break; \
    }
#define FOR_FORMAT_AND_ROWS(qt, M, CALL)                 \
    switch (qt) {                                        \
        case QT_Q4_0: FOR_ROWS(QT_Q4_0, M, CALL); break; \
        case QT_Q4_1: FOR_ROWS(QT_Q4_1, M, CALL); break; \
        case QT_Q8_0: FOR_ROWS(QT_Q8_0, M, CALL); break; \
        case QT_Q4_K: FOR_ROWS(QT_Q4_K, M, CALL); break; \
        case QT_Q6_K: FOR_ROWS(QT_Q6_K, M, CALL); break; \
        default: break;                                  \
    }

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)

// acc + the u8 x s8 dot products of w's dwords with the dword at x in every lane, the
// broadcast folded into the instruction's memory operand (GCC keeps a separate broadcast load
// for _mm512_set1_epi32: one more uop per product, which the extra rows of a verification
// step are short of).
ALWAYS_INLINE __m512i dpbusd_broadcast(__m512i acc, __m512i w, const int32_t* x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*x));
    return acc;
}

// block_term_c's f on 16 lanes: fma(S_hi, 65536, 256 S_mid + S_lo).
ALWAYS_INLINE __m512 planes_to_f512(const __m512i S[3]) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[0]), _mm512_set1_ps(65536.0f),
                           _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(S[1], 8), S[2])));
}

ALWAYS_INLINE void group_avx512_t(int qt, int planes, const uint8_t* gw, int64_t nb,
                                  const IntRows* q, int64_t M, int64_t K, float out[][GROUP]) {
    const int64_t gbb = group_block_bytes(qt);
    __m512 acc[MAX_ROWS];
    for (int64_t m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = gw + b * gbb, *sup = super_scales(qt, gw, nb, b);
        for (int64_t line = 0; line < gbb; line += 64)  // the stream runs ahead of the prefetcher
            _mm_prefetch((const char*)blk + PREFETCH_BYTES + line, _MM_HINT_T0);
        __m512i w[8];
        unpack_block_512(blk, qt, w);
        const __m512 d = block_scales_512(blk, qt, sup), mn = block_mins_512(blk, qt, sup);
        const __m512 d_high = qt == QT_Q6_K ? block_scales_high_512(blk, sup) : _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int64_t m = 0; m < M; m++) {
            if (qt == QT_Q6_K) {  // the halves apart (dwords 0-3, 4-7), each with its scale
                const int32_t* psum = q->psum + PSUMS * (m * nb + b);
                __m512i L[3], H[3];
                for (int p = 0; p < 3; p++) L[p] = H[p] = _mm512_setzero_si512();
                for (int p = 0; p < planes; p++) {
                    const int32_t* xp = (const int32_t*)(plane(q, m, p, K) + b * QK);
                    for (int j = 0; j < 4; j++) {
                        L[p] = dpbusd_broadcast(L[p], w[j], xp + j);
                        H[p] = dpbusd_broadcast(H[p], w[j + 4], xp + j + 4);
                    }
                    L[p] = _mm512_sub_epi32(L[p], _mm512_set1_epi32(32 * psum[3 + p]));
                    H[p] = _mm512_sub_epi32(H[p], _mm512_set1_epi32(32 * (psum[p] - psum[3 + p])));
                }
                const __m512 s = _mm512_set1_ps(q->scale[m * nb + b]);
                acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(planes_to_f512(L), s), d, acc[m]);
                acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(planes_to_f512(H), s), d_high, acc[m]);
                continue;
            }
            __m512i S[3] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
            for (int p = 0; p < planes; p++) {
                const int32_t* xp = (const int32_t*)(plane(q, m, p, K) + b * QK);
                __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
                for (int j = 0; j < 8; j += 2) {
                    even = dpbusd_broadcast(even, w[j], xp + j);
                    odd = dpbusd_broadcast(odd, w[j + 1], xp + j + 1);
                }
                S[p] = _mm512_add_epi32(even, odd);
                if (qt == QT_Q8_0)
                    S[p] = _mm512_sub_epi32(S[p], _mm512_set1_epi32(128 * q->psum[PSUMS * (m * nb + b) + p]));
            }
            const __m512 f = planes_to_f512(S);
            const float s = q->scale[m * nb + b], sum = q->sum[m * nb + b];
            acc[m] = block_term_512(qt, f, s, sum, -8.0f * sum, d, mn, acc[m]);
        }
    }
    for (int64_t m = 0; m < M; m++) _mm512_storeu_ps(out[m], acc[m]);
}

void GROUP_FN(int qt, const uint8_t* gw, int64_t nb, const IntRows* q, int64_t M, int64_t K,
              float out[][GROUP]) {
#define GROUP_M(T, ROWS) group_avx512_t(T, GROUP_PLANES, gw, nb, q, ROWS, K, out)
    FOR_FORMAT_AND_ROWS(qt, M, GROUP_M)
#undef GROUP_M
}
#elif defined(__AVX2__)

// u8 x s8 dot products of 4-byte groups into int32 lanes: AVX-VNNI where the CPU has it, else
// pmaddubsw + pmaddwd (exact while a pair of products stays within int16: 4- and 6-bit
// weights, so Q8_0's bytes go in as two nibbles).
ALWAYS_INLINE __m256i dot4(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// block_term_c's f on 8 lanes: fma(S_hi, 65536, 256 S_mid + S_lo).
ALWAYS_INLINE __m256 planes_to_f256(const __m256i S[3]) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(S[0]), _mm256_set1_ps(65536.0f),
                           _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_slli_epi32(S[1], 8), S[2])));
}

// fp16 d[8] at sup times the 8 scale bytes at sc (unsigned: Q4_K's, else int8): block_scale's
// products for rows 8h .. 8h + 7 (sup and sc at their row 8h).
ALWAYS_INLINE __m256 super_times_256(const uint8_t* sup, const uint8_t* sc, int is_signed) {
    const __m128i b = _mm_loadl_epi64((const __m128i*)sc);
    const __m256i v = is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
    return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)sup)), _mm256_cvtepi32_ps(v));
}

// Rows 8h .. 8h + 7 of a group (the half h of each 64-byte vector).
ALWAYS_INLINE void half_avx2_t(int qt, int planes, const uint8_t* gw, int64_t nb, const IntRows* q,
                               int64_t M, int64_t K, int h, float out[][GROUP]) {
    const int64_t gbb = group_block_bytes(qt);
    const int qs = group_qs_bytes(qt);
    const __m256i nib = _mm256_set1_epi8(0x0F);
    __m256 acc[MAX_ROWS];
    for (int64_t m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = gw + b * gbb, *sup = super_scales(qt, gw, nb, b);
        if (h == 0)  // the stream runs ahead of the prefetcher
            for (int64_t line = 0; line < gbb; line += 64)
                _mm_prefetch((const char*)blk + PREFETCH_BYTES + line, _MM_HINT_T0);
        __m256i w[8];
        if (qt == QT_Q8_0) {
            for (int j = 0; j < 8; j++) w[j] = _mm256_loadu_si256((const __m256i*)(blk + 64 * j + 32 * h));
        } else {
            for (int j = 0; j < 4; j++) {
                const __m256i v = _mm256_loadu_si256((const __m256i*)(blk + 64 * j + 32 * h));
                w[j] = _mm256_and_si256(v, nib);
                w[j + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
            }
        }
        if (qt == QT_Q6_K)  // the high bits (unpack_block_512)
            for (int j = 0; j < 8; j++) {
                const __m256i hv = _mm256_loadu_si256((const __m256i*)(blk + 256 + 64 * (j / 4) + 32 * h));
                const __m256i bits = _mm256_and_si256(_mm256_srli_epi16(hv, 2 * (j % 4)), _mm256_set1_epi8(3));
                w[j] = _mm256_or_si256(w[j], _mm256_slli_epi16(bits, 4));
            }
        const __m256 d = k_quant(qt)
            ? super_times_256(sup + 16 * h, blk + qs + 8 * h, qt == QT_Q6_K)
            : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + qs + 16 * h)));
        const __m256 d_high = qt == QT_Q6_K ? super_times_256(sup + 16 * h, blk + qs + GROUP + 8 * h, 1)
                                            : _mm256_setzero_ps();
        __m256 mn = _mm256_setzero_ps();
        if (qt == QT_Q4_K) {  // -(dmin * m), the sign flipped exactly
            const __m256 p = super_times_256(sup + 2 * GROUP + 16 * h, blk + qs + GROUP + 8 * h, 0);
            mn = _mm256_xor_ps(p, _mm256_set1_ps(-0.0f));
        } else if (qt == QT_Q4_1) {
            mn = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + qs + 2 * GROUP + 16 * h)));
        }
#pragma GCC unroll 8
        for (int64_t m = 0; m < M; m++) {
            if (qt == QT_Q6_K) {  // the halves apart (dwords 0-3, 4-7), each with its scale
                const int32_t* psum = q->psum + PSUMS * (m * nb + b);
                __m256i L[3], H[3];
                for (int p = 0; p < 3; p++) L[p] = H[p] = _mm256_setzero_si256();
                for (int p = 0; p < planes; p++) {
                    const int32_t* xp = (const int32_t*)(plane(q, m, p, K) + b * QK);
                    for (int j = 0; j < 4; j++) {
                        L[p] = dot4(L[p], w[j], _mm256_set1_epi32(xp[j]));
                        H[p] = dot4(H[p], w[j + 4], _mm256_set1_epi32(xp[j + 4]));
                    }
                    L[p] = _mm256_sub_epi32(L[p], _mm256_set1_epi32(32 * psum[3 + p]));
                    H[p] = _mm256_sub_epi32(H[p], _mm256_set1_epi32(32 * (psum[p] - psum[3 + p])));
                }
                const __m256 s = _mm256_set1_ps(q->scale[m * nb + b]);
                acc[m] = _mm256_fmadd_ps(_mm256_mul_ps(planes_to_f256(L), s), d, acc[m]);
                acc[m] = _mm256_fmadd_ps(_mm256_mul_ps(planes_to_f256(H), s), d_high, acc[m]);
                continue;
            }
            __m256i S[3] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
            for (int p = 0; p < planes; p++) {
                const int32_t* xp = (const int32_t*)(plane(q, m, p, K) + b * QK);
                __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
                for (int j = 0; j < 8; j += 2) {
#if !defined(__AVXVNNI__)
                    if (qt == QT_Q8_0) {  // 8-bit weights: high and low nibbles (exact pairs)
                        for (int i = 0; i < 2; i++) {
                            const __m256i x4 = _mm256_set1_epi32(xp[j + i]);
                            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w[j + i], 4), nib);
                            even = dot4(even, hi, x4);
                            odd = dot4(odd, _mm256_and_si256(w[j + i], nib), x4);
                        }
                        continue;
                    }
#endif
                    even = dot4(even, w[j], _mm256_set1_epi32(xp[j]));
                    odd = dot4(odd, w[j + 1], _mm256_set1_epi32(xp[j + 1]));
                }
#if !defined(__AVXVNNI__)
                if (qt == QT_Q8_0)  // even: the high nibbles' products, odd: the low ones'
                    even = _mm256_slli_epi32(even, 4);
#endif
                S[p] = _mm256_add_epi32(even, odd);
                if (qt == QT_Q8_0)
                    S[p] = _mm256_sub_epi32(S[p], _mm256_set1_epi32(128 * q->psum[PSUMS * (m * nb + b) + p]));
            }
            const __m256 f = planes_to_f256(S);
            const float s = q->scale[m * nb + b], sum = q->sum[m * nb + b];
            if (qt == QT_Q4_0) {
                const __m256 g = _mm256_fmadd_ps(f, _mm256_set1_ps(s), _mm256_set1_ps(-8.0f * sum));
                acc[m] = _mm256_fmadd_ps(g, d, acc[m]);
            } else {
                acc[m] = _mm256_fmadd_ps(_mm256_mul_ps(f, _mm256_set1_ps(s)), d, acc[m]);
                if (has_min(qt)) acc[m] = _mm256_fmadd_ps(mn, _mm256_set1_ps(sum), acc[m]);
            }
        }
    }
    for (int64_t m = 0; m < M; m++) _mm256_storeu_ps(out[m] + 8 * h, acc[m]);
}

void GROUP_FN(int qt, const uint8_t* gw, int64_t nb, const IntRows* q, int64_t M, int64_t K,
              float out[][GROUP]) {
    for (int h = 0; h < 2; h++) {
#define HALF_M(T, ROWS) half_avx2_t(T, GROUP_PLANES, gw, nb, q, ROWS, K, h, out)
        FOR_FORMAT_AND_ROWS(qt, M, HALF_M)
#undef HALF_M
    }
}
#else
void GROUP_FN(int qt, const uint8_t* gw, int64_t nb, const IntRows* q, int64_t M, int64_t K,
              float out[][GROUP]) {
    int_dot_group_c_planes(qt, GROUP_PLANES, gw, nb, q, M, K, out);
}
#endif
