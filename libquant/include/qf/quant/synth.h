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

// The model a synthetic checkpoint describes: `config` cut to the emitted layers, without MTP
// or vision when they are left out (so the written config.json matches the tensors).
ckpt::Qwen35Config effective_config(const ckpt::Qwen35Config& config, const SynthOptions& options);

// config.json (+ quantization_config.json for intel-int4) of a checkpoint in options.layout.
void write_configs(const std::filesystem::path& dir, const ckpt::Qwen35Config& config,
                   const SynthOptions& options);

// Quantizes a Qwen3.5-MoE checkpoint in the bf16 layout (Qwen's release, or `synth --layout
// bf16`) into options.layout (intel-int4: AutoRound-compatible RTN; qwen-fp8: block FP8 as
// transformers quantizes), so that one BF16 model yields consistent sources for build-hybrid.
// Fused 3-D experts are split per expert (gate rows first); F32 tensors the target stores as
// BF16 are rounded to nearest even; everything else is copied byte for byte. Other files of
// the source (tokenizer, generation config) are copied. Reads the source through its mapping
// and releases each tensor's pages after use, so memory stays bounded by the largest module.
// Throws Error(kTensorNotFound / kUnsupported) naming the source tensor that is missing or of
// the wrong shape or dtype.
SynthPlan synth_from_checkpoint(const std::filesystem::path& source_dir,
                                const std::filesystem::path& out_dir, const SynthOptions& options,
                                ckpt::Progress* progress = nullptr);

}  // namespace qf::quant
