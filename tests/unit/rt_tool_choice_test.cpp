// Forced tool choices (tool_choice.h): texts written by a random walk of the matcher over the
// "required" and named schemas are JSON whose calls name a tool and satisfy that tool's own
// `parameters` (json_schema_check.h's checker, run on the schema as the request gave it, so the
// re-rooted `$ref`s are checked against the originals); ForcedToolCallParser reads the same
// calls out of those texts, whatever pieces they arrive in, as nlohmann::json parses them.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>

#include "json_schema_check.h"
#include "qf/rt/tool_choice.h"

namespace qf::rt {
namespace {

using Json = nlohmann::ordered_json;
using test::random_text;
using test::satisfies;
using test::verdict;

// Three tools: typed keys, a `$ref` into the tool's own `$defs` (and an enum whose value is an
// object holding "$ref", data that must stay as written), and none at all.
const Json kTools = Json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"}},
    "required": ["city"]}}},
  {"type": "function", "function": {"name": "move", "parameters": {"type": "object",
    "$defs": {"pt": {"type": "object", "properties": {"x": {"type": "number"},
      "y": {"type": "number"}}, "required": ["x", "y"]}},
    "properties": {"to": {"$ref": "#/$defs/pt"}, "mode": {"enum": ["walk", {"$ref": "#/x"}]}},
    "required": ["to", "mode"]}}},
  {"type": "function", "function": {"name": "now"}}])");

Json parameters_of(const std::string& name) {
  for (const Json& t : kTools) {
    if (t["function"]["name"] == name)
      return t["function"].value("parameters", Json::parse(R"({"type": "object",
          "properties": {}})"));
  }
  ADD_FAILURE() << "no tool " << name;
  return Json();
}

// The calls ForcedToolCallParser reads from `text` fed in random pieces.
ChatDelta read_calls(const ToolChoice& c, const std::string& text, std::mt19937& rng) {
  ForcedToolCallParser p(c);
  ChatDelta all;
  for (size_t at = 0; at < text.size();) {
    const size_t n = std::min(text.size() - at, size_t{1} + rng() % 7);
    ChatDelta d = p.push(std::string_view(text).substr(at, n));
    EXPECT_TRUE(d.content.empty()) << text;
    for (ToolCall& call : d.tool_calls) all.tool_calls.push_back(std::move(call));
    at += n;
  }
  all.content = p.finish().content;
  return all;
}

TEST(ToolChoice, RequiredRepliesCallTheToolsByTheirSchemas) {
  const ToolChoice c{ToolChoice::Kind::kRequired, ""};
  const JsonGrammar g = JsonGrammar::from_schema(forced_tool_schema(kTools, c));
  std::mt19937 rng(3);
  std::set<std::string> called;
  int ended = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const std::string text = random_text(g, rng);
    if (text.empty()) continue;
    ++ended;
    ASSERT_TRUE(Json::accept(text)) << text;
    const Json v = Json::parse(text);
    ASSERT_TRUE(v.is_array() && !v.empty()) << text;
    const ChatDelta d = read_calls(c, text, rng);
    EXPECT_EQ(d.content, "") << text;
    ASSERT_EQ(d.tool_calls.size(), v.size()) << text;
    for (size_t i = 0; i < v.size(); ++i) {
      ASSERT_TRUE(v[i].is_object() && v[i].size() == 2) << text;
      const std::string name = v[i]["name"];
      const Json params = parameters_of(name);
      EXPECT_TRUE(satisfies(v[i]["parameters"], params, params)) << text;
      EXPECT_EQ(d.tool_calls[i].name, name);
      EXPECT_EQ(d.tool_calls[i].arguments, v[i]["parameters"]) << text;
      called.insert(name);
    }
  }
  EXPECT_GT(ended, 250);
  EXPECT_EQ(called.size(), 3u);  // every tool came up
}

TEST(ToolChoice, NamedRepliesAreTheArgumentsObject) {
  std::mt19937 rng(4);
  for (const char* name : {"get_weather", "move", "now"}) {
    const ToolChoice c{ToolChoice::Kind::kNamed, name};
    const Json schema = forced_tool_schema(kTools, c);
    EXPECT_EQ(schema, parameters_of(name));
    const JsonGrammar g = JsonGrammar::from_schema(schema);
    int ended = 0;
    for (int trial = 0; trial < 100; ++trial) {
      const std::string text = random_text(g, rng);
      if (text.empty()) continue;
      ++ended;
      ASSERT_TRUE(Json::accept(text)) << text;
      const Json v = Json::parse(text);
      EXPECT_TRUE(v.is_object() && satisfies(v, schema, schema)) << text;
      const ChatDelta d = read_calls(c, text, rng);
      ASSERT_EQ(d.tool_calls.size(), 1u) << text;
      EXPECT_EQ(d.tool_calls[0].name, name);
      EXPECT_EQ(d.tool_calls[0].arguments, v);
      EXPECT_EQ(d.content, "");
    }
    EXPECT_GT(ended, 80) << name;
  }
}

TEST(ToolChoice, VerdictsByHand) {
  const JsonGrammar req =
      JsonGrammar::from_schema(forced_tool_schema(kTools, {ToolChoice::Kind::kRequired, ""}));
  EXPECT_EQ(verdict(req, R"([{"name":"now","parameters":{}}])"), 1);
  EXPECT_EQ(verdict(req, R"([])"), -1);  // at least one call
  EXPECT_EQ(verdict(req, R"([{"name":"later")"), -1);
  EXPECT_EQ(verdict(req, R"([{"parameters":{}})"), -1);  // the name first
  EXPECT_EQ(verdict(req, R"([{"name":"now","parameters":{"city":"x"}}])"), -1);
  EXPECT_EQ(verdict(req, R"([{"name":"get_weather","parameters":{"city":"Oslo","days":2}},)"
                         R"({"name":"move","parameters":{"to":{"x":1,"y":-2.5},"mode":)"
                         R"({"$ref":"#/x"}}}])"),
            1);
  EXPECT_EQ(verdict(req, R"([{"name":"move","parameters":{"to":{"x":1},)"), -1);
  const JsonGrammar named =
      JsonGrammar::from_schema(forced_tool_schema(kTools, {ToolChoice::Kind::kNamed, "now"}));
  EXPECT_EQ(verdict(named, "{}"), 1);
  EXPECT_EQ(verdict(named, R"({"a")"), -1);
  // "parameters": null is a function without parameters, as when it is left out.
  const Json null_params =
      Json::parse(R"([{"type": "function", "function": {"name": "n", "parameters": null}}])");
  for (const ToolChoice& c :
       {ToolChoice{ToolChoice::Kind::kNamed, "n"}, ToolChoice{ToolChoice::Kind::kRequired, ""}}) {
    const JsonGrammar g = JsonGrammar::from_schema(forced_tool_schema(null_params, c));
    EXPECT_EQ(
        verdict(g, c.kind == ToolChoice::Kind::kNamed ? "{}" : R"([{"name":"n","parameters":{}}])"),
        1);
  }
}

TEST(ToolChoice, ParserKeepsStringsWholeAndGivesBackWhatDidNotClose) {
  std::mt19937 rng(5);
  const ToolChoice req{ToolChoice::Kind::kRequired, ""};
  const std::string tricky = R"([{"name":"get_weather","parameters":{"city":"a}],\"[{\\"}},)"
                             "\n"
                             R"( {"name":"now","parameters":{}}])";
  ChatDelta d = read_calls(req, tricky, rng);
  ASSERT_EQ(d.tool_calls.size(), 2u);
  EXPECT_EQ(d.tool_calls[0].arguments, Json::parse(R"({"city":"a}],\"[{\\"})"));
  EXPECT_EQ(d.tool_calls[1].name, "now");
  EXPECT_EQ(d.content, "");
  // Cut short (max_tokens): the calls that closed, then the rest as written.
  const std::string cut = R"([{"name":"now","parameters":{}}, {"name":"get_weather","param)";
  d = read_calls(req, cut, rng);
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.content, R"({"name":"get_weather","param)");
  d = read_calls({ToolChoice::Kind::kNamed, "get_weather"}, R"({"city": "Os)", rng);
  EXPECT_TRUE(d.tool_calls.empty());
  EXPECT_EQ(d.content, R"({"city": "Os)");
}

}  // namespace
}  // namespace qf::rt
