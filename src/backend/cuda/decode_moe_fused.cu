// The MoE block's experts in one launch (batch-1 decode, 4-bit experts): routing, gate/up +
// SwiGLU and the down projection with its weighted sum into the residual, instead of the expert
// launch followed by the down launch (qgemv_kernel, qdown_kernel). The down launch had to wait for
// every expert's whole output; here a unit of work is 32 output columns of one expert, which one
// block turns into its share of the down projection itself: the 32 columns are one int8 block of
// the down input and one 16-byte chunk of every 4-bit down row.
//
// A unit: its expert's 32 gate and 32 up rows (bulk copies on sm_90+, else cp.async) and the
// matching down chunk of every hidden row (cp.async) in shared memory, the 32 SwiGLU outputs times
// the routing weight (the expert launch's dot products and epilogue: the same bits), quantized as
// one block of the int8 activation (qx_quant_unit), then hidden partial sums of the down
// projection. A block runs one routed unit; where two units fit in shared memory (sm_90: 227 KB)
// the first blocks also run one of the shared expert's, whose weights are copied before the
// programmatic wait (they are known), so each block has an SM to itself and streams ~100 KB after
// the routing (two blocks on one SM streamed at half the rate; measured: RESULTS.md).
//
// The partial sums are added as 64-bit fixed-point integers (value * 2^32, exact for an f32 of
// magnitude >= 2^-8) with atomics, so the total does not depend on the order the blocks finish in
// (the logits stay bit-reproducible run to run); the last block to finish (a ticket) adds the
// total into x and leaves the accumulator and the ticket zero for the next layer (a partial sum
// that is not finite makes all of x NaN, where the two launches would spoil only its rows).
//
// Opt-in (WREN_CUDA_DECODE=fusemoe): on the H200 it is slower than the two launches it replaces
// (537 against 695 tok/s at 4K; RESULTS.md, thirty-third session), kept with its check for the
// work the measurements there point to.
#include "backend/cuda/gemv_dev.cuh"
#include "backend/cuda/qgemv_dev.cuh"
#include "backend/cuda/mma.cuh"

#define MF_THREADS 256
#define MF_SLICE   32 // expert columns per unit
#define MF_ROWS    16 // down rows per thread at most (hidden <= MF_THREADS * MF_ROWS)

static size_t g_mf_smem_optin = 48 * 1024;
static bool g_mf_off;

void moe_fused_configure(size_t smem_optin, bool off) {
    g_mf_smem_optin = smem_optin;
    g_mf_off = off;
}

// Shared memory: the int8 MoE input, then per unit slot the gate and up rows of its slice (packed,
// 16 bytes per chunk), their scales and biases, the down chunk of every row, its SwiGLU outputs and
// their int8 block.
struct mf_layout {
    size_t w, sb, d, h, hq, unit; // offsets inside a unit slot, and a slot's size
    size_t total1, total2;        // the block's shared memory with one or two slots
};
static __host__ __device__ __forceinline__ mf_layout mf_smem(int hidden, int group) {
    mf_layout l;
    const size_t rowb = (size_t)hidden / 2, sbb = (size_t)(hidden / group) * 2;
    l.w = 0;
    l.sb = l.w + 2 * MF_SLICE * rowb;
    l.d = l.sb + 4 * MF_SLICE * sbb;
    l.h = l.d + (size_t)hidden * 16;
    l.hq = l.h + MF_SLICE * sizeof(float);
    l.unit = l.hq + qx_bytes(1);
    l.total1 = qx_bytes(hidden / 32) + l.unit;
    l.total2 = l.total1 + l.unit;
    return l;
}

// One unit: expert e's columns [32 s, 32 s + 32) of the matrices (G, U, D).
struct mf_unit {
    const struct dmat *G, *U, *D;
    int e, s;
    float sc;    // routing weight
    uint8_t *sm; // its slot
    uint64_t *bar;
};

// The copies of a unit's weights: gate/up rows and their scales by bulk copies completing on
// u.bar (sm_90+; cp.async before), the down chunks by cp.async; commits one cp.async group.
static __device__ __forceinline__ void mf_issue(const struct moe_fused_params &p, const mf_unit &u,
                                                const mf_layout &L) {
    const int t = threadIdx.x, H = p.hidden;
    const struct dmat &G = *u.G, &U = *u.U, &D = *u.D;
    const uint64_t pol = l2_stream();
    const size_t r0 = (size_t)u.s * MF_SLICE;
    // the slice's rows are contiguous (moe_fused_eligible: dense rows), so each copy is linear
    const int nw = MF_SLICE * H / 32, ns = MF_SLICE * (H / G.group) * 2 / 16;
    const uint8_t *src[6] = {G.data + (size_t)u.e * G.mat_stride + r0 * G.row_stride,
                             U.data + (size_t)u.e * U.mat_stride + r0 * U.row_stride};
    const size_t so = (size_t)u.e * G.sb_mat_stride + r0 * G.sb_row_stride;
    src[2] = G.scales + so, src[3] = G.biases + so, src[4] = U.scales + so, src[5] = U.biases + so;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (t == 0) {
        mbar_expect(u.bar, (uint32_t)(2 * nw + 4 * ns) * 16);
        for (int k = 0; k < 2; k++)
            bulk_copy(u.sm + L.w + 16 * k * nw, src[k], nw * 16, u.bar, pol);
        for (int k = 0; k < 4; k++)
            bulk_copy(u.sm + L.sb + 16 * k * ns, src[2 + k], ns * 16, u.bar, pol);
    }
#else
    for (int k = 0; k < 2; k++)
        for (int i = t; i < nw; i += MF_THREADS)
            cp_async16(u.sm + L.w + 16 * (k * nw + i), src[k] + 16 * i, true, pol);
    for (int k = 0; k < 4; k++)
        for (int i = t; i < ns; i += MF_THREADS)
            cp_async16(u.sm + L.sb + 16 * (k * ns + i), src[2 + k] + 16 * i, true, pol);
#endif
    // the down chunks of one expert are read by its slice units at about the same time, 16 of
    // every 256 bytes each: under the default policy their sectors can be shared in the L2
    // (evict-first measured the same)
    const uint8_t *dsrc = D.data + (size_t)u.e * D.mat_stride + 16 * u.s;
    for (int r = t; r < H; r += MF_THREADS)
        cp_async16(u.sm + L.d + 16 * r, dsrc + (size_t)r * D.row_stride, true);
    cp_async_commit();
}

// The down rows' scale and bias of a unit's chunk (registers: they are 2 of every 16 bytes).
struct mf_dsb {
    uint16_t s[MF_ROWS], b[MF_ROWS];
};
static __device__ __forceinline__ void mf_dsb_load(const struct moe_fused_params &p,
                                                   const mf_unit &u, mf_dsb &o) {
    const struct dmat &D = *u.D;
    const unsigned g = (unsigned)(u.s * MF_SLICE / D.group) * 2;
#pragma unroll
    for (int j = 0; j < MF_ROWS; j++) {
        const int r = threadIdx.x + j * MF_THREADS;
        o.s[j] = o.b[j] = 0;
        if (r < p.hidden) {
            const size_t so = (size_t)u.e * D.sb_mat_stride + (size_t)r * D.sb_row_stride + g;
            o.s[j] = __ldg(reinterpret_cast<const uint16_t *>(D.scales + so));
            o.b[j] = __ldg(reinterpret_cast<const uint16_t *>(D.biases + so));
        }
    }
}

// A unit whose copies have arrived: gate/up and SwiGLU (row set j: gate row j, up row j, by warp
// j % 8, as the expert launch computes it), the int8 block of the 32 outputs, the down partial
// sums added into p.acc. Returns whether a partial sum was not finite.
static __device__ __forceinline__ bool mf_compute(const struct moe_fused_params &p,
                                                  const mf_unit &u, const mf_dsb &dsb,
                                                  const qx_smem &q, const mf_layout &L) {
    const int t = threadIdx.x, warp = t >> 5, lane = t & 31, H = p.hidden;
    const int C = H / 32, nit = (C + QG_CHUNKS - 1) / QG_CHUNKS, sbr = H / u.G->group;
    const uint4 *w = reinterpret_cast<const uint4 *>(u.sm + L.w);
    const uint16_t *sb = reinterpret_cast<const uint16_t *>(u.sm + L.sb);
    float *hs = reinterpret_cast<float *>(u.sm + L.h);
    for (int j = warp; j < MF_SLICE; j += MF_THREADS / 32) {
        float acc[QG_R] = {0.f, 0.f};
        for (int it = 0; it < nit; it++) {
            qstage S;
#pragma unroll
            for (int i = 0; i < QG_R; i++)
#pragma unroll
                for (int v = 0; v < QG_U; v++) {
                    const int c = it * QG_CHUNKS + v * 32 + lane;
                    const bool ok = c < C;
                    const int g = (c >> p.gshift) + (i * 2 * MF_SLICE + j) * sbr;
                    S.w[i][v] = ok ? w[(i * MF_SLICE + j) * C + c] : make_uint4(0, 0, 0, 0);
                    S.s[i][v] = ok ? sb[g] : 0;
                    S.b[i][v] = ok ? sb[g + MF_SLICE * sbr] : 0;
                }
            qdot<4>(S, q, it, C, acc);
        }
        warp_sum_rows(acc);
        if (lane == 0) hs[j] = u.sc * silu_f(acc[0]) * acc[1];
    }
    __syncthreads();
    const qx_smem hq = qx_layout(u.sm + L.hq, 1);
    if (warp == 0) {
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = lane < 4 ? hs[8 * lane + k] : 0.f;
        qx_quant_unit<4>(v, lane, 4, hq);
    }
    __syncthreads();
    // row r's part from the 32 columns (qstep's arithmetic for one chunk)
    uint32_t xl[2][4], xh[2][4];
#pragma unroll
    for (int pl = 0; pl < 2; pl++) {
        const uint4 a = hq.lo[pl][0], b = hq.hi[pl][0];
        xl[pl][0] = a.x, xl[pl][1] = a.y, xl[pl][2] = a.z, xl[pl][3] = a.w;
        xh[pl][0] = b.x, xh[pl][1] = b.y, xh[pl][2] = b.z, xh[pl][3] = b.w;
    }
    const float4 meta = hq.meta[0];
    const uint4 *dw = reinterpret_cast<const uint4 *>(u.sm + L.d);
    bool bad = false;
#pragma unroll
    for (int jr = 0; jr < MF_ROWS; jr++) {
        const int r = t + jr * MF_THREADS;
        if (r >= H) continue;
        const uint4 wv = dw[r];
        const uint32_t wd[4] = {wv.x, wv.y, wv.z, wv.w};
        int is[2] = {0, 0};
#pragma unroll
        for (int pl = 0; pl < 2; pl++) is[pl] = q4_dot(wd, xl[pl], xh[pl], is[pl]);
        const float dot = qx_dot(meta.x, is);
        const float v =
            fmaf(bf16_bits_to_f32(dsb.s[jr]), dot, bf16_bits_to_f32(dsb.b[jr]) * meta.y);
        bad = bad || !isfinite(v);
        atomicAdd(reinterpret_cast<unsigned long long *>(p.acc + r),
                  (unsigned long long)__float2ll_rn(v * 4294967296.f));
    }
    return bad;
}

__global__ void __launch_bounds__(MF_THREADS, 1)
    moe_fused_kernel(const __grid_constant__ struct moe_fused_params p) {
    extern __shared__ __align__(16) uint8_t sm[];
    __shared__ struct route_smem route;
    __shared__ bool last;
    __shared__ __align__(8) uint64_t bar[2];
    TRACE_BEGIN();
    pdl_trigger();
    const int t = threadIdx.x, H = p.hidden, b = (int)blockIdx.x;
    const mf_layout L = mf_smem(H, p.gate.group);
    const int nsh = p.sh_inter / MF_SLICE, spe = p.inter / MF_SLICE;
    // pair: block b runs routed unit b and, for b < nsh, the shared expert's unit b in slot 1;
    // else blocks [0, nsh) run the shared expert's units and the rest one routed unit each
    const bool has_sh = b < nsh, has_rt = p.pair || b >= nsh;
    const int rb = p.pair ? b : b - nsh;
    uint8_t *slots = sm + qx_bytes(H / 32);
    mf_unit us = {&p.sh_gate, &p.sh_up, &p.sh_down, 0, b, 1.f, slots + (p.pair ? L.unit : 0),
                  &bar[1]};
    mf_unit ur = {&p.gate, &p.up, &p.down, 0, rb % spe, 1.f, slots, &bar[0]};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (t == 0) {
        mbar_init(&bar[0], 1), mbar_init(&bar[1], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
#endif
    mf_dsb ds, dr;
    if (has_sh) { // constant weights: copied while the launch before this one finishes
        mf_issue(p, us, L);
        mf_dsb_load(p, us, ds);
    }
    pdl_wait();
    TRACE_WAIT();
    const route_in ri = route_load(p.g);
    const int nq = (int)(qx_bytes(H / 32) / 16);
    for (int i = t; i < nq; i += MF_THREADS) cp_async16(sm + 16 * i, p.g.qx_in + 16 * i, true);
    cp_async_commit();
    route_block(p.g, ri, route);
    TRACE_MARK(0);
    if (has_rt) {
        ur.e = route.ids[rb / spe], ur.sc = route.wts[rb / spe];
        mf_issue(p, ur, L);
        mf_dsb_load(p, ur, dr);
    }
    const qx_smem q = qx_layout(sm, H / 32);
    bool bad = false;
    if (has_sh) {
        us.sc = route.wts[p.K];
        if (has_rt)
            cp_async_wait<1>(); // all but the routed unit's group
        else
            cp_async_wait<0>();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        mbar_wait(us.bar, 0);
#endif
        __syncthreads();
        bad = mf_compute(p, us, ds, q, L);
    }
    TRACE_MARK(1);
    if (has_rt) {
        cp_async_wait<0>();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        mbar_wait(ur.bar, 0);
#endif
        __syncthreads();
        bad = mf_compute(p, ur, dr, q, L) || bad;
    }
    if (__syncthreads_or(bad) && t == 0)
        atomicOr(reinterpret_cast<unsigned long long *>(p.acc + H), 1ull);
    TRACE_MARK(2);

    // the last block adds the total into x
    __threadfence();
    __syncthreads();
    if (t == 0) last = atomicAdd(p.ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    // all loads first (a store between them could alias the next load: one round trip each)
    const bool nan = __ldcg(p.acc + H) != 0;
    long long a[MF_ROWS];
    float xv[MF_ROWS];
#pragma unroll
    for (int j = 0; j < MF_ROWS; j++) {
        const int r = t + j * MF_THREADS;
        a[j] = r < H ? __ldcg(p.acc + r) : 0;
        xv[j] = r < H ? __ldcg(p.x + r) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < MF_ROWS; j++) {
        const int r = t + j * MF_THREADS;
        if (r >= H) continue;
        p.acc[r] = 0;
        p.x[r] = nan ? NAN : xv[j] + __ll2float_rn(a[j]) * 2.3283064365386963e-10f;
    }
    if (t == 0) p.acc[H] = 0, *p.ticket = 0;
}

bool moe_fused_eligible(const struct moe_fused_params *p) {
    if (g_mf_off || decode_f32_gemv() || !p->g.qx_in || p->K < 1 || p->K > 64) return false;
    if (p->g.cols != p->hidden || p->inter % MF_SLICE || p->sh_inter % MF_SLICE || p->hidden % 32 ||
        p->hidden > MF_THREADS * MF_ROWS)
        return false;
    const struct dmat *gu[4] = {&p->gate, &p->up, &p->sh_gate, &p->sh_up};
    const int ng = p->gate.group;
    if (!pow2(ng) || ng < 32 || (p->hidden / ng) % 8) return false; // scale rows of 16-byte chunks
    for (int i = 0; i < (p->sh_inter > 0 ? 4 : 2); i++) {
        const struct dmat *m = gu[i];
        if (m->type != WT_Q4 || m->bits != 4 || m->group != ng || m->cols != p->hidden ||
            m->row_stride != (size_t)p->hidden / 2 ||
            m->sb_row_stride != (size_t)(p->hidden / ng) * 2 || (uintptr_t)m->data % 16 ||
            (uintptr_t)m->scales % 16 || (uintptr_t)m->biases % 16 || m->mat_stride % 16 ||
            m->sb_mat_stride % 16)
            return false;
    }
    const struct dmat *dn[2] = {&p->down, &p->sh_down};
    for (int i = 0; i < (p->sh_inter > 0 ? 2 : 1); i++) {
        const struct dmat *m = dn[i];
        if (m->type != WT_Q4 || m->bits != 4 || !pow2(m->group) || m->group < MF_SLICE ||
            m->rows != p->hidden || m->row_stride % 16 || (uintptr_t)m->data % 16 ||
            m->mat_stride % 16)
            return false;
    }
    return mf_smem(p->hidden, ng).total1 <= g_mf_smem_optin;
}

int moe_fused_launch(const struct moe_fused_params *pp, cudaStream_t s, struct wren_err *e) {
    struct moe_fused_params q = *pp, *p = &q;
    p->gshift = log2i(p->gate.group / 32);
    const mf_layout L = mf_smem(p->hidden, p->gate.group);
    const int nsh = p->sh_inter / MF_SLICE, nrt = p->K * (p->inter / MF_SLICE);
    p->pair = L.total2 <= g_mf_smem_optin && nsh <= nrt;
    const size_t smem = p->pair ? L.total2 : L.total1;
    const int blocks = p->pair ? nrt : nsh + nrt;
    CUDA_CHECK(cudaFuncSetAttribute(moe_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem));
    CUDA_CHECK(
        pdl_launch(moe_fused_kernel, dim3(blocks), dim3(MF_THREADS), smem, s, decode_pdl(), *p));
    return 0;
}
