// Batch-1 GEMV for 4-bit (in the device layout, common.cuh) and 8-bit MLX weights with the
// activation quantized to two int8 planes per block of 32 values and the dot products done by
// dp4a: a 16-byte weight chunk costs ~30 integer instructions instead of ~100 float ones, so the
// kernel streams weights at memory speed instead of being instruction-bound. With d = max|x| / 127
// per block:
//   x ~= d * (x1 + x2 / 254),  x1 = round(x / d),  x2 = round(254 (x / d - x1))   (|x1|, |x2| <=
//   127)
// which keeps x to ~1/64500 of the block's max (finer than bf16), and the affine term uses exact
// sums of the unquantized activation:
//   sum_i (s q_i + b) x_i ~= s * d * (sum_i q_i x1_i + sum_i q_i x2_i / 254) + b * sum_i x_i
//
// Work: a warp computes QG_R rows at once; a step covers QG_U chunks per lane of those rows (64
// chunks of 16 bytes per row); the steps of a warp are pipelined two deep in registers, and the
// first step's weights are requested before the programmatic-launch wait, so they stream while the
// previous kernel finishes. The block's prologue builds the int8 activation in shared memory.
// Two users: the segment GEMV (gemv_params: several matrices reading one x, epilogues, MoE
// routing in the expert launch) and the MoE down projection (one long dot product per output row
// over the K routed experts and the shared expert).
#include "backend/cuda/gemv_dev.cuh"
#include "backend/cuda/qgemv_dev.cuh"
#include "backend/cuda/mma.cuh"

static int g_q_sms = 132;
static bool g_no_split = false;

void qgemv_configure(int sm_count, bool no_split) {
    g_q_sms = sm_count;
    g_no_split = no_split;
}

// The pipelined step loop of one warp: steps (row set j, iteration it) for row sets gw, gw + W,
// ...; load(stage, rs, it) fetches a step (the first npre steps are already in A, B). A finished
// row set's totals are parked on one lane (lane j keeps the j-th), and finish(rs, a, b) runs for up
// to 32 of them at once, so the epilogues' own memory round trips (conv state, routing weight)
// overlap instead of queueing behind each row set.
template <int BITS, class Load, class Finish>
static __device__ __forceinline__ void qrun(int nsteps, int nit, int C, int gw, int W,
                                            const qx_smem &q, qstage &A, qstage &B, int npre,
                                            Load load, Finish finish) {
    if (nsteps <= 0) return;
    const int lane = threadIdx.x & 31;
    int npend = 0, p_rs = 0;
    float p_a = 0.f, p_b = 0.f;
    float acc[QG_R];
    auto done = [&](int rs) {
        warp_sum_rows(acc);
        if (lane == npend) p_rs = rs, p_a = acc[0], p_b = acc[1];
        if (++npend == 32) {
            finish(p_rs, p_a, p_b);
            npend = 0;
        }
#pragma unroll
        for (int i = 0; i < QG_R; i++) acc[i] = 0.f;
    };
    int rsa = gw, ita = 0;
    if (npre < 1) load(A, rsa, ita);
#pragma unroll
    for (int i = 0; i < QG_R; i++) acc[i] = 0.f;
    for (int s = 0; s < nsteps; s += 2) {
        int rsb = rsa, itb = ita + 1;
        if (itb == nit) itb = 0, rsb += W;
        if (s + 1 < nsteps && (s > 0 || npre < 2)) load(B, rsb, itb);
        qdot<BITS>(A, q, ita, C, acc);
        if (ita == nit - 1) done(rsa);
        if (s + 1 >= nsteps) break;
        rsa = rsb, ita = itb + 1;
        if (ita == nit) ita = 0, rsa += W;
        if (s + 2 < nsteps) load(A, rsa, ita);
        qdot<BITS>(B, q, itb, C, acc);
        if (itb == nit - 1) done(rsb);
    }
    if (lane < npend) finish(p_rs, p_a, p_b);
}

// Byte offset of row r of matrix mat in a stack, in 32 bits: the eligibility checks keep every
// stack under 4 GiB (the 64-bit products cost a chain of multiply-adds per row and step).
static __device__ __forceinline__ unsigned qoff(int mat, size_t mat_stride, int r,
                                                size_t row_stride) {
    return (unsigned)mat * (unsigned)mat_stride + (unsigned)r * (unsigned)row_stride;
}
static bool stack_fits32(const struct dmat *m) {
    return (size_t)m->n * m->mat_stride <= UINT32_MAX &&
           (size_t)m->n * m->sb_mat_stride <= UINT32_MAX;
}

// ---- segment GEMV ----------------------------------------------------------------------------

// Row set rs of the launch: segment (seg[k].rs0 = its first row set) and its first row.
static __device__ __forceinline__ int seg_of_rs(const struct gemv_params &p, int rs) {
    int k = 0;
    while (k + 1 < p.nseg && rs >= p.seg[k + 1].rs0) k++;
    return k;
}

// Split steps (SPLIT): a launch of two steps per row set (an input of 4,096 values at 4 bits, 2,048
// at 8; the router) small enough for one row set per warp pair in at most one block per SM.
// Warps 2j and 2j + 1 take the two steps of row set j of the block; the second hands its step's
// terms (qterm) to the first through shared memory and named barrier 1 + j (0 is __syncthreads),
// and the first adds them after its own in the order qrun would (the same bits). So a warp's chain
// after the prologue is one step instead of two (router 5.4 -> 3.5 us per launch, decode +4%).
// Measured and not kept: the same for out_proj and o_proj (256 blocks; the launch before them,
// DeltaNet step or attention combine, ran longer by about what they saved) and for the MoE down
// (its 256 blocks kept the next in_proj from starting early): RESULTS.md, twenty-second session.
#define QS_PAIRS (QG_WARPS / 2)
#define QS_TERMS (int)(sizeof(qterms) / sizeof(float))
#define QS_IT    2 // input units per thread: two steps are at most 4,096 values

static bool split_fits(int row_sets) {
    return row_sets <= QS_PAIRS * g_q_sms;
}

// The pairs' exchange: QS_TERMS x 32 floats per pair after the int8 activation (dynamic shared
// memory: split_smem bytes in all).
static __host__ __device__ __forceinline__ size_t split_smem(int cols) {
    return qx_bytes(cols / 32) + (size_t)QS_PAIRS * QS_TERMS * 32 * sizeof(float);
}
static __device__ __forceinline__ float (*split_xch(uint8_t *smem, int cols, int warp))[32] {
    return reinterpret_cast<float(*)[32]>(smem + qx_bytes(cols / 32)) + (warp >> 1) * QS_TERMS;
}

static __device__ __forceinline__ void bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;" : : "r"(id), "r"(n) : "memory");
}
static __device__ __forceinline__ void bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;" : : "r"(id), "r"(n) : "memory");
}

template <int BITS, bool SPLIT>
__global__ void __launch_bounds__(QG_THREADS, QG_BLOCKS_PER_SM)
    qgemv_kernel(const __grid_constant__ struct gemv_params p) {
    extern __shared__ __align__(16) uint8_t qsm[];
    __shared__ float red[32];
    __shared__ struct route_smem route;
    TRACE_BEGIN();
    pdl_trigger();
    const qx_src in = {p.x, p.cols, p.norm_w, p.gn_w, p.gn_z, p.gn_dv, p.eps};
    if (p.qx_out && blockIdx.x == gridDim.x - 1) { // the extra block: export the int8 activation
        qx_w nw;
        qx_prefetch(in, nw);
        pdl_wait();
        TRACE_WAIT();
        const qx_smem q = qx_layout(qsm, p.cols >> 5);
        if (p.qx_out_bits == 4)
            qx_build<4>(in, nw, q, red);
        else
            qx_build<8>(in, nw, q, red);
        const int n = (int)(qx_bytes(p.cols >> 5) / 16);
        for (int i = threadIdx.x; i < n; i += QG_THREADS)
            reinterpret_cast<uint4 *>(p.qx_out)[i] = reinterpret_cast<const uint4 *>(qsm)[i];
        return;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nblk = gridDim.x - (p.qx_out ? 1 : 0);
    // SPLIT: gw numbers warp pairs, part is the step a warp takes
    const int part = SPLIT ? warp & 1 : 0;
    const int gw = SPLIT ? blockIdx.x * QS_PAIRS + (warp >> 1) : blockIdx.x * QG_WARPS + warp;
    const int W = nblk * (SPLIT ? QS_PAIRS : QG_WARPS);
    const int C = p.cols * BITS / 128, nit = p.q_nit, RS = p.q_rs;
    const route_smem *rt = !SPLIT && p.topk_K > 0 ? &route : nullptr;
    const int nsteps = gw < RS ? (SPLIT ? 1 : ((RS - 1 - gw) / W + 1) * nit) : 0;
    auto load = [&](qstage &S, int rs, int it) {
        const int k = seg_of_rs(p, rs);
        const struct gemv_seg &sg = p.seg[k];
        const int local = rs - sg.rs0;
        const bool pair = sg.epi == EPI_SWIGLU;
        const int mat = seg_mat(sg, rt);
        const int r0 = pair ? local : 2 * local;
#pragma unroll
        for (int i = 0; i < QG_R; i++) {
            const struct dmat &m = pair && i == 1 ? sg.b : sg.a;
            int r = pair ? r0 : r0 + i;
            if (r >= sg.rows) r = r0; // discarded
            const uint8_t *rw = m.data + qoff(mat, m.mat_stride, r, m.row_stride);
            const unsigned so = qoff(mat, m.sb_mat_stride, r, m.sb_row_stride);
            const uint8_t *sc = m.scales + so, *bi = m.biases + so;
#pragma unroll
            for (int u = 0; u < QG_U; u++) {
                const int c = it * QG_CHUNKS + u * 32 + lane;
                const unsigned g = (unsigned)(c >> p.q_gshift) * 2;
                qload(S, i, u, rw + (unsigned)c * 16, sc + g, bi + g, c < C);
            }
        }
    };
    // residual rows (EPI_ADD) this lane will finish first (lane j parks the warp's j-th row set):
    // read right after the wait, so that epilogue is a store, not a round trip
    const int rs_pre = gw + lane * W;
    float pre[2] = {0.f, 0.f};
    auto read_pre = [&]() {
        if (rs_pre >= RS) return;
        const struct gemv_seg &sg = p.seg[seg_of_rs(p, rs_pre)];
        const int r = 2 * (rs_pre - sg.rs0);
        if (sg.epi == EPI_ADD) {
            pre[0] = __ldcg(sg.out + r);
            if (r + 1 < sg.rows) pre[1] = __ldcg(sg.out + r + 1);
        }
    };
    auto finish = [&](int rs, float a, float b) {
        TRACE_MARK(2); // the last call: where the warp's epilogue begins
        const struct gemv_seg &sg = p.seg[seg_of_rs(p, rs)];
        if (sg.epi == EPI_SWIGLU) {
            gemv_epilogue(sg, rs - sg.rs0, a, b, seg_scale(sg, rt));
        } else if (sg.epi == EPI_ADD && rs == rs_pre) {
            const int r = 2 * (rs - sg.rs0);
            sg.out[r] = pre[0] + a;
            if (r + 1 < sg.rows) sg.out[r + 1] = pre[1] + b;
        } else {
            const int r = 2 * (rs - sg.rs0);
            gemv_epilogue(sg, r, a, 0.f, 1.f);
            if (r + 1 < sg.rows) gemv_epilogue(sg, r + 1, b, 0.f, 1.f);
        }
    };
    // before the wait: the norm weights and the first two steps' weights, unless their matrix
    // comes from the router
    qx_wn<SPLIT ? QS_IT : QX_IT> nw;
    if (!p.qx_in) qx_prefetch(in, nw);
    qstage A, B;
    int npre = 0;
    if constexpr (SPLIT) { // no routing, no qx_in (the launcher checks)
        if (nsteps > 0) load(A, gw, part);
        pdl_wait();
        TRACE_WAIT();
        if (part == 0 && lane == 0) read_pre(); // the pair has one row set (W >= RS)
        TRACE_MARK(0);
        const qx_smem q = qx_layout(qsm, p.cols >> 5);
        qx_build<BITS>(in, nw, q, red);
        TRACE_MARK(1);
        if (nsteps == 0) return;
        float(*x)[32] = split_xch(qsm, in.cols, warp);
        if (part == 1) {
            qterms T;
            qterm<BITS>(A, q, 1, C, T);
            const float *t = reinterpret_cast<const float *>(&T);
#pragma unroll
            for (int k = 0; k < QS_TERMS; k++) x[k][lane] = t[k];
            bar_arrive(1 + (warp >> 1), 64);
            return;
        }
        float acc[QG_R] = {0.f, 0.f};
        qdot<BITS>(A, q, 0, C, acc);
        qterms T;
        float *t = reinterpret_cast<float *>(&T);
        bar_sync(1 + (warp >> 1), 64);
#pragma unroll
        for (int k = 0; k < QS_TERMS; k++) t[k] = x[k][lane];
        qchain(T, 1, C, acc);
        warp_sum_rows(acc);
        if (lane == 0) finish(gw, acc[0], acc[1]);
        return;
    }
    const int rs1 = nit > 1 ? gw : gw + W, it1 = nit > 1 ? 1 : 0;
    if (nsteps > 0 && !p.seg[seg_of_rs(p, gw)].idx) {
        load(A, gw, 0), npre = 1;
        if (nsteps > 1 && !p.seg[seg_of_rs(p, rs1)].idx) load(B, rs1, it1), npre = 2;
    }
    pdl_wait();
    TRACE_WAIT();
    route_in ri = {0.f, 0.f};
    if (rt) ri = route_load(p); // first: the routing waits for it
    read_pre();
    const qx_smem q = qx_layout(qsm, p.cols >> 5);
    if (p.qx_in) { // the previous launch built it: copied during the routing
        const int n = (int)(qx_bytes(p.cols >> 5) / 16);
        for (int i = threadIdx.x; i < n; i += QG_THREADS)
            cp_async16(qsm + 16 * i, p.qx_in + 16 * i, true);
        cp_async_commit();
    }
    if (rt) route_block(p, ri, route);
    TRACE_MARK(0);
    // routed experts' first steps right after the routing, so they stream during the prologue
    if (npre < 1 && nsteps > 0) load(A, gw, 0), npre = 1;
    if (npre < 2 && nsteps > 1) load(B, rs1, it1), npre = 2;
    if (p.qx_in) {
        cp_async_wait<0>();
        __syncthreads();
    } else {
        qx_build<BITS>(in, nw, q, red);
    }
    TRACE_MARK(1);
    qrun<BITS>(nsteps, nit, C, gw, W, q, A, B, npre, load, finish);
}

// Whether the int8 path takes this launch: 4- or 8-bit matrices of one format and group size,
// an input of at most 8 * QG_THREADS * QX_IT values, a gated norm over heads of 32..256.
bool qgemv_eligible(const struct gemv_params *p) {
    const struct dmat *f = &p->seg[0].a;
    if ((f->type != WT_Q4 && f->type != WT_Q8) || !pow2(f->group) || f->group < 32) return false;
    if (p->cols % 32 || p->cols > 8 * QG_THREADS * QX_IT) return false;
    if (p->gn_w && (p->gn_dv % 32 || !pow2(p->gn_dv) || p->gn_dv > 256)) return false;
    for (int i = 0; i < p->nseg; i++) {
        const struct gemv_seg *g = &p->seg[i];
        if (g->a.type != f->type || g->a.bits != f->bits || g->a.group != f->group ||
            !stack_fits32(&g->a))
            return false;
        if (g->epi == EPI_SWIGLU && (g->b.type != f->type || g->b.bits != f->bits ||
                                     g->b.group != f->group || !stack_fits32(&g->b)))
            return false;
    }
    return true;
}

size_t gemv_qx_bytes(int cols) {
    return qx_bytes(cols / 32);
}

void gemv_share_qx(struct gemv_params *producer, struct gemv_params *consumer, uint8_t *buf) {
    producer->qx_out = NULL, consumer->qx_in = NULL;
    if (decode_f32_gemv() || !qgemv_eligible(producer) || !qgemv_eligible(consumer) ||
        qstream_eligible(producer) || qstream_eligible(consumer))
        return;
    if (producer->x != consumer->x || producer->cols != consumer->cols ||
        producer->norm_w != consumer->norm_w || producer->eps != consumer->eps || producer->gn_w ||
        consumer->gn_w)
        return;
    producer->qx_out = buf;
    producer->qx_out_bits = consumer->seg[0].a.bits;
    consumer->qx_in = buf;
}

int qgemv_launch(struct gemv_params *p, cudaStream_t s, struct wren_err *e) {
    const int bits = p->seg[0].a.bits;
    int rs = 0;
    bool routed = false;
    for (int i = 0; i < p->nseg; i++) {
        struct gemv_seg *g = &p->seg[i];
        g->rs0 = rs;
        rs += g->epi == EPI_SWIGLU ? g->rows : (g->rows + QG_R - 1) / QG_R;
        routed = routed || g->idx;
    }
    p->q_rs = rs;
    p->q_nit = (p->cols * bits / 128 + QG_CHUNKS - 1) / QG_CHUNKS;
    p->q_gshift = log2i(p->seg[0].a.group / (128 / bits));
    const bool split =
        !g_no_split && p->q_nit == 2 && !routed && p->topk_K == 0 && !p->qx_in && split_fits(rs);
    int blocks;
    if (split) {
        blocks = (rs + QS_PAIRS - 1) / QS_PAIRS;
    } else {
        blocks = (rs + QG_WARPS - 1) / QG_WARPS;
        if (blocks > QG_BLOCKS_PER_SM * g_q_sms) blocks = QG_BLOCKS_PER_SM * g_q_sms;
    }
    if (p->qx_out) blocks++; // the exporting block
    const size_t smem = split ? split_smem(p->cols) : qx_bytes(p->cols / 32);
    void (*k)(const struct gemv_params) =
        bits == 4 ? (split ? qgemv_kernel<4, true> : qgemv_kernel<4, false>)
                  : (split ? qgemv_kernel<8, true> : qgemv_kernel<8, false>);
    CUDA_CHECK(pdl_launch(k, dim3(blocks), dim3(QG_THREADS), smem, s, decode_pdl(), *p));
    return 0;
}

// ---- MoE down projection ---------------------------------------------------------------------

// A racy but well-defined read of a value another grid may be writing (for speculation only).
static __device__ __forceinline__ int ld_relaxed(const int *p) {
    int v;
    asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

template <int BITS>
__global__ void __launch_bounds__(QG_THREADS, QG_BLOCKS_PER_SM)
    qdown_kernel(const __grid_constant__ struct moe_down_params p) {
    extern __shared__ __align__(16) uint8_t qsm[];
    __shared__ float red[32];
    __shared__ int ids[64], sids[64];
    TRACE_BEGIN();
    pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int gw = blockIdx.x * QG_WARPS + warp, W = gridDim.x * QG_WARPS;
    const int Cr = p.inter * BITS / 128, Ck = p.K * Cr, C = Ck + p.sh_inter * BITS / 128;
    const int nit = p.q_nit, RS = (p.hidden + QG_R - 1) / QG_R;
    const int nsteps = gw < RS ? ((RS - 1 - gw) / W + 1) * nit : 0;
    auto load = [&](qstage &S, int rs, int it, const int *eid) {
        const int r0 = rs * QG_R;
#pragma unroll
        for (int u = 0; u < QG_U; u++) {
            const int c = it * QG_CHUNKS + u * 32 + lane;
            const bool routed = c < Ck;
            const int k = routed ? c >> p.q_cshift : 0, cl = routed ? c - k * Cr : c - Ck;
            const struct dmat &m = routed ? p.down : p.sh_down;
            const int mat = routed ? eid[k] : 0;
            const unsigned g = (unsigned)(cl >> p.q_gshift) * 2;
#pragma unroll
            for (int i = 0; i < QG_R; i++) {
                const int r = r0 + i < p.hidden ? r0 + i : r0;
                const unsigned so = qoff(mat, m.sb_mat_stride, r, m.sb_row_stride) + g;
                qload(S, i, u,
                      m.data + qoff(mat, m.mat_stride, r, m.row_stride) + (unsigned)cl * 16,
                      m.scales + so, m.biases + so, c < C);
            }
        }
    };
    // the residual rows this lane finishes first, read right after the wait (as in qgemv_kernel)
    const int rs_pre = gw + lane * W;
    float pre[2] = {0.f, 0.f};
    auto finish = [&](int rs, float a, float b) {
        TRACE_MARK(2); // the last call: where the warp's epilogue begins
        const int r = rs * QG_R;
        const bool have = rs == rs_pre;
        p.out[r] = (have ? pre[0] : p.out[r]) + a;
        if (r + 1 < p.hidden) p.out[r + 1] = (have ? pre[1] : p.out[r + 1]) + b;
    };
    // Speculation: the expert launch writes the ids right after its routing, long before its last
    // blocks leave room for this launch's blocks, so the ids read now are almost always this
    // token's. The first two steps' weights are requested with them before the wait (as for
    // constant matrices) and kept only if the ids read after the wait are the same. An id is
    // clamped into the stack, so a stale or uninitialised one only costs a wasted load.
    for (int i = threadIdx.x; i < p.K; i += blockDim.x) {
        const int v = ld_relaxed(p.ids + i);
        sids[i] = (unsigned)v < (unsigned)p.down.n ? v : 0;
    }
    __syncthreads();
    qstage A, B;
    int npre = 0;
    const int rs1 = nit > 1 ? gw : gw + W, it1 = nit > 1 ? 1 : 0;
    if (nsteps > 0) load(A, gw, 0, sids), npre = 1;
    if (nsteps > 1) load(B, rs1, it1, sids), npre = 2;
    // A third step of at most 32 chunks per row (the 35B model's: 16 of 144, the shared expert's
    // part) is requested now too, into a one-chunk stage: qrun would ask for it only after the
    // first step's dot products, one more DRAM round trip on every warp's chain.
    const bool third = nsteps == 3 && nit == 3 && C <= 2 * QG_CHUNKS + 32;
    uint4 w3[QG_R];
    uint16_t s3[QG_R], b3[QG_R];
    if (third) {
        qstage T;
        load(T, gw, 2, sids); // only its first chunk per row is in range: the rest is folded away
#pragma unroll
        for (int i = 0; i < QG_R; i++) w3[i] = T.w[i][0], s3[i] = T.s[i][0], b3[i] = T.b[i][0];
    }
    pdl_wait();
    TRACE_WAIT();
    for (int i = threadIdx.x; i < p.K; i += blockDim.x) ids[i] = __ldcg(p.ids + i);
    if (rs_pre < RS) {
        pre[0] = __ldcg(p.out + rs_pre * QG_R);
        if (rs_pre * QG_R + 1 < p.hidden) pre[1] = __ldcg(p.out + rs_pre * QG_R + 1);
    }
    const qx_src in = {p.act, p.K * p.inter + p.sh_inter, nullptr, nullptr, nullptr, 0, 0.f};
    const qx_smem q = qx_layout(qsm, in.cols >> 5);
    qx_w nw;
    qx_build<BITS>(in, nw, q, red); // its barrier also publishes ids
    TRACE_MARK(1);
    bool same = true; // the same in every thread: both arrays are in shared memory
    for (int i = 0; i < p.K; i++) same = same && ids[i] == sids[i];
    if (!same) npre = 0; // qrun loads the first steps again, with the real ids
    qrun<BITS>(
        nsteps, nit, C, gw, W, q, A, B, npre,
        [&](qstage &S, int rs, int it) {
            if (third && same && it == 2) {
#pragma unroll
                for (int i = 0; i < QG_R; i++)
                    S.w[i][0] = w3[i], S.s[i][0] = s3[i], S.b[i][0] = b3[i], S.w[i][1] = uint4{},
                    S.s[i][1] = S.b[i][1] = 0;
                return;
            }
            load(S, rs, it, ids);
        },
        finish);
}

bool qdown_eligible(const struct moe_down_params *p) {
    const struct dmat *d = &p->down;
    if (p->K <= 0 || p->K > 64 || (d->type != WT_Q4 && d->type != WT_Q8) || !stack_fits32(d) ||
        (p->sh_inter > 0 && !stack_fits32(&p->sh_down)))
        return false;
    if (!pow2(d->group) || d->group < 32 || p->inter % 32 || !pow2(p->inter * d->bits / 128))
        return false;
    if (p->sh_inter > 0 && (p->sh_inter % 32 || p->sh_down.type != d->type ||
                            p->sh_down.bits != d->bits || p->sh_down.group != d->group))
        return false;
    return p->K * p->inter + p->sh_inter <= 8 * QG_THREADS * QX_IT;
}

int qdown_launch(const struct moe_down_params *pp, cudaStream_t s, struct wren_err *e) {
    struct moe_down_params q = *pp, *p = &q;
    const int bits = p->down.bits, epc = 128 / bits;
    p->q_cshift = log2i(p->inter / epc);
    p->q_gshift = log2i(p->down.group / epc);
    p->q_nit = ((p->K * p->inter + p->sh_inter) / epc + QG_CHUNKS - 1) / QG_CHUNKS;
    const int rs = (p->hidden + QG_R - 1) / QG_R;
    int blocks = (rs + QG_WARPS - 1) / QG_WARPS;
    if (blocks > QG_BLOCKS_PER_SM * g_q_sms) blocks = QG_BLOCKS_PER_SM * g_q_sms;
    const size_t smem = qx_bytes((p->K * p->inter + p->sh_inter) / 32);
    void (*k)(const struct moe_down_params) = bits == 4 ? qdown_kernel<4> : qdown_kernel<8>;
    CUDA_CHECK(pdl_launch(k, dim3(blocks), dim3(QG_THREADS), smem, s, decode_pdl(), *p));
    return 0;
}
