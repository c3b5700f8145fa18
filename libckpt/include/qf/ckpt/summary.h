// What a checkpoint holds: counts and bytes by dtype, by format family and by file.
//
// Families are decided by which tensors exist, never by config.json (a config can lie; the
// tensors cannot): a module with qweight+qzeros+scales is GPTQ-packed, a float8 weight with a
// weight_scale_inv sibling is block FP8, and so on. Everything else is counted by dtype.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qf/ckpt/checkpoint.h"

namespace qf::ckpt {

struct DTypeStat {
  DType dtype;
  size_t n_tensors = 0;
  uint64_t bytes = 0;
};

struct FormatStat {
  std::string family;   // "int4-gptq", "fp8-block", "int8-rowwise", "bf16", ...
  std::string members;  // tensors that make one module of this family, e.g. "qweight+qzeros+scales"
  size_t n_modules = 0;
  size_t n_tensors = 0;
  uint64_t bytes = 0;
};

struct FileStat {
  std::string name;
  FileRole role;
  size_t n_tensors = 0;
  uint64_t file_bytes = 0;
  uint64_t header_bytes = 0;
  uint64_t tensor_bytes = 0;
};

struct Summary {
  size_t n_tensors = 0;
  uint64_t tensor_bytes = 0;
  std::vector<DTypeStat> by_dtype;    // largest first
  std::vector<FormatStat> by_format;  // largest first
  std::vector<FileStat> files;        // tensor files, then strays, by name
};

Summary summarize(const Checkpoint& checkpoint);

}  // namespace qf::ckpt
