// What one dependent stage of a decode step costs, by how the stages are separated: the latency
// budget of the persistent-kernel design in src/backend/cuda/NOTES.md. A stage: every CTA reads
// the whole vector the previous stage wrote (2048 floats, as a GEMV reads x), reduces it, and
// writes its slice of the next vector. Separated by
//   graph:  one kernel per stage, replayed from a CUDA graph;
//   pdl:    the same with programmatic dependent launch (as the decode step runs);
//   ll:     PDL kernels that never wait for the previous grid: each value travels with its stage's
//           tag in one 64-bit word and the readers spin until every word they need has it
//           (NCCL's LL protocol); ll-persist: the same in one persistent kernel;
//   flags:  one persistent kernel (a CTA per SM, cooperative launch) and one counter: after
//           writing its slice a CTA adds 1 (release) and waits (acquire) until the counter
//           reaches (stage + 1) x CTAs.
// Also what a graph boundary costs beyond a PDL stage (a decode step is one graph per token): the
// same PDL stages in graphs of a quarter of the length, replayed four times as often.
// usage: bench_stage_sync [STAGES]
#include "common_check.cuh"

namespace {

constexpr int N = 2048, THREADS = 256;

// A stage's work once each thread holds the sum of its values: the block's total, then the CTA's
// slice of the next vector, each value written by put(index, value).
template <class Put>
__device__ __forceinline__ void stage_finish(float s, int cta, int ncta, Put put) {
    __shared__ float red[THREADS / 32];
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    float t = 0.f;
    for (int w = 0; w < THREADS / 32; w++) t += red[w];
    const int per = (N + ncta - 1) / ncta;
    for (int i = threadIdx.x; i < per && cta * per + i < N; i += THREADS)
        put(cta * per + i, t * 1e-4f + (float)i);
}

__device__ __forceinline__ void stage_work(const float *x, float *y, int cta, int ncta) {
    float s = 0.f;
    for (int i = threadIdx.x; i < N; i += THREADS) s += __ldcg(x + i);
    stage_finish(s, cta, ncta, [&](int i, float v) { y[i] = v; });
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

// ---- low-latency (LL) exchange: every value travels with a tag in one 64-bit word, so a reader
// knows it has this stage's value without any fence, counter or grid-completion wait.
__device__ __forceinline__ unsigned long long ll_load(const unsigned long long *p) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void ll_store(unsigned long long *p, float v, unsigned tag) {
    const unsigned long long w = ((unsigned long long)tag << 32) | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}

constexpr int PER = N / THREADS;

__device__ __forceinline__ void ll_stage(const unsigned long long *x, unsigned long long *y,
                                         unsigned tag_in, int cta, int ncta) {
    float v[PER];
    unsigned ready = 0;
    while (ready != (1u << PER) - 1) {
        unsigned long long w[PER];
#pragma unroll
        for (int j = 0; j < PER; j++)
            if (!(ready >> j & 1)) w[j] = ll_load(x + threadIdx.x + j * THREADS);
#pragma unroll
        for (int j = 0; j < PER; j++)
            if (!(ready >> j & 1) && (unsigned)(w[j] >> 32) == tag_in) {
                v[j] = __uint_as_float((unsigned)w[j]);
                ready |= 1u << j;
            }
    }
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < PER; j++) s += v[j];
    stage_finish(s, cta, ncta, [&](int i, float o) { ll_store(y + i, o, tag_in + 1); });
}

// tags: epoch * 4096 + stage; the epoch is bumped by a 1-thread kernel before every chain
__global__ void ll_bump(unsigned *epoch, unsigned long long *a) {
    const unsigned e = *epoch + 1;
    *epoch = e;
    for (int i = 0; i < N; i++) ll_store(a + i, 1.f, e * 4096u);
}

__global__ void ll_stage_kernel(const unsigned long long *x, unsigned long long *y,
                                const unsigned *epoch, int s) {
    pdl_trigger();
    if (s == 0) pdl_wait(); // the bump kernel's epoch
    const unsigned tag = *(volatile const unsigned *)epoch * 4096u + (unsigned)s;
    ll_stage(x, y, tag, blockIdx.x, gridDim.x);
}

__global__ void ll_persistent_kernel(unsigned long long *a, unsigned long long *b,
                                     const unsigned *epoch, int stages) {
    const unsigned base = *(volatile const unsigned *)epoch * 4096u;
    for (int s = 0; s < stages; s++) {
        ll_stage(s & 1 ? b : a, s & 1 ? a : b, base + (unsigned)s, blockIdx.x, gridDim.x);
        __syncthreads(); // the reduction's shared memory is reused by the next stage
    }
}

} // namespace

int main(int argc, char **argv) {
    const int stages = argc > 1 ? atoi(argv[1]) : 256;
    DIE_IF(stages < 2 || stages > 4000, "stages in [2, 4000]");
    int dev = 0, sms = 0, coop = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
    float *a, *b;
    unsigned long long *la, *lb;
    unsigned *count, *epoch;
    CK(cudaMalloc(&a, N * sizeof(float)));
    CK(cudaMalloc(&b, N * sizeof(float)));
    CK(cudaMalloc(&la, N * sizeof(*la)));
    CK(cudaMalloc(&lb, N * sizeof(*lb)));
    CK(cudaMalloc(&count, sizeof(unsigned)));
    CK(cudaMalloc(&epoch, sizeof(unsigned)));
    CK(cudaMemset(a, 0, N * sizeof(float)));
    CK(cudaMemset(b, 0, N * sizeof(float)));
    CK(cudaMemset(la, 0, N * sizeof(*la)));
    CK(cudaMemset(lb, 0, N * sizeof(*lb)));
    CK(cudaMemset(epoch, 0, sizeof(unsigned)));
    // "fat" CTAs ask for enough shared memory that one fits per SM, as the decode kernels' do
    // with their registers: a stage's CTA on an SM becomes resident only when the previous
    // stage's has left it ("thin" ones of several stages share an SM, and LL readers spin there)
    const int fat = 120 << 10;
    CK(cudaFuncSetAttribute(stage_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, fat));
    CK(cudaFuncSetAttribute(ll_stage_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, fat));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("%d stages, %d CTAs of %d threads (one per SM)\n", stages, sms, THREADS);
    const char *names[] = {"graph", "pdl", "ll"};
    // ms for reps replays of a graph of n stages separated by mode, each CTA asking for smem
    auto run = [&](int mode, int smem, int n, int reps) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        if (mode == 2) {
            CK(pdl_launch(ll_bump, dim3(1), dim3(1), 0, st, false, epoch, la));
            for (int s = 0; s < n; s++)
                CK(pdl_launch(ll_stage_kernel, dim3(sms), dim3(THREADS), (size_t)smem, st, true,
                              (const unsigned long long *)(s & 1 ? lb : la), s & 1 ? la : lb,
                              (const unsigned *)epoch, s));
        } else {
            for (int s = 0; s < n; s++)
                CK(pdl_launch(stage_kernel, dim3(sms), dim3(THREADS), (size_t)smem, st, mode == 1,
                              (const float *)(s & 1 ? b : a), s & 1 ? a : b, mode));
        }
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        for (int r = 0; r < 3; r++) CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e0, st));
        for (int r = 0; r < reps; r++) CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        float ms = 0.f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
        return ms;
    };
    const int reps = 20;
    for (int smem = 0; smem <= fat; smem += fat)
        for (int mode = 0; mode < 3; mode++)
            printf("%-6s %-4s %.2f us per stage\n", names[mode], smem ? "fat" : "thin",
                   run(mode, smem, stages, reps) * 1e3f / reps / stages);
    if (stages % 4 == 0) {
        const float whole = run(1, fat, stages, reps), quarter = run(1, fat, stages / 4, 4 * reps);
        printf("graph boundary: %.2f us beyond a PDL stage (pdl fat, %d-stage graphs x %d vs %d x "
               "%d)\n",
               (quarter - whole) * 1e3f / (3 * reps), stages / 4, 4 * reps, stages, reps);
    }
    DIE_IF(!coop, "no cooperative launch on this device");
    for (int ll = 0; ll < 2; ll++) {
        float best = 1e30f;
        for (int r = 0; r < 5; r++) {
            if (ll)
                CK(pdl_launch(ll_bump, dim3(1), dim3(1), 0, st, false, epoch, la));
            else
                CK(cudaMemsetAsync(count, 0, sizeof(unsigned), st));
            void *args[] = {&a, &b, &count, (void *)&stages};
            void *largs[] = {&la, &lb, &epoch, (void *)&stages};
            CK(cudaEventRecord(e0, st));
            if (ll)
                CK(cudaLaunchCooperativeKernel((void *)ll_persistent_kernel, dim3(sms),
                                               dim3(THREADS), largs, 0, st));
            else
                CK(cudaLaunchCooperativeKernel((void *)persistent_kernel, dim3(sms), dim3(THREADS),
                                               args, 0, st));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            CK(cudaGetLastError());
            float ms = 0.f;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            best = fminf(best, ms);
        }
        printf("%-11s %.2f us per stage (best of 5 launches)\n", ll ? "ll-persist" : "flags",
               best * 1e3f / stages);
    }
    // every word of the LL chain's last vector carries the last stage's tag
    std::vector<unsigned long long> h(N);
    unsigned e = 0;
    CK(cudaMemcpy(h.data(), stages & 1 ? lb : la, N * sizeof(h[0]), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&e, epoch, sizeof(e), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < N; i++) bad += (unsigned)(h[i] >> 32) != e * 4096u + (unsigned)stages;
    DIE_IF(bad, "ll-persist: %d of %d words without the last stage's tag", bad, N);
    return 0;
}
