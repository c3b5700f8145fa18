#include "qf/rt/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "qf/error.h"

namespace qf::rt {

Sampler::Sampler(const SamplingOptions& options) : o_(options), rng_(options.seed) {
  if (!(o_.temperature >= 0.0f) || !std::isfinite(o_.temperature)) {
    throw Error(Errc::kUsage,
                "temperature must be a finite number >= 0, got " + std::to_string(o_.temperature));
  }
  if (!(o_.top_p > 0.0f && o_.top_p <= 1.0f)) {
    throw Error(Errc::kUsage, "top-p must be in (0, 1], got " + std::to_string(o_.top_p));
  }
  if (o_.top_k < 0)
    throw Error(Errc::kUsage, "top-k must be >= 0, got " + std::to_string(o_.top_k));
}

int32_t Sampler::sample(std::span<const float> logits) {
  const int64_t n = static_cast<int64_t>(logits.size());
  if (o_.temperature == 0.0f) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + n) -
                                logits.begin());
  }
  ids_.resize(static_cast<size_t>(n));
  std::iota(ids_.begin(), ids_.end(), 0);
  const auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const int64_t k = o_.top_k > 0 ? std::min<int64_t>(o_.top_k, n) : n;
  std::partial_sort(ids_.begin(), ids_.begin() + k, ids_.end(), by_logit);
  ids_.resize(static_cast<size_t>(k));
  // Softmax at the temperature, in double over the survivors.
  probs_.resize(ids_.size());
  const double top = logits[ids_[0]];
  double sum = 0;
  for (size_t i = 0; i < ids_.size(); ++i) {
    probs_[i] = static_cast<float>(std::exp((logits[ids_[i]] - top) / o_.temperature));
    sum += probs_[i];
  }
  // Nucleus: the smallest prefix (by probability) whose mass reaches top_p.
  size_t keep = ids_.size();
  if (o_.top_p < 1.0f) {
    double mass = 0;
    for (size_t i = 0; i < ids_.size(); ++i) {
      mass += probs_[i] / sum;
      if (mass >= o_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += probs_[i];
  const double u = std::uniform_real_distribution<double>(0.0, kept)(rng_);
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += probs_[i];
    if (u < acc) return ids_[i];
  }
  return ids_[keep - 1];
}

}  // namespace qf::rt
