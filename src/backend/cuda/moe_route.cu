// MoE routing of a prefill chunk, entirely on the GPU and in stream order (no host sync):
// softmax + top-k per token, per-expert histogram, prefix scan to row offsets and to the grouped
// GEMM's tile map, scatter of (token, choice) pairs into expert-sorted rows; after the expert
// GEMMs, a weighted gather back into the residual stream together with the gated shared expert.
#include "backend/cuda/prefill.cuh"

namespace {

constexpr int MAX_E_PER_LANE = 32; // up to 1024 experts
constexpr int SCAN_THREADS = 1024;

// One warp per token. Ties go to the lower expert index (as a stable sort of the probabilities).
__global__ void topk_kernel(const float *logits, int T, int E, int k, bool norm, int *topk_id,
                            float *topk_w, int *counts) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (warp >= T) return;
    const float *row = logits + (size_t)warp * E;
    float v[MAX_E_PER_LANE];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < MAX_E_PER_LANE; i++) {
        int ex = i * 32 + lane;
        v[i] = ex < E ? row[ex] : -INFINITY;
        mx = fmaxf(mx, v[i]);
    }
    for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, o));
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < MAX_E_PER_LANE; i++) {
        v[i] = i * 32 + lane < E ? __expf(v[i] - mx) : -1.f; // probabilities are >= 0
        sum += fmaxf(v[i], 0.f);
    }
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(~0u, sum, o);
    float picked_sum = 0.f, my_w = 0.f;
    int my_id = 0;
    for (int j = 0; j < k; j++) {
        float best = -2.f;
        int bi = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < MAX_E_PER_LANE; i++)
            if (v[i] > best) best = v[i], bi = i * 32 + lane;
        for (int o = 16; o; o >>= 1) {
            float ob = __shfl_xor_sync(~0u, best, o);
            int oi = __shfl_xor_sync(~0u, bi, o);
            if (ob > best || (ob == best && oi < bi)) best = ob, bi = oi;
        }
        if ((bi & 31) == lane) v[bi >> 5] = -2.f; // only the owner lane removes it
        picked_sum += best / sum;
        if (lane == j) my_w = best / sum, my_id = bi;
    }
    if (lane < k) {
        topk_id[warp * k + lane] = my_id;
        topk_w[warp * k + lane] = norm ? my_w / picked_sum : my_w;
        atomicAdd(&counts[my_id], 1);
    }
}

// Exclusive scans of counts (row offsets) and of tiles per expert (tile offsets); writes the map.
__global__ void scan_kernel(const int *counts, int E, int bm, int *offsets, int *cursor, int *tiles,
                            int *n_tiles) {
    __shared__ int s_rows[SCAN_THREADS], s_tiles[SCAN_THREADS];
    const int t = threadIdx.x;
    int c = t < E ? counts[t] : 0, nt = (c + bm - 1) / bm;
    s_rows[t] = c;
    s_tiles[t] = nt;
    __syncthreads();
    for (int o = 1; o < SCAN_THREADS; o <<= 1) { // Hillis-Steele inclusive scan
        int a = t >= o ? s_rows[t - o] : 0, b = t >= o ? s_tiles[t - o] : 0;
        __syncthreads();
        s_rows[t] += a;
        s_tiles[t] += b;
        __syncthreads();
    }
    const int row0 = s_rows[t] - c, tile0 = s_tiles[t] - nt;
    if (t < E) {
        offsets[t] = row0;
        cursor[t] = 0;
        for (int i = 0; i < nt; i++) {
            tiles[3 * (tile0 + i)] = t;
            tiles[3 * (tile0 + i) + 1] = row0 + i * bm;
            tiles[3 * (tile0 + i) + 2] = min(row0 + (i + 1) * bm, row0 + c);
        }
    }
    if (t == SCAN_THREADS - 1) {
        n_tiles[0] = s_tiles[t];
        offsets[E] = s_rows[t];
    }
}

__global__ void scatter_kernel(const int *topk_id, int Tk, int k, const int *offsets, int *cursor,
                               int *sorted_tok, int *slot) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= Tk) return;
    const int ex = topk_id[i];
    const int r = offsets[ex] + atomicAdd(&cursor[ex], 1);
    sorted_tok[r] = i / k;
    slot[i] = r;
}

__global__ void combine_kernel(float *x, const float *y, const int *slot, const float *topk_w,
                               int k, int H, const float *sh, const float *sh_gate) {
    const int t = blockIdx.x;
    const float g = !sh ? 0.f : sh_gate ? 1.f / (1.f + __expf(-sh_gate[t * 2])) : 1.f;
    for (int h = threadIdx.x; h < H; h += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < k; j++) acc += topk_w[t * k + j] * y[(size_t)slot[t * k + j] * H + h];
        if (sh) acc += g * sh[(size_t)t * H + h];
        x[(size_t)t * H + h] += acc;
    }
}

// Router logits in f32 from f32 activations and exactly dequantized weights (CUDA cores): top-k
// choices flip on router-logit errors far below bf16 rounding. Block per RT tokens, thread per
// expert; the tokens' activations pass through shared memory 64 inputs at a time.
constexpr int RT = 32, RK = 64;

__global__ void __launch_bounds__(256)
    router_kernel(const float *x, int T, const struct dmat W, float *out) {
    __shared__ __align__(16) float xs[RT][RK];
    const int t0 = blockIdx.x * RT, H = W.cols, E = W.rows, nt = min(RT, T - t0);
    for (int e0 = 0; e0 < E; e0 += blockDim.x) {
        const int ex = e0 + threadIdx.x;
        const bool ok = ex < E;
        const uint8_t *row = W.data + (size_t)(ok ? ex : 0) * W.row_stride;
        const bf16 *sc =
            reinterpret_cast<const bf16 *>(W.scales + (size_t)(ok ? ex : 0) * W.sb_row_stride);
        const bf16 *bi =
            reinterpret_cast<const bf16 *>(W.biases + (size_t)(ok ? ex : 0) * W.sb_row_stride);
        float acc[RT];
#pragma unroll
        for (int r = 0; r < RT; r++) acc[r] = 0.f;
        for (int k0 = 0; k0 < H; k0 += RK) {
            __syncthreads();
            for (int i = threadIdx.x; i < RT * RK; i += blockDim.x) {
                const int r = i / RK, k = i % RK;
                xs[r][k] = r < nt ? x[(size_t)(t0 + r) * H + k0 + k] : 0.f;
            }
            __syncthreads();
            float w[RK];
#pragma unroll
            for (int k = 0; k < RK; k++) {
                const int kk = k0 + k;
                if (W.type == WT_F32) {
                    w[k] = reinterpret_cast<const float *>(row)[kk];
                } else if (W.type == WT_BF16) {
                    w[k] = __bfloat162float(reinterpret_cast<const bf16 *>(row)[kk]);
                } else {
                    const int per = 32 / W.bits;
                    const uint32_t word = reinterpret_cast<const uint32_t *>(row)[kk / per];
                    const uint32_t q = (word >> (W.bits * (kk % per))) & ((1u << W.bits) - 1);
                    w[k] = __bfloat162float(sc[kk / W.group]) * (float)q +
                           __bfloat162float(bi[kk / W.group]);
                }
            }
#pragma unroll
            for (int r = 0; r < RT; r++) {
#pragma unroll
                for (int k = 0; k < RK; k += 4) {
                    const float4 xv = *reinterpret_cast<const float4 *>(&xs[r][k]);
                    acc[r] = fmaf(w[k], xv.x, acc[r]);
                    acc[r] = fmaf(w[k + 1], xv.y, acc[r]);
                    acc[r] = fmaf(w[k + 2], xv.z, acc[r]);
                    acc[r] = fmaf(w[k + 3], xv.w, acc[r]);
                }
            }
        }
        if (ok)
            for (int r = 0; r < nt; r++) out[(size_t)(t0 + r) * E + ex] = acc[r];
    }
}

} // namespace

int pf_router_f32(cudaStream_t s, const float *x, int T, const struct dmat *W, float *out,
                  struct wren_err *e) {
    if (W->cols % RK != 0)
        return wren_errf(e, "MoE router: hidden size %d is not a multiple of %d", W->cols, RK);
    router_kernel<<<(T + RT - 1) / RT, 256, 0, s>>>(x, T, *W, out);
    CUDA_CHECK_LAUNCH();
    return 0;
}

int pf_moe_max_tiles(int T, int E, int k, int bm) {
    return (T * k + bm - 1) / bm + E;
}

int pf_moe_route(cudaStream_t s, const float *logits, int T, int E, int k, bool norm_topk, int bm,
                 const struct moe_route_buf *b, struct wren_err *e) {
    if (E > 32 * MAX_E_PER_LANE || E > SCAN_THREADS || k > 32 || k > E)
        return wren_errf(e, "MoE routing: %d experts / top-%d not supported (max 1024 / 32)", E, k);
    if (b->max_tiles < pf_moe_max_tiles(T, E, k, bm))
        return wren_errf(e, "MoE routing: tile map too small");
    CUDA_CHECK(cudaMemsetAsync(b->counts, 0, sizeof(int) * E, s));
    topk_kernel<<<(T * 32 + 255) / 256, 256, 0, s>>>(logits, T, E, k, norm_topk, b->topk_id,
                                                     b->topk_w, b->counts);
    CUDA_CHECK_LAUNCH();
    scan_kernel<<<1, SCAN_THREADS, 0, s>>>(b->counts, E, bm, b->offsets, b->cursor, b->tiles,
                                           b->n_tiles);
    CUDA_CHECK_LAUNCH();
    scatter_kernel<<<(T * k + 255) / 256, 256, 0, s>>>(b->topk_id, T * k, k, b->offsets, b->cursor,
                                                       b->sorted_tok, b->slot);
    CUDA_CHECK_LAUNCH();
    return 0;
}

int pf_moe_combine(cudaStream_t s, float *x, const float *y_sorted, const int *slot,
                   const float *topk_w, int T, int k, int H, const float *sh, const float *sh_gate,
                   struct wren_err *e) {
    combine_kernel<<<T, 256, 0, s>>>(x, y_sorted, slot, topk_w, k, H, sh, sh_gate);
    CUDA_CHECK_LAUNCH();
    return 0;
}
