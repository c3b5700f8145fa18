// `qforge serve` on the example model, checked with OpenAI's Python client
// (openai_client_check.py): completions and chat replies, whole and streamed, equal to what
// `qforge generate` prints for the same prompt and sampling; errors with their status and
// parameter; a client leaving mid-stream; SIGTERM ending the server cleanly.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "qf/rt/chat_output.h"
#include "qf/rt/cuda_engine.h"
#include "qf/rt/tokenizer.h"
#include "test_support.h"

namespace qf {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using test::run_command;

const std::string kModel = std::string(QF_SOURCE_DIR) + "/models/tiny/model";

std::string client() {
  return std::string(QF_PYTHON) + " " + QF_SOURCE_DIR + "/tests/e2e/openai_client_check.py";
}

// A `qforge serve --port 0` process; its port read from its stderr line. SIGTERM on stop().
class ServeProcess {
 public:
  explicit ServeProcess(const std::string& flags) : log_(dir_ / "serve.log") {
    pid_ = fork();
    if (pid_ == 0) {
      const std::string cmd = std::string(QF_BIN) + " serve --model " + kModel + " --port 0 " +
                              flags + " 2> " + log_.string();
      execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), nullptr);
      _exit(127);
    }
    const std::regex listening("http://127\\.0\\.0\\.1:([0-9]+)/v1");
    for (int i = 0; i < 600 && port_ == 0; ++i) {  // a minute: qemu runs are slow
      std::smatch m;
      const std::string text = log();
      if (std::regex_search(text, m, listening)) port_ = std::stoi(m[1]);
      if (port_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ~ServeProcess() {
    if (pid_ > 0) stop();
  }
  int port() const { return port_; }
  std::string base() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }
  std::string log() const {
    std::ifstream f(log_);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  // SIGTERM; the exit status.
  int stop() {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  test::TempDir dir_;
  fs::path log_;
  pid_t pid_ = 0;
  int port_ = 0;
};

// `qforge generate --json` with these flags.
Json generate(const std::string& flags) {
  const auto r =
      run_command(std::string(QF_BIN) + " generate --model " + kModel + " --json " + flags);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return Json::parse(r.out);
}

// The served replies against `qforge generate` with the same engine flags (`engine`: --device,
// --speculative).
void expect_generates_replies(const std::string& engine) {
  Json expect = {
      {"model", "served-tiny"}, {"completions", Json::array()}, {"chats", Json::array()}};
  // Greedy, sampled with a seed, with penalties, and one cut by a stop string the greedy text
  // holds.
  const std::string prompt = "import os\n\n\ndef read_config(path):\n";
  const std::string quoted = "'" + prompt + "'";
  for (const auto& [request, flags] : std::vector<std::pair<Json, std::string>>{
           {{{"max_tokens", 24}, {"temperature", 0}}, "--max-tokens 24 --temperature 0"},
           {{{"max_tokens", 20},
             {"temperature", 0.8},
             {"top_p", 0.9},
             {"seed", 11},
             {"extra_body", {{"top_k", 30}}}},  // not an OpenAI field: vLLM's extension
            "--max-tokens 20 --temperature 0.8 --top-p 0.9 --top-k 30 --seed 11"},
           // Penalties and min-p (vLLM's extensions in extra_body), greedy and sampled.
           {{{"max_tokens", 20},
             {"temperature", 0},
             {"presence_penalty", 1.5},
             {"frequency_penalty", 0.5},
             {"extra_body", {{"repetition_penalty", 1.3}}}},
            "--max-tokens 20 --temperature 0 --presence-penalty 1.5 --frequency-penalty 0.5 "
            "--repetition-penalty 1.3"},
           {{{"max_tokens", 20},
             {"temperature", 0.9},
             {"seed", 3},
             {"extra_body", {{"min_p", 0.1}, {"repetition_penalty", 1.2}}}},
            "--max-tokens 20 --temperature 0.9 --seed 3 --min-p 0.1 --repetition-penalty 1.2"}}) {
    const Json g = generate(engine + " --prompt " + quoted + " " + flags);
    Json req = request;
    req["prompt"] = prompt;
    expect["completions"].push_back({{"request", req},
                                     {"text", g["text"]},
                                     {"finish_reason", g["finish_reason"]},
                                     {"prompt_tokens", g["prompt_tokens"]},
                                     {"completion_tokens", g["completion_tokens"]},
                                     {"ids", g["ids"]}});
  }
  const std::string greedy = expect["completions"][0]["text"];
  const size_t cut = greedy.find('(');
  ASSERT_NE(cut, std::string::npos) << greedy;
  // Cut by a stop string: the text before it, and as many tokens as it took to complete it.
  {
    const rt::Tokenizer tok = rt::Tokenizer::load(kModel + "/tokenizer.json");
    const std::vector<int32_t> ids = expect["completions"][0]["ids"];
    size_t n = 1;
    while (n < ids.size() &&
           tok.decode(std::span(ids).first(n), true).find('(') == std::string::npos) {
      ++n;
    }
    Json req = {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}, {"stop", "("}};
    expect["completions"].push_back({{"request", req},
                                     {"text", greedy.substr(0, cut)},
                                     {"finish_reason", "stop"},
                                     {"prompt_tokens", expect["completions"][0]["prompt_tokens"]},
                                     {"completion_tokens", n}});
  }
  // A conversation in the chat format, as token ids, each turn's prompt extending the one before
  // up to its last <|im_start|>: served from the state kept there (prefix reuse), which
  // usage.prompt_tokens_details.cached_tokens counts. The sampled request repeats the greedy
  // one's prompt, so it reuses all of it but its last token.
  expect["completions"][1]["cached_tokens"] =
      expect["completions"][1]["prompt_tokens"].get<int64_t>() - 1;
  {
    const rt::Tokenizer tok = rt::Tokenizer::load(kModel + "/tokenizer.json");
    const int32_t im_start = *tok.token_id("<|im_start|>");
    std::string history = "<|im_start|>user\nWrite a function.<|im_end|>\n";
    int64_t cached = 0;  // the stop case's prompt before it has no <|im_start|>
    for (const char* user : {"Now test it.", "Thanks."}) {
      const std::vector<int32_t> ids = tok.encode(history + "<|im_start|>assistant\n");
      std::string list;
      for (const int32_t id : ids) list += (list.empty() ? "" : ",") + std::to_string(id);
      const Json g = generate(engine + " --tokens " + list + " --max-tokens 16 --temperature 0");
      expect["completions"].push_back(
          {{"request", {{"prompt", ids}, {"max_tokens", 16}, {"temperature", 0}}},
           {"text", g["text"]},
           {"finish_reason", g["finish_reason"]},
           {"prompt_tokens", g["prompt_tokens"]},
           {"completion_tokens", g["completion_tokens"]},
           {"cached_tokens", cached}});
      cached = std::find(ids.rbegin(), ids.rend(), im_start).base() - ids.begin() - 1;
      history += "<|im_start|>assistant\n" + g["text"].get<std::string>() +
                 "<|im_end|>\n<|im_start|>user\n" + user + "<|im_end|>\n";
    }
  }
  // Chat, thinking on and off: generate's text split as chat_output.h says.
  for (const bool think : {true, false}) {
    const Json g = generate(engine + " --chat 'Write a function that adds two numbers.' " +
                            "--max-tokens 30 --temperature 0" + (think ? "" : " --no-think"));
    rt::ChatOutputParser p(think, Json());
    rt::ChatDelta a = p.push(g["text"].get<std::string>()), b = p.finish();
    Json req = {
        {"messages", {{{"role", "user"}, {"content", "Write a function that adds two numbers."}}}},
        {"max_tokens", 30},
        {"temperature", 0}};
    if (!think) req["extra_body"] = {{"chat_template_kwargs", {{"enable_thinking", false}}}};
    expect["chats"].push_back({{"request", req},
                               {"reasoning", a.reasoning + b.reasoning},
                               {"content", a.content + b.content},
                               {"finish_reason", g["finish_reason"]},
                               {"completion_tokens", g["completion_tokens"]}});
  }
  const test::TempDir dir;
  const fs::path file = dir / "expect.json";
  test::write_file(file, expect.dump(2));

  ServeProcess serve(engine + " --served-model-name served-tiny --threads 2");
  ASSERT_GT(serve.port(), 0) << serve.log();
  const auto r = run_command(client() + " engine " + serve.base() + " " + file.string());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err << "\nserver log:\n" << serve.log();
  EXPECT_NE(r.out.find("ok: "), std::string::npos) << r.out;
  EXPECT_EQ(serve.stop(), 0) << serve.log();
  EXPECT_NE(serve.log().find("stopping"), std::string::npos) << serve.log();
}

// An echoed prompt's logprobs, asked as lm-evaluation-harness asks for them (token ids, echo,
// logprobs 1, max_tokens 1), sum to minus the NLL `qforge eval-ppl` gives the same tokens (one
// window, no MTP head; another reduction of the same engine's rows). Prefix reuse stays sound
// around them: a request before and after an echoed one gets the same reply, the second from
// a fresh state (the echo's prompt overwrote the KV rows the kept snapshot relied on).
void expect_echo_scores(const std::string& engine) {
  std::ifstream in(std::string(QF_SOURCE_DIR) + "/models/tiny/heldout.txt");
  std::string text(1500, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  const test::TempDir dir;
  test::write_file(dir / "t.txt", text);
  const auto e = run_command(std::string(QF_BIN) + " eval-ppl --model " + kModel + " --text " +
                             (dir / "t.txt").string() + " --window 4096 --no-mtp --json " +
                             (engine.find("cuda") != std::string::npos ? "--device cuda" : ""));
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const Json ppl = Json::parse(e.out);
  const double nll_sum = ppl["nll"].get<double>() * ppl["predictions"].get<double>();
  const std::vector<int32_t> ids = rt::Tokenizer::load(kModel + "/tokenizer.json").encode(text);
  ASSERT_EQ(static_cast<int64_t>(ids.size()), ppl["tokens"].get<int64_t>());

  ServeProcess serve(engine + " --threads 2");
  ASSERT_GT(serve.port(), 0) << serve.log();
  httplib::Client c("127.0.0.1", serve.port());
  c.set_read_timeout(300);
  const auto post = [&](const Json& body) {
    const auto res = c.Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no reply") << serve.log();
    return res && res->status == 200 ? Json::parse(res->body) : Json();
  };
  const Json plain = {
      {"prompt", "import os\n\n\ndef main():\n"}, {"max_tokens", 12}, {"temperature", 0}};
  const Json before = post(plain);
  const Json echo = post(
      {{"prompt", ids}, {"echo", true}, {"logprobs", 1}, {"max_tokens", 1}, {"temperature", 0}});
  const Json after = post(plain);
  ASSERT_FALSE(echo.is_null());
  const Json& lp = echo["choices"][0]["logprobs"];
  ASSERT_EQ(lp["token_logprobs"].size(), ids.size() + 1) << lp.dump();
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  double sum = 0;
  for (size_t i = 1; i < ids.size(); ++i) sum += lp["token_logprobs"][i].get<double>();
  EXPECT_NEAR(-sum, nll_sum, 1e-4 * static_cast<double>(ids.size())) << engine;
  std::printf("%s: echoed prompt's logprobs sum %.6f, eval-ppl NLL sum %.6f\n", engine.c_str(),
              -sum, nll_sum);
  EXPECT_EQ(echo["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(before["choices"][0]["text"], after["choices"][0]["text"]) << engine;
  EXPECT_EQ(after["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << engine;
  EXPECT_EQ(serve.stop(), 0) << serve.log();
}

// n choices from a served engine: choice i is what `qforge generate --seed S+i` writes for the
// same prompt and sampling (the second choice's prompt served from the kept prefix).
void expect_choices_follow_seeds(const std::string& engine) {
  const std::string prompt = "import os\n\n\ndef read_config(path):\n";
  const std::string flags = " --max-tokens 20 --temperature 0.8 --top-p 0.9 --top-k 30";
  std::vector<Json> want;
  for (const int seed : {11, 12}) {
    want.push_back(generate(engine + " --prompt '" + prompt + "'" + flags + " --seed " +
                            std::to_string(seed)));
  }
  ServeProcess serve(engine + " --threads 2");
  ASSERT_GT(serve.port(), 0) << serve.log();
  httplib::Client c("127.0.0.1", serve.port());
  c.set_read_timeout(300);
  const Json body = {{"prompt", prompt}, {"n", 2},      {"max_tokens", 20}, {"temperature", 0.8},
                     {"top_p", 0.9},     {"top_k", 30}, {"seed", 11}};
  // And the same prompt twice in one request (vLLM's batch of prompts), n 1: choice p takes
  // the seed + p, so the same two replies, and the prompt counts twice.
  Json batch = body;
  batch["prompt"] = Json::array({prompt, prompt});
  batch.erase("n");
  EXPECT_NE(want[0]["text"], want[1]["text"]) << "the seeds should sample apart";
  int64_t prompt_tokens = 0;
  for (const Json& b : {body, batch}) {
    const auto res = c.Post("/v1/completions", b.dump(), "application/json");
    ASSERT_TRUE(res && res->status == 200) << (res ? res->body : "no reply") << serve.log();
    const Json reply = Json::parse(res->body);
    ASSERT_EQ(reply["choices"].size(), 2u) << reply.dump();
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(reply["choices"][i]["text"], want[i]["text"]) << engine << " choice " << i << b;
      EXPECT_EQ(reply["choices"][i]["finish_reason"], want[i]["finish_reason"]) << engine << b;
    }
    EXPECT_EQ(reply["usage"]["completion_tokens"], want[0]["completion_tokens"].get<int64_t>() +
                                                       want[1]["completion_tokens"].get<int64_t>());
    if (prompt_tokens > 0) {
      EXPECT_EQ(reply["usage"]["prompt_tokens"], 2 * prompt_tokens);
    }
    prompt_tokens = reply["usage"]["prompt_tokens"];
  }
  EXPECT_EQ(serve.stop(), 0) << serve.log();
}

TEST(ServeCli, OpenAiClientGetsWhatGenerateWrites) {
  expect_generates_replies("--device cpu");
}

TEST(ServeCli, EchoedPromptLogprobsAreTheModels) {
  expect_echo_scores("--device cpu");
  expect_echo_scores("--device cpu --speculative");
}

TEST(ServeCli, ChoicesAreGenerateWithTheSeedPlusTheirIndex) {
  expect_choices_follow_seeds("--device cpu");
  expect_choices_follow_seeds("--device cpu --speculative");
}

TEST(ServeCli, SpeculativeOnTheCpu) {
  expect_generates_replies("--device cpu --speculative");
  expect_generates_replies("--device cpu --speculative --draft-tokens 2");
}

TEST(ServeCli, CudaEngine) {
  std::string why;
  if (!rt::CudaEngine::available(&why)) GTEST_SKIP() << "no GPU: " << why;
  expect_generates_replies("--device cuda");
  expect_generates_replies("--device cuda --speculative");
  expect_generates_replies("--device cuda --speculative --draft-tokens 2");
  expect_echo_scores("--device cuda");
  expect_echo_scores("--device cuda --speculative");
  expect_choices_follow_seeds("--device cuda");
  expect_choices_follow_seeds("--device cuda --speculative");
}

TEST(ServeCli, ErrorsKeyAndAClientLeaving) {
  ServeProcess serve("--api-key sesame --threads 2");
  ASSERT_GT(serve.port(), 0) << serve.log();
  const auto r = run_command(client() + " errors " + serve.base() + " sesame");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err << "\nserver log:\n" << serve.log();
  EXPECT_NE(serve.log().find("the client closed the stream; generation stopped"), std::string::npos)
      << serve.log();
  // /metrics and /tokenize are outside /v1, so the key is not asked for (as in vLLM); the
  // client that left counts as an aborted generation, and nothing is left on the engine.
  httplib::Client c("127.0.0.1", serve.port());
  const auto tokens = c.Post("/tokenize", R"({"prompt": "Hello"})", "application/json");
  ASSERT_TRUE(tokens);
  EXPECT_EQ(tokens->status, 200) << tokens->body;
  const auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->body.find("finished_reason=\"abort\"} 1\n"), std::string::npos)
      << metrics->body;
  EXPECT_NE(metrics->body.find("vllm:num_requests_running{model_name=\"model\"} 0\n"),
            std::string::npos)
      << metrics->body;
  EXPECT_EQ(serve.stop(), 0) << serve.log();
}

TEST(ServeCli, BadFlagsAndModels) {
  const std::string bin = std::string(QF_BIN) + " serve ";
  auto r = run_command(bin + "--model " + kModel + " --port 70000");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("--port"), std::string::npos) << r.err;
  r = run_command(bin + "--model " + kModel + " --host ''");  // it listened on ::1 before
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("--host is empty"), std::string::npos) << r.err;
  r = run_command(bin + "--model " + kModel + " --max-model-len 1073741824");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("--max-model-len must be 1 to 1073741823"), std::string::npos) << r.err;
  r = run_command(bin + "--model /nonexistent/model");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("/nonexistent/model"), std::string::npos) << r.err;
  // A port in use: the error names it.
  ServeProcess first("");
  ASSERT_GT(first.port(), 0) << first.log();
  r = run_command(bin + "--model " + kModel + " --port " + std::to_string(first.port()));
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find(std::to_string(first.port())), std::string::npos) << r.err;
}

}  // namespace
}  // namespace qf
