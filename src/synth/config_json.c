// config.json, generation_config.json and model.safetensors.index.json as mlx-lm / mlx-vlm write
// them for Qwen3.6-35B-A3B: the published config (nested text_config, vision_config) plus the
// top-level "quantization" block with its per-module 8-bit overrides, mirrored as
// "quantization_config". Top-level keys are sorted like mlx-lm's save_config.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "synth/synth.h"
#include "util/util.h"

int synth_write_text(const char *dir, const char *name, const char *text, struct wren_err *e) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return wren_errf(e, "cannot create %s: %s", path, strerror(errno));
    int rc = st_pwrite_all(fd, text, strlen(text), 0, path, e);
    if (close(fd) && !rc) rc = wren_errf(e, "closing %s: %s", path, strerror(errno));
    if (rc) unlink(path);
    return rc;
}

static int write_json(const char *dir, const char *name, cJSON *root, struct wren_err *e) {
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return wren_errf(e, "%s: out of memory formatting JSON", name);
    size_t n = strlen(text);
    char *withnl = xmalloc(n + 2);
    memcpy(withnl, text, n);
    memcpy(withnl + n, "\n", 2);
    cJSON_free(text);
    int rc = synth_write_text(dir, name, withnl, e);
    free(withnl);
    return rc;
}

static void add_id(cJSON *o, const char *key, int id) {
    if (id >= 0) cJSON_AddNumberToObject(o, key, id);
}

static cJSON *quant_block(const struct synth_dims *d) {
    cJSON *q = cJSON_CreateObject();
    cJSON_AddNumberToObject(q, "group_size", d->group);
    cJSON_AddNumberToObject(q, "bits", d->bits);
    cJSON_AddStringToObject(q, "mode", "affine");
    for (int i = 0; i < d->n_layers; i++) {
        static const char *const gates[2] = {"mlp.gate", "mlp.shared_expert_gate"};
        for (int k = 0; k < 2; k++) {
            char key[160];
            snprintf(key, sizeof key, "language_model.model.layers.%d.%s", i, gates[k]);
            cJSON *o = cJSON_AddObjectToObject(q, key);
            cJSON_AddNumberToObject(o, "group_size", d->group);
            cJSON_AddNumberToObject(o, "bits", d->gate_bits);
        }
    }
    return q;
}

static cJSON *text_config(const struct synth_dims *d) {
    cJSON *t = cJSON_CreateObject();
    cJSON_AddFalseToObject(t, "attention_bias");
    cJSON_AddNumberToObject(t, "attention_dropout", 0.0);
    cJSON_AddTrueToObject(t, "attn_output_gate");
    add_id(t, "bos_token_id", d->endoftext);
    cJSON_AddStringToObject(t, "dtype", "bfloat16");
    add_id(t, "eos_token_id", d->endoftext);
    cJSON_AddNumberToObject(t, "full_attention_interval", d->full_attention_interval);
    cJSON_AddNumberToObject(t, "head_dim", d->head_dim);
    cJSON_AddStringToObject(t, "hidden_act", "silu");
    cJSON_AddNumberToObject(t, "hidden_size", d->hidden);
    cJSON_AddNumberToObject(t, "initializer_range", 0.02);
    cJSON *lt = cJSON_AddArrayToObject(t, "layer_types");
    for (int i = 0; i < d->n_layers; i++)
        cJSON_AddItemToArray(lt, cJSON_CreateString(synth_is_full_attention(d, i)
                                                        ? "full_attention"
                                                        : "linear_attention"));
    cJSON_AddNumberToObject(t, "linear_conv_kernel_dim", d->conv_kernel);
    cJSON_AddNumberToObject(t, "linear_key_head_dim", d->dn_k_dim);
    cJSON_AddNumberToObject(t, "linear_num_key_heads", d->dn_k_heads);
    cJSON_AddNumberToObject(t, "linear_num_value_heads", d->dn_v_heads);
    cJSON_AddNumberToObject(t, "linear_value_head_dim", d->dn_v_dim);
    cJSON_AddStringToObject(t, "mamba_ssm_dtype", "float32");
    cJSON_AddNumberToObject(t, "max_position_embeddings", d->max_position);
    cJSON_AddStringToObject(t, "model_type", "qwen3_5_moe_text");
    cJSON_AddNumberToObject(t, "moe_intermediate_size", d->expert_inter);
    cJSON_AddNumberToObject(t, "mtp_num_hidden_layers", 1);
    cJSON_AddFalseToObject(t, "mtp_use_dedicated_embeddings");
    cJSON_AddNumberToObject(t, "num_attention_heads", d->n_heads);
    cJSON_AddNumberToObject(t, "num_experts", d->n_experts);
    cJSON_AddNumberToObject(t, "num_experts_per_tok", d->top_k);
    cJSON_AddNumberToObject(t, "num_hidden_layers", d->n_layers);
    cJSON_AddNumberToObject(t, "num_key_value_heads", d->n_kv_heads);
    cJSON_AddFalseToObject(t, "output_router_logits");
    cJSON_AddNullToObject(t, "pad_token_id");
    cJSON_AddNumberToObject(t, "partial_rotary_factor", d->partial_rotary);
    cJSON_AddNumberToObject(t, "rms_norm_eps", d->rms_eps);
    cJSON *rp = cJSON_AddObjectToObject(t, "rope_parameters");
    cJSON_AddTrueToObject(rp, "mrope_interleaved");
    int sec[3] = {11, 11, 10};
    cJSON_AddItemToObject(rp, "mrope_section", cJSON_CreateIntArray(sec, 3));
    cJSON_AddNumberToObject(rp, "partial_rotary_factor", d->partial_rotary);
    cJSON_AddNumberToObject(rp, "rope_theta", d->rope_theta);
    cJSON_AddStringToObject(rp, "rope_type", "default");
    cJSON_AddNumberToObject(t, "router_aux_loss_coef", 0.001);
    cJSON_AddNumberToObject(t, "shared_expert_intermediate_size", d->shared_inter);
    cJSON_AddFalseToObject(t, "tie_word_embeddings");
    cJSON_AddTrueToObject(t, "use_cache");
    cJSON_AddNumberToObject(t, "vocab_size", d->vocab);
    return t;
}

static cJSON *vision_config(const struct synth_dims *d) {
    cJSON *v = cJSON_CreateObject();
    cJSON_AddItemToObject(v, "deepstack_visual_indexes", cJSON_CreateArray());
    cJSON_AddNumberToObject(v, "depth", d->v_depth);
    cJSON_AddStringToObject(v, "hidden_act", "gelu_pytorch_tanh");
    cJSON_AddNumberToObject(v, "hidden_size", d->v_hidden);
    cJSON_AddNumberToObject(v, "in_channels", d->v_in_ch);
    cJSON_AddNumberToObject(v, "initializer_range", 0.02);
    cJSON_AddNumberToObject(v, "intermediate_size", d->v_inter);
    cJSON_AddStringToObject(v, "model_type", "qwen3_5_moe");
    cJSON_AddNumberToObject(v, "num_heads", d->v_heads);
    cJSON_AddNumberToObject(v, "num_position_embeddings", d->v_pos);
    cJSON_AddNumberToObject(v, "out_hidden_size", d->v_out);
    cJSON_AddNumberToObject(v, "patch_size", d->v_patch);
    cJSON_AddNumberToObject(v, "spatial_merge_size", d->v_merge);
    cJSON_AddNumberToObject(v, "temporal_patch_size", d->v_temporal);
    return v;
}

static cJSON *config_json(const struct synth_dims *d) {
    cJSON *c = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(c, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("Qwen3_5MoeForConditionalGeneration"));
    add_id(c, "image_token_id", d->image_pad);
    cJSON_AddStringToObject(c, "model_type", "qwen3_5_moe");
    cJSON_AddItemToObject(c, "quantization", quant_block(d));
    cJSON_AddItemToObject(c, "quantization_config", quant_block(d));
    cJSON_AddItemToObject(c, "text_config", text_config(d));
    cJSON_AddFalseToObject(c, "tie_word_embeddings");
    cJSON_AddStringToObject(c, "transformers_version", "4.57.0.dev0");
    add_id(c, "video_token_id", d->video_pad);
    cJSON_AddItemToObject(c, "vision_config", vision_config(d));
    add_id(c, "vision_end_token_id", d->vision_end);
    add_id(c, "vision_start_token_id", d->vision_start);
    return c;
}

int synth_write_config(const struct synth_dims *d, const char *dir, struct wren_err *e) {
    return write_json(dir, "config.json", config_json(d), e);
}

int synth_write_generation_config(const struct synth_dims *d, const char *dir, struct wren_err *e) {
    cJSON *g = cJSON_CreateObject();
    add_id(g, "bos_token_id", d->endoftext);
    cJSON_AddTrueToObject(g, "do_sample");
    cJSON *eos = cJSON_AddArrayToObject(g, "eos_token_id");
    if (d->im_end >= 0) cJSON_AddItemToArray(eos, cJSON_CreateNumber(d->im_end));
    if (d->endoftext >= 0) cJSON_AddItemToArray(eos, cJSON_CreateNumber(d->endoftext));
    add_id(g, "pad_token_id", d->endoftext);
    cJSON_AddNumberToObject(g, "temperature", 1.0);
    cJSON_AddNumberToObject(g, "top_k", 20);
    cJSON_AddNumberToObject(g, "top_p", 0.95);
    cJSON_AddStringToObject(g, "transformers_version", "4.57.0.dev0");
    return write_json(dir, "generation_config.json", g, e);
}

static int by_name(const void *a, const void *b) {
    const struct synth_tensor *x = *(const struct synth_tensor *const *)a;
    const struct synth_tensor *y = *(const struct synth_tensor *const *)b;
    return strcmp(x->name, y->name);
}

int synth_write_index(const struct synth_plan *p, const char *dir, struct wren_err *e) {
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)p->total_bytes);
    cJSON_AddNumberToObject(meta, "total_parameters", (double)p->total_params);
    cJSON *map = cJSON_AddObjectToObject(root, "weight_map");
    const struct synth_tensor **sorted = xmalloc(sizeof *sorted * (size_t)(p->n ? p->n : 1));
    for (int i = 0; i < p->n; i++) sorted[i] = &p->t[i];
    qsort(sorted, (size_t)p->n, sizeof *sorted, by_name);
    for (int i = 0; i < p->n; i++) {
        char shard[64];
        synth_shard_name(p, sorted[i]->shard, shard, sizeof shard);
        cJSON_AddStringToObject(map, sorted[i]->name, shard);
    }
    free(sorted);
    return write_json(dir, "model.safetensors.index.json", root, e);
}

int synth_print_plan(const struct synth_plan *p, const struct synth_dims *d, FILE *f,
                     struct wren_err *e) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "config", config_json(d));
    cJSON_AddNumberToObject(root, "files", p->n_shards);
    cJSON_AddNumberToObject(root, "total_size", (double)p->total_bytes);
    cJSON *all = cJSON_AddObjectToObject(root, "tensors");
    for (int i = 0; i < p->n; i++) {
        const struct synth_tensor *t = &p->t[i];
        cJSON *o = cJSON_AddObjectToObject(all, t->name);
        cJSON_AddStringToObject(o, "dtype", st_dtype_name(t->st.dtype));
        cJSON *sh = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < t->st.ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->st.shape[d]));
        char shard[64];
        synth_shard_name(p, t->shard, shard, sizeof shard);
        cJSON_AddStringToObject(o, "file", shard);
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) return wren_errf(e, "out of memory formatting the plan");
    int bad = fprintf(f, "%s\n", text) < 0 || fflush(f);
    cJSON_free(text);
    return bad ? wren_errf(e, "writing the plan to stdout failed") : 0;
}
