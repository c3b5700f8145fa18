// JsonGrammar (schemas compiled, refused with the keyword's place) and JsonMatcher: for "any
// JSON object", every text's verdict against nlohmann::json's parser, mutated documents
// included; for schemas, texts written by a random walk of the matcher's allowed bytes,
// parsed by nlohmann::json and checked against the schema by json_schema_check.h's checker,
// written from the JSON Schema rules and not from the matcher.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "json_schema_check.h"
#include "qf/error.h"
#include "qf/rt/json_grammar.h"
#include "qf/rt/json_matcher.h"

namespace qf::rt {
namespace {

using Json = nlohmann::ordered_json;
using test::random_text;
using test::satisfies;
using test::verdict;

std::string compile_error(const std::string& schema) {
  return test::schema_error(Json::parse(schema));
}

TEST(JsonGrammar, RefusesWhatItCannotEnforceNamingThePlace) {
  EXPECT_NE(compile_error(R"({"type": "object", "properties": {"a": {"type": "array",
            "uniqueItems": true}}})")
                .find("schema.properties.a: the keyword 'uniqueItems'"),
            std::string::npos);
  EXPECT_NE(compile_error(R"j({"type": "object", "properties": {"a": {"type": "string",
            "pattern": "(?=x)"}}})j")
                .find("schema.properties.a.pattern: at character 2 of the pattern: lookarounds"),
            std::string::npos);
  EXPECT_NE(compile_error(R"({"type": "string", "pattern": "^abc$", "maxLength": 2})")
                .find("schema.pattern: no string"),
            std::string::npos);
  EXPECT_NE(compile_error(R"({"type": "string", "format": "email"})")
                .find("schema.format: the format \"email\" is not supported"),
            std::string::npos);
  EXPECT_NE(compile_error(R"({"format": "date", "pattern": "x"})").find("'format' beside"),
            std::string::npos);
  EXPECT_NE(compile_error(R"({"type": "integer", "minimum": 3, "multipleOf": 3})")
                .find("the keyword 'multipleOf'"),
            std::string::npos);
  EXPECT_NE(compile_error(R"({"properties": {"n": {"type": "integer", "minimum": 3.5,
            "exclusiveMaximum": 4}}})")
                .find("schema.properties.n: no integer lies within the bounds"),
            std::string::npos);
  EXPECT_NE(compile_error(R"({"type": ["number", "null"], "maximum": "3"})")
                .find("schema.maximum: must be a number, got \"3\""),
            std::string::npos);
  EXPECT_NE(compile_error(R"({"type": "integer", "minimum": true})")
                .find("schema.minimum: must be a number, got true"),
            std::string::npos);
  EXPECT_NE(compile_error(R"({"type": "number", "exclusiveMinimum": true})")
                .find("schema.exclusiveMinimum: true needs 'minimum' beside it"),
            std::string::npos);
  EXPECT_NE(compile_error(R"({"type": "number", "minimum": 1e16})")
                .find("schema: no number of at most 15 digits"),
            std::string::npos);
  EXPECT_NE(compile_error(R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})")
                .find("schema.required: names \"b\""),
            std::string::npos);
  EXPECT_NE(compile_error(R"({"type": "array", "minItems": 3, "maxItems": 2})")
                .find("minItems 3 > maxItems 2"),
            std::string::npos);
  EXPECT_NE(compile_error(R"({"$ref": "#/$defs/missing"})").find("names nothing"),
            std::string::npos);
  // A $ref back to its own target before any value (the matcher would recurse forever).
  EXPECT_NE(compile_error(R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}},
            "$ref": "#/$defs/a"})")
                .find("schema/$defs/a: it refers back to itself"),
            std::string::npos);
  EXPECT_NE(compile_error(R"({"$defs": {"b": {"allOf": [{"$ref": "#/$defs/b"}]}},
            "type": "array", "items": {"$ref": "#/$defs/b"}})")
                .find("left recursion"),
            std::string::npos);
  EXPECT_NE(compile_error(R"({"anyOf": [{"$ref": "#"}, {"type": "null"}]})").find("left recursion"),
            std::string::npos);
  // Nested past kMaxJsonNesting: refused before the compiler recurses (it overflowed the stack
  // at 10,000 levels); 500 levels compile.
  const auto items = [](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += R"({"items": )";
    return s + "{}" + std::string(static_cast<size_t>(n), '}');
  };
  EXPECT_NE(compile_error(items(100000)).find("schema: nested more than 512"), std::string::npos);
  EXPECT_EQ(compile_error(items(500)), "");
  EXPECT_NE(compile_error(R"({"type": "object", "properties": {"a": {}},
            "additionalProperties": true})")
                .find("additionalProperties"),
            std::string::npos);
  EXPECT_NE(compile_error(R"({"type": "strin"})").find("unknown type \"strin\""),
            std::string::npos);
  // An empty name is no type either (fuzz_schema found it compiled as "any value").
  EXPECT_NE(compile_error(R"({"type": ""})").find("unknown type \"\""), std::string::npos);
  EXPECT_NE(compile_error(R"({"type": ["integer", ""]})").find("unknown type \"\""),
            std::string::npos);
  EXPECT_NE(compile_error(R"({"enum": []})").find("schema.enum"), std::string::npos);
  EXPECT_NE(compile_error("false").find("admits no value"), std::string::npos);
  EXPECT_NE(compile_error(R"({"type": "array", "items": {"type": "number", "multipleOf": 2}})")
                .find("schema.items: the keyword 'multipleOf'"),
            std::string::npos);
  EXPECT_EQ(compile_error(R"({"type": "object", "title": "T", "description": "d",
            "properties": {"a": {"type": "string", "default": "x"}}})"),
            "");
}

// Valid documents, each a JSON object as nlohmann::json accepts it.
const char* const kObjects[] = {
    "{}",
    "{ }",
    R"({"a":1})",
    R"({"a": [1, 2.5, -3e+2, 0, -0.0, 1E5], "b": {"c": null, "d": [true, false, []]}})",
    R"({"s": "esc \" \\ \/ \b \f \n \r \t \u00e9 \uD83D\uDE00", "": ""})",
    "{\n  \"k\": \"v\",\n  \"n\": {\n    \"deep\": [ {}, { \"x\": 1 } ]\n  }\n}",
    R"({"a":"b","a":"c"})",
    R"({"num": 123456789012345678901234567890})",
};

TEST(JsonMatcher, AnyObjectAgreesWithAJsonParser) {
  const JsonGrammar g = JsonGrammar::any_object();
  for (const char* doc : kObjects) {
    ASSERT_TRUE(Json::accept(doc)) << doc;
    EXPECT_EQ(verdict(g, doc), 1) << doc;
    // Every proper prefix is alive and not complete (an object ends at its '}').
    const std::string d = doc;
    for (size_t n = 0; n < d.size(); ++n)
      EXPECT_EQ(verdict(g, d.substr(0, n)), 0) << d.substr(0, n);
  }
  // Not objects, or not JSON.
  for (const char* bad : {"[]",
                          "1",
                          "\"s\"",
                          "null",
                          "{",
                          "{\"a\"}",
                          "{\"a\":}",
                          "{,}",
                          "{\"a\":1,}",
                          "{\"a\":01}",
                          "{\"a\":1.}",
                          "{\"a\":.5}",
                          "{\"a\":tru}",
                          "{\"a\":\"\\x\"}",
                          "{\"a\":\"\\u12g4\"}",
                          "{\"a\":\"\t\"}",
                          "{} {}",
                          "{\"a\":-}",
                          "{\"a\":1e}",
                          "{'a':1}",
                          "{\"a\":+1}",
                          "{\"a\" 1}"}) {
    EXPECT_NE(verdict(g, bad), 1) << bad;
  }
  // Mutated documents (ASCII edits, whitespace runs short): whatever the parser says.
  std::mt19937 rng(7);
  const std::string alphabet = "{}[]\":,.-+0123456789eEtrufalsn\\/ \nabx";
  int complete = 0, checked = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string d = kObjects[trial % std::size(kObjects)];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % (d.size() + 1);
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          d.insert(d.begin() + static_cast<std::ptrdiff_t>(at), c);
          break;
        case 1:
          if (at < d.size()) d.erase(at, 1);
          break;
        default:
          if (at < d.size()) d[at] = c;
      }
    }
    Json parsed;
    const bool object = Json::accept(d) && Json::parse(d).is_object();
    EXPECT_EQ(verdict(g, d) == 1, object) << d;
    complete += object;
    ++checked;
  }
  EXPECT_GT(complete, 1000);  // the test saw both verdicts often
  EXPECT_LT(complete, checked - 1000);
}

TEST(JsonMatcher, SurrogatesOnlyInPairsAndExponentsOfTwoDigits) {
  const JsonGrammar g = JsonGrammar::any_object();
  EXPECT_EQ(verdict(g, R"({"e":"\uD83D\uDE00"})"), 1);
  EXPECT_EQ(verdict(g, R"({"e":"\ud83d\ude00x"})"), 1);
  EXPECT_EQ(verdict(g, R"({"e":"\uDE)"), -1);     // a low half alone, refused at once
  EXPECT_EQ(verdict(g, R"({"e":"\uD83D")"), -1);  // a high half must be followed by one
  EXPECT_EQ(verdict(g, R"({"e":"\uD83D\u00)"), -1);
  EXPECT_EQ(verdict(g, R"({"e":"\uE000\uFFFF"})"), 1);
  EXPECT_EQ(verdict(g, R"({"n":1e99,"m":-2.5E-07})"), 1);
  EXPECT_EQ(verdict(g, R"({"n":1e100})"), -1);
}

// Strings hold valid UTF-8 only: each case against the UTF-8 standard's table of
// well-formed byte sequences (Unicode 15, table 3-7).
TEST(JsonMatcher, StringsAreValidUtf8) {
  const JsonGrammar g = JsonGrammar::any_object();
  const auto in_string = [&](const std::string& bytes) {
    return verdict(g, "{\"s\":\"" + bytes + "\"}");
  };
  for (const char* ok :
       {"\x7F", "\xC2\x80", "\xDF\xBF", "\xE0\xA0\x80", "\xED\x9F\xBF", "\xEE\x80\x80",
        "\xF0\x90\x80\x80", "\xF4\x8F\xBF\xBF", "caf\xC3\xA9 \xF0\x9F\x98\x80"}) {
    EXPECT_EQ(in_string(ok), 1) << ok;
  }
  for (const char* bad :
       {"\x80", "\xBF", "\xC0\x80", "\xC1\xBF", "\xE0\x9F\xBF", "\xED\xA0\x80", "\xF0\x8F\xBF\xBF",
        "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\xFF", "\xC3", "\xE2\x82", "\xC3\\n"}) {
    EXPECT_EQ(in_string(bad), -1) << bad;
  }
}

TEST(JsonMatcher, LimitsWhitespaceAndNumberLength) {
  const JsonGrammar g = JsonGrammar::any_object();
  const std::string ws(kMaxJsonWhitespace, ' ');
  EXPECT_EQ(verdict(g, "{" + ws + "}"), 1);
  EXPECT_EQ(verdict(g, "{" + ws + " }"), -1);
  const std::string digits(kMaxJsonNumberBytes, '7');
  EXPECT_EQ(verdict(g, "{\"n\":" + digits + "}"), 1);
  EXPECT_EQ(verdict(g, "{\"n\":" + digits + "7}"), -1);
  // A number's last byte cannot be one that needs a digit after it ('-', '.', 'e', an
  // exponent's sign), nor can the byte before it open an exponent's sign: no dead ends
  // (fuzz_schema found '[' then 38 digits then 'E').
  const std::string d38(kMaxJsonNumberBytes - 2, '7');
  EXPECT_EQ(verdict(g, "{\"n\":" + d38 + "1E"), -1);
  EXPECT_EQ(verdict(g, "{\"n\":" + d38 + "1."), -1);
  EXPECT_EQ(verdict(g, "{\"n\":" + d38 + "E"), 0);
  EXPECT_EQ(verdict(g, "{\"n\":" + d38 + "E1}"), 1);
  EXPECT_EQ(verdict(g, "{\"n\":" + d38 + "E+"), -1);
  EXPECT_EQ(verdict(g, "{\"n\":" + d38.substr(1) + "E+"), 0);
  EXPECT_EQ(verdict(g, "{\"n\":" + d38.substr(1) + "E+1}"), 1);
  EXPECT_EQ(verdict(g, "{\"n\":-"), 0);
}

const char* const kSchemas[] = {
    R"({"type": "object", "properties": {
         "name": {"type": "string", "minLength": 2, "maxLength": 5},
         "age": {"type": "integer"},
         "tags": {"type": "array", "items": {"enum": ["a", "b", 1, null, {"k": [true]}]},
                  "minItems": 1, "maxItems": 3},
         "opt": {"type": ["number", "null"]},
         "flag": {"type": "boolean"}},
       "required": ["name", "tags"], "additionalProperties": false})",
    R"({"$defs": {"node": {"type": "object", "properties": {
         "v": {"const": {"x": [1, 2]}},
         "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
         "required": ["v"]}},
       "$ref": "#/$defs/node"})",
    R"({"anyOf": [{"type": "string", "maxLength": 3},
                  {"type": "object", "additionalProperties": {"type": "integer"}},
                  {"type": "array", "items": {"type": "string"}}]})",
    R"({"type": "integer"})",
    R"({"enum": ["red", "green", "re", 10, 1]})",
    R"({"type": "object", "properties": {"a": {"type": "null"}, "ab": {"type": "null"},
         "abc": {"allOf": [{"type": "boolean"}]}}, "required": ["abc"]})",
    R"({"type": "object"})",
    R"({"type": "array", "items": {"type": "object", "properties": {}}, "maxItems": 4})",
    R"({"type": "object", "properties": {
         "id": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
         "tag": {"type": "string", "pattern": "ab|c", "minLength": 2, "maxLength": 4},
         "word": {"type": ["string", "null"], "pattern": "^\\w+$", "maxLength": 6},
         "n": {"type": "integer", "format": "int64"}},
       "required": ["id", "tag", "word", "n"]})",
    R"({"type": "array", "minItems": 5, "maxItems": 5, "items": {"anyOf": [
         {"type": "string", "format": "date"}, {"type": "string", "format": "time"},
         {"type": "string", "format": "date-time"}, {"type": "string", "format": "uuid"},
         {"type": "string", "format": "ipv4"}]}})",
    R"({"type": "object", "properties": {
         "count": {"type": "integer", "minimum": 1, "maximum": 20},
         "p": {"type": "number", "minimum": 0, "maximum": 1},
         "t": {"type": ["number", "null"], "exclusiveMinimum": -273.15, "exclusiveMaximum": 1e3},
         "old": {"type": "integer", "minimum": -3, "exclusiveMinimum": true, "maximum": 3,
                 "exclusiveMaximum": false},
         "neg": {"maximum": -0.5}},
       "required": ["count", "p", "t", "old", "neg"]})",
    R"({"type": "array", "items": {"anyOf": [{"type": "integer", "minimum": 1000},
         {"type": "number", "exclusiveMaximum": 0}]}, "minItems": 3})",
};

TEST(JsonMatcher, WhatASchemaAllowsSatisfiesIt) {
  std::mt19937 rng(11);
  for (const char* text : kSchemas) {
    const Json schema = Json::parse(text);
    const JsonGrammar g = JsonGrammar::from_schema(schema);
    int ended = 0;
    for (int trial = 0; trial < 300; ++trial) {
      const std::string out = random_text(g, rng);
      if (out.empty()) continue;
      ++ended;
      ASSERT_TRUE(Json::accept(out)) << text << "\n" << out;
      EXPECT_TRUE(satisfies(Json::parse(out), schema, schema)) << text << "\n" << out;
    }
    EXPECT_GT(ended, 250) << text;
  }
}

TEST(JsonMatcher, SchemaVerdictsByHand) {
  const JsonGrammar person = JsonGrammar::from_schema(Json::parse(kSchemas[0]));
  EXPECT_EQ(verdict(person, R"({"name": "Ann", "tags": ["a", 1, {"k":[true]}]})"), 1);
  EXPECT_EQ(verdict(person, R"({"name":"Bob","age":-3,"tags":[null],"opt":null,"flag":false})"), 1);
  EXPECT_EQ(verdict(person, R"({"tags": ["a"]})"), -1);                 // name is required
  EXPECT_EQ(verdict(person, R"({"tags": ["a"], "name": "Ann"})"), -1);  // schema order
  EXPECT_EQ(verdict(person, R"({"name": "Annabel")"), -1);              // maxLength 5
  EXPECT_EQ(verdict(person, R"({"name": "A)"), 0);                      // minLength 2, so far
  EXPECT_EQ(verdict(person, R"({"name": "A")"), -1);                    // ... and closed
  EXPECT_EQ(verdict(person, R"({"name": "Ann", "tags": []})"), -1);     // minItems 1
  EXPECT_EQ(verdict(person, R"({"name": "Ann", "tags": ["a","a","a","a"]})"), -1);
  EXPECT_EQ(verdict(person, R"({"name": "Ann", "age": 1.5)"), -1);      // an integer
  EXPECT_EQ(verdict(person, R"({"name": "Ann", "tags": ["c"]})"), -1);  // not in the enum
  EXPECT_EQ(verdict(person, R"({"name": "Ann", "tags": ["a"], "x": 1})"), -1);
  const JsonGrammar colors = JsonGrammar::from_schema(Json::parse(kSchemas[4]));
  EXPECT_EQ(verdict(colors, R"("re")"), 1);
  EXPECT_EQ(verdict(colors, R"("red")"), 1);
  EXPECT_EQ(verdict(colors, R"("r)"), 0);
  EXPECT_EQ(verdict(colors, "1"), 1);
  EXPECT_EQ(verdict(colors, "10"), 1);
  EXPECT_EQ(verdict(colors, "100"), -1);
  const JsonGrammar integer = JsonGrammar::from_schema(Json::parse(kSchemas[3]));
  EXPECT_EQ(verdict(integer, "-12"), 1);  // ends without a byte of its own
  EXPECT_EQ(verdict(integer, "-"), 0);
  EXPECT_EQ(verdict(integer, "1.0"), -1);
  const JsonGrammar bounded = JsonGrammar::from_schema(Json::parse(
      R"({"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 20}})"));
  EXPECT_EQ(verdict(bounded, "[1, 20, 9]"), 1);
  EXPECT_EQ(verdict(bounded, "[0"), -1);
  EXPECT_EQ(verdict(bounded, "[2"), 0);  // 2, or 20 to come
  EXPECT_EQ(verdict(bounded, "[21"), -1);
  EXPECT_EQ(verdict(bounded, "[-1"), -1);
  EXPECT_EQ(verdict(bounded, "[1e1"), -1);  // no exponent under bounds
  const JsonGrammar unit = JsonGrammar::from_schema(
      Json::parse(R"({"type": "number", "exclusiveMinimum": 0, "maximum": 1})"));
  EXPECT_EQ(verdict(unit, "0"), 0);  // 0.5 may follow
  EXPECT_EQ(verdict(unit, "0.0"), 0);
  EXPECT_EQ(verdict(unit, "0.25"), 1);
  EXPECT_EQ(verdict(unit, "1"), 1);
  EXPECT_EQ(verdict(unit, "1.0"), 1);
  EXPECT_EQ(verdict(unit, "1.01"), -1);
  EXPECT_EQ(verdict(unit, "0.123456789012345"), 1);
  EXPECT_EQ(verdict(unit, "0.1234567890123456"), -1);  // 16 digits
}

}  // namespace
}  // namespace qf::rt
