// Prompt scoring (CudaEngine::prefill_scored): the batched prefill's passes, and after each pass's
// layers the LM head over its rows kScoreRows at a time, each row reduced on the device to its
// top k, its log-normalizer (kern::logits_topk_rows) and the logit of the token that follows it
// (kern::logits_pick), so that only those cross to the host. The head is one kern::gemm where it
// takes the head (the INT8 head: its 764 MB at 122B-A10B read once per kScoreRows rows instead of
// once per row), else a GEMV slot per row. Without prefill buffers each token is a step with its
// row on the host, reduced there.
#include <algorithm>
#include <cmath>

#include "engine_impl.h"
#include "qf/kern/topk.h"

namespace qf::rt {

void CudaEngine::Impl::alloc_score() {
  if (sc.logits) return;
  const int64_t vocab = m->config.vocab_size;
  sc.logits = static_cast<float*>(m->alloc(static_cast<size_t>(kScoreRows * vocab) * 4));
  sc.top = static_cast<int*>(m->alloc(static_cast<size_t>(kScoreRows) * kTopSlot * 4));
  sc.targets = static_cast<int*>(m->alloc(static_cast<size_t>(kScoreRows) * 4));
  sc.picked = static_cast<float*>(m->alloc(static_cast<size_t>(kScoreRows) * 4));
  const size_t scratch = kern::logits_topk_rows_scratch_bytes(static_cast<int>(vocab), kScoreRows);
  sc.top_scratch = m->alloc(scratch);
  cuda::check(cudaMemset(sc.top_scratch, 0, scratch), "cudaMemset");
  cuda::check(cudaMallocHost(&sc.pinned, static_cast<size_t>(kScoreRows) * (kTopSlot + 2) * 4),
              "cudaMallocHost");
}

void CudaEngine::Impl::score_rows(const float* src, int r0, int n, const int32_t* targets, int k,
                                  TopLogits* tops, float* target_logits) {
  const int64_t vocab = m->config.vocab_size, h = m->config.hidden_size;
  int* pinned_targets = sc.pinned + kScoreRows * kTopSlot;
  float* pinned_picked = reinterpret_cast<float*>(pinned_targets + kScoreRows);
  std::copy(targets, targets + n, pinned_targets);
  cuda::check(cudaMemcpyAsync(sc.targets, pinned_targets, static_cast<size_t>(n) * 4,
                              cudaMemcpyHostToDevice, stream),
              "copy");
  gemm_rows(m->lm_head, src + r0 * h, static_cast<size_t>(h), sc.logits, static_cast<size_t>(vocab),
            n);
  float* vals = reinterpret_cast<float*>(sc.top + kern::kTopKMax);  // queue_top's slots
  cuda::check(
      kern::logits_topk_rows(sc.logits, static_cast<int>(vocab), static_cast<size_t>(vocab), n, k,
                             sc.top, vals, vals + kern::kTopKMax, kTopSlot, sc.top_scratch, stream),
      "logits_topk_rows");
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

namespace {

// A row of logits on the host reduced as score_rows reduces one on the device.
void reduce_on_host(const std::vector<float>& row, int k, int32_t target, TopLogits& top,
                    float& target_logit) {
  std::vector<int> ids(static_cast<size_t>(k));
  std::vector<float> vals(static_cast<size_t>(k));
  double stats[2];
  kern::logits_topk_ref(row.data(), static_cast<int>(row.size()), k, ids.data(), vals.data(),
                        stats);
  top.ids.assign(ids.begin(), ids.end());
  top.logits = vals;
  top.log_z = stats[0] + std::log(stats[1]);
  target_logit = target >= 0 ? row[static_cast<size_t>(target)] : NAN;
}

// Ids in [-1, vocab): every target, and with `tokens` every token in [0, vocab).
void check_ids(std::span<const int32_t> ids, int64_t vocab, bool token, const char* what) {
  for (const int32_t id : ids) {
    if (id < (token ? 0 : -1) || id >= vocab) {
      throw Error(Errc::kUsage, std::string(what) + " " + std::to_string(id) +
                                    " is outside the vocabulary [0, " + std::to_string(vocab) +
                                    ")" + (token ? "" : " and not -1"));
    }
  }
}

}  // namespace

int32_t CudaEngine::prefill_scored(std::span<const int32_t> tokens,
                                   std::span<const int32_t> targets, int k, TopLogits* tops,
                                   float* target_logits, float* logits) {
  if (tokens.empty()) throw Error(Errc::kUsage, "prefill_scored: no tokens");
  return score_tokens(tokens, targets, k, tops, target_logits, nullptr, {}, nullptr, nullptr,
                      logits);
}

int32_t CudaEngine::prefill_scored_with_mtp(std::span<const int32_t> tokens, int32_t next,
                                            std::span<const int32_t> targets,
                                            std::span<const int32_t> mtp_targets, int k,
                                            TopLogits* tops, float* target_logits,
                                            TopLogits* mtp_tops, float* mtp_target_logits,
                                            float* logits) {
  Impl& s = *impl_;
  s.check_mtp_prefill("prefill_scored_with_mtp", tokens.size());
  if (s.o.mtp_vocab > 0) {
    throw Error(Errc::kUsage,
                "prefill_scored_with_mtp scores the MTP head over the whole "
                "vocabulary; this engine's head drafts from " +
                    std::to_string(s.o.mtp_vocab) + " ids (CudaOptions::mtp_vocab)");
  }
  const size_t rows = tokens.size() - (next < 0 ? 1 : 0);
  if (mtp_targets.size() != rows) {
    throw Error(Errc::kUsage, "prefill_scored_with_mtp: " + std::to_string(mtp_targets.size()) +
                                  " MTP targets for " + std::to_string(rows) + " MTP rows");
  }
  const int64_t vocab = s.m->config.vocab_size;
  check_ids(std::span(&next, 1), vocab, false, "prefill_scored_with_mtp: the next token");
  std::vector<int32_t> after(tokens.begin() + 1, tokens.end());  // each token's next
  after.push_back(next);
  return score_tokens(tokens, targets, k, tops, target_logits, after.data(), mtp_targets, mtp_tops,
                      mtp_target_logits, logits);
}

int32_t CudaEngine::score_tokens(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                                 int k, TopLogits* tops, float* target_logits, const int32_t* after,
                                 std::span<const int32_t> mtp_targets, TopLogits* mtp_tops,
                                 float* mtp_target_logits, float* logits) {
  Impl& s = *impl_;
  const int64_t vocab = s.m->config.vocab_size;
  if (targets.size() != tokens.size()) {
    throw Error(Errc::kUsage, "prefill_scored: " + std::to_string(targets.size()) +
                                  " targets for " + std::to_string(tokens.size()) + " tokens");
  }
  Impl::check_top_k(k);
  // All checked first, so that a bad id in a later pass leaves nothing consumed.
  check_ids(tokens, vocab, true, "token id");
  check_ids(targets, vocab, false, "prefill_scored: target");
  check_ids(mtp_targets, vocab, false, "prefill_scored: MTP target");
  s.before_step(s.position + static_cast<int64_t>(tokens.size()) - 1);
  const size_t mtp_rows = after ? mtp_targets.size() : 0;
  if (s.pf.cap == 0) {  // no prefill buffers: steps (and MTP steps), rows reduced on the host
    std::vector<float> row(static_cast<size_t>(vocab)), mtp_row(row.size());
    int32_t top = 0;
    for (size_t i = 0; i < tokens.size(); ++i) {
      top = step(tokens[i], row.data());
      reduce_on_host(row, k, targets[i], tops[i], target_logits[i]);
      if (i >= mtp_rows) continue;
      mtp_step(after[i], nullptr, mtp_row.data());
      reduce_on_host(mtp_row, k, mtp_targets[i], mtp_tops[i], mtp_target_logits[i]);
    }
    if (logits) std::copy(row.begin(), row.end(), logits);
    return top;
  }
  s.alloc_score();
  for (size_t i = 0; i < tokens.size(); i += static_cast<size_t>(s.pf.cap)) {
    const int n = static_cast<int>(std::min<size_t>(tokens.size() - i, s.pf.cap));
    const int m = static_cast<int>(std::min<size_t>(n, mtp_rows - std::min(i, mtp_rows)));
    s.pass_layers(tokens.data() + i, n, after ? after + i : nullptr, m, true);
    s.mtp_position += m;
    // The MTP rows first: their outputs in pf.u (the main rows' scoring leaves it alone).
    for (int r = 0; r < m; r += Impl::kScoreRows) {
      const size_t at = i + static_cast<size_t>(r);
      s.score_rows(s.pf.u, r, std::min(Impl::kScoreRows, m - r), mtp_targets.data() + at, k,
                   mtp_tops + at, mtp_target_logits + at);
    }
    for (int r = 0; r < n; r += Impl::kScoreRows) {
      const size_t at = i + static_cast<size_t>(r);
      s.score_rows(s.pf.hidden, r, std::min(Impl::kScoreRows, n - r), targets.data() + at, k,
                   tops + at, target_logits + at);
    }
    s.head_row(n - 1);  // the last row as prefill leaves it (step_greedy goes on from it)
    s.pass_end(n);
  }
  if (after) s.upload_mtp_position();
  return s.last_argmax(logits);
}

}  // namespace qf::rt
