// Small decode kernels: the embedding row lookup (token id read on the device, so the sampled
// token of one step feeds the next without a host round trip).
#include "backend/cuda/decode.cuh"

__global__ void embed_kernel(const struct dmat m, const int32_t *tok, float *x) {
    TRACE_BEGIN();
    pdl_trigger();
    pdl_wait();
    TRACE_WAIT();
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= m.cols) return;
    int r = *tok;
    if (r < 0 || r >= m.rows) r = 0; // out-of-range ids are rejected on the host; never read past
    const uint8_t *row = m.data + (size_t)r * m.row_stride;
    float v;
    if (m.type == WT_BF16) {
        v = bf16_bits_to_f32(reinterpret_cast<const uint16_t *>(row)[j]);
    } else if (m.type == WT_F32) {
        v = reinterpret_cast<const float *>(row)[j];
    } else {
        const uint32_t q = q_value(row, m.bits, j);
        const size_t so = (size_t)r * m.sb_row_stride;
        const int g = j / m.group;
        float s = bf16_bits_to_f32(reinterpret_cast<const uint16_t *>(m.scales + so)[g]);
        float b = bf16_bits_to_f32(reinterpret_cast<const uint16_t *>(m.biases + so)[g]);
        v = s * (float)q + b;
    }
    x[j] = v;
}

int embed_launch(const struct dmat *emb, const int32_t *tok, float *x, cudaStream_t s,
                 struct wren_err *e) {
    CUDA_CHECK(pdl_launch(embed_kernel, dim3((emb->cols + 255) / 256), dim3(256), 0, s,
                          decode_pdl(), *emb, tok, x));
    return 0;
}
