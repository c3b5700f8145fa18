// qf::rt::Tokenizer on small tokenizer.json documents: some built here with expectations worked
// out by hand, the others from tests/golden/make_tokenizer_cases.py with the ids and text that
// Hugging Face `tokenizers` 0.23.3 gives (data/tokenizer_cases.json); then streaming decode,
// invalid input, every malformed-document rule, and the Unicode sets the pre-tokenizer regexes
// use, checked on every code point.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <span>
#include <thread>

#include "qf/ckpt/file_io.h"
#include "qf/rt/tokenizer.h"
#include "test_support.h"
#include "unicode_classes.h"  // runtime/src: the sets Oniguruma gives \p{L}, \s, ...

namespace qf::rt {
namespace {

using nlohmann::json;
using Merges = std::vector<std::pair<std::string, std::string>>;

// GPT-2's byte-to-character map, written out here rather than taken from the runtime.
std::string byte_char(uint8_t b) {
  const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  uint32_t cp = b;
  if (!printable) {
    cp = 0x100;
    for (int x = 0; x < b; ++x) {
      cp += !((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE);
    }
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// Raw bytes as a vocabulary entry is written.
std::string bl(std::string_view raw) {
  std::string out;
  for (const char c : raw) out += byte_char(static_cast<uint8_t>(c));
  return out;
}

json byte_level_step() {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
}

// A byte-level BPE tokenizer.json: ids 0..255 are the bytes, `tokens` (raw text) follow from
// 256; the whole text is one word unless `pre` says otherwise.
json make_doc(const std::vector<std::string>& tokens = {}, const Merges& merges = {},
              json pre = json::array({byte_level_step()})) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[bl(std::string(1, static_cast<char>(b)))] = b;
  for (size_t i = 0; i < tokens.size(); ++i) vocab[bl(tokens[i])] = 256 + i;
  json m = json::array();
  for (const auto& [a, b] : merges) m.push_back({bl(a), bl(b)});
  return {{"version", "1.0"},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", std::move(pre)}}},
          {"decoder", byte_level_step()},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
}

Tokenizer parse(const json& doc) {
  return Tokenizer::parse(doc.dump(), "case.json");
}

// The bytes of the ids' tokens, so that expectations read as text.
std::string encoded_bytes(const Tokenizer& t, std::string_view text) {
  std::string out;
  for (const int32_t id : t.encode(text)) out += t.token_bytes(id);
  return out;
}

const json& hf_cases() {
  static const json doc = json::parse(
      ckpt::read_text_file(std::string(QF_GOLDEN_DIR) + "/tokenizer_cases.json", 1 << 24));
  return doc.at("cases");
}

// Every text and id list of one HF case: ids, decode, decode without specials.
void expect_like_hf(const std::string& name) {
  SCOPED_TRACE("case " + name);
  const json& c = hf_cases().at(name);
  const Tokenizer t = Tokenizer::parse(c.at("tokenizer").dump(), name);
  for (const json& e : c.at("encode")) {
    const auto ids = e.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(t.encode(e.at("text").get<std::string>()), ids) << "text: " << e.at("text");
    EXPECT_EQ(t.decode(ids), e.at("decoded").get<std::string>()) << "text: " << e.at("text");
  }
  for (const json& d : c.at("decode")) {
    const auto ids = d.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(t.decode(ids), d.at("text").get<std::string>()) << d.at("ids");
    EXPECT_EQ(t.decode(ids, true), d.at("text_skip_special").get<std::string>()) << d.at("ids");
  }
}

TEST(Tokenizer, LowestRankedMergeFirst) {
  const Tokenizer bc_first = parse(make_doc({"ab", "bc"}, {{"b", "c"}, {"a", "b"}}));
  EXPECT_EQ(bc_first.encode("abc"), (std::vector<int32_t>{'a', 257}));
  const Tokenizer ab_first = parse(make_doc({"ab", "bc"}, {{"a", "b"}, {"b", "c"}}));
  EXPECT_EQ(ab_first.encode("abc"), (std::vector<int32_t>{256, 'c'}));
}

TEST(Tokenizer, LeftmostMergeAmongEqualRanks) {
  const Tokenizer t = parse(make_doc({"aa"}, {{"a", "a"}}));
  EXPECT_EQ(t.encode("aaa"), (std::vector<int32_t>{256, 'a'}));
  EXPECT_EQ(t.encode("aaaaa"), (std::vector<int32_t>{256, 256, 'a'}));
  EXPECT_EQ(t.encode(""), std::vector<int32_t>{});
}

TEST(Tokenizer, AddedTokensAreSplitOutFirst) {
  json doc = make_doc({"ab"}, {{"a", "b"}});
  doc["added_tokens"] = {{{"id", 257}, {"content", "<s>"}, {"special", true}},
                         {{"id", 258}, {"content", "b<"}, {"normalized", false}},
                         {{"id", 259}, {"content", "s>"}, {"normalized", true}}};
  const Tokenizer t = parse(doc);
  // "<s>" is found before BPE could merge across it.
  EXPECT_EQ(t.encode("a<s>b"), (std::vector<int32_t>{'a', 257, 'b'}));
  // The leftmost match wins ("b<" over "<s>"); tokens matched on the raw text (normalized
  // false) go first, the others only look at what is left ("s>").
  EXPECT_EQ(t.encode("ab<s>"), (std::vector<int32_t>{'a', 258, 259}));
  EXPECT_EQ(t.encode("x<s>"), (std::vector<int32_t>{'x', 257}));
  EXPECT_EQ(t.decode(std::vector<int32_t>{257, 'a', 257}), "<s>a<s>");
  EXPECT_EQ(t.decode(std::vector<int32_t>{257, 'a', 257}, true), "a");
  EXPECT_TRUE(t.is_special(257));
  EXPECT_FALSE(t.is_special(258));
  EXPECT_EQ(t.token_id("<s>"), 257);
  EXPECT_EQ(t.token_content(256), "ab");
  EXPECT_EQ(t.n_ids(), 260);
  EXPECT_EQ(t.decode(std::vector<int32_t>{-1, 260, 1000}), "");  // ids no token has
}

TEST(Tokenizer, MergePriorityAndTiesLikeHuggingFace) {
  for (const char* name :
       {"merge_priority", "leftmost_ties", "equal_rank_chain", "merge_listed_twice"}) {
    expect_like_hf(name);
  }
}

// Special and not, lstrip/rstrip over Unicode whitespace, single_word against letters, digits,
// '_' and marks, normalized true (matched after NFC, decoded in NFC) and false (raw text only),
// an added token that is a vocabulary entry, decode of contents outside the byte alphabet.
TEST(Tokenizer, AddedTokenOptionsLikeHuggingFace) {
  expect_like_hf("added_tokens");
}

TEST(Tokenizer, SplitBehaviorsLikeHuggingFace) {
  for (const char* name : {"split_Isolated", "split_Removed", "split_MergedWithPrevious",
                           "split_MergedWithNext", "split_literal"}) {
    expect_like_hf(name);
  }
}

TEST(Tokenizer, ByteLevelOptionsLikeHuggingFace) {
  expect_like_hf("byte_level_regex_prefix");
  expect_like_hf("byte_level_only");
}

TEST(Tokenizer, IgnoreMergesAndUnknownBytesLikeHuggingFace) {
  for (const char* name : {"ignore_merges", "no_ignore_merges", "unknown_bytes",
                           "unknown_bytes_fused", "unknown_bytes_dropped"}) {
    expect_like_hf(name);
  }
}

TEST(Tokenizer, EveryHuggingFaceCaseIsChecked) {
  const std::set<std::string> checked = {"merge_priority",
                                         "leftmost_ties",
                                         "equal_rank_chain",
                                         "merge_listed_twice",
                                         "added_tokens",
                                         "split_Isolated",
                                         "split_Removed",
                                         "split_MergedWithPrevious",
                                         "split_MergedWithNext",
                                         "split_literal",
                                         "byte_level_regex_prefix",
                                         "byte_level_only",
                                         "ignore_merges",
                                         "no_ignore_merges",
                                         "unknown_bytes",
                                         "unknown_bytes_fused",
                                         "unknown_bytes_dropped"};
  for (const auto& [name, c] : hf_cases().items()) EXPECT_TRUE(checked.count(name)) << name;
}

// NFC as tokenizers has it: canonical facts, plus a mark newer than its Unicode 9 data (U+1ACA,
// Unicode 14) that it leaves in place where utf8proc would reorder it before U+0736.
TEST(Tokenizer, NfcNormalizer) {
  json doc = make_doc();
  doc["normalizer"] = {{"type", "NFC"}};
  const Tokenizer t = parse(doc);
  EXPECT_EQ(encoded_bytes(t, "e\u0301"), "\u00e9");
  EXPECT_EQ(encoded_bytes(t, "a\u0301\u0323"), "\u1ea1\u0301");  // reordered, then composed
  EXPECT_EQ(encoded_bytes(t, "\u212b"), "\u00c5");               // singleton decomposition
  EXPECT_EQ(encoded_bytes(t, "\u0958"), "\u0915\u093c");         // excluded from composition
  EXPECT_EQ(encoded_bytes(t, "\u1100\u1161\u11a8"), "\uac01");   // Hangul L V T
  EXPECT_EQ(encoded_bytes(t, "x\u1aca\u0736"), "x\u1aca\u0736");
  EXPECT_EQ(encoded_bytes(t, "plain ascii"), "plain ascii");
}

TEST(StreamDecoder, ConcatenationEqualsDecode) {
  const json& c = hf_cases().at("added_tokens");  // byte tokens, a 2-byte token, specials
  const Tokenizer t = Tokenizer::parse(c.at("tokenizer").dump(), "added_tokens");
  std::mt19937 rng(7);
  for (int round = 0; round < 3000; ++round) {
    std::vector<int32_t> ids(1 + rng() % 40);
    for (int32_t& id : ids) {  // mostly bytes >= 0x80 so that characters are cut apart
      const uint32_t r = rng() % 10;
      id = r < 6 ? 0x80 + static_cast<int32_t>(rng() % 0x80)
                 : static_cast<int32_t>(rng() % (t.n_ids() + 2));
    }
    for (const bool skip : {false, true}) {
      StreamDecoder stream(t, skip);
      std::string out;
      for (const int32_t id : ids) out += stream.push(id);
      out += stream.finish();
      ASSERT_EQ(out, t.decode(ids, skip)) << "round " << round;
    }
  }
  StreamDecoder stream(t);  // a character completed by its last byte comes out then
  EXPECT_EQ(stream.push(0xE4), "");
  EXPECT_EQ(stream.push(0xB8), "");
  EXPECT_EQ(stream.push(0xAD), "\u4e2d");
  EXPECT_EQ(stream.push(0xE4), "");
  EXPECT_EQ(stream.push('a'), "\ufffda");
  EXPECT_EQ(stream.push(0xE4), "");
  EXPECT_EQ(stream.finish(), "\ufffd");
}

TEST(Tokenizer, InvalidUtf8IsAUsageError) {
  const Tokenizer t = parse(make_doc());
  const std::pair<std::string, size_t> bad[] = {{"\xff", 0},
                                                {"ab\x80", 2},
                                                {"\xc0\xaf", 0},          // overlong
                                                {"a\xed\xa0\x80", 1},     // surrogate
                                                {"\xf4\x90\x80\x80", 0},  // above U+10FFFF
                                                {"abc\xe4\xb8", 3}};      // cut short
  for (const auto& [text, at] : bad) {
    try {
      t.encode(text);
      ADD_FAILURE() << "no error for byte " << at;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kUsage);
      EXPECT_NE(std::string(e.what()).find("not valid UTF-8 at byte " + std::to_string(at)),
                std::string::npos)
          << e.what();
    }
  }
}

struct Malformed {
  const char* what;
  std::string text;
  Errc code;
  std::string message;  // a fragment the message must hold
};

std::vector<Malformed> malformed_documents() {
  const json good = make_doc({"ab"}, {{"a", "b"}});
  auto with = [&](const std::function<void(json&)>& edit) {
    json d = good;
    edit(d);
    return d.dump();
  };
  const std::string text = good.dump();
  const json added = {{"id", 257}, {"content", "<s>"}, {"special", true}};
  auto added_with = [&](const char* key, json value) {
    json a = added;
    a[key] = std::move(value);
    return a;
  };
  return {
      {"not JSON", "tokenizer", Errc::kTokenizerInvalid, "not valid JSON"},
      {"truncated file", text.substr(0, text.size() / 2), Errc::kTokenizerInvalid,
       "not valid JSON"},
      {"not an object", "[1, 2]", Errc::kTokenizerInvalid, "not a JSON object"},
      {"missing model", with([](json& d) { d.erase("model"); }), Errc::kTokenizerInvalid,
       "tokenizer.json: missing \"model\""},
      {"missing vocab", with([](json& d) { d["model"].erase("vocab"); }), Errc::kTokenizerInvalid,
       "model: missing \"vocab\""},
      {"merge of an unknown token", with([](json& d) {
         d["model"]["merges"].push_back({"zz", "a"});
       }),
       Errc::kTokenizerInvalid, "model.merges[1] names \"zz\", which is not in model.vocab"},
      {"merge whose result is unknown", with([](json& d) {
         d["model"]["merges"].push_back({"a", "c"});
       }),
       Errc::kTokenizerInvalid, "model.merges[1] names \"ac\""},
      {"merge of the wrong shape", with([](json& d) {
         d["model"]["merges"][0] = {1, 2};
       }),
       Errc::kTokenizerInvalid, "model.merges[0] must be"},
      {"WordPiece", with([](json& d) { d["model"]["type"] = "WordPiece"; }), Errc::kUnsupported,
       "model.type \"WordPiece\" is not supported"},
      {"normalizer", with([](json& d) {
         d["normalizer"] = {{"type", "Lowercase"}};
       }),
       Errc::kUnsupported, "normalizer \"Lowercase\" is not supported"},
      {"NFKC", with([](json& d) {
         d["normalizer"] = {{"type", "NFKC"}};
       }),
       Errc::kUnsupported, "normalizer \"NFKC\""},
      {"vocab ids twice", with([](json& d) { d["model"]["vocab"]["zz"] = 97; }),
       Errc::kTokenizerInvalid, "model.vocab: id 97 is given to both"},
      // A stray large id would size the id tables past memory (fuzz_config found 266666666).
      {"vocab id past its size", with([](json& d) { d["model"]["vocab"]["zz"] = 266666666; }),
       Errc::kTokenizerInvalid, "model.vocab[\"zz\"]: id 266666666 is past the vocabulary's"},
      {"added ids twice", with([&](json& d) {
         d["added_tokens"] = json::array({added, added_with("content", "</s>")});
       }),
       Errc::kTokenizerInvalid, "added_tokens[1] (\"</s>\"): id 257 is also added_tokens[0]"},
      {"added id of a vocabulary token",
       with([&](json& d) { d["added_tokens"] = json::array({added_with("id", 97)}); }),
       Errc::kTokenizerInvalid, "added_tokens[0] (\"<s>\"): id 97 is the vocabulary's \"a\""},
      {"added id past a gap",
       with([&](json& d) { d["added_tokens"] = json::array({added_with("id", 300)}); }),
       Errc::kTokenizerInvalid, "id 300, but tokenizers gives it id 257 (the next id after"},
      {"added content twice", with([&](json& d) {
         d["added_tokens"] = json::array({added, added});
       }),
       Errc::kTokenizerInvalid, "added_tokens[1] (\"<s>\") repeats added_tokens[0]"},
      {"added token with a vocabulary id elsewhere",
       with([&](json& d) { d["added_tokens"] = json::array({added_with("content", "ab")}); }),
       Errc::kTokenizerInvalid, "id 257, but tokenizers gives it id 256 (its vocabulary id)"},
      {"vocab id a string", with([](json& d) { d["model"]["vocab"]["a"] = "97"; }),
       Errc::kTokenizerInvalid, "model.vocab[\"a\"] must be an integer id"},
      {"vocab id a fraction", with([](json& d) { d["model"]["vocab"]["a"] = 97.5; }),
       Errc::kTokenizerInvalid, "model.vocab[\"a\"] must be an integer id"},
      {"vocab id negative", with([](json& d) { d["model"]["vocab"]["a"] = -1; }),
       Errc::kTokenizerInvalid, "model.vocab[\"a\"] must be an integer id"},
      {"added id missing", with([](json& d) {
         d["added_tokens"] = json::array({json{{"content", "<s>"}}});
       }),
       Errc::kTokenizerInvalid, "added_tokens[0]: missing \"id\""},
      {"added content empty",
       with([&](json& d) { d["added_tokens"] = json::array({added_with("content", "")}); }),
       Errc::kTokenizerInvalid, "added_tokens[0].content must be a non-empty string"},
      {"flag not boolean",
       with([&](json& d) { d["added_tokens"] = json::array({added_with("lstrip", "yes")}); }),
       Errc::kTokenizerInvalid, "added_tokens[0].lstrip must be true or false"},
      {"bad regex", with([](json& d) {
         d["pre_tokenizer"]["pretokenizers"].insert(
             d["pre_tokenizer"]["pretokenizers"].begin(),
             json{{"type", "Split"}, {"pattern", {{"Regex", "a(b"}}}, {"behavior", "Isolated"}});
       }),
       Errc::kTokenizerInvalid, "pre_tokenizer[0].pattern: regex error at offset 3"},
      {"Split behavior", with([](json& d) {
         d["pre_tokenizer"]["pretokenizers"].insert(
             d["pre_tokenizer"]["pretokenizers"].begin(),
             json{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Contiguous"}});
       }),
       Errc::kUnsupported, "pre_tokenizer[0].behavior \"Contiguous\""},
      {"no ByteLevel step", with([](json& d) { d["pre_tokenizer"] = nullptr; }), Errc::kUnsupported,
       "without a final ByteLevel step"},
      {"step after ByteLevel", with([](json& d) {
         d["pre_tokenizer"]["pretokenizers"].push_back({{"type", "Whitespace"}});
       }),
       Errc::kUnsupported, "pre_tokenizer[1] \"Whitespace\" after ByteLevel"},
      {"decoder", with([](json& d) {
         d["decoder"] = {{"type", "WordPiece"}};
       }),
       Errc::kUnsupported, "decoder \"WordPiece\""},
      {"post_processor adding tokens", with([](json& d) {
         d["post_processor"] = {
             {"type", "TemplateProcessing"},
             {"single", {{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}}}};
       }),
       Errc::kUnsupported, "post_processor \"TemplateProcessing\" adding tokens"},
      {"dropout", with([](json& d) { d["model"]["dropout"] = 0.1; }), Errc::kUnsupported,
       "model.dropout 0.1"},
      {"byte_fallback", with([](json& d) { d["model"]["byte_fallback"] = true; }),
       Errc::kUnsupported, "model.byte_fallback"},
      {"unknown unk_token", with([](json& d) { d["model"]["unk_token"] = "<unk>"; }),
       Errc::kTokenizerInvalid, "model.unk_token \"<unk>\" is not in model.vocab"},
      {"version", with([](json& d) { d["version"] = "2.0"; }), Errc::kUnsupported,
       "version \"2.0\""},
  };
}

TEST(Tokenizer, MalformedDocumentsAreRefusedByName) {
  ASSERT_NO_THROW(parse(make_doc({"ab"}, {{"a", "b"}})));
  for (const Malformed& m : malformed_documents()) {
    try {
      Tokenizer::parse(m.text, "case.json");
      ADD_FAILURE() << m.what << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), m.code) << m.what << ": " << e.what();
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("case.json: ", 0), 0u) << m.what << ": " << msg;
      EXPECT_NE(msg.find(m.message), std::string::npos) << m.what << ": " << msg;
    }
  }
}

// encode adds no token: post-processors that add none either are accepted.
TEST(Tokenizer, PostProcessorsAddingNothingAreAccepted) {
  json doc = make_doc();
  const json template_a = {{"type", "TemplateProcessing"},
                           {"single", json::array({{{"Sequence", {{"id", "A"}}}}})}};
  for (const json& p :
       {byte_level_step(), template_a,
        json{{"type", "Sequence"}, {"processors", json::array({byte_level_step(), template_a})}}}) {
    doc["post_processor"] = p;
    EXPECT_NO_THROW(parse(doc)) << p;
  }
}

TEST(Tokenizer, LoadNamesTheFile) {
  const test::TempDir dir;
  EXPECT_EQ(test::error_code([&] { Tokenizer::load(dir / "missing.json"); }), Errc::kIo);
  test::write_file(dir / "tokenizer.json", "{");
  try {
    Tokenizer::load(dir / "tokenizer.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kTokenizerInvalid);
    EXPECT_NE(std::string(e.what()).find((dir / "tokenizer.json").string()), std::string::npos);
  }
  test::write_file(dir / "tokenizer.json", make_doc().dump());
  EXPECT_EQ(Tokenizer::load(dir / "tokenizer.json").n_ids(), 256);
}

// Every code point through Split(pattern, Removed): what is left is exactly what the class
// does not match in Oniguruma (unicode_classes.h, read from tokenizers itself).
TEST(Tokenizer, RegexClassesMatchOniguruma) {
  auto in = [](std::span<const unicode::Range> t, uint32_t cp) {
    return std::any_of(t.begin(), t.end(), [&](auto r) { return r.first <= cp && cp <= r.last; });
  };
  struct Class {
    const char* pattern;
    std::function<bool(uint32_t)> removed;
  };
  const Class classes[] = {
      {"\\p{L}", [&](uint32_t c) { return in(unicode::kLetter, c); }},
      {"\\p{M}", [&](uint32_t c) { return in(unicode::kMark, c); }},
      {"\\p{N}", [&](uint32_t c) { return in(unicode::kNumber, c); }},
      {"\\s", [&](uint32_t c) { return in(unicode::kWhiteSpace, c); }},
      {"\\S", [&](uint32_t c) { return !in(unicode::kWhiteSpace, c); }},
      {"[^\\s\\p{L}\\p{N}]",
       [&](uint32_t c) {
         return !in(unicode::kWhiteSpace, c) && !in(unicode::kLetter, c) &&
                !in(unicode::kNumber, c);
       }},
  };
  for (const Class& k : classes) {
    const json split = {
        {"type", "Split"}, {"pattern", {{"Regex", k.pattern}}}, {"behavior", "Removed"}};
    const Tokenizer t = parse(make_doc({}, {}, json::array({split, byte_level_step()})));
    std::string text, left;
    for (uint32_t cp = 0; cp < 0x110000; ++cp) {
      if (cp >= 0xD800 && cp < 0xE000) continue;
      std::string c;
      if (cp < 0x80) {
        c = std::string(1, static_cast<char>(cp));
      } else if (cp < 0x800) {
        c = {static_cast<char>(0xC0 | cp >> 6), static_cast<char>(0x80 | (cp & 0x3F))};
      } else if (cp < 0x10000) {
        c = {static_cast<char>(0xE0 | cp >> 12), static_cast<char>(0x80 | (cp >> 6 & 0x3F)),
             static_cast<char>(0x80 | (cp & 0x3F))};
      } else {
        c = {static_cast<char>(0xF0 | cp >> 18), static_cast<char>(0x80 | (cp >> 12 & 0x3F)),
             static_cast<char>(0x80 | (cp >> 6 & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
      }
      text += c;
      if (!k.removed(cp)) left += c;
    }
    EXPECT_TRUE(encoded_bytes(t, text) == left) << "pattern " << k.pattern;
  }
}

// \s+(?!\S) backtracks over the whole run: megabytes of it must not hit a PCRE2 limit.
TEST(Tokenizer, LongWhitespaceRuns) {
  const json split = {{"type", "Split"},
                      {"pattern", {{"Regex", "\\s+(?!\\S)|\\s+|\\S+"}}},
                      {"behavior", "Isolated"}};
  const Tokenizer t =
      parse(make_doc({"  "}, {{" ", " "}}, json::array({split, byte_level_step()})));
  const std::string text = std::string(2'000'001, ' ') + "x";
  const std::vector<int32_t> ids = t.encode(text);
  ASSERT_EQ(ids.size(), 1'000'002u);  // 1,000,000 "  " then " " then "x"
  EXPECT_EQ(ids[999'999], 256);
  EXPECT_EQ(ids[1'000'000], ' ');
  EXPECT_EQ(ids[1'000'001], 'x');
}

// The per-thread BPE cache must not mix tokenizers, and encode may run on several threads.
TEST(Tokenizer, CacheKeepsTokenizersApartAndThreadsWork) {
  const Tokenizer a = parse(make_doc({"ab"}, {{"a", "b"}}));
  const Tokenizer b = parse(make_doc());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a.encode("ab"), std::vector<int32_t>{256});
    EXPECT_EQ(b.encode("ab"), (std::vector<int32_t>{'a', 'b'}));
  }
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "ab ba aab " + std::to_string(i % 97) + "\n";
  const std::vector<int32_t> want = a.encode(text);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (auto& g : got) threads.emplace_back([&] { g = a.encode(text); });
  for (auto& th : threads) th.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
}

}  // namespace
}  // namespace qf::rt
