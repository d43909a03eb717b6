// Gated DeltaNet recurrence in the chunked (WY / UT) form on tensor cores: the same function as
// the sequential scan of dn_chunk.cu (MODEL.md), evaluated CH tokens at a time. What the two
// kernels of the form (dn_wy_prep.cu, dn_wy_state.cu) share: the chunk size, the workspace through
// which the first hands its results to the second, and the bf16 fragment helpers.
//
// Per value head, with S0 the state before a chunk, gamma_t = g_1 ... g_t (decay products inside
// the chunk, kept as cumulative logs lg_t) and rows t, s < CH of the chunk, unrolling the
// recurrence gives the chunk's deltas D (delta_t = beta_t (v_t - (g_t S_{t-1})^T k_t)) as
//     (I + A) D = diag(beta) V - diag(beta gamma) K S0,  A[t][s] = beta_t gamma_t/gamma_s k_t.k_s
// for s < t (else 0). With X = (I + A)^-1 (forward substitution):
//     U = X diag(beta) V,  W = X diag(beta gamma) K,  D = U - W S0,
//     O = diag(gamma) Q S0 + P D,  P[t][s] = gamma_t/gamma_s q_t.k_s (s <= t),
//     S_new = gamma_C S0 + (diag(gamma_C / gamma) K)^T D.
// Everything that does not need S0 is independent per chunk: `wy_prep_kernel` computes it for
// all chunks at once (A and P from K K^T and Q K^T, then W and U by blocked forward substitution,
// all on tensor cores). `wy_state_kernel` then walks the chunks in order for a slice of value
// columns: D, O and S_new are four products with S on tensor cores.
//
// Precision: the state is f32 in registers and every product that feeds it (K K^T, W S, K^T D)
// runs in three bf16 passes (a_hi b_hi + a_hi b_lo + a_lo b_hi, each operand split into a bf16
// high part and the bf16 of its remainder: ~16 significant bits), so the state follows the f32
// recurrence instead of drifting with bf16 rounding. Products that only reach the output (Q K^T,
// Q S, P D) use bf16 Q and P (the output is rounded to bf16 before out_proj anyway) with S and D
// still split. Decay ratios are exp of differences of cumulative logs, always <= 1: no overflow
// even when a gate underflows to 0.
#pragma once
#include "backend/cuda/mma.cuh"
#include "backend/cuda/prefill.cuh"

namespace wy {

constexpr int CH = 64; // tokens per chunk

template <int DK> struct wy_dims {
    static constexpr int KS = DK + 8; // bf16 row stride of K/Q/W tiles: ldmatrix without conflicts
};

// Workspace layout (per call, nc = ceil(T / CH) chunks; bf16 unless noted):
//   W  [nc][vh][2][CH][DK]  hi and lo parts        K  [nc][kh][2][CH][DK]  hi and lo parts
//   Q  [nc][kh][CH][DK]                            P  [nc][vh][CH][CH]
//   lg [nc][vh][CH] f32 (cumulative log decay)
// U is written into o (same shape as the output; each chunk's U is read before its O is written).
struct wy_ws {
    bf16 *W, *K, *Q, *P;
    float *lg;
};

inline size_t ws_elems_bf16(const struct dn_dims *d, int nc) {
    return (size_t)nc * CH *
           ((size_t)d->vh * d->dk * 2 + (size_t)d->kh * d->dk * 3 + (size_t)d->vh * CH);
}

inline wy_ws ws_split(void *base, const struct dn_dims *d) {
    const int nc = (d->T + CH - 1) / CH;
    wy_ws w;
    w.W = (bf16 *)base;
    w.K = w.W + (size_t)nc * d->vh * 2 * CH * d->dk;
    w.Q = w.K + (size_t)nc * d->kh * 2 * CH * d->dk;
    w.P = w.Q + (size_t)nc * d->kh * CH * d->dk;
    w.lg = (float *)(w.P + (size_t)nc * d->vh * CH * CH);
    return w;
}

// bf16 hi / lo parts of two consecutive values, packed as an mma operand register each.
__device__ __forceinline__ void split2(float x, float y, uint32_t &hi, uint32_t &lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    const __nv_bfloat162 l = __floats2bfloat162_rn(x - __low2float(h), y - __high2float(h));
    hi = *reinterpret_cast<const uint32_t *>(&h);
    lo = *reinterpret_cast<const uint32_t *>(&l);
}

// A-operand fragments (hi, lo) of a 16 x 16 block held as two m16n8 accumulator tiles c0, c1
// (columns 0-7 and 8-15): the accumulator layout of row g / g+8, columns 2t, 2t+1 is the A layout.
__device__ __forceinline__ void acc_to_a(const float c0[4], const float c1[4], uint32_t hi[4],
                                         uint32_t lo[4]) {
    split2(c0[0], c0[1], hi[0], lo[0]);
    split2(c0[2], c0[3], hi[1], lo[1]);
    split2(c1[0], c1[1], hi[2], lo[2]);
    split2(c1[2], c1[3], hi[3], lo[3]);
}

// Lane address of an ldmatrix_x4 that loads the B fragments of two n8 tiles (rows r0.. r0+15 of a
// row-major [n][k] tile, k columns k0.. k0+15): matrices (n 0-7, k lo), (n 0-7, k hi),
// (n 8-15, k lo), (n 8-15, k hi).
__device__ __forceinline__ const bf16 *b_addr(const bf16 *base, int stride, int r0, int k0,
                                              int lane) {
    return base + (size_t)(r0 + (lane & 7) + ((lane >> 4) << 3)) * stride + k0 +
           ((lane >> 3) & 1) * 8;
}
// Lane address of an ldmatrix_x4_trans loading B fragments of two n8 tiles from a row-major
// [k][n] tile (rows k0.. k0+15, columns n0.. n0+15).
__device__ __forceinline__ const bf16 *bt_addr(const bf16 *base, int stride, int k0, int n0,
                                               int lane) {
    return base + (size_t)(k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * stride + n0 + (lane >> 4) * 8;
}
// Lane address of an ldmatrix_x4 loading the A fragment of rows r0.. r0+15, k0.. k0+15.
__device__ __forceinline__ const bf16 *a_addr(const bf16 *base, int stride, int r0, int k0,
                                              int lane) {
    return base + (size_t)(r0 + (lane & 15)) * stride + k0 + (lane >> 4) * 8;
}

// wy_prep_kernel (dn_wy_prep.cu): its dynamic shared memory for key dim dk, and its launch over
// all chunks of d (W, K, Q, P and lg into ws, U into o).
int prep_smem_bytes(int dk);
int launch_prep(cudaStream_t s, const struct dn_dims *d, const float *qkv, const float *ba,
                float *o, const wy_ws &ws, struct wren_err *e);

} // namespace wy
