// End-to-end check on a real checkpoint directory (argv[1]): the CUDA backend against the CPU
// reference backend — logits of the decode step (n = 1) and of forward(n > 1) (rel L2, top-1
// agreement), greedy generation through the captured graph + GPU sampler vs the CPU's argmax loop
// (first 32 tokens), and snapshot restore + seeded sampling determinism. `int8`: both backends
// with the int8 KV cache (--kv-cache int8).
#include <algorithm>

#include "common_check.cuh"

extern "C" {
#include "backend/backend.h"
}

static std::vector<float> g_cpu_logits;
static std::vector<int32_t> g_gen;
static int collect(void *ud, const struct sampled_token *t) {
    (void)ud;
    g_gen.push_back(t->id);
    return 0;
}

static int argmax(const float *l, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

// Per-position rel L2 and top-1 agreement. A bf16 KV cache (CPU: f32) moves hidden states by
// ~1e-3, which on random-weight MoE models flips near-tied expert choices at a few positions (the
// CPU backend with its KV rounded to bf16 shows the same): unless `strict`, the bar is the median
// position (<= max_median) and 95% of positions within max_rel; strict: every position within
// max_rel.
static bool g_strict = false;
static void cmp_logits(const char *what, const float *g, const float *c, int T, int V,
                       double max_rel, double max_median) {
    std::vector<double> rels;
    int top1 = 0;
    for (int t = 0; t < T; t++) {
        double num = 0, den = 0;
        for (int i = 0; i < V; i++) {
            double d = (double)g[(size_t)t * V + i] - c[(size_t)t * V + i];
            num += d * d, den += (double)c[(size_t)t * V + i] * c[(size_t)t * V + i];
        }
        rels.push_back(sqrt(num / (den > 0 ? den : 1)));
        top1 += argmax(g + (size_t)t * V, V) == argmax(c + (size_t)t * V, V);
    }
    std::vector<double> srt = rels;
    std::sort(srt.begin(), srt.end());
    int within = 0;
    for (double r : rels) within += r <= max_rel;
    printf("     %s: rel L2 per position (first 8):", what);
    for (int t = 0; t < T && t < 8; t++) printf(" %.1e", rels[t]);
    printf(" ... worst %.2e at %d\n", srt.back(),
           (int)(std::max_element(rels.begin(), rels.end()) - rels.begin()));
    char name[200];
    if (g_strict) {
        snprintf(name, sizeof name, "%s: worst rel L2 %.2e <= %.0e (strict, %d positions)", what,
                 srt.back(), max_rel, T);
        check_true(name, srt.back() <= max_rel);
    } else {
        snprintf(name, sizeof name,
                 "%s: median rel L2 %.2e <= %.0e, %d/%d positions <= %.0e (worst %.2e)", what,
                 srt[T / 2], max_median, within, T, max_rel, srt.back());
        check_true(name, srt[T / 2] <= max_median && within >= 0.95 * T);
    }
    snprintf(name, sizeof name, "%s: top-1 agreement %d/%d (>= 98%%)", what, top1, T);
    check_true(name, top1 >= 0.98 * T);
}

int main(int argc, char **argv) {
    DIE_IF(argc < 2, "usage: check_decode_e2e MODEL_DIR [T] [strict] [int8]");
    const int T = argc > 2 ? atoi(argv[2]) : 64;
    bool int8 = false;
    for (int i = 3; i < argc; i++) {
        g_strict |= !strcmp(argv[i], "strict");
        int8 |= !strcmp(argv[i], "int8");
    }
    if (int8) printf("     int8 KV cache on both backends\n");
    struct wren_err e;
    struct model m;
    memset(&m, 0, sizeof m);
    DIE_IF(model_load(&m, argv[1], &e), "%s", e.msg);
    struct backend_opts oc = {"cpu", 0, 0, 0, int8}, og = {"cuda", 0, 0, 0, int8};
    struct backend *cpu = backend_create(&m, &oc, &e);
    DIE_IF(!cpu, "%s", e.msg);
    struct backend *gpu = backend_create(&m, &og, &e);
    DIE_IF(!gpu, "%s", e.msg);
    const int V = m.cfg.vocab, ctx = T + 128;
    std::vector<int32_t> tok(T);
    for (int i = 0; i < T; i++) tok[i] = (int32_t)(rnd_u32() % (V < 100000 ? V : 100000));
    struct bstate *cs = cpu->ops->state_new(cpu, ctx, &e), *gs = gpu->ops->state_new(gpu, ctx, &e);
    DIE_IF(!cs || !gs, "%s", e.msg);
    std::vector<float> cl((size_t)T * V), gl((size_t)T * V);
    for (int t = 0; t < T; t++) {
        DIE_IF(cpu->ops->forward(cpu, cs, t, &tok[t], 1, &cl[(size_t)t * V], false, &e), "cpu: %s",
               e.msg);
        DIE_IF(gpu->ops->forward(gpu, gs, t, &tok[t], 1, &gl[(size_t)t * V], false, &e), "cuda: %s",
               e.msg);
    }
    cmp_logits("decode step (n = 1) vs CPU", gl.data(), cl.data(), T, V, 2e-2, 2e-3);
    // forward(n > 1): the prefill path (fallback or batched)
    struct bstate *g2 = gpu->ops->state_new(gpu, ctx, &e);
    DIE_IF(!g2, "%s", e.msg);
    std::vector<float> pl((size_t)T * V);
    int half = T / 2;
    DIE_IF(gpu->ops->forward(gpu, g2, 0, tok.data(), half, pl.data(), true, &e), "cuda prefill: %s",
           e.msg);
    DIE_IF(gpu->ops->forward(gpu, g2, half, tok.data() + half, T - half,
                             pl.data() + (size_t)half * V, true, &e),
           "cuda prefill: %s", e.msg);
    // the prefill path runs its GEMMs on bf16 activations: issue 6's bar (rel L2 <= 2e-2) for the
    // median position too
    cmp_logits("forward n > 1 (two chunks) vs CPU", pl.data(), cl.data(), T, V, 2e-2, 2e-2);
    // greedy generation: CPU argmax loop vs GPU generate
    const int NG = 32;
    std::vector<int32_t> want;
    std::vector<float> lg(cl.end() - V, cl.end());
    for (int i = 0; i < NG; i++) {
        int32_t t = argmax(lg.data(), V);
        want.push_back(t);
        DIE_IF(cpu->ops->forward(cpu, cs, T + i, &t, 1, lg.data(), false, &e), "cpu: %s", e.msg);
    }
    struct sampler_params sp;
    memset(&sp, 0, sizeof sp);
    sp.temperature = 0, sp.top_p = 1, sp.repetition_penalty = 1, sp.n_vocab = V, sp.n_logprobs = -1;
    int ngen = 0, fed = 0;
    g_gen.clear();
    DIE_IF(gpu->ops->generate(gpu, gs, T, &sp, tok.data(), T, NG, collect, NULL, &ngen, &fed, &e),
           "generate: %s", e.msg);
    int same = 0;
    while (same < NG && same < (int)g_gen.size() && g_gen[same] == want[same]) same++;
    char name[160];
    snprintf(name, sizeof name,
             "greedy generate: %d/%d leading tokens equal the CPU's (fed %d of %d)", same, NG, fed,
             ngen);
    check_true(name, same == NG && ngen == NG && (fed == NG || fed == NG - 1));
    // snapshot: save after the prompt, generate, restore, generate again (greedy and seeded)
    struct bsnap *sn = gpu->ops->snap_save(gpu, g2, T, true, &e);
    DIE_IF(!sn, "%s", e.msg);
    sp.temperature = 0.8f, sp.top_k = 40, sp.top_p = 0.95f, sp.seed = 11;
    std::vector<int32_t> runs[2];
    for (int r = 0; r < 2; r++) {
        DIE_IF(gpu->ops->snap_restore(gpu, g2, sn, &e), "%s", e.msg);
        g_gen.clear();
        DIE_IF(
            gpu->ops->generate(gpu, g2, T, &sp, tok.data(), T, 24, collect, NULL, &ngen, &fed, &e),
            "%s", e.msg);
        runs[r] = g_gen;
    }
    check_true("snapshot restore + seeded sampling reproduces 24 tokens",
               runs[0] == runs[1] && runs[0].size() == 24);
    gpu->ops->snap_free(gpu, sn);
    gpu->ops->state_free(gpu, g2);
    gpu->ops->state_free(gpu, gs);
    cpu->ops->state_free(cpu, cs);
    gpu->ops->destroy(gpu);
    cpu->ops->destroy(cpu);
    model_free(&m);
    return finish("check_decode_e2e");
}
