#include "qf/rt/generate.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "qf/error.h"

namespace qf::rt {

namespace {

// report_token with the logprobs from `logprobs()`, called only when they are asked for.
template <class Logprobs>
bool report(GenerateResult& r, const GenerateOptions& o,
            const std::function<void(int32_t)>& on_token, int32_t id, const Logprobs& logprobs) {
  if (std::find(o.stop_ids.begin(), o.stop_ids.end(), id) != o.stop_ids.end()) {
    r.finish_reason = "stop";
    return false;
  }
  r.ids.push_back(id);
  if (o.logprobs >= 0 && o.on_logprobs) o.on_logprobs(logprobs());
  on_token(id);
  return static_cast<int64_t>(r.ids.size()) < o.max_tokens;
}

}  // namespace

bool report_token(GenerateResult& r, const GenerateOptions& o,
                  const std::function<void(int32_t)>& on_token, int32_t id,
                  std::span<const float> raw) {
  return report(r, o, on_token, id, [&] { return token_logprobs(raw, id, o.logprobs); });
}

bool report_token(GenerateResult& r, const GenerateOptions& o,
                  const std::function<void(int32_t)>& on_token, int32_t id, const TopLogits& top) {
  return report(r, o, on_token, id, [&] { return top_logprobs(top, id, o.logprobs); });
}

TokenChooser::TokenChooser(const GenerateOptions& o, int64_t vocab, std::span<const int32_t> prompt)
    : sampler_(o.sampling),
      processor_(o.sampling, vocab, prompt),
      constraint_(o.constraint),
      greedy_(o.sampling.temperature == 0.0f),
      needs_logits_(!greedy_ || !processor_.identity() || o.logprobs >= 0 || constraint_) {
  if (o.logprobs > kMaxLogprobs) {
    throw Error(Errc::kUsage, "at most " + std::to_string(kMaxLogprobs) +
                                  " logprobs a token, asked for " + std::to_string(o.logprobs));
  }
  if (!processor_.identity() || constraint_) return;
  if (greedy_ && o.logprobs >= 0) top_candidates_ = std::max(o.logprobs, 1);
  // Top-k at least the vocabulary keeps every id, which the Sampler visits in id order.
  if (!greedy_ && o.sampling.top_k > 0 && o.sampling.top_k <= kTopKCandidates &&
      o.sampling.top_k < vocab) {
    top_candidates_ = std::max(o.sampling.top_k, o.logprobs);
  }
  if (top_candidates_ > vocab) top_candidates_ = 0;  // more logprobs than ids: the whole row
}

void TokenChooser::sync_constraint(std::span<const int32_t> output) {
  for (; constrained_ < output.size(); ++constrained_) constraint_->accept(output[constrained_]);
}

std::span<const float> TokenChooser::unmasked(std::span<const float> raw,
                                              std::span<const int32_t> output) {
  if (processor_.identity()) return raw;
  processor_.sync(output);
  work_.resize(raw.size());
  processor_.apply(raw, work_);
  return work_;
}

std::span<const float> TokenChooser::masked(std::span<const float> row) {
  if (row.data() != work_.data()) work_.assign(row.begin(), row.end());
  constraint_->mask(work_);
  return work_;
}

std::span<const float> TokenChooser::process(std::span<const float> raw,
                                             std::span<const int32_t> output) {
  if (!constraint_) return unmasked(raw, output);
  sync_constraint(output);
  return masked(unmasked(raw, output));
}

int32_t TokenChooser::choose(std::span<const float> raw, std::span<const int32_t> output) {
  const auto argmax = [](std::span<const float> row) {
    return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  };
  if (!constraint_) {
    const std::span<const float> row = unmasked(raw, output);
    return greedy_ ? argmax(row) : sampler_.sample(row);
  }
  sync_constraint(output);
  const std::span<const float> row = unmasked(raw, output);
  if (greedy_) {
    // The unmasked argmax is the masked one whenever the constraint allows it (the lowest id
    // of the maxima either way): no mask to build, the usual case.
    const int32_t best = argmax(row);
    return constraint_->allows(best) ? best : argmax(masked(row));
  }
  return sampler_.sample(masked(row));
}

int32_t TokenChooser::choose(const TopLogits& top) {
  if (greedy_) return top.ids.front();
  return top.ids[static_cast<size_t>(sampler_.sample(top.logits))];
}

void TokenChooser::distribution(const TopLogits& top, TokenDist& out) {
  sampler_.distribution(top.logits, out);
  for (int32_t& id : out.ids) id = top.ids[static_cast<size_t>(id)];
}

void TokenChooser::distribution(std::span<const float> raw, std::span<const int32_t> output,
                                TokenDist& out) {
  sampler_.distribution(process(raw, output), out);
}

GenerateResult generate_with(const StepFn& step, int64_t vocab, std::span<const int32_t> prompt,
                             const GenerateOptions& o, const std::function<void(int32_t)>& on_token,
                             const PrefillFn& prefill, size_t done, const TopStepFn& top_step,
                             const ScoreFn& score) {
  if (prompt.empty()) throw Error(Errc::kUsage, "the prompt has no tokens");
  if (done >= prompt.size()) {
    throw Error(Errc::kUsage, std::to_string(done) + " tokens done of a prompt of " +
                                  std::to_string(prompt.size()));
  }
  if (o.prompt_logprobs > kMaxLogprobs) {
    throw Error(Errc::kUsage, "prompt logprobs: " + std::to_string(o.prompt_logprobs) +
                                  " alternatives asked, at most " + std::to_string(kMaxLogprobs));
  }
  if (o.prompt_logprobs >= 0 && done > 0) {
    throw Error(Errc::kUsage, "prompt logprobs need the whole prompt, not the last " +
                                  std::to_string(prompt.size() - done) + " tokens");
  }
  using clock = std::chrono::steady_clock;
  TokenChooser chooser(o, vocab, prompt);
  const bool copy = chooser.needs_logits();
  const size_t v = static_cast<size_t>(vocab);
  std::vector<float> logits(copy ? v : 0);
  float* out = copy ? logits.data() : nullptr;
  GenerateResult r;
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  const auto t0 = clock::now();
  int32_t top = 0;
  const std::span<const int32_t> rest = prompt.subspan(done);
  if (o.prompt_logprobs >= 0 && score) {
    top = score(prompt, o.prompt_logprobs, r.prompt_logprobs, out);
  } else if (o.prompt_logprobs >= 0) {  // every row on the host
    std::vector<float> row(v);
    for (size_t i = 0; i < prompt.size(); ++i) {
      top = step(prompt[i], row.data());
      if (i + 1 < prompt.size()) {
        r.prompt_logprobs.push_back(token_logprobs(row, prompt[i + 1], o.prompt_logprobs));
      }
    }
    if (out) std::copy(row.begin(), row.end(), out);
  }
  if (o.prompt_logprobs >= 0) {
    if (o.on_prompt_logprobs) o.on_prompt_logprobs(r.prompt_logprobs);
  } else if (prefill) {
    top = prefill(rest, out);
  } else {
    for (size_t i = 0; i < rest.size(); ++i)
      top = step(rest[i], i + 1 == rest.size() ? out : nullptr);
  }
  const auto t1 = clock::now();
  r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  r.finish_reason = "length";
  if (o.max_tokens > 0) {
    const std::span<const float> row(logits);
    int32_t id = copy ? chooser.choose(row, r.ids) : top;
    const int k = top_step ? chooser.top_candidates() : 0;
    if (k > 0) {  // the first from the prefill's row, the rest from the engine's top k
      TopLogits tops;
      if (report_token(r, o, on_token, id, row)) {
        do {
          top_step(id, k, tops);
          id = chooser.choose(tops);
        } while (report_token(r, o, on_token, id, tops));
      }
    } else {
      while (report_token(r, o, on_token, id, row)) {
        top = step(id, out);
        id = copy ? chooser.choose(row, r.ids) : top;
      }
    }
  }
  r.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return r;
}

StepFn cpu_step(CpuEngine& engine) {
  auto logits =
      std::make_shared<std::vector<float>>(static_cast<size_t>(engine.model().config().vocab_size));
  return [&engine, logits](int32_t token, float* out) {
    engine.step(token, logits->data());
    if (out) std::copy(logits->begin(), logits->end(), out);
    return static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
  };
}

GenerateResult generate(CpuEngine& engine, std::span<const int32_t> prompt,
                        const GenerateOptions& o, const std::function<void(int32_t)>& on_token) {
  engine.reset();
  return generate_with(cpu_step(engine), engine.model().config().vocab_size, prompt, o, on_token);
}

}  // namespace qf::rt
