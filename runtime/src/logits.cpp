#include "qf/rt/logits.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "qf/error.h"

namespace qf::rt {

namespace {

void check_penalty(const char* name, float v, float lo, float hi) {
  if (!(std::isfinite(v) && v >= lo && v <= hi)) {
    throw Error(Errc::kUsage, std::string(name) + " must be in [" + std::to_string(lo) + ", " +
                                  std::to_string(hi) + "], got " + std::to_string(v));
  }
}

}  // namespace

LogitsProcessor::LogitsProcessor(const SamplingOptions& o, int64_t vocab,
                                 std::span<const int32_t> prompt)
    : o_(o) {
  check_penalty("presence penalty", o.presence_penalty, -2.0f, 2.0f);
  check_penalty("frequency penalty", o.frequency_penalty, -2.0f, 2.0f);
  if (!(std::isfinite(o.repetition_penalty) && o.repetition_penalty > 0.0f)) {
    throw Error(Errc::kUsage, "repetition penalty must be a finite number > 0, got " +
                                  std::to_string(o.repetition_penalty));
  }
  for (const auto& [id, bias] : o.logit_bias) {
    if (id < 0 || id >= vocab) {
      throw Error(Errc::kUsage, "logit bias for id " + std::to_string(id) +
                                    ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
    if (!std::isfinite(bias)) {
      throw Error(Errc::kUsage, "logit bias for id " + std::to_string(id) + " is not finite");
    }
  }
  penalties_ =
      o.presence_penalty != 0.0f || o.frequency_penalty != 0.0f || o.repetition_penalty != 1.0f;
  identity_ = !penalties_ && o.logit_bias.empty();
  if (!penalties_) return;
  in_prompt_.assign(static_cast<size_t>(vocab), 0);
  count_.assign(static_cast<size_t>(vocab), 0);
  for (const int32_t id : prompt) {
    if (id < 0 || id >= vocab) continue;  // the engine refuses such a prompt
    if (!in_prompt_[id]) touched_.push_back(id);
    in_prompt_[id] = 1;
  }
}

void LogitsProcessor::sync(std::span<const int32_t> output) {
  if (!penalties_) return;
  for (; synced_ < output.size(); ++synced_) {
    const int32_t id = output[synced_];
    if (id < 0 || static_cast<size_t>(id) >= count_.size()) continue;
    if (count_[id]++ == 0 && !in_prompt_[id]) touched_.push_back(id);
  }
}

void LogitsProcessor::apply(std::span<const float> row, std::span<float> out) const {
  std::copy(row.begin(), row.end(), out.begin());
  for (const auto& [id, bias] : o_.logit_bias) out[id] += bias;
  if (!penalties_) return;
  const float r = o_.repetition_penalty;
  for (const int32_t id : touched_) {
    float& l = out[id];
    if (r != 1.0f) l = l > 0 ? l / r : l * r;
    const uint32_t c = count_[id];
    l -= o_.frequency_penalty * static_cast<float>(c) + (c > 0 ? o_.presence_penalty : 0.0f);
  }
}

TokenLogprobs token_logprobs(std::span<const float> row, int32_t id, int n) {
  const float max = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (const float l : row) sum += std::exp(static_cast<double>(l) - max);
  const double log_z = max + std::log(sum);
  const auto lp = [&](int32_t i) { return static_cast<float>(row[i] - log_z); };
  TokenLogprobs t;
  t.id = id;
  t.logprob = lp(id);
  std::vector<int32_t> ids;
  top_k_ids(row, std::min<int64_t>(n, static_cast<int64_t>(row.size())), ids);
  t.top.reserve(ids.size());
  for (const int32_t i : ids) t.top.emplace_back(i, lp(i));
  return t;
}

}  // namespace qf::rt
