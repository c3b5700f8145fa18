// Model-aware checks of a Qwen3.5-MoE checkpoint against its config.json: the complete expected
// tensor set in any layout qforge knows (BF16 release, Intel INT4, Qwen FP8, hybrids, INT8 LM
// head), dtypes and shapes, INT4 triplet consistency, FP8 scale grids, quantization_config vs
// tensors, and optionally a NaN/Inf scan of every float tensor.
//
// Each linear module may be stored as:
//   bf16   <m>.weight BF16 [N, K]
//   int4   <m>.qweight I32 [K/8, N], <m>.qzeros I32 [ceil(K/G), N/8], <m>.scales F16 [ceil(K/G), N]
//   int8   the same GPTQ triplet with 8-bit words: qweight [K/4, N], qzeros [ceil(K/G), N/4]
//   fp8    <m>.weight F8_E4M3 [N, K], <m>.weight_scale_inv [ceil(N/bn), ceil(K/bk)]
// Routed experts of decoder layers may be fused (experts.gate_up_proj, experts.down_proj) or
// per expert. The MTP head and the vision tower are checked when any of their tensors exist; a
// config that declares an MTP head whose tensors are all absent is a problem (speculative
// decoding would silently stop working).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/progress.h"
#include "qf/ckpt/qwen35_config.h"

namespace qf::quant {

struct ModelCheckOptions {
  bool scan_values = false;  // read every float tensor and report NaN/Inf
  int threads = 0;
  ckpt::Progress* progress = nullptr;  // bytes scanned (scan_values)
};

struct ModelCheckStats {
  bool checked = false;  // false when config.json is absent or not a Qwen3.5-MoE config
  std::string skipped_because;
  std::map<std::string, size_t> modules_by_format;  // "bf16", "int4", "int8", "fp8", "fused-bf16"
  bool has_mtp = false;
  bool has_vision = false;
  uint64_t scanned_bytes = 0;
};

// Appends every problem found (file = "" or the tensor's file). Throws only Error(kIo).
ModelCheckStats check_qwen35_model(const ckpt::Checkpoint& checkpoint,
                                   const ModelCheckOptions& options,
                                   std::vector<ckpt::Problem>& problems);

// The format of linear module `module` [n, k] as stored in `c` ("bf16", "int4", "int8", "fp8"),
// or "" with a problem appended when it is absent or inconsistent. `group` is the INT4/INT8
// group size and `block` the FP8 block edge to check shapes against.
// `consumed`, when given, receives the names of the tensors that make up the module.
std::string check_linear_module(const ckpt::Checkpoint& c, const std::string& module, int64_t n,
                                int64_t k, int64_t group, int64_t block,
                                std::vector<ckpt::Problem>& problems,
                                std::vector<std::string>* consumed = nullptr);

// The same for a plain (non-linear) tensor: present, of one of `dtypes`, of `shape`.
bool check_plain_tensor(const ckpt::Checkpoint& c, const std::string& name,
                        std::initializer_list<ckpt::DType> dtypes, const ckpt::Shape& shape,
                        std::vector<ckpt::Problem>& problems,
                        std::vector<std::string>* consumed = nullptr);

}  // namespace qf::quant
