// rt::Server over a scripted engine that replies with a fixed text: tool calls and reasoning
// read by OpenAI's Python client (openai_client_check.py), whole and streamed; the prompt the
// engine gets is the chat template's; requests take turns on the engine; an engine failure
// reaches the client as a 500 or, mid-stream, as an error event; GET /metrics counts the tokens,
// generations and requests the clients saw and shows a request waiting for the engine;
// /tokenize and /detokenize answer as vLLM's.
#include <gtest/gtest.h>

#include <httplib.h>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "qf/error.h"
#include "qf/rt/chat.h"
#include "qf/rt/openai.h"
#include "qf/rt/server.h"
#include "test_support.h"

namespace qf::rt {
namespace {

using Json = nlohmann::ordered_json;

const std::string kReply =
    "I should look it up.\n</think>\n\nChecking the weather.\n\n<tool_call>\n"
    "<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n"
    "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
    "<parameter=city>\nBergen\n</parameter>\n</function>\n</tool_call>";

const Json kTools = Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
  "description": "Weather for a city.", "parameters": {"type": "object", "properties": {
  "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}])");

const Json kMessages =
    Json::parse(R"([{"role": "user", "content": "Weather in Oslo and Bergen?"}])");

// The JSON events of a streamed reply ("data: {...}" lines, [DONE] left out), in order.
std::vector<Json> events(const std::string& body) {
  std::vector<Json> out;
  for (size_t at = 0; (at = body.find("data: {", at)) != std::string::npos; ++at) {
    out.push_back(Json::parse(body.substr(at + 6, body.find('\n', at) - at - 6)));
  }
  return out;
}

// The server on a free port, in a thread, over a scripted engine.
class ScriptedServer {
 public:
  explicit ScriptedServer(const std::string& reply = kReply, const std::string& name = "scripted")
      : tok_(Tokenizer::load(std::string(QF_SOURCE_DIR) + "/models/tiny/model/tokenizer.json")),
        reply_(tok_.encode(reply)) {
    ServeOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.model_name = name;
    o.max_model_len = 4096;
    o.vocab_size = 4096;
    server_ = std::make_unique<Server>(
        tok_,
        [this](std::span<const int32_t> prompt, const GenerateOptions& go,
               const std::function<void(int32_t)>& on_token, int64_t* cached) {
          *cached = 0;
          if (active_.fetch_add(1) != 0) overlapped_ = true;
          prompt_.assign(prompt.begin(), prompt.end());
          prompts_.push_back(prompt_);
          seeds_.push_back(go.sampling.seed);
          GenerateResult r;
          r.prompt_tokens = static_cast<int64_t>(prompt.size());
          r.finish_reason = "stop";
          if (go.prompt_logprobs >= 0) {  // made-up values as the reply's: prompt_logprob(i)
            for (size_t i = 1; i < prompt.size(); ++i) {
              TokenLogprobs t{prompt[i], prompt_logprob(i), {}};
              for (int k = 0; k < go.prompt_logprobs; ++k) {
                t.top.emplace_back((prompt[i] + 1 + k) % 4096, -0.125f * static_cast<float>(k));
              }
              r.prompt_logprobs.push_back(t);
            }
            if (go.on_prompt_logprobs) go.on_prompt_logprobs(r.prompt_logprobs);
          }
          try {
            for (size_t i = 0; i < reply_.size(); ++i) {
              if (fail_at_ >= 0 && static_cast<int>(i) == fail_at_) {
                throw Error(Errc::kIo, "the scripted engine failed");
              }
              if (static_cast<int64_t>(i) == go.max_tokens) {
                r.finish_reason = "length";
                break;
              }
              std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
              if (go.logprobs >= 0) {  // made-up values, exact in binary: logprob(i)
                TokenLogprobs t{reply_[i], logprob(i), {}};
                for (int k = 0; k < go.logprobs; ++k) {
                  t.top.emplace_back((reply_[i] + k) % 4096, logprob(i) - static_cast<float>(k));
                }
                go.on_logprobs(t);
              }
              on_token(reply_[i]);
              r.ids.push_back(reply_[i]);
            }
          } catch (...) {
            --active_;
            throw;
          }
          --active_;
          return r;
        },
        o);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->run(); });
  }
  ~ScriptedServer() {
    server_->stop();
    thread_.join();
  }
  static float logprob(size_t i) { return -0.5f - static_cast<float>(i) / 64.0f; }
  static float prompt_logprob(size_t i) { return -1.0f - static_cast<float>(i) / 32.0f; }
  const std::vector<int32_t>& reply() const { return reply_; }
  std::string base() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }
  int port() const { return port_; }
  const Tokenizer& tok() const { return tok_; }

  std::vector<int32_t> prompt_;
  std::vector<std::vector<int32_t>> prompts_;  // of every generation, in order
  std::vector<uint64_t> seeds_;                // of every generation, in order
  std::atomic<int> active_{0};
  std::atomic<bool> overlapped_{false};
  int fail_at_ = -1;
  int delay_us_ = 0;

 private:
  Tokenizer tok_;
  std::vector<int32_t> reply_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
};

// openai_client_check.py `mode` against the server, with `expect` as its EXPECT.json.
void expect_client_check(const std::string& mode, const ScriptedServer& s, const Json& expect) {
  const test::TempDir dir;
  test::write_file(dir / "expect.json", expect.dump());
  const auto r = test::run_command(std::string(QF_PYTHON) + " " + QF_SOURCE_DIR +
                                   "/tests/e2e/openai_client_check.py " + mode + " " + s.base() +
                                   " " + (dir / "expect.json").string());
  EXPECT_EQ(r.exit_code, 0) << mode << ": " << r.out << r.err;
  EXPECT_NE(r.out.find("ok: "), std::string::npos) << r.out;
}

TEST(Server, OpenAiClientReadsReasoningAndToolCalls) {
  ScriptedServer s;
  const Json expect = {
      {"model", "scripted"},
      {"request", {{"messages", kMessages}, {"tools", kTools}}},
      {"message",
       {{"reasoning_content", "I should look it up."},
        {"content", "Checking the weather."},
        {"tool_calls",
         {{{"name", "get_weather"}, {"arguments", {{"city", "Oslo"}, {"days", 3}}}},
          {{"name", "get_weather"}, {"arguments", {{"city", "Bergen"}}}}}}}}};
  expect_client_check("tools", s, expect);
  EXPECT_EQ(s.prompt_, s.tok().encode(render_chat(kMessages, kTools)));
}

// tool_choice "required" and a named function: the reply's JSON (here scripted, as the
// constraint would have it) read back as calls by OpenAI's client, the finish reason "stop".
TEST(Server, OpenAiClientReadsForcedToolCalls) {
  const Json named = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  const Json oslo = {{"name", "get_weather"}, {"arguments", {{"city", "Oslo"}, {"days", 3}}}};
  const Json bergen = {{"name", "get_weather"}, {"arguments", {{"city", "Bergen"}}}};
  {
    ScriptedServer s(
        "I should look it up.\n</think>\n\n[{\"name\": \"get_weather\", \"parameters\": "
        "{\"city\": \"Oslo\", \"days\": 3}}, {\"name\": \"get_weather\", \"parameters\": "
        "{\"city\": \"Bergen\"}}]");
    expect_client_check(
        "tools", s,
        {{"model", "scripted"},
         {"request", {{"messages", kMessages}, {"tools", kTools}, {"tool_choice", "required"}}},
         {"finish_reason", "stop"},
         {"message",
          {{"reasoning_content", "I should look it up."},
           {"content", nullptr},
           {"tool_calls", {oslo, bergen}}}}});
  }
  ScriptedServer s("I should look it up.\n</think>\n\n{\"city\": \"Oslo\", \"days\": 3}");
  expect_client_check(
      "tools", s,
      {{"model", "scripted"},
       {"request", {{"messages", kMessages}, {"tools", kTools}, {"tool_choice", named}}},
       {"finish_reason", "stop"},
       {"message",
        {{"reasoning_content", "I should look it up."},
         {"content", nullptr},
         {"tool_calls", {oslo}}}}});
}

// Every generated token's logprobs reach the client in order, whatever chunks carry the
// text, in both endpoints' shapes (read by OpenAI's client).
TEST(Server, OpenAiClientReadsLogprobs) {
  ScriptedServer s;
  Json expect = {{"model", "scripted"}, {"messages", kMessages}, {"top", 2}, {"stop", "weather"}};
  for (size_t i = 0; i < s.reply().size(); ++i) {
    const std::string& b = s.tok().token_bytes(s.reply()[i]);
    expect["logprobs"].push_back(ScriptedServer::logprob(i));
    expect["bytes"].push_back(std::vector<uint8_t>(b.begin(), b.end()));
  }
  expect_client_check("logprobs", s, expect);
}

// A server over an engine of random logits run by generate_with, which a request's constraint
// steers; the logits favour the end of the think block, closing quotes and brackets, and the
// end, so that replies finish.
class RandomLogitsServer {
 public:
  RandomLogitsServer()
      : tok_(Tokenizer::load(std::string(QF_SOURCE_DIR) + "/models/tiny/model/tokenizer.json")),
        boost_(kVocab, 0.0f) {
    const int32_t im_end = *tok_.token_id("<|im_end|>");
    for (int32_t id = 0; id < tok_.n_ids(); ++id) {
      if (tok_.token_bytes(id).find_first_of("\"]},") != std::string::npos) boost_[id] = 6.0f;
    }
    boost_[*tok_.token_id("</think>")] = 14.0f;  // the think block ends first, if there is one
    boost_[im_end] = 8.0f;
    ServeOptions o;
    o.port = 0;
    o.model_name = "random";
    o.max_model_len = 4096;
    o.vocab_size = kVocab;
    o.eos_ids = {im_end};
    server_ = std::make_unique<Server>(
        tok_,
        [this](std::span<const int32_t> prompt, const GenerateOptions& go,
               const std::function<void(int32_t)>& on_token, int64_t* cached) {
          *cached = 0;
          std::normal_distribution<float> normal(0.0f, 2.0f);
          const StepFn step = [&](int32_t, float* logits) {
            if (!logits) return 0;
            for (int64_t i = 0; i < kVocab; ++i) logits[i] = normal(rng_) + boost_[i];
            return 0;
          };
          return generate_with(step, kVocab, prompt, go, on_token);
        },
        o);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->run(); });
  }
  ~RandomLogitsServer() {
    server_->stop();
    thread_.join();
  }
  // A chat request's reply: 200 expected; streamed replies' deltas gathered into one message.
  Json chat(Json body, bool stream) {
    body["messages"] = kMessages;
    body["stream"] = stream;
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60);
    const auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no reply");
    if (!res || res->status != 200) return Json();
    if (!stream) return Json::parse(res->body)["choices"][0];
    Json choice = {{"message", {{"content", ""}}}};
    Json& m = choice["message"];
    for (const Json& e : events(res->body)) {
      if (e["choices"].empty()) continue;
      const Json& d = e["choices"][0]["delta"];
      m["content"] = m["content"].get<std::string>() + d.value("content", "");
      for (const Json& call : d.value("tool_calls", Json::array())) m["tool_calls"].push_back(call);
      if (!e["choices"][0]["finish_reason"].is_null())
        choice["finish_reason"] = e["choices"][0]["finish_reason"];
    }
    return choice;
  }
  int port() const { return port_; }

 private:
  static constexpr int64_t kVocab = 4096;
  Tokenizer tok_;
  std::vector<float> boost_;
  std::mt19937 rng_{5};
  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
};

// response_format through the server: the reply's content parses and has the schema's keys and
// types, with thinking on (the value after `</think>`) and off, whole and streamed.
// echo (completions): the prompt's text leads the reply's, and with logprobs its tokens lead
// the entries (the first with null logprob and alternatives, text_offset counting on through
// the reply); whole and streamed (the prompt in the first chunk); max_tokens 0 scores the prompt
// alone, and is refused without echo.
TEST(Server, CompletionEchoesThePromptAndItsLogprobs) {
  ScriptedServer s("Hello there, world.");
  httplib::Client c("127.0.0.1", s.port());
  const std::string prompt = "def add(a, b):";
  const std::vector<int32_t> ids = s.tok().encode(prompt);
  ASSERT_GE(ids.size(), 3u);
  const auto post = [&](const Json& body) {
    const auto res = c.Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(res) << "no reply";
    return res ? std::make_pair(res->status, res->body) : std::make_pair(0, std::string());
  };
  const std::string reply = s.tok().decode(s.reply(), true);
  for (const bool by_ids : {false, true}) {
    for (const int64_t max_tokens : {int64_t{0}, int64_t{50}}) {
      for (const bool stream : {false, true}) {
        const std::string what = std::string(by_ids ? "ids" : "text") + " max_tokens " +
                                 std::to_string(max_tokens) + (stream ? " streamed" : "");
        Json body = {{"prompt", by_ids ? Json(ids) : Json(prompt)},
                     {"echo", true},
                     {"logprobs", 2},
                     {"max_tokens", max_tokens},
                     {"stream", stream}};
        const auto [status, text] = post(body);
        ASSERT_EQ(status, 200) << what << ": " << text;
        std::string got;
        Json lp;
        std::string finish;
        if (!stream) {
          const Json ch = Json::parse(text)["choices"][0];
          got = ch["text"];
          lp = ch["logprobs"];
          finish = ch["finish_reason"];
        } else {
          bool first = true;
          for (const Json& e : events(text)) {
            const Json& ch = e["choices"][0];
            if (first) {
              EXPECT_EQ(ch["text"], prompt) << what << ": the first chunk";
            }
            first = false;
            got += ch["text"].get<std::string>();
            if (!ch["logprobs"].is_null()) append_logprobs(lp, ch["logprobs"]);
            if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
          }
        }
        const size_t n_reply = max_tokens == 0 ? 0 : s.reply().size();
        EXPECT_EQ(got, prompt + (max_tokens == 0 ? "" : reply)) << what;
        EXPECT_EQ(finish, max_tokens == 0 ? "length" : "stop") << what;
        ASSERT_EQ(lp["tokens"].size(), ids.size() + n_reply) << what << ": " << lp.dump();
        EXPECT_TRUE(lp["token_logprobs"][0].is_null()) << what;
        EXPECT_TRUE(lp["top_logprobs"][0].is_null()) << what;
        int64_t offset = 0;
        for (size_t i = 0; i < ids.size() + n_reply; ++i) {
          EXPECT_EQ(lp["text_offset"][i], offset) << what << " " << i;
          const std::string tok_text = lp["tokens"][i];
          offset += std::count_if(tok_text.begin(), tok_text.end(), [](char ch) {
            return (static_cast<uint8_t>(ch) & 0xC0) != 0x80;
          });
          if (i == 0) continue;
          const float want = i < ids.size() ? ScriptedServer::prompt_logprob(i)
                                            : ScriptedServer::logprob(i - ids.size());
          EXPECT_EQ(lp["token_logprobs"][i].get<float>(), want) << what << " " << i;
          // 2 and the token (the scripted reply's alternatives include the token itself)
          EXPECT_EQ(lp["top_logprobs"][i].size(), i < ids.size() ? 3u : 2u) << what << " " << i;
        }
        EXPECT_EQ(s.prompt_, ids) << what;
      }
    }
  }
  // Echo without logprobs: the text alone; max_tokens 0 without echo: refused.
  const auto [status, text] = post({{"prompt", prompt}, {"echo", true}, {"max_tokens", 3}});
  ASSERT_EQ(status, 200) << text;
  const Json ch = Json::parse(text)["choices"][0];
  EXPECT_TRUE(ch["logprobs"].is_null());
  EXPECT_EQ(ch["text"], prompt + s.tok().decode(std::span(s.reply()).first(3), true));
  const auto [bad, why] = post({{"prompt", prompt}, {"max_tokens", 0}});
  EXPECT_EQ(bad, 400);
  EXPECT_NE(why.find("0 only with 'echo'"), std::string::npos) << why;
  EXPECT_NE(why.find("\"param\":\"max_tokens\""), std::string::npos) << why;
}

// Several prompts in one completions request, as vLLM takes them: prompt p's choice i is choice
// p * n + i, generated in that order with the seed + its index, each echoing its own prompt
// and held to its own room; usage counts every prompt once; whole and streamed.
TEST(Server, CompletionTakesSeveralPrompts) {
  ScriptedServer s("Fine.");
  httplib::Client c("127.0.0.1", s.port());
  const std::vector<std::string> texts = {"One", "Two words", "Three more words"};
  int64_t prompt_tokens = 0;
  for (const std::string& t : texts)
    prompt_tokens += static_cast<int64_t>(s.tok().encode(t).size());
  for (const bool by_ids : {false, true}) {
    for (const bool stream : {false, true}) {
      const std::string what = std::string(by_ids ? "ids" : "text") + (stream ? ", streamed" : "");
      Json prompt = Json::array();
      for (const std::string& t : texts)
        prompt.push_back(by_ids ? Json(s.tok().encode(t)) : Json(t));
      Json body = {{"prompt", prompt}, {"n", 2},           {"seed", 7},
                   {"echo", true},     {"max_tokens", 20}, {"stream", stream}};
      if (stream) body["stream_options"] = {{"include_usage", true}};
      s.seeds_.clear();
      s.prompts_.clear();
      const auto res = c.Post("/v1/completions", body.dump(), "application/json");
      ASSERT_TRUE(res && res->status == 200) << what << ": " << (res ? res->body : "no reply");
      EXPECT_EQ(s.seeds_, (std::vector<uint64_t>{7, 8, 9, 10, 11, 12})) << what;
      ASSERT_EQ(s.prompts_.size(), 6u) << what;
      std::vector<std::string> text(6);
      Json usage;
      if (!stream) {
        const Json j = Json::parse(res->body);
        ASSERT_EQ(j["choices"].size(), 6u) << what;
        for (int i = 0; i < 6; ++i) {
          EXPECT_EQ(j["choices"][i]["index"], i) << what;
          text[i] = j["choices"][i]["text"];
        }
        usage = j["usage"];
      } else {
        for (const Json& e : events(res->body)) {
          if (e.contains("usage") && !e["usage"].is_null()) usage = e["usage"];
          if (e["choices"].empty()) continue;
          text[e["choices"][0]["index"].get<int>()] += e["choices"][0]["text"].get<std::string>();
        }
      }
      for (int i = 0; i < 6; ++i) {
        EXPECT_EQ(s.prompts_[i], s.tok().encode(texts[i / 2])) << what << " choice " << i;
        EXPECT_EQ(text[i], texts[i / 2] + "Fine.") << what << " choice " << i;
      }
      EXPECT_EQ(usage["prompt_tokens"], prompt_tokens) << what;
      EXPECT_EQ(usage["completion_tokens"], 6 * s.reply().size()) << what;
    }
  }
  // Each prompt is held to its own room: the second is too long, and says so by its index.
  const auto res = c.Post(
      "/v1/completions",
      Json{{"prompt", Json::array({Json::array({1}), Json(std::vector<int32_t>(4096, 1))})}}.dump(),
      "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  EXPECT_NE(res->body.find("prompt 1 has 4096 tokens"), std::string::npos) << res->body;
}

// n choices: generated one after the other with the request's seed + i, each whole or streamed
// in its own run of chunks (its index in each, its own role chunk and finish_reason), usage
// summing their tokens; on both endpoints.
TEST(Server, ChoicesTakeTheSeedPlusTheirIndex) {
  ScriptedServer s("Fine, thanks.");
  httplib::Client c("127.0.0.1", s.port());
  const size_t reply = s.reply().size();
  for (const bool chat : {false, true}) {
    for (const bool stream : {false, true}) {
      const std::string what =
          std::string(chat ? "chat" : "completion") + (stream ? ", streamed" : "");
      Json body = {{"n", 3}, {"seed", 40}, {"temperature", 0.7}, {"stream", stream}};
      if (chat) {
        body["messages"] = kMessages;
        body["chat_template_kwargs"] = {{"enable_thinking", false}};  // the reply is content
      } else {
        body["prompt"] = "Hello";
        body["max_tokens"] = 50;
      }
      if (stream) body["stream_options"] = {{"include_usage", true}};
      s.seeds_.clear();
      const auto res = c.Post(chat ? "/v1/chat/completions" : "/v1/completions", body.dump(),
                              "application/json");
      ASSERT_TRUE(res && res->status == 200) << what << ": " << (res ? res->body : "no reply");
      EXPECT_EQ(s.seeds_, (std::vector<uint64_t>{40, 41, 42})) << what;
      std::vector<std::string> text(3);
      std::vector<int> finished(3, 0);
      Json usage;
      if (!stream) {
        const Json j = Json::parse(res->body);
        ASSERT_EQ(j["choices"].size(), 3u) << what;
        for (int i = 0; i < 3; ++i) {
          const Json& ch = j["choices"][i];
          EXPECT_EQ(ch["index"], i) << what;
          text[i] =
              chat ? ch["message"]["content"].get<std::string>() : ch["text"].get<std::string>();
          finished[i] = ch["finish_reason"] == "stop";
        }
        usage = j["usage"];
      } else {
        int last_index = 0;
        for (const Json& e : events(res->body)) {
          if (e.contains("usage") && !e["usage"].is_null()) usage = e["usage"];
          if (e["choices"].empty()) continue;
          const Json& ch = e["choices"][0];
          const int i = ch["index"];
          EXPECT_GE(i, last_index) << what << ": choices one after the other";
          last_index = i;
          text[i] += chat ? ch["delta"].value("content", "") : ch["text"].get<std::string>();
          if (!ch["finish_reason"].is_null()) ++finished[i];
        }
      }
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(text[i], "Fine, thanks.") << what << " choice " << i;
        EXPECT_EQ(finished[i], 1) << what << " choice " << i;
      }
      EXPECT_EQ(usage["completion_tokens"], 3 * reply) << what;
    }
  }
}

TEST(Server, StructuredOutputFollowsTheSchema) {
  RandomLogitsServer server;
  const Json schema = Json::parse(R"({"type": "object", "properties": {
      "city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"},
      "ok": {"type": "boolean"}, "code": {"type": "string", "pattern": "^[A-Z]{3}\\d?$"}},
      "required": ["city", "days", "ok", "code"]})");
  for (const bool thinking : {false, true}) {
    for (const bool stream : {false, true}) {
      const Json body = {
          {"max_tokens", 300},
          {"chat_template_kwargs", {{"enable_thinking", thinking}}},
          {"response_format",
           {{"type", "json_schema"}, {"json_schema", {{"name", "trip"}, {"schema", schema}}}}}};
      const std::string content = server.chat(body, stream)["message"]["content"];
      ASSERT_TRUE(Json::accept(content)) << thinking << stream << ": " << content;
      const Json v = Json::parse(content);
      EXPECT_TRUE(v["city"].is_string() && v["days"].is_number_integer() && v["ok"].is_boolean())
          << content;
      EXPECT_TRUE(std::regex_match(v["code"].get<std::string>(), std::regex("[A-Z]{3}[0-9]?")))
          << content;
    }
  }
  // A schema outside the subset: refused, naming the keyword.
  const Json bad = {{"messages", kMessages},
                    {"response_format",
                     {{"type", "json_schema"},
                      {"json_schema", {{"schema", {{"type", "array"}, {"uniqueItems", true}}}}}}}};
  httplib::Client c("127.0.0.1", server.port());
  const auto res = c.Post("/v1/chat/completions", bad.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_NE(res->body.find("'uniqueItems'"), std::string::npos) << res->body;
  // A body nested past kMaxJsonNesting (100,000 arrays deep in a message's content): refused
  // before anything recurses through it (dumping it overflowed the stack).
  const std::string deep = R"({"messages": [{"role": "user", "content": )" +
                           std::string(100000, '[') + std::string(100000, ']') + "}]}";
  const auto nested = c.Post("/v1/chat/completions", deep, "application/json");
  ASSERT_TRUE(nested);
  EXPECT_EQ(nested->status, 400);
  EXPECT_NE(nested->body.find("nests more than 512"), std::string::npos) << nested->body;
}

// tool_choice "required" and a named function, the constraint steering random logits: every
// reply is calls of the tools with arguments of their parameters' types, and no content.
TEST(Server, ForcedToolChoiceCallsTheTools) {
  RandomLogitsServer server;
  const Json tools = Json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"}},
      "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "stop_all"}}])");
  const Json named = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  for (const Json& choice : {Json("required"), named}) {
    for (const bool thinking : {false, true}) {
      for (const bool stream : {false, true}) {
        const Json body = {{"max_tokens", 400},
                           {"tools", tools},
                           {"tool_choice", choice},
                           {"chat_template_kwargs", {{"enable_thinking", thinking}}}};
        const Json reply = server.chat(body, stream);
        const Json& m = reply["message"];
        const std::string what = choice.dump() + (thinking ? " thinking" : "") +
                                 (stream ? " streamed: " : ": ") + reply.dump();
        EXPECT_EQ(reply["finish_reason"], "stop") << what;
        EXPECT_TRUE(m["content"].is_null() || m["content"] == "") << what;
        ASSERT_TRUE(m.contains("tool_calls") && !m["tool_calls"].empty()) << what;
        if (choice.is_object()) {
          EXPECT_EQ(m["tool_calls"].size(), 1u) << what;
        }
        for (const Json& call : m["tool_calls"]) {
          const Json args = Json::parse(call["function"]["arguments"].get<std::string>());
          if (call["function"]["name"] == "stop_all") {
            EXPECT_EQ(args, Json::object()) << what;
            continue;
          }
          EXPECT_EQ(call["function"]["name"], "get_weather") << what;
          EXPECT_TRUE(args.size() == 2 && args["city"].is_string() &&
                      args["days"].is_number_integer())
              << what;
        }
      }
    }
  }
}

TEST(Server, RequestsTakeTurnsOnTheEngine) {
  ScriptedServer s;
  s.delay_us_ = 200;
  const std::string body =
      Json{{"messages", kMessages}, {"tools", kTools}, {"max_tokens", 40}}.dump();
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&] {
      httplib::Client c("127.0.0.1", s.port());
      c.set_read_timeout(60);
      const auto res = c.Post("/v1/chat/completions", body, "application/json");
      if (res && res->status == 200) {
        const Json j = Json::parse(res->body);
        ok += j["usage"]["completion_tokens"] == 40 && j["choices"][0]["finish_reason"] == "length";
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(ok.load(), 4);
  EXPECT_FALSE(s.overlapped_.load());
}

TEST(Server, EngineFailuresReachTheClient) {
  ScriptedServer s;
  s.fail_at_ = 5;
  httplib::Client c("127.0.0.1", s.port());
  const std::string body = Json{{"messages", kMessages}}.dump();
  auto res = c.Post("/v1/chat/completions", body, "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 500);
  Json j = Json::parse(res->body);
  EXPECT_EQ(j["error"]["type"], "server_error");
  EXPECT_EQ(j["error"]["message"], "the scripted engine failed");
  // Streamed: the events so far, then an error event.
  res = c.Post("/v1/chat/completions", Json{{"messages", kMessages}, {"stream", true}}.dump(),
               "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  const size_t at = res->body.rfind("data: ");
  ASSERT_NE(at, std::string::npos) << res->body;
  j = Json::parse(res->body.substr(at + 6));
  EXPECT_EQ(j["error"]["message"], "the scripted engine failed") << res->body;
  EXPECT_NE(res->body.find("reasoning_content"), std::string::npos) << res->body;
  // And the server still serves.
  s.fail_at_ = -1;
  res = c.Post("/v1/chat/completions", body, "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
}

// GET /metrics: one sample of `name{labels}` (labels exactly as written), or -1 if absent.
double sample(const std::string& text, const std::string& name_and_labels) {
  const std::string key = name_and_labels + " ";
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
    if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + key.size()));
  }
  return -1;
}

// Every line of the exposition is a HELP or TYPE comment or a sample of a declared metric; a
// histogram's buckets only grow, and its +Inf bucket is its count.
void expect_well_formed(const std::string& text) {
  static const std::regex kSample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_]+="(?:[^"\\]|\\.)*"(?:,[a-zA-Z_]+="(?:[^"\\]|\\.)*")*\})? ([0-9.e+-]+))");
  std::set<std::string> declared;
  std::map<std::string, double> last_bucket;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      declared.insert(line.substr(7, line.find(' ', 7) - 7));
      continue;
    }
    ASSERT_TRUE(std::regex_match(line, m, kSample)) << line;
    std::string name = m[1];
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string base = name.substr(0, name.size() - std::strlen(suffix));
      if (name.size() > std::strlen(suffix) && name.ends_with(suffix) && declared.count(base)) {
        name = base;
      }
    }
    EXPECT_TRUE(declared.count(name)) << line;
    if (m[1].str().ends_with("_bucket")) {
      const double v = std::stod(m[3]);
      EXPECT_GE(v, last_bucket[name]) << line;
      last_bucket[name] = v;
    } else if (m[1].str().ends_with("_count")) {
      EXPECT_EQ(std::stod(m[3]), last_bucket[name]) << line;
    }
  }
}

TEST(Server, MetricsCountTokensRequestsAndLatencies) {
  ScriptedServer s;
  httplib::Client c("127.0.0.1", s.port());
  const std::string m = "{model_name=\"scripted\"}";
  auto metrics = [&] {
    const auto res = c.Get("/metrics");
    EXPECT_TRUE(res && res->status == 200);
    EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
    expect_well_formed(res->body);
    return res->body;
  };
  EXPECT_EQ(sample(metrics(), "vllm:generation_tokens_total" + m), 0);

  // A whole chat reply cut at 10 tokens, a streamed completion to its end, a bad request, a
  // path that does not exist.
  auto res = c.Post("/v1/chat/completions",
                    Json{{"messages", kMessages}, {"max_tokens", 10}}.dump(), "application/json");
  ASSERT_TRUE(res && res->status == 200);
  const Json whole = Json::parse(res->body);
  res = c.Post("/v1/completions",
               Json{{"prompt", "Hello"},
                    {"max_tokens", 200},
                    {"stream", true},
                    {"stream_options", {{"include_usage", true}}}}
                   .dump(),
               "application/json");
  ASSERT_TRUE(res && res->status == 200);
  const Json streamed = events(res->body).back();
  ASSERT_EQ(c.Post("/v1/completions", "{", "application/json")->status, 400);
  ASSERT_EQ(c.Get("/v1/nothing-here")->status, 404);

  // A request is counted once its reply has gone out, so the client can ask before that: wait
  // (at most 2 s) for the four requests above (and /metrics counts its own earlier answers).
  std::string t;
  for (int i = 0; i < 200; ++i) {
    t = metrics();
    double answered = 0;
    std::istringstream in(t);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("http_requests_total{", 0) == 0 &&
          line.find("/metrics") == std::string::npos) {
        answered += std::stod(line.substr(line.rfind(' ')));
      }
    }
    if (answered >= 4) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const int64_t generated = whole["usage"]["completion_tokens"].get<int64_t>() +
                            streamed["usage"]["completion_tokens"].get<int64_t>();
  EXPECT_EQ(whole["usage"]["completion_tokens"], 10);
  EXPECT_EQ(streamed["usage"]["completion_tokens"], s.reply().size());
  EXPECT_EQ(sample(t, "vllm:generation_tokens_total" + m), generated);
  EXPECT_EQ(sample(t, "vllm:prompt_tokens_total" + m),
            whole["usage"]["prompt_tokens"].get<int64_t>() +
                streamed["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(sample(t, "vllm:prefix_cache_hits_total" + m), 0);
  EXPECT_EQ(
      sample(t, "vllm:request_success_total{model_name=\"scripted\",finished_reason=\"length\"}"),
      1);
  EXPECT_EQ(
      sample(t, "vllm:request_success_total{model_name=\"scripted\",finished_reason=\"stop\"}"), 1);
  EXPECT_EQ(sample(t, "vllm:num_requests_running" + m), 0);
  EXPECT_EQ(sample(t, "vllm:num_requests_waiting" + m), 0);
  // Two requests generated: one wait and one first token each, a gap between every two tokens.
  EXPECT_EQ(sample(t, "vllm:request_queue_time_seconds_count" + m), 2);
  EXPECT_EQ(sample(t, "vllm:time_to_first_token_seconds_count" + m), 2);
  EXPECT_EQ(sample(t, "vllm:inter_token_latency_seconds_count" + m), generated - 2);
  EXPECT_EQ(sample(t, "vllm:e2e_request_latency_seconds_count" + m), 2);
  EXPECT_GT(sample(t, "vllm:e2e_request_latency_seconds_sum" + m), 0);
  // Lengths: the chat's 10 tokens in the bucket up to 10, the completion's in the one to 100
  // (cumulative: 2); the buckets go 1, 2, 5, ... up to max_model_len (4096: 2000 the last).
  EXPECT_EQ(sample(t, "vllm:request_generation_tokens_sum" + m), generated);
  EXPECT_EQ(sample(t, "vllm:request_generation_tokens_bucket{model_name=\"scripted\",le=\"10\"}"),
            1);
  EXPECT_EQ(sample(t, "vllm:request_generation_tokens_bucket{model_name=\"scripted\",le=\"100\"}"),
            s.reply().size() <= 100 ? 2 : 1);
  EXPECT_EQ(sample(t, "vllm:request_generation_tokens_bucket{model_name=\"scripted\",le=\"5000\"}"),
            -1);
  EXPECT_EQ(sample(t, "vllm:request_prompt_tokens_sum" + m),
            sample(t, "vllm:prompt_tokens_total" + m));
  EXPECT_EQ(sample(t, "vllm:request_prompt_tokens_count" + m), 2);
  for (const char* h :
       {"/v1/chat/completions\",method=\"POST\",status=\"2xx",
        "/v1/completions\",method=\"POST\",status=\"2xx",
        "/v1/completions\",method=\"POST\",status=\"4xx", "other\",method=\"GET\",status=\"4xx"}) {
    EXPECT_EQ(sample(t, std::string("http_requests_total{handler=\"") + h + "\"}"), 1) << h;
  }
  EXPECT_GE(sample(t, "http_requests_total{handler=\"/metrics\",method=\"GET\",status=\"2xx\"}"),
            1);
}

// POST /tokenize and /detokenize as vLLM's: a prompt's ids, a chat's ids as the engine gets them
// for a chat request, ids back to text; bad ids and bodies refused with the field named.
TEST(Server, TokenizeAndDetokenize) {
  ScriptedServer s;
  httplib::Client c("127.0.0.1", s.port());
  const auto post = [&](const char* path, const Json& body) {
    const auto res = c.Post(path, body.dump(), "application/json");
    EXPECT_TRUE(res);
    return std::make_pair(res ? res->status : 0, res ? Json::parse(res->body) : Json());
  };
  const std::vector<int32_t> hello = s.tok().encode("Hello world, how are you?");
  auto [status, j] = post("/tokenize", {{"prompt", "Hello world, how are you?"}});
  ASSERT_EQ(status, 200) << j;
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), hello);
  EXPECT_EQ(j["count"], hello.size());
  EXPECT_EQ(j["max_model_len"], 4096);
  EXPECT_TRUE(j["token_strs"].is_null());
  std::tie(status, j) = post("/tokenize", {{"prompt", "Hello world, how are you?"},
                                           {"return_token_strs", true},
                                           {"model", "scripted"}});
  ASSERT_EQ(status, 200) << j;
  for (size_t i = 0; i < hello.size(); ++i) {
    EXPECT_EQ(j["token_strs"][i], s.tok().token_content(hello[i])) << i;
  }
  std::tie(status, j) = post("/detokenize", {{"tokens", hello}});
  ASSERT_EQ(status, 200) << j;
  EXPECT_EQ(j["prompt"], "Hello world, how are you?");

  // A chat's ids are the ones a chat request puts on the engine.
  ASSERT_EQ(c.Post("/v1/chat/completions", Json{{"messages", kMessages}, {"tools", kTools}}.dump(),
                   "application/json")
                ->status,
            200);
  std::tie(status, j) = post("/tokenize", {{"messages", kMessages}, {"tools", kTools}});
  ASSERT_EQ(status, 200) << j;
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), s.prompt_);
  std::tie(status, j) = post("/tokenize", {{"messages", kMessages},
                                           {"add_generation_prompt", false},
                                           {"chat_template_kwargs", {{"enable_thinking", false}}}});
  ASSERT_EQ(status, 200) << j;
  ChatOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  no_prompt.enable_thinking = false;
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(),
            s.tok().encode(render_chat(kMessages, Json(), no_prompt)));

  struct Bad {
    const char* path;
    Json body;
    int status;
    const char* param;
  };
  for (const Bad& b :
       {Bad{"/detokenize", {{"tokens", {1, -1}}}, 400, "tokens"},
        Bad{"/detokenize", {{"tokens", {4096}}}, 400, "tokens"},
        Bad{"/detokenize", {{"tokens", "12"}}, 400, "tokens"},
        Bad{"/detokenize", Json::object(), 400, "tokens"},
        Bad{"/tokenize", Json::object(), 400, "prompt"},
        Bad{"/tokenize", {{"prompt", 7}}, 400, "prompt"},
        Bad{"/tokenize", {{"prompt", "x"}, {"messages", kMessages}}, 400, "messages"},
        Bad{"/tokenize", {{"messages", Json::array()}}, 400, "messages"},
        Bad{"/tokenize", {{"prompt", "x"}, {"model", "other"}}, 404, "model"}}) {
    std::tie(status, j) = post(b.path, b.body);
    EXPECT_EQ(status, b.status) << b.path << " " << b.body << ": " << j;
    EXPECT_EQ(j["error"]["param"], b.param) << b.path << " " << b.body << ": " << j;
  }
}

// The model's name goes into every engine metric's label, escaped as the text format wants.
TEST(Server, MetricsEscapeTheModelName) {
  ScriptedServer s(kReply, "a\"b\\c\nd");
  httplib::Client c("127.0.0.1", s.port());
  const auto res = c.Get("/metrics");
  ASSERT_TRUE(res && res->status == 200);
  expect_well_formed(res->body);
  EXPECT_EQ(sample(res->body, R"(vllm:generation_tokens_total{model_name="a\"b\\c\nd"})"), 0)
      << res->body;
}

// While one request holds the engine, the next one waits, and /metrics says so.
TEST(Server, MetricsShowTheRequestOnTheEngineAndTheOneWaiting) {
  ScriptedServer s;
  s.delay_us_ = 20000;  // 50 tokens: a second a request
  const std::string body = Json{{"messages", kMessages}, {"max_tokens", 50}}.dump();
  std::vector<std::thread> clients;
  for (int i = 0; i < 2; ++i) {
    clients.emplace_back([&] {
      httplib::Client c("127.0.0.1", s.port());
      c.set_read_timeout(60);
      c.Post("/v1/chat/completions", body, "application/json");
    });
  }
  httplib::Client c("127.0.0.1", s.port());
  const std::string m = "{model_name=\"scripted\"}";
  bool seen = false;
  for (int i = 0; i < 300 && !seen; ++i) {
    const auto res = c.Get("/metrics");
    seen = res && sample(res->body, "vllm:num_requests_running" + m) == 1 &&
           sample(res->body, "vllm:num_requests_waiting" + m) == 1;
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (std::thread& t : clients) t.join();
  EXPECT_TRUE(seen);
  std::string t;
  for (int i = 0; i < 200; ++i) {  // the last generation's end is counted after its reply
    t = c.Get("/metrics")->body;
    if (sample(t, "vllm:num_requests_running" + m) == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(sample(t, "vllm:num_requests_running" + m), 0);
  EXPECT_EQ(sample(t, "vllm:num_requests_waiting" + m), 0);
  // The second request's wait was most of the first one's second.
  EXPECT_GE(sample(t, "vllm:request_queue_time_seconds_sum" + m), 0.5);
}

}  // namespace
}  // namespace qf::rt
