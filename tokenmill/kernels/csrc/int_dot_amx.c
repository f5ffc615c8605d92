// The integer-dot GEMM's 8- and 16-bit tiles on AMX (Xeons from Sapphire Rapids on; built
// where -march=native has AMX-INT8, used once the kernel grants the process the tile state).
//
// A tile is 16 activation rows x one 16-row weight group. Per 32-value block: the block's
// weights, unpacked as the AVX-512 tiles unpack them (Q8_0 back to signed bytes), are the B
// operand as they come (vector j holds dword j of each of the 16 rows: AMX's layout); each
// digit plane of the 16 rows is an A operand read in place (stride: a row's three planes);
// TDPBSSD gives the plane's exact 16 x 16 integer dot products. They leave the tile as the
// AVX-512 tiles' sums do (256 S0 + S1 at 16 bits), and the same fp32 operations make each
// row's 16 outputs: the bits of the AVX-512 and plain C builds (int_dot_gemm.c), whatever
// the rows beside a row. The rows are padded to 16 with zero digits and zero scales.
#define _GNU_SOURCE  // syscall()
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if !defined(TM_AMX_EMULATE)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "int_dot.h"
#include "amx_tiles.h"

#if defined(AMX_BODY)
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

// 1 once the process may use the tiles (asked once; the permission is the process's)
static int amx_available(void) {
#if defined(TM_AMX_EMULATE)
    return 1;
#else
    static int state = -1;  // -1: not asked yet
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s < 0) {
        s = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
        __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    }
    return s;
#endif
}

static int amx_on = 1;  // tm_int_dot_set_amx: where the tiles were timed slower, off

int tm_int_dot_amx_available(void) { return amx_available(); }

void tm_int_dot_set_amx(int on) { __atomic_store_n(&amx_on, on != 0, __ATOMIC_RELAXED); }

int int_dot_amx_ready(void) { return __atomic_load_n(&amx_on, __ATOMIC_RELAXED) && amx_available(); }

void int_dot_amx_begin(void) { amx_configure(); }

void int_dot_amx_end(void) { amx_release(); }

// The rows from M to the padded count: zero digits, scales and sums.
void int_dot_amx_pad_rows(const IntRows* q, int64_t M, int64_t padded, int64_t K) {
    const int64_t nb = K / QK, n = padded - M;
    memset(q->planes + 3 * M * K, 0, (size_t)(3 * n * K));
    memset(q->scale + M * nb, 0, sizeof(float) * (size_t)(n * nb));
    memset(q->sum + M * nb, 0, sizeof(float) * (size_t)(n * nb));
    memset(q->psum + PSUMS * M * nb, 0, sizeof(int32_t) * (size_t)(PSUMS * n * nb));
}

// The P planes' integer dot products of q's 16 rows with block b's 16 weight rows, into s,
// on the tile set (a, w, c0, c1), the weights staged in `stage` (512 bytes).
#define BLOCK_PRODUCTS(b, a, w, c0, c1, s, stage)                                               \
    do {                                                                                        \
        stage_weights(gw + (b) * gbb, qt, stage);                                               \
        TILE_LOAD(w, stage, 64);                                                                \
        TILE_LOAD(a, q->planes + (b) * QK, 3 * K);                                              \
        TILE_ZERO(c0);                                                                          \
        TILE_DPBSSD(c0, a, w);                                                                  \
        TILE_STORE(c0, s[0], 4 * GROUP);                                                        \
        if (P == 2) {                                                                           \
            TILE_LOAD(a, q->planes + K + (b) * QK, 3 * K);                                      \
            TILE_ZERO(c1);                                                                      \
            TILE_DPBSSD(c1, a, w);                                                              \
            TILE_STORE(c1, s[1], 4 * GROUP);                                                    \
        }                                                                                       \
    } while (0)

// A block's weights as the B operand: unpacked as the AVX-512 tiles unpack them, Q8_0's
// bytes back to signed (stored offset by 128).
ALWAYS_INLINE void stage_weights(const uint8_t* blk, int qt, int8_t* wb) {
    __m512i w[8];
    unpack_block_512(blk, qt, w);
    for (int j = 0; j < 8; j++)
        _mm512_store_si512(wb + 64 * j, qt == QT_Q8_0 ? _mm512_xor_si512(w[j], _mm512_set1_epi8((char)0x80))
                                                      : w[j]);
}

// Block b's contribution to the 16 rows' accumulators from its products s (block_term_512,
// as the AVX-512 tiles add theirs).
ALWAYS_INLINE void block_terms(int qt, int P, const uint8_t* gw, int64_t nb, int64_t b,
                               const IntRows* q, int32_t s[2][AMX_ROWS][GROUP], __m512 acc[]) {
    const float pow2 = P == 1 ? 65536.0f : 256.0f;  // the power of two x_int's digits leave out
    const uint8_t* blk = gw + b * group_block_bytes(qt);
    const uint8_t* sup = super_scales(qt, gw, nb, b);
    const __m512 d = block_scales_512(blk, qt, sup), mn = block_mins_512(blk, qt, sup);
#pragma GCC unroll 16
    for (int m = 0; m < AMX_ROWS; m++) {
        const int64_t at = m * nb + b;
        __m512i S = _mm512_load_si512(s[0][m]);
        if (P == 2) S = _mm512_add_epi32(_mm512_slli_epi32(S, 8), _mm512_load_si512(s[1][m]));
        acc[m] = block_term_512(qt, _mm512_cvtepi32_ps(S), q->scale[at] * pow2, q->sum[at],
                                -8.0f * q->sum[at], d, mn, acc[m]);
    }
}

// 16 rows (q's, padded) x the group's 16 outputs at P planes; the first `rows` stored. Blocks
// run in pairs on two tile sets, so one block's tile products can run while the other's
// terms are added (tiles are not renamed: a set's next use waits for its stores).
ALWAYS_INLINE void amx_tile_t(int qt, int P, const uint8_t* gw, int64_t nb, const IntRows* q,
                              int64_t rows, int64_t K, float out[][GROUP]) {
    const int64_t gbb = group_block_bytes(qt);
    _Alignas(64) int8_t wb[2][8 * 64];
    _Alignas(64) int32_t s0[2][AMX_ROWS][GROUP], s1[2][AMX_ROWS][GROUP];
    __m512 acc[AMX_ROWS];
    for (int m = 0; m < AMX_ROWS; m++) acc[m] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        BLOCK_PRODUCTS(b, T_A0, T_B, T_C0, T_C1, s0, wb[0]);
        BLOCK_PRODUCTS(b + 1, T_A1, T_B1, T_C2, T_C3, s1, wb[1]);
        block_terms(qt, P, gw, nb, b, q, s0, acc);
        block_terms(qt, P, gw, nb, b + 1, q, s1, acc);
    }
    if (b < nb) {
        BLOCK_PRODUCTS(b, T_A0, T_B, T_C0, T_C1, s0, wb[0]);
        block_terms(qt, P, gw, nb, b, q, s0, acc);
    }
    for (int64_t m = 0; m < rows; m++) _mm512_storeu_ps(out[m], acc[m]);
}

#define AMX_TILE(T, P) amx_tile_t(T, P, gw, nb, q, rows, K, out)
#define AMX_FOR_FORMAT(P)                              \
    switch (qt) {                                      \
        case QT_Q4_0: AMX_TILE(QT_Q4_0, P); break;     \
        case QT_Q4_1: AMX_TILE(QT_Q4_1, P); break;     \
        case QT_Q8_0: AMX_TILE(QT_Q8_0, P); break;     \
        case QT_Q4_K: AMX_TILE(QT_Q4_K, P); break;     \
        default: break;                                \
    }

// Between int_dot_amx_begin and int_dot_amx_end on the calling thread: q's rows (padded to
// 16) at P planes (1 or 2) x one group, Q4_0 / Q4_1 / Q8_0 / Q4_K.
void int_dot_amx_tile(int qt, int P, const uint8_t* gw, int64_t nb, const IntRows* q,
                      int64_t rows, int64_t K, float out[][GROUP]) {
    if (P == 1)
        AMX_FOR_FORMAT(1)
    else
        AMX_FOR_FORMAT(2)
}
#else
int tm_int_dot_amx_available(void) { return 0; }
void tm_int_dot_set_amx(int on) { (void)on; }
int int_dot_amx_ready(void) { return 0; }
void int_dot_amx_begin(void) {}
void int_dot_amx_end(void) {}
void int_dot_amx_pad_rows(const IntRows* q, int64_t M, int64_t padded, int64_t K) {
    (void)q, (void)M, (void)padded, (void)K;
}
void int_dot_amx_tile(int qt, int P, const uint8_t* gw, int64_t nb, const IntRows* q,
                      int64_t rows, int64_t K, float out[][GROUP]) {
    (void)qt, (void)P, (void)gw, (void)nb, (void)q, (void)rows, (void)K, (void)out;
}
#endif
