// cuda_prefill() end to end on a tiny random hybrid model (3 DeltaNet + 1 attention layer, MoE
// with a gated shared expert) vs a plain f32 CPU forward pass of MODEL.md: all positions'
// logits (rel L2, top-1 agreement), one chunk vs several chunks (dense GEMMs split along K where
// they have few tiles, as in production), and the last-logits contract.
#include <algorithm>

#include "check_prefill_util.cuh"

namespace {

struct hlayer {
    enum layer_kind kind;
    tmat dn_qkv, dn_z, dn_b, dn_a, dn_out, q, k, v, o, router, eg, eu, ed, sg, su, sd, sgw;
    std::vector<float> in_norm, post_norm, conv, A_log, dt_bias, dn_norm, q_norm, k_norm;
};

struct hmodel {
    struct model_config c;
    tmat embed, lm_head;
    std::vector<float> final_norm;
    std::vector<hlayer> L;
};

std::vector<float> rvec(size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (auto &x : v) x = rnd_f(lo, hi);
    return v;
}

// kind 0: dense MLP; 1: MoE choosing all of 4 experts (continuous in its inputs); 2: top-4 of 16.
hmodel make_model(int kind) {
    const bool moe = kind > 0;
    hmodel m;
    struct model_config &c = m.c;
    memset(&c, 0, sizeof c);
    c.hidden = 256;
    c.n_layers = 4;
    c.vocab = 1000;
    for (int i = 0; i < 4; i++) c.kind[i] = i == 3 ? LAYER_ATTENTION : LAYER_DELTANET;
    c.rms_eps = 1e-6f;
    c.n_heads = 8;
    c.n_kv_heads = 1;
    c.head_dim = 256;
    c.rope_dim = 64;
    c.rope_theta = 1e7f;
    c.attn_output_gate = true;
    c.dn_k_heads = 2;
    c.dn_v_heads = 4;
    c.dn_k_dim = 128;
    c.dn_v_dim = 128;
    c.conv_kernel = 4;
    c.n_experts = kind == 2 ? 16 : kind == 1 ? 4 : 0;
    c.top_k = moe ? 4 : 0;
    c.expert_inter = moe ? 128 : 0;
    c.shared_inter = moe ? 128 : 0;
    c.dense_inter = moe ? 0 : 192;
    c.norm_topk = true;
    const int H = c.hidden, C = cfg_dn_conv_dim(&c), V = cfg_dn_v_dim(&c);
    m.embed = make_tmat(WT_Q4, 1, c.vocab, H, 64);
    m.lm_head = make_tmat(WT_Q4, 1, c.vocab, H, 64);
    m.final_norm = rvec(H, 0.8f, 1.2f);
    for (int l = 0; l < c.n_layers; l++) {
        hlayer L;
        L.kind = c.kind[l];
        L.in_norm = rvec(H, 0.8f, 1.2f);
        L.post_norm = rvec(H, 0.8f, 1.2f);
        if (L.kind == LAYER_DELTANET) {
            L.dn_qkv = make_tmat(WT_Q4, 1, C, H, 64);
            L.dn_z = make_tmat(WT_Q4, 1, V, H, 64);
            L.dn_b = make_tmat(WT_Q4, 1, c.dn_v_heads, H, 64);
            L.dn_a = make_tmat(WT_Q4, 1, c.dn_v_heads, H, 64);
            L.dn_out = make_tmat(WT_Q4, 1, H, V, 64);
            L.conv = rvec((size_t)C * 4, -0.6f, 0.6f);
            L.A_log = rvec(c.dn_v_heads, -1.f, 0.5f);
            L.dt_bias = rvec(c.dn_v_heads, -0.5f, 0.5f);
            L.dn_norm = rvec(c.dn_v_dim, 0.8f, 1.2f);
        } else {
            L.q = make_tmat(WT_Q4, 1, c.n_heads * c.head_dim * 2, H, 64);
            L.k = make_tmat(WT_Q4, 1, c.n_kv_heads * c.head_dim, H, 64);
            L.v = make_tmat(WT_Q4, 1, c.n_kv_heads * c.head_dim, H, 64);
            L.o = make_tmat(WT_Q4, 1, H, c.n_heads * c.head_dim, 64);
            L.q_norm = rvec(c.head_dim, 0.8f, 1.2f);
            L.k_norm = rvec(c.head_dim, 0.8f, 1.2f);
        }
        const int SI = moe ? c.shared_inter : c.dense_inter;
        if (moe) {
            L.router = make_tmat(WT_Q8, 1, c.n_experts, H, 64);
            L.eg = make_tmat(WT_Q4, c.n_experts, c.expert_inter, H, 64);
            L.eu = make_tmat(WT_Q4, c.n_experts, c.expert_inter, H, 64);
            L.ed = make_tmat(WT_Q4, c.n_experts, H, c.expert_inter, 64);
            L.sgw = make_tmat(WT_Q8, 1, 1, H, 64);
        }
        L.sg = make_tmat(WT_Q4, 1, SI, H, 64);
        L.su = make_tmat(WT_Q4, 1, SI, H, 64);
        L.sd = make_tmat(WT_Q4, 1, H, SI, 64);
        m.L.push_back(std::move(L));
    }
    return m;
}

// ---- CPU forward pass: f32 weights as dequantized, f32 activations. With `emu`, values are
// rounded to bf16 where the GPU path stores bf16 (GEMM inputs, weights, z, SwiGLU outputs, q/k/v
// and the attention output): that separates wiring errors from rounding that a random router
// (near-ties between experts) amplifies. ----
bool g_emu = false;
inline float bfr(float x) {
    return g_emu ? round_bf16(x) : x;
}
struct fmat {
    int rows, cols;
    std::vector<float> w;
};
fmat deq(const tmat &t, int e = 0) {
    fmat f{t.rows, t.cols, std::vector<float>((size_t)t.rows * t.cols)};
    for (int r = 0; r < t.rows; r++)
        for (int k = 0; k < t.cols; k++) f.w[(size_t)r * t.cols + k] = bfr(t.at(e, r, k));
    return f;
}
std::vector<float> mv(const fmat &W, const float *x) {
    std::vector<float> y(W.rows);
    for (int r = 0; r < W.rows; r++) {
        double s = 0;
        for (int k = 0; k < W.cols; k++) s += (double)W.w[(size_t)r * W.cols + k] * x[k];
        y[r] = (float)s;
    }
    return y;
}
void rms(float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = 1.f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) x[i] *= r * w[i];
}
void round_all(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = bfr(x[i]);
}

std::vector<float> cpu_forward(const hmodel &m, const std::vector<int> &tok) {
    const struct model_config &c = m.c;
    const int n = (int)tok.size(), H = c.hidden, C = cfg_dn_conv_dim(&c), hd = c.head_dim;
    const int kh = c.dn_k_heads, vh = c.dn_v_heads, dk = c.dn_k_dim, dv = c.dn_v_dim;
    std::vector<std::vector<float>> x(n, std::vector<float>(H));
    fmat emb = deq(m.embed), lm = deq(m.lm_head);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < H; i++) x[t][i] = emb.w[(size_t)tok[t] * H + i];
    for (const hlayer &L : m.L) {
        std::vector<std::vector<float>> xn = x;
        for (auto &r : xn) {
            rms(r.data(), L.in_norm.data(), H, c.rms_eps);
            round_all(r.data(), H);
        }
        if (L.kind == LAYER_DELTANET) {
            fmat Wqkv = deq(L.dn_qkv), Wz = deq(L.dn_z), Wb = deq(L.dn_b), Wa = deq(L.dn_a),
                 Wo = deq(L.dn_out);
            std::vector<float> conv((size_t)C * 3, 0.f), S((size_t)vh * dk * dv, 0.f), o(dv);
            for (int t = 0; t < n; t++) {
                std::vector<float> qkv = mv(Wqkv, xn[t].data()), z = mv(Wz, xn[t].data()),
                                   b = mv(Wb, xn[t].data()), a = mv(Wa, xn[t].data()), y(vh * dv);
                round_all(z.data(), (int)z.size());
                std::vector<float> xc(C);
                for (int ch = 0; ch < C; ch++) {
                    float acc = 0;
                    for (int i = 0; i < 3; i++) acc += L.conv[ch * 4 + i] * conv[ch * 3 + i];
                    acc += L.conv[ch * 4 + 3] * qkv[ch];
                    conv[ch * 3] = conv[ch * 3 + 1];
                    conv[ch * 3 + 1] = conv[ch * 3 + 2];
                    conv[ch * 3 + 2] = qkv[ch];
                    xc[ch] = h_silu(acc);
                }
                for (int hh = 0; hh < 2 * kh; hh++) {
                    double ss = 0;
                    for (int i = 0; i < dk; i++) ss += (double)xc[hh * dk + i] * xc[hh * dk + i];
                    float r =
                        1.f / sqrtf((float)ss + 1e-6f) * (hh < kh ? 1.f / sqrtf((float)dk) : 1.f);
                    for (int i = 0; i < dk; i++) xc[hh * dk + i] *= r;
                }
                for (int h = 0; h < vh; h++) {
                    const int k_h = h / (vh / kh);
                    const float *q = &xc[k_h * dk], *k = &xc[kh * dk + k_h * dk];
                    const float *v = &xc[2 * kh * dk + h * dv];
                    float beta = 1.f / (1.f + expf(-b[h]));
                    float ap = a[h] + L.dt_bias[h];
                    float g = expf(-expf(L.A_log[h]) * (ap > 20.f ? ap : log1pf(expf(ap))));
                    float *Sh = &S[(size_t)h * dk * dv];
                    for (int j = 0; j < dv; j++) {
                        double kS = 0;
                        for (int i = 0; i < dk; i++) kS += (double)(Sh[i * dv + j] *= g) * k[i];
                        float delta = beta * (v[j] - (float)kS);
                        double ov = 0;
                        for (int i = 0; i < dk; i++)
                            ov += (double)(Sh[i * dv + j] += k[i] * delta) * q[i];
                        o[j] = (float)ov;
                    }
                    rms(o.data(), L.dn_norm.data(), dv, c.rms_eps);
                    for (int j = 0; j < dv; j++) y[h * dv + j] = bfr(o[j] * h_silu(z[h * dv + j]));
                }
                std::vector<float> out = mv(Wo, y.data());
                for (int i = 0; i < H; i++) x[t][i] += out[i];
            }
        } else {
            fmat Wq = deq(L.q), Wk = deq(L.k), Wv = deq(L.v), Wo = deq(L.o);
            const int nh = c.n_heads, nkv = c.n_kv_heads, half = c.rope_dim / 2;
            std::vector<std::vector<float>> Q(n), K(n), Vv(n);
            auto rope = [&](float *v, int p) {
                for (int i = 0; i < half; i++) {
                    double an = p * pow((double)c.rope_theta, -2.0 * i / c.rope_dim);
                    float cs = (float)cos(an), sn = (float)sin(an), x1 = v[i], x2 = v[i + half];
                    v[i] = x1 * cs - x2 * sn;
                    v[i + half] = x2 * cs + x1 * sn;
                }
            };
            for (int t = 0; t < n; t++) {
                Q[t] = mv(Wq, xn[t].data());
                K[t] = mv(Wk, xn[t].data());
                Vv[t] = mv(Wv, xn[t].data());
                for (int h = 0; h < nh; h++) {
                    rms(&Q[t][h * hd * 2], L.q_norm.data(), hd, c.rms_eps);
                    rope(&Q[t][h * hd * 2], t);
                    round_all(&Q[t][h * hd * 2], hd);
                }
                for (int h = 0; h < nkv; h++) {
                    rms(&K[t][h * hd], L.k_norm.data(), hd, c.rms_eps);
                    rope(&K[t][h * hd], t);
                }
                round_all(K[t].data(), (int)K[t].size());
                round_all(Vv[t].data(), (int)Vv[t].size());
            }
            std::vector<float> att(nh * hd), sc(n);
            for (int t = 0; t < n; t++) {
                for (int h = 0; h < nh; h++) {
                    const int g = h / (nh / nkv);
                    double mx = -1e300, sum = 0;
                    for (int j = 0; j <= t; j++) {
                        double s = 0;
                        for (int i = 0; i < hd; i++)
                            s += (double)Q[t][h * hd * 2 + i] * K[j][g * hd + i];
                        sc[j] = (float)(s / sqrt((double)hd));
                        mx = std::max(mx, (double)sc[j]);
                    }
                    for (int j = 0; j <= t; j++) sum += exp(sc[j] - mx);
                    for (int i = 0; i < hd; i++) {
                        double acc = 0;
                        for (int j = 0; j <= t; j++) acc += exp(sc[j] - mx) * Vv[j][g * hd + i];
                        att[h * hd + i] =
                            bfr((float)(acc / sum) / (1.f + expf(-Q[t][h * hd * 2 + hd + i])));
                    }
                }
                std::vector<float> out = mv(Wo, att.data());
                for (int i = 0; i < H; i++) x[t][i] += out[i];
            }
        }
        // MoE (or the dense MLP)
        const bool moe = c.n_experts > 0;
        fmat Sg = deq(L.sg), Su = deq(L.su), Sd = deq(L.sd);
        fmat R = moe ? deq(L.router) : fmat{}, Sw = moe ? deq(L.sgw) : fmat{};
        std::vector<fmat> Eg, Eu, Ed;
        for (int e = 0; e < c.n_experts; e++) {
            Eg.push_back(deq(L.eg, e));
            Eu.push_back(deq(L.eu, e));
            Ed.push_back(deq(L.ed, e));
        }
        for (int t = 0; t < n; t++) {
            std::vector<float> h = x[t];
            rms(h.data(), L.post_norm.data(), H, c.rms_eps);
            round_all(h.data(), H);
            std::vector<float> acc(H, 0.f);
            auto expert = [&](const fmat &G, const fmat &U, const fmat &D, float w) {
                std::vector<float> g = mv(G, h.data()), u = mv(U, h.data());
                for (size_t i = 0; i < g.size(); i++) g[i] = bfr(h_silu(g[i]) * u[i]);
                std::vector<float> y = mv(D, g.data());
                for (int i = 0; i < H; i++) acc[i] += w * y[i];
            };
            if (!moe) {
                expert(Sg, Su, Sd, 1.f);
                for (int i = 0; i < H; i++) x[t][i] += acc[i];
                continue;
            }
            std::vector<float> lg = mv(R, h.data());
            float mx = *std::max_element(lg.begin(), lg.end());
            std::vector<double> p(c.n_experts);
            double sum = 0;
            for (int e = 0; e < c.n_experts; e++) sum += p[e] = exp((double)lg[e] - mx);
            std::vector<int> idx(c.n_experts);
            for (int e = 0; e < c.n_experts; e++) idx[e] = e;
            std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return p[a] > p[b]; });
            double ps = 0;
            for (int j = 0; j < c.top_k; j++) ps += p[idx[j]];
            for (int j = 0; j < c.top_k; j++)
                expert(Eg[idx[j]], Eu[idx[j]], Ed[idx[j]], (float)(p[idx[j]] / ps));
            float sgate = 1.f / (1.f + expf(-mv(Sw, h.data())[0]));
            expert(Sg, Su, Sd, sgate);
            for (int i = 0; i < H; i++) x[t][i] += acc[i];
        }
    }
    std::vector<float> logits((size_t)n * c.vocab);
    for (int t = 0; t < n; t++) {
        rms(x[t].data(), m.final_norm.data(), H, c.rms_eps);
        round_all(x[t].data(), H);
        std::vector<float> l = mv(lm, x[t].data());
        std::copy(l.begin(), l.end(), logits.begin() + (size_t)t * c.vocab);
    }
    return logits;
}

// ---- device side ----
struct gpu_model {
    struct cuda_ctx cx;
    struct cuda_state st;
    std::vector<struct dlayer> layers;
};

const float *up(const std::vector<float> &v) {
    return v.empty() ? nullptr : dev_upload(v);
}

void make_gpu(gpu_model &g, const hmodel &m, int max_ctx) {
    memset(&g.cx, 0, sizeof g.cx);
    g.cx.smem_optin = dev_smem_optin();
    g.cx.cfg = &m.c;
    g.cx.dm.embed = m.embed.d;
    g.cx.dm.lm_head = m.lm_head.d;
    g.cx.dm.final_norm = up(m.final_norm);
    for (const hlayer &L : m.L) {
        struct dlayer d;
        memset(&d, 0, sizeof d);
        d.kind = L.kind;
        d.input_norm = up(L.in_norm);
        d.post_norm = up(L.post_norm);
        if (L.kind == LAYER_DELTANET) {
            d.dn_qkv = L.dn_qkv.d, d.dn_z = L.dn_z.d, d.dn_b = L.dn_b.d, d.dn_a = L.dn_a.d;
            d.dn_out = L.dn_out.d;
            d.dn_conv = up(L.conv), d.dn_A_log = up(L.A_log), d.dn_dt_bias = up(L.dt_bias);
            d.dn_norm = up(L.dn_norm);
        } else {
            d.q_proj = L.q.d, d.k_proj = L.k.d, d.v_proj = L.v.d, d.o_proj = L.o.d;
            d.q_norm = up(L.q_norm), d.k_norm = up(L.k_norm);
        }
        d.router = L.router.d, d.exp_gate = L.eg.d, d.exp_up = L.eu.d, d.exp_down = L.ed.d;
        d.sh_gate = L.sg.d, d.sh_up = L.su.d, d.sh_down = L.sd.d, d.sh_gate_w = L.sgw.d;
        g.layers.push_back(d);
    }
    g.cx.dm.layers = g.layers.data();
    CK(cudaStreamCreate(&g.cx.stream));
    const struct model_config &c = m.c;
    g.st.max_ctx = max_ctx;
    g.st.n_attn = cfg_n_attn_layers(&c);
    g.st.n_dn = c.n_layers - g.st.n_attn;
    g.st.kv_int8 = false;
    g.st.kv_row = (size_t)c.n_kv_heads * c.head_dim * 2;
    g.st.k_cache = new unsigned char *[g.st.n_attn];
    g.st.v_cache = new unsigned char *[g.st.n_attn];
    g.st.conv = new float *[g.st.n_dn];
    g.st.ssm = new float *[g.st.n_dn];
    for (int i = 0; i < g.st.n_attn; i++) {
        g.st.k_cache[i] =
            (unsigned char *)dev_poison<uint16_t>((size_t)max_ctx * c.n_kv_heads * c.head_dim);
        g.st.v_cache[i] =
            (unsigned char *)dev_poison<uint16_t>((size_t)max_ctx * c.n_kv_heads * c.head_dim);
    }
    for (int i = 0; i < g.st.n_dn; i++) {
        g.st.conv[i] = dev_poison<float>((size_t)cfg_dn_conv_dim(&c) * (c.conv_kernel - 1));
        g.st.ssm[i] = dev_poison<float>((size_t)c.dn_v_heads * c.dn_k_dim * c.dn_v_dim);
    }
    g.st.logits = dev_poison<float>(c.vocab);
}

void reset_state(gpu_model &g, const struct model_config &c) {
    for (int i = 0; i < g.st.n_dn; i++) {
        CK(cudaMemset(g.st.conv[i], 0, sizeof(float) * cfg_dn_conv_dim(&c) * (c.conv_kernel - 1)));
        CK(cudaMemset(g.st.ssm[i], 0, sizeof(float) * c.dn_v_heads * c.dn_k_dim * c.dn_v_dim));
    }
}

// Runs the prompt in chunks of `chunk`, collecting every position's logits.
std::vector<float> gpu_forward(gpu_model &g, const hmodel &m, const std::vector<int> &tok,
                               int chunk, std::vector<float> *last) {
    reset_state(g, m.c);
    const int n = (int)tok.size(), V = m.c.vocab;
    std::vector<float> all((size_t)n * V), lastv(V);
    for (int p = 0; p < n; p += chunk) {
        int len = std::min(chunk, n - p);
        OK(cuda_prefill(&g.cx, &g.st, p, tok.data() + p, len, all.data() + (size_t)p * V, true,
                        ERR));
    }
    if (last) *last = dev_download(g.st.logits, V);
    return all;
}

double top1(const std::vector<float> &a, const std::vector<float> &ref, int V) {
    const int n = (int)(ref.size() / V);
    int agree = 0;
    for (int t = 0; t < n; t++) {
        const float *x = &a[(size_t)t * V], *y = &ref[(size_t)t * V];
        agree += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
    }
    return (double)agree / n;
}

void compare(const char *what, const std::vector<float> &a, const std::vector<float> &ref, int V,
             double tol, double top1_min = 0.98) {
    const double t1 = top1(a, ref, V);
    char buf[240];
    snprintf(buf, sizeof buf, "%s (top-1 %.1f%%, min %.1f%%)", what, 100 * t1, 100 * top1_min);
    report(buf, rel_l2(a.data(), ref.data(), a.size()), tol);
    if (t1 < top1_min) {
        printf("  top-1 agreement below the minimum: FAIL\n");
        g_fail = 1;
    }
}

// The random model is sensitive: bf16 rounding alone (the CPU pass with rounding emulated) moves
// its logits by ~2e-2 rel L2 vs f32, and a top-k router's near-ties flip experts. So the GPU is
// held to that noise floor: rel L2 vs f32 <= max(2e-2, 1.5 x floor) and top-1 >= min(98%, the
// emulated pass's top-1 less 2 points) where the function is continuous (dense MLP, MoE selecting
// every expert); the top-k model is checked for chunking consistency and its distance to the CPU is
// reported.
void run_model(int kind) {
    hmodel m = make_model(kind);
    const int n = 150, V = m.c.vocab;
    const char *name = kind == 0 ? "dense" : kind == 1 ? "MoE 4 of 4" : "MoE 4 of 16";
    std::vector<int> tok(n);
    for (auto &t : tok) t = (int)(rnd_u32() % V);
    g_emu = false;
    std::vector<float> ref = cpu_forward(m, tok);
    g_emu = true;
    std::vector<float> emu = cpu_forward(m, tok);
    const double floor = rel_l2(emu.data(), ref.data(), ref.size());
    gpu_model g;
    make_gpu(g, m, 256);
    const double tol_cpu = std::max(2e-2, 1.5 * floor);
    // top-1: as good as the bf16-emulated CPU pass, less 2 points (it is noise too)
    const double top1_cpu = std::min(0.98, top1(emu, ref, V) - 0.02);
    // Chunkings are the same arithmetic when the DeltaNet recurrence runs in the same form with the
    // same 64-token blocks (the scan always; the chunked form for chunks of 64): held to 2e-3.
    // Otherwise they differ by rounding, which this model amplifies like the bf16 floor: held to
    // the CPU tolerance, top-1 to twice the CPU allowance of flips (two evaluations, each at the
    // noise floor, disagree where either flips; 40 positions move in steps of 2.5%), and only
    // reported for the top-k model (its near-tied experts flip).
    auto consistent = [&](const char *what, const std::vector<float> &a,
                          const std::vector<float> &b, bool same) {
        if (same || kind < 2) {
            compare(what, a, b, V, same ? 2e-3 : tol_cpu, same ? 0.98 : 1 - 2 * (1 - top1_cpu));
            return;
        }
        printf("%s (info: different rounding) rel_l2 %.3e, top-1 %.1f%%\n", what,
               rel_l2(a.data(), b.data(), a.size()), 100 * top1(a, b, V));
    };
    const pf_dn_form forms[] = {PF_DN_SCAN_ONLY, PF_DN_CHUNKED_ONLY, PF_DN_BY_LENGTH};
    const char *const fname[] = {"scan", "chunked", "by length"};
    for (int f = 0; f < 3; f++) {
        cuda_prefill_dn_form(forms[f]);
        std::vector<float> last;
        std::vector<float> one = gpu_forward(g, m, tok, n, &last);
        char what[200];
        if (kind < 2) {
            snprintf(what, sizeof what,
                     "%s model, DeltaNet %s: one chunk of 150 vs CPU f32 (floor %.1e)", name,
                     fname[f], floor);
            compare(what, one, ref, V, tol_cpu, top1_cpu);
        } else {
            printf("%s model, DeltaNet %s (info): one chunk vs CPU f32 %.3e, vs CPU bf16-emulated "
                   "%.3e, floor %.3e\n",
                   name, fname[f], rel_l2(one.data(), ref.data(), one.size()),
                   rel_l2(one.data(), emu.data(), one.size()), floor);
        }
        snprintf(what, sizeof what, "%s model, DeltaNet %s: st->logits == last row of all logits",
                 name, fname[f]);
        report(what, rel_l2(last.data(), one.data() + (size_t)(n - 1) * V, V), 1e-6);
        std::vector<float> ch = gpu_forward(g, m, tok, 64, nullptr);
        snprintf(what, sizeof what, "%s model, DeltaNet %s: chunks of 64 vs one chunk", name,
                 fname[f]);
        consistent(what, ch, one, forms[f] != PF_DN_BY_LENGTH);
        // One-row chunks take the few-rows GEMM kernel, which uses the weights as dequantized
        // (the tiled kernels round them to bf16): the same arithmetic only without it.
        const std::vector<int> tok40(tok.begin(), tok.begin() + 40);
        const std::vector<float> one40(one.begin(), one.begin() + (size_t)40 * V);
        pf_gemm_small_force(1);
        std::vector<float> t1 = gpu_forward(g, m, tok40, 1, nullptr);
        pf_gemm_small_force(0);
        snprintf(what, sizeof what,
                 "%s model, DeltaNet %s: 40 chunks of 1 vs one chunk (first 40), tiled GEMMs", name,
                 fname[f]);
        consistent(what, t1, one40, forms[f] == PF_DN_SCAN_ONLY);
        t1 = gpu_forward(g, m, tok40, 1, nullptr);
        snprintf(what, sizeof what,
                 "%s model, DeltaNet %s: 40 chunks of 1 vs one chunk (first 40), few-rows GEMMs",
                 name, fname[f]);
        consistent(what, t1, one40, false);
    }
    cuda_prefill_dn_form(PF_DN_BY_LENGTH);
    cuda_prefill_free(&g.cx);
}

} // namespace

int main() {
    for (int kind = 0; kind < 3; kind++) run_model(kind);
    printf(g_fail ? "check_prefill_model: FAIL\n" : "check_prefill_model: all ok\n");
    return g_fail;
}
