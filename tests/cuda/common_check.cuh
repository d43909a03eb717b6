// Helpers of the decode kernel checks: random matrices in the MLX/bf16 layouts with a host copy of
// their dequantized values, device buffers, comparisons, and a pass/fail tally.
#pragma once
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "backend/cuda/decode.cuh"

extern "C" {
#include "util/util.h"
}

static int g_fail = 0, g_pass = 0;

#define DIE_IF(cond, ...)                                                                          \
    do {                                                                                           \
        if (cond) {                                                                                \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)
#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t rc_ = (call);                                                                  \
        DIE_IF(rc_ != cudaSuccess, "%s:%d: %s: %s", __FILE__, __LINE__, #call,                     \
               cudaGetErrorString(rc_));                                                           \
    } while (0)
#define WK(call)                                                                                   \
    do {                                                                                           \
        struct wren_err err_;                                                                      \
        DIE_IF((call) != 0, "%s:%d: %s", __FILE__, __LINE__, err_.msg);                            \
    } while (0)

static uint64_t g_rng = 0x1234567887654321ull;
static inline uint32_t rnd_u32(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}
static inline float rnd_f(float lo, float hi) {
    return lo + (hi - lo) * (rnd_u32() & 0xFFFFFF) / 16777216.f;
}
static inline float bfr(float x) {
    return bf16_to_f32(f32_to_bf16(x));
} // round through bf16

template <typename T> static T *dev_copy(const std::vector<T> &h) {
    T *d;
    CK(cudaMalloc(&d, h.size() * sizeof(T) + 16));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
template <typename T> static std::vector<T> host_copy(const T *d, size_t n) {
    std::vector<T> h(n);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}
// A device buffer of n floats filled with NaN, so unwritten outputs are caught.
static float *dev_poison(size_t n) {
    std::vector<float> h(n, NAN);
    return dev_copy(h);
}

// A random stack of n matrices [rows][cols], bits 4/8 (MLX affine, group) or 16 (bf16); host keeps
// the dequantized values in w[(i*rows + r)*cols + c].
struct tmat {
    struct dmat d;
    std::vector<float> w;
    std::vector<float> gb; // quantized: bias of each group [(i*rows + r)*(cols/group) + g]
};

static struct tmat make_mat(int n, int rows, int cols, int bits, int group) {
    struct tmat t;
    memset(&t.d, 0, sizeof t.d);
    t.d.type = bits == 16 ? WT_BF16 : bits == 8 ? WT_Q8 : WT_Q4;
    t.d.n = n, t.d.rows = rows, t.d.cols = cols, t.d.bits = bits == 16 ? 0 : bits,
    t.d.group = group;
    t.w.resize((size_t)n * rows * cols);
    t.d.row_stride = (size_t)cols * bits / 8;
    t.d.mat_stride = t.d.row_stride * rows;
    std::vector<uint8_t> data(t.d.mat_stride * n);
    if (bits == 16) {
        uint16_t *p = (uint16_t *)data.data();
        for (size_t i = 0; i < t.w.size(); i++) {
            float v = rnd_f(-0.1f, 0.1f);
            p[i] = f32_to_bf16(v);
            t.w[i] = bf16_to_f32(p[i]);
        }
    } else {
        int ng = cols / group;
        t.d.sb_row_stride = (size_t)ng * 2;
        t.d.sb_mat_stride = t.d.sb_row_stride * rows;
        std::vector<uint16_t> sc((size_t)n * rows * ng), bi((size_t)n * rows * ng);
        uint32_t *words = (uint32_t *)data.data();
        memset(words, 0, data.size());
        int per = 32 / bits;
        for (size_t r = 0; r < (size_t)n * rows; r++) {
            for (int g = 0; g < ng; g++) {
                sc[r * ng + g] = f32_to_bf16(rnd_f(0.002f, 0.02f) * (bits == 4 ? 1.f : 1.f / 16));
                bi[r * ng + g] = f32_to_bf16(rnd_f(-0.08f, 0.08f));
            }
            for (int c = 0; c < cols; c++) {
                uint32_t q = rnd_u32() & ((1u << bits) - 1);
                words[r * (cols / per) + c / per] |= q << (bits * (c % per));
                t.w[r * cols + c] = bf16_to_f32(sc[r * ng + c / group]) * (float)q +
                                    bf16_to_f32(bi[r * ng + c / group]);
            }
        }
        t.gb.resize(bi.size());
        for (size_t i = 0; i < bi.size(); i++) t.gb[i] = bf16_to_f32(bi[i]);
        t.d.scales = (const uint8_t *)dev_copy(sc);
        t.d.biases = (const uint8_t *)dev_copy(bi);
    }
    t.d.data = dev_copy(data);
    // the device layout of 4-bit weights (the host copy above stays in MLX order for w)
    if (bits == 4) WK(q4_repack((uint8_t *)t.d.data, data.size(), 0, &err_));
    CK(cudaDeviceSynchronize());
    return t;
}

// Host reference: y[r] = W_i[r] . x (double accumulation).
static float ref_dot(const struct tmat &m, int i, int r, const float *x) {
    const float *w = m.w.data() + ((size_t)i * m.d.rows + r) * m.d.cols;
    double s = 0;
    for (int c = 0; c < m.d.cols; c++) s += (double)w[c] * x[c];
    return (float)s;
}

// The decode GEMV of 4/8-bit weights quantizes its input per block of 32 values (from column 0)
// to two int8 planes: x ~= d (x1 + x2 / 254), d = max|x| / 127 (decode_qgemv.cu). qx_err gives
// the representation error per value, computed as the kernel does.
static std::vector<float> qx_err(const float *x, size_t n) {
    std::vector<float> e(n, 0.f);
    for (size_t b = 0; b < n; b += 32) {
        float amax = 0.f;
        for (size_t j = b; j < b + 32 && j < n; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float inv = amax > 0.f ? 127.f / amax : 0.f, d = amax / 127.f;
        for (size_t j = b; j < b + 32 && j < n; j++) {
            float x1 = rintf(x[j] * inv), x2 = rintf(fmaf(-d, x1, x[j]) * (254.f * inv));
            e[j] = fabsf(x[j] - d * (x1 + x2 / 254.f));
        }
    }
    return e;
}
// Bound of the error that quantization causes in row r of matrix i dotted with x (err: qx_err of
// x): sum_c |s q_c| err_c, where s q_c = w_c - bias. Zero for bf16 matrices (f32 path).
static double qx_bound(const struct tmat &m, int i, int r, const float *err) {
    if (m.gb.empty()) return 0.0;
    const int cols = m.d.cols, ng = cols / m.d.group;
    const float *w = m.w.data() + ((size_t)i * m.d.rows + r) * cols;
    const float *gb = m.gb.data() + ((size_t)i * m.d.rows + r) * ng;
    double s = 0;
    for (int c = 0; c < cols; c++) s += fabs((double)w[c] - gb[c / m.d.group]) * err[c];
    return s;
}

static std::vector<float> rnd_vec(size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (auto &x : v) x = rnd_f(lo, hi);
    return v;
}

// Compares got vs want: max |d| <= atol + rtol*|want| elementwise, and no NaN.
static bool check_close(const char *what, const float *got, const float *want, size_t n, float atol,
                        float rtol) {
    size_t bad = 0, first = 0;
    double maxerr = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(got[i] - want[i]);
        if (!(d <= atol + rtol * fabsf(want[i]))) {
            if (!bad) first = i;
            bad++;
        }
        if (d > maxerr || d != d) maxerr = d != d ? INFINITY : d;
    }
    if (bad) {
        printf("FAIL %-48s %zu/%zu bad (first %zu: got %g want %g), max err %.3g\n", what, bad, n,
               first, got[first], want[first], maxerr);
        g_fail++;
        return false;
    }
    printf("ok   %-48s n=%zu max err %.3g\n", what, n, maxerr);
    g_pass++;
    return true;
}

// check_close with a per-element allowance (the int8-activation bound) on top of atol + rtol.
static bool check_close_b(const char *what, const float *got, const float *want,
                          const std::vector<double> &bound, float atol, float rtol) {
    size_t n = bound.size(), bad = 0, first = 0;
    double maxerr = 0, maxratio = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]), lim = atol + rtol * fabs(want[i]) + bound[i];
        if (!(d <= lim)) {
            if (!bad) first = i;
            bad++;
        }
        if (d > maxerr || d != d) maxerr = d != d ? INFINITY : d;
        if (d / lim > maxratio) maxratio = d / lim;
    }
    if (bad) {
        printf("FAIL %-48s %zu/%zu bad (first %zu: got %g want %g, allowed %g), max err %.3g\n",
               what, bad, n, first, got[first], want[first],
               atol + rtol * fabs(want[first]) + bound[first], maxerr);
        g_fail++;
        return false;
    }
    printf("ok   %-48s n=%zu max err %.3g (%.2f of allowed)\n", what, n, maxerr, maxratio);
    g_pass++;
    return true;
}

static bool check_true(const char *what, bool ok) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    ok ? g_pass++ : g_fail++;
    return ok;
}

static void init_device(void) {
    // wrencore precedes wrencuda on the link line: reference the error helpers the kernels'
    // launchers use so the linker pulls them in
    struct wren_err e;
    wren_errf(&e, "link");
    wren_err_prefix(&e, "link");
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    struct decode_config dc;
    dc.sm_count = p.multiProcessorCount;
    dc.smem_optin = p.sharedMemPerBlockOptin;
    dc.pdl = p.major >= 9;
    const char *f = getenv("WREN_CUDA_DECODE"); // as the backend: "f32gemv" checks the f32 kernels
    dc.f32_gemv = f && strstr(f, "f32gemv");
    dc.dn_slices = false;
    dc.cc_major = p.major;
    dc.no_stream = f && strstr(f, "nostream");
    dc.no_split = f && strstr(f, "nosplit");
    dc.fuse_moe = true; // checked wherever it qualifies (check_decode_moe); off by default in wren
    decode_configure(&dc);
}

static int finish(const char *name) {
    printf("%s: %d passed, %d failed\n", name, g_pass, g_fail);
    return g_fail ? 1 : 0;
}
