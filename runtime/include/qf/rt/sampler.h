// Next-token selection: greedy at temperature 0 (lowest id among equal maxima), otherwise
// top-k and min-p, then temperature softmax, then top-p (nucleus) over the survivors, drawn
// from a seeded generator so a seed reproduces a run. A request's bias and penalties are
// applied to the row before it gets here (logits.h). Speculative sampling's choice for a drafted
// token (resolve_draft) draws from the same generator.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace qf::rt {

struct SamplingOptions {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0: all
  uint64_t seed = 0;
  // [0, 1]: ids less likely than min_p times the most likely one are dropped (at the
  // temperature, before top-p; vLLM's order). 0: none.
  float min_p = 0.0f;
  // Applied to the logits by LogitsProcessor (logits.h), greedy choice included.
  float presence_penalty = 0.0f;                        // [-2, 2]
  float frequency_penalty = 0.0f;                       // [-2, 2]
  float repetition_penalty = 1.0f;                      // > 0; 1: none
  std::vector<std::pair<int32_t, float>> logit_bias{};  // (id, added to its logit)
};

// The k (<= l.size()) largest entries' ids into ids[0, k), by decreasing value, then
// increasing id.
void top_k_ids(std::span<const float> l, int64_t k, std::vector<int32_t>& ids);

// The distribution a sampling step draws from: the ids that survive top-k and top-p, with
// unnormalized weights exp((l - max) / T); by decreasing logit (ties: lower id first), except
// that when every id survives they are in id order.
struct TokenDist {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  double total = 0;  // the sum of weights, in double
  // The probability of `id` (0 outside the survivors).
  double prob(int32_t id) const;
};

// What resolve_draft chose: the draft (accepted) or a token drawn in its place.
struct DraftChoice {
  int32_t id = 0;
  bool accepted = false;
};

class Sampler {
 public:
  // Throws Error(kUsage) for a negative temperature, top_p outside (0, 1], negative top_k or
  // min_p outside [0, 1].
  explicit Sampler(const SamplingOptions& options);
  int32_t sample(std::span<const float> logits);

  // The distribution sample() draws from at temperature > 0 (Error(kUsage) at 0).
  void distribution(std::span<const float> logits, TokenDist& out);
  int32_t draw(const TokenDist& dist);
  // Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) for one draft drawn from q:
  // keep it with probability min(1, p(draft) / q(draft)), else draw from max(0, p - q)
  // renormalized. Whatever q is, the id returned is distributed as p.
  DraftChoice resolve_draft(const TokenDist& p, const TokenDist& q, int32_t draft);

 private:
  SamplingOptions o_;
  std::mt19937_64 rng_;
  std::vector<int32_t> ids_;
  TokenDist dist_;
  std::vector<double> q_dense_;  // resolve_draft: q by id
};

}  // namespace qf::rt
