#include "qf/rt/generate.h"

#include <algorithm>
#include <chrono>

#include "qf/error.h"

namespace qf::rt {

GenerateResult generate(CpuEngine& engine, std::span<const int32_t> prompt,
                        const GenerateOptions& o, const std::function<void(int32_t)>& on_token) {
  if (prompt.empty()) throw Error(Errc::kUsage, "the prompt has no tokens");
  using clock = std::chrono::steady_clock;
  const int64_t vocab = engine.model().config().vocab_size;
  Sampler sampler(o.sampling);
  std::vector<float> logits(static_cast<size_t>(vocab));
  GenerateResult r;
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  engine.reset();
  const auto t0 = clock::now();
  for (size_t i = 0; i < prompt.size(); ++i) {
    engine.step(prompt[i], i + 1 == prompt.size() ? logits.data() : nullptr);
  }
  const auto t1 = clock::now();
  r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  r.finish_reason = "length";
  for (int64_t n = 0; n < o.max_tokens; ++n) {
    const int32_t id = sampler.sample(logits);
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), id) != o.stop_ids.end()) {
      r.finish_reason = "stop";
      break;
    }
    r.ids.push_back(id);
    on_token(id);
    if (n + 1 < o.max_tokens) engine.step(id, logits.data());
  }
  r.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return r;
}

}  // namespace qf::rt
