// A decode step's decoder layers in one call: for a batch of single-token rows, each
// layer's RMSNorm -> qkv -> (per-head q/k RMSNorm: Qwen3, Gemma 3) -> RoPE (the layer's
// tables, partial: Phi-4) -> KV write -> paged attention (the layer's window) -> o (+ residual) ->
// RMSNorm -> gate_up -> SiLU or GELU (tanh) * up -> down (+ residual); Gemma 3's sandwich
// norms normalize each block's output before its residual add. Every projection on the
// integer-dot GEMV (int_dot_kernels.c; the GEMM past 8 rows, which gives the same bits).
// The same kernels the per-layer Python path calls, in the same order, without ~15
// torch/ctypes calls per layer (about a third of a decode token).
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "poly_exp.h"
#include "projection.h"

#ifndef ALWAYS_INLINE
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#endif

void tm_rmsnorm(const float* x, const float* w, int64_t M, int64_t K, float eps, float* out, int nthreads);
void tm_rope_neox(float* x, int64_t T, int64_t row_stride, int64_t nheads, int64_t hd,
                  int64_t rotary_dim, const int64_t* positions, const float* cos_t,
                  const float* sin_t, int nthreads);
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
    const float* post_attn_norm;  // the MLP's input norm; with sandwich norms the attention's output norm
    void* kv_cache;  // [2, num_blocks, block_size * nkv * hd]: float32, float16 if kv_half
    Projection qkv, o, gate_up, down;
    const float* q_norm;  // per-head RMSNorm weights of q and k (NULL: none)
    const float* k_norm;
    const float* pre_ff_norm;   // sandwich norms (Gemma 3; NULL: none): the MLP's input norm
    const float* post_ff_norm;  // and its output's
    const float* cos;  // the layer's RoPE tables [positions, rotary_dim / 2]
    const float* sin;
    int64_t rotary_dim;  // each head's first rotary_dim dims turn
    int64_t window;      // sliding window (0: none)
    float scale;     // attention scale
    int32_t gelu;    // GELU (tanh) rather than SiLU gates the MLP
} DecodeLayer;

typedef struct {  // mirrors DecodeDims
    int64_t hidden, heads, kv_heads, head_dim, intermediate, block_size, num_blocks;
    int64_t kv_half;  // the pool holds float16 (rounded to nearest even as written)
    float eps;
} DecodeDims;

typedef struct {  // mirrors DecodeStep: one step's rows
    int64_t rows, max_blocks;
    const int64_t* positions;
    const int64_t* slot_mapping;
    const int64_t* block_table;  // [rows, max_blocks]
    const int64_t* seq_lens;
} DecodeStep;

// out = act(gate) * up for one row (gate_up: [gate | up], I each), act(g) = g / (1 + exp(z)):
// SiLU, z = -g; GELU (tanh), 0.5 g (1 + tanh(u)) = g / (1 + exp(-2u)), u = sqrt(2 / pi)
// (g + 0.044715 g^3) (no cancellation near 0). exp as poly_expf: the vector lanes and the
// scalar tail compute the same sequence of operations.
#define GELU_C 0.044715f
#define GELU_MINUS_2K -1.5957691216057308f  // -2 sqrt(2 / pi)
ALWAYS_INLINE void gated_mul(const float* gate_up, int64_t I, float* out, int gelu) {
    const float* up = gate_up + I;
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= I; i += 16) {
        const __m512 g = _mm512_loadu_ps(gate_up + i);
        const __m512 z = gelu ? _mm512_mul_ps(_mm512_fmadd_ps(_mm512_set1_ps(GELU_C),
                                                              _mm512_mul_ps(_mm512_mul_ps(g, g), g), g),
                                              _mm512_set1_ps(GELU_MINUS_2K))
                              : _mm512_sub_ps(_mm512_setzero_ps(), g);
        const __m512 s = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), poly_exp512(z)));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(s, _mm512_loadu_ps(up + i)));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    for (; i + 8 <= I; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate_up + i);
        const __m256 z = gelu ? _mm256_mul_ps(_mm256_fmadd_ps(_mm256_set1_ps(GELU_C),
                                                              _mm256_mul_ps(_mm256_mul_ps(g, g), g), g),
                                              _mm256_set1_ps(GELU_MINUS_2K))
                              : _mm256_sub_ps(_mm256_setzero_ps(), g);
        const __m256 s = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), poly_exp256(z)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
#endif
    for (; i < I; i++) {
        const float g = gate_up[i];
        const float z = gelu ? fmaf(GELU_C, (g * g) * g, g) * GELU_MINUS_2K : -g;
        out[i] = g / (1.0f + poly_expf(z)) * up[i];
    }
}

void tm_silu_mul(const float* gate_up, int64_t I, float* out) { gated_mul(gate_up, I, out, 0); }

void tm_gelu_tanh_mul(const float* gate_up, int64_t I, float* out) { gated_mul(gate_up, I, out, 1); }

// the per-layer native path's SiLU / GELU on M rows (threads over rows), so a row's result
// is the one-call decoder's bit for bit
static void gated_mul_rows(const float* gate_up, int64_t M, int64_t I, float* out, int gelu,
                           int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (M > 1)
    for (int64_t m = 0; m < M; m++)
        (gelu ? tm_gelu_tanh_mul : tm_silu_mul)(gate_up + m * 2 * I, I, out + m * I);
}

void tm_silu_mul_rows(const float* gate_up, int64_t M, int64_t I, float* out, int nthreads) {
    gated_mul_rows(gate_up, M, I, out, 0, nthreads);
}

void tm_gelu_tanh_mul_rows(const float* gate_up, int64_t M, int64_t I, float* out, int nthreads) {
    gated_mul_rows(gate_up, M, I, out, 1, nthreads);
}

// y = rmsnorm(x) * w added to acc, M rows (the sandwich norms' "hidden + norm(block)").
static void add_normed(float* acc, const float* x, const float* w, int64_t M, int64_t H, float eps,
                       float* tmp, int nthreads) {
    tm_rmsnorm(x, w, M, H, eps, tmp, nthreads);
    for (int64_t i = 0; i < M * H; i++) acc[i] += tmp[i];
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
    float* block = malloc(sizeof(float) * (size_t)(2 * M * H));  // a block's output, its norm
    for (int64_t l = 0; l < n_layers; l++) {
        const DecodeLayer* L = layers + l;
        const int sandwich = L->pre_ff_norm != NULL;
        tm_rmsnorm(hidden, L->input_norm, M, H, d->eps, normed, nthreads);
        linear(&L->qkv, normed, M, H, wide_out, 0, nthreads);
        if (L->q_norm)  // in place, a head a row: the per-layer path's tm_rmsnorm calls
            for (int64_t m = 0; m < M; m++) {
                float* row = wide_out + m * qkv_rows;
                tm_rmsnorm(row, L->q_norm, d->heads, hd, d->eps, row, 1);
                tm_rmsnorm(row + q_size, L->k_norm, d->kv_heads, hd, d->eps, row + q_size, 1);
            }
        tm_rope_neox(wide_out, M, qkv_rows, d->heads + d->kv_heads, hd, L->rotary_dim,
                     step->positions, L->cos, L->sin, nthreads);
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
                                          d->block_size, step->max_blocks, L->scale, L->window,
                                          attn, nthreads);
        else
            tm_paged_attention_decode(q, L->kv_cache, d->num_blocks, step->block_table,
                                      step->seq_lens, M, d->heads, d->kv_heads, hd, d->block_size,
                                      step->max_blocks, L->scale, L->window, attn, nthreads);
        if (sandwich) {  // hidden + norm(o(attn)), then the MLP's input norm
            linear(&L->o, attn, M, q_size, block, 0, nthreads);
            add_normed(hidden, block, L->post_attn_norm, M, H, d->eps, block + M * H, nthreads);
            tm_rmsnorm(hidden, L->pre_ff_norm, M, H, d->eps, normed, nthreads);
        } else {
            linear(&L->o, attn, M, q_size, hidden, 1, nthreads);
            tm_rmsnorm(hidden, L->post_attn_norm, M, H, d->eps, normed, nthreads);
        }
        linear(&L->gate_up, normed, M, H, wide_out, 0, nthreads);
        gated_mul_rows(wide_out, M, I, normed, L->gelu, nthreads);
        if (sandwich) {  // hidden + norm(down(...))
            linear(&L->down, normed, M, I, block, 0, nthreads);
            add_normed(hidden, block, L->post_ff_norm, M, H, d->eps, block + M * H, nthreads);
        } else {
            linear(&L->down, normed, M, I, hidden, 1, nthreads);
        }
    }
    free(normed);
    free(wide_out);
    free(q);
    free(block);
}
