// cuda_prefill(): one chunk of T tokens through every layer, all on cx->stream with no host sync
// until the logits are copied out. The workspace is allocated once for the largest chunk seen
// (grown, never shrunk) and kept in cx->prefill; cuda_prefill_free() releases it.
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/prefill.cuh"

extern "C" {
#include "util/util.h"
}

namespace {

constexpr int MAX_EVENTS = 1024;
constexpr int LOGIT_ROWS = 32; // rows of lm_head per step when all positions' logits are wanted
// The DeltaNet recurrence runs in the chunked WY form (dn_wy_*.cu) from this many tokens per call,
// else as the sequential scan (dn_chunk.cu). Measured on the H200 for the 35B layer
// (check_prefill_dn --bench, bench/RESULTS.md 2026-11-30, with the per-key-head prep kernel):
// scan / chunked 0.027 / 0.035 ms at T = 64, 0.048 / 0.040 at 128, 0.089 / 0.051 at 256, then the
// chunked form at 0.40x of the scan from 2K on (its prep kernel has a ~26 us floor).
constexpr int DN_CHUNKED_MIN_T = 128;

int g_dn_form = -1; // enum pf_dn_form; -1: not read from the environment yet

bool dn_use_chunked(const struct dn_dims *d, size_t smem_optin) {
    if (g_dn_form < 0) { // WREN_CUDA_DN=scan|chunked forces a form (comparison runs)
        const char *f = getenv("WREN_CUDA_DN");
        g_dn_form = !f                      ? PF_DN_BY_LENGTH
                    : !strcmp(f, "scan")    ? PF_DN_SCAN_ONLY
                    : !strcmp(f, "chunked") ? PF_DN_CHUNKED_ONLY
                                            : PF_DN_BY_LENGTH;
    }
    const bool want = g_dn_form == PF_DN_CHUNKED_ONLY ||
                      (g_dn_form == PF_DN_BY_LENGTH && d->T >= DN_CHUNKED_MIN_T);
    return want && pf_dn_chunked_fits(d, smem_optin);
}

} // namespace

struct prefill_ws {
    int cap; // tokens the buffers hold
    int32_t *tokens;
    float *x;
    bf16 *xn;
    // DeltaNet
    float *qkv, *qkvc, *ba, *o;
    bf16 *z, *y;
    // attention
    float *q, *k, *v;
    bf16 *qb, *ao;
    // MoE / MLP
    float *rl, *ye, *sh, *shg;
    bf16 *h, *shh;
    struct moe_route_buf rb; // rb.max_tiles: the tile map's capacity
    // logits
    float *lg;
    // int8 KV cache: the dequantized K then V rows of one layer, for kvd_ctx positions
    bf16 *kvd;
    int kvd_ctx;
    // split-K partial sums of dense GEMMs with few tiles (gemm_split.cu)
    float *split;
    size_t split_bytes;
    // profile: events between phases, each phase tagged with a kind
    bool prof, ev_made;
    cudaEvent_t ev[MAX_EVENTS];
    int ev_kind[MAX_EVENTS], n_ev;
    double kind_ms[PF_KINDS];
};

namespace {

void ws_free(struct prefill_ws *w) {
    // clang-format off
    void *bufs[] = {w->tokens,    w->x,          w->xn,         w->qkv,
                    w->qkvc,      w->ba,         w->o,          w->z,
                    w->y,         w->q,          w->k,          w->v,
                    w->qb,        w->ao,         w->rl,         w->ye,
                    w->sh,        w->shg,        w->h,          w->shh,
                    w->lg,        w->split,      w->rb.topk_id, w->rb.topk_w,  w->kvd,
                    w->rb.counts, w->rb.offsets, w->rb.cursor,  w->rb.sorted_tok,
                    w->rb.slot,   w->rb.tiles,   w->rb.n_tiles};
    // clang-format on
    for (void *b : bufs)
        if (b) cudaFree(b); // release only: nothing to report, at worst a leak
    memset(w, 0, offsetof(struct prefill_ws, prof)); // the profile fields survive a regrow
}

template <class T> int alloc(T **p, size_t n, struct wren_err *e) {
    cudaError_t rc = cudaMalloc((void **)p, n * sizeof(T) + 256);
    if (rc != cudaSuccess) {
        cudaGetLastError(); // reported here; a later launch check must not see it
        return wren_errf(e,
                         "prefill workspace: cannot allocate %zu MiB on the GPU (%s); use a "
                         "smaller prefill chunk",
                         (n * sizeof(T)) >> 20, cudaGetErrorString(rc));
    }
    return 0;
}

int ws_alloc(struct prefill_ws *w, const struct model_config *c, int T, struct wren_err *e) {
    const size_t H = c->hidden, C = cfg_dn_conv_dim(c), V = cfg_dn_v_dim(c);
    const size_t qd = (size_t)c->n_heads * c->head_dim * (c->attn_output_gate ? 2 : 1);
    const size_t kvd = (size_t)c->n_kv_heads * c->head_dim;
    const size_t E = c->n_experts > 0 ? c->n_experts : 1, K = c->top_k > 0 ? c->top_k : 1;
    const size_t I = c->expert_inter > 0 ? c->expert_inter : 1;
    const size_t SI = c->n_experts > 0 ? (c->shared_inter > 0 ? c->shared_inter : 1)
                                       : (c->dense_inter > 0 ? c->dense_inter : 1);
    // qkv is dead once the conv has read it, so it doubles as the chunked recurrence's scratch.
    const struct dn_dims dd = {T,           c->dn_k_heads, c->dn_v_heads,
                               c->dn_k_dim, c->dn_v_dim,   c->conv_kernel};
    const size_t dn_ws = pf_dn_chunked_ws_bytes(&dd) / sizeof(float) + 1;
    const size_t qkv_n = dn_ws > T * C ? dn_ws : T * C;
    w->cap = T;
    // the tile map for any call of up to T tokens: the tile height grows with the rows per expert,
    // so the smallest one bounds the tile count
    w->rb.max_tiles = pf_moe_max_tiles(T, (int)E, (int)K, pf_gemm_group_bm(0));
    if (alloc(&w->tokens, T, e) || alloc(&w->x, T * H, e) || alloc(&w->xn, T * H, e) ||
        alloc(&w->qkv, qkv_n, e) || alloc(&w->qkvc, T * C, e) ||
        alloc(&w->ba, T * 2 * c->dn_v_heads, e) || alloc(&w->o, T * V, e) ||
        alloc(&w->z, T * V, e) || alloc(&w->y, T * V, e) || alloc(&w->q, T * qd, e) ||
        alloc(&w->k, T * kvd, e) || alloc(&w->v, T * kvd, e) ||
        alloc(&w->qb, T * (size_t)c->n_heads * c->head_dim, e) ||
        alloc(&w->ao, T * (size_t)c->n_heads * c->head_dim, e) || alloc(&w->rl, T * E, e) ||
        alloc(&w->ye, T * K * H, e) || alloc(&w->sh, T * H, e) || alloc(&w->shg, T * 2, e) ||
        alloc(&w->h, T * K * I, e) || alloc(&w->shh, T * SI, e) ||
        alloc(&w->lg, (size_t)LOGIT_ROWS * c->vocab, e) || alloc(&w->rb.topk_id, T * K, e) ||
        alloc(&w->rb.topk_w, T * K, e) || alloc(&w->rb.counts, E + 1, e) ||
        alloc(&w->rb.offsets, E + 1, e) || alloc(&w->rb.cursor, E + 1, e) ||
        alloc(&w->rb.sorted_tok, T * K, e) || alloc(&w->rb.slot, T * K, e) ||
        alloc(&w->rb.tiles, 3 * (size_t)w->rb.max_tiles, e) || alloc(&w->rb.n_tiles, 1, e))
        return -1;
    w->split_bytes = pf_gemm_split_ws_bytes();
    return alloc(&w->split, w->split_bytes / sizeof(float), e);
}

struct runner {
    struct cuda_ctx *cx;
    struct prefill_ws *w;
    struct wren_err *e;
    // first failure to record a profiling event: kept for the end of the forward, so that the
    // callers of phase() need no error path of their own
    cudaError_t ev_rc = cudaSuccess;
    void phase(int kind) {
        if (!w->prof || w->n_ev >= MAX_EVENTS) return;
        cudaError_t rc = cudaEventRecord(w->ev[w->n_ev], cx->stream);
        if (rc != cudaSuccess) {
            cudaGetLastError();
            if (ev_rc == cudaSuccess) ev_rc = rc;
            return;
        }
        w->ev_kind[w->n_ev++] = kind;
    }
};

int run_deltanet(runner &r, const struct dlayer *L, float *conv, float *ssm, int T) {
    const struct model_config *c = r.cx->cfg;
    struct prefill_ws *w = r.w;
    struct wren_err *e = r.e;
    cudaStream_t s = r.cx->stream;
    const int C = cfg_dn_conv_dim(c), V = cfg_dn_v_dim(c), vh = c->dn_v_heads;
    r.phase(PF_GEMM);
    if (pf_gemm(s, w->xn, c->hidden, T, &L->dn_qkv, nullptr, w->qkv, C, EPI_F32, nullptr, e) ||
        pf_gemm(s, w->xn, c->hidden, T, &L->dn_z, nullptr, w->z, V, EPI_BF16, nullptr, e) ||
        pf_gemm(s, w->xn, c->hidden, T, &L->dn_b, nullptr, w->ba, 2 * vh, EPI_F32, nullptr, e) ||
        pf_gemm(s, w->xn, c->hidden, T, &L->dn_a, nullptr, w->ba + vh, 2 * vh, EPI_F32, nullptr, e))
        return -1;
    struct dn_dims d = {T, c->dn_k_heads, vh, c->dn_k_dim, c->dn_v_dim, c->conv_kernel};
    r.phase(PF_DN);
    if (pf_dn_prep(s, &d, w->qkv, conv, L->dn_conv, w->qkvc, w->ba, L->dn_A_log, L->dn_dt_bias, e))
        return -1;
    r.phase(PF_DN_SCAN);
    if (dn_use_chunked(&d, r.cx->smem_optin)) {
        if (pf_dn_chunked(s, &d, r.cx->smem_optin, w->qkvc, w->ba, ssm, w->o, w->qkv, e)) return -1;
    } else if (pf_dn_scan(s, &d, w->qkvc, w->ba, ssm, w->o, e)) {
        return -1;
    }
    r.phase(PF_DN);
    if (pf_dn_gate_norm(s, &d, w->o, w->z, L->dn_norm, c->rms_eps, w->y, e)) return -1;
    r.phase(PF_GEMM);
    return pf_gemm(s, w->y, V, T, &L->dn_out, nullptr, w->x, c->hidden, EPI_ADD_F32, nullptr, e);
}

int run_attention(runner &r, const struct cuda_state *st, const struct dlayer *L, unsigned char *kc,
                  unsigned char *vc, int pos, int T) {
    const struct model_config *c = r.cx->cfg;
    struct prefill_ws *w = r.w;
    struct wren_err *e = r.e;
    cudaStream_t s = r.cx->stream;
    const int qd = c->n_heads * c->head_dim * (c->attn_output_gate ? 2 : 1);
    const int kvd = c->n_kv_heads * c->head_dim;
    r.phase(PF_GEMM);
    if (pf_gemm(s, w->xn, c->hidden, T, &L->q_proj, nullptr, w->q, qd, EPI_F32, nullptr, e) ||
        pf_gemm(s, w->xn, c->hidden, T, &L->k_proj, nullptr, w->k, kvd, EPI_F32, nullptr, e) ||
        pf_gemm(s, w->xn, c->hidden, T, &L->v_proj, nullptr, w->v, kvd, EPI_F32, nullptr, e))
        return -1;
    struct attn_dims d;
    d.T = T, d.pos = pos, d.nh = c->n_heads, d.nkv = c->n_kv_heads, d.hd = c->head_dim;
    d.rope_dim = c->rope_dim, d.theta = c->rope_theta, d.eps = c->rms_eps;
    d.gate = c->attn_output_gate, d.kv_int8 = st->kv_int8, d.kv_row = (int)st->kv_row;
    r.phase(PF_ATTN);
    if (pf_attn_prep(s, &d, w->q, w->k, w->v, L->q_norm, L->k_norm, w->qb, kc, vc, e)) return -1;
    const uint16_t *kr = reinterpret_cast<const uint16_t *>(kc),
                   *vr = reinterpret_cast<const uint16_t *>(vc);
    if (d.kv_int8) { // attend to the dequantized rows [0, pos + T)
        const size_t n = (size_t)st->max_ctx * kvd;
        if (pf_kv_dequant(s, &d, pos + T, kc, vc, w->kvd, w->kvd + n, e)) return -1;
        kr = reinterpret_cast<const uint16_t *>(w->kvd);
        vr = reinterpret_cast<const uint16_t *>(w->kvd + n);
    }
    if (pf_flash_attn(s, &d, w->qb, kr, vr, w->q, w->ao, r.cx->smem_optin, e)) return -1;
    r.phase(PF_GEMM);
    return pf_gemm(s, w->ao, c->n_heads * c->head_dim, T, &L->o_proj, nullptr, w->x, c->hidden,
                   EPI_ADD_F32, nullptr, e);
}

int run_mlp(runner &r, const struct dlayer *L, int T) {
    const struct model_config *c = r.cx->cfg;
    struct prefill_ws *w = r.w;
    struct wren_err *e = r.e;
    cudaStream_t s = r.cx->stream;
    const int H = c->hidden;
    if (c->n_experts == 0) { // dense MLP: the shared_* matrices, no gate
        r.phase(PF_GEMM);
        return pf_gemm(s, w->xn, H, T, &L->sh_gate, &L->sh_up, w->shh, c->dense_inter,
                       EPI_SWIGLU_BF16, nullptr, e) ||
               pf_gemm(s, w->shh, c->dense_inter, T, &L->sh_down, nullptr, w->x, H, EPI_ADD_F32,
                       nullptr, e);
    }
    const int E = c->n_experts, K = c->top_k, I = c->expert_inter;
    // Tiles sized for this call's rows per expert (a short call after a long one kept the long
    // one's 256-row tiles: 21 ms of expert GEMMs at 256 tokens, against 11 with 32-row tiles).
    // (pf_moe_route refuses a map larger than the capacity; the grids cover this call's tiles)
    const int bm = pf_gemm_group_bm(T * K / E), tiles = pf_moe_max_tiles(T, E, K, bm);
    r.phase(PF_ROUTE);
    if (pf_gemm(s, w->xn, H, T, &L->router, nullptr, w->rl, E, EPI_F32, nullptr, e) ||
        pf_moe_route(s, w->rl, T, E, K, c->norm_topk, bm, &w->rb, e))
        return -1;
    r.phase(PF_EXPERTS);
    struct gemm_group g1 = {w->rb.tiles, w->rb.n_tiles, tiles, bm, w->rb.sorted_tok};
    struct gemm_group g2 = {w->rb.tiles, w->rb.n_tiles, tiles, bm, nullptr};
    if (pf_gemm(s, w->xn, H, T * K, &L->exp_gate, &L->exp_up, w->h, I, EPI_SWIGLU_BF16, &g1, e) ||
        pf_gemm(s, w->h, I, T * K, &L->exp_down, nullptr, w->ye, H, EPI_F32, &g2, e))
        return -1;
    const bool shared = c->shared_inter > 0;
    const bool gated = shared && L->sh_gate_w.rows > 0;
    if (shared) {
        r.phase(PF_GEMM);
        const int SI = c->shared_inter;
        if (pf_gemm(s, w->xn, H, T, &L->sh_gate, &L->sh_up, w->shh, SI, EPI_SWIGLU_BF16, nullptr,
                    e) ||
            pf_gemm(s, w->shh, SI, T, &L->sh_down, nullptr, w->sh, H, EPI_F32, nullptr, e) ||
            (gated &&
             pf_gemm(s, w->xn, H, T, &L->sh_gate_w, nullptr, w->shg, 2, EPI_F32, nullptr, e)))
            return -1;
    }
    r.phase(PF_OTHER);
    return pf_moe_combine(s, w->x, w->ye, w->rb.slot, w->rb.topk_w, T, K, H,
                          shared ? w->sh : nullptr, gated ? w->shg : nullptr, e);
}

// lm_head over rows [r0, r0 + n) of xn into dst (device, [n][vocab]).
int run_logits(runner &r, int r0, int n, float *dst) {
    const struct model_config *c = r.cx->cfg;
    return pf_gemm(r.cx->stream, r.w->xn + (size_t)r0 * c->hidden, c->hidden, n, &r.cx->dm.lm_head,
                   nullptr, dst, c->vocab, EPI_F32, nullptr, r.e);
}

} // namespace

int cuda_prefill(struct cuda_ctx *cx, struct cuda_state *st, int pos, const int32_t *tokens, int n,
                 float *logits, bool all_logits, struct wren_err *e) {
    const struct model_config *c = cx->cfg;
    cudaStream_t s = cx->stream;
    if (n <= 0) return 0;
    if (pos < 0 || pos + n > st->max_ctx)
        return wren_errf(e, "prefill: positions %d..%d exceed the context of %d tokens", pos,
                         pos + n, st->max_ctx);
    pf_gemm_set_smem_optin(cx->smem_optin);
    if (!cx->prefill) cx->prefill = (struct prefill_ws *)xcalloc(1, sizeof(struct prefill_ws));
    struct prefill_ws *w = cx->prefill;
    if (n > w->cap) {
        CUDA_CHECK(cudaStreamSynchronize(s));
        ws_free(w);
        if (ws_alloc(w, c, n, e)) {
            ws_free(w);
            return -1;
        }
    }
    if (st->kv_int8 && w->kvd_ctx < st->max_ctx) { // sized for the state's whole context
        CUDA_CHECK(cudaStreamSynchronize(s));
        if (w->kvd) cudaFree(w->kvd); // release only: nothing to report
        w->kvd = nullptr;
        w->kvd_ctx = 0;
        if (alloc(&w->kvd, (size_t)2 * st->max_ctx * c->n_kv_heads * c->head_dim, e)) return -1;
        w->kvd_ctx = st->max_ctx;
    }
    pf_gemm_set_split_ws(w->split, w->split_bytes);
    runner r = {cx, w, e};
    w->n_ev = 0;
    r.phase(PF_OTHER);
    CUDA_CHECK(cudaMemcpyAsync(w->tokens, tokens, sizeof(int32_t) * n, cudaMemcpyHostToDevice, s));
    if (pf_embed(s, &cx->dm.embed, w->tokens, n, w->x, e)) return -1;
    int ia = 0, id = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const struct dlayer *L = &cx->dm.layers[l];
        r.phase(PF_OTHER);
        if (pf_rmsnorm_bf16(s, w->x, L->input_norm, n, c->hidden, c->rms_eps, w->xn, e)) return -1;
        int rc = L->kind == LAYER_ATTENTION
                     ? run_attention(r, st, L, st->k_cache[ia], st->v_cache[ia], pos, n)
                     : run_deltanet(r, L, st->conv[id], st->ssm[id], n);
        if (rc) return wren_err_prefix(e, "layer %d: ", l);
        ia += L->kind == LAYER_ATTENTION;
        id += L->kind != LAYER_ATTENTION;
        r.phase(PF_OTHER);
        if (pf_rmsnorm_bf16(s, w->x, L->post_norm, n, c->hidden, c->rms_eps, w->xn, e)) return -1;
        if (run_mlp(r, L, n)) return wren_err_prefix(e, "layer %d: ", l);
    }
    // Final norm and lm_head: the last row always (into st->logits); every row when asked, and
    // then st->logits is copied from the last of them (a one-row GEMM may take the few-rows
    // kernel, whose rounding differs).
    r.phase(PF_LOGITS);
    const bool all = all_logits && logits;
    const int r0 = all ? 0 : n - 1;
    if (pf_rmsnorm_bf16(s, w->x + (size_t)r0 * c->hidden, cx->dm.final_norm, n - r0, c->hidden,
                        c->rms_eps, w->xn + (size_t)r0 * c->hidden, e))
        return -1;
    if (all) {
        for (int t0 = 0; t0 < n; t0 += LOGIT_ROWS) {
            const int m = n - t0 < LOGIT_ROWS ? n - t0 : LOGIT_ROWS;
            if (run_logits(r, t0, m, w->lg)) return -1;
            CUDA_CHECK(cudaMemcpyAsync(logits + (size_t)t0 * c->vocab, w->lg,
                                       sizeof(float) * m * c->vocab, cudaMemcpyDeviceToHost, s));
            if (t0 + m == n)
                CUDA_CHECK(cudaMemcpyAsync(st->logits, w->lg + (size_t)(m - 1) * c->vocab,
                                           sizeof(float) * c->vocab, cudaMemcpyDeviceToDevice, s));
        }
    } else if (run_logits(r, n - 1, 1, st->logits)) {
        return -1;
    } else if (logits) {
        CUDA_CHECK(cudaMemcpyAsync(logits, st->logits, sizeof(float) * c->vocab,
                                   cudaMemcpyDeviceToHost, s));
    }
    r.phase(PF_OTHER);
    CUDA_CHECK(cudaStreamSynchronize(s)); // forward returns when the work is done (and checked)
    CUDA_CHECK_LAUNCH();
    if (r.ev_rc != cudaSuccess)
        return wren_errf(e, "prefill profiling: recording an event: %s",
                         cudaGetErrorString(r.ev_rc));
    if (w->prof)
        for (int i = 0; i + 1 < w->n_ev; i++) {
            float ms = 0;
            CUDA_CHECK(cudaEventElapsedTime(&ms, w->ev[i], w->ev[i + 1]));
            w->kind_ms[w->ev_kind[i]] += ms;
        }
    return 0;
}

void cuda_prefill_free(struct cuda_ctx *cx) {
    struct prefill_ws *w = cx->prefill;
    if (!w) return;
    if (pf_gemm_split_ws() == w->split) pf_gemm_set_split_ws(nullptr, 0);
    ws_free(w);
    if (w->ev_made)
        for (int i = 0; i < MAX_EVENTS; i++) cudaEventDestroy(w->ev[i]); // teardown: no report
    free(w);
    cx->prefill = nullptr;
}

int cuda_prefill_profile(struct cuda_ctx *cx, bool on, double kind_ms[PF_KINDS],
                         struct wren_err *e) {
    if (!cx->prefill) cx->prefill = (struct prefill_ws *)xcalloc(1, sizeof(struct prefill_ws));
    struct prefill_ws *w = cx->prefill;
    if (kind_ms) {
        memcpy(kind_ms, w->kind_ms, sizeof w->kind_ms);
        memset(w->kind_ms, 0, sizeof w->kind_ms);
    }
    if (on && !w->ev_made) {
        for (int i = 0; i < MAX_EVENTS; i++) CUDA_CHECK(cudaEventCreate(&w->ev[i]));
        w->ev_made = true;
    }
    w->prof = on;
    return 0;
}

void cuda_prefill_dn_form(enum pf_dn_form form) {
    g_dn_form = form;
}

const char *const pf_kind_name[PF_KINDS] = {"dense GEMM",     "MoE routing",        "expert GEMMs",
                                            "DeltaNet other", "DeltaNet scan",      "attention",
                                            "lm_head",        "norms/embed/combine"};
