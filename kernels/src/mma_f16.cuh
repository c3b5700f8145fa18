// The f16 and bf16 warp MMAs (mma.sync.m16n8k16, f32 accumulators: Ampere's, so sm_90 and sm_121
// alike) and the shared-memory matrix loads that feed them (ldmatrix), shared by the FP8 GEMM
// (gemm_fp8.cu) and the tensor-core attention (attention_prefill.cu, attention_decode_mma.cu).
// Internal to kernels/src.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace qf::kern::gemv_detail {

// d += a b: a the 16 x 16 A fragment (row-major), b0 b1 the 16 x 8 B fragment (column-major),
// f16 pairs with the lower column in the low half.
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same with bf16 pairs.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The three bf16 limbs of (a, b) for mma_bf16, packed pairs with a in the low half: each limb
// the rest's bf16 (nearest), the rest less it exact in f32, so a = hi + mid + lo to 2^-24 of |a|
// (f32's precision; below ~2^-110 lo is lost to subnormals).
__device__ __forceinline__ void bf16_limbs3(float a, float b, uint32_t (&w)[3]) {
#pragma unroll
  for (int l = 0; l < 3; ++l) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    const float2 f = __bfloat1622float2(h);
    w[l] = *reinterpret_cast<const uint32_t*>(&h);
    a -= f.x;
    b -= f.y;
  }
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Four 8 x 8 matrices of 16-bit entries, lanes 8i .. 8i + 7 giving matrix i's row addresses
// (16 bytes each); r[i] holds this lane's pair of matrix i (row lane / 4, columns 2 (lane % 4)
// and the next), or with _trans of its transpose.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

}  // namespace qf::kern::gemv_detail
