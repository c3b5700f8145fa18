// Prefix reuse across requests (qforge serve): one snapshot of the engine's sequence state,
// taken inside a prompt, lets a later prompt that starts with the same tokens skip them. The
// snapshot is taken before the prompt's last `boundary` token (the chat template's
// `<|im_start|>`, so before the generation prompt: the next turn of the conversation repeats
// everything up to there; a repeat of the prompt keeps it there), or, in a prompt without one,
// before its last token (a growing document moves it along). A DeltaNet layer's state is
// recurrent, so a snapshot serves only prompts that extend its whole prefix. Skipping tokens
// does not change a single bit of what follows: the engine is where it would be after consuming
// them (CudaEngine::verify2's logits are two steps' bits). With speculative decoding the
// snapshot holds the MTP head's state too, whose last entry was made with the token after the
// snapshot's position as its next token: that token is part of the prefix a prompt must repeat.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "qf/rt/cuda_engine.h"
#include "qf/rt/generate.h"
#include "qf/rt/speculative.h"

namespace qf::rt {

// What the cache needs of an engine. `snapshot` keeps the sequence state at the current position
// in the engine's one slot; `restore` returns to it; `reset` starts a fresh sequence.
struct PrefixEngine {
  std::function<void()> reset, snapshot, restore;
  StepFn step;
  PrefillFn prefill;   // may be empty
  TopStepFn top_step;  // may be empty
  ScoreFn score;       // may be empty
  int64_t vocab = 0;
};

// The same for speculative decoding (spec.reset starts a fresh sequence): the snapshot holds the
// MTP head's position and cache as well.
struct SpecPrefixEngine {
  std::function<void()> snapshot, restore;
  SpecEngine spec;
};

class PrefixCache {
 public:
  explicit PrefixCache(int32_t boundary) : boundary_(boundary) {}

  struct Plan {
    size_t reuse = 0;        // prompt tokens the kept snapshot covers (0: start afresh)
    size_t snapshot_at = 0;  // take the next snapshot after this many tokens (0: none)
  };
  Plan plan(std::span<const int32_t> prompt) const;

  // generate_with over `engine` from the snapshot where it covers a prefix of `prompt` (else
  // from a fresh state), taking the next snapshot on the way; result.cached_tokens, and
  // *cached_tokens (when not null) before the first token, say how many prompt tokens were
  // skipped. An exception before the snapshot is taken leaves the cache
  // empty; one after it (the token callback's, say) leaves the snapshot in place. With
  // options.prompt_logprobs >= 0 the whole prompt runs afresh (through engine.score where it
  // has one) and the snapshot is forgotten (its KV rows are overwritten).
  GenerateResult generate(const PrefixEngine& engine, std::span<const int32_t> prompt,
                          const GenerateOptions& options,
                          const std::function<void(int32_t)>& on_token,
                          int64_t* cached_tokens = nullptr);
  // The same with speculative decoding (generate_speculative); `stats` as there.
  GenerateResult generate(const SpecPrefixEngine& engine, std::span<const int32_t> prompt,
                          const GenerateOptions& options,
                          const std::function<void(int32_t)>& on_token,
                          int64_t* cached_tokens = nullptr, SpecStats* stats = nullptr);

 private:
  // Computes the plan, restores the snapshot (or resets) through the engine's hooks, and
  // forgets its tokens where they no longer hold.
  Plan begin(std::span<const int32_t> prompt, int64_t* cached_tokens,
             const std::function<void()>& reset, const std::function<void()>& restore);
  // Records a snapshot just taken after `at` tokens of `prompt` that depends on `lookahead`
  // more (1 with speculative decoding, above): a prompt must repeat them too to reuse it.
  void keep(std::span<const int32_t> prompt, size_t at, size_t lookahead);

  int32_t boundary_;
  std::vector<int32_t> kept_;  // the tokens the snapshot depends on (empty: none)
  size_t kept_position_ = 0;   // of them, those it has consumed
};

// The CPU engine (its snapshot a copy of its SequenceState) and the CUDA engine (its
// CudaOptions::snapshots must be on; two tokens a pass by verify2) as PrefixEngines, and as
// SpecPrefixEngines (speculative_engine's requirements too). `engine` must outlive the result.
PrefixEngine prefix_engine(CpuEngine& engine);
PrefixEngine prefix_engine(CudaEngine& engine);
SpecPrefixEngine speculative_prefix_engine(CpuEngine& engine, int drafts = 1);
SpecPrefixEngine speculative_prefix_engine(CudaEngine& engine, int drafts = 1);

}  // namespace qf::rt
