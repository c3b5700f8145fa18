// Speculative decoding with the MTP head, over any engine: each round the MTP head drafts the
// token after the next one (and with SpecEngine::drafts = n > 1, n tokens, each later one from
// the head's own output and the draft before it, as vLLM applies Qwen's one MTP layer
// recursively), and one verify pass of the main model consumes the next token and the drafts
// together, so the main model runs once per round rather than once per token. The drafts are
// resolved in order; the first one not kept ends the round with the main model's own choice.
// - Greedy (temperature 0): the draft is kept when the main model's argmax after the next token
//   equals it; either way the round yields the main model's own argmaxes, so the ids equal plain
//   greedy decoding's.
// - Sampling: the draft is drawn from the MTP head's distribution q and kept or replaced by
//   Sampler::resolve_draft against the main model's p (the request's bias, penalties, top-k,
//   min-p, temperature and top-p applied to both, with the same ids before them), so every id
//   is distributed as plain sampling's. The same seed gives other ids than plain sampling: the
//   draws differ.
// - Greedy with a bias or penalties: the argmax of the processed rows, the draft's included;
//   the ids equal plain greedy decoding's with the same processing. Drafts after the first
//   are the head's raw argmax, or drawn from its raw row at the request's temperature, top-k,
//   top-p and min-p without bias, penalties or constraint (their state would need the drafts
//   before them as output): still exact, as p is resolved against the q each was drawn from.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "qf/rt/cpu_engine.h"
#include "qf/rt/cuda_engine.h"
#include "qf/rt/generate.h"

namespace qf::rt {

// What the loop needs of an engine. Positions are the main model's; the MTP head keeps its own
// (qwen35-architecture.md: at position t it takes the main model's final-normed hidden state at
// t and the token at t + 1, and predicts the token at t + 2).
struct SpecEngine {
  int64_t vocab = 0;
  // Drafts a round (1 .. kMaxDrafts): verify then takes up to drafts + 1 tokens.
  int drafts = 1;
  // Starts a fresh sequence (both the main model's and the MTP head's positions at 0).
  std::function<void()> reset;
  // Consumes tokens (one to drafts + 1) at the next positions and writes the argmax of each
  // position's logits to top[i], and the logits to logits[i * vocab, (i + 1) * vocab) when `logits`
  // is not null; keeps each position's hidden state for draft().
  std::function<void(std::span<const int32_t> tokens, int32_t* top, float* logits)> verify;
  // Forgets the last n tokens the last verify consumed (1 <= n < its tokens: their KV rows,
  // DeltaNet states and positions): rejected drafts.
  std::function<void(int n)> reject;
  // The MTP head at its next position on the hidden state of token `row` of the last verify and
  // `next_token`; returns the argmax of its logits and writes them [vocab] to `logits` when not
  // null.
  std::function<int32_t(int row, int32_t next_token, float* logits)> draft;
  // drafts > 1: the MTP head at its next position on its own last output (its final-normed
  // hidden state) and `next_token` (the draft before), as draft; and rewind(n), which takes its
  // position back by n (the entries those positions got from its own output are made again from
  // the main model's).
  std::function<int32_t(int32_t next_token, float* logits)> draft_chain;
  std::function<void(int n)> mtp_rewind;
  // Optional: the MTP head's entries at its next positions for rows first_row .. of the last
  // verify, tokens[i] the next token of row i, without its logits (CudaEngine::mtp_entries: a
  // fraction of a draft's cost). The kept drafts' positions; without it, draft per row.
  std::function<void(int first_row, std::span<const int32_t> tokens)> mtp_entries;
  // Optional: the prompt's way in. Consumes tokens (one or more) at the next positions and
  // makes the MTP head's entries for them, each with the token after it as the next (`next`
  // for the last; -1: none for the last). Returns the last token's argmax, writes its logits
  // [vocab] to `logits` when not null, and keeps its hidden state as row 0 for draft(). Without
  // it the loop feeds prompts through verify and draft.
  std::function<int32_t(std::span<const int32_t> tokens, int32_t next, float* logits)> prefill;
  // Optional, for an engine that selects the top k of its logits itself (CudaEngine): verify of
  // two tokens and draft with each row's top `k` (TopLogits) instead of the logits. The loop
  // uses them wherever TokenChooser::top_candidates says the top k decide.
  std::function<void(const int32_t tokens[2], int32_t top[2], int k, TopLogits out[2])> verify_top;
  std::function<int32_t(int row, int32_t next_token, int k, TopLogits& out)> draft_top;
};

inline constexpr int kMaxDrafts = 4;
inline constexpr int kMaxCudaDrafts = 2;  // CudaEngine::verify takes up to 3 tokens

struct SpecStats {
  int64_t rounds = 0;    // verify passes
  int64_t drafted = 0;   // drafts verified (rounds x drafts)
  int64_t accepted = 0;  // drafts kept
  int64_t mtp_steps = 0;
};

// Where a run's prompt starts and where it stops for a snapshot (PrefixCache). With done > 0
// the engine has consumed prompt[0, done) already, the MTP head included: its position is done,
// its last entry made with prompt[done] as the next token. At snapshot_at (done <
// snapshot_at < the prompt's length; 0: none) the engine is left in that state for `snapshot`.
struct SpecPrefill {
  size_t done = 0;
  size_t snapshot_at = 0;
  std::function<void()> snapshot;
};

// The loop, from a fresh engine state or the one `prefill` describes. The prompt goes through
// the engine's prefill (in two parts around the snapshot), or without one through verify two
// tokens at a time (the last alone when its length is odd, or before the snapshot). Every
// prompt position but the last also gets its MTP entry (the head's cache holds every position,
// as in a plain run of it), and so does every accepted draft. Throws Error(kUsage) for
// an empty prompt, a prefill past it or bad sampling options.
GenerateResult generate_speculative(const SpecEngine& engine, std::span<const int32_t> prompt,
                                    const GenerateOptions& options,
                                    const std::function<void(int32_t)>& on_token, SpecStats* stats,
                                    const SpecPrefill& prefill = {});

// Throws Error(kUsage) unless 1 <= drafts <= kMaxDrafts, naming the option `what`.
void check_drafts(int drafts, const char* what);

// The CPU reference engine as a SpecEngine drafting `drafts` tokens a round, reset to a fresh
// state (its model must have an MTP head: else Error(kUnsupported)); its prefill is steps then
// MTP steps, token by token. `engine` must outlive the result.
SpecEngine speculative_engine(CpuEngine& engine, int drafts = 1);
// The CUDA engine (CudaEngine::verify, reject, draft, draft_chain, mtp_rewind,
// prefill_with_mtp), reset; its MTP head must be loaded (CudaOptions::mtp): else
// Error(kUnsupported). Up to kMaxCudaDrafts drafts a round (more: Error(kUnsupported)).
SpecEngine speculative_engine(CudaEngine& engine, int drafts = 1);

}  // namespace qf::rt
