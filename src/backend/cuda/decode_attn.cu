// Gated attention decode for one token: q/k RMSNorm + partial RoPE + KV-cache append (prep), then
// split-KV flash decoding (each block: one KV head x one slice of the context, all G query heads of
// the KV head sharing every K/V load), then the combine with the sigmoid output gate. The context
// length is read from device memory, so one captured graph serves every position.
#include "backend/cuda/decode_attn.cuh"

#define ATT_THREADS 256

static int g_att_sms = 132;
static size_t g_att_smem = 48 * 1024; // opt-in shared memory per block

int attn_splits(int n_kv) {
    // several blocks per SM at long contexts: each block streams its slice with few loads in flight
    // (at most 1024)
    int s = 4 * g_att_sms / (n_kv > 0 ? n_kv : 1);
    return s < 1 ? 1 : s > 1024 ? 1024 : s;
}

// Blocks [0, n_heads): query heads; [n_heads, n_heads + n_kv): KV heads. One thread per dim.
__global__ void attn_prep_kernel(const __grid_constant__ struct attn_params p) {
    extern __shared__ float xs[];
    __shared__ float red[32];
    TRACE_BEGIN();
    pdl_trigger();
    // the rotation's frequency (f64 pow, as the reference computes it) is constant: computed while
    // the projection is still finishing (+0.4% decode at 4K, +0.7% at 128K); so are the position
    // (attn_len), hence the rotation's sin/cos, and the norm weights
    const int hd = p.hd, d = threadIdx.x, half = p.rope_dim / 2;
    const bool isq = (int)blockIdx.x < p.n_heads;
    const int h = isq ? blockIdx.x : blockIdx.x - p.n_heads;
    const int pos = attn_len(p) - 1;
    float sn = 0.f, cs = 0.f;
    if (d < p.rope_dim) {
        const int i = d < half ? d : d - half;
        const float inv = (float)(1.0 / pow((double)p.rope_theta, (double)(2 * i) / p.rope_dim));
        // the angle in f32 as the reference computes it; sin/cos in f64
        const float ang = (float)pos * inv;
        double sd, cd;
        sincos((double)ang, &sd, &cd);
        sn = (float)sd, cs = (float)cd;
    }
    const float nw = d < hd ? (isq ? p.q_norm : p.k_norm)[d] : 0.f;
    pdl_wait();
    TRACE_WAIT();
    float x = 0.f, v = 0.f; // v (KV heads) requested with x: no round trip at the end
    if (d < hd) x = isq ? p.qg[(size_t)h * hd * (p.gate ? 2 : 1) + d] : p.k[(size_t)h * hd + d];
    if (!isq && d < hd) v = p.v[(size_t)h * hd + d];
    float ss = x * x;
#pragma unroll
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((d & 31) == 0) red[d >> 5] = ss;
    __syncthreads();
    ss = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) ss += red[w];
    if (d < hd) xs[d] = x * rsqrtf(ss / (float)hd + p.eps) * nw;
    __syncthreads();
    float y = d < hd ? xs[d] : 0.f;
    if (d < p.rope_dim)
        y = d < half ? (float)(xs[d] * (double)cs - xs[d + half] * (double)sn)
                     : (float)(xs[d] * (double)cs + xs[d - half] * (double)sn);
    if (isq) {
        if (d < hd) p.q_ws[(size_t)h * hd + d] = y;
        return;
    }
    unsigned char *kr = p.kc + (size_t)pos * p.kv_row, *vr = p.vc + (size_t)pos * p.kv_row;
    if (!p.kv_int8) {
        if (d < hd) {
            reinterpret_cast<uint16_t *>(kr)[(size_t)h * hd + d] = f32_to_bf16_bits(y);
            reinterpret_cast<uint16_t *>(vr)[(size_t)h * hd + d] = f32_to_bf16_bits(v);
        }
        return;
    }
    // int8 rows (hd a multiple of the group, so blockDim.x == hd): max |k| and |v| over each group
    // of KV_INT8_GROUP dims, i.e. over its warps (every thread read red before the barrier above)
    constexpr int WPG = KV_INT8_GROUP / 32;
    float ka = fabsf(y), va = fabsf(v);
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        ka = fmaxf(ka, __shfl_xor_sync(0xffffffffu, ka, o));
        va = fmaxf(va, __shfl_xor_sync(0xffffffffu, va, o));
    }
    __shared__ float vmax[32];
    if ((d & 31) == 0) red[d >> 5] = ka, vmax[d >> 5] = va;
    __syncthreads();
    const int g = d / KV_INT8_GROUP;
    ka = va = 0.f;
#pragma unroll
    for (int w = 0; w < WPG; w++)
        ka = fmaxf(ka, red[g * WPG + w]), va = fmaxf(va, vmax[g * WPG + w]);
    kr[(size_t)h * hd + d] = kv_int8_code(y, kv_int8_inv(ka));
    vr[(size_t)h * hd + d] = kv_int8_code(v, kv_int8_inv(va));
    if (d % KV_INT8_GROUP == 0) {
        const int ng = hd / KV_INT8_GROUP;
        kv_int8_scales(kr, p.n_kv, hd)[h * ng + g] = kv_int8_scale(ka);
        kv_int8_scales(vr, p.n_kv, hd)[h * ng + g] = kv_int8_scale(va);
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
    TRACE_BEGIN();
    pdl_trigger();
    const int L = attn_len(p);
    pdl_wait();
    TRACE_WAIT();
    float *part = p.part + ((size_t)sidx * p.n_heads + (size_t)kvh * G) * (HD + 2);
    int start, end;
    if (!attn_slice(p, L, sidx, G, part, start, end)) return;
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
    const uint16_t *kbase = reinterpret_cast<const uint16_t *>(p.kc) + (size_t)kvh * HD,
                   *vbase = reinterpret_cast<const uint16_t *>(p.vc) + (size_t)kvh * HD;
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

// Split-KV decode attention on tensor cores for head_dim 256 with 8 or 16 query heads per KV
// head (Qwen3.6-35B-A3B: 8); the FMA kernel above would do 16 multiply-adds per K or V element
// loaded and be compute-bound at long contexts. Both products are taken transposed (as the int8
// kernel, decode_attn_q8.cu): S^T = K Q^T and O^T = V^T P^T, bf16 mma's with f32 accumulation,
// the keys (for P V the dims) as the 16 rows and the 8 heads of a head tile (HN tiles: G = 8 HN)
// as the columns, so no tile row is empty: 48 mma's per 16-key tile (S twice, as Q is split into
// bf16 hi + lo parts so that the scores keep ~16 mantissa bits as the f32 kernel's; P is bf16, as
// in prefill) and 64 output floats per thread per head tile. (The first version put the G heads on
// the rows: 96 mma's, 16.3M instructions against 11.7M for one layer at 128K, 71.5 against 70.0 us:
// RESULTS.md, twentieth session.) K and V tiles come in by ldmatrix (V transposed), Q^T by ldmatrix
// from shared memory, P^T by movmatrix from the scores' accumulators. Block = (KV head, context
// slice), AM_NW warps; each warp streams its own tiles of 16 keys (K and V rows cp.async'd into a
// private buffer of NS stages), keeps its own online softmax and output in registers, and the
// warps are merged at the end into the slice's partial.
// The merge's column of dim d of head h: a warp's stores of one output register (4 heads, 8 dims)
// spread over the 32 banks.
struct at_cols {
    __device__ int operator()(int h, int d) const { return d ^ (((h >> 1) & 3) << 3); }
};
// Q (hi, lo) then the warps' K/V stages, which the final merge reuses for (o, m, l) per warp.
static __host__ __device__ constexpr size_t at_smem(int hn, int ns) {
    return (size_t)2 * hn * 8 * AM_HD * 2 +
           ((size_t)AM_NW * ns * 2 * AM_KT * AM_HD * 2 > (size_t)AM_NW * 16 * (AM_HD + 2) * 4
                ? (size_t)AM_NW * ns * 2 * AM_KT * AM_HD * 2
                : (size_t)AM_NW * 16 * (AM_HD + 2) * 4);
}
template <int HN, int NS>
__global__ void __launch_bounds__(AM_NW * 32)
    attn_split_mma_kernel(const __grid_constant__ struct attn_params p) {
    extern __shared__ __align__(16) unsigned char am_sm[];
    __nv_bfloat16 *Qh = reinterpret_cast<__nv_bfloat16 *>(am_sm), *Ql = Qh + HN * 8 * AM_HD;
    const int G = p.n_heads / p.n_kv;
    const int kvh = blockIdx.x, sidx = blockIdx.y, tid = threadIdx.x, lane = tid & 31,
              warp = tid >> 5, c4 = lane & 3, g8 = lane >> 2;
    unsigned char *kvw = reinterpret_cast<unsigned char *>(Ql + HN * 8 * AM_HD) +
                         (size_t)warp * NS * 2 * AM_KT * AM_HD * 2;
    TRACE_BEGIN();
    pdl_trigger();
    const int L = attn_len(p);
    int start, end;
    attn_range(p, L, sidx, start, end);
    const int ntiles = start < end ? (end - start + AM_KT - 1) / AM_KT : 0;
    const size_t rowst = (size_t)p.n_kv * AM_HD; // elements
    const __nv_bfloat16 *kc = reinterpret_cast<const __nv_bfloat16 *>(p.kc) + (size_t)kvh * AM_HD +
                              lane * 8,
                        *vc = reinterpret_cast<const __nv_bfloat16 *>(p.vc) + (size_t)kvh * AM_HD +
                              lane * 8;
    // a tile's copies: iteration r copies row r, chunk `lane` (amswz: chunk ^ (r & 7))
    const uint64_t pol = l2_stream(); // the cache is read once per step
    auto load_tile = [&](unsigned char *st, int j) {
        const int k0 = start + j * AM_KT, nk = end - k0;
        const size_t o = (size_t)k0 * rowst;
#pragma unroll
        for (int r = 0; r < AM_KT; r++) {
            const bool ok = nk >= AM_KT || r < nk;
            const size_t go = ok ? o + (size_t)r * rowst : 0;
            const int so = r * AM_HD * 2 + ((lane ^ (r & 7)) << 4);
            cp_async16(st + so, kc + go, ok, pol);
            cp_async16(st + AM_KT * AM_HD * 2 + so, vc + go, ok, pol);
        }
    };
    auto load_stage = [&](int i, int j) { load_tile(kvw + i * 2 * AM_KT * AM_HD * 2, j); };
    am_ring_first<NS> first;
    am_ring_early(first, warp, ntiles, start, end, L, load_stage);
    pdl_wait();
    TRACE_WAIT();
    float *part = p.part + ((size_t)sidx * p.n_heads + (size_t)kvh * G) * (AM_HD + 2);
    if (start >= end) return attn_empty(p, G, part);
    am_ring_rest(first, warp, ntiles, load_stage);
    // Q rows h < G as hi + lo bf16 parts, [8 HN][AM_HD] each, rows past G zero
    for (int i = tid; i < HN * 8 * (AM_HD / 8); i += AM_NW * 32) {
        const int r = i / (AM_HD / 8), c = i % (AM_HD / 8);
        uint32_t hi[4], lo[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float a = 0.f, b = 0.f;
            if (r < G) {
                const float *q = p.q_ws + ((size_t)kvh * G + r) * AM_HD + c * 8 + 2 * k;
                a = __ldcg(q), b = __ldcg(q + 1);
            }
            __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
            __nv_bfloat162 l = __floats2bfloat162_rn(a - __low2float(h), b - __high2float(h));
            hi[k] = *reinterpret_cast<uint32_t *>(&h);
            lo[k] = *reinterpret_cast<uint32_t *>(&l);
        }
        *reinterpret_cast<uint4 *>(Qh + amswz(r, c)) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        *reinterpret_cast<uint4 *>(Ql + amswz(r, c)) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
    __syncthreads();

    // o: dim tile dt holds dims 16 dt + g8 (c 0, 1) and + 8 (c 2, 3) of heads 8 hn + 2c4 (+1)
    float o[AM_HD / 16][HN][4];
#pragma unroll
    for (int i = 0; i < AM_HD / 16; i++)
#pragma unroll
        for (int hn = 0; hn < HN; hn++) o[i][hn][0] = o[i][hn][1] = o[i][hn][2] = o[i][hn][3] = 0.f;
    float m[HN][2], l[HN][2];
#pragma unroll
    for (int hn = 0; hn < HN; hn++) m[hn][0] = m[hn][1] = -INFINITY, l[hn][0] = l[hn][1] = 0.f;
    const float sl2 = rsqrtf((float)AM_HD) * 1.4426950408889634f; // scores in base 2
    // ldmatrix rows and chunks: K (A, x4: keys 0-7 / 8-15, dims +0 / +8), V^T (A, x4 trans: keys
    // 0-7 / 8-15 for dims +0 / +8), Q^T (B, x4: heads, dims of two k-steps)
    const int kr = (lane & 7) + ((lane >> 3) & 1) * 8, kcb = lane >> 4;
    const int vr = (lane & 7) + (lane >> 4) * 8, vcb = (lane >> 3) & 1;
    const int qr = lane & 7, qcb = lane >> 3;
    auto step = [&](const unsigned char *st, unsigned char *next, int j) {
        if (j + (NS - 1) * AM_NW < ntiles) load_tile(next, j + (NS - 1) * AM_NW);
        cp_async_commit();
        cp_async_wait<NS - 1>();
        __syncwarp();
        const __nv_bfloat16 *ks = reinterpret_cast<const __nv_bfloat16 *>(st),
                            *vs = ks + AM_KT * AM_HD;
        float s[HN][4];
#pragma unroll
        for (int hn = 0; hn < HN; hn++) s[hn][0] = s[hn][1] = s[hn][2] = s[hn][3] = 0.f;
#pragma unroll
        for (int k2 = 0; k2 < AM_HD / 32; k2++) { // two k-steps of 16 dims
            uint32_t qh[HN][4], ql[HN][4];
#pragma unroll
            for (int hn = 0; hn < HN; hn++) {
                ldmatrix_x4(qh[hn], Qh + hn * 8 * AM_HD + amswz(qr, 4 * k2 + qcb));
                ldmatrix_x4(ql[hn], Ql + hn * 8 * AM_HD + amswz(qr, 4 * k2 + qcb));
            }
#pragma unroll
            for (int u = 0; u < 2; u++) {
                uint32_t a[4];
                ldmatrix_x4(a, ks + amswz(kr, 4 * k2 + 2 * u + kcb));
#pragma unroll
                for (int hn = 0; hn < HN; hn++) {
                    mma_bf16(s[hn], a, qh[hn][2 * u], qh[hn][2 * u + 1]);
                    mma_bf16(s[hn], a, ql[hn][2 * u], ql[hn][2 * u + 1]);
                }
            }
        }
        // keys past the slice end masked; P^T as the B fragments (keys 2c4.. / 2c4 + 8.., head g8)
        const int kb = start + j * AM_KT;
        float alpha[HN][2];
        const bool moved = am_softmax<HN>(s, m, l, alpha, kb + g8 < end, kb + g8 + 8 < end, sl2);
        uint32_t pb[HN][2];
#pragma unroll
        for (int hn = 0; hn < HN; hn++) {
            __nv_bfloat162 x0 = __floats2bfloat162_rn(s[hn][0], s[hn][1]),
                           x1 = __floats2bfloat162_rn(s[hn][2], s[hn][3]);
            pb[hn][0] = movmatrix_trans(*reinterpret_cast<uint32_t *>(&x0));
            pb[hn][1] = movmatrix_trans(*reinterpret_cast<uint32_t *>(&x1));
        }
        // once the maxima settle, no column of the warp moves: skip the multiplies by 1
        if (__any_sync(~0u, moved)) {
#pragma unroll
            for (int i = 0; i < AM_HD / 16; i++)
#pragma unroll
                for (int hn = 0; hn < HN; hn++)
#pragma unroll
                    for (int c = 0; c < 4; c++) o[i][hn][c] *= alpha[hn][c & 1];
        }
#pragma unroll
        for (int dt = 0; dt < AM_HD / 16; dt++) {
            uint32_t a[4];
            ldmatrix_x4_trans(a, vs + amswz(vr, 2 * dt + vcb));
#pragma unroll
            for (int hn = 0; hn < HN; hn++) mma_bf16(o[dt][hn], a, pb[hn][0], pb[hn][1]);
        }
        __syncwarp(); // the next step refills this stage
    };
    am_ring_run<NS, 2 * AM_KT * AM_HD * 2>(kvw, warp, ntiles, step);
#pragma unroll
    for (int hn = 0; hn < HN; hn++)
#pragma unroll
        for (int e = 0; e < 2; e++) l[hn][e] = am_colsum(l[hn][e]);
    // merge the warps: (m, l, o) of each into shared memory (reusing the K/V stages)
    cp_async_wait<0>();
    __syncthreads();
    float *wo = reinterpret_cast<float *>(Ql + HN * 8 * AM_HD); // [AM_NW][16][AM_HD], at_cols
    float *wm = wo + AM_NW * 16 * AM_HD, *wl = wm + AM_NW * 16;
#pragma unroll
    for (int hn = 0; hn < HN; hn++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int h = 8 * hn + 2 * c4 + e;
            if (g8 == 0) wm[warp * 16 + h] = m[hn][e], wl[warp * 16 + h] = l[hn][e];
#pragma unroll
            for (int dt = 0; dt < AM_HD / 16; dt++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int d = 16 * dt + g8 + 8 * r;
                    wo[((size_t)warp * 16 + h) * AM_HD + at_cols()(h, d)] = o[dt][hn][2 * r + e];
                }
        }
    __syncthreads();
    am_merge(wo, wm, wl, G, part, at_cols());
}

// Merges the splits and applies the output gate. Block = (query head, 32 dims); warp w folds the
// splits w, w + 8, ... that the current length reaches into a running (max, numerator,
// denominator), with the loads of AC_U splits in flight at once, then warp 0 merges the warps'
// states. (One block per head, a thread per dim, waited for ~17 dependent rounds of loads at 66
// splits: 6 us of a 4K step's 20 us per attention layer; this: +1.4% decode at 4K, +2% at 32K.)
// AC_U 9: the H200's 66 splits per KV head in one round of loads (8 left two warps a second
// round: +0.2% decode at 4K to 128K; 16 measured slower at 128K, twentieth session).
#define AC_WARPS 8
#define AC_U     9
// (M, num, den) += a split's (max m, output o, denominator l > 0), rescaled to the larger max
static __device__ __forceinline__ void ac_fold(float &M, float &num, float &den, float m, float o,
                                               float l) {
    const float nm = fmaxf(M, m), a = __expf(M - nm), b = __expf(m - nm);
    num = num * a + b * o;
    den = den * a + b * l;
    M = nm;
}
__global__ void __launch_bounds__(AC_WARPS * 32)
    attn_combine_kernel(const __grid_constant__ struct attn_params p) {
    __shared__ float sm[3][AC_WARPS][32];
    TRACE_BEGIN();
    pdl_trigger();
    const int nact = attn_active(p, attn_units(attn_len(p))); // the slices that hold keys
    pdl_wait();
    TRACE_WAIT();
    const int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, hd = p.hd;
    const int d = blockIdx.y * 32 + lane;
    const size_t stride = (size_t)p.n_heads * (hd + 2);
    const float *ph = p.part + (size_t)h * (hd + 2);
    const float gl = p.gate && warp == 0 ? __ldcg(p.qg + (size_t)h * hd * 2 + hd + d) : 0.f;
    float M = -INFINITY, num = 0.f, den = 0.f;
    for (int s0 = warp; s0 < nact; s0 += AC_WARPS * AC_U) {
        float mv[AC_U], lv[AC_U], ov[AC_U];
#pragma unroll
        for (int u = 0; u < AC_U; u++) {
            const int s = s0 + AC_WARPS * u;
            const bool ok = s < nact;
            const float *ps = ph + (size_t)(ok ? s : 0) * stride;
            mv[u] = ok ? __ldcg(ps + hd) : 0.f;
            lv[u] = ok ? __ldcg(ps + hd + 1) : 0.f;
            ov[u] = ok ? __ldcg(ps + d) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < AC_U; u++) {
            if (lv[u] > 0.f) ac_fold(M, num, den, mv[u], ov[u], lv[u]); // else an empty split
        }
    }
    sm[0][warp][lane] = M, sm[1][warp][lane] = num, sm[2][warp][lane] = den;
    __syncthreads();
    if (warp) return;
    M = -INFINITY, num = den = 0.f;
#pragma unroll
    for (int w = 0; w < AC_WARPS; w++) {
        if (sm[2][w][lane] > 0.f)
            ac_fold(M, num, den, sm[0][w][lane], sm[1][w][lane], sm[2][w][lane]);
    }
    float o = num / den;
    if (p.gate) o *= sigmoid_f(gl);
    p.out[(size_t)h * hd + d] = o;
}

template <int HD>
static int split_launch(const struct attn_params *p, int G, cudaStream_t s, struct wren_err *e) {
    void (*k)(const struct attn_params) = G == 1    ? attn_split_kernel<HD, 1>
                                          : G == 2  ? attn_split_kernel<HD, 2>
                                          : G == 4  ? attn_split_kernel<HD, 4>
                                          : G == 8  ? attn_split_kernel<HD, 8>
                                          : G == 16 ? attn_split_kernel<HD, 16>
                                                    : nullptr;
    if (!k) return wren_errf(e, "attention: %d query heads per KV head is not 1, 2, 4, 8 or 16", G);
    CUDA_CHECK(pdl_launch(k, dim3(p->n_kv, p->splits), dim3(ATT_THREADS), 0, s, decode_pdl(), *p));
    return 0;
}

// Tensor-core path: two K/V stages per warp where the shared memory allows (136 KiB: one block
// per SM on Hopper/Ampere datacenter parts), else one (72.5 KiB, consumer cards); one slice per
// resident block, so the grid is a single wave. (One stage and three blocks per SM on the H200:
// 4% slower at 4K, 7% at 32K and 128K.)
static int attn_mma_launch(struct attn_params *q, int G, cudaStream_t s, struct wren_err *e) {
    const int hn = G / 8;
    const bool two = g_att_smem >= at_smem(hn, 2);
    const size_t smem = at_smem(hn, two ? 2 : 1);
    if (smem > g_att_smem)
        return wren_errf(e, "attention: %zu bytes of shared memory needed, %zu available", smem,
                         g_att_smem);
    void (*k)(const struct attn_params) =
        G == 16 ? (two ? attn_split_mma_kernel<2, 2> : attn_split_mma_kernel<2, 1>)
                : (two ? attn_split_mma_kernel<1, 2> : attn_split_mma_kernel<1, 1>);
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int per_sm = (int)(g_att_smem / smem) < 1 ? 1 : (int)(g_att_smem / smem);
    const int sp = per_sm * g_att_sms / q->n_kv;
    if (sp >= 1 && sp < q->splits) q->splits = sp;
    CUDA_CHECK(
        pdl_launch(k, dim3(q->n_kv, q->splits), dim3(AM_NW * 32), smem, s, decode_pdl(), *q));
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
    CUDA_CHECK(pdl_launch(attn_prep_kernel, dim3(p->n_heads + p->n_kv), dim3(thr),
                          p->hd * sizeof(float), s, decode_pdl(), *p));
    struct attn_params q = *p; // the tensor-core path may use fewer splits
    int rc;
    if (p->kv_int8) {
        rc = attn_split_q8_launch(&q, g_att_sms, g_att_smem, s, e);
    } else if (p->hd == AM_HD && (G == 16 || G == 8)) {
        rc = attn_mma_launch(&q, G, s, e);
    } else {
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
    }
    if (rc) return rc;
    CUDA_CHECK(pdl_launch(attn_combine_kernel, dim3(p->n_heads, p->hd / 32), dim3(AC_WARPS * 32), 0,
                          s, decode_pdl(), q));
    return 0;
}

void attn_set_device(int sms, size_t smem_optin) {
    g_att_sms = sms;
    g_att_smem = smem_optin;
}
