// qforge-bench-sampling: what choosing a token costs the host per step at Qwen3.5's vocabulary
// (248320 logits): logprobs (token_logprobs, and the plain double-precision loop it replaced,
// side by side), the bias and penalties (LogitsProcessor::apply), and the Sampler at Qwen3.5's
// recommended settings and over the whole vocabulary. Best of --rounds, in microseconds.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "qf/rt/logits.h"
#include "qf/rt/sampler.h"

namespace {

double best_us(int rounds, const std::function<void()>& f) {
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(
        best,
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace qf::rt;
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 50;
  constexpr int64_t kVocab = 248320;
  std::vector<float> row(kVocab);
  std::mt19937 gen(1);
  std::normal_distribution<float> d(0.0f, 3.0f);  // a spread like a model's logits
  for (float& x : row) x = d(gen);
  volatile float sink = 0;

  std::printf("host cost per token at %lld logits, best of %d rounds:\n",
              static_cast<long long>(kVocab), rounds);
  const double plain = best_us(rounds, [&] {
    const float max = *std::max_element(row.begin(), row.end());
    double z = 0;
    for (const float x : row) z += std::exp(static_cast<double>(x) - max);
    sink = sink + static_cast<float>(row[7] - max - std::log(z));
  });
  for (const int n : {0, 5, 20}) {
    const double us = best_us(rounds, [&] { sink = sink + token_logprobs(row, 7, n).logprob; });
    std::printf("  token_logprobs, top %-2d          %8.1f us", n, us);
    if (n == 0) std::printf("   (std::exp in double: %.1f us, %.2fx)", plain, plain / us);
    std::printf("\n");
  }
  SamplingOptions penalties;
  penalties.presence_penalty = 1.0f;
  penalties.repetition_penalty = 1.1f;
  penalties.logit_bias = {{3, -100.0f}};
  std::vector<int32_t> prompt(4000), output(1000);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 7919 % kVocab);
  for (size_t i = 0; i < output.size(); ++i) output[i] = static_cast<int32_t>(i * 104729 % kVocab);
  LogitsProcessor p(penalties, kVocab, prompt);
  p.sync(output);
  std::vector<float> out(row.size());
  std::printf("  penalties, 4000 + 1000 ids      %8.1f us\n",
              best_us(rounds, [&] { p.apply(row, out); }));
  const std::vector<std::pair<std::string, SamplingOptions>> samplers = {
      {"T 0.6, top-p 0.95, top-k 20", {.temperature = 0.6f, .top_p = 0.95f, .top_k = 20}},
      {"T 1, min-p 0.05", {.temperature = 1.0f, .min_p = 0.05f}},
      {"T 1, whole vocabulary", {.temperature = 1.0f}}};
  for (const auto& [name, o] : samplers) {
    Sampler s(o);
    std::printf("  sample, %-24s%8.1f us\n", name.c_str(),
                best_us(rounds, [&] { sink = sink + static_cast<float>(s.sample(row)); }));
  }
  return 0;
}
