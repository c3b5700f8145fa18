// decode_to_f32: narrow float codes -> f32, one thread per code (a memory-bound elementwise op;
// grid-stride so any n works with a bounded grid). Formats: qf/quant/formats.h.
// Twin: decode_ref.cpp. Test: tests/kernels/decode_test.cpp.
#include <cstdint>

#include "qf/kern/decode.h"
#include "qf/quant/formats.h"

namespace qf::kern {
namespace {

template <CodeFormat kFormat>
__global__ void decode_to_f32_kernel(const void* __restrict__ codes, size_t n,
                                     float* __restrict__ out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if constexpr (kFormat == CodeFormat::kBf16) {
      out[i] = quant::bf16_to_f32(static_cast<const uint16_t*>(codes)[i]);
    } else if constexpr (kFormat == CodeFormat::kF16) {
      out[i] = quant::f16_to_f32(static_cast<const uint16_t*>(codes)[i]);
    } else if constexpr (kFormat == CodeFormat::kE4M3fn) {
      out[i] = quant::e4m3fn_to_f32(static_cast<const uint8_t*>(codes)[i]);
    } else {
      out[i] = quant::e5m2_to_f32(static_cast<const uint8_t*>(codes)[i]);
    }
  }
}

template <CodeFormat kFormat>
cudaError_t launch(const void* codes, size_t n, float* out, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const size_t blocks = (n + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  decode_to_f32_kernel<kFormat><<<grid, kThreads, 0, stream>>>(codes, n, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t decode_to_f32(CodeFormat format, const void* codes, size_t n, float* out,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (format) {
    case CodeFormat::kBf16:
      return launch<CodeFormat::kBf16>(codes, n, out, stream);
    case CodeFormat::kF16:
      return launch<CodeFormat::kF16>(codes, n, out, stream);
    case CodeFormat::kE4M3fn:
      return launch<CodeFormat::kE4M3fn>(codes, n, out, stream);
    case CodeFormat::kE5M2:
      return launch<CodeFormat::kE5M2>(codes, n, out, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace qf::kern
