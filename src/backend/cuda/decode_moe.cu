// MoE down projections for one token: out[o] += sum_k down_{e_k}[o] . act_k + down_s[o] . act_s.
// The routing weights (and the shared expert's sigmoid gate) are already folded into act by the
// gate/up launch, so this is one long dot product per output row over the concatenated slots:
// every thread streams (slot, chunk) pairs of R rows, and the expert ids never leave the GPU.
#include "backend/cuda/gemv_dev.cuh"

#define MOE_THREADS 256
#define MOE_R       4

// Partial dot products over chunks [t, C) step TPR of R rows of one matrix (mat), input xs.
template <int BITS, int TPR>
static __device__ __forceinline__ void down_rows(const struct dmat &m, int mat,
                                                 const int (&rows)[MOE_R], const float *xs, int C,
                                                 int t, float (&acc)[MOE_R]) {
    const uint8_t *rp[MOE_R];
    const uint16_t *sp[MOE_R], *bp[MOE_R];
#pragma unroll
    for (int i = 0; i < MOE_R; i++) row_ptrs(m, mat, rows[i], rp[i], sp[i], bp[i]);
    rows_dot<BITS, MOE_R, TPR>(rp, sp, bp, m.group, xs, C, t, acc);
}

template <int BITS, int TPR>
__global__ void __launch_bounds__(MOE_THREADS)
    moe_down_kernel(const __grid_constant__ struct moe_down_params p) {
    extern __shared__ float xs[];
    __shared__ float red[MOE_THREADS / 32 * MOE_R];
    __shared__ int ids[64];
    const int total = p.K * p.inter + p.sh_inter;
    for (int i = threadIdx.x; i < total; i += blockDim.x) xs[xpad(i)] = p.act[i];
    for (int i = threadIdx.x; i < p.K; i += blockDim.x) ids[i] = p.ids[i];
    __syncthreads();
    const int t = threadIdx.x % TPR, grp = threadIdx.x / TPR;
    const int row0 = (blockIdx.x * (MOE_THREADS / TPR) + grp) * MOE_R;
    int rows[MOE_R];
#pragma unroll
    for (int i = 0; i < MOE_R; i++) rows[i] = row0 + i < p.hidden ? row0 + i : 0;
    float acc[MOE_R] = {};
    // routed experts: the TPR threads walk the flattened (slot, chunk) sequence, so experts with
    // fewer chunks than threads still keep every lane loading
    {
        constexpr int EPC = wfmt<BITS>::EPC;
        const int C = p.inter / EPC;
        const struct dmat &m = p.down;
#pragma unroll 2
        for (int f = t; f < p.K * C; f += TPR) {
            const int k = f / C, c = f - k * C;
            const uint8_t *rp[MOE_R];
            const uint16_t *sp[MOE_R], *bp[MOE_R];
#pragma unroll
            for (int i = 0; i < MOE_R; i++) row_ptrs(m, ids[k], rows[i], rp[i], sp[i], bp[i]);
            chunk_dot<BITS, MOE_R>(rp, sp, bp, m.group, c, xs + xpad(k * p.inter + c * EPC), acc);
        }
    }
    if (p.sh_inter > 0) {
        const float *xsh = xs + xpad(p.K * p.inter);
        const int sb = dmat_bits(p.sh_down.type, p.sh_down.bits);
        if (sb == 4)
            down_rows<4, TPR>(p.sh_down, 0, rows, xsh, p.sh_inter / 32, t, acc);
        else if (sb == 8)
            down_rows<8, TPR>(p.sh_down, 0, rows, xsh, p.sh_inter / 16, t, acc);
        else
            down_rows<16, TPR>(p.sh_down, 0, rows, xsh, p.sh_inter / 8, t, acc);
    }
    group_reduce<MOE_R, TPR>(acc, red);
#pragma unroll
    for (int i = 0; i < MOE_R; i++)
        if (t == i && row0 + i < p.hidden) p.out[row0 + i] += acc[i];
}

template <int BITS>
static int launch_bits(const struct moe_down_params *p, int tpr, int nb, size_t smem,
                       cudaStream_t s, struct wren_err *e) {
    void (*k)(const struct moe_down_params) = tpr == 32   ? moe_down_kernel<BITS, 32>
                                              : tpr == 64 ? moe_down_kernel<BITS, 64>
                                                          : moe_down_kernel<BITS, 128>;
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    k<<<nb, MOE_THREADS, smem, s>>>(*p);
    CUDA_CHECK_LAUNCH();
    return 0;
}

int moe_down_launch(const struct moe_down_params *p, cudaStream_t s, struct wren_err *e) {
    if (p->K > 64) return wren_errf(e, "moe: top-k of %d is more than the supported 64", p->K);
    if ((p->K && p->inter % 32) || p->sh_inter % 32)
        return wren_errf(e, "moe: expert sizes must be multiples of 32 (got %d, %d)", p->inter,
                         p->sh_inter);
    if (!decode_f32_gemv() && qdown_eligible(p)) return qdown_launch(p, s, e);
    const int bits = p->K ? dmat_bits(p->down.type, p->down.bits) : 4;
    // chunks per row across all slots decide how many threads share a row group
    int chunks =
        p->K * p->inter / (128 / bits) +
        (p->sh_inter ? p->sh_inter * dmat_bits(p->sh_down.type, p->sh_down.bits) / 128 : 0);
    // one block per ~SM is enough (each thread keeps 2 x MOE_R loads in flight); more blocks only
    // repeat the activation prologue
    int tpr = chunks >= 64 ? 64 : 32;
    int rows_per_block = MOE_THREADS / tpr * MOE_R;
    int nb = (p->hidden + rows_per_block - 1) / rows_per_block;
    size_t smem = (size_t)xpad_len(p->K * p->inter + p->sh_inter) * sizeof(float);
    if (bits == 4) return launch_bits<4>(p, tpr, nb, smem, s, e);
    if (bits == 8) return launch_bits<8>(p, tpr, nb, smem, s, e);
    return launch_bits<16>(p, tpr, nb, smem, s, e);
}
