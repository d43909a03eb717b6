// GPU sampler checks: greedy = argmax (ties to the lower id, ids >= n_vocab never chosen), the
// counters it advances, penalties against a host computation, top-k / top-p / min-p support and
// frequencies over many draws, determinism per seed, and logprobs; the top-k kernel against the
// one-block kernel draw for draw (ties at a block's cut included) and how it drew.
#include <algorithm>
#include <map>
#include <set>

#include "common_check.cuh"

struct sbuf {
    int vocab;
    float *logits, *work;
    int *counts, *step, *pos;
    uint8_t *seen;
    int32_t *tok;
    unsigned long long *argmax;
    unsigned *counter;
    struct sampled_token *ring, *ring_dev;
};

static struct sbuf mk(int vocab) {
    struct sbuf b;
    b.vocab = vocab;
    CK(cudaMalloc(&b.logits, vocab * 4));
    CK(cudaMalloc(&b.work, sample_work_bytes(vocab)));
    CK(cudaMalloc(&b.counts, vocab * 4));
    CK(cudaMalloc(&b.seen, vocab));
    CK(cudaMalloc(&b.step, 4));
    CK(cudaMalloc(&b.pos, 4));
    CK(cudaMalloc(&b.tok, 4));
    CK(cudaMalloc(&b.argmax, 8));
    CK(cudaMalloc(&b.counter, 4));
    CK(cudaMemset(b.counts, 0, vocab * 4));
    CK(cudaMemset(b.seen, 0, vocab));
    CK(cudaMemset(b.step, 0, 4));
    CK(cudaMemset(b.pos, 0, 4));
    CK(cudaMemset(b.argmax, 0, 8));
    CK(cudaMemset(b.counter, 0, 4));
    CK(cudaHostAlloc((void **)&b.ring, 8 * sizeof(struct sampled_token), cudaHostAllocMapped));
    CK(cudaHostGetDevicePointer((void **)&b.ring_dev, b.ring, 0));
    return b;
}

static struct sample_params base(const struct sbuf &b) {
    struct sample_params p;
    memset(&p, 0, sizeof p);
    p.logits = b.logits, p.n_vocab = b.vocab, p.temperature = 0, p.top_p = 1, p.repetition = 1,
    p.n_logprobs = -1;
    p.counts = b.counts, p.seen = b.seen, p.work = b.work, p.argmax = b.argmax,
    p.counter = b.counter;
    p.tok_out = b.tok, p.step = b.step, p.pos = b.pos, p.advance_pos = 1, p.ring = b.ring_dev,
    p.ring_n = 8;
    p.seed = 42;
    return p;
}

static int draw(const struct sample_params &p, const struct sbuf &b) {
    WK(sample_launch(&p, 0, &err_));
    CK(cudaDeviceSynchronize());
    int step;
    CK(cudaMemcpy(&step, b.step, 4, cudaMemcpyDeviceToHost));
    return b.ring[(step - 1) % 8].id;
}

static void t_greedy(int vocab) {
    struct sbuf b = mk(vocab);
    std::vector<float> l = rnd_vec(vocab, -5, 5);
    l[vocab / 3] = 9.f, l[vocab / 2] = 9.f; // tie: the lower id wins
    l[vocab - 1] = 50.f;                    // beyond n_vocab: never chosen
    CK(cudaMemcpy(b.logits, l.data(), vocab * 4, cudaMemcpyHostToDevice));
    struct sample_params p = base(b);
    p.n_vocab = vocab - 1;
    int t = draw(p, b);
    int tok, step, pos, cnt;
    CK(cudaMemcpy(&tok, b.tok, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&step, b.step, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&pos, b.pos, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&cnt, b.counts + vocab / 3, 4, cudaMemcpyDeviceToHost));
    char name[128];
    snprintf(name, sizeof name, "greedy argmax vocab %d (tie -> lower id, id >= n_vocab skipped)",
             vocab);
    check_true(name, t == vocab / 3 && tok == t && step == 1 && pos == 1 && cnt == 1);
    // the same through the full kernel (logprobs requested forces it)
    p.n_logprobs = 3;
    int t2 = draw(p, b);
    double mx = -1e30, z = 0;
    for (int i = 0; i < vocab - 1; i++) mx = fmax(mx, l[i]);
    for (int i = 0; i < vocab - 1; i++) z += exp(l[i] - mx);
    const struct sampled_token &r = b.ring[1];
    bool ok = t2 == vocab / 3 && r.n_top == 3 && fabs(r.logprob - (l[t2] - mx - log(z))) < 1e-3 &&
              r.top_id[0] == vocab / 3 && r.top_id[1] == vocab / 2 &&
              fabs(r.top_logprob[1] - (9 - mx - log(z))) < 1e-3;
    snprintf(name, sizeof name, "greedy + logprobs (full sampler) vocab %d", vocab);
    check_true(name, ok);
}

static void t_penalties(void) {
    const int V = 5000;
    struct sbuf b = mk(V);
    std::vector<float> l = rnd_vec(V, -3, 3);
    std::vector<int> counts(V, 0);
    std::vector<uint8_t> seen(V, 0);
    for (int i = 0; i < 200; i++)
        counts[rnd_u32() % V] += 1 + rnd_u32() % 3, seen[rnd_u32() % V] = 1;
    for (int i = 0; i < V; i++) seen[i] |= counts[i] > 0;
    CK(cudaMemcpy(b.logits, l.data(), V * 4, cudaMemcpyHostToDevice));
    struct sample_params p = base(b);
    p.repetition = 1.3f, p.presence = 0.5f, p.frequency = 0.3f;
    bool ok = true;
    for (int round = 0; round < 20; round++) {
        CK(cudaMemcpy(b.counts, counts.data(), V * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(b.seen, seen.data(), V, cudaMemcpyHostToDevice));
        int t = draw(p, b);
        int best = 0;
        float bv = -1e30f;
        for (int i = 0; i < V; i++) {
            float x = l[i];
            if (seen[i]) x = x > 0 ? x / 1.3f : x * 1.3f;
            if (counts[i]) x -= 0.3f * counts[i] + 0.5f;
            if (x > bv) bv = x, best = i;
        }
        ok &= t == best;
        counts[t]++, seen[t] = 1; // what the device recorded too
    }
    check_true("penalties (repetition, presence, frequency) + greedy, 20 rounds", ok);
}

// Draws n samples; checks support and frequencies against the expected distribution.
static void t_dist(const char *what, int V, float temp, int top_k, float top_p, float min_p, int n,
                   bool one_block = false) {
    struct sbuf b = mk(V);
    std::vector<float> l = rnd_vec(V, -2, 2);
    for (int i = 0; i < 6; i++) l[rnd_u32() % V] += 3.f;
    CK(cudaMemcpy(b.logits, l.data(), V * 4, cudaMemcpyHostToDevice));
    // expected: HF order — temperature, top-k, top-p, min-p
    std::vector<int> ord(V);
    for (int i = 0; i < V; i++) ord[i] = i;
    std::sort(ord.begin(), ord.end(),
              [&](int a, int c) { return l[a] > l[c] || (l[a] == l[c] && a < c); });
    int keep = top_k > 0 && top_k < V ? top_k : V;
    double mx = l[ord[0]] / temp, z = 0;
    std::vector<double> pr(V, 0);
    for (int i = 0; i < keep; i++) z += (pr[ord[i]] = exp(l[ord[i]] / temp - mx));
    if (top_p < 1) {
        double acc = 0;
        int k2 = 0;
        while (k2 < keep && acc < top_p * z) acc += pr[ord[k2++]];
        for (int i = k2; i < keep; i++) pr[ord[i]] = 0;
        keep = k2;
    }
    if (min_p > 0)
        for (int i = 0; i < keep; i++)
            if (pr[ord[i]] < min_p * pr[ord[0]]) pr[ord[i]] = 0;
    z = 0;
    for (double v : pr) z += v;
    struct sample_params p = base(b);
    p.temperature = temp, p.top_k = top_k, p.top_p = top_p, p.min_p = min_p, p.seed = 7;
    p.one_block = one_block;
    const bool coop = sample_coop_ok(&p); // then every draw by the multi-block selection
    int *path, coops = 0;
    CK(cudaMallocManaged(&path, 4));
    p.path = coop ? path : NULL;
    std::vector<int> hits(V, 0);
    std::vector<int> seq;
    bool support = true;
    for (int i = 0; i < n; i++) {
        *path = -1;
        int t = draw(p, b);
        coops += *path == 3;
        if (t < 0 || t >= V || pr[t] == 0)
            support = false;
        else
            hits[t]++;
        if (i < 50) seq.push_back(t);
    }
    double worst = 0;
    for (int i = 0; i < V; i++) worst = fmax(worst, fabs(hits[i] / (double)n - pr[i] / z));
    char name[160];
    snprintf(name, sizeof name, "%s: support of %d draws", what, n);
    check_true(name, support);
    if (coop) {
        snprintf(name, sizeof name, "%s: %d of %d draws by the multi-block selection", what, coops,
                 n);
        check_true(name, coops == n);
    }
    snprintf(name, sizeof name, "%s: max |freq - p| = %.4f (< %.3f)", what, worst,
             4.0 / sqrt((double)n));
    check_true(name, worst < 4.0 / sqrt((double)n));
    // determinism: same seed and step -> same draws
    CK(cudaMemset(b.step, 0, 4));
    bool same = true;
    for (int i = 0; i < 50; i++) same &= draw(p, b) == seq[i];
    snprintf(name, sizeof name, "%s: same seed, same 50 draws", what);
    check_true(name, same);
}

// Top-p at the value bins' edges: 1,025 logits in descending order, one per 1/128 nat in pairs of
// bins with an empty pair between (span 16: 128 bins per nat), top-p swept over +-24 f32 steps
// around every pair's cumulative mass. A drawn id (here its rank) must lie in the host's kept set,
// or be the next id (f32 rounding). An empty bin chosen where the running sums of two threads
// differ by a rounding kept every id (the one-block sampler, thirty-fourth session's review).
// stride: the logits at every stride-th id, -inf between (so the candidate kernel's multi-block
// selection spreads them over its blocks).
static void t_topp_edges(bool one_block, int stride) {
    std::vector<float> r;
    for (int t = 0; t < 1024; t += 2)
        for (int b = 2 * t; b < 2 * t + 2; b++) r.push_back(b ? -(b + .5f) / 128.f : 0.f);
    r.push_back(-16.f);
    std::vector<float> l(r.size() * stride, -INFINITY);
    for (size_t i = 0; i < r.size(); i++) l[i * stride] = r[i];
    const int V = (int)l.size();
    struct sbuf b = mk(V);
    CK(cudaMemcpy(b.logits, l.data(), V * 4, cudaMemcpyHostToDevice));
    const int R = (int)r.size();
    double tot = 0, c = 0;
    for (float v : r) tot += exp((double)v);
    struct sample_params p = base(b);
    p.temperature = 1.f, p.one_block = one_block, p.top_p = 0.5f;
    const bool coop = sample_coop_ok(&p); // then every draw by the multi-block selection
    int *path, coops = 0;
    CK(cudaMallocManaged(&path, 4));
    p.path = path;
    int bad = 0, n = 0;
    for (int i = 0; i + 1 < R; i += 2) {
        c += exp((double)r[i]) + exp((double)r[i + 1]);
        for (int j = -24; j <= 24; j++) {
            const float q = (float)(c / tot * (1 + j * ldexp(1., -24)));
            if (q >= 1.f) continue;
            int k = 0;
            for (double acc = 0; k < R && acc < (double)q * tot;) acc += exp((double)r[k++]);
            p.top_p = q;
            *path = -1;
            const int t = draw(p, b);
            coops += *path == 3;
            n++;
            bad += t < 0 || t % stride || t / stride > k;
        }
    }
    char name[160];
    snprintf(name, sizeof name, "top-p at value-bin edges (%s, vocab %d): %d of %d draws kept",
             one_block ? "one-block" : "multi-block", V, n - bad, n);
    check_true(name, bad == 0);
    if (coop) {
        snprintf(name, sizeof name,
                 "top-p at value-bin edges: %d of %d draws by the multi-block "
                 "selection",
                 coops, n);
        check_true(name, coops == n);
    }
}

// top-p 0 without a top-k: every path gives the largest logit's token (the one-block and the
// multi-block selections keep nothing and fall back to it; the candidates keep its key group).
static void t_topp_zero() {
    const int V = 248320;
    struct sbuf b = mk(V);
    std::vector<float> l = rnd_vec(V, -2, 2);
    l[777] = 3.5f, l[99999] = 3.4f;
    CK(cudaMemcpy(b.logits, l.data(), V * 4, cudaMemcpyHostToDevice));
    struct sample_params p = base(b);
    p.temperature = 0.8f, p.top_p = 0.f;
    const bool coop = sample_coop_ok(&p);
    int ok = 0;
    for (int k = 0; k < 3; k++) {
        p.one_block = k == 1, p.no_coop = k == 2;
        for (int i = 0; i < 20; i++) ok += draw(p, b) == 777;
    }
    char name[160];
    snprintf(name, sizeof name,
             "top-p 0: the greedy token on %d of 60 draws (multi-block%s, "
             "one-block, candidates)",
             ok, coop ? "" : " n/a");
    check_true(name, ok == 60);
}

static uint64_t host_splitmix64(uint64_t x) { // the sampler's counter-based RNG, as specified
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// The candidate kernel and the one-block kernel on the same logits and steps: the same tokens (a
// draw without a floor, or by the multi-block selection, over a large vocabulary: each in the id
// whose interval of the cumulative mass of the kept set, in double on the host, holds the step's
// uniform, within f32 rounding: the kernels sum in different orders and ids are ~1e-6 of the mass
// apart), and the same logprobs and top alternatives when asked; want_path: how the candidate
// kernel must have drawn (its `path`; no_coop: without its multi-block selection). ties: 100
// equal best logits across the first block boundary (it hands over to the one-block sampler);
// flat: every logit 0 (padding rows) but the 30 raised by boost and up to 3 more.
static void t_same(const char *what, int V, float temp, int top_k, float top_p, float min_p,
                   bool pens, int n_logprobs, int ties, bool flat, int n, int want_path = 0,
                   float boost = 3.f, bool no_coop = false) {
    struct sbuf b = mk(V);
    std::vector<float> l = rnd_vec(V, -2, 2);
    if (flat) std::fill(l.begin(), l.end(), 0.f);
    for (int i = 0; i < 30; i++) l[rnd_u32() % V] += boost + (float)(rnd_u32() % 300) / 100.f;
    for (int i = 0; i < ties; i++) l[2000 + i] = 8.f;
    CK(cudaMemcpy(b.logits, l.data(), V * 4, cudaMemcpyHostToDevice));
    std::vector<int> counts(V, 0);
    std::vector<uint8_t> seen(V, 0);
    if (pens) {
        for (int i = 0; i < 300; i++)
            counts[rnd_u32() % V] += 1 + rnd_u32() % 3, seen[rnd_u32() % V] = 1;
        for (int i = 0; i < 40; i++) seen[2000 + (int)(rnd_u32() % 200)] = 1;
    }
    struct sample_params p = base(b);
    p.temperature = temp, p.top_k = top_k, p.top_p = top_p, p.min_p = min_p, p.seed = 11;
    p.n_logprobs = n_logprobs, p.no_coop = no_coop;
    if (pens) p.repetition = 1.2f, p.presence = 0.3f, p.frequency = 0.2f;
    p.advance_pos = 0;
    int *path;
    CK(cudaMallocManaged(&path, 4));
    int same = 0, inties = 0, paths = 0, exact = 0;
    // a card that cannot hold the candidate kernel's grid draws these by another path
    const int expect = want_path == 3 && !sample_coop_ok(&p) ? -1 : want_path;
    // the exact cumulative mass of the kept set in id order (draws without a floor: every id; by
    // the multi-block selection: top-p's whole key groups, then min-p, as HF)
    std::vector<double> cum(V + 1, 0.0);
    {
        const float sc = temp > 0.f ? 1.f / temp : 1.f;
        std::vector<float> v(V);
        float vmax = -INFINITY;
        for (int i = 0; i < V; i++) {
            float x = l[i];
            if (pens && seen[i]) x = x > 0.f ? x / 1.2f : x * 1.2f;
            if (pens && counts[i]) x -= 0.2f * (float)counts[i] + 0.3f;
            v[i] = x * sc, vmax = fmaxf(vmax, v[i]);
        }
        std::vector<bool> kept(V, true);
        if (want_path == 3 && top_p < 1.f) {
            std::vector<int> ord(V);
            for (int i = 0; i < V; i++) ord[i] = i;
            std::sort(ord.begin(), ord.end(), [&](int a, int c) { return v[a] > v[c]; });
            double z = 0, acc = 0;
            for (int i = 0; i < V; i++) z += exp((double)v[i] - vmax);
            size_t k = 0;
            while (k < ord.size() && acc < (double)top_p * z)
                acc += exp((double)v[ord[k++]] - vmax);
            while (k < ord.size() && v[ord[k]] == v[ord[k - 1]]) k++;
            std::fill(kept.begin(), kept.end(), false);
            for (size_t i = 0; i < k; i++) kept[ord[i]] = true;
        }
        if (want_path == 3 && min_p > 0.f)
            for (int i = 0; i < V; i++) kept[i] = kept[i] && v[i] >= vmax + logf(min_p);
        for (int i = 0; i < V; i++) cum[i + 1] = cum[i] + (kept[i] ? exp((double)v[i] - vmax) : 0);
    }
    double worst_lp = 0;
    bool tops = true;
    for (int i = 0; i < n; i++) {
        // the same step for both (the RNG stream) and the same penalty state (emit records the
        // token in both)
        struct sampled_token r[2];
        for (int k = 0; k < 2; k++) {
            CK(cudaMemcpy(b.step, &i, 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(b.counts, counts.data(), V * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(b.seen, seen.data(), V, cudaMemcpyHostToDevice));
            p.one_block = k == 1;
            *path = -1;
            p.path = k == 0 ? path : NULL;
            draw(p, b);
            r[k] = b.ring[i % 8];
            if (k == 0) paths += expect < 0 || *path == expect;
        }
        same += r[0].id == r[1].id;
        const uint64_t rr = host_splitmix64(11 ^ host_splitmix64((uint64_t)i + 1));
        const double target = (double)(rr >> 40) / 16777216.0 * cum[V], tol = 1e-5 * cum[V];
        bool both = true;
        for (int k = 0; k < 2; k++)
            both &= cum[r[k].id] - tol <= target && target <= cum[r[k].id + 1] + tol;
        exact += both;
        inties += r[0].id >= 2000 && r[0].id < 2000 + ties;
        if (n_logprobs >= 0) { // (the drawn token's, where both drew the same one)
            if (r[0].id == r[1].id) worst_lp = fmax(worst_lp, fabs(r[0].logprob - r[1].logprob));
            tops &= r[0].n_top == r[1].n_top;
            for (int j = 0; j < r[0].n_top && j < r[1].n_top; j++)
                tops &= r[0].top_id[j] == r[1].top_id[j] &&
                        fabs(r[0].top_logprob[j] - r[1].top_logprob[j]) < 1e-4;
        }
    }
    char name[200];
    if (want_path >= 2) {
        snprintf(name, sizeof name,
                 "%s: both kernels in the exact id (f32 rounding) on %d of %d draws (the same id "
                 "on %d)",
                 what, exact, n, same);
        check_true(name, exact == n);
    } else {
        snprintf(name, sizeof name, "%s: candidate kernel = one-block kernel on %d of %d draws",
                 what, same, n);
        check_true(name, same == n);
    }
    snprintf(name, sizeof name, "%s: the candidate kernel drew %s on %d of %d", what,
             expect < 0       ? "by any path (the card cannot hold its grid)"
             : want_path == 0 ? "from its candidates"
             : want_path == 1 ? "by the one-block sampler"
             : want_path == 2 ? "without a floor"
                              : "by the multi-block selection",
             paths, n);
    check_true(name, paths == n);
    if (ties) {
        snprintf(name, sizeof name, "%s: %d of %d draws among the %d tied best", what, inties, n,
                 ties);
        check_true(name, inties == n);
    }
    if (n_logprobs >= 0) {
        snprintf(name, sizeof name, "%s: logprobs within %.1e, the same top %d", what, worst_lp,
                 n_logprobs);
        check_true(name, worst_lp < 1e-4 && tops);
    }
}

int main(void) {
    init_device();
    t_greedy(1000);
    t_greedy(248320);
    t_penalties();
    t_dist("temperature 1", 50, 1.f, 0, 1.f, 0.f, 20000);
    t_dist("top-k 5 temp 0.8", 1000, 0.8f, 5, 1.f, 0.f, 20000);
    t_dist("top-p 0.6 temp 0.7", 400, 0.7f, 0, 0.6f, 0.f, 20000);
    t_dist("min-p 0.1", 400, 1.f, 0, 1.f, 0.1f, 20000);
    t_dist("top-k 20 top-p 0.8 min-p 0.05", 248320, 0.7f, 20, 0.8f, 0.05f, 3000);
    t_dist("top-k 40 temp 1", 248320, 1.f, 40, 1.f, 0.f, 3000);
    // flat logits keep ~10^5 ids: the multi-block selection (the candidate kernel's) and the
    // one-block sampler's mass selection and draw
    t_dist("top-p 0.5 temp 1, vocab 248320 (multi-block)", 248320, 1.f, 0, 0.5f, 0.f, 3000);
    t_dist("min-p 0.02 temp 0.9, vocab 248320 (multi-block)", 248320, 0.9f, 0, 1.f, 0.02f, 3000);
    t_dist("top-p 0.5 temp 1, vocab 248320 (one-block)", 248320, 1.f, 0, 0.5f, 0.f, 3000, true);
    t_dist("min-p 0.02 temp 0.9, vocab 248320 (one-block)", 248320, 0.9f, 0, 1.f, 0.02f, 3000,
           true);
    t_topp_edges(true, 1);
    t_topp_edges(false, 16);
    t_topp_zero();
    t_same("top-k 20 top-p 0.95", 248320, 1.f, 20, 0.95f, 0.f, false, -1, 0, false, 200);
    t_same("top-k 64 temp 0.6 min-p 0.02 + penalties", 248320, 0.6f, 64, 1.f, 0.02f, true, -1, 0,
           false, 200);
    t_same("top-k 5 temp 1.3 + logprobs 20", 248320, 1.3f, 5, 0.9f, 0.f, false, 20, 0, false, 100);
    t_same("greedy + penalties + logprobs 5", 248320, 0.f, 0, 1.f, 0.f, true, 5, 0, false, 20);
    t_same("top-k 20, 100 tied best across a block boundary", 248320, 1.f, 20, 1.f, 0.f, false, -1,
           100, false, 200, 1);
    t_same("top-k 20, flat logits", 248320, 0.8f, 20, 0.9f, 0.f, false, 3, 0, true, 200);
    t_same("top-k 20, vocab 1000 (one block)", 1000, 1.f, 20, 0.95f, 0.f, false, -1, 0, false, 200);
    t_same("top-k 30, vocab 5000 (partial last block)", 5000, 1.f, 30, 0.95f, 0.f, true, 2, 0,
           false, 200);
    t_same("no top-k: top-p 0.9 temp 0.7, peaked", 248320, 0.7f, 0, 0.9f, 0.f, false, -1, 0, false,
           200, 3, 14.f);
    t_same("no top-k: min-p 0.2 + penalties + logprobs 4", 248320, 1.f, 0, 1.f, 0.2f, true, 4, 0,
           false, 200, 3);
    // the candidate kernel's own top-p and min-p (cards that cannot hold its grid at once)
    t_same("no top-k: top-p 0.9 temp 0.7, peaked (candidates)", 248320, 0.7f, 0, 0.9f, 0.f, false,
           -1, 0, false, 200, 0, 14.f, true);
    t_same("no top-k: min-p 0.2 + penalties + logprobs 4 (candidates)", 248320, 1.f, 0, 1.f, 0.2f,
           true, 4, 0, false, 200, 0, 3.f, true);
    t_same("no top-k: top-p 0.9 over random logits (candidates -> one-block)", 248320, 0.7f, 0,
           0.9f, 0.f, false, -1, 0, false, 30, 1, 0.f, true);
    t_same("no top-k: temperature 1 alone", 248320, 1.f, 0, 1.f, 0.f, false, -1, 0, false, 200, 2);
    t_same("no top-k: temperature 0.5 alone + logprobs 3, vocab 5000", 5000, 0.5f, 0, 1.f, 0.f,
           true, 3, 0, false, 200, 2);
    t_same("top-k >= vocab: temperature 1, vocab 1000", 1000, 1.f, 5000, 1.f, 0.f, false, -1, 0,
           false, 200, 2);
    t_same("no top-k: top-p 0.9 temp 0.7 over random logits (multi-block)", 248320, 0.7f, 0, 0.9f,
           0.f, false, -1, 0, false, 200, 3, 0.f);
    t_same("no top-k: top-p 0.95 min-p 0.02 + penalties + logprobs 4 (multi-block)", 248320, 1.f, 0,
           0.95f, 0.02f, true, 4, 0, false, 200, 3, 0.f);
    t_same("no top-k: min-p 0.05, vocab 4000 (multi-block, one block)", 4000, 1.f, 0, 1.f, 0.05f,
           false, -1, 0, false, 200, 3, 0.f);
    // every logit 0 but 30: the chosen value bin holds ~248K tied ids (beyond the list)
    t_same("no top-k: top-p 0.9 over tied flat logits (one-block)", 248320, 1.f, 0, 0.9f, 0.f,
           false, -1, 0, true, 30, 1);
    return finish("check_decode_sample");
}
