// The CPU reference backend: forward() reads like the model — embed, then per layer
// x += mixer(rmsnorm(x)); x += moe(rmsnorm(x)), then the final norm and lm_head.
#include <stdlib.h>
#include <string.h>

#include "backend/kv_int8.h"
#include "backend/cpu/cpu.h"
#include "util/util.h"

static const struct backend_ops cpu_ops;

static struct cpu_backend *cpu(struct backend *b) {
    return (struct cpu_backend *)b;
}

static struct bstate *cpu_state_new(struct backend *b, int max_ctx, struct wren_err *e) {
    (void)e;
    const struct model_config *c = &b->model->cfg;
    int n_attn = cfg_n_attn_layers(c), n_dn = c->n_layers - n_attn;
    struct cpu_state *st = xcalloc(1, sizeof *st);
    st->max_ctx = max_ctx;
    st->k = xcalloc((size_t)n_attn + 1, sizeof(float *));
    st->v = xcalloc((size_t)n_attn + 1, sizeof(float *));
    st->conv = xcalloc((size_t)n_dn + 1, sizeof(float *));
    st->ssm = xcalloc((size_t)n_dn + 1, sizeof(float *));
    for (int i = 0; i < n_dn; i++) {
        st->conv[i] =
            xcalloc((size_t)cfg_dn_conv_dim(c) * (size_t)(c->conv_kernel - 1) + 1, sizeof(float));
        st->ssm[i] = xcalloc((size_t)c->dn_v_heads * c->dn_k_dim * c->dn_v_dim, sizeof(float));
    }
    st->logits = xcalloc((size_t)c->vocab, sizeof(float));
    return (struct bstate *)st;
}

static void cpu_state_free(struct backend *b, struct bstate *s) {
    struct cpu_state *st = (struct cpu_state *)s;
    if (!st) return;
    const struct model_config *c = &b->model->cfg;
    int n_attn = cfg_n_attn_layers(c), n_dn = c->n_layers - n_attn;
    for (int i = 0; i < n_attn; i++) free(st->k[i]), free(st->v[i]);
    for (int i = 0; i < n_dn; i++) free(st->conv[i]), free(st->ssm[i]);
    free(st->k), free(st->v), free(st->conv), free(st->ssm), free(st->logits), free(st);
}

// Grows the KV caches (doubling) so positions [0, need) fit.
static void kv_reserve(const struct model_config *c, struct cpu_state *st, int need) {
    if (need <= st->kv_cap) return;
    int cap = st->kv_cap ? st->kv_cap : 256;
    while (cap < need) cap *= 2;
    if (cap > st->max_ctx) cap = st->max_ctx;
    size_t row = (size_t)c->n_kv_heads * c->head_dim;
    for (int i = 0; i < cfg_n_attn_layers(c); i++) {
        st->k[i] = xrealloc(st->k[i], sizeof(float) * row * (size_t)cap);
        st->v[i] = xrealloc(st->v[i], sizeof(float) * row * (size_t)cap);
    }
    st->kv_cap = cap;
}

static void embed_rows(const struct model *m, const int32_t *tokens, int n, float *x) {
    for (int t = 0; t < n; t++)
        qmat_row_f32(&m->embed, 0, tokens[t], x + (size_t)t * m->cfg.hidden);
}

static int cpu_forward(struct backend *b, struct bstate *s, int pos, const int32_t *tokens, int n,
                       float *logits, bool all_logits, struct wren_err *e) {
    struct cpu_backend *cb = cpu(b);
    struct cpu_state *st = (struct cpu_state *)s;
    const struct model *m = b->model;
    const struct model_config *c = &m->cfg;
    if (n <= 0) return wren_errf(e, "forward: no tokens");
    if (pos + n > st->max_ctx)
        return wren_errf(e, "context overflow: %d + %d tokens exceed the session's %d", pos, n,
                         st->max_ctx);
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab)
            return wren_errf(e, "token id %d out of range [0, %d)", tokens[t], c->vocab);
    kv_reserve(c, st, pos + n);

    int H = c->hidden;
    float *x = xmalloc(sizeof(float) * (size_t)n * H), *xn = xmalloc(sizeof(float) * (size_t)n * H);
    embed_rows(m, tokens, n, x);
    int rc = 0;
    for (int li = 0; li < c->n_layers && !rc; li++) {
        const struct layer *L = &m->layers[li];
        for (int t = 0; t < n; t++)
            rmsnorm(xn + (size_t)t * H, x + (size_t)t * H, L->input_norm, H, c->rms_eps);
        rc = L->kind == LAYER_DELTANET ? cpu_deltanet(cb, st, li, x, xn, n, e)
                                       : cpu_attention(cb, st, li, x, xn, pos, n, e);
        for (int t = 0; t < n; t++)
            rmsnorm(xn + (size_t)t * H, x + (size_t)t * H, L->post_norm, H, c->rms_eps);
        cpu_moe(cb, li, x, xn, n);
    }
    if (!rc) {
        // lm_head only for the rows that are wanted
        int first = all_logits ? 0 : n - 1, rows = n - first;
        for (int t = first; t < n; t++)
            rmsnorm(xn + (size_t)(t - first) * H, x + (size_t)t * H, m->final_norm, H, c->rms_eps);
        float *out =
            all_logits && logits ? logits : xmalloc(sizeof(float) * (size_t)rows * c->vocab);
        cpu_matmul(cb->tp, &m->lm_head, 0, xn, rows, out, c->vocab);
        memcpy(st->logits, out + (size_t)(rows - 1) * c->vocab, sizeof(float) * (size_t)c->vocab);
        if (logits && !all_logits) memcpy(logits, st->logits, sizeof(float) * (size_t)c->vocab);
        if (out != logits) free(out);
    }
    free(x), free(xn);
    return rc;
}

static int cpu_read_logits(struct backend *b, struct bstate *s, float *out, struct wren_err *e) {
    (void)e;
    memcpy(out, ((struct cpu_state *)s)->logits, sizeof(float) * (size_t)b->model->cfg.vocab);
    return 0;
}

struct cpu_snap {
    int pos, n_dn, n_attn;
    size_t conv_n, ssm_n, kv_row;
    bool with_kv;
    float *data; // conv states, ssm states, then (with_kv) K and V rows [0, pos)
    size_t bytes;
};

static struct bsnap *cpu_snap_save(struct backend *b, struct bstate *s, int pos, bool with_kv,
                                   struct wren_err *e) {
    (void)e;
    const struct model_config *c = &b->model->cfg;
    struct cpu_state *st = (struct cpu_state *)s;
    struct cpu_snap *sn = xcalloc(1, sizeof *sn);
    sn->pos = pos, sn->with_kv = with_kv;
    sn->n_attn = cfg_n_attn_layers(c), sn->n_dn = c->n_layers - sn->n_attn;
    sn->conv_n = (size_t)cfg_dn_conv_dim(c) * (size_t)(c->conv_kernel - 1);
    sn->ssm_n = (size_t)c->dn_v_heads * c->dn_k_dim * c->dn_v_dim;
    sn->kv_row = (size_t)c->n_kv_heads * c->head_dim;
    size_t n = (size_t)sn->n_dn * (sn->conv_n + sn->ssm_n) + c->vocab;
    if (with_kv) n += 2 * (size_t)sn->n_attn * sn->kv_row * (size_t)pos;
    sn->bytes = n * sizeof(float);
    float *p = sn->data = xmalloc(sn->bytes);
    for (int i = 0; i < sn->n_dn; i++) {
        memcpy(p, st->conv[i], sn->conv_n * sizeof(float)), p += sn->conv_n;
        memcpy(p, st->ssm[i], sn->ssm_n * sizeof(float)), p += sn->ssm_n;
    }
    memcpy(p, st->logits, sizeof(float) * (size_t)c->vocab), p += c->vocab;
    if (with_kv)
        for (int i = 0; i < sn->n_attn; i++) {
            memcpy(p, st->k[i], sn->kv_row * (size_t)pos * sizeof(float)), p += sn->kv_row * pos;
            memcpy(p, st->v[i], sn->kv_row * (size_t)pos * sizeof(float)), p += sn->kv_row * pos;
        }
    return (struct bsnap *)sn;
}

static int cpu_snap_restore(struct backend *b, struct bstate *s, const struct bsnap *snap,
                            struct wren_err *e) {
    const struct model_config *c = &b->model->cfg;
    struct cpu_state *st = (struct cpu_state *)s;
    const struct cpu_snap *sn = (const struct cpu_snap *)snap;
    if (sn->pos > st->max_ctx)
        return wren_errf(e, "snapshot of %d tokens does not fit the session (%d)", sn->pos,
                         st->max_ctx);
    if (!sn->with_kv && sn->pos > st->kv_cap)
        return wren_errf(e, "snapshot without KV at position %d, but the session holds %d rows",
                         sn->pos, st->kv_cap);
    const float *p = sn->data;
    for (int i = 0; i < sn->n_dn; i++) {
        memcpy(st->conv[i], p, sn->conv_n * sizeof(float)), p += sn->conv_n;
        memcpy(st->ssm[i], p, sn->ssm_n * sizeof(float)), p += sn->ssm_n;
    }
    memcpy(st->logits, p, sizeof(float) * (size_t)c->vocab), p += c->vocab;
    if (sn->with_kv) {
        kv_reserve(c, st, sn->pos);
        for (int i = 0; i < sn->n_attn; i++) {
            memcpy(st->k[i], p, sn->kv_row * (size_t)sn->pos * sizeof(float)),
                p += sn->kv_row * sn->pos;
            memcpy(st->v[i], p, sn->kv_row * (size_t)sn->pos * sizeof(float)),
                p += sn->kv_row * sn->pos;
        }
    }
    return 0;
}

static size_t cpu_snap_bytes(const struct bsnap *snap) {
    return ((const struct cpu_snap *)snap)->bytes;
}

static void cpu_snap_free(struct backend *b, struct bsnap *snap) {
    (void)b;
    struct cpu_snap *sn = (struct cpu_snap *)snap;
    if (sn) free(sn->data), free(sn);
}

static void cpu_destroy(struct backend *b) {
    struct cpu_backend *cb = cpu(b);
    threadpool_free(cb->tp);
    free(cb->slot);
    free(cb);
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .state_new = cpu_state_new,
    .state_free = cpu_state_free,
    .forward = cpu_forward,
    .read_logits = cpu_read_logits,
    .generate = NULL, // the engine samples on the host
    .snap_save = cpu_snap_save,
    .snap_restore = cpu_snap_restore,
    .snap_bytes = cpu_snap_bytes,
    .snap_free = cpu_snap_free,
};

struct backend *cpu_backend_create(const struct model *m, const struct backend_opts *o,
                                   struct wren_err *e) {
    if (o->kv_int8 && m->cfg.head_dim % KV_INT8_GROUP) {
        wren_errf(e, "--kv-cache int8: head_dim %d is not a multiple of %d", m->cfg.head_dim,
                  KV_INT8_GROUP);
        return NULL;
    }
    struct cpu_backend *cb = xcalloc(1, sizeof *cb);
    cb->base.ops = &cpu_ops;
    cb->base.model = m;
    cb->base.max_chunk = o->prefill_chunk > 0 ? o->prefill_chunk : 256;
    cb->base.kv_elem_bytes = 4;
    cb->kv_int8 = o->kv_int8;
    cb->tp = threadpool_new(o->threads);
    cb->slot = xcalloc((size_t)m->cfg.n_layers, sizeof(int));
    int n_attn = 0, n_dn = 0;
    for (int i = 0; i < m->cfg.n_layers; i++)
        cb->slot[i] = m->cfg.kind[i] == LAYER_ATTENTION ? n_attn++ : n_dn++;
    return &cb->base;
}
