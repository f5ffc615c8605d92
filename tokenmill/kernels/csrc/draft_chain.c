// A draft head's chain of k drafts in one call: tokenmill/spec/draft_head.py's DraftHead.step,
// its readout through the target's lm_head rows for the draft vocabulary and the argmax,
// repeated with the drafted token fed back. The Python loop ran ~15 torch and ctypes calls
// per draft (~0.45 ms on the embedded model, between the target's forwards); here a draft
// is what its bytes cost (~5 MB of Q8_0 head layers and lm_head rows).
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "poly_exp.h"
#include "projection.h"

void tm_rmsnorm(const float* x, const float* w, int64_t M, int64_t K, float eps, float* out, int nthreads);
void tm_silu_mul(const float* gate_up, int64_t I, float* out);

typedef struct {  // mirrors DraftChainWeights in tokenmill/spec/native_chain.py
    int64_t hidden, intermediate, vocab, draft_vocab;
    float head_eps, target_eps;
    const float* feature_norm;
    const float* embed_norm;
    const float* final_norm;    // the target's
    const float* embed_tokens;  // the target's [vocab, hidden] float32
    const int64_t* draft_vocab_ids;
    Projection fc;       // [hidden, 2 * hidden] + bias
    Projection gate_up;  // [2 * intermediate, hidden]
    Projection down;     // [hidden, intermediate]
    Projection readout;  // the target's lm_head rows for draft_vocab_ids (rows >= draft_vocab)
} DraftChainWeights;

// The head's probability of its pick: softmax over the draft vocabulary at the argmax.
static float pick_probability(const float* logits, int64_t n, float top) {
    float sum = 0.0f;
    for (int64_t v = 0; v < n; v++) sum += poly_expf(logits[v] - top);
    return 1.0f / sum;
}

// feature: [hidden], the target's last hidden state, replaced by the last predicted feature.
// Each draft's probability under the head goes to `probs`; the chain stops before a draft
// whose probability times those before it falls below `min_chain_prob` (no verification row
// would pay for it). Returns how many drafts were written (k or fewer; also fewer where a
// token id is out of range or a readout is not finite).
int64_t tm_draft_chain(const DraftChainWeights* w, float* feature, int64_t token, int64_t k,
                       int64_t* drafts, float* probs, float min_chain_prob, int nthreads) {
    const int64_t H = w->hidden, I = w->intermediate;
    float* x = malloc(sizeof(float) * (size_t)(2 * H));
    float* h = malloc(sizeof(float) * (size_t)H);
    float* gate_up = malloc(sizeof(float) * (size_t)(2 * I));
    float* act = malloc(sizeof(float) * (size_t)I);
    float* logits = malloc(sizeof(float) * (size_t)w->readout.rows);
    int64_t n = 0;
    float chain = 1.0f;
    for (; n < k; n++) {
        if (token < 0 || token >= w->vocab) break;
        tm_rmsnorm(feature, w->feature_norm, 1, H, w->head_eps, x, 1);
        tm_rmsnorm(w->embed_tokens + token * H, w->embed_norm, 1, H, w->head_eps, x + H, 1);
        linear(&w->fc, x, 1, 2 * H, h, 0, nthreads);
        linear(&w->gate_up, h, 1, H, gate_up, 0, nthreads);
        tm_silu_mul(gate_up, I, act);
        linear(&w->down, act, 1, I, h, 1, nthreads);  // h + down(act)
        memcpy(feature, h, sizeof(float) * (size_t)H);
        tm_rmsnorm(h, w->final_norm, 1, H, w->target_eps, x, 1);
        linear(&w->readout, x, 1, H, logits, 0, nthreads);
        int64_t best = -1;
        float top = -INFINITY;
        for (int64_t v = 0; v < w->draft_vocab; v++) {  // first on ties, as torch.argmax
            if (logits[v] > top) {
                top = logits[v];
                best = v;
            }
        }
        if (best < 0 || !isfinite(top)) break;
        const float p = pick_probability(logits, w->draft_vocab, top);
        chain *= p;
        if (chain < min_chain_prob) break;
        token = w->draft_vocab_ids[best];
        drafts[n] = token;
        probs[n] = p;
    }
    free(x);
    free(h);
    free(gate_up);
    free(act);
    free(logits);
    return n;
}
