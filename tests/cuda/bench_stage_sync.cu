// What one dependent stage of a decode step costs, by how the stages are separated: the latency
// budget of the persistent-kernel design in src/backend/cuda/NOTES.md. A stage: every CTA reads
// the whole vector the previous stage wrote (2048 floats, as a GEMV reads x), reduces it, and
// writes its slice of the next vector. Separated by
//   graph:  one kernel per stage, replayed from a CUDA graph;
//   pdl:    the same with programmatic dependent launch (as the decode step runs);
//   flags:  one persistent kernel (a CTA per SM, cooperative launch) and one counter: after
//           writing its slice a CTA adds 1 (release) and waits (acquire) until the counter
//           reaches (stage + 1) x CTAs.
// usage: bench_stage_sync [STAGES]
#include "common_check.cuh"

namespace {

constexpr int N = 2048, THREADS = 256;

__device__ __forceinline__ float stage_work(const float *x, float *y, int cta, int ncta) {
    __shared__ float red[THREADS / 32];
    float s = 0.f;
    for (int i = threadIdx.x; i < N; i += THREADS) s += __ldcg(x + i);
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    float t = 0.f;
    for (int w = 0; w < THREADS / 32; w++) t += red[w];
    const int per = (N + ncta - 1) / ncta;
    for (int i = threadIdx.x; i < per && cta * per + i < N; i += THREADS)
        y[cta * per + i] = t * 1e-4f + (float)i;
    return t;
}

__global__ void stage_kernel(const float *x, float *y, int pdl) {
    if (pdl) pdl_trigger(), pdl_wait();
    stage_work(x, y, blockIdx.x, gridDim.x);
}

__global__ void persistent_kernel(float *a, float *b, unsigned *count, int stages) {
    for (int s = 0; s < stages; s++) {
        stage_work(s & 1 ? b : a, s & 1 ? a : b, blockIdx.x, gridDim.x);
        __syncthreads();
        if (threadIdx.x == 0) {
            const unsigned target = (unsigned)(s + 1) * gridDim.x;
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
            unsigned v = 0;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                             : "=r"(v)
                             : "l"(count)
                             : "memory");
            } while (v < target);
        }
        __syncthreads();
    }
}

} // namespace

int main(int argc, char **argv) {
    const int stages = argc > 1 ? atoi(argv[1]) : 256;
    int dev = 0, sms = 0, coop = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
    float *a, *b;
    unsigned *count;
    CK(cudaMalloc(&a, N * sizeof(float)));
    CK(cudaMalloc(&b, N * sizeof(float)));
    CK(cudaMalloc(&count, sizeof(unsigned)));
    CK(cudaMemset(a, 0, N * sizeof(float)));
    CK(cudaMemset(b, 0, N * sizeof(float)));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("%d stages, %d CTAs of %d threads (one per SM)\n", stages, sms, THREADS);
    for (int pdl = 0; pdl < 2; pdl++) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int s = 0; s < stages; s++)
            CK(pdl_launch(stage_kernel, dim3(sms), dim3(THREADS), 0, st, pdl == 1,
                          (const float *)(s & 1 ? b : a), s & 1 ? a : b, pdl));
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        for (int r = 0; r < 3; r++) CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e0, st));
        const int reps = 20;
        for (int r = 0; r < reps; r++) CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0.f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        printf("%-6s %.2f us per stage\n", pdl ? "pdl" : "graph", ms * 1e3f / reps / stages);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
    }
    DIE_IF(!coop, "no cooperative launch on this device");
    float best = 1e30f;
    for (int r = 0; r < 5; r++) {
        CK(cudaMemsetAsync(count, 0, sizeof(unsigned), st));
        void *args[] = {&a, &b, &count, (void *)&stages};
        CK(cudaEventRecord(e0, st));
        CK(cudaLaunchCooperativeKernel((void *)persistent_kernel, dim3(sms), dim3(THREADS), args, 0,
                                       st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0.f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        best = fminf(best, ms);
    }
    printf("flags  %.2f us per stage (best of 5 launches)\n", best * 1e3f / stages);
    return 0;
}
