// Split-KV decode attention over the int8 KV cache (kv_int8.cuh): head_dim 256, up to 16 query
// heads per KV head. Each warp streams its own tiles of 16 keys through f16 mma's with the keys
// (and for P V the dims) as the 16 rows and the query heads as the 8 columns, so a KV head's 8
// heads fill the tile and a thread's output is 256 x 8 / 32 = 64 floats. The codes need no
// conversion instruction: a code byte u placed under the f16 exponent of 8 (one byte permute:
// 0x48uu) is x = 8 + u / 128 = 9 + q / 128, exactly.
//   S^T = K Q^T: one accumulator per 64-dim group g sums x . q; minus 9 times the group's sum of q
//   (per head, computed once) it is q_codes . q / 128, which the key's group scale (times 128)
//   turns into the score: the K bytes go into the mma as they are. Q^T is read from shared
//   memory per tile (8 LDS.128; held in 32 more registers it was measured only in a version
//   capped for three blocks per SM, where it spilled).
//   O^T = V^T P^T: the 16 dims of a row tile lie in one group, so the value scales go into P (per
//   key and group: p * scale * 128 rounded once to f16) and the V bytes go in as x, too: 9 times
//   the sum of the f16 P of the group comes off at the end. P comes out of the scores as S^T and
//   is transposed to the B operand with movmatrix.
// Q is one f16 part (11 mantissa bits; the values carry 8). Per 16-key tile a warp issues 32
// mma's and about 600 instructions; two blocks of 4 warps per SM (194 registers). At 128K context
// the kernel streams the cache at ~70% of HBM peak, stalled mostly on its loads (NOTES.md, "int8
// KV cache").
#include <cuda_fp16.h>

#include "backend/cuda/decode_attn.cuh"

// K/V stages per warp: one tile in flight while one is computed. Three (fits two blocks per SM on
// Hopper) ran the kernel no faster and the decode step 1-2% slower.
#define AQ_NS 2
// One stage: K codes [16][256], V codes [16][256], then the 16 keys' 16-byte scale chunks (K, V).
#define AQ_STAGE (2 * AM_KT * AM_HD + 2 * AM_KT * 16)

// The swizzles of the code tiles: chunk c (16 bytes) of key row r sits at chunk c ^ f(r), so that
// the reads below are conflict-free. K: each quarter warp reads four consecutive chunks of rows
// r, r + 1; V: each half warp reads 2 x 8 bytes of rows 2c4 (c4 < 4) at one group's first or
// second 32 bytes. Both XOR bits 1-2 only, so that a row's chunks 4 i + x move by XOR-ing i << 6.
static __device__ __forceinline__ int aq_kf(int r) {
    return (((r >> 1) & 3) << 1) ^ ((r & 1) << 2);
}
static __device__ __forceinline__ int aq_vf(int r) {
    return ((r >> 1) & 3) << 1;
}
static __device__ __forceinline__ uint32_t aq_bits(__half2 h) {
    return *reinterpret_cast<uint32_t *>(&h);
}
#define AQ_LO 0x4140 // bytes 0, 1 of a word
#define AQ_HI 0x4342 // bytes 2, 3
// The codes in bytes sel of w as the f16 pair (8 + u / 128) = 9 + q / 128.
static __device__ __forceinline__ uint32_t aq_x(uint32_t w, uint32_t sel) {
    return __byte_perm(w, 0x48484848u, sel);
}
// The merge's column of output dim d of head h: a warp's stores of one output register cover
// dims 8 (g8 & 3) + t of 4 heads 2c4 + e and 2 values of bit 5; XOR-ing bits 0-2 with those
// spreads them over the 32 banks.
struct aq_cols {
    __device__ int operator()(int h, int d) const {
        return d ^ (((d >> 5) & 1) | (((h >> 1) & 3) << 1));
    }
};

// The warps' stages, which the final merge reuses for (o, m, l), then Q (f16, 8 HN heads).
template <int HN> static __host__ __device__ constexpr size_t aq_smem() {
    return ((size_t)AM_NW * AQ_NS * AQ_STAGE > (size_t)AM_NW * 16 * (AM_HD + 2) * 4
                ? (size_t)AM_NW * AQ_NS * AQ_STAGE
                : (size_t)AM_NW * 16 * (AM_HD + 2) * 4) +
           (size_t)HN * 8 * AM_HD * 2;
}

// HN head tiles of 8 (G <= 8 HN * heads per KV head).
template <int HN>
__global__ void __launch_bounds__(AM_NW * 32, 2)
    attn_split_q8_kernel(const __grid_constant__ struct attn_params p) {
    extern __shared__ __align__(16) unsigned char am_sm[];
    const int G = p.n_heads / p.n_kv;
    const int kvh = blockIdx.x, sidx = blockIdx.y, tid = threadIdx.x, lane = tid & 31,
              warp = tid >> 5, c4 = lane & 3, g8 = lane >> 2;
    unsigned char *kvw = am_sm + (size_t)warp * AQ_NS * AQ_STAGE;
    TRACE_BEGIN();
    pdl_trigger();
    const int L = attn_len(p);
    int start, end;
    attn_range(p, L, sidx, start, end);
    const int ntiles = start < end ? (end - start + AM_KT - 1) / AM_KT : 0;
    const size_t row = (size_t)p.kv_row;
    // A tile's copies: lane copies chunk cc of rows 2 i + cb (i < 8) of K and V, and one 16-byte
    // scale chunk (lanes < 16: K scales of key lane, else V scales of key lane - 16). Row 2 i + cb
    // of either swizzle is the row-0/1 offset XOR (i & 3) << 5.
    const int cb = lane >> 4, cc = lane & 15;
    const int kdst = cb * AM_HD + ((cc ^ aq_kf(cb)) << 4),
              vdst = AM_KT * AM_HD + cb * AM_HD + ((cc ^ aq_vf(cb)) << 4);
    const unsigned char *kg = p.kc + (size_t)kvh * AM_HD + (size_t)cb * row + cc * 16,
                        *vg = p.vc + (size_t)kvh * AM_HD + (size_t)cb * row + cc * 16,
                        *sg = (lane < 16 ? p.kc : p.vc) + (size_t)p.n_kv * AM_HD +
                              (size_t)kvh * 16 + (size_t)cc * row;
    // keys past the slice's end are zero-filled: code 0 with scale 0 reads as 0, never NaN
    // plain copies, not evict-first as in the bf16 kernel: with the L2 cache hint, ptxas 13.0 gave
    // this kernel's copies a misaligned descriptor register pair (desc[UR1]): illegal instruction
    auto load_tile = [&](unsigned char *st, int j) {
        const int k0 = start + j * AM_KT, nk = end - k0;
        const size_t o = (size_t)k0 * row;
        if (nk >= AM_KT) { // all but a slice's last tile: no predicates
#pragma unroll
            for (int i = 0; i < AM_KT / 2; i++) {
                const size_t go = o + (size_t)(2 * i) * row;
                cp_async16(st + 2 * i * AM_HD + (kdst ^ ((i & 3) << 5)), kg + go, true);
                cp_async16(st + 2 * i * AM_HD + (vdst ^ ((i & 3) << 5)), vg + go, true);
            }
            cp_async16(st + 2 * AM_KT * AM_HD + lane * 16, sg + o, true);
            return;
        }
#pragma unroll
        for (int i = 0; i < AM_KT / 2; i++) {
            const bool ok = 2 * i + cb < nk;
            const size_t go = ok ? o + (size_t)(2 * i) * row : 0;
            cp_async16(st + 2 * i * AM_HD + (kdst ^ ((i & 3) << 5)), kg + go, ok);
            cp_async16(st + 2 * i * AM_HD + (vdst ^ ((i & 3) << 5)), vg + go, ok);
        }
        const bool ok = cc < nk;
        cp_async16(st + 2 * AM_KT * AM_HD + lane * 16, sg + (ok ? o : 0), ok);
    };
    auto load_stage = [&](int i, int j) { load_tile(kvw + i * AQ_STAGE, j); };
    am_ring_first<AQ_NS> first;
    am_ring_early(first, warp, ntiles, start, end, L, load_stage);
    pdl_wait();
    TRACE_WAIT();
    float *part = p.part + ((size_t)sidx * p.n_heads + (size_t)kvh * G) * (AM_HD + 2);
    if (start >= end) return attn_empty(p, G, part);
    am_ring_rest(first, warp, ntiles, load_stage);

    // Q as f16 in shared memory, [8 HN][AM_HD] (heads past G zero), chunks of 8 dims XOR-ed
    // with bit 0 of the head. The B operand of k-tile kk = 4 g + w, head column g8 of head tile
    // hn: logical k 2c4, 2c4 + 1 (b0) and 2c4 + 8, 2c4 + 9 (b1) are dims b .. b + 3, b = 64 g +
    // 16 c4 + 4 w (as the K words arrive: chunk 4 g + c4 of a key row, word w); k-tiles 4 g + 2u,
    // 4 g + 2u + 1 are the 16 bytes at qread[u] + g * 128.
    unsigned char *qsm = am_sm + aq_smem<HN>() - (size_t)HN * 8 * AM_HD * 2;
    for (int c = tid; c < HN * 8 * (AM_HD / 8); c += AM_NW * 32) {
        const int h = c / (AM_HD / 8), k = c % (AM_HD / 8);
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f), y = x;
        if (h < G) {
            const float *q = p.q_ws + ((size_t)kvh * G + h) * AM_HD + 8 * k;
            x = __ldcg(reinterpret_cast<const float4 *>(q));
            y = __ldcg(reinterpret_cast<const float4 *>(q + 4));
        }
        *reinterpret_cast<uint4 *>(qsm + h * 2 * AM_HD + ((k ^ (h & 1)) << 4)) =
            make_uint4(aq_bits(__floats2half2_rn(x.x, x.y)), aq_bits(__floats2half2_rn(x.z, x.w)),
                       aq_bits(__floats2half2_rn(y.x, y.y)), aq_bits(__floats2half2_rn(y.z, y.w)));
    }
    __syncthreads();
    const int qread[2] = {g8 * 2 * AM_HD + (((2 * c4) ^ (g8 & 1)) << 4),
                          g8 * 2 * AM_HD + (((2 * c4 + 1) ^ (g8 & 1)) << 4)};
    // off: 9 x the group sums of the f16 q of this thread's two score columns (heads 2c4, 2c4 + 1)
    float off[HN][4][2];
#pragma unroll
    for (int hn = 0; hn < HN; hn++) {
        float gs[4];
#pragma unroll
        for (int g = 0; g < 4; g++) {
            gs[g] = 0.f;
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const uint4 v =
                    *reinterpret_cast<const uint4 *>(qsm + hn * 16 * AM_HD + qread[u] + g * 128);
                const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&w[e]));
                    gs[g] += f.x + f.y;
                }
            }
            gs[g] += __shfl_xor_sync(~0u, gs[g], 1);
            gs[g] += __shfl_xor_sync(~0u, gs[g], 2);
        }
#pragma unroll
        for (int g = 0; g < 4; g++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                off[hn][g][e] = 9.f * __shfl_sync(~0u, gs[g], (2 * c4 + e) * 4);
    }

    // o: row tile (g, t) holds dims 64 g + 8 g8 + t (rows g8) and + 4 (rows g8 + 8) of heads
    // 8 hn + 2 c4 + e; m, l per head column (l: this thread's keys, summed at the end). The V
    // operand is x = 9 + q / 128, so o sums P x; vs: this thread's keys' sum of P per group, 9
    // times which comes off at the end.
    float o[4][4][HN][4], vs[HN][4][2];
#pragma unroll
    for (int g = 0; g < 4; g++)
#pragma unroll
        for (int hn = 0; hn < HN; hn++) {
            vs[hn][g][0] = vs[hn][g][1] = 0.f;
#pragma unroll
            for (int t = 0; t < 4; t++)
                o[g][t][hn][0] = o[g][t][hn][1] = o[g][t][hn][2] = o[g][t][hn][3] = 0.f;
        }
    float m[HN][2], l[HN][2];
#pragma unroll
    for (int hn = 0; hn < HN; hn++) m[hn][0] = m[hn][1] = -INFINITY, l[hn][0] = l[hn][1] = 0.f;
    // scores in base 2; the 128 of the scales * 128 folded in
    const float sl2 = rsqrtf((float)AM_HD) * 1.4426950408889634f * 128.f;
    // K: chunk 4 i + c4 of rows g8 (and g8 + 8) at kread ^ (i << 6); V: the 8 bytes of group g
    // this thread reads of rows 2c4 (+ 1, 8, 9) at vread ^ (g << 6)
    const int kread = g8 * AM_HD + ((c4 ^ aq_kf(g8)) << 4),
              vread = AM_KT * AM_HD + 2 * c4 * AM_HD + (((g8 >> 1) ^ aq_vf(2 * c4)) << 4) +
                      8 * (g8 & 1);
    auto step = [&](const unsigned char *st, unsigned char *next, int j) {
        if (j + (AQ_NS - 1) * AM_NW < ntiles) load_tile(next, j + (AQ_NS - 1) * AM_NW);
        cp_async_commit();
        cp_async_wait<AQ_NS - 1>();
        __syncwarp();
        const float *sc = reinterpret_cast<const float *>(st + 2 * AM_KT * AM_HD);
        // scores of keys g8, g8 + 8 (rows) and heads 2c4, 2c4 + 1 (columns): per group i, the
        // accumulator minus 9 qsum, times the key's group scale
        float s[HN][4];
#pragma unroll
        for (int hn = 0; hn < HN; hn++) s[hn][0] = s[hn][1] = s[hn][2] = s[hn][3] = 0.f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const unsigned char *kr = st + (kread ^ (i << 6));
            const uint4 k0 = *reinterpret_cast<const uint4 *>(kr),
                        k1 = *reinterpret_cast<const uint4 *>(kr + 8 * AM_HD);
            const uint32_t w0[4] = {k0.x, k0.y, k0.z, k0.w}, w1[4] = {k1.x, k1.y, k1.z, k1.w};
            float a[HN][4];
            uint4 qv[HN][2];
#pragma unroll
            for (int hn = 0; hn < HN; hn++) {
                a[hn][0] = a[hn][1] = a[hn][2] = a[hn][3] = 0.f;
#pragma unroll
                for (int u = 0; u < 2; u++)
                    qv[hn][u] = *reinterpret_cast<const uint4 *>(qsm + hn * 16 * AM_HD + qread[u] +
                                                                 i * 128);
            }
#pragma unroll
            for (int w = 0; w < 4; w++) {
                const uint32_t ka[4] = {aq_x(w0[w], AQ_LO), aq_x(w1[w], AQ_LO), aq_x(w0[w], AQ_HI),
                                        aq_x(w1[w], AQ_HI)};
#pragma unroll
                for (int hn = 0; hn < HN; hn++) {
                    const uint4 &q = qv[hn][w >> 1];
                    mma_f16(a[hn], ka, w & 1 ? q.z : q.x, w & 1 ? q.w : q.y);
                }
            }
            const float sc0 = sc[4 * g8 + i], sc1 = sc[4 * (g8 + 8) + i];
#pragma unroll
            for (int hn = 0; hn < HN; hn++)
#pragma unroll
                for (int c = 0; c < 4; c++)
                    s[hn][c] += (a[hn][c] - off[hn][i][c & 1]) * (c < 2 ? sc0 : sc1);
        }
        // keys past the slice end masked
        const int kb = start + j * AM_KT;
        float alpha[HN][2];
        const bool moved = am_softmax<HN>(s, m, l, alpha, kb + g8 < end, kb + g8 + 8 < end, sl2);
        // once the maxima settle, no column of the warp moves: skip the multiplies by 1
        if (__any_sync(~0u, moved)) {
#pragma unroll
            for (int g = 0; g < 4; g++)
#pragma unroll
                for (int hn = 0; hn < HN; hn++)
#pragma unroll
                    for (int c = 0; c < 4; c++) {
#pragma unroll
                        for (int t = 0; t < 4; t++) o[g][t][hn][c] *= alpha[hn][c & 1];
                        if (c < 2) vs[hn][g][c] *= alpha[hn][c];
                    }
        }
        const float *vsc = sc + 4 * AM_KT;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            // P^T of group g (value scales * 128 folded in, rounded once to f16) as the B fragments
            // of keys 2c4.. / 2c4 + 8.. and head g8
            const float t0 = vsc[4 * g8 + g] * 128.f, t1 = vsc[4 * (g8 + 8) + g] * 128.f;
            uint32_t pb[HN][2];
#pragma unroll
            for (int hn = 0; hn < HN; hn++) {
                const __half2 h0 = __floats2half2_rn(s[hn][0] * t0, s[hn][1] * t0),
                              h1 = __floats2half2_rn(s[hn][2] * t1, s[hn][3] * t1);
                const float2 f0 = __half22float2(h0), f1 = __half22float2(h1);
                vs[hn][g][0] += f0.x + f1.x, vs[hn][g][1] += f0.y + f1.y;
                pb[hn][0] = movmatrix_trans(aq_bits(h0)), pb[hn][1] = movmatrix_trans(aq_bits(h1));
            }
            // O^T += V^T P^T: this thread's A values are keys (2c4, 2c4 + 1) and (2c4 + 8, 2c4 + 9)
            // of dims 64 g + 8 g8 + 0 .. 7 (8 bytes of each key row)
            const unsigned char *vr = st + (vread ^ (g << 6));
            const uint2 ra = *reinterpret_cast<const uint2 *>(vr),
                        rb = *reinterpret_cast<const uint2 *>(vr + AM_HD),
                        rc = *reinterpret_cast<const uint2 *>(vr + 8 * AM_HD),
                        rd = *reinterpret_cast<const uint2 *>(vr + 9 * AM_HD);
            // (A, B) and (C, D) bytes interleaved: for dims 4 wi + 0, 1 (lo) and 2, 3 (hi), pairs
            // of two keys
            const uint32_t ab[2][2] = {{__byte_perm(ra.x, rb.x, 0x5140),
                                        __byte_perm(ra.x, rb.x, 0x7362)},
                                       {__byte_perm(ra.y, rb.y, 0x5140),
                                        __byte_perm(ra.y, rb.y, 0x7362)}},
                           cd[2][2] = {
                               {__byte_perm(rc.x, rd.x, 0x5140), __byte_perm(rc.x, rd.x, 0x7362)},
                               {__byte_perm(rc.y, rd.y, 0x5140), __byte_perm(rc.y, rd.y, 0x7362)}};
#pragma unroll
            for (int t = 0; t < 4; t++) { // dim t (rows g8) and 4 + t (rows g8 + 8)
                const uint32_t sel = t & 1 ? AQ_HI : AQ_LO;
                const uint32_t va[4] = {aq_x(ab[0][t >> 1], sel), aq_x(ab[1][t >> 1], sel),
                                        aq_x(cd[0][t >> 1], sel), aq_x(cd[1][t >> 1], sel)};
#pragma unroll
                for (int hn = 0; hn < HN; hn++) mma_f16(o[g][t][hn], va, pb[hn][0], pb[hn][1]);
            }
        }
        __syncwarp(); // the next step refills this stage
    };
    am_ring_run<AQ_NS, AQ_STAGE>(kvw, warp, ntiles, step);
#pragma unroll
    for (int hn = 0; hn < HN; hn++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            l[hn][e] = am_colsum(l[hn][e]);
#pragma unroll
            for (int g = 0; g < 4; g++) {
                const float v = am_colsum(vs[hn][g][e]);
#pragma unroll
                for (int t = 0; t < 4; t++) {
                    o[g][t][hn][e] -= 9.f * v;
                    o[g][t][hn][2 + e] -= 9.f * v;
                }
            }
        }
    // merge the warps: (m, l, o) of each into shared memory (reusing the stages)
    cp_async_wait<0>();
    __syncthreads();
    float *wo = reinterpret_cast<float *>(am_sm); // [AM_NW][16][AM_HD], aq_cols order
    float *wm = wo + AM_NW * 16 * AM_HD, *wl = wm + AM_NW * 16;
#pragma unroll
    for (int hn = 0; hn < HN; hn++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int h = 8 * hn + 2 * c4 + e;
            if (g8 == 0) wm[warp * 16 + h] = m[hn][e], wl[warp * 16 + h] = l[hn][e];
#pragma unroll
            for (int g = 0; g < 4; g++)
#pragma unroll
                for (int t = 0; t < 4; t++)
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        const int d = 64 * g + 8 * g8 + 4 * r + t;
                        wo[((size_t)warp * 16 + h) * AM_HD + aq_cols()(h, d)] =
                            o[g][t][hn][2 * r + e];
                    }
        }
    __syncthreads();
    am_merge(wo, wm, wl, G, part, aq_cols());
}

bool attn_int8_ok(int hd, int n_heads, int n_kv) {
    return hd == AM_HD && n_kv > 0 && n_heads % n_kv == 0 && n_heads / n_kv <= 16;
}

// One slice per resident block (a single wave), as the bf16 tensor-core path.
template <int HN>
static int q8_launch(struct attn_params *q, int sms, cudaStream_t s, struct wren_err *e) {
    constexpr size_t smem = aq_smem<HN>();
    static int per_sm = 0; // resident blocks per SM (one kernel shape: asked once)
    if (!per_sm) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_split_q8_kernel<HN>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, attn_split_q8_kernel<HN>,
                                                                 AM_NW * 32, smem));
        if (per_sm < 1) per_sm = 1;
    }
    const int sp = per_sm * sms / q->n_kv;
    if (sp >= 1 && sp < q->splits) q->splits = sp;
    CUDA_CHECK(pdl_launch(attn_split_q8_kernel<HN>, dim3(q->n_kv, q->splits), dim3(AM_NW * 32),
                          smem, s, decode_pdl(), *q));
    return 0;
}
int attn_split_q8_launch(struct attn_params *q, int sms, size_t smem_optin, cudaStream_t s,
                         struct wren_err *e) {
    if (!attn_int8_ok(q->hd, q->n_heads, q->n_kv))
        return wren_errf(e, "attention: int8 KV cache with head_dim %d, %d / %d heads", q->hd,
                         q->n_heads, q->n_kv);
    const bool two = q->n_heads / q->n_kv > 8;
    const size_t smem = two ? aq_smem<2>() : aq_smem<1>();
    if (smem > smem_optin)
        return wren_errf(e, "attention: %zu bytes of shared memory needed, %zu available", smem,
                         smem_optin);
    return two ? q8_launch<2>(q, sms, s, e) : q8_launch<1>(q, sms, s, e);
}
