// The batch-1 decode kernels: parameter blocks and host launchers (each enqueues on a stream,
// checks the launch, never synchronizes). Used by the decode step and by tests/cuda/check_decode_*.
#pragma once
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/decode_trace.cuh"
#include "backend/cuda/kv_int8.cuh"

// ---- GEMV over one activation row, several matrices per launch --------------------------------
#define GEMV_MAXSEG       12
#define ROUTE_MAX_EXPERTS 512 // the routing holds 16 probabilities per lane in registers

enum gemv_epi {
    EPI_STORE,  // out[r] = y
    EPI_ADD,    // out[r] += y (residual stream)
    EPI_CONV,   // out[r] = silu(causal conv over the channel's last inputs and y); state shifted
    EPI_SWIGLU, // out[r] = scale * silu(y_a) * y_b (a = gate rows, b = up rows of the same expert)
};

struct gemv_seg {
    struct dmat a, b; // b: up matrix for EPI_SWIGLU only
    int mat;          // matrix of the stack (idx == NULL)
    const int *idx;   // device: matrix = idx[slot] (routed experts)
    int slot;
    int rows;
    int epi;
    float *out;
    const float *scale;  // EPI_SWIGLU: multiplies the result by scale[slot] (NULL: 1)
    const float *conv_w; // EPI_CONV: [rows][conv_k]
    float *conv_state;   // EPI_CONV: [rows][conv_k - 1], oldest first
    int conv_k;
    int block0; // filled by gemv_launch (f32-activation kernel)
    int rs0;    // filled by gemv_launch (int8 kernel): first row set
};

struct gemv_params {
    int nseg;
    struct gemv_seg seg[GEMV_MAXSEG];
    const float *x; // [cols] input row (device)
    int cols;
    int iters;           // row batches per block (filled by gemv_launch)
    const float *norm_w; // non-NULL: x is RMS-normalised with this weight first (fused)
    float eps;
    // non-NULL gn_w: gated RMSNorm per head of gn_dv values instead (DeltaNet output):
    // x_i * rsqrt(mean_head(x^2) + eps) * gn_w[i % gn_dv] * silu(gn_z[i])
    const float *gn_w, *gn_z;
    int gn_dv;
    // MoE routing (the expert launch): when topk_K > 0, every block turns the router's
    // logits[0..topk_E) into top-k ids and (renormalised) weights before it runs its segments; the
    // routed segments (idx != NULL) then take their matrix and scale from that choice, and block 0
    // writes it to ids[0..topk_K) and wts[0..topk_K] (wts[topk_K] = sigmoid(logits[topk_E]) if
    // has_shared_gate, else 1) for the launches after it.
    int topk_E, topk_K;
    int norm_topk, has_shared_gate;
    const float *logits;
    int *ids;
    float *wts;
    // The router and the expert launch quantize the same input (x, post-attention norm): with
    // qx_out set (int8 kernel only), one extra block of this launch writes the int8 activation a
    // qx_out_bits-bit matrix reads (qx_bytes(cols / 32) bytes) to qx_out, and a launch given it as
    // qx_in copies it into shared memory while it routes instead of building it after (the
    // expert launch's prologue took 4.4 us there: bench_decode_trace). Set both through
    // gemv_share_qx, which checks that both launches take the int8 kernel on the same input.
    uint8_t *qx_out;
    int qx_out_bits;
    const uint8_t *qx_in;
    int q_rs, q_nit, q_gshift; // filled by gemv_launch (int8 kernel)
    // A streamed launch (qstream, the lm_head) takes about a quarter of its stages from this pair
    // of counters (zero, and left zero) instead of dealing them all out statically, where each
    // block's static share fills its ring (qstream_launch); NULL: static.
    unsigned *sched;
};

// Runs the int8-activation dp4a kernel (decode_qgemv.cu) when qgemv_eligible, else the
// f32-activation kernel (bf16 weights, mixed formats, very wide inputs).
int gemv_launch(struct gemv_params *p, cudaStream_t s, struct wren_err *e);
bool qgemv_eligible(const struct gemv_params *p);
// Lets consumer reuse the int8 activation producer builds (qx_out / qx_in above) when both take
// the int8 kernel on the same input; buf: qx_bytes(cols / 32) bytes, 16-byte aligned.
void gemv_share_qx(struct gemv_params *producer, struct gemv_params *consumer, uint8_t *buf);
size_t gemv_qx_bytes(int cols); // the size of that buffer
int qgemv_launch(struct gemv_params *p, cudaStream_t s, struct wren_err *e);
// One large matrix (the lm_head) streamed by bulk copies through shared memory (decode_stream.cu).
void qstream_configure(int cc_major, int sm_count, size_t smem_optin, bool off);
bool qstream_eligible(const struct gemv_params *p);
int qstream_launch(const struct gemv_params *p, cudaStream_t s, struct wren_err *e);

// Decode kernel selection, set once by the backend from the device (and for benchmarks).
struct decode_config {
    int sm_count;
    size_t smem_optin;
    bool pdl;       // programmatic dependent launch between the step's kernels (sm_90+)
    bool f32_gemv;  // force the f32-activation GEMV/MoE-down kernels (comparison runs)
    bool dn_slices; // the DeltaNet step in column slices, the norm in out_proj (comparison runs)
    int cc_major;   // compute capability (the streaming GEMV needs 9+)
    bool no_stream; // the lm_head on the register-pipelined GEMV (comparison runs)
    bool no_split;  // no split-step GEMV kernel (comparison runs)
    bool fuse_moe;  // the MoE experts in one launch, moe_fused (measured slower: RESULTS.md)
};
void decode_configure(const struct decode_config *c);
bool decode_f32_gemv(void);
bool decode_dn_slices(void);
bool decode_pdl(void);          // launch the decode kernels with programmatic dependent launch
bool decode_kernels_sm90(void); // the loaded kernels hold their sm_90 paths (not sm_8x code)
void qgemv_configure(int sm_count, bool no_split);
void attn_set_device(int sm_count, size_t smem_optin);

// ---- MoE: down projections of the routed experts + shared expert, weighted sum into x ----------
struct moe_down_params {
    struct dmat down;    // routed experts' down stack [n][hidden][inter]
    struct dmat sh_down; // shared expert's down [hidden][shared_inter] (rows 0: none)
    const int *ids;      // [K] expert ids (device)
    int K;               // routed slots (0: dense model)
    const float *act;    // [K][inter] then [shared_inter]: weights already folded in
    int inter, sh_inter;
    float *out; // [hidden], += result
    int hidden;
    int q_cshift, q_gshift, q_nit; // filled by qdown_launch
};
int moe_down_launch(const struct moe_down_params *p, cudaStream_t s, struct wren_err *e);
bool qdown_eligible(const struct moe_down_params *p);
int qdown_launch(const struct moe_down_params *p, cudaStream_t s, struct wren_err *e);

// ---- MoE experts in one launch: routing, gate/up + SwiGLU and the down projection ---------------
// (decode_moe_fused.cu) where the experts are 4-bit and the router launch shares its int8 input
// (g.qx_in); replaces the expert launch (g) and the down launch.
struct moe_fused_params {
    struct gemv_params g; // the expert launch as built for the two-launch path: routing, qx_in
    struct dmat gate, up, down;          // routed stacks
    struct dmat sh_gate, sh_up, sh_down; // shared expert (sh_inter 0: none)
    int K, inter, sh_inter, hidden;
    float *x;         // [hidden] residual stream, += the experts' weighted sum
    long long *acc;   // [hidden + 1] zero, left zero: fixed-point sums (last: non-finite seen)
    unsigned *ticket; // zero, left zero
    int gshift, pair; // filled by moe_fused_launch
};
void moe_fused_configure(size_t smem_optin, bool off);
bool moe_fused_eligible(const struct moe_fused_params *p);
int moe_fused_launch(const struct moe_fused_params *p, cudaStream_t s, struct wren_err *e);

// ---- Gated DeltaNet recurrent step (one token), after the fused conv in the projection ---------
struct deltanet_params {
    const float *qkv;             // [2*qk + v] q | k | v: conv+silu outputs, or raw (conv_w set)
    const float *z;               // [v] output gate
    const float *b, *a;           // [v_heads]
    float *S;                     // [v_heads][d_k][d_v] state
    const float *A_log, *dt_bias; // [v_heads]
    float *y;                     // [v] readout: raw o, or gated-normed when norm_w is set
    // non-NULL: y = o * rsqrt(mean_head(o^2) + eps) * norm_w * silu(z) (the gated RMSNorm over
    // each head, done here instead of in the out_proj load); only where deltanet_head_ok
    const float *norm_w;
    // non-NULL (only with norm_w, where deltanet_conv_ok): qkv holds the projection's raw outputs
    // and the step runs the causal conv1d + silu and shifts conv_state itself, instead of the
    // projection's epilogue (EPI_CONV)
    const float *conv_w; // [2*qk + v][conv_k]
    float *conv_state;   // [2*qk + v][conv_k - 1], oldest first
    unsigned *conv_tick; // [k_heads], zeroed once: the value heads of a key head take tickets
    int conv_k;
    int k_heads, v_heads, dk, dv;
    float eps;
};
int deltanet_launch(const struct deltanet_params *p, cudaStream_t s, struct wren_err *e);
// Whether the step can run a block per value head with its state columns in registers, and so
// apply the gated RMSNorm itself (d_k 16, 32, 64 or 128; d_v <= 256, <= 128 for d_k 128).
bool deltanet_head_ok(const struct deltanet_params *p);
// Whether that block can also run the causal conv (one channel per thread: 2 d_k + d_v of them,
// conv_k <= 4); p's conv fields need not be set yet.
bool deltanet_conv_ok(const struct deltanet_params *p, int conv_k);

// ---- Attention decode ---------------------------------------------------------------------------
struct attn_params {
    const float *qg;              // q_proj output: per head [query | gate] (gate) or [query]
    const float *k, *v;           // [n_kv][hd]
    const float *q_norm, *k_norm; // [hd]
    unsigned char *kc, *vc;       // caches: [max_ctx] rows of kv_row bytes (kv_int8.cuh)
    int kv_int8;                  // rows hold int8 codes + scales (else bf16)
    int kv_row;                   // bytes per cache row
    const int *pos;               // device: position of this token (context = pos + 1)
    int n_heads, n_kv, hd, rope_dim;
    float rope_theta, eps;
    int gate;
    int max_ctx;
    int splits;  // split-KV blocks per KV head (fixed for a graph; empty splits exit)
    float *q_ws; // [n_heads][hd] normed+roped queries
    float *part; // [splits][n_heads][hd + 2] partial (acc, m, l)
    float *out;  // [n_heads][hd] gated attention output
};
int attn_launch(const struct attn_params *p, cudaStream_t s, struct wren_err *e);
// Whether the int8 KV cache's kernels serve this attention shape (decode: decode_attn_q8.cu;
// prefill: the bf16 flash kernel over dequantized rows).
bool attn_int8_ok(int hd, int n_heads, int n_kv);
// Splits to use for a KV head count on this device (enough blocks to fill it at long contexts).
int attn_splits(int n_kv);

// ---- Embedding row lookup (token id read from device memory) -----------------------------------
int embed_launch(const struct dmat *emb, const int32_t *tok, float *x, cudaStream_t s,
                 struct wren_err *e);

// ---- Sampler --------------------------------------------------------------------------------
struct sample_params {
    const float *logits; // [vocab]
    int n_vocab;         // ids >= n_vocab never sampled
    float temperature, top_p, min_p, presence, frequency, repetition;
    int top_k;
    int n_logprobs; // < 0: none
    uint64_t seed;
    bool one_block; // the one-block kernel where the candidate one would run (comparisons)
    bool no_coop;   // the candidate kernel without its multi-block selection (checks)
    int *path;      // NULL, or where the candidate kernel records how it drew (checks): 0 from
                    // its candidates, 1 by the one-block sampler, 2 without a floor, 3 by the
                    // multi-block selection
    int *counts;    // [vocab] generated-token counts (device)
    uint8_t *seen;  // [vocab] prompt + generated (repetition penalty)
    float *work;    // scratch of sample_work_bytes(vocab) (no initial contents needed)
    unsigned long long *argmax; // greedy scratch (reset by the finisher)
    unsigned *counter;          // block ticket (greedy)
    int32_t *tok_out;           // next step's input token
    int *step;                  // device step counter: ring slot, RNG stream; incremented
    int *pos;                   // device position; incremented when advance_pos
    int advance_pos;
    struct sampled_token *ring; // host-mapped ring of sampled tokens
    int ring_n;
};
int sample_launch(const struct sample_params *p, cudaStream_t s, struct wren_err *e);
// Whether sample_launch draws this call by the candidate kernel's multi-block selection (top-p or
// min-p without a top-k, on a card that holds the kernel's whole grid at once).
bool sample_coop_ok(const struct sample_params *p);
size_t sample_work_bytes(int vocab);

// ---- The decode step -------------------------------------------------------------------------
// Activation workspace of one backend (shared by its states: steps never run concurrently).
struct decode_ws {
    float *x;                   // [hidden] residual stream
    float *qkv, *z, *b, *a, *y; // DeltaNet: conv outputs, gate, beta/alpha logits, mixer output
    float *qg, *k, *v, *q, *att, *part; // attention
    float *rlog, *wts, *act; // MoE: router logits (+ shared gate), weights, expert activations
    int *ids;
    unsigned *dn_tick; // [dn_k_heads] the DeltaNet step's conv-state tickets (deltanet_params)
    uint8_t *qx; // the MoE input as the int8 activation, built by the router launch (gemv_share_qx)
    long long *moe_acc; // [hidden + 1] moe_fused's fixed-point sums (zero between launches)
    unsigned *moe_ticket;
    int *pos, *step; // device position and sampler step counters
    int32_t *tok;    // the step's input token
    int *counts;     // sampler: generated-token counts
    uint8_t *seen;   // sampler: ids in prompt + generated
    float *work;     // sampler scratch (sample_work_bytes)
    unsigned long long *argmax;
    unsigned *scounter;
    unsigned *lm_sched; // [2] the lm_head launch's stage pool (gemv_params.sched)
    struct sampled_token *ring, *ring_dev; // host-mapped ring (host and device views)
    int ring_n;
    int splits; // attention split-KV blocks per KV head
};

// Enqueues one decode step (embedding of ws->tok at position ws->pos through the lm_head into
// st->logits) on cx->stream. No host synchronization; capturable.
int decode_enqueue(struct cuda_ctx *cx, struct decode_ws *ws, struct cuda_state *st,
                   struct wren_err *e);
// Sets the device position and token counters (a kernel, so it is capturable and needs no host
// buffer).
int decode_set_pos_tok(struct decode_ws *ws, int pos, int32_t tok, cudaStream_t s,
                       struct wren_err *e);

// Per-launcher event timing of one non-graph step (benchmarks only).
enum {
    DP_EMBED,
    DP_DN_PROJ,
    DP_DN_STEP,
    DP_DN_OUT,
    DP_ATT_PROJ,
    DP_ATT,
    DP_ATT_OUT,
    DP_ROUTER,
    DP_GATE_UP,
    DP_DOWN,
    DP_LM_HEAD,
    DP_N
};
#define DPROF_MAX 1024
struct decode_prof {
    int n;
    int cat[DPROF_MAX]; // category of the interval starting at ev[i]; -1: end mark
    cudaEvent_t ev[DPROF_MAX];
};
void decode_profile_set(struct decode_prof *p);
int cuda_profile_step(struct backend *b, struct bstate *s, int pos, double *ms, double *total,
                      struct wren_err *e);
