// The reply splitter (chat_output.h): replies written by transformers' rendering of the official
// Qwen3.5 template (the chat goldens) split back into the messages that made them; the split
// the same whether the text comes whole or in any pieces; and the tool-call values' typing.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "qf/ckpt/file_io.h"
#include "qf/rt/chat_output.h"

namespace qf::rt {
namespace {

using Json = nlohmann::ordered_json;

struct Parts {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
};

void add(Parts& p, ChatDelta d) {
  p.reasoning += d.reasoning;
  p.content += d.content;
  for (ToolCall& c : d.tool_calls) p.calls.push_back(std::move(c));
}

// The text in pieces cut at `cuts` (sorted byte offsets).
Parts split(const std::string& text, bool reasoning, const Json& tools,
            const std::vector<size_t>& cuts = {}, bool parse_tools = true) {
  ChatOutputParser parser(reasoning, tools, parse_tools);
  Parts p;
  size_t from = 0;
  for (size_t cut : cuts) {
    add(p, parser.push(text.substr(from, cut - from)));
    from = cut;
  }
  add(p, parser.push(text.substr(from)));
  add(p, parser.finish());
  return p;
}

void expect_same(const Parts& a, const Parts& b, const std::string& where) {
  EXPECT_EQ(a.reasoning, b.reasoning) << where;
  EXPECT_EQ(a.content, b.content) << where;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << where;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].name, b.calls[i].name) << where;
    EXPECT_EQ(a.calls[i].arguments.dump(), b.calls[i].arguments.dump()) << where;
  }
}

// Every single cut, every pair of cuts for short texts, and random piecewise splits: each must
// give what the whole text gives.
void expect_split_invariant(const std::string& text, bool reasoning, const Json& tools) {
  const Parts whole = split(text, reasoning, tools);
  for (size_t i = 0; i <= text.size(); ++i) {
    expect_same(whole, split(text, reasoning, tools, {i}), "cut at " + std::to_string(i));
  }
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<size_t> cuts;
    for (size_t at = 0; at < text.size(); at += 1 + rng() % 4) cuts.push_back(at);
    expect_same(whole, split(text, reasoning, tools, cuts), "random pieces");
  }
  std::vector<size_t> bytes;
  for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
  expect_same(whole, split(text, reasoning, tools, bytes), "byte by byte");
}

std::string strip(const std::string& s, const char* chars) {
  const size_t a = s.find_first_not_of(chars);
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(chars) - a + 1);
}

// The golden cases' assistant turns, as the template rendered them, split back into the
// messages' reasoning, content and calls. Turns whose message the round trip cannot restore by
// design are left out: inline or unbalanced think tags in the content, and call arguments that
// are not strings where the tool's schema does not type them (the template writes their
// Python str()).
TEST(ChatOutput, TemplateRepliesSplitBackIntoTheirMessages) {
  const Json doc =
      Json::parse(ckpt::read_text_file(std::string(QF_GOLDEN_DIR) + "/chat_golden.json"));
  int turns = 0, with_reasoning = 0, with_calls = 0;
  for (const Json& c : doc.at("cases")) {
    const std::string expected = c.at("expected");
    const Json& tools = c.at("tools");
    std::vector<std::string> rendered;  // complete assistant turns, in order
    for (size_t at = expected.find("<|im_start|>assistant\n"); at != std::string::npos;
         at = expected.find("<|im_start|>assistant\n", at + 1)) {
      const size_t begin = at + 22, end = expected.find("<|im_end|>", begin);
      if (end != std::string::npos) rendered.push_back(expected.substr(begin, end - begin));
    }
    size_t turn = 0;
    for (const Json& m : c.at("messages")) {
      if (m.at("role") != "assistant") continue;
      ASSERT_LT(turn, rendered.size()) << c.at("name");
      std::string text = rendered[turn++];
      const std::string content = m.at("content").is_string() ? m.at("content").get<std::string>()
                                  : m.at("content").is_null() ? ""
                                                              : "parts";
      if (content == "parts" || content.find("think>") != std::string::npos) continue;
      std::string reasoning;
      for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
        if (m.contains(key) && m[key].is_string()) {
          reasoning = m[key];
          break;
        }
      }
      // A turn that keeps its reasoning starts with the block the generation prompt opens.
      const bool kept = text.rfind("<think>\n", 0) == 0;
      if (kept) text.erase(0, 8);
      Parts want{kept ? strip(reasoning, "\n") : "", strip(content, " \n\t\r"), {}};
      bool restorable = true;
      for (const Json& tc : m.value("tool_calls", Json::array())) {
        const Json& f = tc.contains("function") ? tc["function"] : tc;
        Json args = f.at("arguments");
        if (args.is_string()) {
          args = args.get<std::string>().empty() ? Json::object()
                                                 : Json::parse(args.get<std::string>());
        }
        for (const auto& [key, value] : args.items()) {
          const Json* props = nullptr;
          for (const Json& t : tools) {
            if (t["function"]["name"] == f["name"])
              props = &t["function"]["parameters"]["properties"];
          }
          const bool typed = props && props->contains(key) && (*props)[key]["type"] != "string";
          restorable = restorable && (value.is_string() || typed);
        }
        want.calls.push_back({f.at("name"), args});
      }
      if (!restorable) continue;
      ++turns;
      with_reasoning += !want.reasoning.empty();
      with_calls += !want.calls.empty();
      SCOPED_TRACE(c.at("name").get<std::string>() + ", turn " + std::to_string(turn));
      expect_same(want, split(text, kept, tools), "whole");
      expect_split_invariant(text, kept, tools);
    }
  }
  // What the goldens hold today; a smaller count means cases were lost.
  EXPECT_GE(turns, 12);
  EXPECT_GE(with_reasoning, 6);
  EXPECT_GE(with_calls, 3);
}

const Json kTools = Json::parse(R"([
  {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"},
    "b": {"type": "boolean"}, "o": {"type": "object"}, "a": {"type": "array"},
    "u": {"type": ["null", "integer"]}, "x": {}}}}}])");

ToolCall call(const std::string& body) {
  ToolCall c;
  EXPECT_TRUE(parse_tool_call(body, kTools, &c)) << body;
  return c;
}

TEST(ChatOutput, ToolCallValuesTakeTheSchemasTypes) {
  const auto arg = [](const std::string& key, const std::string& value) {
    return call("\n<function=f>\n<parameter=" + key + ">\n" + value +
                "\n</parameter>\n</function>\n")
        .arguments.at(key);
  };
  EXPECT_EQ(arg("s", "42"), Json("42"));
  EXPECT_EQ(arg("s", "null"), Json("null"));
  EXPECT_EQ(arg("s", "two\nlines"), Json("two\nlines"));
  EXPECT_EQ(arg("s", "\nkept newline\n"), Json("\nkept newline\n"));  // one stripped each side
  EXPECT_EQ(arg("i", "42"), Json(42));
  EXPECT_EQ(arg("i", "-7"), Json(-7));
  EXPECT_EQ(arg("i", "4.5"), Json("4.5"));
  EXPECT_EQ(arg("i", "None"), Json());
  EXPECT_EQ(arg("n", "4.5"), Json(4.5));
  EXPECT_EQ(arg("n", "1e+16"), Json(1e16));
  EXPECT_EQ(arg("n", "many"), Json("many"));
  EXPECT_EQ(arg("b", "True"), Json(true));
  EXPECT_EQ(arg("b", "false"), Json(false));
  EXPECT_EQ(arg("b", "yes"), Json("yes"));
  EXPECT_EQ(arg("o", R"({"k": [1, 2]})"), Json::parse(R"({"k": [1, 2]})"));
  EXPECT_EQ(arg("o", "{broken"), Json("{broken"));
  EXPECT_EQ(arg("a", "[1, \"x\"]"), Json::parse("[1, \"x\"]"));
  EXPECT_EQ(arg("u", "3"), Json(3));
  EXPECT_EQ(arg("x", "[true]"), Json::parse("[true]"));  // untyped: JSON when it parses
  EXPECT_EQ(arg("unlisted", "[true]"), Json("[true]"));  // not in the schema: a string
  ToolCall c;
  EXPECT_TRUE(parse_tool_call("<function=g>\n</function>", kTools, &c));  // no parameters
  EXPECT_EQ(c.name, "g");
  EXPECT_TRUE(c.arguments.empty());
  for (const char* bad :
       {"", "<function=f>", "<function=>\n</function>", "text</function>",
        "<function=f>\n<parameter=s>\nv\n</function>", "<function=f>\njunk\n</function>",
        "<function=f>\n<parameter=>v</parameter>\n</function>"}) {
    EXPECT_FALSE(parse_tool_call(bad, kTools, &c)) << bad;
  }
}

TEST(ChatOutput, EdgesOfTheSplit) {
  const std::string a_call =
      "<tool_call>\n<function=f>\n<parameter=i>\n1\n</parameter>\n</function>\n</tool_call>";
  struct Case {
    std::string text;
    bool reasoning;
    Parts want;
  };
  const std::vector<Case> cases = {
      {"\nthink\n\n</think>\n\nanswer  \n", true, {"think", "answer", {}}},
      {"ran out of tokens mid-thought\n", true, {"ran out of tokens mid-thought", "", {}}},
      {"</think>", true, {"", "", {}}},
      {"a </thin", true, {"a </thin", "", {}}},  // a tag start at the end is text
      {"no think block </think> stays", false, {"", "no think block </think> stays", {}}},
      {"r</think>\n\nx " + a_call + "\n\n" + a_call + "\n",
       true,
       {"r", "x", {{"f", {{"i", 1}}}, {"f", {{"i", 1}}}}}},
      {"before\n<tool_call>\nnot a call\n</tool_call> after",
       false,
       {"", "before<tool_call>\nnot a call\n</tool_call>after", {}}},
      {"x <tool_call>\n<function=f>\n<parameter=i>\n1",
       false,
       {"", "x<tool_call>\n<function=f>\n<parameter=i>\n1", {}}},  // left open
      {"x <tool_c", false, {"", "x <tool_c", {}}},
  };
  for (const Case& c : cases) {
    expect_same(c.want, split(c.text, c.reasoning, kTools), c.text);
    expect_split_invariant(c.text, c.reasoning, kTools);
  }
  // Tools not parsed (tool_choice "none"): the call stays content.
  expect_same({"", a_call, {}}, split(a_call, false, kTools, {}, false), "parse_tools off");
}

}  // namespace
}  // namespace qf::rt
