// The integer-dot kernels' shared layout (int_dot_kernels.c: repack, activation rows, the
// GEMV; int_dot_groups.h: its 8-row tiles; int_dot_gemm.c: the GEMM over many rows).
#pragma once
#include <stdint.h>
#include <string.h>

// Q4_K's 32-value sub-blocks are regrouped as Q4_1 blocks whose scale d * sc and minimum
// -(dmin * m) the kernels form in fp32 (the products ggml's dequantizer forms) from the
// sub-block's 6-bit sc and m, kept a byte each, and the super-block's fp16 d and dmin, kept
// once per 8 blocks after the group's blocks; so every kernel runs them as Q4_1 with another
// scale load. Q6_K's values q (0..63, value q - 32) keep their low 4 bits as Q4_1's nibbles
// and their high 2 bits in two more vectors (q_bits_high), with two int8 scales sc (one per
// 16 values; the super-block's d after the group's blocks), so the two halves of a block sum
// apart (offset-corrected by the halves' digit sums).
enum { QT_Q4_0 = 2, QT_Q4_1 = 3, QT_Q8_0 = 8, QT_Q4_K = 12, QT_Q6_K = 14 };
#define QK 32
#define GROUP 16           // weight rows interleaved per group
#define MAX_ROWS 8         // activation rows per call
#define X_INT_MAX 8355711.0f  // 0x7F7F7F: |x_int| bound whose three balanced bytes fit int8
#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline float fp16(const uint8_t* p) {
    _Float16 h;
    memcpy(&h, p, 2);
    return (float)h;
}

// Bytes of a group-block's quantized values (dword-interleaved across its 16 rows): Q8_0 a
// byte a value, Q6_K two nibble vectors of 4-bit values plus 2 vectors of high bits, else the
// nibbles.
static inline int group_qs_bytes(int qt) {
    return qt == QT_Q8_0 ? GROUP * QK : qt == QT_Q6_K ? GROUP * QK * 3 / 4 : GROUP * QK / 2;
}

static inline int64_t group_block_bytes(int qt) {
    switch (qt) {
        case QT_Q4_0: return GROUP * 18;
        case QT_Q4_1: return GROUP * 20;
        case QT_Q8_0: return GROUP * 34;
        case QT_Q4_K: return GROUP * 18;
        case QT_Q6_K: return GROUP * 26;
        default: return 0;
    }
}

static inline int k_quant(int qt) { return qt == QT_Q4_K || qt == QT_Q6_K; }

// Bytes of a group's super-block scales (K-quants, 8 blocks each): the 16 rows' fp16 d
// (and Q4_K's dmin).
static inline int super_bytes(int qt) { return qt == QT_Q4_K ? 4 * GROUP : qt == QT_Q6_K ? 2 * GROUP : 0; }

// Bytes of one 16-row group: its nb group-blocks, then (K-quants) its super-blocks' scales.
static inline int64_t group_bytes(int qt, int64_t nb) {
    return nb * group_block_bytes(qt) + nb / 8 * super_bytes(qt);
}

// The super-block scales of block b of the group at gw (NULL: not a K-quant).
static inline const uint8_t* super_scales(int qt, const uint8_t* gw, int64_t nb, int64_t b) {
    return k_quant(qt) ? gw + nb * group_block_bytes(qt) + b / 8 * super_bytes(qt) : NULL;
}

// A weight value is d * q + m per block (Q4_1, Q4_K); Q4_0's is d * (q - 8), Q8_0's d * q.
static inline int has_min(int qt) { return qt == QT_Q4_1 || qt == QT_Q4_K; }

// Row r's scale d (Q6_K: of the first 16 values; block_scale_high: of the last 16) and
// minimum m of a group-block (after its quantized dwords; sup: its super-block scales).
static inline float block_scale(int qt, const uint8_t* blk, const uint8_t* sup, int r) {
    const uint8_t* at = blk + group_qs_bytes(qt);
    if (qt == QT_Q4_K) return fp16(sup + 2 * r) * (float)at[r];
    if (qt == QT_Q6_K) return fp16(sup + 2 * r) * (float)(int8_t)at[r];
    return fp16(at + 2 * r);
}

static inline float block_scale_high(const uint8_t* blk, const uint8_t* sup, int r) {
    return fp16(sup + 2 * r) * (float)(int8_t)blk[group_qs_bytes(QT_Q6_K) + GROUP + r];
}

static inline float block_min(int qt, const uint8_t* blk, const uint8_t* sup, int r) {
    const uint8_t* at = blk + group_qs_bytes(qt);
    if (qt == QT_Q4_1) return fp16(at + 2 * GROUP + 2 * r);
    if (qt == QT_Q4_K) return -(fp16(sup + 2 * GROUP + 2 * r) * (float)at[GROUP + r]);
    return 0.0f;
}

// ---------------------------------------------------------------- activation rows

typedef struct {
    int8_t* planes;  // [M, 3, K]: the high, middle and low bytes of x_int
    float* scale;    // [M, K / 32]
    float* sum;      // [M, K / 32]: scale * sum of x_int
    int32_t* psum;   // [M, K / 32, PSUMS]: sum of each byte plane, then of each plane's
                     // first 16 values (the Q8_0 and Q6_K offset corrections)
} IntRows;
#define PSUMS 6

static inline const int8_t* plane(const IntRows* q, int64_t m, int p, int64_t K) {
    return q->planes + (3 * m + p) * K;
}

// An activation precision: each value rounds to v = rint(x * xmax / amax) in [-xmax, xmax],
// and x_int = v * 2^shift (scale = amax / (xmax * 2^shift)). 24 bits: the decode path's
// (three digit planes). 16 bits: two digits, x_int's low digit zero. 8 bits: v is one int8
// (llama.cpp's Q8 activations), x_int's middle and low digits zero. The planes left out
// contribute nothing, so the leading planes alone give the exact dot products and the
// 24-bit arithmetic (the same fp32 operations) gives the result bit for bit.
typedef struct {
    float xmax, divisor;  // divisor = xmax * 2^shift (exact in fp32)
    int shift;
} Precision;
static const Precision BITS24 = {X_INT_MAX, X_INT_MAX, 0};
static const Precision BITS16 = {32639.0f, 8355584.0f, 8};  // 0x7F7F, 0x7F7F * 256
static const Precision BITS8 = {127.0f, 8323072.0f, 16};      // 127 * 65536

// The digit planes that run at `bits` (24, 16 or 8; anything else: 24) and their precision.
static inline int planes_of(int bits) { return bits == 8 ? 1 : bits == 16 ? 2 : 3; }
static inline Precision precision_of(int bits) {
    const int P = planes_of(bits);
    return P == 1 ? BITS8 : P == 2 ? BITS16 : BITS24;
}

typedef void (*GroupFn)(int qt, const uint8_t* gw, int64_t nb, const IntRows* q, int64_t M,
                        int64_t K, float out[][GROUP]);

// Rows of x quantized at precision pr (threads over rows); planes of IntRows from
// int_dot_alloc_rows (free the buffer it returns). psums: the planes' sums are computed
// (the formats that read them: needs_psums), else zero.
void int_dot_quantize_rows(const float* x, int64_t M, int64_t K, IntRows* q, Precision pr,
                           int psums, int nthreads);
// Q8_0's offset and Q6_K's halves correct the dot products by the planes' sums.
static inline int needs_psums(int qt) { return qt == QT_Q8_0 || qt == QT_Q6_K; }
IntRows int_dot_alloc_rows(int64_t M, int64_t K, void** buffer);
// y[m, r] = row m . weight row r of one 16-row group (M <= MAX_ROWS): the plain C body (all
// three planes), this build's fastest, and its high plane only.
void int_dot_group_c(int qt, const uint8_t* gw, int64_t nb, const IntRows* q, int64_t M,
                     int64_t K, float out[][GROUP]);
// ... on the leading `planes` planes only (the builds without a vector body)
void int_dot_group_c_planes(int qt, int planes, const uint8_t* gw, int64_t nb, const IntRows* q,
                            int64_t M, int64_t K, float out[][GROUP]);
void int_dot_group_fast(int qt, const uint8_t* gw, int64_t nb, const IntRows* q, int64_t M,
                        int64_t K, float out[][GROUP]);
void int_dot_group_fast_high(int qt, const uint8_t* gw, int64_t nb, const IntRows* q, int64_t M,
                             int64_t K, float out[][GROUP]);
// ... and its high and middle planes (16-bit rows).
void int_dot_group_fast_two(int qt, const uint8_t* gw, int64_t nb, const IntRows* q, int64_t M,
                            int64_t K, float out[][GROUP]);
// This build's fastest body on the leading P planes (the rows' others are zero).
static inline GroupFn int_dot_group_planes(int P) {
    return P == 1 ? int_dot_group_fast_high : P == 2 ? int_dot_group_fast_two : int_dot_group_fast;
}

// The GEMM's 8- and 16-bit tiles on AMX (int_dot_amx.c): ready where this build has them,
// the process may use the tiles and tm_int_dot_set_amx left them on; begin / end configure
// and release a thread's tiles.
#define AMX_ROWS 16  // activation rows per AMX tile
int int_dot_amx_ready(void);
void int_dot_amx_begin(void);
void int_dot_amx_end(void);
void int_dot_amx_pad_rows(const IntRows* q, int64_t M, int64_t padded, int64_t K);
void int_dot_amx_tile(int qt, int P, const uint8_t* gw, int64_t nb, const IntRows* q,
                      int64_t rows, int64_t K, float out[][GROUP]);

#if defined(__AVX512F__)
// fp16 d[16] at sup times the 16 scale bytes at sc (unsigned: Q4_K's, else int8): the same
// fp32 products as block_scale's.
ALWAYS_INLINE __m512 super_times_512(const uint8_t* sup, const uint8_t* sc, int is_signed) {
    const __m128i b = _mm_loadu_si128((const __m128i*)sc);
    const __m512i v = is_signed ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
    return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)sup)),
                         _mm512_cvtepi32_ps(v));
}

// The 16 rows' scales and minimums of a group-block (block_scale, block_min; Q6_K: of the
// first 16 values, block_scales_high_512: of the last 16).
ALWAYS_INLINE __m512 block_scales_512(const uint8_t* blk, int qt, const uint8_t* sup) {
    const uint8_t* at = blk + group_qs_bytes(qt);
    if (k_quant(qt)) return super_times_512(sup, at, qt == QT_Q6_K);
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)at));
}

ALWAYS_INLINE __m512 block_scales_high_512(const uint8_t* blk, const uint8_t* sup) {
    return super_times_512(sup, blk + group_qs_bytes(QT_Q6_K) + GROUP, 1);
}

ALWAYS_INLINE __m512 block_mins_512(const uint8_t* blk, int qt, const uint8_t* sup) {
    const uint8_t* at = blk + group_qs_bytes(qt);
    if (qt == QT_Q4_K) {  // -(dmin * m), the sign flipped exactly
        const __m512 p = super_times_512(sup + 2 * GROUP, at + GROUP, 0);
        return _mm512_castsi512_ps(
            _mm512_xor_si512(_mm512_castps_si512(p), _mm512_set1_epi32((int)0x80000000u)));
    }
    return qt == QT_Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(at + 2 * GROUP)))
                         : _mm512_setzero_ps();
}

// A block's term for a row's 16 outputs, block_term_c's fp32 operations on 16 lanes: x is the
// block's exact integer sums as fp32, s the row's scale (times any power of two x left out),
// sum its scale * sum of x_int and neg8sum -8 * sum (Q4_0). Every AVX-512 body (the GEMV's,
// the GEMM's, the AMX tiles') adds its blocks with it, so they give the same bits.
ALWAYS_INLINE __m512 block_term_512(int qt, __m512 x, float s, float sum, float neg8sum,
                                    __m512 d, __m512 mn, __m512 acc) {
    if (qt == QT_Q4_0)
        return _mm512_fmadd_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(s), _mm512_set1_ps(neg8sum)), d, acc);
    acc = _mm512_fmadd_ps(_mm512_mul_ps(x, _mm512_set1_ps(s)), d, acc);
    return has_min(qt) ? _mm512_fmadd_ps(mn, _mm512_set1_ps(sum), acc) : acc;
}
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// One group block's weights as 8 vectors of bytes (16 rows x 32 values): Q8_0's as stored,
// Q4's low and high nibbles apart (values 0..15). The GEMV and the GEMM read blocks alike.
ALWAYS_INLINE void unpack_block_512(const uint8_t* blk, int qt, __m512i w[8]) {
    if (qt == QT_Q8_0) {
        for (int j = 0; j < 8; j++) w[j] = _mm512_loadu_si512(blk + 64 * j);
        return;
    }
    const __m512i nib = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < 4; j++) {
        const __m512i v = _mm512_loadu_si512(blk + 64 * j);
        w[j] = _mm512_and_si512(v, nib);
        w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
    }
    if (qt == QT_Q6_K) {  // dword j's high bits: bits 2 (j % 4) of high vector j / 4's bytes
        const __m512i three = _mm512_set1_epi8(3);
        for (int j = 0; j < 8; j++) {
            const __m512i h = _mm512_loadu_si512(blk + 256 + 64 * (j / 4));
            const __m512i bits = _mm512_and_si512(_mm512_srli_epi16(h, 2 * (j % 4)), three);
            w[j] = _mm512_or_si512(w[j], _mm512_slli_epi16(bits, 4));
        }
    }
}
#endif
