// Shared pieces of the Hopper (sm_90a) fused-dequant GEMM for 4-bit weights (gemm_wg.cu: the
// kernel every thread of which loads; gemm_wgp.cu: shape 1 with a loader warpgroup): the work-item
// shapes and parameters, the work-item map, the dequantization into wgmma A fragments and the
// epilogue. See gemm_wg.cu for the design.
#pragma once
#include "backend/cuda/gemm_args.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/wgmma_rs.cuh"

#include <type_traits>

namespace wg {

constexpr int WG_THREADS = 256;         // two warpgroups
constexpr int MAX_GROUPS = 64;          // K / group: scales + biases of 256 rows take 72 KB at most
constexpr int WG_SMEM_MAX = 227 * 1024; // shared memory per block on sm_90 (the only target)
// the loader-warpgroup kernel of shape 1 (gemm_wgp.cu): two math warpgroups and a loader
constexpr int WGP_THREADS = 384;
constexpr int WGP_MATH_REGS = 224, WGP_LOAD_REGS = 56; // 256 x 224 + 128 x 56 <= 64K
constexpr int WGP_BAR_BYTES = 128;                     // 2 x STAGES mbarriers

// Work-item shapes (SH): MB m64 blocks of weight rows per warpgroup, up to TOK tokens, a ring of
// STAGES k-tiles in shared memory with loads DIST tiles ahead, MIN_BLOCKS CTAs per SM. SH 1: 128
// weight rows x up to 256 tokens; SH 2: 256 rows x up to 128 tokens (half the activation bytes per
// FLOP, twice the weight bytes; the same accumulator registers); SH 3: 256 rows x up to 32 tokens,
// two CTAs per SM (at most 128 registers, 101 KB of shared memory at K = 2048), for experts with a
// few rows each (short prompts): there a k-tile is a latency-bound chain (barrier, dequantize,
// retire the previous wgmma group, issue) and a second CTA runs its chain beside it. SH 4: 128
// rows x up to 128 tokens, two CTAs per SM the same way (128 registers, a ring of 4 stages: 101
// KB at K = 2048), for 25-111 rows per expert (prompts of ~800 to ~3.5K tokens). SH 2 is slower
// than SH 4 wherever measured and stays as a test hook.
template <int SH> struct wg_shape {
    static constexpr int MB = SH == 1 || SH == 4 ? 1 : 2;
    static constexpr int ROWS = 128 * MB;                          // weight rows per work item
    static constexpr int TOK = SH == 1 ? 256 : SH == 3 ? 32 : 128; // tokens per work item at most
    static constexpr int MIN_BLOCKS = SH >= 3 ? 2 : 1;
    static constexpr int ACT = TOK * 128;         // [TOK][64 k] bf16
    static constexpr int STAGE = ACT + ROWS * 32; // + [ROWS][64 k] 4-bit
    static constexpr int STAGES = SH == 4 ? 4 : 5;
    // A stage is overwritten two tiles after it was read (every warpgroup has then retired that
    // tile's wgmma group, see k_tile), so loads run STAGES - 2 tiles ahead.
    static constexpr int DIST = STAGES - 2;
    static_assert(DIST >= 1 && STAGE % 1024 == 0, "a ring of 1024-byte aligned stages");
};

// Bytes per scale (or bias) row in shared memory: the row's ng bf16 values rounded up to 16 bytes
// (cp.async chunks), with pad plus 16 where that is an even multiple of 16. A warp's LDS.U16 of its
// 8 rows' scales then hits 8 banks (row strides of 4 x an odd number of words); unpadded rows of 64
// or 128 bytes (K = 2048, 4096 at groups of 64) put 4 or 8 of them in one bank.
constexpr int sb_row_bytes(int ng, bool pad) {
    return ((ng * 2 + 15) & ~15) + (pad && !(((ng * 2 + 15) >> 4) & 1) ? 16 : 0);
}

// Kernel modes: one weight-row block per CTA; a dense GEMM split along K (gemm_split.cu); several
// weight-row blocks per CTA (wg_params::nb > 1, item shape 1). Each is its own instantiation:
// the split kernel's k loop then starts at a known 0 in the others (one kernel for both cost the
// K = 512 GEMMs 1-12%), and the one-block kernel keeps its k loop free of the block arithmetic
// (with it, ptxas reloaded kernel parameters inside the 256-token k loop).
enum { WG_ONE, WG_SPLIT, WG_MULTI };

// The group size of both matrices is w[0].group (pf_gemm checks that SwiGLU's gate and up agree).
struct wg_params : gemm_in {
    bool sb_async; // scale/bias rows are whole 16-byte chunks: staged by cp.async
    void *C;
    int ldc, epi;
    const int *tiles, *n_tiles;
    int ny;     // work items per row tile (weight-row blocks)
    int splits; // K parts (dense mode only, gemm_split.cu): > 1 writes raw sums to part
    float *part;
    // A CTA runs nb consecutive weight-row blocks of one token tile (ny % nb == 0; nb > 1 only
    // where every block is whole and gate/up strides agree): one k loop over nb * KT tiles, so
    // the next block's first tiles load while this one computes. wbs / sbbs: bytes from a block's
    // packed weights / scale rows to the next block's; sb_slot: bytes between the two scale slots.
    int nb, nyb;       // nyb = ny / nb
    int kshift, kmask; // nb > 1: K / 64 == 1 << kshift, kmask = K / 64 - 1
    uint32_t wbs;      // (wbs <= 2^29: checked)
    size_t sbbs;
    int sb_slot;
    int sbs; // bytes per scale row in shared memory (sb_row_bytes, padded or not: launch)
};

// The loader-warpgroup kernel for shape 1 (gemm_wgp.cu): launches `items` CTAs with `smem` bytes
// of dynamic shared memory (the ring, WGP_BAR_BYTES of barriers, the scale slots).
int launch_loader(cudaStream_t s, const wg_params &p, long items, int smem, struct wren_err *e);

} // namespace wg

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_DEVICE 1
#endif

#ifdef WG_DEVICE
namespace wg {

__device__ __forceinline__ void wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// cp.async writes through the generic proxy; wgmma reads shared memory through the async proxy.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving accumulator reads/writes across the asynchronous MMAs.
template <int ND> __device__ __forceinline__ void fence_acc(float (&d)[ND]) {
#pragma unroll
    for (int i = 0; i < ND; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// Descriptor of a K-major bf16 tile with 128-byte rows, 128-byte swizzle, 8-row groups 1024
// bytes apart (the tile base is 1024-byte aligned; k steps of 16 add 32 bytes to the start).
__device__ __forceinline__ uint64_t act_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) |
           ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

// 16 bytes global -> shared (shared address already converted).
__device__ __forceinline__ void cp_async16_s(uint32_t saddr, const void *g) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(saddr), "l"(g));
}

// A work item: up to 256 rows (tokens) of one expert times 128 weight rows (block `by`).
struct item_t {
    int expert, row0, nrows, by;
};

template <int SH, bool MULTI>
__device__ __forceinline__ bool get_item(const wg_params &p, int n_mtiles, int item, item_t &it) {
    constexpr int WG_TOK = wg_shape<SH>::TOK;
    // several blocks per CTA: the item is the first of its nb blocks
    const int nyb = MULTI ? p.nyb : p.ny, mt = item / nyb;
    if (mt >= n_mtiles) return false;
    it.by = item - mt * nyb;
    if (MULTI) it.by *= p.nb;
    if (p.tiles) {
        it.expert = p.tiles[3 * mt];
        it.row0 = p.tiles[3 * mt + 1];
        it.nrows = p.tiles[3 * mt + 2] - it.row0;
    } else {
        it.expert = 0;
        it.row0 = mt * WG_TOK;
        it.nrows = min(WG_TOK, p.M - it.row0);
    }
    return true;
}

// Item row v -> matrix (0 gate or the only one, 1 up) and its row. SwiGLU items cover ROWS / 2
// features with gate and up rows interleaved by 8 (as in gemm_q.cu), so a thread's accumulator
// rows r and r + 8 are the gate and up of one feature.
template <int SH> __device__ __forceinline__ int row_of(const wg_params &p, int by, int v, int &m) {
    if (p.epi == EPI_SWIGLU_BF16) {
        m = (v >> 3) & 1;
        return by * (wg_shape<SH>::ROWS / 2) + (v >> 4) * 8 + (v & 7);
    }
    m = 0;
    return by * wg_shape<SH>::ROWS + v;
}

// Per-thread state of the loads and of the dequantization.
template <int SH> struct wg_ctx {
    static constexpr int MB = wg_shape<SH>::MB;
    uint32_t smem;   // shared address of stage 0
    uint32_t sbuf;   // shared address of the scales [ROWS][sbs bytes], then the biases
    uint32_t act_st; // this thread's activation chunk: swizzled byte offset inside a stage
    const bf16 *a_src[wg_shape<SH>::TOK / 32]; // this thread's activation chunks (k-tile 0)
    int n_act;                                 // activation chunks this thread copies per tile
    const uint8_t *wq[MB];                     // this thread's packed-weight chunks (k-tile 0)
    uint32_t wq_st[MB];
    bool wq_ok[MB];
    const uint8_t *sb_src[MB]; // this thread's scale or bias rows (cp.async staging)
    bool sb_ok[MB];
    int ng, sbs; // groups per row; bytes per scale row in shared memory (sb_row_bytes)
    int r0;      // first of this thread's weight rows (r0, r0 + 8, + 64 ...)
    int gsh;     // k-tile kt is in group kt >> gsh (groups are 64 << gsh wide)
    uint32_t wo; // word t of its rows' first chunk (chunk h sits at h ^ ((row >> 2) & 1))
};

// The math threads' part of the context: the stages and scale slot at smem and sbuf, and the
// weight rows of thread (warpgroup q, warp w, lane g*4+t): 64 MB q + 16w + g and + 8 (and + 64,
// + 72 for MB = 2).
template <int SH>
__device__ __forceinline__ void init_math(const wg_params &p, wg_ctx<SH> &c, uint32_t smem,
                                          uint32_t sbuf) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    c.smem = smem;
    c.sbuf = sbuf;
    c.ng = p.K / p.w[0].group;
    c.sbs = p.sbs;
    c.gsh = __ffs(p.w[0].group) - 7; // a power of two >= 64 (pf_gemm_wg_fits)
    c.r0 = (warp >> 2) * 64 * wg_shape<SH>::MB + (warp & 3) * 16 + (lane >> 2);
    c.wo = 4 * (lane & 3) + ((((uint32_t)c.r0 >> 2) & 1) << 4); // (rows + 8, + 64 alike)
}

// Byte offset of 16-byte chunk ch of token row tok in a stage's activation tile (the 128-byte
// swizzle wgmma's descriptor reads).
__device__ __forceinline__ uint32_t act_offset(int tok, int ch) {
    return tok * 128 + ((ch ^ (tok & 7)) << 4);
}

// Element offset of chunk ch of item token tok's activation row at k-tile 0 (tokens past the
// item's rows repeat its last one, so copies of whole token tiles stay in bounds).
__device__ __forceinline__ uint32_t act_source(const wg_params &p, const item_t &it, int tok,
                                               int ch) {
    const int r = it.row0 + min(tok, it.nrows - 1);
    return (uint32_t)((p.a_rows ? p.a_rows[r] : r) * p.lda + ch * 8);
}

// Packed-weight chunk idx of an item (16-byte half idx & 1 of item row idx / 2): its address at
// k-tile 0, whether its row exists (ok), and its offset in a stage's weight tile (st: 32-byte rows,
// the halves swapped in every other group of 4 rows).
template <int SH>
__device__ __forceinline__ const uint8_t *weight_chunk(const wg_params &p, const item_t &it,
                                                       int idx, bool &ok, uint32_t &st) {
    const int v = idx >> 1;
    int m;
    const int n = row_of<SH>(p, it.by, v, m);
    ok = n < p.N;
    st = v * 32 + (((idx & 1) ^ ((v >> 2) & 1)) << 4);
    return p.w[m].data + it.expert * p.w[m].ms + (size_t)(ok ? n : 0) * p.w[m].rs + (idx & 1) * 16;
}

// Row copy idx of an item's scales and biases (scale rows 0..ROWS-1, then the bias rows): its
// source and whether its row exists (ok).
template <int SH>
__device__ __forceinline__ const uint8_t *sb_source(const wg_params &p, const item_t &it, int idx,
                                                    bool &ok) {
    constexpr int ROWS = wg_shape<SH>::ROWS;
    int m;
    const int n = row_of<SH>(p, it.by, idx % ROWS, m);
    ok = n < p.N;
    return (idx < ROWS ? p.w[m].scales : p.w[m].biases) + it.expert * p.w[m].sbms +
           (size_t)(ok ? n : 0) * p.w[m].sbrs;
}

// One scale or bias row (ng bf16 values, whole 16-byte chunks) into shared memory by cp.async.
__device__ __forceinline__ void copy_sb_row(uint32_t dst, const uint8_t *src, int ng) {
    for (int ch = 0; ch < ng / 8; ch++) cp_async16_s(dst + ch * 16, src + ch * 16);
}

// f(std::integral_constant<int, NT>) with the token-tile width NT of an item of nrows rows: its
// rows rounded up to 32, at most TOK (one instantiation of the k loop per width).
template <int TOK, class F> __device__ __forceinline__ void with_width(int nrows, F &&f) {
    using std::integral_constant;
    if constexpr (TOK == 32) {
        f(integral_constant<int, 32>());
        return;
    }
    switch ((nrows + 31) >> 5) {
    case 1:
        f(integral_constant<int, 32>());
        break;
    case 2:
        f(integral_constant<int, 64>());
        break;
    case 3:
        f(integral_constant<int, 96>());
        break;
    case 4:
        f(integral_constant<int, 128>());
        break;
    case 5:
        f(integral_constant<int, (TOK < 160 ? TOK : 160)>());
        break;
    case 6:
        f(integral_constant<int, (TOK < 192 ? TOK : 192)>());
        break;
    case 7:
        f(integral_constant<int, (TOK < 224 ? TOK : 224)>());
        break;
    default:
        f(integral_constant<int, TOK>());
        break;
    }
}

__device__ __forceinline__ uint32_t lds_u16(uint32_t a) {
    uint16_t v;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(a));
    return v;
}

// Dequantizes this thread's share of the 64 x 64 weight tile of its warpgroup into the wgmma A
// fragments of the 4 k-steps: rows r0 and r0 + 8, k = 16s + 8h + 2t + e (step s, fragment half h,
// lane t = lane % 4, pair element e). In the device layout (common.cuh, q4_word) these are word t
// of each of the row's two 16-byte chunks (s = 0, 1 in the first, s = 2, 3 in the second), pair
// (s, h) at nibbles 2 (s & 1) + h and + 4, i.e. 16 bits apart, where the LOP3 trick builds 128 + q
// as a bf16 pair; one subtract (exact) and one bf16x2 FMA per pair apply the row's scale and bias
// (rounded once, as the reference's f32 FMA rounded to bf16). st: the shared address of the
// stage's packed weights.
template <int SH>
__device__ __forceinline__ void dequant(const wg_ctx<SH> &c, int kt, uint32_t st, uint32_t sbuf,
                                        int mb, uint32_t (&a)[16]) {
    constexpr int WG_ROWS = wg_shape<SH>::ROWS;
    const int r0 = c.r0 + 64 * mb;
    uint32_t w[2][2]; // [row r0, r0 + 8][chunk]
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int u = 0; u < 2; u++)
            asm volatile("ld.shared.u32 %0, [%1];\n"
                         : "=r"(w[r][u])
                         : "r"(st + (r0 + 8 * r) * 32 + (c.wo ^ (16 * u))));
    const int g = kt >> c.gsh;
    const uint32_t sa = sbuf + r0 * c.sbs + g * 2, sb = sa + 8 * c.sbs;
    const uint32_t sbu[4] = {lds_u16(sa), lds_u16(sb), lds_u16(sa + WG_ROWS * c.sbs),
                             lds_u16(sb + WG_ROWS * c.sbs)};
    __nv_bfloat162 s2[2], b2[2]; // both halves the row's scale / bias
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const uint32_t su = __byte_perm(sbu[r], 0, 0x1010), bu = __byte_perm(sbu[2 + r], 0, 0x1010);
        s2[r] = *reinterpret_cast<const __nv_bfloat162 *>(&su);
        b2[r] = *reinterpret_cast<const __nv_bfloat162 *>(&bu);
    }
    const __nv_bfloat162 m128 = __float2bfloat162_rn(128.f);
#pragma unroll
    for (int s = 0; s < 4; s++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                uint32_t x = nib_bf16x2(w[r][s >> 1] >> (4 * (2 * (s & 1) + h)));
                __nv_bfloat162 v = *reinterpret_cast<__nv_bfloat162 *>(&x);
                v = __hfma2(__hsub2(v, m128), s2[r], b2[r]);
                // fragment registers 0 (row r0) and 1 (r0 + 8) at k, 2 and 3 at k + 8
                a[4 * s + 2 * h + r] = *reinterpret_cast<uint32_t *>(&v);
            }
}

// The epilogue from the accumulators (layout as in store_part). Per weight-row block mb the
// epilogue kind is tested once, the column bounds (n, n + 8 < N) are predicates and this thread's
// two output rows per j (tokens 8j + 2t and + 1) are pointers stepped by 8 rows: the stores of a
// K = 512 item cost about as many instructions as its k loop when every element recomputed its
// address and re-tested the kind.
template <int SH, int NT>
__device__ __forceinline__ void epilogue(const wg_params &p, const wg_ctx<SH> &c, const item_t &cur,
                                         float (&acc)[wg_shape<SH>::MB][NT / 2]) {
    constexpr int MB = wg_shape<SH>::MB, WG_ROWS = wg_shape<SH>::ROWS;
    const int t = threadIdx.x & 3;
    const int lim = cur.nrows - 2 * t; // token 8j + 2t + e is in the item while 8j + e < lim
    const size_t ld = (size_t)p.ldc, ld8 = 8 * ld;
    const size_t row = (size_t)(cur.row0 + 2 * t) * ld;
#pragma unroll
    for (int mb = 0; mb < MB; mb++) {
        const int r0 = c.r0 + 64 * mb;
        if (p.epi == EPI_SWIGLU_BF16) {
            // rows r0 (gate) and r0 + 8 (up) of one feature
            const int f = cur.by * (WG_ROWS / 2) + (r0 >> 4) * 8 + (r0 & 7);
            if (f >= p.N) continue;
            bf16 *o = static_cast<bf16 *>(p.C) + row + f;
#pragma unroll
            for (int j = 0; j < NT / 8; j++, o += ld8)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    if (8 * j + e < lim)
                        o[e * ld] =
                            __float2bfloat16(silu_f(acc[mb][4 * j + e]) * acc[mb][4 * j + 2 + e]);
            continue;
        }
        const int n = cur.by * WG_ROWS + r0; // rows n and n + 8: accumulators 4j + e and 4j + 2 + e
        const bool ok0 = n < p.N, ok1 = n + 8 < p.N;
        if (p.epi == EPI_BF16) {
            bf16 *o = static_cast<bf16 *>(p.C) + row + n;
#pragma unroll
            for (int j = 0; j < NT / 8; j++, o += ld8)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    if (8 * j + e >= lim) continue;
                    if (ok0) o[e * ld] = __float2bfloat16(acc[mb][4 * j + e]);
                    if (ok1) o[e * ld + 8] = __float2bfloat16(acc[mb][4 * j + 2 + e]);
                }
            continue;
        }
        float *o = static_cast<float *>(p.C) + row + n;
        if (p.epi == EPI_ADD_F32) {
            // all reads of C before any write: the compiler cannot prove that the elements
            // differ, so interleaved read-add-writes would each wait for a memory round trip
            const float *q = o;
#pragma unroll
            for (int j = 0; j < NT / 8; j++, q += ld8)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    if (8 * j + e >= lim) continue;
                    if (ok0) acc[mb][4 * j + e] += q[e * ld];
                    if (ok1) acc[mb][4 * j + 2 + e] += q[e * ld + 8];
                }
        }
#pragma unroll
        for (int j = 0; j < NT / 8; j++, o += ld8) // EPI_F32, EPI_ADD_F32 (added above)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                if (8 * j + e >= lim) continue;
                if (ok0) o[e * ld] = acc[mb][4 * j + e];
                if (ok1) o[e * ld + 8] = acc[mb][4 * j + 2 + e];
            }
    }
}

} // namespace wg
#endif // WG_DEVICE
