// The AMX tile operations the integer-dot GEMM uses (int_dot_amx.c), with one fixed tile
// configuration: two sets (a block each) of an int8 operand of 16 rows x 32 bytes (a 32-value
// block of 16 activation rows: one digit plane), one of 8 rows x 64 bytes (the block's 16
// weight rows, a dword of each per row: the repacked layout), and two int32 accumulators of
// 16 x 16 (one per plane).
//
// Built with TM_AMX_EMULATE, the same operations run in software on a per-thread model of
// the tile registers, which refuses (aborts on) any operand shape the hardware would refuse:
// the kernel's layout and arithmetic are tested on CPUs without AMX (tests build it so).
// Included after int_dot.h.
#pragma once
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define T_C0 0  // the first set: accumulators (int32, 16 x 16) of planes 0 and 1,
#define T_C1 1
#define T_A0 2  // activation digits (int8, 16 x 32 bytes),
#define T_B 4   // weights (int8, 8 x 64 bytes)
#define T_A1 3  // the second set's
#define T_B1 5
#define T_C2 6
#define T_C3 7

#if defined(TM_AMX_EMULATE) || (defined(__AMX_TILE__) && defined(__AMX_INT8__))
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define AMX_BODY 1
#endif
#endif

#if defined(AMX_BODY)
typedef struct {  // LDTILECFG's 64 bytes (palette 1)
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

// The tile shapes, as constant data: LDTILECFG reads them (no stores for the compiler to
// order around it), and the software model checks every operand against them
static const TileConfig amx_config __attribute__((aligned(64))) = {
    .palette = 1,
    .colsb = {64, 64, 32, 32, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 8, 8, 16, 16},
};
_Static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

#if defined(TM_AMX_EMULATE)
typedef struct {
    int configured;
    uint8_t rows[8];
    uint16_t colsb[8];
    int8_t t[8][16][64];
} EmulatedTiles;
static _Thread_local EmulatedTiles emulated;

static inline void amx_configure(void) {
    memset(&emulated, 0, sizeof emulated);
    memcpy(emulated.rows, amx_config.rows, sizeof emulated.rows);
    memcpy(emulated.colsb, amx_config.colsb, sizeof emulated.colsb);
    emulated.configured = 1;
}

static inline void amx_release(void) { emulated.configured = 0; }

static inline void amx_check(int t) {
    if (!emulated.configured || t < 0 || t > 7 || emulated.rows[t] == 0) abort();
}

static inline void amx_load(int t, const void* base, int64_t stride) {
    amx_check(t);
    for (int r = 0; r < emulated.rows[t]; r++)
        memcpy(emulated.t[t][r], (const char*)base + r * stride, emulated.colsb[t]);
}

static inline void amx_store(int t, void* base, int64_t stride) {
    amx_check(t);
    for (int r = 0; r < emulated.rows[t]; r++)
        memcpy((char*)base + r * stride, emulated.t[t][r], emulated.colsb[t]);
}

static inline void amx_zero(int t) {
    amx_check(t);
    memset(emulated.t[t], 0, sizeof emulated.t[t]);
}

// c[m][n] += sum over k of a[m][k] * b[k / 4][4 n + k % 4], signed bytes (TDPBSSD)
static inline void amx_dpbssd(int c, int a, int b) {
    amx_check(c), amx_check(a), amx_check(b);
    const int M = emulated.rows[a], N = emulated.colsb[c] / 4, K = emulated.colsb[a];
    if (emulated.rows[c] != M || emulated.colsb[b] != emulated.colsb[c] || 4 * emulated.rows[b] != K)
        abort();
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            int32_t acc;
            memcpy(&acc, emulated.t[c][m] + 4 * n, 4);
            for (int k = 0; k < K; k++)
                acc += (int32_t)emulated.t[a][m][k] * (int32_t)emulated.t[b][k / 4][4 * n + k % 4];
            memcpy(emulated.t[c][m] + 4 * n, &acc, 4);
        }
}

#define TILE_LOAD(t, base, stride) amx_load(t, base, stride)
#define TILE_STORE(t, base, stride) amx_store(t, base, stride)
#define TILE_ZERO(t) amx_zero(t)
#define TILE_DPBSSD(c, a, b) amx_dpbssd(c, a, b)
#else
#include <immintrin.h>

// gcc's tile loads do not tell the compiler they read memory: a barrier before each keeps
// the operand's stores (the staged weights) ahead of it. The software model cannot show
// this; it reads memory as C does.
#define AMX_BARRIER() __asm__ volatile("" ::: "memory")

static inline void amx_configure(void) { _tile_loadconfig(&amx_config); }

static inline void amx_release(void) { _tile_release(); }

#define TILE_LOAD(t, base, stride)    \
    do {                              \
        AMX_BARRIER();                \
        _tile_loadd(t, base, stride); \
    } while (0)
#define TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_DPBSSD(c, a, b) _tile_dpbssd(c, a, b)
#endif
#endif
