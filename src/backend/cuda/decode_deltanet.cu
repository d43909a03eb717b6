// One Gated DeltaNet step per value head, fused: q/k l2norm, g and beta, the state decay, the
// delta-rule update and the readout with the head's state held in registers (read once, written
// once), then the gated RMSNorm * silu(z). The causal conv + silu already ran in the projection's
// epilogue (EPI_CONV). One block per value head: warp w owns state rows [w*RPW, (w+1)*RPW) and
// lane l owns columns [4l, 4l+4).
#include "backend/cuda/decode.cuh"

#define DN_WARPS 16

template <int RPW>
__global__ void __launch_bounds__(DN_WARPS * 32) deltanet_kernel(const __grid_constant__ struct deltanet_params p) {
    __shared__ float q[256], k[256], v[128], delta[128], o[128];
    __shared__ float part[DN_WARPS][128];
    __shared__ float red[32];
    const int h = blockIdx.x, dk = p.dk, dv = p.dv;
    const int kh = h / (p.v_heads / p.k_heads);
    const int qk = p.k_heads * dk;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    for (int i = tid; i < dk; i += blockDim.x) {
        q[i] = p.qkv[kh * dk + i];
        k[i] = p.qkv[qk + kh * dk + i];
    }
    for (int i = tid; i < dv; i += blockDim.x) v[i] = p.qkv[2 * qk + h * dv + i];
    // state rows into registers early: the loads overlap the normalisations below
    const bool colok = 4 * lane < dv;
    float4 S[RPW];
    float *Sh = p.S + (size_t)h * dk * dv;
#pragma unroll
    for (int i = 0; i < RPW; i++)
        S[i] = colok ? *reinterpret_cast<const float4 *>(Sh + (size_t)(warp * RPW + i) * dv + 4 * lane)
                     : make_float4(0.f, 0.f, 0.f, 0.f);
    __syncthreads();
    // l2norm(q) / sqrt(dk), l2norm(k); both sums in one pass
    float sq = 0.f, sk = 0.f;
    for (int i = tid; i < dk; i += blockDim.x) sq += q[i] * q[i], sk += k[i] * k[i];
#pragma unroll
    for (int off = 16; off; off >>= 1) {
        sq += __shfl_xor_sync(0xffffffffu, sq, off);
        sk += __shfl_xor_sync(0xffffffffu, sk, off);
    }
    if (lane == 0) red[warp] = sq, red[16 + warp] = sk;
    __syncthreads();
    sq = sk = 0.f;
    for (int w = 0; w < DN_WARPS; w++) sq += red[w], sk += red[16 + w];
    const float qs = rsqrtf(sq + 1e-6f) * rsqrtf((float)dk), ks = rsqrtf(sk + 1e-6f);
    const float beta = sigmoid_f(p.b[h]);
    const float ax = p.a[h] + p.dt_bias[h];
    const float sp = ax > 20.f ? ax : log1pf(__expf(ax));
    const float g = __expf(-__expf(p.A_log[h]) * sp);
    float kr[RPW], qr[RPW];
#pragma unroll
    for (int i = 0; i < RPW; i++) kr[i] = k[warp * RPW + i] * ks, qr[i] = q[warp * RPW + i] * qs;
    // kv = (g S)^T k
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        acc.x += S[i].x * kr[i];
        acc.y += S[i].y * kr[i];
        acc.z += S[i].z * kr[i];
        acc.w += S[i].w * kr[i];
    }
    if (colok) *reinterpret_cast<float4 *>(&part[warp][4 * lane]) = acc;
    __syncthreads();
    if (tid < dv) {
        float kv = 0.f;
        for (int w = 0; w < DN_WARPS; w++) kv += part[w][tid];
        delta[tid] = beta * (v[tid] - g * kv);
    }
    __syncthreads();
    // S = g S + k delta^T; o = S^T q
    float4 d4 = colok ? *reinterpret_cast<const float4 *>(&delta[4 * lane]) : make_float4(0.f, 0.f, 0.f, 0.f);
    acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        S[i].x = g * S[i].x + kr[i] * d4.x;
        S[i].y = g * S[i].y + kr[i] * d4.y;
        S[i].z = g * S[i].z + kr[i] * d4.z;
        S[i].w = g * S[i].w + kr[i] * d4.w;
        acc.x += S[i].x * qr[i];
        acc.y += S[i].y * qr[i];
        acc.z += S[i].z * qr[i];
        acc.w += S[i].w * qr[i];
    }
    if (colok) {
#pragma unroll
        for (int i = 0; i < RPW; i++) *reinterpret_cast<float4 *>(Sh + (size_t)(warp * RPW + i) * dv + 4 * lane) = S[i];
        *reinterpret_cast<float4 *>(&part[warp][4 * lane]) = acc;
    }
    __syncthreads();
    float ov = 0.f;
    if (tid < dv) {
        for (int w = 0; w < DN_WARPS; w++) ov += part[w][tid];
        o[tid] = ov;
    }
    // gated RMSNorm over the head
    float ss = tid < dv ? ov * ov : 0.f;
#pragma unroll
    for (int off = 16; off; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    __syncthreads();
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    ss = 0.f;
    for (int w = 0; w < DN_WARPS; w++) ss += red[w];
    const float r = rsqrtf(ss / (float)dv + p.eps);
    if (tid < dv) p.y[h * dv + tid] = o[tid] * r * p.norm_w[tid] * silu_f(p.z[h * dv + tid]);
}

int deltanet_launch(const struct deltanet_params *p, cudaStream_t s, struct wren_err *e) {
    if (p->dv > 128 || p->dv % 4 || p->dk > 256 || p->dk % DN_WARPS || p->v_heads % p->k_heads)
        return wren_errf(e, "deltanet: unsupported head sizes d_k %d, d_v %d (need d_v <= 128, d_v %% 4 == 0, "
                            "d_k <= 256, d_k %% 16 == 0)", p->dk, p->dv);
    const int rpw = p->dk / DN_WARPS;
    void (*k)(const struct deltanet_params) = nullptr;
    switch (rpw) {
    case 1: k = deltanet_kernel<1>; break;
    case 2: k = deltanet_kernel<2>; break;
    case 4: k = deltanet_kernel<4>; break;
    case 8: k = deltanet_kernel<8>; break;
    case 16: k = deltanet_kernel<16>; break;
    default: return wren_errf(e, "deltanet: d_k %d is not 16, 32, 64, 128 or 256", p->dk);
    }
    k<<<p->v_heads, DN_WARPS * 32, 0, s>>>(*p);
    CUDA_CHECK_LAUNCH();
    return 0;
}
