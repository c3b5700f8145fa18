// libFuzzer target for the `pattern` compiler (json_regex.h), the one place a request's text
// becomes an automaton. Input: byte 0 the least length, byte 1 the most (-1: none), then the
// pattern up to the first newline, then choices. Properties:
//   * a refusal is a usage error (Error kUsage), and compiling ends within bounded work;
//   * every state of the DFA can still reach an accepting one;
//   * for printable ASCII patterns without counts past 16, the DFA agrees with std::regex_search
//     (ECMAScript, JSON Schema's dialect) within the lengths: on a string walked through the DFA
//     and on one read from the choices (printable ASCII without '"' and '\', which such strings
//     never hold: they are written without escapes).
#include <cstdint>
#include <deque>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.h"
#include "qf/error.h"
#include "qf/rt/json_regex.h"

namespace {

using qf::rt::ByteDfa;

// Printable ASCII, and no count in braces past 16 (std::regex expands counts, so large ones
// would make the reference, not the code under test, slow).
bool reference_can_judge(std::string_view p) {
  if (p.size() > 48) return false;
  int number = -1;
  for (const char c : p) {
    if (c < 0x20 || c > 0x7E) return false;
    if (c >= '0' && c <= '9') {
      number = (number < 0 ? 0 : number) * 10 + (c - '0');
      if (number > 16) return false;
    } else {
      number = -1;
    }
  }
  return true;
}

bool judged_char(uint8_t c) {
  return c >= 0x20 && c <= 0x7E && c != '"' && c != '\\';
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int64_t lo = data[0] % 8;
  const int64_t hi = data[1] % 17 - 1;
  const std::string_view rest(reinterpret_cast<const char*>(data + 2), size - 2);
  const size_t nl = rest.find('\n');
  const std::string_view pattern = rest.substr(0, nl);
  const std::string_view tail = nl == std::string_view::npos ? "" : rest.substr(nl + 1);
  qf::fuzz::Choices choices({reinterpret_cast<const uint8_t*>(tail.data()), tail.size()});

  ByteDfa d;
  try {
    d = ByteDfa::compile(pattern, lo, hi);
  } catch (const qf::Error& e) {
    QF_FUZZ_CHECK(e.code() == qf::Errc::kUsage, e.what());
    return 0;
  }
  const std::string what = "pattern '" + std::string(pattern) + "' [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "]";
  QF_FUZZ_CHECK(d.states() > 0 && d.states() <= static_cast<size_t>(qf::rt::kMaxDfaStates), what);

  // Every state reaches an accepting one: a backward search from the accepting states.
  const size_t n = d.states();
  std::vector<std::vector<int32_t>> into(n);
  for (size_t s = 0; s < n; ++s) {
    for (int c = 0; c < 256; ++c) {
      const int32_t t = d.next(static_cast<int32_t>(s), static_cast<uint8_t>(c));
      QF_FUZZ_CHECK(t == ByteDfa::kDead || (t >= 0 && static_cast<size_t>(t) < n), what);
      if (t != ByteDfa::kDead) into[static_cast<size_t>(t)].push_back(static_cast<int32_t>(s));
    }
  }
  std::vector<uint8_t> live(n, 0);
  std::deque<int32_t> todo;
  for (size_t s = 0; s < n; ++s) {
    if (d.accepting(static_cast<int32_t>(s))) live[s] = 1, todo.push_back(static_cast<int32_t>(s));
  }
  while (!todo.empty()) {
    const int32_t t = todo.front();
    todo.pop_front();
    for (const int32_t s : into[static_cast<size_t>(t)]) {
      if (!live[static_cast<size_t>(s)]) live[static_cast<size_t>(s)] = 1, todo.push_back(s);
    }
  }
  for (size_t s = 0; s < n; ++s) QF_FUZZ_CHECK(live[s], what + ": state " + std::to_string(s));

  if (!reference_can_judge(pattern)) return 0;
  std::regex re;
  try {
    re = std::regex(std::string(pattern), std::regex::ECMAScript);
  } catch (const std::regex_error&) {
    return 0;  // the reference's dialect differs here; nothing to compare with
  }
  const auto reference = [&](const std::string& s) {
    const auto len = static_cast<int64_t>(s.size());
    return len >= lo && (hi < 0 || len <= hi) && std::regex_search(s, re);
  };

  // A walk through the DFA over judged characters, ending where it may when the choices say so.
  std::string walked;
  int32_t at = d.start();
  while (walked.size() < 16) {
    std::vector<uint8_t> next;
    for (int c = 0x20; c <= 0x7E; ++c) {
      if (judged_char(static_cast<uint8_t>(c)) &&
          d.next(at, static_cast<uint8_t>(c)) != ByteDfa::kDead)
        next.push_back(static_cast<uint8_t>(c));
    }
    if (d.accepting(at) && (next.empty() || choices.next(4) == 0)) break;
    if (next.empty()) break;  // only other characters go on: the reference cannot judge
    const uint8_t c = next[choices.next(static_cast<uint32_t>(next.size()))];
    walked += static_cast<char>(c);
    at = d.next(at, c);
  }
  if (d.accepting(at)) QF_FUZZ_CHECK(reference(walked), what + " accepts '" + walked + "'");

  // A string from the choices.
  std::string s;
  const size_t len = choices.next(13);
  for (size_t i = 0; i < len; ++i) {
    static const std::string kChars = "ab1c-. dAB_z0:/x";
    s += kChars[choices.next(static_cast<uint32_t>(kChars.size()))];
  }
  QF_FUZZ_CHECK(d.accepts(s) == reference(s),
                what + (d.accepts(s) ? " accepts '" : " refuses '") + s + "'");
  return 0;
}
