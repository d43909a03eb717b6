// Shared contract of the CUDA backend's files: the model's weights and a sequence's state as they
// live in device memory. Plain C structs of device pointers (included from .cu files only).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

extern "C" {
#include "backend/backend.h"
}

// A weight matrix (or a stack of n expert matrices) on the device, same layout as struct qmat:
// quantized rows are uint32 words (MLX affine, lowest bits first) + bf16 scales/biases per group;
// strides in bytes. Stacks are contiguous: matrix i starts at data + i*mat_stride.
struct dmat {
    enum wtype type;
    int n, rows, cols;
    int bits, group;
    const uint8_t *data;
    size_t row_stride, mat_stride;
    const uint8_t *scales, *biases;
    size_t sb_row_stride, sb_mat_stride;
};

struct dlayer {
    enum layer_kind kind;
    const float *input_norm, *post_norm;
    // DeltaNet
    struct dmat dn_qkv, dn_z, dn_b, dn_a, dn_out;
    const float *dn_conv, *dn_A_log, *dn_dt_bias, *dn_norm;
    // attention
    struct dmat q_proj, k_proj, v_proj, o_proj;
    const float *q_norm, *k_norm;
    // MoE
    struct dmat router, exp_gate, exp_up, exp_down, sh_gate, sh_up, sh_down, sh_gate_w;
};

struct dmodel {
    struct dmat embed, lm_head;
    const float *final_norm;
    struct dlayer *layers; // host array of n_layers, pointing into device memory
};

// Per-sequence state. Attention layer j (j-th full-attention layer) keeps K and V as bf16
// [max_ctx][n_kv_heads][head_dim] (or int8 rows, kv_int8.cuh); DeltaNet layer j keeps conv state
// f32 [conv_dim][kernel-1] (oldest first) and the recurrent state S f32 [v_heads][d_k][d_v].
struct cuda_state {
    int max_ctx;
    int n_attn, n_dn;
    unsigned char **k_cache, **v_cache; // [n_attn] device pointers, rows of kv_row bytes
    bool kv_int8;                       // rows of int8 codes + scales (kv_int8.cuh), else bf16
    size_t kv_row;                      // bytes per cache row (one token, every KV head)
    float **conv, **ssm;                // [n_dn] device pointers
    float *logits;                      // [vocab] logits of the last position forwarded
};

// The backend's device-side context, shared by the decode and prefill files.
struct cuda_ctx {
    const struct model *model; // host model (config, host weight views)
    const struct model_config *cfg;
    struct dmodel dm;
    cudaStream_t stream;
    int device, sm_count, cc_major, cc_minor;
    size_t l2_bytes, smem_optin;
    struct prefill_ws *prefill; // prefill workspace (prefill.cu): NULL until the first prefill
};

// Prefill of n > 1 tokens at positions [pos, pos + n) (src/backend/cuda/prefill*.cu), same contract
// as backend_ops.forward: leaves the last logits in st->logits and copies to `logits` if non-NULL.
int cuda_prefill(struct cuda_ctx *cx, struct cuda_state *st, int pos, const int32_t *tokens, int n,
                 float *logits, bool all_logits, struct wren_err *e);
// Releases cx->prefill (call before destroying the context).
void cuda_prefill_free(struct cuda_ctx *cx);

// Time of the prefill by kernel kind, for benchmarks: once on, each cuda_prefill records events
// between its phases (and syncs at its end); kind_ms (if non-NULL) receives the sums so far, in
// milliseconds, which are then reset.
enum pf_kind {
    PF_GEMM,
    PF_ROUTE,
    PF_EXPERTS,
    PF_DN,
    PF_DN_SCAN,
    PF_ATTN,
    PF_LOGITS,
    PF_OTHER,
    PF_KINDS
};
extern const char *const pf_kind_name[PF_KINDS];
int cuda_prefill_profile(struct cuda_ctx *cx, bool on, double kind_ms[PF_KINDS],
                         struct wren_err *e);
// Which form of the DeltaNet recurrence the prefill uses (tests, comparisons): by chunk length
// (default), or always one form. WREN_CUDA_DN=scan|chunked sets it before the first prefill.
enum pf_dn_form { PF_DN_BY_LENGTH, PF_DN_SCAN_ONLY, PF_DN_CHUNKED_ONLY };
void cuda_prefill_dn_form(enum pf_dn_form form);

// One decode step for token `tok` at position `pos` (src/backend/cuda/cuda_backend.cu): enqueued on
// cx->stream (a replayed CUDA graph), not synchronized; leaves the logits in st->logits.
int cuda_decode_token(struct cuda_ctx *cx, struct cuda_state *st, int pos, int32_t tok,
                      struct wren_err *e);
