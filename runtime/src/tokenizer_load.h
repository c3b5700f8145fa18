// Internal: helpers shared by the tokenizer.json loader's files.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "qf/error.h"
#include "tokenizer_impl.h"

namespace qf::rt {

// Field access that throws Error naming the file and the field.
class JsonFields {
 public:
  explicit JsonFields(std::string source) : src_(std::move(source)) {}

  [[noreturn]] void invalid(const std::string& what) const {
    throw Error(Errc::kTokenizerInvalid, src_ + ": " + what);
  }
  [[noreturn]] void unsupported(const std::string& what) const {
    throw Error(Errc::kUnsupported, src_ + ": " + what + " is not supported");
  }
  // obj[key]; `where` names obj in the message ("model", "added_tokens[3]").
  const nlohmann::json& field(const nlohmann::json& obj, const char* key,
                              const std::string& where) const {
    if (!obj.is_object()) invalid(where + " must be an object");
    const auto it = obj.find(key);
    if (it == obj.end()) invalid(where + ": missing \"" + key + "\"");
    return *it;
  }
  std::string type_of(const nlohmann::json& obj, const std::string& where) const {
    const nlohmann::json& t = field(obj, "type", where);
    if (!t.is_string()) invalid(where + ".type must be a string");
    return t.get<std::string>();
  }
  // An optional boolean (null or absent: fallback).
  bool flag(const nlohmann::json& obj, const char* key, bool fallback,
            const std::string& where) const {
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) invalid(where + "." + key + " must be true or false");
    return it->get<bool>();
  }
  // A token id: an integer in [0, 2^31).
  static bool is_id(const nlohmann::json& v) {
    return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX;
  }
  int32_t id_value(const nlohmann::json& v, const std::string& where) const {
    if (!is_id(v)) invalid(where + " must be an integer id in [0, 2^31), not " + v.dump());
    return v.get<int32_t>();
  }

 protected:
  std::string src_;
};

// What a token string stands for, as the ByteLevel decoder reads it: the bytes of the GPT-2
// alphabet when every character is in it, else the string's own UTF-8.
std::string token_bytes_of(const std::string& token);

// The BPE `model` object: vocabulary, merges and options into `t` (id tables sized to the
// largest vocabulary id). Returns the number of vocabulary entries, which is where
// `tokenizers` starts numbering added tokens.
size_t load_bpe_model(const nlohmann::json& model, const JsonFields& f, Tokenizer::Impl& t);

}  // namespace qf::rt
