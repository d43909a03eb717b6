// Tensor-core and async-copy building blocks (sm_80+) shared by the prefill GEMM and flash
// attention: cp.async 16-byte copies, ldmatrix, movmatrix, and the bf16 / f16 m16n8k16 mma with f32
// accumulation.
#pragma once
#include <stdint.h>

static __device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
// 16 bytes global -> shared; pred false copies nothing and zero-fills.
static __device__ __forceinline__ void cp_async16(void *smem, const void *g, bool pred) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(g),
                 "r"(pred ? 16 : 0));
}
// The same with an L2 cache policy (common.cuh, l2_stream).
static __device__ __forceinline__ void cp_async16(void *smem, const void *g, bool pred,
                                                  uint64_t pol) {
    asm volatile(
        "cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(smem_u32(smem)),
        "l"(g), "r"(pred ? 16 : 0), "l"(pol));
}
// Both clobber memory: the compiler must not move shared-memory reads of the copied data above
// the wait, nor plain stores into a stage below the commit that publishes it.
static __device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// mbarriers and 1-D bulk copies (TMA) into shared memory (sm_90+): the streaming lm_head
// (decode_stream.cu) and the fused MoE launch (decode_moe_fused.cu).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
static __device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count));
}
static __device__ __forceinline__ void mbar_expect(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)),
                 "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
static __device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(smem_u32(b)), "r"(parity)
                     : "memory");
    } while (!done);
}
// bytes (a multiple of 16) from src to dst, completing on mbarrier b; pol: an L2 cache policy
// (common.cuh, l2_stream)
static __device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes,
                                                 uint64_t *b, uint64_t pol) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
                 "[%0], [%1], %2, [%3], %4;" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(b)), "l"(pol)
                 : "memory");
}
#endif
static __device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
static __device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
// The transpose of an 8 x 8 b16 matrix held in the mma fragment layout (thread 4 r + c: row r,
// columns 2c, 2c + 1), in the same layout.
static __device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}
// c += a * b for one m16n8k16 tile: a row-major bf16 fragment, b column-major.
static __device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0,
                                                uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// The same with f16 fragments.
static __device__ __forceinline__ void mma_f16(float c[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The 4-bit dequantization's first step, (x & 0x000F000F) | 0x43004300: the low nibbles of both
// halves as bf16 pairs (128 + q) in one LOP3 (written out because LOP3 encodes one immediate, so
// ptxas otherwise splits it into an AND and an OR; the magic stays in a register).
static __device__ __forceinline__ uint32_t nib_bf16x2(uint32_t x) {
    uint32_t d;
    asm("{\n.reg .b32 m;\nmov.b32 m, 0x43004300;\nlop3.b32 %0, %1, 0x000F000F, m, 0xEA;\n}"
        : "=r"(d)
        : "r"(x));
    return d;
}
