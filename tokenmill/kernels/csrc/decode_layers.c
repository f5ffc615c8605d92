// A decode step's decoder layers in one call: for a batch of single-token rows, each
// layer's RMSNorm -> qkv -> (per-head q/k RMSNorm: Qwen3) -> RoPE -> KV write -> paged
// attention -> o (+ residual) ->
// RMSNorm -> gate_up -> SiLU * up -> down (+ residual), every projection on the
// integer-dot GEMV (int_dot_kernels.c; the GEMM past 32 rows, which gives the same bits). The same kernels the per-layer Python path calls, in
// the same order, without ~15 torch/ctypes calls per layer (about a third of a decode token).
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "poly_exp.h"
#include "projection.h"

void tm_rmsnorm(const float* x, const float* w, int64_t M, int64_t K, float eps, float* out, int nthreads);
void tm_rope_neox(float* x, int64_t T, int64_t row_stride, int64_t nheads, int64_t hd,
                  const int64_t* positions, const float* cos_t, const float* sin_t, int nthreads);
void tm_paged_attention_decode(const float* q, const float* kv, int64_t num_blocks,
                               const int64_t* block_table, const int64_t* seq_lens, int64_t B,
                               int64_t nh, int64_t nkv, int64_t hd, int64_t bs, int64_t max_blocks,
                               float scale, int64_t window, float* out, int nthreads);
void tm_paged_attention_decode_f16(const float* q, const uint16_t* kv, int64_t num_blocks,
                                   const int64_t* block_table, const int64_t* seq_lens, int64_t B,
                                   int64_t nh, int64_t nkv, int64_t hd, int64_t bs,
                                   int64_t max_blocks, float scale, int64_t window, float* out,
                                   int nthreads);
typedef struct {  // the layout mirrors DecodeLayer in tokenmill/model/fused_decode.py
    const float* input_norm;
    const float* post_attn_norm;
    void* kv_cache;  // [2, num_blocks, block_size * nkv * hd]: float32, float16 if kv_half
    Projection qkv, o, gate_up, down;
    const float* q_norm;  // per-head RMSNorm weights of q and k (NULL: none)
    const float* k_norm;
} DecodeLayer;

typedef struct {  // mirrors DecodeDims
    int64_t hidden, heads, kv_heads, head_dim, intermediate, block_size, num_blocks, window;
    int64_t kv_half;  // the pool holds float16 (rounded to nearest even as written)
    float eps, scale;
    const float* cos;
    const float* sin;
} DecodeDims;

typedef struct {  // mirrors DecodeStep: one step's rows
    int64_t rows, max_blocks;
    const int64_t* positions;
    const int64_t* slot_mapping;
    const int64_t* block_table;  // [rows, max_blocks]
    const int64_t* seq_lens;
} DecodeStep;

// out = silu(gate) * up for one row (gate_up: [gate | up], I each), exp as poly_expf: the
// vector lanes and the scalar tail compute the same sequence of operations.
void tm_silu_mul(const float* gate_up, int64_t I, float* out) {
    const float* up = gate_up + I;
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= I; i += 16) {
        const __m512 g = _mm512_loadu_ps(gate_up + i);
        const __m512 e = poly_exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
        const __m512 s = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(s, _mm512_loadu_ps(up + i)));
    }
#elif defined(__AVX2__)
    for (; i + 8 <= I; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate_up + i);
        const __m256 e = poly_exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
        const __m256 s = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
#endif
    for (; i < I; i++) out[i] = gate_up[i] / (1.0f + poly_expf(-gate_up[i])) * up[i];
}

// tm_silu_mul on M rows (threads over rows): the per-layer native path's SiLU, so a row's
// result is the one-call decoder's bit for bit.
void tm_silu_mul_rows(const float* gate_up, int64_t M, int64_t I, float* out, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M > 1)
    for (int64_t m = 0; m < M; m++) tm_silu_mul(gate_up + m * 2 * I, I, out + m * I);
}

// hidden: [rows, hidden], updated in place through every layer.
void tm_decode_layers(const DecodeLayer* layers, int64_t n_layers, const DecodeDims* d,
                      const DecodeStep* step, float* hidden, int nthreads) {
    const int64_t M = step->rows, H = d->hidden, hd = d->head_dim;
    const int64_t q_size = d->heads * hd, kv_size = d->kv_heads * hd, qkv_rows = q_size + 2 * kv_size;
    const int64_t I = d->intermediate, wide = qkv_rows > 2 * I ? qkv_rows : 2 * I;
    float* normed = malloc(sizeof(float) * (size_t)(M * (H > I ? H : I)));
    float* wide_out = malloc(sizeof(float) * (size_t)(M * wide));  // qkv, then gate_up
    float* q = malloc(sizeof(float) * (size_t)(2 * M * q_size));    // queries, then attention out
    float* attn = q + M * q_size;
    for (int64_t l = 0; l < n_layers; l++) {
        const DecodeLayer* L = layers + l;
        tm_rmsnorm(hidden, L->input_norm, M, H, d->eps, normed, nthreads);
        linear(&L->qkv, normed, M, H, wide_out, 0, nthreads);
        if (L->q_norm)  // in place, a head a row: the per-layer path's tm_rmsnorm calls
            for (int64_t m = 0; m < M; m++) {
                float* row = wide_out + m * qkv_rows;
                tm_rmsnorm(row, L->q_norm, d->heads, hd, d->eps, row, 1);
                tm_rmsnorm(row + q_size, L->k_norm, d->kv_heads, hd, d->eps, row + q_size, 1);
            }
        tm_rope_neox(wide_out, M, qkv_rows, d->heads + d->kv_heads, hd, step->positions, d->cos,
                     d->sin, nthreads);
        const int64_t value_off = d->num_blocks * d->block_size * kv_size;
        for (int64_t m = 0; m < M; m++) {
            const float* row = wide_out + m * qkv_rows;
            const int64_t at = step->slot_mapping[m] * kv_size;
            memcpy(q + m * q_size, row, sizeof(float) * (size_t)q_size);
            if (d->kv_half) {
                uint16_t* kv = L->kv_cache;
                floats_to_halves(row + q_size, kv_size, kv + at);
                floats_to_halves(row + q_size + kv_size, kv_size, kv + value_off + at);
            } else {
                float* kv = L->kv_cache;
                memcpy(kv + at, row + q_size, sizeof(float) * (size_t)kv_size);
                memcpy(kv + value_off + at, row + q_size + kv_size, sizeof(float) * (size_t)kv_size);
            }
        }
        if (d->kv_half)
            tm_paged_attention_decode_f16(q, L->kv_cache, d->num_blocks, step->block_table,
                                          step->seq_lens, M, d->heads, d->kv_heads, hd,
                                          d->block_size, step->max_blocks, d->scale, d->window,
                                          attn, nthreads);
        else
            tm_paged_attention_decode(q, L->kv_cache, d->num_blocks, step->block_table,
                                      step->seq_lens, M, d->heads, d->kv_heads, hd, d->block_size,
                                      step->max_blocks, d->scale, d->window, attn, nthreads);
        linear(&L->o, attn, M, q_size, hidden, 1, nthreads);
        tm_rmsnorm(hidden, L->post_attn_norm, M, H, d->eps, normed, nthreads);
        linear(&L->gate_up, normed, M, H, wide_out, 0, nthreads);
        for (int64_t m = 0; m < M; m++) tm_silu_mul(wide_out + m * 2 * I, I, normed + m * I);
        linear(&L->down, normed, M, I, hidden, 1, nthreads);
    }
    free(normed);
    free(wide_out);
    free(q);
}
