// Decode attention straight from the paged cache (no gather): each query row attends to the
// visible keys of its sequence.
//
// Rows that continue one sequence (a request's drafted tokens under speculative decoding:
// the same blocks, each row one key longer than the one before) run as one task per query
// head, so each key and value is read once for all of them instead of once per row. Each
// row's arithmetic is the same however the rows are grouped: results do not depend on what
// else is in the batch.
//
// AVX-512 bodies for head sizes 64 and 128: scores 16 keys at a time (one vector of dot
// products per key, summed across lanes by a fixed tree), exp as a polynomial over 16
// scores, values accumulated for up to 4 rows per pass. Other sizes and builds: one task
// per (row, head) with the portable body.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define RUN_MAX 8  // rows per run (a decode step has at most 8)

typedef struct {
    const float* keys;    // layer's K records
    const float* values;  // layer's V records
    const int64_t* bt;    // the sequence's block table
    int64_t bs, rec, head_off, start, len;  // keys start..len-1 are visible to the first row
    float scale;
} HeadKeys;

static inline const float* key_at(const HeadKeys* a, int64_t t) {
    return a->keys + (a->bt[t / a->bs] * a->bs + t % a->bs) * a->rec + a->head_off;
}

static inline const float* value_at(const HeadKeys* a, int64_t t) {
    return a->values + (a->bt[t / a->bs] * a->bs + t % a->bs) * a->rec + a->head_off;
}

// exp(x) by Cody-Waite range reduction and a degree-6 polynomial (relative error ~2e-7 over
// [-87, 88]); the portable body and the vector one compute the same sequence.
static inline float poly_expf(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = nearbyintf(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union {
        int32_t i;
        float f;
    } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
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

#if defined(__AVX512F__)
#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE __m512 exp512(__m512 x) {  // poly_expf on 16 lanes
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

// Lane j of the result: the sum of v[j]'s lanes (a fixed tree: halves, quarters, ...).
ALWAYS_INLINE __m512 sum16(__m512 v[16]) {
    const __m512i lo1 = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    const __m512i hi1 = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    const __m512i lo2 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    const __m512i hi2 = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    const __m512i lo3 = _mm512_setr_epi32(0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
    const __m512i hi3 = _mm512_setr_epi32(2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    const __m512i lo4 = _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    const __m512i hi4 = _mm512_setr_epi32(1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    // keys k and k + 8: lanes 0-7 hold key k's 8 partial sums, lanes 8-15 key k + 8's
    for (int k = 0; k < 8; k++)
        v[k] = _mm512_add_ps(_mm512_permutex2var_ps(v[k], lo1, v[k + 8]),
                             _mm512_permutex2var_ps(v[k], hi1, v[k + 8]));
    // 4 partials each: lanes 4g..4g+3 hold key k + 4g
    for (int k = 0; k < 4; k++)
        v[k] = _mm512_add_ps(_mm512_permutex2var_ps(v[k], lo2, v[k + 4]),
                             _mm512_permutex2var_ps(v[k], hi2, v[k + 4]));
    // 2 partials each: lanes 2g, 2g+1 hold key k + 2g
    for (int k = 0; k < 2; k++)
        v[k] = _mm512_add_ps(_mm512_permutex2var_ps(v[k], lo3, v[k + 2]),
                             _mm512_permutex2var_ps(v[k], hi3, v[k + 2]));
    return _mm512_add_ps(_mm512_permutex2var_ps(v[0], lo4, v[1]),
                         _mm512_permutex2var_ps(v[0], hi4, v[1]));
}

static inline __mmask16 first_lanes(int64_t n) {
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

// R rows continuing one sequence: row i sees keys start .. len + i - 1 (a->len is row 0's).
// q rows q0 + i * q_stride, outputs out0 + i * out_stride; scores: R x cap floats.
ALWAYS_INLINE void attend_run_avx512(const HeadKeys* a, int64_t R, const float* q0,
                                     int64_t q_stride, int HD, float* scores, int64_t cap,
                                     float* out0, int64_t out_stride) {
    const int V = HD / 16;
    const int64_t start = a->start, end = a->len + R - 1;
    const __m512 scale = _mm512_set1_ps(a->scale);
    for (int64_t t0 = start; t0 < end; t0 += 16) {
        const int64_t nt = end - t0 < 16 ? end - t0 : 16;
        const float* kp[16];
        int64_t blk = t0 / a->bs, off = t0 % a->bs;  // walked, not divided, per key
        for (int j = 0; j < nt; j++) {
            kp[j] = a->keys + (a->bt[blk] * a->bs + off) * a->rec + a->head_off;
            if (++off == a->bs) off = 0, blk++;
        }
        for (int64_t j = nt; j < 16; j++) kp[j] = kp[0];
        for (int64_t i = 0; i < R; i++) {
            const int64_t visible = a->len + i - t0;  // of this tile's keys
            if (visible <= 0) continue;
            const float* qi = q0 + i * q_stride;
            __m512 q[8], acc[16];
            for (int c = 0; c < V; c++) q[c] = _mm512_loadu_ps(qi + 16 * c);
            for (int j = 0; j < 16; j++) {
                acc[j] = _mm512_mul_ps(q[0], _mm512_loadu_ps(kp[j]));
                for (int c = 1; c < V; c++)
                    acc[j] = _mm512_fmadd_ps(q[c], _mm512_loadu_ps(kp[j] + 16 * c), acc[j]);
            }
            _mm512_mask_storeu_ps(scores + i * cap + (t0 - start), first_lanes(visible),
                                  _mm512_mul_ps(sum16(acc), scale));
        }
    }
    float inv[RUN_MAX];
    for (int64_t i = 0; i < R; i++) {
        float* s = scores + i * cap;
        const int64_t n = a->len + i - start;
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int64_t t = 0; t < n; t += 16)
            mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(mx, first_lanes(n - t), s + t));
        const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
        __m512 sum = _mm512_setzero_ps();
        for (int64_t t = 0; t < n; t += 16) {
            const __mmask16 k = first_lanes(n - t);
            const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + t), m));
            _mm512_mask_storeu_ps(s + t, k, e);
            sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, e));
        }
        inv[i] = 1.f / _mm512_reduce_add_ps(sum);
    }
    const int G = HD == 64 ? 4 : 2;  // rows per value pass (accumulators in registers)
    for (int64_t g0 = 0; g0 < R; g0 += G) {
        const int64_t rows = R - g0 < G ? R - g0 : G;
        __m512 o[4][8];
        for (int64_t i = 0; i < rows; i++)
            for (int c = 0; c < V; c++) o[i][c] = _mm512_setzero_ps();
        const int64_t shared_end = a->len + g0;  // keys every row of the pass sees
        int64_t blk = start / a->bs, off = start % a->bs;
        for (int64_t t = start; t < shared_end + rows - 1; t++) {
            const float* vh = a->values + (a->bt[blk] * a->bs + off) * a->rec + a->head_off;
            if (++off == a->bs) off = 0, blk++;
            __m512 v[8];
            for (int c = 0; c < V; c++) v[c] = _mm512_loadu_ps(vh + 16 * c);
            for (int64_t i = 0; i < rows; i++) {
                if (t >= shared_end + i) continue;
                const __m512 p = _mm512_set1_ps(scores[(g0 + i) * cap + (t - start)]);
                for (int c = 0; c < V; c++) o[i][c] = _mm512_fmadd_ps(p, v[c], o[i][c]);
            }
        }
        for (int64_t i = 0; i < rows; i++) {
            float* oh = out0 + (g0 + i) * out_stride;
            const __m512 w = _mm512_set1_ps(inv[g0 + i]);
            for (int c = 0; c < V; c++) _mm512_storeu_ps(oh + 16 * c, _mm512_mul_ps(o[i][c], w));
        }
    }
}
#endif

// Rows b and b + 1 continue one sequence: one key longer, the same blocks for every key.
static int continues(const int64_t* block_table, const int64_t* seq_lens, int64_t max_blocks,
                     int64_t bs, int64_t b) {
    if (seq_lens[b + 1] != seq_lens[b] + 1) return 0;
    const int64_t used = (seq_lens[b + 1] + bs - 1) / bs;
    return memcmp(block_table + b * max_blocks, block_table + (b + 1) * max_blocks,
                  sizeof(int64_t) * (size_t)used) == 0;
}

// q: [B, nh, hd]; kv: one layer's cache [2, num_blocks, block_size, nkv, hd];
// block_table: [B, max_blocks]; seq_lens: [B] (keys 0..len-1 are visible, minus the
// sliding window when window > 0); out: [B, nh, hd]. Tasks: (run of rows, query head).
void tm_paged_attention_decode(const float* q, const float* kv, int64_t num_blocks,
                               const int64_t* block_table, const int64_t* seq_lens, int64_t B,
                               int64_t nh, int64_t nkv, int64_t hd, int64_t bs, int64_t max_blocks,
                               float scale, int64_t window, float* out, int nthreads) {
    const int64_t G = nh / nkv;
    const int64_t rec = nkv * hd;  // floats per token record
    const float* vbase = kv + num_blocks * bs * rec;
    int runs = 0;
    const int vector_body = (hd == 64 || hd == 128) && window <= 0;
#if !defined(__AVX512F__)
    (void)vector_body;
#endif
    int64_t* run_start = malloc(sizeof(int64_t) * (size_t)(B + 1));
    for (int64_t b = 0; b < B; b++) {
#if defined(__AVX512F__)
        if (vector_body && b > 0 && b - run_start[runs - 1] < RUN_MAX &&
            continues(block_table, seq_lens, max_blocks, bs, b - 1))
            continue;
#endif
        run_start[runs++] = b;
    }
    run_start[runs] = B;
    (void)continues;
#pragma omp parallel num_threads(nthreads)
    {
        int64_t cap = 0;
        float* scores = NULL;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < runs * nh; ++task) {
            const int64_t r = task / nh, h = task % nh;
            const int64_t b = run_start[r], R = run_start[r + 1] - b;
            const int64_t len = seq_lens[b];
            const int64_t start = (window > 0 && len > window) ? len - window : 0;
            const int64_t need = R * (len + R - 1 - start);
            if (need > cap) {
                free(scores);
                cap = need;
                scores = (float*)malloc(sizeof(float) * (size_t)cap);
            }
            const HeadKeys a = {kv, vbase, block_table + b * max_blocks, bs, rec, (h / G) * hd,
                                start, len, scale};
            const float* qh = q + (b * nh + h) * hd;
            float* oh = out + (b * nh + h) * hd;
#if defined(__AVX512F__)
            if (vector_body) {
                const int64_t row_cap = len + R - 1 - start;
                if (hd == 64)
                    attend_run_avx512(&a, R, qh, nh * hd, 64, scores, row_cap, oh, nh * hd);
                else
                    attend_run_avx512(&a, R, qh, nh * hd, 128, scores, row_cap, oh, nh * hd);
                continue;
            }
#endif
            attend_head(&a, qh, hd, scores, oh);  // runs are single rows here
        }
        free(scores);
    }
    free(run_start);
}
