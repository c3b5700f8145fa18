// ByteDfa (json_regex.h): for ASCII patterns, every string of a small alphabet up to 3
// characters (and random ones up to 12) gets the verdict of std::regex_search with the
// ECMAScript grammar, JSON Schema's dialect, within the lengths given; every state can still
// reach an accepting one; multi-byte characters count as one and invalid UTF-8 is never taken
// (against the matcher's UTF-8 automaton, json_string_byte); what it cannot do is refused.
#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <regex>
#include <string>

#include "qf/error.h"
#include "qf/rt/json_matcher.h"
#include "qf/rt/json_regex.h"

namespace qf::rt {
namespace {

// Every state reaches an accepting one.
void expect_all_live(const ByteDfa& d, const std::string& what) {
  for (size_t s = 0; s < d.states(); ++s) {
    std::vector<uint8_t> seen(d.states(), 0);
    std::deque<int32_t> todo = {static_cast<int32_t>(s)};
    seen[s] = 1;
    bool found = false;
    while (!todo.empty() && !found) {
      const int32_t x = todo.front();
      todo.pop_front();
      found = d.accepting(x);
      for (int c = 0; c < 256; ++c) {
        const int32_t t = d.next(x, static_cast<uint8_t>(c));
        if (t != ByteDfa::kDead && !seen[static_cast<size_t>(t)]) {
          seen[static_cast<size_t>(t)] = 1;
          todo.push_back(t);
        }
      }
    }
    EXPECT_TRUE(found) << what << ": state " << s << " is a dead end";
  }
}

const char* const kPatterns[] = {
    "a",
    "^a",
    "a$",
    "^a$",
    "^$",
    "",
    "ab|b",
    "^(ab|b)+$",
    "a*b?",
    "[a-c]+",
    "[^a-c]",
    "^[\\w-]{2,4}$",
    "\\d{2}",
    "^.{3}$",
    "^a{2,}$",
    "(a|ab)(c|bcd)(d*)$",
    "^(?:a|b)*ab$",
    "\\s",
    "a.c",
    "^\\.",
    "[.]",
    "a|^b",
    "a$|b",
    "(^a|b$)",
    "^\\D\\W\\S$",
    "^[a\\-z]$",
    "[-a]",
    "^\\x41\\u0042$",
    "a+?b",
    "^(a{1,2}){2}$",
    "b{2}a|a{3}",
    "^[^ ]*$",
    "1[0-9]?$",
    "^(\\d+\\.)?\\d+$",
};
const std::string kAlphabet = "ab1c-. dAB_z";

TEST(ByteDfa, MatchesStdRegexOnAsciiStrings) {
  std::mt19937 rng(7);
  for (const char* p : kPatterns) {
    const std::regex re(p, std::regex::ECMAScript);
    for (const auto& [lo, hi] :
         std::vector<std::pair<int64_t, int64_t>>{{0, -1}, {2, -1}, {0, 3}, {1, 4}}) {
      ByteDfa d;
      try {
        d = ByteDfa::compile(p, lo, hi);
      } catch (const Error& e) {  // allowed only when nothing matches within the lengths
        for (int trial = 0; trial < 20000; ++trial) {
          std::string s;
          const size_t len = rng() % 9;
          for (size_t i = 0; i < len; ++i) s += kAlphabet[rng() % kAlphabet.size()];
          const bool in = static_cast<int64_t>(s.size()) >= lo &&
                          (hi < 0 || static_cast<int64_t>(s.size()) <= hi);
          ASSERT_FALSE(in && std::regex_search(s, re)) << p << " refused: " << e.what();
        }
        continue;
      }
      const std::string what =
          std::string(p) + " [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
      expect_all_live(d, what);
      // Every string up to 3 characters, then random ones up to 12.
      std::vector<std::string> strings = {""};
      for (size_t i = 0; i < strings.size() && strings[i].size() < 3; ++i) {
        for (const char c : kAlphabet) strings.push_back(strings[i] + c);
      }
      for (int trial = 0; trial < 3000; ++trial) {
        std::string s;
        const size_t len = 5 + rng() % 8;
        for (size_t k = 0; k < len; ++k) s += kAlphabet[rng() % kAlphabet.size()];
        strings.push_back(s);
      }
      int yes = 0;
      for (const std::string& s : strings) {
        const bool in = static_cast<int64_t>(s.size()) >= lo &&
                        (hi < 0 || static_cast<int64_t>(s.size()) <= hi);
        const bool want = in && std::regex_search(s, re);
        ASSERT_EQ(d.accepts(s), want) << what << " on \"" << s << "\"";
        yes += want;
      }
      EXPECT_GT(yes, 0) << what;
    }
  }
}

TEST(ByteDfa, CharactersAreCodePoints) {
  const ByteDfa one = ByteDfa::compile("^.$", 0, -1);
  EXPECT_TRUE(one.accepts("\xC3\xA9"));          // é
  EXPECT_TRUE(one.accepts("\xF0\x9F\x98\x80"));  // U+1F600
  EXPECT_FALSE(one.accepts("ab"));
  EXPECT_FALSE(one.accepts("\xE2\x80\xA8"));  // U+2028, a line terminator: not '.'
  const ByteDfa greek = ByteDfa::compile("^[\\u03b1-\\u03c9]+$", 0, 2);
  EXPECT_TRUE(greek.accepts("\xCE\xB1\xCF\x89"));           // αω
  EXPECT_FALSE(greek.accepts("\xCE\xB1\xCF\x89\xCE\xB1"));  // 3 characters > maxLength 2
  EXPECT_FALSE(greek.accepts("a"));
  const ByteDfa not_a = ByteDfa::compile("^[^a]$", 0, -1);
  EXPECT_TRUE(not_a.accepts("\xE2\x82\xAC"));  // €
  EXPECT_FALSE(not_a.accepts("a"));
  const ByteDfa pair = ByteDfa::compile("^\\uD83D\\uDE00$", 0, -1);  // one code point
  EXPECT_TRUE(pair.accepts("\xF0\x9F\x98\x80"));
  const ByteDfa named = ByteDfa::compile("^(?<x>ab)?c$", 0, -1);  // a named group: a group
  EXPECT_TRUE(named.accepts("abc") && named.accepts("c") && !named.accepts("ac"));
}

// Any character: exactly the valid UTF-8 the JSON matcher's string automaton takes, without the
// bytes a string writes only as escapes.
TEST(ByteDfa, OnlyValidUtf8) {
  const ByteDfa any = ByteDfa::compile("[\\s\\S]*", 0, -1);
  std::mt19937 rng(9);
  int valid = 0;
  for (int trial = 0; trial < 200000; ++trial) {
    std::string s;
    const size_t len = 1 + rng() % 6;
    for (size_t i = 0; i < len; ++i) {
      uint8_t b;
      do {
        b = static_cast<uint8_t>(rng() % 3 == 0 ? rng() % 0x80 : 0x80 + rng() % 0x80);
      } while (b == '"' || b == '\\');
      s += static_cast<char>(b);
    }
    int state = 0;
    for (const char c : s) {
      if (state >= 0) state = json_string_byte(state, static_cast<uint8_t>(c));
    }
    ASSERT_EQ(any.accepts(s), state == 0) << trial;
    valid += state == 0;
  }
  EXPECT_GT(valid, 1000);
}

TEST(ByteDfa, RefusesWhatItCannotDo) {
  const auto error = [](const char* p, int64_t lo = 0, int64_t hi = -1) {
    try {
      ByteDfa::compile(p, lo, hi);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kUsage);
      return std::string(e.what());
    }
    ADD_FAILURE() << "compiled: " << p;
    return std::string();
  };
  EXPECT_NE(error("(?=a)").find("lookarounds"), std::string::npos);
  EXPECT_NE(error("(?<!a)b").find("lookarounds"), std::string::npos);
  EXPECT_NE(error("(a)\\1").find("backreferences"), std::string::npos);
  EXPECT_NE(error("\\bx").find("word boundaries"), std::string::npos);
  EXPECT_NE(error("\\p{L}").find("'\\p'"), std::string::npos);
  EXPECT_NE(error("a**").find("after a quantifier"), std::string::npos);
  EXPECT_NE(error("*a").find("nothing to repeat"), std::string::npos);
  EXPECT_NE(error("(a").find("without its ')'"), std::string::npos);
  EXPECT_NE(error("a)").find("unmatched ')'"), std::string::npos);
  EXPECT_NE(error("[a").find("without its ']'"), std::string::npos);
  EXPECT_NE(error("[b-a]").find("out of order"), std::string::npos);
  EXPECT_NE(error("a{3,2}").find("m < n"), std::string::npos);
  EXPECT_NE(error("^a$", 0, 0).find("no string"), std::string::npos);
  EXPECT_NE(error("a^b").find("no string"), std::string::npos);
  EXPECT_NE(error("^\\n$").find("without escapes"), std::string::npos);
  EXPECT_NE(error("^[a-z]{5000}$").find("more than"), std::string::npos);
  EXPECT_NE(error("[a-z]{0,60000}").find("too large"), std::string::npos);  // bounded work
  EXPECT_NE(error("((a{0,100}){0,100}){0,100}").find("too large"), std::string::npos);
}

}  // namespace
}  // namespace qf::rt
