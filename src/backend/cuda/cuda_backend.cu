// The CUDA backend: device selection, one-time weight upload, per-sequence state, forward (n == 1:
// the decode step replayed as a CUDA graph; n > 1: cuda_prefill), generate (decode step + GPU
// sampler captured once per state and sampler config, replayed per token, host reading tokens a
// step behind through a mapped ring), and device-side snapshots.
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/decode.cuh"

extern "C" {
#include "util/util.h"
}

#define RING_N 8

struct bstate {
    struct cuda_state st;      // first: cuda_prefill and the decode step see only this
    void *block;               // one allocation: KV caches, conv and ssm states, logits
    size_t rec_off, rec_bytes; // conv + ssm + logits region (contiguous) within block
    cudaGraphExec_t fwd, gen;
    struct sampler_params gen_p;
};

struct bsnap {
    int pos;
    bool with_kv;
    void *dev;
    size_t bytes;
};

struct cuda_backend {
    struct backend b;
    struct cuda_ctx cx;
    struct decode_ws ws;
    void **allocs;
    int n_allocs, cap_allocs;
    cudaEvent_t ev[RING_N];
    size_t state_bytes_peak, state_bytes_now;
    bool kv_int8;    // states cache K/V as int8 rows (kv_int8.cuh)
    bool one_sample; // WREN_CUDA_DECODE=onesample: the one-block sampler for every sampled call
};

static struct cuda_backend *cb_of(struct backend *b) {
    return (struct cuda_backend *)b;
}
static struct cuda_backend *cb_of_ctx(struct cuda_ctx *cx) {
    return (struct cuda_backend *)((char *)cx - offsetof(struct cuda_backend, cx));
}

extern "C" int cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // no driver or no device: clear the sticky error, report none
        return 0;
    }
    return n;
}

static int dalloc(struct cuda_backend *cb, size_t n, void **out, struct wren_err *e) {
    void *p = NULL;
    cudaError_t rc = cudaMalloc(&p, n ? n : 16);
    if (rc != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot); // for the message only: 0 if it fails too
        cudaGetLastError();        // after both: the next launch check must not see either
        return wren_errf(e, "out of GPU memory allocating %.1f MiB (%.1f MiB free of %.1f MiB)",
                         n / 1048576.0, fr / 1048576.0, tot / 1048576.0);
    }
    if (cb->n_allocs == cb->cap_allocs) {
        cb->cap_allocs = cb->cap_allocs ? 2 * cb->cap_allocs : 256;
        cb->allocs = (void **)xrealloc(cb->allocs, cb->cap_allocs * sizeof(void *));
    }
    cb->allocs[cb->n_allocs++] = p;
    *out = p;
    return 0;
}

// ---- weight upload ---------------------------------------------------------------------------
struct upload {
    size_t done, total;
};

static int put(struct cuda_backend *cb, void *dst, const void *src, size_t n, struct upload *u,
               struct wren_err *e) {
    const size_t step = 64u << 20;
    for (size_t o = 0; o < n; o += step) {
        size_t k = n - o < step ? n - o : step;
        CUDA_CHECK(cudaMemcpy((char *)dst + o, (const char *)src + o, k, cudaMemcpyHostToDevice));
        u->done += k;
        progress("uploading weights", u->done, u->total);
    }
    (void)cb;
    return 0;
}

static size_t qmat_dev_bytes(const struct qmat *q) {
    if (q->rows == 0 || q->n == 0) return 0;
    size_t n = (size_t)q->n * q->rows * q->row_stride;
    if (q->type == WT_Q4 || q->type == WT_Q8) n += 2 * (size_t)q->n * q->rows * q->sb_row_stride;
    return n;
}

// Copies a stack of matrices into a dense device layout (matrix i at i * rows * row_stride).
static int up_region(struct cuda_backend *cb, const uint8_t *src, size_t mat_stride, size_t per,
                     int n, uint8_t **out, struct upload *u, struct wren_err *e) {
    void *d;
    if (dalloc(cb, per * n, &d, e)) return -1;
    if (mat_stride == per || n == 1) {
        if (put(cb, d, src, per * n, u, e)) return -1;
    } else {
        for (int i = 0; i < n; i++)
            if (put(cb, (char *)d + per * i, src + mat_stride * i, per, u, e)) return -1;
    }
    *out = (uint8_t *)d;
    return 0;
}

static int up_mat(struct cuda_backend *cb, const struct qmat *q, struct dmat *m, const char *what,
                  struct upload *u, struct wren_err *e) {
    memset(m, 0, sizeof *m);
    m->type = q->type;
    m->n = q->n;
    m->rows = q->rows;
    m->cols = q->cols;
    m->bits = q->bits;
    m->group = q->group;
    if (q->rows == 0 || q->n == 0) return 0;
    if (q->type == WT_F32)
        return wren_errf(e, "%s: f32 matrices are not supported by the CUDA backend", what);
    int bits = dmat_bits(q->type, q->bits);
    if ((q->type == WT_Q4 && q->bits != 4) || (q->type == WT_Q8 && q->bits != 8))
        return wren_errf(e, "%s: quantized type and bit count disagree", what);
    if (q->cols % (128 / bits) || q->row_stride % 16 ||
        (bits != 16 && (q->group < 32 || q->group % 32)))
        return wren_errf(
            e, "%s: %d columns (%d-bit, group %d) do not fit the CUDA kernels' 16-byte chunks",
            what, q->cols, bits, q->group);
    m->row_stride = q->row_stride;
    m->mat_stride = (size_t)q->rows * q->row_stride;
    if (up_region(cb, q->data, q->mat_stride, m->mat_stride, q->n, (uint8_t **)&m->data, u, e))
        return -1;
    // the kernels read 4-bit weights in the device layout (common.cuh); the legacy stream orders
    // the reordering after the copies
    if (bits == 4 && q4_repack((uint8_t *)m->data, m->mat_stride * q->n, 0, e)) return -1;
    if (bits != 16) {
        m->sb_row_stride = q->sb_row_stride;
        m->sb_mat_stride = (size_t)q->rows * q->sb_row_stride;
        if (up_region(cb, q->scales, q->sb_mat_stride, m->sb_mat_stride, q->n,
                      (uint8_t **)&m->scales, u, e) ||
            up_region(cb, q->biases, q->sb_mat_stride, m->sb_mat_stride, q->n,
                      (uint8_t **)&m->biases, u, e))
            return -1;
    }
    return 0;
}

static int up_f32(struct cuda_backend *cb, const float *src, size_t n, const float **out,
                  struct upload *u, struct wren_err *e) {
    *out = NULL;
    if (!src || !n) return 0;
    void *d;
    if (dalloc(cb, n * sizeof(float), &d, e) || put(cb, d, src, n * sizeof(float), u, e)) return -1;
    *out = (const float *)d;
    return 0;
}

static size_t layer_bytes(const struct model_config *c, const struct layer *L) {
    const struct qmat *ms[] = {&L->dn_qkv,   &L->dn_z,     &L->dn_b,     &L->dn_a,    &L->dn_out,
                               &L->q_proj,   &L->k_proj,   &L->v_proj,   &L->o_proj,  &L->router,
                               &L->exp_gate, &L->exp_up,   &L->exp_down, &L->sh_gate, &L->sh_up,
                               &L->sh_down,  &L->sh_gate_w};
    size_t n = 0;
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) n += qmat_dev_bytes(ms[i]);
    (void)c;
    return n;
}

static int upload_model(struct cuda_backend *cb, struct wren_err *e) {
    const struct model *m = cb->b.model;
    const struct model_config *c = &m->cfg;
    struct dmodel *dm = &cb->cx.dm;
    struct upload u = {0, qmat_dev_bytes(&m->embed) +
                              (m->lm_head.data != m->embed.data ? qmat_dev_bytes(&m->lm_head) : 0)};
    for (int l = 0; l < c->n_layers; l++) u.total += layer_bytes(c, &m->layers[l]);
    dm->layers = (struct dlayer *)xcalloc(c->n_layers, sizeof(struct dlayer));
    char what[64];
    if (up_mat(cb, &m->embed, &dm->embed, "embed_tokens", &u, e)) return -1;
    if (m->lm_head.data == m->embed.data)
        dm->lm_head = dm->embed;
    else if (up_mat(cb, &m->lm_head, &dm->lm_head, "lm_head", &u, e))
        return -1;
    if (up_f32(cb, m->final_norm, c->hidden, &dm->final_norm, &u, e)) return -1;
    const int hd = c->head_dim;
    for (int l = 0; l < c->n_layers; l++) {
        const struct layer *L = &m->layers[l];
        struct dlayer *D = &dm->layers[l];
        D->kind = L->kind;
        snprintf(what, sizeof what, "layer %d", l);
#define UPM(f)                                                                                     \
    do {                                                                                           \
        snprintf(what, sizeof what, "layer %d %s", l, #f);                                         \
        if (up_mat(cb, &L->f, &D->f, what, &u, e)) return -1;                                      \
    } while (0)
        if (up_f32(cb, L->input_norm, c->hidden, &D->input_norm, &u, e) ||
            up_f32(cb, L->post_norm, c->hidden, &D->post_norm, &u, e))
            return -1;
        if (L->kind == LAYER_DELTANET) {
            UPM(dn_qkv);
            UPM(dn_z);
            UPM(dn_b);
            UPM(dn_a);
            UPM(dn_out);
            if (up_f32(cb, L->dn_conv, (size_t)cfg_dn_conv_dim(c) * c->conv_kernel, &D->dn_conv, &u,
                       e) ||
                up_f32(cb, L->dn_A_log, c->dn_v_heads, &D->dn_A_log, &u, e) ||
                up_f32(cb, L->dn_dt_bias, c->dn_v_heads, &D->dn_dt_bias, &u, e) ||
                up_f32(cb, L->dn_norm, c->dn_v_dim, &D->dn_norm, &u, e))
                return -1;
        } else {
            UPM(q_proj);
            UPM(k_proj);
            UPM(v_proj);
            UPM(o_proj);
            if (up_f32(cb, L->q_norm, hd, &D->q_norm, &u, e) ||
                up_f32(cb, L->k_norm, hd, &D->k_norm, &u, e))
                return -1;
        }
        UPM(router);
        UPM(exp_gate);
        UPM(exp_up);
        UPM(exp_down);
        UPM(sh_gate);
        UPM(sh_up);
        UPM(sh_down);
        UPM(sh_gate_w);
#undef UPM
        if (c->n_experts > 0 && D->exp_down.rows &&
            (D->exp_gate.type != D->exp_up.type || D->exp_gate.bits != D->exp_up.bits))
            return wren_errf(e, "layer %d: expert gate and up projections differ in format", l);
    }
    progress("uploading weights", u.total, u.total);
    cb->b.device_bytes = u.total;
    return 0;
}

// ---- workspace -------------------------------------------------------------------------------
static int alloc_ws(struct cuda_backend *cb, struct wren_err *e) {
    const struct model_config *c = cb->cx.cfg;
    struct decode_ws *w = &cb->ws;
    const int K = c->n_experts > 0 ? c->top_k : 0;
    const int shi = c->n_experts > 0 ? c->shared_inter : c->dense_inter;
    w->splits = attn_splits(c->n_kv_heads);
    struct {
        void **p;
        size_t n;
    } t[] = {
        {(void **)&w->x, (size_t)c->hidden * 4},
        {(void **)&w->qkv, (size_t)cfg_dn_conv_dim(c) * 4},
        {(void **)&w->z, (size_t)cfg_dn_v_dim(c) * 4},
        {(void **)&w->b, (size_t)c->dn_v_heads * 4},
        {(void **)&w->a, (size_t)c->dn_v_heads * 4},
        {(void **)&w->y, (size_t)cfg_dn_v_dim(c) * 4},
        {(void **)&w->qg, (size_t)c->n_heads * c->head_dim * 2 * 4},
        {(void **)&w->k, (size_t)c->n_kv_heads * c->head_dim * 4},
        {(void **)&w->v, (size_t)c->n_kv_heads * c->head_dim * 4},
        {(void **)&w->q, (size_t)c->n_heads * c->head_dim * 4},
        {(void **)&w->att, (size_t)c->n_heads * c->head_dim * 4},
        {(void **)&w->part, (size_t)w->splits * c->n_heads * (c->head_dim + 2) * 4},
        {(void **)&w->rlog, (size_t)(c->n_experts + 1) * 4},
        {(void **)&w->wts, (size_t)(K + 1) * 4},
        {(void **)&w->act, ((size_t)K * c->expert_inter + shi) * 4},
        {(void **)&w->ids, (size_t)(K + 1) * 4},
        {(void **)&w->dn_tick, (size_t)(c->dn_k_heads > 0 ? c->dn_k_heads : 1) * 4},
        {(void **)&w->qx, gemv_qx_bytes(c->hidden)},
        {(void **)&w->moe_acc, ((size_t)c->hidden + 1) * 8},
        {(void **)&w->moe_ticket, 4},
        {(void **)&w->pos, 4},
        {(void **)&w->step, 4},
        {(void **)&w->tok, 4},
        {(void **)&w->counts, (size_t)c->vocab * 4},
        {(void **)&w->seen, (size_t)c->vocab},
        {(void **)&w->work, sample_work_bytes(c->vocab)},
        {(void **)&w->argmax, 8},
        {(void **)&w->scounter, 4},
        {(void **)&w->lm_sched, 8},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        if (dalloc(cb, t[i].n, t[i].p, e)) return -1;
        CUDA_CHECK(cudaMemset(*t[i].p, 0, t[i].n));
    }
    const float one = 1.f; // dense models: the shared (only) MLP has weight 1
    CUDA_CHECK(cudaMemcpy(w->wts + K, &one, 4, cudaMemcpyHostToDevice));
    w->ring_n = RING_N;
    CUDA_CHECK(cudaHostAlloc((void **)&w->ring, RING_N * sizeof(struct sampled_token),
                             cudaHostAllocMapped));
    CUDA_CHECK(cudaHostGetDevicePointer((void **)&w->ring_dev, w->ring, 0));
    for (int i = 0; i < RING_N; i++)
        CUDA_CHECK(cudaEventCreateWithFlags(&cb->ev[i], cudaEventDisableTiming));
    return 0;
}

// ---- state ------------------------------------------------------------------------------------
// For the entry points that return a pointer (the others call CUDA_CHECK(cudaSetDevice) directly):
// they may run on threads other than the creator's.
static int use_device(struct cuda_backend *cb, struct wren_err *e) {
    CUDA_CHECK(cudaSetDevice(cb->cx.device));
    return 0;
}

static struct bstate *cuda_state_new(struct backend *b, int max_ctx, struct wren_err *e) {
    struct cuda_backend *cb = cb_of(b);
    if (use_device(cb, e)) return NULL;
    const struct model_config *c = cb->cx.cfg;
    if (max_ctx < 1) {
        wren_errf(e, "context size %d is not positive", max_ctx);
        return NULL;
    }
    struct bstate *s = (struct bstate *)xcalloc(1, sizeof *s);
    struct cuda_state *st = &s->st;
    st->max_ctx = max_ctx;
    st->n_attn = cfg_n_attn_layers(c);
    st->n_dn = c->n_layers - st->n_attn;
    st->kv_int8 = cb->kv_int8;
    st->kv_row = kv_row_bytes(c->n_kv_heads, c->head_dim, st->kv_int8);
    const size_t kv = (size_t)max_ctx * st->kv_row;
    const size_t conv = (size_t)cfg_dn_conv_dim(c) * (c->conv_kernel - 1) * 4;
    const size_t ssm = (size_t)c->dn_v_heads * c->dn_k_dim * c->dn_v_dim * 4;
    const size_t al = 256;
    auto up = [&](size_t n) { return (n + al - 1) / al * al; };
    size_t off = 0;
    const size_t kv_off = off;
    off += 2 * st->n_attn * up(kv);
    s->rec_off = off;
    const size_t conv_off = off;
    off += st->n_dn * up(conv);
    const size_t ssm_off = off;
    off += st->n_dn * up(ssm);
    const size_t log_off = off;
    off += up((size_t)c->vocab * 4);
    s->rec_bytes = off - s->rec_off;
    cudaError_t rc = cudaMalloc(&s->block, off);
    if (rc != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot); // for the message only: 0 if it fails too
        cudaGetLastError();        // after both: the next launch check must not see either
        wren_errf(e, "out of GPU memory for a %d-token context: needs %.1f MiB, %.1f MiB free",
                  max_ctx, off / 1048576.0, fr / 1048576.0);
        free(s);
        return NULL;
    }
    rc = cudaMemsetAsync(s->block, 0, off, cb->cx.stream);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        wren_errf(e, "clearing the state: %s", cudaGetErrorString(rc));
        cudaFree(s->block); // best effort: the error above is the one to report
        free(s);
        return NULL;
    }
    char *base = (char *)s->block;
    st->k_cache = (unsigned char **)xcalloc(st->n_attn + 1, sizeof(unsigned char *));
    st->v_cache = (unsigned char **)xcalloc(st->n_attn + 1, sizeof(unsigned char *));
    st->conv = (float **)xcalloc(st->n_dn + 1, sizeof(float *));
    st->ssm = (float **)xcalloc(st->n_dn + 1, sizeof(float *));
    for (int j = 0; j < st->n_attn; j++) {
        st->k_cache[j] = (unsigned char *)(base + kv_off + (2 * j) * up(kv));
        st->v_cache[j] = (unsigned char *)(base + kv_off + (2 * j + 1) * up(kv));
    }
    for (int j = 0; j < st->n_dn; j++) {
        st->conv[j] = (float *)(base + conv_off + j * up(conv));
        st->ssm[j] = (float *)(base + ssm_off + j * up(ssm));
    }
    st->logits = (float *)(base + log_off);
    cb->state_bytes_now += off;
    if (cb->state_bytes_now > cb->state_bytes_peak) cb->state_bytes_peak = cb->state_bytes_now;
    return s;
}

// Results ignored here and in the other release paths: they cannot report, and a failure leaves at
// worst a leak on a device already in error.
static void cuda_state_free(struct backend *b, struct bstate *s) {
    if (s) cudaSetDevice(cb_of(b)->cx.device);
    if (!s) return;
    struct cuda_backend *cb = cb_of(b);
    cudaStreamSynchronize(cb->cx.stream);
    if (s->fwd) cudaGraphExecDestroy(s->fwd);
    if (s->gen) cudaGraphExecDestroy(s->gen);
    cudaFree(s->block);
    free(s->st.k_cache);
    free(s->st.v_cache);
    free(s->st.conv);
    free(s->st.ssm);
    cb->state_bytes_now -= s->rec_off + s->rec_bytes;
    free(s);
}

// ---- graphs -----------------------------------------------------------------------------------
static int capture(struct cuda_backend *cb, struct bstate *s, const struct sample_params *sp,
                   cudaGraphExec_t *out, struct wren_err *e) {
    cudaStream_t st = cb->cx.stream;
    cudaGraph_t g = NULL;
    CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    int rc = decode_enqueue(&cb->cx, &cb->ws, &s->st, e);
    if (!rc && sp) rc = sample_launch(sp, st, e);
    cudaError_t ce = cudaStreamEndCapture(st, &g);
    // a failed capture is reported here, not again by the next launch check
    if (ce != cudaSuccess) cudaGetLastError();
    if (rc) {
        if (g) cudaGraphDestroy(g); // only cleanup: the error of the enqueue is already in e
        return -1;
    }
    if (ce != cudaSuccess)
        return wren_errf(e, "capturing the decode step: %s", cudaGetErrorString(ce));
    ce = cudaGraphInstantiate(out, g, 0);
    cudaGraphDestroy(g); // the instantiated graph no longer needs it; nothing to report
    if (ce != cudaSuccess) {
        cudaGetLastError();
        return wren_errf(e, "instantiating the decode graph: %s", cudaGetErrorString(ce));
    }
    return 0;
}

// One decode step at position pos for token tok (enqueued, not synchronized).
int cuda_decode_token(struct cuda_ctx *cx, struct cuda_state *st, int pos, int32_t tok,
                      struct wren_err *e) {
    struct cuda_backend *cb = cb_of_ctx(cx);
    struct bstate *s = (struct bstate *)st;
    if (pos < 0 || pos >= st->max_ctx)
        return wren_errf(e, "position %d is outside the state's context of %d tokens", pos,
                         st->max_ctx);
    if (tok < 0 || tok >= cx->cfg->vocab)
        return wren_errf(e, "token id %d is outside the vocabulary (%d)", tok, cx->cfg->vocab);
    if (!s->fwd && capture(cb, s, NULL, &s->fwd, e)) return -1;
    if (decode_set_pos_tok(&cb->ws, pos, tok, cx->stream, e)) return -1;
    CUDA_CHECK(cudaGraphLaunch(s->fwd, cx->stream));
    return 0;
}

// Chunks of fewer tokens run through the decode step, token by token. Measured on an H200 with
// Qwen3.6-35B-A3B (bench/RESULTS.md): a prefill call costs ~13 ms + 0.35 ms per token at these
// sizes (its fixed launch sequence), a decode step ~2.1 ms, so they cross near 8 tokens; the decode
// path is also the closer one to the f32 reference (no bf16 activations).
#define PREFILL_MIN_TOKENS 8

static int cuda_forward(struct backend *b, struct bstate *s, int pos, const int32_t *tokens, int n,
                        float *logits, bool all_logits, struct wren_err *e) {
    CUDA_CHECK(cudaSetDevice(cb_of(b)->cx.device));
    struct cuda_backend *cb = cb_of(b);
    struct cuda_ctx *cx = &cb->cx;
    if (n < 1 || n > b->max_chunk)
        return wren_errf(e, "forward of %d tokens (1..%d)", n, b->max_chunk);
    if (pos < 0 || pos + n > s->st.max_ctx)
        return wren_errf(e, "positions %d..%d exceed the context of %d tokens", pos, pos + n - 1,
                         s->st.max_ctx);
    if (n >= PREFILL_MIN_TOKENS)
        return cuda_prefill(cx, &s->st, pos, tokens, n, logits, all_logits, e);
    const size_t V = (size_t)cx->cfg->vocab;
    for (int i = 0; i < n; i++) {
        if (cuda_decode_token(cx, &s->st, pos + i, tokens[i], e)) return -1;
        if (logits && (all_logits || i == n - 1))
            CUDA_CHECK(cudaMemcpyAsync(logits + (all_logits ? i * V : 0), s->st.logits, V * 4,
                                       cudaMemcpyDeviceToHost, cx->stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(cx->stream));
    return 0;
}

// ---- generate ---------------------------------------------------------------------------------
static void fill_sample_params(struct cuda_backend *cb, struct bstate *s,
                               const struct sampler_params *p, int advance,
                               struct sample_params *sp) {
    struct decode_ws *w = &cb->ws;
    memset(sp, 0, sizeof *sp);
    sp->logits = s->st.logits;
    sp->n_vocab = p->n_vocab > 0 && p->n_vocab < cb->cx.cfg->vocab ? p->n_vocab : cb->cx.cfg->vocab;
    sp->temperature = p->temperature;
    sp->top_p = p->top_p;
    sp->min_p = p->min_p;
    sp->presence = p->presence_penalty;
    sp->frequency = p->frequency_penalty;
    sp->repetition = p->repetition_penalty > 0.f ? p->repetition_penalty : 1.f;
    sp->top_k = p->top_k;
    sp->n_logprobs = p->n_logprobs;
    sp->seed = p->seed;
    sp->one_block = cb->one_sample;
    sp->counts = w->counts;
    sp->seen = w->seen;
    sp->work = w->work;
    sp->argmax = w->argmax;
    sp->counter = w->scounter;
    sp->tok_out = w->tok;
    sp->step = w->step;
    sp->pos = w->pos;
    sp->advance_pos = advance;
    sp->ring = w->ring_dev;
    sp->ring_n = w->ring_n;
}

// Field by field: the struct has padding, which memcmp would compare too.
static bool same_sampler(const struct sampler_params *a, const struct sampler_params *b) {
    return a->temperature == b->temperature && a->top_k == b->top_k && a->top_p == b->top_p &&
           a->min_p == b->min_p && a->presence_penalty == b->presence_penalty &&
           a->frequency_penalty == b->frequency_penalty &&
           a->repetition_penalty == b->repetition_penalty && a->seed == b->seed &&
           a->n_vocab == b->n_vocab && a->n_logprobs == b->n_logprobs;
}

static int cuda_generate(struct backend *b, struct bstate *s, int pos,
                         const struct sampler_params *p, const int32_t *history, int n_history,
                         int max_new, gen_token_cb cb_fn, void *ud, int *n_generated, int *fed,
                         struct wren_err *e) {
    CUDA_CHECK(cudaSetDevice(cb_of(b)->cx.device));
    struct cuda_backend *cb = cb_of(b);
    struct cuda_ctx *cx = &cb->cx;
    struct decode_ws *w = &cb->ws;
    const int vocab = cx->cfg->vocab;
    *n_generated = 0;
    *fed = 0;
    if (max_new <= 0) return 0;
    if (pos < 0 || pos >= s->st.max_ctx)
        return wren_errf(e, "position %d is outside the context", pos);
    // every token fed must fit: the last sampled token is not fed when max_new is reached
    if (pos + max_new - 1 > s->st.max_ctx) max_new = s->st.max_ctx - pos + 1;
    if (!s->gen || !same_sampler(&s->gen_p, p)) {
        // release only: a failure cannot be acted on, and the graph is replaced either way
        if (s->gen) cudaGraphExecDestroy(s->gen), s->gen = NULL;
        struct sample_params sp;
        fill_sample_params(cb, s, p, 1, &sp);
        if (capture(cb, s, &sp, &s->gen, e)) return -1;
        s->gen_p = *p;
    }
    // penalty state: seen = history (repetition), counts = generated in this call
    CUDA_CHECK(cudaMemsetAsync(w->counts, 0, (size_t)vocab * 4, cx->stream));
    if (p->repetition_penalty != 1.f && p->repetition_penalty > 0.f) {
        uint8_t *h = (uint8_t *)xcalloc(vocab, 1);
        for (int i = 0; i < n_history; i++)
            if (history[i] >= 0 && history[i] < vocab) h[history[i]] = 1;
        // on the backend's stream (non-blocking: the legacy stream would not order against it)
        cudaError_t rc = cudaMemcpyAsync(w->seen, h, vocab, cudaMemcpyHostToDevice, cx->stream);
        if (rc == cudaSuccess) rc = cudaStreamSynchronize(cx->stream);
        free(h);
        CUDA_CHECK(rc);
    } else {
        CUDA_CHECK(cudaMemsetAsync(w->seen, 0, vocab, cx->stream));
    }
    if (decode_set_pos_tok(w, pos, -1, cx->stream, e)) return -1;
    CUDA_CHECK(cudaMemsetAsync(w->step, 0, 4, cx->stream));
    struct sample_params first;
    fill_sample_params(cb, s, p, 0, &first);
    if (sample_launch(&first, cx->stream, e)) return -1;
    CUDA_CHECK(cudaEventRecord(cb->ev[0], cx->stream));
    int launched = 1, got = 0, rc = 0;
    for (;;) {
        // run one step ahead: feed the token not yet read while the host handles the previous one
        if (launched < max_new) {
            // a failure still reports the tokens read so far (and waits for the steps in flight)
            cudaError_t le = cudaGraphLaunch(s->gen, cx->stream);
            if (le == cudaSuccess) {
                le = cudaEventRecord(cb->ev[launched % RING_N], cx->stream);
                launched++;
            }
            if (le != cudaSuccess) {
                cudaGetLastError();
                rc = wren_errf(e, "decode step launch failed: %s", cudaGetErrorString(le));
                break;
            }
        }
        cudaError_t ce = cudaEventSynchronize(cb->ev[got % RING_N]);
        if (ce != cudaSuccess) {
            rc = wren_errf(e, "decode step failed: %s", cudaGetErrorString(ce));
            break;
        }
        struct sampled_token t = w->ring[got % RING_N];
        got++;
        int stop = cb_fn ? cb_fn(ud, &t) : 0;
        if (stop || got >= max_new) break;
    }
    cudaError_t ce = cudaStreamSynchronize(cx->stream);
    if (!rc && ce != cudaSuccess)
        rc = wren_errf(e, "decode step failed: %s", cudaGetErrorString(ce));
    *n_generated = got;
    *fed = launched - 1 < got ? launched - 1 : got;
    return rc;
}

// ---- snapshots --------------------------------------------------------------------------------
static struct bsnap *cuda_snap_save(struct backend *b, struct bstate *s, int pos, bool with_kv,
                                    struct wren_err *e) {
    struct cuda_backend *cb = cb_of(b);
    if (use_device(cb, e)) return NULL;
    const size_t row = s->st.kv_row;
    if (pos < 0 || pos > s->st.max_ctx) {
        wren_errf(e, "snapshot position %d outside the context", pos);
        return NULL;
    }
    struct bsnap *sn = (struct bsnap *)xcalloc(1, sizeof *sn);
    sn->pos = pos;
    sn->with_kv = with_kv;
    sn->bytes = s->rec_bytes + (with_kv ? 2 * (size_t)s->st.n_attn * pos * row : 0);
    cudaStream_t st = cb->cx.stream;
    if (cudaMalloc(&sn->dev, sn->bytes) != cudaSuccess) {
        cudaGetLastError();
        wren_errf(e, "out of GPU memory for a %.1f MiB snapshot", sn->bytes / 1048576.0);
        free(sn);
        return NULL;
    }
    char *d = (char *)sn->dev;
    cudaError_t rc = cudaMemcpyAsync(d, (char *)s->block + s->rec_off, s->rec_bytes,
                                     cudaMemcpyDeviceToDevice, st);
    size_t o = s->rec_bytes;
    for (int j = 0; with_kv && j < s->st.n_attn && rc == cudaSuccess; j++) {
        rc = cudaMemcpyAsync(d + o, s->st.k_cache[j], pos * row, cudaMemcpyDeviceToDevice, st);
        o += pos * row;
        if (rc == cudaSuccess)
            rc = cudaMemcpyAsync(d + o, s->st.v_cache[j], pos * row, cudaMemcpyDeviceToDevice, st);
        o += pos * row;
    }
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(st);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        wren_errf(e, "saving a snapshot: %s", cudaGetErrorString(rc));
        cudaFree(sn->dev); // best effort: the copy's error is the one to report
        free(sn);
        return NULL;
    }
    return sn;
}

static int cuda_snap_restore(struct backend *b, struct bstate *s, const struct bsnap *sn,
                             struct wren_err *e) {
    CUDA_CHECK(cudaSetDevice(cb_of(b)->cx.device));
    struct cuda_backend *cb = cb_of(b);
    const size_t row = s->st.kv_row;
    if (sn->pos > s->st.max_ctx)
        return wren_errf(e, "snapshot of %d tokens does not fit this state", sn->pos);
    cudaStream_t st = cb->cx.stream;
    char *d = (char *)sn->dev;
    CUDA_CHECK(cudaMemcpyAsync((char *)s->block + s->rec_off, d, s->rec_bytes,
                               cudaMemcpyDeviceToDevice, st));
    size_t o = s->rec_bytes;
    for (int j = 0; sn->with_kv && j < s->st.n_attn; j++) {
        CUDA_CHECK(
            cudaMemcpyAsync(s->st.k_cache[j], d + o, sn->pos * row, cudaMemcpyDeviceToDevice, st));
        o += sn->pos * row;
        CUDA_CHECK(
            cudaMemcpyAsync(s->st.v_cache[j], d + o, sn->pos * row, cudaMemcpyDeviceToDevice, st));
        o += sn->pos * row;
    }
    CUDA_CHECK(cudaStreamSynchronize(st));
    return 0;
}

static size_t cuda_snap_bytes(const struct bsnap *sn) {
    return sn ? sn->bytes : 0;
}

// Release path: results ignored (see cuda_state_free).
static void cuda_snap_free(struct backend *b, struct bsnap *sn) {
    if (sn) cudaSetDevice(cb_of(b)->cx.device);
    if (!sn) return;
    cudaFree(sn->dev);
    free(sn);
}

// ---- lifetime ---------------------------------------------------------------------------------
// Teardown: CUDA results are ignored (nothing can be reported; see cuda_state_free).
static void cuda_destroy(struct backend *b) {
    if (!b) return;
    struct cuda_backend *cb = cb_of(b);
    cudaSetDevice(cb->cx.device);
    if (cb->cx.stream) cudaStreamSynchronize(cb->cx.stream);
    cuda_prefill_free(&cb->cx);
    for (int i = 0; i < cb->n_allocs; i++) cudaFree(cb->allocs[i]);
    free(cb->allocs);
    for (int i = 0; i < RING_N; i++)
        if (cb->ev[i]) cudaEventDestroy(cb->ev[i]);
    if (cb->ws.ring) cudaFreeHost(cb->ws.ring);
    if (cb->cx.stream) cudaStreamDestroy(cb->cx.stream);
    free(cb->cx.dm.layers);
    if (progress_enabled() && (cb->state_bytes_peak || b->device_bytes)) {
        // peak memory of this run, for benchmarks and capacity planning
        fprintf(stderr, "cuda: weights %.2f GiB, peak state %.2f GiB\n",
                b->device_bytes / 1073741824.0, cb->state_bytes_peak / 1073741824.0);
    }
    free(cb);
}

static int cuda_read_logits(struct backend *b, struct bstate *s, float *out, struct wren_err *e) {
    CUDA_CHECK(cudaSetDevice(cb_of(b)->cx.device));
    struct cuda_backend *cb = cb_of(b);
    CUDA_CHECK(cudaMemcpyAsync(out, s->st.logits, (size_t)cb->cx.cfg->vocab * 4,
                               cudaMemcpyDeviceToHost, cb->cx.stream));
    CUDA_CHECK(cudaStreamSynchronize(cb->cx.stream));
    return 0;
}

static struct backend_ops make_ops(void) {
    struct backend_ops o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.destroy = cuda_destroy;
    o.state_new = cuda_state_new;
    o.state_free = cuda_state_free;
    o.forward = cuda_forward;
    o.read_logits = cuda_read_logits;
    o.generate = cuda_generate;
    o.snap_save = cuda_snap_save;
    o.snap_restore = cuda_snap_restore;
    o.snap_bytes = cuda_snap_bytes;
    o.snap_free = cuda_snap_free;
    return o;
}
static const struct backend_ops cuda_ops = make_ops();

extern "C" struct backend *cuda_backend_create(const struct model *m, const struct backend_opts *o,
                                               struct wren_err *e) {
    int ndev = cuda_device_count();
    if (ndev <= 0) {
        wren_errf(e, "no CUDA device is available (driver missing or no GPU)");
        return NULL;
    }
    int dev = o ? o->device : 0;
    if (dev < 0 || dev >= ndev) {
        wren_errf(e, "GPU %d does not exist (%d available)", dev, ndev);
        return NULL;
    }
    struct cuda_backend *cb = (struct cuda_backend *)xcalloc(1, sizeof *cb);
    cb->b.ops = &cuda_ops;
    cb->b.model = m;
    cb->kv_int8 = o && o->kv_int8;
    // int8: a code per element and an f32 scale per KV_INT8_GROUP of them
    cb->b.kv_elem_bytes = cb->kv_int8 ? 1.0 + 4.0 / KV_INT8_GROUP : 2.0;
    cb->cx.model = m;
    cb->cx.cfg = &m->cfg;
    cb->cx.device = dev;
    cudaDeviceProp prop;
    double t0 = now_sec();
    if (cudaSetDevice(dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        cudaGetLastError();
        wren_errf(e, "cannot open GPU %d", dev);
        free(cb);
        return NULL;
    }
    cb->cx.sm_count = prop.multiProcessorCount;
    cb->cx.cc_major = prop.major;
    cb->cx.cc_minor = prop.minor;
    cb->cx.l2_bytes = prop.l2CacheSize;
    cb->cx.smem_optin = prop.sharedMemPerBlockOptin;
    // WREN_CUDA_SMEM=BYTES (read once here): use at most that much shared memory per block, so
    // that a large GPU takes the kernel shapes of one with less (99 KB on consumer GPUs)
    const char *smem_cap = getenv("WREN_CUDA_SMEM");
    if (smem_cap && *smem_cap) {
        char *end = NULL;
        const long long v = strtoll(smem_cap, &end, 10);
        if (*end || v < 96 * 1024) {
            wren_errf(e, "WREN_CUDA_SMEM=%s: expected a byte count of at least 98304 (96 KiB)",
                      smem_cap);
            free(cb);
            return NULL;
        }
        if ((size_t)v < cb->cx.smem_optin) cb->cx.smem_optin = (size_t)v;
    }
    if (prop.major < 8) {
        wren_errf(e, "GPU %d (%s) has compute capability %d.%d; wren needs 8.0 or newer", dev,
                  prop.name, prop.major, prop.minor);
        free(cb);
        return NULL;
    }
    // WREN_CUDA_DECODE (read once here, for comparison runs): "nopdl", "f32gemv", "dnslices",
    // "nostream", "nosplit", "onesample", "fusemoe" (the MoE experts in one launch: opt-in, slower)
    const char *dflags = getenv("WREN_CUDA_DECODE");
    cb->one_sample = dflags && strstr(dflags, "onesample");
    struct decode_config dc;
    dc.sm_count = prop.multiProcessorCount;
    dc.smem_optin = cb->cx.smem_optin;
    dc.pdl = prop.major >= 9 && !(dflags && strstr(dflags, "nopdl"));
    dc.f32_gemv = dflags && strstr(dflags, "f32gemv");
    dc.dn_slices = dflags && strstr(dflags, "dnslices");
    dc.cc_major = prop.major;
    dc.no_stream = dflags && strstr(dflags, "nostream");
    dc.no_split = dflags && strstr(dflags, "nosplit");
    dc.fuse_moe = dflags && strstr(dflags, "fusemoe");
    decode_configure(&dc);
    const struct model_config *c = &m->cfg;
    int K = c->n_experts > 0 ? c->top_k : 0;
    if (K + 1 > GEMV_MAXSEG || c->n_experts > ROUTE_MAX_EXPERTS) {
        wren_errf(e,
                  "%d experts with top-%d is beyond the CUDA decode kernels (at most %d, top-%d)",
                  c->n_experts, K, ROUTE_MAX_EXPERTS, GEMV_MAXSEG - 1);
        free(cb);
        return NULL;
    }
    if (cb->kv_int8 && !attn_int8_ok(c->head_dim, c->n_heads, c->n_kv_heads)) {
        wren_errf(e,
                  "--kv-cache int8: the CUDA attention kernels need head_dim 256 and at most 16 "
                  "query heads per KV head (this model: %d, %d / %d)",
                  c->head_dim, c->n_heads, c->n_kv_heads);
        free(cb);
        return NULL;
    }
    if (cudaStreamCreateWithFlags(&cb->cx.stream, cudaStreamNonBlocking) != cudaSuccess) {
        cudaGetLastError();
        wren_errf(e, "cannot create a CUDA stream");
        free(cb);
        return NULL;
    }
    if (upload_model(cb, e) || alloc_ws(cb, e)) {
        wren_err_prefix(e, "CUDA backend: ");
        cuda_destroy(&cb->b);
        return NULL;
    }
    // the uploads and memsets ran on the legacy stream, which the backend's non-blocking stream
    // does not wait for
    if (cudaDeviceSynchronize() != cudaSuccess) {
        wren_errf(e, "CUDA backend: initialisation failed: %s",
                  cudaGetErrorString(cudaGetLastError()));
        cuda_destroy(&cb->b);
        return NULL;
    }
    // default prefill chunk: 8192 tokens where the memory left after the weights allows its
    // workspace (~2.4 GB on Qwen3.6-35B-A3B) beside long contexts (measured: 5-13% faster than
    // 4096 from 8K-token prompts on; bench/RESULTS.md), else 4096 (24 GB cards)
    size_t mem_free = 0, mem_total = 0;
    if (cudaMemGetInfo(&mem_free, &mem_total) != cudaSuccess) cudaGetLastError();
    cb->b.max_chunk = o && o->prefill_chunk > 0      ? o->prefill_chunk
                      : mem_free >= (size_t)16 << 30 ? 8192
                                                     : 4096;
    if (progress_enabled())
        fprintf(stderr, "cuda: %s (%d SMs, %.0f MB L2), %.2f GiB of weights uploaded in %.1f s\n",
                prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6,
                cb->b.device_bytes / 1073741824.0, now_sec() - t0);
    return &cb->b;
}

// Benchmarks: one decode step at pos run without a graph, with an event pair around every launcher;
// ms[c] gets the summed time of category c (DP_*) and *total the whole step.
int cuda_profile_step(struct backend *b, struct bstate *s, int pos, double *ms, double *total,
                      struct wren_err *e) {
    struct cuda_backend *cb = cb_of(b);
    struct cuda_ctx *cx = &cb->cx;
    static struct decode_prof prof;
    for (int c = 0; c < DP_N; c++) ms[c] = 0;
    if (decode_set_pos_tok(&cb->ws, pos, 0, cx->stream, e)) return -1;
    prof.n = 0;
    decode_profile_set(&prof);
    int rc = decode_enqueue(cx, &cb->ws, &s->st, e);
    decode_profile_set(NULL);
    if (rc) return -1;
    CUDA_CHECK(cudaStreamSynchronize(cx->stream));
    for (int i = 0; i + 1 < prof.n; i++) {
        if (prof.cat[i] < 0) continue;
        float t = 0;
        CUDA_CHECK(cudaEventElapsedTime(&t, prof.ev[i], prof.ev[i + 1]));
        ms[prof.cat[i]] += t;
    }
    float t = 0;
    if (prof.n > 1) CUDA_CHECK(cudaEventElapsedTime(&t, prof.ev[0], prof.ev[prof.n - 1]));
    *total = t;
    return 0;
}
