// JSON schema helpers for the structured-output tests: a matcher's verdict on a text and a text
// written by a random walk of the matcher's allowed bytes; json_satisfies.h checks values
// against a schema by the JSON Schema rules. Header-only (qf_rt).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "json_satisfies.h"
#include "qf/error.h"
#include "qf/rt/json_grammar.h"
#include "qf/rt/json_matcher.h"

namespace qf::test {

using rt::JsonFrame;
using rt::JsonFrameArena;
using rt::JsonGrammar;
using rt::JsonMatcher;
using rt::JsonState;
using Json = nlohmann::ordered_json;

// 1: the whole text is a complete value; 0: a valid prefix only; -1: rejected.
inline int verdict(const JsonGrammar& g, std::string_view text) {
  JsonMatcher m(g, false);
  JsonFrameArena a;
  JsonState s = m.start(a), next;
  for (const char c : text) {
    if (!m.feed(s, static_cast<uint8_t>(c), a, next)) return -1;
    s.swap(next);
  }
  for (const JsonFrame* f : s) {
    if (m.can_end(f, a)) return 1;
  }
  return 0;
}

// What JsonGrammar::from_schema says refusing `schema` ("" when it compiles); a refusal must be
// a usage error.
inline std::string schema_error(const Json& schema) {
  try {
    JsonGrammar::from_schema(schema);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kUsage);
    return e.what();
  }
  return "";
}

// A text the matcher accepts, written byte by byte: a random printable ASCII byte among those
// allowed, a string's closing quote now and then, and the end as soon as it is allowed half the
// time. "" when it ran past 4000 bytes.
inline std::string random_text(const JsonGrammar& g, std::mt19937& rng) {
  JsonMatcher m(g, false);
  JsonFrameArena a;
  JsonState s = m.start(a), next;
  std::string text;
  while (text.size() < 4000) {
    bool can_end = false;
    for (const JsonFrame* f : s) can_end = can_end || m.can_end(f, a);
    if (can_end && rng() % 2 == 0) return text;
    std::vector<uint8_t> allowed;
    for (int c = 0x20; c < 0x7F; ++c) {
      JsonState probe;
      if (m.feed(s, static_cast<uint8_t>(c), a, probe)) allowed.push_back(static_cast<uint8_t>(c));
    }
    if (allowed.empty()) return can_end ? text : "";
    // Closing a string or a container often enough that texts end.
    uint8_t c = allowed[rng() % allowed.size()];
    for (const uint8_t close : {'"', '}', ']'}) {
      if (allowed.size() > 3 && rng() % 8 == 0 &&
          std::find(allowed.begin(), allowed.end(), close) != allowed.end())
        c = close;
    }
    EXPECT_TRUE(m.feed(s, c, a, next));
    s.swap(next);
    text += static_cast<char>(c);
  }
  return "";
}

}  // namespace qf::test
