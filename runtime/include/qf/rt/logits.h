// What happens to a row of logits besides sampling: a request's logit bias and repetition
// penalties, applied before the Sampler sees the row, and the log-probabilities reported to a
// client, taken from the row as the model gave it.
//
// The formulas and their order are vLLM's (v1 sampler), so that a request means the same on
// both servers:
//   1. logit_bias: l[id] += bias;
//   2. repetition_penalty r, over every id in the prompt or generated so far:
//      l > 0 ? l / r : l * r;
//   3. frequency_penalty f and presence_penalty p, over the ids generated so far (the prompt
//      does not count): l -= f * count + p * (count > 0).
// Greedy choice takes the argmax of the processed row; sampling then applies the temperature,
// min-p, top-k and top-p (Sampler). Logprobs are log-softmax of the unprocessed row (vLLM's
// default "raw_logprobs" mode): what the model gave, whatever the request's sampling.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "qf/rt/sampler.h"

namespace qf::rt {

// The per-request state of steps 1-3: which ids the prompt holds and how often each id has
// been generated. Memory: 5 bytes a vocabulary id (1.2 MB for Qwen3.5), allocated only when a
// penalty is set.
class LogitsProcessor {
 public:
  // Throws Error(kUsage) for penalties out of range (presence and frequency in [-2, 2],
  // repetition > 0, all finite), a bias that is not finite or a biased id outside [0, vocab).
  LogitsProcessor(const SamplingOptions& options, int64_t vocab, std::span<const int32_t> prompt);

  // True when apply() would copy the row unchanged (no bias, no penalty).
  bool identity() const { return identity_; }
  // Counts the ids generated since the last call: `output` is every id generated so far (it
  // only grows; a rejected speculative draft is never in it).
  void sync(std::span<const int32_t> output);
  // out = the processed row (out.size() == row.size()).
  void apply(std::span<const float> row, std::span<float> out) const;

 private:
  SamplingOptions o_;
  bool identity_ = true;
  bool penalties_ = false;
  std::vector<uint8_t> in_prompt_;  // [vocab]
  std::vector<uint32_t> count_;     // [vocab] generated so far
  std::vector<int32_t> touched_;    // the ids in the prompt or generated, each once
  size_t synced_ = 0;
};

// The most alternatives a token's logprobs may list: OpenAI's top_logprobs limit, and vLLM's
// default max_logprobs.
constexpr int kMaxLogprobs = 20;

// One reported token's log-probability and the `n` most likely ids at its position, by
// decreasing log-probability (ties: lower id first).
struct TokenLogprobs {
  int32_t id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};

// The k most likely ids of a row of logits (by decreasing logit, then increasing id: top_k_ids'
// order) with their logits, and the row's log-normalizer: all that greedy choice, sampling with
// top-k <= k and logprobs of up to k alternatives need, without the whole row (a GPU engine
// selects them on the device: CudaEngine::step_top).
struct TopLogits {
  std::vector<int32_t> ids;
  std::vector<float> logits;
  double log_z = 0;  // log of the sum of exp(logit) over the whole row
};

// token_logprobs from `t`: `id` must be one of t.ids, n <= t.ids.size().
TokenLogprobs top_logprobs(const TopLogits& t, int32_t id, int n);

// log-softmax of `row` at `id`, and its top `n` (n >= 0). The normalizer is within 1e-7
// relative of the exact sum, so each logprob is within 1e-7 (plus f32 rounding) of log-softmax.
TokenLogprobs token_logprobs(std::span<const float> row, int32_t id, int n);

}  // namespace qf::rt
