// Hopper (sm_90a) path of the fused-dequant GEMM for 4-bit weights: warpgroup MMA (wgmma) with the
// problem transposed, C^T[n, tok] = W[n, K] * A[tok, K]^T, so that the weights are wgmma's A
// operand, which may come from registers: each thread dequantizes its fragment straight from the
// packed words into the registers the MMA reads (no shared-memory round trip for W, no ldmatrix),
// while the activations (the B operand) sit in shared memory in the 128-byte-swizzled K-major
// layout that a wgmma descriptor reads. wgmma is asynchronous, so the dequantization of k-tile t+1
// overlaps the tensor-core work of tile t (the mma.sync kernel in gemm_q.cu spends its issue slots
// on both).
//
// Block (one work item): 2 warpgroups x 64 weight rows = 128 rows (64 SwiGLU features: gate and up
// rows interleaved by 8, as in gemm_q.cu), times up to 256 tokens; the wgmma N (tokens) is picked
// per block from its row count in steps of 32, so an expert with 140 rows runs one 160-wide tile
// instead of two 128-row tiles. Other item shapes (wg_shape) serve experts with fewer rows, at
// two CTAs per SM with up to 128 or 32 tokens. Activation and packed-weight tiles arrive by
// cp.async in a ring of stages; the group scales/biases of the block's rows for the whole K are
// staged once, with the first tile. A CTA of the 256-token shape may run several weight-row blocks
// of its token tile in one k loop (blocks_per_cta), so that their loads overlap. One CTA per SM for
// that shape (up to 217 KB of shared memory; ~208 registers per thread, ~243 with several blocks).
//
// Shape 1 runs on the loader-warpgroup form of this kernel (gemm_wgp.cu: a third warpgroup issues
// the loads, the two math warpgroups only dequantize and issue wgmmas) except when split along K
// or for odd scale layouts; pf_gemm_wg_producer(0) returns it to the kernel here, whose shared
// pieces are in gemm_wg.cuh.
#include "backend/cuda/gemm_wg.cuh"

using namespace wg;

namespace {

#ifdef WG_DEVICE

// Load-side state for item `it` (gathered activation rows, weight and scale rows).
template <int SH>
__device__ __forceinline__ void setup_loads(const wg_params &p, wg_ctx<SH> &c, const item_t &it) {
    constexpr int MB = wg_shape<SH>::MB, TOK = wg_shape<SH>::TOK;
    const int tid = threadIdx.x;
    const int tok0 = tid >> 3, ch = tid & 7;
    c.act_st = act_offset(tok0, ch);
    c.n_act = (it.nrows - tok0 + 31) / 32;
#pragma unroll
    for (int i = 0; i < TOK / 32; i++) c.a_src[i] = p.A + act_source(p, it, tok0 + 32 * i, ch);
#pragma unroll
    for (int i = 0; i < MB; i++) {
        // weight chunk and scale/bias row copy tid + 256 i
        const int idx = tid + WG_THREADS * i;
        c.wq[i] = weight_chunk<SH>(p, it, idx, c.wq_ok[i], c.wq_st[i]);
        c.sb_src[i] = sb_source<SH>(p, it, idx, c.sb_ok[i]);
    }
}

// Tile kt into the stage at shared address st, its packed weights at byte offset wo from the
// thread's k-tile 0 chunks (kt * 32, plus the weight-row block's offset). NT > 0 (the k loop): the
// NT / 32 activation chunks of a thread unconditionally (rows past the item's repeat its last row,
// so the copies stay in bounds, and their columns are never stored), which keeps branches and their
// address arithmetic out of the loop; NT = 0 (the prologue): only the chunks of the item's rows.
template <int SH, int NT>
__device__ __forceinline__ void load_tile(const wg_ctx<SH> &c, int kt, uint32_t wo, uint32_t st) {
    constexpr int MB = wg_shape<SH>::MB;
#pragma unroll
    for (int i = 0; i < (NT ? NT : wg_shape<SH>::TOK) / 32; i++)
        if (NT || i < c.n_act) cp_async16_s(st + c.act_st + i * 32 * 128, c.a_src[i] + kt * 64);
#pragma unroll
    for (int i = 0; i < MB; i++)
        if (c.wq_ok[i]) cp_async16_s(st + wg_shape<SH>::ACT + c.wq_st[i], c.wq[i] + wo);
}

// The scale and bias rows of the weight-row block at byte offset off (from the item's first) into
// the slot at shared address dst, by cp.async (p.sb_async).
template <int SH>
__device__ __forceinline__ void stage_sb(const wg_ctx<SH> &c, size_t off, uint32_t dst) {
#pragma unroll
    for (int i = 0; i < wg_shape<SH>::MB; i++) {
        const int idx = threadIdx.x + WG_THREADS * i; // scale rows, then bias rows
        if (c.sb_ok[i]) copy_sb_row(dst + idx * c.sbs, c.sb_src[i] + off, c.ng);
    }
}

// First DIST tiles of an item and its scales/biases (with tile 0). The caller has made sure no
// warpgroup still reads the stages or the scales.
template <int SH>
__device__ __forceinline__ void prologue(const wg_params &p, const wg_ctx<SH> &c, const item_t &it,
                                         int kt0, int kt1) {
    constexpr int WG_ROWS = wg_shape<SH>::ROWS;
    const int tid = threadIdx.x;
    if (p.sb_async) {
        stage_sb<SH>(c, 0, c.sbuf);
    } else { // odd shapes (tests): plain loads
        for (int i = tid; i < c.ng * WG_ROWS; i += WG_THREADS) {
            const int v = i / c.ng, gi = i % c.ng;
            int m;
            const int n = row_of<SH>(p, it.by, v, m);
            uint16_t s = 0, b = 0;
            if (n < p.N) {
                const size_t off = it.expert * p.w[m].sbms + (size_t)n * p.w[m].sbrs + gi * 2;
                s = *reinterpret_cast<const uint16_t *>(p.w[m].scales + off);
                b = *reinterpret_cast<const uint16_t *>(p.w[m].biases + off);
            }
            const uint32_t a = c.sbuf + v * c.sbs + gi * 2;
            asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(a), "h"(s));
            asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(a + WG_ROWS * c.sbs), "h"(b));
        }
    }
#pragma unroll
    for (int s = 0; s < wg_shape<SH>::DIST; s++) {
        if (kt0 + s < kt1)
            load_tile<SH, 0>(c, kt0 + s, (kt0 + s) * 32,
                             c.smem + (uint32_t)((kt0 + s) % wg_shape<SH>::STAGES) *
                                          wg_shape<SH>::STAGE);
        cp_async_commit();
    }
}

// One k-tile (of the item's tiles up to KT): wait for its stage, start the load of tile kt + DIST,
// dequantize into `a` while the previous tile's wgmmas (reading the other register set) run, retire
// those, issue 4 wgmmas. Retiring with wait_group 0 right before the issue (not wait_group 1 at the
// top) is what lets ptxas see that no in-flight wgmma reads `a`; otherwise it serializes every
// wgmma (C7513).
// sc: the stage index of tile kt (kt % STAGES), advanced here (no division in the loop). lg: the
// tile to load, counted over the CTA's weight-row blocks (MULTI: block lg >> kshift, k-tile
// lg & kmask; else k-tile lg), loaded while lg < lend. sb: the scale slot of the block computed.
template <int SH, int NT, bool MULTI>
__device__ __forceinline__ void
k_tile(const wg_params &p, const wg_ctx<SH> &c, int kt, int lg, int lend, int &sc, uint32_t sb,
       uint32_t (&a)[wg_shape<SH>::MB][16], float (&acc)[wg_shape<SH>::MB][NT / 2]) {
    constexpr int MB = wg_shape<SH>::MB, STAGES = wg_shape<SH>::STAGES, DIST = wg_shape<SH>::DIST;
    const uint32_t st = c.smem + (uint32_t)sc * wg_shape<SH>::STAGE;
    const int sl = sc + DIST < STAGES ? sc + DIST : sc + DIST - STAGES;
    sc = sc + 1 < STAGES ? sc + 1 : 0;
    cp_async_wait<DIST - 1>();
    fence_proxy_async();
    // Both warpgroups have retired tile kt - 2 (at their previous tile), so its stage is free.
    __syncthreads();
    if (lg < lend) {
        const uint32_t dst = c.smem + (uint32_t)sl * wg_shape<SH>::STAGE;
        if constexpr (MULTI) {
            const int lk = lg & p.kmask;
            load_tile<SH, NT>(c, lk, (uint32_t)(lg >> p.kshift) * p.wbs + lk * 32, dst);
        } else {
            load_tile<SH, NT>(c, lg, lg * 32, dst);
        }
    }
    cp_async_commit(); // (empty near the end: keeps the group count uniform)
#pragma unroll
    for (int mb = 0; mb < MB; mb++) dequant<SH>(c, kt, st + wg_shape<SH>::ACT, sb, mb, a[mb]);
    // descriptors too are wgmma inputs: define them before the fence
    const uint64_t d0 = act_desc(st);
    wg_wait<0>();
    wg_fence();
#pragma unroll
    for (int s = 0; s < 4; s++) {
#pragma unroll
        for (int mb = 0; mb < MB; mb++) {
            const uint32_t(&as)[4] = *reinterpret_cast<const uint32_t(*)[4]>(&a[mb][4 * s]);
            wgmma_rs<NT>::run(acc[mb], as, d0 + 2 * s); // + 32 bytes per k-step
        }
    }
    wg_commit();
}

// Split along K: this part's raw sums, gate and up (if any) side by side (gemm_split.cu adds the
// parts and applies the epilogue). acc[mb][4j + 2h + e]: weight row r0 + 64 mb + 8h of the item,
// token 8j + 2t + e of the tile. Addressed as the epilogue is: the two columns of a row block
// computed once, the thread's two rows per j as a pointer stepped by 8 rows.
template <int SH, int NT>
__device__ __forceinline__ void store_part(const wg_params &p, const wg_ctx<SH> &c,
                                           const item_t &cur, int part,
                                           float (&acc)[wg_shape<SH>::MB][NT / 2]) {
    constexpr int MB = wg_shape<SH>::MB;
    const int t = threadIdx.x & 3;
    const int lim = cur.nrows - 2 * t; // token 8j + 2t + e is in the item while 8j + e < lim
    const size_t ldp = p.epi == EPI_SWIGLU_BF16 ? 2 * (size_t)p.N : (size_t)p.N, ld8 = 8 * ldp;
    float *const P = p.part + (size_t)part * p.M * ldp + (size_t)(cur.row0 + 2 * t) * ldp;
#pragma unroll
    for (int mb = 0; mb < MB; mb++) {
        int col[2];
        bool ok[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int m;
            const int n = row_of<SH>(p, cur.by, c.r0 + 64 * mb + 8 * h, m);
            ok[h] = n < p.N;
            col[h] = m * p.N + n;
        }
        float *o = P;
#pragma unroll
        for (int j = 0; j < NT / 8; j++, o += ld8)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                if (8 * j + e >= lim) continue;
#pragma unroll
                for (int h = 0; h < 2; h++)
                    if (ok[h]) o[e * ldp + col[h]] = acc[mb][4 * j + 2 * h + e];
            }
    }
}

// The epilogue with the fewest live values (each element's address computed at its store), for
// the two-CTA shape at its 128-register limit, where the lean epilogue below made ptxas spill
// inside the k loop.
template <int SH, int NT>
__device__ __forceinline__ void epilogue_regs(const wg_params &p, const wg_ctx<SH> &c,
                                              const item_t &cur,
                                              float (&acc)[wg_shape<SH>::MB][NT / 2]) {
    constexpr int MB = wg_shape<SH>::MB, WG_ROWS = wg_shape<SH>::ROWS;
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int mb = 0; mb < MB; mb++) {
        const int r0 = c.r0 + 64 * mb;
        if (p.epi == EPI_ADD_F32) {
            // all reads of C before any write: the compiler cannot prove that the elements
            // differ, so interleaved read-add-writes would each wait for a memory round trip
#pragma unroll
            for (int j = 0; j < NT / 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        if (8 * j >= cur.nrows) continue;
                        const int tok = 8 * j + 2 * t + e, n = cur.by * WG_ROWS + r0 + 8 * h;
                        if (tok < cur.nrows && n < p.N)
                            acc[mb][4 * j + 2 * h + e] += static_cast<const float *>(
                                p.C)[(size_t)(cur.row0 + tok) * p.ldc + n];
                    }
        }
#pragma unroll
        for (int j = 0; j < NT / 8; j++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int tok = 8 * j + 2 * t + e;
                if (tok >= cur.nrows) continue;
                const size_t r = (size_t)(cur.row0 + tok) * p.ldc;
                if (p.epi == EPI_SWIGLU_BF16) {
                    // rows r0 (gate) and r0 + 8 (up) of one feature
                    const int f = cur.by * (WG_ROWS / 2) + (r0 >> 4) * 8 + (r0 & 7);
                    if (f < p.N)
                        static_cast<bf16 *>(p.C)[r + f] =
                            __float2bfloat16(silu_f(acc[mb][4 * j + e]) * acc[mb][4 * j + 2 + e]);
                    continue;
                }
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int n = cur.by * WG_ROWS + r0 + 8 * h;
                    const float v = acc[mb][4 * j + 2 * h + e];
                    if (n >= p.N) continue;
                    if (p.epi == EPI_BF16)
                        static_cast<bf16 *>(p.C)[r + n] = __float2bfloat16(v);
                    else
                        static_cast<float *>(p.C)[r + n] = v; // EPI_F32, EPI_ADD_F32 (added above)
                }
            }
        }
    }
}

// One work item with an NT-wide token tile: for each of its weight-row blocks the k loop, then
// the epilogue from the accumulators.
template <int SH, int NT, int MODE>
__device__ __forceinline__ void run_item(const wg_params &p, const wg_ctx<SH> &c, const item_t &cur,
                                         int kt0, int kt1, int part) {
    constexpr int MB = wg_shape<SH>::MB, DIST = wg_shape<SH>::DIST;
    constexpr bool SPLIT = MODE == WG_SPLIT, MULTI = MODE == WG_MULTI;
    const int nb = MULTI ? p.nb : 1;
    const int lend = MULTI ? nb * kt1 : kt1; // (MULTI: kt0 = 0, kt1 = K / 64)
    int sc = kt0 % wg_shape<SH>::STAGES;
    float acc[MB][NT / 2];
    uint32_t a0[MB][16], a1[MB][16];
    for (int b = 0; b < nb; b++) {
#pragma unroll
        for (int mb = 0; mb < MB; mb++)
#pragma unroll
            for (int i = 0; i < NT / 2; i++) acc[mb][i] = 0.f;
#pragma unroll
        for (int mb = 0; mb < MB; mb++) fence_acc(acc[mb]);
        const uint32_t sb = c.sbuf + (b & 1) * p.sb_slot;
        if (MULTI && b + 1 < nb) {
            // the next block's scales, into the slot the previous block read: once every thread
            // is past its dequantization (no barrier needed before the first block)
            if (b) __syncthreads();
            stage_sb<SH>(c, (b + 1) * p.sbbs, c.sbuf + ((b + 1) & 1) * p.sb_slot);
        }
        const int lg0 = (MULTI ? b << p.kshift : 0) + DIST; // + kt: the tile loaded at tile kt
        // Register sets alternate strictly (no path reaches a set while its own wgmmas may still
        // be in flight, or ptxas serializes): pairs of tiles, then the odd last one.
        int kt = kt0;
        for (; kt + 1 < kt1; kt += 2) {
            k_tile<SH, NT, MULTI>(p, c, kt, lg0 + kt, lend, sc, sb, a0, acc);
            k_tile<SH, NT, MULTI>(p, c, kt + 1, lg0 + kt + 1, lend, sc, sb, a1, acc);
        }
        if (kt < kt1) k_tile<SH, NT, MULTI>(p, c, kt, lg0 + kt, lend, sc, sb, a0, acc);
        wg_wait<0>();
#pragma unroll
        for (int mb = 0; mb < MB; mb++) fence_acc(acc[mb]);

        if constexpr (SPLIT) {
            store_part<SH, NT>(p, c, cur, part, acc);
        } else {
            item_t it = cur;
            it.by += b;
            if constexpr (wg_shape<SH>::MIN_BLOCKS > 1)
                epilogue_regs<SH, NT>(p, c, it, acc);
            else
                epilogue<SH, NT>(p, c, it, acc);
        }
    }
}

#endif // WG_DEVICE

// One CTA per work item (row tile, weight-row block); in grouped mode the number of row tiles is
// read on the device and surplus CTAs exit at once. (A persistent variant, one CTA per SM walking
// the items and overlapping each epilogue with the next item's first loads, measured 2x slower:
// with the item loop around the per-width k loops ptxas serializes the wgmmas, C7510/C7512.)
// MODE: WG_ONE, WG_SPLIT or WG_MULTI (above).
template <int SH, int MODE>
__global__ void __launch_bounds__(WG_THREADS, wg_shape<SH>::MIN_BLOCKS)
    gemm_wg_kernel(const wg_params p) {
#ifdef WG_DEVICE
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    constexpr int TOK = wg_shape<SH>::TOK;
    constexpr bool SPLIT = MODE == WG_SPLIT;
    const int n_mtiles = p.tiles ? *p.n_tiles : (p.M + TOK - 1) / TOK;
    // dense GEMMs split along K: consecutive CTAs take the parts of one item
    const int item = SPLIT ? blockIdx.x / p.splits : blockIdx.x;
    const int part = SPLIT ? blockIdx.x - item * p.splits : 0;
    item_t cur;
    if (!get_item<SH, MODE == WG_MULTI>(p, n_mtiles, item, cur)) return;
    const int KT = p.K / 64;
    const int kt0 = SPLIT ? part * KT / p.splits : 0;
    const int kt1 = SPLIT ? (part + 1) * KT / p.splits : KT;

    wg_ctx<SH> c;
    // the 128-byte swizzle repeats every 1024 bytes: align the stages to that
    const uint32_t smem = (smem_u32(smem_raw) + 1023) & ~1023u;
    init_math<SH>(p, c, smem, smem + wg_shape<SH>::STAGES * wg_shape<SH>::STAGE);
    setup_loads<SH>(p, c, cur);
    prologue<SH>(p, c, cur, kt0, kt1);
    // the token tile is the item's rows rounded up to 32: one instantiation per width
    with_width<TOK>(cur.nrows, [&](auto nt) {
        run_item<SH, decltype(nt)::value, MODE>(p, c, cur, kt0, kt1, part);
    });
#else
    (void)p;
#endif
}

// 1 when the sm_90a body of the kernels is in this binary (a plain sm_90 or PTX-JIT build has
// no wgmma).
__global__ void wg_probe(int *out) {
#ifdef WG_DEVICE
    *out = 1;
#else
    *out = 0;
#endif
}

int g_force_path = 0;
int g_shape = 0;        // work-item shape (wg_shape): 1-4, or 0 = by the tile map
int g_blocks = 0;       // weight-row blocks per CTA: 1, 2, 4, 8, or 0 = automatic
bool g_producer = true; // shape 1 on the loader-warpgroup kernel where it applies

} // namespace

void pf_gemm_force_path(int path) {
    g_force_path = path;
}

void pf_gemm_wg_shape(int shape) {
    g_shape = shape >= 1 && shape <= 4 ? shape : 0;
}

void pf_gemm_wg_producer(int on) {
    g_producer = on != 0;
}

void pf_gemm_wg_blocks(int nb) {
    g_blocks = nb == 1 || nb == 2 || nb == 4 || nb == 8 ? nb : 0;
}

int pf_gemm_wg_tokens() {
    return g_shape == 3   ? wg_shape<3>::TOK
           : g_shape == 2 ? wg_shape<2>::TOK
           : g_shape == 4 ? wg_shape<4>::TOK
                          : wg_shape<1>::TOK;
}

// Measured (bench/RESULTS.md, thirteenth session; E = 256, k = 8, TFLOP/s of the expert GEMMs by
// rows per expert, shapes 3 / 4 / 2 / 1): 16 rows (T = 512) 96 / 85 / 80 / 68; 24 rows 130 / 123
// / 115 / 100; 32 rows 134 / 151 / 139 / 125; 64 rows 168 / 256 / 238 / 228; 96 rows 328 (4) /
// 316 (2) / 304 (1); 128 rows (T = 4096) 322 (4) / 311 (2) / 360 (1). Shape 2 is never the best
// and is kept as a test hook.
constexpr int WG_FEW_ROWS = 24, WG_MID_ROWS = 112;
int pf_gemm_wg_group_bm(int avg_rows) {
    if (g_shape) return pf_gemm_wg_tokens();
    return avg_rows <= WG_FEW_ROWS  ? wg_shape<3>::TOK
           : avg_rows < WG_MID_ROWS ? wg_shape<4>::TOK
                                    : wg_shape<1>::TOK;
}

bool pf_gemm_wg_available() {
    static int avail = -1;
    if (avail < 0) {
        avail = 0;
        int dev = 0, major = 0, minor = 0;
        int *d = nullptr, h = 0;
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
            major == 9 && minor == 0 && cudaMalloc(&d, sizeof(int)) == cudaSuccess) {
            wg_probe<<<1, 1>>>(d);
            if (cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess && h == 1)
                avail = 1;
            cudaFree(d);
        }
        cudaGetLastError(); // a failed probe only means "not available"
    }
    return avail == 1 && g_force_path != 1;
}

bool pf_gemm_wg_fits(const bf16 *A, int lda, int M, const struct dmat *W, const struct dmat *Wup,
                     int ldc, enum gemm_epi epi, const struct gemm_group *grp) {
    if (!pf_gemm_wg_available()) return false;
    const struct dmat *ms[2] = {W, Wup ? Wup : W};
    for (const struct dmat *m : ms) {
        if (m->type != WT_Q4 || m->bits != 4 || m->group < 64 || !pow2(m->group) ||
            m->cols != W->cols || m->rows != W->rows || ((uintptr_t)m->data % 16) ||
            m->row_stride % 16 || (m->n > 1 && m->mat_stride % 16) || !m->scales || !m->biases ||
            m->sb_row_stride % 2 || m->sb_mat_stride % 2 || ((uintptr_t)m->scales % 2) ||
            ((uintptr_t)m->biases % 2))
            return false;
    }
    const int K = W->cols;
    return K % 64 == 0 && K / W->group <= MAX_GROUPS && lda % 8 == 0 && ((uintptr_t)A % 16) == 0 &&
           (size_t)M * lda + K < (1u << 31) && (!grp || grp->bm <= pf_gemm_wg_tokens()) &&
           (epi != EPI_SWIGLU_BF16 || Wup) && ldc > 0;
}

namespace {
// Weight-row blocks per CTA (wg_params::nb). More blocks hide a CTA's start (its first tiles'
// load latency, which a lone CTA per SM cannot overlap) behind the previous block's k loop, but
// fewer CTAs then share each token tile, so more tiles are live in the L2 at once, and fewer CTAs
// spread less evenly over the SMs. Measured (bench/RESULTS.md, thirteenth and sixteenth sessions),
// expert GEMMs: with token tiles of up to ~160 (at most 160 rows per expert on average: a 4K
// prompt) gate+up (32 k-tiles) gains with 4 blocks (loader kernel: 430-438 TFLOP/s vs 425-428
// with 2) and the down projection (8 k-tiles) with 8 (324-332 vs 321-327 with 4); with wider
// tiles (8K) 4 blocks of gate+up lose (472-486 vs 503-516) and 8 of down lose (356-366 vs
// 374-383), hence at most 64 k-tiles and 4 blocks there. With the tile map ordered by expert
// size (moe_route.cu) gate+up at 4K gains again with 8 blocks (445 vs 441, seventeenth session),
// one CTA per expert, ~2 CTAs per SM. Dense GEMMs keep one block (their token tiles are the
// largest). ctas: the CTAs (map capacity) with one block each; avg_rows: rows per expert.
template <int SH>
int blocks_per_cta(const wg_params &p, bool grouped, long ctas, int avg_rows, int rows_per_block,
                   int smem2) {
    constexpr int DIST = wg_shape<SH>::DIST;
    const int KT = p.K / 64;
    if (SH != 1 || !p.sb_async || KT <= DIST || !pow2(KT) || p.N % rows_per_block ||
        (size_t)rows_per_block * p.w[0].rs > (1u << 29) || p.w[0].rs != p.w[1].rs ||
        p.w[0].sbrs != p.w[1].sbrs || smem2 > WG_SMEM_MAX)
        return 1;
    if (g_blocks) return p.ny % g_blocks ? 1 : g_blocks;
    if (!grouped) return 1;
    const bool narrow = avg_rows <= 160;
    const long min_ctas = (narrow ? 2L : 6L) * pf_device_sms();
    for (int nb : {8, 4, 2})
        if (nb <= (narrow ? 8 : 4) && p.ny % nb == 0 && nb * KT <= (narrow ? 256 : 64) &&
            ctas / nb >= min_ctas)
            return nb;
    return 1;
}

// n_mat: the matrices (experts) of a grouped GEMM's stack
template <int SH>
int launch(cudaStream_t s, wg_params &p, const struct gemm_group *grp, int M, int n_mat,
           struct wren_err *e) {
    constexpr int ROWS = wg_shape<SH>::ROWS, TOK = wg_shape<SH>::TOK;
    const int rows_per_block = p.epi == EPI_SWIGLU_BF16 ? ROWS / 2 : ROWS;
    p.ny = (p.N + rows_per_block - 1) / rows_per_block;
    const int n_mtiles = grp ? grp->max_tiles : (M + TOK - 1) / TOK;
    if (n_mtiles <= 0) return 0;
    // the stage ring (+ 1 KB for its 1024-byte alignment), then the scales and biases: rows padded
    // against bank conflicts, unless the padding would cost a two-CTA shape its second CTA per SM
    // (each CTA at most 113 KB of the SM's 228, less 1 KB per CTA)
    constexpr int ring = 1024 + wg_shape<SH>::STAGES * wg_shape<SH>::STAGE;
    const int ng = p.K / p.w[0].group;
    p.sbs = sb_row_bytes(ng, true);
    if (wg_shape<SH>::MIN_BLOCKS > 1 && ring + p.sbs * ROWS * 2 > 113 * 1024)
        p.sbs = sb_row_bytes(ng, false);
    const int sb_bytes = p.sbs * ROWS * 2; // scales + biases of a block
    const int smem1 = ring + sb_bytes;
    // the grouped map's capacity counts a partial tile per expert: expect about one per 2 experts
    const long est = (M + TOK - 1) / TOK + n_mtiles / 2;
    const long est_tiles = grp && est < n_mtiles ? est : n_mtiles;
    p.nb = blocks_per_cta<SH>(p, grp != nullptr, est_tiles * p.ny, M / (n_mat > 0 ? n_mat : 1),
                              rows_per_block, smem1 + sb_bytes + WGP_BAR_BYTES);
    p.nyb = p.ny / p.nb;
    p.kshift = log2i(p.K / 64);
    p.kmask = p.K / 64 - 1;
    p.wbs = (uint32_t)((size_t)rows_per_block * p.w[0].rs);
    p.sbbs = (size_t)rows_per_block * p.w[0].sbrs;
    p.sb_slot = sb_bytes;
    const int smem = p.nb > 1 ? smem1 + sb_bytes : smem1;
    // dense GEMMs (shape 1) may be split along K; shape 1 may run several blocks per CTA
    constexpr int SPLIT_MODE = SH == 1 ? WG_SPLIT : WG_ONE,
                  MULTI_MODE = SH == 1 ? WG_MULTI : WG_ONE;
    static int attr_smem = 0;
    if (smem > attr_smem) {
        CUDA_CHECK(cudaFuncSetAttribute(gemm_wg_kernel<SH, WG_ONE>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CUDA_CHECK(cudaFuncSetAttribute(gemm_wg_kernel<SH, SPLIT_MODE>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CUDA_CHECK(cudaFuncSetAttribute(gemm_wg_kernel<SH, MULTI_MODE>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        if (wg_shape<SH>::MIN_BLOCKS > 1) // room for that many CTAs' shared memory per SM
            CUDA_CHECK(cudaFuncSetAttribute(gemm_wg_kernel<SH, WG_ONE>,
                                            cudaFuncAttributePreferredSharedMemoryCarveout,
                                            cudaSharedmemCarveoutMaxShared));
        attr_smem = smem;
    }
    const long items = (long)n_mtiles * p.nyb;
    if (items >= (1L << 31)) return wren_errf(e, "gemm: too many tiles");
    p.splits = grp || SH != 1 || p.nb > 1
                   ? 1
                   : pf_gemm_split_parts((int)items, 1, p.K / 64, M, p.N, (enum gemm_epi)p.epi);
    p.part = pf_gemm_split_ws();
    if (SH == 1 && p.splits == 1 && p.sb_async && g_producer)
        return launch_loader(s, p, items, smem + WGP_BAR_BYTES, e);
    if (p.splits > 1)
        gemm_wg_kernel<SH, SPLIT_MODE><<<(unsigned)(items * p.splits), WG_THREADS, smem, s>>>(p);
    else if (p.nb > 1)
        gemm_wg_kernel<SH, MULTI_MODE><<<(unsigned)items, WG_THREADS, smem, s>>>(p);
    else
        gemm_wg_kernel<SH, WG_ONE><<<(unsigned)items, WG_THREADS, smem, s>>>(p);
    CUDA_CHECK_LAUNCH();
    if (p.splits > 1)
        return pf_gemm_split_reduce(s, p.splits, M, p.N, p.C, p.ldc, (enum gemm_epi)p.epi, e);
    return 0;
}
} // namespace

int pf_gemm_wg(cudaStream_t s, const bf16 *A, int lda, int M, const struct dmat *W,
               const struct dmat *Wup, void *C, int ldc, enum gemm_epi epi,
               const struct gemm_group *grp, struct wren_err *e) {
    wg_params p;
    set_gemm_in(p, A, lda, M, W, Wup, grp);
    const struct dmat *ms[2] = {W, Wup ? Wup : W};
    const int ng = p.K / p.w[0].group;
    // scale/bias rows go by 16-byte cp.async when every row is whole, aligned chunks
    p.sb_async = ng % 8 == 0;
    for (int i = 0; i < 2; i++)
        p.sb_async = p.sb_async && (uintptr_t)p.w[i].scales % 16 == 0 &&
                     (uintptr_t)p.w[i].biases % 16 == 0 && p.w[i].sbrs % 16 == 0 &&
                     (ms[i]->n <= 1 || p.w[i].sbms % 16 == 0);
    p.C = C;
    p.ldc = ldc;
    p.epi = (int)epi;
    p.tiles = grp ? grp->tiles : nullptr;
    p.n_tiles = grp ? grp->n_tiles : nullptr;
    // grouped GEMMs: the shape whose tile height the tile map was made for (pf_gemm_wg_group_bm)
    const int sh = g_shape                       ? g_shape
                   : !grp                        ? 1
                   : grp->bm <= wg_shape<3>::TOK ? 3
                   : grp->bm <= wg_shape<4>::TOK ? 4
                                                 : 1;
    const int n_mat = W->n;
    return sh == 4   ? launch<4>(s, p, grp, M, n_mat, e)
           : sh == 3 ? launch<3>(s, p, grp, M, n_mat, e)
           : sh == 2 ? launch<2>(s, p, grp, M, n_mat, e)
                     : launch<1>(s, p, grp, M, n_mat, e);
}
