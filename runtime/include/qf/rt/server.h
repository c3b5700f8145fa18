// An OpenAI-compatible HTTP server over one engine (`qforge serve`): POST /v1/chat/completions
// and /v1/completions (whole replies, or streamed as server-sent events), GET /v1/models,
// /health and /metrics (Prometheus' text format: serve_metrics.h), POST /tokenize and /detokenize
// (vLLM's). Requests run one at a time (the others wait): the engine decodes one sequence (batch
// 1), which is what decode on one GPU is built for here. Every error goes back as OpenAI's
// {"error": {message, type, param, code}} with the HTTP status that fits (400 bad request, 401
// wrong key, 404 unknown model or path, 413 body too large, 500 engine failure); a streamed
// reply that fails after its first event ends with an error event.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "qf/rt/generate.h"
#include "qf/rt/generation_config.h"
#include "qf/rt/tokenizer.h"

namespace qf::rt {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8000;               // 0: any free port (Server::bind says which)
  std::string model_name;        // the id clients name in "model" and /v1/models lists
  std::string api_key;           // "": no key; else requests need "Authorization: Bearer KEY"
  int64_t max_model_len = 0;     // prompt + completion tokens per request (> 0)
  int64_t vocab_size = 0;        // the model's rows: prompt ids past it are refused
  std::vector<int32_t> eos_ids;  // stop tokens unless a request sets ignore_eos
  SamplingOptions defaults;      // the model's sampling defaults (generation_config.json)
};

// One request's generation: on_token(id) for every id, as generate() does; it may throw to stop
// generation early. Before the first token it sets *cached_tokens to the prompt tokens it
// skipped by reusing a kept state (PrefixCache), reported in usage.prompt_tokens_details.
using GenerateFn = std::function<GenerateResult(
    std::span<const int32_t> prompt, const GenerateOptions& options,
    const std::function<void(int32_t)>& on_token, int64_t* cached_tokens)>;

class Server {
 public:
  Server(const Tokenizer& tokenizer, GenerateFn generate, ServeOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket; returns the port. Throws Error(kIo) when it cannot.
  int bind();
  // Serves until stop() (from another thread or a signal-handling thread).
  void run();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qf::rt
