// What fetching a kernel's code costs on this card: the decode step is ~263 short dependent
// launches of a handful of kernels, and a byte-identical second copy of one of them cost 6-9% of
// decode speed (bench/RESULTS.md, twenty-third session). This measures the instruction caches
// directly. A kernel is N independent FFMAs in straight-line code (8 chains: one instruction per
// cycle once its code is cached), run in passes; lane 0 of every warp times each pass with clock64.
// A pass that runs at ~1 cycle per instruction ran from the SM's caches; anything slower waited for
// code.
//   within a launch:  pass 0 (code from wherever it is) vs passes 1, 2 (the SM's caches, if it
//   fits) across launches:  the same kernel again at once; again after another kernel of E
//   instructions
//                     (does the SM keep code between launches, and how much?); after the L2 is
//                     flushed (code from HBM).
// usage: bench_icache
#include <algorithm>

#include "common_check.cuh"

namespace {

constexpr int THREADS = 128; // one warp per scheduler
constexpr int PASSES = 3;

template <int N, int TAG>
__global__ void __launch_bounds__(THREADS)
    code_kernel(float a, float b, float *out, long long *cyc, int passes) {
    float x[8];
#pragma unroll
    for (int j = 0; j < 8; j++) x[j] = (float)(threadIdx.x + j + TAG);
#pragma unroll 1
    for (int p = 0; p < passes; p++) {
        long long t0, t1;
        asm volatile("mov.u64 %0, %%clock64;" : "=l"(t0)::"memory");
#pragma unroll
        for (int i = 0; i < N / 8; i++) {
#pragma unroll
            for (int j = 0; j < 8; j++)
                asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x[j]) : "f"(a), "f"(b));
        }
        asm volatile("mov.u64 %0, %%clock64;" : "=l"(t1)::"memory");
        if ((threadIdx.x & 31) == 0 && p < PASSES)
            cyc[((size_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5)) * PASSES + p] =
                t1 - t0;
    }
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) s += x[j];
    if (s == 1234.5f) out[threadIdx.x] = s; // keeps the chains live
}

// Jumps instead of a straight line: 64 cases of 16 distinct multiply-adds, visited through a jump
// table in an order that never falls through to the next case, so each case's first line is a
// miss the fetcher cannot have prefetched. Cycles per case, cold minus warm, is the latency of
// fetching code from wherever it is.
#define JC_ADD(K, J)                                                                               \
    asm volatile("mad.lo.u32 %0, %0, %1, %2;"                                                      \
                 : "+r"(y[(J)&3])                                                                  \
                 : "r"(y[((J) + 1) & 3]), "n"((K)*16 + (J)))
#define JC_ADD4(K, J)                                                                              \
    JC_ADD(K, J);                                                                                  \
    JC_ADD(K, J + 1);                                                                              \
    JC_ADD(K, J + 2);                                                                              \
    JC_ADD(K, J + 3)
#define JC_CASE(K)                                                                                 \
    case K:                                                                                        \
        JC_ADD4(K, 0);                                                                             \
        JC_ADD4(K, 4);                                                                             \
        JC_ADD4(K, 8);                                                                             \
        JC_ADD4(K, 12);                                                                            \
        break
#define JC_8(B)                                                                                    \
    JC_CASE(B);                                                                                    \
    JC_CASE(B + 1);                                                                                \
    JC_CASE(B + 2);                                                                                \
    JC_CASE(B + 3);                                                                                \
    JC_CASE(B + 4);                                                                                \
    JC_CASE(B + 5);                                                                                \
    JC_CASE(B + 6);                                                                                \
    JC_CASE(B + 7)
constexpr int JCASES = 64;

__global__ void __launch_bounds__(THREADS)
    jump_kernel(int stride, unsigned *out, long long *cyc, int passes) {
    unsigned y[4] = {threadIdx.x, 1u, 2u, 3u};
#pragma unroll 1
    for (int p = 0; p < passes; p++) {
        long long t0, t1;
        asm volatile("mov.u64 %0, %%clock64;" : "=l"(t0)::"memory");
#pragma unroll 1
        for (int i = 0; i < JCASES; i++) {
            switch ((i * stride) & (JCASES - 1)) {
                JC_8(0);
                JC_8(8);
                JC_8(16);
                JC_8(24);
                JC_8(32);
                JC_8(40);
                JC_8(48);
                JC_8(56);
            }
        }
        asm volatile("mov.u64 %0, %%clock64;" : "=l"(t1)::"memory");
        if ((threadIdx.x & 31) == 0 && p < PASSES)
            cyc[((size_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5)) * PASSES + p] =
                t1 - t0;
    }
    if (y[0] + y[1] + y[2] + y[3] == 12345u) out[threadIdx.x] = y[0];
}

using kfn = void (*)(float, float, float *, long long *, int);

struct ctx {
    int sms;
    float *out;
    long long *cyc, *host;
    int threads; // of the last launch
    double mhz;  // SM clock, for the microseconds column
    uint8_t *flush;
    size_t flush_bytes;
};

void launch(ctx &c, kfn k, int passes, int threads = THREADS) {
    c.threads = threads;
    k<<<c.sms, threads>>>(1.0001f, 1e-7f, c.out, c.cyc, passes);
    CK(cudaGetLastError());
}

// median over warps of pass p, cycles per instruction
double cpi(const ctx &c, int n, int p) {
    const int nw = c.sms * c.threads / 32;
    CK(cudaMemcpy(c.host, c.cyc, sizeof(long long) * nw * PASSES, cudaMemcpyDeviceToHost));
    std::vector<long long> v(nw);
    for (int w = 0; w < nw; w++) v[w] = c.host[(size_t)w * PASSES + p];
    std::sort(v.begin(), v.end());
    return (double)v[nw / 2] / n;
}

void flush_l2(const ctx &c) {
    CK(cudaMemset(c.flush, 1, c.flush_bytes));
}

// kernel N from HBM, twice in one launch, launched again at once, after another kernel of N and
// after a 256 KB kernel (code from the L2)
template <int N> void row(ctx &c) {
    kfn k = code_kernel<N, 0>, evict = code_kernel<16384, 2>;
    flush_l2(c);
    launch(c, evict, 1);
    flush_l2(c);
    launch(c, k, PASSES);
    CK(cudaDeviceSynchronize());
    const double hbm = cpi(c, N, 0), warm1 = cpi(c, N, 1), warm2 = cpi(c, N, 2);
    launch(c, k, 1);
    CK(cudaDeviceSynchronize());
    const double again = cpi(c, N, 0);
    launch(c, code_kernel<N, 1>, 1);
    launch(c, k, 1);
    CK(cudaDeviceSynchronize());
    const double after_same = cpi(c, N, 0);
    launch(c, evict, 1);
    launch(c, k, 1);
    CK(cudaDeviceSynchronize());
    const double l2 = cpi(c, N, 0);
    printf("%6d %7d | %8.2f %8.2f %8.2f | %8.2f %8.2f %8.2f | %7.2f\n", N, N * 16 / 1024, hbm,
           warm1, warm2, again, after_same, l2, (l2 - warm1) * N / c.mhz);
}

// N = 2048 (32 KB) again after kernels of E instructions: the SM's capacity across launches
template <int E> void evict_row(ctx &c) {
    kfn k = code_kernel<2048, 0>;
    launch(c, code_kernel<16384, 2>, 1);
    launch(c, k, 1);
    launch(c, code_kernel<E, 3>, 1);
    launch(c, k, 1);
    CK(cudaDeviceSynchronize());
    printf("  after %6d instructions (%4d KB) of other code: %.2f cycles per instruction\n", E,
           E * 16 / 1024, cpi(c, 2048, 0));
}

} // namespace

int main() {
    ctx c;
    int khz = 0;
    CK(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
    c.mhz = khz / 1e3;
    c.flush_bytes = (size_t)256 << 20;
    CK(cudaMalloc(&c.out, THREADS * sizeof(float)));
    CK(cudaMalloc(&c.cyc, sizeof(long long) * c.sms * (THREADS / 32) * PASSES));
    CK(cudaMalloc(&c.flush, c.flush_bytes));
    c.host = (long long *)malloc(sizeof(long long) * c.sms * (THREADS / 32) * PASSES);
    DIE_IF(!c.host, "out of host memory");
    // first launches load the modules
    launch(c, code_kernel<512, 0>, 1);
    launch(c, code_kernel<16384, 2>, 1);
    CK(cudaDeviceSynchronize());
    printf("cycles per instruction (median warp; %d blocks of %d threads, straight-line FFMA)\n",
           c.sms, THREADS);
    printf("     N      KB |  HBM p0   same p1  same p2 |  again   after=N  after256K | "
           "us lost (L2)\n");
    row<512>(c);
    row<1024>(c);
    row<2048>(c);
    row<4096>(c);
    row<8192>(c);
    row<16384>(c);
    printf("a 32 KB kernel launched again after other code:\n");
    evict_row<512>(c);
    evict_row<1024>(c);
    evict_row<2048>(c);
    evict_row<4096>(c);
    evict_row<8192>(c);
    evict_row<16384>(c);

    // the jump kernel: cycles per case
    unsigned *uout;
    CK(cudaMalloc(&uout, THREADS * sizeof(unsigned)));
    auto jl = [&](int passes) {
        c.threads = THREADS;
        jump_kernel<<<c.sms, THREADS>>>(37, uout, c.cyc, passes);
        CK(cudaGetLastError());
    };
    auto jr = [&](const char *what, int p) {
        CK(cudaDeviceSynchronize());
        printf("  %-44s %7.1f cycles per case\n", what, cpi(c, JCASES, p));
    };
    printf("jumps: %d cases of 16 multiply-adds in a non-sequential order (cycles per case)\n",
           JCASES);
    jl(1);
    flush_l2(c), launch(c, code_kernel<16384, 2>, 1), flush_l2(c), jl(PASSES);
    jr("after an L2 flush (code from HBM)", 0);
    jr("  its second pass (warm)", 1);
    jl(1), jr("the same kernel again", 0);
    launch(c, code_kernel<512, 1>, 1), jl(1), jr("after an 8 KB kernel", 0);
    launch(c, code_kernel<2048, 1>, 1), jl(1), jr("after a 32 KB kernel", 0);
    launch(c, code_kernel<4096, 1>, 1), jl(1), jr("after a 64 KB kernel", 0);
    launch(c, code_kernel<8192, 1>, 1), jl(1), jr("after a 128 KB kernel", 0);
    launch(c, code_kernel<16384, 1>, 1), jl(1), jr("after a 256 KB kernel", 0);
    launch(c, code_kernel<4096, 1>, 1), launch(c, code_kernel<4096, 3>, 1), jl(1),
        jr("after two 64 KB kernels", 0);
    launch(c, code_kernel<8192, 1>, 1), launch(c, code_kernel<8192, 3>, 1), jl(1),
        jr("after two 128 KB kernels", 0);
    CK(cudaFree(uout));
    printf("one warp per SM instead of one per scheduler (cycles per instruction):\n");
    launch(c, code_kernel<4096, 0>, PASSES, 32);
    CK(cudaDeviceSynchronize());
    printf("  64 KB: pass 0 %.2f, pass 1 %.2f\n", cpi(c, 4096, 0), cpi(c, 4096, 1));
    launch(c, code_kernel<512, 1>, 1, 32), launch(c, code_kernel<512, 0>, 1, 32);
    CK(cudaDeviceSynchronize());
    printf("  8 KB after another 8 KB kernel: %.2f\n", cpi(c, 512, 0));
    CK(cudaFree(c.out));
    CK(cudaFree(c.cyc));
    CK(cudaFree(c.flush));
    free(c.host);
    return 0;
}
