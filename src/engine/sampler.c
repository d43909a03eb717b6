// Minimal host sampler (greedy / temperature) until the full sampler lands.
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>

#include "util/util.h"

struct sampler {
    struct sampler_params p;
    int vocab;
    uint64_t rng;
};

struct sampler_params sampler_defaults(void) {
    return (struct sampler_params){
        .temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f, .n_logprobs = -1};
}

struct sampler *sampler_new(const struct sampler_params *p, int vocab, const int32_t *history,
                            int n_history) {
    (void)history;
    (void)n_history;
    struct sampler *s = xcalloc(1, sizeof *s);
    s->p = *p;
    s->vocab = p->n_vocab > 0 && p->n_vocab < vocab ? p->n_vocab : vocab;
    s->rng = p->seed * 0x9e3779b97f4a7c15ull + 1;
    return s;
}

void sampler_free(struct sampler *s) {
    free(s);
}

static double uniform(struct sampler *s) {
    s->rng ^= s->rng << 13, s->rng ^= s->rng >> 7, s->rng ^= s->rng << 17;
    return (double)(s->rng >> 11) / 9007199254740992.0;
}

void sampler_sample(struct sampler *s, float *logits, struct sampled_token *out) {
    int best = 0;
    for (int i = 1; i < s->vocab; i++)
        if (logits[i] > logits[best]) best = i;
    out->id = best;
    out->n_top = 0;
    out->logprob = 0;
    if (s->p.temperature <= 0) return;
    double sum = 0;
    for (int i = 0; i < s->vocab; i++) sum += exp((logits[i] - logits[best]) / s->p.temperature);
    double u = uniform(s) * sum;
    for (int i = 0; i < s->vocab; i++) {
        u -= exp((logits[i] - logits[best]) / s->p.temperature);
        if (u <= 0) {
            out->id = i;
            return;
        }
    }
}

void sampler_accept(struct sampler *s, int32_t token) {
    (void)s;
    (void)token;
}
