// Device side of the int8 KV cache (backend/kv_int8.h): the row layout of a cache and the
// quantization, shared by the decode and prefill K/V writers and the readers.
#pragma once
#include <stddef.h>

#include "backend/kv_int8.h"

// One cache row (a token, every KV head) of one layer's K or V: bf16 [n_kv][hd], or int8 codes
// [n_kv][hd] then f32 scales [n_kv][hd / KV_INT8_GROUP], padded to 16 bytes (rows stay 16-byte
// aligned for cp.async; with hd 256 a head's 4 scales are one 16-byte chunk).
static inline __host__ __device__ size_t kv_row_bytes(int n_kv, int hd, bool int8) {
    return int8 ? (size_t)n_kv * hd + ((size_t)n_kv * (hd / KV_INT8_GROUP) * 4 + 15) / 16 * 16
                : (size_t)n_kv * hd * 2;
}
// The scales of a row: [n_kv][hd / KV_INT8_GROUP].
static __host__ __device__ __forceinline__ float *kv_int8_scales(unsigned char *row, int n_kv,
                                                                 int hd) {
    return reinterpret_cast<float *>(row + (size_t)n_kv * hd);
}
// 127 / amax and amax / 127 divided with round-to-nearest (the build uses fast math), as the host
// reference computes them, so both cache the same codes.
static __device__ __forceinline__ float kv_int8_inv(float amax) {
    return amax > KV_INT8_TINY ? __fdiv_rn(KV_INT8_MAX, amax) : 0.f;
}
static __device__ __forceinline__ float kv_int8_scale(float amax) {
    return amax > KV_INT8_TINY ? __fdiv_rn(amax, KV_INT8_MAX) : 0.f;
}
static __device__ __forceinline__ unsigned char kv_int8_code(float x, float inv) {
    return (unsigned char)((int)rintf(__fmul_rn(x, inv)) + 128);
}
