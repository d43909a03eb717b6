// Dense prefill GEMMs of a few token rows: the decode GEMV's int8 machinery (qgemv_dev.cuh) over
// up to SG_T activation rows per block. The tiled GEMMs stream every block's weight rows through
// all k-tiles one after another whatever the token count, so a call of a few tokens cost them as
// much as one of 64 (~200 us per layer: bench/RESULTS.md, ninth session); here each weight chunk
// is loaded once per block and dotted with every row, and the warps stream the whole matrix as in
// decode (each further group of SG_T rows re-reads it, from the L2). Activations are the bf16 rows
// quantized to two int8 planes (finer than bf16), weights are used exactly as dequantized (not
// rounded to bf16).
#include "backend/cuda/prefill.cuh"
#include "backend/cuda/qgemv_dev.cuh"

#define SG_T 8 // token rows per block (blockIdx.y picks the group of rows)

namespace {

// Up to this many rows (per call) take this kernel. Measured on the H200 (bench/RESULTS.md, ninth
// session): a 16-token call 18.8 -> 15.9 ms, 32 tokens 22.6 -> 23.0 ms (slower), 64 26.7 -> 33.6.
constexpr int PF_SMALL_M = 16;

int g_force; // 0: by PF_SMALL_M, 1: never, 2: whenever the shapes fit
size_t g_smem_set;

struct small_params {
    const uint16_t *A; // bf16 [M][lda]
    int lda, M;
    struct dmat W, U; // U: the up rows (EPI_SWIGLU_BF16)
    void *C;
    int ldc, N, epi;
    int C16, nit, gshift, RS; // chunks per row, steps per row set, log2 chunks per group, row sets
};

template <int BITS>
__global__ void __launch_bounds__(QG_THREADS, 1)
    gemm_small_kernel(const __grid_constant__ small_params p) {
    extern __shared__ __align__(16) uint8_t sm[];
    __shared__ float red[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int gw = blockIdx.x * QG_WARPS + warp, W = gridDim.x * QG_WARPS;
    const int t0 = blockIdx.y * SG_T, nt = min(SG_T, p.M - t0), nb = p.W.cols >> 5;
    const size_t qb = qx_bytes(nb);
    const bool pair = p.epi == EPI_SWIGLU_BF16;
    // a row set: two rows of W, or (SwiGLU) row r of W and row r of U. The same loads as
    // qgemv_kernel's; one helper for both measured 0.5% slower decode (543.3 vs 545.7 tok/s at
    // 4K, one call, bench/RESULTS.md), so the decode kernel keeps its own copy.
    auto load = [&](qstage &S, int rs, int it) {
        const int r0 = pair ? rs : 2 * rs;
#pragma unroll
        for (int i = 0; i < QG_R; i++) {
            const struct dmat &m = pair && i == 1 ? p.U : p.W;
            int r = pair ? r0 : r0 + i;
            if (r >= p.N) r = r0; // discarded
            const uint8_t *rw = m.data + (size_t)r * m.row_stride;
            const size_t so = (size_t)r * m.sb_row_stride;
#pragma unroll
            for (int u = 0; u < QG_U; u++) {
                const int c = it * QG_CHUNKS + u * 32 + lane;
                const size_t g = (size_t)(c >> p.gshift) * 2;
                qload(S, i, u, rw + (size_t)c * 16, m.scales + so + g, m.biases + so + g,
                      c < p.C16);
            }
        }
    };
    qstage A, B;
    int rs = gw, it = 0;
    if (rs < p.RS) load(A, rs, 0); // in flight while the rows are quantized
    for (int tt = 0; tt < nt; tt++) {
        const qx_src in = {reinterpret_cast<const float *>(p.A + (size_t)(t0 + tt) * p.lda),
                           p.W.cols,
                           nullptr,
                           nullptr,
                           nullptr,
                           0,
                           0.f};
        qx_w nw;
        qx_build<BITS, true>(in, nw, qx_layout(sm + tt * qb, nb), red);
    }
    float acc[SG_T][QG_R];
#pragma unroll
    for (int tt = 0; tt < SG_T; tt++) acc[tt][0] = acc[tt][1] = 0.f;
    while (rs < p.RS) {
        int rs2 = rs, it2 = it + 1;
        if (it2 == p.nit) it2 = 0, rs2 += W;
        if (rs2 < p.RS) load(B, rs2, it2);
#pragma unroll
        for (int tt = 0; tt < SG_T; tt++)
            if (tt < nt) qdot<BITS>(A, qx_layout(sm + tt * qb, nb), it, p.C16, acc[tt]);
        if (it == p.nit - 1) {
#pragma unroll
            for (int tt = 0; tt < SG_T; tt++) {
                warp_sum_rows(acc[tt]);
                if (lane == tt && tt < nt) { // lane tt writes row t0 + tt of C
                    const size_t o = (size_t)(t0 + tt) * p.ldc;
                    if (pair) {
                        const float y = silu_f(acc[tt][0]) * acc[tt][1];
                        reinterpret_cast<bf16 *>(p.C)[o + rs] = __float2bfloat16_rn(y);
                    } else {
#pragma unroll
                        for (int i = 0; i < QG_R; i++) {
                            if (2 * rs + i >= p.N) break;
                            const size_t j = o + 2 * rs + i;
                            if (p.epi == EPI_F32)
                                reinterpret_cast<float *>(p.C)[j] = acc[tt][i];
                            else if (p.epi == EPI_ADD_F32)
                                reinterpret_cast<float *>(p.C)[j] += acc[tt][i];
                            else
                                reinterpret_cast<bf16 *>(p.C)[j] = __float2bfloat16_rn(acc[tt][i]);
                        }
                    }
                }
                acc[tt][0] = acc[tt][1] = 0.f;
            }
        }
        A = B;
        rs = rs2, it = it2;
    }
}

bool fmt_ok(const struct dmat *W, int K) {
    return (W->type == WT_Q4 || W->type == WT_Q8) && (W->bits == 4 || W->bits == 8) &&
           pow2(W->group) && W->group >= 32 && W->cols == K && W->row_stride % 16 == 0 &&
           (uintptr_t)W->data % 16 == 0;
}

size_t smem_bytes(int K) {
    return SG_T * qx_bytes(K / 32);
}

} // namespace

void pf_gemm_small_force(int mode) {
    g_force = mode;
}

bool pf_gemm_small_fits(const bf16 *A, int lda, int M, const struct dmat *W, const struct dmat *Wup,
                        enum gemm_epi epi, const struct gemm_group *grp, size_t smem_optin) {
    if (grp || g_force == 1 || M <= 0 || (g_force == 0 && M > PF_SMALL_M)) return false;
    const int K = W->cols;
    if (K % 32 || K > 8 * QG_THREADS * QX_IT || lda % 8 || (uintptr_t)A % 16 || !fmt_ok(W, K))
        return false;
    if (epi == EPI_SWIGLU_BF16 && (!Wup || !fmt_ok(Wup, K) || Wup->bits != W->bits ||
                                   Wup->group != W->group || Wup->rows != W->rows))
        return false;
    return smem_bytes(K) + 1024 <= smem_optin;
}

int pf_gemm_small(cudaStream_t s, const bf16 *A, int lda, int M, const struct dmat *W,
                  const struct dmat *Wup, void *C, int ldc, enum gemm_epi epi, struct wren_err *e) {
    small_params p;
    memset(&p, 0, sizeof p);
    p.A = reinterpret_cast<const uint16_t *>(A);
    p.lda = lda, p.M = M;
    p.W = *W;
    if (epi == EPI_SWIGLU_BF16) p.U = *Wup;
    p.C = C, p.ldc = ldc, p.N = W->rows, p.epi = epi;
    const int bits = W->bits, K = W->cols;
    p.C16 = K * bits / 128;
    p.nit = (p.C16 + QG_CHUNKS - 1) / QG_CHUNKS;
    p.gshift = log2i(W->group / (128 / bits));
    p.RS = epi == EPI_SWIGLU_BF16 ? p.N : (p.N + QG_R - 1) / QG_R;
    const size_t smem = smem_bytes(K);
    void (*k)(const small_params) = bits == 4 ? gemm_small_kernel<4> : gemm_small_kernel<8>;
    if (smem > g_smem_set) { // both instantiations, once per larger size
        CUDA_CHECK(cudaFuncSetAttribute(gemm_small_kernel<4>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CUDA_CHECK(cudaFuncSetAttribute(gemm_small_kernel<8>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        g_smem_set = smem;
    }
    const int sms = pf_device_sms();
    int bx = (p.RS + QG_WARPS - 1) / QG_WARPS;
    if (bx > 2 * sms) bx = 2 * sms;
    k<<<dim3(bx, (M + SG_T - 1) / SG_T), QG_THREADS, smem, s>>>(p);
    CUDA_CHECK_LAUNCH();
    return 0;
}
