// MoE prefill on the GPU (routing, grouped gate+up SwiGLU GEMM, grouped down GEMM, weighted
// combine with the gated shared expert) vs a CPU MoE block. Routing is random and uneven: one
// expert takes every token, several take none. Every configuration runs on the portable mma.sync
// kernel, the automatic choice and each forced wgmma variant (PATHS; the sm_90a kernel where
// available). `--bench`: the 35B expert shapes at several T, both kernels, several tile heights.
#include <algorithm>

#include "check_prefill_util.cuh"

struct moe_dev {
    moe_route_buf rb;
    float *logits, *y, *x, *sh, *shg;
    uint16_t *A, *h;
};

static moe_dev alloc_moe(int T, int E, int k, int H, int I, int bm) {
    moe_dev m;
    m.rb.max_tiles = pf_moe_max_tiles(T, E, k, bm);
    m.rb.topk_id = dev_poison<int>((size_t)T * k);
    m.rb.topk_w = dev_poison<float>((size_t)T * k);
    m.rb.counts = dev_poison<int>(E + 1);
    m.rb.offsets = dev_poison<int>(E + 1);
    m.rb.cursor = dev_poison<int>(E + 1);
    m.rb.sorted_tok = dev_poison<int>((size_t)T * k);
    m.rb.slot = dev_poison<int>((size_t)T * k);
    m.rb.tiles = dev_poison<int>((size_t)3 * m.rb.max_tiles);
    m.rb.n_tiles = dev_poison<int>(1);
    m.y = dev_poison<float>((size_t)T * k * H);
    m.h = dev_poison<uint16_t>((size_t)T * k * I);
    m.logits = m.x = m.sh = m.shg = nullptr;
    m.A = nullptr;
    return m;
}

static void free_moe(moe_dev &m) {
    for (void *q :
         {(void *)m.rb.topk_id, (void *)m.rb.topk_w, (void *)m.rb.counts, (void *)m.rb.offsets,
          (void *)m.rb.cursor, (void *)m.rb.sorted_tok, (void *)m.rb.slot, (void *)m.rb.tiles,
          (void *)m.rb.n_tiles, (void *)m.y, (void *)m.h, (void *)m.logits, (void *)m.x,
          (void *)m.A, (void *)m.sh, (void *)m.shg})
        CK(cudaFree(q));
}

static void run_moe(cudaStream_t s, moe_dev &m, int T, int E, int k, int H, int I, int bm,
                    const tmat &G, const tmat &U, const tmat &D, bool with_shared) {
    OK(pf_moe_route(s, m.logits, T, E, k, true, bm, &m.rb, ERR));
    gemm_group g1 = {m.rb.tiles, m.rb.n_tiles, m.rb.max_tiles, bm, m.rb.sorted_tok};
    OK(pf_gemm(s, (const bf16 *)m.A, H, T * k, &G.d, &U.d, m.h, I, EPI_SWIGLU_BF16, &g1, ERR));
    gemm_group g2 = {m.rb.tiles, m.rb.n_tiles, m.rb.max_tiles, bm, nullptr};
    OK(pf_gemm(s, (const bf16 *)m.h, I, T * k, &D.d, nullptr, m.y, H, EPI_F32, &g2, ERR));
    OK(pf_moe_combine(s, m.x, m.y, m.rb.slot, m.rb.topk_w, T, k, H, with_shared ? m.sh : nullptr,
                      m.shg, ERR));
}

// The GPU paths every configuration runs: mma.sync, automatic (wgmma: the item shape by the tile
// map), shapes 1-3, shape 1 with 2, 4 and 8 weight-row blocks per CTA (where the shapes allow it),
// shape 4, shape 1 with 4 blocks on the kernel without the loader warpgroup. PF_CHECK_PATHS=a,b,...
// runs only those (ids below; unset or empty: all).
static const int PATHS[] = {-1, 0, 1, 2, 3, 4, 5, 6, 7, 8};
static const char *set_path(int path) {
    pf_gemm_force_path(path == -1 ? 1 : 0);
    pf_gemm_wg_shape(path < 0 ? 0 : path == 6 ? 4 : path > 3 ? 1 : path);
    pf_gemm_wg_blocks(path == 4 ? 2 : path == 5 || path == 8 ? 4 : path == 7 ? 8 : 0);
    pf_gemm_wg_producer(path == 8 ? 0 : 1);
    // both orders of the tile map (the checks' experts have too few rows for the automatic choice
    // to order them by size)
    pf_moe_tiles_by_size(path == 8 ? 0 : 1);
    return path == -1  ? " [mma]"
           : path == 0 ? " [auto]"
           : path == 1 ? " [r128]"
           : path == 2 ? " [r256]"
           : path == 3 ? " [r256 t32]"
           : path == 4 ? " [r128 nb2]"
           : path == 5 ? " [r128 nb4]"
           : path == 7 ? " [r128 nb8]"
           : path == 8 ? " [r128 nb4, no loader warpgroup, tiles in expert order]"
                       : " [r128 t128 2cta]";
}

static bool path_selected(int path) {
    const char *only = getenv("PF_CHECK_PATHS");
    if (!only || !*only) return true;
    char key[8];
    snprintf(key, sizeof key, "%d", path);
    for (const char *q = only; *q;) {
        const size_t n = strcspn(q, ",");
        if (n == strlen(key) && !strncmp(q, key, n)) return true;
        q += n + (q[n] == ',');
    }
    return false;
}

// One configuration: random uneven routing, the CPU reference once, then every selected path.
static void check(int T, int E, int k, int H, int I, int bm0) {
    tmat G = make_tmat(WT_Q4, E, I, H, 64), U = make_tmat(WT_Q4, E, I, H, 64),
         D = make_tmat(WT_Q4, E, H, I, 64);
    std::vector<float> logits((size_t)T * E), x0((size_t)T * H), sh((size_t)T * H), shg(2 * T);
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) {
            float v = rnd_n() * 2.f;
            if (e == 1) v += 30.f;               // expert 1 takes every token
            if (e >= E - 3) v -= 100.f;          // the last three take none
            if (e == 5 && t % 7 == 0) v += 12.f; // expert 5 some
            logits[(size_t)t * E + e] = v;
        }
    for (auto &v : x0) v = rnd_n();
    for (auto &v : sh) v = rnd_n();
    for (auto &v : shg) v = rnd_n();
    std::vector<uint16_t> A = rand_bf16((size_t)T * H, 1.f);

    // CPU: softmax, top-k, renormalise; experts on bf16-rounded weights and a bf16 hidden vector
    std::vector<float> ref = x0;
    std::vector<int> ref_id((size_t)T * k);
    std::vector<float> h(I);
    for (int t = 0; t < T; t++) {
        const float *lr = &logits[(size_t)t * E];
        float mx = *std::max_element(lr, lr + E);
        std::vector<double> p(E);
        double sum = 0;
        for (int e = 0; e < E; e++) sum += p[e] = exp((double)lr[e] - mx);
        std::vector<int> idx(E);
        for (int e = 0; e < E; e++) idx[e] = e;
        std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return p[a] > p[b]; });
        double psum = 0;
        for (int j = 0; j < k; j++) psum += p[idx[j]] / sum;
        for (int j = 0; j < k; j++) {
            int e = idx[j];
            ref_id[(size_t)t * k + j] = e;
            double w = p[e] / sum / psum;
            for (int i = 0; i < I; i++) {
                double g = 0, u = 0;
                for (int c = 0; c < H; c++) {
                    double a = h_f32(A[(size_t)t * H + c]);
                    g += a * round_bf16(G.at(e, i, c));
                    u += a * round_bf16(U.at(e, i, c));
                }
                h[i] = round_bf16(h_silu((float)g) * (float)u);
            }
            for (int c = 0; c < H; c++) {
                double y = 0;
                for (int i = 0; i < I; i++) y += (double)h[i] * round_bf16(D.at(e, c, i));
                ref[(size_t)t * H + c] += (float)(w * y);
            }
        }
        float sg = 1.f / (1.f + expf(-shg[2 * t]));
        for (int c = 0; c < H; c++) ref[(size_t)t * H + c] += sg * sh[(size_t)t * H + c];
    }
    // compare the MoE contribution (out - x0), not the residual that dominates it
    for (size_t i = 0; i < ref.size(); i++) ref[i] -= x0[i];

    for (int path : PATHS) {
        if (!path_selected(path)) continue;
        const char *name = set_path(path);
        int bm = bm0;
        if (bm > pf_gemm_wg_tokens() && pf_gemm_wg_available()) bm = pf_gemm_wg_tokens();
        moe_dev m = alloc_moe(T, E, k, H, I, bm);
        m.logits = dev_upload(logits);
        m.x = dev_upload(x0);
        m.sh = dev_upload(sh);
        m.shg = dev_upload(shg);
        m.A = dev_upload(A);
        run_moe(0, m, T, E, k, H, I, bm, G, U, D, true);
        CK(cudaDeviceSynchronize());
        std::vector<float> got = dev_download(m.x, (size_t)T * H);
        std::vector<int> gid = dev_download(m.rb.topk_id, (size_t)T * k);
        int id_mismatch = 0;
        for (size_t i = 0; i < gid.size(); i++) id_mismatch += gid[i] != ref_id[i];
        char what[160];
        snprintf(what, sizeof what, "moe%s T=%d E=%d k=%d H=%d I=%d bm=%d (top-k ids %d/%d equal)",
                 name, T, E, k, H, I, bm, T * k - id_mismatch, T * k);
        for (size_t i = 0; i < got.size(); i++) got[i] -= x0[i];
        report(what, id_mismatch ? INFINITY : rel_l2(got.data(), ref.data(), got.size()), 2e-3);
        free_moe(m);
    }
    set_path(0);
    pf_moe_tiles_by_size(-1);
    free_tmat(G), free_tmat(U), free_tmat(D);
}

// wg: 0 mma, else the wgmma kernel's item shape; nb: its weight-row blocks per CTA (0: automatic)
static void bench(int T, int bm, int wg, int nb = 0) {
    const int E = 256, k = 8, H = 2048, I = 512;
    static tmat G = make_tmat(WT_Q4, E, I, H, 64), U = make_tmat(WT_Q4, E, I, H, 64),
                D = make_tmat(WT_Q4, E, H, I, 64);
    std::vector<float> logits((size_t)T * E);
    for (auto &v : logits) v = rnd_n();
    pf_gemm_force_path(wg ? 0 : 1);
    pf_gemm_wg_shape(wg);
    pf_gemm_wg_blocks(nb);
    moe_dev m = alloc_moe(T, E, k, H, I, bm);
    m.logits = dev_upload(logits);
    m.x = dev_poison<float>((size_t)T * H);
    CK(cudaMemset(m.x, 0, sizeof(float) * T * H));
    m.A = dev_upload(rand_bf16((size_t)T * H, 1.f));
    gpu_timer tm;
    run_moe(0, m, T, E, k, H, I, bm, G, U, D, false);
    const int reps = 10;
    float t_route = 0, t_gu = 0, t_down = 0;
    for (int r = 0; r < reps; r++) {
        tm.start(0);
        OK(pf_moe_route(0, m.logits, T, E, k, true, bm, &m.rb, ERR));
        t_route += tm.stop_ms(0);
        gemm_group g1 = {m.rb.tiles, m.rb.n_tiles, m.rb.max_tiles, bm, m.rb.sorted_tok};
        tm.start(0);
        OK(pf_gemm(0, (const bf16 *)m.A, H, T * k, &G.d, &U.d, m.h, I, EPI_SWIGLU_BF16, &g1, ERR));
        t_gu += tm.stop_ms(0);
        gemm_group g2 = {m.rb.tiles, m.rb.n_tiles, m.rb.max_tiles, bm, nullptr};
        tm.start(0);
        OK(pf_gemm(0, (const bf16 *)m.h, I, T * k, &D.d, nullptr, m.y, H, EPI_F32, &g2, ERR));
        t_down += tm.stop_ms(0);
    }
    t_route /= reps, t_gu /= reps, t_down /= reps;
    double f_gu = 2.0 * T * k * 2 * I * H, f_down = 2.0 * T * k * H * I;
    pf_gemm_force_path(0);
    pf_gemm_wg_shape(0);
    pf_gemm_wg_blocks(0);
    free_moe(m);
    printf("bench moe %-10s nb=%d T=%6d bm=%3d: route %.3f ms, gate+up %.3f ms (%.0f TFLOP/s), "
           "down %.3f ms "
           "(%.0f TFLOP/s), experts %.0f TFLOP/s\n",
           wg == 1   ? "wgmma"
           : wg == 2 ? "wgmma r256"
           : wg == 3 ? "wgmma s3"
           : wg == 4 ? "wgmma s4"
                     : "mma",
           nb, T, bm, t_route, t_gu, f_gu / t_gu / 1e9, t_down, f_down / t_down / 1e9,
           (f_gu + f_down) / (t_gu + t_down) / 1e9);
}

int main(int argc, char **argv) {
    printf("wgmma kernel: %s\n", pf_gemm_wg_available() ? "available" : "not available");
    if (argc > 2 && !strcmp(argv[1], "--bench-only")) {
        // one prompt length, the wgmma item shapes 1 (weight-row blocks per CTA automatic, then 1,
        // 2, 4 and 8; the same with the tile map in expert order), 2, 4 and (up to 2K tokens) 3,
        // then the mma.sync kernel with 128-row tiles (for profilers and A/B runs): no checks
        const int T = atoi(argv[2]);
        if (T <= 0 || !pf_gemm_wg_available()) {
            fprintf(stderr, "usage: check_prefill_moe --bench-only T (needs the sm_90a kernel)\n");
            return 2;
        }
        bench(T, 256, 1);
        for (int nb : {1, 2, 4, 8}) bench(T, 256, 1, nb);
        pf_moe_tiles_by_size(0);
        printf("(tile map in expert order)\n");
        bench(T, 256, 1);
        for (int nb : {2, 4, 8}) bench(T, 256, 1, nb);
        pf_moe_tiles_by_size(-1);
        // shape 1 without the loader warpgroup (the kernel every thread of which loads)
        pf_gemm_wg_producer(0);
        printf("(no loader warpgroup)\n");
        bench(T, 256, 1);
        for (int nb : {1, 2, 4}) bench(T, 256, 1, nb);
        pf_gemm_wg_producer(1);
        bench(T, 128, 2), bench(T, 128, 4);
        if (T <= 2048) bench(T, 32, 3);
        bench(T, 128, 0);
        return 0;
    }
    check(200, 16, 4, 256, 128, 32); // tiles of <= 32 rows: wgmma item shape 3
    check(200, 16, 4, 256, 128, 64);
    check(200, 16, 4, 256, 128, 128);
    check(300, 8, 4, 256, 128, 256); // the hot expert: 256 + 44 rows
    check(37, 24, 8, 128, 64, 64);
    check(1, 16, 4, 128, 64, 128);
    check(96, 16, 8, 2048, 512, 256); // the 35B expert shapes (K = 2048 and 512)
    check(150, 8, 2, 1024, 512, 256); // 8 weight-row blocks in both GEMMs: several per CTA
    // K = 256 (4 k-tiles) with 4 gate/up blocks per CTA (path nb4): the scale slots are reused
    // with the least margin the loader warpgroup allows
    check(120, 8, 4, 256, 256, 256);
    if (argc > 1 && !strcmp(argv[argc - 1], "--bench")) {
        // PF_BENCH_TMAX: skip longer prompts (quick comparisons)
        const int tmax = getenv("PF_BENCH_TMAX") ? atoi(getenv("PF_BENCH_TMAX")) : 1 << 30;
        for (int T : {256, 512, 1024, 2048, 4096, 8192, 16384, 32768}) {
            if (T > tmax) break;
            for (int bm : {64, 128, 256})
                if (T * 8 / 256 >= bm / 4 && T * 8 / 256 <= bm * 8) bench(T, bm, 0);
            if (pf_gemm_wg_available()) bench(T, 256, 1), bench(T, 128, 2), bench(T, 128, 4);
            if (pf_gemm_wg_available() && T <= 2048) bench(T, 32, 3);
        }
    }
    printf(g_fail ? "check_prefill_moe: FAIL\n" : "check_prefill_moe: all ok\n");
    return g_fail;
}
