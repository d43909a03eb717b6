// The timeline of one decode step, warp by warp (needs a build with -DWREN_DECODE_TRACE; see
// backend/cuda/decode_trace.cuh): replays the step graph at a context length on a checkpoint and
// prints, per launch, when its blocks became resident, when its programmatic wait released and when
// its warps left, relative to the previous launch's last warp. Then the same per launch kind,
// averaged: how much of the step each kind holds on the critical path (last warp out to last warp
// out), and how that splits into the boundary (previous last out -> first past the wait) and the
// launch's own work after its wait.
// With "greedy" or "sampled" the traced step is a generated one (the backend's generate: the first
// token's sampler, then the step graph with its sampler; sampled: temperature 1, top-k 20, top-p
// 0.95, the models' defaults), so the sampler kernels are on the timeline too; their marks: the
// first phase's selection, the last block's, its draw.
// usage: bench_decode_trace MODEL_DIR [CTX] [all] [blocks] [greedy|sampled]
//        (all: print every launch, not only the kinds; blocks: the attention split launches'
//        blocks, when each became resident and left, in block order)
#include <algorithm>
#include <map>
#include <string>

#include "common_check.cuh"

extern "C" {
#include "backend/backend.h"
}

namespace {

struct launch {
    unsigned long long grid;
    std::vector<trace_rec> w;
    unsigned long long t0_min = ~0ull, t0_max = 0, tw_min = ~0ull, tw_max = 0, t1_max = 0;
    std::vector<double> t1s;
    int blocks = 0;
};

// The launch sequence of decode_enqueue (decode_step.cu), for labels (fused: the MoE experts in
// one launch, moe_fused).
std::vector<std::string> labels(const struct model_config *c, bool fused) {
    std::vector<std::string> l = {"embed"};
    for (int i = 0; i < c->n_layers; i++) {
        if (c->kind[i] == LAYER_DELTANET) {
            l.insert(l.end(), {"dn in_proj", "dn step", "dn out_proj"});
        } else {
            l.insert(l.end(),
                     {"attn qkv", "attn prep", "attn split", "attn combine", "attn o_proj"});
        }
        if (c->n_experts > 0) l.push_back("router");
        if (fused)
            l.push_back("moe fused");
        else
            l.insert(l.end(), {"moe gate/up", "moe down"});
    }
    l.push_back("lm_head");
    return l;
}

double med(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// One launch's blocks in block order: (block, SM, resident, left) in µs after the previous
// launch's last warp out, then the ten that left last.
void block_table(const launch &l, unsigned long long prev_end) {
    std::map<unsigned, std::pair<unsigned long long, unsigned long long>> b; // block: (in, out)
    std::map<unsigned, unsigned> sm;
    for (auto &r : l.w) {
        auto it = b.find(r.block);
        if (it == b.end())
            b[r.block] = {r.t0, r.t1};
        else
            it->second.first = std::min(it->second.first, r.t0),
            it->second.second = std::max(it->second.second, r.t1);
        sm[r.block] = r.sm;
    }
    auto rel = [&](unsigned long long t) { return ((double)t - (double)prev_end) / 1e3; };
    printf("blocks (block sm in out):");
    int k = 0;
    std::vector<std::pair<double, unsigned>> outs;
    for (auto &kv : b) {
        printf("%s%u %u %.2f %.2f", k++ % 6 ? " | " : "\n  ", kv.first, sm[kv.first],
               rel(kv.second.first), rel(kv.second.second));
        outs.push_back({rel(kv.second.second), kv.first});
    }
    std::sort(outs.begin(), outs.end());
    printf("\n  last out:");
    for (size_t i = outs.size() > 10 ? outs.size() - 10 : 0; i < outs.size(); i++)
        printf(" %u (%.2f)", outs[i].second, outs[i].first);
    printf("; median out %.2f\n", outs[outs.size() / 2].first);
}

} // namespace

int main(int argc, char **argv) {
    DIE_IF(argc < 2, "usage: bench_decode_trace MODEL_DIR [CTX] [all] [blocks] [greedy|sampled]");
    const int ctx = argc > 2 ? atoi(argv[2]) : 4096;
    bool all = false, blocks = false;
    int gen = 0; // 1 greedy, 2 sampled
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "all"))
            all = true;
        else if (!strcmp(argv[i], "blocks"))
            blocks = true;
        else if (!strcmp(argv[i], "greedy") || !strcmp(argv[i], "sampled"))
            gen = argv[i][0] == 'g' ? 1 : 2;
        else
            DIE_IF(true, "unknown argument %s", argv[i]);
    }
    DIE_IF(decode_trace_enable(NULL) != 0,
           "this build has no decode trace: configure with -DCMAKE_CUDA_FLAGS=-DWREN_DECODE_TRACE");
    struct wren_err e;
    struct model m;
    memset(&m, 0, sizeof m);
    DIE_IF(model_load(&m, argv[1], &e), "%s", e.msg);
    struct backend_opts og = {"cuda", 0, 0, 0, false};
    struct backend *gpu = backend_create(&m, &og, &e);
    DIE_IF(!gpu, "%s", e.msg);
    struct bstate *s = gpu->ops->state_new(gpu, ctx + 16, &e);
    DIE_IF(!s, "%s", e.msg);
    const int cap = 1 << 21;
    trace_buf *buf;
    CK(cudaMalloc(&buf, sizeof(trace_buf) + (size_t)cap * sizeof(trace_rec)));
    int32_t tok = 1;
    // the KV below ctx is whatever the allocation held: the kernels read the same bytes either way
    for (int i = 0; i < 4; i++) // the graph is captured by the first, the rest warm up
        DIE_IF(gpu->ops->forward(gpu, s, ctx + i, &tok, 1, NULL, false, &e), "%s", e.msg);
    CK(cudaDeviceSynchronize());
    const unsigned hdr[2] = {0, (unsigned)cap};
    CK(cudaMemcpy(buf, hdr, sizeof hdr, cudaMemcpyHostToDevice));
    struct sampler_params sp;
    memset(&sp, 0, sizeof sp);
    sp.temperature = gen == 2 ? 1.f : 0.f, sp.top_k = gen == 2 ? 20 : 0;
    sp.top_p = gen == 2 ? 0.95f : 1.f, sp.repetition_penalty = 1.f, sp.seed = 1;
    sp.n_vocab = m.cfg.vocab, sp.n_logprobs = -1;
    int ngen, fed;
    // two tokens: the first from the logits at hand, the second after one step (captured by the
    // untraced call)
    auto generate = [&](int pos) {
        DIE_IF(gpu->ops->generate(gpu, s, pos, &sp, &tok, 1, 2, NULL, NULL, &ngen, &fed, &e), "%s",
               e.msg);
    };
    if (gen) generate(ctx + 4);
    CK(cudaDeviceSynchronize());
    DIE_IF(decode_trace_enable(buf), "enabling the trace failed");
    if (gen)
        generate(ctx + 6);
    else
        DIE_IF(gpu->ops->forward(gpu, s, ctx + 4, &tok, 1, NULL, false, &e), "%s", e.msg);
    CK(cudaDeviceSynchronize());
    DIE_IF(decode_trace_enable(NULL), "disabling the trace failed");
    unsigned n;
    CK(cudaMemcpy(&n, buf, sizeof n, cudaMemcpyDeviceToHost));
    DIE_IF(n > (unsigned)cap, "trace buffer too small (%u records)", n);
    std::vector<trace_rec> rec(n);
    CK(cudaMemcpy(rec.data(), buf->rec, n * sizeof(trace_rec), cudaMemcpyDeviceToHost));

    std::map<unsigned long long, launch> by_grid;
    for (auto &r : rec) {
        launch &l = by_grid[r.grid];
        l.grid = r.grid;
        l.w.push_back(r);
    }
    std::vector<launch> L;
    for (auto &kv : by_grid) L.push_back(kv.second);
    unsigned long long t00 = ~0ull;
    for (auto &l : L) {
        std::vector<unsigned> blocks;
        for (auto &r : l.w) {
            l.t0_min = std::min(l.t0_min, r.t0), l.t0_max = std::max(l.t0_max, r.t0);
            if (r.tw) l.tw_min = std::min(l.tw_min, r.tw), l.tw_max = std::max(l.tw_max, r.tw);
            l.t1_max = std::max(l.t1_max, r.t1);
            blocks.push_back(r.block);
        }
        std::sort(blocks.begin(), blocks.end());
        l.blocks = (int)(std::unique(blocks.begin(), blocks.end()) - blocks.begin());
        t00 = std::min(t00, l.t0_min);
    }
    std::sort(L.begin(), L.end(),
              [](const launch &a, const launch &b) { return a.t0_min < b.t0_min; });
    std::vector<std::string> lab = labels(&m.cfg, false);
    if (gen) lab.insert(lab.begin(), "sample"), lab.push_back("sample");
    if (lab.size() != L.size()) {
        lab = labels(&m.cfg, true);
        if (gen) lab.insert(lab.begin(), "sample"), lab.push_back("sample");
    }
    const bool named = lab.size() == L.size();
    printf("decode step at context %d: %zu launches traced (%s), %u warp records, %.1f us from the "
           "first warp in to the last warp out\n",
           ctx, L.size(), named ? "labelled by the launch sequence" : "sequence not recognised", n,
           (L.back().t1_max - t00) / 1e3);
    auto us = [&](unsigned long long t) { return (double)(t - t00) / 1e3; };
    struct agg {
        int n = 0;
        double crit = 0, bound = 0, post = 0, late = 0, early = 0, tailw = 0;
        double ph[4] = {0, 0, 0, 0}, lph[4] = {0, 0, 0, 0}; // phases: median warp, last warp out
        double lpre = 0, llate = 0; // the last warp out: entry -> wait; resident late
        bool marks = false;
    };
    std::map<std::string, agg> kinds;
    std::vector<std::string> order;
    if (all)
        printf("%4s %-13s %6s %5s | %9s %9s | %9s %9s | %9s %9s | %7s %7s %7s\n", "#", "launch",
               "blocks", "warps", "in first", "in last", "wait 1st", "wait last", "out med",
               "out last", "bound", "own", "crit");
    int fused_tables = 0;
    unsigned long long prev_end = L[0].t0_min;
    for (size_t i = 0; i < L.size(); i++) {
        launch &l = L[i];
        std::vector<double> outs;
        for (auto &r : l.w) outs.push_back(us(r.t1));
        const unsigned long long wait1 = l.tw_min != ~0ull ? l.tw_min : l.t0_min;
        const double bound = (double)((long long)wait1 - (long long)prev_end) / 1e3;
        const double own = (double)(l.t1_max - wait1) / 1e3;
        const double crit = (double)((long long)l.t1_max - (long long)prev_end) / 1e3;
        // blocks that became resident after the previous launch had finished
        int late = 0, early = 0;
        for (auto &r : l.w)
            if (r.warp == 0) (r.t0 > prev_end ? late : early)++;
        const std::string name = named ? lab[i] : std::to_string(i);
        if (all)
            printf("%4zu %-13s %6d %5zu | %9.2f %9.2f | %9.2f %9.2f | %9.2f %9.2f | %7.2f %7.2f "
                   "%7.2f\n",
                   i, name.c_str(), l.blocks, l.w.size(), us(l.t0_min), us(l.t0_max), us(wait1),
                   l.tw_max ? us(l.tw_max) : 0.0, med(outs), us(l.t1_max), bound, own, crit);
        if (!kinds.count(name)) order.push_back(name);
        agg &a = kinds[name];
        a.n++, a.crit += crit, a.bound += bound, a.post += own;
        a.late += late, a.early += early;
        a.tailw += us(l.t1_max) - med(outs);
        // phases of a warp with marks: wait -> mark 0 (routing), -> mark 1 (prologue), -> mark 2
        // (its last epilogue begins), -> out; and of the last warp out, also entry -> wait
        std::vector<double> ph[4];
        const trace_rec *lastw = nullptr;
        auto phases = [](const trace_rec &r, double(&d)[4]) {
            const unsigned long long m0 = r.tm[0] ? r.tm[0] : r.tw;
            const unsigned long long m2 = r.tm[2] ? r.tm[2] : r.t1;
            d[0] = (m0 - r.tw) / 1e3, d[1] = (r.tm[1] - m0) / 1e3, d[2] = (m2 - r.tm[1]) / 1e3;
            d[3] = (r.t1 - m2) / 1e3;
        };
        for (auto &r : l.w) {
            if (!r.tw || !r.tm[1]) continue;
            double d[4];
            phases(r, d);
            for (int k = 0; k < 4; k++) ph[k].push_back(d[k]);
            if (!lastw || r.t1 > lastw->t1) lastw = &r;
        }
        if (lastw) {
            a.marks = true;
            double d[4];
            phases(*lastw, d);
            for (int k = 0; k < 4; k++) a.ph[k] += med(ph[k]), a.lph[k] += d[k];
            a.lpre += (lastw->tw - lastw->t0) / 1e3;
            a.llate += lastw->t0 > prev_end;
        }
        if (blocks && (name == "attn split" || (name == "moe fused" && fused_tables++ < 2)))
            block_table(l, prev_end);
        prev_end = l.t1_max;
    }
    printf("\n%-13s %5s %10s %9s %9s %9s %11s %12s\n", "kind", "count", "crit total", "crit avg",
           "boundary", "own work", "last-median", "blocks late");
    double tot = 0;
    for (auto &k : order) {
        agg &a = kinds[k];
        tot += a.crit;
        printf("%-13s %5d %8.1f us %9.2f %9.2f %9.2f %11.2f %7.0f/%-4.0f\n", k.c_str(), a.n, a.crit,
               a.crit / a.n, a.bound / a.n, a.post / a.n, a.tailw / a.n, a.late / a.n,
               (a.late + a.early) / a.n);
    }
    printf("(crit: previous launch's last warp out -> this launch's last warp out; boundary: -> "
           "its first warp past the wait; own: first past the wait -> last out; last-median: "
           "last warp out minus the median warp out; blocks late: resident only after the "
           "previous launch had finished, of all; total %.1f us)\n",
           tot);
    printf("\nphases after the wait (us; kinds with marks): median warp | the last warp out "
           "(and its entry -> wait, and how often it was resident only after the previous launch "
           "ended)\n");
    printf("%-13s %7s %7s %7s %7s | %7s %7s %7s %7s %7s %5s\n", "kind", "routing", "prolog", "loop",
           "epilog", "routing", "prolog", "loop", "epilog", "in->wt", "late");
    for (auto &k : order) {
        agg &a = kinds[k];
        if (!a.marks) continue;
        printf("%-13s %7.2f %7.2f %7.2f %7.2f | %7.2f %7.2f %7.2f %7.2f %7.2f %4.0f%%\n", k.c_str(),
               a.ph[0] / a.n, a.ph[1] / a.n, a.ph[2] / a.n, a.ph[3] / a.n, a.lph[0] / a.n,
               a.lph[1] / a.n, a.lph[2] / a.n, a.lph[3] / a.n, a.lpre / a.n, 100 * a.llate / a.n);
    }
    CK(cudaFree(buf));
    gpu->ops->state_free(gpu, s);
    gpu->ops->destroy(gpu);
    model_free(&m);
    return 0;
}
