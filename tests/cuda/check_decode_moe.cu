// MoE down-projection check: routed experts (device ids, weights folded into the activations) plus
// the shared expert in the same or a different format, accumulated into the residual; and the
// experts in one launch (moe_fused) against the host and against the two-launch path.
#include "common_check.cuh"

// Writes the real ids only after ~spin cycles, while (programmatic launch) the down launch after
// it may already run: its blocks then read stale ids before their wait.
__global__ void late_ids_kernel(int *dst, const int *src, int K, long long spin) {
    pdl_trigger();
    const long long t0 = clock64();
    while (clock64() - t0 < spin) {
    }
    for (int k = threadIdx.x; k < K; k += blockDim.x) dst[k] = src[k];
}

// late: the ids arrive from a kernel still running when the down launch starts (the speculative
// weight loads before the wait must then be discarded)
static void t_down(int bits, int sh_bits, int E, int K, int inter, int sh_inter, int hidden,
                   bool late = false) {
    struct tmat D = make_mat(E, hidden, inter, bits, 64);
    struct tmat S = make_mat(1, hidden, sh_inter > 0 ? sh_inter : 64, sh_bits, 64);
    std::vector<int> ids(K);
    for (int k = 0; k < K; k++) ids[k] = (int)(rnd_u32() % E); // repeats allowed
    std::vector<float> act = rnd_vec((size_t)K * inter + sh_inter, -1, 1),
                       res = rnd_vec(hidden, -1, 1);
    int *dids = dev_copy(ids);
    float *dact = dev_copy(act), *out = dev_copy(res);
    struct moe_down_params p;
    memset(&p, 0, sizeof p);
    p.down = D.d, p.sh_down = S.d, p.ids = dids, p.K = K, p.act = dact, p.inter = inter,
    p.sh_inter = sh_inter;
    p.out = out, p.hidden = hidden;
    if (late) {
        std::vector<int> stale(K);
        for (int k = 0; k < K; k++) stale[k] = (ids[k] + 1 + k) % E;
        int *real = dids;
        dids = dev_copy(stale);
        p.ids = dids;
        cudaStream_t st;
        CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        late_ids_kernel<<<1, 32, 0, st>>>(dids, real, K, 200000);
        CK(cudaGetLastError());
        WK(moe_down_launch(&p, st, &err_));
        CK(cudaStreamSynchronize(st));
        CK(cudaStreamDestroy(st));
    } else {
        WK(moe_down_launch(&p, 0, &err_));
    }
    std::vector<float> want(hidden), qe = qx_err(act.data(), act.size());
    std::vector<double> bound(hidden);
    for (int o = 0; o < hidden; o++) {
        double s = res[o], b = 0;
        for (int k = 0; k < K; k++) {
            s += ref_dot(D, ids[k], o, &act[(size_t)k * inter]);
            b += qx_bound(D, ids[k], o, &qe[(size_t)k * inter]);
        }
        if (sh_inter) {
            s += ref_dot(S, 0, o, &act[(size_t)K * inter]);
            b += qx_bound(S, 0, o, &qe[(size_t)K * inter]);
        }
        want[o] = (float)s, bound[o] = b;
    }
    char name[128];
    snprintf(name, sizeof name, "moe down b%d (shared b%d) K%d %dx%d +%d%s", bits, sh_bits, K,
             hidden, inter, sh_inter, late ? ", ids written late" : "");
    check_close_b(name, host_copy(out, hidden).data(), want.data(), bound, 2e-3f, 2e-3f);
}

// The router launch (sharing its int8 input), then the experts either as the expert launch + the
// down launch (the path checked above and in check_decode_gemv) or as one moe_fused launch. The
// fused result is checked against the host (the down projection of the two-launch path's
// expert outputs, with their int8 bound) and against the two-launch result; it must not depend
// on block timing (a second run gives the same bits) and leaves its accumulator and ticket zero.
static void t_fused(int E, int K, int inter, int sh_inter, int hidden, int group, bool shg) {
    const int gd = inter % 64 || sh_inter % 64 ? 32 : 64; // down group (divides inter)
    struct tmat R = make_mat(1, E, hidden, 8, 64), G1 = make_mat(1, 1, hidden, 8, 64);
    struct tmat Gt = make_mat(E, inter, hidden, 4, group),
                Up = make_mat(E, inter, hidden, 4, group), Dn = make_mat(E, hidden, inter, 4, gd);
    const int si = sh_inter > 0 ? sh_inter : 64; // (unused without a shared expert)
    struct tmat Sg = make_mat(1, si, hidden, 4, group), Su = make_mat(1, si, hidden, 4, group),
                Sd = make_mat(1, hidden, si, 4, gd);
    std::vector<float> x = rnd_vec(hidden, -2, 2), nw = rnd_vec(hidden, 0.5f, 1.5f);
    float *dx = dev_copy(x), *dnw = dev_copy(nw), *rlog = dev_poison(E + 1),
          *wts = dev_poison(K + 1), *act = dev_poison((size_t)K * inter + sh_inter);
    float *xa = dev_copy(x), *xb = dev_copy(x), *xc = dev_copy(x);
    int *ids;
    CK(cudaMalloc(&ids, (K + 1) * 4));
    CK(cudaMemset(ids, 0xff, (K + 1) * 4));
    uint8_t *qxb;
    CK(cudaMalloc(&qxb, gemv_qx_bytes(hidden)));
    long long *acc;
    unsigned *ticket;
    CK(cudaMalloc(&acc, ((size_t)hidden + 1) * 8));
    CK(cudaMemset(acc, 0, ((size_t)hidden + 1) * 8));
    CK(cudaMalloc(&ticket, 4));
    CK(cudaMemset(ticket, 0, 4));

    struct gemv_params rp, gp;
    memset(&rp, 0, sizeof rp);
    rp.x = dx, rp.cols = hidden, rp.norm_w = dnw, rp.eps = 1e-6f;
    rp.seg[rp.nseg].a = R.d, rp.seg[rp.nseg].rows = E, rp.seg[rp.nseg].epi = EPI_STORE;
    rp.seg[rp.nseg++].out = rlog;
    if (shg) {
        rp.seg[rp.nseg].a = G1.d, rp.seg[rp.nseg].rows = 1, rp.seg[rp.nseg].epi = EPI_STORE;
        rp.seg[rp.nseg++].out = rlog + E;
    }
    gp = rp;
    gp.nseg = 0;
    gp.topk_E = E, gp.topk_K = K, gp.norm_topk = 1, gp.has_shared_gate = shg;
    gp.logits = rlog, gp.ids = ids, gp.wts = wts;
    if (sh_inter > 0) {
        struct gemv_seg &g = gp.seg[gp.nseg++];
        g.a = Sg.d, g.b = Su.d, g.slot = K, g.rows = sh_inter, g.epi = EPI_SWIGLU,
        g.out = act + (size_t)K * inter, g.scale = wts;
    }
    for (int k = 0; k < K; k++) {
        struct gemv_seg &g = gp.seg[gp.nseg++];
        g.a = Gt.d, g.b = Up.d, g.idx = ids, g.slot = k, g.rows = inter, g.epi = EPI_SWIGLU;
        g.out = act + (size_t)k * inter, g.scale = wts;
    }
    gemv_share_qx(&rp, &gp, qxb);
    struct moe_down_params dp;
    memset(&dp, 0, sizeof dp);
    dp.down = Dn.d, dp.sh_down = Sd.d, dp.ids = ids, dp.K = K, dp.act = act, dp.inter = inter,
    dp.sh_inter = sh_inter, dp.out = xa, dp.hidden = hidden;
    struct moe_fused_params fp;
    memset(&fp, 0, sizeof fp);
    fp.g = gp;
    fp.gate = Gt.d, fp.up = Up.d, fp.down = Dn.d, fp.sh_gate = Sg.d, fp.sh_up = Su.d,
    fp.sh_down = Sd.d;
    fp.K = K, fp.inter = inter, fp.sh_inter = sh_inter, fp.hidden = hidden;
    fp.x = xb, fp.acc = acc, fp.ticket = ticket;
    char name[160];
    snprintf(name, sizeof name, "moe fused E%d K%d %dx%d +%d g%d%s: eligible", E, K, hidden, inter,
             sh_inter, group, shg ? " (shared gate)" : "");
    if (!check_true(name, moe_fused_eligible(&fp))) return;

    WK(gemv_launch(&rp, 0, &err_));
    WK(gemv_launch(&gp, 0, &err_));
    WK(moe_down_launch(&dp, 0, &err_));
    WK(gemv_launch(&rp, 0, &err_));
    WK(moe_fused_launch(&fp, 0, &err_));
    fp.x = xc;
    WK(gemv_launch(&rp, 0, &err_));
    WK(moe_fused_launch(&fp, 0, &err_));
    CK(cudaDeviceSynchronize());

    std::vector<float> h = host_copy(act, (size_t)K * inter + sh_inter);
    std::vector<int> hid = host_copy(ids, K);
    std::vector<float> qe = qx_err(h.data(), h.size());
    std::vector<float> want(hidden);
    std::vector<double> bound(hidden), absum(hidden);
    for (int o = 0; o < hidden; o++) {
        double sum = x[o], b = 0, a = 0;
        auto add = [&](const struct tmat &m, int mat, const float *hv, const float *ev, int n) {
            sum += ref_dot(m, mat, o, hv);
            b += qx_bound(m, mat, o, ev);
            const float *w = m.w.data() + ((size_t)mat * m.d.rows + o) * m.d.cols;
            for (int c = 0; c < n; c++) a += fabs((double)w[c] * hv[c]);
        };
        for (int k = 0; k < K; k++)
            add(Dn, hid[k], &h[(size_t)k * inter], &qe[(size_t)k * inter], inter);
        if (sh_inter) add(Sd, 0, &h[(size_t)K * inter], &qe[(size_t)K * inter], sh_inter);
        want[o] = (float)sum, bound[o] = b, absum[o] = a;
    }
    std::vector<float> gb = host_copy(xb, hidden), gc = host_copy(xc, hidden),
                       ga = host_copy(xa, hidden);
    snprintf(name, sizeof name, "  vs host (the two-launch path's expert outputs)");
    check_close_b(name, gb.data(), want.data(), bound, 2e-3f, 2e-3f);
    // where the down launch takes the int8 kernel, the two paths quantize the same expert outputs
    // the same way and differ by the order of the f32 sums only (else it runs on f32 inputs)
    const bool same_q = qdown_eligible(&dp);
    std::vector<double> ob(hidden);
    for (int o = 0; o < hidden; o++) ob[o] = 2e-6 * absum[o] + (same_q ? 0.0 : bound[o]);
    snprintf(name, sizeof name, "  vs the expert + down launches%s",
             same_q ? "" : " (f32 down: int8 bound)");
    check_close_b(name, gb.data(), ga.data(), ob, 1e-6f, 1e-6f);
    snprintf(name, sizeof name, "  a second run: the same bits; accumulator and ticket left zero");
    std::vector<long long> hacc = host_copy(acc, (size_t)hidden + 1);
    bool zero = host_copy(ticket, 1)[0] == 0;
    for (long long v : hacc) zero = zero && v == 0;
    check_true(name, !memcmp(gb.data(), gc.data(), hidden * 4) && zero);
    for (float *p : {dx, dnw, rlog, wts, act, xa, xb, xc}) CK(cudaFree(p));
    CK(cudaFree(ids));
    CK(cudaFree(qxb));
    CK(cudaFree(acc));
    CK(cudaFree(ticket));
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0); // a crash keeps the lines printed before it
    init_device();
    t_down(4, 4, 256, 8, 512, 512, 2048);
    t_down(8, 8, 256, 8, 512, 512, 2048);
    t_down(16, 16, 64, 8, 512, 512, 2048);
    t_down(4, 8, 256, 8, 512, 512, 2048);
    t_down(4, 16, 32, 3, 128, 64, 333);
    t_down(8, 4, 16, 2, 64, 0, 129);
    t_down(4, 4, 512, 10, 512, 512, 2048); // qwen3-next-like top-10
    t_down(4, 4, 1, 0, 0, 1024, 2047);     // dense MLP: shared slot only
    t_down(4, 4, 256, 8, 512, 512, 2048, true);
    // the third step requested before the wait (144 chunks, the last 16 a routed expert's here,
    // not the shared one's), with the ids on time and late
    t_down(4, 4, 256, 9, 512, 0, 2048);
    t_down(4, 4, 256, 9, 512, 0, 2048, true);
    t_down(8, 8, 64, 4, 256, 512, 1000, true);
    t_fused(256, 8, 512, 512, 2048, 64, true);  // Qwen3.5/3.6 MoE shapes
    t_fused(256, 8, 512, 0, 2048, 64, false);   // no shared expert
    t_fused(512, 10, 512, 512, 2048, 64, true); // top-10 (routing by one warp)
    t_fused(64, 4, 96, 64, 512, 32, true);      // 3 slices per expert, group 32
    t_fused(128, 6, 256, 128, 2560, 64, true);  // 80 chunks per row: a partial second step
    t_fused(256, 8, 512, 512, 4096, 128, true); // 16 down rows per thread
    return finish("check_decode_moe");
}
