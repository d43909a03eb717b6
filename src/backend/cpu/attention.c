// Gated full attention: q_proj gives [query | gate] per head; q, k RMS-normalised per head; RoPE
// on the first rope_dim dims (rotate-half pairs i, i + rope_dim/2); causal softmax attention with
// each KV head shared by n_heads/n_kv_heads consecutive query heads; out = o_proj(attn *
// sigmoid(gate)).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/kv_int8.h"
#include "util/util.h"

static void rope(float *x, int pos, int rope_dim, float theta) {
    int half = rope_dim / 2;
    for (int i = 0; i < half; i++) {
        // inv_freq and the angle in f32, as the reference computes them.
        float inv_freq = (float)(1.0 / pow((double)theta, (double)(2 * i) / rope_dim));
        float ang = (float)pos * inv_freq;
        float cs = (float)cos((double)ang), sn = (float)sin((double)ang);
        float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * cs - x2 * sn;
        x[i + half] = x2 * cs + x1 * sn;
    }
}

struct attn_job {
    const struct model_config *c;
    int pos, T;
    const float *q;       // [T][n_heads][head_dim] (normalised, rotated)
    const float *kc, *vc; // caches [ctx][n_kv * head_dim]
    float *out;           // [T][n_heads * head_dim]
};

static void attend(void *ctx, int i0, int i1) {
    const struct attn_job *J = ctx;
    const struct model_config *c = J->c;
    int hd = c->head_dim, kvd = c->n_kv_heads * hd, group = c->n_heads / c->n_kv_heads;
    float scale = 1.0f / sqrtf((float)hd);
    float *score = xmalloc(sizeof(float) * (size_t)(J->pos + J->T));
    for (int i = i0; i < i1; i++) {
        int t = i / c->n_heads, h = i % c->n_heads, kvh = h / group, n = J->pos + t + 1;
        const float *q = J->q + ((size_t)t * c->n_heads + h) * hd;
        float mx = -INFINITY;
        for (int j = 0; j < n; j++) {
            score[j] = dot_f32(q, J->kc + (size_t)j * kvd + (size_t)kvh * hd, hd) * scale;
            if (score[j] > mx) mx = score[j];
        }
        float sum = 0;
        for (int j = 0; j < n; j++) sum += (score[j] = expf(score[j] - mx));
        float *o = J->out + ((size_t)t * c->n_heads + h) * hd;
        memset(o, 0, sizeof(float) * (size_t)hd);
        for (int j = 0; j < n; j++) {
            const float *v = J->vc + (size_t)j * kvd + (size_t)kvh * hd;
            float p = score[j] / sum;
            for (int d = 0; d < hd; d++) o[d] += p * v[d];
        }
    }
    free(score);
}

int cpu_attention(struct cpu_backend *cb, struct cpu_state *st, int li, float *x, const float *xn,
                  int pos, int T, struct wren_err *e) {
    (void)e;
    const struct model_config *c = &cb->base.model->cfg;
    const struct layer *L = &cb->base.model->layers[li];
    int hd = c->head_dim, nh = c->n_heads, kvd = c->n_kv_heads * hd;
    int qw = nh * hd * (c->attn_output_gate ? 2 : 1);
    float *qg = xmalloc(sizeof(float) * (size_t)T * qw);
    float *q = xmalloc(sizeof(float) * (size_t)T * nh * hd);
    float *k = xmalloc(sizeof(float) * (size_t)T * kvd),
          *v = xmalloc(sizeof(float) * (size_t)T * kvd);
    float *att = xmalloc(sizeof(float) * (size_t)T * nh * hd);
    float *out = xmalloc(sizeof(float) * (size_t)T * c->hidden);
    cpu_matmul(cb->tp, &L->q_proj, 0, xn, T, qg, qw);
    cpu_matmul(cb->tp, &L->k_proj, 0, xn, T, k, kvd);
    cpu_matmul(cb->tp, &L->v_proj, 0, xn, T, v, kvd);

    float *kc = st->k[cb->slot[li]], *vc = st->v[cb->slot[li]];
    for (int t = 0; t < T; t++) {
        int stride = c->attn_output_gate ? 2 * hd : hd;
        for (int h = 0; h < nh; h++) {
            float *qh = q + ((size_t)t * nh + h) * hd;
            rmsnorm(qh, qg + (size_t)t * qw + (size_t)h * stride, L->q_norm, hd, c->rms_eps);
            rope(qh, pos + t, c->rope_dim, c->rope_theta);
        }
        for (int h = 0; h < c->n_kv_heads; h++) {
            float *kh = kc + (size_t)(pos + t) * kvd + (size_t)h * hd;
            rmsnorm(kh, k + (size_t)t * kvd + (size_t)h * hd, L->k_norm, hd, c->rms_eps);
            rope(kh, pos + t, c->rope_dim, c->rope_theta);
            if (cb->kv_int8) kv_int8_round_trip(kh, hd);
        }
        float *vr = vc + (size_t)(pos + t) * kvd;
        memcpy(vr, v + (size_t)t * kvd, sizeof(float) * (size_t)kvd);
        for (int h = 0; cb->kv_int8 && h < c->n_kv_heads; h++) kv_int8_round_trip(vr + h * hd, hd);
    }
    struct attn_job J = {.c = c, .pos = pos, .T = T, .q = q, .kc = kc, .vc = vc, .out = att};
    parallel_for(cb->tp, T * nh, 1, attend, &J);
    if (c->attn_output_gate)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < nh; h++) {
                const float *gate = qg + (size_t)t * qw + (size_t)h * 2 * hd + hd;
                float *o = att + ((size_t)t * nh + h) * hd;
                for (int d = 0; d < hd; d++) o[d] *= sigmoidf(gate[d]);
            }
    cpu_matmul(cb->tp, &L->o_proj, 0, att, T, out, c->hidden);
    for (size_t i = 0; i < (size_t)T * c->hidden; i++) x[i] += out[i];
    free(qg), free(q), free(k), free(v), free(att), free(out);
    return 0;
}
