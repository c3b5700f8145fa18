// The native Qwen3.5 chat template against transformers' rendering of the official Jinja
// template (tests/golden/make_chat_goldens.py -> data/chat_golden.json), byte for byte, plus
// the input checks: every malformed field is refused with its index and name.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "qf/ckpt/file_io.h"
#include "qf/rt/chat.h"
#include "test_support.h"

namespace qf::rt {
namespace {

using Json = nlohmann::ordered_json;

const Json& golden() {
  static const Json doc =
      Json::parse(ckpt::read_text_file(std::string(QF_GOLDEN_DIR) + "/chat_golden.json"));
  return doc;
}

// Position and surroundings of the first difference, for a readable failure.
std::string first_difference(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  const size_t from = i < 40 ? 0 : i - 40;
  return "byte " + std::to_string(i) + ": expected ..." + a.substr(from, 80) + "... got ..." +
         b.substr(from, 80) + "...";
}

// One test per golden case, named after it. Without the data file there are none, and
// TemplateProvenanceIsRecorded fails instead.
size_t n_cases() {
  try {
    return golden().at("cases").size();
  } catch (const std::exception&) {
    return 0;
  }
}

class ChatGoldenCase : public ::testing::TestWithParam<size_t> {};

TEST_P(ChatGoldenCase, MatchesTransformersByteForByte) {
  const Json& c = golden().at("cases").at(GetParam());
  const ChatOptions opts{.add_generation_prompt = c["options"]["add_generation_prompt"],
                         .enable_thinking = c["options"]["enable_thinking"]};
  const std::string expected = c.at("expected");
  const std::string got = render_chat(c.at("messages"), c.at("tools"), opts);
  EXPECT_EQ(got, expected) << first_difference(expected, got);
}

INSTANTIATE_TEST_SUITE_P(Qwen35, ChatGoldenCase, ::testing::Range<size_t>(0, n_cases()),
                         [](const ::testing::TestParamInfo<size_t>& p) {
                           return golden()["cases"][p.param]["name"].get<std::string>();
                         });

TEST(ChatGolden, TemplateProvenanceIsRecorded) {
  ASSERT_GE(golden().at("cases").size(), 20u);
  const Json& p = golden().at("provenance");
  EXPECT_NE(p.at("official_source").get<std::string>().find("Qwen/Qwen3.5-35B-A3B"),
            std::string::npos);
  EXPECT_EQ(p.at("template_sha256").get<std::string>().size(), 64u);
}

Json user(const std::string& text) {
  return {{"role", "user"}, {"content", text}};
}

TEST(Chat, GenerationPromptFollowsOptions) {
  const Json msgs = Json::array({user("hi")});
  const std::string base = "<|im_start|>user\nhi<|im_end|>\n";
  EXPECT_EQ(render_chat(msgs, nullptr), base + "<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(render_chat(msgs, nullptr, {.enable_thinking = false}),
            base + "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(render_chat(msgs, nullptr, {.add_generation_prompt = false}), base);
  EXPECT_EQ(render_chat(msgs, Json::array()), render_chat(msgs, nullptr));  // [] = no tools
}

TEST(Chat, ArgumentsAsStringOrObjectRenderAlike) {
  auto conv = [](const Json& args) {
    return Json::array(
        {user("q"),
         {{"role", "assistant"},
          {"content", nullptr},
          {"tool_calls",
           {{{"type", "function"}, {"function", {{"name", "f"}, {"arguments", args}}}}}}}});
  };
  const Json obj = Json::parse(R"({"b": 1.5, "a": [true, null], "s": "x"})");
  EXPECT_EQ(render_chat(conv(obj.dump()), nullptr), render_chat(conv(obj), nullptr));
  // Key order is the caller's, not sorted.
  EXPECT_NE(render_chat(conv(obj), nullptr).find("<parameter=b>\n1.5\n</parameter>\n<parameter=a>"),
            std::string::npos);
  EXPECT_EQ(render_chat(conv(""), nullptr), render_chat(conv(Json::object()), nullptr));
  EXPECT_EQ(render_chat(conv(nullptr), nullptr), render_chat(conv(Json::object()), nullptr));
}

// The Error a render throws: its code and message.
std::pair<Errc, std::string> failure(const Json& messages, const Json& tools = nullptr) {
  try {
    render_chat(messages, tools);
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  ADD_FAILURE() << "no error for " << messages.dump();
  return {Errc::kUsage, ""};
}

void expect_usage(const Json& messages, const std::string& message, const Json& tools = nullptr) {
  const auto [code, what] = failure(messages, tools);
  EXPECT_EQ(code, Errc::kUsage) << what;
  EXPECT_EQ(what, message);
}

TEST(ChatErrors, MessagesShape) {
  expect_usage(Json::array(),
               "messages: expected a non-empty array of messages, got an empty array");
  expect_usage(Json::object(), "messages: expected a non-empty array of messages, got object");
  expect_usage(Json::array({"hi"}), "messages[0]: expected an object, got string");
  expect_usage(Json::array({{{"content", "x"}}}), "messages[0]: missing \"role\"");
}

TEST(ChatErrors, RoleNamesIndexAndValue) {
  expect_usage(Json::array({user("a"), user("b"), {{"role", "bot"}, {"content", "c"}}}),
               "messages[2].role: expected one of system, user, assistant, tool, got 'bot'");
  expect_usage(Json::array({{{"role", 7}}}),
               "messages[0].role: expected one of system, user, assistant, tool, got number");
  expect_usage(Json::array({user("a"), {{"role", "system"}, {"content", "late"}}}),
               "messages[1].role: a system message is only allowed as the first message");
}

TEST(ChatErrors, Content) {
  expect_usage(
      Json::array({{{"role", "user"}, {"content", 3}}}),
      "messages[0].content: expected a string, an array of text parts or null, got number");
  expect_usage(
      Json::array({{{"role", "user"}, {"content", {{"text", "x"}}}}}),
      "messages[0].content: expected a string, an array of text parts or null, got object");
  expect_usage(Json::array({{{"role", "user"}, {"content", {"x"}}}}),
               "messages[0].content[0]: expected an object {\"type\": \"text\", \"text\": ...}, "
               "got string");
  expect_usage(Json::array({{{"role", "user"}, {"content", {{{"type", "text"}}}}}}),
               "messages[0].content[0]: expected a text part with a \"text\" field");
  expect_usage(Json::array({{{"role", "user"}, {"content", {{{"type", "text"}, {"text", 1}}}}}}),
               "messages[0].content[0].text: expected a string, got number");
  const auto [code, what] =
      failure(Json::array({{{"role", "user"},
                            {"content",
                             {{{"type", "text"}, {"text", "see"}},
                              {{"type", "image_url"}, {"image_url", {{"url", "x"}}}}}}}}));
  EXPECT_EQ(code, Errc::kUnsupported);
  EXPECT_EQ(what, "messages[0].content[1]: image and video parts are not supported (text only)");
}

TEST(ChatErrors, Reasoning) {
  expect_usage(Json::array({user("q"), {{"role", "assistant"}, {"reasoning_content", 1}}}),
               "messages[1].reasoning_content: expected a string or null, got number");
  expect_usage(Json::array({user("q"), {{"role", "assistant"}, {"reasoning", {"x"}}}}),
               "messages[1].reasoning: expected a string or null, got array");
}

TEST(ChatErrors, ToolCalls) {
  auto with_calls = [](const Json& calls) {
    return Json::array(
        {user("q"), {{"role", "assistant"}, {"content", ""}, {"tool_calls", calls}}});
  };
  expect_usage(with_calls(Json::object()),
               "messages[1].tool_calls: expected an array or null, got object");
  expect_usage(with_calls({1}), "messages[1].tool_calls[0]: expected an object, got number");
  expect_usage(with_calls({{{"function", "f"}}}),
               "messages[1].tool_calls[0].function: expected an object, got string");
  expect_usage(with_calls({{{"function", {{"arguments", "{}"}}}}}),
               "messages[1].tool_calls[0].function: missing \"name\"");
  expect_usage(with_calls({{{"name", 5}}}),
               "messages[1].tool_calls[0].name: expected a string, got number");
  expect_usage(with_calls({{{"function", {{"name", "f"}, {"arguments", 5}}}}}),
               "messages[1].tool_calls[0].function.arguments: expected an object or a JSON string "
               "holding one, got number");
  expect_usage(with_calls({{{"function", {{"name", "f"}, {"arguments", "[1, 2]"}}}}}),
               "messages[1].tool_calls[0].function.arguments: expected a JSON object, got array");
  const auto [code, what] =
      failure(with_calls({{{"function", {{"name", "f"}, {"arguments", "{oops"}}}}}));
  EXPECT_EQ(code, Errc::kUsage);
  EXPECT_EQ(what.rfind("messages[1].tool_calls[0].function.arguments: not valid JSON: ", 0), 0u)
      << what;
}

TEST(ChatErrors, ToolsAndQueries) {
  expect_usage(Json::array({user("q")}), "tools: expected an array or null, got object",
               Json::object());
  expect_usage(Json::array({user("q")}), "tools[1]: expected an object, got string",
               Json::array({Json::object(), "f"}));
  const std::string no_query =
      "messages: no user query: every user message is a wrapped <tool_response> (or there is no "
      "user message)";
  expect_usage(Json::array({{{"role", "system"}, {"content", "s"}}}), no_query);
  expect_usage(Json::array({user(" <tool_response>\nx\n</tool_response>\n")}), no_query);
}

}  // namespace
}  // namespace qf::rt
