// The FP8 form of kern::gemm (gemm_fp8.cu): dense products only (offsets nullptr), no SwiGLU
// epilogue. Internal to kernels/src; gemm.h dispatches to it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "qf/kern/gemm.h"

namespace qf::kern::gemv_detail {

// kFp8, K a multiple of 128, N of 16, 128 x 128 scale blocks, 16-byte aligned codes.
bool gemm_fp8_ok(const DeviceLinear& w);
size_t gemm_fp8_scratch_bytes(const DeviceLinear& w, const GemmRows& rows);
cudaError_t gemm_fp8(const DeviceLinear& w, const float* x, float* y, const GemmRows& rows,
                     void* scratch, cudaStream_t stream);

}  // namespace qf::kern::gemv_detail
