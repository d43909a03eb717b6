// Binds every checkpoint tensor to a named field of struct model / struct layer, checking dtype and
// shape against the config. Both formats: HF bf16 (nested `model.language_model.*`, fused 3-D
// experts, zero-centred norms) and MLX affine quantized (`language_model.model.*`, per-projection
// expert stacks `switch_mlp`, norms stored as 1 + w, conv1d as [C, K, 1]).
#include "model/weights.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "model/safetensors.h"
#include "util/util.h"

struct binder {
    struct model *m;
    const char *prefix; // "model.language_model." | "language_model.model." | "model."
    const char *lm_head;
    bool mlx_naming;
    struct wren_err *e;
};

static struct st_tensor *lookup(struct binder *b, const char *name, struct st_file **file) {
    for (int i = 0; i < b->m->n_files; i++) {
        struct st_tensor *t = st_find(b->m->files[i], name);
        if (t) {
            if (file) *file = b->m->files[i];
            return t;
        }
    }
    return NULL;
}

static void shape_str(const struct st_tensor *t, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

static int shape_is(const struct st_tensor *t, int ndim, const int64_t *dims) {
    if (t->ndim != ndim) return 0;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != dims[i]) return 0;
    return 1;
}

static int shape_err(struct binder *b, const char *name, const struct st_tensor *t, int ndim,
                     const int64_t *dims, const char *what) {
    char want[128] = "[", got[128];
    size_t k = 1;
    for (int i = 0; i < ndim; i++)
        k += (size_t)snprintf(want + k, sizeof want - k, "%s%lld", i ? ", " : "",
                              (long long)dims[i]);
    snprintf(want + k, sizeof want - k, "]");
    shape_str(t, got, sizeof got);
    struct st_file *f = NULL;
    lookup(b, name, &f);
    return wren_errf(b->e, "%s: tensor '%s': expected %s shape %s, found %s %s",
                     f ? f->path : b->m->dir, name, what, want, t->dtype_name, got);
}

static struct st_tensor *need(struct binder *b, const char *name) {
    struct st_tensor *t = lookup(b, name, NULL);
    if (!t)
        wren_errf(b->e, "%s: missing tensor '%s'", b->m->dir, name);
    else
        t->used = 1;
    return t;
}

// A matrix [rows][cols], or a stack of n of them when n > 1 (3-D tensor), quantized or not.
// rows_total/row0 select a slice of the stored rows (HF fused gate_up_proj).
static int bind_mat_slice(struct binder *b, struct qmat *w, const char *base, int n, int rows,
                          int cols, int rows_total, int row0) {
    char name[256];
    // HF stores its fused 3-D expert tensors without the ".weight" suffix.
    bool bare = !b->mlx_naming && strstr(base, ".mlp.experts.");
    snprintf(name, sizeof name, "%s%s", base, bare ? "" : ".weight");
    struct st_tensor *t = need(b, name);
    if (!t) return -1;
    int nd = n > 1 ? 3 : 2;
    int64_t lead = n;
    memset(w, 0, sizeof *w);
    w->n = n, w->rows = rows, w->cols = cols;
    if (t->dtype == ST_U32) { // MLX affine quantized: weight, scales, biases
        if (t->ndim != nd) goto bad_q;
        int64_t packed = t->shape[nd - 1];
        if (packed <= 0 || (32 * packed) % cols) goto bad_q;
        int bits = (int)(32 * packed / cols);
        int64_t want[3] = {lead, rows_total, packed};
        if ((bits != 4 && bits != 8) || !shape_is(t, nd, n > 1 ? want : want + 1)) goto bad_q;
        char sn[256], bn[256];
        snprintf(sn, sizeof sn, "%s.scales", base);
        snprintf(bn, sizeof bn, "%s.biases", base);
        struct st_tensor *s = need(b, sn), *bi = need(b, bn);
        if (!s || !bi) return -1;
        if (s->ndim != nd || s->shape[nd - 1] <= 0 || cols % s->shape[nd - 1])
            return shape_err(b, sn, s, nd, want, "(scales: [.., rows, cols/group] BF16)");
        int group = (int)(cols / s->shape[nd - 1]);
        int64_t swant[3] = {lead, rows_total, cols / group};
        if (group != 32 && group != 64 && group != 128)
            return wren_errf(b->e, "%s: %s: group size %d is not supported (32, 64 or 128)",
                             b->m->dir, base, group);
        if (s->dtype != ST_BF16 || !shape_is(s, nd, n > 1 ? swant : swant + 1))
            return shape_err(b, sn, s, nd, n > 1 ? swant : swant + 1, "BF16");
        if (bi->dtype != ST_BF16 || !shape_is(bi, nd, n > 1 ? swant : swant + 1))
            return shape_err(b, bn, bi, nd, n > 1 ? swant : swant + 1, "BF16");
        w->type = bits == 4 ? WT_Q4 : WT_Q8;
        w->bits = bits, w->group = group;
        w->row_stride = (size_t)packed * 4;
        w->mat_stride = w->row_stride * (size_t)rows_total;
        w->data = t->data + (size_t)row0 * w->row_stride;
        w->sb_row_stride = (size_t)(cols / group) * 2;
        w->sb_mat_stride = w->sb_row_stride * (size_t)rows_total;
        w->scales = s->data + (size_t)row0 * w->sb_row_stride;
        w->biases = bi->data + (size_t)row0 * w->sb_row_stride;
        return 0;
    bad_q:;
        int64_t wq[3] = {lead, rows_total, (int64_t)cols * 4 / 32};
        return shape_err(b, name, t, nd, n > 1 ? wq : wq + 1,
                         "U32 (4-bit; 8-bit has twice the last dim)");
    }
    int64_t want[3] = {lead, rows_total, cols};
    if ((t->dtype != ST_BF16 && t->dtype != ST_F32) || !shape_is(t, nd, n > 1 ? want : want + 1))
        return shape_err(b, name, t, nd, n > 1 ? want : want + 1, "BF16 or F32");
    w->type = t->dtype == ST_BF16 ? WT_BF16 : WT_F32;
    size_t es = t->dtype == ST_BF16 ? 2 : 4;
    w->row_stride = (size_t)cols * es;
    w->mat_stride = w->row_stride * (size_t)rows_total;
    w->data = t->data + (size_t)row0 * w->row_stride;
    return 0;
}

static int bind_mat(struct binder *b, struct qmat *w, const char *base, int n, int rows, int cols) {
    return bind_mat_slice(b, w, base, n, rows, cols, rows, 0);
}

// A small vector (norm, A_log, dt_bias, conv weight) converted to f32. `len` elements in total;
// any shape whose product is len and whose dims are among `dims` is accepted.
static int bind_vec(struct binder *b, float **out, const char *name, int len, bool plus_one) {
    struct st_tensor *t = need(b, name);
    if (!t) return -1;
    int64_t count = 1;
    for (int i = 0; i < t->ndim; i++) count *= t->shape[i];
    if (count != len || (t->dtype != ST_BF16 && t->dtype != ST_F32 && t->dtype != ST_F16)) {
        char got[128];
        shape_str(t, got, sizeof got);
        return wren_errf(b->e, "%s: tensor '%s': expected %d BF16/F32 values, found %s %s",
                         b->m->dir, name, len, t->dtype_name, got);
    }
    float *v = xmalloc(sizeof(float) * (size_t)len);
    for (int i = 0; i < len; i++) {
        if (t->dtype == ST_F32)
            memcpy(&v[i], t->data + 4 * (size_t)i, 4);
        else if (t->dtype == ST_BF16) {
            uint16_t h;
            memcpy(&h, t->data + 2 * (size_t)i, 2);
            v[i] = bf16_to_f32(h);
        } else {
            uint16_t h;
            memcpy(&h, t->data + 2 * (size_t)i, 2);
            v[i] = f16_to_f32(h);
        }
        if (plus_one) v[i] += 1.0f;
    }
    *out = v;
    return 0;
}

static int bind_layer(struct binder *b, int li) {
    const struct model_config *c = &b->m->cfg;
    struct layer *L = &b->m->layers[li];
    bool hf = !b->mlx_naming; // HF stores zero-centred norm weights
    char p[128], n[256];
    snprintf(p, sizeof p, "%slayers.%d.", b->prefix, li);
#define NAME(s) (snprintf(n, sizeof n, "%s%s", p, s), n)
    L->kind = c->kind[li];
    if (bind_vec(b, &L->input_norm, NAME("input_layernorm.weight"), c->hidden, hf) ||
        bind_vec(b, &L->post_norm, NAME("post_attention_layernorm.weight"), c->hidden, hf))
        return -1;
    if (L->kind == LAYER_DELTANET) {
        int qk = cfg_dn_qk_dim(c), v = cfg_dn_v_dim(c), conv = cfg_dn_conv_dim(c);
        if (bind_mat(b, &L->dn_qkv, NAME("linear_attn.in_proj_qkv"), 1, conv, c->hidden) ||
            bind_mat(b, &L->dn_z, NAME("linear_attn.in_proj_z"), 1, v, c->hidden) ||
            bind_mat(b, &L->dn_b, NAME("linear_attn.in_proj_b"), 1, c->dn_v_heads, c->hidden) ||
            bind_mat(b, &L->dn_a, NAME("linear_attn.in_proj_a"), 1, c->dn_v_heads, c->hidden) ||
            bind_mat(b, &L->dn_out, NAME("linear_attn.out_proj"), 1, c->hidden, v) ||
            bind_vec(b, &L->dn_conv, NAME("linear_attn.conv1d.weight"), conv * c->conv_kernel,
                     false) ||
            bind_vec(b, &L->dn_A_log, NAME("linear_attn.A_log"), c->dn_v_heads, false) ||
            bind_vec(b, &L->dn_dt_bias, NAME("linear_attn.dt_bias"), c->dn_v_heads, false) ||
            bind_vec(b, &L->dn_norm, NAME("linear_attn.norm.weight"), c->dn_v_dim, false))
            return -1;
        (void)qk;
    } else {
        int qd = c->n_heads * c->head_dim * (c->attn_output_gate ? 2 : 1);
        int kvd = c->n_kv_heads * c->head_dim;
        if (bind_mat(b, &L->q_proj, NAME("self_attn.q_proj"), 1, qd, c->hidden) ||
            bind_mat(b, &L->k_proj, NAME("self_attn.k_proj"), 1, kvd, c->hidden) ||
            bind_mat(b, &L->v_proj, NAME("self_attn.v_proj"), 1, kvd, c->hidden) ||
            bind_mat(b, &L->o_proj, NAME("self_attn.o_proj"), 1, c->hidden,
                     c->n_heads * c->head_dim) ||
            bind_vec(b, &L->q_norm, NAME("self_attn.q_norm.weight"), c->head_dim, hf) ||
            bind_vec(b, &L->k_norm, NAME("self_attn.k_norm.weight"), c->head_dim, hf))
            return -1;
    }
    if (c->n_experts > 0) {
        int E = c->n_experts, I = c->expert_inter;
        if (bind_mat(b, &L->router, NAME("mlp.gate"), 1, E, c->hidden)) return -1;
        if (b->mlx_naming) {
            if (bind_mat(b, &L->exp_gate, NAME("mlp.switch_mlp.gate_proj"), E, I, c->hidden) ||
                bind_mat(b, &L->exp_up, NAME("mlp.switch_mlp.up_proj"), E, I, c->hidden) ||
                bind_mat(b, &L->exp_down, NAME("mlp.switch_mlp.down_proj"), E, c->hidden, I))
                return -1;
        } else {
            if (bind_mat_slice(b, &L->exp_gate, NAME("mlp.experts.gate_up_proj"), E, I, c->hidden,
                               2 * I, 0) ||
                bind_mat_slice(b, &L->exp_up, NAME("mlp.experts.gate_up_proj"), E, I, c->hidden,
                               2 * I, I) ||
                bind_mat(b, &L->exp_down, NAME("mlp.experts.down_proj"), E, c->hidden, I))
                return -1;
        }
        if (c->shared_inter > 0 &&
            (bind_mat(b, &L->sh_gate, NAME("mlp.shared_expert.gate_proj"), 1, c->shared_inter,
                      c->hidden) ||
             bind_mat(b, &L->sh_up, NAME("mlp.shared_expert.up_proj"), 1, c->shared_inter,
                      c->hidden) ||
             bind_mat(b, &L->sh_down, NAME("mlp.shared_expert.down_proj"), 1, c->hidden,
                      c->shared_inter) ||
             bind_mat(b, &L->sh_gate_w, NAME("mlp.shared_expert_gate"), 1, 1, c->hidden)))
            return -1;
    } else if (bind_mat(b, &L->sh_gate, NAME("mlp.gate_proj"), 1, c->dense_inter, c->hidden) ||
               bind_mat(b, &L->sh_up, NAME("mlp.up_proj"), 1, c->dense_inter, c->hidden) ||
               bind_mat(b, &L->sh_down, NAME("mlp.down_proj"), 1, c->hidden, c->dense_inter)) {
        return -1;
    }
#undef NAME
    return 0;
}

// Tensors the text model does not use: vision tower, multi-token-prediction head.
static bool skipped(const char *name) {
    static const char *const skip[] = {"model.visual.",
                                       "visual.",
                                       "vision_tower.",
                                       "mtp.",
                                       "model.mtp.",
                                       "language_model.mtp.",
                                       "model.language_model.mtp."};
    for (size_t i = 0; i < sizeof skip / sizeof skip[0]; i++)
        if (!strncmp(name, skip[i], strlen(skip[i]))) return true;
    return false;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

// The shard files: from model.safetensors.index.json when present, else every *.safetensors.
static int list_shards(const char *dir, char ***out, int *n, struct wren_err *e) {
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    char **names = NULL;
    int k = 0;
    FILE *probe = fopen(path, "rb");
    if (probe) {
        fclose(probe);
        char *text = read_file(path, NULL, e);
        if (!text) return -1;
        cJSON *root = cJSON_Parse(text);
        free(text);
        const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
        if (!cJSON_IsObject(wm)) {
            cJSON_Delete(root);
            return wren_errf(e, "%s: not valid JSON with a 'weight_map' object", path);
        }
        for (const cJSON *it = wm->child; it; it = it->next) {
            if (!cJSON_IsString(it) || strchr(it->valuestring, '/')) {
                wren_errf(e, "%s: weight_map['%s'] must name a file in the directory", path,
                          it->string); // before the tree holding it->string is freed
                for (int i = 0; i < k; i++) free(names[i]);
                free(names);
                cJSON_Delete(root);
                return -1;
            }
            int dup = 0;
            for (int i = 0; i < k && !dup; i++) dup = !strcmp(names[i], it->valuestring);
            if (dup) continue;
            names = xrealloc(names, sizeof *names * (size_t)(k + 1));
            names[k++] = xstrdup(it->valuestring);
        }
        cJSON_Delete(root);
    } else {
        DIR *d = opendir(dir);
        if (!d) return wren_errf(e, "%s: cannot open model directory", dir);
        struct dirent *de;
        while ((de = readdir(d))) {
            size_t len = strlen(de->d_name);
            if (len > 12 && !strcmp(de->d_name + len - 12, ".safetensors")) {
                names = xrealloc(names, sizeof *names * (size_t)(k + 1));
                names[k++] = xstrdup(de->d_name);
            }
        }
        closedir(d);
    }
    if (!k) return wren_errf(e, "%s: no safetensors files found", dir);
    qsort(names, (size_t)k, sizeof *names, cmp_str);
    *out = names;
    *n = k;
    return 0;
}

static int detect_naming(struct binder *b) {
    static const struct {
        const char *prefix, *lm_head;
        bool mlx;
    } layouts[] = {
        {"model.language_model.", "lm_head", false}, // HF Qwen3_5MoeForConditionalGeneration
        {"language_model.model.", "language_model.lm_head", true}, // MLX (mlx-vlm / mlx-lm)
        {"model.", "lm_head", false},                              // HF text-only CausalLM
    };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        char n[256];
        snprintf(n, sizeof n, "%sembed_tokens.weight", layouts[i].prefix);
        if (lookup(b, n, NULL)) {
            b->prefix = layouts[i].prefix;
            b->lm_head = layouts[i].lm_head;
            b->mlx_naming = layouts[i].mlx;
            return 0;
        }
    }
    return wren_errf(b->e,
                     "%s: no embedding tensor found (looked for model.language_model."
                     "embed_tokens.weight, language_model.model.embed_tokens.weight, "
                     "model.embed_tokens.weight): not a Qwen3.5/3.6 checkpoint?",
                     b->m->dir);
}

size_t qmat_bytes(const struct qmat *w) {
    size_t per = w->row_stride * (size_t)w->rows;
    if (w->type == WT_Q4 || w->type == WT_Q8) per += 2 * w->sb_row_stride * (size_t)w->rows;
    return per * (size_t)w->n;
}

// Adds a matrix to the model's totals; `frac` of it is read per token (k/E for expert stacks).
static void account(struct model *m, const struct qmat *w, double frac) {
    if (!w->data) return;
    size_t bytes = qmat_bytes(w);
    m->weight_bytes += bytes;
    m->active_bytes += (size_t)((double)bytes * frac);
    m->active_params += frac * (double)w->n * w->rows * w->cols;
}

static void account_layer(struct model *m, const struct layer *L) {
    const struct qmat *dense[] = {&L->dn_qkv,  &L->dn_z,   &L->dn_b,    &L->dn_a,     &L->dn_out,
                                  &L->q_proj,  &L->k_proj, &L->v_proj,  &L->o_proj,   &L->router,
                                  &L->sh_gate, &L->sh_up,  &L->sh_down, &L->sh_gate_w};
    for (size_t i = 0; i < sizeof dense / sizeof dense[0]; i++) account(m, dense[i], 1.0);
    double frac = m->cfg.n_experts ? (double)m->cfg.top_k / m->cfg.n_experts : 0;
    account(m, &L->exp_gate, frac);
    account(m, &L->exp_up, frac);
    account(m, &L->exp_down, frac);
}

int model_load(struct model *m, const char *dir, struct wren_err *e) {
    memset(m, 0, sizeof *m);
    m->dir = xstrdup(dir);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = read_file(path, NULL, e);
    if (!text) goto fail;
    int rc = config_parse(&m->cfg, text, path, e);
    free(text);
    if (rc) goto fail;

    char **names = NULL;
    if (list_shards(dir, &names, &m->n_files, e)) goto fail;
    m->files = xcalloc((size_t)m->n_files, sizeof *m->files);
    for (int i = 0; i < m->n_files; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        m->files[i] = st_open(path, e);
        if (!m->files[i]) {
            for (int j = 0; j < m->n_files; j++) free(names[j]);
            free(names);
            goto fail;
        }
    }
    for (int j = 0; j < m->n_files; j++) free(names[j]);
    free(names);

    struct binder b = {.m = m, .e = e};
    const struct model_config *c = &m->cfg;
    if (detect_naming(&b)) goto fail;
    m->cfg.format = b.mlx_naming ? CKPT_MLX : CKPT_HF;
    char n[256];
    snprintf(n, sizeof n, "%sembed_tokens", b.prefix);
    if (bind_mat(&b, &m->embed, n, 1, c->vocab, c->hidden)) goto fail;
    snprintf(n, sizeof n, "%snorm.weight", b.prefix);
    if (bind_vec(&b, &m->final_norm, n, c->hidden, !b.mlx_naming)) goto fail;
    snprintf(n, sizeof n, "%s.weight", b.lm_head);
    if (c->tie_embeddings && !lookup(&b, n, NULL))
        m->lm_head = m->embed;
    else if (bind_mat(&b, &m->lm_head, b.lm_head, 1, c->vocab, c->hidden))
        goto fail;
    m->layers = xcalloc((size_t)c->n_layers, sizeof *m->layers);
    for (int i = 0; i < c->n_layers; i++) {
        if (bind_layer(&b, i)) goto fail;
        account_layer(m, &m->layers[i]);
    }
    account(m, &m->embed, 1.0 / c->vocab); // one embedding row per token
    account(m, &m->lm_head, 1.0);
    m->active_params -= (double)c->hidden; // the embedding row is a lookup, not a product

    for (int i = 0; i < m->n_files; i++)
        for (int j = 0; j < m->files[i]->n; j++) {
            const struct st_tensor *t = &m->files[i]->tensors[j];
            if (!t->used && !skipped(t->name)) {
                wren_errf(e, "%s: unexpected tensor '%s' (not part of the %s layout wren binds)",
                          m->files[i]->path, t->name, c->model_type);
                goto fail;
            }
        }
    return 0;
fail:
    model_free(m);
    return -1;
}

void model_free(struct model *m) {
    if (m->layers) {
        for (int i = 0; i < m->cfg.n_layers; i++) {
            struct layer *L = &m->layers[i];
            float *vecs[] = {L->input_norm, L->post_norm, L->dn_conv, L->dn_A_log,
                             L->dn_dt_bias, L->dn_norm,   L->q_norm,  L->k_norm};
            for (size_t k = 0; k < sizeof vecs / sizeof vecs[0]; k++) free(vecs[k]);
        }
        free(m->layers);
    }
    free(m->final_norm);
    for (int i = 0; i < m->n_files; i++) st_close(m->files[i]);
    free(m->files);
    free(m->dir);
    memset(m, 0, sizeof *m);
}

void qmat_row_f32(const struct qmat *w, int i, int r, float *out) {
    const uint8_t *row = w->data + (size_t)i * w->mat_stride + (size_t)r * w->row_stride;
    if (w->type == WT_F32) {
        memcpy(out, row, sizeof(float) * (size_t)w->cols);
        return;
    }
    if (w->type == WT_BF16) {
        for (int j = 0; j < w->cols; j++) {
            uint16_t h;
            memcpy(&h, row + 2 * (size_t)j, 2);
            out[j] = bf16_to_f32(h);
        }
        return;
    }
    size_t sb = (size_t)i * w->sb_mat_stride + (size_t)r * w->sb_row_stride;
    int per_word = 32 / w->bits;
    uint32_t mask = (1u << w->bits) - 1;
    for (int g = 0; g < w->cols / w->group; g++) {
        uint16_t hs, hb;
        memcpy(&hs, w->scales + sb + 2 * (size_t)g, 2);
        memcpy(&hb, w->biases + sb + 2 * (size_t)g, 2);
        float s = bf16_to_f32(hs), bias = bf16_to_f32(hb);
        for (int j = g * w->group; j < (g + 1) * w->group; j++) {
            uint32_t word;
            memcpy(&word, row + 4 * (size_t)(j / per_word), 4);
            out[j] = s * (float)((word >> (w->bits * (j % per_word))) & mask) + bias;
        }
    }
}
