// Mixture of experts: p = softmax(router(x)) in f32, top-k experts renormalised, each expert a
// SwiGLU MLP, plus the shared expert scaled by sigmoid(shared_expert_gate(x)). Rows are grouped by
// expert so each expert's weights are read once per call. A dense model (no experts) is the shared
// MLP without the gate.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "util/util.h"

// SwiGLU MLP on n rows: out[n][hidden] = down(silu(gate(x)) * up(x)) with matrix index i.
static void swiglu(struct cpu_backend *cb, const struct qmat *gate, const struct qmat *up,
                   const struct qmat *down, int i, const float *x, int n, float *out) {
    int I = gate->rows;
    float *g = xmalloc(sizeof(float) * (size_t)n * I), *u = xmalloc(sizeof(float) * (size_t)n * I);
    cpu_matmul(cb->tp, gate, i, x, n, g, I);
    cpu_matmul(cb->tp, up, i, x, n, u, I);
    for (size_t j = 0; j < (size_t)n * I; j++) g[j] = silu(g[j]) * u[j];
    cpu_matmul(cb->tp, down, i, g, n, out, down->rows);
    free(g), free(u);
}

void cpu_moe(struct cpu_backend *cb, int li, float *x, const float *xn, int T) {
    const struct model_config *c = &cb->base.model->cfg;
    const struct layer *L = &cb->base.model->layers[li];
    int H = c->hidden, E = c->n_experts, K = c->top_k;
    float *out = xcalloc((size_t)T * H, sizeof(float));
    float *tmp = xmalloc(sizeof(float) * (size_t)T * H);

    if (E > 0) {
        float *p = xmalloc(sizeof(float) * (size_t)T * E);
        int *sel = xmalloc(sizeof(int) * (size_t)T * K);
        float *wsel = xmalloc(sizeof(float) * (size_t)T * K);
        cpu_matmul(cb->tp, &L->router, 0, xn, T, p, E);
        for (int t = 0; t < T; t++) {
            float *pt = p + (size_t)t * E, mx = -INFINITY, sum = 0;
            for (int j = 0; j < E; j++) mx = fmaxf(mx, pt[j]);
            for (int j = 0; j < E; j++) sum += (pt[j] = expf(pt[j] - mx));
            for (int j = 0; j < E; j++) pt[j] /= sum;
            float wsum = 0;
            for (int k = 0; k < K; k++) { // selection by descending probability, lowest id on ties
                int best = -1;
                for (int j = 0; j < E; j++) {
                    bool taken = false;
                    for (int m = 0; m < k; m++) taken |= sel[t * K + m] == j;
                    if (!taken && (best < 0 || pt[j] > pt[best])) best = j;
                }
                sel[t * K + k] = best;
                wsum += (wsel[t * K + k] = pt[best]);
            }
            if (c->norm_topk)
                for (int k = 0; k < K; k++) wsel[t * K + k] /= wsum;
        }
        // Group rows by expert.
        int *rows = xmalloc(sizeof(int) * (size_t)T * K);
        float *xe = xmalloc(sizeof(float) * (size_t)T * H);
        for (int ex = 0; ex < E; ex++) {
            int n = 0;
            for (int t = 0; t < T * K; t++)
                if (sel[t] == ex) rows[n++] = t;
            if (!n) continue;
            for (int r = 0; r < n; r++)
                memcpy(xe + (size_t)r * H, xn + (size_t)(rows[r] / K) * H,
                       sizeof(float) * (size_t)H);
            swiglu(cb, &L->exp_gate, &L->exp_up, &L->exp_down, ex, xe, n, tmp);
            for (int r = 0; r < n; r++) {
                float w = wsel[rows[r]];
                float *o = out + (size_t)(rows[r] / K) * H;
                for (int j = 0; j < H; j++) o[j] += w * tmp[(size_t)r * H + j];
            }
        }
        free(p), free(sel), free(wsel), free(rows), free(xe);
    }
    if (L->sh_gate.data) {
        swiglu(cb, &L->sh_gate, &L->sh_up, &L->sh_down, 0, xn, T, tmp);
        float *gate = NULL;
        if (L->sh_gate_w.data) {
            gate = xmalloc(sizeof(float) * (size_t)T);
            cpu_matmul(cb->tp, &L->sh_gate_w, 0, xn, T, gate, 1);
        }
        for (int t = 0; t < T; t++) {
            float gs = gate ? sigmoidf(gate[t]) : 1.0f;
            for (int j = 0; j < H; j++) out[(size_t)t * H + j] += gs * tmp[(size_t)t * H + j];
        }
        free(gate);
    }
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] += out[i];
    free(out), free(tmp);
}
