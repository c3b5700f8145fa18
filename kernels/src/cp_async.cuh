// cp.async (Ampere's LDGSTS: sm_80 and later, sm_90 and sm_121 alike): 16 bytes from global to
// shared memory without a register, through L2 only (.cg), in groups the thread waits for; and
// the GEMMs' pipeline over K (gemm_int4.cu, gemm_fp8.cu). Internal to kernels/src.
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

// Segments 0 .. n - 1 through kStages shared-memory buffers, kStages - 1 ahead: fill(s, buf)
// issues segment s's copies into buffer buf as one commit group (an empty group for s >= n),
// body(s, buf) uses them once every thread's copies of segment s have landed. The whole block
// calls it; on return every copy has landed and every thread is done with the buffers.
template <int kStages, class Fill, class Body>
__device__ __forceinline__ void pipeline(int n, const Fill& fill, const Body& body) {
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) fill(s, s);
#pragma unroll 1
  for (int s = 0; s < n; ++s) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // segment s landed; every thread is done with the buffer refilled next
    fill(s + kStages - 1, (s + kStages - 1) % kStages);
    body(s, s % kStages);
  }
  cp_async_wait<0>();
  __syncthreads();
}

}  // namespace qf::kern::gemv_detail
