// Fused-dequant GEMM on tensor cores (mma.sync m16n8k16 bf16, f32 accumulation), sm_80+.
// C[M, N] = A[M, K] * W[N, K]^T with W in MLX affine 4/8-bit (or bf16): each 128 x 64 tile of W is
// dequantized by the block into shared memory and never exists dequantized in device memory.
// A tiles arrive by cp.async (3 stages); the next W tile is fetched into registers while the
// current one is multiplied. One kernel serves the dense projections and the grouped (MoE) GEMMs:
// in grouped mode blockIdx.x indexes a device-built tile map (expert, row range).
#include "backend/cuda/gemm_args.cuh"
#include "backend/cuda/mma.cuh"

namespace {

constexpr int BN = 128, BK = 64, NTHREADS = 256, ASTAGES = 3;
// Shared memory of a block of BM-row tiles: ASTAGES A tiles, two W tiles.
constexpr int tile_smem(int bm) {
    return (ASTAGES * bm * BK + 2 * BN * BK) * (int)sizeof(bf16);
}

struct gparams : gemm_in {
    void *C;
    int ldc;
    const int *tiles, *n_tiles;
    int splits; // K parts (dense mode only, gemm_split.cu; blockIdx.z): > 1 writes raw sums to part
    float *part;
};

// Element offset of 16-byte chunk c of row r in a [rows][64] bf16 tile, XOR-swizzled so that
// ldmatrix reads of 8 rows hit 8 different bank groups.
__device__ __forceinline__ int swz(int r, int c) {
    return r * BK + ((c ^ (r & 7)) << 3);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// One thread's share of a W tile: 32 consecutive k of one row.
struct bfrag {
    uint4 q[4];
    float s, b;
};

template <int BITS>
__device__ __forceinline__ void load_b(bfrag &f, const uint8_t *wrow, const uint8_t *srow,
                                       const uint8_t *brow, int gshift, int k, bool valid) {
    constexpr int NV = BITS == 4 ? 1 : BITS == 8 ? 2 : 4;
    if (!valid) {
#pragma unroll
        for (int i = 0; i < NV; i++) f.q[i] = make_uint4(0, 0, 0, 0);
        f.s = f.b = 0.f;
        return;
    }
    const uint4 *p = reinterpret_cast<const uint4 *>(wrow + (size_t)k * BITS / 8);
#pragma unroll
    for (int i = 0; i < NV; i++) f.q[i] = __ldg(p + i);
    if (BITS != 16) {
        const int g = k >> gshift; // the group of k (groups are powers of two, see pf_gemm)
        f.s = __bfloat162float(reinterpret_cast<const bf16 *>(srow)[g]);
        f.b = __bfloat162float(reinterpret_cast<const bf16 *>(brow)[g]);
    }
}

// Dequantizes a fragment into 4 swizzled 16-byte chunks of row v (chunks c0 .. c0+3).
template <int BITS>
__device__ __forceinline__ void store_b(const bfrag &f, bf16 *Bs, int v, int c0) {
    if (BITS == 16) {
#pragma unroll
        for (int i = 0; i < 4; i++) *reinterpret_cast<uint4 *>(Bs + swz(v, c0 + i)) = f.q[i];
    } else if (BITS == 4) {
        // 128 + q as bf16 pairs (exponent of 128, q in the low mantissa bits); minus 128 is exact,
        // then one bf16x2 FMA (q * s + b, rounded once, like an f32 FMA rounded to bf16). In the
        // device layout (common.cuh) nibbles j and j + 4 of word t are values 8j + 2t and + 1 of
        // the chunk: as a bf16 pair, word t of the chunk's j-th 8 values in shared memory.
        const __nv_bfloat162 s2 = __float2bfloat162_rn(f.s), b2 = __float2bfloat162_rn(f.b);
        const __nv_bfloat162 m128 = __float2bfloat162_rn(128.f);
        const uint32_t *w = reinterpret_cast<const uint32_t *>(&f.q[0]);
        uint32_t r[4][4]; // r[j][t]: values 8j + 2t, 8j + 2t + 1
#pragma unroll
        for (int t = 0; t < 4; t++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                uint32_t x = nib_bf16x2(w[t] >> (4 * j));
                __nv_bfloat162 hv = *reinterpret_cast<__nv_bfloat162 *>(&x);
                hv = __hfma2(__hsub2(hv, m128), s2, b2);
                r[j][t] = *reinterpret_cast<uint32_t *>(&hv);
            }
#pragma unroll
        for (int j = 0; j < 4; j++)
            *reinterpret_cast<uint4 *>(Bs + swz(v, c0 + j)) =
                make_uint4(r[j][0], r[j][1], r[j][2], r[j][3]);
    } else {
        const uint32_t *w = reinterpret_cast<const uint32_t *>(&f.q[0]);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float val[8];
#pragma unroll
            for (int j = 0; j < 8; j++)
                val[j] = fmaf(f.s, (float)((w[2 * i + j / 4] >> (8 * (j % 4))) & 0xFFu), f.b);
            uint4 o = make_uint4(pack_bf16(val[0], val[1]), pack_bf16(val[2], val[3]),
                                 pack_bf16(val[4], val[5]), pack_bf16(val[6], val[7]));
            *reinterpret_cast<uint4 *>(Bs + swz(v, c0 + i)) = o;
        }
    }
}

// Warp grid: 2 x 4 warps of 32 x 32 / 64 x 32 for BM = 64 / 128 (two blocks per SM); 4 x 2 warps
// of 64 x 64 for BM = 256 (one block per SM, half the dequantization per MMA).
template <int BM> struct tile_cfg {
    static constexpr int WARPS_M = BM == 256 ? 4 : 2, WARPS_N = 8 / WARPS_M;
    static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N, MT = WM / 16, NT = WN / 8;
    static constexpr int MIN_BLOCKS = BM == 256 ? 1 : 2;
};

template <int BITS, int BM, int EPI>
__global__ void __launch_bounds__(NTHREADS, tile_cfg<BM>::MIN_BLOCKS)
    gemm_q_kernel(const gparams p) {
    constexpr int WM = tile_cfg<BM>::WM, WN = tile_cfg<BM>::WN, MT = tile_cfg<BM>::MT,
                  NT = tile_cfg<BM>::NT;
    constexpr int A_CHUNKS = BM * 8 / NTHREADS;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *As = reinterpret_cast<bf16 *>(smem_raw);
    bf16 *Bs = As + ASTAGES * BM * BK;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / tile_cfg<BM>::WARPS_N, wn = warp % tile_cfg<BM>::WARPS_N;

    int expert = 0, row0, row_end;
    if (p.tiles) {
        if ((int)blockIdx.x >= *p.n_tiles) return;
        expert = p.tiles[3 * blockIdx.x];
        row0 = p.tiles[3 * blockIdx.x + 1];
        row_end = p.tiles[3 * blockIdx.x + 2];
    } else {
        row0 = blockIdx.x * BM;
        row_end = min(row0 + BM, p.M);
    }

    // A rows this thread copies (gathered through a_rows in grouped mode).
    const bf16 *a_src[A_CHUNKS];
    bool a_ok[A_CHUNKS];
#pragma unroll
    for (int i = 0; i < A_CHUNKS; i++) {
        int idx = tid + i * NTHREADS, r = row0 + (idx >> 3);
        a_ok[i] = r < row_end;
        int src = a_ok[i] ? (p.a_rows ? p.a_rows[r] : r) : 0; // row 0: never read (size 0)
        a_src[i] = p.A + (size_t)src * p.lda + (idx & 7) * 8;
    }

    // The W row this thread dequantizes: virtual row v of the tile, half of its 64 k.
    const int v = tid >> 1, half = tid & 1;
    int n;
    const wview w = (EPI == EPI_SWIGLU_BF16 && ((v >> 3) & 1)) ? p.w[1] : p.w[0];
    if (EPI == EPI_SWIGLU_BF16) {
        n = blockIdx.y * 64 + (v >> 4) * 8 + (v & 7);
    } else {
        n = blockIdx.y * BN + v;
    }
    const bool b_ok = n < p.N;
    const int nn = b_ok ? n : 0;
    const uint8_t *wrow = w.data + expert * w.ms + nn * w.rs;
    const uint8_t *srow = w.scales ? w.scales + expert * w.sbms + nn * w.sbrs : nullptr;
    const uint8_t *brow = w.biases ? w.biases + expert * w.sbms + nn * w.sbrs : nullptr;
    const int gshift = __ffs(w.group) - 1;

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.f;

    // this CTA's part of the k-tiles (all of them unless the GEMM is split along K)
    const int KT = (blockIdx.z + 1) * (p.K / BK) / p.splits,
              kt0 = blockIdx.z * (p.K / BK) / p.splits;
    auto load_a = [&](int kt) {
        if (kt < KT) {
            bf16 *dst = As + (kt % ASTAGES) * BM * BK;
#pragma unroll
            for (int i = 0; i < A_CHUNKS; i++) {
                int idx = tid + i * NTHREADS;
                cp_async16(dst + swz(idx >> 3, idx & 7), a_src[i] + kt * BK, a_ok[i]);
            }
        }
        cp_async_commit();
    };

#pragma unroll
    for (int s = 0; s < ASTAGES - 1; s++) load_a(kt0 + s);
    bfrag f;
    load_b<BITS>(f, wrow, srow, brow, gshift, kt0 * BK + half * 32, b_ok);
    store_b<BITS>(f, Bs, v, half * 4);
    if (kt0 + 1 < KT) load_b<BITS>(f, wrow, srow, brow, gshift, (kt0 + 1) * BK + half * 32, b_ok);

    for (int kt = kt0; kt < KT; kt++) {
        cp_async_wait<ASTAGES - 2>();
        __syncthreads();
        load_a(kt + ASTAGES - 1);
        if (kt + 1 < KT) {
            store_b<BITS>(f, Bs + ((kt + 1 - kt0) & 1) * BN * BK, v, half * 4);
            if (kt + 2 < KT)
                load_b<BITS>(f, wrow, srow, brow, gshift, (kt + 2) * BK + half * 32, b_ok);
        }
        const bf16 *a_t = As + (kt % ASTAGES) * BM * BK;
        const bf16 *b_t = Bs + ((kt - kt0) & 1) * BN * BK;
#pragma unroll
        for (int ks = 0; ks < BK / 16; ks++) {
            uint32_t a[MT][4], b[NT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                int r = wm * WM + mt * 16 + (lane & 15);
                ldmatrix_x4(a[mt], a_t + swz(r, ks * 2 + (lane >> 4)));
            }
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                int r = wn * WN + np * 16 + (lane & 7) + ((lane >> 4) << 3);
                uint32_t t4[4];
                ldmatrix_x4(t4, b_t + swz(r, ks * 2 + ((lane >> 3) & 1)));
                b[2 * np][0] = t4[0];
                b[2 * np][1] = t4[1];
                b[2 * np + 1][0] = t4[2];
                b[2 * np + 1][1] = t4[3];
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++) mma_bf16(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
        }
    }

    if (p.splits > 1) { // raw sums of this K part: gate and up (if any) side by side
        const int ldp = EPI == EPI_SWIGLU_BF16 ? 2 * p.N : p.N;
        float *P = p.part + (size_t)blockIdx.z * p.M * ldp;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int r = row0 + wm * WM + mt * 16 + (lane >> 2) + hr * 8;
                if (r >= row_end) continue;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    // SwiGLU: pairs of n-tiles are (gate, up) of 8 features
                    const int c =
                        EPI == EPI_SWIGLU_BF16
                            ? blockIdx.y * 64 + wn * (WN / 2) + (nt >> 1) * 8 + (lane & 3) * 2
                            : blockIdx.y * BN + wn * WN + nt * 8 + (lane & 3) * 2;
                    const int off = EPI == EPI_SWIGLU_BF16 ? (nt & 1) * p.N : 0;
                    float *prow = P + (size_t)r * ldp + off;
                    if (c < p.N) prow[c] = acc[mt][nt][hr * 2];
                    if (c + 1 < p.N) prow[c + 1] = acc[mt][nt][hr * 2 + 1];
                }
            }
        return;
    }
    // Epilogue straight from the accumulators (c0,c1: row lane/4, c2,c3: row lane/4 + 8).
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int r = row0 + wm * WM + mt * 16 + (lane >> 2) + hr * 8;
            if (r >= row_end) continue;
            if (EPI == EPI_SWIGLU_BF16) {
                bf16 *crow = static_cast<bf16 *>(p.C) + (size_t)r * p.ldc;
#pragma unroll
                for (int j = 0; j < NT / 2; j++) {
                    const int c = blockIdx.y * 64 + wn * (WN / 2) + j * 8 + (lane & 3) * 2;
                    float h0 = silu_f(acc[mt][2 * j][hr * 2]) * acc[mt][2 * j + 1][hr * 2];
                    float h1 = silu_f(acc[mt][2 * j][hr * 2 + 1]) * acc[mt][2 * j + 1][hr * 2 + 1];
                    if (c + 1 < p.N)
                        *reinterpret_cast<__nv_bfloat162 *>(crow + c) =
                            __floats2bfloat162_rn(h0, h1);
                    else if (c < p.N)
                        crow[c] = __float2bfloat16(h0);
                }
            } else {
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const int c = blockIdx.y * BN + wn * WN + nt * 8 + (lane & 3) * 2;
                    const float v0 = acc[mt][nt][hr * 2], v1 = acc[mt][nt][hr * 2 + 1];
                    if (EPI == EPI_BF16) {
                        bf16 *crow = static_cast<bf16 *>(p.C) + (size_t)r * p.ldc;
                        if (c + 1 < p.N)
                            *reinterpret_cast<__nv_bfloat162 *>(crow + c) =
                                __floats2bfloat162_rn(v0, v1);
                        else if (c < p.N)
                            crow[c] = __float2bfloat16(v0);
                    } else {
                        float *crow = static_cast<float *>(p.C) + (size_t)r * p.ldc;
                        if (EPI == EPI_ADD_F32) {
                            if (c < p.N) crow[c] += v0;
                            if (c + 1 < p.N) crow[c + 1] += v1;
                        } else {
                            if (c < p.N) crow[c] = v0;
                            if (c + 1 < p.N) crow[c + 1] = v1;
                        }
                    }
                }
            }
        }
    }
}

// Any layout, any K: one thread per output element. For odd shapes (tiny test models, N = 1).
__device__ float w_at(const wview &w, enum wtype type, int bits, int e, int n, int k) {
    const uint8_t *row = w.data + e * w.ms + n * w.rs;
    switch (type) {
    case WT_F32:
        return reinterpret_cast<const float *>(row)[k];
    case WT_BF16:
        return __bfloat162float(reinterpret_cast<const bf16 *>(row)[k]);
    default: {
        const uint32_t q = q_value(row, bits, k);
        size_t sb = e * w.sbms + n * w.sbrs;
        float s = __bfloat162float(reinterpret_cast<const bf16 *>(w.scales + sb)[k / w.group]);
        float b = __bfloat162float(reinterpret_cast<const bf16 *>(w.biases + sb)[k / w.group]);
        return s * (float)q + b;
    }
    }
}

__global__ void gemm_generic_kernel(const gparams p, enum wtype type, int bits, int epi, int bm) {
    int expert = 0, row0, row_end;
    if (p.tiles) {
        if ((int)blockIdx.x >= *p.n_tiles) return;
        expert = p.tiles[3 * blockIdx.x];
        row0 = p.tiles[3 * blockIdx.x + 1];
        row_end = p.tiles[3 * blockIdx.x + 2];
    } else {
        row0 = blockIdx.x * bm;
        row_end = min(row0 + bm, p.M);
    }
    const int n = blockIdx.y * blockDim.x + threadIdx.x;
    if (n >= p.N) return;
    for (int r = row0; r < row_end; r++) {
        const bf16 *a = p.A + (size_t)(p.a_rows ? p.a_rows[r] : r) * p.lda;
        float s0 = 0.f, s1 = 0.f;
        for (int k = 0; k < p.K; k++) {
            float x = __bfloat162float(a[k]);
            s0 += x * w_at(p.w[0], type, bits, expert, n, k);
            if (epi == EPI_SWIGLU_BF16) s1 += x * w_at(p.w[1], type, bits, expert, n, k);
        }
        if (epi == EPI_SWIGLU_BF16) {
            static_cast<bf16 *>(p.C)[(size_t)r * p.ldc + n] = __float2bfloat16(silu_f(s0) * s1);
        } else if (epi == EPI_BF16) {
            static_cast<bf16 *>(p.C)[(size_t)r * p.ldc + n] = __float2bfloat16(s0);
        } else if (epi == EPI_ADD_F32) {
            static_cast<float *>(p.C)[(size_t)r * p.ldc + n] += s0;
        } else {
            static_cast<float *>(p.C)[(size_t)r * p.ldc + n] = s0;
        }
    }
}

bool aligned16(const void *p, size_t stride) {
    return ((uintptr_t)p % 16) == 0 && stride % 16 == 0;
}

template <int BITS, int BM, int EPI>
int launch_fast(cudaStream_t s, const gparams &p, dim3 grid, struct wren_err *e) {
    constexpr int smem = tile_smem(BM);
    static bool attr_set = false; // per instantiation; setting it twice is harmless
    if (!attr_set) {
        CUDA_CHECK(cudaFuncSetAttribute(gemm_q_kernel<BITS, BM, EPI>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        attr_set = true;
    }
    gemm_q_kernel<BITS, BM, EPI><<<grid, NTHREADS, smem, s>>>(p);
    CUDA_CHECK_LAUNCH();
    return 0;
}

template <int BITS, int BM>
int launch_epi(cudaStream_t s, const gparams &p, dim3 grid, enum gemm_epi epi, struct wren_err *e) {
    switch (epi) {
    case EPI_F32:
        return launch_fast<BITS, BM, EPI_F32>(s, p, grid, e);
    case EPI_BF16:
        return launch_fast<BITS, BM, EPI_BF16>(s, p, grid, e);
    case EPI_ADD_F32:
        return launch_fast<BITS, BM, EPI_ADD_F32>(s, p, grid, e);
    default:
        return launch_fast<BITS, BM, EPI_SWIGLU_BF16>(s, p, grid, e);
    }
}

template <int BITS>
int launch_bm(cudaStream_t s, const gparams &p, dim3 grid, int bm, enum gemm_epi epi,
              struct wren_err *e) {
    if (bm == 64) return launch_epi<BITS, 64>(s, p, grid, epi, e);
    if (bm == 256) return launch_epi<BITS, 256>(s, p, grid, epi, e);
    return launch_epi<BITS, 128>(s, p, grid, epi, e);
}

int g_force_bm = 0;
size_t g_smem_optin = 0; // 0: query the current device

// The shared memory a block may use (0 when it cannot be queried).
size_t smem_optin() {
    if (!g_smem_optin) {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess)
            g_smem_optin = (size_t)v;
        else
            cudaGetLastError(); // unknown limit: no tall tiles; the next launch check must pass
    }
    return g_smem_optin;
}

// Whether 256-row tiles (128 KB of shared memory) fit the device: not on consumer GPUs (99 KB).
bool tall_tiles_fit() {
    return (size_t)tile_smem(256) <= smem_optin();
}

// Tile height of a dense GEMM: 256 when that still gives two waves of blocks (and fits), else
// 128 (64 for a few rows).
int dense_bm(int M, int N) {
    if (g_force_bm) return g_force_bm;
    const int sms = pf_device_sms();
    const int nb = (N + BN - 1) / BN;
    if (M >= 512 && (M + 255) / 256 * nb >= 2 * sms && tall_tiles_fit()) return 256;
    return M <= 64 ? 64 : 128;
}

} // namespace

void pf_gemm_force_bm(int bm) {
    g_force_bm = bm;
}

// Measured on the H200 (bench/RESULTS.md): 64-row tiles win only below ~32 rows per expert. The
// wgmma kernel sizes its tile width from each tile's rows, so it takes whole experts (up to 256,
// or 128 with its 256-row work items).
int pf_gemm_group_bm(int avg_rows) {
    if (g_force_bm) return g_force_bm;
    if (pf_gemm_wg_available()) return pf_gemm_wg_group_bm(avg_rows);
    return avg_rows < 48 ? 64 : avg_rows >= 512 && tall_tiles_fit() ? 256 : 128;
}

void pf_gemm_set_smem_optin(size_t bytes) {
    g_smem_optin = bytes;
}

int pf_gemm(cudaStream_t s, const bf16 *A, int lda, int M, const struct dmat *W,
            const struct dmat *Wup, void *C, int ldc, enum gemm_epi epi,
            const struct gemm_group *grp, struct wren_err *e) {
    if (M <= 0) return 0;
    if (epi == EPI_SWIGLU_BF16 &&
        (!Wup || Wup->type != W->type || Wup->rows != W->rows || Wup->cols != W->cols ||
         Wup->bits != W->bits || Wup->group != W->group))
        return wren_errf(e, "gemm: SwiGLU needs gate and up matrices of one shape and format");
    // a few rows: the GEMV-style kernel (gemm_small.cu)
    if (pf_gemm_small_fits(A, lda, M, W, Wup, epi, grp, smem_optin()))
        return pf_gemm_small(s, A, lda, M, W, Wup, C, ldc, epi, e);
    // Hopper: the wgmma kernel (gemm_wg.cu) for every 4-bit GEMM it supports, grouped and dense
    // (1.3-2x this kernel's rate, bench/RESULTS.md)
    if (pf_gemm_wg_fits(A, lda, M, W, Wup, ldc, epi, grp))
        return pf_gemm_wg(s, A, lda, M, W, Wup, C, ldc, epi, grp, e);
    gparams p;
    set_gemm_in(p, A, lda, M, W, Wup, grp);
    p.C = C;
    p.ldc = ldc;
    p.tiles = grp ? grp->tiles : nullptr;
    p.n_tiles = grp ? grp->n_tiles : nullptr;
    const int bm = grp ? grp->bm : dense_bm(M, W->rows);
    const int n_mtiles = grp ? grp->max_tiles : (M + bm - 1) / bm;
    if (n_mtiles <= 0) return 0;

    const bool quant = W->type == WT_Q4 || W->type == WT_Q8;
    const int bits = W->type == WT_Q4 ? 4 : W->type == WT_Q8 ? 8 : 16;
    bool fast = (quant || W->type == WT_BF16) && p.K % BK == 0 &&
                (bm == 64 || bm == 128 || bm == 256) && lda % 8 == 0 && ((uintptr_t)A % 16) == 0 &&
                aligned16(W->data, W->row_stride) && (W->n <= 1 || W->mat_stride % 16 == 0) &&
                (!Wup || aligned16(Wup->data, Wup->row_stride)) && ldc % 2 == 0;
    if (quant)
        fast = fast && (W->bits == 4 || W->bits == 8) && W->group % 32 == 0 && pow2(W->group);
    p.splits = 1;
    p.part = nullptr;
    if (fast) {
        dim3 grid(n_mtiles, epi == EPI_SWIGLU_BF16 ? (p.N + 63) / 64 : (p.N + BN - 1) / BN);
        if (!grp) // two CTAs per SM below 256-row tiles
            grid.z = p.splits =
                pf_gemm_split_parts(grid.x * grid.y, bm == 256 ? 1 : 2, p.K / BK, M, p.N, epi);
        p.part = pf_gemm_split_ws();
        int rc = bits == 4   ? launch_bm<4>(s, p, grid, bm, epi, e)
                 : bits == 8 ? launch_bm<8>(s, p, grid, bm, epi, e)
                             : launch_bm<16>(s, p, grid, bm, epi, e);
        if (rc || p.splits == 1) return rc;
        return pf_gemm_split_reduce(s, p.splits, M, p.N, C, ldc, epi, e);
    }
    dim3 grid(n_mtiles, (p.N + 127) / 128);
    gemm_generic_kernel<<<grid, 128, 0, s>>>(p, W->type, W->bits, (int)epi, bm);
    CUDA_CHECK_LAUNCH();
    return 0;
}
