// The model as bound at load: every tensor of the checkpoint is a named field here, its dtype and
// shape checked against the config. Backends read these views (host memory, usually mmap'd) and
// upload or use them directly; nothing looks tensors up by name after load.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

enum wtype { WT_BF16, WT_F32, WT_Q4, WT_Q8 };

// A weight matrix [rows = out][cols = in], or a stack of `n` of them (experts), in one of:
//  - WT_BF16 / WT_F32: row r of matrix i starts at data + i*mat_stride + r*row_stride (bytes);
//  - WT_Q4 / WT_Q8 (MLX affine): row packed as uint32 words, element j in bits
//    [bits*(j % (32/bits)), ...) of word j/(32/bits); w = scale*q + bias per `group` inputs;
//    scales/biases bf16, row r of matrix i at scales + i*sb_mat_stride + r*sb_row_stride (bytes).
// Views may alias one checkpoint tensor (HF gate_up_proj is split into gate and up views).
struct qmat {
    enum wtype type;
    int n, rows, cols;
    int bits, group; // quantized only
    const uint8_t *data;
    size_t row_stride, mat_stride;
    const uint8_t *scales, *biases;
    size_t sb_row_stride, sb_mat_stride;
};

// Small tensors (norms, conv, A_log, dt_bias) are converted to f32 at load and owned here.
struct layer {
    enum layer_kind kind;
    float *input_norm; // [hidden], effective weight (1 + w for HF)
    float *post_norm;  // [hidden]

    // gated DeltaNet (kind == LAYER_DELTANET)
    struct qmat dn_qkv; // [2*qk + v, hidden]
    struct qmat dn_z;   // [v, hidden]
    struct qmat dn_b;   // [v_heads, hidden]
    struct qmat dn_a;   // [v_heads, hidden]
    struct qmat dn_out; // [hidden, v]
    float *dn_conv;     // [conv_dim][conv_kernel]
    float *dn_A_log;    // [v_heads]
    float *dn_dt_bias;  // [v_heads]
    float *dn_norm;     // [v_dim] plain weight (gated RMSNorm per head)

    // gated attention (kind == LAYER_ATTENTION)
    struct qmat q_proj; // [n_heads * head_dim * (gate ? 2 : 1), hidden]
    struct qmat k_proj; // [n_kv_heads * head_dim, hidden]
    struct qmat v_proj; // [n_kv_heads * head_dim, hidden]
    struct qmat o_proj; // [hidden, n_heads * head_dim]
    float *q_norm;      // [head_dim], effective
    float *k_norm;      // [head_dim], effective

    // MoE (n_experts > 0) or dense MLP (n_experts == 0: only the shared_* fields, no gate)
    struct qmat router;    // [n_experts, hidden]
    struct qmat exp_gate;  // n_experts x [expert_inter, hidden]
    struct qmat exp_up;    // n_experts x [expert_inter, hidden]
    struct qmat exp_down;  // n_experts x [hidden, expert_inter]
    struct qmat sh_gate;   // [shared_inter, hidden]
    struct qmat sh_up;     // [shared_inter, hidden]
    struct qmat sh_down;   // [hidden, shared_inter]
    struct qmat sh_gate_w; // [1, hidden] shared_expert_gate (absent: type BF16 with rows 0)
};

struct st_file; // safetensors mapping

struct model {
    struct model_config cfg;
    struct qmat embed;    // [vocab, hidden]
    struct qmat lm_head;  // [vocab, hidden] (aliases embed when tied)
    float *final_norm;    // [hidden], effective
    struct layer *layers; // [n_layers]

    char *dir;
    int n_files;
    struct st_file **files; // kept mapped for the model's lifetime
    size_t weight_bytes;    // bytes of all bound matrices (what a backend would upload)
    size_t active_bytes;  // matrix bytes one token reads (top-k of the experts, one embedding row)
    double active_params; // weights one token multiplies by (for FLOP counts)
};

// Loads config.json and every safetensors shard of `dir`, binds and checks every tensor.
int model_load(struct model *m, const char *dir, struct wren_err *e);
void model_free(struct model *m);

// Dequantizes row r of matrix i of w into out[cols] (f32). Used by embedding lookups and tests.
void qmat_row_f32(const struct qmat *w, int i, int r, float *out);
// Bytes of one matrix (weights + scales + biases), for bandwidth accounting.
size_t qmat_bytes(const struct qmat *w);
