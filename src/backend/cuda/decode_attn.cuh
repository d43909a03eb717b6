// Pieces shared by the split-KV decode attention kernels (decode_attn.cu: bf16 cache;
// decode_attn_q8.cu: int8 cache).
#pragma once
#include "backend/cuda/decode.cuh"

#define ATT_TILE 64 // slices are whole multiples of this many tokens

// The split kernel over the int8 cache (decode_attn_q8.cu); may lower q->splits (a single wave).
int attn_split_q8_launch(struct attn_params *q, int sms, size_t smem_optin, cudaStream_t s,
                         struct wren_err *e);

// Context slice [start, end) of split sidx: the length (read on the device) is cut into p.splits
// slices rounded up to ATT_TILE tokens. An empty slice writes the neutral partial (m = -inf, l = 0)
// for its G heads and returns false.
static __device__ __forceinline__ int attn_chunk(int L, int splits) {
    const int chunk = (L + splits - 1) / splits;
    return (chunk + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
}
static __device__ __forceinline__ bool attn_slice(const struct attn_params &p, int sidx, int G,
                                                  float *part, int &start, int &end) {
    const int L = *p.pos + 1, chunk = attn_chunk(L, p.splits);
    start = sidx * chunk, end = min(L, start + chunk);
    if (start < end) return true;
    if ((int)threadIdx.x < G)
        part[(size_t)threadIdx.x * (p.hd + 2) + p.hd] = -INFINITY,
                                                part[(size_t)threadIdx.x * (p.hd + 2) + p.hd + 1] =
                                                    0.f;
    return false;
}

// The tensor-core kernels: 16-row tiles (the G query heads of a KV head, rows past G zero) over a
// head_dim of 256; each warp of a block streams its own tiles of AM_KT keys.
#define AM_HD 256
#define AM_KT 16 // keys per warp tile
#define AM_NW 4  // warps per block

static __device__ __forceinline__ int amswz(int r, int c) { // chunk c (8 bf16) of row r
    return r * AM_HD + ((c ^ (r & 7)) << 3);
}

// The end of a tensor-core split block: the warps' (output o [16][AM_HD], running max m and
// denominator l per row, m in base 2), left in shared memory, merged into the slice's partial
// (acc, m in base e, l) for the G heads. col(row, d): where dim d of a row sits in wo's row.
struct am_cols {
    __device__ int operator()(int, int d) const { return d; }
};
template <class Col = am_cols>
static __device__ __forceinline__ void am_merge(const float *wo, const float *wm, const float *wl,
                                                int G, float *part, Col col = Col()) {
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
