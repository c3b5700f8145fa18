// Structured output (OpenAI's `response_format`): the JSON values a reply may be, as a small
// grammar of shapes compiled from a JSON schema, or "any JSON object" for {"type":
// "json_object"}. json_matcher.h walks it byte by byte; json_constraint.h turns that into the
// tokens that may come next.
//
// The schema subset (draft 2020-12 keywords; anything else that constrains values is refused,
// naming the keyword and where it is, so that no output can break a rule we did not enforce):
//   * `type`: object, array, string, number, integer, boolean, null, or a list of them;
//   * objects: `properties` (written in the schema's order; those in `required` always, the
//     others optional), `required`, `additionalProperties` (false, or with no `properties` a
//     schema or true for the values of any keys);
//   * arrays: `items`, `minItems`, `maxItems`;
//   * strings: `minLength`, `maxLength` (characters; an escape counts as one), `pattern`
//     (json_regex.h; such strings are written without escapes), `format` date, time,
//     date-time (RFC 3339; days within their month's length, February 29 in any year), uuid,
//     ipv4 (as patterns; on other types `pattern` and `format` are ignored);
//   * numbers and integers: `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`
//     (numbers, or draft 4's booleans beside minimum / maximum), json_number.h: such numbers
//     are written without an exponent, numbers with at most 15 digits;
//   * `enum`, `const` (any JSON values, written as nlohmann::json dumps them), `anyOf`,
//     `oneOf` (walked as anyOf, so taken only where its alternatives are provably disjoint,
//     src/json_disjoint.h), `allOf` of one schema, `$ref` to a JSON pointer in the document (`#`,
//     `#/$defs/Name`, ...), recursion included (not left recursion: a `$ref` that reaches
//     itself before any object, array or string);
//   * annotations (title, description, default, examples, $schema, $id, $comment, ...) ignored.
// What the matcher lets through is stricter than the schema where JSON allows choices: keys in
// the schema's order, each at most once, enum and const values in their compact form, at most
// kMaxJsonWhitespace whitespace bytes between tokens (and after the value), numbers of at most
// kMaxJsonNumberBytes with at most two exponent digits (so none overflows a double), \u
// escapes of surrogates only in pairs, strings with a pattern written without escapes. Strings
// are valid UTF-8 (json_matcher.h).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "qf/rt/json_regex.h"

namespace qf::rt {

constexpr int kMaxJsonWhitespace = 32;
// The deepest nesting of arrays and objects a schema or a request body may have: the schema
// compiler and nlohmann::json's dump recurse once a level.
constexpr int kMaxJsonNesting = 512;

// Whether `v` nests arrays and objects more than `limit` deep (walked without recursion, so any
// depth is safe to ask about).
bool json_deeper_than(const nlohmann::ordered_json& v, int limit);
constexpr int kMaxJsonNumberBytes = 40;

struct JsonShape {
  enum class Kind : uint8_t {
    kAny,      // any JSON value
    kObject,   // closed (properties) or open (any keys, `values`)
    kArray,    // `items`, min_items .. max_items
    kString,   // min_length .. max_length characters
    kNumber,   // JSON's number grammar
    kInteger,  // a number without fraction or exponent
    kLiteral,  // one of `literals`, written exactly
    kAnyOf,    // one of `alternatives`
  };
  struct Property {
    std::string key;  // as written in the output, quotes included: "\"name\""
    int32_t shape = 0;
    bool required = false;
  };
  Kind kind = Kind::kAny;
  // Compiled from a schema without `type`, whose other keywords imply this kind: values of the
  // other types satisfy the schema too (they are never written).
  bool implied_type = false;
  // kObject. Closed: `properties` in order, first_required[i] the first required index >= i
  // (properties.size() when none). Open: any keys, each value a `values`.
  bool open = false;
  bool closed = false;  // additionalProperties false: no keys beyond `properties` (else they
                        // are never written, but satisfy the schema)
  std::vector<Property> properties;
  std::vector<uint32_t> first_required;  // [properties.size() + 1]
  int32_t values = 0;
  // kArray
  int32_t items = 0;
  int64_t min_items = 0, max_items = -1;  // -1: no limit
  // kString; `pattern` >= 0: JsonGrammar::pattern(pattern) holds the characters (and the
  // lengths) instead. kNumber, kInteger: `pattern` >= 0: that DFA holds the number's bytes
  // (its bounds, json_number.h).
  int64_t min_length = 0, max_length = -1;
  int32_t pattern = -1;
  // kLiteral
  std::vector<std::string> literals;
  // kAnyOf
  std::vector<int32_t> alternatives;
};

class JsonGrammar {
 public:
  // Shapes every grammar has, at these indices: any value, and the shapes it opens by its
  // first byte.
  static constexpr int32_t kAnyValue = 0, kAnyObject = 1, kAnyArray = 2, kAnyString = 3,
                           kAnyNumber = 4, kBoolean = 5, kNull = 6;

  // {"type": "json_object"}: a JSON object, anything in it.
  static JsonGrammar any_object();
  // Throws Error(kUsage) for a schema outside the subset or one that nothing satisfies,
  // naming the keyword and its place ("schema.properties.tags.items: ..."), or nested more than
  // kMaxJsonNesting deep.
  static JsonGrammar from_schema(const nlohmann::ordered_json& schema);

  const JsonShape& shape(int32_t i) const { return shapes_[static_cast<size_t>(i)]; }
  const ByteDfa& pattern(int32_t i) const { return patterns_[static_cast<size_t>(i)]; }
  int32_t root() const { return root_; }
  size_t size() const { return shapes_.size(); }

 private:
  JsonGrammar();
  friend class SchemaCompiler;
  std::vector<JsonShape> shapes_;
  std::vector<ByteDfa> patterns_;
  int32_t root_ = kAnyValue;
};

}  // namespace qf::rt
