// Kernels of the prefill path (prompt chunks of T > 1 tokens) and their host launchers.
// Launchers only enqueue work on the given stream (no host sync) and return 0, or -1 with a message
// in e when a launch fails or a shape is not supported.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_model.h"

extern "C" {
#include "util/err.h"
}

typedef __nv_bfloat16 bf16;

// ---- fused-dequant GEMM (gemm_q.cu): C[M, N] = A[M, K] (bf16) * W[N, K]^T -----------------------
enum gemm_epi {
    EPI_F32,         // C f32
    EPI_BF16,        // C bf16
    EPI_ADD_F32,     // C f32 += result (residual add; one writer per element)
    EPI_SWIGLU_BF16, // C bf16 [M, N] = silu(A W^T) * (A Wup^T): gate and up in one GEMM
};

// Grouped (MoE) mode: the rows are sorted by expert; tile i of the map covers rows
// [tiles[3i+1], tiles[3i+2]) of expert tiles[3i] (rows of at most `bm`); *n_tiles tiles are valid
// (read on the device). a_rows (optional) gathers: row r of the GEMM reads A row a_rows[r].
struct gemm_group {
    const int *tiles;
    const int *n_tiles;
    int max_tiles;
    int bm;
    const int *a_rows;
};

// W (and Wup for SWIGLU) may be a stack of experts only in grouped mode; dense mode uses matrix 0.
// N = W->rows, K = W->cols; A has row stride lda elements, C row stride ldc elements.
int pf_gemm(cudaStream_t s, const bf16 *A, int lda, int M, const struct dmat *W,
            const struct dmat *Wup, void *C, int ldc, enum gemm_epi epi,
            const struct gemm_group *grp, struct wren_err *e);
// Dense GEMMs of a few rows (gemm_small.cu): the decode GEMV's int8 machinery over up to 8 rows per
// block; pf_gemm takes it by itself where it fits (4/8-bit weights, M up to a measured limit).
bool pf_gemm_small_fits(const bf16 *A, int lda, int M, const struct dmat *W, const struct dmat *Wup,
                        enum gemm_epi epi, const struct gemm_group *grp, size_t smem_optin);
int pf_gemm_small(cudaStream_t s, const bf16 *A, int lda, int M, const struct dmat *W,
                  const struct dmat *Wup, void *C, int ldc, enum gemm_epi epi, struct wren_err *e);
// Test and benchmark hook: 0 = automatic, 1 = never the small-M kernel, 2 = whenever it fits.
void pf_gemm_small_force(int mode);
// The tile height the grouped GEMM uses for an average of `avg_rows` rows per expert.
int pf_gemm_group_bm(int avg_rows);
// The device's shared memory per block, which bounds the mma.sync kernel's tile height (set by the
// backend; 0 or unset: queried from the current device).
void pf_gemm_set_smem_optin(size_t bytes);
// Test and benchmark hook: forces the tile height (64, 128, 256) of every GEMM; 0 = automatic.
void pf_gemm_force_bm(int bm);
// Test and benchmark hook: 0 = automatic (the sm_90a wgmma kernel of gemm_wg.cu for every call it
// supports, on Hopper), 1 = only the portable mma.sync kernel.
void pf_gemm_force_path(int path);
// Shape of the wgmma kernel's work items (gemm_wg.cu): 1 = 128 weight rows x up to 256 tokens,
// 2 = 256 rows x up to 128 tokens, 3 = 256 rows x up to 32 tokens, two CTAs per SM, 4 = 128 rows
// x up to 128 tokens, two CTAs per SM; 0 = automatic (dense GEMMs 1; grouped GEMMs by the tile
// map's height, which pf_gemm_wg_group_bm picks from the average rows per expert). Forcing a shape
// is a test and benchmark hook. pf_gemm_wg_tokens() is the largest grouped tile the kernel takes.
void pf_gemm_wg_shape(int shape);
// Test and benchmark hook: weight-row blocks per CTA of the wgmma kernel (1, 2, 4, 8, 16; 0 =
// automatic: more blocks hide each CTA's start, fewer keep the SMs evenly loaded).
void pf_gemm_wg_blocks(int nb);
// Test and benchmark hook: shape 1 on the kernel with a loader warpgroup (gemm_wgp.cu) wherever
// it applies, 1 (default), or always on the kernel whose threads all load, 0.
void pf_gemm_wg_producer(int on);
int pf_gemm_wg_tokens();
int pf_gemm_wg_group_bm(int avg_rows);
// sm_90a wgmma path for 4-bit weights (gemm_wg.cu): available on this device and binary (and not
// disabled by pf_gemm_force_path(1)); whether it supports a call; the launch.
bool pf_gemm_wg_available();
bool pf_gemm_wg_fits(const bf16 *A, int lda, int M, const struct dmat *W, const struct dmat *Wup,
                     int ldc, enum gemm_epi epi, const struct gemm_group *grp);
int pf_gemm_wg(cudaStream_t s, const bf16 *A, int lda, int M, const struct dmat *W,
               const struct dmat *Wup, void *C, int ldc, enum gemm_epi epi,
               const struct gemm_group *grp, struct wren_err *e);

// ---- split-K for dense GEMMs of few work items (gemm_split.cu) ----------------------------------
// Both tiled kernels split K into S parts when a dense GEMM has too few CTAs to fill the GPU: each
// part writes raw f32 sums to a workspace [S][M][N] ([S][M][2N] for SwiGLU: gate, then up) and
// pf_gemm_split_reduce adds the parts in a fixed order and applies the epilogue. Without a
// workspace (pf_gemm_set_split_ws) nothing is split. The workspace the automatic choice needs is
// pf_gemm_split_ws_bytes() (a 128 x 256 f32 tile per SM).
constexpr size_t PF_SPLIT_WS_FLOATS_PER_SM = 128 * 256;
void pf_gemm_set_split_ws(float *ws, size_t bytes);
size_t pf_gemm_split_ws_bytes();
float *pf_gemm_split_ws();
int pf_device_sms();
// Parts for a GEMM of `ctas` CTAs (ctas_per_wave resident per SM) over KT k-tiles: 1 = no split.
int pf_gemm_split_parts(int ctas, int ctas_per_wave, int KT, int M, int N, enum gemm_epi epi);
int pf_gemm_split_reduce(cudaStream_t s, int S, int M, int N, void *C, int ldc, enum gemm_epi epi,
                         struct wren_err *e);
// Test and benchmark hook: 0 = automatic, 1 = never split, S >= 2 = S parts wherever K allows.
void pf_gemm_split_force(int parts);

// ---- MoE routing (moe_route.cu) -----------------------------------------------------------------
// From router logits [T, E] f32: top-k (softmax, renormalised when norm_topk) ids/weights [T*k],
// expert-sorted order (sorted_tok[r] = token of row r, slot[t*k+j] = row of token t's j-th choice)
// and the grouped GEMM tile map for tiles of bm rows. counts/offsets/cursor: [E + 1] int scratch.
struct moe_route_buf {
    int *topk_id;
    float *topk_w;
    int *counts, *offsets, *cursor;
    int *sorted_tok, *slot;
    int *tiles, *n_tiles;
    int max_tiles;
};
int pf_moe_route(cudaStream_t s, const float *logits, int T, int E, int k, bool norm_topk, int bm,
                 const struct moe_route_buf *b, struct wren_err *e);
int pf_moe_max_tiles(int T, int E, int k, int bm);
// Test and benchmark hook: the tile map by experts in descending order of rows, 1, or in expert
// order, 0; -1 (default): by size from 112 rows per expert on average.
void pf_moe_tiles_by_size(int mode);
// x[t] += sum_j topk_w[t,j] * y_sorted[slot[t,j]] + g[t] * sh[t] where g = sigmoid(sh_gate[2t])
// (sh_gate has row stride 2; NULL: g = 1); sh NULL: no shared expert
int pf_moe_combine(cudaStream_t s, float *x, const float *y_sorted, const int *slot,
                   const float *topk_w, int T, int k, int H, const float *sh, const float *sh_gate,
                   struct wren_err *e);

// ---- small row kernels (prefill_ops.cu) ---------------------------------------------------------
int pf_embed(cudaStream_t s, const struct dmat *emb, const int32_t *tokens, int T, float *x,
             struct wren_err *e);
// out (bf16) = rmsnorm(x) * w, per row of H
int pf_rmsnorm_bf16(cudaStream_t s, const float *x, const float *w, int T, int H, float eps,
                    bf16 *out, struct wren_err *e);

// ---- gated DeltaNet (dn_chunk.cu) ---------------------------------------------------------------
struct dn_dims {
    int T, kh, vh, dk, dv, kernel; // conv_dim = 2*kh*dk + vh*dv
};
// qkv [T, C] f32 -> qkvc [T, C]: causal depthwise conv over the chunk using conv_state
// [C][kernel-1] (oldest first), then silu; conv_state becomes the chunk's last inputs. q, k in qkvc
// are then l2-normalised per head (q also scaled by dk^-1/2). ba [T, 2*vh] f32 (b | a) becomes
// beta | g in place.
int pf_dn_prep(cudaStream_t s, const struct dn_dims *d, const float *qkv, float *conv_state,
               const float *conv_w, float *qkvc, float *ba, const float *A_log,
               const float *dt_bias, struct wren_err *e);
// The recurrence over the chunk (state S [vh][dk][dv] f32 in place), o [T, vh*dv] f32.
int pf_dn_scan(cudaStream_t s, const struct dn_dims *d, const float *qkv, const float *ba, float *S,
               float *o, struct wren_err *e);
// The same recurrence in the chunked WY/UT form on tensor cores (dn_wy_*.cu): same inputs, outputs
// and state as pf_dn_scan, plus a scratch buffer of pf_dn_chunked_ws_bytes(d) bytes (16-byte
// aligned). Unlike the scan it uses o as scratch before writing it. smem_optin is the device's
// opt-in shared memory per block (cuda_ctx.smem_optin), which decides how the state kernel stages
// its chunks. pf_dn_chunked_fits: the dims are supported (dk 32/64/128, dv a multiple of 16) and
// the device has the shared memory it needs.
size_t pf_dn_chunked_ws_bytes(const struct dn_dims *d);
bool pf_dn_chunked_fits(const struct dn_dims *d, size_t smem_optin);
// Chunk stages the state kernel uses with that much shared memory (2, 1, or 0: does not fit).
int pf_dn_chunked_stages(const struct dn_dims *d, size_t smem_optin);
int pf_dn_chunked(cudaStream_t s, const struct dn_dims *d, size_t smem_optin, const float *qkv,
                  const float *ba, float *S, float *o, void *ws, struct wren_err *e);
// Test and benchmark hook: warps per block of the chunked form's state kernel (1, 2, 4; 0 =
// automatic) and which of its two kernels run (bit 0: the per-chunk prep, bit 1: the state walk;
// 3 = both, the default; one alone only for timing).
void pf_dn_chunked_test(int nw, int kernels);
// y (bf16) = rmsnorm(o per head, w) * silu(z), z [T, vh*dv] bf16
int pf_dn_gate_norm(cudaStream_t s, const struct dn_dims *d, const float *o, const bf16 *z,
                    const float *w, float eps, bf16 *y, struct wren_err *e);

// ---- attention (flash_attn.cu) ------------------------------------------------------------------
struct attn_dims {
    int T, pos, nh, nkv, hd, rope_dim;
    float theta, eps;
    bool gate;
    bool kv_int8; // the caches hold int8 rows (kv_int8.cuh) of kv_row bytes, else bf16
    int kv_row;
};
// q [T, nh*hd*(gate?2:1)] f32 from q_proj, k/v [T, nkv*hd] f32: q/k RMSNorm + RoPE, q to bf16
// [nh][T][hd] in qb, K/V written to the caches (bf16 [ctx][nkv][hd], or int8 rows) at rows
// [pos, pos+T).
int pf_attn_prep(cudaStream_t s, const struct attn_dims *d, const float *q, const float *k,
                 const float *v, const float *q_norm, const float *k_norm, bf16 *qb, void *k_cache,
                 void *v_cache, struct wren_err *e);
// Rows [0, rows) of int8 caches as the values they stand for, bf16 [rows][nkv][hd] in kd / vd
// (what pf_flash_attn then reads: prefill attends to the same values as decode).
int pf_kv_dequant(cudaStream_t s, const struct attn_dims *d, int rows, const void *k_cache,
                  const void *v_cache, bf16 *kd, bf16 *vd, struct wren_err *e);
// Causal attention of the chunk's queries over cache rows [0, pos+T); out bf16 [T, nh*hd],
// multiplied by sigmoid(gate) (read from q) when d->gate. smem_optin: the device's shared memory
// per block (picks the block shape).
int pf_flash_attn(cudaStream_t s, const struct attn_dims *d, const bf16 *qb,
                  const uint16_t *k_cache, const uint16_t *v_cache, const float *q, bf16 *out,
                  size_t smem_optin, struct wren_err *e);
