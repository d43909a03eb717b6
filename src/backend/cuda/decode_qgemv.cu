// Batch-1 GEMV for MLX 4- and 8-bit weights with the activation quantized to two int8 planes
// per block of 32 values and the dot products done by dp4a: a 16-byte weight chunk costs ~30
// integer instructions instead of ~100 float ones, so the kernel streams weights at memory speed
// instead of being instruction-bound. With d = max|x| / 127 per block:
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

#define QG_THREADS       256
#define QG_WARPS         (QG_THREADS / 32)
#define QG_R             2 // rows per warp step (finish() takes two totals)
#define QG_U             2 // 16-byte chunks per lane per row per step
#define QG_CHUNKS        (QG_U * 32)
#define QG_BLOCKS_PER_SM 2 // blocks per SM (register budget: 128 per thread)

static int g_q_sms = 132;

void qgemv_set_sm_count(int sm_count) {
    g_q_sms = sm_count;
}

static __device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

static __device__ __forceinline__ uint32_t pack4(int a, int b, int c, int d) {
    return (uint32_t)(a & 0xff) | (uint32_t)(b & 0xff) << 8 | (uint32_t)(c & 0xff) << 16 |
           (uint32_t)(d & 0xff) << 24;
}

// The int8 activation in shared memory, per block of 32 values: for each plane (x1, x2) the lo/hi
// 16-byte halves in the byte order the format's dp4a pairs with the weight words, and meta =
// {d, sum, sum of the first 16, sum of the last 16} of the unquantized values. Each array is
// followed by 4 spare entries so lanes reading lo[b] and hi[b] together (8-bit) hit different
// banks.
struct qx_smem {
    uint4 *lo[2], *hi[2];
    float4 *meta;
};
static __host__ __device__ __forceinline__ size_t qx_bytes(int nb) {
    return (size_t)(4 * (nb + 4)) * sizeof(uint4) + (size_t)nb * sizeof(float4);
}
static __device__ __forceinline__ qx_smem qx_layout(void *smem, int nb) {
    qx_smem q;
    uint4 *p = reinterpret_cast<uint4 *>(smem);
    q.lo[0] = p, q.hi[0] = p + (nb + 4), q.lo[1] = p + 2 * (nb + 4), q.hi[1] = p + 3 * (nb + 4);
    q.meta = reinterpret_cast<float4 *>(p + 4 * (nb + 4));
    return q;
}

struct qx_src {
    const float *x;
    int cols;
    const float *norm_w; // RMSNorm weight (fused), or
    const float *gn_w;   // gated RMSNorm per head of gn_dv values: x * r_head * gn_w * silu(gn_z)
    const float *gn_z;
    int gn_dv;
    float eps;
};

// Units of 8 values: thread t handles units t + QG_THREADS * i (i < QX_IT), so the 4 units of a
// block of 32 sit on 4 consecutive lanes and the block's max and sums are two shuffles away. x and
// gn_z are read with __ldcg: they were written by the previous kernels.
#define QX_IT 4 // cols <= 8 * QG_THREADS * QX_IT

static __device__ __forceinline__ void ld8(float (&v)[8], const float *p, bool cg) {
    const float4 a = cg ? __ldcg(reinterpret_cast<const float4 *>(p))
                        : __ldg(reinterpret_cast<const float4 *>(p));
    const float4 b = cg ? __ldcg(reinterpret_cast<const float4 *>(p) + 1)
                        : __ldg(reinterpret_cast<const float4 *>(p) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// The norm weights of this thread's units: constant, so loaded before the programmatic-launch wait.
struct qx_w {
    float w[QX_IT][8];
};
static __device__ __forceinline__ void qx_prefetch(const qx_src &in, qx_w &nw) {
    const int nu = in.cols >> 3, t = threadIdx.x;
#pragma unroll
    for (int i = 0; i < QX_IT; i++) {
        const int u = t + i * QG_THREADS;
        if (u < nu && in.norm_w) ld8(nw.w[i], in.norm_w + 8 * u, false);
        if (u < nu && in.gn_w) ld8(nw.w[i], in.gn_w + (8 * u) % in.gn_dv, false);
    }
}

template <int BITS>
static __device__ void qx_build(const qx_src &in, const qx_w &nw, const qx_smem &q, float *red) {
    const int nu = in.cols >> 3, t = threadIdx.x;
    float v[QX_IT][8];
    float ss[QX_IT];
#pragma unroll
    for (int i = 0; i < QX_IT; i++) {
        const int u = t + i * QG_THREADS;
        ss[i] = 0.f;
        if (u < nu) {
            ld8(v[i], in.x + 8 * u, true);
#pragma unroll
            for (int j = 0; j < 8; j++) ss[i] += v[i][j] * v[i][j];
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) v[i][j] = 0.f;
        }
    }
    if (in.norm_w) {
        float tot = 0.f;
#pragma unroll
        for (int i = 0; i < QX_IT; i++) tot += ss[i];
        const float scale = rsqrtf(block_sum(tot, red) / (float)in.cols + in.eps);
#pragma unroll
        for (int i = 0; i < QX_IT; i++) {
            const int u = t + i * QG_THREADS;
            if (u >= nu) continue;
#pragma unroll
            for (int j = 0; j < 8; j++) v[i][j] *= scale * nw.w[i][j];
        }
    } else if (in.gn_w) {
        // a head is gn_dv / 8 consecutive lanes (a power of two <= 32, checked by the launcher)
#pragma unroll
        for (int i = 0; i < QX_IT; i++) {
            float hs = ss[i];
            for (int o = 1; o < in.gn_dv >> 3; o <<= 1) hs += __shfl_xor_sync(0xffffffffu, hs, o);
            const int u = t + i * QG_THREADS;
            if (u >= nu) continue;
            const float r = rsqrtf(hs / (float)in.gn_dv + in.eps);
            float z[8];
            ld8(z, in.gn_z + 8 * u, true);
#pragma unroll
            for (int j = 0; j < 8; j++) v[i][j] *= r * nw.w[i][j] * silu_f(z[j]);
        }
    }
#pragma unroll
    for (int i = 0; i < QX_IT; i++) {
        const int u = t + i * QG_THREADS; // nu is a multiple of 4: a quad is all in or all out
        float amax = 0.f, sum = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) amax = fmaxf(amax, fabsf(v[i][j])), sum += v[i][j];
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        const float half = sum + __shfl_xor_sync(0xffffffffu, sum, 1); // values 0-15 or 16-31
        const float other = __shfl_xor_sync(0xffffffffu, half, 2);
        if (u >= nu) continue;
        const float inv = amax > 0.f ? 127.f / amax : 0.f, d = amax / 127.f;
        int x[2][8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            x[0][j] = __float2int_rn(v[i][j] * inv);
            // |x2| <= 127 up to rounding; clamped so an int8 can never wrap
            const int x2 = __float2int_rn(fmaf(-d, (float)x[0][j], v[i][j]) * (254.f * inv));
            x[1][j] = max(-127, min(127, x2));
        }
        const int blk = u >> 2, k = u & 3;
#pragma unroll
        for (int pl = 0; pl < 2; pl++) {
            const int *y = x[pl];
            if constexpr (BITS == 4) {
                // weight word k holds values 8k..8k+7, even ones in the low nibbles of its bytes:
                // lo pairs with the low nibbles, hi with the high ones
                reinterpret_cast<uint32_t *>(q.lo[pl] + blk)[k] = pack4(y[0], y[2], y[4], y[6]);
                reinterpret_cast<uint32_t *>(q.hi[pl] + blk)[k] = pack4(y[1], y[3], y[5], y[7]);
            } else {
                // lo holds values 0-15 (units 0, 1), hi values 16-31 (units 2, 3), in order
                uint32_t *h = reinterpret_cast<uint32_t *>((k < 2 ? q.lo[pl] : q.hi[pl]) + blk);
                h[(k & 1) * 2] = pack4(y[0], y[1], y[2], y[3]);
                h[(k & 1) * 2 + 1] = pack4(y[4], y[5], y[6], y[7]);
            }
        }
        if (k == 0) q.meta[blk] = make_float4(d, half + other, half, other);
    }
    __syncthreads();
}

// The weights of one warp step: QG_U chunks of QG_R rows per lane with their scales and biases.
struct qstage {
    uint4 w[QG_R][QG_U];
    uint16_t s[QG_R][QG_U], b[QG_R][QG_U];
};

static __device__ __forceinline__ void qload(qstage &S, int i, int u, const uint8_t *w,
                                             const uint8_t *sc, const uint8_t *bi, bool ok) {
    if (ok) {
        S.w[i][u] = __ldg(reinterpret_cast<const uint4 *>(w));
        S.s[i][u] = __ldg(reinterpret_cast<const uint16_t *>(sc));
        S.b[i][u] = __ldg(reinterpret_cast<const uint16_t *>(bi));
    } else {
        S.w[i][u] = make_uint4(0, 0, 0, 0);
        S.s[i][u] = S.b[i][u] = 0;
    }
}

// acc[i] += the step's part of row i's dot product. Chunk c = it * QG_CHUNKS + 32 u + lane.
template <int BITS>
static __device__ __forceinline__ void qdot(const qstage &S, const qx_smem &q, int it, int C,
                                            float (&acc)[QG_R]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < QG_U; u++) {
        const int c = it * QG_CHUNKS + u * 32 + lane;
        if (c >= C) continue;
        uint4 xa[2], xb[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
        float d, xs;
        if constexpr (BITS == 4) {
#pragma unroll
            for (int pl = 0; pl < 2; pl++) xa[pl] = q.lo[pl][c], xb[pl] = q.hi[pl][c];
            float4 m = q.meta[c];
            d = m.x, xs = m.y;
        } else {
#pragma unroll
            for (int pl = 0; pl < 2; pl++) xa[pl] = (c & 1) ? q.hi[pl][c >> 1] : q.lo[pl][c >> 1];
            float4 m = q.meta[c >> 1];
            d = m.x, xs = (c & 1) ? m.w : m.z;
        }
#pragma unroll
        for (int i = 0; i < QG_R; i++) {
            const uint32_t *w = &S.w[i][u].x;
            int is[2] = {0, 0};
#pragma unroll
            for (int pl = 0; pl < 2; pl++) {
                const uint32_t *xl = &xa[pl].x, *xh = &xb[pl].x;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    if constexpr (BITS == 4) {
                        is[pl] = __dp4a((int)(w[k] & 0x0F0F0F0Fu), (int)xl[k], is[pl]);
                        is[pl] = __dp4a((int)((w[k] >> 4) & 0x0F0F0F0Fu), (int)xh[k], is[pl]);
                    } else {
                        is[pl] = dp4a_us(w[k], xl[k], is[pl]);
                    }
                }
            }
            const float dot = d * fmaf((float)is[1], 1.f / 254.f, (float)is[0]);
            acc[i] = fmaf(bf16_bits_to_f32(S.s[i][u]), dot,
                          fmaf(bf16_bits_to_f32(S.b[i][u]), xs, acc[i]));
        }
    }
}

static __device__ __forceinline__ void warp_sum_rows(float (&acc)[QG_R]) {
#pragma unroll
    for (int i = 0; i < QG_R; i++)
#pragma unroll
        for (int o = 16; o; o >>= 1) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
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

// ---- segment GEMV ----------------------------------------------------------------------------

// Row set rs of the launch: segment (seg[k].rs0 = its first row set) and its first row.
static __device__ __forceinline__ int seg_of_rs(const struct gemv_params &p, int rs) {
    int k = 0;
    while (k + 1 < p.nseg && rs >= p.seg[k + 1].rs0) k++;
    return k;
}

template <int BITS>
__global__ void __launch_bounds__(QG_THREADS, QG_BLOCKS_PER_SM)
    qgemv_kernel(const __grid_constant__ struct gemv_params p) {
    extern __shared__ __align__(16) uint8_t qsm[];
    __shared__ float red[32];
    __shared__ struct route_smem route;
    pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int gw = blockIdx.x * QG_WARPS + warp, W = gridDim.x * QG_WARPS;
    const int C = p.cols * BITS / 128, nit = p.q_nit, RS = p.q_rs;
    const route_smem *rt = p.topk_K > 0 ? &route : nullptr;
    const int nsteps = gw < RS ? ((RS - 1 - gw) / W + 1) * nit : 0;
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
            const uint8_t *rw = m.data + (size_t)mat * m.mat_stride + (size_t)r * m.row_stride;
            const size_t so = (size_t)mat * m.sb_mat_stride + (size_t)r * m.sb_row_stride;
#pragma unroll
            for (int u = 0; u < QG_U; u++) {
                const int c = it * QG_CHUNKS + u * 32 + lane;
                const size_t g = (size_t)(c >> p.q_gshift) * 2;
                qload(S, i, u, rw + (size_t)c * 16, m.scales + so + g, m.biases + so + g, c < C);
            }
        }
    };
    // residual rows (EPI_ADD) this lane will finish first (lane j parks the warp's j-th row set):
    // read right after the wait, so that epilogue is a store, not a round trip
    const int rs_pre = gw + lane * W;
    float pre[2] = {0.f, 0.f};
    auto finish = [&](int rs, float a, float b) {
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
    const qx_src in = {p.x, p.cols, p.norm_w, p.gn_w, p.gn_z, p.gn_dv, p.eps};
    qx_w nw;
    qx_prefetch(in, nw);
    qstage A, B;
    int npre = 0;
    const int rs1 = nit > 1 ? gw : gw + W, it1 = nit > 1 ? 1 : 0;
    if (nsteps > 0 && !p.seg[seg_of_rs(p, gw)].idx) {
        load(A, gw, 0), npre = 1;
        if (nsteps > 1 && !p.seg[seg_of_rs(p, rs1)].idx) load(B, rs1, it1), npre = 2;
    }
    pdl_wait();
    if (rs_pre < RS) {
        const struct gemv_seg &sg = p.seg[seg_of_rs(p, rs_pre)];
        const int r = 2 * (rs_pre - sg.rs0);
        if (sg.epi == EPI_ADD) {
            pre[0] = __ldcg(sg.out + r);
            if (r + 1 < sg.rows) pre[1] = __ldcg(sg.out + r + 1);
        }
    }
    if (rt) route_block(p, route);
    // routed experts' first steps right after the routing, so they stream during the prologue
    if (npre < 1 && nsteps > 0) load(A, gw, 0), npre = 1;
    if (npre < 2 && nsteps > 1) load(B, rs1, it1), npre = 2;
    const qx_smem q = qx_layout(qsm, p.cols >> 5);
    qx_build<BITS>(in, nw, q, red);
    qrun<BITS>(nsteps, nit, C, gw, W, q, A, B, npre, load, finish);
}

static bool pow2(int v) {
    return v > 0 && (v & (v - 1)) == 0;
}
static int log2i(int v) {
    int s = 0;
    while ((1 << s) < v) s++;
    return s;
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
        if (g->a.type != f->type || g->a.bits != f->bits || g->a.group != f->group) return false;
        if (g->epi == EPI_SWIGLU &&
            (g->b.type != f->type || g->b.bits != f->bits || g->b.group != f->group))
            return false;
    }
    return true;
}

int qgemv_launch(struct gemv_params *p, cudaStream_t s, struct wren_err *e) {
    const int bits = p->seg[0].a.bits;
    int rs = 0;
    for (int i = 0; i < p->nseg; i++) {
        struct gemv_seg *g = &p->seg[i];
        g->rs0 = rs;
        rs += g->epi == EPI_SWIGLU ? g->rows : (g->rows + QG_R - 1) / QG_R;
    }
    p->q_rs = rs;
    p->q_nit = (p->cols * bits / 128 + QG_CHUNKS - 1) / QG_CHUNKS;
    p->q_gshift = log2i(p->seg[0].a.group / (128 / bits));
    int blocks = (rs + QG_WARPS - 1) / QG_WARPS;
    if (blocks > QG_BLOCKS_PER_SM * g_q_sms) blocks = QG_BLOCKS_PER_SM * g_q_sms;
    const size_t smem = qx_bytes(p->cols / 32);
    void (*k)(const struct gemv_params) = bits == 4 ? qgemv_kernel<4> : qgemv_kernel<8>;
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
            const size_t g = (size_t)(cl >> p.q_gshift) * 2;
#pragma unroll
            for (int i = 0; i < QG_R; i++) {
                const int r = r0 + i < p.hidden ? r0 + i : r0;
                const size_t so = (size_t)mat * m.sb_mat_stride + (size_t)r * m.sb_row_stride + g;
                qload(S, i, u,
                      m.data + (size_t)mat * m.mat_stride + (size_t)r * m.row_stride +
                          (size_t)cl * 16,
                      m.scales + so, m.biases + so, c < C);
            }
        }
    };
    // the residual rows this lane finishes first, read right after the wait (as in qgemv_kernel)
    const int rs_pre = gw + lane * W;
    float pre[2] = {0.f, 0.f};
    auto finish = [&](int rs, float a, float b) {
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
    pdl_wait();
    for (int i = threadIdx.x; i < p.K; i += blockDim.x) ids[i] = __ldcg(p.ids + i);
    if (rs_pre < RS) {
        pre[0] = __ldcg(p.out + rs_pre * QG_R);
        if (rs_pre * QG_R + 1 < p.hidden) pre[1] = __ldcg(p.out + rs_pre * QG_R + 1);
    }
    const qx_src in = {p.act, p.K * p.inter + p.sh_inter, nullptr, nullptr, nullptr, 0, 0.f};
    const qx_smem q = qx_layout(qsm, in.cols >> 5);
    qx_w nw;
    qx_build<BITS>(in, nw, q, red); // its barrier also publishes ids
    bool same = true;               // the same in every thread: both arrays are in shared memory
    for (int i = 0; i < p.K; i++) same = same && ids[i] == sids[i];
    if (!same) npre = 0; // qrun loads the first steps again, with the real ids
    qrun<BITS>(
        nsteps, nit, C, gw, W, q, A, B, npre,
        [&](qstage &S, int rs, int it) { load(S, rs, it, ids); }, finish);
}

bool qdown_eligible(const struct moe_down_params *p) {
    const struct dmat *d = &p->down;
    if (p->K <= 0 || p->K > 64 || (d->type != WT_Q4 && d->type != WT_Q8)) return false;
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
