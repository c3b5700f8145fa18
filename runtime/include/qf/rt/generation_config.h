// generation_config.json: the model's stop tokens and its recommended sampling defaults.
// Qwen3.5 ships eos_token_id [248046, 248044] (<|im_end|>, <|endoftext|>), pad 248044
// (qwen35-architecture.md §6). Fields this runtime does not use (transformers_version, ...)
// are ignored; a field given as null counts as absent, as transformers treats it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "qf/rt/sampler.h"

namespace qf::rt {

struct GenerationConfig {
  std::vector<int32_t> eos_token_ids;  // stop tokens in file order (int or list); empty if none
  std::optional<int32_t> bos_token_id;
  std::optional<int32_t> pad_token_id;
  std::optional<bool> do_sample;
  std::optional<float> temperature;         // >= 0
  std::optional<float> top_p;               // (0, 1]
  std::optional<int32_t> top_k;             // >= 0 (0: no limit)
  std::optional<float> min_p;               // [0, 1]
  std::optional<float> repetition_penalty;  // > 0
};

// Reads `model_dir`/generation_config.json; without that file, the defaults above (no stop
// tokens). Throws Error: kIo when model_dir is not a directory or the file cannot be read,
// kConfigInvalid naming the file and field for malformed JSON or a value of the wrong type or
// range.
GenerationConfig load_generation_config(const std::filesystem::path& model_dir);
// The same from the file's text; `source` names it in messages.
GenerationConfig parse_generation_config(std::string_view json_text, const std::string& source);

// The sampling the model recommends: generation_config's temperature, top-p, top-k and min-p
// when it samples (do_sample, or a temperature given without it), else greedy; its repetition
// penalty either way (transformers applies it to greedy search too); seed 0.
SamplingOptions default_sampling(const GenerationConfig& g);

}  // namespace qf::rt
