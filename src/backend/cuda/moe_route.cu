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

// Inclusive scan of s[0..SCAN_THREADS) by the block (Hillis-Steele); s is complete on return.
__device__ void block_scan(int *s, int t) {
    __syncthreads();
    for (int o = 1; o < SCAN_THREADS; o <<= 1) {
        const int a = t >= o ? s[t - o] : 0;
        __syncthreads();
        s[t] += a;
        __syncthreads();
    }
}

// Exclusive scan of counts (row offsets) and the tile map. by_size: experts in descending order of
// rows (all above SCAN_THREADS - 1 rows as one class), an expert's tiles adjacent, so that the
// grouped GEMM's CTAs (dispatched in index order) start the largest experts first and the SMs
// finish their last, shortest tiles close together, while tiles that read the same expert's
// weights still run side by side (sharing them in the L2). The order among experts of equal rows
// is whatever the atomics give: a tile's results do not depend on its place in the map.
// Otherwise in expert order.
__global__ void scan_kernel(const int *counts, int E, int bm, bool by_size, int *offsets,
                            int *cursor, int *tiles, int *n_tiles) {
    __shared__ int s_rows[SCAN_THREADS], s_tiles[SCAN_THREADS];
    const int t = threadIdx.x;
    const int c = t < E ? counts[t] : 0, nt = (c + bm - 1) / bm;
    s_rows[t] = c;
    s_tiles[t] = nt;
    block_scan(s_rows, t);
    block_scan(s_tiles, t);
    const int row0 = s_rows[t] - c, n_all = s_tiles[SCAN_THREADS - 1];
    int tile0 = s_tiles[t] - nt;
    if (by_size) {
        // s_tiles[SCAN_THREADS - 1 - key]: tiles of the experts with key = min(rows, SCAN_THREADS
        // - 1), scanned, less each slot's own count: where the experts of that key start
        const int key = SCAN_THREADS - 1 - min(c, SCAN_THREADS - 1);
        __syncthreads();
        s_tiles[t] = 0;
        __syncthreads();
        if (nt > 0) atomicAdd(&s_tiles[key], nt);
        __syncthreads();
        const int own = s_tiles[t];
        block_scan(s_tiles, t);
        s_tiles[t] -= own;
        __syncthreads();
        if (nt > 0) tile0 = atomicAdd(&s_tiles[key], nt);
    }
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
        n_tiles[0] = n_all;
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

// The tile map by expert size from this many rows per expert on average (the wgmma kernel's
// item shape 1, gemm_wg.cu). Measured (bench/RESULTS.md, seventeenth session), whole prefill:
// 4K +3% (the expert GEMMs 11% faster), 8K and 32K unchanged; 1K and 2K 0.4-1% slower.
constexpr int BY_SIZE_ROWS = 112;
int g_tiles_by_size = -1;

} // namespace

void pf_moe_tiles_by_size(int mode) {
    g_tiles_by_size = mode;
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
    const bool by_size =
        g_tiles_by_size < 0 ? (long)T * k >= (long)BY_SIZE_ROWS * E : g_tiles_by_size != 0;
    scan_kernel<<<1, SCAN_THREADS, 0, s>>>(b->counts, E, bm, by_size, b->offsets, b->cursor,
                                           b->tiles, b->n_tiles);
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
