// The generation loop over an engine: prefill the prompt, then sample until a stop token or the
// token limit, reporting each new token as it is chosen (for streaming).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "qf/rt/cpu_engine.h"
#include "qf/rt/logits.h"
#include "qf/rt/sampler.h"

namespace qf::rt {

// A rule on which ids may come next (structured output: JsonConstraint, json_constraint.h). The
// generation loops give it every id they report, in order, and mask every row they choose from
// with it, before the request's bias and penalties; one object serves one generation.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  virtual void accept(int32_t id) = 0;                // `id` was generated
  virtual bool allows(int32_t id) const = 0;          // whether `id` may come next
  virtual void mask(std::span<float> row) const = 0;  // -inf at every id that may not
};

struct GenerateOptions {
  int64_t max_tokens = 256;
  SamplingOptions sampling;
  // Generation ends when one is chosen (it is not reported). Every row of the LM head may be
  // chosen, padding rows past the tokenizer's ids included, as transformers and vLLM do.
  std::vector<int32_t> stop_ids;
  // >= 0: each reported token's log-probability and its position's `logprobs` most likely ids
  // (logits.h) go to on_logprobs, just before on_token gets the id. -1: none.
  int logprobs = -1;
  std::function<void(const TokenLogprobs&)> on_logprobs;
  // Null: any id. Logprobs stay those of the unmasked row (vLLM's raw logprobs).
  std::shared_ptr<TokenConstraint> constraint;
  // >= 0: every prompt token after the first gets its log-probability under the position before
  // it and that position's `prompt_logprobs` most likely ids (GenerateResult::prompt_logprobs;
  // a completion's echoed prompt). The whole prompt then runs from a fresh state. -1: none.
  int prompt_logprobs = -1;
  // Called with them once the prompt is consumed, before the first token (streamed echo).
  std::function<void(const std::vector<TokenLogprobs>&)> on_prompt_logprobs;
};

struct GenerateResult {
  std::vector<int32_t> ids;   // generated, stop token excluded
  std::string finish_reason;  // "stop" or "length"
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens a kept state spared the engine (PrefixCache)
  // GenerateOptions::prompt_logprobs >= 0: prompt tokens 1 .. n - 1, in order.
  std::vector<TokenLogprobs> prompt_logprobs;
  double prefill_seconds = 0, decode_seconds = 0;
};

// Reports `id` of a generation to `r` and `on_token`, unless it is one of the stop ids (then
// r.finish_reason = "stop"); false when generation ends with it (a stop id, or max_tokens ids
// reported). `raw`: the unprocessed logits `id` was chosen from, for its logprobs (ignored
// unless options.logprobs >= 0). The generation loops' shared tail (generate_with,
// generate_speculative).
bool report_token(GenerateResult& r, const GenerateOptions& options,
                  const std::function<void(int32_t)>& on_token, int32_t id,
                  std::span<const float> raw = {});
// The same with the logprobs from the row's top ids (TopLogits).
bool report_token(GenerateResult& r, const GenerateOptions& options,
                  const std::function<void(int32_t)>& on_token, int32_t id, const TopLogits& top);

// How the generation loops choose each token from a row of logits: the request's bias and
// penalties (LogitsProcessor, given the ids generated so far), then greedy argmax or the
// Sampler. Throws Error(kUsage) for bad sampling options.
class TokenChooser {
 public:
  TokenChooser(const GenerateOptions& options, int64_t vocab, std::span<const int32_t> prompt);
  // False when the engine's argmax of the raw logits is the choice (greedy, no bias or penalty)
  // and no logprobs are asked: the loops then pass null logits, and a GPU engine copies none.
  bool needs_logits() const { return needs_logits_; }
  // When the row's top k ids and their logits (TopLogits) decide as the whole row would: the k
  // (1 .. kTopKCandidates) that the choice and the logprobs need, else 0. Nothing to process
  // (no bias, penalty or constraint), and top-k sampling or greedy choice with logprobs.
  int top_candidates() const { return top_candidates_; }
  bool greedy() const { return greedy_; }
  // The row as sampling sees it (the constraint's mask, bias and penalties applied); `raw`
  // itself when nothing applies, else a buffer that the next call overwrites.
  std::span<const float> process(std::span<const float> raw, std::span<const int32_t> output);
  int32_t choose(std::span<const float> raw, std::span<const int32_t> output);
  // choose() from the top top_candidates() ids of the raw row: the same id as from the row
  // (the Sampler sees the candidates' logits in the order it would visit them, draws the same
  // random number and maps the position back).
  int32_t choose(const TopLogits& top);
  // The Sampler's distribution of the processed row (temperature > 0).
  void distribution(std::span<const float> raw, std::span<const int32_t> output, TokenDist& out);
  // The same from the row's top top_candidates() ids: the same ids and weights in the same order.
  void distribution(const TopLogits& top, TokenDist& out);
  Sampler& sampler() { return sampler_; }

 private:
  // The row after bias and penalties, before the constraint's mask.
  std::span<const float> unmasked(std::span<const float> raw, std::span<const int32_t> output);
  // `row` (unmasked's) with the constraint's mask, in work_; the constraint synced first.
  std::span<const float> masked(std::span<const float> row);
  void sync_constraint(std::span<const int32_t> output);

  Sampler sampler_;
  LogitsProcessor processor_;
  std::shared_ptr<TokenConstraint> constraint_;
  size_t constrained_ = 0;  // output ids the constraint has been given
  bool greedy_, needs_logits_;
  int top_candidates_ = 0;
  std::vector<float> work_;
};

// One decode step of some engine: consume `token`, write the logits [vocab] when `logits` is not
// null, return their argmax.
using StepFn = std::function<int32_t(int32_t token, float* logits)>;

// The most candidates a TopStepFn is asked for (kern::kTopKMax, the CUDA engine's limit).
constexpr int kTopKCandidates = 128;

// A decode step that returns the logits' top `k` ids (TopLogits) instead of the whole row, where
// an engine selects them itself (CudaEngine::step_top); returns the argmax.
using TopStepFn = std::function<int32_t(int32_t token, int k, TopLogits& out)>;

// Many prompt tokens in one call, where an engine has a prefill (CudaEngine::prefill): consume
// `tokens` at the next positions, write the last one's logits [vocab] to `logits` when it is not
// null, return their argmax.
using PrefillFn = std::function<int32_t(std::span<const int32_t> tokens, float* logits)>;

// Prompt scoring, where an engine has it (CudaEngine::prefill_scored): consume `tokens` as a
// PrefillFn does, appending to `out` the logprobs of tokens[1 ..] (each under the row before
// it, with its `n` most likely ids); the last row's logits [vocab] to `logits` when not null;
// returns their argmax.
using ScoreFn = std::function<int32_t(std::span<const int32_t> tokens, int n,
                                      std::vector<TokenLogprobs>& out, float* logits)>;

// The loop over any engine, from a fresh state or one that has consumed prompt[0, done)
// already (PrefixCache; done < the prompt's length). Unless TokenChooser::needs_logits, it
// passes null logits, so an engine that computes the argmax on its device copies nothing back.
// With `prefill`, the prompt goes through it in one call; else step by step. With `top_step`,
// decode steps use it wherever TokenChooser::top_candidates says the top ids suffice. With
// options.prompt_logprobs >= 0 (done must be 0), the prompt goes through `score` where given,
// else step by step with every row on the host (prefill unused).
GenerateResult generate_with(const StepFn& step, int64_t vocab, std::span<const int32_t> prompt,
                             const GenerateOptions& options,
                             const std::function<void(int32_t)>& on_token,
                             const PrefillFn& prefill = {}, size_t done = 0,
                             const TopStepFn& top_step = {}, const ScoreFn& score = {});

// The CPU engine's step as a StepFn (its own logits buffer; the argmax on the host).
StepFn cpu_step(CpuEngine& engine);

// Starts from a fresh sequence state. on_token(id) runs for every generated id; throwing from it
// stops generation (the exception propagates). Throws Error(kUsage) for an empty prompt or ids
// outside the vocabulary.
GenerateResult generate(CpuEngine& engine, std::span<const int32_t> prompt,
                        const GenerateOptions& options,
                        const std::function<void(int32_t)>& on_token);

}  // namespace qf::rt
