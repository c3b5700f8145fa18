// cp.async (Ampere's LDGSTS: sm_80 and later, sm_90 and sm_121 alike): 16 bytes from global to
// shared memory without a register, through L2 only (.cg), in groups the thread waits for.
// The GEMMs' pipelines (gemm_int4.cu, gemm_fp8.cu). Internal to kernels/src.
#pragma once

#include <cuda_runtime.h>

namespace qf::kern::gemv_detail {

// src_bytes 0 writes 16 zero bytes (nothing is read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes = 16) {
  const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

}  // namespace qf::kern::gemv_detail
