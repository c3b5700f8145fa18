// A linear module [n, k] (y = W x) as a checkpoint stores it, resolved once to its format's
// tensors: a float weight (BF16/F16/F32, also a slice of a fused 3-D expert tensor), INT4/INT8
// GPTQ (auto_round:auto_gptq, v1 zeros) or FP8 E4M3 with block weight_scale_inv multipliers.
// Every element is reconstructed exactly as its format defines it (formats.h), in f32:
//   GPTQ  scale * (code - (zero + 1))      FP8  e4m3(code) * scale_inv[r / bn][c / bk]
// so row() equals what `qforge dequantize --dtype f32` writes, and matvec() is the fp32 product
// with those weights. Does not own the data (views into a mapped checkpoint).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "qf/ckpt/checkpoint.h"
#include "qf/quant/matrix.h"
#include "qf/quant/quant_config.h"

namespace qf::quant {

struct StoredLinear {
  enum class Kind { kFloat, kGptq, kFp8 };
  Kind kind = Kind::kFloat;
  int64_t n = 0, k = 0;
  std::optional<MatrixView> w;  // kFloat
  int bits = 0;                 // kGptq: 4 or 8
  int64_t group = 0;            // kGptq: columns per scale group
  const uint32_t* qweight = nullptr;
  const uint32_t* qzeros = nullptr;
  const uint16_t* scales = nullptr;
  const uint8_t* codes = nullptr;  // kFp8, row-major [n, k]
  std::optional<MatrixView> scale_inv;
  int64_t bn = 128, bk = 128;
  std::vector<const ckpt::TensorRef*> parts;  // the tensors it reads

  // A float weight at `data` (e.g. expert e of a fused [E, rows, k] tensor).
  static StoredLinear float_view(const void* data, ckpt::DType dtype, int64_t n, int64_t k);

  // "bf16" / "f32" / "int4" / "int8" / "fp8".
  std::string format() const;
  // out[0..k) = row r in f32, exactly as the format defines it.
  void row(int64_t r, float* out) const;
  // y[r - r0] = sum_c W[r][c] * x[c] for r in [r0, r1), fp32 accumulation.
  void matvec_rows(const float* x, float* y, int64_t r0, int64_t r1) const;
  // Drops the mapped pages of its tensors (streaming tools).
  void release() const;
};

// How a checkpoint's quantized modules are laid out (from config.json's quantization_config and
// qforge's hybrid record): INC's per-module group size, the global group, the FP8 block edge.
struct LinearLayout {
  const IncResolver* inc = nullptr;
  int64_t group = 128;
  int64_t block = 128;
};

// The layout a config.json declares (quantization_config, qforge.hybrid). Throws
// Error(kUnsupported) for a GPTQ packing other than auto_round:auto_gptq, kConfigInvalid for
// fields of the wrong type; `source` names the file in messages.
struct CheckpointLayout {
  std::optional<IncResolver> inc;
  int64_t group = 128;
  int64_t block = 128;
  LinearLayout linear() const { return {inc ? &*inc : nullptr, group, block}; }
};
CheckpointLayout checkpoint_layout(const nlohmann::json& config, const std::string& source);

// Resolves module `m` (a name without ".weight") of shape [n, k] in `c`. The checkpoint must have
// passed the model checks (check_qwen35_model); throws Error(kTensorNotFound) otherwise.
StoredLinear resolve_linear(const ckpt::Checkpoint& c, const LinearLayout& layout,
                            const std::string& m, int64_t n, int64_t k);

}  // namespace qf::quant
