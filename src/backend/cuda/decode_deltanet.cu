// One Gated DeltaNet step, fused: q/k l2norm, g and beta, the state decay, the delta-rule update
// and the readout with the state held in registers (read once, written once). Two shapes: a block
// per value head with the gated RMSNorm of the head's output fused (d_k 16/32/64/128; this model
// family has 128; +1.5% decode, bench/RESULTS.md) and, where a thread per channel fits, the
// causal conv1d + silu too; else blocks of 32 state columns, the norm left to the out_proj GEMV's
// load and the conv to the projection's epilogue (EPI_CONV).
#include "backend/cuda/decode.cuh"

#define DNH_MAX_THREADS 512 // threads of a head block: d_v x (4 for d_k 128, else 1)
#define DN_CONV_MAX     4   // conv taps held in registers by the head block

static __device__ __forceinline__ void warp_sum2(float &a, float &b) {
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
}

// Block-wide sums of two floats (nthreads a multiple of 32, <= 512); red: 2 * 16 floats.
static __device__ __forceinline__ void block_sum2(float &a, float &b, float *red) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    warp_sum2(a, b);
    __syncthreads(); // red may still be read by an earlier call
    if (lane == 0) red[warp] = a, red[16 + warp] = b;
    __syncthreads();
    a = b = 0.f;
    for (int w = 0; w < nw; w++) a += red[w], b += red[16 + w];
}

// The causal conv of one channel (conv_k <= DN_CONV_MAX taps; the state holds the last conv_k - 1
// inputs, oldest first), in the order of the projection's EPI_CONV epilogue, so both give the same
// bits.
struct dn_conv_ch {
    float w[DN_CONV_MAX], st[DN_CONV_MAX - 1];
};
static __device__ __forceinline__ void dn_conv_load(dn_conv_ch &c, const float *w, const float *st,
                                                    int K) {
#pragma unroll
    for (int i = 0; i < DN_CONV_MAX; i++) c.w[i] = i < K ? w[i] : 0.f;
#pragma unroll
    for (int i = 0; i < DN_CONV_MAX - 1; i++) c.st[i] = i < K - 1 ? st[i] : 0.f;
}
static __device__ __forceinline__ float dn_conv_out(const dn_conv_ch &c, float y, int K) {
    float o = 0.f;
#pragma unroll
    for (int i = 0; i < DN_CONV_MAX; i++)
        if (i == K - 1) o = c.w[i] * y;
#pragma unroll
    for (int i = 0; i < DN_CONV_MAX - 1; i++)
        if (i < K - 1) o += c.w[i] * c.st[i];
    return silu_f(o);
}
static __device__ __forceinline__ void dn_conv_store(const dn_conv_ch &c, float *st, float y,
                                                     int K) {
#pragma unroll
    for (int i = 0; i < DN_CONV_MAX - 1; i++)
        if (i < K - 1) st[i] = i + 1 < K - 1 ? c.st[i + 1] : y;
}

// Block = value head h; TPC threads per state column j (adjacent lanes), each holding DK / TPC
// of its rows in registers (TPC = 4 for DK = 128: 32 rows, ~100 registers; with 2 the block's 64 KB
// state came from half as many warps and each thread's chains were twice as long):
// kv = S^T k and o = S^T q are per-thread sums plus a shuffle, and the block sees the whole
// head's o, so it applies the gated RMSNorm: out_proj then reads a plain input (its prologue is
// ~2 us shorter). Four partial sums per dot product keep the dependent chains short. q and k sit
// in shared memory per row part, padded so the parts read different banks.
// With p.conv_w the block also runs the causal conv of its channels, thread t < 2 DK + dv owning
// one (q, k of its key head, v of its head): the taps and the state are loaded before the
// programmatic wait, so the projection ends with plain stores instead of its conv epilogue (a
// chain of round trips to the state). The value heads of a key head all read that head's q/k
// state before the wait; each takes a ticket once it has used its copy, and the last one writes
// the shifted state, so no block can read a state another already advanced.
template <int DK, int TPC>
__global__ void __launch_bounds__(DNH_MAX_THREADS)
    deltanet_head_kernel(const __grid_constant__ struct deltanet_params p) {
    constexpr int R = DK / TPC, RP = R + 4;
    __shared__ __align__(16) float q[TPC * RP], k[TPC * RP];
    __shared__ float vsm[DNH_MAX_THREADS / TPC];
    __shared__ float red[32];
    __shared__ bool last;
    const int h = blockIdx.x, t = threadIdx.x, j = t / TPC, part = t % TPC, dv = p.dv;
    const int nt = blockDim.x, kh = h / (p.v_heads / p.k_heads), qk = p.k_heads * DK;
    const bool ok = j < dv;
    float *Sh = p.S + ((size_t)h * DK + (size_t)part * R) * dv + j;
    float S[R];
    TRACE_BEGIN();
    pdl_trigger();
    // this layer's own state and constants: loaded while the projection is still finishing
#pragma unroll
    for (int i = 0; i < R; i++) S[i] = ok ? Sh[(size_t)i * dv] : 0.f;
    const float A_log = p.A_log[h], dt_bias = p.dt_bias[h];
    const float nw = ok ? p.norm_w[j] : 0.f;
    const bool conv = p.conv_w != nullptr;
    // conv mode: this thread's channel (-1: none) and its taps and state
    const int ch = !conv             ? -1
                   : t < DK          ? kh * DK + t
                   : t < 2 * DK      ? qk + kh * DK + (t - DK)
                   : t < 2 * DK + dv ? 2 * qk + h * dv + (t - 2 * DK)
                                     : -1;
    const int K = p.conv_k;
    dn_conv_ch cc;
    if (ch >= 0)
        dn_conv_load(cc, p.conv_w + (size_t)ch * K, p.conv_state + (size_t)ch * (K - 1), K);
    pdl_wait();
    TRACE_WAIT();
    const float b_in = __ldcg(p.b + h), a_in = __ldcg(p.a + h);
    const float zz = ok ? __ldcg(p.z + h * dv + j) : 0.f;
    float vv = 0.f, yraw = 0.f, sq = 0.f, sk = 0.f;
    if (conv) {
        // the q/k squares are summed by their channels' threads and published by the barrier
        // that publishes q and k (the same lanes and order as the loop below: the same bits)
        if (ch >= 0) {
            yraw = __ldcg(p.qkv + ch);
            const float o = dn_conv_out(cc, yraw, K);
            if (t < DK)
                q[t + t / R * 4] = o, sq = o * o;
            else if (t < 2 * DK)
                k[(t - DK) + (t - DK) / R * 4] = o, sk = o * o;
            else
                vsm[t - 2 * DK] = o;
        }
        warp_sum2(sq, sk);
        if ((t & 31) == 0) red[t >> 5] = sq, red[16 + (t >> 5)] = sk;
        __syncthreads(); // every channel's state has been used
        if (t == 0) {
            const unsigned n = (unsigned)(p.v_heads / p.k_heads);
            last = atomicInc(p.conv_tick + kh, n - 1) == n - 1;
        }
        if (ch >= 2 * qk) dn_conv_store(cc, p.conv_state + (size_t)ch * (K - 1), yraw, K);
        if (ok) vv = vsm[j];
        sq = sk = 0.f;
        for (int w = 0; w < (nt >> 5); w++) sq += red[w], sk += red[16 + w];
    } else {
        for (int i = t; i < DK; i += nt) {
            q[i + i / R * 4] = __ldcg(p.qkv + kh * DK + i);
            k[i + i / R * 4] = __ldcg(p.qkv + qk + kh * DK + i);
        }
        vv = ok ? __ldcg(p.qkv + 2 * qk + h * dv + j) : 0.f;
        __syncthreads();
        for (int i = t; i < DK; i += nt) {
            const float a = q[i + i / R * 4], b = k[i + i / R * 4];
            sq += a * a, sk += b * b;
        }
        block_sum2(sq, sk, red);
    }
    TRACE_MARK(0); // the inputs in (and their conv)
    const float qs = rsqrtf(sq + 1e-6f) * rsqrtf((float)DK), ks = rsqrtf(sk + 1e-6f);
    const float beta = sigmoid_f(b_in);
    const float ax = a_in + dt_bias;
    const float sp = ax > 20.f ? ax : log1pf(__expf(ax));
    const float g = __expf(-__expf(A_log) * sp);
    TRACE_MARK(1); // the q/k norms, g and beta
    const float4 *k4 = reinterpret_cast<const float4 *>(k + part * RP);
    const float4 *q4 = reinterpret_cast<const float4 *>(q + part * RP);
    float a4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < R / 4; i++) {
        const float4 kk = k4[i];
        a4[0] = fmaf(S[4 * i], kk.x, a4[0]);
        a4[1] = fmaf(S[4 * i + 1], kk.y, a4[1]);
        a4[2] = fmaf(S[4 * i + 2], kk.z, a4[2]);
        a4[3] = fmaf(S[4 * i + 3], kk.w, a4[3]);
    }
    float kv = (a4[0] + a4[1]) + (a4[2] + a4[3]);
#pragma unroll
    for (int o = 1; o < TPC; o <<= 1) kv += __shfl_xor_sync(0xffffffffu, kv, o);
    const float d = beta * (vv - g * kv * ks), dks = d * ks;
    a4[0] = a4[1] = a4[2] = a4[3] = 0.f;
#pragma unroll
    for (int i = 0; i < R / 4; i++) {
        const float4 kk = k4[i], qq = q4[i];
        S[4 * i] = fmaf(g, S[4 * i], kk.x * dks);
        S[4 * i + 1] = fmaf(g, S[4 * i + 1], kk.y * dks);
        S[4 * i + 2] = fmaf(g, S[4 * i + 2], kk.z * dks);
        S[4 * i + 3] = fmaf(g, S[4 * i + 3], kk.w * dks);
        a4[0] = fmaf(S[4 * i], qq.x, a4[0]);
        a4[1] = fmaf(S[4 * i + 1], qq.y, a4[1]);
        a4[2] = fmaf(S[4 * i + 2], qq.z, a4[2]);
        a4[3] = fmaf(S[4 * i + 3], qq.w, a4[3]);
    }
    if (ok)
#pragma unroll
        for (int i = 0; i < R; i++) Sh[(size_t)i * dv] = S[i];
    float o = (a4[0] + a4[1]) + (a4[2] + a4[3]);
#pragma unroll
    for (int off = 1; off < TPC; off <<= 1) o += __shfl_xor_sync(0xffffffffu, o, off);
    o *= qs;
    float so = ok && part == 0 ? o * o : 0.f, unused = 0.f;
    TRACE_MARK(2);               // the state updated
    block_sum2(so, unused, red); // its barriers also publish `last`
    if (ok && part == 0) p.y[h * dv + j] = o * rsqrtf(so / (float)dv + p.eps) * nw * silu_f(zz);
    if (ch >= 0 && ch < 2 * qk && last)
        dn_conv_store(cc, p.conv_state + (size_t)ch * (K - 1), yraw, K);
}

#define DN_WARPS 8

// Block (value head h, slice of 32 state columns): warp w owns state rows [w*RPW, (w+1)*RPW), lane
// l owns column 32*slice + l. The state is read and written once; q/k normalisation is recomputed
// by each block (dk values). Output: the raw readout o; the gated RMSNorm * silu(z) over the head
// is fused into the out_proj GEMV's input load (gemv_params.gn_*), which sees the whole head.
template <int RPW>
__global__ void __launch_bounds__(DN_WARPS * 32)
    deltanet_kernel(const __grid_constant__ struct deltanet_params p) {
    __shared__ float q[256], k[256];
    __shared__ float part[DN_WARPS][32];
    __shared__ float delta[32];
    __shared__ float red[2][DN_WARPS];
    const int h = blockIdx.x, dk = p.dk, dv = p.dv;
    const int kh = h / (p.v_heads / p.k_heads);
    const int qk = p.k_heads * dk;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int col = blockIdx.y * 32 + lane;
    const bool colok = col < dv;
    float *Sh = p.S + (size_t)h * dk * dv;
    float S[RPW];
    TRACE_BEGIN();
    pdl_trigger();
    // the state is this layer's own (last written a token ago): load it while the projection
    // that feeds q/k/v is still finishing, then wait for it
#pragma unroll
    for (int i = 0; i < RPW; i++) S[i] = colok ? Sh[(size_t)(warp * RPW + i) * dv + col] : 0.f;
    const float A_log = p.A_log[h], dt_bias = p.dt_bias[h];
    pdl_wait();
    TRACE_WAIT();
    // the gate inputs are loaded with q/k/v so their round trips overlap
    const float b_in = __ldcg(p.b + h), a_in = __ldcg(p.a + h);
    for (int i = tid; i < dk; i += blockDim.x) {
        q[i] = __ldcg(p.qkv + kh * dk + i);
        k[i] = __ldcg(p.qkv + qk + kh * dk + i);
    }
    const float vv = colok ? __ldcg(p.qkv + 2 * qk + h * dv + col) : 0.f;
    __syncthreads();
    float sq = 0.f, sk = 0.f;
    for (int i = tid; i < dk; i += blockDim.x) sq += q[i] * q[i], sk += k[i] * k[i];
#pragma unroll
    for (int off = 16; off; off >>= 1) {
        sq += __shfl_xor_sync(0xffffffffu, sq, off);
        sk += __shfl_xor_sync(0xffffffffu, sk, off);
    }
    if (lane == 0) red[0][warp] = sq, red[1][warp] = sk;
    __syncthreads();
    sq = sk = 0.f;
#pragma unroll
    for (int w = 0; w < DN_WARPS; w++) sq += red[0][w], sk += red[1][w];
    const float qs = rsqrtf(sq + 1e-6f) * rsqrtf((float)dk), ks = rsqrtf(sk + 1e-6f);
    const float beta = sigmoid_f(b_in);
    const float ax = a_in + dt_bias;
    const float sp = ax > 20.f ? ax : log1pf(__expf(ax));
    const float g = __expf(-__expf(A_log) * sp);
    float kr[RPW], qr[RPW];
#pragma unroll
    for (int i = 0; i < RPW; i++) kr[i] = k[warp * RPW + i] * ks, qr[i] = q[warp * RPW + i] * qs;
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < RPW; i++) acc += S[i] * kr[i];
    part[warp][lane] = acc;
    __syncthreads();
    if (warp == 0) {
        float kv = 0.f;
#pragma unroll
        for (int w = 0; w < DN_WARPS; w++) kv += part[w][lane];
        delta[lane] = beta * (vv - g * kv);
    }
    __syncthreads();
    const float d = delta[lane];
    acc = 0.f;
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        S[i] = g * S[i] + kr[i] * d;
        acc += S[i] * qr[i];
    }
    if (colok)
#pragma unroll
        for (int i = 0; i < RPW; i++) Sh[(size_t)(warp * RPW + i) * dv + col] = S[i];
    part[warp][lane] = acc; // every warp read part before the second barrier
    __syncthreads();
    if (warp == 0 && colok) {
        float o = 0.f;
#pragma unroll
        for (int w = 0; w < DN_WARPS; w++) o += part[w][lane];
        p.y[h * dv + col] = o;
    }
}

static int dnh_tpc(int dk) {
    return dk == 128 ? 4 : 1;
}

bool deltanet_conv_ok(const struct deltanet_params *p, int conv_k) {
    if (!deltanet_head_ok(p) || conv_k < 1 || conv_k > DN_CONV_MAX) return false;
    const int threads = (p->dv * dnh_tpc(p->dk) + 31) / 32 * 32;
    return 2 * p->dk + p->dv <= threads;
}

bool deltanet_head_ok(const struct deltanet_params *p) {
    return !decode_dn_slices() && (p->dk == 16 || p->dk == 32 || p->dk == 64 || p->dk == 128) &&
           p->dv > 0 && p->dv * dnh_tpc(p->dk) <= DNH_MAX_THREADS && p->k_heads > 0 &&
           p->v_heads > 0 && p->v_heads % p->k_heads == 0;
}

int deltanet_launch(const struct deltanet_params *p, cudaStream_t s, struct wren_err *e) {
    if (p->conv_w &&
        (!p->norm_w || !p->conv_state || !p->conv_tick || !deltanet_conv_ok(p, p->conv_k)))
        return wren_errf(e,
                         "deltanet: the fused conv needs the per-head kernel, 2 d_k + d_v "
                         "channels within its threads and at most %d taps (got d_k %d, d_v %d, "
                         "%d taps)",
                         DN_CONV_MAX, p->dk, p->dv, p->conv_k);
    if (p->norm_w) {
        if (!deltanet_head_ok(p))
            return wren_errf(e,
                             "deltanet: the fused gated norm needs d_k 16, 32, 64 or 128 and "
                             "d_v <= %d (got d_k %d, d_v %d)",
                             DNH_MAX_THREADS / dnh_tpc(p->dk), p->dk, p->dv);
        void (*k)(const struct deltanet_params) = p->dk == 16   ? deltanet_head_kernel<16, 1>
                                                  : p->dk == 32 ? deltanet_head_kernel<32, 1>
                                                  : p->dk == 64 ? deltanet_head_kernel<64, 1>
                                                                : deltanet_head_kernel<128, 4>;
        const int threads = (p->dv * dnh_tpc(p->dk) + 31) / 32 * 32;
        CUDA_CHECK(pdl_launch(k, dim3(p->v_heads), dim3(threads), 0, s, decode_pdl(), *p));
        return 0;
    }
    if (p->dk > 256 || p->dk % DN_WARPS || p->v_heads % p->k_heads)
        return wren_errf(
            e, "deltanet: unsupported head sizes d_k %d, d_v %d (need d_k <= 256, d_k %% 8 == 0)",
            p->dk, p->dv);
    const int rpw = p->dk / DN_WARPS;
    void (*k)(const struct deltanet_params) = nullptr;
    switch (rpw) {
    case 1:
        k = deltanet_kernel<1>;
        break;
    case 2:
        k = deltanet_kernel<2>;
        break;
    case 4:
        k = deltanet_kernel<4>;
        break;
    case 8:
        k = deltanet_kernel<8>;
        break;
    case 16:
        k = deltanet_kernel<16>;
        break;
    case 32:
        k = deltanet_kernel<32>;
        break;
    default:
        return wren_errf(e, "deltanet: d_k %d is not 8, 16, 32, 64, 128 or 256", p->dk);
    }
    dim3 grid(p->v_heads, (p->dv + 31) / 32);
    CUDA_CHECK(pdl_launch(k, grid, dim3(DN_WARPS * 32), 0, s, decode_pdl(), *p));
    return 0;
}
