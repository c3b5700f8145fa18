// libFuzzer target for structured output's schema compiler and matcher (json_grammar.h,
// json_matcher.h). Input: a JSON schema, then after a 0xFF byte (never in JSON text) the
// choices of a walk. Properties:
//   * a schema is compiled or refused with a usage error (Error kUsage), whatever it holds;
//   * walking the matcher byte by byte never reaches a dead end: some byte is allowed, or the
//     value may end;
//   * a walked value that ends is JSON (nlohmann parses it), and it satisfies the schema by
//     json_satisfies.h's checker, written from the JSON Schema rules (for schemas whose
//     patterns std::regex can judge).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.h"
#include "json_mutator.h"
#include "json_satisfies.h"
#include "qf/error.h"
#include "qf/rt/json_grammar.h"
#include "qf/rt/json_matcher.h"

namespace {

using Json = nlohmann::ordered_json;
using qf::rt::JsonFrame;
using qf::rt::JsonFrameArena;
using qf::rt::JsonGrammar;
using qf::rt::JsonMatcher;
using qf::rt::JsonState;

// Whether every `pattern` in the schema is printable ASCII without a count past 16 (the
// checker runs them through std::regex, which expands counts).
bool patterns_judgeable(const Json& v) {
  if (v.is_array()) {
    for (const Json& x : v) {
      if (!patterns_judgeable(x)) return false;
    }
  }
  if (!v.is_object()) return true;
  for (const auto& [key, x] : v.items()) {
    if (key == "pattern" && x.is_string()) {
      int number = -1;
      for (const char c : x.get<std::string>()) {
        if (c < 0x20 || c > 0x7E) return false;
        number = c >= '0' && c <= '9' ? (number < 0 ? 0 : number) * 10 + (c - '0') : -1;
        if (number > 16) return false;
      }
      try {
        std::regex(x.get<std::string>(), std::regex::ECMAScript);
      } catch (const std::regex_error&) {
        return false;
      }
    }
    if (!patterns_judgeable(x)) return false;
  }
  return true;
}

bool judged_byte(int c) {
  return c == '\t' || c == '\n' || c == '\r' || (c >= 0x20 && c <= 0x7E);
}

}  // namespace

QF_FUZZ_JSON_MUTATOR(0, "type", "properties", "required", "additionalProperties", "items",
                     "minItems", "maxItems", "minLength", "maxLength", "pattern", "format",
                     "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum", "const",
                     "anyOf", "oneOf", "allOf", "$ref", "$defs")

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t cut = in.find('\xFF');
  const Json schema = Json::parse(in.substr(0, cut), nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return 0;
  const std::string_view tail = cut == std::string_view::npos ? "" : in.substr(cut + 1);
  qf::fuzz::Choices choices({reinterpret_cast<const uint8_t*>(tail.data()), tail.size()});

  std::unique_ptr<JsonGrammar> g;
  try {
    g = std::make_unique<JsonGrammar>(JsonGrammar::from_schema(schema));
  } catch (const qf::Error& e) {
    QF_FUZZ_CHECK(e.code() == qf::Errc::kUsage, e.what());
    return 0;
  }
  const std::string what = "schema " + schema.dump();

  const JsonMatcher m(*g, false);
  JsonFrameArena a;
  JsonState s = m.start(a), next;
  std::string text;
  bool ended = false;
  while (text.size() < 512) {
    const size_t mark = a.mark();
    bool can_end = false;
    for (const JsonFrame* f : s) can_end = can_end || m.can_end(f, a);
    std::vector<uint8_t> allowed;
    bool any = false;
    for (int c = 0; c < 256; ++c) {
      JsonState probe;
      if (m.feed(s, static_cast<uint8_t>(c), a, probe)) {
        any = true;
        if (judged_byte(c)) allowed.push_back(static_cast<uint8_t>(c));
      }
    }
    a.rewind(mark);
    QF_FUZZ_CHECK(any || can_end, what + ": a dead end after '" + text + "'");
    if (can_end && (allowed.empty() || choices.empty() || choices.next(4) == 0)) {
      ended = true;
      break;
    }
    if (allowed.empty()) break;  // only bytes the checker cannot judge go on
    uint8_t c = allowed[choices.next(static_cast<uint32_t>(allowed.size()))];
    if (choices.empty()) {  // close what is open, so that the value ends
      for (const uint8_t close : {'"', '}', ']', '0', 'n', 't', 'f'}) {
        if (std::find(allowed.begin(), allowed.end(), close) != allowed.end()) {
          c = close;
          break;
        }
      }
    }
    QF_FUZZ_CHECK(m.feed(s, c, a, next), what);
    s.swap(next);
    text += static_cast<char>(c);
  }
  if (!ended) return 0;
  const Json v = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  QF_FUZZ_CHECK(!v.is_discarded(), what + ": the matcher ended '" + text + "', not JSON");
  if (!patterns_judgeable(schema)) return 0;
  QF_FUZZ_CHECK(qf::test::satisfies(v, schema, schema), what + ": '" + text + "' breaks it");
  return 0;
}
