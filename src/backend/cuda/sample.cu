// Token sampling on the GPU. The chosen id goes straight into the next step's input buffer and
// into a host-mapped ring (read by the host a step later), so a captured decode step never waits
// for the host. Greedy without penalties: a grid-wide argmax (here). Every other call: the
// candidate kernel (sample_cand.cu), a grid of blocks that each keep their slice's best candidates
// and the last of them selecting and drawing (top-p and min-p without a top-k: all of them, over
// every id, sample_coop.cuh); where its candidates cannot hold the kept set it runs the
// one-block sampler (sample_dev.cuh), which applies the penalties (device-side counts),
// temperature, then top-k, top-p and min-p — each a threshold on the scaled logit found by radix
// selection over all ids — in one block. Both draw from the kept set in id order with a
// counter-based RNG (seed, step). The one-block kernel alone: WREN_CUDA_DECODE=onesample.
#include "backend/cuda/sample_dev.cuh"

#define ARGMAX_THREADS 256

// ---- greedy: grid-wide argmax, the last block emits -----------------------------------------
__global__ void __launch_bounds__(ARGMAX_THREADS)
    argmax_kernel(const __grid_constant__ struct sample_params p) {
    TRACE_BEGIN();
    pdl_wait(); // launched early (programmatic launch): the logits come from the lm_head
    TRACE_WAIT();
    unsigned long long best = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n_vocab;
         i += gridDim.x * blockDim.x) {
        unsigned long long k = lkey(p.logits[i], i);
        best = k > best ? k : best;
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        unsigned long long ob = __shfl_xor_sync(0xffffffffu, best, o);
        best = ob > best ? ob : best;
    }
    if ((threadIdx.x & 31) == 0) atomicMax(p.argmax, best);
    __threadfence();
    __syncthreads();
    __shared__ int last;
    if (threadIdx.x == 0) last = atomicAdd(p.counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last || threadIdx.x) return;
    __threadfence();
    unsigned long long k = atomicExch(p.argmax, 0ull);
    int tok = lkey_id(k);
    *p.counter = 0;
    emit(p, tok, 0.f, 0, nullptr, nullptr);
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_full_kernel(const __grid_constant__ struct sample_params p) {
    __shared__ samp_smem sm;
    sample_full(p, sm);
}

int sample_launch(const struct sample_params *p, cudaStream_t s, struct wren_err *e) {
    const bool plain_greedy = p->temperature <= 0.f && p->n_logprobs < 0 && p->presence == 0.f &&
                              p->frequency == 0.f && p->repetition == 1.f;
    if (!plain_greedy && !p->one_block && sample_cand_ok(p)) {
        return sample_cand_launch(p, s, e);
    } else if (plain_greedy) {
        int nb = (p->n_vocab + ARGMAX_THREADS * 8 - 1) / (ARGMAX_THREADS * 8);
        if (nb > 1024) nb = 1024;
        if (nb < 1) nb = 1;
        CUDA_CHECK(
            pdl_launch(argmax_kernel, dim3(nb), dim3(ARGMAX_THREADS), 0, s, decode_pdl(), *p));
    } else {
        sample_full_kernel<<<1, SAMPLE_THREADS, 0, s>>>(*p);
        CUDA_CHECK_LAUNCH();
    }
    return 0;
}
