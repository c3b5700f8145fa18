// Prompt scoring (CudaEngine::prefill_scored): the batched prefill's passes, and after each pass's
// layers the LM head over its rows kScoreRows at a time, each row reduced on the device to its
// top k, its log-normalizer (kern::logits_topk) and the logit of the token that follows it
// (kern::logits_pick), so that only those cross to the host. The head is one kern::gemm where it
// takes the head (the INT8 head: its 764 MB at 122B-A10B read once per kScoreRows rows instead of
// once per row), else a GEMV slot per row. Without prefill buffers each token is a step with its
// row on the host, reduced there.
#include <algorithm>
#include <cmath>

#include "engine_impl.h"
#include "qf/kern/lm_head.h"
#include "qf/kern/topk.h"

namespace qf::rt {

void CudaEngine::Impl::alloc_score() {
  if (sc.logits) return;
  const int64_t vocab = m->config.vocab_size;
  sc.logits = static_cast<float*>(m->alloc(static_cast<size_t>(kScoreRows * vocab) * 4));
  sc.top = static_cast<int*>(m->alloc(static_cast<size_t>(kScoreRows) * kTopSlot * 4));
  sc.targets = static_cast<int*>(m->alloc(static_cast<size_t>(kScoreRows) * 4));
  sc.picked = static_cast<float*>(m->alloc(static_cast<size_t>(kScoreRows) * 4));
  cuda::check(cudaMallocHost(&sc.pinned, static_cast<size_t>(kScoreRows) * (kTopSlot + 2) * 4),
              "cudaMallocHost");
}

void CudaEngine::Impl::score_rows(int r0, int n, const int32_t* targets, int k, TopLogits* tops,
                                  float* target_logits) {
  const int64_t vocab = m->config.vocab_size, h = m->config.hidden_size;
  int* pinned_targets = sc.pinned + kScoreRows * kTopSlot;
  float* pinned_picked = reinterpret_cast<float*>(pinned_targets + kScoreRows);
  std::copy(targets, targets + n, pinned_targets);
  cuda::check(cudaMemcpyAsync(sc.targets, pinned_targets, static_cast<size_t>(n) * 4,
                              cudaMemcpyHostToDevice, stream),
              "copy");
  gemm_rows(m->lm_head, pf.hidden + r0 * h, static_cast<size_t>(h), sc.logits,
            static_cast<size_t>(vocab), n);
  for (int r = 0; r < n; ++r) {  // one launch at a time on the scratch: stream order
    int* row_ids = sc.top + r * kTopSlot;
    float* vals = reinterpret_cast<float*>(row_ids + kern::kTopKMax);
    cuda::check(kern::logits_topk(sc.logits + r * vocab, static_cast<int>(vocab), k, row_ids, vals,
                                  vals + kern::kTopKMax, top_scratch, stream),
                "logits_topk");
  }
  cuda::check(kern::logits_pick(sc.logits, static_cast<int>(vocab), static_cast<size_t>(vocab),
                                sc.targets, n, sc.picked, stream),
              "logits_pick");
  cuda::check(cudaMemcpyAsync(sc.pinned, sc.top, static_cast<size_t>(n) * kTopSlot * 4,
                              cudaMemcpyDeviceToHost, stream),
              "copy");
  cuda::check(cudaMemcpyAsync(pinned_picked, sc.picked, static_cast<size_t>(n) * 4,
                              cudaMemcpyDeviceToHost, stream),
              "copy");
  cuda::check(cudaStreamSynchronize(stream), "scoring");
  read_top(sc.pinned, n, k, tops);
  std::copy(pinned_picked, pinned_picked + n, target_logits);
}

int32_t CudaEngine::prefill_scored(std::span<const int32_t> tokens,
                                   std::span<const int32_t> targets, int k, TopLogits* tops,
                                   float* target_logits, float* logits) {
  Impl& s = *impl_;
  const int64_t vocab = s.m->config.vocab_size;
  if (tokens.empty()) throw Error(Errc::kUsage, "prefill_scored: no tokens");
  if (targets.size() != tokens.size()) {
    throw Error(Errc::kUsage, "prefill_scored: " + std::to_string(targets.size()) +
                                  " targets for " + std::to_string(tokens.size()) + " tokens");
  }
  Impl::check_top_k(k);
  // All checked first, so that a bad id in a later pass leaves nothing consumed.
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      throw Error(Errc::kUsage, "token id " + std::to_string(tokens[i]) +
                                    " is outside the vocabulary [0, " + std::to_string(vocab) +
                                    ")");
    }
    if (targets[i] < -1 || targets[i] >= vocab) {
      throw Error(Errc::kUsage, "prefill_scored: target " + std::to_string(targets[i]) +
                                    " is outside the vocabulary [0, " + std::to_string(vocab) +
                                    ") and not -1");
    }
  }
  s.before_step(s.position + static_cast<int64_t>(tokens.size()) - 1);
  if (s.pf.cap == 0) {  // no prefill buffers: steps, each row reduced on the host
    std::vector<float> row(static_cast<size_t>(vocab));
    std::vector<int> ids(static_cast<size_t>(k));
    std::vector<float> vals(static_cast<size_t>(k));
    int32_t top = 0;
    for (size_t i = 0; i < tokens.size(); ++i) {
      top = step(tokens[i], row.data());
      double stats[2];
      kern::logits_topk_ref(row.data(), static_cast<int>(vocab), k, ids.data(), vals.data(), stats);
      tops[i].ids.assign(ids.begin(), ids.end());
      tops[i].logits = vals;
      tops[i].log_z = stats[0] + std::log(stats[1]);
      target_logits[i] = targets[i] >= 0 ? row[static_cast<size_t>(targets[i])] : NAN;
    }
    if (logits) std::copy(row.begin(), row.end(), logits);
    return top;
  }
  s.alloc_score();
  for (size_t i = 0; i < tokens.size(); i += static_cast<size_t>(s.pf.cap)) {
    const int n = static_cast<int>(std::min<size_t>(tokens.size() - i, s.pf.cap));
    s.pass_layers(tokens.data() + i, n, nullptr, 0);
    for (int r = 0; r < n; r += Impl::kScoreRows) {
      const size_t at = i + static_cast<size_t>(r);
      s.score_rows(r, std::min(Impl::kScoreRows, n - r), targets.data() + at, k, tops + at,
                   target_logits + at);
    }
    s.head_row(n - 1);  // the last row as prefill leaves it (step_greedy goes on from it)
    s.pass_end(n);
  }
  return s.last_argmax(logits);
}

}  // namespace qf::rt
