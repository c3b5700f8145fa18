// What `qforge serve` counts for GET /metrics, in Prometheus' text format (version 0.0.4). The
// engine's figures carry the names vLLM's server gives the same quantities (and its model_name
// label), so that a dashboard made for a vLLM server reads a qforge one; the HTTP requests are
// counted as prometheus-fastapi-instrumentator (which vLLM's server uses) counts them, by route,
// method and status class. Internal to runtime/src (server.cpp).
//
// A generation is one choice of a request (n = 3 makes three): it waits for the engine (the
// server runs one at a time), holds it, and ends with a finish reason: the engine's "stop" or
// "length", "abort" when a streaming client went away, "error" when the engine failed.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace qf::rt {

class ServeMetrics {
 public:
  // max_model_len bounds the token-count histograms' buckets (1, 2, 5, 10, 20, 50, ... up to it).
  ServeMetrics(std::string model_name, int64_t max_model_len);

  // Generations waiting for the engine, and on it (0 or 1).
  void add_waiting(int delta);
  void add_running(int delta);
  // A generation's wait for the engine.
  void queued(double seconds);
  // A request's arrival to its first generated token; the gap between two tokens of a generation.
  void first_token(double seconds);
  void inter_token(double seconds);
  // A generation's end: its prompt tokens (of which `cached` came from a kept state), the tokens
  // it generated, and why it ended.
  void generation_done(int64_t prompt, int64_t cached, int64_t generated,
                       std::string_view finished_reason);
  // A request's arrival to its last byte, for requests answered in full (whole or streamed).
  void request_done(double seconds);
  // Any HTTP request answered: its route (unknown paths count as "other", so that no client can
  // add labels without bound), method and status.
  void http(std::string_view route, std::string_view method, int status);

  // The exposition: every metric with its HELP and TYPE lines.
  std::string render() const;

 private:
  struct Histogram {
    std::vector<double> bounds;    // upper bounds, ascending; +Inf implied
    std::vector<uint64_t> counts;  // per bound (not cumulative), then +Inf
    double sum = 0;
    explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1) {}
    void observe(double v);
  };

  void observe(Histogram& h, double seconds);

  std::string model_label_;  // model_name="..." (escaped)
  mutable std::mutex mu_;
  int64_t waiting_ = 0, running_ = 0;
  uint64_t prompt_tokens_ = 0, generation_tokens_ = 0, cache_hits_ = 0;
  std::map<std::string, uint64_t> finished_;  // by finished_reason
  std::map<std::tuple<std::string, std::string, std::string>, uint64_t> http_;
  Histogram queue_, ttft_, itl_, e2e_, prompt_len_, generated_len_;
};

}  // namespace qf::rt
