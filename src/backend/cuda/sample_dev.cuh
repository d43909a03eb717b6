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
// min-p's floor: the key of the largest scaled value vmax plus log(min_p), as every sampler keeps
// it.
static __device__ __forceinline__ uint32_t minp_key(float vmax, float min_p) {
    return fkey(vmax + logf(min_p));
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
static __device__ __forceinline__ float pen_adjust(const struct sample_params &p, int i, float l) {
    if (p.repetition != 1.f && p.seen[i]) l = l > 0.f ? l / p.repetition : l * p.repetition;
    if (p.frequency != 0.f || p.presence != 0.f) {
        const int c = p.counts[i];
        if (c) l -= p.frequency * (float)c + p.presence;
    }
    return l;
}
static __device__ __forceinline__ float pen_logit(const struct sample_params &p, int i) {
    return pen_adjust(p, i, p.logits[i]);
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

// Calls f(i, a[i]) for this thread's ids i = tid, tid + blockDim.x, ... below n, in order, with the
// loads of RUN_BATCH of them in flight at once (one block over a 248K vocabulary: otherwise a
// chain of 243 dependent round trips to the L2 per thread and pass).
#define RUN_BATCH 8
template <typename F>
static __device__ __forceinline__ void for_my_ids(const float *a, int n, F f) {
    const int nt = blockDim.x;
    for (int i0 = threadIdx.x; i0 < n; i0 += RUN_BATCH * nt) {
        float w[RUN_BATCH];
#pragma unroll
        for (int j = 0; j < RUN_BATCH; j++) w[j] = i0 + j * nt < n ? a[i0 + j * nt] : 0.f;
#pragma unroll
        for (int j = 0; j < RUN_BATCH; j++)
            if (i0 + j * nt < n) f(i0 + j * nt, w[j]);
    }
}

// Radix selection: the values are first binned by their distance below the largest, the bins
// spread over the values' span (beyond 32 nats, 1/64 of a nat per bin) so that the 248K
// histogram updates land on many addresses (by the key's top bits, they land on a few dozen; the
// block's updates to them took ~0.12 ms per pass), then the chosen bin's keys: listed in shared
// memory and resolved by rs_list_tau, or (more than RS_LIST of them) in three passes of 11, 11 and
// 10 bits over the vocabulary.
#define RS_BINS    2048
#define RS_PER_NAT 64.f
#define RS_LIST    1024 // the chosen bin's keys kept in shared memory (248K ids: ~120 per bin)
static_assert(2 * SAMPLE_THREADS >= RS_BINS, "rs_pick: two bins per thread");
static_assert(RS_LIST <= SAMPLE_THREADS, "rs_list_tau: one listed key per thread");

typedef unsigned long long u64;
typedef cub::BlockScan<u64, SAMPLE_THREADS> BSu;

// The value bin of v: monotone in v (a higher bin's keys all exceed a lower one's), the same in
// the one-block and the multi-block selections.
struct rs_vbins {
    float vmax, per;
    __device__ rs_vbins(float vmax_, float span)
        : vmax(vmax_),
          per(span > 0.f && span < RS_BINS / RS_PER_NAT ? RS_BINS / span : RS_PER_NAT) {}
    __device__ int operator()(float v) const {
        return (int)fmaxf(fminf((vmax - v) * per, RS_BINS - 1.f), 0.f);
    }
};

struct rs_pickbuf {
    int pick, last;
};

// The first non-empty of the nb bins in hist (largest values first) whose cumulative count or
// mass reaches the target (with strict: exceeds it), else the last with any (so that a bin's sum
// taken again in another order, a rounding short of the target, still ends in its smallest key);
// the target, first taken as tgt(the bins' total), becomes what is left of it inside that bin.
// The cumulative sums are written back and both the bin and its predecessor's sum read from them,
// so every thread agrees on both. *reached: whether a bin reached it. T: float, or u64 (fixed-
// point masses, exact in any order).
template <class T, class Tgt>
static __device__ int rs_pick(T *hist, int nb, T &target, Tgt tgt, bool strict,
                              typename cub::BlockScan<T, SAMPLE_THREADS>::TempStorage &scan,
                              rs_pickbuf &pb, bool *reached = nullptr) {
    const int tid = threadIdx.x;
    if (tid == 0) pb.pick = INT_MAX, pb.last = -1;
    __syncthreads(); // hist complete, the previous pick read
    const bool has0 = 2 * tid < nb, has1 = 2 * tid + 1 < nb;
    const T a = has0 ? hist[2 * tid] : T(0), b = has1 ? hist[2 * tid + 1] : T(0);
    T excl, total;
    cub::BlockScan<T, SAMPLE_THREADS>(scan).ExclusiveSum(a + b, excl, total);
    target = tgt(total);
    // only bins with something in them: one thread's c2 and the next one's excl are the same sum
    // rounded in two orders (f32), so an empty bin after them could otherwise reach the target
    const T c1 = excl + a, c2 = c1 + b;
    if (has0) hist[2 * tid] = c1;
    if (has1) hist[2 * tid + 1] = c2;
    if (a > T(0) && (strict ? c1 > target : c1 >= target))
        atomicMin(&pb.pick, 2 * tid);
    else if (b > T(0) && (strict ? c2 > target : c2 >= target))
        atomicMin(&pb.pick, 2 * tid + 1);
    if (a > T(0) || b > T(0)) atomicMax(&pb.last, b > T(0) ? 2 * tid + 1 : 2 * tid);
    __syncthreads();
    const int r = pb.pick != INT_MAX ? pb.pick : pb.last >= 0 ? pb.last : nb - 1;
    if (reached) *reached = pb.pick != INT_MAX;
    target -= r ? hist[r - 1] : T(0);
    __syncthreads();
    return r;
}

// Key digit d of the passes after the value bin: 11, 11 and 10 bits from the top.
static __device__ __forceinline__ int rs_shift(int d) {
    return d == 0 ? 21 : d == 1 ? 10 : 0;
}
static __device__ __forceinline__ uint32_t rs_dmask(int d) {
    return d == 2 ? 1023u : 2047u;
}

// hist[bin] += m for the lanes of a warp that add (all lanes call it), the lanes of one bin summed
// first: one atomic per bin and warp. A value bin's keys share their top digits, so their adds
// would queue on a few addresses (and u64 ones on shared memory are compare-and-swap loops: the
// multi-block selection's first digit pass took ~14 us).
template <class T> static __device__ void warp_hist_add(T *hist, int bin, T m, bool add) {
    const unsigned adds = __ballot_sync(0xffffffffu, add);
    const unsigned grp = __match_any_sync(0xffffffffu, add ? bin : -1);
    T sum = T(0);
    for (int l = 0; l < 32; l++) {
        const T x = __shfl_sync(0xffffffffu, m, l);
        if ((grp & adds) >> l & 1) sum += x;
    }
    if (add && (threadIdx.x & 31) == __ffs(grp) - 1) atomicAdd(&hist[bin], sum);
}

// The scalars of rs_list_tau.
template <class T> struct rs_listbuf {
    uint32_t klo, khi; // the listed keys' range
    int pick;          // the chosen digit's bin
    T before;          // the sum before it
};

// The key tau among the nl listed keys lk (counts or masses lm, one per thread: nl <= blockDim.x)
// where the running sum from the largest key reaches the target: (sum of keys > tau) < target <=
// (sum of keys >= tau). The keys of one value bin agree above their highest differing bit, so the
// 8-bit digit passes (hist: 256) start there; the block adds (per warp first: ties would queue on
// one address), warp 0 picks the digit as rs_pick does. (11-bit passes over all 32 bits with block
// scans: ~3 us each; a warp alone: ~15 us over a full list; thirty-fifth session.)
template <class T>
static __device__ uint32_t rs_list_tau(const uint32_t *lk, const T *lm, int nl, T target, T *hist,
                                       rs_listbuf<T> &lb) {
    const int tid = threadIdx.x, lane = tid & 31;
    const bool in = tid < nl;
    const uint32_t k = in ? lk[tid] : 0u;
    const T m = in ? lm[tid] : T(0);
    if (tid == 0) lb.klo = 0xFFFFFFFFu, lb.khi = 0;
    __syncthreads();
    uint32_t lo = in ? k : 0xFFFFFFFFu, hi = k;
    for (int o = 16; o; o >>= 1) {
        lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    }
    if (lane == 0) atomicMin(&lb.klo, lo), atomicMax(&lb.khi, hi);
    __syncthreads();
    lo = lb.klo, hi = lb.khi;
    if (lo >= hi) return hi; // one key (or none)
    const int top = 31 - __clz(lo ^ hi);
    uint32_t mask = ~((2u << top) - 1u), prefix = hi & mask; // the bits above top: common
    for (int h = top; h >= 0; h -= 8) {
        const int shift = max(h - 7, 0);
        const uint32_t dm = (2u << (h - shift)) - 1u;
        if (tid < 256) hist[tid] = T(0);
        __syncthreads();
        // bin dm - digit: the largest digit first
        warp_hist_add(hist, (int)(dm - ((k >> shift) & dm)), m, in && (k & mask) == prefix);
        __syncthreads();
        if (tid < 32) { // the first non-empty bin whose running sum reaches the target, else the
                        // last non-empty; 8 bins per lane
            T c[8], sum = T(0);
#pragma unroll
            for (int i = 0; i < 8; i++) sum += (c[i] = hist[8 * lane + i]);
            T acc = sum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const T y = __shfl_up_sync(0xffffffffu, acc, o);
                if (lane >= o) acc += y;
            }
            acc -= sum;
            int pick = -1, last = -1;
            T before = T(0), lbefore = T(0);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                if (c[i] > T(0)) {
                    if (pick < 0 && acc + c[i] >= target) pick = 8 * lane + i, before = acc;
                    last = 8 * lane + i, lbefore = acc;
                }
                acc += c[i];
            }
            const unsigned hits = __ballot_sync(0xffffffffu, pick >= 0),
                           any = __ballot_sync(0xffffffffu, last >= 0);
            const int src = hits ? __ffs(hits) - 1 : any ? 31 - __clz(any) : 0;
            const int b = __shfl_sync(0xffffffffu, hits ? pick : last, src);
            const T bf = __shfl_sync(0xffffffffu, hits ? before : lbefore, src);
            if (lane == 0) lb.pick = any ? b : -1, lb.before = bf;
        }
        __syncthreads();
        if (lb.pick < 0) return hi; // nothing to count at all
        target -= lb.before;
        prefix |= (dm - (uint32_t)lb.pick) << shift;
        mask |= dm << shift;
        __syncthreads(); // every thread has read the pick
    }
    return prefix;
}

struct samp_smem {
    union {
        typename BRf::TempStorage r;
        typename BSf::TempStorage s;
    } cub;
    float hist[RS_BINS]; // count or mass per bin, largest values first (counts are exact in f32)
    float bf, lo;
    uint32_t bu;
    rs_pickbuf pb;            // rs_pick's choice
    rs_listbuf<float> lb;     // rs_list_tau's
    int nlist;                // keys of radix_select's chosen value bin (beyond RS_LIST: not kept)
    uint32_t list_k[RS_LIST]; // and their counts or masses
    float list_m[RS_LIST];
    int chosen;
    int ncand;
    int cand_id[64];
    float cand_v[64];
};

// Radix selection over the values v(i) = scale * work[i] of ids with key >= floor_key: returns the
// key tau with (count or mass of keys > tau) < target <= (count or mass of keys >= tau), where the
// target is `want` for a count and want x (the mass of every key >= floor_key) for a mass. Mass
// of id i is exp(v(i) - vmax); span: the largest value minus the smallest finite one. After the
// value bins, the chosen bin's keys are listed in shared memory, so that, where they fit, the key
// is resolved from them (rs_list_tau); only heavy ties (over RS_LIST ids in one bin) take the key
// digit passes over the whole vocabulary. A thread adds a run of ids falling in one bin before it
// touches the histogram.
template <bool MASS>
static __device__ uint32_t radix_select(const float *work, int n, float scale, float vmax,
                                        float span, uint32_t floor_key, float want, samp_smem &sm) {
    const rs_vbins vbin(vmax, span);
    // f(v, k, count or mass) for each of this thread's ids whose key is at or above the floor
    auto kept = [&](auto f) {
        for_my_ids(work, n, [&](int, float w) {
            const float v = w * scale;
            const uint32_t k = fkey(v);
            if (k >= floor_key) f(v, k, MASS ? __expf(v - vmax) : 1.f);
        });
    };
    float target = want;
    int vb = 0;
    uint32_t prefix = 0, mask = 0;
    for (int pass = 0; pass < 4; pass++) {
        const int shift = pass ? rs_shift(pass - 1) : 0;
        const uint32_t dmask = pass ? rs_dmask(pass - 1) : 0u;
        const int nb = pass == 0 ? RS_BINS : (int)dmask + 1;
        for (int b = threadIdx.x; b < RS_BINS; b += blockDim.x) sm.hist[b] = 0.f;
        __syncthreads();
        int run = -1;
        float acc = 0.f;
        auto add = [&](int bin, float m) {
            if (bin != run) {
                if (run >= 0) atomicAdd(&sm.hist[run], acc);
                run = bin, acc = 0.f;
            }
            acc += m;
        };
        kept([&](float v, uint32_t k, float m) {
            const int bin = vbin(v);
            if (pass > 0 && (bin != vb || (k & mask) != prefix)) return;
            add(pass == 0 ? bin : nb - 1 - (int)((k >> shift) & dmask), m);
        });
        if (run >= 0) atomicAdd(&sm.hist[run], acc);
        const bool of_total = MASS && pass == 0;
        const int r = rs_pick(
            sm.hist, nb, target, [&](float tot) { return of_total ? target * tot : target; }, false,
            sm.cub.s, sm.pb);
        if (pass > 0) {
            prefix |= (uint32_t)(nb - 1 - r) << shift;
            mask |= dmask << shift;
            continue;
        }
        vb = r;
        if (threadIdx.x == 0) sm.nlist = 0;
        __syncthreads();
        kept([&](float v, uint32_t k, float m) {
            if (vbin(v) != vb) return;
            const int slot = atomicAdd(&sm.nlist, 1);
            if (slot < RS_LIST) sm.list_k[slot] = k, sm.list_m[slot] = m;
        });
        __syncthreads();
        if (sm.nlist <= RS_LIST)
            return rs_list_tau(sm.list_k, sm.list_m, sm.nlist, target, sm.hist, sm.lb);
    }
    return prefix;
}

// The whole sampler in one block of SAMPLE_THREADS threads (sm: the caller's, which the candidate
// kernel shares with its other phases).
static __device__ void sample_full(const struct sample_params &p, samp_smem &sm) {
    const int n = p.n_vocab, tid = threadIdx.x;
    // penalties (HF repetition over prompt + generated; OpenAI presence/frequency over generated)
    float mx = -INFINITY, mn = INFINITY;
    int mi = 0x7fffffff;
    for_my_ids(p.logits, n, [&](int i, float w) {
        const float l = pen_adjust(p, i, w);
        p.work[i] = l;
        if (l > mx) mx = l, mi = i;
        if (l > -INFINITY) mn = fminf(mn, l);
    });
    // block argmax of the penalised logits (ties: lower id)
    {
        unsigned long long k = mi == 0x7fffffff ? 0ull : lkey(mx, mi);
        typedef cub::BlockReduce<unsigned long long, SAMPLE_THREADS> BRu;
        __shared__ typename BRu::TempStorage tr;
        unsigned long long best = BRu(tr).Reduce(
            k, [](unsigned long long a, unsigned long long b) { return a > b ? a : b; });
        // every logit -inf or NaN: id 0 (lkey_id(0) would be -1)
        if (tid == 0) sm.bu = best ? (uint32_t)lkey_id(best) : 0u, sm.bf = lkey_logit(best);
        __syncthreads();
        mi = (int)sm.bu;
        mx = sm.bf;
        mn = BRf(sm.cub.r).Reduce(mn, [](float a, float b) { return fminf(a, b); });
        if (tid == 0) sm.lo = mn;
        __syncthreads();
        mn = sm.lo;
        __syncthreads();
    }
    int tok = mi;
    if (p.temperature > 0.f) {
        const float sc = 1.f / p.temperature, vmax = mx * sc, span = (mx - mn) * sc;
        uint32_t floor_key = 0;
        if (p.top_k > 0 && p.top_k < n)
            floor_key = radix_select<false>(p.work, n, sc, vmax, span, 0, (float)p.top_k, sm);
        if (p.top_p <= 0.f) { // nothing kept: the greedy token
            floor_key = 0xFFFFFFFFu;
        } else if (p.top_p < 1.f) {
            uint32_t t = radix_select<true>(p.work, n, sc, vmax, span, floor_key, p.top_p, sm);
            floor_key = t > floor_key ? t : floor_key;
        }
        if (p.min_p > 0.f) {
            uint32_t t = minp_key(vmax, p.min_p);
            floor_key = t > floor_key ? t : floor_key;
        }
        // draw: the first id in id order whose cumulative mass exceeds u x the total. The masses
        // of tiles of consecutive ids (a warp per tile, coalesced), a scan over the tiles, then
        // one warp walks the tile that holds the target (it was per-thread segments of 243 ids,
        // one dependent load after another)
        const int lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
        const int tile = 256 * ((n + 256 * RS_BINS - 1) / (256 * RS_BINS)),
                  ntiles = (n + tile - 1) / tile;
        // a lane's 8 ids of a batch of 256 (i0 + 32 j + lane) and their masses (0: below the floor)
        auto batch = [&](int i0, float(&c)[8]) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int i = i0 + 32 * j + lane;
                c[j] = i < n ? p.work[i] * sc : -INFINITY;
            }
#pragma unroll
            for (int j = 0; j < 8; j++) c[j] = fkey(c[j]) >= floor_key ? __expf(c[j] - vmax) : 0.f;
        };
        for (int t = warp; t < ntiles; t += nw) {
            float m = 0.f;
            for (int i0 = t * tile; i0 < min(n, (t + 1) * tile); i0 += 256) {
                float c[8];
                batch(i0, c);
#pragma unroll
                for (int j = 0; j < 8; j++) m += c[j];
            }
#pragma unroll
            for (int o = 16; o; o >>= 1) m += __shfl_xor_sync(0xffffffffu, m, o);
            if (lane == 0) sm.hist[t] = m;
        }
        const uint64_t r = splitmix64(p.seed ^ splitmix64((uint64_t)(*p.step) + 1));
        const float u = (float)(r >> 40) * (1.f / 16777216.f);
        // the first tile whose cumulative mass exceeds u x the total, else the last with any
        float tg;
        bool reached;
        const int t = rs_pick(
            sm.hist, ntiles, tg, [&](float total) { return u * total; }, true, sm.cub.s, sm.pb,
            &reached);
        if (tid == 0) sm.chosen = -1;
        __syncthreads();
        if (warp == 0 && sm.pb.last >= 0) { // else no id has any mass
            // past the end of the tile's mass (rounding): its last id with any (ids whose mass
            // underflows to 0 are never drawn)
            if (!reached) tg = INFINITY;
            float acc = 0.f;
            int pick = -1, last = -1;
            for (int i0 = t * tile; i0 < min(n, (t + 1) * tile) && pick < 0; i0 += 256) {
                float c[8];
                batch(i0, c);
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const bool in = c[j] > 0.f;
                    float x = c[j];
#pragma unroll
                    for (int o = 1; o < 32; o <<= 1) {
                        const float y = __shfl_up_sync(0xffffffffu, x, o);
                        if (lane >= o) x += y;
                    }
                    const unsigned hit = __ballot_sync(0xffffffffu, in && acc + x > tg);
                    const unsigned any = __ballot_sync(0xffffffffu, in);
                    if (pick < 0) {
                        if (hit)
                            pick = i0 + 32 * j + __ffs(hit) - 1;
                        else if (any)
                            last = i0 + 32 * j + 31 - __clz(any);
                    }
                    acc += __shfl_sync(0xffffffffu, x, 31);
                }
            }
            if (lane == 0) sm.chosen = pick >= 0 ? pick : last;
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
        for_my_ids(p.work, n, [&](int, float w) { z += __expf(w - mx); });
        z = BRf(sm.cub.r).Sum(z);
        if (tid == 0) sm.bf = z;
        __syncthreads();
        const float lse = mx + logf(sm.bf);
        lp = p.work[tok] - lse;
        ntop = min(p.n_logprobs, min(WREN_MAX_TOP_LOGPROBS, n));
        if (ntop > 0) {
            uint32_t t = radix_select<false>(p.work, n, 1.f, mx, mx - mn, 0, (float)ntop, sm);
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
