// Prefill throughput on a full-size Qwen3.6-35B-A3B-shaped model with random 4-bit weights made
// on the GPU (no checkpoint has to travel): tokens/s per prompt length, achieved TFLOP/s and the
// time by kernel kind. Random weights route tokens about uniformly over the experts.
// usage: [PF_GEMM_PATH=1] [PF_WG_SHAPE=1|2|3|4] [PF_WG_NB=1|2|4|8] [PF_WG_PROD=0] [PF_SMALL=1|2]
// [PF_TILES=0|1] [PF_SPLIT=1|S] check_prefill_bench CHUNK LEN [LEN...] (one line per length; for
// lengths up to 512 in one chunk also the time the GPU alone needs, to tell host-bound from
// GPU-bound calls, and the time by kernel kind)
#include <algorithm>
#include <chrono>

#include "check_prefill_util.cuh"
#include "rand_dev.cuh"

namespace {

uint32_t g_seed = 1;
size_t g_bytes = 0;

__global__ void spin_kernel(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

double now_ms() {
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

struct dmat qm(int n, int rows, int cols, int bits) {
    return rand_qmat(n, rows, cols, bits, g_seed++ * 0x9E3779B9u, &g_bytes);
}
const float *fv(size_t n, float base, float var) {
    return rand_fvec(n, base, var, g_seed++ * 0x85EBCA6Bu);
}

} // namespace

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s CHUNK LEN [LEN...]\n", argv[0]);
        return 2;
    }
    const int chunk = atoi(argv[1]);
    // PF_GEMM_PATH=1: only the portable mma.sync GEMM (for comparisons)
    if (getenv("PF_GEMM_PATH")) pf_gemm_force_path(atoi(getenv("PF_GEMM_PATH")));
    // PF_WG_SHAPE=1|2|3|4: force the wgmma kernel's work-item shape (default: by rows per expert)
    if (getenv("PF_WG_SHAPE")) pf_gemm_wg_shape(atoi(getenv("PF_WG_SHAPE")));
    // PF_WG_NB=1|2|4|8: the wgmma kernel's weight-row blocks per CTA (default: by the CTA count)
    if (getenv("PF_WG_NB")) pf_gemm_wg_blocks(atoi(getenv("PF_WG_NB")));
    // PF_WG_PROD=0: shape 1 without the loader warpgroup
    if (getenv("PF_WG_PROD")) pf_gemm_wg_producer(atoi(getenv("PF_WG_PROD")));
    // PF_SMALL=1|2: never / whenever it fits the few-rows GEMM kernel (default: by row count)
    if (getenv("PF_SMALL")) pf_gemm_small_force(atoi(getenv("PF_SMALL")));
    // PF_SPLIT=1|S: never split dense GEMMs along K / S parts wherever K allows (default: by CTAs)
    if (getenv("PF_SPLIT")) pf_gemm_split_force(atoi(getenv("PF_SPLIT")));
    // PF_TILES=0|1: the MoE tile map in expert order / larger experts first (default: by rows)
    if (getenv("PF_TILES")) pf_moe_tiles_by_size(atoi(getenv("PF_TILES")));
    int max_len = 0;
    for (int i = 2; i < argc; i++) max_len = std::max(max_len, atoi(argv[i]));

    struct model_config c;
    memset(&c, 0, sizeof c);
    c.hidden = 2048, c.n_layers = 40, c.vocab = 248320, c.rms_eps = 1e-6f;
    for (int i = 0; i < 40; i++) c.kind[i] = i % 4 == 3 ? LAYER_ATTENTION : LAYER_DELTANET;
    c.n_heads = 16, c.n_kv_heads = 2, c.head_dim = 256, c.rope_dim = 64, c.rope_theta = 1e7f;
    c.attn_output_gate = true;
    c.dn_k_heads = 16, c.dn_v_heads = 32, c.dn_k_dim = 128, c.dn_v_dim = 128, c.conv_kernel = 4;
    c.n_experts = 256, c.top_k = 8, c.expert_inter = 512, c.shared_inter = 512, c.norm_topk = true;
    const int H = 2048, C = cfg_dn_conv_dim(&c), V = cfg_dn_v_dim(&c);

    struct cuda_ctx cx;
    memset(&cx, 0, sizeof cx);
    cx.cfg = &c;
    cx.smem_optin = dev_smem_optin();
    cx.dm.embed = qm(1, c.vocab, H, 4);
    cx.dm.lm_head = qm(1, c.vocab, H, 4);
    cx.dm.final_norm = fv(H, 1.f, 0.2f);
    std::vector<struct dlayer> layers(40);
    for (int l = 0; l < 40; l++) {
        struct dlayer &d = layers[l];
        memset(&d, 0, sizeof d);
        d.kind = c.kind[l];
        d.input_norm = fv(H, 1.f, 0.2f);
        d.post_norm = fv(H, 1.f, 0.2f);
        if (d.kind == LAYER_DELTANET) {
            d.dn_qkv = qm(1, C, H, 4), d.dn_z = qm(1, V, H, 4), d.dn_b = qm(1, 32, H, 4);
            d.dn_a = qm(1, 32, H, 4), d.dn_out = qm(1, H, V, 4);
            d.dn_conv = fv((size_t)C * 4, 0.f, 1.f), d.dn_A_log = fv(32, -0.5f, 1.f);
            d.dn_dt_bias = fv(32, 0.f, 1.f), d.dn_norm = fv(128, 1.f, 0.2f);
        } else {
            d.q_proj = qm(1, 16 * 512, H, 4), d.k_proj = qm(1, 512, H, 4),
            d.v_proj = qm(1, 512, H, 4);
            d.o_proj = qm(1, H, 16 * 256, 4);
            d.q_norm = fv(256, 1.f, 0.2f), d.k_norm = fv(256, 1.f, 0.2f);
        }
        d.router = qm(1, 256, H, 8);
        d.exp_gate = qm(256, 512, H, 4), d.exp_up = qm(256, 512, H, 4),
        d.exp_down = qm(256, H, 512, 4);
        d.sh_gate = qm(1, 512, H, 4), d.sh_up = qm(1, 512, H, 4), d.sh_down = qm(1, H, 512, 4);
        d.sh_gate_w = qm(1, 1, H, 8);
    }
    cx.dm.layers = layers.data();
    CK(cudaStreamCreate(&cx.stream));
    CK(cudaDeviceSynchronize());
    printf("model: %.2f GB of random 4-bit weights on the GPU\n", g_bytes / 1e9);

    struct cuda_state st;
    st.max_ctx = max_len;
    st.n_attn = 10, st.n_dn = 30;
    st.kv_int8 = false;
    st.kv_row = 2 * 256 * 2;
    std::vector<unsigned char *> kc(10), vc(10);
    std::vector<float *> conv(30), ssm(30);
    for (int i = 0; i < 10; i++) {
        CK(cudaMalloc(&kc[i], (size_t)max_len * 2 * 256 * 2));
        CK(cudaMalloc(&vc[i], (size_t)max_len * 2 * 256 * 2));
    }
    for (int i = 0; i < 30; i++) {
        CK(cudaMalloc(&conv[i], (size_t)C * 3 * 4));
        CK(cudaMalloc(&ssm[i], (size_t)32 * 128 * 128 * 4));
    }
    st.k_cache = kc.data(), st.v_cache = vc.data(), st.conv = conv.data(), st.ssm = ssm.data();
    CK(cudaMalloc(&st.logits, (size_t)c.vocab * 4));

    std::vector<int32_t> tok(max_len);
    for (auto &t : tok) t = (int32_t)(rnd_u32() % 248000);
    std::vector<float> logits(c.vocab);
    // FLOPs per token: projections + experts + shared + router (2 per MAC), attention by context
    const double proj_dn = 2.0 * H * (C + V + 64) + 2.0 * V * H;
    const double proj_at = 2.0 * H * (16 * 512 + 1024) + 2.0 * 4096 * H;
    const double mlp = 2.0 * H * 512 * 3 * (8 + 1) + 2.0 * H * 257;
    const double per_tok = 30 * proj_dn + 10 * proj_at + 40 * mlp;

    auto run = [&](int len, bool prof) {
        for (int i = 0; i < 30; i++) {
            CK(cudaMemsetAsync(conv[i], 0, (size_t)C * 3 * 4, cx.stream));
            CK(cudaMemsetAsync(ssm[i], 0, (size_t)32 * 128 * 128 * 4, cx.stream));
        }
        CK(cudaStreamSynchronize(cx.stream));
        OK(cuda_prefill_profile(&cx, prof, nullptr, ERR));
        gpu_timer tm;
        tm.start(cx.stream);
        for (int p = 0; p < len; p += chunk)
            OK(cuda_prefill(&cx, &st, p, tok.data() + p, std::min(chunk, len - p),
                            p + chunk >= len ? logits.data() : nullptr, false, ERR));
        return tm.stop_ms(cx.stream);
    };
    run(std::min(chunk, max_len), false); // warm-up: workspace, kernel attributes
    for (int i = 2; i < argc; i++) {
        const int len = atoi(argv[i]);
        float ms = run(len, false);
        double attn = 10.0 * 4 * 16 * 256 * ((double)len * (len + 1) / 2);
        double flop = per_tok * len + attn;
        printf(
            "prefill chunk=%d len=%7d: %9.1f ms  %9.0f tok/s  %6.1f TFLOP/s (matmul+attention)\n",
            chunk, len, ms, len / ms * 1e3, flop / ms / 1e9);
        fflush(stdout);
        if (len <= 512 && len <= chunk) {
            // the same call queued behind a 50 ms spin kernel: the host has enqueued everything
            // before the GPU reaches it, so (wall - spin) is the GPU's own time for the call
            int khz = 0;
            CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
            const long long cyc = (long long)khz * 50;
            double spin = 1e30, queued = 1e30, plain = 1e30;
            for (int rep = 0; rep < 3; rep++) {
                double t0 = now_ms();
                spin_kernel<<<1, 1, 0, cx.stream>>>(cyc);
                CK(cudaStreamSynchronize(cx.stream));
                spin = std::min(spin, now_ms() - t0);
                t0 = now_ms();
                spin_kernel<<<1, 1, 0, cx.stream>>>(cyc);
                OK(cuda_prefill(&cx, &st, 0, tok.data(), len, logits.data(), false, ERR));
                queued = std::min(queued, now_ms() - t0);
                t0 = now_ms();
                OK(cuda_prefill(&cx, &st, 0, tok.data(), len, logits.data(), false, ERR));
                plain = std::min(plain, now_ms() - t0);
            }
            printf("  len=%d: one call %.2f ms of wall time, %.2f ms of GPU time when queued\n",
                   len, plain, queued - spin);
        }
        if (len == 2048 || len == 4096 || len == 32768 || (len <= 512 && len <= chunk)) {
            double kind[PF_KINDS];
            OK(cuda_prefill_profile(&cx, true, nullptr, ERR));
            float pms = run(len, true);
            OK(cuda_prefill_profile(&cx, false, kind, ERR));
            printf("  breakdown at len=%d (profiled run %.1f ms):", len, pms);
            for (int k = 0; k < PF_KINDS; k++) printf(" %s %.1f ms;", pf_kind_name[k], kind[k]);
            printf("\n");
        }
    }
    bool finite = true;
    for (float x : logits) finite = finite && x == x && fabsf(x) < 1e30f;
    printf("last logits finite: %s\n", finite ? "yes" : "NO");
    cuda_prefill_free(&cx);
    return finite ? 0 : 1;
}
