// model.safetensors.index.json: which file holds each tensor of a sharded checkpoint.
//
//   {"metadata": {"total_size": <sum of tensor data bytes>}, "weight_map": {"<tensor>": "<file>"}}
//
// total_size counts tensor bytes only (no length prefixes, no headers). Unknown members of
// "metadata" and of the top-level object are kept verbatim and written back on serialization.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "qf/ckpt/problem.h"

namespace qf::ckpt {

inline constexpr std::string_view kIndexFileName = "model.safetensors.index.json";

struct ShardIndex {
  std::optional<uint64_t> total_size;                           // metadata.total_size
  std::vector<std::pair<std::string, std::string>> weight_map;  // tensor -> file, sorted by tensor
  std::vector<std::pair<std::string, std::string>> extra_metadata;  // other metadata, raw JSON
  std::vector<std::pair<std::string, std::string>> extra_top;       // other members, raw JSON

  // File holding `tensor`, or nullptr (binary search; weight_map must be sorted).
  const std::string* file_of(std::string_view tensor) const;
  // Distinct file names, sorted.
  std::vector<std::string> files() const;
  // Sorts weight_map by tensor name (call after filling it by hand).
  void sort();
};

struct IndexParse {
  ShardIndex index;
  std::vector<Problem> problems;  // kIndexInvalid / kDuplicateName; file field left empty
};

// Parses an index. Malformed JSON or a wrong top-level shape gives one kIndexInvalid problem;
// bad entries (non-string file, path-like file name, a tensor listed twice) are each reported
// and skipped. Never throws on bad input.
IndexParse parse_index(std::string_view text);

// Hugging Face's own format (json.dumps(indent=2, sort_keys=True) + "\n", ASCII-escaped), so
// indexes we rewrite diff cleanly against the ones transformers writes.
std::string serialize_index(const ShardIndex& index);

}  // namespace qf::ckpt
