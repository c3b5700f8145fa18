// Reading a checkpoint's quantization_config as vLLM's INC (auto-round) loader resolves it
// (checkpoint-formats.md §2.7): the bits a module gets, and editing extra_config.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

namespace qf::quant {

// INC's resolution prepared once for a config: exact extra_config keys, compiled regex keys
// and block prefixes (checking 100k modules against hundreds of keys stays cheap).
class IncResolver {
 public:
  explicit IncResolver(const nlohmann::json& qcfg);
  int bits(const std::string& module) const;
  // The module's group size along K: its extra_config entry's group_size, else the global one;
  // -1 (one group per row) is returned as is.
  int64_t group_size(const std::string& module) const;

 private:
  struct Scheme {
    int bits;
    int64_t group;
  };
  // The extra_config entry that applies, or null (then block membership decides the bits).
  const Scheme* entry(const std::string& module) const;

  int global_ = 16;
  int64_t global_group_ = 128;
  std::map<std::string, Scheme> exact_;
  std::vector<std::pair<std::regex, Scheme>> regex_;
  std::vector<std::string> blocks_;
};

// Bits INC gives `module` (checkpoint naming, e.g. "model.language_model.layers.0.mlp.gate"):
// an exact extra_config key wins; otherwise keys with regex metacharacters are tried with
// search semantics; otherwise modules under a block_name_to_quantize prefix get the global
// bits and all others 16. `qcfg` is the quantization_config object (quant_method auto-round).
int inc_module_bits(const nlohmann::json& qcfg, const std::string& module);

// block_name_to_quantize as a list (it is a comma-separated string or a list).
std::vector<std::string> inc_blocks(const nlohmann::json& qcfg);

// True for an AutoRound / INC quantization_config.
bool is_inc_config(const nlohmann::json& qcfg);

// Checks the types of every quantization_config member a reader here uses, so that a
// malformed config is an error naming the member and not an exception inside the JSON
// library: the object itself (or null), quant_method, packing_format and fmt strings; bits and
// group_size integers; sym a boolean; weight_block_size two positive integers;
// modules_to_not_convert an array; extra_config an object of objects whose bits and group_size
// are integers. Throws Error(kConfigInvalid) "`where`.member ...".
void check_quantization_config(const nlohmann::json& qcfg, const std::string& where);

}  // namespace qf::quant
