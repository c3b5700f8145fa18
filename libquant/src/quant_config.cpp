#include "qf/quant/quant_config.h"

#include "qf/error.h"

namespace qf::quant {
namespace {

bool has_regex_chars(const std::string& key) {
  return key.find_first_of("*+?^$()[]{}|\\") != std::string::npos;
}

template <typename T>
T int_of(const nlohmann::json& entry, const char* key, T fallback) {
  return entry.is_object() && entry.contains(key) && entry[key].is_number_integer()
             ? entry[key].get<T>()
             : fallback;
}

}  // namespace

bool is_inc_config(const nlohmann::json& qcfg) {
  if (!qcfg.is_object() || !qcfg.contains("quant_method") || !qcfg["quant_method"].is_string())
    return false;
  const std::string m = qcfg["quant_method"].get<std::string>();
  return m == "auto-round" || m == "autoround" || m == "inc";
}

void check_quantization_config(const nlohmann::json& qcfg, const std::string& where) {
  if (qcfg.is_null()) return;
  const auto bad = [&](const std::string& what) {
    throw Error(Errc::kConfigInvalid, where + what);
  };
  if (!qcfg.is_object()) bad(" must be an object");
  for (const char* key : {"quant_method", "packing_format", "fmt"}) {
    if (qcfg.contains(key) && !qcfg[key].is_string())
      bad(std::string(".") + key + " must be a string");
  }
  const auto integers = [&](const nlohmann::json& o, const std::string& at) {
    for (const char* key : {"bits", "group_size"}) {
      if (o.contains(key) && !o[key].is_number_integer())
        bad(at + "." + key + " must be an integer");
    }
  };
  integers(qcfg, "");
  if (qcfg.contains("sym") && !qcfg["sym"].is_boolean()) bad(".sym must be true or false");
  if (qcfg.contains("weight_block_size")) {
    const nlohmann::json& b = qcfg["weight_block_size"];
    if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() ||
        b[0].get<int64_t>() <= 0 || b[1].get<int64_t>() <= 0)
      bad(".weight_block_size must be two positive integers");
  }
  if (qcfg.contains("modules_to_not_convert") && !qcfg["modules_to_not_convert"].is_array())
    bad(".modules_to_not_convert must be an array");
  if (qcfg.contains("extra_config")) {
    const nlohmann::json& extra = qcfg["extra_config"];
    if (!extra.is_object()) bad(".extra_config must be an object");
    for (const auto& [key, e] : extra.items()) {
      if (!e.is_object()) bad(".extra_config[\"" + key + "\"] must be an object");
      integers(e, ".extra_config[\"" + key + "\"]");
    }
  }
}

std::vector<std::string> inc_blocks(const nlohmann::json& qcfg) {
  std::vector<std::string> out;
  const auto it = qcfg.find("block_name_to_quantize");
  if (it == qcfg.end()) return out;
  auto add = [&](std::string s) {
    while (!s.empty() && s.front() == ' ') s.erase(s.begin());
    while (!s.empty() && s.back() == ' ') s.pop_back();
    if (!s.empty()) out.push_back(s);
  };
  if (it->is_string()) {
    const std::string v = it->get<std::string>();
    size_t start = 0;
    for (size_t comma; (comma = v.find(',', start)) != std::string::npos; start = comma + 1) {
      add(v.substr(start, comma - start));
    }
    add(v.substr(start));
  } else if (it->is_array()) {
    for (const auto& b : *it) {
      if (b.is_string()) add(b.get<std::string>());
    }
  }
  return out;
}

IncResolver::IncResolver(const nlohmann::json& qcfg) {
  global_ = int_of<int>(qcfg, "bits", 16);
  global_group_ = int_of<int64_t>(qcfg, "group_size", 128);
  const auto extra = qcfg.find("extra_config");
  if (extra != qcfg.end() && extra->is_object()) {
    for (const auto& [key, e] : extra->items()) {
      const Scheme scheme{int_of<int>(e, "bits", global_),
                          int_of<int64_t>(e, "group_size", global_group_)};
      exact_.emplace(key, scheme);
      if (!has_regex_chars(key)) continue;
      try {
        regex_.emplace_back(std::regex(key), scheme);
      } catch (const std::regex_error&) {
        // INC would fail on such a key too; treat it as matching nothing.
      }
    }
  }
  blocks_ = inc_blocks(qcfg);
}

const IncResolver::Scheme* IncResolver::entry(const std::string& module) const {
  if (const auto it = exact_.find(module); it != exact_.end()) return &it->second;
  for (const auto& [re, scheme] : regex_) {
    if (std::regex_search(module, re)) return &scheme;
  }
  return nullptr;
}

int IncResolver::bits(const std::string& module) const {
  if (const Scheme* s = entry(module)) return s->bits;
  for (const std::string& b : blocks_) {
    if (module == b || module.rfind(b + ".", 0) == 0) return global_;
  }
  return 16;
}

int64_t IncResolver::group_size(const std::string& module) const {
  const Scheme* s = entry(module);
  return s ? s->group : global_group_;
}

int inc_module_bits(const nlohmann::json& qcfg, const std::string& module) {
  return IncResolver(qcfg).bits(module);
}

}  // namespace qf::quant
