// Small row-wise kernels of the prefill path: embedding lookup and RMSNorm to bf16.
#include "backend/cuda/prefill.cuh"

namespace {

// Block per token: dequantizes its embedding row into the f32 residual stream.
__global__ void embed_kernel(const struct dmat emb, const int32_t *tokens, float *x) {
    const int t = blockIdx.x, H = emb.cols;
    const int id = tokens[t];
    const uint8_t *row = emb.data + (size_t)id * emb.row_stride;
    for (int k = threadIdx.x; k < H; k += blockDim.x) {
        float v;
        if (emb.type == WT_F32) {
            v = reinterpret_cast<const float *>(row)[k];
        } else if (emb.type == WT_BF16) {
            v = __bfloat162float(reinterpret_cast<const bf16 *>(row)[k]);
        } else {
            const uint32_t q = q_value(row, emb.bits, k);
            const bf16 *sc =
                reinterpret_cast<const bf16 *>(emb.scales + (size_t)id * emb.sb_row_stride);
            const bf16 *bi =
                reinterpret_cast<const bf16 *>(emb.biases + (size_t)id * emb.sb_row_stride);
            v = __bfloat162float(sc[k / emb.group]) * (float)q +
                __bfloat162float(bi[k / emb.group]);
        }
        x[(size_t)t * H + k] = v;
    }
}

__global__ void rmsnorm_kernel(const float *x, const float *w, int H, float eps, bf16 *out) {
    __shared__ float red[32];
    const float *row = x + (size_t)blockIdx.x * H;
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) ss += row[i] * row[i];
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(~0u, ss, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
        for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
        if (threadIdx.x == 0) red[0] = rsqrtf(v / H + eps);
    }
    __syncthreads();
    const float r = red[0];
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        out[(size_t)blockIdx.x * H + i] = __float2bfloat16(row[i] * r * w[i]);
}

} // namespace

int pf_embed(cudaStream_t s, const struct dmat *emb, const int32_t *tokens, int T, float *x,
             struct wren_err *e) {
    embed_kernel<<<T, 256, 0, s>>>(*emb, tokens, x);
    CUDA_CHECK_LAUNCH();
    return 0;
}

int pf_rmsnorm_bf16(cudaStream_t s, const float *x, const float *w, int T, int H, float eps,
                    bf16 *out, struct wren_err *e) {
    rmsnorm_kernel<<<T, 256, 0, s>>>(x, w, H, eps, out);
    CUDA_CHECK_LAUNCH();
    return 0;
}
