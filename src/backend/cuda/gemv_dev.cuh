// Device pieces shared by the decode GEMV kernels (decode_gemv.cu: f32 activations, any format;
// decode_qgemv.cu: int8 activations with dp4a for 4/8-bit weights): block reduction, the output
// epilogues and the MoE router finisher.
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
