// A checkpoint: a directory (config.json, quantization_config.json, the index, shards, sidecars
// such as model_extra_tensors.safetensors, tokenizer and other files) or a single .safetensors
// file. Tensor names resolve across all files the index references.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "qf/ckpt/index.h"
#include "qf/ckpt/problem.h"
#include "qf/ckpt/safetensors.h"

namespace qf::ckpt {

// Checksum manifest written by `qforge validate --checksums` (see checksum.h).
inline constexpr std::string_view kManifestFileName = "qforge-manifest.json";

enum class FileRole {
  kShard,        // model-00001-of-00014.safetensors, or the single model.safetensors
  kSidecar,      // another .safetensors file the index references (model_extra_tensors...)
  kStray,        // a .safetensors file the index does not reference (loaders disagree on it)
  kIndex,        // model.safetensors.index.json
  kConfig,       // config.json
  kQuantConfig,  // quantization_config.json
  kManifest,     // qforge-manifest.json (checksums)
  kTokenizer,    // tokenizer, chat template, generation and preprocessor configs
  kOther,
};
std::string_view file_role_name(FileRole role);

struct CheckpointFile {
  std::string name;  // relative to root()
  FileRole role;
  uint64_t size = 0;
};

struct TensorRef {
  const SafetensorsFile* file;
  const TensorInfo* info;
};

class Checkpoint {
 public:
  // Fails fast: throws Error for the first problem that makes tensor lookup wrong or ambiguous
  // (unreadable headers, index entries that do not resolve, duplicates across files). A stale
  // total_size or a stray file does not stop loading; `qforge validate` reports those.
  static Checkpoint open(const std::filesystem::path& path);
  // Opens everything it can and appends every problem found; throws only Error(kIo).
  static Checkpoint open_collect(const std::filesystem::path& path, std::vector<Problem>& problems);

  // Directory holding the files (for a single file: its parent directory).
  const std::filesystem::path& root() const { return root_; }
  bool is_single_file() const { return single_file_; }
  const std::optional<ShardIndex>& index() const { return index_; }
  // Files that hold the checkpoint's tensors (index-referenced; or the single file; or, with no
  // index, every .safetensors file), sorted by name.
  const std::vector<SafetensorsFile>& tensor_files() const { return files_; }
  // Stray .safetensors files, parsed so their headers can be checked and hashed.
  const std::vector<SafetensorsFile>& stray_files() const { return strays_; }
  // Every regular file in the directory (dotfiles and subdirectories excluded), sorted by name.
  const std::vector<CheckpointFile>& listing() const { return listing_; }

  const TensorRef* find(std::string_view name) const;
  // Throws Error(kTensorNotFound).
  TensorView view(std::string_view name) const;
  size_t n_tensors() const { return by_name_.size(); }
  // Sum of tensor data bytes over tensor_files() (what metadata.total_size must say).
  uint64_t tensor_bytes() const { return tensor_bytes_; }
  // Name of a file relative to root().
  std::string file_name(const SafetensorsFile& f) const;
  // The first problem (from open_collect) that stops loading, or nullptr: is_loader_fatal codes,
  // except header problems of stray files, which no loader reads.
  const Problem* first_fatal(const std::vector<Problem>& problems) const;

 private:
  Checkpoint() = default;

  std::filesystem::path root_;
  bool single_file_ = false;
  std::optional<ShardIndex> index_;
  std::vector<SafetensorsFile> files_;
  std::vector<SafetensorsFile> strays_;
  std::vector<CheckpointFile> listing_;
  std::unordered_map<std::string_view, TensorRef> by_name_;
  uint64_t tensor_bytes_ = 0;
};

// True for problems after which name lookups could return the wrong bytes.
bool is_loader_fatal(Errc code);

}  // namespace qf::ckpt
