// bounded_number_dfa (json_number.h) against a reference written from the rules: the number
// syntax it writes checked by std::regex, the bounds checked as a JSON Schema validator reading
// doubles checks them (strtod; exact for numbers of at most 15 digits), or, for long integers,
// as 128-bit integers. Every string of up to 5 bytes over the number's bytes, random long
// ones, every state's liveness, and the refusals.
#include <gtest/gtest.h>

#include <cstdlib>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "qf/error.h"
#include "qf/rt/json_grammar.h"
#include "qf/rt/json_number.h"

namespace qf::rt {
namespace {

using Json = nlohmann::ordered_json;

NumberBounds bounds_of(const Json& schema) {
  NumberBounds b;
  b.integer = schema.value("type", "number") == "integer";
  const auto text = [&](const char* key) {
    return schema.contains(key) ? schema[key].dump() : std::string();
  };
  b.minimum = text("minimum");
  b.maximum = text("maximum");
  b.exclusive_minimum = text("exclusiveMinimum");
  b.exclusive_maximum = text("exclusiveMaximum");
  return b;
}

bool dfa_accepts(const ByteDfa& d, const std::string& s) {
  int32_t state = d.start();
  for (const char c : s) {
    state = d.next(state, static_cast<uint8_t>(c));
    if (state == ByteDfa::kDead) return false;
  }
  return d.accepting(state);
}

int digit_count(const std::string& s) {
  int n = 0;
  for (const char c : s) n += c >= '0' && c <= '9';
  return n;
}

// Whether `s` is written as the DFA writes numbers: the syntax, no minus before zero, the
// lengths.
bool well_written(const std::string& s, bool integer) {
  static const std::regex number("-?(0|[1-9][0-9]*)(\\.[0-9]+)?");
  static const std::regex minus_zero("-0(\\.0+)?");
  if (!std::regex_match(s, number) || std::regex_match(s, minus_zero)) return false;
  if (integer) return s.find('.') == std::string::npos && s.size() <= 40;
  const bool zero_whole = s.rfind("0", 0) == 0 || s.rfind("-0", 0) == 0;
  return digit_count(s) - zero_whole <= 15;
}

// The bounds as a validator reading doubles checks them.
bool within_as_doubles(const std::string& s, const Json& schema) {
  const double x = std::strtod(s.c_str(), nullptr);
  const auto bound = [&](const char* key) { return schema[key].get<double>(); };
  if (schema.contains("minimum") && !(x >= bound("minimum"))) return false;
  if (schema.contains("maximum") && !(x <= bound("maximum"))) return false;
  if (schema.contains("exclusiveMinimum") && !(x > bound("exclusiveMinimum"))) return false;
  if (schema.contains("exclusiveMaximum") && !(x < bound("exclusiveMaximum"))) return false;
  return true;
}

const char* const kBounds[] = {
    R"({"type": "integer", "minimum": 1, "maximum": 100})",
    R"({"type": "integer", "exclusiveMinimum": -5, "exclusiveMaximum": 5})",
    R"({"type": "integer", "minimum": 0.5, "maximum": 9.5})",
    R"({"type": "integer", "minimum": -1000})",
    R"({"type": "integer", "maximum": -7})",
    R"({"type": "integer", "minimum": 120, "maximum": 120})",
    R"({"type": "integer", "minimum": 2, "exclusiveMinimum": 2, "maximum": 40})",
    R"({"type": "integer", "minimum": 3, "exclusiveMinimum": 1, "exclusiveMaximum": 30,
        "maximum": 29})",
    R"({"type": "number", "minimum": 0, "maximum": 1})",
    R"({"type": "number", "exclusiveMinimum": 0})",
    R"({"type": "number", "minimum": -2.5, "maximum": 3.75})",
    R"({"type": "number", "maximum": -0.001})",
    R"({"type": "number", "minimum": 0.05, "maximum": 0.0501})",
    R"({"type": "number", "exclusiveMinimum": -1, "exclusiveMaximum": 1})",
    R"({"type": "number", "maximum": 1e2})",
    R"({"type": "number", "minimum": 1.5e-3, "exclusiveMaximum": 0.1})",
    R"({"type": "number", "minimum": -0.0, "exclusiveMaximum": 12.25})",
    R"({"type": "number", "exclusiveMinimum": 99.9, "maximum": 1000})",
    R"({"type": "number", "minimum": -123.456, "exclusiveMaximum": -0.5})",
};

TEST(BoundedNumber, EveryShortStringAgreesWithAValidator) {
  const std::string alphabet = "-.0123456789";
  for (const char* text : kBounds) {
    const Json schema = Json::parse(text);
    const NumberBounds b = bounds_of(schema);
    const ByteDfa d = bounded_number_dfa(b);
    int accepted = 0;
    std::vector<std::string> level = {""};
    for (int len = 1; len <= 5; ++len) {
      std::vector<std::string> next;
      for (const std::string& p : level) {
        for (const char c : alphabet) next.push_back(p + c);
      }
      for (const std::string& s : next) {
        const bool want = well_written(s, b.integer) && within_as_doubles(s, schema);
        ASSERT_EQ(dfa_accepts(d, s), want) << text << " on " << s;
        accepted += want;
      }
      level = std::move(next);
    }
    EXPECT_GT(accepted, 0) << text;
  }
}

// Random numbers of up to 17 digits, written as the DFA writes them or nearly (leading zeros,
// "-0", a point without digits): the DFA agrees with the validator on each.
TEST(BoundedNumber, LongNumbersAgreeWithAValidator) {
  std::mt19937 rng(5);
  const auto digits = [&](int n, bool lead) {
    std::string s;
    for (int i = 0; i < n; ++i)
      s += static_cast<char>('0' + (i == 0 && lead ? 1 + rng() % 9 : rng() % 10));
    return s;
  };
  for (const char* text : kBounds) {
    const Json schema = Json::parse(text);
    const NumberBounds b = bounds_of(schema);
    const ByteDfa d = bounded_number_dfa(b);
    for (int trial = 0; trial < 20000; ++trial) {
      std::string s = rng() % 3 == 0 ? "-" : "";
      const int whole = static_cast<int>(rng() % 6);
      s += whole == 0 ? "0" : digits(whole, rng() % 20 != 0);
      if (rng() % 2) s += "." + digits(static_cast<int>(rng() % 14), false);
      const bool want = well_written(s, b.integer) && within_as_doubles(s, schema);
      ASSERT_EQ(dfa_accepts(d, s), want) << text << " on " << s;
    }
  }
}

// Integers far past a double's precision, compared exactly.
TEST(BoundedNumber, LongIntegersCompareExactly) {
  using I = __int128;
  const auto parse = [](const std::string& s) {
    I v = 0;
    for (size_t i = s[0] == '-'; i < s.size(); ++i) v = v * 10 + (s[i] - '0');
    return s[0] == '-' ? -v : v;
  };
  const std::string lo = "-99999999999999999999", hi = "123456789012345678901234567890";
  NumberBounds b;
  b.integer = true;
  b.minimum = lo;
  b.exclusive_maximum = hi;
  const ByteDfa d = bounded_number_dfa(b);
  std::mt19937 rng(9);
  int accepted = 0;
  for (int trial = 0; trial < 50000; ++trial) {
    // Near a bound (its digits with a few changed) or random.
    std::string s = rng() % 2 ? lo : hi;
    if (rng() % 4 == 0) {
      s = (rng() % 2 ? "-" : "") + std::to_string(1 + rng() % 9);
      for (int n = static_cast<int>(rng() % 37); n > 0; --n)
        s += static_cast<char>('0' + rng() % 10);
    } else {
      for (int n = static_cast<int>(rng() % 3); n >= 0; --n)
        s[1 + rng() % (s.size() - 1)] = static_cast<char>('0' + rng() % 10);
      if (rng() % 5 == 0) s.pop_back();
      if (rng() % 5 == 0) s += '7';
    }
    const bool want = well_written(s, true) && parse(s) >= parse(lo) && parse(s) < parse(hi);
    ASSERT_EQ(dfa_accepts(d, s), want) << s;
    accepted += want;
  }
  EXPECT_GT(accepted, 10000);
  EXPECT_TRUE(dfa_accepts(d, lo));
  EXPECT_FALSE(dfa_accepts(d, hi));
  EXPECT_TRUE(dfa_accepts(d, "123456789012345678901234567889"));
}

// From every state some number within the bounds can still be written.
TEST(BoundedNumber, EveryStateCanFinish) {
  for (const char* text : kBounds) {
    const ByteDfa d = bounded_number_dfa(bounds_of(Json::parse(text)));
    for (size_t s = 0; s < d.states(); ++s) {
      std::vector<uint8_t> seen(d.states(), 0);
      std::deque<int32_t> todo = {static_cast<int32_t>(s)};
      bool finishes = false;
      while (!todo.empty() && !finishes) {
        const int32_t t = todo.front();
        todo.pop_front();
        finishes = d.accepting(t);
        for (int c = 0; c < 256; ++c) {
          const int32_t u = d.next(t, static_cast<uint8_t>(c));
          if (u != ByteDfa::kDead && !seen[static_cast<size_t>(u)]) {
            seen[static_cast<size_t>(u)] = 1;
            todo.push_back(u);
          }
        }
      }
      EXPECT_TRUE(finishes) << text << " state " << s;
    }
    EXPECT_LT(d.states(), 400u) << text;
  }
}

std::string refusal(const NumberBounds& b) {
  try {
    bounded_number_dfa(b);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kUsage);
    return e.what();
  }
  return "";
}

TEST(BoundedNumber, RefusesBoundsNothingMeets) {
  NumberBounds b;
  b.integer = true;
  b.minimum = "5";
  b.maximum = "4";
  EXPECT_NE(refusal(b).find("no integer lies within the bounds"), std::string::npos);
  b.minimum = "";
  b.exclusive_minimum = "2";
  b.exclusive_maximum = "3";
  b.maximum = "";
  EXPECT_NE(refusal(b).find("no integer"), std::string::npos);
  b.integer = false;
  EXPECT_EQ(refusal(b), "");  // 2.5 is a number
  b.exclusive_minimum = "";
  b.exclusive_maximum = "";
  b.minimum = "1e+20";  // beyond 15 digits
  EXPECT_NE(refusal(b).find("no number of at most 15 digits"), std::string::npos);
  b.minimum = "x";
  EXPECT_NE(refusal(b).find("\"x\" is not a JSON number"), std::string::npos);
}

}  // namespace
}  // namespace qf::rt
