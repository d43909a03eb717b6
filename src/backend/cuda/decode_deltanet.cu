// One Gated DeltaNet step, fused: q/k l2norm, g and beta, the state decay, the delta-rule update
// and the readout with the state held in registers (read once, written once). The causal conv +
// silu already ran in the projection's epilogue (EPI_CONV).
#include "backend/cuda/decode.cuh"

#define DN_WARPS 8

// Block (value head h, slice of 32 state columns): warp w owns state rows [w*RPW, (w+1)*RPW), lane
// l owns column 32*slice + l. The state is read and written once; q/k normalisation is recomputed
// by each block (dk values). Output: the raw readout o; the gated RMSNorm * silu(z) over the head
// is fused into the out_proj GEMV's input load (gemv_params.gn_*), which sees the whole head.
template <int RPW>
__global__ void __launch_bounds__(DN_WARPS * 32)
    deltanet_kernel(const __grid_constant__ struct deltanet_params p) {
    __shared__ float q[256], k[256];
    __shared__ float part[DN_WARPS][32];
    __shared__ float delta[32];
    __shared__ float red[2][DN_WARPS];
    const int h = blockIdx.x, dk = p.dk, dv = p.dv;
    const int kh = h / (p.v_heads / p.k_heads);
    const int qk = p.k_heads * dk;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int col = blockIdx.y * 32 + lane;
    const bool colok = col < dv;
    float *Sh = p.S + (size_t)h * dk * dv;
    float S[RPW];
    pdl_trigger();
    // the state is this layer's own (last written a token ago): load it while the projection
    // that feeds q/k/v is still finishing, then wait for it
#pragma unroll
    for (int i = 0; i < RPW; i++) S[i] = colok ? Sh[(size_t)(warp * RPW + i) * dv + col] : 0.f;
    const float A_log = p.A_log[h], dt_bias = p.dt_bias[h];
    pdl_wait();
    // the gate inputs are loaded with q/k/v so their round trips overlap
    const float b_in = __ldcg(p.b + h), a_in = __ldcg(p.a + h);
    for (int i = tid; i < dk; i += blockDim.x) {
        q[i] = __ldcg(p.qkv + kh * dk + i);
        k[i] = __ldcg(p.qkv + qk + kh * dk + i);
    }
    const float vv = colok ? __ldcg(p.qkv + 2 * qk + h * dv + col) : 0.f;
    __syncthreads();
    float sq = 0.f, sk = 0.f;
    for (int i = tid; i < dk; i += blockDim.x) sq += q[i] * q[i], sk += k[i] * k[i];
#pragma unroll
    for (int off = 16; off; off >>= 1) {
        sq += __shfl_xor_sync(0xffffffffu, sq, off);
        sk += __shfl_xor_sync(0xffffffffu, sk, off);
    }
    if (lane == 0) red[0][warp] = sq, red[1][warp] = sk;
    __syncthreads();
    sq = sk = 0.f;
#pragma unroll
    for (int w = 0; w < DN_WARPS; w++) sq += red[0][w], sk += red[1][w];
    const float qs = rsqrtf(sq + 1e-6f) * rsqrtf((float)dk), ks = rsqrtf(sk + 1e-6f);
    const float beta = sigmoid_f(b_in);
    const float ax = a_in + dt_bias;
    const float sp = ax > 20.f ? ax : log1pf(__expf(ax));
    const float g = __expf(-__expf(A_log) * sp);
    float kr[RPW], qr[RPW];
#pragma unroll
    for (int i = 0; i < RPW; i++) kr[i] = k[warp * RPW + i] * ks, qr[i] = q[warp * RPW + i] * qs;
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < RPW; i++) acc += S[i] * kr[i];
    part[warp][lane] = acc;
    __syncthreads();
    if (warp == 0) {
        float kv = 0.f;
#pragma unroll
        for (int w = 0; w < DN_WARPS; w++) kv += part[w][lane];
        delta[lane] = beta * (vv - g * kv);
    }
    __syncthreads();
    const float d = delta[lane];
    acc = 0.f;
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        S[i] = g * S[i] + kr[i] * d;
        acc += S[i] * qr[i];
    }
    if (colok)
#pragma unroll
        for (int i = 0; i < RPW; i++) Sh[(size_t)(warp * RPW + i) * dv + col] = S[i];
    part[warp][lane] = acc; // every warp read part before the second barrier
    __syncthreads();
    if (warp == 0 && colok) {
        float o = 0.f;
#pragma unroll
        for (int w = 0; w < DN_WARPS; w++) o += part[w][lane];
        p.y[h * dv + col] = o;
    }
}

int deltanet_launch(const struct deltanet_params *p, cudaStream_t s, struct wren_err *e) {
    if (p->dk > 256 || p->dk % DN_WARPS || p->v_heads % p->k_heads)
        return wren_errf(
            e, "deltanet: unsupported head sizes d_k %d, d_v %d (need d_k <= 256, d_k %% 8 == 0)",
            p->dk, p->dv);
    const int rpw = p->dk / DN_WARPS;
    void (*k)(const struct deltanet_params) = nullptr;
    switch (rpw) {
    case 1:
        k = deltanet_kernel<1>;
        break;
    case 2:
        k = deltanet_kernel<2>;
        break;
    case 4:
        k = deltanet_kernel<4>;
        break;
    case 8:
        k = deltanet_kernel<8>;
        break;
    case 16:
        k = deltanet_kernel<16>;
        break;
    case 32:
        k = deltanet_kernel<32>;
        break;
    default:
        return wren_errf(e, "deltanet: d_k %d is not 8, 16, 32, 64, 128 or 256", p->dk);
    }
    dim3 grid(p->v_heads, (p->dv + 31) / 32);
    CUDA_CHECK(pdl_launch(k, grid, dim3(DN_WARPS * 32), 0, s, decode_pdl(), *p));
    return 0;
}
