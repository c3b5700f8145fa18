// The f16 warp MMA (mma.sync.m16n8k16, f32 accumulators: Ampere's, so sm_90 and sm_121 alike),
// shared by the FP8 GEMM (gemm_fp8.cu) and the tensor-core attention prefill
// (attention_prefill.cu). Internal to kernels/src.
#pragma once

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

}  // namespace qf::kern::gemv_detail
