// Pieces shared by the split-KV decode attention kernels (decode_attn.cu: bf16 cache;
// decode_attn_q8.cu: int8 cache).
#pragma once
#include "backend/cuda/decode.cuh"
#include "backend/cuda/mma.cuh"

#define ATT_TILE 64 // the FMA split kernel's tile of keys

// The tensor-core kernels (decode_attn.cu: bf16 cache; decode_attn_q8.cu: int8) over a head_dim
// of 256: S^T = K Q^T and O^T = V^T P^T with the keys (the dims) as the 16 rows of an m16n8k16 tile
// and the 8 query heads of a head tile as its columns (heads past G zero); each warp of a block
// streams its own tiles of AM_KT keys. Every kernel's slices are whole warp tiles.
#define AM_HD 256
#define AM_KT 16 // keys per warp tile
#define AM_NW 4  // warps per block

// The split kernel over the int8 cache (decode_attn_q8.cu); may lower q->splits (a single wave).
int attn_split_q8_launch(struct attn_params *q, int sms, size_t smem_optin, cudaStream_t s,
                         struct wren_err *e);

// The context length of this step, read on the device so one captured graph serves every
// position. The position is written before the step's first kernel starts (decode_set_pos_tok, or
// the previous step's sampler) and not during it, so the kernels read it before their
// programmatic-launch wait: a round trip less after it.
static __device__ __forceinline__ int attn_len(const struct attn_params &p) {
    return *p.pos + 1;
}

// Context slice [start, end) of split sidx. The length's warp tiles (units of AM_KT tokens) are
// dealt out as evenly as possible over the active slices (the first ones one unit more, the slices
// past them empty): all splits, or as many as give each a tile for each of a block's AM_NW warps.
// Slices of ceil(L / splits) rounded up to 64 tokens left SMs idle at long contexts (at 128K only
// 64 of 66 slices held keys; int8 cache at 32K: 631 -> 641 tok/s). Slices of one unit were 0.8%
// slower at 1K, of at least 8 or 16 units 0.5% and 2.3% slower at 4K.
static __device__ __forceinline__ int attn_units(int L) {
    return (L + AM_KT - 1) / AM_KT;
}
static __device__ __forceinline__ int attn_active(const struct attn_params &p, int units) {
    return min(p.splits, (units + AM_NW - 1) / AM_NW);
}
static __device__ __forceinline__ void attn_range(const struct attn_params &p, int L, int sidx,
                                                  int &start, int &end) {
    const int units = attn_units(L), act = attn_active(p, units);
    const int base = units / act, rem = units % act;
    start = sidx < act ? (sidx * base + min(sidx, rem)) * AM_KT : L;
    end = sidx < act ? min(L, start + (base + (sidx < rem)) * AM_KT) : L;
}
// An empty slice's neutral partial (m = -inf, l = 0) for its G heads. The partials' workspace is
// what the previous attention layer's combine read: written only after the programmatic wait.
static __device__ __forceinline__ void attn_empty(const struct attn_params &p, int G, float *part) {
    if ((int)threadIdx.x < G) {
        float *pt = part + (size_t)threadIdx.x * (p.hd + 2) + p.hd;
        pt[0] = -INFINITY, pt[1] = 0.f;
    }
}
// attn_range, then attn_empty where the slice is empty (returns false).
static __device__ __forceinline__ bool attn_slice(const struct attn_params &p, int L, int sidx,
                                                  int G, float *part, int &start, int &end) {
    attn_range(p, L, sidx, start, end);
    if (start < end) return true;
    attn_empty(p, G, part);
    return false;
}

// Whether a slice's tile of AM_KT keys from k0 holds only rows that earlier steps wrote: all but
// the row at L - 1, which this step's prep kernel appends. Such tiles may be copied before the
// programmatic-launch wait, so that their DRAM round trip overlaps the prep.
static __device__ __forceinline__ bool attn_tile_old(int k0, int end, int L) {
    return min(k0 + AM_KT, end) < L;
}

// A warp's first NS - 1 ring stages (tiles warp + i AM_NW of its slice, one commit group each):
// am_ring_early requests before the programmatic wait those that attn_tile_old allows, and
// am_ring_rest the others after it. load(i, j) copies tile j into stage i. (Both stages' tiles
// before the wait, bf16: no faster at 4K, 0.4% slower at 128K.)
template <int NS> struct am_ring_first { bool early[NS > 1 ? NS - 1 : 1]; };
template <int NS, class Load>
static __device__ __forceinline__ void am_ring_early(am_ring_first<NS> &f, int warp, int ntiles,
                                                     int start, int end, int L, Load load) {
#pragma unroll
    for (int i = 0; i < NS - 1; i++) {
        const int j = warp + i * AM_NW;
        f.early[i] = j < ntiles && attn_tile_old(start + j * AM_KT, end, L);
        if (f.early[i]) load(i, j);
    }
}
template <int NS, class Load>
static __device__ __forceinline__ void am_ring_rest(const am_ring_first<NS> &f, int warp,
                                                    int ntiles, Load load) {
#pragma unroll
    for (int i = 0; i < NS - 1; i++) {
        const int j = warp + i * AM_NW;
        if (j < ntiles && !f.early[i]) load(i, j);
        cp_async_commit();
    }
}

// The warp's tiles in turn over its NS stages of SB bytes from ring, unrolled so that each stage's
// offsets are constants: step(stage, the stage it refills next, tile).
template <int NS, size_t SB, class Step>
static __device__ __forceinline__ void am_ring_run(unsigned char *ring, int warp, int ntiles,
                                                   Step step) {
    for (int j0 = warp; j0 < ntiles; j0 += NS * AM_NW) {
#pragma unroll
        for (int i = 0; i < NS; i++) {
            if (j0 + i * AM_NW >= ntiles) break;
            step(ring + i * SB, ring + (i + NS - 1) % NS * SB, j0 + i * AM_NW);
        }
    }
}

static __device__ __forceinline__ int amswz(int r, int c) { // chunk c (8 bf16) of row r
    return r * AM_HD + ((c ^ (r & 7)) << 3);
}

// A head column's sum over its 8 lanes (lane bits 2-4: the rows g8 of the tile).
static __device__ __forceinline__ float am_colsum(float x) {
    x += __shfl_xor_sync(~0u, x, 4);
    x += __shfl_xor_sync(~0u, x, 8);
    return x + __shfl_xor_sync(~0u, x, 16);
}

// The online softmax (base 2) of one tile's scores: s[hn][c] is key g8 (c < 2) or g8 + 8 (c >= 2)
// and head 2c4 + (c & 1) of head tile hn, unscaled; v0, v1: whether those keys lie in the slice;
// m, l: the thread's columns' running max and its keys' denominator. Leaves the probabilities in s
// and the factor for the running output in alpha; returns whether any factor is not 1.
template <int HN>
static __device__ __forceinline__ bool am_softmax(float (&s)[HN][4], float (&m)[HN][2],
                                                  float (&l)[HN][2], float (&alpha)[HN][2], bool v0,
                                                  bool v1, float sl2) {
    bool moved = false;
#pragma unroll
    for (int hn = 0; hn < HN; hn++) {
        float mx[2] = {m[hn][0], m[hn][1]};
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const float x = (c < 2 ? v0 : v1) ? s[hn][c] * sl2 : -INFINITY;
            s[hn][c] = x;
            mx[c & 1] = fmaxf(mx[c & 1], x);
        }
#pragma unroll
        for (int e = 0; e < 2; e++) {
            mx[e] = fmaxf(mx[e], __shfl_xor_sync(~0u, mx[e], 4));
            mx[e] = fmaxf(mx[e], __shfl_xor_sync(~0u, mx[e], 8));
            mx[e] = fmaxf(mx[e], __shfl_xor_sync(~0u, mx[e], 16));
            alpha[hn][e] = exp2f(m[hn][e] - mx[e]); // first tile: exp2(-inf) = 0
            m[hn][e] = mx[e];
            moved |= alpha[hn][e] != 1.f;
        }
#pragma unroll
        for (int c = 0; c < 4; c++) s[hn][c] = exp2f(s[hn][c] - m[hn][c & 1]);
#pragma unroll
        for (int e = 0; e < 2; e++) l[hn][e] = l[hn][e] * alpha[hn][e] + (s[hn][e] + s[hn][e + 2]);
    }
    return moved;
}

// The end of a tensor-core split block: the warps' (output o [16][AM_HD], running max m and
// denominator l per head, m in base 2), left in shared memory, merged into the slice's partial
// (acc, m in base e, l) for the G heads. col(row, d): where dim d of a head's row sits in wo's row.
template <class Col>
static __device__ __forceinline__ void am_merge(const float *wo, const float *wm, const float *wl,
                                                int G, float *part, Col col) {
    const float ln2 = 0.6931471805599453f;
    for (int i = threadIdx.x; i < G * AM_HD; i += AM_NW * 32) {
        const int row = i / AM_HD, d = i % AM_HD;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < AM_NW; w++) M = fmaxf(M, wm[w * 16 + row]);
        float acc = 0.f, den = 0.f;
#pragma unroll
        for (int w = 0; w < AM_NW; w++) {
            const float sc = wl[w * 16 + row] > 0.f ? exp2f(wm[w * 16 + row] - M) : 0.f;
            acc += sc * wo[((size_t)w * 16 + row) * AM_HD + col(row, d)];
            den += sc * wl[w * 16 + row];
        }
        float *pt = part + (size_t)row * (AM_HD + 2);
        pt[d] = acc;
        if (d == 0) pt[AM_HD] = M * ln2, pt[AM_HD + 1] = den; // the combine works in base e
    }
}
