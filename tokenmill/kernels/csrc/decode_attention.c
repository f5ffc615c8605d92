// Decode attention straight from the paged cache (no gather): each query row attends to the
// visible keys of its sequence.
//
// AVX-512 and AVX2 bodies (head sizes 64 and 128), flash-decoding style: a task is one KV
// head's keys in a range of KEY_CHUNK positions, for every query that reads them: the query
// heads sharing the KV head (GQA) and the rows that continue one sequence (a request's
// drafted tokens under speculative decoding: the same blocks, each row one key longer than
// the one before). So each key and value is read once per step, and a long sequence spreads
// over the threads.
// Per query, a chunk leaves its maximum score, exp-sum and unnormalized output; a second
// pass merges the chunks in key order. Chunks sit at fixed key positions, so each row's
// arithmetic is the same whatever else is in the batch and however rows are grouped.
// Inside a chunk: scores a vector width of keys at a time (16 or 8; one vector of products
// per key, summed across lanes by a fixed tree), exp as a polynomial over a vector of scores,
// values accumulated for a few queries per pass. The chunk's records sit in scattered blocks,
// beyond the hardware prefetcher: the bodies fetch them to L2 themselves, FETCH_AHEAD
// positions ahead, spread over the score and value loops so the reads overlap the arithmetic.
//
// Other head sizes, sliding windows and builds without AVX2: one task per (row, head), the
// portable body. decode_attention_f16.c builds this file again for a float16 pool.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "paged_kv.h"
#include "poly_exp.h"
#if (defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))) && !defined(KV_NO_VECTOR)
#include <immintrin.h>
#define CHUNKED_BODY 1  // a vector body for head sizes 64 and 128
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#endif

#define RUN_MAX 8       // rows per run (a decode step has at most 8)
#define QUERIES_MAX 64  // query vectors per task: rows of a run x heads sharing a KV head
#define KEY_CHUNK 256   // key positions per task

// The keys t0 .. t0 + n - 1 of a tile of `width` (the block table walked, not divided, per
// key); the lanes past n repeat the first key (their scores are never stored).
static inline void key_tile(const HeadKeys* a, int64_t t0, int64_t n, int width, const kv_t** kp) {
    int64_t blk = t0 / a->bs, off = t0 % a->bs;
    for (int64_t j = 0; j < n; j++) {
        kp[j] = a->keys + (a->bt[blk] * a->bs + off) * a->rec + a->head_off;
        if (++off == a->bs) off = 0, blk++;
    }
    for (int64_t j = n; j < width; j++) kp[j] = kp[0];
}

#if defined(CHUNKED_BODY)
// The next record the vector bodies fetch to L2: a chunk's keys, then its values.
typedef struct {
    int64_t t, c0, c1, blk, off;  // position, the chunk, its block-table entry and offset
    int64_t to_value;             // a key's record to its value's
    int lines;                    // cache lines of a head's key (or value)
    int values;                   // fetching the values now
} Fetch;
#define FETCH_AHEAD 64  // how many positions ahead of the scores

ALWAYS_INLINE void fetch_next(const HeadKeys* a, Fetch* f) {
    if (f->t == f->c1) {
        if (f->values) return;
        f->values = 1, f->t = f->c0, f->blk = f->c0 / a->bs, f->off = f->c0 % a->bs;
    }
    const char* r = (const char*)(a->keys + (f->values ? f->to_value : 0) +
                                  (a->bt[f->blk] * a->bs + f->off) * a->rec + a->head_off);
    for (int l = 0; l < f->lines; l++) _mm_prefetch(r + 64 * l, _MM_HINT_T1);
    if (++f->off == a->bs) f->off = 0, f->blk++;
    f->t++;
}
#endif

#if defined(__AVX512F__)
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

// One chunk of keys, c0 .. c1 - 1, for the n queries sharing one KV head: query j reads q[j]
// and sees keys up to vis[j] - 1 (vis[j] > c0). Leaves, per query, the chunk's maximum
// score, the sum of exp(score - maximum) and the unnormalized output o[j] (HD floats).
// scores: n x (c1 - c0) floats.
ALWAYS_INLINE void attend_chunk_avx512(const HeadKeys* a, int64_t c0, int64_t c1, int64_t n,
                                       const float* const* q, const int64_t* vis, int HD,
                                       float* scores, float* const* o, float* mx, float* sum) {
    const int V = HD / 16;
    const int64_t cap = c1 - c0;
    const __m512 scale = _mm512_set1_ps(a->scale);
    const int64_t to_value = a->values - a->keys;  // a key's record to its value's
    // Keys and values reach L2 FETCH_AHEAD positions ahead of the scores, their prefetches
    // spread over a query's key loop and the value pass (a burst would stall on the miss
    // buffers while nothing computes), so reading the scattered records overlaps the arithmetic.
    Fetch f = {c0, c0, c1, c0 / a->bs, c0 % a->bs, to_value, HD * (int)sizeof(kv_t) / 64, 0};
    while (f.t < c0 + FETCH_AHEAD && f.t < c1) fetch_next(a, &f);
    const kv_t* kp[16];
    key_tile(a, c0, c1 - c0 < 16 ? c1 - c0 : 16, 16, kp);
    for (int64_t t0 = c0; t0 < c1; t0 += 16) {
        const kv_t* next[16];  // the next tile's keys to L1 while the scores run
        if (t0 + 16 < c1) {
            key_tile(a, t0 + 16, c1 - t0 - 16 < 16 ? c1 - t0 - 16 : 16, 16, next);
            for (int k = 0; k < 16; k++)
                for (int64_t b = 0; b < HD * (int64_t)sizeof(kv_t); b += 64)
                    _mm_prefetch((const char*)next[k] + b, _MM_HINT_T0);
        }
        int fetching = 1;  // the first query that reads the tile fetches a tile further on
        for (int64_t j = 0; j < n; j++) {
            const int64_t visible = vis[j] - t0;  // of this tile's keys
            if (visible <= 0) continue;
            __m512 qv[8], acc[16];
            for (int c = 0; c < V; c++) qv[c] = _mm512_loadu_ps(q[j] + 16 * c);
            for (int k = 0; k < 16; k++) {
                if (fetching) fetch_next(a, &f);
                acc[k] = _mm512_mul_ps(qv[0], KV_LOAD16(kp[k]));
                for (int c = 1; c < V; c++)
                    acc[k] = _mm512_fmadd_ps(qv[c], KV_LOAD16(kp[k] + 16 * c), acc[k]);
            }
            _mm512_mask_storeu_ps(scores + j * cap + (t0 - c0), first_lanes(visible),
                                  _mm512_mul_ps(sum16(acc), scale));
            fetching = 0;
        }
        if (t0 + 16 < c1) memcpy(kp, next, sizeof kp);
    }
    for (int64_t j = 0; j < n; j++) {  // exp(score - max) in place, and their sum
        float* s = scores + j * cap;
        const int64_t len = (vis[j] < c1 ? vis[j] : c1) - c0;
        __m512 m = _mm512_set1_ps(-INFINITY);
        for (int64_t t = 0; t < len; t += 16)
            m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, first_lanes(len - t), s + t));
        mx[j] = _mm512_reduce_max_ps(m);
        const __m512 mj = _mm512_set1_ps(mx[j]);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t t = 0; t < len; t += 16) {
            const __mmask16 k = first_lanes(len - t);
            const __m512 e = poly_exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + t), mj));
            _mm512_mask_storeu_ps(s + t, k, e);
            acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, e));
        }
        sum[j] = _mm512_reduce_add_ps(acc);
    }
    const int P = HD == 64 ? 4 : 2;  // queries per value pass (accumulators in registers)
    for (int64_t j0 = 0; j0 < n; j0 += P) {
        const int64_t m = n - j0 < P ? n - j0 : P;
        int64_t shared = c1, last = c0;  // keys every query of the pass sees; any sees
        for (int64_t j = 0; j < m; j++) {
            const int64_t end = vis[j0 + j] < c1 ? vis[j0 + j] : c1;
            shared = end < shared ? end : shared;
            last = end > last ? end : last;
        }
        __m512 acc[4][8];
        for (int64_t j = 0; j < m; j++)
            for (int c = 0; c < V; c++) acc[j][c] = _mm512_setzero_ps();
        int64_t blk = c0 / a->bs, off = c0 % a->bs;
        for (int64_t t = c0; t < last; t++) {
            const kv_t* vh = a->values + (a->bt[blk] * a->bs + off) * a->rec + a->head_off;
            if (++off == a->bs) off = 0, blk++;
            fetch_next(a, &f);
            __m512 v[8];
            for (int c = 0; c < V; c++) v[c] = KV_LOAD16(vh + 16 * c);
            for (int64_t j = 0; j < m; j++) {
                if (t >= shared && t >= vis[j0 + j]) continue;
                const __m512 p = _mm512_set1_ps(scores[(j0 + j) * cap + (t - c0)]);
                for (int c = 0; c < V; c++) acc[j][c] = _mm512_fmadd_ps(p, v[c], acc[j][c]);
            }
        }
        for (int64_t j = 0; j < m; j++)
            for (int c = 0; c < V; c++) _mm512_storeu_ps(o[j0 + j] + 16 * c, acc[j][c]);
    }
}
#define attend_chunk attend_chunk_avx512

#elif defined(CHUNKED_BODY)
// Lane j of the result: the sum of v[j]'s lanes (a fixed tree of pairwise adds).
ALWAYS_INLINE __m256 sum8(const __m256 v[8]) {
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

static inline __m256i first_lanes8(int64_t n) {  // lanes below n set (a maskload mask)
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 8 ? n : 8)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// attend_chunk_avx512 on 8 lanes: 8 keys per tile, values for up to 2 queries per pass.
ALWAYS_INLINE void attend_chunk_avx2(const HeadKeys* a, int64_t c0, int64_t c1, int64_t n,
                                     const float* const* q, const int64_t* vis, int HD,
                                     float* scores, float* const* o, float* mx, float* sum) {
    const int V = HD / 8;
    const int64_t cap = c1 - c0;
    const __m256 scale = _mm256_set1_ps(a->scale);
    Fetch f = {c0, c0, c1, c0 / a->bs, c0 % a->bs, a->values - a->keys,
               HD * (int)sizeof(kv_t) / 64, 0};  // as attend_chunk_avx512 fetches
    while (f.t < c0 + FETCH_AHEAD && f.t < c1) fetch_next(a, &f);
    for (int64_t t0 = c0; t0 < c1; t0 += 8) {
        const kv_t* kp[8];
        key_tile(a, t0, c1 - t0 < 8 ? c1 - t0 : 8, 8, kp);
        int fetching = 1;
        for (int64_t j = 0; j < n; j++) {
            const int64_t visible = vis[j] - t0;  // of this tile's keys
            if (visible <= 0) continue;
            __m256 acc[8];
            for (int k = 0; k < 8; k++) {
                if (fetching) fetch_next(a, &f);
                acc[k] = _mm256_mul_ps(_mm256_loadu_ps(q[j]), KV_LOAD8(kp[k]));
                for (int c = 1; c < V; c++)
                    acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(q[j] + 8 * c), KV_LOAD8(kp[k] + 8 * c),
                                             acc[k]);
            }
            _mm256_maskstore_ps(scores + j * cap + (t0 - c0), first_lanes8(visible),
                                _mm256_mul_ps(sum8(acc), scale));
            fetching = 0;
        }
    }
    for (int64_t j = 0; j < n; j++) {  // exp(score - max) in place, and their sum
        float* s = scores + j * cap;
        const int64_t len = (vis[j] < c1 ? vis[j] : c1) - c0;
        float m = -INFINITY;
        for (int64_t t = 0; t < len; t++) m = s[t] > m ? s[t] : m;
        mx[j] = m;
        const __m256 mj = _mm256_set1_ps(m);
        __m256 acc = _mm256_setzero_ps();
        for (int64_t t = 0; t < len; t += 8) {
            const __m256i k = first_lanes8(len - t);
            const __m256 e = _mm256_and_ps(
                poly_exp256(_mm256_sub_ps(_mm256_maskload_ps(s + t, k), mj)), _mm256_castsi256_ps(k));
            _mm256_maskstore_ps(s + t, k, e);
            acc = _mm256_add_ps(acc, e);
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, acc);
        sum[j] = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                 ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    }
    for (int64_t j0 = 0; j0 < n; j0 += 2) {  // values: 2 queries per pass
        const int64_t m = n - j0 < 2 ? n - j0 : 2;
        int64_t end[2] = {0, 0}, last = c0;
        for (int64_t j = 0; j < m; j++) {
            end[j] = vis[j0 + j] < c1 ? vis[j0 + j] : c1;
            last = end[j] > last ? end[j] : last;
        }
        for (int half = 0; half < HD / 64; half++) {  // 64 floats of the head at a time
            __m256 acc[2][8];
            for (int64_t j = 0; j < m; j++)
                for (int c = 0; c < 8; c++) acc[j][c] = _mm256_setzero_ps();
            int64_t blk = c0 / a->bs, off = c0 % a->bs;
            for (int64_t t = c0; t < last; t++) {
                const kv_t* vh = a->values + (a->bt[blk] * a->bs + off) * a->rec + a->head_off +
                                 64 * half;
                if (++off == a->bs) off = 0, blk++;
                fetch_next(a, &f);
                for (int64_t j = 0; j < m; j++) {
                    if (t >= end[j]) continue;
                    const __m256 p = _mm256_set1_ps(scores[(j0 + j) * cap + (t - c0)]);
                    for (int c = 0; c < 8; c++)
                        acc[j][c] = _mm256_fmadd_ps(p, KV_LOAD8(vh + 8 * c), acc[j][c]);
                }
            }
            for (int64_t j = 0; j < m; j++)
                for (int c = 0; c < 8; c++)
                    _mm256_storeu_ps(o[j0 + j] + 64 * half + 8 * c, acc[j][c]);
        }
    }
}
#define attend_chunk attend_chunk_avx2
#endif

#if defined(CHUNKED_BODY)
// A task: one run's queries on one KV head (rows x its query heads h0 .. h1 - 1), keys
// c0 .. c1 - 1; its partial results start at `part` (per query: HD floats, max, sum).
typedef struct {
    int64_t b, R, h0, h1, c0, c1, part;
} ChunkTask;

static void decode_chunked(const float* q, const kv_t* kv, const kv_t* vbase,
                                  const int64_t* block_table, const int64_t* seq_lens,
                                  const int64_t* run_start, int64_t runs, int64_t nh, int64_t nkv,
                                  int64_t hd, int64_t bs, int64_t max_blocks, float scale,
                                  float* out, int nthreads) {
    const int64_t G = nh / nkv, rec = nkv * hd;
    const int64_t per_task = G * RUN_MAX <= QUERIES_MAX ? G : QUERIES_MAX / RUN_MAX;
    const int64_t head_chunks = (G + per_task - 1) / per_task;
    int64_t ntasks = 0, nparts = 0;  // count, then fill
    for (int64_t r = 0; r < runs; r++) {
        const int64_t R = run_start[r + 1] - run_start[r], end = seq_lens[run_start[r]] + R - 1;
        ntasks += nkv * head_chunks * ((end + KEY_CHUNK - 1) / KEY_CHUNK);
    }
    ChunkTask* tasks = malloc(sizeof(ChunkTask) * (size_t)ntasks);
    int64_t* groups = malloc(sizeof(int64_t) * (size_t)(runs * nkv * head_chunks + 1));
    int64_t t = 0, ngroups = 0;
    for (int64_t r = 0; r < runs; r++) {
        const int64_t b = run_start[r], R = run_start[r + 1] - b, end = seq_lens[b] + R - 1;
        for (int64_t k = 0; k < nkv; k++)
            for (int64_t hc = 0; hc < head_chunks; hc++) {
                const int64_t h0 = k * G + hc * per_task;
                const int64_t h1 = h0 + per_task < (k + 1) * G ? h0 + per_task : (k + 1) * G;
                groups[ngroups++] = t;  // the group's chunks are consecutive tasks
                for (int64_t c0 = 0; c0 < end; c0 += KEY_CHUNK, t++) {
                    tasks[t] = (ChunkTask){b, R, h0, h1, c0, c0 + KEY_CHUNK < end ? c0 + KEY_CHUNK : end,
                                           nparts};
                    nparts += R * (h1 - h0) * (hd + 2);
                }
            }
    }
    groups[ngroups] = t;
    float* parts = malloc(sizeof(float) * (size_t)nparts);
#pragma omp parallel num_threads(nthreads)
    {
        float* scores = malloc(sizeof(float) * QUERIES_MAX * KEY_CHUNK);
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < ntasks; i++) {
            const ChunkTask* T = tasks + i;
            const HeadKeys a = {kv, vbase, block_table + T->b * max_blocks, bs, rec,
                                (T->h0 / G) * hd, 0, 0, scale};
            const float* qs[QUERIES_MAX];
            float* os[QUERIES_MAX];
            int64_t vis[QUERIES_MAX], n = 0, seen = 0;
            const int64_t heads = T->h1 - T->h0;
            float* mx = parts + T->part + T->R * heads * hd;
            float* sum = mx + T->R * heads;
            for (int64_t row = 0; row < T->R; row++)
                for (int64_t h = T->h0; h < T->h1; h++, n++) {
                    qs[n] = q + ((T->b + row) * nh + h) * hd;
                    os[n] = parts + T->part + n * hd;
                    vis[n] = seq_lens[T->b] + row;
                    mx[n] = -INFINITY, sum[n] = 0.f;  // a query that sees none of the chunk
                    seen += vis[n] > T->c0;
                }
            // queries are in increasing length: those that see the chunk are the last ones
            const int64_t skip = n - seen;
            if (hd == 64)
                attend_chunk(&a, T->c0, T->c1, seen, qs + skip, vis + skip, 64, scores, os + skip,
                             mx + skip, sum + skip);
            else
                attend_chunk(&a, T->c0, T->c1, seen, qs + skip, vis + skip, 128, scores, os + skip,
                             mx + skip, sum + skip);
        }
        free(scores);
        // merge each query's chunks in key order: out = sum_c w_c o_c / sum_c w_c sum_c,
        // w_c = exp(max_c - max)
#pragma omp for schedule(static)
        for (int64_t g = 0; g < ngroups; g++) {
            const ChunkTask* first = tasks + groups[g];
            const int64_t heads = first->h1 - first->h0, n = first->R * heads;
            for (int64_t j = 0; j < n; j++) {
                const int64_t row = j / heads, h = first->h0 + j % heads;
                float m = -INFINITY;
                for (int64_t c = groups[g]; c < groups[g + 1]; c++) {
                    const float* mx = parts + tasks[c].part + n * hd;
                    m = mx[j] > m ? mx[j] : m;
                }
                float acc[128] = {0};
                float total = 0.f;
                for (int64_t c = groups[g]; c < groups[g + 1]; c++) {
                    const float* o = parts + tasks[c].part;
                    const float* mx = o + n * hd;
                    if (mx[j] == -INFINITY) continue;  // the query sees none of this chunk
                    const float w = poly_expf(mx[j] - m);
                    total += w * mx[n + j];
#pragma omp simd
                    for (int64_t d = 0; d < hd; d++) acc[d] += w * o[j * hd + d];
                }
                const float inv = 1.f / total;
                float* oh = out + ((first->b + row) * nh + h) * hd;
#pragma omp simd
                for (int64_t d = 0; d < hd; d++) oh[d] = acc[d] * inv;
            }
        }
    }
    free(parts);
    free(groups);
    free(tasks);
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

// q: [B, nh, hd]; kv: one layer's cache [2, num_blocks, block_size, nkv, hd] (kv_t);
// block_table: [B, max_blocks]; seq_lens: [B] (keys 0..len-1 are visible, minus the
// sliding window when window > 0); out: [B, nh, hd].
void KV_NAME(tm_paged_attention_decode)(const float* q, const kv_t* kv, int64_t num_blocks,
                                        const int64_t* block_table, const int64_t* seq_lens,
                                        int64_t B, int64_t nh, int64_t nkv, int64_t hd, int64_t bs,
                                        int64_t max_blocks, float scale, int64_t window, float* out,
                                        int nthreads) {
    const int64_t G = nh / nkv;
    const int64_t rec = nkv * hd;  // values per token record
    const kv_t* vbase = kv + num_blocks * bs * rec;
#if defined(CHUNKED_BODY)
    if ((hd == 64 || hd == 128) && window <= 0) {
        int64_t* run_start = malloc(sizeof(int64_t) * (size_t)(B + 1));
        int64_t runs = 0;
        for (int64_t b = 0; b < B; b++)
            if (b == 0 || b - run_start[runs - 1] >= RUN_MAX ||
                !continues(block_table, seq_lens, max_blocks, bs, b - 1))
                run_start[runs++] = b;
        run_start[runs] = B;
        decode_chunked(q, kv, vbase, block_table, seq_lens, run_start, runs, nh, nkv, hd, bs,
                       max_blocks, scale, out, nthreads);
        free(run_start);
        return;
    }
#endif
    (void)continues;
#pragma omp parallel num_threads(nthreads)
    {
        int64_t cap = 0;
        float* scores = NULL;  // [n]
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < B * nh; ++task) {
            const int64_t b = task / nh, h = task % nh;
            const int64_t len = seq_lens[b];
            const int64_t start = (window > 0 && len > window) ? len - window : 0;
            if (len - start > cap) {
                free(scores);
                cap = len - start;
                scores = (float*)malloc(sizeof(float) * (size_t)cap);
            }
            const HeadKeys a = {kv, vbase, block_table + b * max_blocks, bs, rec, (h / G) * hd,
                                start, len, scale};
            attend_head(&a, q + (b * nh + h) * hd, hd, scores, out + (b * nh + h) * hd);
        }
        free(scores);
    }
}
