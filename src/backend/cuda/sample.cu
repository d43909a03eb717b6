// Token sampling on the GPU. The chosen id goes straight into the next step's input buffer and
// into a host-mapped ring (read by the host a step later), so a captured decode step never waits
// for the host. Greedy without penalties: a grid-wide argmax. With a top-k of at most TS_KMAX (the
// models' own defaults, e.g. 20), or greedy with penalties or logprobs: a grid of blocks that each
// keep their slice's best candidates, the last one to finish selecting from them
// (sample_topk_kernel). Everything else: one block that applies the penalties (device-side counts),
// temperature, then top-k, top-p and min-p — each a threshold on the scaled logit found by radix
// selection (by count for top-k, by probability mass for top-p). Both draw from the kept set in id
// order with a counter-based RNG (seed, step).
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "backend/cuda/decode.cuh"

#define SAMPLE_THREADS 1024
#define ARGMAX_THREADS 256

static __device__ __forceinline__ uint32_t fkey(float f) { // order-preserving float -> uint
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static __device__ __forceinline__ float kfloat(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
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

// ---- greedy: grid-wide argmax, the last block emits -----------------------------------------
__global__ void __launch_bounds__(ARGMAX_THREADS)
    argmax_kernel(const __grid_constant__ struct sample_params p) {
    TRACE_BEGIN();
    pdl_wait(); // launched early (programmatic launch): the logits come from the lm_head
    TRACE_WAIT();
    unsigned long long best = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n_vocab;
         i += gridDim.x * blockDim.x) {
        unsigned long long k =
            ((unsigned long long)fkey(p.logits[i]) << 32) | (0xFFFFFFFFu - (uint32_t)i);
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
    int tok = (int)(0xFFFFFFFFu - (uint32_t)(k & 0xFFFFFFFFu));
    *p.counter = 0;
    emit(p, tok, 0.f, 0, nullptr, nullptr);
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
        unsigned long long k =
            mi == 0x7fffffff ? 0ull
                             : ((unsigned long long)fkey(mx) << 32) | (0xFFFFFFFFu - (uint32_t)mi);
        typedef cub::BlockReduce<unsigned long long, SAMPLE_THREADS> BRu;
        __shared__ typename BRu::TempStorage tr;
        unsigned long long best = BRu(tr).Reduce(
            k, [](unsigned long long a, unsigned long long b) { return a > b ? a : b; });
        if (tid == 0)
            sm.bu = (uint32_t)(0xFFFFFFFFu - (uint32_t)(best & 0xFFFFFFFFu)),
            sm.bf = kfloat((uint32_t)(best >> 32));
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

__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_full_kernel(const __grid_constant__ struct sample_params p) {
    sample_full(p);
}

// ---- candidate sampler: every block keeps its slice's best, the last block selects -----------
// Block b takes ids [b TS_ELEMS, (b + 1) TS_ELEMS) and keeps its first kc (the candidate count:
// top-k, or TS_KMAX without one; top logprobs; 1 for greedy) in the order (penalised logit desc,
// id asc), with the scaled key of its next one and its (max, sum of exp) for the log-partition
// and the scaled mass. That order is total and the same in every block, so the global first kc are
// among the blocks' first kc. A floor on the scaled key (top-k: the top_k-th's, ties included;
// top-p: the group where the mass from the top reaches top_p of all; min-p) keeps exactly the
// candidates above it when no block's next key reaches it and the kept set fits in TS_CHUNK; else
// (identical logits tied at a block's cut, top-p over more than TS_CHUNK ids) the last block runs
// the one-block sampler instead. Without any floor the draw picks a block by its mass and then an
// id in it, both in id order.
// The selection is a sort of 128 keys per warp in registers (bitonic, by shuffles) and a
// tournament between the warps (the top 128 of two sorted chunks is the elementwise max of one and
// the other reversed, a bitonic sequence), so a block needs five barriers, not a sort of its slice
// in shared memory (~13 us on an H200).
#define TS_PER   4 // keys per lane: a warp sorts TS_CHUNK
#define TS_CHUNK (TS_PER * 32)
#define TS_WARPS (SAMPLE_THREADS / 32)
#define TS_ELEMS (TS_CHUNK * TS_WARPS) // ids per block
#define TS_KMAX  64                    // the largest candidate count this path takes (< TS_CHUNK)

typedef unsigned long long u64;

static __host__ __device__ __forceinline__ int ts_blocks(int n) {
    return (n + TS_ELEMS - 1) / TS_ELEMS;
}
// Candidates per block (<= n).
static __host__ __device__ __forceinline__ bool ts_topk(const struct sample_params &p) {
    return p.temperature > 0.f && p.top_k >= 1 && p.top_k < p.n_vocab;
}
static __host__ __device__ __forceinline__ int ts_kc(const struct sample_params &p) {
    int kc = p.temperature > 0.f ? (ts_topk(p) ? p.top_k : TS_KMAX) : 1;
    if (p.n_logprobs > kc)
        kc = p.n_logprobs < WREN_MAX_TOP_LOGPROBS ? p.n_logprobs : WREN_MAX_TOP_LOGPROBS;
    return kc < p.n_vocab ? kc : p.n_vocab;
}
// Scratch in p.work: [nb][TS_KMAX] candidate keys, [nb] (max, sum of exp) of the logits and of the
// scaled ones, [nb] next keys.
struct ts_scratch {
    u64 *cand;
    float2 *part, *spart;
    uint32_t *next;
};
static __host__ __device__ __forceinline__ ts_scratch ts_layout(void *work, int nb) {
    ts_scratch t;
    t.cand = reinterpret_cast<u64 *>(work);
    t.part = reinterpret_cast<float2 *>(t.cand + (size_t)nb * TS_KMAX);
    t.spart = t.part + nb;
    t.next = reinterpret_cast<uint32_t *>(t.spart + nb);
    return t;
}

size_t sample_work_bytes(int vocab) {
    const size_t nb = (size_t)ts_blocks(vocab);
    const size_t fast = nb * TS_KMAX * 8 + nb * 16 + nb * 4, full = (size_t)vocab * 4;
    return fast > full ? fast : full;
}

// Whether the candidate kernel takes this call (not plain greedy: the argmax kernel is cheaper):
// all blocks' candidates within one block's keys.
static bool ts_eligible(const struct sample_params &p) {
    if (p.n_vocab < 1) return false;
    const int kc = ts_kc(p);
    return kc >= 1 && kc <= TS_KMAX && (size_t)ts_blocks(p.n_vocab) * kc <= TS_ELEMS;
}

static __device__ __forceinline__ u64 ts_key(float l, int i) {
    return ((u64)fkey(l) << 32) | (0xFFFFFFFFu - (uint32_t)i);
}
static __device__ __forceinline__ float ts_l(u64 k) {
    return kfloat((uint32_t)(k >> 32));
}
static __device__ __forceinline__ int ts_id(u64 k) {
    return (int)(0xFFFFFFFFu - (uint32_t)k);
}
// The key top-k, top-p and min-p compare: of the logit scaled by 1 / temperature (v = l sc, as
// the one-block kernel computes it).
static __device__ __forceinline__ uint32_t ts_skey(u64 k, float sc) {
    return fkey(ts_l(k) * sc);
}

static __device__ __forceinline__ u64 shfl_xor64(u64 v, int m) {
    const uint32_t lo = __shfl_xor_sync(0xffffffffu, (uint32_t)v, m);
    const uint32_t hi = __shfl_xor_sync(0xffffffffu, (uint32_t)(v >> 32), m);
    return ((u64)hi << 32) | lo;
}

// One bitonic stage over the warp's chunk (element e = 32 r + lane) towards descending order:
// pairs (e, e ^ j) within sequences of SIZE, descending where e & SIZE is 0.
template <int SIZE, int J> static __device__ __forceinline__ void ts_stage(u64 (&k)[TS_PER]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < TS_PER; r++) {
        const bool desc = ((r * 32 + lane) & SIZE) == 0;
        if constexpr (J >= 32) {
            constexpr int d = J / 32;
            if ((r & d) == 0) { // the pair (r, r + d) once, from its lower element
                const u64 a = k[r], b = k[r + d];
                if (desc ? a < b : a > b) k[r] = b, k[r + d] = a;
            }
        } else {
            const u64 o = shfl_xor64(k[r], J);
            const bool lower = (lane & J) == 0;
            const u64 mx = k[r] > o ? k[r] : o, mn = k[r] > o ? o : k[r];
            k[r] = lower == desc ? mx : mn;
        }
    }
}
template <int SIZE, int J> static __device__ __forceinline__ void ts_merge(u64 (&k)[TS_PER]) {
    ts_stage<SIZE, J>(k);
    if constexpr (J > 1) ts_merge<SIZE, J / 2>(k);
}
template <int SIZE> static __device__ __forceinline__ void ts_sort(u64 (&k)[TS_PER]) {
    if constexpr (SIZE > 2) ts_sort<SIZE / 2>(k);
    ts_merge<SIZE, SIZE / 2>(k);
}

// The block's TS_ELEMS keys (k of every thread) -> the largest TS_CHUNK, descending, in warp 0's
// k. sm: TS_ELEMS / 2 keys.
static __device__ void ts_block_top(u64 (&k)[TS_PER], u64 *sm) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    ts_sort<TS_CHUNK>(k);
    for (int w = TS_WARPS / 2; w >= 1; w >>= 1) {
        if (warp >= w && warp < 2 * w)
#pragma unroll
            for (int r = 0; r < TS_PER; r++) sm[(warp - w) * TS_CHUNK + r * 32 + lane] = k[r];
        __syncthreads();
        if (warp < w) {
#pragma unroll
            for (int r = 0; r < TS_PER; r++) {
                const u64 o = sm[warp * TS_CHUNK + TS_CHUNK - 1 - (r * 32 + lane)];
                k[r] = k[r] > o ? k[r] : o;
            }
            ts_merge<TS_CHUNK * 2, TS_CHUNK / 2>(k); // SIZE past the chunk: all descending
        }
        __syncthreads();
    }
}

// Warp 0: the number of leading entries of a[0, n) (n <= TS_CHUNK, keys not increasing) whose
// scaled key is at least f.
static __device__ int ts_prefix(const u64 *a, int n, float sc, uint32_t f) {
    const int lane = threadIdx.x & 31;
    int c = 0;
    for (int r = 0; r < TS_PER; r++) {
        const int j = r * 32 + lane;
        c += __popc(__ballot_sync(0xffffffffu, j < n && ts_skey(a[j], sc) >= f));
    }
    return c;
}

// Warp 0: the first index of a[0, n) at which the running mass exp(v - vmax) exceeds target (-1
// if it never does); with target < 0 only the total, into *total. by_id: a holds (id, logit
// bits), else keys.
static __device__ int ts_walk(const u64 *a, int n, float sc, float vmax, float target, bool by_id,
                              float *total) {
    const int lane = threadIdx.x & 31;
    float acc = 0.f;
    for (int c0 = 0; c0 < n; c0 += 32) {
        const int j = c0 + lane;
        float m = 0.f;
        if (j < n) m = __expf((by_id ? __uint_as_float((uint32_t)a[j]) : ts_l(a[j])) * sc - vmax);
        float inc = m; // inclusive scan over the chunk
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float y = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= o) inc += y;
        }
        if (target >= 0.f) {
            const unsigned hit = __ballot_sync(0xffffffffu, j < n && acc + inc > target);
            if (hit) return c0 + __ffs(hit) - 1;
        }
        acc += __shfl_sync(0xffffffffu, inc, 31);
    }
    if (total) *total = acc;
    return -1;
}

// Warp 0: whether every block's next key is below f (so every id at or above f is a candidate)
// and the candidates at or above f fit in the sorted TS_CHUNK (m candidates in all).
static __device__ bool ts_complete(const uint32_t *next, int nb, const u64 *top, int m, float sc,
                                   uint32_t f) {
    bool ok = !(m > TS_CHUNK && ts_skey(top[TS_CHUNK - 1], sc) >= f);
    for (int b = threadIdx.x & 31; b < nb; b += 32) ok &= __ldcg(next + b) < f;
    return __all_sync(0xffffffffu, ok);
}

// Warp 0: the merged (max, sum of exp(x - max)) of the blocks' parts, as log of the sum.
static __device__ float ts_lse(const float2 *part, int nb) {
    float M = -INFINITY, Z = 0.f;
    for (int b = threadIdx.x & 31; b < nb; b += 32) M = fmaxf(M, __ldcg(&part[b].x));
    for (int o = 16; o; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    for (int b = threadIdx.x & 31; b < nb; b += 32) {
        const float2 pb = __ldcg(part + b);
        Z += pb.y * __expf(pb.x - M);
    }
    for (int o = 16; o; o >>= 1) Z += __shfl_xor_sync(0xffffffffu, Z, o);
    return M + logf(Z);
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_topk_kernel(const __grid_constant__ struct sample_params p) {
    __shared__ u64 sm[TS_ELEMS / 2];
    __shared__ typename BRf::TempStorage tr;
    __shared__ typename BSf::TempStorage ts;
    __shared__ float bval, s_target, s_vmax, s_ltok;
    __shared__ bool last;
    __shared__ int mode, s_blk, s_tok, ntop;
    __shared__ int top_id[WREN_MAX_TOP_LOGPROBS];
    __shared__ float top_lp[WREN_MAX_TOP_LOGPROBS];
    TRACE_BEGIN();
    pdl_wait(); // launched early (programmatic launch): the logits come from the lm_head
    TRACE_WAIT();
    const int n = p.n_vocab, nb = gridDim.x, kc = ts_kc(p), tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    const bool sampling = p.temperature > 0.f, topk = ts_topk(p);
    // no top-k: the mass over every id, for top-p or for a draw without a floor
    const bool spart = sampling && !topk;
    const float sc = sampling ? 1.f / p.temperature : 1.f;
    const ts_scratch t = ts_layout(p.work, nb);
    const int b0 = blockIdx.x * TS_ELEMS;
    u64 k[TS_PER];
    float mx = -INFINITY;
#pragma unroll
    for (int r = 0; r < TS_PER; r++) {
        const int i = b0 + warp * TS_CHUNK + r * 32 + lane;
        k[r] = 0; // below every id's key
        if (i < n) {
            const float l = pen_logit(p, i);
            k[r] = ts_key(l, i), mx = fmaxf(mx, l);
        }
    }
    if (p.n_logprobs >= 0 || spart) { // this slice's parts of the log-partition and scaled mass
        mx = BRf(tr).Reduce(mx, [](float a, float b) { return fmaxf(a, b); });
        if (tid == 0) bval = mx;
        __syncthreads();
        mx = bval;
        if (p.n_logprobs >= 0) {
            float z = 0.f;
#pragma unroll
            for (int r = 0; r < TS_PER; r++)
                if (k[r]) z += __expf(ts_l(k[r]) - mx);
            z = BRf(tr).Sum(z);
            if (tid == 0) t.part[blockIdx.x] = make_float2(mx, z);
            __syncthreads();
        }
        if (spart) {
            float z = 0.f;
#pragma unroll
            for (int r = 0; r < TS_PER; r++)
                if (k[r]) z += __expf(ts_l(k[r]) * sc - mx * sc);
            z = BRf(tr).Sum(z);
            if (tid == 0) t.spart[blockIdx.x] = make_float2(mx * sc, z);
        }
    }
    ts_block_top(k, sm);
    if (warp == 0)
#pragma unroll
        for (int r = 0; r < TS_PER; r++) {
            const int j = r * 32 + lane;
            if (j < kc) t.cand[(size_t)blockIdx.x * TS_KMAX + j] = k[r];
            if (j == kc) t.next[blockIdx.x] = b0 + kc < n ? ts_skey(k[r], sc) : 0u;
        }
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(p.counter, 1u) == (unsigned)nb - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    // the blocks' candidates -> the largest TS_CHUNK, descending, into sm[0, TS_CHUNK)
    const int m = nb * kc;
#pragma unroll
    for (int r = 0; r < TS_PER; r++) {
        const int j = warp * TS_CHUNK + r * 32 + lane;
        k[r] = j < m ? __ldcg(t.cand + (size_t)(j / kc) * TS_KMAX + j % kc) : 0ull;
    }
    ts_block_top(k, sm);
    const uint64_t rnd = splitmix64(p.seed ^ splitmix64((uint64_t)(*p.step) + 1));
    const float u = (float)(rnd >> 40) * (1.f / 16777216.f);
    // warp 0 selects; mode 0: it drew (or greedy), 1: the one-block sampler, 2: a draw without a
    // floor, in block s_blk
    if (warp == 0) {
#pragma unroll
        for (int r = 0; r < TS_PER; r++) sm[r * 32 + lane] = k[r];
        __syncwarp();
        if (lane == 0) *p.counter = 0;
        float lse = 0.f;
        int nt = 0;
        if (p.n_logprobs >= 0) {
            lse = ts_lse(t.part, nb);
            nt = min(min(p.n_logprobs, WREN_MAX_TOP_LOGPROBS), n);
            if (lane < nt) top_id[lane] = ts_id(sm[lane]), top_lp[lane] = ts_l(sm[lane]) - lse;
        }
        int md = 0, tok = ts_id(sm[0]);
        float ltok = ts_l(sm[0]);
        const int ntopc = m < TS_CHUNK ? m : TS_CHUNK;
        const float vmax = ts_l(sm[0]) * sc;
        if (sampling && !topk && p.top_p >= 1.f && p.min_p <= 0.f) {
            // no floor: the block where u of the mass falls, in id order
            float acc = 0.f, tot = 0.f;
            for (int b = lane; b < nb; b += 32) {
                const float2 sb = __ldcg(t.spart + b);
                tot += sb.y * __expf(sb.x - vmax);
            }
            for (int o = 16; o; o >>= 1) tot += __shfl_xor_sync(0xffffffffu, tot, o);
            const float target = u * tot;
            int blk = nb - 1;
            for (int c0 = 0; c0 < nb; c0 += 32) {
                const int b = c0 + lane;
                float mb = 0.f;
                if (b < nb) {
                    const float2 sb = __ldcg(t.spart + b);
                    mb = sb.y * __expf(sb.x - vmax);
                }
                float inc = mb;
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                    const float y = __shfl_up_sync(0xffffffffu, inc, o);
                    if (lane >= o) inc += y;
                }
                const unsigned hit = __ballot_sync(0xffffffffu, b < nb && acc + inc > target);
                if (hit) {
                    const int h = __ffs(hit) - 1;
                    blk = c0 + h;
                    acc += __shfl_sync(0xffffffffu, inc - mb, h);
                    break;
                }
                acc += __shfl_sync(0xffffffffu, inc, 31);
            }
            if (lane == 0) s_blk = blk, s_target = target - acc, s_vmax = vmax;
            md = 2;
        } else if (sampling) {
            uint32_t floor_key = 0;
            bool ok = true;
            int keep = ntopc;
            if (topk) { // the keys at or above the top_k-th's (kc may be larger, for logprobs)
                floor_key = ts_skey(sm[p.top_k - 1], sc);
                ok = ts_complete(t.next, nb, sm, m, sc, floor_key);
                keep = ts_prefix(sm, ntopc, sc, floor_key); // a prefix: keys do not increase
            }
            if (ok && p.top_p < 1.f) { // the smallest prefix of whole key groups reaching top_p
                float z = 0.f;
                if (topk) {
                    ts_walk(sm, keep, sc, vmax, -1.f, false, &z);
                } else {
                    for (int b = lane; b < nb; b += 32) {
                        const float2 sb = __ldcg(t.spart + b);
                        z += sb.y * __expf(sb.x - vmax);
                    }
                    for (int o = 16; o; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
                }
                int j = ts_walk(sm, keep, sc, vmax, fmaxf(p.top_p, 0.f) * z, false, NULL);
                if (j < 0) j = keep - 1, ok = topk; // short by rounding, or beyond the candidates
                // mass(keys >= key_j) reaches the target and mass(keys > key_j) does not
                const uint32_t tp = ts_skey(sm[j], sc);
                floor_key = tp > floor_key ? tp : floor_key;
            }
            if (p.min_p > 0.f) {
                const uint32_t tm = fkey(vmax + logf(p.min_p));
                floor_key = tm > floor_key ? tm : floor_key;
            }
            if (!topk) ok = ok && ts_complete(t.next, nb, sm, m, sc, floor_key);
            if (ok) {
                keep = ts_prefix(sm, keep, sc, floor_key); // >= 1: the first id's key is vmax's
                // draw in id order: (id, logit bits) ascending, sorted descending as complements
#pragma unroll
                for (int r = 0; r < TS_PER; r++) {
                    const int j = r * 32 + lane;
                    k[r] = j < keep ? ~(((u64)ts_id(sm[j]) << 32) | __float_as_uint(ts_l(sm[j])))
                                    : 0ull;
                }
                ts_sort<TS_CHUNK>(k);
                __syncwarp();
#pragma unroll
                for (int r = 0; r < TS_PER; r++) sm[r * 32 + lane] = ~k[r];
                __syncwarp();
                float total = 0.f;
                ts_walk(sm, keep, sc, vmax, -1.f, true, &total);
                int j = ts_walk(sm, keep, sc, vmax, u * total, true, NULL);
                if (j < 0) j = keep - 1;
                tok = (int)(sm[j] >> 32), ltok = __uint_as_float((uint32_t)sm[j]);
            }
            md = ok ? 0 : 1;
        }
        if (lane == 0) mode = md, s_tok = tok, s_ltok = ltok, bval = lse, ntop = nt;
        if (lane == 0 && p.path) *p.path = md;
    }
    __syncthreads();
    if (mode == 1) {
        sample_full(p);
        return;
    }
    if (mode == 2) { // a draw without a floor, inside block s_blk: 4 consecutive ids per thread
        const int base = s_blk * TS_ELEMS + tid * TS_PER;
        float mass[TS_PER], local = 0.f;
#pragma unroll
        for (int r = 0; r < TS_PER; r++) {
            mass[r] = base + r < n ? __expf(pen_logit(p, base + r) * sc - s_vmax) : 0.f;
            local += mass[r];
        }
        float excl;
        BSf(ts).ExclusiveSum(local, excl);
        if (tid == 0) s_tok = min(n, (s_blk + 1) * TS_ELEMS) - 1; // if rounding leaves it short
        __syncthreads();
        const float target = s_target;
        if (target >= excl && target < excl + local) {
            float acc = excl;
#pragma unroll
            for (int r = 0; r < TS_PER; r++) {
                acc += mass[r];
                if (acc > target && base + r < n) {
                    s_tok = base + r;
                    break;
                }
            }
        }
        __syncthreads();
        if (tid == 0) s_ltok = pen_logit(p, s_tok);
    }
    if (tid == 0) emit(p, s_tok, p.n_logprobs >= 0 ? s_ltok - bval : 0.f, ntop, top_id, top_lp);
}

int sample_launch(const struct sample_params *p, cudaStream_t s, struct wren_err *e) {
    const bool plain_greedy = p->temperature <= 0.f && p->n_logprobs < 0 && p->presence == 0.f &&
                              p->frequency == 0.f && p->repetition == 1.f;
    if (!plain_greedy && !p->one_block && ts_eligible(*p)) {
        CUDA_CHECK(pdl_launch(sample_topk_kernel, dim3(ts_blocks(p->n_vocab)), dim3(SAMPLE_THREADS),
                              0, s, decode_pdl(), *p));
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
