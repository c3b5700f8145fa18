// Test helper: copy a checkpoint directory with edits, to build malformed inputs from valid ones.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "qf/ckpt/writer.h"

namespace qf::test {

struct CheckpointEdit {
  std::set<std::string> drop;                      // tensors to leave out
  std::map<std::string, ckpt::TensorSpec> add;     // name -> spec (zero bytes)
  std::map<std::string, ckpt::TensorSpec> retype;  // name -> new spec (zero bytes)
  std::function<void(const std::string& name, std::string& bytes)> patch;  // edit kept bytes
  std::function<void(std::string& config_json)> config;                    // edit config.json text
  bool keep_index_entries = false;  // leave dropped names in the index (index problems)
};

// Copies every file of `in` to `out` (created), rewriting shards per `edit`; added tensors go
// to the first shard. The index is rebuilt from the written shards unless told otherwise.
void copy_checkpoint(const std::filesystem::path& in, const std::filesystem::path& out,
                     const CheckpointEdit& edit);

}  // namespace qf::test
