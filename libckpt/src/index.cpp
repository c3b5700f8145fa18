#include "qf/ckpt/index.h"

#include <algorithm>

#include "qf/ckpt/json.h"

namespace qf::ckpt {
namespace {

// Index entries must name a file inside the checkpoint directory.
bool is_bare_safetensors_name(std::string_view f) {
  constexpr std::string_view kExt = ".safetensors";
  if (f.size() <= kExt.size() || f.substr(f.size() - kExt.size()) != kExt) return false;
  return f.find('/') == std::string_view::npos && f.find('\\') == std::string_view::npos &&
         f.find('\0') == std::string_view::npos && f[0] != '.';
}

void parse_metadata(JsonReader& r, ShardIndex& idx, std::vector<Problem>& problems) {
  if (r.peek() != JsonType::kObject) {
    r.skip_value();
    problems.push_back({Errc::kIndexInvalid, "", "", "\"metadata\" is not an object"});
    return;
  }
  r.begin_object();
  std::string key;
  while (r.next_key(key)) {
    if (key != "total_size") {
      idx.extra_metadata.emplace_back(key, std::string(r.skip_value()));
      continue;
    }
    if (r.peek() != JsonType::kNumber) {
      r.skip_value();
      problems.push_back({Errc::kIndexInvalid, "", "", "metadata.total_size is not a number"});
      continue;
    }
    const JsonNumber num = r.read_number();
    if (!num.fits_u64 || num.negative) {
      problems.push_back({Errc::kIndexInvalid, "", "",
                          "metadata.total_size " + std::string(num.text) +
                              " is not a non-negative 64-bit integer"});
      continue;
    }
    idx.total_size = num.magnitude;
  }
}

void parse_weight_map(JsonReader& r, ShardIndex& idx, std::vector<Problem>& problems) {
  if (r.peek() != JsonType::kObject) {
    r.skip_value();
    problems.push_back({Errc::kIndexInvalid, "", "", "\"weight_map\" is not an object"});
    return;
  }
  r.begin_object();
  std::string name, file;
  while (r.next_key(name)) {
    if (r.peek() != JsonType::kString) {
      r.skip_value();
      problems.push_back(
          {Errc::kIndexInvalid, "", name, "weight_map value is not a file name string"});
      continue;
    }
    r.read_string(file);
    if (!is_bare_safetensors_name(file)) {
      problems.push_back({Errc::kIndexInvalid, "", name,
                          "weight_map names \"" + file +
                              "\", not a .safetensors file inside the checkpoint directory"});
      continue;
    }
    idx.weight_map.emplace_back(name, file);
  }
  // Stable sort keeps the first of duplicate names first; report and drop the later ones.
  // Indexes written with sort_keys (Hugging Face's) are already in order.
  const auto by_name = [](const auto& a, const auto& b) { return a.first < b.first; };
  if (!std::is_sorted(idx.weight_map.begin(), idx.weight_map.end(), by_name)) {
    std::stable_sort(idx.weight_map.begin(), idx.weight_map.end(), by_name);
  }
  auto& wm = idx.weight_map;
  size_t out = 0;
  for (size_t i = 0; i < wm.size(); ++i) {
    if (out > 0 && wm[out - 1].first == wm[i].first) {
      problems.push_back({Errc::kDuplicateName, "", wm[i].first,
                          "weight_map lists the tensor twice (\"" + wm[out - 1].second +
                              "\" and \"" + wm[i].second + "\")"});
      continue;
    }
    if (out != i) wm[out] = std::move(wm[i]);
    ++out;
  }
  wm.resize(out);
}

}  // namespace

const std::string* ShardIndex::file_of(std::string_view tensor) const {
  const auto it = std::lower_bound(weight_map.begin(), weight_map.end(), tensor,
                                   [](const auto& e, std::string_view t) { return e.first < t; });
  return it != weight_map.end() && it->first == tensor ? &it->second : nullptr;
}

std::vector<std::string> ShardIndex::files() const {
  std::vector<std::string> out;
  for (const auto& [tensor, file] : weight_map) out.push_back(file);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void ShardIndex::sort() {
  std::sort(weight_map.begin(), weight_map.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
}

IndexParse parse_index(std::string_view text) {
  IndexParse out;
  if (const auto bad = utf8_error_offset(text)) {
    out.problems.push_back(
        {Errc::kIndexInvalid, "", "", "byte " + std::to_string(*bad) + " is not valid UTF-8"});
    return out;
  }
  try {
    JsonReader r(text);
    if (r.peek() != JsonType::kObject) {
      out.problems.push_back({Errc::kIndexInvalid, "", "", "top level is not a JSON object"});
      return out;
    }
    r.begin_object();
    std::string key;
    bool have_map = false;
    while (r.next_key(key)) {
      if (key == "metadata") {
        parse_metadata(r, out.index, out.problems);
      } else if (key == "weight_map") {
        have_map = true;
        parse_weight_map(r, out.index, out.problems);
      } else {
        out.index.extra_top.emplace_back(key, std::string(r.skip_value()));
      }
    }
    r.expect_end();
    if (!have_map) out.problems.push_back({Errc::kIndexInvalid, "", "", "no \"weight_map\""});
  } catch (const JsonSyntaxError& e) {
    out = IndexParse{};
    out.problems.push_back({Errc::kIndexInvalid, "", "",
                            "invalid JSON at byte " + std::to_string(e.offset()) + ": " + e.what() +
                                " (near \"" + json_context(text, e.offset()) + "\")"});
  }
  return out;
}

std::string serialize_index(const ShardIndex& index) {
  // Members sorted by key at every level, as sort_keys=True does.
  std::vector<std::pair<std::string, std::string>> meta = index.extra_metadata;
  if (index.total_size) meta.emplace_back("total_size", std::to_string(*index.total_size));
  std::sort(meta.begin(), meta.end());
  std::vector<std::pair<std::string, std::string>> top = index.extra_top;
  top.emplace_back("metadata", "");
  top.emplace_back("weight_map", "");
  std::sort(top.begin(), top.end(), [](const auto& a, const auto& b) { return a.first < b.first; });

  std::string s = "{";
  bool first_top = true;
  for (const auto& [key, raw] : top) {
    s += first_top ? "\n  " : ",\n  ";
    first_top = false;
    append_json_string(s, key, /*ensure_ascii=*/true);
    s += ": ";
    if (key == "metadata" && raw.empty()) {
      if (meta.empty()) s += "{}";
      for (size_t i = 0; i < meta.size(); ++i) {
        s += i ? ",\n    " : "{\n    ";
        append_json_string(s, meta[i].first, true);
        s += ": " + meta[i].second;
      }
      if (!meta.empty()) s += "\n  }";
    } else if (key == "weight_map" && raw.empty()) {
      const auto& wm = index.weight_map;
      if (wm.empty()) s += "{}";
      for (size_t i = 0; i < wm.size(); ++i) {
        s += i ? ",\n    " : "{\n    ";
        append_json_string(s, wm[i].first, true);
        s += ": ";
        append_json_string(s, wm[i].second, true);
      }
      if (!wm.empty()) s += "\n  }";
    } else {
      s += raw;
    }
  }
  s += "\n}\n";
  return s;
}

}  // namespace qf::ckpt
