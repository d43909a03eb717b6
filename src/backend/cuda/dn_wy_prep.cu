// The first kernel of the chunked DeltaNet form (derivation in dn_wy.cuh): everything of a chunk
// that does not need the state before it, for all chunks at once. A and P come from K K^T and
// Q K^T, then W and U by blocked forward substitution, all on tensor cores; W, K, Q, P and lg go
// to the workspace, U into o, for wy_state_kernel (dn_wy_state.cu).
#include "backend/cuda/dn_wy.cuh"

namespace wy {
namespace {

constexpr float LOG_G_MIN = -100.f; // a gate that underflowed to 0 decays by e^-100 instead

__device__ __forceinline__ uint32_t pack_bf16(float x, float y) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<const uint32_t *>(&h);
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

template <int DK>
int launch(cudaStream_t s, const struct dn_dims *d, const float *qkv, const float *ba, float *o,
           const wy_ws &ws, struct wren_err *e) {
    const int C = 2 * d->kh * DK + d->vh * d->dv, nc = (d->T + CH - 1) / CH;
    static bool attr_set = false; // per instantiation
    if (!attr_set) {
        CUDA_CHECK(cudaFuncSetAttribute(
            wy_prep_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize, prep_smem<DK>()));
        attr_set = true;
    }
    wy_prep_kernel<DK><<<dim3(nc, d->kh), PREP_THREADS, prep_smem<DK>(), s>>>(
        qkv, ba, o, ws, d->T, C, d->kh, d->vh, d->dv);
    CUDA_CHECK_LAUNCH();
    return 0;
}

} // namespace

int prep_smem_bytes(int dk) {
    switch (dk) {
    case 32:
        return prep_smem<32>();
    case 64:
        return prep_smem<64>();
    default:
        return prep_smem<128>();
    }
}

int launch_prep(cudaStream_t s, const struct dn_dims *d, const float *qkv, const float *ba,
                float *o, const wy_ws &ws, struct wren_err *e) {
    switch (d->dk) {
    case 32:
        return launch<32>(s, d, qkv, ba, o, ws, e);
    case 64:
        return launch<64>(s, d, qkv, ba, o, ws, e);
    default:
        return launch<128>(s, d, qkv, ba, o, ws, e);
    }
}

} // namespace wy
