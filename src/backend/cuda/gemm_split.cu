// Split-K for dense GEMMs of few work items. A prompt of a few hundred tokens gives the tiled
// kernels one row tile, so a projection with few weight-row blocks (out_proj: 16 of 128 rows, the
// shared expert's gate/up: 8, DeltaNet b/a: 1) ran 8-97 CTAs on 132 SMs, each walking all 32-64
// k-tiles in sequence. Split in S parts along K, each CTA writes its raw f32 partial sums to a
// workspace [S][M][ldp] and one small kernel adds the S parts in order and applies the epilogue,
// so results do not depend on which CTA finishes first.
#include "backend/cuda/prefill.cuh"

namespace {

float *g_ws = nullptr;
size_t g_ws_bytes = 0;
int g_force = 0; // 0 automatic, 1 never split, S >= 2: split in S parts wherever K allows

// Each part walks at least this many 64-wide k-tiles: below that the per-CTA start (first loads,
// scales) is most of the work.
constexpr int MIN_KT_PER_PART = 4;
constexpr int MAX_PARTS = 16;

} // namespace

int pf_device_sms() {
    static int sms = 0;
    if (!sms) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
            cudaGetLastError(); // only a heuristic's input: guess, and keep launch checks clean
            sms = 100;
        }
    }
    return sms;
}

namespace {

// One thread per output element (row m, column n): the S parts summed in order 0..S-1.
__global__ void split_reduce_kernel(const float *part, int S, int M, int N, int ldp, void *C,
                                    int ldc, int epi) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)M * N) return;
    const int m = (int)(i / N), n = (int)(i - (long)m * N);
    const size_t stride = (size_t)M * ldp;
    const float *p = part + (size_t)m * ldp + n;
    float v = 0.f;
    for (int s = 0; s < S; s++) v += p[s * stride];
    const size_t o = (size_t)m * ldc + n;
    switch (epi) {
    case EPI_F32:
        static_cast<float *>(C)[o] = v;
        break;
    case EPI_ADD_F32:
        static_cast<float *>(C)[o] += v;
        break;
    case EPI_BF16:
        static_cast<bf16 *>(C)[o] = __float2bfloat16(v);
        break;
    default: { // SwiGLU: gate in columns [0, N), up in [N, 2N)
        float u = 0.f;
        for (int s = 0; s < S; s++) u += p[s * stride + N];
        static_cast<bf16 *>(C)[o] = __float2bfloat16(silu_f(v) * u);
    }
    }
}

} // namespace

void pf_gemm_set_split_ws(float *ws, size_t bytes) {
    g_ws = ws;
    g_ws_bytes = ws ? bytes : 0;
}

size_t pf_gemm_split_ws_bytes() {
    return (size_t)pf_device_sms() * PF_SPLIT_WS_FLOATS_PER_SM * sizeof(float);
}

void pf_gemm_split_force(int parts) {
    g_force = parts < 0 ? 0 : parts;
}

float *pf_gemm_split_ws() {
    return g_ws;
}

int pf_gemm_split_parts(int ctas, int ctas_per_wave, int KT, int M, int N, enum gemm_epi epi) {
    if (!g_ws || g_force == 1 || ctas <= 0) return 1;
    int S = g_force ? g_force : ctas_per_wave * pf_device_sms() / ctas;
    S = S < MAX_PARTS ? S : MAX_PARTS;
    const int kmax = g_force ? KT : KT / MIN_KT_PER_PART;
    S = S < kmax ? S : kmax;
    const size_t ldp = (size_t)N * (epi == EPI_SWIGLU_BF16 ? 2 : 1);
    while (S > 1 && (size_t)S * M * ldp * sizeof(float) > g_ws_bytes) S--;
    return S > 1 ? S : 1;
}

int pf_gemm_split_reduce(cudaStream_t s, int S, int M, int N, void *C, int ldc, enum gemm_epi epi,
                         struct wren_err *e) {
    const int ldp = N * (epi == EPI_SWIGLU_BF16 ? 2 : 1);
    const long n = (long)M * N;
    const int threads = 256;
    split_reduce_kernel<<<(unsigned)((n + threads - 1) / threads), threads, 0, s>>>(
        g_ws, S, M, N, ldp, C, ldc, (int)epi);
    CUDA_CHECK_LAUNCH();
    return 0;
}
