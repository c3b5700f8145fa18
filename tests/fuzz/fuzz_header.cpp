// libFuzzer target for the safetensors header parser (the file's bytes, as a whole file).
// Run: make fuzz FUZZ_SECONDS=300 (clang, ASan + UBSan; corpora in build-fuzz/corpus/NAME).
// The parser must never crash, hang or read out of bounds, and every problem it reports must
// carry a known code. A header without problems must describe tensors inside the file, each of
// the bytes the writer gives its dtype and shape (tensor_bytes); and the writer's header for the
// same tensors and metadata (plan_safetensors) must parse clean to the same names, dtypes,
// shapes and metadata, the writer's escaping of names and metadata strings included.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <cstring>
#include <optional>
#include <vector>

#include "fuzz_support.h"
#include "qf/ckpt/safetensors.h"
#include "qf/ckpt/writer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto bytes = reinterpret_cast<const std::byte*>(data);
  const qf::ckpt::HeaderParse p = qf::ckpt::parse_header({bytes, size}, size);
  for (const qf::ckpt::Problem& pr : p.problems) {
    QF_FUZZ_CHECK(static_cast<int>(pr.code) < qf::kNumErrc, pr.message);
  }
  // A header without problems must describe tensors that lie inside the file.
  if (!p.problems.empty()) return 0;
  std::vector<qf::ckpt::TensorSpec> specs;
  for (const qf::ckpt::TensorInfo& t : p.header.tensors) {
    QF_FUZZ_CHECK(t.end <= p.header.data_bytes && t.begin <= t.end, t.name);
    specs.push_back({t.name, t.dtype, t.shape});
    QF_FUZZ_CHECK(qf::ckpt::tensor_bytes(specs.back()) == t.n_bytes(), t.name);
  }
  const std::optional<qf::ckpt::Metadata> meta =
      p.header.has_metadata ? std::optional(p.header.metadata) : std::nullopt;
  const qf::ckpt::HeaderPlan plan = qf::ckpt::plan_safetensors(specs, meta);
  std::vector<std::byte> file(8 + plan.header.size());
  const uint64_t n = plan.header.size();
  for (int i = 0; i < 8; ++i) file[i] = static_cast<std::byte>(n >> (8 * i) & 0xFF);
  std::memcpy(file.data() + 8, plan.header.data(), plan.header.size());
  const qf::ckpt::HeaderParse q = qf::ckpt::parse_header(file, plan.file_bytes());
  QF_FUZZ_CHECK(q.problems.empty(), q.problems.empty() ? "" : q.problems[0].message);
  QF_FUZZ_CHECK(q.header.metadata == p.header.metadata &&
                    q.header.has_metadata == p.header.has_metadata &&
                    q.header.tensors.size() == p.header.tensors.size(),
                plan.header);
  for (const qf::ckpt::TensorInfo& t : q.header.tensors) {
    const auto same = [&](const qf::ckpt::TensorSpec& s) {
      return s.name == t.name && s.dtype == t.dtype && s.shape == t.shape;
    };
    QF_FUZZ_CHECK(std::any_of(specs.begin(), specs.end(), same), t.name);
  }
  return 0;
}
