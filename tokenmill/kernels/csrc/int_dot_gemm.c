// The integer-dot GEMM: prefill chunks and batched steps past the decode GEMV's rows, on the
// weights tm_int_dot_repack regrouped (int_dot_kernels.c has the layout and the GEMV).
//
// Every row is quantized once, then threads split the output groups (16 weight rows each);
// a thread runs its groups over a block of rows at a time (their digits stay in L2) in tiles
// of rows x 16 outputs whose accumulators stay in registers across the K loop: the weight
// block is unpacked once per tile, each activation dword is broadcast from L1.
//
// Activation precision (`bits`), per 32-value block of a row:
//   24: the decode path's (three digit planes); the tiles are the GEMV's, so a row's result
//       is the GEMV's bit for bit, whatever the rows beside it.
//   16: v = rint(x * 32639 / amax), x_int = 256 v: two digit planes, two thirds of the work.
//   8:  one int8 per value (llama.cpp's Q8 activations): v = rint(x * 127 / amax), x_int =
//       65536 v: the high plane alone, a third of the work.
// At 8 and 16 bits the AVX-512 VNNI build runs its own tiles of 12 rows (below), which read
// the rows' digits and terms from one stream per tile.
// The planes left out are zero, and every build runs the 24-bit path's fp32 operations on
// x_int, so the plain C reference with all three planes, the AVX2 and the AVX-512 VNNI
// builds give the same bits at each precision; a row's result never depends on the rows
// beside it. The AVX-512 tiles fold x_int's power of two into the row's scale (65536 at 8
// bits, 256 at 16, where they join the two planes' sums in int32 first: 256 S0 + S1 is the
// block's exact dot product with v, and converting it rounds as the 24-bit path's
// fma(S0, 65536, 256 S1) does, to that value over 256): scaling by a power of two is exact,
// so the bits are the same, and the join costs two integer operations instead of two
// conversions, a shift and an FMA (the GEMM 6% faster on a Zen 4 EPYC).
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "int_dot.h"

#define ROW_TILES 8  // tiles of rows a thread runs each of its weight groups over at a time

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define TILE_ROWS 12  // rows per 8- / 16-bit tile (registers: an accumulator a row, 8 weights)
#else
#define TILE_ROWS MAX_ROWS
#endif
// The 8- and 16-bit tiles read their rows in one stream: per tile of TILE_ROWS rows and per
// block, the rows' 32 digits of each plane, then per row the scale (times 65536 at 8 bits,
// 256 at 16: the powers of two the tiles leave out of x_int), scale * sum of x_int, -8 times
// that (Q4_0), and 128 * each plane's digit sum (Q8_0's offset correction), so every load is one
// pointer plus a constant.
#define CHUNK(P) (TILE_ROWS * QK * (P) + 5 * TILE_ROWS * 4)

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// Rows quantized in q with P leading planes, in tiles: ceil(M / TILE_ROWS) * nb chunks
// (threads over rows).
static void pack_rows(const IntRows* q, int P, int64_t M, int64_t K, int8_t* out, int nthreads) {
    const int64_t nb = K / QK;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M > TILE_ROWS)
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++) {
            int8_t* c = out + ((m / TILE_ROWS) * nb + b) * CHUNK(P);
            const int64_t r = m % TILE_ROWS, at = m * nb + b;
            for (int p = 0; p < P; p++)
                memcpy(c + (p * TILE_ROWS + r) * QK, plane(q, m, p, K) + b * QK, QK);
            float* f = (float*)(c + TILE_ROWS * QK * P);
            // exact: times a power of two (the tiles' planes joined in int32 leave it out)
            f[r] = q->scale[at] * (P == 1 ? 65536.0f : 256.0f);
            f[TILE_ROWS + r] = q->sum[at];
            f[2 * TILE_ROWS + r] = -8.0f * q->sum[at];
            for (int p = 0; p < 2; p++)
                ((int32_t*)f)[(3 + p) * TILE_ROWS + r] = p < P ? 128 * q->psum[PSUMS * at + p] : 0;
        }
}

// acc + the u8 x s8 dot products of w's dwords with the dword at x in every lane (the
// broadcast folded into the instruction, as in int_dot_groups.h).
ALWAYS_INLINE __m512i dpbusd_bcst(__m512i acc, __m512i w, const int8_t* x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t*)x));
    return acc;
}

// One plane's exact dot products of a row's block with the 16 weight rows (two short chains).
ALWAYS_INLINE __m512i plane_dot(const __m512i w[8], const int8_t* x) {
    __m512i s = _mm512_setzero_si512(), t = _mm512_setzero_si512();
    for (int j = 0; j < 8; j += 2) {
        s = dpbusd_bcst(s, w[j], x + 4 * j);
        t = dpbusd_bcst(t, w[j + 1], x + 4 * j + 4);
    }
    return _mm512_add_epi32(s, t);
}

// ROWS rows x 16 outputs with P planes from a tile's chunks: per row and block 8 P vpdpbusd
// and the 24-bit path's fp32 operations (f * 65536 * scale as f * (scale * 65536) at 8 bits,
// (256 S0 + S1) * (scale * 256) at 16).
ALWAYS_INLINE void tile_avx512_t(int qt, int P, int ROWS, const uint8_t* gw, int64_t nb,
                                 const int8_t* chunks, float out[][GROUP]) {
    const int64_t gbb = group_block_bytes(qt);
    __m512 acc[TILE_ROWS];
    for (int m = 0; m < ROWS; m++) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t* blk = gw + b * gbb;
        const int8_t* c = chunks + b * CHUNK(P);
        const float* f = (const float*)(c + TILE_ROWS * QK * P);
        const int32_t* off = (const int32_t*)f + 3 * TILE_ROWS;
        __m512i w[8];
        unpack_block_512(blk, qt, w);
        const uint8_t* sup = super_scales(qt, gw, nb, b);
        const __m512 d = block_scales_512(blk, qt, sup), mn = block_mins_512(blk, qt, sup);
#pragma GCC unroll 16
        for (int m = 0; m < ROWS; m++) {
            __m512i S0 = plane_dot(w, c + m * QK);
            if (qt == QT_Q8_0) S0 = _mm512_sub_epi32(S0, _mm512_set1_epi32(off[m]));
            __m512 x;
            if (P == 1) {
                x = _mm512_cvtepi32_ps(S0);
            } else {
                __m512i S1 = plane_dot(w, c + (TILE_ROWS + m) * QK);
                if (qt == QT_Q8_0) S1 = _mm512_sub_epi32(S1, _mm512_set1_epi32(off[TILE_ROWS + m]));
                x = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(S0, 8), S1));
            }
            acc[m] = block_term_512(qt, x, f[m], f[TILE_ROWS + m], f[2 * TILE_ROWS + m], d, mn,
                                    acc[m]);
        }
    }
    for (int m = 0; m < ROWS; m++) _mm512_storeu_ps(out[m], acc[m]);
}

#define TILE_M(T, P, ROWS) tile_avx512_t(T, P, ROWS, gw, nb, chunks, out)
#define TILE_FOR_ROWS(T, P)                \
    switch (M) {                           \
        case 1: TILE_M(T, P, 1); break;    \
        case 2: TILE_M(T, P, 2); break;    \
        case 3: TILE_M(T, P, 3); break;    \
        case 4: TILE_M(T, P, 4); break;    \
        case 5: TILE_M(T, P, 5); break;    \
        case 6: TILE_M(T, P, 6); break;    \
        case 7: TILE_M(T, P, 7); break;    \
        case 8: TILE_M(T, P, 8); break;    \
        case 9: TILE_M(T, P, 9); break;    \
        case 10: TILE_M(T, P, 10); break;  \
        case 11: TILE_M(T, P, 11); break;  \
        default: TILE_M(T, P, 12); break;  \
    }
#define TILE_FOR_FORMAT(P)                               \
    switch (qt) {                                        \
        case QT_Q4_0: TILE_FOR_ROWS(QT_Q4_0, P); break;  \
        case QT_Q4_1: TILE_FOR_ROWS(QT_Q4_1, P); break;  \
        case QT_Q8_0: TILE_FOR_ROWS(QT_Q8_0, P); break;  \
        case QT_Q4_K: TILE_FOR_ROWS(QT_Q4_K, P); break;  \
        default: break;                                  \
    }

static void tile(int qt, int P, const uint8_t* gw, int64_t nb, const IntRows* q,
                 const int8_t* chunks, int64_t M, int64_t K, float out[][GROUP]) {
    (void)q, (void)K;
    if (P == 1)
        TILE_FOR_FORMAT(1)
    else
        TILE_FOR_FORMAT(2)
}
#else
// Elsewhere the GEMV's tiles on the leading planes (AVX2: vpdpbusd emulated or AVX-VNNI)
// are the 8- and 16-bit tiles; they read the rows as quantized.
static void tile(int qt, int P, const uint8_t* gw, int64_t nb, const IntRows* q,
                 const int8_t* chunks, int64_t M, int64_t K, float out[][GROUP]) {
    (void)chunks;
    if (P == 1)
        int_dot_group_fast_high(qt, gw, nb, q, M, K, out);
    else
        int_dot_group_fast_two(qt, gw, nb, q, M, K, out);
}
#endif

typedef enum { RUN_FAST, RUN_REFERENCE } Run;

static const float zeros[GROUP];  // the bias where there is none

// y = out + bias (+ y when accumulating): the GEMV's operations (out + 0.0f without a bias),
// one vector a row.
static inline void store_group(const float* restrict out, const float* restrict bias,
                               int accumulate, float* restrict y) {
    if (accumulate)
        for (int r = 0; r < GROUP; r++) y[r] += out[r] + bias[r];
    else
        for (int r = 0; r < GROUP; r++) y[r] = out[r] + bias[r];
}

static void int_dot_gemm(Run run, const float* x, int64_t M, int64_t K, const uint8_t* w, int qt,
                         int64_t N, const float* bias, float* y, int accumulate, int bits,
                         int nthreads) {
    const int64_t nb = K / QK;
    const int P = planes_of(bits);  // the digit planes that run
    // Q6_K (two scales a block) runs the GEMV's tiles at every precision
    const int tiled = run == RUN_FAST && P < 3 && qt != QT_Q6_K;
    const int amx = tiled && int_dot_amx_ready();  // the tiles on AMX: 16 rows each
    const int64_t tile_rows = amx ? AMX_ROWS : tiled ? TILE_ROWS : MAX_ROWS;
    // rows a thread runs each of its groups over at a time: their digits stay in L2
    const int64_t block = tile_rows * (K <= 2048 ? ROW_TILES : ROW_TILES / 4);
    const int64_t padded = amx ? (M + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS : M;
    void* buffer;
    IntRows q = int_dot_alloc_rows(padded, K, &buffer);
    int_dot_quantize_rows(x, M, K, &q, precision_of(bits), needs_psums(qt), nthreads);
    if (amx) int_dot_amx_pad_rows(&q, M, padded, K);
    int8_t* chunks = NULL;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    if (tiled && !amx) {  // the tiles read their rows from chunks (elsewhere from q)
        chunks = malloc((size_t)((M + TILE_ROWS - 1) / TILE_ROWS * nb * CHUNK(P)));
        pack_rows(&q, P, M, K, chunks, nthreads);
    }
#endif
#pragma omp parallel num_threads(nthreads)
    {
        if (amx) int_dot_amx_begin();
        for (int64_t b0 = 0; b0 < M; b0 += block) {
            const int64_t b1 = M - b0 < block ? M : b0 + block;
#pragma omp for schedule(static) nowait
            for (int64_t g = 0; g < N / GROUP; g++) {
                float out[AMX_ROWS][GROUP];  // the most rows of any tile
                for (int64_t m0 = b0; m0 < b1; m0 += tile_rows) {
                    const int64_t rows = b1 - m0 < tile_rows ? b1 - m0 : tile_rows;
                    const IntRows rows_q = {q.planes + 3 * m0 * K, q.scale + m0 * nb,
                                            q.sum + m0 * nb, q.psum + PSUMS * m0 * nb};
                    const uint8_t* gw = w + g * group_bytes(qt, nb);
                    if (amx)
                        int_dot_amx_tile(qt, P, gw, nb, &rows_q, rows, K, out);
                    else if (tiled)
                        tile(qt, P, gw, nb, &rows_q,
                             chunks ? chunks + m0 / TILE_ROWS * nb * CHUNK(P) : NULL, rows, K,
                             out);
                    else if (run == RUN_FAST)
                        int_dot_group_fast(qt, gw, nb, &rows_q, rows, K, out);
                    else
                        int_dot_group_c(qt, gw, nb, &rows_q, rows, K, out);
                    for (int64_t m = 0; m < rows; m++)
                        store_group(out[m], bias ? bias + g * GROUP : zeros, accumulate,
                                    y + (m0 + m) * N + g * GROUP);
                }
            }
        }
        if (amx) int_dot_amx_end();
    }
    free(chunks);
    free(buffer);
}

// y = x W^T (+ bias) (+ y when accumulating) for any number of rows; w repacked by
// tm_int_dot_repack; bits: the activations' precision, 24, 16 or 8 (anything else: 24).
void tm_int_dot_gemm(const float* x, int64_t M, int64_t K, const uint8_t* w, int qt, int64_t N,
                     const float* bias, float* y, int accumulate, int bits, int nthreads) {
    int_dot_gemm(RUN_FAST, x, M, K, w, qt, N, bias, y, accumulate, bits, nthreads);
}

// The plain C implementation whatever the build, with all three planes at every precision
// (the ones left out are zero): the fast tiles' shortcuts are checked against it.
void tm_int_dot_gemm_reference(const float* x, int64_t M, int64_t K, const uint8_t* w, int qt,
                               int64_t N, float* y, int bits) {
    int_dot_gemm(RUN_REFERENCE, x, M, K, w, qt, N, NULL, y, 0, bits, 1);
}
