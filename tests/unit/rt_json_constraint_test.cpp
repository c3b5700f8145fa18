// JsonConstraint on Qwen3.5's tokenizer: the trie walk's masks against each id tried one by one
// (JsonConstraint::allows, the matcher fed the id's bytes), at states inside every kind of
// value; the think block; and whole generations from random logits through the generation
// loop, greedy and sampled, whose text must parse and satisfy the schema.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <regex>

#include "qf/error.h"
#include "qf/rt/generate.h"
#include "qf/rt/json_constraint.h"

namespace qf::rt {
namespace {

using Json = nlohmann::ordered_json;

const Tokenizer& qwen() {
  static const Tokenizer t = Tokenizer::load(QF_TOKENIZER_JSON);
  return t;
}

std::shared_ptr<const TokenTrie> trie() {
  static const auto t = [] {
    const Tokenizer& tok = qwen();
    const auto t0 = std::chrono::steady_clock::now();
    auto built = std::make_shared<const TokenTrie>(tok);
    std::printf(
        "  the trie of %d ids: %zu nodes, built in %.0f ms\n", tok.n_ids(), built->nodes().size(),
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    return built;
  }();
  return t;
}

int32_t im_end() {
  return *qwen().token_id("<|im_end|>");
}

const char* const kSchema = R"({"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "codes": {"type": "array", "items": {"enum": ["x1", "y22", null]}, "maxItems": 2},
    "note": {"type": "string", "maxLength": 4},
    "zip": {"type": "string", "pattern": "^[0-9]{4} ?[A-Z]{2}$"},
    "when": {"type": "string", "format": "date"}},
    "required": ["city", "days", "zip"], "additionalProperties": false})";

std::shared_ptr<JsonConstraint> constraint(const char* schema, bool reasoning = false) {
  auto g = std::make_shared<const JsonGrammar>(
      schema ? JsonGrammar::from_schema(Json::parse(schema)) : JsonGrammar::any_object());
  return std::make_shared<JsonConstraint>(trie(), g, std::vector<int32_t>{im_end()}, reasoning);
}

void accept_text(JsonConstraint& c, const std::string& text) {
  for (const int32_t id : qwen().encode(text)) c.accept(id);
}

// The mask from the trie walk, id for id the verdict of feeding that id's bytes.
void expect_mask_is_each_ids_verdict(const JsonConstraint& c, const std::string& where) {
  const int64_t n = 248320;  // the LM head's rows: padding past the tokenizer's ids
  std::vector<uint64_t> bits;
  const auto t0 = std::chrono::steady_clock::now();
  c.allowed(n, bits);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  int64_t allowed = 0, wrong = 0;
  for (int32_t id = 0; id < n; ++id) {
    const bool bit = bits[static_cast<size_t>(id) >> 6] >> (id & 63) & 1;
    const bool one = id < trie()->n_ids() && c.allows(id);
    allowed += bit;
    if (bit != one && ++wrong <= 5) ADD_FAILURE() << where << ": id " << id << " mask " << bit;
  }
  EXPECT_EQ(wrong, 0) << where;
  EXPECT_GT(allowed, 0) << where;
  std::printf("  %-28s %7lld ids allowed, mask %.2f ms\n", where.c_str(),
              static_cast<long long>(allowed), ms);
}

TEST(TokenTrie, HoldsEveryOrdinaryIdOnceUnderItsBytes) {
  const TokenTrie& t = *trie();
  std::vector<int> seen(static_cast<size_t>(t.n_ids()));
  // Walk the trie, rebuilding each node's bytes.
  const auto visit = [&](auto& self, uint32_t node, const std::string& path) -> void {
    const TokenTrie::Node& p = t.nodes()[node];
    for (uint32_t i = p.begin; i < p.own_end; ++i) {
      EXPECT_EQ(t.bytes(t.ids()[i]), path);
      ++seen[static_cast<size_t>(t.ids()[i])];
    }
    // free_from: each id's bytes past the node's run through the UTF-8 states from q.
    uint8_t free_from = 0;
    for (int q = 0; q < kUtf8States; ++q) {
      bool free = true;
      for (uint32_t i = p.own_end; i < p.end && free; ++i) {
        int state = q;
        for (const char c : t.bytes(t.ids()[i]).substr(path.size())) {
          if ((state = json_string_byte(state, static_cast<uint8_t>(c))) < 0) break;
        }
        free = state >= 0;
      }
      free_from |= static_cast<uint8_t>(free << q);
    }
    EXPECT_EQ(p.free_from, free_from) << path;
    uint32_t max_chars = 0;
    for (uint32_t i = p.own_end; i < p.end; ++i) {
      uint32_t chars = 0;
      for (const char c : t.bytes(t.ids()[i]).substr(path.size()))
        chars += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
      max_chars = std::max(max_chars, chars);
    }
    EXPECT_EQ(p.max_chars, max_chars) << path;
    for (uint32_t c = p.first_child; c < p.first_child + p.n_children; ++c)
      self(self, c, path + static_cast<char>(t.nodes()[c].byte));
  };
  visit(visit, 0, "");
  for (int32_t id = 0; id < t.n_ids(); ++id) {
    EXPECT_EQ(seen[static_cast<size_t>(id)], qwen().is_special(id) ? 0 : 1) << id;
  }
}

TEST(JsonConstraint, MaskIsEachIdsVerdict) {
  {
    auto c = constraint(nullptr);
    expect_mask_is_each_ids_verdict(*c, "object: start");
    accept_text(*c, "{\"a");
    expect_mask_is_each_ids_verdict(*c, "object: in a key");
    accept_text(*c, "\": \"text");
    expect_mask_is_each_ids_verdict(*c, "object: in a string");
    accept_text(*c, " \\u00");
    expect_mask_is_each_ids_verdict(*c, "object: in a \\u escape");
    accept_text(*c, "e9\", \"n\": [12");
    expect_mask_is_each_ids_verdict(*c, "object: in a number");
    accept_text(*c, "]}");
    EXPECT_TRUE(c->complete());
    EXPECT_TRUE(c->allows(im_end()));
    expect_mask_is_each_ids_verdict(*c, "object: complete");
  }
  {
    auto c = constraint(kSchema);
    EXPECT_FALSE(c->allows(im_end()));
    accept_text(*c, "{\n  \"city\": \"Oslo\",\n  \"days\": 1");
    expect_mask_is_each_ids_verdict(*c, "schema: in a bounded integer");
    accept_text(*c, "2");
    expect_mask_is_each_ids_verdict(*c, "schema: after an integer");
    accept_text(*c, ", \"codes\": [\"y");
    expect_mask_is_each_ids_verdict(*c, "schema: in an enum string");
    accept_text(*c, "22\"], \"note\": \"ab");
    expect_mask_is_each_ids_verdict(*c, "schema: in a maxLength string");
    accept_text(*c, "\", \"zip\": \"12");
    expect_mask_is_each_ids_verdict(*c, "schema: in a pattern string");
    accept_text(*c, "34 NL\", \"when\": \"2024-0");
    expect_mask_is_each_ids_verdict(*c, "schema: in a date string");
  }
  {  // a pattern most strings match: the walk goes byte by byte through most of the trie
    auto c = constraint(R"({"type": "string", "pattern": "[a-z]", "maxLength": 40})");
    accept_text(*c, "\"Ab");
    expect_mask_is_each_ids_verdict(*c, "schema: in a loose pattern");
  }
}

// The reply is free until `</think>`; then the value, whitespace first if it likes.
TEST(JsonConstraint, StartsAfterTheThinkBlock) {
  auto c = constraint(kSchema, /*reasoning=*/true);
  EXPECT_TRUE(c->in_reasoning());
  EXPECT_TRUE(c->allows(im_end()));
  EXPECT_TRUE(c->allows(*qwen().token_id("<tool_call>")));
  std::vector<float> row(248320, 1.0f);
  c->mask(row);
  EXPECT_EQ(std::count(row.begin(), row.end(), 1.0f), 248320);
  accept_text(*c, "The user wants a city. </thi");
  EXPECT_TRUE(c->in_reasoning());
  accept_text(*c, "nk>\n\n");
  EXPECT_FALSE(c->in_reasoning());
  EXPECT_FALSE(c->allows(im_end()));
  EXPECT_TRUE(c->allows(qwen().encode("{")[0]));
  EXPECT_FALSE(c->allows(qwen().encode("Sure")[0]));
  EXPECT_FALSE(c->allows(*qwen().token_id("<tool_call>")));
  accept_text(*c, "{\"city\": \"Rome\", \"days\": 2, \"zip\": \"1234AB\"}");
  EXPECT_TRUE(c->complete());
  EXPECT_THROW(c->accept(qwen().encode("x")[0]), Error);
}

// Generations from random logits, through generate_with and TokenChooser: whatever the logits,
// the text is the schema's.
TEST(JsonConstraint, GenerationsFromRandomLogitsAreValid) {
  const int64_t vocab = 248320;
  std::vector<bool> closers(static_cast<size_t>(vocab));
  for (int32_t id = 0; id < trie()->n_ids(); ++id)
    closers[static_cast<size_t>(id)] =
        trie()->bytes(id).find_first_of("\"]},") != std::string::npos;
  const auto closing = [&](int64_t id) { return closers[static_cast<size_t>(id)]; };
  for (const bool sampled : {false, true}) {
    for (int seed = 0; seed < 3; ++seed) {
      std::mt19937 rng(static_cast<unsigned>(100 + seed));
      std::normal_distribution<float> normal(0.0f, 3.0f);
      // Logits that favour closing strings and containers and the end, so that generations
      // finish.
      const StepFn step = [&](int32_t, float* logits) {
        if (!logits) return 0;  // a prompt token before the last
        for (int64_t i = 0; i < vocab; ++i) logits[i] = normal(rng) + (closing(i) ? 8.0f : 0.0f);
        logits[im_end()] = 12.0f;
        return 0;
      };
      GenerateOptions o;
      o.max_tokens = 400;
      o.stop_ids = {im_end()};
      o.constraint = constraint(kSchema);
      if (sampled) o.sampling = {.temperature = 1.0f, .top_k = 50, .seed = uint64_t(seed)};
      const std::vector<int32_t> prompt = {1, 2, 3};
      const GenerateResult r = generate_with(step, vocab, prompt, o, [](int32_t) {});
      const std::string text = qwen().decode(r.ids);
      EXPECT_EQ(r.finish_reason, "stop") << text;
      ASSERT_TRUE(Json::accept(text)) << text;
      const Json v = Json::parse(text);
      EXPECT_TRUE(v.contains("city") && v["city"].is_string()) << text;
      EXPECT_TRUE(v.contains("days") && v["days"].is_number_integer()) << text;
      EXPECT_TRUE(std::regex_match(v["zip"].get<std::string>(), std::regex("[0-9]{4} ?[A-Z]{2}")))
          << text;
      if (v.contains("when")) {
        EXPECT_TRUE(std::regex_match(v["when"].get<std::string>(),
                                     std::regex("[0-9]{4}-[01][0-9]-[0-3][0-9]")))
            << text;
      }
      if (v.contains("note")) {  // maxLength 4: code points
        size_t chars = 0;
        for (const char c : v["note"].get<std::string>())
          chars += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
        EXPECT_LE(chars, 4u) << text;
      }
    }
  }
}

}  // namespace
}  // namespace qf::rt
