// The candidate sampler: every block keeps its slice's best, the last block selects and draws.
// Block b takes ids [b TS_ELEMS, (b + 1) TS_ELEMS) and keeps its first kc (the candidate count:
// top-k, or TS_KMAX for top-p / min-p without one; top logprobs; 1 for greedy or a draw without a
// floor) in the order (penalised logit desc, id asc), with the scaled key of its next one and its
// (max, sum of exp) for the log-partition and the scaled mass. That order is total and the same in
// every block, so the global first kc are among the blocks' first kc. A floor on the scaled key
// (top-k: the top_k-th's, ties included; top-p: the group where the mass from the top reaches top_p
// of all; min-p) keeps exactly the candidates above it when no block's next key reaches it and the
// kept set fits in TS_CHUNK; else (identical logits tied at a block's cut, top-p over more than
// TS_CHUNK ids) the last block runs the one-block sampler instead. Without any floor the draw picks
// a block by its mass and then an id in it, both in id order. Top-p and min-p without a top-k,
// where the card holds the whole grid at once: every block keeps only its maximum, and all blocks
// then find the kept set together and draw as without a floor (sample_coop.cuh).
//
// The selection (ts_top): the kc + 1 largest of a block's keys are at or above the (kc + 1)-th
// largest of its 128 groups' maxima, so usually a few dozen keys pass that bound and one warp sorts
// them (bitonic, in registers, by shuffles). Where more pass (flat or tied logits, or top-p without
// top-k, which may keep 128), every warp sorts its 128 keys and the warps play a tournament (the
// top 128 of two sorted chunks is the elementwise max of one and the other reversed, a bitonic
// sequence): five barriers a block. A first version sorted each block's keys, and the candidates,
// in shared memory (barrier-separated bitonic stages): ~40 us more per token; the tournament alone
// ~30 us per call (bench/RESULTS.md, twenty-fifth and twenty-sixth sessions).
#include "backend/cuda/sample_coop.cuh"

#define TS_PER   4 // keys per lane: a warp sorts TS_CHUNK
#define TS_CHUNK (TS_PER * 32)
#define TS_WARPS (SAMPLE_THREADS / 32)
#define TS_ELEMS (TS_CHUNK * TS_WARPS) // ids per block
#define TS_KMAX  64                    // the largest candidate count this path takes (< TS_CHUNK)

static __host__ __device__ __forceinline__ int ts_blocks(int n) {
    return (n + TS_ELEMS - 1) / TS_ELEMS;
}
// Whether a top-k bounds the kept set.
static __host__ __device__ __forceinline__ bool ts_topk(const struct sample_params &p) {
    return p.temperature > 0.f && p.top_k >= 1 && p.top_k < p.n_vocab;
}
// A draw from every id (temperature alone): by block mass, then inside the block.
static __host__ __device__ __forceinline__ bool ts_floorless(const struct sample_params &p) {
    return p.temperature > 0.f && !ts_topk(p) && p.top_p >= 1.f && p.min_p <= 0.f;
}
// Candidates per block (<= n): the top-k; without one, TS_KMAX for top-p and min-p, or just the
// maximum where the multi-block selection finds their kept set (coop) and for a floorless draw;
// the top logprobs when more.
static __host__ __device__ __forceinline__ int ts_kc(const struct sample_params &p, bool coop) {
    int kc = p.temperature > 0.f ? (ts_topk(p)                ? p.top_k
                                    : ts_floorless(p) || coop ? 1
                                                              : TS_KMAX)
                                 : 1;
    if (p.n_logprobs > kc)
        kc = p.n_logprobs < WREN_MAX_TOP_LOGPROBS ? p.n_logprobs : WREN_MAX_TOP_LOGPROBS;
    return kc < p.n_vocab ? kc : p.n_vocab;
}
// Scratch in p.work: [nb][TS_KMAX] candidate keys, [nb] (max, sum of exp) of the logits and of the
// scaled ones, [nb] next keys; the one-block sampler's values over them; then the multi-block
// selection's (co_glob).
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

static __host__ __device__ __forceinline__ size_t ts_co_offset(int vocab) {
    const size_t nb = (size_t)ts_blocks(vocab);
    const size_t fast = nb * TS_KMAX * 8 + nb * 16 + nb * 4, full = (size_t)vocab * 4;
    return ((fast > full ? fast : full) + 255) / 256 * 256;
}
static __device__ __forceinline__ co_glob *ts_co(const struct sample_params &p) {
    return reinterpret_cast<co_glob *>(reinterpret_cast<char *>(p.work) + ts_co_offset(p.n_vocab));
}

size_t sample_work_bytes(int vocab) {
    return ts_co_offset(vocab) + co_bytes(ts_blocks(vocab));
}

// Whether the kept set may need the multi-block selection: top-p or min-p without a top-k.
static bool ts_coop_call(const struct sample_params &p) {
    return p.temperature > 0.f && !ts_topk(p) && !ts_floorless(p);
}

// Whether the candidate kernel takes this call (not plain greedy: the argmax kernel is cheaper):
// all blocks' candidates within one block's keys.
static bool ts_eligible(const struct sample_params &p) {
    if (p.n_vocab < 1) return false;
    const int kc = ts_kc(p, false);
    return kc >= 1 && kc <= TS_KMAX && (size_t)ts_blocks(p.n_vocab) * kc <= TS_ELEMS;
}

// The key top-k, top-p and min-p compare: of the logit scaled by 1 / temperature (v = l sc, as
// the one-block kernel computes it).
static __device__ __forceinline__ uint32_t ts_skey(u64 k, float sc) {
    return fkey(lkey_logit(k) * sc);
}

static __device__ __forceinline__ u64 shfl_xor64(u64 v, int m) {
    const uint32_t lo = __shfl_xor_sync(0xffffffffu, (uint32_t)v, m);
    const uint32_t hi = __shfl_xor_sync(0xffffffffu, (uint32_t)(v >> 32), m);
    return ((u64)hi << 32) | lo;
}

// Bitonic sorting of a warp's P x 32 keys (element e = 32 r + lane) towards descending order, as
// loops over the stages: the sampler runs once per token, so its code comes cold from the L2 (~2.4
// cycles per instruction, bench_icache), and an unrolled network of 128 keys was ~1,300
// instructions per copy (the kernel ran 36-40 us inside the decode step, 20 in a loop of calls).
// One stage: pairs (e, e ^ j) within sequences of `size`, descending where e & size is 0.
template <int P> static __device__ __forceinline__ void ts_stage(u64 (&k)[P], int size, int j) {
    const int lane = threadIdx.x & 31;
    if (j >= 32) { // between registers r and r + j / 32
#pragma unroll
        for (int d = 1; d < P; d <<= 1)
            if (j == 32 * d)
#pragma unroll
                for (int r = 0; r < P; r++)
                    if ((r & d) == 0) {
                        const bool desc = ((r * 32 + lane) & size) == 0;
                        const u64 a = k[r], b = k[r + d];
                        if (desc ? a < b : a > b) k[r] = b, k[r + d] = a;
                    }
        return;
    }
#pragma unroll
    for (int r = 0; r < P; r++) {
        const bool desc = ((r * 32 + lane) & size) == 0;
        const u64 o = shfl_xor64(k[r], j);
        const bool lower = (lane & j) == 0;
        const u64 mx = k[r] > o ? k[r] : o, mn = k[r] > o ? o : k[r];
        k[r] = lower == desc ? mx : mn;
    }
}
// The stages j, j / 2, ..., 1 of sequences of `size` (a bitonic sequence of j * 2 -> sorted).
template <int P> static __device__ __forceinline__ void ts_merge(u64 (&k)[P], int size, int j) {
#pragma unroll 1
    for (; j >= 1; j >>= 1) ts_stage<P>(k, size, j);
}
template <int P> static __device__ __forceinline__ void ts_sort(u64 (&k)[P]) {
#pragma unroll 1
    for (int size = 2; size <= P * 32; size <<= 1) ts_merge<P>(k, size, size / 2);
}

// The block's shared memory for ts_top.
struct ts_smem {
    u64 x[TS_ELEMS / 2];     // the tournament's exchange; the filter's survivors
    u64 gmax[TS_ELEMS / 32]; // the filter's group maxima (a group: one register of a warp)
    u64 bound;
    int count;
};

// The block's keys (k of every thread, TS_ELEMS; warps from `live` on hold only zeros) -> the
// largest TS_CHUNK, descending, in warp 0's k: a sort per warp, then a tournament between the
// warps (five barriers for 32).
static __device__ __forceinline__ void ts_block_top(u64 (&k)[TS_PER], u64 *sm, int live) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp < live) ts_sort(k);
    int span = 1; // warps at and past it hold zeros: no round for them
    while (span < live) span <<= 1;
    for (int w = span / 2; w >= 1; w >>= 1) {
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
            ts_merge<TS_PER>(k, TS_CHUNK * 2, TS_CHUNK / 2); // size past the chunk: descending
        }
        __syncthreads();
    }
}

// As ts_block_top, where only the first `need` must be exact; returns how many leading keys of
// warp 0's k are (the rest: zeros, or keys not the next largest). For need <= TS_FILTER a filter:
// the need-th largest of the 128 groups' maxima is at most the need-th largest key, so the keys at
// or above it are the largest (at least need of them); when they fit in TS_CHUNK, warp 0 sorts
// only them. Else (many equal or flat keys) the full tournament. The sorts of all warps and the
// tournament were most of the kernel's time.
#define TS_FILTER (TS_KMAX + 1)
static __device__ __forceinline__ int ts_top(u64 (&k)[TS_PER], ts_smem &s, int need, int live) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (need <= TS_FILTER) {
#pragma unroll
        for (int r = 0; r < TS_PER; r++) {
            u64 g = k[r];
#pragma unroll
            for (int o = 16; o; o >>= 1) {
                const u64 h = shfl_xor64(g, o);
                g = h > g ? h : g;
            }
            if (lane == r) s.gmax[warp * TS_PER + r] = g;
        }
        if (threadIdx.x == 0) s.count = 0;
        __syncthreads();
        if (warp == 0) {
            u64 g[TS_PER];
#pragma unroll
            for (int r = 0; r < TS_PER; r++) g[r] = s.gmax[r * 32 + lane];
            ts_sort(g);
#pragma unroll
            for (int r = 0; r < TS_PER; r++) s.gmax[r * 32 + lane] = g[r];
            __syncwarp();
            if (lane == 0) s.bound = s.gmax[need - 1];
        }
        __syncthreads();
        const u64 b = s.bound;
        if (b) { // zero: fewer than need groups hold keys
#pragma unroll
            for (int r = 0; r < TS_PER; r++) {
                const bool in = k[r] >= b;
                const unsigned m = __ballot_sync(0xffffffffu, in);
                int base = 0;
                if (lane == 0 && m) base = atomicAdd(&s.count, __popc(m));
                base = __shfl_sync(0xffffffffu, base, 0) + __popc(m & ((1u << lane) - 1));
                if (in && base < TS_CHUNK) s.x[base] = k[r];
            }
            __syncthreads();
            const int c = s.count;
            if (c <= TS_CHUNK) {
                if (warp == 0) {
#pragma unroll
                    for (int r = 0; r < TS_PER; r++) {
                        const int j = r * 32 + lane;
                        k[r] = j < c ? s.x[j] : 0ull;
                    }
                    ts_sort(k);
                }
                return c;
            }
        }
    }
    ts_block_top(k, s.x, live);
    return TS_CHUNK;
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

// Warp 0: the first j of [0, n) at which the running sum of mass(j), in order, exceeds target (-1
// if it never does: target INFINITY gives the total); *before: the sum before it (or the total).
template <class Mass> static __device__ int ts_scan(int n, float target, Mass mass, float *before) {
    const int lane = threadIdx.x & 31;
    float acc = 0.f;
    for (int c0 = 0; c0 < n; c0 += 32) {
        const int j = c0 + lane;
        const float m = j < n ? mass(j) : 0.f;
        float inc = m; // inclusive scan over the chunk
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float y = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= o) inc += y;
        }
        const unsigned hit = __ballot_sync(0xffffffffu, j < n && acc + inc > target);
        if (hit) {
            const int h = __ffs(hit) - 1;
            *before = acc + __shfl_sync(0xffffffffu, inc - m, h);
            return c0 + h;
        }
        acc += __shfl_sync(0xffffffffu, inc, 31);
    }
    *before = acc;
    return -1;
}

// Warp 0: whether every block's next key is below f (so every id at or above f is a candidate).
static __device__ bool ts_complete(const uint32_t *next, int nb, uint32_t f) {
    bool ok = true;
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

// Every block of the multi-block selection (sample_coop.cuh): the floor of the kept set over its
// ids (TS_PER consecutive per thread, as the draw's walk reads them) and its mass above the floor
// for the last block's choice of a block. The last block returns whether it may draw (false:
// the one-block sampler instead), with the floor in floor_key.
static __device__ __noinline__ bool co_select(const struct sample_params &p, co_glob *g,
                                              co_smem &cs, int nb, bool last, unsigned gen,
                                              uint32_t &floor_key) {
    const int tid = threadIdx.x, n = p.n_vocab, base = blockIdx.x * TS_ELEMS + tid * TS_PER;
    const float sc = 1.f / p.temperature, vmax = __ldcg(&g->vmax), span = __ldcg(&g->span);
    float v[TS_PER];
#pragma unroll
    for (int r = 0; r < TS_PER; r++) v[r] = base + r < n ? pen_logit(p, base + r) * sc : -INFINITY;
    uint32_t fl;
    if (!co_floor(p, g, cs, nb, gen, v, vmax, span, fl)) return false;
    float m = 0.f;
#pragma unroll
    for (int r = 0; r < TS_PER; r++)
        if (fkey(v[r]) >= fl) m += __expf(v[r] - vmax);
    m = BRf(cs.red).Sum(m);
    if (tid == 0) g->bpart[nb + blockIdx.x] = m, floor_key = fl;
    co_gather(p.counter, nb, last);
    return true;
}

// COOP: top-p or min-p without a top-k over every block (the multi-block selection), where the
// card holds the whole grid at once; else the last block runs the one-block sampler where the
// candidates cannot hold the kept set. (A template, not a flag: with the multi-block selection's
// call in the kernel, every path spilled.)
template <bool COOP>
__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_topk_kernel(const __grid_constant__ struct sample_params p) {
    constexpr bool coop = COOP;
    __shared__ union { // the phases' memory: candidates, then one of the two selections, the walk
        ts_smem ts;
        samp_smem full;
        co_smem co;
    } su;
    ts_smem &ss = su.ts;
    u64 *const sm = ss.x;
    __shared__ typename BRf::TempStorage tr;
    __shared__ typename BSf::TempStorage ts;
    __shared__ float bval, s_target, s_vmax, s_ltok;
    __shared__ bool last;
    __shared__ unsigned s_gen;
    __shared__ uint32_t s_floor;
    __shared__ int mode, s_blk, s_tok, s_lastid, ntop;
    __shared__ int top_id[WREN_MAX_TOP_LOGPROBS];
    __shared__ float top_lp[WREN_MAX_TOP_LOGPROBS];
    TRACE_BEGIN();
    pdl_wait(); // launched early (programmatic launch): the logits come from the lm_head
    TRACE_WAIT();
    const int n = p.n_vocab, nb = gridDim.x, kc = ts_kc(p, coop), tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    const bool sampling = p.temperature > 0.f, topk = ts_topk(p);
    // no top-k: the mass over every id, for top-p (but not over every block) or for a draw without
    // a floor
    const bool spart = sampling && !topk && !coop;
    const float sc = sampling ? 1.f / p.temperature : 1.f;
    const ts_scratch t = ts_layout(p.work, nb);
    co_glob *const cg = ts_co(p);
    const int b0 = blockIdx.x * TS_ELEMS;
    u64 k[TS_PER];
    float mx = -INFINITY;
#pragma unroll
    for (int r = 0; r < TS_PER; r++) {
        const int i = b0 + warp * TS_CHUNK + r * 32 + lane;
        k[r] = 0; // below every id's key
        if (i < n) {
            const float l = pen_logit(p, i);
            k[r] = lkey(l, i), mx = fmaxf(mx, l);
        }
    }
    if (p.n_logprobs >= 0 || spart) { // this slice's parts of the log-partition and scaled mass
        mx = BRf(tr).Reduce(mx, [](float a, float b) { return fmaxf(a, b); });
        if (tid == 0) bval = mx;
        __syncthreads();
        mx = bval;
        // (max, sum of exp) of the logits scaled by s (x 1 is exact: the log-partition's terms)
        auto part = [&](float s, float2 *out) {
            float z = 0.f;
#pragma unroll
            for (int r = 0; r < TS_PER; r++) // a block of -inf logits: (-inf, 0), not NaN
                if (k[r] && mx > -INFINITY) z += __expf(lkey_logit(k[r]) * s - mx * s);
            z = BRf(tr).Sum(z);
            if (tid == 0) out[blockIdx.x] = make_float2(mx * s, z);
            __syncthreads(); // tr is used again
        };
        if (p.n_logprobs >= 0) part(1.f, t.part);
        if (spart) part(sc, t.spart);
    }
    if (coop) { // the multi-block selection's span; its sums emptied
        float mn = INFINITY;
#pragma unroll
        for (int r = 0; r < TS_PER; r++)
            if (k[r] && lkey_logit(k[r]) > -INFINITY) mn = fminf(mn, lkey_logit(k[r]));
        mn = BRf(tr).Reduce(mn, [](float a, float b) { return fminf(a, b); });
        if (tid == 0) cg->bpart[blockIdx.x] = mn;
        if (blockIdx.x == 0) co_clear(cg);
        __syncthreads(); // tr is used again
    }
    // phase 0: this block's keys -> its candidates; phase 1 (the last block): the candidates of
    // all -> the first E exact. One call site, so the last block runs code its SM has just run.
    // Exact: phase 0 the first kc + 1; phase 1 all a top-k, greedy or floorless call reads (its
    // first kc), while top-p or min-p without a top-k may keep the whole TS_CHUNK. The filter's
    // groups in phase 1 are runs of 32 candidates (a block's first kc, then the next block's):
    // with kc above 32 a run's maximum can be a block's 33rd candidate, most candidates pass the
    // bound and the filter only adds its cost (top-k 64: 31.9 -> 33.3 us).
    const int m = nb * kc;
    int E = 0;
#pragma unroll 1
    for (int phase = 0;; phase++) {
        const int need = phase == 0                                                   ? kc + 1
                         : (topk || !sampling || ts_floorless(p) || coop) && kc <= 32 ? kc + 1
                                                                                      : TS_CHUNK;
        const int live = phase == 0 ? min(TS_WARPS, (n - b0 + TS_CHUNK - 1) / TS_CHUNK)
                                    : (m + TS_CHUNK - 1) / TS_CHUNK;
        E = min(ts_top(k, ss, need, live), m);
        if (phase == 1) break;
        TRACE_MARK(0);
        if (warp == 0)
#pragma unroll
            for (int r = 0; r < TS_PER; r++) {
                const int j = r * 32 + lane;
                if (j < kc) t.cand[(size_t)blockIdx.x * TS_KMAX + j] = k[r];
                if (j == kc) t.next[blockIdx.x] = b0 + kc < n ? ts_skey(k[r], sc) : 0u;
            }
        __threadfence();
        __syncthreads();
        if (tid == 0) {
            if (coop) s_gen = *(volatile unsigned *)&cg->gen; // before the ticket (co_join)
            __threadfence();
            last = atomicAdd(p.counter, 1u) == (unsigned)nb - 1;
        }
        __syncthreads();
        if (!last) break;
        __threadfence();
#pragma unroll
        for (int r = 0; r < TS_PER; r++) {
            const int j = warp * TS_CHUNK + r * 32 + lane;
            k[r] = j < m ? __ldcg(t.cand + (size_t)(j / kc) * TS_KMAX + j % kc) : 0ull;
        }
    }
    if (!last) { // done, or wait to select with the last block
        if (coop) {
            co_join(cg, s_gen);
            co_select(p, cg, su.co, nb, false, s_gen + 1, s_floor);
        }
        return;
    }
    TRACE_MARK(1);
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
            if (lane < nt)
                top_id[lane] = lkey_id(sm[lane]), top_lp[lane] = lkey_logit(sm[lane]) - lse;
        }
        int md = 0, tok = lkey_id(sm[0]);
        float ltok = lkey_logit(sm[0]);
        const float vmax = lkey_logit(sm[0]) * sc;
        // mass exp(v - vmax) of block b's ids (no top-k), of the sorted candidate j, of the kept id
        // j once sorted by id
        auto bmass = [&](int b) {
            const float2 sb = __ldcg(t.spart + b);
            return sb.y * __expf(sb.x - vmax);
        };
        auto cmass = [&](int j) { return __expf(lkey_logit(sm[j]) * sc - vmax); };
        auto imass = [&](int j) { return __expf(__uint_as_float((uint32_t)sm[j]) * sc - vmax); };
        if (ts_floorless(p)) {
            // no floor: the block where u of the mass falls, in id order
            float tot, acc;
            ts_scan(nb, INFINITY, bmass, &tot);
            const float target = u * tot;
            int blk = ts_scan(nb, target, bmass, &acc);
            if (blk < 0) blk = nb - 1; // short by rounding
            if (lane == 0) s_blk = blk, s_target = target - acc, s_vmax = vmax;
            md = 2;
        } else if (coop) { // top-p or min-p without a top-k: over every block
            md = 1;
        } else if (sampling) {
            uint32_t floor_key = 0;
            bool ok = true;
            int keep = E;
            // the kept set (a prefix: keys do not increase) is within the exact first E when a key
            // there is below the floor, or when they are all the candidates
            auto fits = [&](int kept) { return kept < E || E == m; };
            if (topk) { // the keys at or above the top_k-th's (kc may be larger, for logprobs)
                floor_key = ts_skey(sm[p.top_k - 1], sc);
                keep = ts_prefix(sm, E, sc, floor_key);
                ok = ts_complete(t.next, nb, floor_key) && fits(keep);
            }
            if (ok && p.top_p < 1.f) { // the smallest prefix of whole key groups reaching top_p
                float z, before;
                if (topk)
                    ts_scan(keep, INFINITY, cmass, &z);
                else
                    ts_scan(nb, INFINITY, bmass, &z);
                int j = ts_scan(keep, fmaxf(p.top_p, 0.f) * z, cmass, &before);
                if (j < 0) j = keep - 1, ok = topk; // short by rounding, or beyond the candidates
                // mass(keys >= key_j) reaches the target and mass(keys > key_j) does not
                const uint32_t tp = ts_skey(sm[j], sc);
                floor_key = tp > floor_key ? tp : floor_key;
            }
            if (p.min_p > 0.f) {
                const uint32_t tm = minp_key(vmax, p.min_p);
                floor_key = tm > floor_key ? tm : floor_key;
            }
            if (ok) {
                keep = ts_prefix(sm, keep, sc, floor_key); // >= 1: the first id's key is vmax's
                ok = fits(keep) && (topk || ts_complete(t.next, nb, floor_key));
            }
            if (ok) {
                // draw in id order: (id, logit bits) ascending, sorted descending as complements
                auto by_id = [&](int j) {
                    return j < keep
                               ? ~(((u64)lkey_id(sm[j]) << 32) | __float_as_uint(lkey_logit(sm[j])))
                               : 0ull;
                };
                if (keep <= 32) { // the usual top-k sets: one key per lane
                    u64 q[1] = {by_id(lane)};
                    ts_sort(q);
                    __syncwarp();
                    sm[lane] = ~q[0];
                } else {
#pragma unroll
                    for (int r = 0; r < TS_PER; r++) k[r] = by_id(r * 32 + lane);
                    ts_sort(k);
                    __syncwarp();
#pragma unroll
                    for (int r = 0; r < TS_PER; r++) sm[r * 32 + lane] = ~k[r];
                }
                __syncwarp();
                float total, before;
                ts_scan(keep, INFINITY, imass, &total);
                int j = ts_scan(keep, u * total, imass, &before);
                if (j < 0) j = keep - 1;
                tok = (int)(sm[j] >> 32), ltok = __uint_as_float((uint32_t)sm[j]);
            }
            md = ok ? 0 : 1;
        }
        if (lane == 0) mode = md, s_tok = tok, s_ltok = ltok, bval = lse, ntop = nt, s_floor = 0;
        if (lane == 0 && p.path) *p.path = md;
        if (coop) co_release(cg, nb, lkey_logit(sm[0]), sc, s_gen + 1);
    }
    __syncthreads();
    TRACE_MARK(2);
    if (coop && co_select(p, cg, su.co, nb, true, s_gen + 1, s_floor)) {
        if (warp == 0) { // the block where u of the kept mass falls, in id order
            const float *bm = cg->bpart + nb;
            auto bmass = [&](int b) { return __ldcg(bm + b); };
            float tot, acc;
            ts_scan(nb, INFINITY, bmass, &tot);
            int blk = ts_scan(nb, u * tot, bmass, &acc);
            float target = u * tot - acc;
            if (blk < 0) { // short by rounding: the last block with any (its last id with any)
                for (int b = lane; b < nb; b += 32)
                    if (bmass(b) > 0.f) blk = b;
                for (int o = 16; o; o >>= 1) blk = max(blk, __shfl_xor_sync(0xffffffffu, blk, o));
                target = INFINITY;
            }
            // no mass at all (top-p <= 0 keeps nothing): the greedy token, as the one-block sampler
            if (lane == 0) {
                mode = blk >= 0 ? 2 : 0, s_blk = blk, s_target = target, s_vmax = __ldcg(&cg->vmax);
                if (p.path) *p.path = 3;
            }
        }
        __syncthreads();
    }
    if (mode == 1) {
        sample_full(p, su.full);
        return;
    }
    if (mode == 2) { // a draw inside block s_blk (above s_floor): 4 consecutive ids per thread
        const int base = s_blk * TS_ELEMS + tid * TS_PER;
        float mass[TS_PER], local = 0.f;
        int mylast = -1;
#pragma unroll
        for (int r = 0; r < TS_PER; r++) {
            const float v = base + r < n ? pen_logit(p, base + r) * sc : -INFINITY;
            mass[r] = fkey(v) >= s_floor ? __expf(v - s_vmax) : 0.f;
            local += mass[r];
            if (mass[r] > 0.f) mylast = base + r;
        }
        if (tid == 0) s_lastid = -1, s_tok = -1;
        __syncthreads();
        if (mylast >= 0) atomicMax(&s_lastid, mylast);
        float excl;
        BSf(ts).ExclusiveSum(local, excl);
        // the thread whose [excl, next thread's excl) holds the target, so that exactly one
        // writes (its own excl + local may round past the next one's); the buffer is free now
        float *ex = reinterpret_cast<float *>(su.co.hist);
        ex[tid] = excl;
        __syncthreads();
        const float target = s_target;
        if (target >= excl && (tid + 1 == (int)blockDim.x || target < ex[tid + 1])) {
            float acc = excl;
            int pick = mylast; // if the rounding leaves the target past its ids' mass
#pragma unroll
            for (int r = 0; r < TS_PER; r++) {
                acc += mass[r];
                if (acc > target && mass[r] > 0.f) {
                    pick = base + r;
                    break;
                }
            }
            s_tok = pick;
        }
        __syncthreads();
        if (tid == 0 && s_tok < 0)
            s_tok = s_lastid; // or past the block's (or this thread has none)
        __syncthreads();
        if (tid == 0) s_ltok = pen_logit(p, s_tok);
    }
    if (tid == 0) emit(p, s_tok, p.n_logprobs >= 0 ? s_ltok - bval : 0.f, ntop, top_id, top_lp);
}

bool sample_cand_ok(const struct sample_params *p) {
    return ts_eligible(*p);
}

// Every block resident at once (the waiting ones hold their SMs): the launch is cooperative, so
// the driver refuses a grid the card cannot hold rather than let it hang, and this test keeps such
// cards (by their reported SM count) on the one-block sampler. A failed query: not asserted, the
// one-block sampler instead.
bool sample_coop_ok(const struct sample_params *p) {
    if (p->one_block || p->no_coop || !ts_coop_call(*p) || !ts_eligible(*p)) return false;
    int dev, sms, per, coop;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess || !coop ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, sample_topk_kernel<true>,
                                                      SAMPLE_THREADS, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return (long)per * sms >= ts_blocks(p->n_vocab);
}

int sample_cand_launch(const struct sample_params *p, cudaStream_t s, struct wren_err *e) {
    const bool coop = sample_coop_ok(p);
    CUDA_CHECK(launch_ex(coop ? sample_topk_kernel<true> : sample_topk_kernel<false>,
                         dim3(ts_blocks(p->n_vocab)), dim3(SAMPLE_THREADS), 0, s, decode_pdl(),
                         coop, *p));
    return 0;
}
