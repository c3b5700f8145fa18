// The INT8 form of kern::gemm (gemm_int8.cu): the LM head over many rows (prompt scoring), dense
// products only (offsets nullptr), no SwiGLU epilogue. Internal to kernels/src; gemm.h
// dispatches to it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "qf/kern/gemm.h"

namespace qf::kern::gemv_detail {

// kInt8, K a multiple of 128 and at most kMaxSmemK, 16-byte aligned rows, groups a power-of-two
// multiple of 128 columns or one per row.
bool gemm_int8_ok(const DeviceLinear& w);
size_t gemm_int8_scratch_bytes(const DeviceLinear& w, const GemmRows& rows);
cudaError_t gemm_int8(const DeviceLinear& w, const float* x, float* y, const GemmRows& rows,
                      void* scratch, cudaStream_t stream);

}  // namespace qf::kern::gemv_detail
