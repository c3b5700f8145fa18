// The BPE `model` of a tokenizer.json: vocabulary, merges and options.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "tokenizer_load.h"
#include "utf8.h"

namespace qf::rt {
namespace {

using nlohmann::json;

void check_options(const json& m, const JsonFields& f, Tokenizer::Impl& t) {
  if (const json& d = m.value("dropout", json()); !d.is_null() && !(d.is_number() && d == 0)) {
    f.unsupported("model.dropout " + d.dump());
  }
  if (f.flag(m, "byte_fallback", false, "model")) f.unsupported("model.byte_fallback");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json& v = m.value(k, json());
    if (!v.is_null() && v != "") f.unsupported(std::string("model.") + k + " " + v.dump());
  }
  t.ignore_merges = f.flag(m, "ignore_merges", false, "model");
  t.fuse_unk = f.flag(m, "fuse_unk", false, "model");
}

// model.vocab into the id tables; returns its size.
size_t load_vocab(const json& m, const JsonFields& f, Tokenizer::Impl& t) {
  const json& vocab = f.field(m, "vocab", "model");
  if (!vocab.is_object()) f.invalid("model.vocab must be an object of token -> id");
  // The tables are indexed by id, so the largest id sizes them: a vocabulary may leave gaps
  // (tokenizers accepts them), but ids past its size plus kMaxVocabGaps would take memory no
  // real tokenizer needs (one stray id of 266666666 took 8.5 GB; found by fuzz_config).
  constexpr size_t kMaxVocabGaps = 65536;
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab.items()) {
    if (!JsonFields::is_id(id)) f.id_value(id, "model.vocab[\"" + token + "\"]");  // throws
    if (id.get<uint64_t>() >= vocab.size() + kMaxVocabGaps) {
      f.invalid("model.vocab[\"" + token + "\"]: id " + id.dump() + " is past the vocabulary's " +
                std::to_string(vocab.size()) + " entries by more than " +
                std::to_string(kMaxVocabGaps));
    }
    max_id = std::max(max_id, id.get<int32_t>());
  }
  const auto n = static_cast<size_t>(max_id + 1);
  t.id_bytes.assign(n, std::string());
  t.id_content.assign(n, std::string());
  t.id_special.assign(n, 0);
  std::vector<uint8_t> taken(n, 0);
  t.content_to_id.reserve(vocab.size());
  for (const auto& [token, id_json] : vocab.items()) {
    const auto id = id_json.get<int32_t>();
    if (taken[id]) {
      f.invalid("model.vocab: id " + std::to_string(id) + " is given to both \"" +
                t.id_content[id] + "\" and \"" + token + "\"");
    }
    taken[id] = 1;
    t.id_content[id] = token;
    t.id_bytes[id] = token_bytes_of(token);
    t.content_to_id.emplace(token, id);
    std::string raw;
    if (t.ignore_merges && detail::byte_level_to_bytes(token, raw)) t.vocab.emplace(raw, id);
  }
  for (int b = 0; b < 256; ++b) {
    std::string c;
    detail::append_utf8(c, detail::byte_char(static_cast<uint8_t>(b)));
    const auto it = t.content_to_id.find(c);
    t.byte_id[b] = it != t.content_to_id.end() ? it->second : -1;
  }
  if (const json& u = m.value("unk_token", json()); !u.is_null()) {
    const auto it =
        u.is_string() ? t.content_to_id.find(u.get<std::string>()) : t.content_to_id.end();
    if (it == t.content_to_id.end()) {
      f.invalid("model.unk_token " + u.dump() + " is not in model.vocab");
    }
    t.unk = it->second;
  }
  return vocab.size();
}

void load_merges(const json& m, const JsonFields& f, Tokenizer::Impl& t) {
  const json& merges = f.field(m, "merges", "model");
  if (!merges.is_array()) f.invalid("model.merges must be an array");
  if (merges.size() > static_cast<size_t>(INT32_MAX)) f.unsupported("more than 2^31 merges");
  auto id_of = [&](std::string_view token, size_t r) {
    const auto it = t.content_to_id.find(token);
    if (it == t.content_to_id.end()) {
      f.invalid("model.merges[" + std::to_string(r) + "] names \"" + std::string(token) +
                "\", which is not in model.vocab");
    }
    return it->second;
  };
  std::string ab;
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& e = merges[r];
    std::string_view a, b;
    if (e.is_string()) {  // the older "left right" form
      const std::string& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        f.invalid("model.merges[" + std::to_string(r) + "] \"" + s + "\" is not \"left right\"");
      }
      a = std::string_view(s).substr(0, sp);
      b = std::string_view(s).substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get_ref<const std::string&>();
      b = e[1].get_ref<const std::string&>();
    } else {
      f.invalid("model.merges[" + std::to_string(r) + "] must be \"left right\" or [left, right]");
    }
    ab.assign(a).append(b);
    const int32_t ia = id_of(a, r), ib = id_of(b, r), iab = id_of(ab, r);
    t.merges.insert_or_assign(ia, ib, BpeMerge{static_cast<int32_t>(r), iab});
  }
}

}  // namespace

std::string token_bytes_of(const std::string& token) {
  std::string raw;
  return detail::byte_level_to_bytes(token, raw) ? raw : token;
}

size_t load_bpe_model(const json& m, const JsonFields& f, Tokenizer::Impl& t) {
  const std::string type = f.type_of(m, "model");
  if (type != "BPE") f.unsupported("model.type \"" + type + "\"");
  check_options(m, f, t);
  const size_t n = load_vocab(m, f, t);
  load_merges(m, f, t);
  return n;
}

}  // namespace qf::rt
