// dequantize: any Qwen3.5-MoE checkpoint qforge reads (Qwen's BF16 or FP8 release, Intel's
// INT4, hybrids, an INT8 LM head) to plain BF16 in the layout of Qwen's BF16 release, which
// transformers loads: fused 3-D routed experts in the decoder layers (experts.gate_up_proj
// [E, 2I, H] with the gate rows first, experts.down_proj [E, H, I]), per-expert MTP experts,
// F32 linear_attn.A_log and linear_attn.norm, everything else BF16; no quantization_config.
//
// Values: each stored weight is reconstructed exactly in f32 by its format's formula
// (formats.h: INT4/INT8 GPTQ v1 scale * (code - zero), FP8 e4m3(code) * weight_scale_inv,
// one f32 product), then rounded to BF16 to nearest even. BF16 tensors are copied byte for
// byte; BF16 -> F32 widening is exact. Used to build references (e.g. for transformers).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "qf/ckpt/dtype.h"
#include "qf/ckpt/progress.h"

namespace qf::quant {

struct DequantizeOptions {
  bool force = false;     // replace an existing output directory
  bool dry_run = false;   // plan only
  bool checksums = true;  // write qforge-manifest.json
  uint64_t shard_bytes = 5ull << 30;
  size_t shards = 0;  // exactly this many shards when > 0
  int threads = 0;
  // BF16 (Qwen's release layout) or F32: every weight exactly as reconstructed, no rounding
  // (a reference for engines that compute with the stored values).
  ckpt::DType dtype = ckpt::DType::kBF16;
};

struct DequantizeReport {
  std::map<std::string, size_t> modules_by_format;  // of the input: bf16, int4, int8, fp8, ...
  size_t n_tensors = 0;                             // written
  uint64_t tensor_bytes = 0;
  std::vector<std::string> files;
  bool mtp = false, vision = false;
  double seconds = 0;
};

// The input must pass the model-aware checks (check_qwen35_model); its first problem is thrown
// otherwise. Throws Error: kExists, kUnsupported (GPTQ packing other than auto_round:auto_gptq),
// kConfigInvalid, kIo.
DequantizeReport dequantize_checkpoint(const std::filesystem::path& input,
                                       const std::filesystem::path& out,
                                       const DequantizeOptions& options,
                                       ckpt::Progress* progress = nullptr);

}  // namespace qf::quant
