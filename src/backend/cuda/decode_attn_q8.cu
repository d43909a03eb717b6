// Split-KV decode attention over the int8 KV cache (kv_int8.cuh): head_dim 256, up to 16 query
// heads per KV head, the scheme of attn_split_mma_kernel (decode_attn.cu) with half the bytes per
// key and f16 mma's. The codes need no conversion instruction: a code byte u placed under the f16
// exponent of 8 (one byte permute: 0x48uu) is x = 8 + u / 128 = 9 + q / 128, exactly.
//   Q K^T: one accumulator per 64-dim group g sums q . x; minus 9 times the group's sum of q (per
//   row, computed once) it is q . q_codes / 128, which the key's group scale (times 128) turns into
//   the score: the K bytes go into the mma as they are.
//   P V: x - 9 = q / 128 exactly, times the value's group scale * 128 in f16 (a subtraction and a
//   multiply per pair; folding the offset as for K would leave 8 + u / 128 rounded to f16 products,
//   ~10 times the value's own rounding error).
// Q is one f16 part (11 mantissa bits; the values carry 8).
//
#include <cuda_fp16.h>

#include "backend/cuda/decode_attn.cuh"
#include "backend/cuda/mma.cuh"

// One stage: K codes [16][256], V codes [16][256], then the 16 keys' 16-byte scale chunks (K, V).
#define AQ_STAGE (2 * AM_KT * AM_HD + 2 * AM_KT * 16)

// Byte offset of 16-byte chunk c of row r in a [16][256] code tile. The XOR keeps both read
// patterns free of bank conflicts: K (8 lanes: rows r, r + 1, four consecutive chunks) and V
// (8 lanes: rows 2c for c < 4, two chunks).
static __device__ __forceinline__ int aqswz(int r, int c) {
    const int f = (((r >> 1) & 3) << 1) ^ ((r & 1) << 2);
    return r * AM_HD + ((c ^ f) << 4);
}
// Q K^T's k-tile kk, logical k = t, stands for dim 64 (kk / 4) + 16 c + 4 (kk % 4) + e with
// c = (t & 7) / 2, e = (t & 1) + 2 (t / 8): thread c of a quad reads 16-byte chunk 4 (kk / 4) + c of
// a key row, whose word kk % 4 holds the tile's 4 dims of that thread (bytes 0, 1: k = 2c, 2c + 1;
// bytes 2, 3: k = 2c + 8, 2c + 9). Q is stored in that order.
static __device__ __forceinline__ uint32_t aq_bits(__half2 h) {
    return *reinterpret_cast<uint32_t *>(&h);
}
#define AQ_LO 0x4140 // bytes 0, 1 of a word
#define AQ_HI 0x4342 // bytes 2, 3
// The codes in bytes sel of w as the f16 pair (8 + u / 128) = 9 + q / 128.
static __device__ __forceinline__ uint32_t aq_x(uint32_t w, uint32_t sel) {
    return __byte_perm(w, 0x48484848u, sel);
}
// Their values: q / 128 times s128 (the groups' scales times 128).
static __device__ __forceinline__ uint32_t aq_val(uint32_t w, uint32_t sel, __half2 s128) {
    const uint32_t x = aq_x(w, sel);
    return aq_bits(
        __hmul2(__hsub2(*reinterpret_cast<const __half2 *>(&x), __float2half2_rn(9.f)), s128));
}
// The merge's column of output dim d in row r: the P V fragments leave dim 128 hh + 16 (2 c + e) + j
// in the register of n-tile 16 hh + j, so a warp's stores of one register would all hit one bank;
// XOR-ing the low 5 bits with (r, c) spreads them (bits 5-6 hold c: invertible).
struct aq_cols {
    __device__ int operator()(int r, int d) const { return d ^ ((r & 7) | (((d >> 5) & 3) << 3)); }
};

// Q (f16), its group sums, then the warps' stages, which the final merge reuses for (o, m, l).
#define AQ_QS (16 * AM_HD * 2) // offset of the group sums [16][4] (f32)
#define AQ_ST (AQ_QS + 16 * 4 * 4) // offset of the stages
#define AQ_NS 2 // K/V stages per warp (3: 2% slower at 128K)
static __host__ __device__ constexpr size_t aq_smem() {
    return (size_t)AQ_ST + ((size_t)AM_NW * AQ_NS * AQ_STAGE > (size_t)AM_NW * 16 * (AM_HD + 2) * 4
                                ? (size_t)AM_NW * AQ_NS * AQ_STAGE
                                : (size_t)AM_NW * 16 * (AM_HD + 2) * 4);
}

__global__ void __launch_bounds__(AM_NW * 32)
    attn_split_q8_kernel(const __grid_constant__ struct attn_params p) {
    extern __shared__ __align__(16) unsigned char am_sm[];
    __half *Qs = reinterpret_cast<__half *>(am_sm); // [16][AM_HD], dims in aq_kdim order
    float *qsum = reinterpret_cast<float *>(am_sm + AQ_QS); // [16][4]: sum of a group's q (f16)
    const int G = p.n_heads / p.n_kv;
    const int kvh = blockIdx.x, sidx = blockIdx.y, tid = threadIdx.x, lane = tid & 31,
              warp = tid >> 5, c4 = lane & 3, g8 = lane >> 2;
    unsigned char *kvw = am_sm + AQ_ST + (size_t)warp * AQ_NS * AQ_STAGE;
    TRACE_BEGIN();
    pdl_trigger();
    pdl_wait();
    TRACE_WAIT();
    float *part = p.part + ((size_t)sidx * p.n_heads + (size_t)kvh * G) * (AM_HD + 2);
    int start, end;
    if (!attn_slice(p, sidx, G, part, start, end)) return;
    const int ntiles = (end - start + AM_KT - 1) / AM_KT;
    const size_t row = (size_t)p.kv_row;
    const unsigned char *kc = p.kc + (size_t)kvh * AM_HD, *vc = p.vc + (size_t)kvh * AM_HD;
    const size_t soff = (size_t)p.n_kv * AM_HD + (size_t)kvh * 16; // the head's 4 group scales
    // keys past the slice's end are zero-filled: code 0 with scale 0 reads as 0, never NaN
    auto load_tile = [&](int stage, int j) {
        unsigned char *ks = kvw + (size_t)stage * AQ_STAGE, *vs = ks + AM_KT * AM_HD,
                      *sc = vs + AM_KT * AM_HD;
        const int k0 = start + j * AM_KT;
#pragma unroll
        for (int i = lane; i < AM_KT * (AM_HD / 16); i += 32) {
            const int r = i >> 4, c = i & 15, key = k0 + r;
            const bool ok = key < end;
            const size_t off = (size_t)(ok ? key : start) * row + c * 16;
            cp_async16(ks + aqswz(r, c), kc + off, ok);
            cp_async16(vs + aqswz(r, c), vc + off, ok);
        }
        const int key = k0 + (lane & 15);
        const bool ok = key < end;
        cp_async16(sc + lane * 16, (lane < 16 ? p.kc : p.vc) + (size_t)(ok ? key : start) * row + soff,
                   ok);
    };
    if (warp < ntiles) load_tile(0, warp);
    cp_async_commit();
    // Q rows g < G in f16 (rows past G zero), dims permuted as the K words arrive: 4 consecutive
    // dims (one float4) are logical k 2c, 2c + 1, 2c + 8, 2c + 9 of one k-tile
#pragma unroll
    for (int i = tid; i < 16 * (AM_HD / 4); i += AM_NW * 32) {
        const int r = i / (AM_HD / 4), d = (i % (AM_HD / 4)) * 4;
        float4 q = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < G) q = __ldcg(reinterpret_cast<const float4 *>(p.q_ws + ((size_t)kvh * G + r) * AM_HD + d));
        const int kk = 4 * (d >> 6) + ((d >> 2) & 3), l = kk * 16 + 2 * ((d >> 4) & 3);
        *reinterpret_cast<__half2 *>(Qs + amswz(r, l >> 3) + (l & 7)) = __floats2half2_rn(q.x, q.y);
        *reinterpret_cast<__half2 *>(Qs + amswz(r, (l + 8) >> 3) + (l & 7)) =
            __floats2half2_rn(q.z, q.w);
    }
    __syncthreads();
    if (tid < 64) { // group g of a row is its logical k-tiles 4g .. 4g + 3: chunks 8g .. 8g + 7
        const int r = tid >> 2, g = tid & 3;
        float sum = 0.f;
        for (int c = 8 * g; c < 8 * g + 8; c++) {
            const uint4 u = *reinterpret_cast<const uint4 *>(Qs + amswz(r, c));
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&w[k]));
                sum += f.x + f.y;
            }
        }
        qsum[r * 4 + g] = sum;
    }
    __syncthreads();
    float off[4][2]; // 9 x the group sums of rows g8, g8 + 8
#pragma unroll
    for (int g = 0; g < 4; g++) off[g][0] = 9.f * qsum[g8 * 4 + g], off[g][1] = 9.f * qsum[(g8 + 8) * 4 + g];

    float o[AM_HD / 8][4];
#pragma unroll
    for (int i = 0; i < AM_HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    // scores in base 2; the 128 of the scales * 128 folded in
    const float sl2 = rsqrtf((float)AM_HD) * 1.4426950408889634f * 128.f;
    int it = 0;
    for (int j = warp; j < ntiles; j += AM_NW, it++) {
        if (j + AM_NW < ntiles) load_tile((it + 1) % AQ_NS, j + AM_NW);
        cp_async_commit();
        cp_async_wait<1>();
        __syncwarp();
        const unsigned char *ks = kvw + (size_t)(it % AQ_NS) * AQ_STAGE, *vs = ks + AM_KT * AM_HD,
                            *sc = vs + AM_KT * AM_HD;
        // Q K^T per group i (chunk 4 i + c4 of key rows g8, g8 + 8), then per score entry
        // (row, key nt * 8 + 2 c4 + e): sum over groups of scale * (acc - 9 qsum)
        float4 ksc[2][2];
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                ksc[nt][e] = *reinterpret_cast<const float4 *>(sc + (nt * 8 + 2 * c4 + e) * 16);
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint4 k0 = *reinterpret_cast<const uint4 *>(ks + aqswz(g8, 4 * i + c4)),
                        k1 = *reinterpret_cast<const uint4 *>(ks + aqswz(g8 + 8, 4 * i + c4));
            const uint32_t w0[4] = {k0.x, k0.y, k0.z, k0.w}, w1[4] = {k1.x, k1.y, k1.z, k1.w};
            float a[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
            for (int w = 0; w < 4; w++) {
                const int kk = 4 * i + w;
                uint32_t qa[4];
                ldmatrix_x4(qa, Qs + amswz(lane & 15, kk * 2 + (lane >> 4)));
                mma_f16(a[0], qa, aq_x(w0[w], AQ_LO), aq_x(w0[w], AQ_HI));
                mma_f16(a[1], qa, aq_x(w1[w], AQ_LO), aq_x(w1[w], AQ_HI));
            }
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const float4 f = ksc[nt][c & 1];
                    const float scl = i == 0 ? f.x : i == 1 ? f.y : i == 2 ? f.z : f.w;
                    s[nt][c] += (a[nt][c] - off[i][c >> 1]) * scl;
                }
        }
        // keys past the slice end masked; online softmax per row (lane >> 2, + 8)
        const int kb = start + j * AM_KT;
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int kl = nt * 8 + c4 * 2 + (c & 1);
                const float x = kb + kl < end ? s[nt][c] * sl2 : -INFINITY;
                s[nt][c] = x;
                mx[c >> 1] = fmaxf(mx[c >> 1], x);
            }
        float alpha[2], rs[2] = {0.f, 0.f};
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(~0u, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(~0u, mx[r], 2));
            alpha[r] = exp2f(m[r] - mx[r]); // first tile: exp2(-inf) = 0
            m[r] = mx[r];
        }
        uint32_t pa[4];
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            float pr[4];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                pr[c] = exp2f(s[nt][c] - m[c >> 1]);
                rs[c >> 1] += pr[c];
            }
            pa[nt * 2] = aq_bits(__floats2half2_rn(pr[0], pr[1]));
            pa[nt * 2 + 1] = aq_bits(__floats2half2_rn(pr[2], pr[3]));
        }
#pragma unroll
        for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + rs[r];
        // once the maxima settle, no row of the warp moves: skip the 128 multiplies by 1
        if (__any_sync(~0u, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
            for (int i = 0; i < AM_HD / 8; i++) {
                o[i][0] *= alpha[0], o[i][1] *= alpha[0];
                o[i][2] *= alpha[1], o[i][3] *= alpha[1];
            }
        }
        // P V: this thread's B values are keys (2c, 2c + 1) and (2c + 8, 2c + 9) of one column;
        // byte j of its chunk 8 hh + g8 of those rows is n-tile 16 hh + j, dim 128 hh + 16 g8 + j,
        // in group 2 hh + g8 / 4
        const float *vsc = reinterpret_cast<const float *>(sc + AM_KT * 16);
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int g = 2 * hh + (g8 >> 2);
            const __half2 sa = __floats2half2_rn(vsc[(2 * c4) * 4 + g] * 128.f,
                                                 vsc[(2 * c4 + 1) * 4 + g] * 128.f),
                          sb = __floats2half2_rn(vsc[(2 * c4 + 8) * 4 + g] * 128.f,
                                                 vsc[(2 * c4 + 9) * 4 + g] * 128.f);
            const uint4 ra = *reinterpret_cast<const uint4 *>(vs + aqswz(2 * c4, 8 * hh + g8)),
                        rb = *reinterpret_cast<const uint4 *>(vs + aqswz(2 * c4 + 1, 8 * hh + g8)),
                        rc = *reinterpret_cast<const uint4 *>(vs + aqswz(2 * c4 + 8, 8 * hh + g8)),
                        rd = *reinterpret_cast<const uint4 *>(vs + aqswz(2 * c4 + 9, 8 * hh + g8));
            const uint32_t A[4] = {ra.x, ra.y, ra.z, ra.w}, B[4] = {rb.x, rb.y, rb.z, rb.w},
                           C[4] = {rc.x, rc.y, rc.z, rc.w}, D[4] = {rd.x, rd.y, rd.z, rd.w};
#pragma unroll
            for (int wi = 0; wi < 4; wi++) {
                // (A, B) and (C, D) bytes interleaved: pairs of one column, two keys
                const uint32_t ab[2] = {__byte_perm(A[wi], B[wi], 0x5140),
                                        __byte_perm(A[wi], B[wi], 0x7362)},
                               cd[2] = {__byte_perm(C[wi], D[wi], 0x5140),
                                        __byte_perm(C[wi], D[wi], 0x7362)};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const uint32_t sel = e & 1 ? AQ_HI : AQ_LO;
                    mma_f16(o[16 * hh + 4 * wi + e], pa, aq_val(ab[e >> 1], sel, sa),
                            aq_val(cd[e >> 1], sel, sb));
                }
            }
        }
        __syncwarp(); // this stage is refilled AQ_NS tiles later
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(~0u, l[r], 1);
        l[r] += __shfl_xor_sync(~0u, l[r], 2);
    }
    // merge the warps: (m, l, o) of each into shared memory (reusing the stages), dims restored
    cp_async_wait<0>();
    __syncthreads();
    float *wo = reinterpret_cast<float *>(am_sm + AQ_QS); // [AM_NW][16][AM_HD], aq_cols order
    float *wm = wo + AM_NW * 16 * AM_HD, *wl = wm + AM_NW * 16;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int rw = g8 + r * 8;
        if (c4 == 0) wm[warp * 16 + rw] = m[r], wl[warp * 16 + rw] = l[r];
#pragma unroll
        for (int nt = 0; nt < AM_HD / 8; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                wo[((size_t)warp * 16 + rw) * AM_HD +
                   aq_cols()(rw, 128 * (nt >> 4) + 16 * (2 * c4 + e) + (nt & 15))] = o[nt][r * 2 + e];
    }
    __syncthreads();
    am_merge(wo, wm, wl, G, part, aq_cols());
}

bool attn_int8_ok(int hd, int n_heads, int n_kv) {
    return hd == AM_HD && n_kv > 0 && n_heads % n_kv == 0 && n_heads / n_kv <= 16;
}

// One slice per resident block (a single wave), as the bf16 tensor-core path.
int attn_split_q8_launch(struct attn_params *q, int sms, size_t smem_optin, cudaStream_t s,
                         struct wren_err *e) {
    if (!attn_int8_ok(q->hd, q->n_heads, q->n_kv))
        return wren_errf(e, "attention: int8 KV cache with head_dim %d, %d / %d heads", q->hd,
                         q->n_heads, q->n_kv);
    constexpr size_t smem = aq_smem();
    void (*kern)(struct attn_params) = attn_split_q8_kernel;
    if (smem > smem_optin)
        return wren_errf(e, "attention: %zu bytes of shared memory needed, %zu available", smem,
                         smem_optin);
    static int per_sm = 0; // resident blocks per SM (one kernel shape: asked once)
    if (!per_sm) {
        CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, AM_NW * 32, smem));
        if (per_sm < 1) per_sm = 1;
    }
    const int sp = per_sm * sms / q->n_kv;
    if (sp >= 1 && sp < q->splits) q->splits = sp;
    CUDA_CHECK(pdl_launch(kern, dim3(q->n_kv, q->splits), dim3(AM_NW * 32), smem, s, decode_pdl(), *q));
    return 0;
}
