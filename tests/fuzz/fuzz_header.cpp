// libFuzzer target for the safetensors header parser (the file's bytes, as a whole file).
// Run: make fuzz FUZZ_SECONDS=300 (clang, ASan + UBSan; corpora in build-fuzz/corpus/NAME).
// The parser must never crash, hang or read out of bounds, and every problem it reports must
// carry a known code.
#include <cstddef>
#include <cstdint>

#include "qf/ckpt/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto bytes = reinterpret_cast<const std::byte*>(data);
  const qf::ckpt::HeaderParse p = qf::ckpt::parse_header({bytes, size}, size);
  for (const qf::ckpt::Problem& pr : p.problems) {
    if (static_cast<int>(pr.code) >= qf::kNumErrc) __builtin_trap();
  }
  // A header without problems must describe tensors that lie inside the file.
  if (p.problems.empty()) {
    for (const qf::ckpt::TensorInfo& t : p.header.tensors) {
      if (t.end > p.header.data_bytes || t.begin > t.end) __builtin_trap();
    }
  }
  return 0;
}
