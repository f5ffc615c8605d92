// One packed projection as the fused native calls see it (decode_layers.c, draft_chain.c):
// weights regrouped by tm_int_dot_repack, run on the integer-dot GEMV.
#pragma once
#include <stdint.h>

void tm_int_dot_linear(const float* x, int64_t M, int64_t K, const uint8_t* w, int qt, int64_t N,
                       const float* bias, float* y, int accumulate, int bits, int nthreads);
void tm_int_dot_gemm(const float* x, int64_t M, int64_t K, const uint8_t* w, int qt, int64_t N,
                     const float* bias, float* y, int accumulate, int bits, int nthreads);

#define GEMV_MAX_ROWS 8  // more rows run the GEMM (linear.py's INT_DOT_GEMV_MAX_ROWS; same bits)

typedef struct {  // mirrors Projection in tokenmill/model/fused_decode.py
    const uint8_t* weight;
    const float* bias;  // or NULL
    int64_t qtype;
    int64_t rows;
    int64_t bits;  // the activations' precision (KernelConfig's): the per-layer path's
} Projection;

static inline void linear(const Projection* p, const float* x, int64_t M, int64_t K, float* y,
                          int accumulate, int nthreads) {
    (M <= GEMV_MAX_ROWS ? tm_int_dot_linear : tm_int_dot_gemm)(
        x, M, K, p->weight, (int)p->qtype, p->rows, p->bias, y, accumulate, (int)p->bits, nthreads);
}
