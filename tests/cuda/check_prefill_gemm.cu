// Fused-dequant GEMM (pf_gemm, dense mode) vs a CPU GEMM over the same dequantized weights:
// 4/8-bit and bf16 weights, every epilogue, odd M/N, the generic fallback (K not a multiple of 64).
// Every case runs on the portable mma.sync kernel, on the automatic choice among the tiled kernels
// (the sm_90a wgmma kernel for the 4-bit cases it supports on Hopper, elsewhere mma.sync again),
// wgmma with 256-row items, and the few-rows GEMV kernel (gemm_small.cu, forced for every M; it
// uses the weights exactly as dequantized, so its reference does not round them to bf16), and
// split along K (gemm_split.cu) in 3 parts on both tiled kernels and in up to 16 on wgmma.
// `--bench`: times the projection shapes of the 35B model at T = 4096 on both kernels.
#include "check_prefill_util.cuh"

// ref[m][n] = sum_k A[m][k] * bf16(W[n][k]) in double: the kernel rounds dequantized weights to
// bf16
static bool g_exact; // the small-M kernel: weights not rounded to bf16

static std::vector<float> ref_gemm(const std::vector<uint16_t> &A, int M, const tmat &W, int e) {
    std::vector<float> wr((size_t)W.rows * W.cols);
    for (int n = 0; n < W.rows; n++)
        for (int k = 0; k < W.cols; k++)
            wr[(size_t)n * W.cols + k] = g_exact ? W.at(e, n, k) : round_bf16(W.at(e, n, k));
    std::vector<float> C((size_t)M * W.rows);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < W.rows; n++) {
            double s = 0;
            for (int k = 0; k < W.cols; k++)
                s += (double)h_f32(A[(size_t)m * W.cols + k]) * wr[(size_t)n * W.cols + k];
            C[(size_t)m * W.rows + n] = (float)s;
        }
    return C;
}

static const char *g_path = "";

static void check_case(const char *name, enum wtype type, int group, int M, int N, int K,
                       enum gemm_epi epi) {
    tmat W = make_tmat(type, 1, N, K, group);
    tmat U = make_tmat(type, 1, N, K, group);
    std::vector<uint16_t> A = rand_bf16((size_t)M * K, 1.f);
    uint16_t *dA = dev_upload(A);
    const bool f32out = epi == EPI_F32 || epi == EPI_ADD_F32;
    const int ldc = N == 1 ? 2 : N;
    std::vector<float> got((size_t)M * N), ref = ref_gemm(A, M, W, 0);
    std::vector<float> init((size_t)M * ldc);
    for (auto &x : init) x = rnd_n();
    void *dC;
    if (epi == EPI_ADD_F32) {
        dC = dev_upload(init);
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) ref[(size_t)m * N + n] += init[(size_t)m * ldc + n];
    } else if (f32out) {
        dC = dev_poison<float>((size_t)M * ldc);
    } else {
        dC = dev_poison<uint16_t>((size_t)M * ldc);
    }
    if (epi == EPI_SWIGLU_BF16) {
        std::vector<float> up = ref_gemm(A, M, U, 0);
        for (size_t i = 0; i < ref.size(); i++) ref[i] = h_silu(ref[i]) * up[i];
    }
    OK(pf_gemm(0, (const bf16 *)dA, K, M, &W.d, &U.d, dC, ldc, epi, nullptr, ERR));
    CK(cudaDeviceSynchronize());
    if (f32out) {
        std::vector<float> c = dev_download((float *)dC, (size_t)M * ldc);
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) got[(size_t)m * N + n] = c[(size_t)m * ldc + n];
    } else {
        std::vector<uint16_t> c = dev_download((uint16_t *)dC, (size_t)M * ldc);
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) got[(size_t)m * N + n] = h_f32(c[(size_t)m * ldc + n]);
    }
    char what[160];
    snprintf(what, sizeof what, "gemm%s %s M=%d N=%d K=%d", g_path, name, M, N, K);
    // the generic path (K % 64 != 0) keeps dequantized weights in f32: it differs from the
    // bf16-rounded reference by the weights' rounding (~2^-9 relative)
    const bool generic = K % 64 != 0;
    report(what, rel_l2(got.data(), ref.data(), got.size()), f32out && !generic ? 1e-4 : 8e-3);
    CK(cudaFree(dA));
    CK(cudaFree(dC));
}

static void bench_case(const char *name, int M, int N, int K, enum gemm_epi epi) {
    tmat W = make_tmat(WT_Q4, 1, N, K, 64), U = make_tmat(WT_Q4, 1, N, K, 64);
    uint16_t *dA = dev_upload(rand_bf16((size_t)M * K, 1.f));
    float *dC = dev_poison<float>((size_t)M * N);
    gpu_timer tm;
    for (int i = 0; i < 3; i++)
        OK(pf_gemm(0, (const bf16 *)dA, K, M, &W.d, &U.d, dC, N, epi, nullptr, ERR));
    const int reps = 20;
    for (int bm : {0, 128, 256, -1, -2}) { // -1: the wgmma kernel, -2: with 256-row items
        pf_gemm_force_path(bm < 0 ? 0 : 1);
        pf_gemm_wg_shape(bm == -2 ? 2 : 0);
        pf_gemm_force_bm(bm < 0 ? 0 : bm);
        OK(pf_gemm(0, (const bf16 *)dA, K, M, &W.d, &U.d, dC, N, epi, nullptr, ERR));
        tm.start(0);
        for (int i = 0; i < reps; i++)
            OK(pf_gemm(0, (const bf16 *)dA, K, M, &W.d, &U.d, dC, N, epi, nullptr, ERR));
        float ms = tm.stop_ms(0) / reps;
        double flop = 2.0 * M * N * K * (epi == EPI_SWIGLU_BF16 ? 2 : 1);
        printf("bench gemm %-22s %-10s M=%d N=%d K=%d: %.3f ms, %.1f TFLOP/s\n", name,
               bm == -1    ? "wgmma"
               : bm == -2  ? "wgmma r256"
               : bm == 128 ? "mma bm128"
               : bm == 256 ? "mma bm256"
                           : "mma auto",
               M, N, K, ms, flop / ms / 1e9);
    }
    pf_gemm_force_bm(0);
    pf_gemm_force_path(0);
    pf_gemm_wg_shape(0);
    CK(cudaFree(dA));
    CK(cudaFree(dC));
}

int main(int argc, char **argv) {
    bool bench = argc > 1 && !strcmp(argv[argc - 1], "--bench");
    printf("wgmma kernel: %s\n", pf_gemm_wg_available() ? "available" : "not available");
    float *split_ws = nullptr;
    const size_t split_bytes = (size_t)64 << 20;
    CK(cudaMalloc(&split_ws, split_bytes));
    pf_gemm_set_split_ws(split_ws, split_bytes);
    // 0: automatic (wgmma where it fits, split along K where few CTAs); 1: mma.sync; 2: wgmma with
    // 256-row work items; 3: the small-M kernel; 4 / 5: mma.sync / wgmma split in 3 parts;
    // 6: wgmma split in 16 parts (or one per k-tile); 7: wgmma items of 256 rows x 32 tokens;
    // 8 / 9: wgmma with 2 / 4 weight-row blocks per CTA (where N and K allow, else 1); 10: wgmma
    // items of 128 rows x 128 tokens, two CTAs per SM; 11: shape 1 on the kernel without the loader
    // warpgroup
    for (int path : {1, 0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}) {
        pf_gemm_wg_producer(path == 11 ? 0 : 1);
        pf_gemm_force_path(path == 1 || path == 4 ? 1 : 0);
        pf_gemm_wg_shape(path == 2 ? 2 : path == 7 ? 3 : path == 10 ? 4 : 0);
        pf_gemm_wg_blocks(path == 8 ? 2 : path == 9 ? 4 : 0);
        pf_gemm_small_force(path == 3 ? 2 : 1);
        pf_gemm_split_force(path == 0 ? 0 : path == 4 || path == 5 ? 3 : path == 6 ? 16 : 1);
        g_exact = path == 3;
        g_path = path == 1    ? " [mma]"
                 : path == 0  ? " [auto]"
                 : path == 2  ? " [wgmma r256]"
                 : path == 3  ? " [small-M]"
                 : path == 4  ? " [mma split 3]"
                 : path == 5  ? " [wgmma split 3]"
                 : path == 6  ? " [wgmma split 16]"
                 : path == 7  ? " [wgmma s3]"
                 : path == 8  ? " [wgmma nb2]"
                 : path == 9  ? " [wgmma nb4]"
                 : path == 10 ? " [wgmma s4]"
                              : " [wgmma, no loader warpgroup]";
        check_case("q4 g64 f32", WT_Q4, 64, 300, 200, 512, EPI_F32);
        check_case("q4 g64 f32 small", WT_Q4, 64, 3, 130, 64, EPI_F32);
        check_case("q8 g64 bf16", WT_Q8, 64, 37, 256, 128, EPI_BF16);
        check_case("bf16 add", WT_BF16, 0, 130, 72, 192, EPI_ADD_F32);
        check_case("q4 g64 swiglu", WT_Q4, 64, 77, 96, 256, EPI_SWIGLU_BF16);
        check_case("q4 g64 swiglu odd N", WT_Q4, 64, 129, 50, 128, EPI_SWIGLU_BF16);
        check_case("q4 g128 bm64", WT_Q4, 128, 64, 128, 256, EPI_F32);
        check_case("q8 g64 N=1 (shared gate)", WT_Q8, 64, 50, 1, 2048, EPI_F32);
        check_case("q4 g32 K=96 (generic)", WT_Q4, 32, 5, 33, 96, EPI_F32);
        check_case("q4 g32 K=96 swiglu (generic)", WT_Q4, 32, 9, 17, 96, EPI_SWIGLU_BF16);
        check_case("q4 g32 f32 K=2048", WT_Q4, 32, 200, 260, 2048, EPI_F32);
        pf_gemm_force_bm(256);
        check_case("bm256 q4 g64 f32", WT_Q4, 64, 300, 200, 512, EPI_F32);
        check_case("bm256 q4 g64 swiglu", WT_Q4, 64, 520, 96, 256, EPI_SWIGLU_BF16);
        check_case("bm256 q8 g64 add", WT_Q8, 64, 257, 130, 128, EPI_ADD_F32);
        check_case("bm256 bf16 bf16", WT_BF16, 0, 100, 64, 192, EPI_BF16);
        pf_gemm_force_bm(64);
        check_case("bm64 q4 g64 f32", WT_Q4, 64, 300, 200, 512, EPI_F32);
        pf_gemm_force_bm(0);
        check_case("q4 g64 add K=2048", WT_Q4, 64, 260, 300, 2048, EPI_ADD_F32);
        check_case("q4 g64 bf16 K=1024", WT_Q4, 64, 513, 136, 1024, EPI_BF16);
        check_case("q4 g64 f32 K=4096", WT_Q4, 64, 40, 128, 4096, EPI_F32);
        check_case("q4 g64 swiglu K=2048", WT_Q4, 64, 300, 512, 2048, EPI_SWIGLU_BF16);
        check_case("q4 g128 f32 K=640", WT_Q4, 128, 70, 64, 640, EPI_F32);
        check_case("q4 g64 f32 K=576 (odd k-tiles)", WT_Q4, 64, 33, 192, 576, EPI_F32);
        // whole 128-row blocks (SwiGLU: 64 features) and power-of-two k-tiles: several blocks
        // per CTA on paths 8 and 9
        check_case("q4 g64 f32 N=512 K=512", WT_Q4, 64, 300, 512, 512, EPI_F32);
        check_case("q4 g64 f32 N=512 K=256", WT_Q4, 64, 200, 512, 256, EPI_F32);
        check_case("q4 g64 add N=1024 K=1024", WT_Q4, 64, 77, 1024, 1024, EPI_ADD_F32);
        check_case("q4 g128 bf16 N=256 K=1024", WT_Q4, 128, 260, 256, 1024, EPI_BF16);
        check_case("q4 g64 swiglu N=256 K=512", WT_Q4, 64, 40, 256, 512, EPI_SWIGLU_BF16);
    }
    pf_gemm_force_path(0);
    pf_gemm_wg_shape(0);
    pf_gemm_wg_blocks(0);
    pf_gemm_wg_producer(1);
    pf_gemm_small_force(0);
    pf_gemm_split_force(0);
    g_exact = false;
    if (bench) {
        bench_case("dn_qkv", 4096, 8192, 2048, EPI_F32);
        bench_case("q_proj(+gate)", 4096, 8192, 2048, EPI_F32);
        bench_case("dn_out/o_proj add", 4096, 2048, 4096, EPI_ADD_F32);
        bench_case("z bf16", 4096, 4096, 2048, EPI_BF16);
        bench_case("shared gate+up swiglu", 4096, 512, 2048, EPI_SWIGLU_BF16);
        bench_case("shared down add", 4096, 2048, 512, EPI_ADD_F32);
        bench_case("lm_head rows=256", 256, 248320, 2048, EPI_F32);
    }
    pf_gemm_set_split_ws(nullptr, 0);
    CK(cudaFree(split_ws));
    printf(g_fail ? "check_prefill_gemm: FAIL\n" : "check_prefill_gemm: all ok\n");
    return g_fail;
}
