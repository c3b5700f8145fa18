// The BF16 form of kern::gemm (gemm_bf16.cu): dense or grouped products (the router, the MTP
// head's projections and experts, a BF16 checkpoint's everything), no SwiGLU epilogue. Internal
// to kernels/src; gemm.h dispatches to it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "qf/kern/gemm.h"

namespace qf::kern::gemv_detail {

// kBf16, K a multiple of 8, 16-byte aligned rows and matrices, N * K / 8 < 2^32.
bool gemm_bf16_ok(const DeviceLinear& w);
size_t gemm_bf16_scratch_bytes(const DeviceLinear& w, const GemmRows& rows);
cudaError_t gemm_bf16(const DeviceLinear& w, const float* x, float* y, const GemmRows& rows,
                      void* scratch, cudaStream_t stream);

}  // namespace qf::kern::gemv_detail
