// Gated attention decode for one token: q/k RMSNorm + partial RoPE + KV-cache append (prep), then
// split-KV flash decoding (each block: one KV head x one slice of the context, all G query heads of
// the KV head sharing every K/V load), then the combine with the sigmoid output gate. The context
// length is read from device memory, so one captured graph serves every position.
#include "backend/cuda/decode.cuh"

#define ATT_THREADS 256
#define ATT_TILE    64

static int g_att_sms = 132;

int attn_splits(int n_kv) {
    // several blocks per SM at long contexts: each block streams its slice with few loads in flight
    // (at most 1024: the combine keeps one weight per split in shared memory)
    int s = 4 * g_att_sms / (n_kv > 0 ? n_kv : 1);
    return s < 1 ? 1 : s > 1024 ? 1024 : s;
}

// Blocks [0, n_heads): query heads; [n_heads, n_heads + n_kv): KV heads. One thread per dim.
__global__ void attn_prep_kernel(const __grid_constant__ struct attn_params p) {
    extern __shared__ float xs[];
    __shared__ float red[32];
    const int hd = p.hd, d = threadIdx.x, pos = *p.pos;
    const bool isq = (int)blockIdx.x < p.n_heads;
    const int h = isq ? blockIdx.x : blockIdx.x - p.n_heads;
    float x = 0.f;
    if (d < hd) x = isq ? p.qg[(size_t)h * hd * (p.gate ? 2 : 1) + d] : p.k[(size_t)h * hd + d];
    float ss = x * x;
#pragma unroll
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((d & 31) == 0) red[d >> 5] = ss;
    __syncthreads();
    ss = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) ss += red[w];
    const float *nw = isq ? p.q_norm : p.k_norm;
    if (d < hd) xs[d] = x * rsqrtf(ss / (float)hd + p.eps) * nw[d];
    __syncthreads();
    if (d >= hd) return;
    float y = xs[d];
    const int half = p.rope_dim / 2;
    if (d < p.rope_dim) {
        const int i = d < half ? d : d - half;
        // inv_freq and the angle in f32 as the reference computes them; sin/cos in f64
        const float inv = (float)(1.0 / pow((double)p.rope_theta, (double)(2 * i) / p.rope_dim));
        const float ang = (float)pos * inv;
        double sn, cs;
        sincos((double)ang, &sn, &cs);
        sn = (float)sn;
        cs = (float)cs;
        y = d < half ? (float)(xs[d] * cs - xs[d + half] * sn)
                     : (float)(xs[d] * cs + xs[d - half] * sn);
    }
    if (isq) {
        p.q_ws[(size_t)h * hd + d] = y;
    } else {
        size_t o = ((size_t)pos * p.n_kv + h) * hd + d;
        p.kc[o] = f32_to_bf16_bits(y);
        p.vc[o] = f32_to_bf16_bits(p.v[(size_t)h * hd + d]);
    }
}

template <int DPL> struct kvec;
template <> struct kvec<2> { using T = uint32_t; };
template <> struct kvec<4> { using T = uint2; };
template <> struct kvec<8> { using T = uint4; };

template <int DPL>
static __device__ __forceinline__ void unpack_bf16(const typename kvec<DPL>::T &w,
                                                   float (&f)[DPL]) {
    const uint32_t *u = reinterpret_cast<const uint32_t *>(&w);
#pragma unroll
    for (int i = 0; i < DPL / 2; i++) {
        f[2 * i] = __uint_as_float(u[i] << 16);
        f[2 * i + 1] = __uint_as_float(u[i] & 0xFFFF0000u);
    }
}

template <int HD, int G>
__global__ void __launch_bounds__(ATT_THREADS)
    attn_split_kernel(const __grid_constant__ struct attn_params p) {
    constexpr int DPL = HD / 32;                 // K dims per lane in the score phase
    constexpr int TW = 32 / G < 8 ? 32 / G : 8;  // tokens per warp step
    constexpr int NSUB = ATT_THREADS / (HD / 2); // token subsets in the V phase
    __shared__ __align__(16) float qs[G][HD];
    __shared__ float sc[G][ATT_TILE];
    __shared__ float m_run[G], l_run[G], alpha[G];
    __shared__ __align__(16) float obuf[G][HD];
    const int kvh = blockIdx.x, sidx = blockIdx.y, tid = threadIdx.x, warp = tid >> 5,
              lane = tid & 31;
    const int L = *p.pos + 1;
    int chunk = (L + p.splits - 1) / p.splits;
    chunk = (chunk + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
    const int start = sidx * chunk, end = min(L, start + chunk);
    float *part = p.part + ((size_t)sidx * p.n_heads + (size_t)kvh * G) * (HD + 2);
    if (start >= end) {
        if (tid < G)
            part[(size_t)tid * (HD + 2) + HD] = -INFINITY,
                                          part[(size_t)tid * (HD + 2) + HD + 1] = 0.f;
        return;
    }
    for (int i = tid; i < G * HD; i += ATT_THREADS) {
        qs[i / HD][i % HD] = p.q_ws[((size_t)kvh * G + i / HD) * HD + i % HD];
        obuf[i / HD][i % HD] = 0.f;
    }
    if (tid < G) m_run[tid] = -INFINITY, l_run[tid] = 0.f;
    __syncthreads();
    const float scale = rsqrtf((float)HD);
    const int dp = tid % (HD / 2), ts = tid / (HD / 2);
    float acc[G][2];
#pragma unroll
    for (int g = 0; g < G; g++) acc[g][0] = acc[g][1] = 0.f;
    const size_t rowst = (size_t)p.n_kv * HD;
    const uint16_t *kbase = p.kc + (size_t)kvh * HD, *vbase = p.vc + (size_t)kvh * HD;
    constexpr int VPT = ATT_TILE / NSUB; // V rows per thread per tile
    for (int t0 = start; t0 < end; t0 += ATT_TILE) {
        // issue this tile's V loads first (used after the softmax) and all 8 K rows of the warp
        uint32_t vw[VPT];
#pragma unroll
        for (int jj = 0; jj < VPT; jj++) {
            int tok = t0 + ts + jj * NSUB;
            vw[jj] = tok < end ? __ldg(reinterpret_cast<const unsigned int *>(
                                     vbase + (size_t)tok * rowst + 2 * dp))
                               : 0u;
        }
        typename kvec<DPL>::T kall[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int tok = t0 + warp * 8 + j;
            if (tok < end)
                kall[j] = *reinterpret_cast<const typename kvec<DPL>::T *>(
                    kbase + (size_t)tok * rowst + lane * DPL);
            else
                memset(&kall[j], 0, sizeof(kall[j]));
        }
        // scores: warp w covers tile tokens [8w, 8w + 8)
#pragma unroll
        for (int tt = 0; tt < 8; tt += TW) {
            typename kvec<DPL>::T kw[TW];
#pragma unroll
            for (int j = 0; j < TW; j++) kw[j] = kall[tt + j];
            float v[32];
#pragma unroll
            for (int i = 0; i < 32; i++) v[i] = 0.f;
#pragma unroll
            for (int j = 0; j < TW; j++) {
                float kf[DPL];
                unpack_bf16<DPL>(kw[j], kf);
#pragma unroll
                for (int g = 0; g < G; g++) {
                    float s = 0.f;
#pragma unroll
                    for (int d = 0; d < DPL; d++) s = fmaf(qs[g][lane * DPL + d], kf[d], s);
                    v[j * G + g] = s;
                }
            }
            // transpose-reduce: afterwards lane l holds the full sum of v[l]
#pragma unroll
            for (int off = 16; off; off >>= 1) {
#pragma unroll
                for (int i = 0; i < off; i++) {
                    bool up = lane & off;
                    float send = up ? v[i] : v[i + off];
                    float keep = up ? v[i + off] : v[i];
                    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
                }
            }
            if (lane < TW * G) {
                int j = lane / G, g = lane % G, tok = t0 + warp * 8 + tt + j;
                sc[g][warp * 8 + tt + j] = tok < end ? v[0] * scale : -INFINITY;
            }
        }
        __syncthreads();
        // online softmax per head
        for (int g = warp; g < G; g += ATT_THREADS / 32) {
            float a = sc[g][lane], b = sc[g][lane + 32];
            float mx = fmaxf(a, b);
#pragma unroll
            for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float mnew = fmaxf(m_run[g], mx);
            float pa = __expf(a - mnew), pb = __expf(b - mnew);
            sc[g][lane] = pa;
            sc[g][lane + 32] = pb;
            float sum = pa + pb;
#pragma unroll
            for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            if (lane == 0) {
                float al = __expf(m_run[g] - mnew);
                alpha[g] = al;
                l_run[g] = l_run[g] * al + sum;
                m_run[g] = mnew;
            }
        }
        __syncthreads();
#pragma unroll
        for (int g = 0; g < G; g++) acc[g][0] *= alpha[g], acc[g][1] *= alpha[g];
#pragma unroll
        for (int jj = 0; jj < VPT; jj++) {
            const int j = ts + jj * NSUB;
            const uint32_t w = vw[jj]; // zero past the end, where the probability is 0 too
            float v0 = __uint_as_float(w << 16), v1 = __uint_as_float(w & 0xFFFF0000u);
#pragma unroll
            for (int g = 0; g < G; g++) {
                float pr = sc[g][j];
                acc[g][0] = fmaf(pr, v0, acc[g][0]);
                acc[g][1] = fmaf(pr, v1, acc[g][1]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
        atomicAdd(&obuf[g][2 * dp], acc[g][0]);
        atomicAdd(&obuf[g][2 * dp + 1], acc[g][1]);
    }
    __syncthreads();
    for (int i = tid; i < G * HD; i += ATT_THREADS)
        part[(size_t)(i / HD) * (HD + 2) + i % HD] = obuf[i / HD][i % HD];
    if (tid < G)
        part[(size_t)tid * (HD + 2) + HD] = m_run[tid],
                                      part[(size_t)tid * (HD + 2) + HD + 1] = l_run[tid];
}

// One block per query head, one thread per dim: merges the splits and applies the output gate.
// Only the splits the current length reaches are read; their weights exp(m_s - M) are computed
// once into shared memory, so the per-dim sums are independent loads rather than a dependent
// chain per split.
__global__ void attn_combine_kernel(const __grid_constant__ struct attn_params p) {
    __shared__ float wsh[1024], lsh[1024], red[32];
    pdl_trigger();
    const int h = blockIdx.x, tid = threadIdx.x, hd = p.hd, lane = tid & 31, warp = tid >> 5;
    const int nw = blockDim.x >> 5;
    const int L = *p.pos + 1;
    int chunk = (L + p.splits - 1) / p.splits;
    chunk = (chunk + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
    const int nact = min(p.splits, (L + chunk - 1) / chunk);
    const size_t stride = (size_t)p.n_heads * (hd + 2);
    const float *ph = p.part + (size_t)h * (hd + 2);
    float mx = -INFINITY;
    for (int s = tid; s < nact; s += blockDim.x) {
        const float m = ph[s * stride + hd], l = ph[s * stride + hd + 1];
        wsh[s] = l > 0.f ? m : -INFINITY;
        lsh[s] = l;
        mx = fmaxf(mx, wsh[s]);
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < nw; w++) M = fmaxf(M, red[w]);
    __syncthreads();
    float den = 0.f;
    for (int s = tid; s < nact; s += blockDim.x) {
        const float w = lsh[s] > 0.f ? __expf(wsh[s] - M) : 0.f;
        wsh[s] = w;
        den += w * lsh[s];
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) den += __shfl_xor_sync(0xffffffffu, den, o);
    if (lane == 0) red[warp] = den;
    __syncthreads();
    den = 0.f;
    for (int w = 0; w < nw; w++) den += red[w];
    if (tid >= hd) return;
    float num[4] = {0.f, 0.f, 0.f, 0.f};
    int s = 0;
    for (; s + 4 <= nact; s += 4)
#pragma unroll
        for (int j = 0; j < 4; j++) num[j] += wsh[s + j] * ph[(s + j) * stride + tid];
    for (; s < nact; s++) num[0] += wsh[s] * ph[s * stride + tid];
    float o = (num[0] + num[1] + num[2] + num[3]) / den;
    if (p.gate) o *= sigmoid_f(p.qg[(size_t)h * hd * 2 + hd + tid]);
    p.out[(size_t)h * hd + tid] = o;
}

template <int HD>
static int split_launch(const struct attn_params *p, int G, cudaStream_t s, struct wren_err *e) {
    dim3 grid(p->n_kv, p->splits);
    switch (G) {
    case 1:
        attn_split_kernel<HD, 1><<<grid, ATT_THREADS, 0, s>>>(*p);
        break;
    case 2:
        attn_split_kernel<HD, 2><<<grid, ATT_THREADS, 0, s>>>(*p);
        break;
    case 4:
        attn_split_kernel<HD, 4><<<grid, ATT_THREADS, 0, s>>>(*p);
        break;
    case 8:
        attn_split_kernel<HD, 8><<<grid, ATT_THREADS, 0, s>>>(*p);
        break;
    case 16:
        attn_split_kernel<HD, 16><<<grid, ATT_THREADS, 0, s>>>(*p);
        break;
    default:
        return wren_errf(e, "attention: %d query heads per KV head is not 1, 2, 4, 8 or 16", G);
    }
    CUDA_CHECK_LAUNCH();
    return 0;
}

int attn_launch(const struct attn_params *p, cudaStream_t s, struct wren_err *e) {
    if (p->n_kv <= 0 || p->n_heads % p->n_kv)
        return wren_errf(e, "attention: %d heads over %d KV heads", p->n_heads, p->n_kv);
    if (p->rope_dim % 2 || p->rope_dim > p->hd)
        return wren_errf(e, "attention: bad rope_dim %d", p->rope_dim);
    if (p->splits < 1 || p->splits > 1024)
        return wren_errf(e, "attention: %d split-KV blocks (1..1024)", p->splits);
    const int G = p->n_heads / p->n_kv;
    int thr = (p->hd + 31) / 32 * 32;
    attn_prep_kernel<<<p->n_heads + p->n_kv, thr, p->hd * sizeof(float), s>>>(*p);
    CUDA_CHECK_LAUNCH();
    int rc;
    switch (p->hd) {
    case 64:
        rc = split_launch<64>(p, G, s, e);
        break;
    case 128:
        rc = split_launch<128>(p, G, s, e);
        break;
    case 256:
        rc = split_launch<256>(p, G, s, e);
        break;
    default:
        return wren_errf(e, "attention: head_dim %d is not 64, 128 or 256", p->hd);
    }
    if (rc) return rc;
    attn_combine_kernel<<<p->n_heads, thr, 0, s>>>(*p);
    CUDA_CHECK_LAUNCH();
    return 0;
}

void attn_set_sm_count(int sms) {
    g_att_sms = sms;
}
