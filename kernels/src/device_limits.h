// Host-side queries of the current device's limits, for launchers that pick a launch shape by
// them (lm_head.cu, attention_prefill.cu). Internal to kernels/src.
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

}  // namespace qf::kern
