// Gated DeltaNet step check: many consecutive steps against the host recurrence (state decay,
// delta rule, readout, gated RMSNorm), comparing the outputs at every step and the final state,
// for both kernel shapes: column slices (raw readout; the gated norm then runs in the out_proj
// GEMV's load, checked too) and a block per head with the gated norm fused (norm_w set), with and
// without the causal conv (conv_k taps: the kernel reads raw projections, checked against the
// host conv and its state shift; 0: the inputs are the conv outputs already).
#include "common_check.cuh"

static void t_dn(int kh, int vh, int dk, int dv, int steps, bool fused, int conv_k = 0) {
    const int qk = kh * dk, V = vh * dv, C = 2 * qk + V;
    std::vector<float> A_log = rnd_vec(vh, -1, 1), dtb = rnd_vec(vh, -1, 1),
                       nw = rnd_vec(dv, 0.5f, 1.5f);
    std::vector<float> S((size_t)vh * dk * dv, 0.f);
    float *dS = dev_copy(S), *dA = dev_copy(A_log), *ddt = dev_copy(dtb), *dnw = dev_copy(nw);
    float *dqkv, *dz, *db, *da, *dy = dev_poison(V);
    const int K = conv_k > 0 ? conv_k : 1;
    std::vector<float> cw = rnd_vec((size_t)C * K, -0.6f, 0.6f),
                       cst = rnd_vec((size_t)C * (K - 1) + 1, -1, 1);
    float *dcw = dev_copy(cw), *dcst = dev_copy(cst);
    unsigned *dtick;
    CK(cudaMalloc(&dtick, kh * 4));
    CK(cudaMemset(dtick, 0, kh * 4));
    CK(cudaMalloc(&dqkv, C * 4));
    CK(cudaMalloc(&dz, V * 4));
    CK(cudaMalloc(&db, vh * 4));
    CK(cudaMalloc(&da, vh * 4));
    double worst = 0;
    bool ok = true;
    std::vector<float> y(V), oraw(V);
    for (int t = 0; t < steps; t++) {
        std::vector<float> qkv = rnd_vec(C, -1, 1), z = rnd_vec(V, -2, 2), b = rnd_vec(vh, -3, 3),
                           a = rnd_vec(vh, -3, 3);
        CK(cudaMemcpy(dqkv, qkv.data(), C * 4, cudaMemcpyHostToDevice));
        if (conv_k > 0) // the host conv over the raw inputs just copied, as the kernel runs it
            for (int c = 0; c < C; c++) {
                float *st = &cst[(size_t)c * (K - 1)];
                const float y = qkv[c];
                float o = cw[(size_t)c * K + K - 1] * y;
                for (int i = 0; i < K - 1; i++) o += cw[(size_t)c * K + i] * st[i];
                for (int i = 0; i + 1 < K - 1; i++) st[i] = st[i + 1];
                if (K > 1) st[K - 2] = y;
                qkv[c] = o / (1 + expf(-o));
            }
        CK(cudaMemcpy(dz, z.data(), V * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(db, b.data(), vh * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(da, a.data(), vh * 4, cudaMemcpyHostToDevice));
        struct deltanet_params p;
        p.qkv = dqkv, p.z = dz, p.b = db, p.a = da, p.S = dS, p.A_log = dA, p.dt_bias = ddt,
        p.y = dy;
        p.k_heads = kh, p.v_heads = vh, p.dk = dk, p.dv = dv, p.eps = 1e-6f;
        p.norm_w = fused ? dnw : nullptr;
        p.conv_w = nullptr, p.conv_state = nullptr, p.conv_tick = nullptr, p.conv_k = 0;
        if (conv_k > 0) p.conv_w = dcw, p.conv_state = dcst, p.conv_tick = dtick, p.conv_k = conv_k;
        if (t == 0 && fused)
            check_true("deltanet block-per-head kernel offered", deltanet_head_ok(&p));
        if (t == 0 && conv_k > 0)
            check_true("deltanet conv in the per-head kernel offered",
                       deltanet_conv_ok(&p, conv_k));
        WK(deltanet_launch(&p, 0, &err_));
        for (int h = 0; h < vh; h++) {
            int hk = h / (vh / kh);
            std::vector<double> q(dk), k(dk);
            double sq = 0, sk = 0;
            for (int i = 0; i < dk; i++) {
                q[i] = qkv[hk * dk + i], k[i] = qkv[qk + hk * dk + i];
                sq += q[i] * q[i], sk += k[i] * k[i];
            }
            for (int i = 0; i < dk; i++)
                q[i] *= 1 / sqrt(sq + 1e-6) / sqrt((double)dk), k[i] *= 1 / sqrt(sk + 1e-6);
            double beta = 1 / (1 + exp(-b[h])), ax = a[h] + dtb[h];
            double g = exp(-exp(A_log[h]) * (ax > 20 ? ax : log1p(exp(ax))));
            float *Sh = &S[(size_t)h * dk * dv];
            std::vector<double> kv(dv, 0), o(dv, 0);
            for (int i = 0; i < dk; i++)
                for (int j = 0; j < dv; j++)
                    Sh[i * dv + j] = (float)(Sh[i * dv + j] * g), kv[j] += Sh[i * dv + j] * k[i];
            for (int j = 0; j < dv; j++) kv[j] = beta * (qkv[2 * qk + h * dv + j] - kv[j]);
            for (int i = 0; i < dk; i++)
                for (int j = 0; j < dv; j++)
                    Sh[i * dv + j] = (float)(Sh[i * dv + j] + k[i] * kv[j]),
                                o[j] += Sh[i * dv + j] * q[i];
            double ss = 0;
            for (int j = 0; j < dv; j++) ss += o[j] * o[j], oraw[h * dv + j] = (float)o[j];
            double r = 1 / sqrt(ss / dv + 1e-6);
            for (int j = 0; j < dv; j++) {
                double zz = z[h * dv + j];
                y[h * dv + j] = (float)(o[j] * r * nw[j] * zz / (1 + exp(-zz)));
            }
        }
        std::vector<float> gy = host_copy(dy, V);
        const std::vector<float> &want = fused ? y : oraw;
        for (int i = 0; i < V; i++) {
            double d = fabs(gy[i] - want[i]);
            if (!(d <= 2e-3 + 2e-3 * fabs(want[i]))) ok = false;
            worst = d > worst ? d : worst;
        }
    }
    // the gated RMSNorm * silu(z) runs in the out_proj GEMV's input load: check it on the last
    // step, with the f32-activation kernel (bf16) and the int8 one (4-bit)
    for (int bits : {16, 4}) {
        if (fused || (bits == 4 && V % 64)) continue; // one whole group per 64 inputs
        const int rows = 77;
        struct tmat W = make_mat(1, rows, V, bits, 64);
        float *out = dev_poison(rows);
        struct gemv_params gp;
        memset(&gp, 0, sizeof gp);
        gp.x = dy, gp.cols = V, gp.gn_w = dnw, gp.gn_z = dz, gp.gn_dv = dv, gp.eps = 1e-6f;
        gp.seg[0].a = W.d, gp.seg[0].rows = rows, gp.seg[0].epi = EPI_STORE, gp.seg[0].out = out;
        gp.nseg = 1;
        WK(gemv_launch(&gp, 0, &err_));
        std::vector<float> want(rows), qe = qx_err(y.data(), V);
        std::vector<double> bound(rows);
        for (int r = 0; r < rows; r++)
            want[r] = ref_dot(W, 0, r, y.data()), bound[r] = qx_bound(W, 0, r, qe.data());
        char nm[128];
        snprintf(nm, sizeof nm, "gated rmsnorm*silu(z) fused in out_proj load, d_v %d, b%d", dv,
                 bits);
        check_close_b(nm, host_copy(out, rows).data(), want.data(), bound, 2e-3f, 5e-3f);
    }
    char name[128];
    snprintf(name, sizeof name,
             "deltanet %s%s %d steps %dk/%dv heads d%dx%d outputs (max err %.2g)",
             fused ? "per head + gated norm," : "slices,", conv_k > 0 ? " + conv" : "", steps, kh,
             vh, dk, dv, worst);
    check_true(name, ok);
    if (conv_k > 0) {
        snprintf(name, sizeof name, "deltanet conv state after %d steps, %d taps, %dk/%dv heads",
                 steps, conv_k, kh, vh);
        check_close(name, host_copy(dcst, (size_t)C * (K - 1)).data(), cst.data(),
                    (size_t)C * (K - 1), 1e-6f, 0.f);
        std::vector<unsigned> tick(kh);
        CK(cudaMemcpy(tick.data(), dtick, kh * 4, cudaMemcpyDeviceToHost));
        bool zero = true;
        for (int i = 0; i < kh; i++) zero = zero && tick[i] == 0;
        check_true("deltanet conv tickets back at 0 after every step", zero);
    }
    snprintf(name, sizeof name, "deltanet final state d%dx%d%s", dk, dv,
             fused ? " (per head)" : "");
    check_close(name, host_copy(dS, S.size()).data(), S.data(), S.size(), 1e-3f, 1e-3f);
}

int main(void) {
    init_device();
    for (bool fused : {false, true}) {
        t_dn(16, 32, 128, 128, 64, fused);
        t_dn(2, 4, 64, 64, 100, fused);
        t_dn(1, 3, 32, 24, 50, fused);
        t_dn(4, 4, 16, 128, 30, fused);
        t_dn(1, 2, 128, 40, 20, fused); // d_k 128 (thread pairs) with a partly idle last warp
        t_dn(1, 2, 64, 256, 20, fused); // 256 threads, one per column
    }
    // the causal conv in the per-head kernel (d_k 128: 2 d_k + d_v channels within 4 d_v threads)
    t_dn(16, 32, 128, 128, 40, true, 4);
    t_dn(1, 3, 128, 96, 30, true, 3);  // three value heads take tickets on one key head
    t_dn(2, 2, 128, 128, 10, true, 1); // no state
    check_true("deltanet conv not offered where the channels outnumber the threads", [] {
        struct deltanet_params p;
        memset(&p, 0, sizeof p);
        p.k_heads = 2, p.v_heads = 4, p.dk = 64, p.dv = 64;
        return !deltanet_conv_ok(&p, 4) && deltanet_head_ok(&p);
    }());
    return finish("check_decode_deltanet");
}
