// Attention decode check: q/k RMSNorm, partial RoPE, KV-cache append, GQA split-KV attention with
// the output gate, against a host reference over bf16-rounded caches — short contexts, contexts
// that are not tile multiples, and long split contexts; also several consecutive steps. The int8
// cache (backend/kv_int8.h): the appended codes and scales against the host's quantization of the
// host's k/v (codes within 1: the device's norm and rotation round differently), the attention
// against a host reference over the device's cache.
#include "backend/kv_int8.h"
#include "common_check.cuh"

// Host quantization of a head's row into codes + group scales (backend/kv_int8.h).
static void host_q8(const float *x, int n, unsigned char *code, float *scale) {
    for (int g = 0; g < n / KV_INT8_GROUP; g++)
        scale[g] = kv_int8_group(x + g * KV_INT8_GROUP, code + g * KV_INT8_GROUP);
}

static void host_rope(float *x, int pos, int rope_dim, float theta) {
    int half = rope_dim / 2;
    for (int i = 0; i < half; i++) {
        float inv = (float)(1.0 / pow((double)theta, (double)(2 * i) / rope_dim));
        float ang = (float)pos * inv;
        float cs = (float)cos((double)ang), sn = (float)sin((double)ang);
        float a = x[i], b = x[i + half];
        x[i] = a * cs - b * sn;
        x[i + half] = b * cs + a * sn;
    }
}
static void host_rms(float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = 1.f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) x[i] = x[i] * r * w[i];
}

struct acase {
    int nh, nkv, hd, rope, gate, ctx, splits, steps, int8;
};

// An int8 cache [rows][R bytes]: the value of (row t, head h, dim j).
static float q8_val(const std::vector<unsigned char> &c, size_t R, int nkv, int hd, int t, int h,
                    int j) {
    float sc;
    memcpy(&sc, &c[t * R + (size_t)nkv * hd + 4 * ((h * hd + j) / KV_INT8_GROUP)], 4);
    return (float)((int)c[t * R + (size_t)h * hd + j] - 128) * sc;
}

static void t_attn(struct acase c) {
    const int max_ctx = c.ctx + c.steps + 1, G = c.nh / c.nkv;
    const size_t row = (size_t)c.nkv * c.hd, R = kv_row_bytes(c.nkv, c.hd, c.int8);
    const int ng = c.hd / KV_INT8_GROUP;
    // rows from ctx on are NaN until written (bf16 0x7fc0; int8: every byte 0xff, NaN scales), so
    // a kernel that reads a row before the step's prep wrote it, or past the length, fails
    std::vector<uint16_t> kc(max_ctx * row, 0x7fc0), vc(max_ctx * row, 0x7fc0);
    std::vector<unsigned char> kq(max_ctx * R, 0xff), vq(max_ctx * R, 0xff); // int8 caches
    for (size_t i = 0; i < (size_t)c.ctx * row; i++)
        kc[i] = f32_to_bf16(rnd_f(-1.5f, 1.5f)), vc[i] = f32_to_bf16(rnd_f(-1, 1));
    for (int t = 0; c.int8 && t < c.ctx; t++)
        for (int h = 0; h < c.nkv; h++) {
            std::vector<float> k = rnd_vec(c.hd, -1.5f, 1.5f), v = rnd_vec(c.hd, -1, 1);
            if (t % 97 == 5) std::fill(v.begin(), v.begin() + 64, 0.f); // a zero group: scale 0
            host_q8(k.data(), c.hd, &kq[t * R + (size_t)h * c.hd],
                    (float *)&kq[t * R + row + 4 * h * ng]);
            host_q8(v.data(), c.hd, &vq[t * R + (size_t)h * c.hd],
                    (float *)&vq[t * R + row + 4 * h * ng]);
        }
    unsigned char *dkc, *dvc;
    if (c.int8) {
        dkc = dev_copy(kq), dvc = dev_copy(vq);
    } else {
        dkc = (unsigned char *)dev_copy(kc), dvc = (unsigned char *)dev_copy(vc);
    }
    std::vector<float> qn = rnd_vec(c.hd, 0.5f, 1.5f), kn = rnd_vec(c.hd, 0.5f, 1.5f);
    float *dqn = dev_copy(qn), *dkn = dev_copy(kn);
    const int qgw = c.hd * (c.gate ? 2 : 1);
    float *dqg, *dk, *dv, *dq = dev_poison((size_t)c.nh * c.hd),
                          *dout = dev_poison((size_t)c.nh * c.hd);
    float *part = dev_poison((size_t)c.splits * c.nh * (c.hd + 2));
    int *dpos;
    CK(cudaMalloc(&dqg, (size_t)c.nh * qgw * 4));
    CK(cudaMalloc(&dk, row * 4));
    CK(cudaMalloc(&dv, row * 4));
    CK(cudaMalloc(&dpos, 4));
    std::vector<float> want((size_t)c.nh * c.hd);
    for (int st = 0; st < c.steps; st++) {
        const int pos = c.ctx + st;
        std::vector<float> qg = rnd_vec((size_t)c.nh * qgw, -2, 2), k = rnd_vec(row, -2, 2),
                           v = rnd_vec(row, -1, 1);
        CK(cudaMemcpy(dqg, qg.data(), qg.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dk, k.data(), row * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dv, v.data(), row * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dpos, &pos, 4, cudaMemcpyHostToDevice));
        struct attn_params p;
        memset(&p, 0, sizeof p);
        p.qg = dqg, p.k = dk, p.v = dv, p.q_norm = dqn, p.k_norm = dkn, p.kc = dkc, p.vc = dvc,
        p.pos = dpos, p.kv_int8 = c.int8, p.kv_row = (int)R;
        p.n_heads = c.nh, p.n_kv = c.nkv, p.hd = c.hd, p.rope_dim = c.rope, p.rope_theta = 1e7f,
        p.eps = 1e-6f;
        p.gate = c.gate, p.max_ctx = max_ctx, p.splits = c.splits, p.q_ws = dq, p.part = part,
        p.out = dout;
        WK(attn_launch(&p, 0, &err_));
        // host: append k, v (bf16 or int8); int8: attend over the device's cache (below)
        for (int h = 0; h < c.nkv; h++) {
            float *kk = &k[(size_t)h * c.hd];
            host_rms(kk, kn.data(), c.hd, 1e-6f);
            host_rope(kk, pos, c.rope, 1e7f);
            for (int d = 0; d < c.hd; d++)
                kc[(size_t)pos * row + h * c.hd + d] = f32_to_bf16(kk[d]),
                                                  vc[(size_t)pos * row + h * c.hd + d] =
                                                      f32_to_bf16(v[(size_t)h * c.hd + d]);
            if (c.int8) {
                host_q8(kk, c.hd, &kq[pos * R + (size_t)h * c.hd],
                        (float *)&kq[pos * R + row + 4 * h * ng]);
                host_q8(&v[(size_t)h * c.hd], c.hd, &vq[pos * R + (size_t)h * c.hd],
                        (float *)&vq[pos * R + row + 4 * h * ng]);
            }
        }
        if (st + 1 < c.steps) continue; // only the last step's output is compared
        std::vector<unsigned char> gkq, gvq;
        if (c.int8) gkq = host_copy(dkc, (pos + 1) * R), gvq = host_copy(dvc, (pos + 1) * R);
        auto kval = [&](int t, int h, int j) {
            return c.int8 ? q8_val(gkq, R, c.nkv, c.hd, t, h, j)
                          : bf16_to_f32(kc[(size_t)t * row + h * c.hd + j]);
        };
        auto vval = [&](int t, int h, int j) {
            return c.int8 ? q8_val(gvq, R, c.nkv, c.hd, t, h, j)
                          : bf16_to_f32(vc[(size_t)t * row + h * c.hd + j]);
        };
        for (int h = 0; h < c.nh; h++) {
            std::vector<float> q(&qg[(size_t)h * qgw], &qg[(size_t)h * qgw] + c.hd);
            host_rms(q.data(), qn.data(), c.hd, 1e-6f);
            host_rope(q.data(), pos, c.rope, 1e7f);
            int kvh = h / G;
            std::vector<double> s(pos + 1);
            double mx = -1e300;
            for (int t = 0; t <= pos; t++) {
                double d = 0;
                for (int j = 0; j < c.hd; j++) d += (double)q[j] * kval(t, kvh, j);
                s[t] = d / sqrt((double)c.hd);
                mx = fmax(mx, s[t]);
            }
            double den = 0;
            for (int t = 0; t <= pos; t++) den += (s[t] = exp(s[t] - mx));
            for (int j = 0; j < c.hd; j++) {
                double o = 0;
                for (int t = 0; t <= pos; t++) o += s[t] * vval(t, kvh, j);
                o /= den;
                if (c.gate) o *= 1 / (1 + exp(-(double)qg[(size_t)h * qgw + c.hd + j]));
                want[(size_t)h * c.hd + j] = (float)o;
            }
        }
    }
    char name[160];
    snprintf(name, sizeof name, "attention%s h%d/kv%d d%d rope%d%s ctx %d (+%d steps) splits %d",
             c.int8 ? " int8" : "", c.nh, c.nkv, c.hd, c.rope, c.gate ? " gate" : "", c.ctx,
             c.steps, c.splits);
    // int8: Q is one f16 part (11 bits) and P f16 in the kernel
    check_close(name, host_copy(dout, want.size()).data(), want.data(), want.size(),
                c.int8 ? 4e-3f : 2e-3f, c.int8 ? 3e-2f : 2e-2f);
    if (c.int8) {
        const int n = c.ctx + c.steps;
        std::vector<unsigned char> gk = host_copy(dkc, n * R), gv = host_copy(dvc, n * R);
        int bad = 0;
        double worst = 0;
        for (int t = 0; t < n; t++)
            for (int h = 0; h < c.nkv; h++) {
                for (int j = 0; j < c.hd; j++) {
                    const size_t o = t * R + (size_t)h * c.hd + j;
                    bad += abs((int)gk[o] - (int)kq[o]) > 1 || abs((int)gv[o] - (int)vq[o]) > 1;
                }
                for (int kv = 0; kv < 2 * ng; kv++) {
                    float a, b;
                    const size_t o = t * R + row + 4 * (h * ng + kv / 2);
                    memcpy(&a, &(kv & 1 ? gv : gk)[o], 4);
                    memcpy(&b, &(kv & 1 ? vq : kq)[o], 4);
                    worst = fmax(worst, fabs(a - b) / fmax(fabs(b), 1e-30));
                }
            }
        snprintf(name, sizeof name,
                 "int8 kv append ctx %d: codes within 1 (%d off), scales (rel err %.1e)", c.ctx,
                 bad, worst);
        check_true(name, bad == 0 && worst < 1e-3);
        CK(cudaFree(dkc));
        CK(cudaFree(dvc));
        CK(cudaFree(part));
        return;
    }
    const size_t nrow = (size_t)(c.ctx + c.steps) * row;
    std::vector<uint16_t> gk = host_copy((uint16_t *)dkc, nrow);
    std::vector<float> a(nrow), b(nrow);
    for (size_t i = 0; i < nrow; i++) a[i] = bf16_to_f32(gk[i]), b[i] = bf16_to_f32(kc[i]);
    snprintf(name, sizeof name, "kv cache append (K, normed+roped) ctx %d", c.ctx);
    check_close(name, a.data(), b.data(), nrow, 1e-2f, 1e-2f);
    CK(cudaFree(dkc));
    CK(cudaFree(dvc));
    CK(cudaFree(part));
}

int main(void) {
    init_device();
    const int S = attn_splits(2);
    struct acase cs[] = {
        {16, 2, 256, 64, 1, 0, S, 1},
        {16, 2, 256, 64, 1, 0, S, 70},
        {16, 2, 256, 64, 1, 63, S, 3},
        {16, 2, 256, 64, 1, 1000, 1, 1},
        {16, 2, 256, 64, 1, 4095, S, 2},
        {16, 2, 256, 64, 1, 40000, S, 1},
        {16, 2, 256, 64, 0, 777, S, 1},
        {8, 4, 128, 32, 1, 300, attn_splits(4), 2},
        {4, 4, 64, 64, 1, 129, attn_splits(4), 2},
        {32, 2, 128, 128, 1, 2000, S, 1},
        // int8 cache: the model's shape, the tiny test model's (2 heads per KV head), 5 KV heads
        // (scales across two 16-byte chunks), 16 heads per KV head
        {16, 2, 256, 64, 1, 0, S, 1, 1},
        {16, 2, 256, 64, 1, 0, S, 70, 1},
        {16, 2, 256, 64, 1, 63, S, 3, 1},
        {16, 2, 256, 64, 1, 1000, 1, 1, 1},
        {16, 2, 256, 64, 1, 4095, S, 2, 1},
        {16, 2, 256, 64, 1, 40000, S, 1, 1},
        {16, 2, 256, 64, 0, 777, S, 1, 1},
        {4, 2, 256, 64, 1, 129, S, 2, 1},
        {10, 5, 256, 64, 1, 300, attn_splits(5), 2, 1},
        {16, 1, 256, 64, 1, 2000, attn_splits(1), 1, 1},
        // bf16 tensor-core path with 16 heads per KV head (two head tiles); other rotary widths
        // (pairs 64 dims apart; the whole head)
        {32, 2, 256, 64, 1, 1500, S, 2},
        {16, 2, 256, 128, 1, 130, S, 2},
        {16, 2, 256, 256, 0, 17, S, 1},
    };
    for (auto &c : cs) t_attn(c);
    // a consumer card's shared memory (99 KiB per block): one K/V stage per warp in the bf16
    // tensor-core kernel
    cudaDeviceProp dp;
    CK(cudaGetDeviceProperties(&dp, 0));
    attn_set_device(dp.multiProcessorCount, 99 * 1024);
    struct acase small[] = {
        {16, 2, 256, 64, 1, 4095, S, 2},
        {32, 2, 256, 64, 1, 1500, S, 1},
        {16, 2, 256, 64, 1, 3000, S, 1, 1},
    };
    for (auto &c : small) t_attn(c);
    attn_set_device(dp.multiProcessorCount, dp.sharedMemPerBlockOptin);
    return finish("check_decode_attn");
}
