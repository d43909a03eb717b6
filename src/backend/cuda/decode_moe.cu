// MoE down projections for one token: out[o] += sum_k down_{e_k}[o] . act_k + down_s[o] . act_s.
// The routing weights (and the shared expert's sigmoid gate) are already folded into act by the
// gate/up launch, so this is one long dot product per output row over the concatenated slots:
// every thread streams (slot, chunk) pairs of R rows, and the expert ids never leave the GPU.
#include "backend/cuda/decode.cuh"

#define MOE_THREADS 256
#define MOE_R       4

static __device__ __forceinline__ uint4 ldw16(const uint8_t *p) {
    return __ldg(reinterpret_cast<const uint4 *>(p));
}

// Partial dot products over chunks [t, C) step TPR of R rows of one matrix (mat), input xs.
template <int BITS, int TPR>
static __device__ __forceinline__ void down_rows(const struct dmat &m, int mat,
                                                 const int (&rows)[MOE_R], const float *xs, int C,
                                                 int t, float (&acc)[MOE_R]) {
    constexpr int EPC = wfmt<BITS>::EPC;
    const uint8_t *base = m.data + (size_t)mat * m.mat_stride;
    const uint8_t *sb = m.scales + (size_t)mat * m.sb_mat_stride;
    const uint8_t *bb = m.biases + (size_t)mat * m.sb_mat_stride;
#pragma unroll 2
    for (int c = t; c < C; c += TPR) {
        uint4 w[MOE_R];
        float s[MOE_R], b[MOE_R];
#pragma unroll
        for (int i = 0; i < MOE_R; i++)
            w[i] = ldw16(base + (size_t)rows[i] * m.row_stride + (size_t)c * 16);
        if constexpr (BITS != 16) {
            int g = c * EPC / m.group;
#pragma unroll
            for (int i = 0; i < MOE_R; i++) {
                size_t o = (size_t)rows[i] * m.sb_row_stride;
                s[i] = bf16_bits_to_f32(__ldg(reinterpret_cast<const uint16_t *>(sb + o) + g));
                b[i] = bf16_bits_to_f32(__ldg(reinterpret_cast<const uint16_t *>(bb + o) + g));
            }
        } else {
#pragma unroll
            for (int i = 0; i < MOE_R; i++) s[i] = b[i] = 0.f;
        }
        dot_chunk<BITS, MOE_R>(w, s, b, xs + xpad(c * EPC), acc);
    }
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
            const int k = f / C, c = f - k * C, ex = ids[k];
            const uint8_t *base = m.data + (size_t)ex * m.mat_stride + (size_t)c * 16;
            uint4 w[MOE_R];
            float s[MOE_R], b[MOE_R];
#pragma unroll
            for (int i = 0; i < MOE_R; i++) w[i] = ldw16(base + (size_t)rows[i] * m.row_stride);
            if constexpr (BITS != 16) {
                const int g = c * EPC / m.group;
                const size_t o0 = (size_t)ex * m.sb_mat_stride;
#pragma unroll
                for (int i = 0; i < MOE_R; i++) {
                    size_t o = o0 + (size_t)rows[i] * m.sb_row_stride;
                    s[i] = bf16_bits_to_f32(
                        __ldg(reinterpret_cast<const uint16_t *>(m.scales + o) + g));
                    b[i] = bf16_bits_to_f32(
                        __ldg(reinterpret_cast<const uint16_t *>(m.biases + o) + g));
                }
            } else {
#pragma unroll
                for (int i = 0; i < MOE_R; i++) s[i] = b[i] = 0.f;
            }
            dot_chunk<BITS, MOE_R>(w, s, b, xs + xpad(k * p.inter + c * EPC), acc);
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
    // reduce over the TPR threads of the group
    constexpr int W = TPR < 32 ? TPR : 32;
#pragma unroll
    for (int i = 0; i < MOE_R; i++)
#pragma unroll
        for (int o = W / 2; o; o >>= 1) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
    if constexpr (TPR > 32) {
        constexpr int NW = TPR / 32;
        int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        if (lane == 0)
#pragma unroll
            for (int i = 0; i < MOE_R; i++) red[warp * MOE_R + i] = acc[i];
        __syncthreads();
        int w0 = warp / NW * NW;
#pragma unroll
        for (int i = 0; i < MOE_R; i++) {
            float v = 0.f;
            for (int k = 0; k < NW; k++) v += red[(w0 + k) * MOE_R + i];
            acc[i] = v;
        }
    }
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
