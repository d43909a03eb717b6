// Decode speed of the CUDA backend on a checkpoint (argv[1]) at the context lengths given
// (argv[2], comma-separated): tokens/s of generate() (graph replay + GPU greedy sampler), the bytes
// a token must move (active weights + DeltaNet state read/write + KV cache) as achieved bandwidth,
// against a device-to-device copy measured here, a per-kernel-group breakdown (event timing of a
// non-graph step) and device memory in use. The KV cache below the measured position is zeros
// (no prefill is run): the kernels read the same bytes either way.
#include "common_check.cuh"

extern "C" {
#include "backend/backend.h"
}

static int count_cb(void *ud, const struct sampled_token *t) {
    (void)t;
    ++*(int *)ud;
    return 0;
}

__global__ void empty_kernel(int *p) {
    if (p && threadIdx.x == 1024) *p = 0; // never true: keeps the kernel from being elided
}

// The same with a parameter block of B bytes (the GEMV's is ~3 KB) and the decode kernels'
// programmatic-launch calls.
template <int B> struct blob { int v[B / 4]; };
template <int B> __global__ void empty_pdl_kernel(const __grid_constant__ blob<B> p) {
    pdl_trigger();
    pdl_wait();
    if (threadIdx.x == 1024) printf("%d", p.v[B / 4 - 1]); // never true
}

// Replay cost of a graph of n empty kernel nodes, per node (us): the floor any n-launch step pays.
// B > 0: empty_pdl_kernel<B> launched as the decode kernels are (pdl_launch).
template <int B = 0> static double node_cost_us(int n, bool pdl = false) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t x;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    for (int i = 0; i < n; i++) {
        if constexpr (B == 0) {
            empty_kernel<<<132, 256, 0, st>>>(nullptr);
        } else {
            blob<B> b;
            memset(&b, 0, sizeof b);
            CK(pdl_launch(empty_pdl_kernel<B>, dim3(132), dim3(256), 0, st, pdl, b));
        }
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&x, g, 0));
    for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(x, st));
    CK(cudaStreamSynchronize(st));
    double t0 = now_sec();
    for (int i = 0; i < 20; i++) CK(cudaGraphLaunch(x, st));
    CK(cudaStreamSynchronize(st));
    double us = (now_sec() - t0) / 20 / n * 1e6;
    CK(cudaGraphExecDestroy(x));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(st));
    return us;
}

static double copy_bw(void) {
    const size_t n = 2ull << 30;
    void *a, *b;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemset(a, 1, n));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e0));
    for (int i = 0; i < 10; i++) CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaFree(a));
    CK(cudaFree(b));
    return 2.0 * n * 10 / (ms * 1e-3) / 1e9; // read + write
}

// Bytes one decode token must read: every non-expert matrix, top_k of the experts, the lm_head.
static double active_weight_bytes(const struct model *m) {
    const struct model_config *c = &m->cfg;
    double n = qmat_bytes(&m->lm_head) + (double)qmat_bytes(&m->embed) / c->vocab;
    for (int l = 0; l < c->n_layers; l++) {
        const struct layer *L = &m->layers[l];
        const struct qmat *dense[] = {&L->dn_qkv,  &L->dn_z,     &L->dn_b,    &L->dn_a,
                                      &L->dn_out,  &L->q_proj,   &L->k_proj,  &L->v_proj,
                                      &L->o_proj,  &L->router,   &L->sh_gate, &L->sh_up,
                                      &L->sh_down, &L->sh_gate_w};
        for (auto q : dense)
            if (q->rows) n += qmat_bytes(q);
        if (c->n_experts > 0)
            n += (double)c->top_k / c->n_experts *
                 (qmat_bytes(&L->exp_gate) + qmat_bytes(&L->exp_up) + qmat_bytes(&L->exp_down));
    }
    return n;
}

int main(int argc, char **argv) {
    DIE_IF(argc < 3, "usage: check_decode_speed MODEL_DIR CTX[,CTX...] [GEN]");
    const int gen = argc > 3 ? atoi(argv[3]) : 128;
    std::vector<int> ctxs;
    for (char *p = argv[2]; *p;) {
        ctxs.push_back((int)strtol(p, &p, 10));
        if (*p == ',') p++;
    }
    struct wren_err e;
    struct model m;
    memset(&m, 0, sizeof m);
    double t0 = now_sec();
    DIE_IF(model_load(&m, argv[1], &e), "%s", e.msg);
    double t1 = now_sec();
    struct backend_opts og = {"cuda", 0, 0, 0, false};
    struct backend *gpu = backend_create(&m, &og, &e);
    DIE_IF(!gpu, "%s", e.msg);
    double t2 = now_sec();
    size_t fr, tot;
    CK(cudaMemGetInfo(&fr, &tot));
    printf("model %s: load %.1f s, upload %.1f s (%.2f GiB of weights), device memory in use %.2f "
           "GiB\n",
           argv[1], t1 - t0, t2 - t1, gpu->device_bytes / 1073741824.0, (tot - fr) / 1073741824.0);
    const double bw = copy_bw();
    printf("graph of 263 empty kernels (132 x 256 threads): %.2f us per node\n", node_cost_us(263));
    printf("  with a parameter block of 16 / 256 / %zu (the GEMV's) / 4,000 bytes: %.2f / %.2f / "
           "%.2f / %.2f us per node; with programmatic launch (if on): %.2f / %.2f / %.2f / %.2f\n",
           sizeof(struct gemv_params), node_cost_us<16>(263), node_cost_us<256>(263),
           node_cost_us<(int)sizeof(struct gemv_params)>(263), node_cost_us<4000>(263),
           node_cost_us<16>(263, decode_pdl()), node_cost_us<256>(263, decode_pdl()),
           node_cost_us<(int)sizeof(struct gemv_params)>(263, decode_pdl()),
           node_cost_us<4000>(263, decode_pdl()));
    const struct model_config *c = &m.cfg;
    const double wbytes = active_weight_bytes(&m);
    const double state_bytes = 2.0 * (c->n_layers - cfg_n_attn_layers(c)) *
                               ((double)c->dn_v_heads * c->dn_k_dim * c->dn_v_dim * 4 +
                                (double)cfg_dn_conv_dim(c) * (c->conv_kernel - 1) * 4);
    const double kv_per_tok = (double)cfg_n_attn_layers(c) * c->n_kv_heads * c->head_dim * 2 * 2;
    printf("device-to-device copy: %.0f GB/s (read + write); active weights %.3f GB/token, "
           "DeltaNet state %.3f GB/token, KV %.1f KiB per context token\n",
           bw, wbytes / 1e9, state_bytes / 1e9, kv_per_tok / 1024);
    const char *cats[DP_N] = {"embed",  "dn_proj", "dn_step", "dn_out", "att_proj", "attn",
                              "o_proj", "router",  "gate_up", "down",   "lm_head"};
    printf("\n%8s %9s %9s %8s %7s | breakdown of one non-graph step (ms):", "ctx", "tok/s",
           "ms/tok", "GB/s", "%copy");
    for (int i = 0; i < DP_N; i++) printf(" %s", cats[i]);
    printf(" total\n");
    struct sampler_params sp;
    memset(&sp, 0, sizeof sp);
    sp.temperature = 0, sp.top_p = 1, sp.repetition_penalty = 1, sp.n_vocab = c->vocab,
    sp.n_logprobs = -1;
    for (int ctx : ctxs) {
        struct bstate *s = gpu->ops->state_new(gpu, ctx + gen + 16, &e);
        if (!s) {
            printf("%8d  %s\n", ctx, e.msg);
            continue;
        }
        if (ctx == 32768 || ctx == ctxs.back()) {
            CK(cudaMemGetInfo(&fr, &tot));
            printf("    (device memory in use with a %d-token state: %.2f GiB)\n", ctx + gen + 16,
                   (tot - fr) / 1073741824.0);
        }
        int n = 0, made = 0, fed = 0;
        DIE_IF(gpu->ops->generate(gpu, s, ctx, &sp, NULL, 0, 8, count_cb, &n, &made, &fed, &e),
               "%s", e.msg); // capture
        n = 0;
        double a = now_sec();
        DIE_IF(gpu->ops->generate(gpu, s, ctx, &sp, NULL, 0, gen, count_cb, &n, &made, &fed, &e),
               "%s", e.msg);
        double dt = (now_sec() - a) / made;
        double bytes = wbytes + state_bytes + kv_per_tok * (ctx + gen / 2);
        double ms[DP_N], total;
        DIE_IF(cuda_profile_step(gpu, s, ctx, ms, &total, &e), "%s", e.msg);
        printf("%8d %9.1f %9.3f %8.0f %6.1f%% |", ctx, 1 / dt, dt * 1e3, bytes / dt / 1e9,
               100 * bytes / dt / 1e9 / bw);
        for (int i = 0; i < DP_N; i++) printf(" %.3f", ms[i]);
        printf(" %.3f\n", total);
        fflush(stdout);
        gpu->ops->state_free(gpu, s);
    }
    gpu->ops->destroy(gpu);
    model_free(&m);
    return 0;
}
