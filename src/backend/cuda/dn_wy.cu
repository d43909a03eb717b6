// Gated DeltaNet recurrence in the chunked (WY / UT) form on tensor cores: the same function as
// the sequential scan of dn_chunk.cu (MODEL.md), evaluated CH tokens at a time.
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
#include "backend/cuda/mma.cuh"
#include "backend/cuda/prefill.cuh"

namespace {

constexpr int CH = 64;     // tokens per chunk
constexpr int PS = CH + 8; // row stride of P (bf16) in shared memory: ldmatrix without conflicts
constexpr float LOG_G_MIN = -100.f; // a gate that underflowed to 0 decays by e^-100 instead

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

size_t ws_elems_bf16(const struct dn_dims *d, int nc) {
    return (size_t)nc * CH *
           ((size_t)d->vh * d->dk * 2 + (size_t)d->kh * d->dk * 3 + (size_t)d->vh * CH);
}

wy_ws ws_split(void *base, const struct dn_dims *d) {
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
__device__ __forceinline__ uint32_t pack_bf16(float x, float y) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<const uint32_t *>(&h);
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

// Cumulative log decay of the chunk (warp 0; padded steps decay by 1) and beta into shared memory.
__device__ void load_decay(const float *ba, int t0, int n, int vh, int h, float *lg, float *beta) {
    const int lane = threadIdx.x;
    float l[2];
    for (int i = 0; i < 2; i++) {
        const int t = 2 * lane + i;
        const float *p = ba + (size_t)(t0 + t) * 2 * vh;
        l[i] = t < n ? fmaxf(__logf(p[vh + h]), LOG_G_MIN) : 0.f;
        beta[t] = t < n ? p[h] : 0.f;
    }
    l[1] += l[0];
    float run = l[1];
    for (int o = 1; o < 32; o <<= 1) {
        const float u = __shfl_up_sync(~0u, run, o);
        if (lane >= o) run += u;
    }
    lg[2 * lane] = run - l[1] + l[0];
    lg[2 * lane + 1] = run;
}

// Block per (chunk, key head), 8 warps, taking the key head's vh / kh value heads in turn: K K^T
// and Q K^T are computed once per key head (A and P of each value head only rescale them). Every
// K / Q load of a thread is issued before the first is used, and the W / U right-hand sides are
// loaded before the barriers that precede their use (the first version, a block per value head
// with a thread per W / U column running the 63-step substitution in f32, waited on its loads with
// little in flight, issued slowly and spilled at 255 registers: 0.94 ms at 8K tokens vs 0.33 now).
// The substitution is blocked and runs on tensor cores: with A in 16 x 16 blocks A_ij and
// X_ii = (I + A_ii)^-1 (four small f32 inversions, in place in A), the rows of Y = (I + A)^-1 B
// come 16 at a time as
//     Y_i = X_ii (B_i - sum_{j<i} A_ij Y_j),
// evaluated transposed (Y^T: rows are W / U columns, so each warp owns whole columns and needs no
// other warp's results, and its accumulators are directly the next product's A operand) with the
// 3-pass bf16 split as everywhere else (~16 bits; W is stored at that precision anyway).
constexpr int PREP_THREADS = 256;
constexpr int FS = CH + 8; // f32 row stride of G, QK, A: fragment loads (row g, column 2t) hit 32
                           // distinct banks per half-warp

template <int DK> __host__ __device__ constexpr int prep_main_bytes() {
    return 3 * CH * wy_dims<DK>::KS * 2 > 3 * CH * FS * 4 ? 3 * CH * wy_dims<DK>::KS * 2
                                                          : 3 * CH * FS * 4;
}
// Kh, Kl, Qh (bf16) during the products, then G, QK and A (f32) over them; lg and beta of two value
// heads (the next head's are loaded while the current one is solved).
template <int DK> constexpr int prep_smem() {
    return prep_main_bytes<DK>() + 4 * CH * 4;
}

// The unit-th (of 10) causal 16 x 16 tile of G = K K^T (3 passes) and QK = Q K^T: row block rb,
// column block cb <= rb. Hi-hi and the cross terms go to separate accumulators (shorter chains).
template <int DK>
__device__ __forceinline__ void gram_tile(const bf16 *khs, const bf16 *kls, const bf16 *qhs, int rb,
                                          int cb, float G[2][4], float QK[2][4]) {
    constexpr int KS = wy_dims<DK>::KS;
    const int lane = threadIdx.x & 31;
    float G2[2][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) G[i][j] = G2[i][j] = QK[i][j] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DK / 16; kk++) {
        uint32_t ah[4], al[4], aq[4], bh[4], bl[4];
        ldmatrix_x4(ah, a_addr(khs, KS, 16 * rb, 16 * kk, lane));
        ldmatrix_x4(al, a_addr(kls, KS, 16 * rb, 16 * kk, lane));
        ldmatrix_x4(aq, a_addr(qhs, KS, 16 * rb, 16 * kk, lane));
        ldmatrix_x4(bh, b_addr(khs, KS, 16 * cb, 16 * kk, lane));
        ldmatrix_x4(bl, b_addr(kls, KS, 16 * cb, 16 * kk, lane));
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mma_bf16(G[i], ah, bh[2 * i], bh[2 * i + 1]);
            mma_bf16(QK[i], aq, bh[2 * i], bh[2 * i + 1]);
            mma_bf16(G2[i], al, bh[2 * i], bh[2 * i + 1]);
        }
#pragma unroll
        for (int i = 0; i < 2; i++) mma_bf16(G2[i], ah, bl[2 * i], bl[2 * i + 1]);
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) G[i][j] += G2[i][j];
}

// B fragments (hi, lo) of M^T for the two n8 tiles of a 16 x 16 block of M (f32, rows r0.., columns
// s0..): B[k][n] = M[r0 + n][s0 + k].
__device__ __forceinline__ void bt_frags(const float *M, int r0, int s0, uint32_t bh[2][2],
                                         uint32_t bl[2][2]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int nn = 0; nn < 2; nn++) {
        const float *row = M + (r0 + 8 * nn + g) * FS + s0 + 2 * tq;
        const float2 a0 = *reinterpret_cast<const float2 *>(row);
        const float2 a1 = *reinterpret_cast<const float2 *>(row + 8);
        split2(a0.x, a0.y, bh[nn][0], bl[nn][0]);
        split2(a1.x, a1.y, bh[nn][1], bl[nn][1]);
    }
}

// c[mt][nn] += a[mt] b[nn] in 3 passes (a_lo b_hi, a_hi b_lo, a_hi b_hi), each pass over the
// (up to) 4 independent accumulators.
__device__ __forceinline__ void mma3(float *c[2][2], const uint32_t ah[2][4],
                                     const uint32_t al[2][4], const uint32_t bh[2][2],
                                     const uint32_t bl[2][2], int nmt) {
#pragma unroll
    for (int ps = 0; ps < 3; ps++)
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
            if (mt >= nmt) break;
#pragma unroll
            for (int nn = 0; nn < 2; nn++) {
                if (ps == 0) mma_bf16(c[mt][nn], al[mt], bh[nn][0], bh[nn][1]);
                if (ps == 1) mma_bf16(c[mt][nn], ah[mt], bl[nn][0], bl[nn][1]);
                if (ps == 2) mma_bf16(c[mt][nn], ah[mt], bh[nn][0], bh[nn][1]);
            }
        }
}

// Right-hand side of 32 columns c0.. of [W | U] (16 per m-tile; nmt m-tiles) as Y^T accumulator
// tiles y[mt][token tile]: rows = columns, columns = tokens. Unscaled (beta, gamma come later).
__device__ __forceinline__ void load_rhs(const float *qkv, int C, int t0, int n, int src_w,
                                         int src_u, int DKc, int c0, int nmt,
                                         float y[2][CH / 8][4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < CH / 8; nt++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int col = c0 + 16 * mt + g + 8 * (j >> 1), tok = 8 * nt + 2 * tq + (j & 1);
                const int src = col < DKc ? src_w + col : src_u + col - DKc;
                y[mt][nt][j] =
                    mt < nmt && tok < n ? __ldg(qkv + (size_t)(t0 + tok) * C + src) : 0.f;
            }
}

template <int DK>
__global__ void __launch_bounds__(PREP_THREADS, 2)
    wy_prep_kernel(const float *qkv, const float *ba, float *o, wy_ws ws, int T, int C, int kh,
                   int vh, int dv) {
    constexpr int KS = wy_dims<DK>::KS, NL = CH * DK / 4 / PREP_THREADS;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *khs = (bf16 *)smem, *kls = khs + CH * KS, *qhs = kls + CH * KS;
    float *Gs = (float *)smem, *QKs = Gs + CH * FS, *As = QKs + CH * FS;
    float *dec = (float *)(smem + prep_main_bytes<DK>()); // [2][lg CH | beta CH]
    const int c = blockIdx.x, kq = blockIdx.y, t0 = c * CH, n = min(CH, T - t0), R = vh / kh;
    const int qoff = kq * DK, koff = kh * DK + kq * DK;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;

    { // K and Q rows: all of a thread's loads in flight at once
        float4 kf[NL], qf[NL];
#pragma unroll
        for (int i = 0; i < NL; i++) {
            const int idx = threadIdx.x + i * PREP_THREADS, t = idx / (DK / 4),
                      d = (idx % (DK / 4)) * 4;
            kf[i] = qf[i] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (t < n) {
                const float *row = qkv + (size_t)(t0 + t) * C;
                kf[i] = __ldg(reinterpret_cast<const float4 *>(row + koff + d));
                qf[i] = __ldg(reinterpret_cast<const float4 *>(row + qoff + d));
            }
        }
        if (w == 0) load_decay(ba, t0, n, vh, kq * R, dec, dec + CH);
        bf16 *Kd = ws.K + ((size_t)c * kh + kq) * 2 * CH * DK;
        bf16 *Qd = ws.Q + ((size_t)c * kh + kq) * CH * DK;
#pragma unroll
        for (int i = 0; i < NL; i++) {
            const int idx = threadIdx.x + i * PREP_THREADS, t = idx / (DK / 4),
                      d = (idx % (DK / 4)) * 4;
            uint32_t h0, l0, h1, l1;
            split2(kf[i].x, kf[i].y, h0, l0);
            split2(kf[i].z, kf[i].w, h1, l1);
            const uint2 kh2 = make_uint2(h0, h1), kl2 = make_uint2(l0, l1),
                        q2 = make_uint2(pack_bf16(qf[i].x, qf[i].y), pack_bf16(qf[i].z, qf[i].w));
            *reinterpret_cast<uint2 *>(khs + t * KS + d) = kh2;
            *reinterpret_cast<uint2 *>(kls + t * KS + d) = kl2;
            *reinterpret_cast<uint2 *>(qhs + t * KS + d) = q2;
            *reinterpret_cast<uint2 *>(Kd + t * DK + d) = kh2;
            *reinterpret_cast<uint2 *>(Kd + (CH + t) * DK + d) = kl2;
            *reinterpret_cast<uint2 *>(Qd + t * DK + d) = q2;
        }
    }
    __syncthreads();
    { // G and QK, causal 16 x 16 tiles: warp w takes tiles w and w + 8 (of 10)
        float G[2][2][4], QK[2][2][4];
        int rb[2], cb[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int u = w + 8 * k;
            rb[k] = u < 1 ? 0 : u < 3 ? 1 : u < 6 ? 2 : 3;
            cb[k] = u - rb[k] * (rb[k] + 1) / 2;
            if (u < 10) gram_tile<DK>(khs, kls, qhs, rb[k], cb[k], G[k], QK[k]);
        }
        __syncthreads(); // G, QK and A overwrite the bf16 tiles
#pragma unroll
        for (int k = 0; k < 2; k++) {
            if (w + 8 * k >= 10) break;
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int off = (16 * rb[k] + g + 8 * hf) * FS + 16 * cb[k] + 8 * i + 2 * tq;
                    *reinterpret_cast<float2 *>(Gs + off) =
                        make_float2(G[k][i][2 * hf], G[k][i][2 * hf + 1]);
                    *reinterpret_cast<float2 *>(QKs + off) =
                        make_float2(QK[k][i][2 * hf], QK[k][i][2 * hf + 1]);
                }
        }
    }

    const int MT = (DK + dv) / 16, NP = (MT + 1) / 2; // m-tiles of 16 [W | U] columns; pairs
    for (int r = 0; r < R; r++) {
        const int h = kq * R + r, voff = 2 * kh * DK + h * dv;
        const float *lg = dec + (r & 1) * 2 * CH, *beta = lg + CH;
        float y[2][CH / 8][4];
        int p = w;
        if (p < NP) load_rhs(qkv, C, t0, n, koff, voff, DK, 32 * p, 2 * p + 1 < MT ? 2 : 1, y);
        __syncthreads();
        // A (strictly lower; blocks above the diagonal are never read) and P of this value head.
        bf16 *P = ws.P + ((size_t)c * vh + h) * CH * CH;
        for (int i = threadIdx.x; i < CH * CH / 8; i += PREP_THREADS) {
            const int t = i / (CH / 8), s0 = (i % (CH / 8)) * 8;
            uint32_t pk[4] = {0u, 0u, 0u, 0u};
            if (s0 <= t) {
                float pv[8];
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    const int s = s0 + k;
                    const float d = __expf(fminf(lg[t] - lg[s], 0.f));
                    As[t * FS + s] = s < t ? beta[t] * d * Gs[t * FS + s] : 0.f;
                    pv[k] = s <= t ? d * QKs[t * FS + s] : 0.f;
                }
#pragma unroll
                for (int k = 0; k < 4; k++) pk[k] = pack_bf16(pv[2 * k], pv[2 * k + 1]);
            }
            *reinterpret_cast<uint4 *>(P + t * CH + s0) = make_uint4(pk[0], pk[1], pk[2], pk[3]);
        }
        if (threadIdx.x < CH) ws.lg[((size_t)c * vh + h) * CH + threadIdx.x] = lg[threadIdx.x];
        __syncthreads();
        if (w < CH / 16) { // X_ww = (I + A_ww)^-1 by forward substitution, a column per lane
            const int b = 16 * w, col = lane & 15;
            float x[16];
#pragma unroll
            for (int rr = 0; rr < 16; rr++) {
                float acc = rr == col ? 1.f : 0.f;
#pragma unroll
                for (int s = 0; s < rr; s++) acc -= As[(b + rr) * FS + b + s] * x[s];
                x[rr] = acc;
            }
            __syncwarp();
            if (lane < 16)
#pragma unroll
                for (int rr = 0; rr < 16; rr++) As[(b + rr) * FS + b + col] = x[rr];
        }
        __syncthreads();
        for (; p < NP; p += PREP_THREADS / 32) {
            const int c0 = 32 * p, nmt = 2 * p + 1 < MT ? 2 : 1;
            const bool isw = c0 < DK;
#pragma unroll
            for (int nt = 0; nt < CH / 8; nt++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int tok = 8 * nt + 2 * tq + j;
                    const float sc = beta[tok] * (isw ? __expf(lg[tok]) : 1.f);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        y[mt][nt][j] *= sc;
                        y[mt][nt][j + 2] *= sc;
                    }
                }
#pragma unroll
            for (int i = 0; i < CH / 16; i++) {
                float *acc[2][2] = {{y[0][2 * i], y[0][2 * i + 1]}, {y[1][2 * i], y[1][2 * i + 1]}};
                uint32_t ah[2][4], al[2][4], bh[2][2], bl[2][2];
#pragma unroll
                for (int j = 0; j < i; j++) { // R_i^T -= Y_j^T A_ij^T
                    bt_frags(As, 16 * i, 16 * j, bh, bl);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        acc_to_a(y[mt][2 * j], y[mt][2 * j + 1], ah[mt], al[mt]);
#pragma unroll
                        for (int k = 0; k < 4; k++) { // negated: the split is sign-symmetric
                            ah[mt][k] ^= 0x80008000u;
                            al[mt][k] ^= 0x80008000u;
                        }
                    }
                    mma3(acc, ah, al, bh, bl, nmt);
                }
                // Y_i^T = R_i^T X_ii^T
                bt_frags(As, 16 * i, 16 * i, bh, bl);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    acc_to_a(y[mt][2 * i], y[mt][2 * i + 1], ah[mt], al[mt]);
#pragma unroll
                    for (int k = 0; k < 4; k++) y[mt][2 * i][k] = y[mt][2 * i + 1][k] = 0.f;
                }
                mma3(acc, ah, al, bh, bl, nmt);
            }
            // Out: lanes g, g^1 swap one value so each holds two adjacent columns of one token.
            bf16 *Wd = ws.W + ((size_t)c * vh + h) * 2 * CH * DK;
            const bool odd = g & 1;
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                if (mt >= nmt) break;
#pragma unroll
                for (int nt = 0; nt < CH / 8; nt++)
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        const float v0 = y[mt][nt][2 * hf], v1 = y[mt][nt][2 * hf + 1];
                        const float rv = __shfl_xor_sync(~0u, odd ? v0 : v1, 4);
                        const float e0 = odd ? rv : v0, e1 = odd ? v1 : rv;
                        const int tok = 8 * nt + 2 * tq + odd;
                        const int d0 = c0 + 16 * mt + (g & ~1) + 8 * hf;
                        if (isw) {
                            uint32_t hi, lo;
                            split2(e0, e1, hi, lo);
                            *reinterpret_cast<uint32_t *>(Wd + tok * DK + d0) = hi;
                            *reinterpret_cast<uint32_t *>(Wd + (CH + tok) * DK + d0) = lo;
                        } else if (tok < n) {
                            *reinterpret_cast<float2 *>(o + (size_t)(t0 + tok) * vh * dv + h * dv +
                                                        d0 - DK) = make_float2(e0, e1);
                        }
                    }
            }
            const int pn = p + PREP_THREADS / 32;
            if (pn < NP)
                load_rhs(qkv, C, t0, n, koff, voff, DK, 32 * pn, 2 * pn + 1 < MT ? 2 : 1, y);
        }
        if (w == 0 && r + 1 < R)
            load_decay(ba, t0, n, vh, h + 1, dec + ((r + 1) & 1) * 2 * CH,
                       dec + ((r + 1) & 1) * 2 * CH + CH);
        __syncthreads();
    }
}

// Shared-memory stage of one chunk for wy_state_kernel.
template <int DK> struct stage_layout {
    static constexpr int KS = wy_dims<DK>::KS;
    static constexpr int TILE = CH * KS; // bf16 elements of one [CH][DK] tile
    static __host__ __device__ int us(int nw) { return 16 * nw + 4; } // U row stride (floats)
    static __host__ __device__ int bytes(int nw) {
        return (5 * TILE + CH * PS) * 2 + (CH * us(nw) + CH) * 4;
    }
};

// Copies chunk c's W (hi, lo), K (hi, lo), Q, P, lg and the block's U columns into a stage.
template <int DK>
__device__ void stage_chunk(unsigned char *st, const wy_ws &ws, const float *o, int c, int T,
                            int kh, int vh, int dv, int h, int j0, int nw) {
    using L = stage_layout<DK>;
    bf16 *Wh = (bf16 *)st, *Kh = Wh + 2 * L::TILE, *Qh = Kh + 2 * L::TILE, *Ps = Qh + L::TILE;
    float *Us = (float *)(Ps + CH * PS), *lgs = Us + CH * L::us(nw);
    const int khead = h / (vh / kh), nth = 32 * nw, tid = threadIdx.x;
    const bf16 *Wg = ws.W + ((size_t)c * vh + h) * 2 * CH * DK;
    const bf16 *Kg = ws.K + ((size_t)c * kh + khead) * 2 * CH * DK;
    const bf16 *Qg = ws.Q + ((size_t)c * kh + khead) * CH * DK;
    const bf16 *Pg = ws.P + ((size_t)c * vh + h) * CH * CH;
    constexpr int RC = DK / 8; // 16-byte chunks per row
    for (int i = tid; i < 2 * CH * RC; i += nth) {
        const int r = i / RC, d = (i % RC) * 8; // r < 2 CH: hi rows then lo rows
        cp_async16(Wh + r * L::KS + d, Wg + r * DK + d, true);
        cp_async16(Kh + r * L::KS + d, Kg + r * DK + d, true);
    }
    for (int i = tid; i < CH * RC; i += nth) {
        const int r = i / RC, d = (i % RC) * 8;
        cp_async16(Qh + r * L::KS + d, Qg + r * DK + d, true);
    }
    for (int i = tid; i < CH * CH / 8; i += nth) {
        const int r = i / (CH / 8), d = (i % (CH / 8)) * 8;
        cp_async16(Ps + r * PS + d, Pg + r * CH + d, true);
    }
    const int t0 = c * CH;
    for (int i = tid; i < CH * 4 * nw; i += nth) { // U rows past T are zero
        const int r = i / (4 * nw), d = (i % (4 * nw)) * 4;
        const bool in = t0 + r < T;
        cp_async16(Us + r * L::us(nw) + d,
                   o + (size_t)(in ? t0 + r : 0) * vh * dv + h * dv + j0 + d, in);
    }
    for (int i = tid; i < CH / 4; i += nth)
        cp_async16(lgs + 4 * i, ws.lg + ((size_t)c * vh + h) * CH + 4 * i, true);
    cp_async_commit();
}

// The mma helpers are volatile asm and are issued in source order, and an mma that accumulates into
// the result of the previous one waits for it (~30 cycles). So every product below runs its passes
// over 8 independent accumulator tiles in turn (the first version chained the 2-3 passes of each
// tile and ran ~5x below the tensor rate).

// D^T = U^T - S^T W^T (3 passes) and O^T = S^T Q^T (2 passes) over the chunk's CH tokens.
template <int DK>
__device__ __forceinline__ void state_products(const float st[DK / 8][4], const bf16 *Wh,
                                               const bf16 *Wl, const bf16 *Qh, float dt[CH / 8][4],
                                               float ot[CH / 8][4]) {
    constexpr int KS = wy_dims<DK>::KS;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < CH / 8; i++)
        for (int j = 0; j < 4; j++) dt[i][j] = ot[i][j] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DK / 16; kk++) {
        uint32_t ah[4], al[4];
        acc_to_a(st[2 * kk], st[2 * kk + 1], ah, al);
#pragma unroll
        for (int hf = 0; hf < 2; hf++) { // token tiles 4 hf .. 4 hf + 3
            uint32_t wh[2][4], wl[2][4], q[2][4];
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int r0 = 32 * hf + 16 * j;
                ldmatrix_x4(wh[j], b_addr(Wh, KS, r0, 16 * kk, lane));
                ldmatrix_x4(wl[j], b_addr(Wl, KS, r0, 16 * kk, lane));
                ldmatrix_x4(q[j], b_addr(Qh, KS, r0, 16 * kk, lane));
            }
#pragma unroll
            for (int ps = 0; ps < 3; ps++) {
#pragma unroll
                for (int j = 0; j < 2; j++)
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        const int nt = 4 * hf + 2 * j + i;
                        if (ps == 0) mma_bf16(dt[nt], al, wh[j][2 * i], wh[j][2 * i + 1]);
                        if (ps == 1) mma_bf16(dt[nt], ah, wl[j][2 * i], wl[j][2 * i + 1]);
                        if (ps == 2) mma_bf16(dt[nt], ah, wh[j][2 * i], wh[j][2 * i + 1]);
                    }
                if (ps == 2) break;
#pragma unroll
                for (int j = 0; j < 2; j++)
#pragma unroll
                    for (int i = 0; i < 2; i++)
                        mma_bf16(ot[4 * hf + 2 * j + i], ps ? ah : al, q[j][2 * i],
                                 q[j][2 * i + 1]);
            }
        }
    }
}

// O^T += D^T P^T (2 passes; P is causal: only token tiles at or below the diagonal block).
__device__ __forceinline__ void intra_products(const float dt[CH / 8][4], const bf16 *Ps,
                                               float ot[CH / 8][4]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int ks = 0; ks < CH / 16; ks++) {
        uint32_t ah[4], al[4], p[CH / 16][4];
        acc_to_a(dt[2 * ks], dt[2 * ks + 1], ah, al);
#pragma unroll
        for (int np = ks; np < CH / 16; np++)
            ldmatrix_x4(p[np], b_addr(Ps, PS, 16 * np, 16 * ks, lane));
#pragma unroll
        for (int ps = 0; ps < 2; ps++)
#pragma unroll
            for (int np = ks; np < CH / 16; np++)
#pragma unroll
                for (int i = 0; i < 2; i++)
                    mma_bf16(ot[2 * np + i], ps ? ah : al, p[np][2 * i], p[np][2 * i + 1]);
    }
}

// S^T += D~^T K (3 passes), 4 key-dim tile pairs (8 accumulator tiles) at a time.
template <int DK>
__device__ __forceinline__ void state_update(const float dt[CH / 8][4], const bf16 *Kh,
                                             const bf16 *Kl, float st[DK / 8][4]) {
    constexpr int KS = wy_dims<DK>::KS, NG = DK / 16 < 4 ? DK / 16 : 4;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int ks = 0; ks < CH / 16; ks++) {
        uint32_t ah[4], al[4];
        acc_to_a(dt[2 * ks], dt[2 * ks + 1], ah, al);
#pragma unroll
        for (int g0 = 0; g0 < DK / 16; g0 += NG) {
            uint32_t kh[NG][4], kl[NG][4];
#pragma unroll
            for (int j = 0; j < NG; j++) {
                ldmatrix_x4_trans(kh[j], bt_addr(Kh, KS, 16 * ks, 16 * (g0 + j), lane));
                ldmatrix_x4_trans(kl[j], bt_addr(Kl, KS, 16 * ks, 16 * (g0 + j), lane));
            }
#pragma unroll
            for (int ps = 0; ps < 3; ps++)
#pragma unroll
                for (int j = 0; j < NG; j++)
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        float *c = st[2 * (g0 + j) + i];
                        if (ps == 0) mma_bf16(c, al, kh[j][2 * i], kh[j][2 * i + 1]);
                        if (ps == 1) mma_bf16(c, ah, kl[j][2 * i], kl[j][2 * i + 1]);
                        if (ps == 2) mma_bf16(c, ah, kh[j][2 * i], kh[j][2 * i + 1]);
                    }
        }
    }
}

// One chunk for a warp's 16 value columns: st[DK/8][4] holds S^T (rows: the columns j of S,
// columns: the key dims d) as m16n8 accumulator tiles.
template <int DK>
__device__ void chunk_step(const unsigned char *stg, float st[DK / 8][4], float *o, int c, int T,
                           int vh, int dv, int h, int jw, int wcol, int nw) {
    using L = stage_layout<DK>;
    const bf16 *Wh = (const bf16 *)stg, *Wl = Wh + L::TILE, *Kh = Wl + L::TILE, *Kl = Kh + L::TILE,
               *Qh = Kl + L::TILE, *Ps = Qh + L::TILE;
    const float *Us = (const float *)(Ps + CH * PS), *lgs = Us + CH * L::us(nw);
    const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;

    float dt[CH / 8][4], ot[CH / 8][4]; // D^T and O^T: [16 columns][CH tokens]
    state_products<DK>(st, Wh, Wl, Qh, dt, ot);
    const float lgC = lgs[CH - 1];
#pragma unroll
    for (int nt = 0; nt < CH / 8; nt++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int tok = 8 * nt + 2 * tq + (i & 1), col = wcol + g + 8 * (i >> 1);
            dt[nt][i] = Us[tok * L::us(nw) + col] - dt[nt][i];
            ot[nt][i] *= __expf(lgs[tok]);
        }
    }
    intra_products(dt, Ps, ot);
    // S^T = gamma_C S^T + (D^T diag(gamma_C / gamma)) K.
#pragma unroll
    for (int nt = 0; nt < CH / 8; nt++) {
        const int s = 8 * nt + 2 * tq;
        const float r0 = __expf(lgC - lgs[s]), r1 = __expf(lgC - lgs[s + 1]);
        dt[nt][0] *= r0;
        dt[nt][1] *= r1;
        dt[nt][2] *= r0;
        dt[nt][3] *= r1;
    }
    const float gC = __expf(lgC);
#pragma unroll
    for (int i = 0; i < DK / 8; i++)
        for (int j = 0; j < 4; j++) st[i][j] *= gC;
    state_update<DK>(dt, Kh, Kl, st);
    const int t0 = c * CH;
#pragma unroll
    for (int nt = 0; nt < CH / 8; nt++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int tok = t0 + 8 * nt + 2 * tq + (i & 1);
            if (tok < T) o[(size_t)tok * vh * dv + h * dv + jw + g + 8 * (i >> 1)] = ot[nt][i];
        }
    }
}

// Block per (value head, 16 nw value columns), warp per 16 columns (nw <= 4); walks the chunks in
// order with the next chunk's inputs staged by cp.async while the current one is computed (nst = 2
// stages).
template <int DK>
__global__ void __launch_bounds__(128)
    wy_state_kernel(wy_ws ws, float *S, float *o, int T, int kh, int vh, int dv, int nw, int nst) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int h = blockIdx.y, j0 = blockIdx.x * 16 * nw, w = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, jw = j0 + 16 * w;
    const int nc = (T + CH - 1) / CH, sb = stage_layout<DK>::bytes(nw);
    float *Sh = S + (size_t)h * DK * dv;

    float st[DK / 8][4]; // S^T[j][d]: rows j = jw + g (+8), columns d = 8i + 2tq (+1)
#pragma unroll
    for (int i = 0; i < DK / 8; i++)
        for (int j = 0; j < 4; j++)
            st[i][j] = Sh[(size_t)(8 * i + 2 * tq + (j & 1)) * dv + jw + g + 8 * (j >> 1)];

    stage_chunk<DK>(smem, ws, o, 0, T, kh, vh, dv, h, j0, nw);
    for (int c = 0; c < nc; c++) {
        const int buf = nst == 2 ? c & 1 : 0;
        cp_async_wait<0>();
        __syncthreads();
        if (nst == 2 && c + 1 < nc)
            stage_chunk<DK>(smem + (buf ^ 1) * sb, ws, o, c + 1, T, kh, vh, dv, h, j0, nw);
        chunk_step<DK>(smem + buf * sb, st, o, c, T, vh, dv, h, jw, 16 * w, nw);
        if (nst == 1 && c + 1 < nc) {
            __syncthreads();
            stage_chunk<DK>(smem, ws, o, c + 1, T, kh, vh, dv, h, j0, nw);
        }
    }
#pragma unroll
    for (int i = 0; i < DK / 8; i++)
        for (int j = 0; j < 4; j++)
            Sh[(size_t)(8 * i + 2 * tq + (j & 1)) * dv + jw + g + 8 * (j >> 1)] = st[i][j];
}

int dev_smem_optin() {
    static int v = -1;
    if (v < 0) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
            v = 48 * 1024;
    }
    return v;
}

int g_force_warps = 0, g_kernels = 3; // test hooks: block shape; bit 0 prep, bit 1 state kernel

// Warps (of 16 value columns each) per block of wy_state_kernel. Every block stages its head's W,
// K, Q and P (~90 KB per chunk for dk 128) from L2, so more warps per block mean less of that
// traffic and staging work per warp; each warp has its own SM sub-partition either way (4 warps:
// 64 blocks for the 35B layer; 2 warps: 128).
int warps_per_block(const struct dn_dims *d) {
    if (g_force_warps > 0 && d->dv % (16 * g_force_warps) == 0) return g_force_warps;
    return d->dv % 64 == 0 ? 4 : d->dv % 32 == 0 ? 2 : 1;
}

template <int DK> int stages(const struct dn_dims *d) {
    const int nw = warps_per_block(d), optin = dev_smem_optin();
    if (2 * stage_layout<DK>::bytes(nw) <= optin) return 2;
    return stage_layout<DK>::bytes(nw) <= optin && prep_smem<DK>() <= optin ? 1 : 0;
}

int stages_for(const struct dn_dims *d) {
    switch (d->dk) {
    case 32:
        return stages<32>(d);
    case 64:
        return stages<64>(d);
    case 128:
        return stages<128>(d);
    default:
        return 0;
    }
}

template <int DK>
int launch(cudaStream_t s, const struct dn_dims *d, const float *qkv, const float *ba, float *S,
           float *o, void *ws_base, struct wren_err *e) {
    const int C = 2 * d->kh * DK + d->vh * d->dv, nc = (d->T + CH - 1) / CH;
    const int nw = warps_per_block(d), nst = stages<DK>(d);
    const int psm = prep_smem<DK>(), ssm = nst * stage_layout<DK>::bytes(nw);
    static int attr_set = 0; // bytes the attribute allows, per instantiation
    if (attr_set < ssm) {
        CUDA_CHECK(cudaFuncSetAttribute(wy_prep_kernel<DK>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, psm));
        CUDA_CHECK(cudaFuncSetAttribute(wy_state_kernel<DK>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, ssm));
        attr_set = ssm;
    }
    const wy_ws ws = ws_split(ws_base, d);
    if (g_kernels & 1) {
        wy_prep_kernel<DK><<<dim3(nc, d->kh), PREP_THREADS, psm, s>>>(qkv, ba, o, ws, d->T, C,
                                                                      d->kh, d->vh, d->dv);
        CUDA_CHECK_LAUNCH();
    }
    if (!(g_kernels & 2)) return 0;
    wy_state_kernel<DK><<<dim3(d->dv / (16 * nw), d->vh), 32 * nw, ssm, s>>>(ws, S, o, d->T, d->kh,
                                                                             d->vh, d->dv, nw, nst);
    CUDA_CHECK_LAUNCH();
    return 0;
}

} // namespace

void pf_dn_chunked_test(int nw, int kernels) {
    g_force_warps = nw == 1 || nw == 2 || nw == 4 ? nw : 0;
    g_kernels = kernels >= 1 && kernels <= 3 ? kernels : 3;
}

size_t pf_dn_chunked_ws_bytes(const struct dn_dims *d) {
    const int nc = (d->T + CH - 1) / CH;
    return ws_elems_bf16(d, nc) * sizeof(bf16) + (size_t)nc * d->vh * CH * sizeof(float);
}

bool pf_dn_chunked_fits(const struct dn_dims *d) {
    return d->dv % 16 == 0 && d->kh > 0 && d->vh % d->kh == 0 && stages_for(d) > 0;
}

int pf_dn_chunked(cudaStream_t s, const struct dn_dims *d, const float *qkv, const float *ba,
                  float *S, float *o, void *ws, struct wren_err *e) {
    if (!pf_dn_chunked_fits(d))
        return wren_errf(e,
                         "DeltaNet (chunked): dims dk %d dv %d heads %d/%d not supported on this "
                         "device",
                         d->dk, d->dv, d->vh, d->kh);
    if (d->T <= 0) return 0;
    switch (d->dk) {
    case 32:
        return launch<32>(s, d, qkv, ba, S, o, ws, e);
    case 64:
        return launch<64>(s, d, qkv, ba, S, o, ws, e);
    default:
        return launch<128>(s, d, qkv, ba, S, o, ws, e);
    }
}
