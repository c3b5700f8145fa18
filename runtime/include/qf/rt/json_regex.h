// JSON Schema's `pattern` (an ECMA-262 regular expression, matched anywhere in the string
// unless anchored) and a string's minLength / maxLength, compiled together into one DFA over
// the UTF-8 bytes of the string's characters, for the structured-output matcher
// (json_matcher.h): a state from which no accepted string can be reached is dead, so a walk of
// the DFA never ends in a string it cannot close.
//
// The syntax: literals, `.`, classes `[...]` (ranges, negation, escapes), `\d \D \w \W \s \S`,
// the escapes `\t \n \r \f \v \0 \xHH \uHHHH` and of syntax characters, groups `(...)`,
// `(?:...)`, `(?<name>...)`, alternation, the quantifiers `* + ? {n} {n,} {n,m}` (lazy or not:
// the same strings), and the anchors `^ $`. Refused, naming what: lookarounds, backreferences,
// word boundaries, `\c`, `\p`, and patterns whose DFA would pass kMaxDfaStates.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace qf::rt {

constexpr int32_t kMaxDfaStates = 4096;

class ByteDfa {
 public:
  static constexpr int32_t kDead = -1;
  // `max_chars` < 0: no limit. Throws Error(kUsage) saying what is wrong with the pattern, or
  // that nothing matches it within the lengths.
  static ByteDfa compile(std::string_view pattern, int64_t min_chars, int64_t max_chars);
  // The DFA of a transition table ([state][byte] -> state or kDead; state 0 the start) without
  // the states from which no accepting state can be reached (transitions to them are kDead);
  // `states() == 0` when the start is one of them.
  static ByteDfa live_part(const std::vector<int32_t>& table, const std::vector<uint8_t>& accept);

  int32_t start() const { return 0; }
  int32_t next(int32_t state, uint8_t byte) const {
    return table_[static_cast<size_t>(state) * 256 + byte];
  }
  bool accepting(int32_t state) const { return accept_[static_cast<size_t>(state)] != 0; }
  // Whether the DFA accepts `s` whole.
  bool accepts(std::string_view s) const {
    int32_t at = start();
    for (const char c : s) {
      at = next(at, static_cast<uint8_t>(c));
      if (at == kDead) return false;
    }
    return accepting(at);
  }
  size_t states() const { return accept_.size(); }

 private:
  std::vector<int32_t> table_;  // [state][byte] -> state or kDead
  std::vector<uint8_t> accept_;
};

}  // namespace qf::rt
