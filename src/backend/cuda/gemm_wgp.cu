// Shape 1 of the Hopper GEMM (gemm_wg.cu) with a loader warpgroup (sixteenth session).
// The k-tile of the kernel in gemm_wg.cu issues its own loads: per thread and tile the activation
// and weight cp.asyncs with their 64-bit addresses, the group commit and wait and a CTA barrier,
// ~20 of its ~134 instructions, and the fifteenth session's profile found those instruction chains
// (not the tensor cores) bounding the 128-160-token tiles of a 4K prompt. Here a third warpgroup
// issues every load: it walks the CTA's tiles in order, waits for a stage to be released (an
// mbarrier per stage that the 256 math threads arrive on once their wgmmas have read it), copies
// the tile into it and has the stage's other mbarrier complete when its copies land
// (cp.async.mbarrier.arrive). The math warpgroups wait on that barrier, dequantize and issue the
// wgmmas; the loader gives up registers for them (setmaxnreg). The ring's stages are as wide as
// the CTA's token tile, so tiles of up to 160 tokens get 7-8 stages instead of 5 (seventeenth
// session: expert GEMMs at 4K 398-402 -> 406-411 TFLOP/s, the down projection 327-333 -> 338-347).
#include "backend/cuda/gemm_wg.cuh"

namespace wg {
namespace {

// The ring of a CTA: its stages hold the item's token width (nt rows of activations, then the
// weights), so narrow items get more of them: up to MAX_STAGES in the bytes of the launch's
// STAGES full-width stages, with several blocks per CTA at most K / 64 + 1 (see wgp_produce).
// The "full" and "empty" mbarriers follow the ring. Loader and math threads derive the ring from
// the same item; the math threads' stage geometry is known at compile time (their token width).
constexpr int MAX_STAGES = 8;
#ifdef WG_DEVICE
constexpr uint32_t RING_BYTES = wg_shape<1>::STAGES * wg_shape<1>::STAGE;
constexpr uint32_t FULL_OFF = RING_BYTES, EMPTY_OFF = FULL_OFF + 8 * MAX_STAGES;

// Bytes per stage for a tile of nt tokens (nt x 128 of activations, a multiple of 4096: stages
// stay aligned), and the stages that fit.
__host__ __device__ constexpr uint32_t stage_bytes(int nt) {
    return (uint32_t)nt * 128 + wg_shape<1>::ROWS * 32;
}
__host__ __device__ constexpr int ring_fit(uint32_t stage) {
    return RING_BYTES / stage < MAX_STAGES ? (int)(RING_BYTES / stage) : MAX_STAGES;
}
template <int NT> struct ring_geom {
    static constexpr uint32_t ACT = NT * 128, STAGE = stage_bytes(NT);
    static constexpr int N = ring_fit(STAGE);
    static_assert(ACT % 1024 == 0 && N >= 5, "aligned stages, at least as many as the launch's");
};

__device__ __forceinline__ void mbar_init_s(uint32_t b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(b), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_s(uint32_t b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(b) : "memory");
}
// The barrier completes once every cp.async this thread issued before has landed.
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t b) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(b) : "memory");
}
__device__ __forceinline__ void mbar_wait_s(uint32_t b, uint32_t parity) {
    asm volatile("{\n .reg .pred p;\n WAIT_%=:\n"
                 " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 " @!p bra WAIT_%=;\n}\n" ::"r"(b),
                 "r"(parity)
                 : "memory");
}

// The loader's share of an item: thread pt (0..127) copies 16-byte chunk pt % 8 of token rows
// pt / 8 + 16 i (i < 2 * the tile's 32-token width), weight chunks pt and pt + 128 of each tile,
// and scale/bias rows pt and pt + 128 (scales of rows 0..127, then biases).
struct wgp_loader {
    const bf16 *A;
    uint32_t a_off[wg_shape<1>::TOK / 16]; // element offsets of the token rows, k-tile 0
    int nl;                                // token rows per thread and tile
    uint32_t act_st;
    const uint8_t *wq[2];
    uint32_t wq_st[2];
    bool wq_ok[2];
    const uint8_t *sb_src[2];
    bool sb_ok[2];
    int ng, sbs;
};

__device__ __forceinline__ void wgp_setup(const wg_params &p, wgp_loader &l, const item_t &it,
                                          int pt) {
    const int tok0 = pt >> 3, ch = pt & 7;
    l.A = p.A;
    l.nl = 2 * ((it.nrows + 31) >> 5);
    l.act_st = act_offset(tok0, ch); // (rows 16 apart: the same swizzle)
#pragma unroll
    for (int i = 0; i < wg_shape<1>::TOK / 16; i++)
        l.a_off[i] = act_source(p, it, tok0 + 16 * i, ch);
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int idx = pt + 128 * j;
        l.wq[j] = weight_chunk<1>(p, it, idx, l.wq_ok[j], l.wq_st[j]);
        l.sb_src[j] = sb_source<1>(p, it, idx, l.sb_ok[j]);
    }
    l.ng = p.K / p.w[0].group;
    l.sbs = p.sbs;
}

__device__ __forceinline__ int ring_stages(const wg_params &p, int n_max, bool multi) {
    return multi ? min(n_max, p.K / 64 + 1) : n_max;
}

// The loader warpgroup: every tile of the CTA (MULTI: nb blocks x K / 64) in order, each block's
// scales with its first tile (into the slot the block before last read: its tiles were released
// before this tile's stage, as the ring has at most K / 64 + 1 stages and K / 64 >= STAGES - 1).
template <bool MULTI>
__device__ __forceinline__ void wgp_produce(const wg_params &p, const wgp_loader &l, uint32_t smem,
                                            uint32_t sbuf, int nrows) {
    const int nt = ((nrows + 31) >> 5) * 32; // the math threads' width (with_width)
    const uint32_t act = (uint32_t)nt * 128, stage = stage_bytes(nt);
    const int n = ring_stages(p, ring_fit(stage), MULTI);
    const uint32_t full = smem + FULL_OFF, empty = smem + EMPTY_OFF;
    const int KT = p.K / 64, lend = MULTI ? p.nb * KT : KT;
    int s = 0;
    uint32_t ph = 0; // parity of the stage's current use
    for (int lg = 0; lg < lend; lg++) {
        if (lg >= n) mbar_wait_s(empty + 8 * s, ph ^ 1);
        const int b = MULTI ? lg >> p.kshift : 0, lk = MULTI ? lg & p.kmask : lg;
        if (lk == 0) {
            const uint32_t dst = sbuf + (b & 1) * p.sb_slot;
#pragma unroll
            for (int j = 0; j < 2; j++)
                if (l.sb_ok[j])
                    copy_sb_row(dst + (threadIdx.x - 256 + 128 * j) * l.sbs,
                                l.sb_src[j] + b * p.sbbs, l.ng);
        }
        const uint32_t st = smem + (uint32_t)s * stage;
#pragma unroll
        for (int i = 0; i < wg_shape<1>::TOK / 16; i++)
            if (i < l.nl) cp_async16_s(st + l.act_st + i * 16 * 128, l.A + l.a_off[i] + lk * 64);
        const uint32_t wo = (MULTI ? (uint32_t)b * p.wbs : 0) + lk * 32;
#pragma unroll
        for (int j = 0; j < 2; j++)
            if (l.wq_ok[j]) cp_async16_s(st + act + l.wq_st[j], l.wq[j] + wo);
        cp_async_mbar_arrive(full + 8 * s);
        if (++s == n) s = 0, ph ^= 1;
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// The math threads' place in the ring: the next stage to wait for (and its parity), the next to
// release, the ring's stages. Stages are consumed and released in order.
struct ring_pos {
    int sc, rc, n;
    uint32_t ph;
};

// Wait for the next stage's copies and dequantize it (while earlier tiles' wgmmas run); returns
// the stage's shared address.
template <int NT>
__device__ __forceinline__ uint32_t wgp_load(const wg_ctx<1> &c, ring_pos &q, int kt, uint32_t sb,
                                             uint32_t (&a)[16]) {
    const uint32_t st = c.smem + (uint32_t)q.sc * ring_geom<NT>::STAGE;
    mbar_wait_s(c.smem + FULL_OFF + 8 * q.sc, q.ph);
    fence_proxy_async(); // the copies were written through the generic proxy; wgmma reads async
    dequant<1>(c, kt, st + ring_geom<NT>::ACT, sb, 0, a);
    if (++q.sc == q.n) q.sc = 0, q.ph ^= 1;
    return st;
}

__device__ __forceinline__ void wgp_release(const wg_ctx<1> &c, ring_pos &q) {
    mbar_arrive_s(c.smem + EMPTY_OFF + 8 * q.rc);
    if (++q.rc == q.n) q.rc = 0;
}

// Retire the tile before (its fragment registers are the ones the next load overwrites) and
// release its stage, then issue this tile's 4 k-steps. FIRST: the block's tile 0, whose first
// wgmma overwrites the accumulators (no zeroing per block) and which has no tile of the block
// before it (a block's last tile is retired and released after its k loop).
template <int NT, bool FIRST>
__device__ __forceinline__ void wgp_issue(const wg_ctx<1> &c, ring_pos &q, uint32_t st,
                                          const uint32_t (&a)[16], float (&acc)[NT / 2]) {
    const uint64_t d0 = act_desc(st); // (descriptors too are wgmma inputs: before the fence)
    wg_wait<0>();
    if (!FIRST) wgp_release(c, q);
    wg_fence();
#pragma unroll
    for (int s = 0; s < 4; s++) {
        const uint32_t(&as)[4] = *reinterpret_cast<const uint32_t(*)[4]>(&a[4 * s]);
        if (FIRST && s == 0)
            wgmma_rs<NT>::run_first(acc, as, d0);
        else
            wgmma_rs<NT>::run(acc, as, d0 + 2 * s);
    }
    wg_commit();
}

// A block's k loop: the wgmmas of tile kt run while tile kt + 1 is dequantized.
template <int NT>
__device__ __forceinline__ void wgp_block(const wg_ctx<1> &c, ring_pos &q, int KT, uint32_t sb,
                                          float (&acc)[NT / 2]) {
    uint32_t a0[16], a1[16], st;
    // register sets alternate strictly (see run_item)
    st = wgp_load<NT>(c, q, 0, sb, a0);
    wgp_issue<NT, true>(c, q, st, a0, acc);
    int kt = 1;
    for (; kt + 1 < KT; kt += 2) {
        st = wgp_load<NT>(c, q, kt, sb, a1);
        wgp_issue<NT, false>(c, q, st, a1, acc);
        st = wgp_load<NT>(c, q, kt + 1, sb, a0);
        wgp_issue<NT, false>(c, q, st, a0, acc);
    }
    if (kt < KT) {
        st = wgp_load<NT>(c, q, kt, sb, a1);
        wgp_issue<NT, false>(c, q, st, a1, acc);
    }
    wg_wait<0>();
    fence_acc(acc);
    wgp_release(c, q);
}

template <int NT, bool MULTI>
__device__ __forceinline__ void wgp_item(const wg_params &p, const wg_ctx<1> &c,
                                         const item_t &cur) {
    const int nb = MULTI ? p.nb : 1, KT = p.K / 64;
    ring_pos q = {0, 0, ring_stages(p, ring_geom<NT>::N, MULTI), 0};
    float acc[1][NT / 2];
#pragma unroll
    for (int i = 0; i < NT / 2; i++) acc[0][i] = 0.f; // (defined values; every block overwrites)
    for (int b = 0; b < nb; b++) {
        fence_acc(acc[0]);
        const uint32_t sb = c.sbuf + (b & 1) * p.sb_slot;
        wgp_block<NT>(c, q, KT, sb, acc[0]);
        item_t it = cur;
        it.by += b;
        epilogue<1, NT>(p, c, it, acc);
    }
}

#endif // WG_DEVICE

// The loader-warpgroup kernel: warpgroups 0 and 1 compute, warpgroup 2 loads.
// Shared memory: the ring, the stages' mbarriers, the scale slots.
template <bool MULTI>
__global__ void __launch_bounds__(WGP_THREADS, 1) gemm_wgp_kernel(const wg_params p) {
#ifdef WG_DEVICE
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    constexpr int TOK = wg_shape<1>::TOK;
    const int tid = threadIdx.x;
    const int n_mtiles = p.tiles ? *p.n_tiles : (p.M + TOK - 1) / TOK;
    item_t cur;
    if (!get_item<1, MULTI>(p, n_mtiles, blockIdx.x, cur)) return;
    const uint32_t smem = (smem_u32(smem_raw) + 1023) & ~1023u;
    const uint32_t sbuf = smem + FULL_OFF + WGP_BAR_BYTES;
    if (tid == 0)
        for (int s = 0; s < MAX_STAGES; s++) {
            mbar_init_s(smem + FULL_OFF + 8 * s, 128);
            mbar_init_s(smem + EMPTY_OFF + 8 * s, 256);
        }
    __syncthreads();
    if (tid >= 256) { // warpgroup 2
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(WGP_LOAD_REGS));
        wgp_loader l;
        wgp_setup(p, l, cur, tid - 256);
        wgp_produce<MULTI>(p, l, smem, sbuf, cur.nrows);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(WGP_MATH_REGS));
    wg_ctx<1> c;
    init_math<1>(p, c, smem, sbuf);
    // (inlined: a wgmma pipeline across a call is serialized, C7510)
    with_width<TOK>(
        cur.nrows, [&](auto nt) __attribute__((always_inline)) {
            wgp_item<decltype(nt)::value, MULTI>(p, c, cur);
        });
#else
    (void)p;
#endif
}

} // namespace

static_assert(2 * MAX_STAGES * 8 <= WGP_BAR_BYTES, "the stages' mbarriers fit their block");

int launch_loader(cudaStream_t s, const wg_params &p, long items, int smem, struct wren_err *e) {
    // With several blocks per CTA the loader copies block b's scale rows, with block b's first
    // tile, into the slot block b - 2 used; that tile's stage is free only once every tile of
    // block b - 2 is released, as the ring has at most K / 64 + 1 stages (ring_stages); K / 64 >=
    // STAGES - 1 keeps it at least as deep as the launch's STAGES (blocks_per_cta ensures it).
    if (p.nb > 1 && p.K / 64 < wg_shape<1>::STAGES - 1)
        return wren_errf(e, "gemm: %d weight-row blocks per CTA need K >= %d (K = %d)", p.nb,
                         64 * (wg_shape<1>::STAGES - 1), p.K);
    static int attr = 0;
    if (smem > attr) {
        CUDA_CHECK(cudaFuncSetAttribute(gemm_wgp_kernel<false>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CUDA_CHECK(cudaFuncSetAttribute(gemm_wgp_kernel<true>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        attr = smem;
    }
    if (p.nb > 1)
        gemm_wgp_kernel<true><<<(unsigned)items, WGP_THREADS, smem, s>>>(p);
    else
        gemm_wgp_kernel<false><<<(unsigned)items, WGP_THREADS, smem, s>>>(p);
    CUDA_CHECK_LAUNCH();
    return 0;
}

} // namespace wg
