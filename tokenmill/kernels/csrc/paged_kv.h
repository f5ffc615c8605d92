// A sequence's keys and values in the paged KV pool, and the portable attention body the
// decode and prefill kernels share (decode_attention.c, prefill_attention.c).
//
// The pool holds float32 or, where the including file defines KV_F16 (the *_f16.c files),
// float16 records: kv_t, kv_float() and the KV_LOAD16 / KV_LOAD8 vector loads read either,
// and KV_NAME gives the f16 build's exported functions their own names.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "half.h"
#include "poly_exp.h"
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(KV_F16)
typedef uint16_t kv_t;
#define KV_NAME(name) name##_f16
static inline float kv_float(kv_t x) { return half_to_float(x); }
#if defined(__AVX512F__)
#define KV_LOAD16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p)))
#endif
#if defined(__F16C__)
#define KV_LOAD8(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p)))
#else
#define KV_NO_VECTOR 1  // an AVX2 build without F16C: the portable bodies
#endif
#else
typedef float kv_t;
#define KV_NAME(name) name
static inline float kv_float(kv_t x) { return x; }
#define KV_LOAD16(p) _mm512_loadu_ps(p)
#define KV_LOAD8(p) _mm256_loadu_ps(p)
#endif

typedef struct {
    const kv_t* keys;    // layer's K records
    const kv_t* values;  // layer's V records
    const int64_t* bt;    // the sequence's block table
    int64_t bs, rec, head_off, start, len;  // keys start..len-1 are visible
    float scale;
} HeadKeys;

static inline const kv_t* key_at(const HeadKeys* a, int64_t t) {
    return a->keys + (a->bt[t / a->bs] * a->bs + t % a->bs) * a->rec + a->head_off;
}

static inline const kv_t* value_at(const HeadKeys* a, int64_t t) {
    return a->values + (a->bt[t / a->bs] * a->bs + t % a->bs) * a->rec + a->head_off;
}

// The portable body: one query head over its visible keys, softmax(q . k * scale) . v.
static void attend_head(const HeadKeys* a, const float* qh, int64_t hd, float* scores, float* oh) {
    float mx = -INFINITY;
    for (int64_t t = a->start; t < a->len; ++t) {
        const kv_t* kh = key_at(a, t);
        float acc = 0.f;
#pragma omp simd reduction(+ : acc)
        for (int64_t d = 0; d < hd; ++d) acc += qh[d] * kv_float(kh[d]);
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
        const kv_t* vh = value_at(a, t);
        const float p = scores[t - a->start] * inv;
#pragma omp simd
        for (int64_t d = 0; d < hd; ++d) oh[d] += p * kv_float(vh[d]);
    }
}
