// The model's dimensions, read once from config.json (nested text_config or flat) and validated.
// Everything downstream sizes itself from this struct; no JSON is consulted after load.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "util/err.h"

#define WREN_MAX_LAYERS 128
#define WREN_MAX_EOS    8

enum layer_kind { LAYER_DELTANET, LAYER_ATTENTION };
enum ckpt_format { CKPT_HF, CKPT_MLX }; // HF: bf16, zero-centred norms; MLX: affine-quantized

struct quant_spec { // MLX affine quantization of one module (bits 0 = not quantized)
    int bits, group;
};

struct model_config {
    char model_type[64]; // e.g. "qwen3_5_moe_text"
    enum ckpt_format format;
    int hidden;   // 2048
    int n_layers; // 40
    int vocab;    // embedding rows (248320, padded past the tokenizer)
    enum layer_kind kind[WREN_MAX_LAYERS];
    float rms_eps;
    bool tie_embeddings;

    // gated full attention
    int n_heads, n_kv_heads, head_dim; // 16, 2, 256
    int rope_dim;                      // rotated dims per head (head_dim * partial_rotary_factor)
    float rope_theta;
    bool attn_output_gate; // q_proj emits [query | gate] per head

    // gated DeltaNet
    int dn_k_heads, dn_v_heads; // 16, 32
    int dn_k_dim, dn_v_dim;     // 128, 128
    int conv_kernel;            // 4

    // mixture of experts (n_experts == 0: dense MLP of size dense_inter)
    int n_experts, top_k; // 256, 8
    int expert_inter;     // 512
    int shared_inter;     // 512 (0: no shared expert)
    int dense_inter;      // only for dense (qwen3_5) models
    bool norm_topk;       // renormalise the top-k weights

    int max_position; // max_position_embeddings
    int n_eos;
    int32_t eos[WREN_MAX_EOS];

    struct quant_spec quant; // default quantization (MLX); each tensor's own is read off its shape
};

// Derived sizes used everywhere.
static inline int cfg_dn_qk_dim(const struct model_config *c) {
    return c->dn_k_heads * c->dn_k_dim;
}
static inline int cfg_dn_v_dim(const struct model_config *c) {
    return c->dn_v_heads * c->dn_v_dim;
}
static inline int cfg_dn_conv_dim(const struct model_config *c) {
    return 2 * cfg_dn_qk_dim(c) + cfg_dn_v_dim(c);
}
static inline int cfg_n_attn_layers(const struct model_config *c) {
    int n = 0;
    for (int i = 0; i < c->n_layers; i++) n += c->kind[i] == LAYER_ATTENTION;
    return n;
}

// Parses and validates config.json text. `path` is used in messages only.
int config_parse(struct model_config *c, const char *json, const char *path, struct wren_err *e);
