// Sampler checks against direct computations: greedy = argmax, the padding past n_vocab is never
// sampled, the support of top-k / top-p / min-p, penalty arithmetic, logprobs, determinism per
// seed, and the empirical distribution of draws against softmax for a small vocabulary.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"
#include "util/util.h"
#include "check.h"

// Test-only generator, independent of the sampler's own PRNG.
static uint64_t lcg = 12345;
static float frand(void) { // [0, 1)
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((lcg >> 40) * 0x1.0p-24);
}

static int32_t draw(const struct sampler_params *p, const float *logits, int vocab,
                    struct sampler *s) {
    float *row = xmalloc(sizeof(float) * (size_t)vocab);
    memcpy(row, logits, sizeof(float) * (size_t)vocab);
    struct sampled_token t;
    bool own = !s;
    if (own) s = sampler_new(p, vocab, NULL, 0);
    sampler_sample(s, row, &t);
    if (own) sampler_free(s);
    free(row);
    return t.id;
}

// Fraction of draws per id over n draws from one sampler.
static void histogram(const struct sampler_params *p, const float *logits, int vocab, int n,
                      double *freq) {
    struct sampler *s = sampler_new(p, vocab, NULL, 0);
    for (int i = 0; i < vocab; i++) freq[i] = 0;
    for (int i = 0; i < n; i++) freq[draw(p, logits, vocab, s)] += 1.0 / n;
    sampler_free(s);
}

static void test_greedy_and_mask(void) {
    enum { V = 1000, NV = 900 };
    float l[V];
    for (int i = 0; i < V; i++) l[i] = frand() * 10 - 5;
    l[950] = 100;             // in the padding: must never be chosen
    l[123] = 20, l[124] = 20; // tie: lowest id
    struct sampler_params p = sampler_defaults();
    p.temperature = 0;
    p.n_vocab = NV;
    CHECK(draw(&p, l, V, NULL) == 123, "greedy picks the first argmax below n_vocab");
    p.n_vocab = 0; // 0: the whole row
    CHECK(draw(&p, l, V, NULL) == 950, "n_vocab 0 means the whole row");
    p.temperature = 1e-30f; // would overflow the scaled logits: greedy
    CHECK(draw(&p, l, V, NULL) == 950, "a vanishing temperature is greedy");

    // Sampling with a huge logit in the padding: never drawn.
    float m[V];
    for (int i = 0; i < V; i++) m[i] = i >= NV ? 1000.0f : 0.0f;
    p = sampler_defaults();
    p.n_vocab = NV;
    struct sampler *s = sampler_new(&p, V, NULL, 0);
    int bad = 0;
    for (int i = 0; i < 5000; i++) bad += draw(&p, m, V, s) >= NV;
    sampler_free(s);
    CHECK(bad == 0, "%d draws at ids >= n_vocab", bad);

    // Everything -inf / NaN: still a valid id.
    for (int i = 0; i < V; i++) m[i] = i % 2 ? -INFINITY : NAN;
    p.temperature = 0.8f;
    int32_t id = draw(&p, m, V, NULL);
    CHECK(id >= 0 && id < NV, "all -inf/NaN row gives id %d", id);
}

static void softmax(const float *l, int n, float t, double *out) {
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++) mx = fmax(mx, l[i] / t);
    for (int i = 0; i < n; i++) sum += out[i] = exp(l[i] / t - mx);
    for (int i = 0; i < n; i++) out[i] /= sum;
}

static void test_supports(void) {
    // probabilities 0.4 0.3 0.15 0.1 0.05 (temperature 1)
    const double pr[5] = {0.4, 0.3, 0.15, 0.1, 0.05};
    float l[8];
    for (int i = 0; i < 5; i++) l[i] = (float)log(pr[i]);
    l[5] = l[6] = l[7] = -INFINITY;
    double f[8];
    struct sampler_params p = sampler_defaults();
    p.seed = 7;

    p.top_k = 2;
    histogram(&p, l, 8, 20000, f);
    CHECK(f[0] > 0.5 && f[1] > 0.35 && f[2] == 0 && f[3] == 0 && f[4] == 0,
          "top_k 2 support: %.3f %.3f %.3f", f[0], f[1], f[2]);
    CHECK(fabs(f[0] - 0.4 / 0.7) < 0.02, "top_k 2 renormalises: %.3f", f[0]);

    p = sampler_defaults();
    p.top_p = 0.69f; // 0.4 + 0.3 reaches it: {0, 1}
    histogram(&p, l, 8, 20000, f);
    CHECK(f[0] > 0 && f[1] > 0 && f[2] == 0, "top_p 0.69 support: %.3f %.3f %.3f", f[0], f[1],
          f[2]);
    p.top_p = 0.71f; // needs the third
    histogram(&p, l, 8, 20000, f);
    CHECK(f[2] > 0 && f[3] == 0, "top_p 0.71 support: %.3f %.3f", f[2], f[3]);
    CHECK(fabs(f[2] - 0.15 / 0.85) < 0.02, "top_p renormalises: %.3f", f[2]);

    p = sampler_defaults();
    p.min_p = 0.3f; // threshold 0.12: {0, 1, 2}
    histogram(&p, l, 8, 20000, f);
    CHECK(f[2] > 0 && f[3] == 0, "min_p 0.3 support: %.3f %.3f", f[2], f[3]);
    p.min_p = 0.5f; // threshold 0.2: {0, 1}
    histogram(&p, l, 8, 20000, f);
    CHECK(f[1] > 0 && f[2] == 0, "min_p 0.5 support: %.3f %.3f", f[1], f[2]);

    // Order matters: top-k 3 leaves {0.4,0.3,0.15}/0.85, top_p 0.8 then needs all three
    // (0.7/0.85 = 0.82 reaches it after two: {0, 1}).
    p = sampler_defaults();
    p.top_k = 3, p.top_p = 0.8f;
    histogram(&p, l, 8, 20000, f);
    CHECK(f[1] > 0 && f[2] == 0, "top_k then top_p: %.3f %.3f", f[1], f[2]);

    // Temperature changes the top-p set: at T=0.5 probs ~ .52 .29 .07 .03 .008 -> {0,1} for 0.8
    p = sampler_defaults();
    p.temperature = 0.5f, p.top_p = 0.8f;
    histogram(&p, l, 8, 20000, f);
    double sm[8];
    softmax(l, 5, 0.5f, sm);
    CHECK(sm[0] + sm[1] >= 0.8 && f[2] == 0 && f[1] > 0, "temperature before top_p");
}

static void test_penalties(void) {
    float l[6] = {2, -2, 1, 3, 0.5f, -1};
    int32_t hist[3] = {0, 1, 1};
    struct sampler_params p = sampler_defaults();
    p.temperature = 0;
    p.repetition_penalty = 2;
    struct sampler *s = sampler_new(&p, 6, hist, 3);
    struct sampled_token t;
    float row[6];
    memcpy(row, l, sizeof row);
    sampler_sample(s, row, &t);
    CHECK(row[0] == 1 && row[1] == -4 && row[2] == 1 && row[3] == 3, "repetition on history");
    sampler_accept(s, 3);
    memcpy(row, l, sizeof row);
    sampler_sample(s, row, &t);
    CHECK(row[3] == 1.5f && row[4] == 0.5f, "repetition on generated: %g", row[3]);
    sampler_free(s);

    p = sampler_defaults();
    p.temperature = 0;
    p.presence_penalty = 0.5f, p.frequency_penalty = 0.25f;
    s = sampler_new(&p, 6, hist, 3); // the prompt does not count for these
    memcpy(row, l, sizeof row);
    sampler_sample(s, row, &t);
    CHECK(!memcmp(row, l, sizeof row), "presence/frequency ignore the prompt");
    sampler_accept(s, 3);
    sampler_accept(s, 3);
    sampler_accept(s, 5);
    memcpy(row, l, sizeof row);
    sampler_sample(s, row, &t);
    CHECK(row[3] == 3 - 0.5f - 0.5f && row[5] == -1 - 0.5f - 0.25f && row[0] == 2,
          "presence/frequency arithmetic: %g %g", row[3], row[5]);
    CHECK(t.id == 0, "greedy after penalties picks %d", t.id);
    sampler_free(s);
}

static void test_logprobs(void) {
    enum { V = 300 };
    float l[V], row[V];
    for (int i = 0; i < V; i++) l[i] = frand() * 8 - 4;
    struct sampler_params p = sampler_defaults();
    p.temperature = 0.3f, p.top_k = 5, p.n_logprobs = 4, p.seed = 3;
    struct sampler *s = sampler_new(&p, V, NULL, 0);
    struct sampled_token t;
    memcpy(row, l, sizeof row);
    sampler_sample(s, row, &t);
    sampler_free(s);
    double mx = -1e30, sum = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, l[i]);
    for (int i = 0; i < V; i++) sum += exp(l[i] - mx);
    double lse = mx + log(sum);
    CHECK(fabs(t.logprob - (l[t.id] - lse)) < 1e-4, "sampled logprob at temperature 1");
    CHECK(t.n_top == 4, "n_top %d", t.n_top);
    int order[V];
    for (int i = 0; i < V; i++) order[i] = i;
    for (int i = 0; i < 4; i++) // selection sort of the top 4
        for (int j = i + 1; j < V; j++)
            if (l[order[j]] > l[order[i]]) {
                int x = order[i];
                order[i] = order[j], order[j] = x;
            }
    for (int k = 0; k < 4 && k < t.n_top; k++)
        CHECK(t.top_id[k] == order[k] && fabs(t.top_logprob[k] - (l[order[k]] - lse)) < 1e-4,
              "top logprob %d: id %d vs %d", k, t.top_id[k], order[k]);
    p.n_logprobs = 100;
    s = sampler_new(&p, V, NULL, 0);
    memcpy(row, l, sizeof row);
    sampler_sample(s, row, &t);
    sampler_free(s);
    CHECK(t.n_top == WREN_MAX_TOP_LOGPROBS, "n_top capped: %d", t.n_top);
}

static void test_determinism(void) {
    enum { V = 500, N = 300 };
    float l[V];
    for (int i = 0; i < V; i++) l[i] = frand() * 4;
    struct sampler_params p = sampler_defaults();
    p.temperature = 1.2f, p.top_p = 0.9f, p.seed = 42;
    int32_t a[N], b[N], c[N];
    struct sampler *s1 = sampler_new(&p, V, NULL, 0), *s2 = sampler_new(&p, V, NULL, 0);
    p.seed = 43;
    struct sampler *s3 = sampler_new(&p, V, NULL, 0);
    for (int i = 0; i < N; i++) {
        a[i] = draw(&p, l, V, s1), b[i] = draw(&p, l, V, s2), c[i] = draw(&p, l, V, s3);
        sampler_accept(s1, a[i]), sampler_accept(s2, b[i]), sampler_accept(s3, c[i]);
    }
    sampler_free(s1), sampler_free(s2), sampler_free(s3);
    CHECK(!memcmp(a, b, sizeof a), "same seed, same ids");
    CHECK(memcmp(a, c, sizeof a), "different seed, different ids");

    // The draw does not depend on how the kept set was selected: top_k = vocab (heap path)
    // keeps everything, like no top_k, and must give the same ids for the same seed.
    p = sampler_defaults();
    p.temperature = 1.5f, p.seed = 99;
    s1 = sampler_new(&p, V, NULL, 0);
    p.top_k = V;
    s2 = sampler_new(&p, V, NULL, 0);
    int same = 0;
    for (int i = 0; i < N; i++) same += draw(&p, l, V, s1) == draw(&p, l, V, s2);
    sampler_free(s1), sampler_free(s2);
    CHECK(same == N, "selection path changed %d of %d draws", N - same, N);
}

// Empirical frequencies against softmax(l / T); a 4-sigma bound per id.
static void test_distribution(void) {
    enum { V = 10, N = 200000 };
    float l[V];
    for (int i = 0; i < V; i++) l[i] = frand() * 3 - 1.5f;
    const float temps[3] = {0.5f, 1.0f, 1.7f};
    for (int k = 0; k < 3; k++) {
        struct sampler_params p = sampler_defaults();
        p.temperature = temps[k], p.seed = 100 + (uint64_t)k;
        double f[V], ref[V];
        histogram(&p, l, V, N, f);
        softmax(l, V, temps[k], ref);
        for (int i = 0; i < V; i++) {
            double sd = sqrt(ref[i] * (1 - ref[i]) / N);
            CHECK(fabs(f[i] - ref[i]) <= 4 * sd + 1e-9, "T=%.1f id %d: %.4f vs %.4f", temps[k], i,
                  f[i], ref[i]);
        }
    }
}

// Full 248k vocabulary: the sampled id is inside the top-p set computed by a full sort, and the
// cost per token is reported.
static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

static void test_large_vocab(void) {
    enum { V = 248320, NV = 248077 };
    float *l = xmalloc(sizeof(float) * V), *row = xmalloc(sizeof(float) * V);
    for (int i = 0; i < V; i++) l[i] = frand() * 6 + (i % 97 == 0 ? 8 : 0);
    double *pr = xmalloc(sizeof(double) * NV);
    float *sorted = xmalloc(sizeof(float) * NV);
    const float T = 0.8f, TOP_P = 0.95f;
    softmax(l, NV, T, pr);
    for (int i = 0; i < NV; i++) sorted[i] = (float)pr[i];
    qsort(sorted, NV, sizeof(float), cmp_desc);
    double cum = 0;
    float thr = 0;
    for (int i = 0; i < NV; i++) {
        cum += sorted[i];
        if (cum >= TOP_P) {
            thr = sorted[i];
            break;
        }
    }
    struct sampler_params p = sampler_defaults();
    p.temperature = T, p.top_p = TOP_P, p.n_vocab = NV, p.seed = 9, p.n_logprobs = 5;
    struct sampler *s = sampler_new(&p, V, NULL, 0);
    const int n = 40;
    double t0 = now_sec();
    int outside = 0;
    for (int i = 0; i < n; i++) {
        memcpy(row, l, sizeof(float) * V);
        struct sampled_token t;
        sampler_sample(s, row, &t);
        outside += t.id >= NV || (float)pr[t.id] < thr * 0.999f;
    }
    double dt = (now_sec() - t0) / n;
    sampler_free(s);
    CHECK(outside == 0, "%d draws outside the top-p set", outside);
    printf("large vocab (%d): %.2f ms per token (top_p %.2f, logprobs 5)\n", V, dt * 1e3, TOP_P);

    // top-k through the heap (small k) and through quickselect (large k): every draw is among
    // the k largest logits.
    float *lsorted = xmalloc(sizeof(float) * NV);
    memcpy(lsorted, l, sizeof(float) * NV);
    qsort(lsorted, NV, sizeof(float), cmp_desc);
    const int ks[3] = {20, 3000, 20000};
    for (int j = 0; j < 3; j++) {
        p = sampler_defaults();
        p.top_k = ks[j], p.temperature = 2.0f, p.n_vocab = NV, p.seed = 11;
        s = sampler_new(&p, V, NULL, 0);
        int bad = 0, distinct = 0;
        char *hit = xcalloc(NV, 1);
        t0 = now_sec();
        for (int i = 0; i < 200; i++) {
            memcpy(row, l, sizeof(float) * V);
            struct sampled_token t;
            sampler_sample(s, row, &t);
            bad += t.id >= NV || l[t.id] < lsorted[ks[j] - 1];
            distinct += !hit[t.id];
            hit[t.id] = 1;
        }
        dt = (now_sec() - t0) / 200;
        sampler_free(s);
        free(hit);
        CHECK(bad == 0 && distinct > 1, "top_k %d: %d draws outside, %d distinct", ks[j], bad,
              distinct);
        printf("large vocab: %.2f ms per token (top_k %d)\n", dt * 1e3, ks[j]);
    }
    free(lsorted);
    free(l), free(row), free(pr), free(sorted);
}

int main(void) {
    test_greedy_and_mask();
    test_supports();
    test_penalties();
    test_logprobs();
    test_determinism();
    test_distribution();
    test_large_vocab();
    return check_finish("sampler");
}
