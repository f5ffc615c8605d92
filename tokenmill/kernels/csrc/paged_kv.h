// A sequence's keys and values in the paged KV pool, and the portable attention body the
// decode and prefill kernels share (decode_attention.c, prefill_attention.c).
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "poly_exp.h"

typedef struct {
    const float* keys;    // layer's K records
    const float* values;  // layer's V records
    const int64_t* bt;    // the sequence's block table
    int64_t bs, rec, head_off, start, len;  // keys start..len-1 are visible
    float scale;
} HeadKeys;

static inline const float* key_at(const HeadKeys* a, int64_t t) {
    return a->keys + (a->bt[t / a->bs] * a->bs + t % a->bs) * a->rec + a->head_off;
}

static inline const float* value_at(const HeadKeys* a, int64_t t) {
    return a->values + (a->bt[t / a->bs] * a->bs + t % a->bs) * a->rec + a->head_off;
}

// The portable body: one query head over its visible keys, softmax(q . k * scale) . v.
static void attend_head(const HeadKeys* a, const float* qh, int64_t hd, float* scores, float* oh) {
    float mx = -INFINITY;
    for (int64_t t = a->start; t < a->len; ++t) {
        const float* kh = key_at(a, t);
        float acc = 0.f;
#pragma omp simd reduction(+ : acc)
        for (int64_t d = 0; d < hd; ++d) acc += qh[d] * kh[d];
        scores[t - a->start] = acc * a->scale;
        mx = fmaxf(mx, acc * a->scale);
    }
    const int64_t n = a->len - a->start;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) {
        const float e = poly_expf(scores[i] - mx);
        scores[i] = e;
        sum += e;
    }
    const float inv = 1.f / sum;
    memset(oh, 0, sizeof(float) * (size_t)hd);
    for (int64_t t = a->start; t < a->len; ++t) {
        const float* vh = value_at(a, t);
        const float p = scores[t - a->start] * inv;
#pragma omp simd
        for (int64_t d = 0; d < hd; ++d) oh[d] += p * vh[d];
    }
}
