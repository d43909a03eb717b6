// The upload's reordering of 4-bit weights into the device layout (common.cuh, q4_word).
#include "backend/cuda/common.cuh"

namespace {
// One thread per 16-byte chunk: MLX value v = 8j + 2t + e (word j, nibble 2t + e) moves to word
// t, nibble j + 4e (j = 2s + h).
__global__ void q4_repack_kernel(uint4 *d, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint4 c = d[i];
        const uint32_t src[4] = {c.x, c.y, c.z, c.w};
        uint32_t dst[4] = {0, 0, 0, 0};
#pragma unroll
        for (int t = 0; t < 4; t++)
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    dst[t] |= ((src[j] >> (4 * (2 * t + e))) & 15u) << (4 * (j + 4 * e));
        d[i] = make_uint4(dst[0], dst[1], dst[2], dst[3]);
    }
}
} // namespace

int q4_repack(uint8_t *d, size_t n, cudaStream_t s, struct wren_err *e) {
    if (n % 16 || (uintptr_t)d % 16)
        return wren_errf(e, "q4_repack: %zu bytes at %p are not whole 16-byte chunks", n,
                         (void *)d);
    if (!n) return 0;
    const size_t chunks = n / 16;
    const unsigned blocks = (unsigned)(chunks / 256 + 1 < 65536 ? chunks / 256 + 1 : 65536);
    q4_repack_kernel<<<blocks, 256, 0, s>>>(reinterpret_cast<uint4 *>(d), chunks);
    CUDA_CHECK_LAUNCH();
    return 0;
}
