// Device pieces shared by the decode GEMV kernels (decode_gemv.cu and decode_moe.cu: f32
// activations, any format; decode_qgemv.cu: int8 activations with dp4a for 4/8-bit weights): block
// reduction, the f32 dequantized dot products, the output epilogues and the MoE routing.
#pragma once
#include "backend/cuda/decode.cuh"

// Block-wide sum of one float (all threads get it). red: >= 32 floats of shared memory.
static __device__ __forceinline__ float block_sum(float v, float *red) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (l == 0) red[w] = v;
    __syncthreads();
    v = l < nw ? red[l] : 0.f;
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---- f32-activation GEMV pieces (decode_gemv.cu segments, decode_moe.cu down projections) -------

static __device__ __forceinline__ uint4 ldw(const uint8_t *p) {
    return __ldg(reinterpret_cast<const uint4 *>(p));
}

// Row start, scale row and bias row of row `row` of matrix `mat` of a stack (no scales: bf16).
static __device__ __forceinline__ void row_ptrs(const struct dmat &m, int mat, int row,
                                                const uint8_t *&rp, const uint16_t *&sp,
                                                const uint16_t *&bp) {
    rp = m.data + (size_t)mat * m.mat_stride + (size_t)row * m.row_stride;
    if (m.type != WT_BF16) {
        size_t o = (size_t)mat * m.sb_mat_stride + (size_t)row * m.sb_row_stride;
        sp = reinterpret_cast<const uint16_t *>(m.scales + o);
        bp = reinterpret_cast<const uint16_t *>(m.biases + o);
    } else {
        sp = bp = nullptr;
    }
}

// acc[i] += chunk c of row i (rows given by row_ptrs; they may come from different matrices of the
// same format) dotted with xs, the chunk's activations in padded shared memory.
template <int BITS, int R>
static __device__ __forceinline__ void
chunk_dot(const uint8_t *const (&rp)[R], const uint16_t *const (&sp)[R],
          const uint16_t *const (&bp)[R], int group, int c, const float *xs, float (&acc)[R]) {
    constexpr int EPC = wfmt<BITS>::EPC;
    uint4 w[R];
    float s[R], b[R];
#pragma unroll
    for (int i = 0; i < R; i++) w[i] = ldw(rp[i] + (size_t)c * 16);
    if constexpr (BITS != 16) {
        int g = c * EPC / group;
#pragma unroll
        for (int i = 0; i < R; i++) {
            s[i] = bf16_bits_to_f32(__ldg(sp[i] + g));
            b[i] = bf16_bits_to_f32(__ldg(bp[i] + g));
        }
    } else {
#pragma unroll
        for (int i = 0; i < R; i++) s[i] = b[i] = 0.f;
    }
    dot_chunk<BITS, R>(w, s, b, xs, acc);
}

// R row dot products over chunks t, t + TPR, ... < C (thread t of a group of TPR sharing the rows).
template <int BITS, int R, int TPR>
static __device__ __forceinline__ void rows_dot(const uint8_t *const (&rp)[R],
                                                const uint16_t *const (&sp)[R],
                                                const uint16_t *const (&bp)[R], int group,
                                                const float *xs, int C, int t, float (&acc)[R]) {
#pragma unroll 2
    for (int c = t; c < C; c += TPR)
        chunk_dot<BITS, R>(rp, sp, bp, group, c, xs + xpad(c * wfmt<BITS>::EPC), acc);
}

// Sums acc over the TPR threads of a row group; every thread of the group gets the totals.
template <int R, int TPR>
static __device__ __forceinline__ void group_reduce(float (&acc)[R], float *red) {
    constexpr int W = TPR < 32 ? TPR : 32;
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int o = W / 2; o; o >>= 1) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
    if constexpr (TPR > 32) {
        constexpr int NW = TPR / 32;
        int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        if (lane == 0)
#pragma unroll
            for (int i = 0; i < R; i++) red[warp * R + i] = acc[i];
        __syncthreads();
        int w0 = warp / NW * NW;
#pragma unroll
        for (int i = 0; i < R; i++) {
            float v = 0.f;
#pragma unroll
            for (int k = 0; k < NW; k++) v += red[(w0 + k) * R + i];
            acc[i] = v;
        }
        __syncthreads();
    }
}

// Stores output row r of a segment from its dot product y (y_up: the up row and sc: the scale
// (seg_scale), EPI_SWIGLU only).
static __device__ __forceinline__ void gemv_epilogue(const struct gemv_seg &sg, int r, float y,
                                                     float y_up, float sc) {
    switch (sg.epi) {
    case EPI_STORE:
        sg.out[r] = y;
        break;
    case EPI_ADD:
        sg.out[r] += y;
        break;
    case EPI_CONV: {
        const int K = sg.conv_k;
        const float *cw = sg.conv_w + (size_t)r * K;
        float *st = sg.conv_state + (size_t)r * (K - 1);
        float o = cw[K - 1] * y;
        for (int j = 0; j < K - 1; j++) o += cw[j] * st[j];
        for (int j = 0; j + 1 < K - 1; j++) st[j] = st[j + 1];
        if (K > 1) st[K - 2] = y;
        sg.out[r] = silu_f(o);
        break;
    }
    case EPI_SWIGLU: {
        sg.out[r] = sc * silu_f(y) * y_up;
        break;
    }
    }
}

// The routing of one token, computed by warp 0 of every block of the expert launch that reads it
// (instead of a finisher in the router launch: that cost a fence, a ticket and a serial tail on
// one block, and the expert launch then had to fetch the ids). Softmax over the E logits, top-K
// (ties: lower id first), optional renormalisation, the shared expert's sigmoid gate. Lane l holds
// the probabilities of experts l, l + 32, ... in registers (NPL of them); a probability's float
// bits order like the value (it is >= 0), so each round is two warp reductions (the max key, then
// the lowest id holding it) and a rescan of its NPL registers by the lane that owned it.
struct route_smem {
    int ids[64];
    float wts[65];
    // route_block256's scratch: per-warp maxima (logit, then key), candidate counts and
    // probability sums, then the candidates (key, id, probability)
    unsigned wmax[8];
    int cnt[8];
    float psum[8];
    unsigned ckey[32];
    int cid[32];
    float cp[32];
};

template <int NPL>
static __device__ void route_warp(const struct gemv_params &p, struct route_smem &rt) {
    const int E = p.topk_E, K = p.topk_K, lane = threadIdx.x & 31;
    float v[NPL];
    float mx = -INFINITY;
    const float shared_logit = p.has_shared_gate && lane == 0 ? __ldcg(p.logits + E) : 0.f;
#pragma unroll
    for (int j = 0; j < NPL; j++) {
        const int i = lane + 32 * j;
        v[j] = i < E ? __ldcg(p.logits + i) : -INFINITY;
        mx = fmaxf(mx, v[j]);
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < NPL; j++) {
        v[j] = lane + 32 * j < E ? __expf(v[j] - mx) : -1.f; // -1: absent
        sum += fmaxf(v[j], 0.f);
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv_sum = 1.f / sum;
    // this lane's best untaken entry: key = bits + 1 (0 = taken or absent); ascending j keeps the
    // lowest id among equals
    unsigned bk;
    int bj;
    auto rescan = [&]() {
        bk = 0, bj = 0;
#pragma unroll
        for (int j = 0; j < NPL; j++) {
            const unsigned k = v[j] >= 0.f ? __float_as_uint(v[j]) + 1u : 0u;
            if (k > bk) bk = k, bj = j;
        }
    };
    rescan();
    float wsum = 0.f, myw = 0.f;
    int myid = 0;
    for (int k = 0; k < K; k++) {
        const unsigned m = __reduce_max_sync(0xffffffffu, bk);
        const unsigned id =
            __reduce_min_sync(0xffffffffu, bk == m ? (unsigned)(lane + 32 * bj) : 0xffffffffu);
        const float w = __uint_as_float(m - 1u) * inv_sum;
        wsum += w;
        if (lane == k) myw = w, myid = (int)id;
        if ((int)(id & 31) == lane) {
#pragma unroll
            for (int j = 0; j < NPL; j++)
                if (j == (int)(id >> 5)) v[j] = -1.f; // taken
            rescan();
        }
    }
    if (lane < K) {
        rt.ids[lane] = myid;
        rt.wts[lane] = p.norm_topk ? myw / wsum : myw;
    }
    if (lane == 0) rt.wts[K] = p.has_shared_gate ? sigmoid_f(shared_logit) : 1.f;
}

// A float's bits as an unsigned key that orders like the value.
static __device__ __forceinline__ unsigned float_key(float f) {
    const unsigned b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}
static __device__ __forceinline__ float key_float(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? k & 0x7fffffffu : ~k);
}

// The logits route_block256 reads (thread t: expert t, and thread 0 the shared expert's gate):
// loaded by the caller as the first thing after its wait, so that this round trip, on the launch's
// critical path, is not queued behind the launch's other loads.
struct route_in {
    float lg, shared_logit;
};
static __device__ __forceinline__ bool route256_ok(const struct gemv_params &p) {
    return p.topk_E == 256 && p.topk_K <= 8 && blockDim.x == 256;
}
static __device__ __forceinline__ route_in route_load(const struct gemv_params &p) {
    route_in r = {0.f, 0.f};
    if (!route256_ok(p)) return r; // route_warp reads its own
    r.lg = __ldcg(p.logits + threadIdx.x);
    if (p.has_shared_gate && threadIdx.x == 0) r.shared_logit = __ldcg(p.logits + p.topk_E);
    return r;
}

// The same routing by all 256 threads for E = 256 experts and K <= 8 (this model family), in about
// half route_warp's time (it sits on the expert launch's critical path): thread t holds expert t.
// It ranks by the same key as route_warp (the probability's bits + 1, 0 for a NaN; then the lower
// id), so both choose the same experts. Each warp's largest logit is an expert whose key is that
// logit's probability, so the smallest of the 8 warps' largest logits, as a probability, is at
// most the K-th largest key (8 experts reach it): only experts at or above it are candidates
// (usually ~10), which warp 0 ranks. One exchange of the warps' largest logits gives both the
// maximum (for the probabilities) and that bound. Returns false (in every thread) when more than
// 32 experts reach the bound (mass ties); the caller then routes with route_warp.
static __device__ bool route_block256(const struct gemv_params &p, const route_in &in,
                                      struct route_smem &rt) {
    const int t = threadIdx.x, w = t >> 5, l = t & 31, K = p.topk_K;
    const float shared_logit = in.shared_logit, lg = in.lg;
    // the largest logit (NaN ignored, as fmaxf does in route_warp)
    const unsigned lk = lg == lg ? float_key(lg) : 0u;
    const unsigned wl = __reduce_max_sync(0xffffffffu, lk);
    if (l == 0) rt.wmax[w] = wl;
    __syncthreads();
    unsigned top = 0, low = 0xffffffffu;
#pragma unroll
    for (int i = 0; i < 8; i++) top = max(top, rt.wmax[i]), low = min(low, rt.wmax[i]);
    const float mx = key_float(top);
    const float pr = __expf(lg - mx);
    const unsigned key = pr >= 0.f ? __float_as_uint(pr) + 1u : 0u;
    const float bp = __expf(key_float(low) - mx);
    const unsigned bound = low && bp >= 0.f ? __float_as_uint(bp) + 1u : 0u;
    float ps = fmaxf(pr, 0.f);
#pragma unroll
    for (int o = 16; o; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
    const bool cand = key >= bound;
    const unsigned ball = __ballot_sync(0xffffffffu, cand);
    if (l == 0) rt.cnt[w] = __popc(ball), rt.psum[w] = ps;
    __syncthreads();
    int off = 0, n = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int c = rt.cnt[i];
        off += i < w ? c : 0;
        n += c;
    }
    if (n > 32) return false;
    if (cand) {
        const int i = off + __popc(ball & ((1u << l) - 1u));
        rt.ckey[i] = key, rt.cid[i] = t, rt.cp[i] = pr;
    }
    __syncthreads();
    if (w == 0) {
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) sum += rt.psum[i];
        const unsigned ck = l < n ? rt.ckey[l] : 0u;
        const int ci = l < n ? rt.cid[l] : 0x7fffffff;
        int rank = 0;
        for (int j = 0; j < n; j++) {
            const unsigned kj = __shfl_sync(0xffffffffu, ck, j);
            const int ij = __shfl_sync(0xffffffffu, ci, j);
            rank += kj > ck || (kj == ck && ij < ci);
        }
        const bool sel = l < n && rank < K;
        const float wv = sel ? rt.cp[l] * (1.f / sum) : 0.f;
        float wsum = wv;
#pragma unroll
        for (int o = 16; o; o >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, o);
        if (sel) rt.ids[rank] = ci, rt.wts[rank] = p.norm_topk ? wv / wsum : wv;
        if (l == 0) rt.wts[K] = p.has_shared_gate ? sigmoid_f(shared_logit) : 1.f;
    }
    return true;
}

// Every block routes and publishes the choice in shared memory; block 0 also writes it to p.ids /
// p.wts for the launches after this one.
static __device__ __forceinline__ void route_block(const struct gemv_params &p, const route_in &in,
                                                   struct route_smem &rt) {
    const bool done = route256_ok(p) && route_block256(p, in, rt);
    if (!done && threadIdx.x < 32) {
        if (p.topk_E <= 256)
            route_warp<8>(p, rt);
        else
            route_warp<ROUTE_MAX_EXPERTS / 32>(p, rt);
    }
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x <= p.topk_K) {
        if ((int)threadIdx.x < p.topk_K) p.ids[threadIdx.x] = rt.ids[threadIdx.x];
        p.wts[threadIdx.x] = rt.wts[threadIdx.x];
    }
}

// A segment's matrix (routed: from this block's routing or from device memory) and output scale.
static __device__ __forceinline__ int seg_mat(const struct gemv_seg &sg, const route_smem *rt) {
    if (!sg.idx) return sg.mat;
    return rt ? rt->ids[sg.slot] : __ldcg(sg.idx + sg.slot);
}
static __device__ __forceinline__ float seg_scale(const struct gemv_seg &sg, const route_smem *rt) {
    if (!sg.scale) return 1.f;
    return rt ? rt->wts[sg.slot] : __ldcg(sg.scale + sg.slot);
}
