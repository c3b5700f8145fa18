// What the CUDA engine's golden tests share (rt_cuda_golden_test.cpp: the fixtures and their
// hybrid builds; rt_cuda_tiny_golden_test.cpp: the tiny preset's hybrids): the fixtures' files,
// comparisons of logits against a reference within a bound, the engine's prefill, MTP and
// prompt-scoring paths checked against steps or the CPU engine, and the tiny hybrids' builders.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "model_fixtures.h"
#include "qf/ckpt/safetensors.h"
#include "qf/error.h"
#include "qf/rt/cpu_engine.h"
#include "qf/rt/cuda_engine.h"
#include "qf/rt/generate.h"
#include "qf/rt/logits.h"
#include "qf/rt/mtp_vocab.h"
#include "qf/rt/prefix_cache.h"
#include "qf/rt/sampler.h"
#include "qf/rt/speculative.h"

namespace qf::rt::cuda_golden {

namespace fs = std::filesystem;
inline const fs::path kDir = QF_MODEL_GOLDEN_DIR;
inline constexpr int64_t kGreedy = 128;

inline std::vector<int32_t> prompt_of(const fs::path& reference) {
  const ckpt::SafetensorsFile f = ckpt::SafetensorsFile::open(reference);
  const auto v = f.view("prompt_ids").as<int32_t>();
  return {v.begin(), v.end()};
}

inline std::vector<float> logits_of(const fs::path& reference, const char* name = "logits") {
  const ckpt::SafetensorsFile f = ckpt::SafetensorsFile::open(reference);
  if (!f.find(name)) return {};
  const auto v = f.view(name).as<float>();
  return {v.begin(), v.end()};
}

inline double top_logit(const std::vector<float>& logits) {
  double top = 0;
  for (const float v : logits) top = std::max(top, static_cast<double>(std::fabs(v)));
  return top;
}

inline void expect_same(const std::vector<float>& want, const std::vector<float>& got,
                        int64_t vocab, double bound, const std::string& what) {
  ASSERT_EQ(want.size(), got.size());
  double diff = 0, top = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(want[i] - got[i])));
    top = std::max(top, static_cast<double>(std::fabs(want[i])));
  }
  for (size_t r = 0; r * vocab < want.size(); ++r) {
    const auto w = want.begin() + static_cast<int64_t>(r * vocab);
    const auto g = got.begin() + static_cast<int64_t>(r * vocab);
    EXPECT_EQ(std::max_element(w, w + vocab) - w, std::max_element(g, g + vocab) - g)
        << what << ": argmax differs at position " << r;
  }
  EXPECT_LE(diff / top, bound) << what;
  std::printf("%-44s max |diff| %.3g = %.3g x max |logit|\n", what.c_str(), diff, diff / top);
}

// verify2 (two tokens a pass) against steps: after a step, the pair's logits are two steps'
// bits, and prefilling the prompt in pairs gives the greedy ids `want`.
inline void expect_pairs_equal_steps(CudaEngine& gpu, const std::vector<int32_t>& prompt,
                                     const std::vector<int32_t>& want, const std::string& name) {
  const size_t v = static_cast<size_t>(gpu.config().vocab_size);
  std::vector<float> two(2 * v), one(2 * v);
  int32_t top[2];
  gpu.reset();
  gpu.step(prompt[0], nullptr);
  gpu.verify2(prompt.data() + 1, top, two.data());
  gpu.reset();
  gpu.step(prompt[0], nullptr);
  EXPECT_EQ(gpu.step(prompt[1], one.data()), top[0]) << name;
  EXPECT_EQ(gpu.step(prompt[2], one.data() + v), top[1]) << name;
  EXPECT_EQ(std::memcmp(two.data(), one.data(), two.size() * sizeof(float)), 0)
      << name << ": verify2's logits differ from two steps'";
  GenerateOptions greedy;
  greedy.max_tokens = static_cast<int64_t>(want.size());
  const PrefillFn pairs = [&](std::span<const int32_t> t, float*) {
    int32_t top2[2] = {0, 0};
    size_t i = 0;
    for (; i + 2 <= t.size(); i += 2) gpu.verify2(t.data() + i, top2);
    return i < t.size() ? gpu.step(t[i], nullptr) : top2[1];
  };
  for (const size_t len : {prompt.size(), prompt.size() - 1}) {  // even and odd lengths
    gpu.reset();
    const GenerateResult got = generate_with(
        [&](int32_t token, float* logits) { return gpu.step(token, logits); },
        static_cast<int64_t>(v), std::span(prompt.data(), len), greedy, [](int32_t) {}, pairs);
    if (len == prompt.size()) {
      EXPECT_EQ(got.ids, want) << name << ": greedy after a prefill in pairs differs";
    }
    EXPECT_EQ(gpu.position(), static_cast<int64_t>(len + got.ids.size()) - 1) << name;
  }
}

// Every position's logits by batched prefill (advance over the whole prompt, from a fresh
// state), its argmaxes checked against the logits it returned.
inline std::vector<float> prefill_logits(CudaEngine& e, const std::vector<int32_t>& prompt,
                                         int64_t vocab) {
  e.reset();
  std::vector<float> out(prompt.size() * vocab);
  std::vector<int32_t> top(prompt.size());
  e.advance(prompt, top.data(), out.data());
  for (size_t r = 0; r < prompt.size(); ++r) {
    const auto row = out.begin() + static_cast<int64_t>(r * vocab);
    EXPECT_EQ(top[r], std::max_element(row, row + vocab) - row) << "prefill's argmax, row " << r;
  }
  EXPECT_EQ(e.position(), static_cast<int64_t>(prompt.size()));
  return out;
}

// Batched prefill against the CPU's logits `c` and greedy ids `want`: in one pass and in passes
// of 3 (a captured pass replayed; the slot count can change a BF16 or FP8 product's summation
// order, so not bit for bit the one pass), CudaEngine::prefill's last row (the same bits as
// advance's on the same engine) and greedy continuation; without prefill buffers (pairs), the
// last row of the steps' logits `steps` bit for bit.
inline void expect_prefill(const Model& model, CudaEngine& gpu, const std::vector<int32_t>& prompt,
                           const std::vector<float>& c, const std::vector<float>& steps,
                           const std::vector<int32_t>& want, const std::string& name) {
  const int64_t vocab = model.config().vocab_size;
  expect_same(c, prefill_logits(gpu, prompt, vocab), vocab, 5e-4, name + " prefill cuda vs cpu");
  CudaOptions o;
  o.max_context = gpu.position() + static_cast<int64_t>(want.size()) + 1;
  o.prefill_chunk = 3;
  CudaEngine chunked(model, o);
  const std::vector<float> q = prefill_logits(chunked, prompt, vocab);
  expect_same(c, q, vocab, 5e-4, name + " prefill in passes of 3");
  std::vector<float> last(static_cast<size_t>(vocab));
  chunked.reset();
  const int32_t top = chunked.prefill(prompt, last.data());
  EXPECT_EQ(std::memcmp(last.data(), q.data() + q.size() - vocab, last.size() * sizeof(float)), 0)
      << name << ": prefill's last logits";
  EXPECT_EQ(top, std::max_element(last.begin(), last.end()) - last.begin()) << name;
  // Without prefill buffers: pairs (verify2), so the last logits are the steps' bits, for even
  // and odd lengths.
  o.prefill_chunk = 0;
  CudaEngine paired(model, o);
  for (const size_t len : {prompt.size(), prompt.size() - 1}) {
    paired.reset();
    const int32_t t = paired.prefill(std::span(prompt.data(), len), last.data());
    EXPECT_EQ(std::memcmp(last.data(), steps.data() + (len - 1) * vocab, last.size() * 4), 0)
        << name << ": prefill in pairs, length " << len;
    EXPECT_EQ(t, std::max_element(last.begin(), last.end()) - last.begin()) << name;
    EXPECT_EQ(paired.position(), static_cast<int64_t>(len)) << name;
    // step_greedy goes on from the last argmax (after a pair too: it was a stale token once).
    if (len == prompt.size() && want.size() > 1) {
      EXPECT_EQ(paired.step_greedy(), want[1]) << name;
    }
  }
  GenerateOptions greedy;
  greedy.max_tokens = static_cast<int64_t>(want.size());
  for (CudaEngine* e : {&gpu, &chunked}) {
    e->reset();
    const GenerateResult got = generate_with(
        [&](int32_t token, float* logits) { return e->step(token, logits); }, vocab, prompt, greedy,
        [](int32_t) {},
        [&](std::span<const int32_t> t, float* logits) { return e->prefill(t, logits); });
    EXPECT_EQ(got.ids, want) << name << ": greedy after a batched prefill differs";
  }
  chunked.reset();  // step_greedy goes on from the prefill's argmax
  EXPECT_EQ(chunked.prefill(prompt, nullptr), want[0]) << name;
  if (want.size() > 1) {
    EXPECT_EQ(chunked.step_greedy(), want[1]) << name;
  }
}

// prefill_with_mtp makes the MTP head's entries draft() makes, up to the order of the sums:
// after it, the head's logits at the prompt's last but one position are the step path's
// (`g_mtp`), in one pass, in passes of 3 and in pairs (no prefill buffers: draft()'s own bits),
// with the last token's entry left to draft() and with it made from `next`; and mtp_entries
// (speculative decoding's kept drafts) makes them from a verify's rows, one or two at a time.
inline void expect_mtp_prefill(const Model& model, const std::vector<int32_t>& prompt,
                               const std::vector<float>& g_mtp, const std::string& name) {
  const int64_t vocab = model.config().vocab_size;
  const size_t t_len = prompt.size();
  ASSERT_GE(t_len, 3u) << name;
  const std::vector<float> want(g_mtp.end() - vocab, g_mtp.end());  // position t_len - 2
  for (const int chunk : {1024, 3, 0}) {
    const std::string what = name + " MTP prefill in passes of " + std::to_string(chunk);
    CudaOptions o;
    o.max_context = static_cast<int64_t>(t_len) + 2;
    o.mtp = true;
    o.prefill_chunk = chunk;
    CudaEngine e(model, o);
    std::vector<float> d(static_cast<size_t>(vocab)), last(d.size());
    const int32_t top = e.prefill_with_mtp(std::span(prompt.data(), t_len - 1), -1, last.data());
    EXPECT_EQ(top, std::max_element(last.begin(), last.end()) - last.begin()) << what;
    EXPECT_EQ(e.mtp_position(), static_cast<int64_t>(t_len) - 2) << what;
    // The heads one position apart: refused, nothing consumed.
    EXPECT_THROW(e.prefill_with_mtp(std::span(prompt.data(), 1), -1, nullptr), Error) << what;
    e.draft(0, prompt[t_len - 1], d.data());
    EXPECT_EQ(e.mtp_position(), static_cast<int64_t>(t_len) - 1) << what;
    if (chunk == 0) {
      EXPECT_EQ(std::memcmp(d.data(), want.data(), d.size() * sizeof(float)), 0) << what;
    } else {
      expect_same(want, d, vocab, 5e-4, what);
    }
    e.reset();
    e.prefill_with_mtp(std::span(prompt.data(), t_len - 2), prompt[t_len - 2], nullptr);
    EXPECT_EQ(e.mtp_position(), static_cast<int64_t>(t_len) - 2) << what;
    e.step(prompt[t_len - 2], nullptr);
    e.draft(0, prompt[t_len - 1], d.data());
    expect_same(want, d, vocab, chunk == 0 ? 0.0 : 5e-4, what + ", next given");
    // The entries of a verify's first one or two rows by mtp_entries, the head's draft from the
    // row after them: the head at position t_len - 2 again.
    ASSERT_GE(t_len, 5u) << name;
    for (const int rows : {1, 2}) {
      const size_t at = t_len - 2 - static_cast<size_t>(rows);  // the verify's first position
      e.reset();
      e.prefill_with_mtp(std::span(prompt.data(), at), prompt[at], nullptr);
      int32_t top3[3];
      e.verify(std::span(prompt.data() + at, static_cast<size_t>(rows) + 1), top3, nullptr);
      e.mtp_entries(0, std::span(prompt.data() + at + 1, static_cast<size_t>(rows)));
      EXPECT_EQ(e.mtp_position(), static_cast<int64_t>(t_len) - 2) << what;
      e.draft(rows, prompt[t_len - 1], d.data());
      expect_same(want, d, vocab, chunk == 0 ? 0.0 : 5e-4,
                  what + ", " + std::to_string(rows) + " entries by mtp_entries");
    }
    EXPECT_THROW(e.mtp_entries(2, std::span(prompt.data(), 2)), Error) << what;
    // A token outside the vocabulary, even in a later pass, is refused before anything runs.
    e.reset();
    std::vector<int32_t> bad = prompt;
    bad.back() = static_cast<int32_t>(vocab);
    EXPECT_THROW(e.prefill_with_mtp(bad, -1), Error) << what;
    EXPECT_EQ(e.position(), 0) << what;
  }
}

// Rows reduced on the device (tops, picked: prefill_scored's) against the CPU's rows `c`: each
// row's log-normalizer, its top 5 (the argmax exactly; each logit that of its id; the fifth the
// CPU's fifth largest) and the target's logit within tol, NaN where the target is -1. The
// largest difference goes to `worst`.
inline void expect_rows(const std::vector<float>& c, int64_t vocab,
                        const std::vector<TopLogits>& tops, const std::vector<float>& picked,
                        const std::vector<int32_t>& targets, double tol, double& worst,
                        const std::string& what) {
  constexpr int k = 5;
  int bad = 0;
  const auto near = [&](double got, double want, const std::string& at) {
    worst = std::max(worst, std::fabs(got - want));
    if (!(std::fabs(got - want) <= tol) && ++bad <= 5) {
      ADD_FAILURE() << what << " " << at << ": gpu " << got << " cpu " << want;
    }
  };
  ASSERT_EQ(c.size(), tops.size() * vocab) << what;
  for (size_t r = 0; r < tops.size(); ++r) {
    const float* row = c.data() + r * vocab;
    const std::string at = "position " + std::to_string(r);
    const double m = *std::max_element(row, row + vocab);
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(row[i]) - m);
    near(tops[r].log_z, m + std::log(sum), at + " log-normalizer");
    ASSERT_EQ(tops[r].ids.size(), static_cast<size_t>(k)) << what;
    EXPECT_EQ(tops[r].ids[0], std::max_element(row, row + vocab) - row) << what << " " << at;
    for (int j = 0; j < k; ++j) near(tops[r].logits[j], row[tops[r].ids[j]], at + " top logit");
    std::vector<float> sorted(row, row + vocab);
    std::nth_element(sorted.begin(), sorted.begin() + k - 1, sorted.end(), std::greater<>());
    near(tops[r].logits[k - 1], sorted[k - 1], at + " fifth logit");
    if (targets[r] >= 0) {
      near(picked[r], row[targets[r]], at + " target's logit");
    } else {
      EXPECT_TRUE(std::isnan(picked[r])) << what;
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

// prefill_scored against the CPU's rows `c` (every position of `prompt`) within bound x max
// |logit| (expect_rows), the engine then where prefill leaves it; with `c_mtp` (the CPU's MTP
// rows, position t predicting t + 2) prefill_scored_with_mtp, its MTP rows too. Refused
// (nothing consumed): a target past the vocabulary, targets of another length, k 0.
inline void expect_scored(const Model& model, const std::vector<int32_t>& prompt,
                          const std::vector<float>& c, const std::vector<float>* c_mtp, int chunk,
                          double bound, const std::string& what) {
  const int64_t vocab = model.config().vocab_size;
  const size_t n = prompt.size();
  constexpr int k = 5;
  CudaOptions o;
  o.max_context = static_cast<int64_t>(n) + 1;
  o.prefill_chunk = chunk;
  o.mtp = c_mtp != nullptr;
  CudaEngine e(model, o);
  std::vector<int32_t> targets(prompt.begin() + 1, prompt.end()), mtp_targets;
  targets.push_back(-1);
  std::vector<TopLogits> tops(n), mtp_tops;
  std::vector<float> picked(n), last(static_cast<size_t>(vocab)), mtp_picked;
  int32_t top = 0;
  if (c_mtp) {
    mtp_targets.assign(prompt.begin() + 2, prompt.end());
    mtp_targets.push_back(-1);
    mtp_tops.resize(n - 1);
    mtp_picked.resize(n - 1);
    top = e.prefill_scored_with_mtp(prompt, -1, targets, mtp_targets, k, tops.data(), picked.data(),
                                    mtp_tops.data(), mtp_picked.data(), last.data());
    EXPECT_EQ(e.mtp_position(), static_cast<int64_t>(n) - 1) << what;
  } else {
    top = e.prefill_scored(prompt, targets, k, tops.data(), picked.data(), last.data());
  }
  EXPECT_EQ(e.position(), static_cast<int64_t>(n)) << what;
  EXPECT_EQ(top, std::max_element(last.begin(), last.end()) - last.begin()) << what;
  const double tol = bound * top_logit(c);
  double worst = 0;
  expect_rows(c, vocab, tops, picked, targets, tol, worst, what);
  if (c_mtp) expect_rows(*c_mtp, vocab, mtp_tops, mtp_picked, mtp_targets, tol, worst, what);
  std::printf("%-44s max |diff| %.3g = %.3g x max |logit|\n", what.c_str(), worst,
              worst / top_logit(c));
  // As prefill leaves it: the last logits its bits, step_greedy going on from their argmax.
  CudaEngine f(model, o);
  std::vector<float> want_last(last.size());
  f.prefill(prompt, want_last.data());
  EXPECT_EQ(std::memcmp(last.data(), want_last.data(), last.size() * sizeof(float)), 0) << what;
  EXPECT_EQ(e.step_greedy(), f.step_greedy()) << what;
  e.reset();
  std::vector<int32_t> wrong = targets;
  wrong[n / 2] = static_cast<int32_t>(vocab);
  EXPECT_THROW(e.prefill_scored(prompt, wrong, k, tops.data(), picked.data()), Error) << what;
  EXPECT_THROW(
      e.prefill_scored(prompt, std::span(targets.data(), n - 1), k, tops.data(), picked.data()),
      Error)
      << what;
  EXPECT_THROW(e.prefill_scored(prompt, targets, 0, tops.data(), picked.data()), Error) << what;
  if (c_mtp) {  // MTP targets one short
    EXPECT_THROW(
        e.prefill_scored_with_mtp(prompt, -1, targets, std::span(mtp_targets.data(), 1), k,
                                  tops.data(), picked.data(), mtp_tops.data(), mtp_picked.data()),
        Error)
        << what;
  }
  EXPECT_EQ(e.position(), 0) << what;
}

template <class Engine>
std::vector<float> prompt_logits(Engine& e, const std::vector<int32_t>& prompt, int64_t vocab) {
  std::vector<float> out(prompt.size() * vocab);
  for (size_t t = 0; t < prompt.size(); ++t) e.step(prompt[t], out.data() + t * vocab);
  return out;
}

// A 4-layer tiny-preset checkpoint in `dir` (qforge synth; no vision tower, no MTP head unless
// `mtp`).
inline void synth_tiny(const fs::path& dir, const std::string& layout, int seed, bool mtp = false) {
  const test::CommandResult r = test::run_command(
      std::string(QF_BIN) + " synth " + dir.string() + " --preset tiny --layout " + layout +
      " --layers 4" + (mtp ? "" : " --no-mtp") + " --no-vision --seed " + std::to_string(seed));
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

// The tiny preset's hybrid (+ INT8 head, or INT4 with lm_head_bits 4) built in `dir` from a BF16
// synth of `seed`.
inline void tiny_hybrid(const fs::path& dir, int seed, bool mtp, std::unique_ptr<Model>& out,
                        int lm_head_bits = 8) {
  const fs::path src = dir / "tiny-bf16";
  ASSERT_NO_FATAL_FAILURE(synth_tiny(src, "bf16", seed, mtp));
  ASSERT_NO_FATAL_FAILURE(
      test::build_hybrid(QF_BIN, src, dir, Model::load(src)->config().vocab_size, lm_head_bits));
  out = Model::load(dir / "hybrid");
}

// n token ids spread over the vocabulary (a stride prime to it), from `offset`.
inline std::vector<int32_t> spread_tokens(size_t n, int64_t vocab, int64_t offset) {
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) {
    ids[i] = static_cast<int32_t>((static_cast<int64_t>(i) * 7919 + offset) % vocab);
  }
  return ids;
}

// kGreedy greedy tokens after `prompt` from both engines, reset first (the GPU's prompt by
// batched prefill): the same ids, else a failure naming `what`. Returns the CPU's.
inline std::vector<int32_t> expect_same_greedy(CpuEngine& cpu, CudaEngine& gpu,
                                               const std::vector<int32_t>& prompt,
                                               const std::string& what) {
  GenerateOptions greedy;
  greedy.max_tokens = kGreedy;
  cpu.reset();
  const GenerateResult want = generate(cpu, prompt, greedy, [](int32_t) {});
  gpu.reset();
  const GenerateResult got = generate_with(
      [&](int32_t token, float* logits) { return gpu.step(token, logits); },
      gpu.config().vocab_size, prompt, greedy, [](int32_t) {},
      [&](std::span<const int32_t> t, float* logits) { return gpu.prefill(t, logits); });
  EXPECT_EQ(got.ids, want.ids) << what << ": greedy continuations differ";
  return want.ids;
}

// bf16 or fp8 KV caches (CudaOptions::kv_cache) on `model`, against the CPU reference with the
// same caches: every position of a 300-token prompt by steps (the decode kernel, its new row
// rounded as the cache holds it) and by batched prefill (the prefill kernels' reads), the MTP
// head's (its own cache) where the model has one, and 128 greedy tokens, with the bounds of the
// f32 caches (fp8: 2e-3, below); a verify's two and three rows, the steps' bits. The caches'
// rounding must show: the CPU's logits with them differ from its f32 ones.
// Why fp8's bound is wider: a k entry that the two engines compute an ulp of f32 apart can round
// to either side of a midpoint (attention_test), and an e4m3 ulp is 2^-3 of the entry against
// bf16's 2^-7. On the r2 hybrid the MTP head's logits measured 5.7e-4 x max |logit| from the
// CPU's, while its logits move 8.1e-3 between fp8 and f32 caches.
inline void check_narrow_caches(const Model& model, const std::string& name, KvCacheType kv) {
  const double bound = kv == KvCacheType::kFp8 ? 2e-3 : 5e-4;
  const int64_t vocab = model.config().vocab_size;
  const std::vector<int32_t> prompt = spread_tokens(300, vocab, 31);
  const bool mtp = model.mtp().has_value();
  CpuEngine cpu(model, 2, kv), cpu32(model, 2);
  CudaOptions o;
  o.max_context = static_cast<int64_t>(prompt.size()) + kGreedy + 1;
  o.mtp = mtp;
  o.kv_cache = kv;
  CudaEngine gpu(model, o);
  const size_t t_len = prompt.size();
  std::vector<float> c(t_len * vocab), g(t_len * vocab), c_mtp(mtp ? (t_len - 1) * vocab : 0),
      g_mtp(c_mtp.size());
  for (size_t t = 0; t < t_len; ++t) {
    cpu.step(prompt[t], c.data() + t * vocab);
    gpu.step(prompt[t], g.data() + t * vocab);
    if (!mtp || t + 1 == t_len) continue;
    cpu.mtp_step(prompt[t + 1], cpu.hidden().data(), c_mtp.data() + t * vocab);
    gpu.mtp_step(prompt[t + 1], nullptr, g_mtp.data() + t * vocab);
  }
  expect_same(c, g, vocab, bound, name + ": steps cuda vs cpu");
  if (mtp) expect_same(c_mtp, g_mtp, vocab, bound, name + ": mtp cuda vs cpu");
  expect_same(c, prefill_logits(gpu, prompt, vocab), vocab, bound, name + ": prefill cuda vs cpu");
  // A verify's rows through the narrow caches (attn_decode_rows on the decode's kernel): two and
  // three steps' bits, deep into the prompt.
  for (const size_t n : {size_t{2}, size_t{3}}) {
    const size_t at = t_len - n;
    std::vector<float> rows(n * vocab), steps(n * vocab);
    std::vector<int32_t> top(n);
    gpu.reset();
    for (size_t t = 0; t < at; ++t) gpu.step(prompt[t], nullptr);
    gpu.verify(std::span(prompt.data() + at, n), top.data(), rows.data());
    gpu.reset();
    for (size_t t = 0; t < at; ++t) gpu.step(prompt[t], nullptr);
    for (size_t r = 0; r < n; ++r) {
      EXPECT_EQ(gpu.step(prompt[at + r], steps.data() + r * vocab), top[r]) << name << " row " << r;
    }
    EXPECT_EQ(std::memcmp(rows.data(), steps.data(), rows.size() * sizeof(float)), 0)
        << name << ": a " << n << "-token verify's logits differ from the steps'";
  }

  const std::vector<float> c32 = prompt_logits(cpu32, prompt, vocab);
  double moved = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    moved = std::max(moved, static_cast<double>(std::fabs(c[i] - c32[i])));
  }
  moved /= top_logit(c32);
  std::printf("%-44s max |diff| %.3g x max |logit|\n", (name + ", cpu vs f32 KV").c_str(), moved);
  EXPECT_GT(moved, 1e-5) << name << ": the narrow caches changed nothing";

  expect_same_greedy(cpu, gpu, prompt, name);
}

}  // namespace qf::rt::cuda_golden
