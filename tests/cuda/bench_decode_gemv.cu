// Decode GEMV speed on Qwen3.6-35B-A3B's shapes (random 4-bit group-64 weights, 8-bit router):
// each launch kind replayed 20 times in a CUDA graph, then one layer's chain (DeltaNet
// projections, MoE) x 40, per kernel mode: int8-activation kernels with and without programmatic
// dependent launch, and the f32-activation kernels. Prints us per launch and GB/s of weights read.
// usage: bench_decode_gemv [REPS]     bench_decode_gemv once   (each kind launched once, for ncu)
//        bench_decode_gemv cold [REPS]   (weights from HBM instead of the L2, see bench_cold)
#include "backend/cuda/gemv_dev.cuh"
#include "common_check.cuh"
#include "rand_dev.cuh"

namespace {

// Cycles of one routing (softmax + top-k of the router's logits by one warp), averaged over n.
__global__ void route_cycles_kernel(const struct gemv_params p, int n, long long *cycles) {
    __shared__ struct route_smem rt;
    long long t0 = clock64();
    for (int i = 0; i < n; i++) {
        route_warp<8>(p, rt);
        __syncwarp();
    }
    if (threadIdx.x == 0) *cycles = (clock64() - t0) / n;
}

// The same for the routing by a whole block (256 threads), as the expert launch runs it.
__global__ void route_block_cycles_kernel(const struct gemv_params p, int n, long long *cycles) {
    __shared__ struct route_smem rt;
    long long t0 = clock64();
    for (int i = 0; i < n; i++) {
        route_block(p, route_load(p), rt);
        __syncthreads();
    }
    if (threadIdx.x == 0) *cycles = (clock64() - t0) / n;
}

uint32_t g_seed = 1;

struct dmat rand_mat(int n, int rows, int cols, int bits) {
    return rand_qmat(n, rows, cols, bits, g_seed++ * 0x9E3779B9u, nullptr);
}
// bytes of n_used matrices of the stack (data, scales, biases)
double mat_bytes(const struct dmat &m, int n_used) {
    return (double)(m.mat_stride + 2 * m.sb_mat_stride) * n_used;
}
float *dev_f(size_t n, float v) {
    return rand_fvec(n, 0.f, v, g_seed++ * 0x85EBCA6Bu);
}

struct gemv_seg seg(const struct dmat &m, int epi, float *out) {
    struct gemv_seg g;
    memset(&g, 0, sizeof g);
    g.a = m, g.rows = m.rows, g.epi = epi, g.out = out;
    return g;
}

struct shapes {
    gemv_params in_proj, out_proj, qkv, o_proj, router, gate_up, gate_up_ids, lm_head;
    moe_down_params down;
    double b_in, b_out, b_qkv, b_o, b_router, b_gu, b_down, b_lm;
};

shapes make_shapes() {
    const int H = 2048, E = 256, K = 8, I = 512;
    shapes s;
    memset(&s, 0, sizeof s);
    float *x = dev_f(H, 2.f), *nw = dev_f(H, 1.f), *big = dev_f(1 << 20, 1.f);
    float *y = dev_f(4096, 1.f), *z = dev_f(4096, 1.f), *gnw = dev_f(128, 1.f);
    float *out = dev_f(300000, 0.f);
    float *act = dev_f((K + 1) * I, 1.f);
    (void)big;
    struct dmat qkvm = rand_mat(1, 8192, H, 4), zm = rand_mat(1, 4096, H, 4),
                bm = rand_mat(1, 32, H, 4), am = rand_mat(1, 32, H, 4),
                outm = rand_mat(1, H, 4096, 4), qm = rand_mat(1, 8192, H, 4),
                km = rand_mat(1, 512, H, 4), vm = rand_mat(1, 512, H, 4),
                om = rand_mat(1, H, 4096, 4), rm = rand_mat(1, E, H, 8), sgm = rand_mat(1, 1, H, 8),
                gm = rand_mat(E, I, H, 4), um = rand_mat(E, I, H, 4), dm = rand_mat(E, H, I, 4),
                shg = rand_mat(1, I, H, 4), shu = rand_mat(1, I, H, 4), shd = rand_mat(1, H, I, 4),
                lm = rand_mat(1, 248320, H, 4);
    int hid[K] = {3, 41, 77, 100, 150, 199, 201, 255}, *ids;
    CK(cudaMalloc(&ids, (K + 1) * sizeof(int)));
    CK(cudaMemcpy(ids, hid, sizeof hid, cudaMemcpyHostToDevice));
    float *rlog = dev_f(E + 1, 0.f), *wts_r = dev_f(K + 1, 0.f);
    { // router logits as a trained router gives them: distinct values (no mass ties)
        std::vector<float> lg(E + 1);
        for (int i = 0; i <= E; i++) lg[i] = (float)((i * 37 + 11) % 101) / 25.f - 2.f + i * 1e-4f;
        CK(cudaMemcpy(rlog, lg.data(), lg.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    int *ids_r;
    CK(cudaMalloc(&ids_r, (K + 1) * sizeof(int)));

    gemv_params *p = &s.in_proj;
    p->x = x, p->cols = H, p->norm_w = nw, p->eps = 1e-6f;
    p->seg[0] = seg(qkvm, EPI_STORE, out); // the DeltaNet step runs the conv (decode_step.cu)
    p->seg[1] = seg(zm, EPI_STORE, out + 8192);
    p->seg[2] = seg(bm, EPI_STORE, out + 12288);
    p->seg[3] = seg(am, EPI_STORE, out + 12320);
    p->nseg = 4;
    s.b_in = mat_bytes(qkvm, 1) + mat_bytes(zm, 1) + mat_bytes(bm, 1) + mat_bytes(am, 1);

    p = &s.out_proj;
    p->x = y, p->cols = 4096, p->gn_w = gnw, p->gn_z = z, p->gn_dv = 128, p->eps = 1e-6f;
    p->seg[0] = seg(outm, EPI_ADD, out + 20000);
    p->nseg = 1;
    s.b_out = mat_bytes(outm, 1);

    p = &s.qkv;
    p->x = x, p->cols = H, p->norm_w = nw, p->eps = 1e-6f;
    p->seg[0] = seg(qm, EPI_STORE, out);
    p->seg[1] = seg(km, EPI_STORE, out + 8192);
    p->seg[2] = seg(vm, EPI_STORE, out + 8704);
    p->nseg = 3;
    s.b_qkv = mat_bytes(qm, 1) + mat_bytes(km, 1) + mat_bytes(vm, 1);

    p = &s.o_proj;
    p->x = y, p->cols = 4096;
    p->seg[0] = seg(om, EPI_ADD, out + 20000);
    p->nseg = 1;
    s.b_o = mat_bytes(om, 1);

    p = &s.router;
    p->x = x, p->cols = H, p->norm_w = nw, p->eps = 1e-6f;
    p->seg[0] = seg(rm, EPI_STORE, rlog);
    p->seg[1] = seg(sgm, EPI_STORE, rlog + E);
    p->nseg = 2;
    s.b_router = mat_bytes(rm, 1) + mat_bytes(sgm, 1);

    p = &s.gate_up; // routes from the router's logits in every block
    p->x = x, p->cols = H, p->norm_w = nw, p->eps = 1e-6f;
    p->topk_E = E, p->topk_K = K, p->norm_topk = 1, p->has_shared_gate = 1;
    p->logits = rlog, p->ids = ids_r, p->wts = wts_r;
    struct gemv_seg g = seg(shg, EPI_SWIGLU, act + K * I); // shared first, as the decode step
    g.b = shu, g.slot = K, g.scale = wts_r;
    p->seg[p->nseg++] = g;
    for (int k = 0; k < K; k++) {
        g = seg(gm, EPI_SWIGLU, act + k * I);
        g.b = um, g.idx = ids_r, g.slot = k, g.scale = wts_r;
        p->seg[p->nseg++] = g;
    }
    s.b_gu = mat_bytes(gm, K) + mat_bytes(um, K) + mat_bytes(shg, 1) + mat_bytes(shu, 1);
    // the same launch with the ids given (no routing in it): what the routing costs
    s.gate_up_ids = s.gate_up;
    s.gate_up_ids.topk_K = 0;
    for (int k = 1; k <= K; k++) s.gate_up_ids.seg[k].idx = ids;

    moe_down_params *d = &s.down;
    d->down = dm, d->sh_down = shd, d->ids = ids, d->K = K, d->act = act, d->inter = I,
    d->sh_inter = I, d->out = out + 30000, d->hidden = H;
    s.b_down = mat_bytes(dm, K) + mat_bytes(shd, 1);

    p = &s.lm_head;
    p->x = x, p->cols = H, p->norm_w = nw, p->eps = 1e-6f;
    p->seg[0] = seg(lm, EPI_STORE, out);
    p->nseg = 1;
    s.b_lm = mat_bytes(lm, 1);
    CK(cudaDeviceSynchronize());
    return s;
}

struct wren_err g_err;

// Times `reps` replays of a graph holding n copies of the launch sequence f; returns us per copy.
template <class F> double time_graph(cudaStream_t st, int n, int reps, F f) {
    cudaGraph_t g;
    cudaGraphExec_t x;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    for (int i = 0; i < n; i++)
        if (f(st)) {
            fprintf(stderr, "launch failed: %s\n", g_err.msg);
            exit(1);
        }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&x, g, 0));
    for (int i = 0; i < 2; i++) CK(cudaGraphLaunch(x, st));
    CK(cudaStreamSynchronize(st));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a, st));
    for (int i = 0; i < reps; i++) CK(cudaGraphLaunch(x, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    CK(cudaGraphExecDestroy(x));
    CK(cudaGraphDestroy(g));
    return ms * 1e3 / reps / n;
}

// A copy of m in fresh device memory. The "cold" timings cycle through enough copies that every
// launch reads its weights from HBM, as the real step does (40 distinct layers, 1.67 GB per
// token), rather than from the 50 MB L2 that 20 replays of one matrix hit.
struct dmat clone_mat(const struct dmat &m) {
    struct dmat c = m;
    if (!m.data) return c;
    uint8_t *d, *sc, *b;
    CK(cudaMalloc(&d, m.mat_stride * m.n));
    CK(cudaMalloc(&sc, m.sb_mat_stride * m.n));
    CK(cudaMalloc(&b, m.sb_mat_stride * m.n));
    CK(cudaMemcpy(d, m.data, m.mat_stride * m.n, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(sc, m.scales, m.sb_mat_stride * m.n, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(b, m.biases, m.sb_mat_stride * m.n, cudaMemcpyDeviceToDevice));
    c.data = d, c.scales = sc, c.biases = b;
    return c;
}
gemv_params clone_params(const gemv_params &p) {
    gemv_params q = p;
    for (int i = 0; i < p.nseg; i++)
        q.seg[i].a = clone_mat(p.seg[i].a), q.seg[i].b = clone_mat(p.seg[i].b);
    return q;
}

// "cold": each non-routed launch kind over enough copies of its matrices to exceed the L2, and the
// layer chain over 40 layers' weights, each layer routing to its own experts.
void bench_cold(const shapes &s, const cudaDeviceProp &prop, cudaStream_t st, int reps) {
    struct decode_config dc = {prop.multiProcessorCount, prop.sharedMemPerBlockOptin,
                               prop.major >= 9, false};
    decode_configure(&dc);
    struct {
        const char *name;
        const gemv_params *p;
    } ks[] = {{"dn in_proj 12352x2048", &s.in_proj},
              {"dn out_proj 2048x4096 gated", &s.out_proj},
              {"attn qkv 9216x2048", &s.qkv},
              {"attn o_proj 2048x4096", &s.o_proj},
              {"router 257x2048 q8", &s.router}};
    printf("us per launch (int8+pdl): hot = 20 replays of one matrix, cold = cycling through "
           "copies\n");
    for (auto &k : ks) {
        double b = 0;
        for (int i = 0; i < k.p->nseg; i++) b += mat_bytes(k.p->seg[i].a, 1);
        const int nc = (int)fmin(400., fmax(4., ceil(200e6 / b)));
        std::vector<gemv_params> cp(nc);
        for (int i = 0; i < nc; i++) cp[i] = clone_params(*k.p);
        const double hot = time_graph(st, 20, reps, [&](cudaStream_t t) {
            gemv_params q = *k.p;
            return gemv_launch(&q, t, &g_err);
        });
        int i = 0;
        const double cold = time_graph(st, nc, reps, [&](cudaStream_t t) {
            gemv_params q = cp[i++ % nc];
            return gemv_launch(&q, t, &g_err);
        });
        printf("%-30s hot %6.2f  cold %6.2f  (%d copies, cold %.0f GB/s)\n", k.name, hot, cold, nc,
               b / cold / 1e3);
    }
    // each layer its own router weights, so it routes to its own experts of the shared stacks,
    // and the down projection reads the experts the routing chose
    const int L = 40;
    std::vector<gemv_params> in(L), out(L), rt(L);
    moe_down_params dn = s.down;
    dn.ids = s.gate_up.ids;
    for (int l = 0; l < L; l++) {
        in[l] = clone_params(s.in_proj), out[l] = clone_params(s.out_proj), rt[l] = s.router;
        rt[l].seg[0].a = rand_mat(1, 256, 2048, 8);
    }
    for (int cold = 0; cold < 2; cold++) {
        int l = 0;
        const double us = time_graph(st, L, reps, [&](cudaStream_t t) {
            const int i = cold ? l++ : 0;
            gemv_params q;
            q = cold ? in[i] : s.in_proj;
            if (gemv_launch(&q, t, &g_err)) return -1;
            q = cold ? out[i] : s.out_proj;
            if (gemv_launch(&q, t, &g_err)) return -1;
            q = cold ? rt[i] : s.router;
            if (gemv_launch(&q, t, &g_err)) return -1;
            q = s.gate_up;
            if (gemv_launch(&q, t, &g_err)) return -1;
            return moe_down_launch(cold ? &dn : &s.down, t, &g_err);
        });
        printf("layer chain (5 launches), %s: %.2f us\n",
               cold ? "40 layers' weights, routed experts" : "one layer's weights, fixed experts",
               us);
    }
}

} // namespace

int main(int argc, char **argv) {
    init_device();
    const bool once = argc > 1 && !strcmp(argv[1], "once");
    const int reps = argc > 1 && !once && strcmp(argv[1], "cold") ? atoi(argv[1]) : 20;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    shapes s = make_shapes();
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    if (argc > 1 && !strcmp(argv[1], "cold")) {
        bench_cold(s, prop, st, argc > 2 ? atoi(argv[2]) : 20);
        return 0;
    }
    if (once) {
        gemv_params *ps[] = {&s.in_proj, &s.out_proj, &s.qkv,    &s.o_proj,
                             &s.router,  &s.gate_up,  &s.lm_head};
        for (gemv_params *p : ps) {
            gemv_params q = *p;
            WK(gemv_launch(&q, st, &err_));
        }
        WK(moe_down_launch(&s.down, st, &err_));
        CK(cudaStreamSynchronize(st));
        return 0;
    }
    struct {
        const char *name;
        bool pdl, f32;
    } modes[] = {{"int8+pdl", true, false}, {"int8", false, false}, {"f32", false, true}};
    struct kind {
        const char *name;
        gemv_params *p;
        double bytes;
    } kinds[] = {{"dn in_proj 12352x2048", &s.in_proj, s.b_in},
                 {"dn out_proj 2048x4096 gated", &s.out_proj, s.b_out},
                 {"attn qkv 9216x2048", &s.qkv, s.b_qkv},
                 {"attn o_proj 2048x4096", &s.o_proj, s.b_o},
                 {"router 257x2048 q8", &s.router, s.b_router},
                 {"moe top-8 + gate/up 8+1 experts", &s.gate_up, s.b_gu},
                 {"moe gate/up, ids given", &s.gate_up_ids, s.b_gu},
                 {"lm_head 248320x2048", &s.lm_head, s.b_lm}};
    printf("%-30s", "kernel (us / GB/s)");
    for (auto &m : modes) printf(" %18s", m.name);
    printf("\n");
    for (auto &k : kinds) {
        printf("%-30s", k.name);
        for (auto &m : modes) {
            struct decode_config dc = {prop.multiProcessorCount, prop.sharedMemPerBlockOptin,
                                       m.pdl && prop.major >= 9, m.f32};
            decode_configure(&dc);
            gemv_params *p = k.p;
            double us = time_graph(st, 20, reps, [&](cudaStream_t t) {
                gemv_params q = *p;
                return gemv_launch(&q, t, &g_err);
            });
            printf(" %8.2f %7.0f  ", us, k.bytes / us / 1e3);
        }
        printf("\n");
    }
    printf("%-30s", "moe down 8+1 experts");
    for (auto &m : modes) {
        struct decode_config dc = {prop.multiProcessorCount, prop.sharedMemPerBlockOptin,
                                   m.pdl && prop.major >= 9, m.f32};
        decode_configure(&dc);
        double us = time_graph(st, 20, reps,
                               [&](cudaStream_t t) { return moe_down_launch(&s.down, t, &g_err); });
        printf(" %8.2f %7.0f  ", us, s.b_down / us / 1e3);
    }
    printf("\n");
    // one DeltaNet layer's GEMVs + MoE (no recurrent step): the chain a token runs 30 times
    const double lb = s.b_in + s.b_out + s.b_router + s.b_gu + s.b_down;
    {
        long long *cyc;
        CK(cudaMalloc(&cyc, sizeof *cyc));
        int khz = 0;
        CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
        for (int b = 0; b < 2; b++) {
            if (b)
                route_block_cycles_kernel<<<1, 256, 0, st>>>(s.gate_up, 100, cyc);
            else
                route_cycles_kernel<<<1, 32, 0, st>>>(s.gate_up, 100, cyc);
            CK(cudaGetLastError());
            long long c = 0;
            CK(cudaMemcpyAsync(&c, cyc, sizeof c, cudaMemcpyDeviceToHost, st));
            CK(cudaStreamSynchronize(st));
            printf("routing (%s, E 256, top-8): %lld cycles (%.2f us at %.2f GHz)\n",
                   b ? "256-thread block" : "one warp", c, c / (khz * 1e-3), khz * 1e-6);
        }
        CK(cudaFree(cyc));
    }
    printf("%-30s", "layer chain (5 launches)");
    for (auto &m : modes) {
        struct decode_config dc = {prop.multiProcessorCount, prop.sharedMemPerBlockOptin,
                                   m.pdl && prop.major >= 9, m.f32};
        decode_configure(&dc);
        double us = time_graph(st, 40, reps, [&](cudaStream_t t) {
            gemv_params q;
            q = s.in_proj;
            if (gemv_launch(&q, t, &g_err)) return -1;
            q = s.out_proj;
            if (gemv_launch(&q, t, &g_err)) return -1;
            q = s.router;
            if (gemv_launch(&q, t, &g_err)) return -1;
            q = s.gate_up;
            if (gemv_launch(&q, t, &g_err)) return -1;
            return moe_down_launch(&s.down, t, &g_err);
        });
        printf(" %8.2f %7.0f  ", us, lb / us / 1e3);
    }
    printf("\n");
    return 0;
}
