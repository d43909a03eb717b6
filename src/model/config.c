#include "model/config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

// Reads fields from the text config first, then from fallbacks (the root, rope_parameters, ...).
struct cfg_src {
    const cJSON *obj[4];
    int n;
    const char *path;
    struct wren_err *e;
};

static const cJSON *find(const struct cfg_src *s, const char *key) {
    for (int i = 0; i < s->n; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(s->obj[i], key);
        if (v && !cJSON_IsNull(v)) return v;
    }
    return NULL;
}

// Integer field: required unless def >= 0 is given (-1 = required).
static int get_int(const struct cfg_src *s, const char *key, long def, long lo, long hi, int *out) {
    const cJSON *v = find(s, key);
    if (!v) {
        if (def < 0) return wren_errf(s->e, "%s: missing required field '%s'", s->path, key);
        *out = (int)def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi)
        return wren_errf(s->e, "%s: field '%s' must be an integer in [%ld, %ld]", s->path, key, lo,
                         hi);
    *out = (int)v->valuedouble;
    return 0;
}

static int get_float(const struct cfg_src *s, const char *key, double def, float *out) {
    const cJSON *v = find(s, key);
    if (!v) {
        if (isnan(def)) return wren_errf(s->e, "%s: missing required field '%s'", s->path, key);
        *out = (float)def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return wren_errf(s->e, "%s: field '%s' must be a number", s->path, key);
    *out = (float)v->valuedouble;
    return 0;
}

static int get_bool(const struct cfg_src *s, const char *key, bool def, bool *out) {
    const cJSON *v = find(s, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v))
        return wren_errf(s->e, "%s: field '%s' must be true or false", s->path, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int parse_layer_types(struct model_config *c, const struct cfg_src *s) {
    const cJSON *lt = find(s, "layer_types");
    if (lt) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers)
            return wren_errf(s->e, "%s: 'layer_types' must list %d layer types", s->path,
                             c->n_layers);
        int i = 0;
        for (const cJSON *it = lt->child; it; it = it->next, i++) {
            if (cJSON_IsString(it) && !strcmp(it->valuestring, "linear_attention"))
                c->kind[i] = LAYER_DELTANET;
            else if (cJSON_IsString(it) && !strcmp(it->valuestring, "full_attention"))
                c->kind[i] = LAYER_ATTENTION;
            else
                return wren_errf(s->e,
                                 "%s: layer_types[%d]: unsupported layer type (expected "
                                 "linear_attention or full_attention)",
                                 s->path, i);
        }
        return 0;
    }
    int interval;
    if (get_int(s, "full_attention_interval", 4, 1, WREN_MAX_LAYERS, &interval)) return -1;
    for (int i = 0; i < c->n_layers; i++)
        c->kind[i] = (i + 1) % interval == 0 ? LAYER_ATTENTION : LAYER_DELTANET;
    return 0;
}

static int parse_eos(struct model_config *c, const struct cfg_src *s) {
    const cJSON *v = find(s, "eos_token_id");
    c->n_eos = 0;
    if (!v) return 0;
    if (cJSON_IsNumber(v)) {
        c->eos[c->n_eos++] = (int32_t)v->valuedouble;
        return 0;
    }
    if (!cJSON_IsArray(v))
        return wren_errf(s->e, "%s: 'eos_token_id' must be an id or a list", s->path);
    for (const cJSON *it = v->child; it && c->n_eos < WREN_MAX_EOS; it = it->next) {
        if (!cJSON_IsNumber(it))
            return wren_errf(s->e, "%s: 'eos_token_id' entries must be ids", s->path);
        c->eos[c->n_eos++] = (int32_t)it->valuedouble;
    }
    return 0;
}

static int check(struct model_config *c, const char *path, struct wren_err *e) {
#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) return wren_errf(e, "%s: unsupported config: " __VA_ARGS__);                  \
    } while (0)
    REQUIRE(c->rope_dim % 2 == 0 && c->rope_dim <= c->head_dim,
            "rotary dims %d must be even and <= head_dim %d", path, c->rope_dim, c->head_dim);
    REQUIRE(c->n_heads % c->n_kv_heads == 0, "%d attention heads not a multiple of %d KV heads",
            path, c->n_heads, c->n_kv_heads);
    REQUIRE(c->dn_v_heads % c->dn_k_heads == 0,
            "%d DeltaNet value heads not a multiple of %d key "
            "heads",
            path, c->dn_v_heads, c->dn_k_heads);
    REQUIRE(c->n_experts == 0 || (c->top_k >= 1 && c->top_k <= c->n_experts && c->top_k <= 64),
            "top-%d of %d experts", path, c->top_k, c->n_experts);
    REQUIRE(c->n_experts > 0 || c->dense_inter > 0, "neither experts nor a dense MLP", path);
    REQUIRE(c->rms_eps > 0, "rms_norm_eps must be positive", path);
#undef REQUIRE
    return 0;
}

int config_parse(struct model_config *c, const char *json, const char *path, struct wren_err *e) {
    memset(c, 0, sizeof *c);
    cJSON *root = cJSON_Parse(json);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return wren_errf(e, "%s: not a valid JSON object", path);
    }
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    struct cfg_src s = {.path = path, .e = e};
    if (cJSON_IsObject(text)) s.obj[s.n++] = text;
    s.obj[s.n++] = root;
    const cJSON *rope = find(&s, "rope_parameters");
    if (!cJSON_IsObject(rope)) rope = find(&s, "rope_scaling");
    if (cJSON_IsObject(rope)) s.obj[s.n++] = rope;

    int rc = -1;
    const cJSON *mt = find(&s, "model_type");
    const char *type = cJSON_IsString(mt) ? mt->valuestring : "";
    snprintf(c->model_type, sizeof c->model_type, "%s", type);
    if (!strcmp(type, "qwen3_next")) {
        wren_errf(e,
                  "%s: model_type qwen3_next (flat layout with fused in_proj_qkvz) is not "
                  "supported; wren runs qwen3_5_moe / qwen3_5 checkpoints",
                  path);
        goto out;
    }
    if (strncmp(type, "qwen3_5", 7)) {
        wren_errf(e, "%s: model_type '%s' is not supported (expected qwen3_5_moe or qwen3_5)", path,
                  type);
        goto out;
    }
    float partial = 1.0f;
    if (get_int(&s, "hidden_size", -1, 64, 65536, &c->hidden) ||
        get_int(&s, "num_hidden_layers", -1, 1, WREN_MAX_LAYERS, &c->n_layers) ||
        get_int(&s, "vocab_size", -1, 1, 1 << 24, &c->vocab) ||
        get_float(&s, "rms_norm_eps", 1e-6, &c->rms_eps) ||
        get_int(&s, "num_attention_heads", -1, 1, 1024, &c->n_heads) ||
        get_int(&s, "num_key_value_heads", -1, 1, 1024, &c->n_kv_heads) ||
        get_int(&s, "head_dim", -1, 8, 1024, &c->head_dim) ||
        get_float(&s, "rope_theta", 10000.0, &c->rope_theta) ||
        get_float(&s, "partial_rotary_factor", 1.0, &partial) ||
        get_bool(&s, "attn_output_gate", true, &c->attn_output_gate) ||
        get_int(&s, "linear_num_key_heads", -1, 1, 1024, &c->dn_k_heads) ||
        get_int(&s, "linear_num_value_heads", -1, 1, 1024, &c->dn_v_heads) ||
        get_int(&s, "linear_key_head_dim", -1, 8, 1024, &c->dn_k_dim) ||
        get_int(&s, "linear_value_head_dim", -1, 8, 1024, &c->dn_v_dim) ||
        get_int(&s, "linear_conv_kernel_dim", 4, 1, 16, &c->conv_kernel) ||
        get_int(&s, "num_experts", 0, 0, 4096, &c->n_experts) ||
        get_int(&s, "num_experts_per_tok", 0, 0, 4096, &c->top_k) ||
        get_int(&s, "moe_intermediate_size", 0, 0, 1 << 20, &c->expert_inter) ||
        get_int(&s, "shared_expert_intermediate_size", 0, 0, 1 << 20, &c->shared_inter) ||
        get_int(&s, "intermediate_size", 0, 0, 1 << 20, &c->dense_inter) ||
        get_bool(&s, "norm_topk_prob", true, &c->norm_topk) ||
        get_bool(&s, "tie_word_embeddings", false, &c->tie_embeddings) ||
        get_int(&s, "max_position_embeddings", 262144, 1, 1 << 30, &c->max_position) ||
        parse_layer_types(c, &s) || parse_eos(c, &s))
        goto out;
    if (!(partial > 0 && partial <= 1) || !(c->rope_theta > 0)) {
        wren_errf(e, "%s: partial_rotary_factor must be in (0, 1] and rope_theta positive", path);
        goto out;
    }
    c->rope_dim = (int)lroundf((float)c->head_dim * partial);
    if (c->n_experts > 0 && (c->top_k < 1 || c->expert_inter < 1)) {
        wren_errf(e, "%s: MoE config needs num_experts_per_tok and moe_intermediate_size", path);
        goto out;
    }
    if (c->n_experts > 0) c->dense_inter = 0;
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization");
    if (!cJSON_IsObject(q)) q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (cJSON_IsObject(q)) {
        struct cfg_src qs = {.obj = {q}, .n = 1, .path = path, .e = e};
        if (get_int(&qs, "bits", 4, 1, 8, &c->quant.bits) ||
            get_int(&qs, "group_size", 64, 1, 4096, &c->quant.group))
            goto out;
    }
    rc = check(c, path, e);
out:
    cJSON_Delete(root);
    return rc;
}
