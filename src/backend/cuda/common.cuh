// Shared helpers of the CUDA backend (decode and prefill): error checking that never exits,
// bf16 conversions, and the MLX affine dequantization used inside the weight-streaming kernels.
#pragma once
#include <stdint.h>
#include <string.h>

#include <utility>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "model/weights.h"
#include "util/err.h"
}

// Turns a failing CUDA call into a wren_err and returns -1 from the enclosing function.
// `e` must be a struct wren_err * in scope. The error is also cleared from cudaGetLastError: a
// non-sticky one (bad launch configuration, out of memory) must not fail the next launch check.
#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t cuda_check_rc_ = (call);                                                       \
        if (cuda_check_rc_ != cudaSuccess) {                                                       \
            cudaGetLastError();                                                                    \
            return wren_errf(e, "CUDA error %s at %s:%d (%s)", cudaGetErrorString(cuda_check_rc_), \
                             __FILE__, __LINE__, #call);                                           \
        }                                                                                          \
    } while (0)

// After a kernel launch: reports launch-configuration errors (not asynchronous faults).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// Host-side shape helpers of the launchers (group sizes and chunk counts are powers of two).
static inline bool pow2(int v) {
    return v > 0 && (v & (v - 1)) == 0;
}
static inline int log2i(int v) { // the smallest s with 2^s >= v
    int s = 0;
    while ((1 << s) < v) s++;
    return s;
}

static __host__ __device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) {
#ifdef __CUDA_ARCH__
    return __uint_as_float((uint32_t)h << 16);
#else
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

static __device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

static __device__ __forceinline__ float silu_f(float x) {
    return x / (1.f + __expf(-x));
}
static __device__ __forceinline__ float sigmoid_f(float x) {
    return 1.f / (1.f + __expf(-x));
}

// Weight chunks: every quantized/bf16 row is streamed in 16-byte chunks. A chunk holds EPC
// elements and never straddles a quantization group (groups are >= 32 elements).
template <int BITS> struct wfmt {
    static constexpr int EPC = 128 / BITS; // elements per 16-byte chunk (BITS 16 = bf16)
};

// The 4-bit layout on the device. The upload (q4_repack) reorders the values inside every
// 16-byte chunk of a 4-bit matrix (32 values, never straddling a group): chunk value
// v = 16s + 8h + 2t + e (s, h, e in {0, 1}, t < 4) sits in word t at nibble 2s + h + 4e, where MLX
// has it in word v / 8 at nibble v % 8. A tensor-core fragment's lane t needs exactly the values
// 2t, 2t + 1 (+ 8h, + 16s) of a chunk: they are one word, each (s, h) pair 16 bits apart, where
// one LOP3 turns both nibbles into bf16 (nib_bf16x2), with no byte gathering or pairing left.
// Within a 16-byte chunk only, so every kernel still streams whole chunks of 32 values in order.
static __host__ __device__ __forceinline__ int q4_word(int v) { // v < 32
    return (v >> 1) & 3;
}
static __host__ __device__ __forceinline__ int q4_shift(int v) {
    return 4 * ((v >> 3) + 4 * (v & 1));
}
// Value k of a quantized row (bits 4: the layout above; bits 8: byte k).
static __device__ __forceinline__ uint32_t q_value(const uint8_t *row, int bits, int k) {
    const uint32_t *w = reinterpret_cast<const uint32_t *>(row);
    if (bits == 4) return (w[(k >> 5) * 4 + q4_word(k & 31)] >> q4_shift(k & 31)) & 15u;
    return (w[k >> 2] >> (8 * (k & 3))) & 255u;
}
// Reorders n bytes of MLX 4-bit data on the device into the layout above (in place, n % 16 == 0;
// stream-ordered).
int q4_repack(uint8_t *d, size_t n, cudaStream_t s, struct wren_err *e);

// Activations are kept in shared memory as f32 with 4 floats of padding after every 32, so that
// lanes reading consecutive chunks hit distinct banks (see NOTES.md).
static __host__ __device__ __forceinline__ int xpad(int i) {
    return i + ((i >> 5) << 2);
}
static __host__ __device__ __forceinline__ int xpad_len(int n) {
    return n + ((n + 31) >> 5) * 4;
}

// Exact small-integer to float conversion without I2F: 2^23 + q as a float bit pattern, minus 2^23.
static __device__ __forceinline__ float u8f(uint32_t q) {
    return __uint_as_float(0x4B000000u | q) - 8388608.f;
}

// acc[i] += s_i * sum_j x_j q_ij + b_i * sum_j x_j over one 16-byte chunk of R rows.
// xs points at the chunk's first activation in padded shared memory (EPC contiguous floats).
template <int BITS, int R>
static __device__ __forceinline__ void dot_chunk(const uint4 (&w)[R], const float (&s)[R],
                                                 const float (&b)[R], const float *xs,
                                                 float (&acc)[R]) {
    if constexpr (BITS == 4) {
        float xsum = 0.f, d[R];
#pragma unroll
        for (int i = 0; i < R; i++) d[i] = 0.f;
#pragma unroll
        for (int t = 0; t < 4; t++) {
            // word t (device layout, q4_word): its low nibbles hold values 2t, 16 + 2t, 2t + 1,
            // 17 + 2t of the chunk, its high nibbles 8 + 2t, 24 + 2t, 9 + 2t, 25 + 2t
            const float2 x0 = *reinterpret_cast<const float2 *>(xs + 2 * t);
            const float2 x1 = *reinterpret_cast<const float2 *>(xs + 8 + 2 * t);
            const float2 x2 = *reinterpret_cast<const float2 *>(xs + 16 + 2 * t);
            const float2 x3 = *reinterpret_cast<const float2 *>(xs + 24 + 2 * t);
            // xv[2b] pairs with byte b of the low nibbles, xv[2b + 1] with byte b of the high
            const float xv[8] = {x0.x, x1.x, x2.x, x3.x, x0.y, x1.y, x2.y, x3.y};
#pragma unroll
            for (int j = 0; j < 8; j++) xsum += xv[j];
#pragma unroll
            for (int i = 0; i < R; i++) {
                uint32_t word = t == 0 ? w[i].x : t == 1 ? w[i].y : t == 2 ? w[i].z : w[i].w;
                // one byte permute places a level in the mantissa of 2^23
                const uint32_t lo = word & 0x0F0F0F0Fu, hi = (word >> 4) & 0x0F0F0F0Fu;
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    d[i] =
                        fmaf(xv[2 * b],
                             __uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7540 + b)) - 8388608.f,
                             d[i]);
                    d[i] =
                        fmaf(xv[2 * b + 1],
                             __uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7540 + b)) - 8388608.f,
                             d[i]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < R; i++) acc[i] += s[i] * d[i] + b[i] * xsum;
    } else if constexpr (BITS == 8) {
        float xsum = 0.f, d[R];
#pragma unroll
        for (int i = 0; i < R; i++) d[i] = 0.f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float4 xa = *reinterpret_cast<const float4 *>(xs + 4 * k);
            float xv[4] = {xa.x, xa.y, xa.z, xa.w};
#pragma unroll
            for (int j = 0; j < 4; j++) xsum += xv[j];
#pragma unroll
            for (int i = 0; i < R; i++) {
                uint32_t word = k == 0 ? w[i].x : k == 1 ? w[i].y : k == 2 ? w[i].z : w[i].w;
#pragma unroll
                for (int j = 0; j < 4; j++)
                    d[i] = fmaf(xv[j],
                                __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7540 + j)) -
                                    8388608.f,
                                d[i]);
            }
        }
#pragma unroll
        for (int i = 0; i < R; i++) acc[i] += s[i] * d[i] + b[i] * xsum;
    } else { // bf16: 8 elements, no scale/bias
        float4 xa = *reinterpret_cast<const float4 *>(xs);
        float4 xb = *reinterpret_cast<const float4 *>(xs + 4);
        float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
        for (int i = 0; i < R; i++) {
            uint32_t wd[4] = {w[i].x, w[i].y, w[i].z, w[i].w};
            float d = 0.f;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                d = fmaf(xv[2 * k], __uint_as_float(wd[k] << 16), d);
                d = fmaf(xv[2 * k + 1], __uint_as_float(wd[k] & 0xFFFF0000u), d);
            }
            acc[i] += d;
        }
        (void)s;
        (void)b;
    }
}

// Bits of a device matrix as used by the templates: 4, 8, or 16 for bf16.
static __host__ __device__ __forceinline__ int dmat_bits(enum wtype t, int bits) {
    return t == WT_BF16 ? 16 : bits;
}

// An L2 cache policy for data a decode step reads once (weights, the KV cache): its lines are the
// first to be evicted. The step streams ~1.7 GB through a 50 MB L2; under the default policy that
// evicts the kernels' code and the activations every few launches, and each launch then fetches
// its code again (a second, identical copy of the GEMV kernel for one launch kind cost 9% of
// decode speed: RESULTS.md, twenty-third session).
static __device__ __forceinline__ uint64_t l2_stream() {
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}

// Programmatic dependent launch (Hopper and newer): a kernel launched with pdl_launch may start
// while the previous kernel of the stream is still running. It must call pdl_wait() before it
// reads anything an earlier kernel wrote, or writes anything an earlier kernel may still read;
// work before that point may only touch constant data (weights, recurrent state of this layer,
// the step's position: attn_len), or speculate on a value an earlier kernel writes and check it
// after the wait (qdown_kernel).
// pdl_trigger() lets the next kernel launch early. Both are no-ops before sm_90.
static __device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
static __device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches kernel<<<grid, threads, smem, s>>>(args...), overlapping with the previous kernel when
// pdl is set (the kernel must then follow the pdl_wait contract above). coop: a cooperative launch,
// for a kernel whose blocks wait for each other: the driver guarantees that the whole grid is
// resident at once, or fails the launch instead of letting it hang.
template <typename... P, typename... A>
static cudaError_t launch_ex(void (*kernel)(P...), dim3 grid, dim3 threads, size_t smem,
                             cudaStream_t s, bool pdl, bool coop, A &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = threads;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[2];
    int na = 0;
    if (pdl) {
        at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[na++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (coop) {
        at[na].id = cudaLaunchAttributeCooperative;
        at[na++].val.cooperative = 1;
    }
    cfg.attrs = at;
    cfg.numAttrs = na;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}
template <typename... P, typename... A>
static cudaError_t pdl_launch(void (*kernel)(P...), dim3 grid, dim3 threads, size_t smem,
                              cudaStream_t s, bool pdl, A &&...args) {
    return launch_ex(kernel, grid, threads, smem, s, pdl, false, std::forward<A>(args)...);
}
