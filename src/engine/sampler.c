// Host sampler: penalties, then logprobs, then temperature / top-k / top-p / min-p, then a draw
// from our own PRNG. It is the reference the device samplers must match, so the order of the
// steps is part of the contract (see sampler.h).
#include "engine/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/rng.h"
#include "util/util.h"

struct cand {
    float v; // scaled logit, later the unnormalised probability exp(v - max)
    int32_t id;
};

struct sampler {
    struct sampler_params p;
    int n_valid; // ids [0, n_valid) may be sampled
    struct rng rng;

    uint8_t *seen; // repetition penalty: id occurred in history or output (NULL when off)
    int32_t *seen_ids;
    int n_seen, cap_seen;

    uint32_t *count; // presence/frequency: times each id was generated (NULL when off)
    int32_t *gen_ids;
    int n_gen, cap_gen;

    struct cand *cand; // scratch [n_valid]
};

struct sampler_params sampler_defaults(void) {
    return (struct sampler_params){.temperature = 1.0f,
                                   .top_k = 0,
                                   .top_p = 1.0f,
                                   .min_p = 0.0f,
                                   .presence_penalty = 0.0f,
                                   .frequency_penalty = 0.0f,
                                   .repetition_penalty = 1.0f,
                                   .seed = 0,
                                   .n_vocab = 0,
                                   .n_logprobs = -1};
}

static bool rep_on(const struct sampler_params *p) {
    return p->repetition_penalty > 0 && p->repetition_penalty != 1.0f;
}
static bool freq_on(const struct sampler_params *p) {
    return p->presence_penalty != 0 || p->frequency_penalty != 0;
}

static void mark_seen(struct sampler *s, int32_t id) {
    if (!s->seen || id < 0 || id >= s->n_valid || s->seen[id]) return;
    s->seen[id] = 1;
    if (s->n_seen == s->cap_seen) {
        s->cap_seen = s->cap_seen ? 2 * s->cap_seen : 256;
        s->seen_ids = xrealloc(s->seen_ids, sizeof(int32_t) * (size_t)s->cap_seen);
    }
    s->seen_ids[s->n_seen++] = id;
}

struct sampler *sampler_new(const struct sampler_params *p, int vocab, const int32_t *history,
                            int n_history) {
    struct sampler *s = xcalloc(1, sizeof *s);
    s->p = *p;
    s->n_valid = (p->n_vocab > 0 && p->n_vocab < vocab) ? p->n_vocab : vocab;
    if (s->n_valid < 1) s->n_valid = 1; // a zero-length row would leave nothing to return
    rng_seed(&s->rng, p->seed);
    if (rep_on(p)) {
        s->seen = xcalloc((size_t)s->n_valid, 1);
        for (int i = 0; i < n_history; i++) mark_seen(s, history[i]);
    }
    if (freq_on(p)) s->count = xcalloc((size_t)s->n_valid, sizeof(uint32_t));
    s->cand = xmalloc(sizeof(struct cand) * (size_t)s->n_valid);
    return s;
}

void sampler_free(struct sampler *s) {
    if (!s) return;
    free(s->seen);
    free(s->seen_ids);
    free(s->count);
    free(s->gen_ids);
    free(s->cand);
    free(s);
}

void sampler_accept(struct sampler *s, int32_t token) {
    mark_seen(s, token);
    if (!s->count || token < 0 || token >= s->n_valid) return;
    if (s->count[token]++ == 0) {
        if (s->n_gen == s->cap_gen) {
            s->cap_gen = s->cap_gen ? 2 * s->cap_gen : 256;
            s->gen_ids = xrealloc(s->gen_ids, sizeof(int32_t) * (size_t)s->cap_gen);
        }
        s->gen_ids[s->n_gen++] = token;
    }
}

// Only the ids that occurred are touched, so penalties cost O(distinct ids), not O(vocab).
static void apply_penalties(struct sampler *s, float *logits) {
    const struct sampler_params *p = &s->p;
    if (s->seen) {
        float r = p->repetition_penalty;
        for (int i = 0; i < s->n_seen; i++) {
            float *l = &logits[s->seen_ids[i]];
            *l = *l > 0 ? *l / r : *l * r;
        }
    }
    if (s->count) {
        for (int i = 0; i < s->n_gen; i++) {
            int32_t id = s->gen_ids[i];
            logits[id] -= (float)s->count[id] * p->frequency_penalty + p->presence_penalty;
        }
    }
}

static int32_t argmax(const float *l, int n) {
    int32_t best = 0;
    float bv = -INFINITY;
    for (int i = 0; i < n; i++)
        if (l[i] > bv) bv = l[i], best = i; // NaN never compares greater: skipped
    return best;
}

// Log-softmax denominators and the top-N ids of the penalised logits (temperature 1). The top-N
// list is kept sorted by insertion; for N <= 20 nearly every logit fails the first comparison.
static void logprobs(const float *l, int n, struct sampled_token *out, int n_top, double *lse) {
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (l[i] > mx) mx = l[i];
    double sum = 0;
    if (mx > -INFINITY)
        for (int i = 0; i < n; i++)
            if (l[i] > -INFINITY) sum += (double)expf(l[i] - mx);
    *lse = mx > -INFINITY ? (double)mx + log(sum) : 0;
    out->n_top = 0;
    for (int i = 0; i < n && n_top > 0; i++) {
        float v = l[i];
        if (!(v > -INFINITY)) continue;
        int k = out->n_top;
        if (k == n_top && v <= out->top_logprob[k - 1]) continue;
        if (k < n_top)
            out->n_top++;
        else
            k--;
        while (k > 0 && out->top_logprob[k - 1] < v) {
            out->top_logprob[k] = out->top_logprob[k - 1];
            out->top_id[k] = out->top_id[k - 1];
            k--;
        }
        out->top_logprob[k] = v;
        out->top_id[k] = i;
    }
    for (int k = 0; k < out->n_top; k++) out->top_logprob[k] = (float)(out->top_logprob[k] - *lse);
}

static inline void cswap(struct cand *a, struct cand *b) {
    struct cand t = *a;
    *a = *b;
    *b = t;
}

// Quickselect with a three-way partition (robust to many equal values): afterwards c[0, m) hold
// the m largest values, in no particular order. Expected O(n).
static void select_top(struct cand *c, int n, int m) {
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        float a = c[lo].v, b = c[lo + (hi - lo) / 2].v, d = c[hi - 1].v;
        float piv = a < b ? (b < d ? b : (a < d ? d : a)) : (a < d ? a : (b < d ? d : b));
        int lt = lo, i = lo, gt = hi; // [lo,lt) > piv, [lt,i) == piv, [gt,hi) < piv
        while (i < gt) {
            if (c[i].v > piv)
                cswap(&c[lt++], &c[i++]);
            else if (c[i].v < piv)
                cswap(&c[i], &c[--gt]);
            else
                i++;
        }
        if (m < lt)
            hi = lt;
        else if (m <= gt)
            return;
        else
            lo = gt;
    }
}

static int cand_desc(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int cand_by_id(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

// Smallest prefix of the descending order whose mass reaches `target`. Sorts only as much as
// needed: geometric chunks are selected from the unsorted rest, so a peaked distribution (the
// usual case) costs a few hundred sorted elements instead of the whole vocabulary.
static int top_p_cut(struct cand *c, int n, double target) {
    double cum = 0;
    int done = 0, chunk = 64;
    while (done < n) {
        int m = n - done < chunk ? n - done : chunk;
        if (m < n - done) select_top(c + done, n - done, m);
        qsort(c + done, (size_t)m, sizeof *c, cand_desc);
        for (int i = done; i < done + m; i++) {
            cum += c[i].v;
            if (cum >= target) return i + 1;
        }
        done += m;
        chunk *= 4;
    }
    return n;
}

// For a large candidate set, top-p first narrows it in one pass: a histogram of the
// probabilities over 1024 bins (the top 10 bits of a positive float order it like its value)
// finds the bin where the mass from the top reaches `target`; only candidates at or above that
// bin can be in the nucleus, and usually they are a few hundred of the whole vocabulary.
static int top_p_prefilter(struct cand *c, int n, double target) {
    double mass[1024] = {0};
    for (int i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &c[i].v, 4);
        mass[b >> 21] += c[i].v;
    }
    int bin = 1023;
    for (double cum = 0; bin > 0; bin--)
        if (mass[bin] > 0 && (cum += mass[bin]) >= target) break;
    int k = 0;
    for (int i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &c[i].v, 4);
        if ((int)(b >> 21) >= bin) c[k++] = c[i];
    }
    return k;
}

static void sift_down(struct cand *h, int n, int i) {
    for (;;) {
        int m = i, a = 2 * i + 1, b = a + 1;
        if (a < n && h[a].v < h[m].v) m = a;
        if (b < n && h[b].v < h[m].v) m = b;
        if (m == i) return;
        cswap(&h[i], &h[m]);
        i = m;
    }
}

// The k largest finite logits in one pass with a min-heap of size k: nearly every logit is
// rejected by one comparison with the heap's minimum, so a small top_k (Qwen recommends 20)
// costs about one read of the row. Returns how many were found (< k if fewer are finite).
static int heap_top_k(const float *l, int n, int k, struct cand *h) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        float v = l[i];
        if (m == k) {
            if (v > h[0].v) {
                h[0].v = v, h[0].id = i;
                sift_down(h, k, 0);
            }
        } else if (v > -INFINITY) {
            int j = m++;
            h[j].v = v, h[j].id = i;
            while (j > 0 && h[(j - 1) / 2].v > h[j].v) {
                cswap(&h[j], &h[(j - 1) / 2]);
                j = (j - 1) / 2;
            }
        }
    }
    return m;
}

static int32_t sample_truncated(struct sampler *s, const float *l) {
    const struct sampler_params *p = &s->p;
    struct cand *c = s->cand;
    float inv_t = 1.0f / p->temperature;
    int n = 0;
    bool in_id_order = false;
    if (p->top_k > 0 && p->top_k <= 8192) {
        n = heap_top_k(l, s->n_valid, p->top_k, c);
        for (int i = 0; i < n; i++) c[i].v = fminf(c[i].v * inv_t, FLT_MAX);
    } else {
        for (int i = 0; i < s->n_valid; i++)
            if (l[i] > -INFINITY) c[n].v = fminf(l[i] * inv_t, FLT_MAX), c[n++].id = i;
        in_id_order = true;
        if (p->top_k > 0 && p->top_k < n) {
            select_top(c, n, p->top_k);
            n = p->top_k;
            in_id_order = false;
        }
    }
    if (n == 0) return argmax(l, s->n_valid);
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (c[i].v > mx) mx = c[i].v;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += (c[i].v = expf(c[i].v - mx));
    if (p->top_p < 1.0f) {
        double target = (double)p->top_p * sum;
        if (p->top_p <= 0) target = 0; // only the most likely token
        if (n > 4096) n = top_p_prefilter(c, n, target);
        n = top_p_cut(c, n, target);
        in_id_order = false;
        sum = 0;
        for (int i = 0; i < n; i++) sum += c[i].v;
    }
    if (p->min_p > 0) { // relative to the most likely token, whose weight is exp(0) = 1
        int k = 0;
        sum = 0;
        for (int i = 0; i < n; i++)
            if (c[i].v >= p->min_p) sum += c[i].v, c[k++] = c[i];
        n = k; // the maximum always passes (min_p <= 1), so n >= 1 unless min_p > 1
        if (n == 0) return argmax(l, s->n_valid);
    }
    // The draw scans the kept ids in ascending id order, whatever order the selection left them
    // in, so that another implementation (a device sampler) can reproduce it from the same u.
    if (!in_id_order) qsort(c, (size_t)n, sizeof *c, cand_by_id);
    double u = rng_uniform(&s->rng) * sum, cum = 0;
    for (int i = 0; i < n; i++) {
        cum += c[i].v;
        if (u < cum) return c[i].id;
    }
    return c[n - 1].id; // rounding left u at the very top
}

void sampler_sample(struct sampler *s, float *logits, struct sampled_token *out) {
    apply_penalties(s, logits);
    double lse = 0;
    out->n_top = 0;
    if (s->p.n_logprobs >= 0) {
        int n_top =
            s->p.n_logprobs < WREN_MAX_TOP_LOGPROBS ? s->p.n_logprobs : WREN_MAX_TOP_LOGPROBS;
        logprobs(logits, s->n_valid, out, n_top, &lse);
    }
    // Below 1e-5 the scaled logits would overflow; the distribution is a point mass anyway.
    bool greedy = !(s->p.temperature >= 1e-5f);
    int32_t id = greedy ? argmax(logits, s->n_valid) : sample_truncated(s, logits);
    out->id = id;
    out->logprob = s->p.n_logprobs >= 0 ? (float)((double)logits[id] - lse) : 0.0f;
}

void sampler_params_overlay(struct sampler_params *p, const struct sampler_params *over,
                            unsigned set) {
    if (set & SAMPLER_SET_TEMPERATURE) p->temperature = over->temperature;
    if (set & SAMPLER_SET_TOP_K) p->top_k = over->top_k;
    if (set & SAMPLER_SET_TOP_P) p->top_p = over->top_p;
    if (set & SAMPLER_SET_MIN_P) p->min_p = over->min_p;
    if (set & SAMPLER_SET_PRESENCE) p->presence_penalty = over->presence_penalty;
    if (set & SAMPLER_SET_FREQUENCY) p->frequency_penalty = over->frequency_penalty;
    if (set & SAMPLER_SET_REPETITION) p->repetition_penalty = over->repetition_penalty;
    if (set & SAMPLER_SET_SEED) p->seed = over->seed;
}
