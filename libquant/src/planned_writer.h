// Internal: writes a planned checkpoint (SynthPlan) through a staging directory, one file per
// thread, with a caller-supplied producer for each tensor's bytes. Shared by synth and
// synth --from.
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>

#include "qf/ckpt/progress.h"
#include "qf/ckpt/writer.h"
#include "qf/quant/matrix.h"
#include "qf/quant/synth.h"

namespace qf::quant::detail {

struct ByteSource {
  int fd = -1;  // readable
  uint64_t offset = 0;
  const std::filesystem::path* path = nullptr;  // for errors
};

struct PlannedWrite {
  bool overwrite = false;
  bool sparse_zeros = false;  // WriterOptions::sparse_zeros for every file
  bool hash = false;          // hash while writing; digests land in `digests` (sorted by name)
  bool clone = false;         // WriterOptions::clone for every file
  int threads = 0;            // files written in parallel; 0 = hardware concurrency
  std::vector<ckpt::FileDigest>* digests = nullptr;
  // The layout of file f given its tensors in plan order; unset: plan_safetensors (sorted).
  std::function<ckpt::HeaderPlan(size_t f, std::vector<ckpt::TensorSpec> tensors)> layout;
  std::atomic<uint64_t>* cloned_bytes = nullptr;  // adds the bytes that share source blocks
  // For a producer that copies every tensor unchanged from a file: where tensor `decl`'s bytes
  // are read from. With hash, two threads a file and sources that are not sparse, each file's
  // digest is then computed from those bytes by a task of its own, beside the task writing the
  // file (which the kernel then copies, no longer through the writer's buffer), instead of in
  // the writing thread's path.
  std::function<ByteSource(const ckpt::TensorDecl& decl)> source;
};

// Appends the bytes of tensor `decl` to `w` (exactly its planned size). Called on the thread
// that writes the file, in the writer's order. Must add the bytes it wrote to progress.
using TensorProducer =
    std::function<void(const ckpt::TensorDecl& decl, ckpt::SafetensorsWriter& w)>;

// Writes every file of `plan` and the index into "<out_dir>.tmp", then calls finish(stage) for
// the other files (configs, tokenizer), then renames the staging directory to out_dir.
// Refuses an existing out_dir unless overwrite; on failure removes the staging directory.
void write_planned_checkpoint(const SynthPlan& plan, const std::filesystem::path& out_dir,
                              const PlannedWrite& options, const TensorProducer& produce,
                              const std::function<void(const std::filesystem::path&)>& finish);

// Appends the float values of `v` (all rows) to `w` as `dtype` (F32, F16 or BF16; exact widening
// or round to nearest even), a chunk at a time.
void write_converted(const MatrixView& v, ckpt::DType dtype, ckpt::SafetensorsWriter& w);

// Writes <stage>/qforge-manifest.json from the digests of the safetensors files (hashed while
// written) and a fresh digest of every other file in `stage`.
void write_stage_manifest(const std::filesystem::path& stage,
                          std::vector<ckpt::FileDigest> safetensors_digests);

}  // namespace qf::quant::detail
