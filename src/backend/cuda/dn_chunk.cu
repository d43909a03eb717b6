// Gated DeltaNet over a prefill chunk: causal conv1d (+ conv state), q/k l2norm, beta and g, the
// recurrence with the state in registers, and the gated RMSNorm before out_proj.
//
// The recurrence is column-separable: column j of S (one value dim) evolves from k, q, g, beta and
// v[j] alone. So a block owns 16 columns of one value head; 8 lanes share a column (DK/8 rows of S
// each, in registers) and combine their partial dot products with 3 shuffles. Inputs are staged
// through shared memory CT steps at a time (double-buffered cp.async). This is the sequential form;
// its cost is linear in T.
#include "backend/cuda/prefill.cuh"

namespace {

constexpr int CONV_TB = 32; // timesteps per conv thread
constexpr int SCAN_COLS = 16, SCAN_THREADS = SCAN_COLS * 8, CT = 16;

// Thread per (channel, block of CONV_TB steps).
__global__ void conv_kernel(const float *x, const float *state, const float *w, float *y, int T,
                            int C, int K) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int t0 = blockIdx.y * CONV_TB;
    if (c >= C) return;
    float wc[8];
    for (int i = 0; i < K; i++) wc[i] = w[c * K + i];
    for (int t = t0; t < min(t0 + CONV_TB, T); t++) {
        float acc = 0.f;
        for (int i = 0; i < K; i++) {
            int src = t - (K - 1) + i; // < 0: from the state (its index K-1+src, oldest first)
            float xv = src >= 0 ? x[(size_t)src * C + c] : state[c * (K - 1) + (K - 1) + src];
            acc += wc[i] * xv;
        }
        y[(size_t)t * C + c] = silu_f(acc);
    }
}

__global__ void conv_state_kernel(const float *x, float *state, int T, int C, int K) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float ns[8];
    for (int i = 0; i < K - 1; i++) {
        int src = T - (K - 1) + i;
        ns[i] = src >= 0 ? x[(size_t)src * C + c] : state[c * (K - 1) + (K - 1) + src];
    }
    for (int i = 0; i < K - 1; i++) state[c * (K - 1) + i] = ns[i];
}

// Block per token: a warp per q/k head (l2norm), then beta and g per value head.
__global__ void qk_norm_kernel(float *qkvc, float *ba, const float *A_log, const float *dt_bias,
                               int C, int kh, int vh, int dk) {
    const int t = blockIdx.x, lane = threadIdx.x & 31;
    float *row = qkvc + (size_t)t * C;
    const float qscale = rsqrtf((float)dk);
    for (int w = threadIdx.x >> 5; w < 2 * kh; w += blockDim.x >> 5) {
        float *v = row + (size_t)w * dk; // q heads, then k heads
        float ss = 0.f;
        for (int i = lane; i < dk; i += 32) ss += v[i] * v[i];
        for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(~0u, ss, o);
        float r = rsqrtf(ss + 1e-6f) * (w < kh ? qscale : 1.f);
        for (int i = lane; i < dk; i += 32) v[i] *= r;
    }
    for (int h = threadIdx.x; h < vh; h += blockDim.x) {
        float *p = ba + (size_t)t * 2 * vh;
        float b = p[h], a = p[vh + h] + dt_bias[h];
        float sp = a > 20.f ? a : log1pf(__expf(a));
        p[h] = 1.f / (1.f + __expf(-b));
        p[vh + h] = __expf(-__expf(A_log[h]) * sp);
    }
}

__device__ __forceinline__ void cp_async(void *smem, const void *g, int bytes) {
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(smem);
    if (bytes == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(g));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(sa), "l"(g));
}

// Inputs of CT steps are staged by cp.async into one of two buffers while the other is consumed,
// so the sequential loop never waits on global memory.
template <int DK>
__global__ void __launch_bounds__(SCAN_THREADS)
    scan_kernel(const float *qkvc, const float *ba, float *S, float *o, int T, int C, int kh,
                int vh, int dv) {
    // Thread sl of a column owns rows (ii*8 + sl)*4 + e (ii < DK/32, e < 4): the 8 lanes of a
    // column then read 8 consecutive float4 of k and q, free of shared-memory bank conflicts.
    constexpr int R = DK / 8; // rows of S per thread
    __shared__ __align__(16) float qs[2][CT][DK], ks[2][CT][DK];
    __shared__ __align__(16) float vs[2][CT][SCAN_COLS];
    __shared__ float gs[2][CT], bs[2][CT];
    const int h = blockIdx.y, j0 = blockIdx.x * SCAN_COLS;
    const int tid = threadIdx.x, jj = tid >> 3, sl = tid & 7;
    const int khead = h / (vh / kh);
    const int qoff = khead * DK, koff = kh * DK + khead * DK, voff = 2 * kh * DK + h * dv + j0;
    float *Sh = S + (size_t)h * DK * dv;

    auto stage = [&](int c0, int buf) {
        const int n = min(CT, T - c0);
        for (int i = tid; i < n * DK / 4; i += SCAN_THREADS) {
            const int t = i / (DK / 4), d = (i % (DK / 4)) * 4;
            const float *row = qkvc + (size_t)(c0 + t) * C;
            cp_async(&qs[buf][t][d], row + qoff + d, 16);
            cp_async(&ks[buf][t][d], row + koff + d, 16);
        }
        for (int i = tid; i < n * SCAN_COLS / 4; i += SCAN_THREADS) {
            const int t = i / (SCAN_COLS / 4), d = (i % (SCAN_COLS / 4)) * 4;
            cp_async(&vs[buf][t][d], qkvc + (size_t)(c0 + t) * C + voff + d, 16);
        }
        for (int t = tid; t < n; t += SCAN_THREADS) {
            cp_async(&bs[buf][t], ba + (size_t)(c0 + t) * 2 * vh + h, 4);
            cp_async(&gs[buf][t], ba + (size_t)(c0 + t) * 2 * vh + vh + h, 4);
        }
        asm volatile("cp.async.commit_group;\n");
    };

    auto row_of = [&](int i) { return ((i >> 2) * 8 + sl) * 4 + (i & 3); };
    float st[R];
#pragma unroll
    for (int i = 0; i < R; i++) st[i] = Sh[(size_t)row_of(i) * dv + j0 + jj];

    stage(0, 0);
    for (int c0 = 0, buf = 0; c0 < T; c0 += CT, buf ^= 1) {
        const int n = min(CT, T - c0);
        if (c0 + CT < T)
            stage(c0 + CT, buf ^ 1);
        else
            asm volatile("cp.async.commit_group;\n");
        asm volatile("cp.async.wait_group 1;\n");
        __syncthreads();
        for (int t = 0; t < n; t++) {
            const float g = gs[buf][t], beta = bs[buf][t];
            float kv[R], qv[R];
#pragma unroll
            for (int i = 0; i < R; i += 4) {
                *reinterpret_cast<float4 *>(&kv[i]) =
                    *reinterpret_cast<const float4 *>(&ks[buf][t][row_of(i)]);
                *reinterpret_cast<float4 *>(&qv[i]) =
                    *reinterpret_cast<const float4 *>(&qs[buf][t][row_of(i)]);
            }
            // two partial sums halve the dependent FMA chain
            float kS0 = 0.f, kS1 = 0.f;
#pragma unroll
            for (int i = 0; i < R; i += 2) {
                st[i] *= g;
                st[i + 1] *= g;
                kS0 += st[i] * kv[i];
                kS1 += st[i + 1] * kv[i + 1];
            }
            float kS = kS0 + kS1;
            kS += __shfl_xor_sync(~0u, kS, 1);
            kS += __shfl_xor_sync(~0u, kS, 2);
            kS += __shfl_xor_sync(~0u, kS, 4);
            const float delta = beta * (vs[buf][t][jj] - kS);
            float ov0 = 0.f, ov1 = 0.f;
#pragma unroll
            for (int i = 0; i < R; i += 2) {
                st[i] += kv[i] * delta;
                st[i + 1] += kv[i + 1] * delta;
                ov0 += st[i] * qv[i];
                ov1 += st[i + 1] * qv[i + 1];
            }
            float ov = ov0 + ov1;
            ov += __shfl_xor_sync(~0u, ov, 1);
            ov += __shfl_xor_sync(~0u, ov, 2);
            ov += __shfl_xor_sync(~0u, ov, 4);
            if (sl == 0) o[(size_t)(c0 + t) * vh * dv + h * dv + j0 + jj] = ov;
        }
        __syncthreads(); // buffer `buf` is refilled by the next iteration's stage
    }
#pragma unroll
    for (int i = 0; i < R; i++) Sh[(size_t)row_of(i) * dv + j0 + jj] = st[i];
}

// Warp per (token, value head): y = rmsnorm(o) * w * silu(z), in f32, stored bf16.
__global__ void gate_norm_kernel(const float *o, const bf16 *z, const float *w, float eps, bf16 *y,
                                 int T, int vh, int dv) {
    const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (gw >= T * vh) return;
    const size_t base = (size_t)gw * dv; // rows of [T][vh][dv] are contiguous
    float ss = 0.f;
    for (int i = lane; i < dv; i += 32) ss += o[base + i] * o[base + i];
    for (int off = 16; off; off >>= 1) ss += __shfl_xor_sync(~0u, ss, off);
    const float r = rsqrtf(ss / dv + eps);
    for (int i = lane; i < dv; i += 32)
        y[base + i] =
            __float2bfloat16(o[base + i] * r * w[i] * silu_f(__bfloat162float(z[base + i])));
}

} // namespace

int pf_dn_prep(cudaStream_t s, const struct dn_dims *d, const float *qkv, float *conv_state,
               const float *conv_w, float *qkvc, float *ba, const float *A_log,
               const float *dt_bias, struct wren_err *e) {
    const int C = 2 * d->kh * d->dk + d->vh * d->dv;
    if (d->kernel < 2 || d->kernel > 8)
        return wren_errf(e, "DeltaNet: conv kernel %d not supported (2..8)", d->kernel);
    dim3 grid((C + 127) / 128, (d->T + CONV_TB - 1) / CONV_TB);
    conv_kernel<<<grid, 128, 0, s>>>(qkv, conv_state, conv_w, qkvc, d->T, C, d->kernel);
    CUDA_CHECK_LAUNCH();
    conv_state_kernel<<<(C + 127) / 128, 128, 0, s>>>(qkv, conv_state, d->T, C, d->kernel);
    CUDA_CHECK_LAUNCH();
    qk_norm_kernel<<<d->T, 256, 0, s>>>(qkvc, ba, A_log, dt_bias, C, d->kh, d->vh, d->dk);
    CUDA_CHECK_LAUNCH();
    return 0;
}

int pf_dn_scan(cudaStream_t s, const struct dn_dims *d, const float *qkv, const float *ba, float *S,
               float *o, struct wren_err *e) {
    const int C = 2 * d->kh * d->dk + d->vh * d->dv;
    if (d->dv % SCAN_COLS != 0 || d->vh % d->kh != 0)
        return wren_errf(e,
                         "DeltaNet: value dim %d (must be a multiple of %d) or heads %d/%d "
                         "not supported",
                         d->dv, SCAN_COLS, d->vh, d->kh);
    dim3 grid(d->dv / SCAN_COLS, d->vh);
    switch (d->dk) {
    case 32:
        scan_kernel<32><<<grid, SCAN_THREADS, 0, s>>>(qkv, ba, S, o, d->T, C, d->kh, d->vh, d->dv);
        break;
    case 64:
        scan_kernel<64><<<grid, SCAN_THREADS, 0, s>>>(qkv, ba, S, o, d->T, C, d->kh, d->vh, d->dv);
        break;
    case 128:
        scan_kernel<128><<<grid, SCAN_THREADS, 0, s>>>(qkv, ba, S, o, d->T, C, d->kh, d->vh, d->dv);
        break;
    default:
        return wren_errf(e, "DeltaNet: key dim %d not supported (32, 64, 128)", d->dk);
    }
    CUDA_CHECK_LAUNCH();
    return 0;
}

int pf_dn_gate_norm(cudaStream_t s, const struct dn_dims *d, const float *o, const bf16 *z,
                    const float *w, float eps, bf16 *y, struct wren_err *e) {
    const int warps = d->T * d->vh;
    gate_norm_kernel<<<(warps * 32 + 255) / 256, 256, 0, s>>>(o, z, w, eps, y, d->T, d->vh, d->dv);
    CUDA_CHECK_LAUNCH();
    return 0;
}
