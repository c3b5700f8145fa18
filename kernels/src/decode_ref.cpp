// CPU twin of decode.cu (same scalar decoders from formats.h).
#include <cstdint>

#include "qf/kern/decode.h"
#include "qf/quant/formats.h"

namespace qf::kern {

void decode_to_f32_ref(CodeFormat format, const void* codes, size_t n, float* out) {
  const auto* c16 = static_cast<const uint16_t*>(codes);
  const auto* c8 = static_cast<const uint8_t*>(codes);
  for (size_t i = 0; i < n; ++i) {
    switch (format) {
      case CodeFormat::kBf16:
        out[i] = quant::bf16_to_f32(c16[i]);
        break;
      case CodeFormat::kF16:
        out[i] = quant::f16_to_f32(c16[i]);
        break;
      case CodeFormat::kE4M3fn:
        out[i] = quant::e4m3fn_to_f32(c8[i]);
        break;
      case CodeFormat::kE5M2:
        out[i] = quant::e5m2_to_f32(c8[i]);
        break;
    }
  }
}

}  // namespace qf::kern
