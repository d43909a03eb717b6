// GEMV kernel checks against a host reference: q4/q8/bf16, group sizes 32/64/128, odd row counts,
// several segments per launch, fused RMSNorm, the ADD / CONV / SWIGLU epilogues with routed
// (device-indexed) experts, and the router finisher (softmax, top-k with ties, renormalisation).
#include "common_check.cuh"
#include "backend/cuda/qgemv_dev.cuh"
#include <algorithm>

static void host_norm(std::vector<float> &xn, const std::vector<float> &x,
                      const std::vector<float> &w, float eps) {
    double ss = 0;
    for (float v : x) ss += (double)v * v;
    float r = 1.f / sqrtf((float)(ss / x.size()) + eps);
    xn.resize(x.size());
    for (size_t i = 0; i < x.size(); i++) xn[i] = x[i] * r * w[i];
}

static void t_plain(int bits, int group, int rows1, int rows2, int cols, bool norm) {
    struct tmat A = make_mat(1, rows1, cols, bits, group),
                B = make_mat(3, rows2, cols, bits, group);
    std::vector<float> x = rnd_vec(cols, -2, 2), nw = rnd_vec(cols, 0.5f, 1.5f), xn;
    std::vector<float> res = rnd_vec(rows2, -1, 1);
    float *dx = dev_copy(x), *dnw = dev_copy(nw), *o1 = dev_poison(rows1), *o2 = dev_copy(res);
    struct gemv_params p;
    memset(&p, 0, sizeof p);
    p.x = dx, p.cols = cols, p.norm_w = norm ? dnw : nullptr, p.eps = 1e-6f;
    p.seg[0].a = A.d, p.seg[0].rows = rows1, p.seg[0].epi = EPI_STORE, p.seg[0].out = o1;
    p.seg[1].a = B.d, p.seg[1].rows = rows2, p.seg[1].epi = EPI_ADD, p.seg[1].out = o2,
    p.seg[1].mat = 2;
    p.nseg = 2;
    WK(gemv_launch(&p, 0, &err_));
    if (norm)
        host_norm(xn, x, nw, 1e-6f);
    else
        xn = x;
    std::vector<float> w1(rows1), w2(rows2), qe = qx_err(xn.data(), cols);
    std::vector<double> b1(rows1), b2(rows2);
    for (int r = 0; r < rows1; r++)
        w1[r] = ref_dot(A, 0, r, xn.data()), b1[r] = qx_bound(A, 0, r, qe.data());
    for (int r = 0; r < rows2; r++)
        w2[r] = res[r] + ref_dot(B, 2, r, xn.data()), b2[r] = qx_bound(B, 2, r, qe.data());
    char name[128];
    snprintf(name, sizeof name, "gemv b%d g%d %dx%d%s store", bits, group, rows1, cols,
             norm ? " norm" : "");
    check_close_b(name, host_copy(o1, rows1).data(), w1.data(), b1, 2e-3f, 2e-3f);
    snprintf(name, sizeof name, "gemv b%d g%d %dx%d%s add (mat 2)", bits, group, rows2, cols,
             norm ? " norm" : "");
    check_close_b(name, host_copy(o2, rows2).data(), w2.data(), b2, 2e-3f, 2e-3f);
}

// One large matrix alone: the streaming kernel on sm_90+ (decode_stream.cu), against the host and
// bitwise against the register-pipelined kernel; then three launches that take about a quarter of
// their stages from a counter pair (the decode step's lm_head), each the same bits, the pair zero
// after.
static void t_stream(int bits, int group, int rows, int cols) {
    struct tmat A = make_mat(1, rows, cols, bits, group);
    std::vector<float> x = rnd_vec(cols, -2, 2), nw = rnd_vec(cols, 0.5f, 1.5f), xn;
    float *dx = dev_copy(x), *dnw = dev_copy(nw), *o1 = dev_poison(rows), *o2 = dev_poison(rows);
    struct gemv_params p;
    memset(&p, 0, sizeof p);
    p.x = dx, p.cols = cols, p.norm_w = dnw, p.eps = 1e-6f;
    p.seg[0].a = A.d, p.seg[0].rows = rows, p.seg[0].epi = EPI_STORE, p.seg[0].out = o1;
    p.nseg = 1;
    const bool streamed = qstream_eligible(&p);
    WK(gemv_launch(&p, 0, &err_));
    unsigned *sched;
    CK(cudaMalloc(&sched, 8));
    CK(cudaMemset(sched, 0, 8));
    std::vector<float *> os(3);
    for (float *&o : os) {
        o = dev_poison(rows);
        p.seg[0].out = o, p.sched = sched;
        WK(gemv_launch(&p, 0, &err_));
    }
    unsigned left[2];
    CK(cudaMemcpy(left, sched, 8, cudaMemcpyDeviceToHost));
    p.sched = nullptr;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    qstream_configure(prop.major, prop.multiProcessorCount, prop.sharedMemPerBlockOptin, true);
    p.seg[0].out = o2;
    WK(gemv_launch(&p, 0, &err_));
    // back to the configuration init_device made (streaming unless WREN_CUDA_DECODE=nostream)
    const char *f = getenv("WREN_CUDA_DECODE");
    qstream_configure(prop.major, prop.multiProcessorCount, prop.sharedMemPerBlockOptin,
                      f && strstr(f, "nostream"));
    host_norm(xn, x, nw, 1e-6f);
    std::vector<float> w(rows), qe = qx_err(xn.data(), cols);
    std::vector<double> b(rows);
    for (int r = 0; r < rows; r++)
        w[r] = ref_dot(A, 0, r, xn.data()), b[r] = qx_bound(A, 0, r, qe.data());
    std::vector<float> g1 = host_copy(o1, rows), g2 = host_copy(o2, rows);
    char name[128];
    snprintf(name, sizeof name, "gemv b%d g%d %dx%d norm, one matrix (%s)", bits, group, rows, cols,
             streamed ? "streamed" : "not streamed");
    check_close_b(name, g1.data(), w.data(), b, 2e-3f, 2e-3f);
    auto bits_differ = [&](const std::vector<float> &g) { // outputs whose bits differ from g1's
        size_t n = 0;
        for (int r = 0; r < rows; r++) n += memcmp(&g1[r], &g[r], 4) != 0;
        return n;
    };
    size_t diff = bits_differ(g2);
    snprintf(name, sizeof name,
             "gemv b%d g%d %dx%d: same bits as the pipelined kernel (%zu differ)", bits, group,
             rows, cols, diff);
    check_true(name, diff == 0);
    for (size_t k = 0; k < os.size(); k++) {
        diff = bits_differ(host_copy(os[k], rows));
        snprintf(name, sizeof name,
                 "gemv b%d g%d %dx%d: stages from a counter, launch %zu: same bits (%zu differ)",
                 bits, group, rows, cols, k + 1, diff);
        check_true(name, diff == 0);
        CK(cudaFree(os[k]));
    }
    snprintf(name, sizeof name, "gemv b%d g%d %dx%d: the counters left at zero (%u, %u)", bits,
             group, rows, cols, left[0], left[1]);
    check_true(name, left[0] == 0 && left[1] == 0);
    CK(cudaFree(sched));
    CK(cudaFree(dx));
    CK(cudaFree(dnw));
    CK(cudaFree(o1));
    CK(cudaFree(o2));
}

static void t_conv(int bits, int rows, int cols, int K) {
    struct tmat A = make_mat(1, rows, cols, bits, 64);
    std::vector<float> cw = rnd_vec((size_t)rows * K, -0.5f, 0.5f),
                       cs = rnd_vec((size_t)rows * (K - 1), -1, 1);
    float *dcw = dev_copy(cw), *dcs = dev_copy(cs), *out = dev_poison(rows);
    std::vector<float> want(rows), st = cs;
    std::vector<double> bmax(rows, 0.0), bout(rows), bst(rows * (K - 1));
    for (int step = 0; step < 3; step++) {
        std::vector<float> x = rnd_vec(cols, -1, 1);
        float *dx = dev_copy(x);
        struct gemv_params p;
        memset(&p, 0, sizeof p);
        p.x = dx, p.cols = cols;
        p.seg[0].a = A.d, p.seg[0].rows = rows, p.seg[0].epi = EPI_CONV, p.seg[0].out = out;
        p.seg[0].conv_w = dcw, p.seg[0].conv_state = dcs, p.seg[0].conv_k = K;
        p.nseg = 1;
        WK(gemv_launch(&p, 0, &err_));
        std::vector<float> qe = qx_err(x.data(), cols);
        for (int r = 0; r < rows; r++) {
            float y = ref_dot(A, 0, r, x.data());
            bmax[r] = fmax(bmax[r], qx_bound(A, 0, r, qe.data()));
            float *h = &st[(size_t)r * (K - 1)];
            float o = cw[(size_t)r * K + K - 1] * y;
            for (int j = 0; j < K - 1; j++) o += cw[(size_t)r * K + j] * h[j];
            for (int j = 0; j + 1 < K - 1; j++) h[j] = h[j + 1];
            h[K - 2] = y;
            want[r] = o / (1.f + expf(-o));
        }
        CK(cudaFree(dx));
    }
    // a projection error e moves the conv output by at most sum_j |w_j| e (silu' <= 1.1)
    for (int r = 0; r < rows; r++) {
        double cwa = 0;
        for (int j = 0; j < K; j++) cwa += fabs(cw[(size_t)r * K + j]);
        bout[r] = 1.1 * cwa * bmax[r];
        for (int j = 0; j < K - 1; j++) bst[(size_t)r * (K - 1) + j] = bmax[r];
    }
    char name[128];
    snprintf(name, sizeof name, "gemv conv epilogue b%d %dx%d k%d (3 steps)", bits, rows, cols, K);
    check_close_b(name, host_copy(out, rows).data(), want.data(), bout, 2e-3f, 2e-3f);
    snprintf(name, sizeof name, "gemv conv state b%d", bits);
    check_close_b(name, host_copy(dcs, st.size()).data(), st.data(), bst, 2e-3f, 2e-3f);
}

// Router logits, then the expert launch: routing (softmax, top-k) in every block and the gate/up
// SWIGLU of the routed experts and the shared expert.
static void t_moe_front(int bits, int E, int K, int inter, int hidden, bool ties, bool norm_topk) {
    struct tmat R = make_mat(1, E, hidden, 8, 64), G1 = make_mat(1, 1, hidden, 8, 64);
    struct tmat Gt = make_mat(E, inter, hidden, bits, 64),
                Up = make_mat(E, inter, hidden, bits, 64);
    struct tmat Sg = make_mat(1, inter, hidden, bits, 64),
                Su = make_mat(1, inter, hidden, bits, 64);
    std::vector<float> x = rnd_vec(hidden, -2, 2), nw = rnd_vec(hidden, 0.5f, 1.5f), xn;
    host_norm(xn, x, nw, 1e-6f);
    float *dx = dev_copy(x), *dnw = dev_copy(nw), *rlog = dev_poison(E + 1),
          *wts = dev_poison(K + 1);
    float *act = dev_poison((size_t)(K + 1) * inter);
    int *ids;
    CK(cudaMalloc(&ids, (K + 1) * 4));
    CK(cudaMemset(ids, 0xff, (K + 1) * 4));
    std::vector<float> lg(E + 1);
    if (ties) {
        // force exact ties: make router rows equal in pairs by copying rows on the device
        for (int r = 1; r < E; r += 2) {
            CK(cudaMemcpy((uint8_t *)R.d.data + r * R.d.row_stride,
                          R.d.data + (r - 1) * R.d.row_stride, R.d.row_stride,
                          cudaMemcpyDeviceToDevice));
            CK(cudaMemcpy((uint8_t *)R.d.scales + r * R.d.sb_row_stride,
                          R.d.scales + (r - 1) * R.d.sb_row_stride, R.d.sb_row_stride,
                          cudaMemcpyDeviceToDevice));
            CK(cudaMemcpy((uint8_t *)R.d.biases + r * R.d.sb_row_stride,
                          R.d.biases + (r - 1) * R.d.sb_row_stride, R.d.sb_row_stride,
                          cudaMemcpyDeviceToDevice));
        }
        for (int r = 1; r < E; r += 2)
            memcpy(&R.w[(size_t)r * hidden], &R.w[(size_t)(r - 1) * hidden],
                   hidden * sizeof(float));
    }
    std::vector<float> qe = qx_err(xn.data(), hidden);
    std::vector<double> lgb(E + 1);
    for (int r = 0; r < E; r++)
        lg[r] = ref_dot(R, 0, r, xn.data()), lgb[r] = qx_bound(R, 0, r, qe.data());
    lg[E] = ref_dot(G1, 0, 0, xn.data()), lgb[E] = qx_bound(G1, 0, 0, qe.data());
    struct gemv_params p;
    memset(&p, 0, sizeof p);
    p.x = dx, p.cols = hidden, p.norm_w = dnw, p.eps = 1e-6f;
    p.seg[0].a = R.d, p.seg[0].rows = E, p.seg[0].epi = EPI_STORE, p.seg[0].out = rlog;
    p.seg[1].a = G1.d, p.seg[1].rows = 1, p.seg[1].epi = EPI_STORE, p.seg[1].out = rlog + E;
    p.nseg = 2;
    WK(gemv_launch(&p, 0, &err_));
    // host top-k on the device's logits (so tie order is judged on identical inputs)
    std::vector<float> glog = host_copy(rlog, E + 1);
    char name[128];
    snprintf(name, sizeof name, "router logits E%d b8%s", E, ties ? " (ties)" : "");
    check_close_b(name, glog.data(), lg.data(), lgb, 2e-3f, 2e-3f);
    double mx = -1e30, sum = 0;
    for (int i = 0; i < E; i++) mx = fmax(mx, glog[i]);
    std::vector<double> pr(E);
    for (int i = 0; i < E; i++) sum += (pr[i] = exp(glog[i] - mx));
    std::vector<int> sel;
    std::vector<float> sw;
    double ws = 0;
    for (int k = 0; k < K; k++) {
        int b = -1;
        for (int i = 0; i < E; i++) {
            bool taken = false;
            for (int s : sel) taken |= s == i;
            if (!taken && (b < 0 || pr[i] > pr[b])) b = i;
        }
        sel.push_back(b);
        sw.push_back((float)(pr[b] / sum));
        ws += pr[b] / sum;
    }
    if (norm_topk)
        for (auto &v : sw) v = (float)(v / ws);
    sw.push_back(1.f / (1.f + expf(-glog[E])));
    // routing + gate/up
    memset(&p, 0, sizeof p);
    p.x = dx, p.cols = hidden, p.norm_w = dnw, p.eps = 1e-6f;
    p.topk_E = E, p.topk_K = K, p.norm_topk = norm_topk, p.has_shared_gate = 1;
    p.logits = rlog, p.ids = ids, p.wts = wts;
    for (int k = 0; k < K; k++) {
        struct gemv_seg &g = p.seg[p.nseg++];
        g.a = Gt.d, g.b = Up.d, g.idx = ids, g.slot = k, g.rows = inter, g.epi = EPI_SWIGLU;
        g.out = act + (size_t)k * inter, g.scale = wts;
    }
    struct gemv_seg &g = p.seg[p.nseg++];
    g.a = Sg.d, g.b = Su.d, g.slot = K, g.rows = inter, g.epi = EPI_SWIGLU,
    g.out = act + (size_t)K * inter, g.scale = wts;
    WK(gemv_launch(&p, 0, &err_));
    std::vector<int> gids = host_copy(ids, K);
    bool same = true;
    for (int k = 0; k < K; k++) same &= gids[k] == sel[k];
    snprintf(name, sizeof name, "routing top-%d ids of %d%s", K, E,
             ties ? " (ties: lower id first)" : "");
    check_true(name, same);
    snprintf(name, sizeof name, "routing weights%s + shared gate",
             norm_topk ? " (renormalised)" : "");
    check_close(name, host_copy(wts, K + 1).data(), sw.data(), K + 1, 1e-5f, 1e-4f);
    std::vector<float> want((size_t)(K + 1) * inter);
    std::vector<double> wb(want.size());
    for (int k = 0; k <= K; k++)
        for (int r = 0; r < inter; r++) {
            float a = k < K ? ref_dot(Gt, sel[k], r, xn.data()) : ref_dot(Sg, 0, r, xn.data());
            float b = k < K ? ref_dot(Up, sel[k], r, xn.data()) : ref_dot(Su, 0, r, xn.data());
            double ea = k < K ? qx_bound(Gt, sel[k], r, qe.data()) : qx_bound(Sg, 0, r, qe.data());
            double eb = k < K ? qx_bound(Up, sel[k], r, qe.data()) : qx_bound(Su, 0, r, qe.data());
            float sa = a / (1.f + expf(-a));
            want[(size_t)k * inter + r] = sw[k] * sa * b;
            // silu' <= 1.1: |d(silu(a) b)| <= 1.1 ea (|b| + eb) + |silu(a)| eb
            wb[(size_t)k * inter + r] = fabs(sw[k]) * (1.1 * ea * (fabs(b) + eb) + fabs(sa) * eb);
        }
    snprintf(name, sizeof name, "swiglu gate/up b%d %d experts x %d + shared", bits, K, inter);
    check_close_b(name, host_copy(act, want.size()).data(), want.data(), wb, 1e-4f, 3e-3f);

    // The same two launches with the router's extra block exporting the int8 activation and the
    // expert launch copying it instead of building it: the same bits everywhere.
    struct gemv_params rq;
    memset(&rq, 0, sizeof rq);
    rq.x = dx, rq.cols = hidden, rq.norm_w = dnw, rq.eps = 1e-6f;
    float *rlog2 = dev_poison(E + 1), *wts2 = dev_poison(K + 1),
          *act2 = dev_poison((size_t)(K + 1) * inter);
    int *ids2;
    CK(cudaMalloc(&ids2, (K + 1) * 4));
    CK(cudaMemset(ids2, 0xff, (K + 1) * 4));
    rq.seg[0].a = R.d, rq.seg[0].rows = E, rq.seg[0].epi = EPI_STORE, rq.seg[0].out = rlog2;
    rq.seg[1].a = G1.d, rq.seg[1].rows = 1, rq.seg[1].epi = EPI_STORE, rq.seg[1].out = rlog2 + E;
    rq.nseg = 2;
    struct gemv_params pe = p;
    pe.logits = rlog2, pe.ids = ids2, pe.wts = wts2;
    for (int k = 0; k <= K; k++) pe.seg[k].out = act2 + (size_t)(k < K ? k : K) * inter;
    for (int k = 0; k < K; k++) pe.seg[k].idx = ids2, pe.seg[k].scale = wts2;
    pe.seg[K].scale = wts2;
    uint8_t *qxb;
    CK(cudaMalloc(&qxb, gemv_qx_bytes(hidden)));
    CK(cudaMemset(qxb, 0xff, gemv_qx_bytes(hidden)));
    gemv_share_qx(&rq, &pe, qxb);
    snprintf(name, sizeof name, "router -> expert launch b%d: int8 activation shared", bits);
    check_true(name, bits == 16 ? pe.qx_in == nullptr : pe.qx_in == qxb && rq.qx_out == qxb);
    WK(gemv_launch(&rq, 0, &err_));
    WK(gemv_launch(&pe, 0, &err_));
    auto same_bits = [](const void *a, const void *b, size_t n) { return !memcmp(a, b, n); };
    snprintf(name, sizeof name, "  its logits, ids, weights and gate/up outputs: the same bits");
    check_true(name, same_bits(host_copy(rlog2, E + 1).data(), glog.data(), (E + 1) * 4) &&
                         same_bits(host_copy(ids2, K).data(), gids.data(), K * 4) &&
                         same_bits(host_copy(wts2, K + 1).data(), host_copy(wts, K + 1).data(),
                                   (K + 1) * 4) &&
                         same_bits(host_copy(act2, want.size()).data(),
                                   host_copy(act, want.size()).data(), want.size() * 4));
    CK(cudaFree(qxb));
    CK(cudaFree(ids2));
    CK(cudaFree(rlog2));
    CK(cudaFree(wts2));
    CK(cudaFree(act2));
}

int main(void) {
    init_device();
    const int bitsv[] = {4, 8, 16};
    const int groups[] = {32, 64, 128};
    for (int b : bitsv)
        for (int g : groups) {
            if (b == 16 && g != 64) continue;
            t_plain(b, g, 37, 515, 2048, true);
            t_plain(b, g, 1, 3, 384, false);
        }
    t_plain(4, 64, 2051, 17, 4096, true);
    t_plain(4, 64, 248320 / 64, 5, 2048, true); // lm_head-like row count
    t_plain(8, 32, 129, 7, 8192, false);
    // two steps per row: the split-step kernel (second steps of 32 and of 2 chunks), and
    // too many row sets for it
    t_plain(4, 32, 301, 64, 3072, false);
    t_plain(8, 32, 5, 1023, 1056, true);
    t_plain(4, 64, 2600, 3, 4096, false);
    // up to three row sets per warp (the DeltaNet in_proj's shape)
    t_plain(4, 64, 8192, 4160, 2048, true);
    t_plain(4, 32, 8191, 4161, 2048, false);
    // a few row sets past two per warp (their warps take a third): the attention q/k/v's shape
    // and smaller remainders, sized from this device's warp count (QG_* in qgemv_dev.cuh; a row
    // set is QG_R rows)
    {
        cudaDeviceProp prop;
        CK(cudaGetDeviceProperties(&prop, 0));
        const int warps = QG_WARPS * QG_BLOCKS_PER_SM * prop.multiProcessorCount;
        const int W2 = 2 * QG_R * warps;                     // rows: two row sets per warp
        const int x = std::min(384, warps / 2);              // extra row sets: 384 on the H200
        const int y = std::min(128, warps / 2);              // row sets moved to the second segment
        t_plain(4, 64, W2 - 2 * y, 2 * (x + y), 2048, true); // 8192 + 1024 rows on the H200
        t_plain(4, 32, W2 - 2 * y, 2 * y + 200, 2048, false); // 100 row sets more
        t_plain(8, 64, W2 - 7, 9, 1024, true);                // 2 more, an odd row in each segment
        // a block count + 1 more
        t_plain(4, 128, W2, 2 * QG_BLOCKS_PER_SM * prop.multiProcessorCount + 1, 2048, false);
    }
    t_stream(4, 64, 248320, 2048); // the lm_head
    t_stream(4, 32, 40013, 1024);  // a last stage of 1 row
    t_stream(8, 64, 33001, 2048);
    t_stream(4, 128, 36000, 4096);
    for (int b : bitsv) t_conv(b, 333, 512, 4);
    t_conv(4, 64, 256, 2);
    t_conv(4, 22000, 256, 4); // several row sets per warp
    t_conv(8, 300, 256, 6);   // a wider conv kernel
    t_conv(8, 101, 256, 3);
    for (int b : bitsv) t_moe_front(b, 256, 8, 512, 2048, false, true);
    t_moe_front(4, 256, 8, 512, 2048, true, true);
    t_moe_front(4, 64, 4, 96, 256, true, false);
    t_moe_front(16, 16, 2, 64, 128, false, true);
    return finish("check_decode_gemv");
}
