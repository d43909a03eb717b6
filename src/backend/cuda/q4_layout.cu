// The upload's reordering of 4-bit weights into the device layout (common.cuh, q4_word).
#include "backend/cuda/common.cuh"

namespace {
// One thread per 16-byte chunk: MLX value v (word v / 8, nibble v % 8) moves to word q4_word(v)
// at bit q4_shift(v).
__global__ void q4_repack_kernel(uint4 *d, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint4 c = d[i];
        const uint32_t src[4] = {c.x, c.y, c.z, c.w};
        uint32_t dst[4] = {0, 0, 0, 0};
#pragma unroll
        for (int v = 0; v < 32; v++)
            dst[q4_word(v)] |= ((src[v >> 3] >> (4 * (v & 7))) & 15u) << q4_shift(v);
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
