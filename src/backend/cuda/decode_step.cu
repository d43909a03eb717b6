// One batch-1 decode step as a fixed sequence of fused launches (see NOTES.md for the list): per
// DeltaNet layer 3 mixer launches, per attention layer 4 (prep, split, combine counted as one
// launcher), per MoE block 3; then the final norm fused into the lm_head GEMV.
#include "backend/cuda/decode.cuh"

// Profiling mode (off unless decode_profile_set was called; never inside a captured graph): an
// event pair around every launcher, attributed to a category.
static struct decode_prof *g_prof;
void decode_profile_set(struct decode_prof *p) {
    g_prof = p;
}

static int prof_mark(cudaStream_t s, int cat, struct wren_err *e) {
    struct decode_prof *p = g_prof;
    if (!p || p->n >= DPROF_MAX) return 0;
    if (!p->ev[p->n]) CUDA_CHECK(cudaEventCreate(&p->ev[p->n]));
    p->cat[p->n] = cat;
    CUDA_CHECK(cudaEventRecord(p->ev[p->n++], s));
    return 0;
}
#define PROF(cat, call) (prof_mark(cx->stream, cat, e) || (call) || prof_mark(cx->stream, -1, e))

#ifdef WREN_DECODE_TRACE
#define TRACE_UNITS 64 // translation units with traced kernels (more than there are)
static void (*g_trace_set[TRACE_UNITS])(struct trace_buf *);
static int g_trace_units;
void decode_trace_register(void (*set)(struct trace_buf *)) {
    if (g_trace_units < TRACE_UNITS) g_trace_set[g_trace_units++] = set;
}
int decode_trace_enable(struct trace_buf *b) {
    for (int i = 0; i < g_trace_units; i++) g_trace_set[i](b);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
#else
int decode_trace_enable(struct trace_buf *b) {
    (void)b;
    return -1;
}
#endif

__global__ void set_pos_tok_kernel(int *pos, int p, int32_t *tok, int32_t t) {
    *pos = p;
    if (t >= 0) *tok = t;
}

int decode_set_pos_tok(struct decode_ws *ws, int pos, int32_t tok, cudaStream_t s,
                       struct wren_err *e) {
    set_pos_tok_kernel<<<1, 1, 0, s>>>(ws->pos, pos, ws->tok, tok);
    CUDA_CHECK_LAUNCH();
    return 0;
}

static struct gemv_seg seg_of(const struct dmat *m, int epi, float *out) {
    struct gemv_seg g;
    memset(&g, 0, sizeof g);
    g.a = *m;
    g.rows = m->rows;
    g.epi = epi;
    g.out = out;
    return g;
}

// A launch reading input x (cols values), RMS-normalised with norm_w on the fly when given.
static struct gemv_params gemv_in(const float *x, int cols, const float *norm_w, float eps) {
    struct gemv_params gp;
    memset(&gp, 0, sizeof gp);
    gp.x = x;
    gp.cols = cols;
    gp.norm_w = norm_w;
    gp.eps = eps;
    return gp;
}

static int moe_block(struct cuda_ctx *cx, struct decode_ws *ws, const struct dlayer *L,
                     struct wren_err *e) {
    const struct model_config *c = cx->cfg;
    const int K = c->n_experts > 0 ? c->top_k : 0;
    const int inter = c->expert_inter, shi = c->n_experts > 0 ? c->shared_inter : c->dense_inter;
    const bool shg = L->sh_gate_w.rows > 0 && shi > 0;
    struct gemv_params gp = gemv_in(ws->x, c->hidden, L->post_norm, c->rms_eps);
    if (K > 0) { // the expert launch does the routing (softmax, top-k) in every block
        gp.topk_E = c->n_experts;
        gp.topk_K = K;
        gp.norm_topk = c->norm_topk;
        gp.has_shared_gate = shg;
        gp.logits = ws->rlog;
        gp.ids = ws->ids;
        gp.wts = ws->wts;
    }
    // the shared expert first: its weights are known before the routing, so the first warps
    // request them before the launch's programmatic wait (measured: 10.4 -> 9.5 us per launch)
    if (shi > 0) {
        struct gemv_seg g = seg_of(&L->sh_gate, EPI_SWIGLU, ws->act + (size_t)K * inter);
        g.b = L->sh_up;
        g.slot = K;
        g.scale = ws->wts;
        gp.seg[gp.nseg++] = g;
    }
    for (int k = 0; k < K; k++) {
        struct gemv_seg g = seg_of(&L->exp_gate, EPI_SWIGLU, ws->act + (size_t)k * inter);
        g.b = L->exp_up;
        g.idx = ws->ids;
        g.slot = k;
        g.scale = ws->wts;
        gp.seg[gp.nseg++] = g;
    }
    if (K > 0) { // the router, set up after the expert launch so they can share the int8 input
        struct gemv_params rp = gemv_in(ws->x, c->hidden, L->post_norm, c->rms_eps);
        rp.seg[rp.nseg++] = seg_of(&L->router, EPI_STORE, ws->rlog);
        if (shg) rp.seg[rp.nseg++] = seg_of(&L->sh_gate_w, EPI_STORE, ws->rlog + c->n_experts);
        gemv_share_qx(&rp, &gp, ws->qx);
        if (PROF(DP_ROUTER, gemv_launch(&rp, cx->stream, e))) return -1;
        // the experts in one launch where asked for and they qualify (4-bit, the int8 input
        // shared); measured slower than the two launches below (RESULTS.md, thirty-third session)
        struct moe_fused_params fp;
        memset(&fp, 0, sizeof fp);
        fp.g = gp;
        fp.gate = L->exp_gate, fp.up = L->exp_up, fp.down = L->exp_down;
        fp.sh_gate = L->sh_gate, fp.sh_up = L->sh_up, fp.sh_down = L->sh_down;
        fp.K = K, fp.inter = inter, fp.sh_inter = shi, fp.hidden = c->hidden;
        fp.x = ws->x, fp.acc = ws->moe_acc, fp.ticket = ws->moe_ticket;
        if (moe_fused_eligible(&fp)) return PROF(DP_GATE_UP, moe_fused_launch(&fp, cx->stream, e));
    }
    if (PROF(DP_GATE_UP, gemv_launch(&gp, cx->stream, e))) return -1;
    struct moe_down_params dp;
    memset(&dp, 0, sizeof dp);
    dp.down = L->exp_down;
    dp.sh_down = L->sh_down;
    dp.ids = ws->ids;
    dp.K = K;
    dp.act = ws->act;
    dp.inter = inter;
    dp.sh_inter = shi;
    dp.out = ws->x;
    dp.hidden = c->hidden;
    return PROF(DP_DOWN, moe_down_launch(&dp, cx->stream, e));
}

static int deltanet_layer(struct cuda_ctx *cx, struct decode_ws *ws, struct cuda_state *st, int j,
                          const struct dlayer *L, struct wren_err *e) {
    const struct model_config *c = cx->cfg;
    struct deltanet_params dp;
    memset(&dp, 0, sizeof dp);
    dp.k_heads = c->dn_k_heads;
    dp.v_heads = c->dn_v_heads;
    dp.dk = c->dn_k_dim;
    dp.dv = c->dn_v_dim;
    // the gated RMSNorm in the step where it runs a block per head, else in out_proj's load; the
    // causal conv there too where it fits (the projection's epilogue then stores plain outputs:
    // its conv epilogue was a chain of round trips to the state at the launch's end)
    if (deltanet_head_ok(&dp)) dp.norm_w = L->dn_norm;
    if (dp.norm_w && deltanet_conv_ok(&dp, c->conv_kernel)) {
        dp.conv_w = L->dn_conv;
        dp.conv_state = st->conv[j];
        dp.conv_tick = ws->dn_tick;
        dp.conv_k = c->conv_kernel;
    }
    struct gemv_params gp = gemv_in(ws->x, c->hidden, L->input_norm, c->rms_eps);
    struct gemv_seg g = seg_of(&L->dn_qkv, dp.conv_w ? EPI_STORE : EPI_CONV, ws->qkv);
    if (!dp.conv_w) {
        g.conv_w = L->dn_conv;
        g.conv_state = st->conv[j];
        g.conv_k = c->conv_kernel;
    }
    gp.seg[gp.nseg++] = g;
    gp.seg[gp.nseg++] = seg_of(&L->dn_z, EPI_STORE, ws->z);
    gp.seg[gp.nseg++] = seg_of(&L->dn_b, EPI_STORE, ws->b);
    gp.seg[gp.nseg++] = seg_of(&L->dn_a, EPI_STORE, ws->a);
    if (PROF(DP_DN_PROJ, gemv_launch(&gp, cx->stream, e))) return -1;
    dp.qkv = ws->qkv;
    dp.z = ws->z;
    dp.b = ws->b;
    dp.a = ws->a;
    dp.S = st->ssm[j];
    dp.A_log = L->dn_A_log;
    dp.dt_bias = L->dn_dt_bias;
    dp.y = ws->y;
    dp.eps = c->rms_eps;
    if (PROF(DP_DN_STEP, deltanet_launch(&dp, cx->stream, e))) return -1;
    gp = gemv_in(ws->y, cfg_dn_v_dim(c), NULL, c->rms_eps);
    if (!dp.norm_w) {
        gp.gn_w = L->dn_norm;
        gp.gn_z = ws->z;
        gp.gn_dv = c->dn_v_dim;
    }
    gp.seg[gp.nseg++] = seg_of(&L->dn_out, EPI_ADD, ws->x);
    return PROF(DP_DN_OUT, gemv_launch(&gp, cx->stream, e));
}

static int attention_layer(struct cuda_ctx *cx, struct decode_ws *ws, struct cuda_state *st, int j,
                           const struct dlayer *L, struct wren_err *e) {
    const struct model_config *c = cx->cfg;
    struct gemv_params gp = gemv_in(ws->x, c->hidden, L->input_norm, c->rms_eps);
    gp.seg[gp.nseg++] = seg_of(&L->q_proj, EPI_STORE, ws->qg);
    gp.seg[gp.nseg++] = seg_of(&L->k_proj, EPI_STORE, ws->k);
    gp.seg[gp.nseg++] = seg_of(&L->v_proj, EPI_STORE, ws->v);
    if (PROF(DP_ATT_PROJ, gemv_launch(&gp, cx->stream, e))) return -1;
    struct attn_params ap;
    ap.qg = ws->qg;
    ap.k = ws->k;
    ap.v = ws->v;
    ap.q_norm = L->q_norm;
    ap.k_norm = L->k_norm;
    ap.kc = st->k_cache[j];
    ap.vc = st->v_cache[j];
    ap.kv_int8 = st->kv_int8;
    ap.kv_row = (int)st->kv_row;
    ap.pos = ws->pos;
    ap.n_heads = c->n_heads;
    ap.n_kv = c->n_kv_heads;
    ap.hd = c->head_dim;
    ap.rope_dim = c->rope_dim;
    ap.rope_theta = c->rope_theta;
    ap.eps = c->rms_eps;
    ap.gate = c->attn_output_gate;
    ap.max_ctx = st->max_ctx;
    ap.splits = ws->splits;
    ap.q_ws = ws->q;
    ap.part = ws->part;
    ap.out = ws->att;
    if (PROF(DP_ATT, attn_launch(&ap, cx->stream, e))) return -1;
    gp = gemv_in(ws->att, c->n_heads * c->head_dim, NULL, c->rms_eps);
    gp.seg[gp.nseg++] = seg_of(&L->o_proj, EPI_ADD, ws->x);
    return PROF(DP_ATT_OUT, gemv_launch(&gp, cx->stream, e));
}

int decode_enqueue(struct cuda_ctx *cx, struct decode_ws *ws, struct cuda_state *st,
                   struct wren_err *e) {
    const struct model_config *c = cx->cfg;
    if (PROF(DP_EMBED, embed_launch(&cx->dm.embed, ws->tok, ws->x, cx->stream, e))) return -1;
    int jd = 0, ja = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const struct dlayer *L = &cx->dm.layers[l];
        int rc = c->kind[l] == LAYER_DELTANET ? deltanet_layer(cx, ws, st, jd++, L, e)
                                              : attention_layer(cx, ws, st, ja++, L, e);
        if (rc || moe_block(cx, ws, L, e)) return wren_err_prefix(e, "layer %d: ", l);
    }
    struct gemv_params gp = gemv_in(ws->x, c->hidden, cx->dm.final_norm, c->rms_eps);
    gp.seg[gp.nseg++] = seg_of(&cx->dm.lm_head, EPI_STORE, st->logits);
    gp.sched = ws->lm_sched;
    return PROF(DP_LM_HEAD, gemv_launch(&gp, cx->stream, e));
}
