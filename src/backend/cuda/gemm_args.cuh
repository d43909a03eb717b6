// What both fused-dequant GEMM kernels (gemm_q.cu, gemm_wg.cu) read from a pf_gemm call: the
// activations and the weight matrices, filled from the call's dmats in one place. Each kernel's
// parameter block derives from gemm_in (still one struct passed by value) and adds its own fields
// after it in the order they had before (gemm_q's layout is unchanged): ptxas is sensitive to
// that order, moving sb_async and epi of wg_params behind the tile map made gemm_wg_kernel<2>
// (236 registers) spill 860 bytes.
#pragma once
#include "backend/cuda/prefill.cuh"

// One weight matrix (or expert stack): packed data, scales and biases with their byte strides per
// row and per matrix.
struct wview {
    const uint8_t *data, *scales, *biases;
    size_t rs, ms, sbrs, sbms;
    int group; // 1 for unquantized matrices, so that k / group is defined everywhere
};

struct gemm_in {
    const bf16 *A;
    int lda;
    const int *a_rows; // grouped mode: row r of the GEMM reads A row a_rows[r] (NULL: row r)
    int M, N, K;
    wview w[2]; // gate (or the only matrix) and up; W twice without an up matrix
};

inline wview view_of(const struct dmat *m) {
    wview w;
    w.data = m->data;
    w.scales = m->scales;
    w.biases = m->biases;
    w.rs = m->row_stride;
    w.ms = m->mat_stride;
    w.sbrs = m->sb_row_stride;
    w.sbms = m->sb_mat_stride;
    w.group = m->group > 0 ? m->group : 1;
    return w;
}

inline void set_gemm_in(gemm_in &p, const bf16 *A, int lda, int M, const struct dmat *W,
                        const struct dmat *Wup, const struct gemm_group *grp) {
    p.A = A;
    p.lda = lda;
    p.a_rows = grp ? grp->a_rows : nullptr;
    p.M = M;
    p.N = W->rows;
    p.K = W->cols;
    p.w[0] = view_of(W);
    p.w[1] = view_of(Wup ? Wup : W);
}
