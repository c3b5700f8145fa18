// Bounded numbers as a DFA (json_number.h): the states of writing a number, each knowing how
// its digits so far compare with each bound's, explored from the empty text; then the states
// that cannot reach a number within the bounds are cut (ByteDfa::live_part).
#include "qf/rt/json_number.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include "qf/error.h"
#include "qf/rt/json_grammar.h"

namespace qf::rt {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw Error(Errc::kUsage, what);
}

constexpr int kMaxDigits = 15;  // of a bounded `number` (json_number.h says why)
constexpr int kMaxExponent = 1000;

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
int sign(int v) {
  return (v > 0) - (v < 0);
}

// A decimal: the digits before the point without leading zeros and those after it without
// trailing zeros (zero: both empty, and not negative).
struct Decimal {
  bool neg = false;
  std::string whole, frac;
  bool zero() const { return whole.empty() && frac.empty(); }
  int signum() const { return zero() ? 0 : neg ? -1 : 1; }
};

// A JSON number's text as a Decimal; nullopt when it is not one.
std::optional<Decimal> decimal(std::string_view text) {
  Decimal d;
  size_t i = 0;
  if (i < text.size() && text[i] == '-') {
    d.neg = true;
    ++i;
  }
  std::string digits;
  int64_t point = -1;
  for (; i < text.size() && (is_digit(text[i]) || (text[i] == '.' && point < 0)); ++i) {
    if (text[i] == '.') {
      point = static_cast<int64_t>(digits.size());
    } else {
      digits += text[i];
    }
  }
  if (digits.empty()) return std::nullopt;
  if (point < 0) point = static_cast<int64_t>(digits.size());
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    const bool negative = i < text.size() && text[i] == '-';
    if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
    int64_t e = 0;
    const size_t first = i;
    for (; i < text.size() && is_digit(text[i]) && e <= kMaxExponent; ++i)
      e = e * 10 + text[i] - '0';
    if (i == first || e > kMaxExponent) return std::nullopt;
    point += negative ? -e : e;
  }
  if (i != text.size()) return std::nullopt;
  if (point < 0) {
    digits.insert(0, static_cast<size_t>(-point), '0');
    point = 0;
  }
  if (point > static_cast<int64_t>(digits.size())) digits.resize(static_cast<size_t>(point), '0');
  d.whole = digits.substr(0, static_cast<size_t>(point));
  d.frac = digits.substr(static_cast<size_t>(point));
  d.whole.erase(0, std::min(d.whole.find_first_not_of('0'), d.whole.size()));
  while (!d.frac.empty() && d.frac.back() == '0') d.frac.pop_back();
  if (d.zero()) d.neg = false;
  return d;
}

// The sign of a - b.
int compare(const Decimal& a, const Decimal& b) {
  if (a.signum() != b.signum()) return sign(a.signum() - b.signum());
  int m = 0;  // of |a| - |b|: fractions without trailing zeros compare as strings
  if (a.whole.size() != b.whole.size()) {
    m = a.whole.size() < b.whole.size() ? -1 : 1;
  } else {
    m = sign(a.whole.compare(b.whole));
    if (m == 0) m = sign(a.frac.compare(b.frac));
  }
  return a.signum() * m;
}

struct Bound {
  Decimal value;
  bool exclusive = false;
};

enum Phase : uint8_t { kBegin, kMinus, kZero, kWhole, kDot, kFrac };

// A state: what the text so far tells. `cmp[b]` compares the magnitude so far with bound b's:
// in the whole part, its digits with as many of the bound's first; after the point, the whole
// magnitude so far with the bound's (0 while they agree). `pos`: the digits of the part being
// written that count (none for a whole part "0"; 0 once every bound's comparison is decided).
struct Num {
  uint8_t phase = kBegin, neg = 0, nonzero = 0, bytes = 0, pos = 0, digits = 0;
  int8_t cmp[2] = {0, 0};
  uint64_t key() const {
    return uint64_t{phase} | uint64_t{neg} << 8 | uint64_t{nonzero} << 9 | uint64_t{bytes} << 16 |
           uint64_t{pos} << 24 | uint64_t{static_cast<uint8_t>(cmp[0])} << 32 |
           uint64_t{static_cast<uint8_t>(cmp[1])} << 40 | uint64_t{digits} << 48;
  }
};

class Builder {
 public:
  Builder(std::optional<Bound> lower, std::optional<Bound> upper, bool integer)
      : bound_{std::move(lower), std::move(upper)}, integer_(integer) {}

  ByteDfa build() const {
    std::map<uint64_t, int32_t> ids;
    std::vector<Num> states;
    std::vector<int32_t> table;
    std::vector<uint8_t> accept;
    const auto id_of = [&](const Num& s) {
      const auto [it, added] = ids.emplace(s.key(), static_cast<int32_t>(states.size()));
      if (added) states.push_back(s);
      return it->second;
    };
    id_of(Num{});
    for (size_t i = 0; i < states.size(); ++i) {
      if (states.size() > static_cast<size_t>(kMaxDfaStates))
        fail("the bounds need more than " + std::to_string(kMaxDfaStates) + " DFA states");
      const Num s = states[i];
      accept.push_back(accepting(s));
      table.resize(table.size() + 256, ByteDfa::kDead);
      for (const char c : std::string_view("-.0123456789")) {
        if (const std::optional<Num> t = step(s, c))
          table[i * 256 + static_cast<uint8_t>(c)] = id_of(*t);
      }
    }
    ByteDfa d = ByteDfa::live_part(table, accept);
    if (d.states() == 0) {
      fail(integer_ ? "no integer lies within the bounds"
                    : "no number of at most 15 digits (written without an exponent) lies within "
                      "the bounds");
    }
    return d;
  }

 private:
  std::optional<Num> step(const Num& s, char c) const {
    if (s.bytes >= kMaxJsonNumberBytes) return std::nullopt;
    Num t = s;
    ++t.bytes;
    const bool digit = is_digit(c);
    if (digit) {  // a whole part "0" is not counted
      t.digits += s.phase >= kDot || c != '0' || s.phase == kWhole;
      if (!integer_ && t.digits > kMaxDigits) return std::nullopt;
      t.nonzero |= c != '0';
    }
    switch (s.phase) {
      case kBegin:
        if (c == '-') {
          t.phase = kMinus;
          t.neg = 1;
          return t;
        }
        [[fallthrough]];
      case kMinus:
        if (c == '0') {
          t.phase = kZero;
          return t;
        }
        if (!digit) return std::nullopt;
        t.phase = kWhole;
        whole_digit(t, c);
        return t;
      case kZero:
      case kWhole:
        if (digit && s.phase == kWhole) {
          whole_digit(t, c);
          return t;
        }
        if (c != '.' || integer_) return std::nullopt;
        t.phase = kDot;
        end_whole(t);
        return t;
      default:  // kDot, kFrac
        if (!digit) return std::nullopt;
        t.phase = kFrac;
        frac_digit(t, c);
        return t;
    }
  }

  void whole_digit(Num& t, char c) const {
    for (int b = 0; b < 2; ++b) {
      if (!bound_[b] || t.cmp[b] != 0 || t.pos >= bound_[b]->value.whole.size()) continue;
      t.cmp[b] = static_cast<int8_t>(sign(c - bound_[b]->value.whole[t.pos]));
    }
    ++t.pos;
  }
  void end_whole(Num& t) const {
    for (int b = 0; b < 2; ++b) {
      if (!bound_[b]) continue;
      const size_t n = bound_[b]->value.whole.size();
      if (t.pos != n) t.cmp[b] = t.pos > n ? 1 : -1;
    }
    t.pos = 0;
    settle(t);
  }
  void frac_digit(Num& t, char c) const {
    for (int b = 0; b < 2; ++b) {
      if (!bound_[b] || t.cmp[b] != 0) continue;
      const std::string& f = bound_[b]->value.frac;
      t.cmp[b] = static_cast<int8_t>(sign(c - (t.pos < f.size() ? f[t.pos] : '0')));
    }
    ++t.pos;
    settle(t);
  }
  void settle(Num& t) const {
    for (int b = 0; b < 2; ++b) {
      if (bound_[b] && t.cmp[b] == 0) return;
    }
    t.pos = 0;
  }

  // The sign of the finished number minus bound b.
  int against(const Num& s, int b) const {
    const Decimal& v = bound_[b]->value;
    const int own = !s.nonzero ? 0 : s.neg ? -1 : 1;
    if (own != v.signum()) return sign(own - v.signum());
    Num t = s;
    if (s.phase != kFrac) end_whole(t);
    int m = t.cmp[b];
    if (m == 0 && t.pos < v.frac.size()) m = -1;  // the bound's fraction goes on
    return own * m;
  }

  bool accepting(const Num& s) const {
    if (s.phase != kZero && s.phase != kWhole && s.phase != kFrac) return false;
    if (s.neg && !s.nonzero) return false;  // no "-0"
    if (bound_[0]) {
      const int c = against(s, 0);
      if (c < 0 || (c == 0 && bound_[0]->exclusive)) return false;
    }
    if (bound_[1]) {
      const int c = against(s, 1);
      if (c > 0 || (c == 0 && bound_[1]->exclusive)) return false;
    }
    return true;
  }

  std::optional<Bound> bound_[2];  // lower, upper
  bool integer_;
};

// The tighter of an inclusive and an exclusive bound (`sense` 1: lower, -1: upper).
std::optional<Bound> tighter(const std::string& inclusive, const std::string& exclusive,
                             int sense) {
  std::optional<Bound> out;
  for (const bool excl : {false, true}) {
    const std::string& text = excl ? exclusive : inclusive;
    if (text.empty()) continue;
    const std::optional<Decimal> d = decimal(text);
    if (!d) fail("the bound \"" + text + "\" is not a JSON number");
    const int c = out ? compare(*d, out->value) * sense : 1;
    if (c > 0 || (c == 0 && excl)) out = Bound{*d, excl};
  }
  return out;
}

}  // namespace

ByteDfa bounded_number_dfa(const NumberBounds& bounds) {
  return Builder(tighter(bounds.minimum, bounds.exclusive_minimum, 1),
                 tighter(bounds.maximum, bounds.exclusive_maximum, -1), bounds.integer)
      .build();
}

}  // namespace qf::rt
