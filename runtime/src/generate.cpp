#include "qf/rt/generate.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "qf/error.h"

namespace qf::rt {

bool report_token(GenerateResult& r, const GenerateOptions& o,
                  const std::function<void(int32_t)>& on_token, int32_t id) {
  if (std::find(o.stop_ids.begin(), o.stop_ids.end(), id) != o.stop_ids.end()) {
    r.finish_reason = "stop";
    return false;
  }
  r.ids.push_back(id);
  on_token(id);
  return static_cast<int64_t>(r.ids.size()) < o.max_tokens;
}

GenerateResult generate_with(const StepFn& step, int64_t vocab, std::span<const int32_t> prompt,
                             const GenerateOptions& o, const std::function<void(int32_t)>& on_token,
                             const PrefillFn& prefill) {
  if (prompt.empty()) throw Error(Errc::kUsage, "the prompt has no tokens");
  using clock = std::chrono::steady_clock;
  const bool greedy = o.sampling.temperature == 0.0f;
  Sampler sampler(o.sampling);
  const size_t v = static_cast<size_t>(vocab);
  std::vector<float> logits(greedy ? 0 : v);
  float* out = greedy ? nullptr : logits.data();
  GenerateResult r;
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  const auto t0 = clock::now();
  int32_t top = 0;
  const size_t n = prompt.size();
  if (prefill) {
    top = prefill(prompt, out);
  } else {
    for (size_t i = 0; i < n; ++i) top = step(prompt[i], i + 1 == n ? out : nullptr);
  }
  const auto t1 = clock::now();
  r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  r.finish_reason = "length";
  if (o.max_tokens > 0) {
    const std::span<const float> row(logits.data(), greedy ? 0 : v);
    int32_t id = greedy ? top : sampler.sample(row);
    while (report_token(r, o, on_token, id)) {
      top = step(id, out);
      id = greedy ? top : sampler.sample(row);
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
