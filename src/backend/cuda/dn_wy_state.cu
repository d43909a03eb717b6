// The second kernel of the chunked DeltaNet form (derivation in dn_wy.cuh): walks the chunks in
// order for a slice of value columns, taking each chunk's W, K, Q, P, lg and U from
// wy_prep_kernel (dn_wy_prep.cu); D, O and S_new are four products with the state on tensor
// cores. Also the entry points of the form (prefill.cuh), which run the two kernels in turn.
#include "backend/cuda/dn_wy.cuh"

namespace wy {
namespace {

constexpr int PS = CH + 8; // row stride of P (bf16) in shared memory: ldmatrix without conflicts

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

int g_force_warps = 0, g_kernels = 3; // test hooks: block shape; bit 0 prep, bit 1 state kernel

// Warps (of 16 value columns each) per block of wy_state_kernel. Every block stages its head's W,
// K, Q and P (~90 KB per chunk for dk 128) from L2, so more warps per block mean less of that
// traffic and staging work per warp; each warp has its own SM sub-partition either way (4 warps:
// 64 blocks for the 35B layer; 2 warps: 128).
int warps_per_block(const struct dn_dims *d) {
    if (g_force_warps > 0 && d->dv % (16 * g_force_warps) == 0) return g_force_warps;
    return d->dv % 64 == 0 ? 4 : d->dv % 32 == 0 ? 2 : 1;
}

// Chunk stages of wy_state_kernel that fit the device's opt-in shared memory per block; 0: the
// form does not fit.
template <int DK> int stages(const struct dn_dims *d, size_t smem_optin) {
    const size_t sb = stage_layout<DK>::bytes(warps_per_block(d));
    if (2 * sb <= smem_optin) return 2;
    return sb <= smem_optin && (size_t)prep_smem_bytes(DK) <= smem_optin ? 1 : 0;
}

int stages_for(const struct dn_dims *d, size_t smem_optin) {
    switch (d->dk) {
    case 32:
        return stages<32>(d, smem_optin);
    case 64:
        return stages<64>(d, smem_optin);
    case 128:
        return stages<128>(d, smem_optin);
    default:
        return 0;
    }
}

template <int DK>
int launch(cudaStream_t s, const struct dn_dims *d, size_t smem_optin, const float *qkv,
           const float *ba, float *S, float *o, void *ws_base, struct wren_err *e) {
    const int nw = warps_per_block(d), nst = stages<DK>(d, smem_optin);
    const int ssm = nst * stage_layout<DK>::bytes(nw);
    static int attr_set = 0; // bytes the attribute allows, per instantiation
    if (attr_set < ssm) {
        CUDA_CHECK(cudaFuncSetAttribute(wy_state_kernel<DK>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, ssm));
        attr_set = ssm;
    }
    const wy_ws ws = ws_split(ws_base, d);
    if ((g_kernels & 1) && launch_prep(s, d, qkv, ba, o, ws, e)) return -1;
    if (!(g_kernels & 2)) return 0;
    wy_state_kernel<DK><<<dim3(d->dv / (16 * nw), d->vh), 32 * nw, ssm, s>>>(ws, S, o, d->T, d->kh,
                                                                             d->vh, d->dv, nw, nst);
    CUDA_CHECK_LAUNCH();
    return 0;
}

} // namespace
} // namespace wy

void pf_dn_chunked_test(int nw, int kernels) {
    wy::g_force_warps = nw == 1 || nw == 2 || nw == 4 ? nw : 0;
    wy::g_kernels = kernels >= 1 && kernels <= 3 ? kernels : 3;
}

size_t pf_dn_chunked_ws_bytes(const struct dn_dims *d) {
    const int nc = (d->T + wy::CH - 1) / wy::CH;
    return wy::ws_elems_bf16(d, nc) * sizeof(bf16) + (size_t)nc * d->vh * wy::CH * sizeof(float);
}

int pf_dn_chunked_stages(const struct dn_dims *d, size_t smem_optin) {
    return wy::stages_for(d, smem_optin);
}

bool pf_dn_chunked_fits(const struct dn_dims *d, size_t smem_optin) {
    return d->dv % 16 == 0 && d->kh > 0 && d->vh % d->kh == 0 && wy::stages_for(d, smem_optin) > 0;
}

int pf_dn_chunked(cudaStream_t s, const struct dn_dims *d, size_t smem_optin, const float *qkv,
                  const float *ba, float *S, float *o, void *ws, struct wren_err *e) {
    if (!pf_dn_chunked_fits(d, smem_optin))
        return wren_errf(e,
                         "DeltaNet (chunked): dims dk %d dv %d heads %d/%d not supported on this "
                         "device",
                         d->dk, d->dv, d->vh, d->kh);
    if (d->T <= 0) return 0;
    switch (d->dk) {
    case 32:
        return wy::launch<32>(s, d, smem_optin, qkv, ba, S, o, ws, e);
    case 64:
        return wy::launch<64>(s, d, smem_optin, qkv, ba, S, o, ws, e);
    default:
        return wy::launch<128>(s, d, smem_optin, qkv, ba, S, o, ws, e);
    }
}
