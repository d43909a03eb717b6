// Batch-1 GEMV: y = W x for several matrices that read the same x, in one launch. The weights are
// streamed once in 16-byte chunks with dequantization fused in the read; x (optionally
// RMS-normalised on the fly) sits in padded shared memory and is reused by the R rows a thread
// computes at once. TPR threads share a row group (split over the row's chunks) so that small
// matrices still put enough loads in flight. Epilogues fold the consumer's elementwise work in.
#include "backend/cuda/gemv_dev.cuh"

static int g_sm_count = 132;
static size_t g_smem_optin = 48 * 1024;
static bool g_f32_gemv;
static bool g_pdl;
static bool g_dn_slices;

void decode_configure(const struct decode_config *c) {
    g_sm_count = c->sm_count;
    g_smem_optin = c->smem_optin;
    g_f32_gemv = c->f32_gemv;
    // the programmatic-launch waits exist only in sm_90+ code (decode_kernels_sm90, which is also
    // false on a card below sm_90: it loads sm_8x code)
    g_pdl = c->pdl && decode_kernels_sm90();
    g_dn_slices = c->dn_slices;
    attn_set_device(c->sm_count, c->smem_optin);
    qgemv_configure(c->sm_count, c->no_split);
    moe_fused_configure(c->smem_optin, !c->fuse_moe);
    qstream_configure(c->cc_major, c->sm_count, c->smem_optin, c->no_stream);
}
bool decode_pdl(void) {
    return g_pdl;
}
bool decode_f32_gemv(void) {
    return g_f32_gemv;
}
bool decode_dn_slices(void) {
    return g_dn_slices;
}

#define GEMV_THREADS 256
// Blocks per SM the row batches are spread over, and the minimum resident blocks per SM the
// register allocation must allow (measured: see bench/RESULTS.md).
#ifndef GEMV_BLOCKS_PER_SM
#define GEMV_BLOCKS_PER_SM 4
#endif
#ifndef GEMV_MIN_BLOCKS
#define GEMV_MIN_BLOCKS 3
#endif

// Loads x into padded shared memory: plain, RMS-normalised (norm_w), or gated-RMS-normalised per
// head (gn_w; hs: one float per head of scratch).
static __device__ void load_x(float *xs, float *hs, const struct gemv_params &p, float *red) {
    const float *x = p.x;
    const int cols = p.cols;
    float scale = 1.f;
    if (p.norm_w) {
        float ss = 0.f;
        for (int i = threadIdx.x; i < cols; i += blockDim.x) ss += x[i] * x[i];
        ss = block_sum(ss, red);
        scale = rsqrtf(ss / (float)cols + p.eps);
    }
    if (p.gn_w) {
        const int dv = p.gn_dv, nh = cols / dv, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        for (int h = warp; h < nh; h += blockDim.x >> 5) {
            float ss = 0.f;
            for (int i = lane; i < dv; i += 32) ss += x[h * dv + i] * x[h * dv + i];
#pragma unroll
            for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            if (lane == 0) hs[h] = rsqrtf(ss / (float)dv + p.eps);
        }
        __syncthreads();
        for (int i = threadIdx.x; i < cols; i += blockDim.x)
            xs[xpad(i)] = x[i] * hs[i / dv] * p.gn_w[i % dv] * silu_f(p.gn_z[i]);
    } else {
        for (int i = threadIdx.x; i < cols; i += blockDim.x)
            xs[xpad(i)] = p.norm_w ? x[i] * scale * p.norm_w[i] : x[i];
    }
    __syncthreads();
}

template <int BITS, int R, int TPR>
static __device__ void seg_rows(const struct gemv_seg &sg, int mat, float sc, int row0,
                                const float *xs, int cols, float *red) {
    constexpr int EPC = wfmt<BITS>::EPC;
    const bool pair = sg.epi == EPI_SWIGLU;
    const int t = threadIdx.x % TPR;
    const uint8_t *rp[R];
    const uint16_t *sp[R], *bp[R];
    // pair: rows [0, R/2) of a and the same rows of b; rows past the end read row 0 (discarded)
    const int per = pair ? R / 2 : R;
#pragma unroll
    for (int i = 0; i < R; i++) {
        int r = row0 + (pair ? i % (R / 2) : i);
        if (r >= sg.rows) r = 0;
        row_ptrs(pair && i >= R / 2 ? sg.b : sg.a, mat, r, rp[i], sp[i], bp[i]);
    }
    float acc[R];
#pragma unroll
    for (int i = 0; i < R; i++) acc[i] = 0.f;
    rows_dot<BITS, R, TPR>(rp, sp, bp, sg.a.group, xs, cols / EPC, t, acc);
    group_reduce<R, TPR>(acc, red);
#pragma unroll
    for (int i = 0; i < R; i++) {
        int r = row0 + i;
        if (i >= per || t != i || r >= sg.rows) continue;
        // acc[i + R/2] is the up row of a SWIGLU pair; thread i holds every total
        float u = 0.f;
#pragma unroll
        for (int k = 0; k < R; k++)
            if (k == i + R / 2) u = acc[k];
        gemv_epilogue(sg, r, acc[i], u, sc);
    }
}

template <int TPR>
__global__ void __launch_bounds__(GEMV_THREADS, GEMV_MIN_BLOCKS)
    gemv_kernel(const __grid_constant__ struct gemv_params p) {
    extern __shared__ float xs[];
    __shared__ float red[GEMV_THREADS / 32 * 4];
    __shared__ struct route_smem route;
    const route_smem *rt = p.topk_K > 0 ? &route : nullptr;
    if (rt) route_block(p, route_load(p), route);
    load_x(xs, xs + xpad_len(p.cols), p, red);
    int s = 0;
    while (s + 1 < p.nseg && (int)blockIdx.x >= p.seg[s + 1].block0) s++;
    const struct gemv_seg &sg = p.seg[s];
    const int mat = seg_mat(sg, rt);
    const float sc = seg_scale(sg, rt);
    const int groups = GEMV_THREADS / TPR, grp = threadIdx.x / TPR;
    const int bits = dmat_bits(sg.a.type, sg.a.bits);
    const int per = sg.epi == EPI_SWIGLU ? 2 : 4; // rows per group
    // each block walks p.iters consecutive batches of groups*per rows, so the x prologue (load +
    // norm) is paid once per many rows
    for (int it = 0; it < p.iters; it++) {
        const int batch = (blockIdx.x - sg.block0) * p.iters + it;
        if (batch * groups * per >= sg.rows) break; // block-uniform
        const int row0 = (batch * groups + grp) * per;
        if (bits == 4)
            seg_rows<4, 4, TPR>(sg, mat, sc, row0, xs, p.cols, red);
        else if (bits == 8)
            seg_rows<8, 4, TPR>(sg, mat, sc, row0, xs, p.cols, red);
        else
            seg_rows<16, 4, TPR>(sg, mat, sc, row0, xs, p.cols, red);
    }
}

int gemv_launch(struct gemv_params *p, cudaStream_t s, struct wren_err *e) {
    if (p->nseg < 1 || p->nseg > GEMV_MAXSEG)
        return wren_errf(e, "gemv: bad segment count %d", p->nseg);
    for (int i = 0; i < p->nseg; i++) {
        const struct gemv_seg *g = &p->seg[i];
        const int bits = dmat_bits(g->a.type, g->a.bits);
        if (g->a.cols != p->cols || p->cols % (128 / bits))
            return wren_errf(e, "gemv: matrix of %d columns (%d-bit) cannot read an input of %d",
                             g->a.cols, bits, p->cols);
        if (g->epi == EPI_SWIGLU &&
            (g->b.type != g->a.type || g->b.bits != g->a.bits || g->b.group != g->a.group))
            return wren_errf(e, "gemv: gate and up projections must share one format");
    }
    if (!g_f32_gemv && qstream_eligible(p)) return qstream_launch(p, s, e);
    if (!g_f32_gemv && qgemv_eligible(p)) return qgemv_launch(p, s, e);
    int cmax = 0;
    long groups_total = 0;
    for (int i = 0; i < p->nseg; i++) {
        const struct gemv_seg *g = &p->seg[i];
        int c = p->cols / (128 / dmat_bits(g->a.type, g->a.bits));
        if (c > cmax) cmax = c;
        groups_total += (g->rows + 3) / 4 * (g->epi == EPI_SWIGLU ? 2 : 1);
    }
    // threads per row group: enough warps in flight to cover memory latency (>= 8 per SM), and
    // no more threads than chunks per row
    int tpr = 32;
    while (tpr < 256 && tpr * 2 <= cmax && groups_total * tpr / 32 < (long)g_sm_count * 8) tpr *= 2;
    const int per_block_groups = GEMV_THREADS / tpr;
    long batches = 0;
    for (int i = 0; i < p->nseg; i++) {
        int per = p->seg[i].epi == EPI_SWIGLU ? 2 : 4;
        batches += (p->seg[i].rows + per_block_groups * per - 1) / (per_block_groups * per);
    }
    const long target_blocks = (long)GEMV_BLOCKS_PER_SM * g_sm_count;
    p->iters = (int)((batches + target_blocks - 1) / target_blocks);
    if (p->iters < 1) p->iters = 1;
    int nb = 0;
    for (int i = 0; i < p->nseg; i++) {
        struct gemv_seg *g = &p->seg[i];
        int per = g->epi == EPI_SWIGLU ? 2 : 4;
        int nbatch = (g->rows + per_block_groups * per - 1) / (per_block_groups * per);
        g->block0 = nb;
        nb += (nbatch + p->iters - 1) / p->iters;
    }
    if (p->gn_w && (p->gn_dv <= 0 || p->cols % p->gn_dv))
        return wren_errf(e, "gemv: gated norm over heads of %d does not divide %d", p->gn_dv,
                         p->cols);
    size_t smem = ((size_t)xpad_len(p->cols) + (p->gn_w ? p->cols / p->gn_dv : 0)) * sizeof(float);
    static void (*const kernels[4])(const struct gemv_params) = {
        gemv_kernel<32>, gemv_kernel<64>, gemv_kernel<128>, gemv_kernel<256>};
    const int ki = tpr == 32 ? 0 : tpr == 64 ? 1 : tpr == 128 ? 2 : 3;
    void (*k)(const struct gemv_params) = kernels[ki];
    // the kernel's static shared memory (reduction, routing) counts against the same limit;
    // queried once per kernel, not per launch
    static size_t static_smem[4];
    static bool queried[4];
    if (!queried[ki]) {
        cudaFuncAttributes fa;
        CUDA_CHECK(cudaFuncGetAttributes(&fa, k));
        static_smem[ki] = fa.sharedSizeBytes, queried[ki] = true;
    }
    if (smem + static_smem[ki] > g_smem_optin)
        return wren_errf(e, "gemv: input of %d columns does not fit in shared memory", p->cols);
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    k<<<nb, GEMV_THREADS, smem, s>>>(*p);
    CUDA_CHECK_LAUNCH();
    return 0;
}

// Whether the loaded decode kernels were compiled for sm_90+ (all translation units share the
// build's architecture list). The programmatic-launch waits and the bulk copies exist only in
// that code: a build of sm_8x code alone, JIT-compiled on a newer card, has them compiled out and
// must run without both (it ran the streaming lm_head as an empty kernel, and overlapped kernels
// that could not wait).
bool decode_kernels_sm90(void) {
    static int v = -1;
    if (v < 0) {
        cudaFuncAttributes a;
        v = cudaFuncGetAttributes(&a, (const void *)gemv_kernel<32>) == cudaSuccess &&
            a.ptxVersion >= 90;
        cudaGetLastError();
    }
    return v == 1;
}
