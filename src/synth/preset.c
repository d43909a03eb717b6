// The dimensions of each preset. qwen3.6-35b-a3b is the published Qwen3.6-35B-A3B text_config and
// vision_config; tiny keeps every structural feature (3:1 DeltaNet/attention pattern, GQA,
// value heads sharing key heads, routed + shared experts) at a size tests can run in seconds.
#include <string.h>

#include "synth/synth.h"

static const struct synth_dims qwen36 = {
    .preset = "qwen3.6-35b-a3b",
    .hidden = 2048,
    .n_layers = 40,
    .vocab = 248320,
    .n_heads = 16,
    .n_kv_heads = 2,
    .head_dim = 256,
    .dn_k_heads = 16,
    .dn_v_heads = 32,
    .dn_k_dim = 128,
    .dn_v_dim = 128,
    .conv_kernel = 4,
    .n_experts = 256,
    .top_k = 8,
    .expert_inter = 512,
    .shared_inter = 512,
    .full_attention_interval = 4,
    .max_position = 262144,
    .rope_theta = 10000000.0,
    .partial_rotary = 0.25,
    .rms_eps = 1e-6,
    .group = 64,
    .bits = 4,
    .gate_bits = 8,
    .endoftext = 248044,
    .im_end = 248046,
    .vision_start = 248053,
    .vision_end = 248054,
    .image_pad = 248056,
    .video_pad = 248057,
    .v_depth = 27,
    .v_hidden = 1152,
    .v_heads = 16,
    .v_inter = 4304,
    .v_out = 2048,
    .v_pos = 2304,
    .v_patch = 16,
    .v_temporal = 2,
    .v_merge = 2,
    .v_in_ch = 3,
    .vision = true,
};

// Special ids sit where Qwen3.6 puts them relative to the end of its BPE vocabulary
// (248044 = 1000 + 247044), so a tiny model without a tokenizer still has distinct, in-range ids.
static const struct synth_dims tiny = {
    .preset = "tiny",
    .hidden = 256,
    .n_layers = 8,
    .vocab = 1024,
    .n_heads = 4,
    .n_kv_heads = 2,
    .head_dim = 256,
    .dn_k_heads = 2,
    .dn_v_heads = 4,
    .dn_k_dim = 128,
    .dn_v_dim = 128,
    .conv_kernel = 4,
    .n_experts = 16,
    .top_k = 4,
    .expert_inter = 128,
    .shared_inter = 128,
    .full_attention_interval = 4,
    .max_position = 262144,
    .rope_theta = 10000000.0,
    .partial_rotary = 0.25,
    .rms_eps = 1e-6,
    .group = 64,
    .bits = 4,
    .gate_bits = 8,
    .endoftext = 1000,
    .im_end = 1002,
    .vision_start = 1009,
    .vision_end = 1010,
    .image_pad = 1012,
    .video_pad = 1013,
    .v_depth = 2,
    .v_hidden = 64,
    .v_heads = 4,
    .v_inter = 136, // like 4304, not a multiple of the group size
    .v_out = 256,
    .v_pos = 64,
    .v_patch = 16,
    .v_temporal = 2,
    .v_merge = 2,
    .v_in_ch = 3,
    .vision = false,
};

int synth_preset(const char *name, struct synth_dims *d, struct wren_err *e) {
    if (!strcmp(name, qwen36.preset))
        *d = qwen36;
    else if (!strcmp(name, tiny.preset))
        *d = tiny;
    else
        return wren_errf(e, "unknown preset '%s' (expected tiny or qwen3.6-35b-a3b)", name);
    return 0;
}
