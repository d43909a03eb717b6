// Engine and sessions: a loaded model on one backend, and sequences fed in bounded chunks.
#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "util/util.h"

struct wren_engine {
    struct model model;
    struct backend *be;
    int default_ctx;
};

struct wren_session {
    struct wren_engine *en;
    struct bstate *st;
    int max_ctx;
    int32_t *tokens; // the sequence
    int n, cap;
    int n_state;     // tokens whose effect is in the state: n, or n - 1 after a generation
    bool has_logits; // the state holds the logits of position n_state - 1
    bool broken;     // a reset could not make a fresh state: refuse to compute on the old one
    struct wren_err broken_err;
};

struct wren_snapshot {
    struct wren_engine *en;
    struct bsnap *snap;
    int32_t *tokens;
    int n;
    bool with_kv;
};

struct wren_engine *wren_engine_open(const struct wren_engine_opts *o, struct wren_err *e) {
    if (!o->model_dir) {
        wren_errf(e, "no model directory given (-m DIR)");
        return NULL;
    }
    struct wren_engine *en = xcalloc(1, sizeof *en);
    if (model_load(&en->model, o->model_dir, e)) {
        free(en);
        return NULL;
    }
    struct backend_opts bo = {.name = o->backend,
                              .threads = o->threads,
                              .prefill_chunk = o->prefill_chunk,
                              .device = o->device,
                              .kv_int8 = o->kv_int8};
    en->be = backend_create(&en->model, &bo, e);
    if (!en->be) {
        model_free(&en->model);
        free(en);
        return NULL;
    }
    int max = en->model.cfg.max_position;
    en->default_ctx = o->ctx > 0 ? o->ctx : (max < 32768 ? max : 32768);
    return en;
}

void wren_engine_close(struct wren_engine *en) {
    if (!en) return;
    en->be->ops->destroy(en->be);
    model_free(&en->model);
    free(en);
}

const struct model_config *wren_engine_config(const struct wren_engine *en) {
    return &en->model.cfg;
}
const char *wren_engine_backend(const struct wren_engine *en) {
    return en->be->ops->name;
}
const char *wren_engine_model_dir(const struct wren_engine *en) {
    return en->model.dir;
}
size_t wren_engine_weight_bytes(const struct wren_engine *en) {
    return en->model.weight_bytes;
}

int wren_engine_prefill_chunk(const struct wren_engine *en) {
    return en->be->max_chunk > 0 ? en->be->max_chunk : 1;
}

double wren_engine_decode_bytes(const struct wren_engine *en, int ctx) {
    const struct model_config *c = &en->model.cfg;
    int n_attn = cfg_n_attn_layers(c), n_dn = c->n_layers - n_attn;
    double state = (double)n_dn * c->dn_v_heads * c->dn_k_dim * c->dn_v_dim * 4.0;
    double kv = (double)ctx * n_attn * 2.0 * c->n_kv_heads * c->head_dim * en->be->kv_elem_bytes;
    return (double)en->model.active_bytes + 2.0 * state + kv;
}

double wren_engine_prefill_flops(const struct wren_engine *en, int n) {
    const struct model_config *c = &en->model.cfg;
    // QK^T and PV over the causal triangle: 2 * 2 * head_dim per (query, key) pair and head.
    double attn = 4.0 * c->head_dim * c->n_heads * cfg_n_attn_layers(c) * (double)n * (n + 1) / 2;
    return 2.0 * en->model.active_params * n + attn;
}

struct wren_session *wren_session_new(struct wren_engine *en, int max_ctx, struct wren_err *e) {
    if (max_ctx <= 0) max_ctx = en->default_ctx;
    struct bstate *st = en->be->ops->state_new(en->be, max_ctx, e);
    if (!st) return NULL;
    struct wren_session *s = xcalloc(1, sizeof *s);
    s->en = en, s->st = st, s->max_ctx = max_ctx;
    s->cap = 256;
    s->tokens = xmalloc(sizeof(int32_t) * (size_t)s->cap);
    return s;
}

void wren_session_free(struct wren_session *s) {
    if (!s) return;
    s->en->be->ops->state_free(s->en->be, s->st);
    free(s->tokens), free(s);
}

// Positions only move forward; every backend's state is overwritten as the new sequence is fed
// (KV rows are rewritten, recurrent state restarts from zero through a fresh state object).
void wren_session_reset(struct wren_session *s) {
    struct backend *be = s->en->be;
    struct wren_err e = {0};
    struct bstate *st = be->ops->state_new(be, s->max_ctx, &e);
    if (st) {
        be->ops->state_free(be, s->st);
        s->st = st;
        s->broken = false;
    } else { // keeping the old recurrent state would silently corrupt the next sequence
        s->broken = true;
        s->broken_err = e;
    }
    s->n = s->n_state = 0;
    s->has_logits = false;
}

int wren_session_max_ctx(const struct wren_session *s) {
    return s->max_ctx;
}
int wren_session_len(const struct wren_session *s) {
    return s->n;
}
const int32_t *wren_session_tokens(const struct wren_session *s) {
    return s->tokens;
}

static void append(struct wren_session *s, const int32_t *tok, int n) {
    if (s->n + n > s->cap) {
        while (s->cap < s->n + n) s->cap *= 2;
        s->tokens = xrealloc(s->tokens, sizeof(int32_t) * (size_t)s->cap);
    }
    memcpy(s->tokens + s->n, tok, sizeof(int32_t) * (size_t)n);
    s->n += n;
}

// Runs tokens already appended to s->tokens at [n_state, n_state + n) through the backend.
static int run(struct wren_session *s, int n, float *logits, bool all_logits,
               wren_progress_cb progress, void *ud, struct wren_err *e) {
    struct backend *be = s->en->be;
    int vocab = s->en->model.cfg.vocab, chunk = be->max_chunk > 0 ? be->max_chunk : n;
    for (int done = 0; done < n;) {
        int m = n - done < chunk ? n - done : chunk;
        float *out = NULL;
        if (all_logits && logits)
            out = logits + (size_t)done * vocab;
        else if (done + m == n)
            out = logits;
        if (be->ops->forward(be, s->st, s->n_state, s->tokens + s->n_state, m, out,
                             all_logits && logits, e))
            return -1;
        s->n_state += m;
        s->has_logits = true; // every forward leaves its last position's logits in the state
        done += m;
        if (progress) progress(ud, done, n);
    }
    return 0;
}

// Feeds a generated-but-unfed last token, so the state covers the whole sequence.
static int catch_up(struct wren_session *s, struct wren_err *e) {
    if (s->n_state == s->n) return 0;
    return run(s, s->n - s->n_state, NULL, false, NULL, NULL, e);
}

int wren_session_feed(struct wren_session *s, const int32_t *tokens, int n, float *logits,
                      bool all_logits, wren_progress_cb progress, void *ud, struct wren_err *e) {
    const struct model_config *c = &s->en->model.cfg;
    if (s->broken) return wren_errf(e, "session state could not be reset: %s", s->broken_err.msg);
    if (n <= 0) return wren_errf(e, "nothing to feed");
    if (s->n + n > s->max_ctx)
        return wren_errf(e, "context overflow: %d tokens in the session + %d new exceed its %d",
                         s->n, n, s->max_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab)
            return wren_errf(e, "token id %d out of range [0, %d)", tokens[i], c->vocab);
    if (catch_up(s, e)) return -1;
    append(s, tokens, n);
    if (run(s, n, logits, all_logits, progress, ud, e)) {
        s->n = s->n_state; // keep the sequence consistent with the state
        return -1;
    }
    return 0;
}

struct gen_ctx {
    struct wren_session *s;
    wren_token_cb cb;
    void *ud;
};

static int on_token(void *ud, const struct sampled_token *tok) {
    struct gen_ctx *g = ud;
    append(g->s, &tok->id, 1);
    return g->cb ? g->cb(g->ud, tok) : 0;
}

int wren_session_generate(struct wren_session *s, const struct sampler_params *p, int max_new,
                          wren_token_cb cb, void *ud, int *n_out, struct wren_err *e) {
    struct backend *be = s->en->be;
    *n_out = 0;
    if (s->broken) return wren_errf(e, "session state could not be reset: %s", s->broken_err.msg);
    if (catch_up(s, e)) return -1;
    if (!s->has_logits) return wren_errf(e, "generate: feed a prompt first");
    if (max_new > s->max_ctx - s->n) max_new = s->max_ctx - s->n;
    if (max_new <= 0) return 0;
    struct gen_ctx g = {.s = s, .cb = cb, .ud = ud};
    int start = s->n;
    if (be->ops->generate) {
        int fed = 0, made = 0;
        int rc = be->ops->generate(be, s->st, s->n_state, p, s->tokens, s->n, max_new, on_token, &g,
                                   &made, &fed, e);
        s->n_state += fed;
        *n_out = s->n - start;
        if (s->n_state > s->n) s->n_state = s->n; // defensive: never claim unseen tokens
        return rc;
    }
    int vocab = s->en->model.cfg.vocab;
    struct sampler *sm = sampler_new(p, vocab, s->tokens, s->n);
    float *logits = xmalloc(sizeof(float) * (size_t)vocab);
    int rc = 0;
    for (int i = 0; i < max_new; i++) {
        struct sampled_token tok;
        if ((rc = be->ops->read_logits(be, s->st, logits, e))) break;
        sampler_sample(sm, logits, &tok);
        sampler_accept(sm, tok.id);
        int stop = on_token(&g, &tok);
        if (stop || i + 1 == max_new) break;
        if ((rc = run(s, 1, NULL, false, NULL, NULL, e))) break;
    }
    sampler_free(sm);
    free(logits);
    *n_out = s->n - start;
    return rc;
}

struct wren_snapshot *wren_session_snapshot(struct wren_session *s, bool with_kv,
                                            struct wren_err *e) {
    struct backend *be = s->en->be;
    if (s->broken) {
        wren_errf(e, "session state could not be reset: %s", s->broken_err.msg);
        return NULL;
    }
    if (catch_up(s, e)) return NULL;
    struct bsnap *b = be->ops->snap_save(be, s->st, s->n_state, with_kv, e);
    if (!b) return NULL;
    struct wren_snapshot *sn = xcalloc(1, sizeof *sn);
    sn->en = s->en, sn->snap = b, sn->n = s->n_state, sn->with_kv = with_kv;
    sn->tokens = xmalloc(sizeof(int32_t) * (size_t)(sn->n ? sn->n : 1));
    memcpy(sn->tokens, s->tokens, sizeof(int32_t) * (size_t)sn->n);
    return sn;
}

int wren_session_restore(struct wren_session *s, const struct wren_snapshot *snap,
                         struct wren_err *e) {
    if (snap->en != s->en) return wren_errf(e, "snapshot belongs to another engine");
    if (snap->n > s->max_ctx)
        return wren_errf(e, "snapshot of %d tokens exceeds the session's context %d", snap->n,
                         s->max_ctx);
    // Without KV the snapshot relies on the session's own cache rows [0, n): valid only while the
    // session still holds the snapshot's tokens as a prefix of what its state has seen.
    if (!snap->with_kv && (s->broken || s->n_state < snap->n ||
                           memcmp(s->tokens, snap->tokens, sizeof(int32_t) * (size_t)snap->n)))
        return wren_errf(e,
                         "a snapshot without KV cache can only be restored into a session that "
                         "still holds its %d tokens",
                         snap->n);
    if (s->en->be->ops->snap_restore(s->en->be, s->st, snap->snap, e)) return -1;
    s->broken = false;
    s->n = 0;
    append(s, snap->tokens, snap->n);
    s->n_state = snap->n;
    s->has_logits = snap->n > 0; // snapshots carry the logits of their last position
    return 0;
}

int wren_snapshot_len(const struct wren_snapshot *snap) {
    return snap->n;
}
const int32_t *wren_snapshot_tokens(const struct wren_snapshot *snap) {
    return snap->tokens;
}
size_t wren_snapshot_bytes(const struct wren_snapshot *snap) {
    return snap->en->be->ops->snap_bytes(snap->snap) + sizeof(int32_t) * (size_t)snap->n;
}

void wren_snapshot_free(struct wren_snapshot *snap) {
    if (!snap) return;
    snap->en->be->ops->snap_free(snap->en->be, snap->snap);
    free(snap->tokens), free(snap);
}
