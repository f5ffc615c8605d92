// Multi-LoRA deltas on the CPU (Punica's segment-grouped SGMV): one call per linear layer
// adds every adapter's delta to its rows, y[rows_s] += (x[rows_s] · A_sᵀ) · B_s, for all
// the step's segments s (an adapter and the batch rows that use it).
//
// Adapter weights are fp16 (half the bytes of float: a step reads every active adapter's
// weights once, so the bytes are the cost), widened to float in registers; sums are float.
// A_s is [R_s, K] row-major. B_s holds, for each module j of the fused layer (q, k, v or
// gate, up), its [w_sj, N_j] block as tiles of TILE columns ([ceil(N_j / TILE)][w_sj][TILE],
// the last tile zero-padded: each tile one contiguous read), the modules back to back.
// Module j writes y's columns [sum N_<j, + N_j) from rank columns [sum w_s<j, + w_sj).
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

#define ROWS 4  // batch rows sharing each weight load

// n fp16 values as float (n a multiple of the vector width in the vector forms).
static inline float half_to_float(uint16_t h) {
#if defined(__F16C__) || defined(__AVX512F__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        int e = -1;
        do {
            ++e;
            man <<= 1;
        } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

#define RANKS 4  // rank rows sharing each activation load
#define AHEAD 1024  // fp16 values read ahead of the loads in each weight row (1 KiB)
#define TILE 32  // B's columns per tile: a module's B is stored tile by tile

// out[r][i] = sum_k a_r[k] * x_i[k] for RANKS rows a_r and ROWS rows x_i, one block of
// float accumulators per pass over K (callers repeat a row to fill a block: constant
// bounds keep the accumulators in registers)
static void shrink_block(const uint16_t* const* a, const float* const* x, int64_t K,
                         float out[RANKS][ROWS]) {
    int64_t k = 0;
    float acc[RANKS][ROWS] = {{0}};
#if defined(__AVX512F__)
    __m512 v[RANKS][ROWS];
    for (int r = 0; r < RANKS; ++r)
        for (int i = 0; i < ROWS; ++i) v[r][i] = _mm512_setzero_ps();
    for (; k + 16 <= K; k += 16) {
        __m512 w[RANKS];
        for (int r = 0; r < RANKS; ++r) __builtin_prefetch(a[r] + k + AHEAD);
        for (int r = 0; r < RANKS; ++r)
            w[r] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(a[r] + k)));
        for (int i = 0; i < ROWS; ++i) {
            __m512 xv = _mm512_loadu_ps(x[i] + k);
            for (int r = 0; r < RANKS; ++r) v[r][i] = _mm512_fmadd_ps(w[r], xv, v[r][i]);
        }
    }
    for (int r = 0; r < RANKS; ++r)
        for (int i = 0; i < ROWS; ++i) acc[r][i] = _mm512_reduce_add_ps(v[r][i]);
#elif defined(__F16C__) && defined(__FMA__)
    for (int i0 = 0; i0 < ROWS; i0 += 2) {  // 16 ymm registers: two activation rows a pass
        __m256 v[RANKS][2];
        for (int r = 0; r < RANKS; ++r) v[r][0] = v[r][1] = _mm256_setzero_ps();
        for (k = 0; k + 8 <= K; k += 8) {
            __m256 w[RANKS];
            for (int r = 0; r < RANKS; ++r) __builtin_prefetch(a[r] + k + AHEAD);
            for (int r = 0; r < RANKS; ++r)
                w[r] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(a[r] + k)));
            for (int i = 0; i < 2; ++i) {
                __m256 xv = _mm256_loadu_ps(x[i0 + i] + k);
                for (int r = 0; r < RANKS; ++r) v[r][i] = _mm256_fmadd_ps(w[r], xv, v[r][i]);
            }
        }
        for (int r = 0; r < RANKS; ++r)
            for (int i = 0; i < 2; ++i) {
                __m128 s = _mm_add_ps(_mm256_castps256_ps128(v[r][i]),
                                      _mm256_extractf128_ps(v[r][i], 1));
                s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                s = _mm_add_ss(s, _mm_movehdup_ps(s));
                acc[r][i0 + i] = _mm_cvtss_f32(s);
            }
    }
#endif
    for (; k < K; ++k)
        for (int r = 0; r < RANKS; ++r) {
            float w = half_to_float(a[r][k]);
            for (int i = 0; i < ROWS; ++i) acc[r][i] += w * x[i][k];
        }
    for (int r = 0; r < RANKS; ++r)
        for (int i = 0; i < ROWS; ++i) out[r][i] = acc[r][i];
}

// y_i[c] += sum_r t_i[r] * b[r, c] for the n <= TILE columns of one tile of b ([w, TILE]
// fp16, contiguous); ROWS rows t_i, of which the first nrows are written
static void expand_tile(const uint16_t* b, int w, int n, const float* const* t, float* const* y,
                        int nrows) {
#if defined(__AVX512F__)
    if (n == TILE) {
        __m512 v[ROWS][2];
        for (int i = 0; i < ROWS; ++i) v[i][0] = v[i][1] = _mm512_setzero_ps();
        for (int r = 0; r < w; ++r) {
            const uint16_t* br = b + r * TILE;
            __builtin_prefetch(br + 2 * w * TILE);  // two tiles on: the next item's reads
            __m512 w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)br));
            __m512 w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(br + 16)));
            for (int i = 0; i < ROWS; ++i) {
                __m512 s = _mm512_set1_ps(t[i][r]);
                v[i][0] = _mm512_fmadd_ps(s, w0, v[i][0]);
                v[i][1] = _mm512_fmadd_ps(s, w1, v[i][1]);
            }
        }
        for (int i = 0; i < ROWS; ++i) {
            if (i >= nrows) break;
            _mm512_storeu_ps(y[i], _mm512_add_ps(_mm512_loadu_ps(y[i]), v[i][0]));
            _mm512_storeu_ps(y[i] + 16, _mm512_add_ps(_mm512_loadu_ps(y[i] + 16), v[i][1]));
        }
        return;
    }
#elif defined(__F16C__) && defined(__FMA__)
    if (n == TILE) {
        for (int h = 0; h < TILE; h += 16) {  // half a tile a pass: 8 accumulators
            __m256 v[ROWS][2];
            for (int i = 0; i < ROWS; ++i) v[i][0] = v[i][1] = _mm256_setzero_ps();
            for (int r = 0; r < w; ++r) {
                const uint16_t* br = b + r * TILE + h;
                __builtin_prefetch(br + 2 * w * TILE);
                __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)br));
                __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(br + 8)));
                for (int i = 0; i < ROWS; ++i) {
                    __m256 s = _mm256_set1_ps(t[i][r]);
                    v[i][0] = _mm256_fmadd_ps(s, w0, v[i][0]);
                    v[i][1] = _mm256_fmadd_ps(s, w1, v[i][1]);
                }
            }
            for (int i = 0; i < ROWS; ++i) {
                if (i >= nrows) break;
                float* yi = y[i] + h;
                _mm256_storeu_ps(yi, _mm256_add_ps(_mm256_loadu_ps(yi), v[i][0]));
                _mm256_storeu_ps(yi + 8, _mm256_add_ps(_mm256_loadu_ps(yi + 8), v[i][1]));
            }
        }
        return;
    }
#endif
    for (int c = 0; c < n; ++c) {
        float acc[ROWS] = {0};
        for (int r = 0; r < w; ++r) {
            float wv = half_to_float(b[r * TILE + c]);
            for (int i = 0; i < nrows; ++i) acc[i] += t[i][r] * wv;
        }
        for (int i = 0; i < nrows; ++i) y[i][c] += acc[i];
    }
}

#define COLS (8 * TILE)  // output columns per expand work item

static inline int64_t tiles(int64_t n) { return (n + TILE - 1) / TILE; }

// x: [*, K] floats (row stride ldx); y: [*, N] floats (row stride ldy), N = sum outs.
// Segment s covers rows[seg_start[s] .. seg_start[s+1]); a[s], b[s] its weights;
// widths[s * J + j] its rank for module j (0: no delta for that module).
void tm_lora_sgmv(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t K, int32_t S,
                  const int32_t* seg_start, const int32_t* rows, const uint16_t* const* a,
                  const uint16_t* const* b, int32_t J, const int32_t* widths,
                  const int32_t* outs, int nthreads) {
    int32_t rmax = 1, nshrink = 0;
    int64_t chunks = 0;
    for (int32_t j = 0; j < J; ++j) chunks += (outs[j] + COLS - 1) / COLS;
    for (int32_t s = 0; s < S; ++s) {
        int32_t r = 0;
        for (int32_t j = 0; j < J; ++j) r += widths[s * J + j];
        rmax = r > rmax ? r : rmax;
    }
    int32_t* item = (int32_t*)malloc(sizeof(int32_t) * 2 * (size_t)(S * ((rmax + RANKS - 1) / RANKS)));
    for (int32_t s = 0; s < S; ++s) {
        int32_t r = 0;
        for (int32_t j = 0; j < J; ++j) r += widths[s * J + j];
        for (int32_t i = 0; i < r; i += RANKS, ++nshrink) item[2 * nshrink] = s, item[2 * nshrink + 1] = i;
    }
    int32_t nexpand = (int32_t)(S * chunks);
    float* t = (float*)calloc((size_t)seg_start[S] * rmax, sizeof(float));  // x · Aᵀ per row
#pragma omp parallel num_threads(nthreads) if ((int64_t)nshrink * RANKS * K > 65536)
    {
        // shrink: RANKS rank rows of one adapter per item, over its rows ROWS at a time
#pragma omp for schedule(static)
        for (int32_t it = 0; it < nshrink; ++it) {
            int32_t s = item[2 * it], r0 = item[2 * it + 1], rank = 0;
            for (int32_t j = 0; j < J; ++j) rank += widths[s * J + j];
            int na = rank - r0 < RANKS ? rank - r0 : RANKS;
            const uint16_t* as[RANKS];
            for (int r = 0; r < RANKS; ++r) as[r] = a[s] + (int64_t)(r0 + (r < na ? r : 0)) * K;
            for (int32_t p = seg_start[s]; p < seg_start[s + 1]; p += ROWS) {
                int nx = seg_start[s + 1] - p < ROWS ? seg_start[s + 1] - p : ROWS;
                const float* xs[ROWS];
                float out[RANKS][ROWS];
                for (int i = 0; i < ROWS; ++i) xs[i] = x + (int64_t)rows[p + (i < nx ? i : 0)] * ldx;
                shrink_block(as, xs, K, out);
                for (int r = 0; r < na; ++r)
                    for (int i = 0; i < nx; ++i) t[(int64_t)(p + i) * rmax + r0 + r] = out[r][i];
            }
        }
        // expand: COLS columns of one module of one adapter per item, tile by tile
#pragma omp for schedule(static)
        for (int32_t it = 0; it < nexpand; ++it) {
            int32_t s = (int32_t)(it / chunks), j = 0, rank0 = 0;
            int64_t rest = it % chunks, col0 = 0, boff = 0;
            for (;; ++j) {
                int64_t nc = (outs[j] + COLS - 1) / COLS;
                if (rest < nc) break;
                rest -= nc;
                rank0 += widths[s * J + j];
                boff += tiles(outs[j]) * TILE * widths[s * J + j];
                col0 += outs[j];
            }
            int w = widths[s * J + j];
            if (w == 0) continue;
            int64_t c1 = (rest + 1) * COLS < outs[j] ? (rest + 1) * COLS : outs[j];
            for (int64_t c = rest * COLS; c < c1; c += TILE) {
                const uint16_t* tile = b[s] + boff + (c / TILE) * TILE * w;
                int n = c1 - c < TILE ? (int)(c1 - c) : TILE;
                for (int32_t p = seg_start[s]; p < seg_start[s + 1]; p += ROWS) {
                    int nr = seg_start[s + 1] - p < ROWS ? seg_start[s + 1] - p : ROWS;
                    const float* ts[ROWS];
                    float* ys[ROWS];
                    for (int i = 0; i < ROWS; ++i) {
                        int q = p + (i < nr ? i : 0);
                        ts[i] = t + (int64_t)q * rmax + rank0;
                        ys[i] = y + (int64_t)rows[q] * ldy + col0 + c;
                    }
                    expand_tile(tile, w, n, ts, ys, nr);
                }
            }
        }
    }
    free(item);
    free(t);
}
