// tokenizer.json -> Tokenizer::Impl. Only what byte-level BPE tokenizers (GPT-2, Qwen, Llama 3)
// use is accepted; anything else is refused by name rather than approximated.
#include <algorithm>
#include <atomic>
#include <map>
#include <nlohmann/json.hpp>

#include "qf/ckpt/file_io.h"
#include "qf/error.h"
#include "tokenizer_impl.h"
#include "tokenizer_load.h"
#include "utf8.h"

namespace qf::rt {
namespace {

using nlohmann::json;

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A literal string as a PCRE2 pattern.
std::string escape_literal(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

class DocLoader : public JsonFields {
 public:
  using JsonFields::JsonFields;

  void normalizer(const json& n, Tokenizer::Impl& t) const {
    if (n.is_null()) return;
    std::vector<const json*> list{&n};
    if (type_of(n, "normalizer") == "Sequence") {
      list.clear();
      const json& seq = field(n, "normalizers", "normalizer");
      if (!seq.is_array()) invalid("normalizer.normalizers must be an array");
      for (const json& e : seq) list.push_back(&e);
    }
    for (const json* e : list) {
      const std::string type = type_of(*e, "normalizer");
      if (type != "NFC") unsupported("normalizer \"" + type + "\"");
      t.nfc = true;  // NFC twice is NFC once
    }
  }

  void pre_tokenizer(const json& p, Tokenizer::Impl& t) const {
    std::vector<const json*> list;
    if (!p.is_null()) list.push_back(&p);
    if (!p.is_null() && type_of(p, "pre_tokenizer") == "Sequence") {
      list.clear();
      const json& seq = field(p, "pretokenizers", "pre_tokenizer");
      if (!seq.is_array()) invalid("pre_tokenizer.pretokenizers must be an array");
      for (const json& e : seq) list.push_back(&e);
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const json& e = *list[i];
      const std::string where = "pre_tokenizer[" + std::to_string(i) + "]";
      const std::string type = type_of(e, where);
      if (!t.pre.empty() && t.pre.back().kind == PreTokenizeStep::Kind::kByteLevel) {
        unsupported(where + " \"" + type + "\" after ByteLevel");
      }
      PreTokenizeStep step;
      if (type == "Split") {
        split(e, where, step);
      } else if (type == "ByteLevel") {
        step.kind = PreTokenizeStep::Kind::kByteLevel;
        step.add_prefix_space = flag(e, "add_prefix_space", false, where);
        if (flag(e, "use_regex", true, where)) step.regex.emplace(kGpt2Pattern, "GPT-2 pattern");
      } else {
        unsupported(where + ".type \"" + type + "\"");
      }
      t.pre.push_back(std::move(step));
    }
    if (t.pre.empty() || t.pre.back().kind != PreTokenizeStep::Kind::kByteLevel) {
      unsupported("a pre_tokenizer without a final ByteLevel step (not a byte-level BPE)");
    }
  }

  void decoder_and_post(const json& d, const json& p) const {
    const std::string dtype = d.is_null() ? "null" : type_of(d, "decoder");
    if (dtype != "ByteLevel") {
      unsupported("decoder \"" + dtype + "\" (byte-level BPE needs ByteLevel)");
    }
    if (!p.is_null() && !adds_nothing(p, "post_processor")) {
      unsupported("post_processor \"" + type_of(p, "post_processor") + "\" adding tokens");
    }
  }

  void added_tokens(const json& list, std::vector<AddedToken>& out) const {
    if (!list.is_array()) invalid("added_tokens must be an array");
    for (size_t i = 0; i < list.size(); ++i) {
      const json& e = list[i];
      const std::string where = "added_tokens[" + std::to_string(i) + "]";
      AddedToken a;
      a.id = id_value(field(e, "id", where), where + ".id");
      const json& content = field(e, "content", where);
      if (!content.is_string() || content.get_ref<const std::string&>().empty()) {
        invalid(where + ".content must be a non-empty string");
      }
      a.content = content.get<std::string>();  // UTF-8: the JSON parser checks strings
      a.special = flag(e, "special", false, where);
      a.single_word = flag(e, "single_word", false, where);
      a.lstrip = flag(e, "lstrip", false, where);
      a.rstrip = flag(e, "rstrip", false, where);
      a.normalized = flag(e, "normalized", !a.special, where);
      out.push_back(std::move(a));
    }
  }

 private:
  // encode adds no token, which matches tokenizers only where the post-processor would not
  // either: ByteLevel (offsets only), a template of the sequence alone, or a Sequence of those.
  bool adds_nothing(const json& p, const std::string& where) const {
    const std::string type = type_of(p, where);
    if (type == "ByteLevel") return true;
    if (type == "Sequence") {
      const json& list = field(p, "processors", where);
      return list.is_array() && std::all_of(list.begin(), list.end(), [&](const json& e) {
               return adds_nothing(e, where + ".processors[]");
             });
    }
    if (type == "TemplateProcessing") {
      const json& single = field(p, "single", where);
      return single.is_array() && std::all_of(single.begin(), single.end(), [](const json& e) {
               return e.is_object() && e.size() == 1 && e.contains("Sequence");
             });
    }
    return false;
  }

  void split(const json& e, const std::string& where, PreTokenizeStep& step) const {
    const json& pat = field(e, "pattern", where);
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      step.regex.emplace(pat["Regex"].get<std::string>(), src_ + ": " + where + ".pattern");
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      step.regex.emplace(escape_literal(pat["String"].get<std::string>()),
                         src_ + ": " + where + ".pattern");
    } else {
      invalid(where + ".pattern must be {\"Regex\": ...} or {\"String\": ...}");
    }
    if (flag(e, "invert", false, where)) unsupported(where + ".invert");
    const json& b = e.value("behavior", json("Isolated"));
    const std::string behavior = b.is_string() ? b.get<std::string>() : b.dump();
    static const std::map<std::string, SplitBehavior> kBehaviors = {
        {"Isolated", SplitBehavior::kIsolated},
        {"Removed", SplitBehavior::kRemoved},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext}};
    const auto it = kBehaviors.find(behavior);
    if (it == kBehaviors.end()) unsupported(where + ".behavior \"" + behavior + "\"");
    step.behavior = it->second;
  }
};

// Whether a vocabulary entry has this id (before added tokens are placed).
bool is_vocab_id(const Tokenizer::Impl& t, int32_t id) {
  if (static_cast<size_t>(id) >= t.id_content.size()) return false;
  const auto it = t.content_to_id.find(t.id_content[id]);
  return it != t.content_to_id.end() && it->second == id;
}

// Ids, special flags and matching sets of the added tokens. `tokenizers` ignores the ids in the
// file: a token takes its vocabulary id when its content is a vocabulary entry, otherwise the
// next id from the vocabulary size on, in file order. A file whose ids disagree would encode
// differently here and there, so it is refused.
void place_added_tokens(const JsonFields& f, Tokenizer::Impl& t, size_t vocab_size) {
  std::map<std::string, size_t> by_content;
  std::map<int32_t, size_t> by_id;
  auto next_id = static_cast<int64_t>(vocab_size);
  auto name = [&](size_t i) {
    return "added_tokens[" + std::to_string(i) + "] (\"" + t.added[i].content + "\")";
  };
  for (size_t i = 0; i < t.added.size(); ++i) {
    const AddedToken& a = t.added[i];
    const std::string id = "id " + std::to_string(a.id);
    if (const auto [it, fresh] = by_content.emplace(a.content, i); !fresh) {
      f.invalid(name(i) + " repeats added_tokens[" + std::to_string(it->second) + "]");
    }
    if (const auto [it, fresh] = by_id.emplace(a.id, i); !fresh) {
      f.invalid(name(i) + ": " + id + " is also " + name(it->second));
    }
    const auto in_vocab = t.content_to_id.find(a.content);  // the vocabulary's entries so far
    const bool known = in_vocab != t.content_to_id.end();
    if (!known && is_vocab_id(t, a.id)) {
      f.invalid(name(i) + ": " + id + " is the vocabulary's \"" + t.id_content[a.id] + "\"");
    }
    const int64_t expect = known ? in_vocab->second : next_id++;
    if (a.id != expect) {
      f.invalid(name(i) + ": " + id + ", but tokenizers gives it id " + std::to_string(expect) +
                (known ? " (its vocabulary id)" : " (the next id after the vocabulary)"));
    }
  }
  for (const AddedToken& a : t.added) {
    if (static_cast<size_t>(a.id) >= t.id_bytes.size()) {
      t.id_bytes.resize(a.id + 1);
      t.id_content.resize(a.id + 1);
      t.id_special.resize(a.id + 1);
    }
    // A normalized token is matched, and decoded, in its normalized form.
    std::string buffer;
    const std::string form(a.normalized && t.nfc ? detail::nfc(a.content, buffer) : a.content);
    t.id_bytes[a.id] = token_bytes_of(form);
    t.id_content[a.id] = a.content;
    t.id_special[a.id] = a.special;
    t.content_to_id[a.content] = a.id;
    Tokenizer::Impl::AddedIndex& index = a.normalized ? t.added_normalized : t.added_raw;
    index.by_first_byte[static_cast<uint8_t>(form[0])].push_back({form, &a});  // a stays put
    index.empty = false;
  }
  for (auto* index : {&t.added_raw, &t.added_normalized}) {
    for (auto& v : index->by_first_byte) {
      std::stable_sort(v.begin(), v.end(),
                       [](const auto& x, const auto& y) { return x.text.size() > y.text.size(); });
    }
  }
}

}  // namespace

Tokenizer Tokenizer::parse(std::string_view text, const std::string& source) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(Errc::kTokenizerInvalid, source + ": not valid JSON: " + e.what());
  }
  const DocLoader l(source);
  if (!doc.is_object()) l.invalid("the document is not a JSON object");
  if (const json& v = doc.value("version", json()); !v.is_null() && v != "1.0") {
    l.unsupported("version " + v.dump() + " (expected \"1.0\")");
  }
  auto impl = std::make_unique<Impl>();
  impl->source = source;
  static std::atomic<uint64_t> next_uid{1};
  impl->uid = next_uid++;
  l.added_tokens(doc.value("added_tokens", json::array()), impl->added);
  l.normalizer(doc.value("normalizer", json()), *impl);
  l.pre_tokenizer(doc.value("pre_tokenizer", json()), *impl);
  l.decoder_and_post(doc.value("decoder", json()), doc.value("post_processor", json()));
  const size_t vocab_size = load_bpe_model(l.field(doc, "model", "tokenizer.json"), l, *impl);
  place_added_tokens(l, *impl, vocab_size);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw Error(Errc::kIo, "'" + path.string() + "': no such tokenizer file");
  }
  return parse(ckpt::read_text_file(path, 1ull << 30), path.string());
}

}  // namespace qf::rt
