// Deterministic synthetic Qwen3.5-MoE checkpoints in the released layouts.
//
// Names, dtypes and shapes come from the schema (qf/ckpt/qwen35_schema.h); values come from a
// counter-based generator keyed by (seed, tensor name, element index), so output bytes do not
// depend on thread count, chunking or platform. Streams through fixed buffers: memory does not
// grow with model size.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "qf/ckpt/progress.h"
#include "qf/ckpt/qwen35_schema.h"

namespace qf::quant {

enum class SynthValues {
  kZeros,   // every weight zero (sparse files); format constants (qzeros) still correct
  kRandom,  // plausible magnitudes per tensor role
};

struct SynthOptions {
  ckpt::Qwen35Layout layout = ckpt::Qwen35Layout::kBf16;
  ckpt::SchemaOptions schema;
  SynthValues values = SynthValues::kRandom;
  uint64_t seed = 0;
  uint64_t shard_bytes = 5ull << 30;  // HF-style greedy split...
  size_t shards = 0;                  // ...or exactly this many shards when > 0
  bool overwrite = false;
  int threads = 0;  // 0: hardware concurrency
};

struct SynthFile {
  std::string name;
  size_t n_tensors = 0;
  uint64_t tensor_bytes = 0;
};

struct SynthPlan {
  std::vector<ckpt::TensorDecl> tensors;
  std::vector<size_t> file_of;  // index into files, per tensor
  std::vector<SynthFile> files;
  uint64_t tensor_bytes = 0;
};

// Which tensor goes to which file (main shards, then the MTP sidecar for intel-int4).
SynthPlan plan_synth(const ckpt::Qwen35Config& config, const SynthOptions& options);

// Fills `out` with bytes [offset, offset + out.size()) of tensor `decl`'s data.
void synth_tensor_bytes(const ckpt::TensorDecl& decl, SynthValues values, uint64_t seed,
                        uint64_t offset, std::span<std::byte> out);

// Writes the checkpoint into `out_dir` (staged in "<out_dir>.tmp", renamed at the end): shards,
// sidecar, index, config.json (+ quantization_config.json for intel-int4). Refuses an existing
// out_dir unless overwrite. progress counts tensor bytes.
SynthPlan synth_checkpoint(const ckpt::Qwen35Config& config, const std::filesystem::path& out_dir,
                           const SynthOptions& options, ckpt::Progress* progress = nullptr);

// The quantization_config object a layout's config.json carries ("" for bf16).
std::string synth_quantization_config(const ckpt::Qwen35Config& config,
                                      const SynthOptions& options);

}  // namespace qf::quant
