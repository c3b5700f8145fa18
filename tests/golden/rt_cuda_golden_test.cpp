// The CUDA engine against the CPU reference (itself equal to transformers) on every fixture and
// its hybrid + INT8-head build: logits at every prompt position and the MTP head's (argmax
// identical, max |diff| <= 5e-4 x max |logit|; 1e-4 on the tiny preset), transformers' logits
// too (1e-3), and 128 greedy tokens identical, also by speculative decoding (two-token verify
// passes) and after a batched prefill, whose logits at every position are held to the same
// bounds, as are the MTP head's after its batched prefill (prefill_with_mtp) and prompt scoring's
// rows (prefill_scored). Skips with a message where no GPU is usable.
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

namespace qf::rt {
namespace {

namespace fs = std::filesystem;
const fs::path kDir = QF_MODEL_GOLDEN_DIR;
constexpr int64_t kGreedy = 128;

std::vector<int32_t> prompt_of(const fs::path& reference) {
  const ckpt::SafetensorsFile f = ckpt::SafetensorsFile::open(reference);
  const auto v = f.view("prompt_ids").as<int32_t>();
  return {v.begin(), v.end()};
}

std::vector<float> logits_of(const fs::path& reference, const char* name = "logits") {
  const ckpt::SafetensorsFile f = ckpt::SafetensorsFile::open(reference);
  if (!f.find(name)) return {};
  const auto v = f.view(name).as<float>();
  return {v.begin(), v.end()};
}

double top_logit(const std::vector<float>& logits) {
  double top = 0;
  for (const float v : logits) top = std::max(top, static_cast<double>(std::fabs(v)));
  return top;
}

void expect_same(const std::vector<float>& want, const std::vector<float>& got, int64_t vocab,
                 double bound, const std::string& what) {
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
void expect_pairs_equal_steps(CudaEngine& gpu, const std::vector<int32_t>& prompt,
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
std::vector<float> prefill_logits(CudaEngine& e, const std::vector<int32_t>& prompt,
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
void expect_prefill(const Model& model, CudaEngine& gpu, const std::vector<int32_t>& prompt,
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
void expect_mtp_prefill(const Model& model, const std::vector<int32_t>& prompt,
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
void expect_rows(const std::vector<float>& c, int64_t vocab, const std::vector<TopLogits>& tops,
                 const std::vector<float>& picked, const std::vector<int32_t>& targets, double tol,
                 double& worst, const std::string& what) {
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
void expect_scored(const Model& model, const std::vector<int32_t>& prompt,
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

void check(const fs::path& model_dir, const fs::path& reference, const std::string& name) {
  const std::unique_ptr<Model> model = Model::load(model_dir);
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int32_t> prompt = prompt_of(reference);
  CudaOptions o;
  o.max_context = static_cast<int64_t>(prompt.size()) + kGreedy + 1;
  o.mtp = true;
  CudaEngine gpu(*model, o);
  ASSERT_EQ(gpu.has_mtp(), model->mtp().has_value()) << name;
  CpuEngine cpu(*model, 2);
  const size_t h = static_cast<size_t>(model->config().hidden_size), t_len = prompt.size();
  std::vector<float> g(t_len * vocab), c(t_len * vocab), gh(t_len * h);
  std::vector<float> g_mtp(gpu.has_mtp() ? (t_len - 1) * vocab : 0), c_mtp(g_mtp.size());
  // The MTP head right after each step, from the hidden state the step left on the device.
  for (size_t t = 0; t < t_len; ++t) {
    gpu.step(prompt[t], g.data() + t * vocab);
    cpu.step(prompt[t], c.data() + t * vocab);
    gpu.hidden(gh.data() + t * h);
    if (!gpu.has_mtp() || t + 1 == t_len) continue;
    gpu.mtp_step(prompt[t + 1], nullptr, g_mtp.data() + t * vocab);
    cpu.mtp_step(prompt[t + 1], cpu.hidden().data(), c_mtp.data() + t * vocab);
  }
  // Rounding differences, amplified over the prompt's recurrent steps: 3e-6 to 1.3e-4 on the
  // fixtures (H100); one INT4 code one step off moves logits by 9.3e-2 (rt_model_golden_test).
  expect_same(c, g, vocab, 5e-4, name + " cuda vs cpu");
  expect_same(logits_of(reference), g, vocab, 1e-3, name + " cuda vs transformers");
  if (gpu.has_mtp()) {
    expect_same(c_mtp, g_mtp, vocab, 5e-4, name + " mtp cuda vs cpu");
    const std::vector<float> want = logits_of(reference, "mtp_logits");
    ASSERT_EQ(want.size(), g_mtp.size()) << name << ": the reference's mtp_logits";
    expect_same(want, g_mtp, vocab, 1e-3, name + " mtp cuda vs transformers");
    // Again from the hidden states copied to the host, after a reset: the same bits.
    gpu.reset();
    std::vector<float> again(g_mtp.size());
    for (size_t t = 0; t + 1 < t_len; ++t) {
      gpu.step(prompt[t], nullptr);
      EXPECT_EQ(gpu.mtp_position(), static_cast<int64_t>(t));
      gpu.mtp_step(prompt[t + 1], gh.data() + t * h, again.data() + t * vocab);
    }
    EXPECT_EQ(std::memcmp(again.data(), g_mtp.data(), again.size() * sizeof(float)), 0)
        << name << ": mtp logits from host and device hidden states differ";
    expect_mtp_prefill(*model, prompt, g_mtp, name);
  }

  GenerateOptions greedy;
  greedy.max_tokens = kGreedy;
  const GenerateResult want = generate(cpu, prompt, greedy, [](int32_t) {});
  gpu.reset();
  const GenerateResult got =
      generate_with([&](int32_t token, float* logits) { return gpu.step(token, logits); }, vocab,
                    prompt, greedy, [](int32_t) {});
  EXPECT_EQ(got.ids, want.ids) << name << ": greedy continuations differ";
  expect_pairs_equal_steps(gpu, prompt, want.ids, name);
  expect_prefill(*model, gpu, prompt, c, g, want.ids, name);
  for (const int chunk : {1024, 3, 0}) {
    expect_scored(*model, prompt, c, nullptr, chunk, 5e-4,
                  name + " scored in passes of " + std::to_string(chunk));
    if (gpu.has_mtp()) {
      expect_scored(*model, prompt, c, &c_mtp, chunk, 5e-4,
                    name + " scored with MTP, passes of " + std::to_string(chunk));
    }
  }
  {  // An echoed prompt's logprobs (PrefixEngine::score: prefill_scored) against the CPU's rows
    GenerateOptions echo;
    echo.max_tokens = 8;
    echo.prompt_logprobs = 4;
    const PrefixEngine pe = prefix_engine(gpu);
    pe.reset();
    const GenerateResult e = generate_with(
        pe.step, vocab, prompt, echo, [](int32_t) {}, pe.prefill, 0, pe.top_step, pe.score);
    const std::vector<int32_t> first8(want.ids.begin(), want.ids.begin() + 8);
    EXPECT_EQ(e.ids, first8) << name << ": greedy after prompt logprobs";
    ASSERT_EQ(e.prompt_logprobs.size(), t_len - 1) << name;
    double worst = 0;
    for (size_t t = 0; t + 1 < t_len; ++t) {
      const TokenLogprobs want_lp = token_logprobs(
          std::span(c.data() + t * vocab, static_cast<size_t>(vocab)), prompt[t + 1], 4);
      const TokenLogprobs& lp = e.prompt_logprobs[t];
      EXPECT_EQ(lp.id, want_lp.id) << name;
      worst = std::max(worst, static_cast<double>(std::fabs(lp.logprob - want_lp.logprob)));
      ASSERT_EQ(lp.top.size(), 4u) << name;
      EXPECT_EQ(lp.top[0].first, want_lp.top[0].first) << name << " position " << t;
      for (size_t j = 0; j < 4; ++j) {
        worst = std::max(worst,
                         static_cast<double>(std::fabs(lp.top[j].second - want_lp.top[j].second)));
      }
    }
    EXPECT_LE(worst, 1e-3 * top_logit(c)) << name;
    std::printf("%-44s prompt logprobs max |diff| %.3g\n", name.c_str(), worst);
  }
  {  // without the MTP head, verify2 defers nothing and nothing can be rejected
    CudaOptions plain_o = o;
    plain_o.mtp = false;
    CudaEngine plain(*model, plain_o);
    expect_pairs_equal_steps(plain, prompt, want.ids, name + " (no MTP head)");
    int32_t top[2];
    plain.verify2(prompt.data(), top);
    EXPECT_THROW(plain.reject_last(), Error) << name;
    EXPECT_THROW(plain.advance(std::span(prompt.data(), 0), top, nullptr), Error) << name;
  }
  if (!gpu.has_mtp()) return;
  // Speculative decoding: the fixtures' random MTP heads draft (nearly all rejected: the rollback
  // path), then an oracle drafts the greedy tokens (all kept: the verify's second argmax).
  SpecStats st;
  const GenerateResult spec = generate_speculative(
      speculative_engine(gpu), prompt, greedy, [](int32_t) {}, &st);
  EXPECT_EQ(spec.ids, want.ids) << name << ": speculative continuation differs";
  std::printf("%-40s speculative: %lld rounds, %lld drafts kept\n", name.c_str(),
              static_cast<long long>(st.rounds), static_cast<long long>(st.accepted));
  SpecEngine oracle = speculative_engine(gpu);
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), want.ids.begin(), want.ids.end());
  size_t p = 0;
  test::use_oracle(oracle, seq, p, vocab);
  const GenerateResult kept = generate_speculative(
      oracle, prompt, greedy, [](int32_t) {}, &st);
  EXPECT_EQ(kept.ids, want.ids) << name << ": speculative continuation with kept drafts";
  EXPECT_EQ(st.accepted, st.rounds) << name;
  // Sampling at top-k 1 (every distribution one-hot): the greedy ids through the sampling path,
  // with the rows' top 1 selected on the device (verify2_top, draft_top) and with the verify's
  // and the head's logits copied back.
  GenerateOptions top1 = greedy;
  top1.sampling = {.temperature = 0.8f, .top_k = 1, .seed = 3};
  for (const bool tops : {true, false}) {
    SpecEngine e = speculative_engine(gpu);
    if (!tops) e.verify_top = nullptr, e.draft_top = nullptr;
    const GenerateResult s1 = generate_speculative(
        e, prompt, top1, [](int32_t) {}, nullptr);
    EXPECT_EQ(s1.ids, want.ids) << name << ": sampled speculative continuation at top-k 1"
                                << (tops ? ", top k on the device" : "");
    oracle = speculative_engine(gpu);
    test::use_oracle(oracle, seq, p, vocab);
    if (tops) {
      oracle.draft_top = [&](int row, int32_t next, int k, TopLogits& out) {
        std::vector<float> l(static_cast<size_t>(vocab));
        const int32_t id = oracle.draft(row, next, l.data());
        top_k_ids(l, k, out.ids);
        out.logits.assign(static_cast<size_t>(k), 0.0f);
        for (int j = 0; j < k; ++j) out.logits[j] = l[out.ids[j]];
        out.log_z = std::log(std::exp(1.0) + static_cast<double>(vocab - 1));
        return id;
      };
    } else {
      oracle.verify_top = nullptr, oracle.draft_top = nullptr;
    }
    const GenerateResult o1 = generate_speculative(
        oracle, prompt, top1, [](int32_t) {}, &st);
    EXPECT_EQ(o1.ids, want.ids) << name << ": sampled, with kept drafts";
    EXPECT_EQ(st.accepted, st.rounds) << name;
  }

  // Three tokens a pass (two drafts a round): the three steps' bits; a rollback of one or two
  // tokens, then steps, the bits of steps that never saw them; then the loop with the head's
  // drafts, the oracle's (all kept) and the oracle's with every third draft wrong (rounds that
  // keep one of two), greedy and sampled at top-k 1.
  {
    std::vector<float> three(3 * vocab), steps(3 * vocab), after(vocab), want_after(vocab);
    int32_t top3[3];
    gpu.reset();
    gpu.step(prompt[0], nullptr);
    gpu.verify(std::span(prompt.data() + 1, 3), top3, three.data());
    gpu.reset();
    gpu.step(prompt[0], nullptr);
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(gpu.step(prompt[1 + r], steps.data() + r * vocab), top3[r]) << name << " row " << r;
    }
    EXPECT_EQ(std::memcmp(three.data(), steps.data(), three.size() * sizeof(float)), 0)
        << name << ": a three-token verify's logits differ from three steps'";
    for (const int n : {1, 2}) {
      gpu.reset();
      gpu.step(prompt[0], nullptr);
      gpu.verify(std::span(prompt.data() + 1, 3), top3, nullptr);
      gpu.reject(n);
      EXPECT_EQ(gpu.position(), 4 - n) << name;
      gpu.step(prompt[4 - n], after.data());  // a token the rejected ones did not see
      gpu.step(prompt[5 - n], after.data());
      gpu.reset();
      for (int t = 0; t < 6 - n; ++t) gpu.step(prompt[t], want_after.data());
      EXPECT_EQ(std::memcmp(after.data(), want_after.data(), after.size() * sizeof(float)), 0)
          << name << ": steps after rejecting " << n << " of three tokens";
    }
    EXPECT_THROW(gpu.reject(1), Error) << name;
    gpu.verify(std::span(prompt.data(), 3), top3, nullptr);
    EXPECT_THROW(gpu.reject(3), Error) << name;
    EXPECT_THROW(gpu.verify(std::span(prompt.data(), 4), top3, nullptr), Error) << name;
    const GenerateResult s2 = generate_speculative(
        speculative_engine(gpu, 2), prompt, greedy, [](int32_t) {}, &st);
    EXPECT_EQ(s2.ids, want.ids) << name << ": two drafts a round";
    for (const int wrong_every : {0, 3}) {
      oracle = speculative_engine(gpu, 2);
      test::use_oracle(oracle, seq, p, vocab, wrong_every);
      const GenerateResult o2 = generate_speculative(
          oracle, prompt, greedy, [](int32_t) {}, &st);
      EXPECT_EQ(o2.ids, want.ids) << name << ": two drafts a round, oracle wrong every "
                                  << wrong_every;
      if (wrong_every == 0) {
        EXPECT_GE(st.accepted, st.drafted - 2) << name;
      } else {
        EXPECT_LT(st.accepted, st.drafted - 2) << name;
      }
      EXPECT_GT(st.accepted, 0) << name;
      oracle = speculative_engine(gpu, 2);
      test::use_oracle(oracle, seq, p, vocab, wrong_every);
      EXPECT_EQ(generate_speculative(
                    oracle, prompt, top1, [](int32_t) {}, nullptr)
                    .ids,
                want.ids)
          << name << ": sampled at top-k 1, two drafts a round, oracle wrong every " << wrong_every;
    }
    EXPECT_THROW(speculative_engine(gpu, 3), Error) << name;
  }

  gpu.reset();
  gpu.step(prompt[0], nullptr);  // a rollback is only for a verify's later tokens
  EXPECT_THROW(gpu.reject_last(), Error) << name;
}

// The logits of every prompt position, one engine stepping through the prompt.
template <class Engine>
std::vector<float> prompt_logits(Engine& e, const std::vector<int32_t>& prompt, int64_t vocab) {
  std::vector<float> out(prompt.size() * vocab);
  for (size_t t = 0; t < prompt.size(); ++t) e.step(prompt[t], out.data() + t * vocab);
  return out;
}

// A 4-layer tiny-preset checkpoint in `dir` (qforge synth; no vision tower, no MTP head unless
// `mtp`).
void synth_tiny(const fs::path& dir, const std::string& layout, int seed, bool mtp = false) {
  const test::CommandResult r = test::run_command(
      std::string(QF_BIN) + " synth " + dir.string() + " --preset tiny --layout " + layout +
      " --layers 4" + (mtp ? "" : " --no-mtp") + " --no-vision --seed " + std::to_string(seed));
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

// The tiny preset's hybrid (+ INT8 head, or INT4 with lm_head_bits 4) built in `dir` from a BF16
// synth of `seed`.
void tiny_hybrid(const fs::path& dir, int seed, bool mtp, std::unique_ptr<Model>& out,
                 int lm_head_bits = 8) {
  const fs::path src = dir / "tiny-bf16";
  ASSERT_NO_FATAL_FAILURE(synth_tiny(src, "bf16", seed, mtp));
  ASSERT_NO_FATAL_FAILURE(
      test::build_hybrid(QF_BIN, src, dir, Model::load(src)->config().vocab_size, lm_head_bits));
  out = Model::load(dir / "hybrid");
}

// n token ids spread over the vocabulary (a stride prime to it), from `offset`.
std::vector<int32_t> spread_tokens(size_t n, int64_t vocab, int64_t offset) {
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) {
    ids[i] = static_cast<int32_t>((static_cast<int64_t>(i) * 7919 + offset) % vocab);
  }
  return ids;
}

// kGreedy greedy tokens after `prompt` from both engines, reset first (the GPU's prompt by
// batched prefill): the same ids, else a failure naming `what`. Returns the CPU's.
std::vector<int32_t> expect_same_greedy(CpuEngine& cpu, CudaEngine& gpu,
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
void check_narrow_caches(const Model& model, const std::string& name, KvCacheType kv) {
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

class CudaGolden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  }
};

TEST_P(CudaGolden, Bf16ModelEqualsTheCpuReference) {
  check(kDir / GetParam() / "model", kDir / GetParam() / "reference.safetensors", GetParam());
}

TEST_P(CudaGolden, HybridEqualsTheCpuReference) {
  test::TempDir tmp;
  const fs::path src = kDir / GetParam() / "model";
  ASSERT_NO_FATAL_FAILURE(
      test::build_hybrid(QF_BIN, src, tmp.path(), Model::load(src)->config().vocab_size));
  check(tmp / "hybrid", kDir / GetParam() / "hybrid_reference.safetensors", GetParam() + " hybrid");
}

// The head_dim-256 fixture's hybrid build with bf16 KV caches: its decode steps run the
// tensor-core kernel (attention_decode_mma.cu), as Qwen3.5's shapes do. Not the hd-64 fixtures:
// they run the split kernel, which the tiny preset covers, and r4 amplifies the caches'
// single-ulp differences (attention_test: a k entry rounded either side of a midpoint) past the
// bound: its steps measured 1.1e-2 x max |logit| from the CPU's, whose own logits move 1.7e-2
// between bf16 and f32 caches (likely near-tied choices among its 16 experts; not traced).
void check_r2_hybrid_caches(KvCacheType kv) {
  std::string why;
  if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  const fs::path src = kDir / "r2-hd256-e8k3" / "model";
  ASSERT_NO_FATAL_FAILURE(
      test::build_hybrid(QF_BIN, src, tmp.path(), Model::load(src)->config().vocab_size));
  const std::unique_ptr<Model> model = Model::load(tmp / "hybrid");
  ASSERT_EQ(model->config().head_dim, 256);
  check_narrow_caches(
      *model, std::string("r2-hd256-e8k3 hybrid, ") + kv_cache_type_name(kv) + " KV caches", kv);
}
TEST(CudaGoldenR2, HybridWithBf16KvCachesEqualsTheCpuReference) {
  check_r2_hybrid_caches(KvCacheType::kBf16);
}
// The same with fp8 caches (the tensor-core decode's fp8 staging, the prefill's fp8 limbs).
TEST(CudaGoldenR2, HybridWithFp8KvCachesEqualsTheCpuReference) {
  check_r2_hybrid_caches(KvCacheType::kFp8);
}

// The fixtures' hidden sizes (64, 96) are no multiple of 128, so their experts keep gemv +
// swiglu; the tiny preset (hidden 256, expert inter 128) in intel-int4 loads its routed experts
// in kern::gemv_swiglu's paired row order. Fused and unfused engines must give the same bits
// (the epilogue computes what gemv + swiglu do), and both equal the CPU reference.
TEST(CudaGoldenTiny, PairedSwigluExpertsEqualUnfusedAndTheCpuReference) {
  std::string why;
  if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  const fs::path dir = tmp / "tiny-int4";
  ASSERT_NO_FATAL_FAILURE(synth_tiny(dir, "intel-int4", 3));
  const std::unique_ptr<Model> model = Model::load(dir);
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int32_t> prompt = {1, 17, 300, 5, 42, 99, 7, 250};
  CudaOptions o;
  o.max_context = 64;
  CudaEngine fused(*model, o);
  o.fused_swiglu = false;
  CudaEngine unfused(*model, o);
  CpuEngine cpu(*model, 2);
  const std::vector<float> f = prompt_logits(fused, prompt, vocab),
                           u = prompt_logits(unfused, prompt, vocab),
                           c = prompt_logits(cpu, prompt, vocab);
  EXPECT_EQ(std::memcmp(f.data(), u.data(), f.size() * sizeof(float)), 0)
      << "fused and unfused SwiGLU differ";
  expect_same(c, f, vocab, 1e-4, "tiny int4 paired cuda vs cpu");
  // Batched prefill: INT4 projections and experts through kern::gemm (grouped by gemm_route).
  expect_same(c, prefill_logits(fused, prompt, vocab), vocab, 1e-4, "tiny int4 paired prefill");
  expect_same(c, prefill_logits(unfused, prompt, vocab), vocab, 1e-4, "tiny int4 unfused prefill");
  o.fused_swiglu = true;
  o.prefill_chunk = 3;
  CudaEngine chunked(*model, o);
  expect_same(c, prefill_logits(chunked, prompt, vocab), vocab, 1e-4,
              "tiny int4 paired prefill, passes of 3");
}

// The tiny preset as a hybrid (INT4 experts in the paired order, FP8 shared experts): the shared
// expert as extra slots of the routed experts' launches (kern::gemv_moe) must take effect and
// equal the CPU reference, as the engine with its own launches does.
TEST(CudaGoldenTiny, SharedExpertInTheExpertLaunchesEqualsTheCpuReference) {
  std::string why;
  if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  const fs::path src = tmp / "tiny-bf16";
  ASSERT_NO_FATAL_FAILURE(synth_tiny(src, "bf16", 5));
  const std::unique_ptr<Model> bf16 = Model::load(src);
  ASSERT_NO_FATAL_FAILURE(test::build_hybrid(QF_BIN, src, tmp.path(), bf16->config().vocab_size));
  const std::unique_ptr<Model> model = Model::load(tmp / "hybrid");
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int32_t> prompt = {1, 17, 300, 5, 42, 99, 7, 250, 3, 11};
  CudaOptions o;
  o.max_context = 64;
  o.shared_in_experts = true;
  CudaEngine slots(*model, o);
  EXPECT_TRUE(slots.load_stats().shared_in_experts);
  o.shared_in_experts = false;
  CudaEngine own(*model, o);
  EXPECT_FALSE(own.load_stats().shared_in_experts);
  CpuEngine cpu(*model, 2);
  const std::vector<float> s = prompt_logits(slots, prompt, vocab),
                           w = prompt_logits(own, prompt, vocab),
                           c = prompt_logits(cpu, prompt, vocab);
  expect_same(c, s, vocab, 1e-4, "tiny hybrid shared in experts vs cpu");
  expect_same(c, w, vocab, 1e-4, "tiny hybrid shared launches vs cpu");
  // Batched prefill: INT4 and the FP8 shared expert ([256 x 256], [256 x 128]: shapes gemm_fp8
  // takes) through kern::gemm, the BF16 router as gemv slots.
  expect_same(c, prefill_logits(own, prompt, vocab), vocab, 1e-4, "tiny hybrid prefill vs cpu");
}

// A 1300-token prompt through batched prefill in passes of 1024 (the most tokens a pass that
// qforge bench measured) and of the default size: every position's logits against the CPU
// reference, through a second, partial pass and past the first pass's attention window.
TEST(CudaGoldenTiny, LongPromptInLargePassesEqualsTheCpuReference) {
  std::string why;
  if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  std::unique_ptr<Model> model;
  ASSERT_NO_FATAL_FAILURE(tiny_hybrid(tmp.path(), 9, false, model));
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int32_t> prompt = spread_tokens(1300, vocab, 13);
  CpuEngine cpu(*model, 2);
  const std::vector<float> c = prompt_logits(cpu, prompt, vocab);
  for (const int chunk : {1024, 256}) {
    CudaOptions o;
    o.max_context = static_cast<int64_t>(prompt.size()) + 1;
    o.prefill_chunk = chunk;
    CudaEngine gpu(*model, o);
    expect_same(c, prefill_logits(gpu, prompt, vocab), vocab, 5e-4,
                "tiny hybrid, 1300 tokens in passes of " + std::to_string(chunk));
    expect_scored(*model, prompt, c, nullptr, chunk, 5e-4,
                  "tiny hybrid, 1300 tokens scored in passes of " + std::to_string(chunk));
  }
}

// Prompt scoring with the MTP head on the tiny hybrid, whose main layers' experts are paired
// (INT4, kern::gemm) and whose MTP layer's are not (BF16, GEMV slots), as at 122B-A10B: 300
// tokens in passes of 1024 and of 128, every main and MTP row against the CPU's.
TEST(CudaGoldenTiny, ScoredWithMtpOnTheHybridEqualsTheCpuReference) {
  std::string why;
  if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  std::unique_ptr<Model> model;
  ASSERT_NO_FATAL_FAILURE(tiny_hybrid(tmp.path(), 17, true, model));
  ASSERT_TRUE(model->mtp());
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int32_t> prompt = spread_tokens(300, vocab, 29);
  CpuEngine cpu(*model, 2);
  std::vector<float> c(prompt.size() * vocab), c_mtp((prompt.size() - 1) * vocab);
  for (size_t t = 0; t < prompt.size(); ++t) {
    cpu.step(prompt[t], c.data() + t * vocab);
    if (t + 1 < prompt.size()) {
      cpu.mtp_step(prompt[t + 1], cpu.hidden().data(), c_mtp.data() + t * vocab);
    }
  }
  for (const int chunk : {1024, 128}) {
    expect_scored(*model, prompt, c, &c_mtp, chunk, 5e-4,
                  "tiny hybrid + MTP, 300 tokens scored in passes of " + std::to_string(chunk));
  }
}

// The tiny hybrid with an INT4 LM head (quantize-lm-head --bits 4: GPTQ 4-bit, group 128, so
// the INT4 GEMV, the INT4 GEMM in prompt scoring and whole INT4 tiles for a draft vocabulary):
// every position of a 300-token prompt by steps and by batched prefill, the MTP head's logits
// (all ids, then a draft vocabulary), prompt scoring with the MTP rows, and 128 greedy tokens,
// plain and speculative, against the CPU reference.
TEST(CudaGoldenTiny, Int4LmHeadEqualsTheCpuReference) {
  std::string why;
  if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  std::unique_ptr<Model> model;
  ASSERT_NO_FATAL_FAILURE(tiny_hybrid(tmp.path(), 41, true, model, 4));
  ASSERT_TRUE(model->mtp());
  ASSERT_EQ(model->lm_head().format(), "int4");
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int32_t> prompt = spread_tokens(300, vocab, 43);
  const size_t t_len = prompt.size();
  CpuEngine cpu(*model, 2);
  CudaOptions o;
  o.max_context = static_cast<int64_t>(t_len) + kGreedy + 1;
  o.mtp = true;
  CudaEngine gpu(*model, o);
  std::vector<float> c(t_len * vocab), g(c.size()), c_mtp((t_len - 1) * vocab), g_mtp(c_mtp.size());
  for (size_t t = 0; t < t_len; ++t) {
    cpu.step(prompt[t], c.data() + t * vocab);
    gpu.step(prompt[t], g.data() + t * vocab);
    if (t + 1 == t_len) continue;
    cpu.mtp_step(prompt[t + 1], cpu.hidden().data(), c_mtp.data() + t * vocab);
    gpu.mtp_step(prompt[t + 1], nullptr, g_mtp.data() + t * vocab);
  }
  expect_same(c, g, vocab, 5e-4, "tiny hybrid, INT4 head: steps");
  expect_same(c_mtp, g_mtp, vocab, 5e-4, "tiny hybrid, INT4 head: mtp");
  expect_same(c, prefill_logits(gpu, prompt, vocab), vocab, 5e-4,
              "tiny hybrid, INT4 head: prefill");
  expect_scored(*model, prompt, c, &c_mtp, 1024, 5e-4, "tiny hybrid, INT4 head: scored");

  const std::vector<int32_t> want = expect_same_greedy(cpu, gpu, prompt, "INT4 head");
  GenerateOptions greedy;
  greedy.max_tokens = kGreedy;
  const GenerateResult spec = generate_speculative(
      speculative_engine(gpu), prompt, greedy, [](int32_t) {}, nullptr);
  EXPECT_EQ(spec.ids, want) << "INT4 head: speculative continuation";

  // A draft vocabulary: the head's first n rows, whole INT4 tiles.
  const int64_t n = vocab / 4 / kMtpVocabStep * kMtpVocabStep;
  ASSERT_GE(n, kMtpVocabStep);
  cpu.reset();
  cpu.set_mtp_vocab(n);
  CudaOptions ov = o;
  ov.mtp_vocab = n;
  CudaEngine gv(*model, ov);
  std::vector<float> cv(static_cast<size_t>(vocab)), gvl(cv.size()), c_head, g_head;
  for (size_t t = 0; t + 1 < 64; ++t) {
    cpu.step(prompt[t], nullptr);
    gv.step(prompt[t], nullptr);
    cpu.mtp_step(prompt[t + 1], cpu.hidden().data(), cv.data());
    gv.mtp_step(prompt[t + 1], nullptr, gvl.data());
    c_head.insert(c_head.end(), cv.begin(), cv.begin() + n);
    g_head.insert(g_head.end(), gvl.begin(), gvl.begin() + n);
  }
  expect_same(c_head, g_head, n, 5e-4, "tiny hybrid, INT4 head: MTP drafts from [0, n)");
}

// The tiny hybrid with its MTP head (head_dim 64: the split kernel).
void check_tiny_hybrid_caches(KvCacheType kv) {
  std::string why;
  if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  std::unique_ptr<Model> model;
  ASSERT_NO_FATAL_FAILURE(tiny_hybrid(tmp.path(), 23, true, model));
  ASSERT_TRUE(model->mtp());
  check_narrow_caches(*model, std::string("tiny hybrid, ") + kv_cache_type_name(kv) + " KV caches",
                      kv);
}
TEST(CudaGoldenTiny, Bf16KvCacheEqualsTheCpuReferenceWithBf16Caches) {
  check_tiny_hybrid_caches(KvCacheType::kBf16);
}
TEST(CudaGoldenTiny, Fp8KvCacheEqualsTheCpuReferenceWithFp8Caches) {
  check_tiny_hybrid_caches(KvCacheType::kFp8);
}

// A draft vocabulary (CudaOptions::mtp_vocab) on the tiny hybrid's INT8 LM head: the MTP head's
// logits over [0, n) against the CPU engine's with the same vocabulary, -inf past n on the
// device as on the host; speculative decoding, greedy and through the sampling path at top-k 1
// (the head's top 1 selected on the device, and its logits copied back), gives the greedy ids.
// Prompt scoring's MTP rows and draft vocabularies that are not whole multiples of 128 are
// refused.
TEST(CudaGoldenTiny, MtpDraftVocabularyEqualsTheCpuReference) {
  std::string why;
  if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  std::unique_ptr<Model> model;
  ASSERT_NO_FATAL_FAILURE(tiny_hybrid(tmp.path(), 31, true, model));
  ASSERT_TRUE(model->mtp());
  const int64_t vocab = model->config().vocab_size;
  const int64_t n = vocab / 4 / kMtpVocabStep * kMtpVocabStep;
  ASSERT_GE(n, kMtpVocabStep);
  const std::vector<int32_t> prompt = spread_tokens(120, vocab, 37);
  CpuEngine cpu(*model, 2);
  cpu.set_mtp_vocab(n);
  CudaOptions o;
  o.max_context = static_cast<int64_t>(prompt.size()) + kGreedy + 1;
  o.mtp = true;
  o.mtp_vocab = n;
  CudaEngine gpu(*model, o);
  const size_t t_len = prompt.size(), un = static_cast<size_t>(n);
  std::vector<float> c(static_cast<size_t>(vocab)), g(c.size());
  std::vector<float> c_head((t_len - 1) * un), g_head(c_head.size());
  for (size_t t = 0; t + 1 < t_len; ++t) {
    cpu.step(prompt[t], nullptr);
    gpu.step(prompt[t], nullptr);
    cpu.mtp_step(prompt[t + 1], cpu.hidden().data(), c.data());
    gpu.mtp_step(prompt[t + 1], nullptr, g.data());
    std::copy(c.begin(), c.begin() + n, c_head.begin() + static_cast<int64_t>(t * un));
    std::copy(g.begin(), g.begin() + n, g_head.begin() + static_cast<int64_t>(t * un));
    for (int64_t i = n; i < vocab; ++i) {
      ASSERT_EQ(g[i], -std::numeric_limits<float>::infinity()) << "position " << t << ", id " << i;
    }
  }
  expect_same(c_head, g_head, n, 5e-4,
              "tiny hybrid, MTP drafts from [0, " + std::to_string(n) + ")");

  GenerateOptions greedy;
  greedy.max_tokens = kGreedy;
  cpu.reset();
  const GenerateResult want = generate(cpu, prompt, greedy, [](int32_t) {});
  SpecStats st;
  const GenerateResult spec = generate_speculative(
      speculative_engine(gpu), prompt, greedy, [](int32_t) {}, &st);
  EXPECT_EQ(spec.ids, want.ids) << "speculative continuation, draft vocabulary";
  std::printf("tiny hybrid, drafts from [0, %lld): %lld of %lld drafts kept\n",
              static_cast<long long>(n), static_cast<long long>(st.accepted),
              static_cast<long long>(st.rounds));
  GenerateOptions top1 = greedy;
  top1.sampling = {.temperature = 0.8f, .top_k = 1, .seed = 3};
  for (const bool tops : {true, false}) {
    SpecEngine e = speculative_engine(gpu);
    if (!tops) e.verify_top = nullptr, e.draft_top = nullptr;
    const GenerateResult s1 = generate_speculative(
        e, prompt, top1, [](int32_t) {}, nullptr);
    EXPECT_EQ(s1.ids, want.ids) << "sampled at top-k 1, draft vocabulary"
                                << (tops ? ", top k on the device" : "");
  }

  gpu.reset();
  const std::vector<int32_t> targets(prompt.begin() + 1, prompt.end());
  std::vector<int32_t> full_targets = targets, mtp_targets(prompt.begin() + 2, prompt.end());
  full_targets.push_back(0);
  mtp_targets.push_back(-1);
  std::vector<TopLogits> tops(t_len), mtp_tops(t_len - 1);
  std::vector<float> picked(t_len), mtp_picked(t_len - 1);
  EXPECT_THROW(gpu.prefill_scored_with_mtp(prompt, -1, full_targets, mtp_targets, 1, tops.data(),
                                           picked.data(), mtp_tops.data(), mtp_picked.data()),
               Error);
  for (const int64_t bad : {n + 1, kMtpVocabStep / 2, vocab + kMtpVocabStep, -n}) {
    CudaOptions b = o;
    b.mtp_vocab = bad;
    EXPECT_THROW({ CudaEngine e(*model, b); }, Error) << bad;
  }
}

// CudaEngine::step_top (the row's top k selected on the device) against step's whole row: the
// same ids and logit bits, the normalizer within 1e-5, and generation that samples (Qwen3.5's
// defaults, top-k 128 with min-p, top-k 5 with logprobs) or reports greedy logprobs choosing the
// same ids from the top k as from the row, seed for seed.
TEST(CudaGoldenTiny, TopStepChoosesAsTheWholeRow) {
  std::string why;
  if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  const fs::path dir = tmp / "tiny-int4";
  ASSERT_NO_FATAL_FAILURE(synth_tiny(dir, "intel-int4", 13));
  const std::unique_ptr<Model> model = Model::load(dir);
  const int64_t vocab = model->config().vocab_size;
  CudaOptions o;
  o.max_context = 128;
  CudaEngine a(*model, o), b(*model, o);
  std::vector<float> row(static_cast<size_t>(vocab));
  TopLogits top;
  for (const int32_t token : {1, 17, 300, 5, 42}) {
    const int32_t want = a.step(token, row.data());
    EXPECT_EQ(b.step_top(token, 20, top), want);
    std::vector<int32_t> ids;
    top_k_ids(row, 20, ids);
    EXPECT_EQ(top.ids, ids);
    for (size_t j = 0; j < ids.size(); ++j) EXPECT_EQ(top.logits[j], row[ids[j]]) << j;
    const TokenLogprobs lp = token_logprobs(row, ids[0], 1);
    EXPECT_NEAR(static_cast<double>(top.logits[0]) - top.log_z, lp.logprob, 1e-5);
  }
  EXPECT_THROW(b.step_top(1, 0, top), Error);
  EXPECT_THROW(b.step_top(1, 129, top), Error);
  EXPECT_THROW(b.step_top(static_cast<int32_t>(vocab), 20, top), Error);
  struct Case {
    SamplingOptions s;
    int logprobs;
  };
  for (const Case& c : {Case{{.temperature = 0.6f, .top_p = 0.95f, .top_k = 20, .seed = 1}, -1},
                        Case{{.temperature = 1.0f, .top_k = 128, .seed = 2, .min_p = 0.02f}, -1},
                        Case{{.temperature = 1.2f, .top_k = 5, .seed = 3}, 5}, Case{{}, 3}}) {
    GenerateOptions g;
    g.max_tokens = 48;
    g.sampling = c.s;
    g.logprobs = c.logprobs;
    std::vector<TokenLogprobs> want_lp, got_lp;
    const std::vector<int32_t> prompt = {1, 17, 300, 5, 42, 99, 7, 250};
    a.reset();
    g.on_logprobs = [&](const TokenLogprobs& t) { want_lp.push_back(t); };
    const GenerateResult want = generate_with([&](int32_t t, float* l) { return a.step(t, l); },
                                              vocab, prompt, g, [](int32_t) {});
    b.reset();
    g.on_logprobs = [&](const TokenLogprobs& t) { got_lp.push_back(t); };
    const GenerateResult got = generate_with(
        [&](int32_t t, float* l) { return b.step(t, l); }, vocab, prompt, g, [](int32_t) {}, {}, 0,
        [&](int32_t t, int k, TopLogits& out) { return b.step_top(t, k, out); });
    EXPECT_EQ(got.ids, want.ids) << "top-k " << c.s.top_k;
    ASSERT_EQ(got_lp.size(), want_lp.size());
    for (size_t i = 0; i < got_lp.size(); ++i) {
      EXPECT_NEAR(got_lp[i].logprob, want_lp[i].logprob, 1e-5) << i;
      ASSERT_EQ(got_lp[i].top.size(), want_lp[i].top.size());
      for (size_t j = 0; j < got_lp[i].top.size(); ++j) {
        EXPECT_EQ(got_lp[i].top[j].first, want_lp[i].top[j].first);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGolden, ::testing::ValuesIn(test::model_fixtures()),
                         test::fixture_test_name);

}  // namespace
}  // namespace qf::rt
