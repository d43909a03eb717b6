// Hopper (sm_90a) path of the fused-dequant GEMM for 4-bit weights: warpgroup MMA (wgmma) with the
// problem transposed, C^T[n, tok] = W[n, K] * A[tok, K]^T, so that the weights are wgmma's A operand,
// which may come from registers: each thread dequantizes its fragment straight from the packed
// words into the registers the MMA reads (no shared-memory round trip for W, no ldmatrix), while
// the activations (the B operand) sit in shared memory in the 128-byte-swizzled K-major layout that
// a wgmma descriptor reads. wgmma is asynchronous, so the dequantization of k-tile t+1 overlaps the
// tensor-core work of tile t (the mma.sync kernel in gemm_q.cu spends its issue slots on both).
//
// Block: 2 warpgroups x 64 weight rows = 128 rows (64 SwiGLU features: gate and up rows interleaved
// by 8, as in gemm_q.cu), times up to 256 tokens; the wgmma N (tokens) is picked per block from its
// row count in steps of 32, so an expert with 140 rows runs one 160-wide tile instead of two
// 128-row tiles. Activation and packed-weight tiles arrive by cp.async in a 5-stage ring; the
// group scales/biases of the block's rows for the whole K are staged once.
#include "backend/cuda/mma.cuh"
#include "backend/cuda/prefill.cuh"
#include "backend/cuda/wgmma_rs.cuh"

namespace {

constexpr int WG_ROWS = 128;    // weight rows per block
constexpr int WG_TOK = 256;     // tokens per block at most (wgmma N <= 256)
constexpr int WG_THREADS = 256; // two warpgroups
constexpr int WG_STAGES = 5;
constexpr int ACT_BYTES = WG_TOK * 128; // [256 tokens][64 k] bf16
constexpr int WQ_BYTES = WG_ROWS * 32;  // [128 rows][64 k] 4-bit
constexpr int STAGE_BYTES = ACT_BYTES + WQ_BYTES;
constexpr int MAX_GROUPS = 64; // K / group: the scale stage is 128 x 64 x 4 bytes at most

struct wg_params {
    const bf16 *A;
    int lda;
    const int *a_rows;
    int M, N, K;
    const uint8_t *w[2], *sc[2], *bi[2]; // gate (or the only matrix) and up
    size_t rs[2], ms[2], sbrs[2], sbms[2];
    int group;
    void *C;
    int ldc, epi;
    const int *tiles, *n_tiles;
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_DEVICE 1
#endif

#ifdef WG_DEVICE
// A stage is overwritten two tiles after it was read (every warpgroup has then retired that
// tile's wgmma group, see k_tile), so loads run STAGES - 2 tiles ahead.
constexpr int WG_DIST = WG_STAGES - 2;

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
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

// 16 bytes global -> shared (shared address already converted).
__device__ __forceinline__ void cp_async16_s(uint32_t saddr, const void *g) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(saddr), "l"(g));
}

__device__ __forceinline__ float silu_f(float x) {
    return x / (1.f + __expf(-x));
}

// The per-block state the k loop needs.
struct wg_ctx {
    uint32_t smem;   // shared address of stage 0
    uint32_t act_st; // this thread's activation chunk: swizzled byte offset inside a stage
    uint32_t a_off[WG_TOK / 32];
    int n_act;        // chunks this thread copies per tile
    const uint8_t *wq; // this thread's packed-weight chunk (k-tile 0)
    uint32_t wq_st;
    bool wq_ok;
    const uint32_t *sb; // staged (scale, bias) pairs, [group][128 rows]
    int kt_per_group;   // k-tiles per quantization group
    int r0;             // first of this thread's two weight rows (r0, r0 + 8) in the block
    uint32_t sel;       // byte_perm selector: byte t of two words
};

__device__ __forceinline__ void load_tile(const wg_ctx &c, const bf16 *A, int kt) {
    const uint32_t st = c.smem + (uint32_t)(kt % WG_STAGES) * STAGE_BYTES;
#pragma unroll
    for (int i = 0; i < WG_TOK / 32; i++)
        if (i < c.n_act) cp_async16_s(st + c.act_st + i * 32 * 128, A + c.a_off[i] + kt * 64);
    if (c.wq_ok) cp_async16_s(st + ACT_BYTES + c.wq_st, c.wq + kt * 32);
    cp_async_commit();
}

// Dequantizes this thread's share of the 64 x 64 weight tile of its warpgroup into the wgmma A
// fragments of the 4 k-steps: rows r0 and r0 + 8, k = 2t, 2t+1, 2t+8, 2t+9 of each step (t = lane
// % 4). MLX packs k = 8j .. 8j+7 into word j (k = 8j + i in bits 4i), so the 4 values a thread
// needs from word j are its byte t: a byte_perm gathers byte t of both rows' word j, the LOP3
// trick builds 128 + q as bf16 pairs, one subtract (exact) and one bf16x2 FMA per pair apply the
// rows' scales and biases (rounded once, as the reference's f32 FMA rounded to bf16).
__device__ __forceinline__ void dequant(const wg_ctx &c, int kt, uint32_t (&a)[16]) {
    const uint32_t st = c.smem + (uint32_t)(kt % WG_STAGES) * STAGE_BYTES + ACT_BYTES;
    uint32_t w0[8], w1[8];
    const int r1 = c.r0 + 8;
    // row r's chunk h sits at chunk h ^ ((r >> 2) & 1): the 8 rows a warp reads hit all 32 banks
    const uint32_t x0 = ((c.r0 >> 2) & 1) << 4;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(w0[0]), "=r"(w0[1]), "=r"(w0[2]), "=r"(w0[3])
                 : "r"(st + c.r0 * 32 + x0));
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(w0[4]), "=r"(w0[5]), "=r"(w0[6]), "=r"(w0[7])
                 : "r"(st + c.r0 * 32 + (16 ^ x0)));
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(w1[0]), "=r"(w1[1]), "=r"(w1[2]), "=r"(w1[3])
                 : "r"(st + r1 * 32 + x0));
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(w1[4]), "=r"(w1[5]), "=r"(w1[6]), "=r"(w1[7])
                 : "r"(st + r1 * 32 + (16 ^ x0)));
    const int g = kt / c.kt_per_group;
    const uint32_t sb0 = c.sb[g * WG_ROWS + c.r0], sb1 = c.sb[g * WG_ROWS + r1];
    const uint32_t s2u = __byte_perm(sb0, sb1, 0x5410), b2u = __byte_perm(sb0, sb1, 0x7632);
    const __nv_bfloat162 s2 = *reinterpret_cast<const __nv_bfloat162 *>(&s2u);
    const __nv_bfloat162 b2 = *reinterpret_cast<const __nv_bfloat162 *>(&b2u);
    const __nv_bfloat162 m128 = __float2bfloat162_rn(128.f);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const uint32_t y = __byte_perm(w0[j], w1[j], c.sel); // (byte t of row r0, of row r1)
        uint32_t lo = (y & 0x000F000Fu) | 0x43004300u;        // k = 8j + 2t of both rows
        uint32_t hi = ((y >> 4) & 0x000F000Fu) | 0x43004300u; // k = 8j + 2t + 1
        __nv_bfloat162 l2 = *reinterpret_cast<__nv_bfloat162 *>(&lo);
        __nv_bfloat162 h2 = *reinterpret_cast<__nv_bfloat162 *>(&hi);
        l2 = __hfma2(__hsub2(l2, m128), s2, b2);
        h2 = __hfma2(__hsub2(h2, m128), s2, b2);
        lo = *reinterpret_cast<uint32_t *>(&l2);
        hi = *reinterpret_cast<uint32_t *>(&h2);
        // word j is k-step j / 2; even words are fragment registers 0 (row r0) and 1 (row r0 + 8),
        // odd words (k + 8) registers 2 and 3
        a[(j >> 1) * 4 + (j & 1) * 2] = __byte_perm(lo, hi, 0x5410);
        a[(j >> 1) * 4 + (j & 1) * 2 + 1] = __byte_perm(lo, hi, 0x7632);
    }
}

// One k-tile: wait for its stage, start the load of tile kt + DIST, dequantize into `a` while the
// previous tile's wgmmas (reading the other register set) run, retire those, issue 4 wgmmas.
// Retiring with wait_group 0 right before the issue (not wait_group 1 at the top) is what lets
// ptxas see that no in-flight wgmma reads `a`; otherwise it serializes every wgmma (C7513).
template <int NT>
__device__ __forceinline__ void k_tile(const wg_ctx &c, const bf16 *A, int kt, int KT,
                                       uint32_t (&a)[16], float (&acc)[NT / 2]) {
    cp_async_wait<WG_DIST - 1>();
    fence_proxy_async();
    // Both warpgroups have retired tile kt - 2 (at their previous tile), so its stage is free.
    __syncthreads();
    if (kt + WG_DIST < KT)
        load_tile(c, A, kt + WG_DIST);
    else
        cp_async_commit(); // keep the group count uniform
    dequant(c, kt, a);
    // descriptors too are wgmma inputs: define them before the fence
    const uint64_t d0 = act_desc(c.smem + (uint32_t)(kt % WG_STAGES) * STAGE_BYTES);
    wg_wait<0>();
    wg_fence();
#pragma unroll
    for (int s = 0; s < 4; s++) {
        const uint32_t(&as)[4] = *reinterpret_cast<const uint32_t(*)[4]>(&a[4 * s]);
        wgmma_rs<NT>::run(acc, as, d0 + 2 * s); // + 32 bytes per k-step
    }
    wg_commit();
}

template <int NT>
__device__ __forceinline__ void mainloop(const wg_params &p, wg_ctx &c, int row0, int nrows,
                                         int by) {
    float acc[NT / 2];
#pragma unroll
    for (int i = 0; i < NT / 2; i++) acc[i] = 0.f;
    uint32_t a0[16], a1[16];
    const int KT = p.K / 64;
    fence_acc(acc);
    // Register sets alternate strictly (no path reaches a set while its own wgmmas may still be
    // in flight, or ptxas serializes): pairs of tiles, then the odd last one.
    int kt = 0;
    for (; kt + 1 < KT; kt += 2) {
        k_tile<NT>(c, p.A, kt, KT, a0, acc);
        k_tile<NT>(c, p.A, kt + 1, KT, a1, acc);
    }
    if (kt < KT) k_tile<NT>(c, p.A, kt, KT, a0, acc);
    wg_wait<0>();
    fence_acc(acc);

    // acc[4j + 2h + e]: weight row r0 + 8h of the block, token 8j + 2t + e of the tile
    const int lane = threadIdx.x & 31, t = lane & 3;
#pragma unroll
    for (int j = 0; j < NT / 8; j++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int tok = 8 * j + 2 * t + e;
            if (tok >= nrows) continue;
            const size_t r = (size_t)(row0 + tok) * p.ldc;
            if (p.epi == EPI_SWIGLU_BF16) {
                // rows r0 (gate) and r0 + 8 (up) of one feature
                const int f = by * 64 + (c.r0 >> 4) * 8 + (c.r0 & 7);
                if (f < p.N)
                    static_cast<bf16 *>(p.C)[r + f] =
                        __float2bfloat16(silu_f(acc[4 * j + e]) * acc[4 * j + 2 + e]);
                continue;
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int n = by * WG_ROWS + c.r0 + 8 * h;
                const float v = acc[4 * j + 2 * h + e];
                if (n >= p.N) continue;
                if (p.epi == EPI_BF16)
                    static_cast<bf16 *>(p.C)[r + n] = __float2bfloat16(v);
                else if (p.epi == EPI_ADD_F32)
                    static_cast<float *>(p.C)[r + n] += v;
                else
                    static_cast<float *>(p.C)[r + n] = v;
            }
        }
    }
}
#endif // WG_DEVICE

__global__ void __launch_bounds__(WG_THREADS, 1) gemm_wg_kernel(const wg_params p) {
#ifdef WG_DEVICE
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int expert = 0, row0, row_end;
    if (p.tiles) {
        if ((int)blockIdx.x >= *p.n_tiles) return;
        expert = p.tiles[3 * blockIdx.x];
        row0 = p.tiles[3 * blockIdx.x + 1];
        row_end = p.tiles[3 * blockIdx.x + 2];
    } else {
        row0 = blockIdx.x * WG_TOK;
        row_end = min(row0 + WG_TOK, p.M);
    }
    const int nrows = row_end - row0, by = blockIdx.y;
    if (nrows <= 0) return;

    wg_ctx c;
    // the 128-byte swizzle repeats every 1024 bytes: align the stages to that
    const uint32_t base = smem_u32(smem_raw);
    c.smem = (base + 1023) & ~1023u;
    unsigned char *smem = smem_raw + (c.smem - base);
    c.sb = reinterpret_cast<const uint32_t *>(smem + WG_STAGES * STAGE_BYTES);

    // activations: this thread copies 16-byte chunk (tid % 8) of tokens tid / 8 + 32 i
    const int tok0 = tid >> 3, ch = tid & 7;
    c.act_st = tok0 * 128 + ((ch ^ (tok0 & 7)) << 4);
    c.n_act = (nrows - tok0 + 31) / 32;
#pragma unroll
    for (int i = 0; i < WG_TOK / 32; i++) {
        const int r = row0 + min(tok0 + 32 * i, nrows - 1);
        c.a_off[i] = (uint32_t)((p.a_rows ? p.a_rows[r] : r) * p.lda + ch * 8);
    }

    // packed weights: this thread copies half (16 bytes = 32 k) of block row tid / 2
    auto row_of = [&](int v, int &m) { // block row -> matrix (0 gate/plain, 1 up) and its row
        if (p.epi == EPI_SWIGLU_BF16) {
            m = (v >> 3) & 1;
            return by * 64 + (v >> 4) * 8 + (v & 7);
        }
        m = 0;
        return by * WG_ROWS + v;
    };
    {
        const int v = tid >> 1, half = tid & 1;
        int m;
        const int n = row_of(v, m);
        c.wq_ok = n < p.N;
        c.wq = p.w[m] + expert * p.ms[m] + (size_t)(c.wq_ok ? n : 0) * p.rs[m] + half * 16;
        c.wq_st = v * 32 + ((half ^ ((v >> 2) & 1)) << 4);
    }
    const int KT = p.K / 64;
#pragma unroll
    for (int s = 0; s < WG_DIST; s++) {
        if (s < KT)
            load_tile(c, p.A, s);
        else
            cp_async_commit();
    }

    // (scale, bias) of every group of the block's rows, [group][row], while the first tiles load
    const int ng = p.K / p.group;
    uint32_t *sb = const_cast<uint32_t *>(c.sb);
    for (int i = tid; i < ng * WG_ROWS; i += WG_THREADS) {
        const int v = i % WG_ROWS, gi = i / WG_ROWS;
        int m;
        const int n = row_of(v, m);
        uint32_t val = 0;
        if (n < p.N) {
            const size_t off = expert * p.sbms[m] + (size_t)n * p.sbrs[m] + gi * 2;
            const uint32_t s = *reinterpret_cast<const uint16_t *>(p.sc[m] + off);
            const uint32_t b = *reinterpret_cast<const uint16_t *>(p.bi[m] + off);
            val = s | (b << 16);
        }
        sb[gi * WG_ROWS + v] = val;
    }
    c.kt_per_group = p.group / 64;
    // thread (warpgroup q, warp w, lane g*4+t) owns block rows 64q + 16w + g and + 8
    c.r0 = (warp >> 2) * 64 + (warp & 3) * 16 + (lane >> 2);
    const uint32_t t = lane & 3;
    c.sel = t | (t << 4) | ((t + 4) << 8) | ((t + 4) << 12);
    // (the first k_tile's barrier publishes the scales)

    switch ((nrows + 31) >> 5) {
    case 1:
        mainloop<32>(p, c, row0, nrows, by);
        break;
    case 2:
        mainloop<64>(p, c, row0, nrows, by);
        break;
    case 3:
        mainloop<96>(p, c, row0, nrows, by);
        break;
    case 4:
        mainloop<128>(p, c, row0, nrows, by);
        break;
    case 5:
        mainloop<160>(p, c, row0, nrows, by);
        break;
    case 6:
        mainloop<192>(p, c, row0, nrows, by);
        break;
    case 7:
        mainloop<224>(p, c, row0, nrows, by);
        break;
    default:
        mainloop<256>(p, c, row0, nrows, by);
        break;
    }
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

} // namespace

void pf_gemm_force_path(int path) {
    g_force_path = path;
}

int pf_gemm_path_forced() {
    return g_force_path;
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
        if (m->type != WT_Q4 || m->bits != 4 || m->group % 64 || m->cols != W->cols ||
            m->rows != W->rows || ((uintptr_t)m->data % 16) || m->row_stride % 16 ||
            (m->n > 1 && m->mat_stride % 16) || !m->scales || !m->biases ||
            m->sb_row_stride % 2 || m->sb_mat_stride % 2 || ((uintptr_t)m->scales % 2) ||
            ((uintptr_t)m->biases % 2))
            return false;
    }
    const int K = W->cols;
    return K % 64 == 0 && K / W->group <= MAX_GROUPS && lda % 8 == 0 && ((uintptr_t)A % 16) == 0 &&
           (size_t)M * lda + K < (1u << 31) && (!grp || grp->bm <= WG_TOK) &&
           (epi != EPI_SWIGLU_BF16 || Wup) && ldc > 0;
}

int pf_gemm_wg(cudaStream_t s, const bf16 *A, int lda, int M, const struct dmat *W,
               const struct dmat *Wup, void *C, int ldc, enum gemm_epi epi,
               const struct gemm_group *grp, struct wren_err *e) {
    wg_params p;
    p.A = A;
    p.lda = lda;
    p.a_rows = grp ? grp->a_rows : nullptr;
    p.M = M;
    p.N = W->rows;
    p.K = W->cols;
    const struct dmat *ms[2] = {W, Wup ? Wup : W};
    for (int i = 0; i < 2; i++) {
        p.w[i] = ms[i]->data;
        p.sc[i] = ms[i]->scales;
        p.bi[i] = ms[i]->biases;
        p.rs[i] = ms[i]->row_stride;
        p.ms[i] = ms[i]->mat_stride;
        p.sbrs[i] = ms[i]->sb_row_stride;
        p.sbms[i] = ms[i]->sb_mat_stride;
    }
    p.group = W->group;
    p.C = C;
    p.ldc = ldc;
    p.epi = (int)epi;
    p.tiles = grp ? grp->tiles : nullptr;
    p.n_tiles = grp ? grp->n_tiles : nullptr;
    const int n_mtiles = grp ? grp->max_tiles : (M + WG_TOK - 1) / WG_TOK;
    if (n_mtiles <= 0) return 0;
    const int smem = 1024 + WG_STAGES * STAGE_BYTES + (p.K / p.group) * WG_ROWS * 4;
    static int attr_smem = 0;
    if (smem > attr_smem) {
        CUDA_CHECK(cudaFuncSetAttribute(gemm_wg_kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        attr_smem = smem;
    }
    dim3 grid(n_mtiles, epi == EPI_SWIGLU_BF16 ? (p.N + 63) / 64 : (p.N + WG_ROWS - 1) / WG_ROWS);
    gemm_wg_kernel<<<grid, WG_THREADS, smem, s>>>(p);
    CUDA_CHECK_LAUNCH();
    return 0;
}
