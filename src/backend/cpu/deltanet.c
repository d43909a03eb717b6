// Gated DeltaNet layer (linear_attention), f32, token by token through the recurrence:
//   qkv = silu(causal_conv1d(in_proj_qkv(x))); q, k l2-normalised (q scaled by 1/sqrt(d_k))
//   beta = sigmoid(b), g = exp(-exp(A_log) * softplus(a + dt_bias))
//   S = g S;  S += k (beta (v - S^T k))^T;  o = S^T q;  y = rmsnorm(o) * silu(z);  x += out_proj(y)
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "util/util.h"

struct dn_job {
    const struct model_config *c;
    const struct layer *L;
    int T;
    float *qkv;            // [T][conv_dim]: projections in, conv+silu out (q | k | v)
    float *conv_state;     // [conv_dim][K-1]
    float *ssm;            // [v_heads][d_k][d_v]
    const float *z;        // [T][v_dim]
    const float *beta, *g; // [T][v_heads]
    float *y;              // [T][v_dim]
};

static void conv_channels(void *ctx, int c0, int c1) {
    const struct dn_job *J = ctx;
    int K = J->c->conv_kernel, C = cfg_dn_conv_dim(J->c);
    for (int ch = c0; ch < c1; ch++) {
        const float *w = J->L->dn_conv + (size_t)ch * K;
        float *hist = J->conv_state + (size_t)ch * (K - 1); // oldest first
        for (int t = 0; t < J->T; t++) {
            float in = J->qkv[(size_t)t * C + ch], acc = w[K - 1] * in;
            for (int k = 0; k < K - 1; k++) acc += w[k] * hist[k];
            for (int k = 0; k + 1 < K - 1; k++) hist[k] = hist[k + 1];
            if (K > 1) hist[K - 2] = in;
            J->qkv[(size_t)t * C + ch] = silu(acc);
        }
    }
}

static void l2norm(float *x, int n, float scale) {
    float ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = scale / sqrtf(ss + 1e-6f);
    for (int i = 0; i < n; i++) x[i] *= r;
}

static void recur_heads(void *ctx, int h0, int h1) {
    const struct dn_job *J = ctx;
    const struct model_config *c = J->c;
    int dk = c->dn_k_dim, dv = c->dn_v_dim, C = cfg_dn_conv_dim(c), qk = cfg_dn_qk_dim(c);
    int ratio = c->dn_v_heads / c->dn_k_heads;
    float kv[dv], delta[dv], o[dv];
    for (int h = h0; h < h1; h++) {
        float *S = J->ssm + (size_t)h * dk * dv;
        int kh = h / ratio;
        for (int t = 0; t < J->T; t++) {
            const float *row = J->qkv + (size_t)t * C;
            const float *q = row + kh * dk, *k = row + qk + kh * dk, *v = row + 2 * qk + h * dv;
            float g = J->g[t * c->dn_v_heads + h], beta = J->beta[t * c->dn_v_heads + h];
            memset(kv, 0, sizeof kv);
            for (int i = 0; i < dk; i++) {
                float *Si = S + (size_t)i * dv;
                for (int j = 0; j < dv; j++) {
                    Si[j] *= g;
                    kv[j] += Si[j] * k[i];
                }
            }
            for (int j = 0; j < dv; j++) delta[j] = beta * (v[j] - kv[j]);
            memset(o, 0, sizeof o);
            for (int i = 0; i < dk; i++) {
                float *Si = S + (size_t)i * dv;
                for (int j = 0; j < dv; j++) {
                    Si[j] += k[i] * delta[j];
                    o[j] += Si[j] * q[i];
                }
            }
            // gated RMSNorm of this head's output
            float *y = J->y + (size_t)t * cfg_dn_v_dim(c) + (size_t)h * dv;
            const float *z = J->z + (size_t)t * cfg_dn_v_dim(c) + (size_t)h * dv;
            rmsnorm(y, o, J->L->dn_norm, dv, c->rms_eps);
            for (int j = 0; j < dv; j++) y[j] *= silu(z[j]);
        }
    }
}

int cpu_deltanet(struct cpu_backend *cb, struct cpu_state *st, int li, float *x, const float *xn,
                 int T, struct wren_err *e) {
    (void)e;
    const struct model_config *c = &cb->base.model->cfg;
    const struct layer *L = &cb->base.model->layers[li];
    int C = cfg_dn_conv_dim(c), V = cfg_dn_v_dim(c), H = c->dn_v_heads, qk = cfg_dn_qk_dim(c);
    float *qkv = xmalloc(sizeof(float) * (size_t)T * C);
    float *z = xmalloc(sizeof(float) * (size_t)T * V);
    float *b = xmalloc(sizeof(float) * (size_t)T * H), *a = xmalloc(sizeof(float) * (size_t)T * H);
    float *y = xmalloc(sizeof(float) * (size_t)T * V);
    float *out = xmalloc(sizeof(float) * (size_t)T * c->hidden);

    cpu_matmul(cb->tp, &L->dn_qkv, 0, xn, T, qkv, C);
    cpu_matmul(cb->tp, &L->dn_z, 0, xn, T, z, V);
    cpu_matmul(cb->tp, &L->dn_b, 0, xn, T, b, H);
    cpu_matmul(cb->tp, &L->dn_a, 0, xn, T, a, H);

    struct dn_job J = {.c = c,
                       .L = L,
                       .T = T,
                       .qkv = qkv,
                       .conv_state = st->conv[cb->slot[li]],
                       .ssm = st->ssm[cb->slot[li]],
                       .z = z,
                       .beta = b,
                       .g = a,
                       .y = y};
    parallel_for(cb->tp, C, 64, conv_channels, &J);

    float qscale = 1.0f / sqrtf((float)c->dn_k_dim);
    for (int t = 0; t < T; t++) {
        float *row = qkv + (size_t)t * C;
        for (int h = 0; h < c->dn_k_heads; h++) {
            l2norm(row + h * c->dn_k_dim, c->dn_k_dim, qscale);
            l2norm(row + qk + h * c->dn_k_dim, c->dn_k_dim, 1.0f);
        }
        for (int h = 0; h < H; h++) { // in place: b -> beta, a -> decay g
            float av = a[t * H + h] + L->dn_dt_bias[h];
            float sp = av > 20.0f ? av : log1pf(expf(av));
            a[t * H + h] = expf(-expf(L->dn_A_log[h]) * sp);
            b[t * H + h] = sigmoidf(b[t * H + h]);
        }
    }
    parallel_for(cb->tp, H, 1, recur_heads, &J);

    cpu_matmul(cb->tp, &L->dn_out, 0, y, T, out, c->hidden);
    for (size_t i = 0; i < (size_t)T * c->hidden; i++) x[i] += out[i];
    free(qkv), free(z), free(b), free(a), free(y), free(out);
    return 0;
}
