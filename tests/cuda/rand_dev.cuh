// Random device data made on the GPU (benchmarks: no checkpoint has to travel): hashed words,
// MLX affine 4/8-bit matrices (group 64) with weights ~ uniform in [-1.7/sqrt(cols), +], and float
// vectors. Include after a header that defines CK (common_check.cuh or check_prefill_util.cuh).
#pragma once
#include <math.h>
#include <string.h>

#include <cuda_bf16.h>

#include "backend/cuda/cuda_model.h"

namespace {

__device__ __forceinline__ uint32_t rand_hash(size_t i, uint32_t seed) {
    uint32_t x = (uint32_t)i * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    return x;
}
__global__ void fill_words(uint32_t *w, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        w[i] = rand_hash(i, seed);
}
// scales/biases for 2^bits levels so that weights are ~ uniform in [-amp, amp]
__global__ void fill_sb(__nv_bfloat16 *s, __nv_bfloat16 *b, size_t n, float amp, int levels) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        s[i] = __float2bfloat16(2.f * amp / (levels - 1));
        b[i] = __float2bfloat16(-amp);
    }
}
__global__ void fill_f(float *p, size_t n, float base, float var, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = base + var * ((rand_hash(i, seed) & 0xFFFF) / 65536.f - 0.5f);
}

// A stack of n random matrices [rows][cols]; *bytes (if non-NULL) grows by what was allocated.
// in: the input width the weights' amplitude is for (default cols; wider where a row's dot
// product spans several matrices, as the MoE down's over the chosen experts).
struct dmat rand_qmat(int n, int rows, int cols, int bits, uint32_t seed, size_t *bytes,
                      int in = 0) {
    struct dmat d;
    memset(&d, 0, sizeof d);
    d.type = bits == 4 ? WT_Q4 : WT_Q8;
    d.n = n, d.rows = rows, d.cols = cols, d.bits = bits, d.group = 64;
    d.row_stride = (size_t)cols * bits / 8;
    d.mat_stride = d.row_stride * rows;
    d.sb_row_stride = (size_t)cols / 64 * 2;
    d.sb_mat_stride = d.sb_row_stride * rows;
    uint8_t *data, *s, *b;
    CK(cudaMalloc(&data, d.mat_stride * n));
    CK(cudaMalloc(&s, d.sb_mat_stride * n));
    CK(cudaMalloc(&b, d.sb_mat_stride * n));
    if (bytes) *bytes += d.mat_stride * n + 2 * d.sb_mat_stride * n;
    fill_words<<<1024, 256>>>((uint32_t *)data, d.mat_stride * n / 4, seed);
    fill_sb<<<1024, 256>>>((__nv_bfloat16 *)s, (__nv_bfloat16 *)b, d.sb_mat_stride * n / 2,
                           1.7f / sqrtf((float)(in ? in : cols)), 1 << bits);
    CK(cudaGetLastError());
    d.data = data, d.scales = s, d.biases = b;
    return d;
}

float *rand_fvec(size_t n, float base, float var, uint32_t seed) {
    float *p;
    CK(cudaMalloc(&p, n * 4));
    fill_f<<<256, 256>>>(p, n, base, var, seed);
    CK(cudaGetLastError());
    return p;
}

} // namespace
