// Batch-1 GEMV for one large 4/8-bit matrix (the lm_head: 248K rows, 286 MB at 4 bits), where the
// whole cost is streaming the weights. The register-pipelined GEMV (decode_qgemv.cu) keeps two
// steps of 2 rows per warp in flight, ~64 KB per SM, and reached ~3.2 TB/s on it. Here a producer
// thread per block bulk-copies (TMA 1-D) stages of QS_ROWS consecutive rows with their scales and
// biases into a ring in shared memory, NST stages ahead (~200 KB in flight per SM), and 7 consumer
// warps take 2 rows of each stage with the same int8 activation and dp4a dot products (qdot).
// A stage is three contiguous copies. Blocks that become resident only after the previous launch
// ends (a quarter to two thirds of them in traces) start ~10 us after the others, so only the first
// three quarters of the stages are dealt out statically; the rest are taken one at a time from a
// counter as ring slots free up, so the blocks finish together. Hopper and newer.
#include "backend/cuda/qgemv_dev.cuh"
#include "backend/cuda/mma.cuh"

#define QS_CWARPS 7                  // consumer warps; the 8th is the producer
#define QS_ROWS   (QS_CWARPS * QG_R) // rows per stage
#define QS_MAXST  8

struct qs_params {
    struct dmat a;
    float *out;
    const float *x, *norm_w;
    int cols, rows;
    float eps;
    int C, ng, gshift; // 16-byte chunks per row, scale groups per row, log2(chunks per group)
    int nst;           // stages in the ring
    long nstages;      // stages of the whole matrix
    unsigned *sched; // [2]: stages taken from the pool, blocks done with it (zero between launches)
    long nstat;      // with sched: stages dealt statically to each block
};

static __host__ __device__ __forceinline__ size_t qs_stage_bytes(int C, int ng) {
    return (size_t)QS_ROWS * C * 16 + (size_t)2 * QS_ROWS * ng * 2;
}

template <int BITS>
__global__ void __launch_bounds__(QG_THREADS, QG_BLOCKS_PER_SM)
    qstream_kernel(const __grid_constant__ struct qs_params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint8_t qs_sm[];
    __shared__ float red[32];
    __shared__ __align__(8) uint64_t full[QS_MAXST], empty[QS_MAXST];
    __shared__ long sidx[QS_MAXST]; // the stage in each ring slot (-1: the block is done)
    TRACE_BEGIN();
    pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nst = p.nst;
    // the block's statically dealt stages [lo, lo + cnt); with sched, then the pool [base, nstages)
    const long lo = p.sched ? blockIdx.x * p.nstat : blockIdx.x * p.nstages / gridDim.x;
    const long cnt = p.sched ? p.nstat : (blockIdx.x + 1) * p.nstages / gridDim.x - lo;
    const long base = p.nstat * gridDim.x;
    const size_t wb = (size_t)QS_ROWS * p.C * 16, sb = (size_t)QS_ROWS * p.ng * 2;
    const size_t stb = wb + 2 * sb;
    if (threadIdx.x == 0) {
        for (int i = 0; i < nst; i++) mbar_init(&full[i], 1), mbar_init(&empty[i], QS_CWARPS);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const bool producer = warp == QS_CWARPS && lane == 0;
    const uint64_t pol = l2_stream();
    long ahead = -1; // the producer's next stage from the pool, requested one stage ahead
    // the producer: the block's i-th stage into ring slot i % nst; false once there is none
    auto issue = [&](long i) {
        const int slot = (int)(i % nst);
        long g = i < cnt ? lo + i : p.nstages;
        if (i >= cnt && p.sched) {
            g = ahead >= 0 ? ahead : base + atomicAdd(p.sched, 1u);
            ahead = g < p.nstages ? base + atomicAdd(p.sched, 1u) : -1;
        }
        if (g >= p.nstages) {
            sidx[slot] = -1;
            mbar_arrive(&full[slot]);
            if (p.sched) { // the last block done with the pool resets it for the next launch
                // release: this block's grabs come before its count; acquire: the last block
                // resets only after every block's grabs (both fences, not the control dependency)
                __threadfence();
                if (atomicAdd(p.sched + 1, 1u) == gridDim.x - 1) {
                    __threadfence();
                    atomicExch(p.sched, 0u), atomicExch(p.sched + 1, 0u);
                }
            }
            return false;
        }
        sidx[slot] = g;
        const long row0 = g * QS_ROWS;
        const int nr = (int)min((long)QS_ROWS, p.rows - row0);
        uint8_t *st = qs_sm + slot * stb;
        const uint32_t w = (uint32_t)nr * p.C * 16, s = (uint32_t)nr * p.ng * 2;
        mbar_expect(&full[slot], w + 2 * s);
        bulk_copy(st, p.a.data + row0 * p.a.row_stride, w, &full[slot], pol);
        bulk_copy(st + wb, p.a.scales + row0 * p.a.sb_row_stride, s, &full[slot], pol);
        bulk_copy(st + wb + sb, p.a.biases + row0 * p.a.sb_row_stride, s, &full[slot], pol);
        return true;
    };
    // the weights are constant: the first stages stream while the previous kernel finishes
    bool more = true;
    if (producer)
        for (long i = 0; i < nst && more; i++) more = issue(i);
    const qx_src in = {p.x, p.cols, p.norm_w, nullptr, nullptr, 0, p.eps};
    qx_w nw;
    qx_prefetch(in, nw);
    pdl_wait();
    TRACE_WAIT();
    const qx_smem q = qx_layout(qs_sm + nst * stb, p.cols >> 5);
    qx_build<BITS>(in, nw, q, red);
    if (warp == QS_CWARPS) {
        if (producer)
            for (long i = nst; more; i++) {
                mbar_wait(&empty[i % nst], (uint32_t)((i / nst - 1) & 1));
                more = issue(i);
            }
        return;
    }
    const int nit = (p.C + QG_CHUNKS - 1) / QG_CHUNKS;
    for (long i = 0;; i++) {
        const int slot = (int)(i % nst);
        mbar_wait(&full[slot], (uint32_t)((i / nst) & 1));
        const long stage = sidx[slot];
        if (stage < 0) break;
        const long row0 = stage * QS_ROWS;
        const int nr = (int)min((long)QS_ROWS, p.rows - row0), r = QG_R * warp;
        const uint8_t *st = qs_sm + slot * stb;
        float acc[QG_R] = {0.f, 0.f};
        if (r < nr) {
            for (int it = 0; it < nit; it++) {
                qstage S;
#pragma unroll
                for (int j = 0; j < QG_R; j++) {
                    const int rr = r + j < nr ? r + j : r; // a missing second row: discarded
#pragma unroll
                    for (int u = 0; u < QG_U; u++) {
                        const int c = it * QG_CHUNKS + u * 32 + lane, cc = c < p.C ? c : 0;
                        const size_t g = ((size_t)rr * p.ng + (cc >> p.gshift)) * 2;
                        S.w[j][u] =
                            *reinterpret_cast<const uint4 *>(st + ((size_t)rr * p.C + cc) * 16);
                        S.s[j][u] = *reinterpret_cast<const uint16_t *>(st + wb + g);
                        S.b[j][u] = *reinterpret_cast<const uint16_t *>(st + wb + sb + g);
                    }
                }
                qdot<BITS>(S, q, it, p.C, acc);
            }
        }
        __syncwarp(); // every lane has read the slot
        if (lane == 0) mbar_arrive(&empty[slot]);
        if (r >= nr) continue;
        warp_sum_rows(acc);
        if (lane == 0) {
            p.out[row0 + r] = acc[0];
            if (r + 1 < nr) p.out[row0 + r + 1] = acc[1];
        }
    }
#else
    (void)p;
#endif
}

static bool g_qs_on;
static int g_qs_sms = 132;
static size_t g_qs_smem;

void qstream_configure(int cc_major, int sm_count, size_t smem_optin, bool off) {
    g_qs_on = cc_major >= 9 && decode_kernels_sm90() && !off;
    g_qs_sms = sm_count;
    g_qs_smem = smem_optin;
}

// Stages that fit beside the int8 activation with two blocks per SM (0: too few to stream).
static int qs_stages(const struct gemv_params *p, const struct dmat *a) {
    const int C = p->cols * a->bits / 128, ng = p->cols / a->group;
    const size_t per_block = g_qs_smem / QG_BLOCKS_PER_SM, qx = qx_bytes(p->cols / 32) + 1024;
    if (per_block <= qx) return 0;
    const size_t n = (per_block - qx) / qs_stage_bytes(C, ng);
    return n < 3 ? 0 : n > QS_MAXST ? QS_MAXST : (int)n;
}

// One EPI_STORE matrix of at least QS_MIN_ROWS dense, 16-byte aligned rows whose format the int8
// GEMV takes (the lm_head), on sm_90+.
#define QS_MIN_ROWS 32768
bool qstream_eligible(const struct gemv_params *p) {
    if (!g_qs_on || p->nseg != 1 || p->gn_w || p->topk_K > 0 || !qgemv_eligible(p)) return false;
    const struct gemv_seg *g = &p->seg[0];
    const struct dmat *a = &g->a;
    if (g->epi != EPI_STORE || g->idx || g->mat != 0 || g->rows < QS_MIN_ROWS || a->rows < g->rows)
        return false;
    const int C = p->cols * a->bits / 128, ng = p->cols / a->group;
    return a->row_stride == (size_t)C * 16 && a->sb_row_stride == (size_t)ng * 2 && ng % 8 == 0 &&
           (uintptr_t)a->data % 16 == 0 && (uintptr_t)a->scales % 16 == 0 &&
           (uintptr_t)a->biases % 16 == 0 && qs_stages(p, a) > 0;
}

int qstream_launch(const struct gemv_params *p, cudaStream_t s, struct wren_err *e) {
    const struct gemv_seg *g = &p->seg[0];
    struct qs_params q;
    memset(&q, 0, sizeof q);
    q.a = g->a, q.out = g->out, q.x = p->x, q.norm_w = p->norm_w;
    q.cols = p->cols, q.rows = g->rows, q.eps = p->eps;
    const int bits = g->a.bits;
    q.C = p->cols * bits / 128, q.ng = p->cols / g->a.group;
    q.gshift = log2i(g->a.group / (128 / bits));
    q.nst = qs_stages(p, &g->a);
    q.nstages = ((long)q.rows + QS_ROWS - 1) / QS_ROWS;
    q.sched = p->sched;
    const size_t smem = (size_t)q.nst * qs_stage_bytes(q.C, q.ng) + qx_bytes(p->cols / 32);
    void (*k)(const struct qs_params) = bits == 4 ? qstream_kernel<4> : qstream_kernel<8>;
    static size_t attr[2];
    if (smem > attr[bits == 4 ? 0 : 1]) {
        CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr[bits == 4 ? 0 : 1] = smem;
    }
    long blocks = (long)QG_BLOCKS_PER_SM * g_qs_sms;
    if (blocks > q.nstages) blocks = q.nstages;
    q.nstat = q.sched ? q.nstages * 3 / 4 / blocks : 0;
    // the pool only after the wait: a block's first ring fill, issued before it, is all static (a
    // launch with the pool right behind another, under PDL, would otherwise race with its reset)
    if (q.nstat < q.nst) q.sched = NULL, q.nstat = 0;
    CUDA_CHECK(pdl_launch(k, dim3((unsigned)blocks), dim3(QG_THREADS), smem, s, decode_pdl(), q));
    return 0;
}
