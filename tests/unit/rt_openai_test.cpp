// OpenAI request bodies (openai.h): what each field becomes, every malformed or unsupported
// field refused with its name, and stop strings cut where a search of the whole text cuts,
// however the text arrives.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "json_schema_check.h"
#include "qf/rt/chat.h"
#include "qf/rt/openai.h"

namespace qf::rt {
namespace {

using Json = nlohmann::ordered_json;
using test::verdict;

const SamplingOptions kDefaults{0.6f, 0.95f, 20, 1234};

Json chat_body(Json extra = Json::object()) {
  Json b = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

// The ApiError of parsing `body`, which must be thrown.
ApiError error_of(const Json& body, bool chat = true) {
  try {
    if (chat) {
      parse_chat_request(body, kDefaults);
    } else {
      parse_completion_request(body, kDefaults);
    }
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body.dump();
  return ApiError(0, "", "");
}

TEST(OpenAiRequest, ChatFieldsAndDefaults) {
  ApiRequest r = parse_chat_request(chat_body(), kDefaults);
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompts.at(0).text, render_chat(chat_body()["messages"], Json()));
  EXPECT_TRUE(r.thinking);
  EXPECT_FALSE(r.max_tokens);
  EXPECT_EQ(r.sampling.temperature, 0.6f);
  EXPECT_EQ(r.sampling.top_p, 0.95f);
  EXPECT_EQ(r.sampling.top_k, 20);
  EXPECT_EQ(r.sampling.seed, 1234u);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.parse_tools);

  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  r = parse_chat_request(chat_body({{"temperature", 0},
                                    {"top_p", 0.5},
                                    {"top_k", -1},
                                    {"seed", 7},
                                    {"max_completion_tokens", 9},
                                    {"stop", "END"},
                                    {"stream", true},
                                    {"stream_options", {{"include_usage", true}}},
                                    {"ignore_eos", true},
                                    {"tools", tools},
                                    {"chat_template_kwargs", {{"enable_thinking", false}}},
                                    {"n", 1},
                                    {"presence_penalty", 0},
                                    {"logprobs", false},
                                    {"logit_bias", Json::object()},
                                    {"response_format", {{"type", "text"}}},
                                    {"unknown_field", "ignored"}}),
                         kDefaults);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_EQ(r.sampling.seed, 7u);
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(r.stream && r.include_usage && r.ignore_eos && r.parse_tools);
  EXPECT_FALSE(r.thinking);
  EXPECT_EQ(r.n, 1);
  EXPECT_EQ(parse_chat_request(chat_body({{"n", 128}}), kDefaults).n, 128);
  EXPECT_EQ(parse_completion_request({{"prompt", "x"}, {"n", 3}}, kDefaults).n, 3);
  ChatOptions no_think;
  no_think.enable_thinking = false;
  EXPECT_EQ(r.prompts.at(0).text, render_chat(chat_body()["messages"], tools, no_think));
  r = parse_chat_request(
      chat_body({{"tools", tools}, {"tool_choice", "none"}, {"stop", {"a", "b"}}}), kDefaults);
  EXPECT_FALSE(r.parse_tools);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
  // null is "not given".
  r = parse_chat_request(chat_body({{"temperature", nullptr}, {"max_tokens", nullptr}}), kDefaults);
  EXPECT_EQ(r.sampling.temperature, 0.6f);
  EXPECT_FALSE(r.max_tokens);
}

// vLLM's sampling fields and logprobs: what each becomes.
TEST(OpenAiRequest, PenaltiesBiasAndLogprobs) {
  ApiRequest r = parse_chat_request(chat_body({{"presence_penalty", 1.5},
                                               {"frequency_penalty", -0.5},
                                               {"repetition_penalty", 1.1},
                                               {"min_p", 0.05},
                                               {"logit_bias", {{"7", -100}, {"0", 2.5}}},
                                               {"logprobs", true},
                                               {"top_logprobs", 3}}),
                                    kDefaults);
  EXPECT_EQ(r.sampling.presence_penalty, 1.5f);
  EXPECT_EQ(r.sampling.frequency_penalty, -0.5f);
  EXPECT_EQ(r.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_EQ(r.sampling.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{7, -100.0f}, {0, 2.5f}}));
  EXPECT_EQ(r.logprobs, 3);
  EXPECT_EQ(parse_chat_request(chat_body({{"logprobs", true}}), kDefaults).logprobs, 0);
  EXPECT_EQ(parse_chat_request(chat_body({{"logprobs", false}}), kDefaults).logprobs, -1);
  EXPECT_EQ(parse_chat_request(chat_body(), kDefaults).logprobs, -1);
  // The defaults (generation_config's) stay where the request says nothing.
  SamplingOptions d = kDefaults;
  d.repetition_penalty = 1.05f;
  d.min_p = 0.1f;
  r = parse_chat_request(chat_body(), d);
  EXPECT_EQ(r.sampling.repetition_penalty, 1.05f);
  EXPECT_EQ(r.sampling.min_p, 0.1f);
  // Completions: logprobs is the count.
  const Json c = {{"prompt", "x"}, {"logprobs", 5}};
  EXPECT_EQ(parse_completion_request(c, kDefaults).logprobs, 5);
  EXPECT_EQ(parse_completion_request({{"prompt", "x"}}, kDefaults).logprobs, -1);
  EXPECT_EQ(error_of({{"prompt", "x"}, {"logprobs", 21}}, false).param(), "logprobs");
  EXPECT_EQ(error_of({{"prompt", "x"}, {"logprobs", true}}, false).param(), "logprobs");
}

// Logprobs in the replies' shapes, over the example model's tokenizer: token strings from the
// tokens' bytes (U+FFFD for part of a character, whose exact bytes chat gives), offsets in
// characters.
// response_format: text means no grammar; json_object any object; json_schema the schema's
// (its own checks in rt_json_grammar_test), on both endpoints.
TEST(OpenAiRequest, ResponseFormat) {
  EXPECT_EQ(parse_chat_request(chat_body(), {}).grammar, nullptr);
  EXPECT_EQ(parse_chat_request(chat_body({{"response_format", {{"type", "text"}}}}), {}).grammar,
            nullptr);
  const auto object =
      parse_chat_request(chat_body({{"response_format", {{"type", "json_object"}}}}), {}).grammar;
  ASSERT_NE(object, nullptr);
  EXPECT_EQ(object->root(), JsonGrammar::kAnyObject);
  const Json schema = {{"type", "array"}, {"items", {{"type", "integer"}}}, {"maxItems", 2}};
  const Json format = {{"type", "json_schema"},
                       {"json_schema", {{"name", "ids"}, {"schema", schema}, {"strict", true}}}};
  for (const bool chat : {true, false}) {
    const Json body = chat ? chat_body({{"response_format", format}})
                           : Json{{"prompt", "x"}, {"response_format", format}};
    const auto g =
        chat ? parse_chat_request(body, {}).grammar : parse_completion_request(body, {}).grammar;
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->shape(g->root()).kind, JsonShape::Kind::kArray);
    EXPECT_EQ(g->shape(g->root()).max_items, 2);
  }
  const ApiError e = error_of(chat_body(
      {{"response_format",
        {{"type", "json_schema"},
         {"json_schema", {{"schema", {{"properties", {{"a", {{"uniqueItems", true}}}}}}}}}}}}));
  EXPECT_NE(std::string(e.what()).find("schema.properties.a: the keyword 'uniqueItems'"),
            std::string::npos)
      << e.what();
}

// tool_choice: "auto" parses the model's XML calls, "none" leaves them as content, and
// "required" or a named function hold the reply to the calls' JSON (tool_choice.h).
TEST(OpenAiRequest, ToolChoice) {
  const Json tools = Json::parse(R"([
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"a": {"type": "integer"}}, "required": ["a"]}}},
    {"type": "function", "function": {"name": "g"}}])");
  ApiRequest r = parse_chat_request(chat_body({{"tools", tools}}), {});
  EXPECT_EQ(r.tool_choice.kind, ToolChoice::Kind::kAuto);
  EXPECT_TRUE(r.parse_tools);
  EXPECT_EQ(r.grammar, nullptr);
  r = parse_chat_request(chat_body({{"tools", tools}, {"tool_choice", "none"}}), {});
  EXPECT_EQ(r.tool_choice.kind, ToolChoice::Kind::kNone);
  EXPECT_FALSE(r.parse_tools);
  EXPECT_EQ(r.grammar, nullptr);
  r = parse_chat_request(chat_body({{"tools", tools}, {"tool_choice", "required"}}), {});
  EXPECT_EQ(r.tool_choice.kind, ToolChoice::Kind::kRequired);
  EXPECT_FALSE(r.parse_tools);
  ASSERT_NE(r.grammar, nullptr);
  EXPECT_EQ(
      verdict(*r.grammar, R"([{"name":"f","parameters":{"a":1}},{"name":"g","parameters":{}}])"),
      1);
  EXPECT_EQ(verdict(*r.grammar, R"([{"name":"f","parameters":{}}])"), -1);  // a is required
  const Json named = {{"type", "function"}, {"function", {{"name", "f"}}}};
  r = parse_chat_request(chat_body({{"tools", tools}, {"tool_choice", named}}), {});
  EXPECT_EQ(r.tool_choice.kind, ToolChoice::Kind::kNamed);
  EXPECT_EQ(r.tool_choice.name, "f");
  ASSERT_NE(r.grammar, nullptr);
  EXPECT_EQ(verdict(*r.grammar, R"({"a": -3})"), 1);
  EXPECT_EQ(verdict(*r.grammar, R"([)"), -1);

  // Refused, naming the field.
  Json bad_tools = tools;
  bad_tools[1]["function"]["parameters"] = {{"type", "object"},
                                            {"properties", {{"s", {{"uniqueItems", true}}}}}};
  const std::vector<std::pair<Json, std::string>> cases = {
      {{{"tools", tools}, {"tool_choice", 3}}, "tool_choice"},
      {{{"tools", tools}, {"tool_choice", "any"}}, "tool_choice"},
      {{{"tools", tools}, {"tool_choice", {{"type", "function"}}}}, "tool_choice"},
      {{{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "h"}}}}}},
       "tool_choice"},
      {{{"tool_choice", named}}, "tool_choice"},  // no tools
      {{{"tools", tools},
        {"tool_choice", "required"},
        {"response_format", {{"type", "json_object"}}}},
       "response_format"},
      {{{"tools", Json::array({{{"function", {{"name", "f"}}}}})}, {"tool_choice", "required"}},
       "tools"},
      {{{"tools", bad_tools}, {"tool_choice", "required"}}, "tools"},
      {{{"tools", Json::parse(R"([{"type": "function", "function": {"name": "f",
          "parameters": {"type": "string"}}}])")},
        {"tool_choice", named}},
       "tools"},
  };
  for (const auto& [extra, param] : cases) {
    const ApiError e = error_of(chat_body(extra));
    EXPECT_EQ(e.status(), 400) << extra.dump();
    EXPECT_EQ(e.param(), param) << extra.dump() << ": " << e.what();
  }
  // A schema outside the subset is refused at its own place; with tool_choice "auto" or a
  // named function other than its own, it is never compiled.
  const std::string what =
      error_of(chat_body({{"tools", bad_tools}, {"tool_choice", "required"}})).what();
  EXPECT_NE(what.find("tools[1].function.parameters.properties.s: the keyword 'uniqueItems'"),
            std::string::npos)
      << what;
  EXPECT_NO_THROW(parse_chat_request(chat_body({{"tools", bad_tools}}), {}));
  EXPECT_NO_THROW(
      parse_chat_request(chat_body({{"tools", bad_tools}, {"tool_choice", named}}), {}));
}

TEST(OpenAiReply, LogprobsJson) {
  const Tokenizer tok =
      Tokenizer::load(std::string(QF_SOURCE_DIR) + "/models/tiny/model/tokenizer.json");
  const std::vector<int32_t> ids = tok.encode("h\u00e9llo w\u00f6rld");  // "héllo wörld"
  std::vector<TokenLogprobs> entries;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto lp = -0.25f * static_cast<float>(i + 1);
    entries.push_back({ids[i], lp, {{ids[(i + 1) % ids.size()], -0.125f}}});
  }
  const Json chat = chat_logprobs_json(tok, entries);
  ASSERT_EQ(chat["content"].size(), ids.size());
  std::string bytes, text;
  for (size_t i = 0; i < ids.size(); ++i) {
    const Json& e = chat["content"][i];
    for (const Json& b : e["bytes"]) bytes.push_back(static_cast<char>(b.get<int>()));
    text += e["token"].get<std::string>();
    EXPECT_EQ(e["logprob"].get<float>(), entries[i].logprob);
    ASSERT_EQ(e["top_logprobs"].size(), 1u);
    EXPECT_EQ(e["top_logprobs"][0]["logprob"].get<float>(), -0.125f);
    EXPECT_EQ(e["top_logprobs"][0]["token"], chat["content"][(i + 1) % ids.size()]["token"]);
  }
  EXPECT_EQ(bytes, "h\u00e9llo w\u00f6rld");  // the bytes are exact whatever the split
  if (text != bytes) {                        // a split character: U+FFFD in the strings
    EXPECT_NE(text.find("\ufffd"), std::string::npos) << text;
  }
  // Each offset is 3 plus the characters (UTF-8 lead bytes) of the token strings before it.
  int64_t offset = 3;
  const Json c = completion_logprobs_json(tok, entries, offset);
  ASSERT_EQ(c["tokens"].size(), ids.size());
  std::string before;
  const auto chars = [](const std::string& u) {
    return static_cast<int64_t>(std::count_if(
        u.begin(), u.end(), [](char ch) { return (static_cast<unsigned char>(ch) >> 6) != 2; }));
  };
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(c["tokens"][i], chat["content"][i]["token"]);
    EXPECT_EQ(c["token_logprobs"][i].get<float>(), entries[i].logprob);
    EXPECT_EQ(c["text_offset"][i].get<int64_t>(), 3 + chars(before)) << i;
    // The chosen token is in its map with the alternative.
    const std::string t = c["tokens"][i].get<std::string>();
    EXPECT_EQ(c["top_logprobs"][i][t].get<float>(), entries[i].logprob);
    before += t;
  }
  EXPECT_EQ(offset, 3 + chars(before));
  // 11 characters, each in one token's string, unless a token splits one (U+FFFD counts then).
  if (text == bytes) {
    EXPECT_EQ(offset, 3 + 11);
  }
}

TEST(OpenAiRequest, BadChatFieldsNameTheField) {
  const std::vector<std::pair<Json, std::string>> cases = {
      {{{"temperature", "hot"}}, "temperature"},
      {{{"temperature", -0.1}}, "temperature"},
      // Finite doubles that are infinite floats (fuzz_request: the sampler threw on them).
      {{{"temperature", 1e39}}, "temperature"},
      {{{"repetition_penalty", 1e300}}, "repetition_penalty"},
      {{{"top_p", 0}}, "top_p"},
      {{{"top_p", 1.5}}, "top_p"},
      {{{"top_k", -2}}, "top_k"},
      {{{"top_k", 2.5}}, "top_k"},
      {{{"seed", "1"}}, "seed"},
      {{{"max_tokens", 0}}, "max_tokens"},
      {{{"max_completion_tokens", -3}}, "max_completion_tokens"},
      {{{"n", 0}}, "n"},
      {{{"n", 129}}, "n"},
      {{{"n", 1.5}}, "n"},
      {{{"stream", "yes"}}, "stream"},
      {{{"stream_options", {{"include_usage", true}}}}, "stream_options"},  // without stream
      {{{"stop", 5}}, "stop"},
      {{{"stop", {"ok", ""}}}, "stop"},
      {{{"presence_penalty", 2.5}}, "presence_penalty"},
      {{{"presence_penalty", "1"}}, "presence_penalty"},
      {{{"frequency_penalty", -2.01}}, "frequency_penalty"},
      {{{"repetition_penalty", 0}}, "repetition_penalty"},
      {{{"min_p", 1.1}}, "min_p"},
      {{{"min_p", -0.1}}, "min_p"},
      {{{"logit_bias", {{"x1", 5}}}}, "logit_bias"},
      {{{"logit_bias", {{"-1", 5}}}}, "logit_bias"},
      {{{"logit_bias", {{"99999999999", 5}}}}, "logit_bias"},
      {{{"logit_bias", {{"1", 101}}}}, "logit_bias"},
      {{{"logit_bias", {{"1", "5"}}}}, "logit_bias"},
      {{{"logit_bias", Json::array({1})}}, "logit_bias"},
      {{{"logprobs", 2}}, "logprobs"},
      {{{"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs"},
      {{{"logprobs", true}, {"top_logprobs", -1}}, "top_logprobs"},
      {{{"top_logprobs", 2}}, "top_logprobs"},  // without logprobs
      {{{"response_format", {{"type", "xml"}}}}, "response_format"},
      {{{"response_format", {{"type", "json_schema"}}}}, "response_format"},
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}},
       "response_format"},
      {{{"response_format",
         {{"type", "json_schema"},
          {"json_schema", {{"schema", {{"type", "integer"}, {"multipleOf", 3}}}}}}}},
       "response_format"},
      {{{"response_format", "json"}}, "response_format"},
      {{{"tools", "f"}}, "tools"},
      {{{"tool_choice", "required"}}, "tool_choice"},
      {{{"chat_template_kwargs", {{"enable_thinking", "no"}}}}, "enable_thinking"},
      {{{"messages", Json::array()}}, "messages"},
      {{{"messages", {{{"role", "robot"}, {"content", "x"}}}}}, "messages"},
      {{{"model", 3}}, "model"},
  };
  for (const auto& [extra, param] : cases) {
    const ApiError e = error_of(chat_body(extra));
    EXPECT_EQ(e.status(), 400) << extra.dump();
    EXPECT_EQ(e.param(), param) << extra.dump() << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(param), std::string::npos) << e.what();
    const Json j = e.to_json();
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_EQ(j["error"]["param"], param);
  }
  Json no_messages = chat_body();
  no_messages.erase("messages");
  EXPECT_EQ(error_of(no_messages).param(), "messages");
  EXPECT_EQ(error_of(Json::array({1})).param(), "");  // not an object
}

TEST(OpenAiRequest, CompletionPrompts) {
  const auto parse = [](Json prompt, Json extra = Json::object()) {
    Json b = {{"prompt", std::move(prompt)}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    return parse_completion_request(b, kDefaults);
  };
  ApiRequest r = parse("def f(");
  EXPECT_FALSE(r.chat);
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "def f(");
  EXPECT_EQ(r.max_tokens, 16);  // OpenAI's default for completions
  EXPECT_EQ(parse({"one"}).prompts.at(0).text, "one");
  EXPECT_EQ(parse({1, 2, 3}).prompts.at(0).ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse(Json::array({Json::array({4, 5})}), {{"max_tokens", 3}}).prompts.at(0).ids,
            (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(parse({1}, {{"max_tokens", 3}}).max_tokens, 3);
  // Several prompts of one kind, as vLLM takes them; n times their number at most 128.
  r = parse({"a", "b", "c"}, {{"n", 2}});
  ASSERT_EQ(r.prompts.size(), 3u);
  EXPECT_EQ(r.prompts[2].text, "c");
  EXPECT_TRUE(r.prompts[2].ids.empty());
  r = parse(Json::array({Json::array({4, 5}), Json::array({6})}));
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].ids, std::vector<int32_t>{6});
  EXPECT_EQ(parse(Json(std::vector<std::string>(64, "x")), {{"n", 2}}).prompts.size(), 64u);
  EXPECT_EQ(error_of({{"prompt", std::vector<std::string>(65, "x")}, {"n", 2}}, false).param(),
            "prompt");
  for (const Json& bad :
       {Json(""), Json::array(), Json({1, -1}), Json({1, "x"}), Json(5), Json({{{"k", 1}}}),
        Json({"a", ""}), Json({"a", Json::array({1})}), Json::array({Json::array({1}), "a"}),
        Json::array({Json::array()}), Json::array({Json::array({1, "x"})})}) {
    EXPECT_EQ(error_of({{"prompt", bad}}, false).param(), "prompt") << bad.dump();
  }
  EXPECT_EQ(error_of({{"max_tokens", 5}}, false).param(), "prompt");
  // echo: taken, and with it max_tokens 0 (the prompt scored alone); 0 without it refused.
  EXPECT_TRUE(parse("x", {{"echo", true}}).echo);
  EXPECT_FALSE(parse("x").echo);
  EXPECT_EQ(parse("x", {{"echo", true}, {"max_tokens", 0}}).max_tokens, 0);
  EXPECT_EQ(error_of({{"prompt", "x"}, {"max_tokens", 0}}, false).param(), "max_tokens");
  EXPECT_EQ(error_of({{"prompt", "x"}, {"echo", true}, {"max_tokens", -1}}, false).param(),
            "max_tokens");
  EXPECT_EQ(error_of({{"prompt", "x"}, {"echo", "yes"}}, false).param(), "echo");
  EXPECT_EQ(error_of({{"prompt", "x"}, {"suffix", "y"}}, false).param(), "suffix");
  EXPECT_EQ(error_of({{"prompt", "x"}, {"best_of", 2}}, false).param(), "best_of");
}

// Stop strings against the definition: the text before the first occurrence of any of them in
// the whole text, for every way of cutting the text into pieces tried.
TEST(OpenAiRequest, StopStringsCutWhereTheWholeTextDoes) {
  const std::vector<std::vector<std::string>> stop_sets = {{"\n\n"},    {"abc", "bcd"}, {"aaa"},
                                                           {"ab", "b"}, {"é!"},         {"zz"}};
  const std::vector<std::string> texts = {"x\ny\n\nz",    "xxabcd",        "xbcdabc", "aaaa", "aab",
                                          "caf\xc3\xa9!", "no match here", "a",       ""};
  std::mt19937 rng(3);
  int matched = 0;
  for (const auto& stops : stop_sets) {
    for (const std::string& text : texts) {
      size_t first = std::string::npos;
      for (const auto& s : stops) first = std::min(first, text.find(s));
      const std::string want = first == std::string::npos ? text : text.substr(0, first);
      matched += first != std::string::npos;
      for (int trial = 0; trial < 40; ++trial) {
        StopStrings st(stops);
        std::string got;
        for (size_t at = 0; at < text.size();) {
          const size_t n = trial == 0 ? 1 : 1 + rng() % 3;
          got += st.push(text.substr(at, n));
          at += n;
        }
        if (!st.matched()) got += st.finish();
        EXPECT_EQ(got, want) << text << " / " << stops[0];
        EXPECT_EQ(st.matched(), first != std::string::npos) << text;
        if (st.matched()) {
          EXPECT_EQ(st.push("more"), "");  // nothing after a match
        }
      }
    }
  }
  EXPECT_GE(matched, 8);
}

}  // namespace
}  // namespace qf::rt
