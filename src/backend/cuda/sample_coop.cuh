// The candidate kernel's multi-block selection (sample_cand.cu): where its candidates cannot hold
// the kept set (top-p or min-p without a top-k over thousands of ids: a flat distribution), every
// block of its grid, not one, finds the floor and the draw's block. Each block reads its own ids
// once more (TS_ELEMS, TS_PER consecutive ones per thread) and keeps them in registers through the
// selection, instead of one SM streaming the vocabulary several times (the one-block sampler:
// ~0.25 ms per token).
//
// The blocks wait at the ticket for the last one (the maximum and span) and meet at grid barriers,
// so all of them must be resident at once: the launcher allows it only where the card holds the
// whole grid, as a cooperative launch (sample_coop_ok). The ticket's last block is the last to
// arrive, so the others are already resident when it releases them.
//
// Top-p: the value bins of the one-block sampler (rs_vbins) with the masses in 2^-40 fixed point,
// summed per block in shared memory and over the grid by integer atomics (exact in any order, so
// every block picks the same bin and the draws are reproducible), then the chosen bin's ids
// listed in global memory and resolved in every block by the key-digit passes (rs_list_tau). Then
// each block's mass above the floor; the last block picks the block holding the draw and walks it.
#pragma once
#include "backend/cuda/sample_dev.cuh"

#define CO_LIST 1024            // the chosen value bin's ids (beyond: the one-block sampler)
#define CO_ONE  1099511627776.0 // 2^40: a mass of 1 in fixed point (248K ids sum below 2^58)

// Global scratch, after the candidate kernel's and the one-block sampler's in p.work. gen may
// hold anything at first; hist and nlist are zeroed by block 0 before its ticket.
struct co_glob {
    unsigned gen; // barrier generation
    float vmax;   // the largest scaled logit
    float span;   // vmax minus the smallest finite scaled logit
    unsigned nlist;
    u64 hist[RS_BINS];
    uint32_t list_k[CO_LIST];
    u64 list_m[CO_LIST];
    // [nb] the blocks' smallest finite logits, then [nb] their masses above the floor
    float bpart[1];
};
static __host__ __device__ __forceinline__ size_t co_bytes(int nb) {
    return sizeof(co_glob) + (size_t)(2 * nb) * sizeof(float);
}

struct co_smem {
    u64 hist[RS_BINS];
    uint32_t lk[CO_LIST];
    u64 lm[CO_LIST];
    typename BSu::TempStorage scan;
    typename BRf::TempStorage red;
    rs_pickbuf pb;
    rs_listbuf<u64> lb;
};
static_assert(CO_LIST <= SAMPLE_THREADS, "rs_list_tau: one listed key per thread");

// Block 0 before its ticket: the sums and the list of the multi-block selection emptied.
static __device__ void co_clear(co_glob *g) {
    for (int b = threadIdx.x; b < RS_BINS; b += blockDim.x) g->hist[b] = 0;
    if (threadIdx.x == 0) g->nlist = 0;
}

// A grid barrier for the nb blocks, on the ticket's counter (zero between uses) and the
// generation word g->gen, whose value every block tracks in gen (it changes only once every block
// arrived: no read before arriving).
static __device__ void co_sync(unsigned *cnt, co_glob *g, int nb, unsigned &gen) {
    __syncthreads(); // the block's writes are issued
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(cnt, 1u) == (unsigned)nb - 1) {
            *(volatile unsigned *)cnt = 0;
            __threadfence();
            *(volatile unsigned *)&g->gen = gen + 1;
        } else {
            while (*(volatile unsigned *)&g->gen == gen) __nanosleep(32);
        }
        __threadfence();
    }
    gen++;
    __syncthreads();
}

// The other blocks, after their ticket (gen0: the generation read before it, the last block
// releases them with gen0 + 1): wait for the last block's maximum and span.
static __device__ void co_join(co_glob *g, unsigned gen0) {
    if (threadIdx.x == 0) {
        while (*(volatile unsigned *)&g->gen == gen0) __nanosleep(32);
        __threadfence();
    }
    __syncthreads();
}

// Warp 0 of the last block: the scaled maximum mx * sc and the span for every block; gen: the
// generation it starts.
static __device__ void co_release(co_glob *g, int nb, float mx, float sc, unsigned gen) {
    const int lane = threadIdx.x & 31;
    float mn = INFINITY;
    for (int b = lane; b < nb; b += 32) mn = fminf(mn, __ldcg(g->bpart + b));
    for (int o = 16; o; o >>= 1) mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
    if (lane == 0) {
        g->vmax = mx * sc, g->span = (mx - mn) * sc;
        __threadfence();
        *(volatile unsigned *)&g->gen = gen;
    }
}

// Every block, its values v (scaled, penalised; -inf past the vocabulary): the floor key of the
// kept set (top-p's key where the mass from the top reaches top_p of all, min-p's), identical in
// every block. false: the chosen value bin holds more than CO_LIST ids (heavy ties).
template <int NV>
static __device__ bool co_floor(const struct sample_params &p, co_glob *g, co_smem &cs, int nb,
                                unsigned gen, const float (&v)[NV], float vmax, float span,
                                uint32_t &floor_key) {
    const int tid = threadIdx.x, nt = blockDim.x;
    floor_key = p.min_p > 0.f ? minp_key(vmax, p.min_p) : 0u;
    if (p.top_p <= 0.f) { // nothing kept: the greedy token
        floor_key = 0xFFFFFFFFu;
        return true;
    }
    if (p.top_p >= 1.f) return true;
    const rs_vbins vbin(vmax, span);
    auto mass = [&](float x) { return (u64)((double)__expf(x - vmax) * CO_ONE); };
    for (int b = tid; b < RS_BINS; b += nt) cs.hist[b] = 0;
    __syncthreads();
#pragma unroll
    for (int r = 0; r < NV; r++) {
        const u64 m = v[r] > -INFINITY ? mass(v[r]) : 0;
        if (m) atomicAdd(&cs.hist[vbin(v[r])], m);
    }
    __syncthreads();
    for (int b = tid; b < RS_BINS; b += nt)
        if (cs.hist[b]) atomicAdd(&g->hist[b], cs.hist[b]);
    co_sync(p.counter, g, nb, gen);
    for (int b = tid; b < RS_BINS; b += nt) cs.hist[b] = __ldcg(&g->hist[b]);
    u64 target;
    const int vb = rs_pick(
        cs.hist, RS_BINS, target,
        [&](u64 total) { return (u64)ceil((double)p.top_p * (double)total); }, false, cs.scan,
        cs.pb);
#pragma unroll
    for (int r = 0; r < NV; r++) {
        if (v[r] == -INFINITY || vbin(v[r]) != vb) continue;
        const unsigned slot = atomicAdd(&g->nlist, 1u);
        if (slot < CO_LIST) g->list_k[slot] = fkey(v[r]), g->list_m[slot] = mass(v[r]);
    }
    co_sync(p.counter, g, nb, gen);
    const unsigned nl = __ldcg(&g->nlist);
    if (nl > CO_LIST) return false;
    for (int j = tid; j < (int)nl; j += nt)
        cs.lk[j] = __ldcg(&g->list_k[j]), cs.lm[j] = __ldcg(&g->list_m[j]);
    __syncthreads();
    const uint32_t tau = rs_list_tau(cs.lk, cs.lm, (int)nl, target, cs.hist, cs.lb);
    floor_key = tau > floor_key ? tau : floor_key;
    return true;
}

// The other blocks leave once their mass is written; the last block waits for all of them.
static __device__ void co_gather(unsigned *cnt, int nb, bool last) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (!last) {
            atomicAdd(cnt, 1u);
        } else {
            while (*(volatile unsigned *)cnt != (unsigned)nb - 1) __nanosleep(32);
            *(volatile unsigned *)cnt = 0;
            __threadfence();
        }
    }
    __syncthreads();
}
