// Gated DeltaNet prefill kernels (conv + state, l2norm, beta/g, sequential scan, gated norm) vs a
// CPU token-by-token implementation of MODEL.md, from a non-zero conv and recurrent state; and one
// chunk vs two chunks. `--bench`: the 35B layer's scan at several T.
#include "check_prefill_util.cuh"

struct dn_case {
    int T, kh, vh, dk, dv, K;
};

struct dn_out {
    std::vector<float> conv, S, y;
};

static float softplus(float x) {
    return x > 20.f ? x : log1pf(expf(x));
}

static dn_out cpu_dn(const dn_case &c, const std::vector<float> &qkv, const std::vector<float> &ba,
                     std::vector<float> conv, std::vector<float> S, const std::vector<float> &cw,
                     const std::vector<float> &A_log, const std::vector<float> &dtb,
                     const std::vector<uint16_t> &z, const std::vector<float> &nw) {
    const int C = 2 * c.kh * c.dk + c.vh * c.dv, K = c.K;
    dn_out r;
    r.y.resize((size_t)c.T * c.vh * c.dv);
    std::vector<float> x(C), o(c.dv);
    for (int t = 0; t < c.T; t++) {
        for (int ch = 0; ch < C; ch++) {
            float acc = 0;
            for (int i = 0; i < K - 1; i++) acc += cw[ch * K + i] * conv[ch * (K - 1) + i];
            float in = qkv[(size_t)t * C + ch];
            acc += cw[ch * K + K - 1] * in;
            for (int i = 0; i < K - 2; i++) conv[ch * (K - 1) + i] = conv[ch * (K - 1) + i + 1];
            conv[ch * (K - 1) + K - 2] = in;
            x[ch] = h_silu(acc);
        }
        for (int hh = 0; hh < 2 * c.kh; hh++) {
            float ss = 0;
            for (int i = 0; i < c.dk; i++) ss += x[hh * c.dk + i] * x[hh * c.dk + i];
            float rr = 1.f / sqrtf(ss + 1e-6f) * (hh < c.kh ? 1.f / sqrtf((float)c.dk) : 1.f);
            for (int i = 0; i < c.dk; i++) x[hh * c.dk + i] *= rr;
        }
        for (int h = 0; h < c.vh; h++) {
            const int kh = h / (c.vh / c.kh);
            const float *q = &x[kh * c.dk], *k = &x[c.kh * c.dk + kh * c.dk];
            const float *v = &x[2 * c.kh * c.dk + h * c.dv];
            float beta = 1.f / (1.f + expf(-ba[(size_t)t * 2 * c.vh + h]));
            float g =
                expf(-expf(A_log[h]) * softplus(ba[(size_t)t * 2 * c.vh + c.vh + h] + dtb[h]));
            float *Sh = &S[(size_t)h * c.dk * c.dv];
            for (int j = 0; j < c.dv; j++) {
                double kS = 0;
                for (int i = 0; i < c.dk; i++) {
                    Sh[i * c.dv + j] *= g;
                    kS += (double)Sh[i * c.dv + j] * k[i];
                }
                float delta = beta * (v[j] - (float)kS);
                double ov = 0;
                for (int i = 0; i < c.dk; i++) {
                    Sh[i * c.dv + j] += k[i] * delta;
                    ov += (double)Sh[i * c.dv + j] * q[i];
                }
                o[j] = (float)ov;
            }
            double ss = 0;
            for (int j = 0; j < c.dv; j++) ss += (double)o[j] * o[j];
            float rr = 1.f / sqrtf((float)(ss / c.dv) + 1e-6f);
            for (int j = 0; j < c.dv; j++) {
                size_t i = (size_t)t * c.vh * c.dv + h * c.dv + j;
                r.y[i] = o[j] * rr * nw[j] * h_silu(h_f32(z[i]));
            }
        }
    }
    r.conv = conv;
    r.S = S;
    return r;
}

// Runs the GPU kernels over [t0, t0 + T) of the inputs, updating dconv / dS in place.
static void gpu_dn(const dn_case &c, int t0, int T, const float *dqkv, const float *dba_in,
                   float *dconv, float *dS, const float *dcw, const float *dA, const float *ddt,
                   const uint16_t *dz, const float *dnw, uint16_t *dy) {
    const int C = 2 * c.kh * c.dk + c.vh * c.dv;
    dn_dims d = {T, c.kh, c.vh, c.dk, c.dv, c.K};
    float *qkvc = dev_poison<float>((size_t)T * C), *ba = dev_poison<float>((size_t)T * 2 * c.vh);
    float *o = dev_poison<float>((size_t)T * c.vh * c.dv);
    CK(cudaMemcpy(ba, dba_in + (size_t)t0 * 2 * c.vh, sizeof(float) * T * 2 * c.vh,
                  cudaMemcpyDeviceToDevice));
    OK(pf_dn_prep(0, &d, dqkv + (size_t)t0 * C, dconv, dcw, qkvc, ba, dA, ddt, ERR));
    OK(pf_dn_scan(0, &d, qkvc, ba, dS, o, ERR));
    OK(pf_dn_gate_norm(0, &d, o, (const bf16 *)dz + (size_t)t0 * c.vh * c.dv, dnw, 1e-6f,
                       (bf16 *)dy + (size_t)t0 * c.vh * c.dv, ERR));
    CK(cudaDeviceSynchronize());
    CK(cudaFree(qkvc));
    CK(cudaFree(ba));
    CK(cudaFree(o));
}

static void check(const dn_case &c, int split) {
    const int C = 2 * c.kh * c.dk + c.vh * c.dv, K = c.K;
    std::vector<float> qkv((size_t)c.T * C), ba((size_t)c.T * 2 * c.vh), conv((size_t)C * (K - 1)),
        S((size_t)c.vh * c.dk * c.dv), cw((size_t)C * K), A_log(c.vh), dtb(c.vh), nw(c.dv);
    for (auto &v : qkv) v = rnd_n();
    for (auto &v : ba) v = rnd_n() * 2;
    for (auto &v : conv) v = rnd_n();
    for (auto &v : S) v = rnd_n() * 0.3f;
    for (auto &v : cw) v = rnd_n() * 0.5f;
    for (auto &v : A_log) v = rnd_f(-2, 1);
    for (auto &v : dtb) v = rnd_n();
    for (auto &v : nw) v = rnd_f(0.5, 1.5);
    std::vector<uint16_t> z = rand_bf16((size_t)c.T * c.vh * c.dv, 1.f);
    dn_out ref = cpu_dn(c, qkv, ba, conv, S, cw, A_log, dtb, z, nw);

    float *dqkv = dev_upload(qkv), *dba = dev_upload(ba), *dconv = dev_upload(conv),
          *dS = dev_upload(S), *dcw = dev_upload(cw), *dA = dev_upload(A_log),
          *ddt = dev_upload(dtb), *dnw = dev_upload(nw);
    uint16_t *dz = dev_upload(z), *dy = dev_poison<uint16_t>(z.size());
    if (split > 0 && split < c.T) {
        gpu_dn(c, 0, split, dqkv, dba, dconv, dS, dcw, dA, ddt, dz, dnw, dy);
        gpu_dn(c, split, c.T - split, dqkv, dba, dconv, dS, dcw, dA, ddt, dz, dnw, dy);
    } else {
        gpu_dn(c, 0, c.T, dqkv, dba, dconv, dS, dcw, dA, ddt, dz, dnw, dy);
    }
    std::vector<uint16_t> yb = dev_download(dy, z.size());
    std::vector<float> y(yb.size());
    for (size_t i = 0; i < y.size(); i++) y[i] = h_f32(yb[i]);
    std::vector<float> gS = dev_download(dS, S.size()), gc = dev_download(dconv, conv.size());
    char what[160];
    snprintf(what, sizeof what, "dn T=%d kh=%d vh=%d dk=%d dv=%d split=%d: y", c.T, c.kh, c.vh,
             c.dk, c.dv, split);
    report(what, rel_l2(y.data(), ref.y.data(), y.size()), 8e-3);
    snprintf(what, sizeof what, "dn T=%d split=%d: state S", c.T, split);
    report(what, rel_l2(gS.data(), ref.S.data(), gS.size()), 1e-4);
    snprintf(what, sizeof what, "dn T=%d split=%d: conv state", c.T, split);
    report(what, rel_l2(gc.data(), ref.conv.data(), gc.size()), 0);
}

static void bench(int T) {
    dn_case c = {T, 16, 32, 128, 128, 4};
    const int C = 2 * c.kh * c.dk + c.vh * c.dv;
    dn_dims d = {T, c.kh, c.vh, c.dk, c.dv, c.K};
    std::vector<float> qkv((size_t)T * C), ba((size_t)T * 2 * c.vh);
    for (auto &v : qkv) v = rnd_n();
    for (auto &v : ba) v = rnd_n();
    float *dqkv = dev_upload(qkv), *dba = dev_upload(ba), *qkvc = dev_poison<float>(qkv.size());
    float *conv = dev_poison<float>((size_t)C * 3), *cw = dev_poison<float>((size_t)C * 4);
    CK(cudaMemset(conv, 0, sizeof(float) * C * 3));
    CK(cudaMemset(cw, 0, sizeof(float) * C * 4));
    float *S = dev_poison<float>((size_t)c.vh * c.dk * c.dv),
          *o = dev_poison<float>((size_t)T * 4096);
    CK(cudaMemset(S, 0, sizeof(float) * c.vh * c.dk * c.dv));
    float *A = dev_poison<float>(32), *dt = dev_poison<float>(32);
    CK(cudaMemset(A, 0, 128));
    CK(cudaMemset(dt, 0, 128));
    gpu_timer tm;
    OK(pf_dn_prep(0, &d, dqkv, conv, cw, qkvc, dba, A, dt, ERR));
    tm.start(0);
    OK(pf_dn_prep(0, &d, dqkv, conv, cw, qkvc, dba, A, dt, ERR));
    float t_prep = tm.stop_ms(0);
    OK(pf_dn_scan(0, &d, qkvc, dba, S, o, ERR));
    tm.start(0);
    OK(pf_dn_scan(0, &d, qkvc, dba, S, o, ERR));
    float t_scan = tm.stop_ms(0);
    printf("bench dn T=%6d: conv+norm %.3f ms, sequential scan %.3f ms (%.1f us/token)\n", T,
           t_prep, t_scan, t_scan * 1000 / T);
    CK(cudaFree(dqkv));
    CK(cudaFree(dba));
    CK(cudaFree(qkvc));
    CK(cudaFree(o));
}

int main(int argc, char **argv) {
    check({77, 2, 4, 128, 32, 4}, 0);
    check({77, 2, 4, 128, 32, 4}, 50);
    check({2, 2, 4, 128, 32, 4}, 1); // chunks shorter than the conv window
    check({45, 1, 2, 64, 16, 4}, 0);
    check({33, 2, 2, 32, 48, 3}, 0);
    if (argc > 1 && !strcmp(argv[argc - 1], "--bench"))
        for (int T : {512, 4096, 32768}) bench(T);
    printf(g_fail ? "check_prefill_dn: FAIL\n" : "check_prefill_dn: all ok\n");
    return g_fail;
}
