// Causal flash attention for a prefill chunk on tensor cores (mma.sync m16n8k16 bf16), head_dim
// 256, GQA: a block takes 128 (or 64) queries of one head (8 or 4 warps x 16 rows) and streams the
// KV cache rows [0, pos + last query] in tiles of 64 keys (32 where the device's shared memory per
// block is smaller, as on consumer GPUs; cp.async, double-buffered), with the online softmax in
// registers. The chunk's own K/V are written into the cache first (attn_prep), so
// earlier chunks and this one are read the same way. The output gate sigmoid is applied in the
// epilogue.
#include "backend/cuda/mma.cuh"
#include "backend/cuda/kv_int8.cuh"
#include "backend/cuda/prefill.cuh"

namespace {

constexpr int HD = 256;
constexpr int CH = HD / 8; // 16-byte chunks per row

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
// Element offset of chunk c of row r in a [rows][HD] tile; XOR swizzle within groups of 8 chunks.
__device__ __forceinline__ int fswz(int r, int c) {
    return r * HD + ((c ^ (r & 7)) << 3);
}

// q/k RMSNorm + partial rotate-half RoPE; q -> qb [nh][T][hd] bf16, k/v -> caches.
// Block per (token, head slot): slots [0, nh) q heads, [nh, nh + nkv) k heads, then v heads.
__global__ void attn_prep_kernel(const attn_dims d, const float *q, const float *k, const float *v,
                                 const float *q_norm, const float *k_norm, bf16 *qb, void *kc,
                                 void *vc) {
    extern __shared__ float xs[];
    __shared__ float red[32];
    const int t = blockIdx.x, slot = blockIdx.y, hd = d.hd;
    const float *src;
    const float *w = nullptr;
    if (slot < d.nh) {
        src = q + (size_t)t * d.nh * hd * (d.gate ? 2 : 1) + (size_t)slot * hd * (d.gate ? 2 : 1);
        w = q_norm;
    } else if (slot < d.nh + d.nkv) {
        src = k + (size_t)t * d.nkv * hd + (size_t)(slot - d.nh) * hd;
        w = k_norm;
    } else {
        src = v + (size_t)t * d.nkv * hd + (size_t)(slot - d.nh - d.nkv) * hd;
    }
    float ss = 0.f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        xs[i] = src[i];
        ss += xs[i] * xs[i];
    }
    if (w) {
        for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(~0u, ss, o);
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
        __syncthreads();
        if (threadIdx.x == 0) {
            float tot = 0.f;
            for (int i = 0; i < (int)(blockDim.x >> 5); i++) tot += red[i];
            red[0] = rsqrtf(tot / hd + d.eps);
        }
        __syncthreads();
        const float r = red[0];
        for (int i = threadIdx.x; i < hd; i += blockDim.x) xs[i] *= r * w[i];
        __syncthreads();
        const int half = d.rope_dim / 2, p = d.pos + t;
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            // angle in double: positions reach 1e5+ and the fastest frequency is 1 rad/token
            double inv = pow((double)d.theta, -2.0 * i / d.rope_dim);
            double sn, cs;
            sincos((double)p * inv, &sn, &cs);
            float x1 = xs[i], x2 = xs[i + half];
            xs[i] = x1 * (float)cs - x2 * (float)sn;
            xs[i + half] = x2 * (float)cs + x1 * (float)sn;
        }
    }
    __syncthreads();
    if (slot < d.nh) {
        bf16 *dst = qb + ((size_t)slot * d.T + t) * hd;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) dst[i] = __float2bfloat16(xs[i]);
        return;
    }
    const bool isk = slot < d.nh + d.nkv;
    const int h = isk ? slot - d.nh : slot - d.nh - d.nkv;
    unsigned char *cache = reinterpret_cast<unsigned char *>(isk ? kc : vc);
    if (!d.kv_int8) {
        bf16 *dst = reinterpret_cast<bf16 *>(cache) + ((size_t)(d.pos + t) * d.nkv + h) * hd;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) dst[i] = __float2bfloat16(xs[i]);
        return;
    }
    // int8 row (kv_int8.cuh): a warp per group takes its max |x| into red (free: read before the
    // last barrier)
    const int ng = hd / KV_INT8_GROUP, lane = threadIdx.x & 31;
    for (int g = threadIdx.x >> 5; g < ng; g += blockDim.x >> 5) {
        float a = 0.f;
        for (int i = lane; i < KV_INT8_GROUP; i += 32)
            a = fmaxf(a, fabsf(xs[g * KV_INT8_GROUP + i]));
        for (int o = 16; o; o >>= 1) a = fmaxf(a, __shfl_xor_sync(~0u, a, o));
        if (lane == 0) red[g] = a;
    }
    __syncthreads();
    unsigned char *row = cache + (size_t)(d.pos + t) * d.kv_row;
    for (int i = threadIdx.x; i < hd; i += blockDim.x)
        row[(size_t)h * hd + i] = kv_int8_code(xs[i], kv_int8_inv(red[i / KV_INT8_GROUP]));
    if ((int)threadIdx.x < ng)
        kv_int8_scales(row, d.nkv, hd)[h * ng + threadIdx.x] = kv_int8_scale(red[threadIdx.x]);
}

// int8 cache rows [0, rows) -> bf16 [rows][nkv][hd] (K into kd, V into vd; blockIdx.y: which),
// 8 values per thread.
__global__ void kv_dequant_kernel(const attn_dims d, int rows, const unsigned char *kc,
                                  const unsigned char *vc, bf16 *kd, bf16 *vd) {
    const size_t n = (size_t)rows * d.nkv * (d.hd / 8);
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int per_row = d.nkv * (d.hd / 8);
    const size_t r = i / per_row;
    const int h = (int)(i % per_row) / (d.hd / 8), c = (int)(i % per_row) % (d.hd / 8);
    const unsigned char *row = (blockIdx.y ? vc : kc) + r * d.kv_row;
    const float sc = reinterpret_cast<const float *>(
        row + (size_t)d.nkv * d.hd)[(h * d.hd + c * 8) / KV_INT8_GROUP];
    const uint2 q = *reinterpret_cast<const uint2 *>(row + (size_t)h * d.hd + c * 8);
    const uint32_t w[2] = {q.x, q.y};
    uint32_t out[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint32_t x = w[k >> 1] >> (16 * (k & 1));
        out[k] = pack_bf16((float)((int)(x & 0xFF) - 128) * sc,
                           (float)((int)((x >> 8) & 0xFF) - 128) * sc);
    }
    bf16 *dst = (blockIdx.y ? vd : kd) + ((r * d.nkv + h) * d.hd + c * 8);
    *reinterpret_cast<uint4 *>(dst) = make_uint4(out[0], out[1], out[2], out[3]);
}

// NW warps of 16 queries each: 8 (128 queries) amortise each K/V tile over twice the queries and
// keep two warps per scheduler; 4 for short chunks. BKV keys per K/V tile.
template <int NW, int BKV>
__global__ void __launch_bounds__(NW * 32)
    flash_kernel(const attn_dims d, const bf16 *qb, const bf16 *kc, const bf16 *vc,
                 const float *qraw, bf16 *out) {
    constexpr int BQ = NW * 16, FA_THREADS = NW * 32;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *Qs = reinterpret_cast<bf16 *>(smem_raw);
    bf16 *Ks = Qs + BQ * HD;      // 2 stages
    bf16 *Vs = Ks + 2 * BKV * HD; // 2 stages
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // heavy (late) query tiles first
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y;
    const int q0 = qt * BQ, kvh = h / (d.nh / d.nkv);
    const size_t kv_stride = (size_t)d.nkv * HD;
    const int q_last = min(q0 + BQ, d.T) - 1;
    const int n_keys = d.pos + q_last + 1;
    const int n_kt = (n_keys + BKV - 1) / BKV;

    const bf16 *qsrc = qb + ((size_t)h * d.T) * HD;
    for (int i = tid; i < BQ * CH; i += FA_THREADS) {
        int r = i / CH, c = i % CH;
        bool ok = q0 + r < d.T;
        cp_async16(Qs + fswz(r, c), qsrc + (size_t)(ok ? q0 + r : 0) * HD + c * 8, ok);
    }
    auto load_kv = [&](int kt) {
        const int stg = kt & 1;
        for (int i = tid; i < BKV * CH; i += FA_THREADS) {
            int r = i / CH, c = i % CH, key = kt * BKV + r;
            bool ok = key < n_keys;
            size_t off = (size_t)(ok ? key : 0) * kv_stride + (size_t)kvh * HD + c * 8;
            cp_async16(Ks + stg * BKV * HD + fswz(r, c), kc + off, ok);
            cp_async16(Vs + stg * BKV * HD + fswz(r, c), vc + off, ok);
        }
    };
    load_kv(0);
    cp_async_commit();

    float o[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const float sl2 = rsqrtf((float)HD) * 1.4426950408889634f;
    const int qpos0 = d.pos + q0 + warp * 16 + (lane >> 2); // row of c0/c1; +8 for c2/c3

    for (int kt = 0; kt < n_kt; kt++) {
        if (kt + 1 < n_kt) load_kv(kt + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bf16 *kt_s = Ks + (kt & 1) * BKV * HD, *vt_s = Vs + (kt & 1) * BKV * HD;

        float s[BKV / 8][4];
#pragma unroll
        for (int i = 0; i < BKV / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++) {
            uint32_t a[4];
            ldmatrix_x4(a, Qs + fswz(warp * 16 + (lane & 15), ks * 2 + (lane >> 4)));
#pragma unroll
            for (int np = 0; np < BKV / 16; np++) {
                uint32_t b[4];
                ldmatrix_x4(b, kt_s + fswz(np * 16 + (lane & 7) + ((lane >> 4) << 3),
                                           ks * 2 + ((lane >> 3) & 1)));
                mma_bf16(s[2 * np], a, b[0], b[1]);
                mma_bf16(s[2 * np + 1], a, b[2], b[3]);
            }
        }
        // causal mask (also hides keys past n_keys) and online softmax, base 2
        const int kbase = kt * BKV;
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nt = 0; nt < BKV / 8; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int key = kbase + nt * 8 + (lane & 3) * 2 + (c & 1);
                int qp = qpos0 + (c >> 1) * 8;
                float x = key <= qp ? s[nt][c] * sl2 : -INFINITY;
                s[nt][c] = x;
                mx[c >> 1] = fmaxf(mx[c >> 1], x);
            }
        float alpha[2], rs[2] = {0.f, 0.f};
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(~0u, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(~0u, mx[r], 2));
            alpha[r] = mx[r] == -INFINITY ? 1.f : exp2f(m[r] - mx[r]);
            m[r] = mx[r];
        }
        uint32_t pa[BKV / 16][4];
#pragma unroll
        for (int nt = 0; nt < BKV / 8; nt++) {
            float p[4];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                p[c] = m[c >> 1] == -INFINITY ? 0.f : exp2f(s[nt][c] - m[c >> 1]);
                rs[c >> 1] += p[c];
            }
            pa[nt >> 1][(nt & 1) * 2] = pack_bf16(p[0], p[1]);
            pa[nt >> 1][(nt & 1) * 2 + 1] = pack_bf16(p[2], p[3]);
        }
#pragma unroll
        for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + rs[r];
#pragma unroll
        for (int i = 0; i < HD / 8; i++) {
            o[i][0] *= alpha[0];
            o[i][1] *= alpha[0];
            o[i][2] *= alpha[1];
            o[i][3] *= alpha[1];
        }
#pragma unroll
        for (int ks = 0; ks < BKV / 16; ks++) {
#pragma unroll
            for (int np = 0; np < HD / 16; np++) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, vt_s + fswz(ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                 np * 2 + (lane >> 4)));
                mma_bf16(o[2 * np], pa[ks], b[0], b[1]);
                mma_bf16(o[2 * np + 1], pa[ks], b[2], b[3]);
            }
        }
        __syncthreads(); // stage kt&1 is reloaded by the next iteration
    }

    // finish: quad-reduce l, normalise, gate, store bf16
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(~0u, l[r], 1);
        l[r] += __shfl_xor_sync(~0u, l[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int t = q0 + warp * 16 + (lane >> 2) + r * 8;
        if (t >= d.T) continue;
        const float inv = 1.f / l[r];
        const float *g =
            d.gate ? qraw + (size_t)t * d.nh * HD * 2 + (size_t)h * HD * 2 + HD : nullptr;
        bf16 *dst = out + (size_t)t * d.nh * HD + (size_t)h * HD;
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++) {
            const int c = nt * 8 + (lane & 3) * 2;
            float v0 = o[nt][r * 2] * inv, v1 = o[nt][r * 2 + 1] * inv;
            if (g) {
                v0 *= 1.f / (1.f + __expf(-g[c]));
                v1 *= 1.f / (1.f + __expf(-g[c + 1]));
            }
            *reinterpret_cast<__nv_bfloat162 *>(dst + c) = __floats2bfloat162_rn(v0, v1);
        }
    }
}

template <int NW, int BKV> constexpr int flash_smem() {
    return (NW * 16 * HD + 4 * BKV * HD) * (int)sizeof(bf16); // Q, then K and V in 2 stages
}

template <int NW, int BKV>
int launch(cudaStream_t s, const struct attn_dims *d, const bf16 *qb, const uint16_t *k_cache,
           const uint16_t *v_cache, const float *q, bf16 *out, struct wren_err *e) {
    constexpr int BQ = NW * 16, smem = flash_smem<NW, BKV>();
    static bool attr_set = false;
    if (!attr_set) {
        CUDA_CHECK(cudaFuncSetAttribute(flash_kernel<NW, BKV>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        attr_set = true;
    }
    dim3 grid((d->T + BQ - 1) / BQ, d->nh);
    flash_kernel<NW, BKV>
        <<<grid, NW * 32, smem, s>>>(*d, qb, reinterpret_cast<const bf16 *>(k_cache),
                                     reinterpret_cast<const bf16 *>(v_cache), q, out);
    CUDA_CHECK_LAUNCH();
    return 0;
}

} // namespace

int pf_attn_prep(cudaStream_t s, const struct attn_dims *d, const float *q, const float *k,
                 const float *v, const float *q_norm, const float *k_norm, bf16 *qb, void *k_cache,
                 void *v_cache, struct wren_err *e) {
    if (d->rope_dim % 2 || d->rope_dim > d->hd)
        return wren_errf(e, "attention: rope dim %d not supported", d->rope_dim);
    dim3 grid(d->T, d->nh + 2 * d->nkv);
    attn_prep_kernel<<<grid, 128, d->hd * sizeof(float), s>>>(*d, q, k, v, q_norm, k_norm, qb,
                                                              k_cache, v_cache);
    CUDA_CHECK_LAUNCH();
    return 0;
}

int pf_kv_dequant(cudaStream_t s, const struct attn_dims *d, int rows, const void *k_cache,
                  const void *v_cache, bf16 *kd, bf16 *vd, struct wren_err *e) {
    if (!d->kv_int8 || d->hd % KV_INT8_GROUP)
        return wren_errf(e, "attention: no int8 cache to dequantize");
    const size_t n = (size_t)rows * d->nkv * (d->hd / 8);
    if (n == 0) return 0;
    dim3 grid((unsigned)((n + 255) / 256), 2);
    kv_dequant_kernel<<<grid, 256, 0, s>>>(*d, rows, (const unsigned char *)k_cache,
                                           (const unsigned char *)v_cache, kd, vd);
    CUDA_CHECK_LAUNCH();
    return 0;
}

int pf_flash_attn(cudaStream_t s, const struct attn_dims *d, const bf16 *qb,
                  const uint16_t *k_cache, const uint16_t *v_cache, const float *q, bf16 *out,
                  size_t smem_optin, struct wren_err *e) {
    if (d->hd != HD || d->nh % d->nkv)
        return wren_errf(e,
                         "attention: head dim %d / heads %d:%d not supported by the prefill "
                         "kernel (head dim 256, whole GQA groups)",
                         d->hd, d->nh, d->nkv);
    // the largest block that fits: 128 queries for long chunks, 64-key tiles (H100/H200: 192 KB;
    // A100: 128 queries x 32 keys; 99 KB consumer GPUs: 64 queries x 32 keys, 96 KB)
    const size_t m = smem_optin;
    if (d->T > 64 && (size_t)flash_smem<8, 64>() <= m)
        return launch<8, 64>(s, d, qb, k_cache, v_cache, q, out, e);
    if (d->T > 64 && (size_t)flash_smem<8, 32>() <= m)
        return launch<8, 32>(s, d, qb, k_cache, v_cache, q, out, e);
    if ((size_t)flash_smem<4, 64>() <= m)
        return launch<4, 64>(s, d, qb, k_cache, v_cache, q, out, e);
    if ((size_t)flash_smem<4, 32>() <= m)
        return launch<4, 32>(s, d, qb, k_cache, v_cache, q, out, e);
    return wren_errf(e,
                     "attention: the prefill kernel needs %d bytes of shared memory per block, "
                     "the device allows %zu",
                     flash_smem<4, 32>(), m);
}
