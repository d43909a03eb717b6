// Random-weight checkpoints with the real layout: the tensor names, dtypes, shapes, sharding and
// config.json of mlx-community/Qwen3.6-35B-A3B-4bit (MLX affine quantization, group 64, 4 bits,
// the MoE router and shared-expert gate at 8 bits), filled with deterministic random values drawn
// so that a forward pass stays finite and in a realistic range.
//
// Value rules (what a reader of the checkpoint can rely on):
//  - every quantized matrix (embedding and lm_head included): packed codes uniform over
//    [0, 2^bits), per-group scale s = std/sigma_q * (1 + j) / sqrt(1 + J^2/3) with j uniform in
//    [-J, J] (J = 0.2) and sigma_q = sqrt((4^bits - 1) / 12), bias = -s * (2^bits - 1) / 2;
//    so the dequantized weights have mean ~0 and std = 1/sqrt(in_features);
//  - RMSNorm weights (MLX stores the effective 1 + w): 1 +- 0.05 uniform; the DeltaNet output
//    norm likewise;
//  - conv1d: uniform with std 1/sqrt(kernel); A_log (f32) = log(uniform(1, 16));
//    dt_bias uniform in [-0.5, 0.5];
//  - vision tower (bf16, unquantized as published): matrices std 1/sqrt(in), biases 0 +- 0.02,
//    LayerNorm weights 1 +- 0.05.
// Values depend only on --seed and the tensor name (never on thread count or order).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "model/st_writer.h"
#include "util/err.h"

#define SYNTH_MAX_LAYERS 128

struct synth_dims {
    const char *preset;
    int hidden, n_layers, vocab;
    int n_heads, n_kv_heads, head_dim;
    int dn_k_heads, dn_v_heads, dn_k_dim, dn_v_dim, conv_kernel;
    int n_experts, top_k, expert_inter, shared_inter;
    int full_attention_interval;
    int max_position;
    double rope_theta, partial_rotary, rms_eps;
    int group, bits, gate_bits; // default quantization and the router/shared-gate override
    // special token ids written into config.json / generation_config.json (-1: absent)
    int endoftext, im_end, vision_start, vision_end, image_pad, video_pad;
    // vision tower (config + optional tensors)
    int v_depth, v_hidden, v_heads, v_inter, v_out, v_pos, v_patch, v_temporal, v_merge, v_in_ch;
    bool vision; // write the vision tower's tensors
};

// Looks up a preset ("tiny", "qwen3.6-35b-a3b"). Returns 0, or -1 with e naming the presets.
int synth_preset(const char *name, struct synth_dims *d, struct wren_err *e);
// Layer i is full attention when (i + 1) % full_attention_interval == 0.
static inline bool synth_is_full_attention(const struct synth_dims *d, int i) {
    return (i + 1) % d->full_attention_interval == 0;
}

// How one tensor's values are drawn.
enum synth_init {
    SI_QWEIGHT, // packed codes, uniform random bits
    SI_QSCALES, // per-group scales (a = target std of the dequantized weights; bits)
    SI_QBIASES, // per-group biases matching the scales of the same base name
    SI_NEAR,    // a +- b, uniform
    SI_UNIFORM, // uniform in [a, b)
    SI_LOGUNIF, // log(uniform in [a, b))
};

struct synth_tensor {
    struct st_tensor_out st; // name (points into name[]), dtype, shape; offset once planned
    char name[160];
    enum synth_init init;
    int bits;
    float a, b;
    uint64_t key;      // random stream of this tensor (seed + base name)
    int shard;         // index of the file it lives in
    uint64_t n_params; // parameters it stands for (packed codes count unpacked; scales 0)
};

struct synth_plan {
    struct synth_tensor *t;
    int n, cap;
    int n_shards;
    uint64_t total_bytes;  // sum of tensor bytes (as the index's metadata.total_size)
    uint64_t total_params; // as mlx-lm counts them (quantized weights unpacked, no scales)
};

// Builds the tensor list of the whole checkpoint in file order (vision tower first when enabled,
// then the language model as mlx-lm orders it) and assigns shards the way mlx-lm does: a new file
// when the next tensor would take the current one past shard_bytes.
void synth_plan_build(struct synth_plan *p, const struct synth_dims *d, uint64_t seed,
                      uint64_t shard_bytes);
void synth_plan_free(struct synth_plan *p);
// File name of shard i: "model.safetensors" alone, else "model-0000i-of-0000n.safetensors".
void synth_shard_name(const struct synth_plan *p, int i, char *out, size_t cap);

// Values of bytes [off, off + n) of tensor t's data into out (n a multiple of the dtype size and
// off of the chunk size used by the writer). Deterministic in (t->key, off).
#define SYNTH_CHUNK_BYTES ((size_t)8 << 20)
void synth_fill(const struct synth_tensor *t, size_t chunk_index, uint8_t *out, size_t n);

// Writes every shard of the plan into dir with `threads` workers. Reports bytes and seconds.
int synth_write_shards(const struct synth_plan *p, const char *dir, int threads, bool show_progress,
                       struct wren_err *e);

// config.json, generation_config.json and model.safetensors.index.json.
int synth_write_config(const struct synth_dims *d, const char *dir, struct wren_err *e);
int synth_write_generation_config(const struct synth_dims *d, const char *dir, struct wren_err *e);
int synth_write_index(const struct synth_plan *p, const char *dir, struct wren_err *e);
// The plan as JSON: {"config": config.json, "files", "total_size",
// "tensors": {name: {dtype, shape, file}} in file order}.
int synth_print_plan(const struct synth_plan *p, const struct synth_dims *d, FILE *f,
                     struct wren_err *e);

// Tokenizer directory: reads tokenizer.json to size the vocabulary (max id of model.vocab and
// added_tokens, + 1) and find the special ids; copies the tokenizer files into dir.
struct synth_tokenizer {
    int n_ids;                                                             // max id + 1
    int endoftext, im_end, vision_start, vision_end, image_pad, video_pad; // -1 when absent
    bool has_generation_config; // the source directory had one (copied as is)
};
int synth_tokenizer_read(const char *src_dir, struct synth_tokenizer *tk, struct wren_err *e);
int synth_tokenizer_copy(const char *src_dir, const char *dst_dir, struct synth_tokenizer *tk,
                         struct wren_err *e);

// Writes a whole small file (config files), checking every step.
int synth_write_text(const char *dir, const char *name, const char *text, struct wren_err *e);
