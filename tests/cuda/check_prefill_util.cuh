// Helpers of the prefill kernel checks: random quantized matrices (host copy + device dmat),
// bf16 conversion, poisoned device buffers, error metrics. Every check compares against a plain
// CPU implementation of the math in MODEL.md.
#pragma once
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "backend/cuda/prefill.cuh"

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t rc_ = (call);                                                                  \
        if (rc_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(rc_));           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define OK(call)                                                                                   \
    do {                                                                                           \
        struct wren_err e_;                                                                        \
        e_.msg[0] = 0;                                                                             \
        if ((call) != 0) {                                                                         \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, e_.msg);                            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define ERR (&e_)

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static inline uint32_t rnd_u32() {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}
static inline float rnd_f(float lo, float hi) {
    return lo + (hi - lo) * (rnd_u32() / 4294967296.f);
}
static inline float rnd_n() { // roughly normal
    float s = 0;
    for (int i = 0; i < 4; i++) s += rnd_f(-1, 1);
    return s * 0.866f;
}

static inline uint16_t h_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static inline float h_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline float round_bf16(float f) {
    return h_f32(h_bf16(f));
}

// Device 0's opt-in shared memory per block: what the backend puts in cuda_ctx.smem_optin (the
// prefill picks the chunked DeltaNet form only when its stages fit).
static inline size_t dev_smem_optin() {
    int v = 0;
    CK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    return (size_t)v;
}

template <class T> static T *dev_upload(const std::vector<T> &v) {
    T *d;
    CK(cudaMalloc(&d, v.size() * sizeof(T) + 16));
    CK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
template <class T> static T *dev_poison(size_t n) { // NaN-ish bytes: unwritten outputs show up
    T *d;
    CK(cudaMalloc(&d, n * sizeof(T) + 16));
    CK(cudaMemset(d, 0xFF, n * sizeof(T) + 16));
    return d;
}
template <class T> static std::vector<T> dev_download(const T *d, size_t n) {
    std::vector<T> v(n);
    CK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

// A random stack of n [rows, cols] matrices in one format, on host and device.
struct tmat {
    enum wtype type;
    int n, rows, cols, bits, group;
    std::vector<uint8_t> data, scales, biases;
    size_t rs, ms, sbrs, sbms;
    struct dmat d;

    float at(int e, int r, int k) const { // the MLX affine rule (f32)
        const uint8_t *row = data.data() + e * ms + r * rs;
        if (type == WT_BF16) return h_f32(((const uint16_t *)row)[k]);
        if (type == WT_F32) return ((const float *)row)[k];
        int per = 32 / bits;
        uint32_t w = ((const uint32_t *)row)[k / per];
        uint32_t q = (w >> (bits * (k % per))) & ((1u << bits) - 1);
        size_t sb = e * sbms + r * sbrs;
        float s = h_f32(((const uint16_t *)(scales.data() + sb))[k / group]);
        float b = h_f32(((const uint16_t *)(biases.data() + sb))[k / group]);
        return s * (float)q + b;
    }
};

static tmat make_tmat(enum wtype type, int n, int rows, int cols, int group) {
    tmat m;
    m.type = type;
    m.n = n;
    m.rows = rows;
    m.cols = cols;
    m.bits = type == WT_Q4 ? 4 : type == WT_Q8 ? 8 : 0;
    m.group = m.bits ? group : 0;
    const float amp = 1.f / sqrtf((float)cols);
    if (m.bits) {
        m.rs = (size_t)cols * m.bits / 8;
        m.sbrs = (size_t)(cols / group) * 2;
    } else {
        m.rs = (size_t)cols * (type == WT_BF16 ? 2 : 4);
        m.sbrs = 0;
    }
    m.ms = m.rs * rows;
    m.sbms = m.sbrs * rows;
    m.data.resize(m.ms * n);
    for (auto &b : m.data) b = (uint8_t)rnd_u32();
    if (m.bits) {
        m.scales.resize(m.sbms * n);
        m.biases.resize(m.sbms * n);
        const int qmax = (1 << m.bits) - 1;
        for (size_t i = 0; i < m.scales.size() / 2; i++) {
            float s = rnd_f(0.5f, 1.5f) * 2.f * amp / qmax;
            ((uint16_t *)m.scales.data())[i] = h_bf16(s);
            ((uint16_t *)m.biases.data())[i] = h_bf16(-s * qmax / 2 + rnd_f(-0.1f, 0.1f) * amp);
        }
    } else if (type == WT_BF16) {
        for (size_t i = 0; i < m.data.size() / 2; i++)
            ((uint16_t *)m.data.data())[i] = h_bf16(rnd_n() * amp);
    }
    m.d.type = type;
    m.d.n = n;
    m.d.rows = rows;
    m.d.cols = cols;
    m.d.bits = m.bits;
    m.d.group = m.group;
    m.d.data = dev_upload(m.data);
    // the device layout of 4-bit weights (data stays in MLX order for at())
    if (m.bits == 4) OK(q4_repack((uint8_t *)m.d.data, m.data.size(), 0, ERR));
    CK(cudaDeviceSynchronize());
    m.d.row_stride = m.rs;
    m.d.mat_stride = m.ms;
    m.d.scales = m.bits ? dev_upload(m.scales) : nullptr;
    m.d.biases = m.bits ? dev_upload(m.biases) : nullptr;
    m.d.sb_row_stride = m.sbrs;
    m.d.sb_mat_stride = m.sbms;
    return m;
}

// Frees the device copies of a make_tmat matrix.
static inline void free_tmat(tmat &m) {
    for (const void *q :
         {(const void *)m.d.data, (const void *)m.d.scales, (const void *)m.d.biases})
        CK(cudaFree(const_cast<void *>(q)));
    m.d.data = m.d.scales = m.d.biases = nullptr;
}

static std::vector<uint16_t> rand_bf16(size_t n, float amp) {
    std::vector<uint16_t> v(n);
    for (auto &x : v) x = h_bf16(rnd_n() * amp);
    return v;
}

static double rel_l2(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        if (!(d == d)) return INFINITY; // NaN: an output was not written
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static int g_fail = 0;
static void report(const char *what, double err, double tol) {
    bool ok = err <= tol;
    printf("%-58s rel_l2 %.3e (tol %.1e) %s\n", what, err, tol, ok ? "ok" : "FAIL");
    if (!ok) g_fail = 1;
}

static inline float h_silu(float x) {
    return x / (1.f + expf(-x));
}

struct gpu_timer {
    cudaEvent_t a, b;
    gpu_timer() {
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
    }
    void start(cudaStream_t s) { CK(cudaEventRecord(a, s)); }
    float stop_ms(cudaStream_t s) {
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        return ms;
    }
};
