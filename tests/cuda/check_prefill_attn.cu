// Prefill attention (q/k RMSNorm + partial RoPE + KV cache write, causal flash attention with GQA
// and the output gate) vs a CPU implementation, at position 0 and after earlier chunks' KV.
// With the int8 cache (backend/kv_int8.h): the chunk's rows quantized by the prep (codes within 1
// of the host's, scales), then dequantized into bf16 rows that the flash kernel reads.
// `--bench`: the 35B shapes (16 q heads, 2 KV heads, head dim 256) at several contexts.
#include "backend/cuda/kv_int8.cuh"
#include "check_prefill_util.cuh"

struct at_case {
    int T, pos, nh, nkv, rope_dim;
};

static void cpu_norm_rope(float *x, const float *w, int hd, int rope_dim, int p, double theta,
                          float eps) {
    double ss = 0;
    for (int i = 0; i < hd; i++) ss += (double)x[i] * x[i];
    float r = 1.f / sqrtf((float)(ss / hd) + eps);
    for (int i = 0; i < hd; i++) x[i] *= r * w[i];
    int half = rope_dim / 2;
    for (int i = 0; i < half; i++) {
        double a = p * pow(theta, -2.0 * i / rope_dim);
        float c = (float)cos(a), s = (float)sin(a);
        float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
    }
}

// The shared memory per block the kernel may use: the device's, or a smaller limit (the block
// shapes of other GPUs: 160 KB A100-like, 99 KB consumer).
static size_t g_smem;

static void check(const at_case &c, bool int8) {
    const int hd = 256, T = c.T, pos = c.pos, ctx = pos + T + 5;
    const size_t R = kv_row_bytes(c.nkv, hd, int8), kvd = (size_t)c.nkv * hd;
    const double theta = 1e7;
    const float eps = 1e-6f;
    std::vector<float> q((size_t)T * c.nh * hd * 2), k((size_t)T * c.nkv * hd),
        v((size_t)T * c.nkv * hd), qn(hd), kn(hd);
    for (auto &x : q) x = rnd_n();
    for (auto &x : k) x = rnd_n();
    for (auto &x : v) x = rnd_n();
    for (auto &x : qn) x = rnd_f(0.5, 1.5);
    for (auto &x : kn) x = rnd_f(0.5, 1.5);
    // cache rows [0, pos) from "earlier chunks"
    std::vector<uint16_t> kc = rand_bf16((size_t)ctx * c.nkv * hd, 1.f),
                          vc = rand_bf16((size_t)ctx * c.nkv * hd, 1.f);
    std::vector<float> K((size_t)(pos + T) * c.nkv * hd), V(K.size());
    for (size_t i = 0; i < (size_t)pos * c.nkv * hd; i++) K[i] = h_f32(kc[i]), V[i] = h_f32(vc[i]);
    // int8: codes + scales of the same rows; a row's values as the dequantization gives them
    std::vector<unsigned char> kq(ctx * R, 0), vq(ctx * R, 0);
    const int ng = hd / KV_INT8_GROUP;
    auto q8 = [&](std::vector<unsigned char> &cache, int t, int h, float *x) {
        for (int g = 0; g < ng; g++) {
            unsigned char *code = &cache[t * R + (size_t)h * hd + g * KV_INT8_GROUP];
            const float sc = kv_int8_group(x + g * KV_INT8_GROUP, code);
            memcpy(&cache[t * R + kvd + 4 * (h * ng + g)], &sc, 4);
            for (int i = 0; i < KV_INT8_GROUP; i++)
                x[g * KV_INT8_GROUP + i] = round_bf16((float)((int)code[i] - 128) * sc);
        }
    };
    for (int t = 0; int8 && t < pos; t++)
        for (int h = 0; h < c.nkv; h++) {
            q8(kq, t, h, &K[(t * kvd + (size_t)h * hd)]);
            q8(vq, t, h, &V[(t * kvd + (size_t)h * hd)]);
        }
    for (int t = 0; t < T; t++)
        for (int h = 0; h < c.nkv; h++) {
            float *kd = &K[((size_t)(pos + t) * c.nkv + h) * hd];
            float *vd = &V[((size_t)(pos + t) * c.nkv + h) * hd];
            memcpy(kd, &k[((size_t)t * c.nkv + h) * hd], hd * 4);
            cpu_norm_rope(kd, kn.data(), hd, c.rope_dim, pos + t, theta, eps);
            memcpy(vd, &v[((size_t)t * c.nkv + h) * hd], hd * 4);
            if (int8) {
                q8(kq, pos + t, h, kd);
                q8(vq, pos + t, h, vd);
            } else {
                for (int i = 0; i < hd; i++) kd[i] = round_bf16(kd[i]), vd[i] = round_bf16(vd[i]);
            }
        }
    std::vector<float> ref((size_t)T * c.nh * hd), qv(hd), sc(pos + T);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < c.nh; h++) {
            const float *qs = &q[((size_t)t * c.nh + h) * hd * 2];
            memcpy(qv.data(), qs, hd * 4);
            cpu_norm_rope(qv.data(), qn.data(), hd, c.rope_dim, pos + t, theta, eps);
            for (auto &x : qv) x = round_bf16(x);
            const int kvh = h / (c.nh / c.nkv), n = pos + t + 1;
            double mx = -1e300, sum = 0;
            for (int j = 0; j < n; j++) {
                double s = 0;
                for (int i = 0; i < hd; i++)
                    s += (double)qv[i] * K[((size_t)j * c.nkv + kvh) * hd + i];
                sc[j] = (float)(s / 16.0);
                mx = fmax(mx, sc[j]);
            }
            for (int j = 0; j < n; j++) sum += exp(sc[j] - mx);
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int j = 0; j < n; j++)
                    o += exp(sc[j] - mx) * V[((size_t)j * c.nkv + kvh) * hd + i];
                float g = 1.f / (1.f + expf(-qs[hd + i]));
                ref[((size_t)t * c.nh + h) * hd + i] = (float)(o / sum) * g;
            }
        }

    float *dq = dev_upload(q), *dk = dev_upload(k), *dv = dev_upload(v), *dqn = dev_upload(qn),
          *dkn = dev_upload(kn);
    uint16_t *dkc = dev_upload(kc), *dvc = dev_upload(vc);
    unsigned char *dkq = dev_upload(kq), *dvq = dev_upload(vq);
    uint16_t *dkd = dev_poison<uint16_t>((size_t)(pos + T) * kvd),
             *dvd = dev_poison<uint16_t>((size_t)(pos + T) * kvd); // dequantized rows
    uint16_t *dqb = dev_poison<uint16_t>((size_t)c.nh * T * hd);
    uint16_t *dout = dev_poison<uint16_t>(ref.size());
    attn_dims d = {T, pos, c.nh, c.nkv, hd, c.rope_dim, (float)theta, eps, true, int8, (int)R};
    if (int8) {
        OK(pf_attn_prep(0, &d, dq, dk, dv, dqn, dkn, (bf16 *)dqb, dkq, dvq, ERR));
        OK(pf_kv_dequant(0, &d, pos + T, dkq, dvq, (bf16 *)dkd, (bf16 *)dvd, ERR));
        OK(pf_flash_attn(0, &d, (const bf16 *)dqb, dkd, dvd, dq, (bf16 *)dout, g_smem, ERR));
    } else {
        OK(pf_attn_prep(0, &d, dq, dk, dv, dqn, dkn, (bf16 *)dqb, dkc, dvc, ERR));
        OK(pf_flash_attn(0, &d, (const bf16 *)dqb, dkc, dvc, dq, (bf16 *)dout, g_smem, ERR));
    }
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> ob = dev_download(dout, ref.size()),
                          kb = dev_download(int8 ? dkd : dkc, (size_t)(pos + T) * c.nkv * hd);
    if (int8) { // the chunk's codes and scales against the host's quantization of its rows
        std::vector<unsigned char> gk = dev_download(dkq, ctx * R), gv = dev_download(dvq, ctx * R);
        int bad = 0;
        double worst = 0;
        for (int t = pos; t < pos + T; t++)
            for (int h = 0; h < c.nkv; h++) {
                for (int i = 0; i < hd; i++) {
                    const size_t o = t * R + (size_t)h * hd + i;
                    bad += abs((int)gk[o] - (int)kq[o]) > 1 || abs((int)gv[o] - (int)vq[o]) > 1;
                }
                for (int g = 0; g < ng; g++) {
                    const size_t o = t * R + kvd + 4 * (h * ng + g);
                    float a, b;
                    memcpy(&a, &gk[o], 4);
                    memcpy(&b, &kq[o], 4);
                    worst = fmax(worst, fabs(a - b) / fmax(fabs(b), 1e-30));
                    memcpy(&a, &gv[o], 4);
                    memcpy(&b, &vq[o], 4);
                    worst = fmax(worst, fabs(a - b) / fmax(fabs(b), 1e-30));
                }
            }
        char what[160];
        snprintf(what, sizeof what, "attn int8 T=%d pos=%d: codes within 1 (%d off), scales", T,
                 pos, bad);
        report(what, bad ? 1.0 : worst, 1e-3);
    }
    std::vector<float> out(ob.size()), kg(kb.size());
    for (size_t i = 0; i < ob.size(); i++) out[i] = h_f32(ob[i]);
    for (size_t i = 0; i < kb.size(); i++) kg[i] = h_f32(kb[i]);
    char what[160];
    snprintf(what, sizeof what, "attn%s T=%d pos=%d heads %d:%d rope %d smem %zuK: output",
             int8 ? " int8" : "", T, pos, c.nh, c.nkv, c.rope_dim, g_smem / 1024);
    report(what, rel_l2(out.data(), ref.data(), out.size()), 1.5e-2);
    snprintf(what, sizeof what, "attn%s T=%d pos=%d: K cache rows",
             int8 ? " int8 (dequantized)" : "", T, pos);
    report(what, rel_l2(kg.data(), K.data(), kg.size()), 8e-3);
    CK(cudaFree(dq));
    CK(cudaFree(dk));
    CK(cudaFree(dv));
    CK(cudaFree(dkc));
    CK(cudaFree(dvc));
    CK(cudaFree(dkq));
    CK(cudaFree(dvq));
    CK(cudaFree(dkd));
    CK(cudaFree(dvd));
    CK(cudaFree(dqb));
    CK(cudaFree(dout));
}

static void bench(int T, int pos) {
    const int nh = 16, nkv = 2, hd = 256, ctx = pos + T;
    attn_dims d = {T, pos, nh, nkv, hd, 64, 1e7f, 1e-6f, true, false, 0};
    float *q = dev_poison<float>((size_t)T * nh * hd * 2);
    CK(cudaMemset(q, 0, sizeof(float) * T * nh * hd * 2));
    uint16_t *kc = dev_poison<uint16_t>((size_t)ctx * nkv * hd),
             *vc = dev_poison<uint16_t>((size_t)ctx * nkv * hd);
    CK(cudaMemset(kc, 0, 2ull * ctx * nkv * hd));
    CK(cudaMemset(vc, 0, 2ull * ctx * nkv * hd));
    uint16_t *qb = dev_poison<uint16_t>((size_t)T * nh * hd),
             *out = dev_poison<uint16_t>((size_t)T * nh * hd);
    CK(cudaMemset(qb, 0, 2ull * T * nh * hd));
    gpu_timer tm;
    OK(pf_flash_attn(0, &d, (const bf16 *)qb, kc, vc, q, (bf16 *)out, g_smem, ERR));
    tm.start(0);
    OK(pf_flash_attn(0, &d, (const bf16 *)qb, kc, vc, q, (bf16 *)out, g_smem, ERR));
    float ms = tm.stop_ms(0);
    double flop = 4.0 * nh * hd * ((double)T * pos + (double)T * (T + 1) / 2);
    printf("bench flash T=%6d pos=%7d smem %zuK: %.3f ms, %.0f TFLOP/s\n", T, pos, g_smem / 1024,
           ms, flop / ms / 1e9);
    CK(cudaFree(q));
    CK(cudaFree(kc));
    CK(cudaFree(vc));
    CK(cudaFree(qb));
    CK(cudaFree(out));
}

int main(int argc, char **argv) {
    const size_t limits[3] = {dev_smem_optin(), 163840, 101376};
    for (size_t lim : limits) {
        g_smem = lim < dev_smem_optin() ? lim : dev_smem_optin();
        for (int int8 = 0; int8 < 2; int8++) {
            check({100, 0, 4, 1, 64}, int8);
            check({100, 70, 4, 1, 64}, int8);
            check({37, 130, 16, 2, 64}, int8);
            check({1, 5, 2, 2, 256}, int8);
            check({130, 0, 2, 1, 0}, int8);
        }
    }
    if (argc > 1 && !strcmp(argv[argc - 1], "--bench"))
        for (size_t lim : limits) {
            g_smem = lim < dev_smem_optin() ? lim : dev_smem_optin();
            bench(4096, 0);
            bench(4096, 28672);
            bench(4096, 126976);
        }
    printf(g_fail ? "check_prefill_attn: FAIL\n" : "check_prefill_attn: all ok\n");
    return g_fail;
}
