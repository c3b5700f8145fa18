// Checksums: XXH3-64 (seed 0) per file and per tensor, and the manifest that records them.
//
// The file hash is the plain XXH3-64 of the file's bytes, so `xxhsum -H3 FILE` reproduces it.
// The tensor hash is XXH3-64 of the tensor's data bytes, so a corrupted or changed tensor is
// named, and tools that copy tensors unchanged can carry the hash over.
//
// Manifest (qforge-manifest.json, deterministic, keys sorted):
//   {"format": "qforge-manifest", "version": 1, "hash": "xxh3-64",
//    "files": {"<name>": {"size": N, "xxh3": "<16 hex>", "tensors": {"<tensor>": "<16 hex>"}}}}
// "tensors" appears for .safetensors files whose header is valid.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "qf/ckpt/problem.h"
#include "qf/ckpt/progress.h"
#include "qf/ckpt/safetensors.h"

namespace qf::ckpt {

struct FileDigest {
  std::string name;  // relative to the checkpoint directory
  uint64_t size = 0;
  uint64_t xxh3 = 0;
  bool has_tensors = false;
  std::vector<std::pair<std::string, uint64_t>> tensors;  // sorted by tensor name
};

struct Manifest {
  std::vector<FileDigest> files;  // sorted by name
};

struct DigestJob {
  std::filesystem::path path;
  std::string name;
  const Header* header = nullptr;  // a valid header: also hash each tensor; nullptr: file only
};

// Hashes one file from a read-only mapping, window by window (RSS stays flat). Adds the file's
// bytes to progress->done when progress is given. Throws Error(kIo).
FileDigest digest_file(const DigestJob& job, Progress* progress = nullptr);

// Hashes many files on `threads` threads (0: hardware concurrency), largest first; the file
// hash and the tensor hashes of one file are separate tasks. Results are sorted by name.
Manifest digest_files(const std::vector<DigestJob>& jobs, int threads, Progress* progress);

// Hashes a safetensors file while it is produced, from its bytes in file order: the same file
// and tensor hashes digest_file gives for the finished file, without reading it back.
class StreamHasher {
 public:
  // `layout`: the tensors in data order (a writer's plan); must outlive the hasher.
  StreamHasher(std::string name, const std::vector<TensorInfo>& layout);
  ~StreamHasher();
  StreamHasher(const StreamHasher&) = delete;
  StreamHasher& operator=(const StreamHasher&) = delete;

  void header(const void* p, size_t n);  // bytes before the data section
  void data(const void* p, size_t n);    // the next bytes of the data section
  FileDigest finish();                   // after the last byte

 private:
  struct State;
  std::unique_ptr<State> s_;
};

std::string serialize_manifest(const Manifest& manifest);
// Throws Error(kManifestInvalid) naming what is wrong.
Manifest parse_manifest(std::string_view text);

// Every difference between what the manifest records and what was measured now:
// kManifestMissingFile, kManifestExtraFile, kChecksumMismatch (per file and per tensor).
std::vector<Problem> compare_manifests(const Manifest& recorded, const Manifest& measured);

std::string hex64(uint64_t v);

}  // namespace qf::ckpt
