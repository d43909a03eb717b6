// MoE down-projection check: routed experts (device ids, weights folded into the activations) plus
// the shared expert in the same or a different format, accumulated into the residual.
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

int main(void) {
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
    return finish("check_decode_moe");
}
