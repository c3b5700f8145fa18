// qforge serve --model DIR: an OpenAI-compatible HTTP server over the CPU or CUDA engine
// (rt::Server). SIGINT / SIGTERM stop it.
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "args.h"
#include "commands.h"
#include "qf/error.h"
#include "qf/rt/cuda_engine.h"
#include "qf/rt/generate.h"
#include "qf/rt/generation_config.h"
#include "qf/rt/prefix_cache.h"
#include "qf/rt/server.h"
#include "qf/rt/speculative.h"
#include "qf/rt/tokenizer.h"

namespace qf::tools {
namespace {

struct ServeArgs {
  std::string model, device = "cpu", host = "127.0.0.1", name, api_key;
  int port = 8000, threads = 0;
  int64_t max_model_len = 0;
  bool speculative = false, no_prefix_cache = false;
  int64_t mtp_vocab = 0;  // --mtp-draft-vocab (0: all)
  int draft_tokens = 1;   // --draft-tokens
  rt::KvCacheType kv_cache = rt::KvCacheType::kF32;
};

// SIGINT and SIGTERM go to one thread, blocked everywhere else (threads started later, the
// engine's and the server's, inherit the mask): while a server runs it is stopped (again until
// run() returns, should the signal come before it listens); before, the process exits.
std::mutex serving_mutex;  // held while the pointer is read and used, or changed
rt::Server* serving = nullptr;

// Publishes the running server to the signal thread for its lifetime.
struct Serving {
  explicit Serving(rt::Server* s) { set(s); }
  ~Serving() { set(nullptr); }
  static void set(rt::Server* s) {
    std::lock_guard<std::mutex> lock(serving_mutex);
    serving = s;
  }
};

void handle_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::thread([signals] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "[serve] signal %d: stopping\n", sig);
    for (bool first = true;; first = false) {
      {
        std::lock_guard<std::mutex> lock(serving_mutex);
        if (serving == nullptr && first) std::_Exit(128 + sig);
        if (serving == nullptr) return;
        serving->stop();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }).detach();
}

int run(const ServeArgs& a) {
  handle_signals();
  if (a.port < 0 || a.port > 65535) throw Error(Errc::kUsage, "--port must be in 0..65535");
  if (a.host.empty()) {
    throw Error(Errc::kUsage,
                "--host is empty: give an address to listen on (127.0.0.1, ::1, "
                "0.0.0.0, ...)");
  }
  if (a.max_model_len < 0 || a.max_model_len >= rt::kMaxCudaContext) {
    throw Error(Errc::kUsage, "--max-model-len must be 1 to " +
                                  std::to_string(rt::kMaxCudaContext - 1) +
                                  " (or 0: the model's, at most 32768)");
  }
  check_draft_tokens(a.draft_tokens, a.device);
  const std::filesystem::path dir(a.model);
  const std::unique_ptr<rt::Model> model = rt::Model::load(dir);
  const rt::Tokenizer tok = rt::Tokenizer::load(dir / "tokenizer.json");
  const rt::GenerationConfig gen = rt::load_generation_config(dir);
  const ckpt::Qwen35Config& cfg = model->config();

  rt::ServeOptions o;
  o.host = a.host;
  o.port = a.port;
  std::filesystem::path norm = std::filesystem::absolute(dir).lexically_normal();
  if (norm.filename().empty()) norm = norm.parent_path();  // a trailing slash
  o.model_name = a.name.empty() ? norm.filename().string() : a.name;
  o.api_key = a.api_key;
  o.max_model_len =
      a.max_model_len > 0 ? a.max_model_len : std::min<int64_t>(cfg.max_position_embeddings, 32768);
  o.vocab_size = cfg.vocab_size;
  o.eos_ids = gen.eos_token_ids;
  o.eos_ids.push_back(static_cast<int32_t>(cfg.eos_token_id));
  o.defaults = rt::default_sampling(gen);

  // The engine, and how a request runs on it: from the state kept after the previous prompt's
  // shared prefix (PrefixCache), or, with --no-prefix-cache, afresh.
  std::unique_ptr<rt::CpuEngine> cpu;
  std::unique_ptr<rt::CudaEngine> cuda;
  rt::PrefixEngine pe;
  rt::SpecPrefixEngine spe;  // --speculative
  if (a.device == "cuda") {
    rt::CudaOptions co;
    co.max_context = o.max_model_len + 1;
    co.mtp = a.speculative;
    co.mtp_vocab = a.mtp_vocab;
    co.snapshots = !a.no_prefix_cache;
    co.kv_cache = a.kv_cache;
    cuda = std::make_unique<rt::CudaEngine>(*model, co);
    const rt::CudaLoadStats& ls = cuda->load_stats();
    std::fprintf(stderr, "[%s: %.2f GiB on the GPU, loaded in %.2f s]\n", ls.device_name.c_str(),
                 ls.device_bytes / 1073741824.0, ls.load_seconds);
    pe = rt::prefix_engine(*cuda);
    if (a.speculative) spe = rt::speculative_prefix_engine(*cuda, a.draft_tokens);
  } else {
    cpu = std::make_unique<rt::CpuEngine>(*model, a.threads, a.kv_cache);
    if (a.mtp_vocab > 0) cpu->set_mtp_vocab(a.mtp_vocab);
    pe = rt::prefix_engine(*cpu);
    if (a.speculative) spe = rt::speculative_prefix_engine(*cpu, a.draft_tokens);
  }
  const std::optional<int32_t> im_start = tok.token_id("<|im_start|>");
  auto cache = std::make_shared<rt::PrefixCache>(im_start.value_or(-1));
  rt::GenerateFn run_request = [&, cache](std::span<const int32_t> prompt,
                                          const rt::GenerateOptions& go,
                                          const std::function<void(int32_t)>& on, int64_t* cached) {
    // An echoed prompt's logprobs (every position's row) take the plain engine, afresh.
    const bool spec = a.speculative && go.prompt_logprobs < 0;
    if (!a.no_prefix_cache && spec) return cache->generate(spe, prompt, go, on, cached);
    if (!a.no_prefix_cache) return cache->generate(pe, prompt, go, on, cached);
    *cached = 0;
    if (spec) {
      spe.spec.reset();
      return rt::generate_speculative(spe.spec, prompt, go, on, nullptr);
    }
    pe.reset();
    return rt::generate_with(pe.step, pe.vocab, prompt, go, on, pe.prefill, 0, pe.top_step,
                             pe.score);
  };

  rt::Server server(tok, std::move(run_request), o);
  const int port = server.bind();
  const Serving published(&server);
  // An IPv6 address goes in brackets in a URL.
  const std::string host = a.host.find(':') != std::string::npos ? "[" + a.host + "]" : a.host;
  std::fprintf(stderr,
               "qforge serve: http://%s:%d/v1 (model '%s' on %s, max_model_len %lld%s); "
               "Ctrl-C stops\n",
               host.c_str(), port, o.model_name.c_str(), a.device.c_str(),
               static_cast<long long>(o.max_model_len), a.speculative ? ", speculative" : "");
  server.run();
  return kExitOk;
}

}  // namespace

Command add_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* sub = app.add_subcommand("serve", "Serve an OpenAI-compatible HTTP API");
  sub->add_option("--model", a->model, "model directory (any layout qforge reads)")->required();
  sub->add_option("--device", a->device, "cpu (the reference engine) or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  sub->add_option("--host", a->host, "address to listen on")->capture_default_str();
  sub->add_option("--port", a->port, "port (0: any free one, printed)")->capture_default_str();
  sub->add_option("--served-model-name", a->name,
                  "the model id clients use (default: the directory's name)");
  sub->add_option("--api-key", a->api_key, "require Authorization: Bearer KEY on /v1/")
      ->envname("QFORGE_API_KEY");
  sub->add_option("--max-model-len", a->max_model_len,
                  "prompt + completion tokens per request (default: the model's, at most 32768; "
                  "sizes the CUDA engine's KV cache)");
  sub->add_flag("--speculative", a->speculative,
                "speculative decoding with the checkpoint's MTP head (as generate --speculative)");
  add_mtp_vocab_option(sub, &a->mtp_vocab, "--speculative");
  add_draft_tokens_option(sub, &a->draft_tokens);
  sub->add_flag("--no-prefix-cache", a->no_prefix_cache,
                "start every request afresh (default: a request that extends the previous one's "
                "prompt up to its last turn skips that part)");
  add_threads_option(sub, &a->threads, "CPU engine worker threads");
  add_kv_cache_option(sub, &a->kv_cache);
  sub->footer(
      "Endpoints: POST /v1/chat/completions, POST /v1/completions (stream: server-sent events),\n"
      "GET /v1/models, GET /health, GET /metrics (Prometheus), POST /tokenize and /detokenize\n"
      "(vLLM's). One request runs at a time; others wait their turn.\n"
      "Sampling fields a request leaves out take generation_config.json's defaults. Chat\n"
      "replies carry reasoning_content (the think block) and tool_calls (parsed from the\n"
      "Qwen3-Coder XML calls) apart from content.\n\n"
      "Example:\n  qforge serve --model /models/qwen3.5-122b-hybrid --device cuda --port 8000");
  return {sub, [a] { return run(*a); }};
}

}  // namespace qf::tools
