// Device helpers shared by the token mixers (gdn.cu, attention.cu) and moe_shared.cuh. Scalar
// functions spell out the same formulas as runtime/src/cpu_engine.cpp so the kernels and their
// _ref twins agree up to libm ulps and summation order. Reductions use fixed shuffle trees:
// results are deterministic.
#pragma once

#include <cuda_runtime.h>

namespace qf::kern::mixer {

__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}
__device__ __forceinline__ float silu(float x) {
  return x * sigmoid(x);
}
__device__ __forceinline__ float softplus(float x) {  // threshold 20, as torch and the CPU engine
  return x > 20.0f ? x : log1pf(expf(x));
}

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum of `v` over the block, returned to every thread. blockDim.x must be a multiple of 32;
// `smem` holds 32 doubles. Ends with a barrier, so the caller may reuse smem and may rely on
// shared-memory writes made before the call being visible after it.
__device__ __forceinline__ double block_sum(double v, double* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < n_warps; ++w) total += smem[w];
  __syncthreads();
  return total;
}

}  // namespace qf::kern::mixer
