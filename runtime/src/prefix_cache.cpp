#include "qf/rt/prefix_cache.h"

#include <algorithm>
#include <memory>

namespace qf::rt {

PrefixCache::Plan PrefixCache::plan(std::span<const int32_t> prompt) const {
  Plan p;
  // A whole-prefix match that leaves at least one token to run (its logits start generation).
  if (!kept_.empty() && kept_.size() <= prompt.size() && kept_position_ < prompt.size() &&
      std::equal(kept_.begin(), kept_.end(), prompt.begin())) {
    p.reuse = kept_position_;
  }
  // Before the last boundary where the prompt has one (a chat: the state there serves the next
  // turn, so a repeat of the prompt keeps it rather than moving past it); else before the last
  // token (a growing document moves it along).
  size_t at = prompt.size() - 1;
  for (size_t i = prompt.size(); i-- > 1;) {
    if (prompt[i] == boundary_) {
      at = i;
      break;
    }
  }
  p.snapshot_at = at > p.reuse ? at : 0;
  return p;
}

PrefixCache::Plan PrefixCache::begin(std::span<const int32_t> prompt, int64_t* cached_tokens,
                                     const std::function<void()>& reset,
                                     const std::function<void()>& restore) {
  const Plan p = plan(prompt);
  if (cached_tokens) *cached_tokens = static_cast<int64_t>(p.reuse);
  // A fresh start overwrites the KV rows the snapshot relies on (the CUDA engine's are not
  // copied), and a new snapshot replaces it: forget it until keep() says what it holds.
  if (p.reuse == 0 || p.snapshot_at > 0) kept_.clear();
  if (p.reuse > 0) {
    restore();
  } else {
    reset();
  }
  return p;
}

void PrefixCache::keep(std::span<const int32_t> prompt, size_t at, size_t lookahead) {
  kept_.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(at + lookahead));
  kept_position_ = at;
}

GenerateResult PrefixCache::generate(const PrefixEngine& e, std::span<const int32_t> prompt,
                                     const GenerateOptions& options,
                                     const std::function<void(int32_t)>& on_token,
                                     int64_t* cached_tokens) {
  if (prompt.empty()) {
    return generate_with(e.step, e.vocab, prompt, options, on_token, e.prefill, 0, e.top_step);
  }
  if (options.prompt_logprobs >= 0) {  // every position's row: no reuse, no snapshot
    kept_.clear();
    if (cached_tokens) *cached_tokens = 0;
    e.reset();
    return generate_with(e.step, e.vocab, prompt, options, on_token, e.prefill, 0, e.top_step,
                         e.score);
  }
  const Plan p = begin(prompt, cached_tokens, e.reset, e.restore);
  size_t done = p.reuse;
  if (p.snapshot_at > 0) {
    if (e.prefill && done < p.snapshot_at) {
      e.prefill(prompt.subspan(done, p.snapshot_at - done), nullptr);
      done = p.snapshot_at;
    }
    for (; done < p.snapshot_at; ++done) e.step(prompt[done], nullptr);
    e.snapshot();
    keep(prompt, done, 0);
  }
  // What follows leaves the snapshot as it is, whatever it throws (a stop string, a client gone).
  GenerateResult r =
      generate_with(e.step, e.vocab, prompt, options, on_token, e.prefill, done, e.top_step);
  r.cached_tokens = static_cast<int64_t>(p.reuse);
  return r;
}

GenerateResult PrefixCache::generate(const SpecPrefixEngine& e, std::span<const int32_t> prompt,
                                     const GenerateOptions& options,
                                     const std::function<void(int32_t)>& on_token,
                                     int64_t* cached_tokens, SpecStats* stats) {
  if (prompt.empty()) return generate_speculative(e.spec, prompt, options, on_token, stats);
  const Plan p = begin(prompt, cached_tokens, e.spec.reset, e.restore);
  SpecPrefill prefill;
  prefill.done = p.reuse;
  prefill.snapshot_at = p.snapshot_at;
  prefill.snapshot = [&] {
    e.snapshot();
    keep(prompt, p.snapshot_at, 1);  // the MTP head's last entry took prompt[snapshot_at]
  };
  GenerateResult r = generate_speculative(e.spec, prompt, options, on_token, stats, prefill);
  r.cached_tokens = static_cast<int64_t>(p.reuse);
  return r;
}

PrefixEngine prefix_engine(CpuEngine& engine) {
  auto kept = std::make_shared<SequenceState>();
  PrefixEngine e;
  e.vocab = engine.model().config().vocab_size;
  e.reset = [&engine] { engine.reset(); };
  e.snapshot = [&engine, kept] { *kept = engine.state(); };
  e.restore = [&engine, kept] { engine.state() = *kept; };
  e.step = cpu_step(engine);
  return e;
}

PrefixEngine prefix_engine(CudaEngine& engine) {
  PrefixEngine e;
  e.vocab = engine.config().vocab_size;
  e.reset = [&engine] { engine.reset(); };
  e.snapshot = [&engine] { engine.snapshot(); };
  e.restore = [&engine] { engine.restore_snapshot(); };
  e.step = [&engine](int32_t token, float* logits) { return engine.step(token, logits); };
  e.prefill = [&engine](std::span<const int32_t> t, float* logits) {
    return engine.prefill(t, logits);
  };
  e.top_step = [&engine](int32_t token, int k, TopLogits& out) {
    return engine.step_top(token, k, out);
  };
  e.score = [&engine](std::span<const int32_t> t, int n, std::vector<TokenLogprobs>& out,
                      float* logits) {
    std::vector<int32_t> targets(t.begin() + 1, t.end());
    targets.push_back(-1);
    std::vector<TopLogits> tops(t.size());
    std::vector<float> picked(t.size());
    const int32_t top =
        engine.prefill_scored(t, targets, std::max(n, 1), tops.data(), picked.data(), logits);
    for (size_t i = 0; i + 1 < t.size(); ++i) {
      TokenLogprobs lp;
      lp.id = targets[i];
      lp.logprob = static_cast<float>(picked[i] - tops[i].log_z);
      for (int j = 0; j < n; ++j) {
        lp.top.emplace_back(
            tops[i].ids[static_cast<size_t>(j)],
            static_cast<float>(tops[i].logits[static_cast<size_t>(j)] - tops[i].log_z));
      }
      out.push_back(std::move(lp));
    }
    return top;
  };
  return e;
}

// The plain PrefixEngine's snapshot and restore: the CPU engine's SequenceState holds the MTP
// head's cache and position; the CUDA engine's snapshot keeps its position.
SpecPrefixEngine speculative_prefix_engine(CpuEngine& engine, int drafts) {
  const PrefixEngine plain = prefix_engine(engine);
  return {plain.snapshot, plain.restore, speculative_engine(engine, drafts)};
}

SpecPrefixEngine speculative_prefix_engine(CudaEngine& engine, int drafts) {
  const PrefixEngine plain = prefix_engine(engine);
  return {plain.snapshot, plain.restore, speculative_engine(engine, drafts)};
}

}  // namespace qf::rt
