// A structure-aware mutator for the fuzz targets whose input holds a JSON document: byte
// mutations rarely turn a value into another type ("sym": true into "sym": "yes"), which is
// where the readers of configs and requests broke. With libFuzzer (QF_LIBFUZZER), a target
// defines LLVMFuzzerCustomMutator through QF_FUZZ_JSON_MUTATOR: half of the mutations edit the
// document as a tree (a value replaced by one of another type or an edge value, a member or
// element removed, duplicated or added under a known key), the others are libFuzzer's own.
// The input is [prefix bytes][JSON][0xFF and the rest]; prefix and tail are kept.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace qf::fuzz {

// Edits `doc` once; `keys` are member names worth adding.
inline void mutate_json(nlohmann::ordered_json& doc, std::mt19937& rng,
                        std::initializer_list<const char*> keys) {
  using Json = nlohmann::ordered_json;
  std::vector<Json*> nodes;
  const auto collect = [&](auto& self, Json& v) -> void {
    nodes.push_back(&v);
    if (v.is_object() || v.is_array()) {
      for (Json& c : v) self(self, c);
    }
  };
  collect(collect, doc);
  Json& at = *nodes[rng() % nodes.size()];
  const auto value = [&]() -> Json {
    switch (rng() % 16) {
      case 0:
        return nullptr;
      case 1:
        return rng() % 2 == 0;
      case 2:
        return 0;
      case 3:
        return -1;
      case 4:
        return static_cast<int64_t>(rng() % 300);
      case 5:
        return INT64_MAX;
      case 6:
        return INT64_MIN;
      case 7:
        return 1e308;
      case 8:
        return 0.5;
      case 9:
        return "";
      case 10:
        return "yes";
      case 11:
        return std::string(rng() % 300, 'a');
      case 12:
        return Json::array();
      case 13:
        return Json::array({0, 0});
      case 14:
        return Json::object();
      default:
        return Json(*nodes[rng() % nodes.size()]);  // a copy of another node
    }
  };
  const uint32_t op = rng() % 4;
  if (op == 0 || !(at.is_object() || at.is_array()) || at.empty()) {
    at = value();        // a value of another type or an edge value
  } else if (op == 1) {  // remove a member or element
    if (at.is_object()) {
      auto it = at.begin();
      std::advance(it, rng() % at.size());
      at.erase(it.key());
    } else {
      at.erase(rng() % at.size());
    }
  } else if (op == 2) {  // duplicate one
    if (at.is_array()) {
      at.push_back(Json(at[rng() % at.size()]));
    } else if (keys.size() > 0) {
      auto it = at.begin();
      std::advance(it, rng() % at.size());
      Json copy = it.value();
      at[std::string(*(keys.begin() + rng() % keys.size()))] = std::move(copy);
    }
  } else if (at.is_object() && keys.size() > 0) {  // add a known key
    at[std::string(*(keys.begin() + rng() % keys.size()))] = value();
  } else if (at.is_array()) {
    at.push_back(value());
  }
}

}  // namespace qf::fuzz

#ifdef QF_LIBFUZZER
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

// Defines LLVMFuzzerCustomMutator for inputs of `prefix` bytes, then JSON up to an optional 0xFF
// byte; `...`: the member names worth adding.
#define QF_FUZZ_JSON_MUTATOR(prefix, ...)                                                       \
  extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,        \
                                            unsigned int seed) {                                \
    std::mt19937 rng(seed);                                                                     \
    if (rng() % 2 == 0 || size < (prefix)) return LLVMFuzzerMutate(data, size, max_size);       \
    const std::string_view in(reinterpret_cast<const char*>(data) + (prefix), size - (prefix)); \
    const size_t cut = std::min(in.find('\xFF'), in.size());                                    \
    auto doc = nlohmann::ordered_json::parse(in.substr(0, cut), nullptr, false);                \
    if (doc.is_discarded()) return LLVMFuzzerMutate(data, size, max_size);                      \
    qf::fuzz::mutate_json(doc, rng, {__VA_ARGS__});                                             \
    const std::string text =                                                                    \
        doc.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);             \
    const std::string tail(in.substr(cut));                                                     \
    if ((prefix) + text.size() + tail.size() > max_size)                                        \
      return LLVMFuzzerMutate(data, size, max_size);                                            \
    std::memcpy(data + (prefix), text.data(), text.size());                                     \
    std::memcpy(data + (prefix) + text.size(), tail.data(), tail.size());                       \
    return (prefix) + text.size() + tail.size();                                                \
  }
#else
#define QF_FUZZ_JSON_MUTATOR(prefix, ...)
#endif
