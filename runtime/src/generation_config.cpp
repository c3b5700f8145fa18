#include "qf/rt/generation_config.h"

#include <cerrno>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "qf/ckpt/file_io.h"
#include "qf/error.h"

namespace qf::rt {
namespace {

using nlohmann::json;

constexpr const char* kFileName = "generation_config.json";
constexpr uint64_t kMaxBytes = 1 << 20;  // a few hundred bytes in practice

class Reader {
 public:
  Reader(const json& doc, const std::string& source) : doc_(doc), src_(source) {}

  [[noreturn]] void invalid(const std::string& key, const std::string& what) const {
    throw Error(Errc::kConfigInvalid, src_ + ": \"" + key + "\": " + what);
  }

  // The value of `key`, or null when it is absent.
  const json& get(const char* key) const {
    static const json kNull;
    const auto it = doc_.find(key);
    return it == doc_.end() ? kNull : *it;
  }

  int32_t token_id(const json& v, const std::string& key) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      invalid(key, "expected a token id (an integer from 0 to 2^31-1), got " + v.dump());
    }
    return static_cast<int32_t>(v.get<int64_t>());
  }

  std::optional<int32_t> optional_id(const char* key) const {
    const json& v = get(key);
    if (v.is_null()) return std::nullopt;
    return token_id(v, key);
  }

  std::vector<int32_t> eos_ids() const {
    const json& v = get("eos_token_id");
    if (v.is_null()) return {};
    if (!v.is_array()) return {token_id(v, "eos_token_id")};
    std::vector<int32_t> ids;
    for (size_t i = 0; i < v.size(); ++i) {
      ids.push_back(token_id(v[i], "eos_token_id[" + std::to_string(i) + "]"));
    }
    return ids;
  }

  // A finite number with lo <= x <= hi (lo excluded when lo_open).
  std::optional<float> number(const char* key, double lo, bool lo_open, double hi) const {
    const json& v = get(key);
    if (v.is_null()) return std::nullopt;
    const double x = v.is_number() ? v.get<double>() : std::nan("");
    const bool ok = std::isfinite(x) && (lo_open ? x > lo : x >= lo) && x <= hi;
    if (!ok) {
      const std::string range = std::isinf(hi)
                                    ? (lo_open ? "> " : ">= ") + fmt(lo)
                                    : (lo_open ? "in (" : "in [") + fmt(lo) + ", " + fmt(hi) + "]";
      invalid(key, "expected a number " + range + ", got " + v.dump());
    }
    return static_cast<float>(x);
  }

  std::optional<int32_t> count(const char* key) const {
    const json& v = get(key);
    if (v.is_null()) return std::nullopt;
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      invalid(key, "expected a non-negative integer, got " + v.dump());
    }
    return static_cast<int32_t>(v.get<int64_t>());
  }

  std::optional<bool> flag(const char* key) const {
    const json& v = get(key);
    if (v.is_null()) return std::nullopt;
    if (!v.is_boolean()) invalid(key, "expected true or false, got " + v.dump());
    return v.get<bool>();
  }

 private:
  static std::string fmt(double x) { return json(x).dump(); }

  const json& doc_;
  const std::string& src_;
};

}  // namespace

GenerationConfig parse_generation_config(std::string_view json_text, const std::string& source) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::exception& e) {
    throw Error(Errc::kConfigInvalid, source + ": not valid JSON: " + e.what());
  }
  if (!doc.is_object()) {
    throw Error(Errc::kConfigInvalid,
                source + ": expected a JSON object at the top level, got " + doc.type_name());
  }
  const Reader r(doc, source);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  GenerationConfig c;
  c.eos_token_ids = r.eos_ids();
  c.bos_token_id = r.optional_id("bos_token_id");
  c.pad_token_id = r.optional_id("pad_token_id");
  c.do_sample = r.flag("do_sample");
  c.temperature = r.number("temperature", 0, false, kInf);
  c.top_p = r.number("top_p", 0, true, 1);
  c.top_k = r.count("top_k");
  c.min_p = r.number("min_p", 0, false, 1);
  c.repetition_penalty = r.number("repetition_penalty", 0, true, kInf);
  return c;
}

GenerationConfig load_generation_config(const std::filesystem::path& model_dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(model_dir, ec)) {
    throw_io("cannot read model directory", model_dir.string(),
             std::filesystem::exists(model_dir, ec) ? ENOTDIR : ENOENT);
  }
  const std::filesystem::path path = model_dir / kFileName;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (st.type() == std::filesystem::file_type::not_found) return {};
  if (ec) throw_io("cannot stat", path.string(), ec.value());
  return parse_generation_config(ckpt::read_text_file(path, kMaxBytes), path.string());
}

SamplingOptions default_sampling(const GenerationConfig& g) {
  SamplingOptions s;
  if (g.do_sample.value_or(g.temperature.has_value())) {
    s.temperature = g.temperature.value_or(1.0f);
    s.top_p = g.top_p.value_or(1.0f);
    s.top_k = g.top_k.value_or(0);
    s.min_p = g.min_p.value_or(0.0f);
  }
  s.repetition_penalty = g.repetition_penalty.value_or(1.0f);  // a logits processor: greedy too
  return s;
}

}  // namespace qf::rt
