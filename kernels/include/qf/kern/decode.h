// Decoding narrow float codes to f32: BF16, F16, FP8 E4M3FN, FP8 E5M2.
// The device kernel and its CPU twin both apply the scalar decoders of qf/quant/formats.h, so
// host and device agree bit for bit (NaN payloads included). Test: tests/kernels/decode_test.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace qf::kern {

enum class CodeFormat {
  kBf16,    // 2 bytes per code
  kF16,     // 2 bytes per code
  kE4M3fn,  // 1 byte per code (safetensors F8_E4M3)
  kE5M2,    // 1 byte per code (safetensors F8_E5M2)
};

// out[i] = decode(codes[i]) for i < n. `codes` and `out` are device pointers; any alignment of
// codes to its element size. Stream-ordered, allocates nothing; returns the launch error.
cudaError_t decode_to_f32(CodeFormat format, const void* codes, size_t n, float* out,
                          cudaStream_t stream);

// CPU twin of decode_to_f32 on host pointers.
void decode_to_f32_ref(CodeFormat format, const void* codes, size_t n, float* out);

}  // namespace qf::kern
