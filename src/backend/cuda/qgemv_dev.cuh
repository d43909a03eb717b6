// The int8-activation GEMV pieces (decode_qgemv.cu: batch-1 decode; gemm_small.cu: prefill chunks
// of a few tokens): the activation row quantized to two int8 planes per block of 32 values in
// shared memory (the format is described in decode_qgemv.cu), 16-byte weight chunks loaded in warp
// steps, and the dp4a dot products.
#pragma once
#include "backend/cuda/gemv_dev.cuh"

#define QG_THREADS       256
#define QG_WARPS         (QG_THREADS / 32)
#define QG_R             2 // rows per warp step (finish() takes two totals)
#define QG_U             2 // 16-byte chunks per lane per row per step
#define QG_CHUNKS        (QG_U * 32)
#define QG_BLOCKS_PER_SM 2 // blocks per SM (register budget: 128 per thread)

static __device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

static __device__ __forceinline__ uint32_t pack4(int a, int b, int c, int d) {
    return (uint32_t)(a & 0xff) | (uint32_t)(b & 0xff) << 8 | (uint32_t)(c & 0xff) << 16 |
           (uint32_t)(d & 0xff) << 24;
}

// The int8 activation in shared memory, per block of 32 values: for each plane (x1, x2) the lo/hi
// 16-byte halves in the byte order the format's dp4a pairs with the weight words, and meta =
// {d, sum, sum of the first 16, sum of the last 16} of the unquantized values. Each array is
// followed by 4 spare entries so lanes reading lo[b] and hi[b] together (8-bit) hit different
// banks.
struct qx_smem {
    uint4 *lo[2], *hi[2];
    float4 *meta;
};
static __host__ __device__ __forceinline__ size_t qx_bytes(int nb) {
    return (size_t)(4 * (nb + 4)) * sizeof(uint4) + (size_t)nb * sizeof(float4);
}
static __device__ __forceinline__ qx_smem qx_layout(void *smem, int nb) {
    qx_smem q;
    uint4 *p = reinterpret_cast<uint4 *>(smem);
    q.lo[0] = p, q.hi[0] = p + (nb + 4), q.lo[1] = p + 2 * (nb + 4), q.hi[1] = p + 3 * (nb + 4);
    q.meta = reinterpret_cast<float4 *>(p + 4 * (nb + 4));
    return q;
}

struct qx_src {
    const float *x; // or, for qx_build<BITS, true>, bf16 values (as uint16_t bits)
    int cols;
    const float *norm_w; // RMSNorm weight (fused), or
    const float *gn_w;   // gated RMSNorm per head of gn_dv values: x * r_head * gn_w * silu(gn_z)
    const float *gn_z;
    int gn_dv;
    float eps;
};

// Units of 8 values: thread t handles units t + QG_THREADS * i (i < QX_IT), so the 4 units of a
// block of 32 sit on 4 consecutive lanes and the block's max and sums are two shuffles away. x and
// gn_z are read with __ldcg: they were written by the previous kernels.
#define QX_IT 4 // cols <= 8 * QG_THREADS * QX_IT

static __device__ __forceinline__ void ld8(float (&v)[8], const float *p, bool cg) {
    const float4 a = cg ? __ldcg(reinterpret_cast<const float4 *>(p))
                        : __ldg(reinterpret_cast<const float4 *>(p));
    const float4 b = cg ? __ldcg(reinterpret_cast<const float4 *>(p) + 1)
                        : __ldg(reinterpret_cast<const float4 *>(p) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// The norm weights of this thread's units: constant, so loaded before the programmatic-launch wait.
// IT < QX_IT: for inputs of at most 8 * QG_THREADS * IT values (fewer registers).
template <int IT> struct qx_wn { float w[IT][8]; };
using qx_w = qx_wn<QX_IT>;
template <int IT>
static __device__ __forceinline__ void qx_prefetch(const qx_src &in, qx_wn<IT> &nw) {
    const int nu = in.cols >> 3, t = threadIdx.x;
#pragma unroll
    for (int i = 0; i < IT; i++) {
        if (i * QG_THREADS >= nu) break; // the same in the whole block
        const int u = t + i * QG_THREADS;
        if (u < nu && in.norm_w) ld8(nw.w[i], in.norm_w + 8 * u, false);
        if (u < nu && in.gn_w) ld8(nw.w[i], in.gn_w + (8 * u) % in.gn_dv, false);
    }
}

// Quantizes unit u (8 values) of an activation of nu units into q. The four units of a block of 32
// sit on the lanes of one quad, and all four lanes call this (the block's max and sums are quad
// shuffles); a lane with u >= nu only takes part in the shuffles.
template <int BITS>
static __device__ __forceinline__ void qx_quant_unit(const float (&v)[8], int u, int nu,
                                                     const qx_smem &q) {
    float amax = 0.f, sum = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) amax = fmaxf(amax, fabsf(v[j])), sum += v[j];
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const float half = sum + __shfl_xor_sync(0xffffffffu, sum, 1); // values 0-15 or 16-31
    const float other = __shfl_xor_sync(0xffffffffu, half, 2);
    if (u >= nu) return;
    const float inv = amax > 0.f ? 127.f / amax : 0.f, d = amax / 127.f;
    int x[2][8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        x[0][j] = __float2int_rn(v[j] * inv);
        // |x2| <= 127 up to rounding; clamped so an int8 can never wrap
        const int x2 = __float2int_rn(fmaf(-d, (float)x[0][j], v[j]) * (254.f * inv));
        x[1][j] = max(-127, min(127, x2));
    }
    const int blk = u >> 2, k = u & 3;
#pragma unroll
    for (int pl = 0; pl < 2; pl++) {
        const int *y = x[pl];
        if constexpr (BITS == 4) {
            // weight word t of a chunk (device layout, common.cuh) holds values 8m + 2t + e at
            // nibble m + 4e: lo pairs with the low nibbles of its bytes, values (2t, 16 + 2t,
            // 2t + 1, 17 + 2t), hi with the high ones, (8 + 2t, 24 + 2t, 9 + 2t, 25 + 2t). So
            // value 2t + e of unit k (m = k) is byte (k >> 1) + 2e of word t of lo (k even) or
            // hi (k odd): byte stores, no exchange between the lanes of a block
            uint8_t *o =
                reinterpret_cast<uint8_t *>((k & 1 ? q.hi[pl] : q.lo[pl]) + blk) + (k >> 1);
#pragma unroll
            for (int j = 0; j < 8; j++) o[4 * (j >> 1) + 2 * (j & 1)] = (uint8_t)y[j];
        } else {
            // lo holds values 0-15 (units 0, 1), hi values 16-31 (units 2, 3), in order
            uint32_t *h = reinterpret_cast<uint32_t *>((k < 2 ? q.lo[pl] : q.hi[pl]) + blk);
            h[(k & 1) * 2] = pack4(y[0], y[1], y[2], y[3]);
            h[(k & 1) * 2 + 1] = pack4(y[4], y[5], y[6], y[7]);
        }
    }
    if (k == 0) q.meta[blk] = make_float4(d, half + other, half, other);
}

// XB: in.x points to bf16 values (prefill activations), else to floats.
template <int BITS, bool XB = false, int IT = QX_IT>
static __device__ void qx_build(const qx_src &in, const qx_wn<IT> &nw, const qx_smem &q,
                                float *red) {
    const int nu = in.cols >> 3, t = threadIdx.x;
    float v[IT][8];
    float ss[IT];
    // the iterations no thread of the block has a unit in are skipped by a uniform branch (the
    // compiler would otherwise run them predicated, shuffles included)
#pragma unroll
    for (int i = 0; i < IT; i++) {
        const int u = t + i * QG_THREADS;
        ss[i] = 0.f;
        if (i * QG_THREADS >= nu) continue;
        if (u < nu) {
            if constexpr (XB) {
                const uint4 b = __ldcg(reinterpret_cast<const uint4 *>(
                    reinterpret_cast<const uint16_t *>(in.x) + 8 * u));
                const uint32_t w[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    v[i][2 * j] = __uint_as_float(w[j] << 16);
                    v[i][2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
                }
            } else {
                ld8(v[i], in.x + 8 * u, true);
            }
#pragma unroll
            for (int j = 0; j < 8; j++) ss[i] += v[i][j] * v[i][j];
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) v[i][j] = 0.f;
        }
    }
    if (in.norm_w) {
        float tot = 0.f;
#pragma unroll
        for (int i = 0; i < IT; i++) tot += ss[i];
        const float scale = rsqrtf(block_sum(tot, red) / (float)in.cols + in.eps);
#pragma unroll
        for (int i = 0; i < IT; i++) {
            if (i * QG_THREADS >= nu) break;
            const int u = t + i * QG_THREADS;
            if (u >= nu) continue;
#pragma unroll
            for (int j = 0; j < 8; j++) v[i][j] *= scale * nw.w[i][j];
        }
    } else if (in.gn_w) {
        // a head is gn_dv / 8 consecutive lanes (a power of two <= 32, checked by the launcher)
#pragma unroll
        for (int i = 0; i < IT; i++) {
            if (i * QG_THREADS >= nu) break;
            float hs = ss[i];
            for (int o = 1; o < in.gn_dv >> 3; o <<= 1) hs += __shfl_xor_sync(0xffffffffu, hs, o);
            const int u = t + i * QG_THREADS;
            if (u >= nu) continue;
            const float r = rsqrtf(hs / (float)in.gn_dv + in.eps);
            float z[8];
            ld8(z, in.gn_z + 8 * u, true);
#pragma unroll
            for (int j = 0; j < 8; j++) v[i][j] *= r * nw.w[i][j] * silu_f(z[j]);
        }
    }
#pragma unroll
    for (int i = 0; i < IT; i++) {
        if (i * QG_THREADS >= nu) break;
        const int u = t + i * QG_THREADS; // nu is a multiple of 4: a quad is all in or all out
        qx_quant_unit<BITS>(v[i], u, nu, q);
    }
    __syncthreads();
}

// The weights of one warp step: QG_U chunks of QG_R rows per lane with their scales and biases.
struct qstage {
    uint4 w[QG_R][QG_U];
    uint16_t s[QG_R][QG_U], b[QG_R][QG_U];
};

// The weights stream through the L2 once per token: loaded as first to be evicted (l2_stream), so
// they do not push out what is read again soon, the kernels' code above all.
static __device__ __forceinline__ uint4 ld_stream16(const void *a, uint64_t pol) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(a), "l"(pol));
    return v;
}
static __device__ __forceinline__ uint16_t ld_stream2(const void *a, uint64_t pol) {
    uint16_t v;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.u16 %0, [%1], %2;"
        : "=h"(v)
        : "l"(a), "l"(pol));
    return v;
}
static __device__ __forceinline__ void qload(qstage &S, int i, int u, const uint8_t *w,
                                             const uint8_t *sc, const uint8_t *bi, bool ok) {
    if (ok) {
        const uint64_t pol = l2_stream();
        S.w[i][u] = ld_stream16(w, pol);
        S.s[i][u] = ld_stream2(sc, pol);
        S.b[i][u] = ld_stream2(bi, pol);
    } else {
        S.w[i][u] = make_uint4(0, 0, 0, 0);
        S.s[i][u] = S.b[i][u] = 0;
    }
}

// acc + one 16-byte chunk of 4-bit weights (device layout) dotted with one int8 plane of a block
// (xl, xh: its lo and hi words, qx_smem).
static __device__ __forceinline__ int q4_dot(const uint32_t *w, const uint32_t *xl,
                                             const uint32_t *xh, int acc) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        acc = __dp4a((int)(w[k] & 0x0F0F0F0Fu), (int)xl[k], acc);
        acc = __dp4a((int)((w[k] >> 4) & 0x0F0F0F0Fu), (int)xh[k], acc);
    }
    return acc;
}
// The integer dot products of both planes (x ~= d (x1 + x2 / 254)) as one value.
static __device__ __forceinline__ float qx_dot(float d, const int (&is)[2]) {
    return d * fmaf((float)is[1], 1.f / 254.f, (float)is[0]);
}

// The dot products of one step: for chunk c = it * QG_CHUNKS + 32 u + lane of row i, term(i, u,
// s, dot, b, xs) gets its scale s, its integer dot product times the block's d, its bias b and the
// block's sum xs; row i's dot product gains fmaf(s, dot, fmaf(b, xs, acc)) per chunk (qdot).
template <int BITS, class Term>
static __device__ __forceinline__ void qstep(const qstage &S, const qx_smem &q, int it, int C,
                                             Term term) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < QG_U; u++) {
        const int c = it * QG_CHUNKS + u * 32 + lane;
        if (c >= C) continue;
        uint4 xa[2], xb[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
        float d, xs;
        if constexpr (BITS == 4) {
#pragma unroll
            for (int pl = 0; pl < 2; pl++) xa[pl] = q.lo[pl][c], xb[pl] = q.hi[pl][c];
            float4 m = q.meta[c];
            d = m.x, xs = m.y;
        } else {
#pragma unroll
            for (int pl = 0; pl < 2; pl++) xa[pl] = (c & 1) ? q.hi[pl][c >> 1] : q.lo[pl][c >> 1];
            float4 m = q.meta[c >> 1];
            d = m.x, xs = (c & 1) ? m.w : m.z;
        }
#pragma unroll
        for (int i = 0; i < QG_R; i++) {
            const uint32_t *w = &S.w[i][u].x;
            int is[2] = {0, 0};
#pragma unroll
            for (int pl = 0; pl < 2; pl++) {
                const uint32_t *xl = &xa[pl].x, *xh = &xb[pl].x;
                if constexpr (BITS == 4) {
                    is[pl] = q4_dot(w, xl, xh, is[pl]);
                } else {
#pragma unroll
                    for (int k = 0; k < 4; k++) is[pl] = dp4a_us(w[k], xl[k], is[pl]);
                }
            }
            const float dot = qx_dot(d, is);
            term(i, u, bf16_bits_to_f32(S.s[i][u]), dot, bf16_bits_to_f32(S.b[i][u]), xs);
        }
    }
}

// acc[i] += the step's part of row i's dot product.
template <int BITS>
static __device__ __forceinline__ void qdot(const qstage &S, const qx_smem &q, int it, int C,
                                            float (&acc)[QG_R]) {
    qstep<BITS>(S, q, it, C, [&](int i, int, float s, float dot, float b, float xs) {
        acc[i] = fmaf(s, dot, fmaf(b, xs, acc[i]));
    });
}

// A step's terms, kept so that another warp than the one that computed them can add them (qchain
// adds them as qdot would: the same bits). The split GEMV kernel hands them between warps.
struct qterms {
    float s[QG_R][QG_U], dot[QG_R][QG_U], b[QG_R][QG_U], xs[QG_U];
};
template <int BITS>
static __device__ __forceinline__ void qterm(const qstage &S, const qx_smem &q, int it, int C,
                                             qterms &T) {
    qstep<BITS>(S, q, it, C, [&](int i, int u, float s, float dot, float b, float xs) {
        T.s[i][u] = s, T.dot[i][u] = dot, T.b[i][u] = b, T.xs[u] = xs;
    });
}
static __device__ __forceinline__ void qchain(const qterms &T, int it, int C, float (&acc)[QG_R]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < QG_U; u++) {
        if (it * QG_CHUNKS + u * 32 + lane >= C) continue;
#pragma unroll
        for (int i = 0; i < QG_R; i++)
            acc[i] = fmaf(T.s[i][u], T.dot[i][u], fmaf(T.b[i][u], T.xs[u], acc[i]));
    }
}

static __device__ __forceinline__ void warp_sum_rows(float (&acc)[QG_R]) {
#pragma unroll
    for (int i = 0; i < QG_R; i++)
#pragma unroll
        for (int o = 16; o; o >>= 1) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
}
