// The sampler's shared pieces (sample.cu: the greedy argmax and the one-block kernel;
// sample_cand.cu: the candidate kernel, which falls back to the one-block sampler): key order,
// penalties, the RNG, recording a token, and the one-block sampler itself.
#pragma once
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "backend/cuda/decode.cuh"

#define SAMPLE_THREADS 1024

static __device__ __forceinline__ uint32_t fkey(float f) { // order-preserving float -> uint
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static __device__ __forceinline__ float kfloat(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
// Logit l of id i as one 64-bit key: larger logit first, ties to the lower id (every sampler's
// order; 0 is below every id's key).
static __device__ __forceinline__ unsigned long long lkey(float l, int i) {
    return ((unsigned long long)fkey(l) << 32) | (0xFFFFFFFFu - (uint32_t)i);
}
static __device__ __forceinline__ float lkey_logit(unsigned long long k) {
    return kfloat((uint32_t)(k >> 32));
}
static __device__ __forceinline__ int lkey_id(unsigned long long k) {
    return (int)(0xFFFFFFFFu - (uint32_t)k);
}

static __device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Logit i with the penalties (HF repetition over prompt + generated; OpenAI presence/frequency over
// generated). The counts are read only when a count penalty is on (l - 0 is l).
static __device__ __forceinline__ float pen_logit(const struct sample_params &p, int i) {
    float l = p.logits[i];
    if (p.repetition != 1.f && p.seen[i]) l = l > 0.f ? l / p.repetition : l * p.repetition;
    if (p.frequency != 0.f || p.presence != 0.f) {
        const int c = p.counts[i];
        if (c) l -= p.frequency * (float)c + p.presence;
    }
    return l;
}

// Records the chosen token: ring slot, next input, counts, step and position counters.
static __device__ void emit(const struct sample_params &p, int tok, float logprob, int n_top,
                            const int *top_id, const float *top_lp) {
    int step = *p.step;
    struct sampled_token *r = p.ring + (step % p.ring_n);
    r->id = tok;
    r->logprob = logprob;
    r->n_top = n_top;
    for (int i = 0; i < n_top; i++) r->top_id[i] = top_id[i], r->top_logprob[i] = top_lp[i];
    *p.tok_out = tok;
    p.counts[tok] += 1;
    p.seen[tok] = 1;
    *p.step = step + 1;
    if (p.advance_pos) *p.pos += 1;
}

// ---- full sampler: one block ----------------------------------------------------------------
typedef cub::BlockReduce<float, SAMPLE_THREADS> BRf;
typedef cub::BlockScan<float, SAMPLE_THREADS> BSf;

struct samp_smem {
    union {
        typename BRf::TempStorage r;
        typename BSf::TempStorage s;
    } cub;
    float hist[256];
    unsigned cnt[256];
    float bf;
    uint32_t bu;
    int chosen;
    int ncand;
    int cand_id[64];
    float cand_v[64];
};

// Radix selection over the values v(i) = scale * work[i] of ids with key >= floor_key: returns the
// key tau with (count or mass of keys > tau) < target <= (count or mass of keys >= tau).
// Mass of id i is exp(v(i) - vmax).
template <bool MASS>
static __device__ uint32_t radix_select(const float *work, int n, float scale, float vmax,
                                        uint32_t floor_key, float target, samp_smem &sm) {
    uint32_t prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) sm.hist[b] = 0.f, sm.cnt[b] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            float v = work[i] * scale;
            uint32_t k = fkey(v);
            if (k < floor_key || (k & mask) != prefix) continue;
            int bin = (k >> shift) & 255;
            if (MASS)
                atomicAdd(&sm.hist[bin], __expf(v - vmax));
            else
                atomicAdd(&sm.cnt[bin], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float acc = 0.f;
            int b = 255;
            for (; b > 0; b--) {
                float c = MASS ? sm.hist[b] : (float)sm.cnt[b];
                if (acc + c >= target) break;
                acc += c;
            }
            sm.bf = target - acc;
            sm.bu = (uint32_t)b;
        }
        __syncthreads();
        target = sm.bf;
        prefix |= sm.bu << shift;
        mask |= 255u << shift;
        __syncthreads();
    }
    return prefix;
}

// The whole sampler in one block of SAMPLE_THREADS threads.
static __device__ void sample_full(const struct sample_params &p) {
    __shared__ samp_smem sm;
    const int n = p.n_vocab, tid = threadIdx.x;
    // penalties (HF repetition over prompt + generated; OpenAI presence/frequency over generated)
    float mx = -INFINITY;
    int mi = 0x7fffffff;
    for (int i = tid; i < n; i += blockDim.x) {
        const float l = pen_logit(p, i);
        p.work[i] = l;
        if (l > mx) mx = l, mi = i;
    }
    // block argmax of the penalised logits (ties: lower id)
    {
        unsigned long long k = mi == 0x7fffffff ? 0ull : lkey(mx, mi);
        typedef cub::BlockReduce<unsigned long long, SAMPLE_THREADS> BRu;
        __shared__ typename BRu::TempStorage tr;
        unsigned long long best = BRu(tr).Reduce(
            k, [](unsigned long long a, unsigned long long b) { return a > b ? a : b; });
        if (tid == 0) sm.bu = (uint32_t)lkey_id(best), sm.bf = lkey_logit(best);
        __syncthreads();
        mi = (int)sm.bu;
        mx = sm.bf;
        __syncthreads();
    }
    int tok = mi;
    if (p.temperature > 0.f) {
        const float sc = 1.f / p.temperature, vmax = mx * sc;
        uint32_t floor_key = 0;
        if (p.top_k > 0 && p.top_k < n)
            floor_key = radix_select<false>(p.work, n, sc, vmax, 0, (float)p.top_k, sm);
        if (p.top_p < 1.f) {
            float z = 0.f;
            for (int i = tid; i < n; i += blockDim.x) {
                float v = p.work[i] * sc;
                if (fkey(v) >= floor_key) z += __expf(v - vmax);
            }
            z = BRf(sm.cub.r).Sum(z);
            if (tid == 0) sm.bf = z;
            __syncthreads();
            z = sm.bf;
            __syncthreads();
            uint32_t t =
                radix_select<true>(p.work, n, sc, vmax, floor_key, fmaxf(p.top_p, 0.f) * z, sm);
            floor_key = t > floor_key ? t : floor_key;
        }
        if (p.min_p > 0.f) {
            uint32_t t = fkey(vmax + logf(p.min_p));
            floor_key = t > floor_key ? t : floor_key;
        }
        // draw: ordered scan over contiguous per-thread segments
        const int seg = (n + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
        const int b0 = tid * seg, b1 = min(n, b0 + seg);
        float local = 0.f;
        for (int i = b0; i < b1; i++) {
            float v = p.work[i] * sc;
            if (fkey(v) >= floor_key) local += __expf(v - vmax);
        }
        float excl, total;
        BSf(sm.cub.s).ExclusiveSum(local, excl, total);
        if (tid == 0) sm.chosen = -1;
        __syncthreads();
        uint64_t r = splitmix64(p.seed ^ splitmix64((uint64_t)(*p.step) + 1));
        float target = (float)(r >> 40) * (1.f / 16777216.f) * total;
        if (target >= excl && target < excl + local) {
            float acc = excl;
            int last = -1;
            for (int i = b0; i < b1; i++) {
                float v = p.work[i] * sc;
                if (fkey(v) < floor_key) continue;
                last = i;
                acc += __expf(v - vmax);
                if (acc > target) break;
            }
            if (last >= 0) sm.chosen = last;
        }
        __syncthreads();
        if (sm.chosen >= 0) tok = sm.chosen;
        __syncthreads();
    }
    // logprobs under the penalised temperature-1 distribution
    float lp = 0.f;
    int ntop = 0;
    if (p.n_logprobs >= 0) {
        float z = 0.f;
        for (int i = tid; i < n; i += blockDim.x) z += __expf(p.work[i] - mx);
        z = BRf(sm.cub.r).Sum(z);
        if (tid == 0) sm.bf = z;
        __syncthreads();
        const float lse = mx + logf(sm.bf);
        lp = p.work[tok] - lse;
        ntop = min(p.n_logprobs, min(WREN_MAX_TOP_LOGPROBS, n));
        if (ntop > 0) {
            uint32_t t = radix_select<false>(p.work, n, 1.f, mx, 0, (float)ntop, sm);
            if (tid == 0) sm.ncand = 0;
            __syncthreads();
            for (int i = tid; i < n; i += blockDim.x) {
                if (fkey(p.work[i]) < t) continue;
                int slot = atomicAdd(&sm.ncand, 1);
                if (slot < 64) sm.cand_id[slot] = i, sm.cand_v[slot] = p.work[i];
            }
            __syncthreads();
            if (tid == 0) {
                int nc = min(sm.ncand, 64);
                for (int a = 1; a < nc; a++) { // insertion sort: value desc, id asc
                    int id = sm.cand_id[a];
                    float v = sm.cand_v[a];
                    int b = a - 1;
                    while (b >= 0 &&
                           (sm.cand_v[b] < v || (sm.cand_v[b] == v && sm.cand_id[b] > id))) {
                        sm.cand_id[b + 1] = sm.cand_id[b], sm.cand_v[b + 1] = sm.cand_v[b];
                        b--;
                    }
                    sm.cand_id[b + 1] = id, sm.cand_v[b + 1] = v;
                }
                ntop = min(ntop, nc);
                for (int a = 0; a < ntop; a++) sm.cand_v[a] -= lse;
            }
        }
    }
    if (tid == 0) emit(p, tok, lp, ntop, sm.cand_id, sm.cand_v);
}

// The candidate kernel (sample_cand.cu): whether it takes this call, and its launch.
bool sample_cand_ok(const struct sample_params *p);
int sample_cand_launch(const struct sample_params *p, cudaStream_t s, struct wren_err *e);
