// quantize-lm-head: the LM head as INT8 per row or INT4 per group of 128, symmetric, stored as
// GPTQ so that qforge's runtime and vLLM's INC path (GPTQ-Marlin uint8b128 / uint4b8) read it
// (checkpoint-formats.md §4.5 option B):
//   INT8 (bits 8, the default)
//   lm_head.qweight I32 [H/4, V]   four codes per word along H, code = q + 128, lowest byte =
//                                  lowest k; q = clamp(round_half_even(w / s_v), -127, 127)
//   lm_head.qzeros  I32 [1, V/4]   0x7F7F7F7F (zero 128, stored minus one: GPTQ v1)
//   lm_head.scales  F16 [1, V]     s_v = max|w_v| / 127 rounded to F16 first, so
//                                  q * s_v is exactly what a loader reconstructs
//   INT4 (bits 4): AutoRound's own RTN W4 G128 sym, as its --quant_lm_head exports it and as
//   quantize_int4 writes every INT4 module (int4.h: scale = the group's extreme / -8 in
//   F16, q = clamp(round_half_even(w / s), -8, 7))
//   lm_head.qweight I32 [H/8, V]   eight codes q + 8 per word along H
//   lm_head.qzeros  I32 [G, V/8]   0x77777777 (zero 8, stored minus one), G = ceil(H / 128)
//   lm_head.scales  F16 [G, V]
// lm_head.weight is removed (a module never has both weight and qweight). quantization_config
// (config.json and quantization_config.json) gets extra_config["lm_head"] = {bits, group_size
// (-1 or 128), sym, data_type int}; config.json gets "qforge": {"lm_head": {...}} with the
// format and the quality report. Whether stock vLLM's INC applies an exact "lm_head" key to this
// VL model's ParallelLMHead was not checked here (no vLLM on these machines).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "qf/ckpt/progress.h"

namespace qf::quant {

struct LmHeadOptions {
  std::filesystem::path out;  // write a new checkpoint here...
  bool in_place = false;      // ...or replace the files in the input directory
  bool force = false;         // replace an existing --out
  bool dry_run = false;
  int bits = 8;      // 8: per row; 4: per group of kLmHeadInt4Group columns
  int samples = 16;  // random hidden states N(0, 1) for the logits comparison
  uint64_t seed = 0;
  int threads = 0;
};

inline constexpr int64_t kLmHeadInt4Group = 128;

struct LmHeadReport {
  int bits = 8;
  int64_t group = -1;                            // columns per scale; -1: the whole row
  int64_t rows = 0, cols = 0;                    // V, H
  std::string shard;                             // the file that held lm_head.weight
  std::string source_dtype;                      // of lm_head.weight (BF16, F16 or F32)
  double max_abs_error = 0, mean_abs_error = 0;  // dequantized vs BF16 weights
  double min_row_cosine = 1, mean_row_cosine = 1;
  double top1_agreement = 0;  // fraction of samples whose argmax logit agrees
  double top5_overlap = 0;    // mean |top5(BF16) ∩ top5(quantized)| / 5
  int samples = 0;
  uint64_t bytes_before = 0, bytes_after = 0;  // lm_head tensor bytes
  bool manifest_updated = false;
  double seconds = 0;
};

// Reads lm_head.weight twice (scales and quality, then the codes, strip by strip), a bounded
// chunk of rows at a time; every other file is carried over (hard links in place, else reflink
// or copy) into "<out>.tmp", which then replaces <out> in one step. The dry run measures but
// writes nothing. Throws Error: kUsage (neither or both of out/in_place, bits not 4 or 8),
// kTensorNotFound (no lm_head.weight), kUnsupported (not an auto-round checkpoint, already
// quantized, a dimension not a multiple of 32 / bits), kExists, kConfigInvalid, kIo.
LmHeadReport quantize_lm_head(const std::filesystem::path& dir, const LmHeadOptions& options,
                              ckpt::Progress* progress = nullptr);

}  // namespace qf::quant
