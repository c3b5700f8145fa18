// Structural validation of a checkpoint: every file parses, the index and the files agree,
// and (optionally) every byte matches the checksum manifest. Collects every problem.
// Model-aware checks (expected tensor set, formats vs quantization_config) build on this.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

#include "qf/ckpt/problem.h"
#include "qf/ckpt/progress.h"

namespace qf::ckpt {

class Checkpoint;

struct ValidateOptions {
  // Verify the manifest if one exists; otherwise create it, but only for a valid checkpoint.
  bool checksums = false;
  int threads = 0;               // hashing threads; 0 = hardware concurrency
  Progress* progress = nullptr;  // bytes hashed / to hash
  // Further checks on the opened checkpoint (model-aware ones live above libckpt), run after the
  // structural checks and before checksums; they append to the problem list.
  std::function<void(const Checkpoint&, std::vector<Problem>&)> extra_checks;
};

enum class ChecksumAction { kNone, kVerified, kCreated, kNotCreated };

struct ValidateReport {
  std::vector<Problem> problems;  // in discovery order; empty means valid
  size_t n_model_files = 0;       // .safetensors files that belong to the model
  size_t n_files = 0;             // every file in the listing
  size_t n_tensors = 0;
  uint64_t tensor_bytes = 0;
  ChecksumAction checksums = ChecksumAction::kNone;
  std::filesystem::path manifest_path;
  uint64_t hashed_bytes = 0;
  double hash_seconds = 0;

  bool ok() const { return problems.empty(); }
};

// Where the manifest of `path` lives: DIR/qforge-manifest.json for a directory, and
// FILE.qforge-manifest.json beside a single file.
std::filesystem::path manifest_path_for(const std::filesystem::path& path);

// Throws only Error(kIo) (unreadable directory, failed manifest write); every rule violation
// is a Problem in the report.
ValidateReport validate_checkpoint(const std::filesystem::path& path,
                                   const ValidateOptions& options);

}  // namespace qf::ckpt
