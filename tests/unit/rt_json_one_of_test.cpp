// oneOf in JsonGrammar: compiled only where the alternatives are provably disjoint
// (json_disjoint.h). Every pair of a pool of alternatives is tried: where the compiler takes
// the pair, random values written under it must each satisfy exactly one alternative by
// json_schema_check.h's checker (written from the JSON Schema rules); where some random value
// of one alternative satisfies the other, the compiler must have refused. Then discriminated
// unions as pydantic writes them, and the refusal's text.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "json_schema_check.h"
#include "qf/error.h"
#include "qf/rt/json_grammar.h"

namespace qf::rt {
namespace {

using Json = nlohmann::ordered_json;
using test::random_text;
using test::satisfies;
using test::schema_error;

const char* const kAlternatives[] = {
    R"({"type": "string", "maxLength": 3})",
    R"({"type": "integer", "minimum": 0, "maximum": 9})",
    R"({"type": "number"})",
    R"({"type": "null"})",
    R"({"type": "boolean"})",
    R"({"enum": ["a", "b", 1]})",
    R"({"const": "c"})",
    R"({"enum": [2.0, null]})",
    R"({"type": "array", "items": {"type": "integer"}, "maxItems": 2})",
    R"({"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
        "required": ["kind"]})",
    R"({"type": "object", "properties": {"kind": {"const": "dog"}, "lives": {"type": "string"}},
        "required": ["kind", "lives"]})",
    R"({"type": "object", "properties": {"kind": {"enum": ["dog", "fox"]}}})",
    R"({"type": "object", "properties": {"x": {"type": "null"}}, "required": ["x"],
        "additionalProperties": false})",
    R"({"type": "object", "properties": {"y": {"type": "null"}}, "required": ["y"],
        "additionalProperties": false})",
    R"({"type": "object", "properties": {"y": {"type": "null"}}, "required": ["y"]})",
    R"({"properties": {"kind": {"const": "owl"}}, "required": ["kind"]})",
    R"({"anyOf": [{"type": "null"}, {"type": "object", "properties": {"kind": {"const": "cow"}},
        "required": ["kind"]}]})",
    R"({"type": "object", "properties": {"lives": {"type": "integer"}}, "required": ["lives"]})",
};

TEST(JsonOneOf, TakesThePairsNoValueMatchesTwiceAndRefusesTheOthers) {
  std::mt19937 rng(3);
  const size_t n = std::size(kAlternatives);
  int taken = 0, refused = 0;
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = i + 1; j < n; ++j) {
      const Json a = Json::parse(kAlternatives[i]), b = Json::parse(kAlternatives[j]);
      const Json one_of = {{"oneOf", {a, b}}};
      const std::string why = schema_error(one_of);
      // Values of each alternative alone, as the matcher writes them: does one satisfy both?
      bool both = false;
      for (const Json& alt : {a, b}) {
        const JsonGrammar g = JsonGrammar::from_schema(alt);
        for (int trial = 0; trial < 200 && !both; ++trial) {
          const std::string text = random_text(g, rng);
          if (text.empty()) continue;
          const Json v = Json::parse(text);
          both = satisfies(v, a, a) && satisfies(v, b, b);
        }
      }
      if (why.empty()) {
        ++taken;
        EXPECT_FALSE(both) << "taken, yet a value satisfies both:\n" << one_of.dump();
        const JsonGrammar g = JsonGrammar::from_schema(one_of);
        for (int trial = 0; trial < 100; ++trial) {
          const std::string text = random_text(g, rng);
          if (text.empty()) continue;
          EXPECT_TRUE(satisfies(Json::parse(text), one_of, one_of)) << one_of.dump() << "\n"
                                                                    << text;
        }
      } else {
        ++refused;
        EXPECT_NE(why.find("schema.oneOf: alternatives 0 and 1 may both match"), std::string::npos)
            << why;
      }
    }
  }
  std::printf("  %d pairs taken, %d refused\n", taken, refused);
  EXPECT_GT(taken, 100);
  EXPECT_GT(refused, 15);
}

// A discriminated union as pydantic writes it: $refs to models told apart by a Literal field,
// the discriminator keyword beside (an annotation).
TEST(JsonOneOf, TakesPydanticDiscriminatedUnions) {
  const Json schema = Json::parse(R"({
    "$defs": {
      "Cat": {"properties": {"pet_type": {"const": "cat", "title": "Pet Type", "type": "string"},
                             "meows": {"title": "Meows", "type": "integer"}},
              "required": ["pet_type", "meows"], "title": "Cat", "type": "object"},
      "Dog": {"properties": {"pet_type": {"const": "dog", "title": "Pet Type", "type": "string"},
                             "barks": {"title": "Barks", "type": "number"}},
              "required": ["pet_type", "barks"], "title": "Dog", "type": "object"}},
    "properties": {"pet": {"discriminator": {"mapping": {"cat": "#/$defs/Cat",
                                                         "dog": "#/$defs/Dog"},
                                             "propertyName": "pet_type"},
                           "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
                           "title": "Pet"},
                   "n": {"title": "N", "type": "integer"}},
    "required": ["pet", "n"], "title": "Model", "type": "object"})");
  const JsonGrammar g = JsonGrammar::from_schema(schema);
  std::mt19937 rng(8);
  int cats = 0, dogs = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const std::string text = random_text(g, rng);
    if (text.empty()) continue;
    const Json v = Json::parse(text);
    EXPECT_TRUE(satisfies(v, schema, schema)) << text;
    cats += v["pet"]["pet_type"] == "cat";
    dogs += v["pet"]["pet_type"] == "dog";
  }
  EXPECT_GT(cats, 50);
  EXPECT_GT(dogs, 50);
  // The same models with the same tag are refused.
  Json same = schema;
  same["$defs"]["Dog"]["properties"]["pet_type"]["const"] = "cat";
  EXPECT_NE(schema_error(same).find("schema.properties.pet.oneOf: alternatives 0 and 1 may both "
                                    "match a value"),
            std::string::npos);
}

TEST(JsonOneOf, RefusesBesideTypeOrAnyOf) {
  EXPECT_NE(schema_error(Json::parse(R"({"type": "object", "oneOf": [{"required": []}]})"))
                .find("'type' beside 'oneOf'"),
            std::string::npos);
  EXPECT_NE(schema_error(Json::parse(R"({"anyOf": [true], "oneOf": [true]})")).find("beside"),
            std::string::npos);
  EXPECT_NE(schema_error(Json::parse(R"({"oneOf": []})")).find("schema.oneOf: must be a non-empty"),
            std::string::npos);
}

}  // namespace
}  // namespace qf::rt
