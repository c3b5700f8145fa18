#include "serve_metrics.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace qf::rt {
namespace {

// Label value escaping of the text format: backslash, double quote and line feed.
std::string escape_label(std::string_view v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void header(std::string& s, const char* name, const char* type, const char* help) {
  s += std::string("# HELP ") + name + ' ' + help + "\n# TYPE " + name + ' ' + type + '\n';
}

// Bucket bounds in seconds. Waits, first tokens and gaps between tokens: 1 ms to about ten
// minutes; a request's whole time: 0.3 s to 32 minutes. Longer ones count in +Inf.
const std::vector<double> kLatencyBounds = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06,  0.08,
                                            0.1,   0.25,  0.5,  0.75, 1.0,  2.5,   5.0,
                                            7.5,   10.0,  20.0, 40.0, 80.0, 160.0, 640.0};
const std::vector<double> kRequestBounds = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,   2.5,
                                            5.0,  10.0,  15.0,  20.0,  30.0,  40.0,  50.0,
                                            60.0, 120.0, 240.0, 480.0, 960.0, 1920.0};

// 1, 2, 5, 10, 20, 50, ... up to `max` (vLLM's buckets for token counts are of this kind).
std::vector<double> one_two_five(int64_t max) {
  std::vector<double> b;
  for (double decade = 1;; decade *= 10) {
    for (const double m : {1.0, 2.0, 5.0}) {
      if (m * decade > static_cast<double>(max)) return b;
      b.push_back(m * decade);
    }
  }
}

}  // namespace

void ServeMetrics::Histogram::observe(double v) {
  const auto it = std::lower_bound(bounds.begin(), bounds.end(), v);  // le: v <= bound
  ++counts[static_cast<size_t>(it - bounds.begin())];
  sum += v;
}

ServeMetrics::ServeMetrics(std::string model_name, int64_t max_model_len)
    : model_label_("model_name=\"" + escape_label(model_name) + "\""),
      queue_(kLatencyBounds),
      ttft_(kLatencyBounds),
      itl_(kLatencyBounds),
      e2e_(kRequestBounds),
      prompt_len_(one_two_five(max_model_len)),
      generated_len_(one_two_five(max_model_len)) {}

void ServeMetrics::add_waiting(int delta) {
  std::lock_guard<std::mutex> lock(mu_);
  waiting_ += delta;
}
void ServeMetrics::add_running(int delta) {
  std::lock_guard<std::mutex> lock(mu_);
  running_ += delta;
}
void ServeMetrics::observe(Histogram& h, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  h.observe(seconds);
}
void ServeMetrics::queued(double seconds) {
  observe(queue_, seconds);
}
void ServeMetrics::first_token(double seconds) {
  observe(ttft_, seconds);
}
void ServeMetrics::inter_token(double seconds) {
  observe(itl_, seconds);
}
void ServeMetrics::request_done(double seconds) {
  observe(e2e_, seconds);
}

void ServeMetrics::generation_done(int64_t prompt, int64_t cached, int64_t generated,
                                   std::string_view finished_reason) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += static_cast<uint64_t>(prompt);
  cache_hits_ += static_cast<uint64_t>(cached);
  generation_tokens_ += static_cast<uint64_t>(generated);
  prompt_len_.observe(static_cast<double>(prompt));
  generated_len_.observe(static_cast<double>(generated));
  ++finished_[std::string(finished_reason)];
}

void ServeMetrics::http(std::string_view route, std::string_view method, int status) {
  static constexpr std::string_view kRoutes[] = {
      "/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/tokenize",
      "/detokenize"};
  const bool known = std::find(std::begin(kRoutes), std::end(kRoutes), route) != std::end(kRoutes);
  static constexpr std::string_view kMethods[] = {"GET",    "POST",    "HEAD", "PUT",
                                                  "DELETE", "OPTIONS", "PATCH"};
  const bool known_method =
      std::find(std::begin(kMethods), std::end(kMethods), method) != std::end(kMethods);
  const std::string status_class =
      status >= 100 && status < 600 ? std::to_string(status / 100) + "xx" : "other";
  std::lock_guard<std::mutex> lock(mu_);
  ++http_[{known ? std::string(route) : "other", known_method ? std::string(method) : "other",
           status_class}];
}

std::string ServeMetrics::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string s;
  const std::string& m = model_label_;
  // A gauge or counter: one sample.
  const auto single = [&](const char* name, const char* type, const char* help, auto v) {
    header(s, name, type, help);
    s += std::string(name) + '{' + m + "} " + std::to_string(v) + '\n';
  };
  const auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    header(s, name, "histogram", help);
    uint64_t below = 0;
    for (size_t i = 0; i <= h.bounds.size(); ++i) {
      below += h.counts[i];
      const std::string le = i < h.bounds.size() ? number(h.bounds[i]) : "+Inf";
      s += std::string(name) + "_bucket{" + m + ",le=\"" + le + "\"} " + std::to_string(below) +
           '\n';
    }
    s += std::string(name) + "_sum{" + m + "} " + number(h.sum) + '\n';
    s += std::string(name) + "_count{" + m + "} " + std::to_string(below) + '\n';
  };
  single("vllm:num_requests_running", "gauge", "Generations on the engine (one at a time).",
         running_);
  single("vllm:num_requests_waiting", "gauge", "Generations waiting for the engine.", waiting_);
  single("vllm:prompt_tokens_total", "counter", "Prompt tokens of finished generations.",
         prompt_tokens_);
  single("vllm:generation_tokens_total", "counter", "Tokens generated.", generation_tokens_);
  single("vllm:prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache.", prompt_tokens_);
  single("vllm:prefix_cache_hits_total", "counter", "Prompt tokens the prefix cache served.",
         cache_hits_);
  header(s, "vllm:request_success_total", "counter", "Finished generations by finish reason.");
  for (const auto& [reason, n] : finished_) {
    s += "vllm:request_success_total{" + m + ",finished_reason=\"" + escape_label(reason) + "\"} " +
         std::to_string(n) + '\n';
  }
  histogram("vllm:request_queue_time_seconds", "A generation's wait for the engine.", queue_);
  histogram("vllm:time_to_first_token_seconds", "A request's arrival to its first token.", ttft_);
  histogram("vllm:inter_token_latency_seconds", "Between two tokens of a generation.", itl_);
  histogram("vllm:e2e_request_latency_seconds", "A request's arrival to its last byte.", e2e_);
  histogram("vllm:request_prompt_tokens", "Prompt tokens of a finished generation.", prompt_len_);
  histogram("vllm:request_generation_tokens", "Tokens a finished generation made.", generated_len_);
  header(s, "http_requests_total", "counter", "HTTP requests answered.");
  for (const auto& [key, n] : http_) {
    const auto& [route, method, status] = key;
    s += "http_requests_total{handler=\"" + route + "\",method=\"" + method + "\",status=\"" +
         status + "\"} " + std::to_string(n) + '\n';
  }
  return s;
}

}  // namespace qf::rt
