// Gated DeltaNet prefill kernels (conv + state, l2norm, beta/g, the recurrence in both forms:
// sequential scan and chunked WY, gated norm) vs a CPU token-by-token implementation of MODEL.md,
// from a non-zero conv and recurrent state; one chunk vs several calls carrying the state.
// `--bench`: the 35B layer's recurrence in both forms at T = 64 .. 32768.
#include <algorithm>

#include "check_prefill_util.cuh"

struct dn_case {
    int T, kh, vh, dk, dv, K;
    bool slow = false; // gates near 1 (memory of thousands of tokens): state errors would pile up
};

enum dn_form { FORM_SCAN, FORM_CHUNKED };
static const char *const form_name[] = {"scan", "chunked"};

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

static int g_nw = 0; // the state kernel's block shape in the checks (pf_dn_chunked_test)

static size_t g_optin = 0; // > 0: pretend the device has this much (the one-stage path)

// What the backend passes as cuda_ctx.smem_optin.
static size_t smem_optin() {
    return g_optin ? g_optin : dev_smem_optin();
}

// Runs the GPU kernels over [t0, t0 + T) of the inputs, updating dconv / dS in place.
static void gpu_dn(dn_form form, const dn_case &c, int t0, int T, const float *dqkv,
                   const float *dba_in, float *dconv, float *dS, const float *dcw, const float *dA,
                   const float *ddt, const uint16_t *dz, const float *dnw, uint16_t *dy) {
    const int C = 2 * c.kh * c.dk + c.vh * c.dv;
    dn_dims d = {T, c.kh, c.vh, c.dk, c.dv, c.K};
    float *qkvc = dev_poison<float>((size_t)T * C), *ba = dev_poison<float>((size_t)T * 2 * c.vh);
    float *o = dev_poison<float>((size_t)T * c.vh * c.dv);
    CK(cudaMemcpy(ba, dba_in + (size_t)t0 * 2 * c.vh, sizeof(float) * T * 2 * c.vh,
                  cudaMemcpyDeviceToDevice));
    OK(pf_dn_prep(0, &d, dqkv + (size_t)t0 * C, dconv, dcw, qkvc, ba, dA, ddt, ERR));
    if (form == FORM_SCAN) {
        OK(pf_dn_scan(0, &d, qkvc, ba, dS, o, ERR));
    } else {
        void *ws = dev_poison<uint8_t>(pf_dn_chunked_ws_bytes(&d)); // every byte must be written
        pf_dn_chunked_test(g_nw, 3);
        OK(pf_dn_chunked(0, &d, smem_optin(), qkvc, ba, dS, o, ws, ERR));
        pf_dn_chunked_test(0, 3);
        CK(cudaDeviceSynchronize());
        CK(cudaFree(ws));
    }
    OK(pf_dn_gate_norm(0, &d, o, (const bf16 *)dz + (size_t)t0 * c.vh * c.dv, dnw, 1e-6f,
                       (bf16 *)dy + (size_t)t0 * c.vh * c.dv, ERR));
    CK(cudaDeviceSynchronize());
    CK(cudaFree(qkvc));
    CK(cudaFree(ba));
    CK(cudaFree(o));
}

// Tolerances (rel L2), the same for both forms. y: the output is rounded to bf16 (~1e-3) and the
// chunked form multiplies bf16 q and P on the output path (~1e-3 more); 8e-3 leaves room for
// the rmsnorm amplifying small outputs. S: both forms keep the state in f32 (the chunked one
// through 3-pass bf16 products, ~16 bits per operand, see dn_wy.cuh): 1e-4 is far below the 2e-3
// a bf16 state would show, and the slow-gate cases over 4K-8K tokens check it does not grow.
static void check(std::vector<dn_form> forms, const dn_case &c, std::vector<int> splits) {
    const int C = 2 * c.kh * c.dk + c.vh * c.dv, K = c.K;
    std::vector<float> qkv((size_t)c.T * C), ba((size_t)c.T * 2 * c.vh), conv((size_t)C * (K - 1)),
        S((size_t)c.vh * c.dk * c.dv), cw((size_t)C * K), A_log(c.vh), dtb(c.vh), nw(c.dv);
    for (auto &v : qkv) v = rnd_n();
    for (auto &v : ba) v = rnd_n() * 2;
    for (auto &v : conv) v = rnd_n();
    for (auto &v : S) v = rnd_n() * 0.3f;
    for (auto &v : cw) v = rnd_n() * 0.5f;
    for (auto &v : A_log) v = c.slow ? rnd_f(-9, -6) : rnd_f(-2, 1);
    for (auto &v : dtb) v = rnd_n();
    for (auto &v : nw) v = rnd_f(0.5, 1.5);
    std::vector<uint16_t> z = rand_bf16((size_t)c.T * c.vh * c.dv, 1.f);
    dn_out ref = cpu_dn(c, qkv, ba, conv, S, cw, A_log, dtb, z, nw);

    splits.push_back(c.T); // calls cover [0, s1), [s1, s2), ..., [.., T)
    for (dn_form form : forms) {
        float *dqkv = dev_upload(qkv), *dba = dev_upload(ba), *dconv = dev_upload(conv),
              *dS = dev_upload(S), *dcw = dev_upload(cw), *dA = dev_upload(A_log),
              *ddt = dev_upload(dtb), *dnw = dev_upload(nw);
        uint16_t *dz = dev_upload(z), *dy = dev_poison<uint16_t>(z.size());
        char sp[64] = "";
        for (int t0 = 0, i = 0; t0 < c.T; t0 = splits[i++]) {
            gpu_dn(form, c, t0, splits[i] - t0, dqkv, dba, dconv, dS, dcw, dA, ddt, dz, dnw, dy);
            if (splits[i] < c.T)
                snprintf(sp + strlen(sp), sizeof sp - strlen(sp), "%s%d", i ? "," : " @",
                         splits[i]);
        }
        std::vector<uint16_t> yb = dev_download(dy, z.size());
        std::vector<float> y(yb.size());
        for (size_t i = 0; i < y.size(); i++) y[i] = h_f32(yb[i]);
        std::vector<float> gS = dev_download(dS, S.size()), gc = dev_download(dconv, conv.size());
        char what[160];
        snprintf(what, sizeof what, "dn %s T=%d h=%d/%d dk=%d dv=%d%s%s: y", form_name[form], c.T,
                 c.kh, c.vh, c.dk, c.dv, c.slow ? " slow" : "", sp);
        report(what, rel_l2(y.data(), ref.y.data(), y.size()), 8e-3);
        snprintf(what, sizeof what, "dn %s T=%d%s: state S", form_name[form], c.T, sp);
        report(what, rel_l2(gS.data(), ref.S.data(), gS.size()), 1e-4);
        snprintf(what, sizeof what, "dn %s T=%d%s: conv state", form_name[form], c.T, sp);
        report(what, rel_l2(gc.data(), ref.conv.data(), gc.size()), 0);
        for (void *p : {(void *)dqkv, (void *)dba, (void *)dconv, (void *)dS, (void *)dcw,
                        (void *)dA, (void *)ddt, (void *)dnw, (void *)dz, (void *)dy})
            CK(cudaFree(p));
    }
}

// The state kernel with one chunk stage, as on devices with less shared memory per block (A100:
// 163 KB takes one 113 KB stage for dk 128): the largest opt-in size that gives one stage.
static void check_one_stage(const dn_case &c, std::vector<int> splits) {
    dn_dims d = {c.T, c.kh, c.vh, c.dk, c.dv, c.K};
    size_t x = smem_optin();
    while (x >= 1024 && pf_dn_chunked_stages(&d, x) != 1) x -= 1024;
    if (x < 1024) {
        report("dn chunked, one stage: no shared-memory size gives one stage", INFINITY, 0);
        return;
    }
    printf("one chunk stage: opt-in shared memory taken as %zu bytes\n", x);
    g_optin = x;
    check({FORM_CHUNKED}, c, splits);
    g_optin = 0;
}

// Both forms of the recurrence on the 35B layer (16/32 heads, dk = dv = 128) at T tokens; the
// median of 5 runs of each.
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
          *o = dev_poison<float>((size_t)T * c.vh * c.dv);
    CK(cudaMemset(S, 0, sizeof(float) * c.vh * c.dk * c.dv));
    float *A = dev_poison<float>(32), *dt = dev_poison<float>(32);
    CK(cudaMemset(A, 0, 128));
    CK(cudaMemset(dt, 0, 128));
    void *ws = dev_poison<uint8_t>(pf_dn_chunked_ws_bytes(&d));
    gpu_timer tm;
    OK(pf_dn_prep(0, &d, dqkv, conv, cw, qkvc, dba, A, dt, ERR));
    tm.start(0);
    OK(pf_dn_prep(0, &d, dqkv, conv, cw, qkvc, dba, A, dt, ERR));
    float t_prep = tm.stop_ms(0), t[5][5];
    // scan; chunked; chunked with 2-warp state blocks; the chunked form's prep kernel alone; its
    // state kernel alone (on the prep's output of the previous run)
    const int nw[5] = {0, 0, 2, 0, 0}, kern[5] = {0, 3, 3, 1, 2};
    const size_t optin = smem_optin();
    for (int f = 0; f < 5; f++) {
        pf_dn_chunked_test(nw[f], kern[f]);
        for (int r = -1; r < 5; r++) { // r = -1: warm-up
            tm.start(0);
            if (f == 0)
                OK(pf_dn_scan(0, &d, qkvc, dba, S, o, ERR));
            else
                OK(pf_dn_chunked(0, &d, optin, qkvc, dba, S, o, ws, ERR));
            float ms = tm.stop_ms(0);
            if (r >= 0) t[f][r] = ms;
        }
        std::sort(t[f], t[f] + 5);
    }
    pf_dn_chunked_test(0, 3);
    printf("bench dn T=%6d: conv+norm %.3f ms | scan %8.3f ms (%.3f us/tok) | chunked %8.3f ms "
           "(%.3f us/tok, chunked/scan %.3f; prep %.3f + state %.3f) | 2-warp blocks %8.3f ms\n",
           T, t_prep, t[0][2], t[0][2] * 1000 / T, t[1][2], t[1][2] * 1000 / T, t[1][2] / t[0][2],
           t[3][2], t[4][2], t[2][2]);
    for (void *p : {(void *)dqkv, (void *)dba, (void *)qkvc, (void *)conv, (void *)cw, (void *)S,
                    (void *)o, (void *)A, (void *)dt, ws})
        CK(cudaFree(p));
}

int main(int argc, char **argv) {
    const bool do_bench = argc > 1 && !strcmp(argv[argc - 1], "--bench");
    const std::vector<dn_form> f = {FORM_SCAN, FORM_CHUNKED};
    check(f, {77, 2, 4, 128, 32, 4}, {});
    check(f, {77, 2, 4, 128, 32, 4}, {50});
    check(f, {2, 2, 4, 128, 32, 4}, {1}); // calls shorter than the conv window
    check(f, {1, 2, 4, 128, 32, 4}, {});
    check(f, {45, 1, 2, 64, 16, 4}, {});
    check(f, {33, 2, 2, 32, 48, 3}, {});
    check(f, {64, 2, 4, 128, 128, 4}, {});        // exactly one chunk
    check(f, {200, 2, 4, 128, 64, 4}, {65, 129}); // calls straddling chunk boundaries
    check(f, {130, 1, 4, 64, 32, 4}, {});         // 4 value heads per key head
    check(f, {4099, 2, 4, 128, 128, 4, true}, {1500, 1501});
    check(f, {8192, 2, 4, 128, 128, 4, true}, {});
    check(f, {8192, 2, 4, 128, 128, 4}, {2048, 4096, 6144});
    g_nw = 2; // the state kernel's other block shape
    check({FORM_CHUNKED}, {300, 2, 4, 128, 128, 4}, {130});
    g_nw = 0;
    check_one_stage({300, 2, 4, 128, 128, 4}, {130});
    check_one_stage({130, 1, 4, 64, 32, 4}, {});
    if (do_bench)
        for (int T : {64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768}) bench(T);
    printf(g_fail ? "check_prefill_dn: FAIL\n" : "check_prefill_dn: all ok\n");
    return g_fail;
}
