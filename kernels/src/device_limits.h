// Host-side queries of the current device's limits, for launchers that pick a launch shape by
// them (lm_head.cu, attention.cu, attention_prefill.cu). Internal to kernels/src.
#pragma once

#include <cuda_runtime.h>

namespace qf::kern {

// Shared memory a block may opt in to on the current device, in bytes; 0 where it cannot be
// queried (the error is cleared: the caller's launch reports its own).
inline int max_smem_optin() {
  int device = 0, smem = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return smem;
}

// The current device's SM count; 0 where it cannot be queried (the error left for the caller:
// cudaGetLastError() returns it).
inline int sm_count() {
  int device = 0, n_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 0;
  }
  return n_sm;
}

}  // namespace qf::kern
