// Internals of the CPU reference backend: f32 activations and accumulation, weights used in place
// (quantized ones dequantized inside the dot products), threads over output rows / heads.
#pragma once
#include "backend/backend.h"
#include "backend/cpu/threadpool.h"

struct cpu_backend {
    struct backend base;
    struct threadpool *tp;
    int *slot;    // [n_layers]: index among layers of the same kind (KV cache / DeltaNet state)
    bool kv_int8; // cached K/V rows rounded through int8 (backend/kv_int8.h), stored as f32
};

struct cpu_state {
    int max_ctx;
    int kv_cap;     // positions allocated in each KV cache (grows up to max_ctx)
    float **k, **v; // [n_attn][kv_cap][n_kv_heads * head_dim]
    float **conv;   // [n_dn][conv_dim][kernel - 1], oldest input first
    float **ssm;    // [n_dn][v_heads][d_k][d_v]
    float *logits;  // [vocab] of the last position forwarded
};

// y[t][r] = sum_c x[t][c] * W_i[r][c] for t < T and rows r of matrix i of w; x is [T][w->cols]
// contiguous, y has row stride ldy.
void cpu_matmul(struct threadpool *tp, const struct qmat *w, int i, const float *x, int T, float *y,
                int ldy);
// Same for a subset of rows [r0, r1) only (lm_head of selected positions uses all rows).
void rmsnorm(float *out, const float *x, const float *w, int n, float eps);
float dot_f32(const float *a, const float *b, int n);
static inline float silu(float x) {
    return x / (1.0f + __builtin_expf(-x));
}
static inline float sigmoidf(float x) {
    return 1.0f / (1.0f + __builtin_expf(-x));
}

// One layer's mixer / MLP over T rows at positions [pos, pos + T); x is the residual [T][hidden],
// updated in place.
int cpu_deltanet(struct cpu_backend *cb, struct cpu_state *st, int li, float *x, const float *xn,
                 int T, struct wren_err *e);
int cpu_attention(struct cpu_backend *cb, struct cpu_state *st, int li, float *x, const float *xn,
                  int pos, int T, struct wren_err *e);
void cpu_moe(struct cpu_backend *cb, int li, float *x, const float *xn, int T);
