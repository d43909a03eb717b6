// The int8 KV cache (--kv-cache int8). Each cached row of head_dim values (one token, one KV head,
// K or V) is stored in groups of KV_INT8_GROUP: codes u = q + 128 with q = rint(x * (127 / amax))
// in [-127, 127], amax = max |x| over the group, and one f32 scale amax / 127 per group (0 for an
// all-zero or tiny group); the value read back is q * scale. (Groups of 64, not whole rows: on the
// tiny test model the logits' median error against an f32 cache is 1.3e-3 with groups of 64 and
// 3.0e-3 with a scale per row; a bf16 cache gives 3.5e-4.) Both backends quantize the same f32
// values with these operations (the CUDA kernels use round-to-nearest division as here), so they
// cache the same codes; the CPU backend stores the values read back in its f32 cache, the CUDA
// backend the codes and scales (backend/cuda NOTES.md, "int8 KV cache").
#pragma once
#include <math.h>

#define KV_INT8_GROUP 64 // head_dim must be a multiple
#define KV_INT8_MAX   127.0f
// Groups whose amax is not above this are cached as zeros (127 / amax would overflow).
#define KV_INT8_TINY 1e-30f

static inline float kv_int8_amax(const float *x, int n) {
    float amax = 0.f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    return amax;
}
// Codes of one group x[0, KV_INT8_GROUP) into code[]; returns its scale.
static inline float kv_int8_group(const float *x, unsigned char *code) {
    const float amax = kv_int8_amax(x, KV_INT8_GROUP),
                inv = amax > KV_INT8_TINY ? KV_INT8_MAX / amax : 0.f;
    for (int i = 0; i < KV_INT8_GROUP; i++) code[i] = (unsigned char)((int)rintf(x[i] * inv) + 128);
    return amax > KV_INT8_TINY ? amax / KV_INT8_MAX : 0.f;
}
// Quantizes the row x[0, n) (n a multiple of KV_INT8_GROUP) and overwrites it with the values read
// back.
static inline void kv_int8_round_trip(float *x, int n) {
    for (int g = 0; g < n; g += KV_INT8_GROUP) {
        const float amax = kv_int8_amax(x + g, KV_INT8_GROUP),
                    inv = amax > KV_INT8_TINY ? KV_INT8_MAX / amax : 0.f,
                    scale = amax > KV_INT8_TINY ? amax / KV_INT8_MAX : 0.f;
        for (int i = g; i < g + KV_INT8_GROUP; i++) x[i] = rintf(x[i] * inv) * scale;
    }
}
