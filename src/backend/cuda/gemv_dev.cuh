// Device pieces shared by the decode GEMV kernels (decode_gemv.cu and decode_moe.cu: f32
// activations, any format; decode_qgemv.cu: int8 activations with dp4a for 4/8-bit weights): block
// reduction, the f32 dequantized dot products, the output epilogues and the MoE router finisher.
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

// Stores output row r of a segment from its dot product y (y_up: the up row, EPI_SWIGLU only).
static __device__ __forceinline__ void gemv_epilogue(const struct gemv_seg &sg, int r, float y,
                                                     float y_up) {
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
        const float sc = sg.scale ? __ldcg(sg.scale + sg.slot) : 1.f;
        sg.out[r] = sc * silu_f(y) * y_up;
        break;
    }
    }
}

// Router finisher (the whole block): softmax over E logits, top-K (ties: lower id first),
// optional renormalisation, the shared expert's sigmoid gate. The logits are read once, by all
// threads at the same time (one memory round trip), into shared memory.
static __device__ void topk_finish(const struct gemv_params &p) {
    __shared__ float prob[2048];
    __shared__ float red[32];
    const int E = p.topk_E, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nw = blockDim.x >> 5;
    float mx = -INFINITY;
    for (int i = tid; i < E; i += blockDim.x) {
        prob[i] = __ldcg(p.logits + i);
        mx = fmaxf(mx, prob[i]);
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = -INFINITY;
    for (int w = 0; w < nw; w++) mx = fmaxf(mx, red[w]);
    float sum = 0.f;
    for (int i = tid; i < E; i += blockDim.x) {
        const float v = __expf(prob[i] - mx);
        prob[i] = v;
        sum += v;
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    __syncthreads(); // everyone has read red[] (max) before it is reused
    if (lane == 0) red[warp] = sum;
    __syncthreads();
    if (warp) return;
    sum = 0.f;
    for (int w = 0; w < nw; w++) sum += red[w];
    float wsum = 0.f, myw = 0.f;
    for (int k = 0; k < p.topk_K; k++) {
        float bv = -2.f;
        int bi = 0x7fffffff;
        for (int i = lane; i < E; i += 32) {
            float v = prob[i];
            if (v > bv) bv = v, bi = i; // ascending i: the first max is the lowest id
        }
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        if (lane == k) myw = bv / sum;
        wsum += bv / sum;
        if (lane == 0) {
            p.ids[k] = bi;
            prob[bi] = -1.f;
        }
        __syncwarp();
    }
    if (lane < p.topk_K) p.wts[lane] = p.norm_topk ? myw / wsum : myw;
    if (lane == 0) {
        p.wts[p.topk_K] = p.has_shared_gate ? sigmoid_f(__ldcg(p.logits + E)) : 1.f;
        *p.counter = 0;
    }
}

// The router's last block (ticket counter) runs the finisher once every block's logits are out.
// One fence per block, by the thread that takes the ticket after the barrier (cumulative over the
// block's writes), rather than one per thread.
static __device__ __forceinline__ void topk_if_last(const struct gemv_params &p) {
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(p.counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last) {
        __threadfence();
        topk_finish(p);
    }
}
