// Next-token selection: greedy at temperature 0 (lowest id among equal maxima), otherwise
// top-k, then temperature softmax, then top-p (nucleus) over the survivors, drawn from a seeded
// generator so a seed reproduces a run.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace qf::rt {

struct SamplingOptions {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0: all
  uint64_t seed = 0;
};

class Sampler {
 public:
  // Throws Error(kUsage) for a negative temperature, top_p outside (0, 1] or negative top_k.
  explicit Sampler(const SamplingOptions& options);
  int32_t sample(std::span<const float> logits);

 private:
  SamplingOptions o_;
  std::mt19937_64 rng_;
  std::vector<int32_t> ids_;
  std::vector<float> probs_;
};

}  // namespace qf::rt
