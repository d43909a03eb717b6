// A per-warp timeline of the decode kernels, for diagnosis only: compiled in with
// -DWREN_DECODE_TRACE (a separate build; tests/cuda/bench_decode_trace.cu reads it), empty
// otherwise. Lane 0 of every warp of a traced kernel records its grid, block, warp and SM with
// %globaltimer stamps at entry, after the programmatic-launch wait and at exit, and up to three
// marks a kernel sets where its phases end (TRACE_MARK). So one replayed decode step shows when
// each launch's blocks became resident, when its wait released and when its last warp left:
// where the critical path of the step runs, which event timing of whole launches cannot show.
#pragma once
#include <cuda_runtime.h>

struct trace_rec {
    unsigned long long grid, t0, tw, t1;
    unsigned long long tm[3]; // optional marks inside a kernel (TRACE_MARK), 0 where not reached
    unsigned block, warp, sm, pad;
};
struct trace_buf {
    unsigned n, cap, pad[2];
    struct trace_rec rec[1]; // cap of them
};

#ifdef WREN_DECODE_TRACE
// Every translation unit has its own copy of g_trace (no relocatable device code): each registers
// a setter at load time, and decode_trace_enable (decode_step.cu) calls them all.
void decode_trace_register(void (*set)(struct trace_buf *));
static __device__ struct trace_buf *g_trace;
static void decode_trace_set_(struct trace_buf *b) {
    (void)cudaMemcpyToSymbol(g_trace, &b, sizeof b); // diagnostic build: checked by its reader
}
static const int decode_trace_registered_ = (decode_trace_register(decode_trace_set_), 0);

static __device__ __forceinline__ unsigned long long trace_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

struct trace_scope {
    struct trace_rec *r;
    __device__ trace_scope() : r(nullptr) {
        struct trace_buf *b = g_trace;
        const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
        if (!b || (tid & 31)) return;
        const unsigned i = atomicAdd(&b->n, 1u);
        if (i >= b->cap) return;
        r = &b->rec[i];
        unsigned long long g;
        unsigned sm;
        asm volatile("mov.u64 %0, %%gridid;" : "=l"(g));
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        r->grid = g;
        r->block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        r->warp = tid >> 5;
        r->sm = sm;
        r->tw = r->tm[0] = r->tm[1] = r->tm[2] = 0;
        r->t0 = trace_now();
    }
    __device__ void waited() {
        if (r) r->tw = trace_now();
    }
    __device__ void mark(int i) {
        if (r) r->tm[i] = trace_now();
    }
    __device__ ~trace_scope() {
        if (r) r->t1 = trace_now();
    }
};
#define TRACE_BEGIN() struct trace_scope trace_
#define TRACE_WAIT()  trace_.waited()
#define TRACE_MARK(i) trace_.mark(i)
#else
#define TRACE_BEGIN()                                                                              \
    do {                                                                                           \
    } while (0)
#define TRACE_WAIT()                                                                               \
    do {                                                                                           \
    } while (0)
#define TRACE_MARK(i)                                                                              \
    do {                                                                                           \
    } while (0)
#endif

// Host: points every traced kernel at b (NULL: tracing off). 0, or -1 in a build without traces.
int decode_trace_enable(struct trace_buf *b);
