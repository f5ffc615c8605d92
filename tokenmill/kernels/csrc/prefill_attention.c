// Prefill attention straight from the paged cache (no gather): the rows of prompt chunks (a
// chunk is a run of consecutive positions of one sequence after its cached context) attend
// causally, within an optional sliding window, to their sequence's keys. Flash-attention
// style, all chunks of a step in one call.
//
// A task is one KV head and a tile of up to QUERY_TILE consecutive positions of one chunk
// (fewer where more than GROUP_MAX query heads share a KV head); its rows are the tile's
// positions times the query heads sharing the KV head (GQA), so each key a task reads serves
// all of them. Keys go in tiles of KEY_TILE positions at fixed multiples of
// KEY_TILE. A task transposes each key tile once (dimension-major: KEY_TILE keys a line), then
// every block of ROWS rows takes the tile's scores as a register-blocked product (ROWS x
// KEY_TILE accumulators over the head dimension), an online-softmax update and the values'
// product. A row's arithmetic depends on its position alone: not on the chunk it came in nor
// on the rows beside it.
//
// AVX-512 (16 lanes) and AVX2 (8 lanes) share the vector body (head sizes a multiple of the
// lanes); other builds and head sizes: the portable body, a row at a time.
// prefill_attention_f16.c builds this file again for a float16 pool.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "paged_kv.h"
#include "poly_exp.h"
#if (defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))) && !defined(KV_NO_VECTOR)
#include <immintrin.h>
#define VECTOR_BODY 1
#endif
#define ALWAYS_INLINE static inline __attribute__((always_inline))

#define QUERY_TILE 32  // positions per task
#define GROUP_MAX 16   // query heads per KV head a task takes QUERY_TILE positions of

// The keys position p sees: lo .. p.
static inline int64_t first_key(int64_t p, int64_t window) {
    return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
}

#if defined(VECTOR_BODY)
#if defined(__AVX512F__)
#define W 16
#define ROWS 8  // score accumulators: ROWS x 2 vectors of 32
typedef __m512 vf;
#define VLOAD _mm512_loadu_ps
#define VLOAD_KV KV_LOAD16
#define VSTORE _mm512_storeu_ps
#define VSET1 _mm512_set1_ps
#define VFMA _mm512_fmadd_ps
#define VMUL _mm512_mul_ps
#define VSUB _mm512_sub_ps
#define VMAX _mm512_max_ps
#define VADD _mm512_add_ps
#define VEXP poly_exp512
ALWAYS_INLINE float vmax_all(vf v) { return _mm512_reduce_max_ps(v); }
ALWAYS_INLINE float vsum_all(vf v) { return _mm512_reduce_add_ps(v); }
// p where s is a score (finite), 0 where s is -inf (a masked key: exactly 0, never exp(-87))
ALWAYS_INLINE vf keep_seen(vf p, vf s) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s, VSET1(-INFINITY), _CMP_NEQ_OQ), p);
}
#define VUNPACKLO _mm512_unpacklo_ps
#define VUNPACKHI _mm512_unpackhi_ps
#define VSHUFFLE _mm512_shuffle_ps
// transpose()'s last stages: the 4 x 4 blocks moved across the four 128-bit lanes.
ALWAYS_INLINE void cross_lanes(vf r[W]) {
    vf t[W];
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 4; k++) {
            t[8 * i + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0x88);
            t[8 * i + 4 + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0xDD);
        }
    for (int k = 0; k < 8; k++) {
        r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
        r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xDD);
    }
}
#else
#define W 8
#define ROWS 4  // score accumulators: ROWS x 2 vectors of 16
typedef __m256 vf;
#define VLOAD _mm256_loadu_ps
#define VLOAD_KV KV_LOAD8
#define VSTORE _mm256_storeu_ps
#define VSET1 _mm256_set1_ps
#define VFMA _mm256_fmadd_ps
#define VMUL _mm256_mul_ps
#define VSUB _mm256_sub_ps
#define VMAX _mm256_max_ps
#define VADD _mm256_add_ps
#define VEXP poly_exp256
ALWAYS_INLINE float vmax_all(vf v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
ALWAYS_INLINE float vsum_all(vf v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
ALWAYS_INLINE vf keep_seen(vf p, vf s) {
    return _mm256_and_ps(p, _mm256_cmp_ps(s, VSET1(-INFINITY), _CMP_NEQ_OQ));
}
#define VUNPACKLO _mm256_unpacklo_ps
#define VUNPACKHI _mm256_unpackhi_ps
#define VSHUFFLE _mm256_shuffle_ps
// transpose()'s last stage: the 4 x 4 blocks moved across the two 128-bit lanes.
ALWAYS_INLINE void cross_lanes(vf r[W]) {
    vf t[W];
    for (int k = 0; k < 4; k++) {
        t[k] = _mm256_permute2f128_ps(r[k], r[k + 4], 0x20);
        t[k + 4] = _mm256_permute2f128_ps(r[k], r[k + 4], 0x31);
    }
    for (int k = 0; k < W; k++) r[k] = t[k];
}
#endif
#define KEY_TILE (2 * W)
#define TASK_ROWS (QUERY_TILE * GROUP_MAX + ROWS)  // a task's rows, padded to whole blocks

// r[i] <- lane i of every r[j], a W x W transpose in registers: 4 x 4 blocks within each
// 128-bit lane, then across the lanes.
ALWAYS_INLINE void transpose(vf r[W]) {
    vf t[W];
    for (int i = 0; i < W / 2; i++) {
        t[2 * i] = VUNPACKLO(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = VUNPACKHI(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < W / 4; i++) {
        r[4 * i] = VSHUFFLE(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * i + 1] = VSHUFFLE(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[4 * i + 2] = VSHUFFLE(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * i + 3] = VSHUFFLE(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    cross_lanes(r);
}

// kt[d][j] = key j's dimension d (kt: [hd][KEY_TILE]), W x W blocks transposed in registers
// (a float16 pool's values widened exactly on the load).
ALWAYS_INLINE void transpose_keys(const kv_t* const* kp, int64_t hd, float* kt) {
    for (int j0 = 0; j0 < KEY_TILE; j0 += W)
        for (int64_t d0 = 0; d0 < hd; d0 += W) {
            vf r[W];
            for (int i = 0; i < W; i++) r[i] = VLOAD_KV(kp[j0 + i] + d0);
            transpose(r);
            for (int i = 0; i < W; i++) VSTORE(kt + (d0 + i) * KEY_TILE + j0, r[i]);
        }
}

// s[r][j] = scale * q_r . key j of the tile, for ROWS rows (kt: [hd][KEY_TILE]).
ALWAYS_INLINE void tile_scores(const float* const* q, const float* kt, int64_t hd, float scale,
                               float* s) {
    vf a0[ROWS], a1[ROWS];
    for (int r = 0; r < ROWS; r++) a0[r] = VSET1(0.f), a1[r] = VSET1(0.f);
    for (int64_t d = 0; d < hd; d++) {
        const vf k0 = VLOAD(kt + d * KEY_TILE), k1 = VLOAD(kt + d * KEY_TILE + W);
#pragma GCC unroll 8
        for (int r = 0; r < ROWS; r++) {
            const vf b = VSET1(q[r][d]);
            a0[r] = VFMA(b, k0, a0[r]);
            a1[r] = VFMA(b, k1, a1[r]);
        }
    }
    const vf sc = VSET1(scale);
    for (int r = 0; r < ROWS; r++) {
        VSTORE(s + r * KEY_TILE, VMUL(a0[r], sc));
        VSTORE(s + r * KEY_TILE + W, VMUL(a1[r], sc));
    }
}

// o_r = alpha_r o_r + sum_j p[r][j] v_j on NV vectors of the head dimension from d0, NR rows.
ALWAYS_INLINE void tile_values(int NR, int NV, float* const* o, const float* p, const float* alpha,
                               const kv_t* const* v, int64_t d0) {
    vf acc[ROWS / 2][4];
    for (int r = 0; r < NR; r++) {
        const vf a = VSET1(alpha[r]);
        for (int i = 0; i < NV; i++) acc[r][i] = VMUL(VLOAD(o[r] + d0 + i * W), a);
    }
    for (int j = 0; j < KEY_TILE; j++) {
        vf x[4];
        for (int i = 0; i < NV; i++) x[i] = VLOAD_KV(v[j] + d0 + i * W);
        for (int r = 0; r < NR; r++) {
            const vf b = VSET1(p[r * KEY_TILE + j]);
            for (int i = 0; i < NV; i++) acc[r][i] = VFMA(b, x[i], acc[r][i]);
        }
    }
    for (int r = 0; r < NR; r++)
        for (int i = 0; i < NV; i++) VSTORE(o[r] + d0 + i * W, acc[r][i]);
}

// One block of ROWS rows over one key tile (keys t0 ..): scores, mask, online softmax, values.
// m, l: the rows' running maximum and exp-sum; pos: their positions (lo: first visible keys).
static void block_tile(const float* const* q, float* const* o, const int64_t* pos,
                       const int64_t* lo, float* m, float* l, const float* kt,
                       const kv_t* const* v, int64_t t0, int64_t hd, float scale, float* s) {
    tile_scores(q, kt, hd, scale, s);
    float alpha[ROWS];
    for (int r = 0; r < ROWS; r++) {
        float* sr = s + r * KEY_TILE;
        if (t0 < lo[r] || t0 + KEY_TILE - 1 > pos[r])  // the tile is partly hidden from the row
            for (int j = 0; j < KEY_TILE; j++)
                if (t0 + j < lo[r] || t0 + j > pos[r]) sr[j] = -INFINITY;
        const vf s0 = VLOAD(sr), s1 = VLOAD(sr + W);
        const float mx = vmax_all(VMAX(s0, s1));
        if (mx == -INFINITY) {  // sees none of the tile
            alpha[r] = 1.f;
            memset(sr, 0, sizeof(float) * KEY_TILE);
            continue;
        }
        const float mnew = m[r] > mx ? m[r] : mx;
        alpha[r] = m[r] == -INFINITY ? 0.f : poly_expf(m[r] - mnew);
        const vf mv = VSET1(mnew);
        const vf p0 = keep_seen(VEXP(VSUB(s0, mv)), s0), p1 = keep_seen(VEXP(VSUB(s1, mv)), s1);
        VSTORE(sr, p0), VSTORE(sr + W, p1);
        l[r] = l[r] * alpha[r] + vsum_all(VADD(p0, p1));
        m[r] = mnew;
    }
    for (int r0 = 0; r0 < ROWS; r0 += ROWS / 2) {
        int64_t d0 = 0;
        for (; d0 + 4 * W <= hd; d0 += 4 * W)
            tile_values(ROWS / 2, 4, o + r0, s + r0 * KEY_TILE, alpha + r0, v, d0);
        for (; d0 < hd; d0 += W) tile_values(ROWS / 2, 1, o + r0, s + r0 * KEY_TILE, alpha + r0, v, d0);
    }
}

typedef struct {
    float *kt, *s, *o, *m, *l, *zero;  // per thread (zero: hd floats, also read as kv_t)
} Scratch;

// The rows of positions p0 .. p0 + n - 1 of one chunk (queries of the G heads sharing the KV
// head kh, row i * G + g) over their visible keys; out rows as q's.
static void attend_tile(const HeadKeys* a, const float* q, int64_t q_stride, float* out,
                        int64_t out_stride, int64_t p0, int64_t n, int64_t G, int64_t kh,
                        int64_t window, int64_t hd, float scale, Scratch* w) {
    const int64_t R = n * G, blocks = (R + ROWS - 1) / ROWS;
    const float* qr[TASK_ROWS];
    float* orow[TASK_ROWS];
    int64_t pos[TASK_ROWS], lo[TASK_ROWS];
    for (int64_t r = 0; r < blocks * ROWS; r++) {
        const int64_t i = r < R ? r / G : n - 1, g = r < R ? r % G : G - 1;
        qr[r] = r < R ? q + i * q_stride + (kh * G + g) * hd : w->zero;
        orow[r] = w->o + r * hd;
        pos[r] = p0 + i;
        lo[r] = first_key(p0 + i, window);
        w->m[r] = -INFINITY, w->l[r] = 0.f;
    }
    memset(w->o, 0, sizeof(float) * (size_t)(blocks * ROWS * hd));
    const int64_t last = p0 + n - 1, start = first_key(p0, window) / KEY_TILE * KEY_TILE;
    const kv_t *kp[KEY_TILE], *vp[KEY_TILE];
    const kv_t* zero = (const kv_t*)w->zero;
    for (int64_t t0 = start; t0 <= last; t0 += KEY_TILE) {
        for (int j = 0; j < KEY_TILE; j++) {  // keys past the rows' last are zeros
            const int64_t t = t0 + j;
            kp[j] = t <= last ? key_at(a, t) : zero;
            vp[j] = t <= last ? value_at(a, t) : zero;
        }
        transpose_keys(kp, hd, w->kt);
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t r0 = b * ROWS;
            if (t0 > pos[r0 + ROWS - 1] || t0 + KEY_TILE - 1 < lo[r0]) continue;
            block_tile(qr + r0, orow + r0, pos + r0, lo + r0, w->m + r0, w->l + r0, w->kt, vp,
                       t0, hd, scale, w->s);
        }
    }
    for (int64_t r = 0; r < R; r++) {
        const float inv = 1.f / w->l[r];
        float* dst = out + (r / G) * out_stride + (kh * G + r % G) * hd;
        for (int64_t d = 0; d < hd; d++) dst[d] = w->o[r * hd + d] * inv;
    }
}
#endif

// q: rows [T, nh, hd] at q_stride floats apart; kv: one layer's cache [2, num_blocks,
// block_size, nkv, hd] (kv_t), the chunks' own keys already in it; chunk c: rows query_start[c] ..
// query_start[c + 1] - 1 at positions ending at context_lens[c] - 1, blocks block_table[c];
// window > 0: a row sees its last `window` keys only. out: [T, nh, hd] (rows of no chunk are
// left as they are).
void KV_NAME(tm_paged_attention_prefill)(const float* q, int64_t q_stride, const kv_t* kv,
                                         int64_t num_blocks, const int64_t* block_table,
                                         int64_t max_blocks, const int64_t* query_start,
                                         const int64_t* context_lens, int64_t C, int64_t nh,
                                         int64_t nkv, int64_t hd, int64_t bs, float scale,
                                         int64_t window, float* out, int nthreads) {
    const int64_t G = nh / nkv, rec = nkv * hd;
    // positions per task: a task's rows (positions x G) stay within QUERY_TILE * GROUP_MAX
    const int64_t tile = G <= GROUP_MAX ? QUERY_TILE
                       : G < QUERY_TILE * GROUP_MAX ? QUERY_TILE * GROUP_MAX / G : 1;
    const kv_t* vbase = kv + num_blocks * bs * rec;
    // tasks: (chunk, tile, KV head), the longest rows first (dynamic scheduling)
    int64_t ntasks = 0;
    for (int64_t c = 0; c < C; c++)
        ntasks += nkv * ((query_start[c + 1] - query_start[c] + tile - 1) / tile);
    int64_t* tasks = malloc(sizeof(int64_t) * 3 * (size_t)(ntasks + 1));
    int64_t t = 0;
    for (int64_t c = 0; c < C; c++) {
        const int64_t n = query_start[c + 1] - query_start[c];
        for (int64_t i0 = (n - 1) / tile * tile; i0 >= 0; i0 -= tile)
            for (int64_t h = 0; h < nkv; h++) tasks[3 * t] = c, tasks[3 * t + 1] = i0, tasks[3 * t + 2] = h, t++;
    }
    int64_t max_ctx = 0;
    for (int64_t c = 0; c < C; c++) max_ctx = context_lens[c] > max_ctx ? context_lens[c] : max_ctx;
#if defined(VECTOR_BODY)
    const int vector = hd % W == 0 && G <= QUERY_TILE * GROUP_MAX;
#else
    const int vector = 0;
#endif
#pragma omp parallel num_threads(nthreads)
    {
#if defined(VECTOR_BODY)
        const int64_t rows = ((tile * G + ROWS - 1) / ROWS) * ROWS;
        Scratch w = {0};
        float* buf = NULL;
        if (vector) {
            buf = malloc(sizeof(float) * (size_t)(hd * KEY_TILE + ROWS * KEY_TILE + rows * hd + 2 * rows + hd));
            w.kt = buf, w.s = w.kt + hd * KEY_TILE, w.o = w.s + ROWS * KEY_TILE;
            w.m = w.o + rows * hd, w.l = w.m + rows, w.zero = w.l + rows;
            memset(w.zero, 0, sizeof(float) * (size_t)hd);
        }
#endif
        float* scores = vector ? NULL : malloc(sizeof(float) * (size_t)(max_ctx + 1));
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < ntasks; i++) {
            const int64_t c = tasks[3 * i], i0 = tasks[3 * i + 1], kh = tasks[3 * i + 2];
            const int64_t n0 = query_start[c + 1] - query_start[c];
            const int64_t n = n0 - i0 < tile ? n0 - i0 : tile;
            const int64_t p0 = context_lens[c] - n0 + i0, row = query_start[c] + i0;
            HeadKeys a = {kv, vbase, block_table + c * max_blocks, bs, rec, kh * hd, 0, 0, scale};
#if defined(VECTOR_BODY)
            if (vector) {
                attend_tile(&a, q + row * q_stride, q_stride, out + row * nh * hd, nh * hd, p0, n,
                            G, kh, window, hd, scale, &w);
                continue;
            }
#endif
            for (int64_t j = 0; j < n; j++) {  // the portable body, a row at a time
                a.start = first_key(p0 + j, window), a.len = p0 + j + 1;
                for (int64_t g = 0; g < G; g++) {
                    const int64_t h = kh * G + g;
                    attend_head(&a, q + (row + j) * q_stride + h * hd, hd, scores,
                                out + ((row + j) * nh + h) * hd);
                }
            }
        }
#if defined(VECTOR_BODY)
        free(buf);
#endif
        free(scores);
    }
    free(tasks);
}
