// build-hybrid: Intel's AutoRound INT4 checkpoint with every BF16 shared-expert projection
// replaced by the FP8 block-128 weight and weight_scale_inv of Qwen's FP8 release.
//
// Everything else is copied byte for byte (including the MTP sidecar, listed in the rebuilt
// index). Output shards keep the input's names and data order; each replaced weight keeps its
// place and its scale goes to the end of the shard. Unchanged tensors keep their byte positions
// modulo 4 KiB, so on a filesystem that shares extents (XFS, btrfs) they are reflinked rather
// than written: the output then costs the space of the new FP8 tensors only. Streams through the
// kernel or a fixed buffer (memory does not depend on model size), writes through "<out>.tmp" and
// renames at the end, and hashes while writing to produce the checksum manifest.
//
// config.json gains a "qforge" object describing the hybrid (read by qforge's runtime):
//   "qforge": {"hybrid": {"fp8_format": "float8_e4m3fn", "weight_block_size": [128, 128],
//              "scale": "weight_scale_inv", "scale_dtype": "BF16", "modules": [...]}}
// and quantization_config (in config.json and quantization_config.json) is edited only if an
// FP8 module would otherwise resolve to INT4 under INC's rules: it then gets an extra_config
// entry {"bits": 16, "data_type": "float"}, which is what routes it to the FP8 path of vLLM's
// INC loader with the hybrid patch. Intel's checkpoints already mark shared experts 16-bit.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "qf/ckpt/progress.h"

namespace qf::quant {

struct HybridOptions {
  bool mtp = true;           // also replace the MTP layer's shared expert when both have one
  bool force = false;        // replace an existing output; accept unexpected FP8 tensors
  bool dry_run = false;      // plan and report only
  bool checksums = true;     // write qforge-manifest.json for the output
  bool check = true;         // compare each FP8 projection with Intel's BF16 one (cosine)
  double min_cosine = 0.98;  // below this the inputs are not the same model: fail unless force
  int threads = 0;
};

// FP8 tensors the hybrid does not use, by why.
struct HybridCategory {
  std::string name;     // "routed-experts", "int4-in-int4-checkpoint", "mtp", ...
  std::string meaning;  // one line for the report
  size_t n_tensors = 0;
  std::vector<std::string> examples;  // up to 3 names
};

struct HybridReport {
  std::vector<std::string> modules;  // replaced modules, sorted
  size_t n_main = 0;                 // of which in decoder layers
  size_t n_mtp = 0;                  // of which in the MTP layer
  std::string scale_dtype;           // of the added weight_scale_inv tensors
  std::vector<HybridCategory> unused;
  size_t n_unexpected = 0;
  std::vector<std::string> strays_ignored;  // stray .safetensors of the INT4 input, not copied
  std::vector<std::string> config_edits;    // extra_config entries added
  double min_cosine = 1.0;                  // FP8 vs BF16 over replaced modules (check)
  std::string min_cosine_module;
  uint64_t bytes_in = 0, bytes_out = 0;  // tensor bytes
  uint64_t bytes_shared = 0;  // of bytes_out, sharing the inputs' blocks (XFS, btrfs reflinks)
  struct File {
    std::string name;
    size_t n_tensors = 0;
    uint64_t tensor_bytes = 0;
  };
  std::vector<File> files;
  std::vector<std::string> fp8_files_read;  // FP8 shards that held needed tensors
  double seconds = 0;
};

// Throws Error: kTensorNotFound / kUnsupported (missing or misshapen tensors, named),
// kExists (output exists without force), kConfigInvalid, kIo.
HybridReport build_hybrid(const std::filesystem::path& int4_dir,
                          const std::filesystem::path& fp8_dir,
                          const std::filesystem::path& out_dir, const HybridOptions& options,
                          ckpt::Progress* progress = nullptr);

}  // namespace qf::quant
