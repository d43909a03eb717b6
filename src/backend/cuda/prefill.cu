// Fallback prefill: runs the decode step token by token. Correct but slow; the PREFILL engineer's
// batched implementation replaces this file.
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_model.h"

int cuda_prefill(struct cuda_ctx *cx, struct cuda_state *st, int pos, const int32_t *tokens, int n,
                 float *logits, bool all_logits, struct wren_err *e) {
    const size_t vocab = (size_t)cx->cfg->vocab;
    for (int i = 0; i < n; i++) {
        if (cuda_decode_token(cx, st, pos + i, tokens[i], e)) return -1;
        if (logits && all_logits)
            CUDA_CHECK(cudaMemcpyAsync(logits + i * vocab, st->logits, vocab * 4,
                                       cudaMemcpyDeviceToHost, cx->stream));
    }
    if (logits && !all_logits)
        CUDA_CHECK(
            cudaMemcpyAsync(logits, st->logits, vocab * 4, cudaMemcpyDeviceToHost, cx->stream));
    CUDA_CHECK(cudaStreamSynchronize(cx->stream));
    return 0;
}
