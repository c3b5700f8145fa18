// A request's logit bias and penalties (LogitsProcessor), min-p, and reported logprobs, against
// values worked out by hand from vLLM's formulas (logits.h) and from the definitions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "qf/error.h"
#include "qf/rt/generate.h"
#include "qf/rt/logits.h"
#include "qf/rt/sampler.h"
#include "top_logits.h"

namespace qf::rt {
namespace {

std::vector<float> processed(const LogitsProcessor& p, const std::vector<float>& row) {
  std::vector<float> out(row.size());
  p.apply(row, out);
  return out;
}

TEST(LogitsProcessor, NothingSetCopiesTheRow) {
  const LogitsProcessor p({}, 4, std::vector<int32_t>{0, 1});
  EXPECT_TRUE(p.identity());
  const std::vector<float> row = {1.5f, -2.0f, 0.0f, 7.0f};
  EXPECT_EQ(processed(p, row), row);
}

// Repetition 2 over the prompt's ids: positive logits halve, negative ones double, the others
// stay.
TEST(LogitsProcessor, RepetitionDividesPositiveAndMultipliesNegativeLogits) {
  LogitsProcessor p({.repetition_penalty = 2.0f}, 6, std::vector<int32_t>{1, 2, 1});
  EXPECT_FALSE(p.identity());
  const std::vector<float> row = {1.0f, 2.0f, -1.0f, 3.0f, -4.0f, 0.0f};
  EXPECT_EQ(processed(p, row), (std::vector<float>{1.0f, 1.0f, -2.0f, 3.0f, -4.0f, 0.0f}));
  p.sync(std::vector<int32_t>{4, 5});  // generated ids count for repetition too
  EXPECT_EQ(processed(p, row), (std::vector<float>{1.0f, 1.0f, -2.0f, 3.0f, -8.0f, 0.0f}));
}

// Frequency 0.5 and presence 0.25 over the generated ids only, after repetition 2:
//   id 3, generated twice: 3 / 2 - 0.5 * 2 - 0.25 = 0.25
//   id 4, generated once: -4 * 2 - 0.5 - 0.25 = -8.75
//   id 1, in the prompt only: 2 / 2 = 1 (the prompt does not count for frequency and presence)
TEST(LogitsProcessor, FrequencyAndPresenceCountGeneratedIdsOnly) {
  LogitsProcessor p(
      {.presence_penalty = 0.25f, .frequency_penalty = 0.5f, .repetition_penalty = 2.0f}, 6,
      std::vector<int32_t>{1});
  std::vector<int32_t> out = {3};
  p.sync(out);
  out.push_back(3);
  out.push_back(4);
  p.sync(out);
  p.sync(out);  // nothing new: no double count
  const std::vector<float> row = {1.0f, 2.0f, -1.0f, 3.0f, -4.0f, 0.5f};
  EXPECT_EQ(processed(p, row), (std::vector<float>{1.0f, 1.0f, -1.0f, 0.25f, -8.75f, 0.5f}));
}

// The bias comes first: id 2's -1 + 3 = 2 is positive when repetition divides it (1), and a
// negative presence penalty raises a generated id.
TEST(LogitsProcessor, BiasComesBeforeThePenalties) {
  LogitsProcessor p({.presence_penalty = -1.0f,
                     .repetition_penalty = 2.0f,
                     .logit_bias = {{2, 3.0f}, {0, -100.0f}}},
                    4, std::vector<int32_t>{2});
  p.sync(std::vector<int32_t>{1});
  const std::vector<float> row = {0.5f, 4.0f, -1.0f, 0.0f};
  EXPECT_EQ(processed(p, row), (std::vector<float>{-99.5f, 3.0f, 1.0f, 0.0f}));
  const LogitsProcessor bias_only({.logit_bias = {{3, 0.5f}}}, 4, std::vector<int32_t>{});
  EXPECT_FALSE(bias_only.identity());
  EXPECT_EQ(processed(bias_only, row), (std::vector<float>{0.5f, 4.0f, -1.0f, 0.5f}));
}

TEST(LogitsProcessor, RefusesBadOptions) {
  const std::vector<int32_t> none;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(LogitsProcessor({.presence_penalty = 2.5f}, 4, none), Error);
  EXPECT_THROW(LogitsProcessor({.frequency_penalty = -2.01f}, 4, none), Error);
  EXPECT_THROW(LogitsProcessor({.frequency_penalty = nan}, 4, none), Error);
  EXPECT_THROW(LogitsProcessor({.repetition_penalty = 0.0f}, 4, none), Error);
  EXPECT_THROW(LogitsProcessor({.logit_bias = {{4, 1.0f}}}, 4, none), Error);
  EXPECT_THROW(LogitsProcessor({.logit_bias = {{-1, 1.0f}}}, 4, none), Error);
  EXPECT_THROW(LogitsProcessor({.logit_bias = {{0, nan}}}, 4, none), Error);
  EXPECT_NO_THROW(LogitsProcessor({.presence_penalty = -2.0f,
                                   .frequency_penalty = 2.0f,
                                   .repetition_penalty = 0.5f,
                                   .logit_bias = {{3, -100.0f}}},
                                  4, none));
  EXPECT_THROW(Sampler({.min_p = 1.5f}), Error);
  EXPECT_THROW(Sampler({.min_p = -0.1f}), Error);
}

// Probabilities 0.5, 0.3, 0.15, 0.05. At T = 1, min-p 0.25 keeps p >= 0.125: the first three.
// At T = 2 the probabilities go as sqrt(p) (0.707, 0.548, 0.387, 0.224) and 0.25 * 0.707 =
// 0.177 keeps all four: the temperature comes before min-p. Min-p 1 keeps the top alone.
TEST(Sampler, MinPKeepsWhatIsLikelyEnoughAtTheTemperature) {
  const std::vector<float> row = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  TokenDist d;
  Sampler({.temperature = 1.0f, .min_p = 0.25f}).distribution(row, d);
  EXPECT_EQ(d.ids, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_NEAR(d.prob(0), 0.5 / 0.95, 1e-6);
  Sampler({.temperature = 2.0f, .min_p = 0.25f}).distribution(row, d);
  EXPECT_EQ(d.ids.size(), 4u);
  Sampler({.temperature = 1.0f, .top_k = 2, .min_p = 0.25f}).distribution(row, d);
  EXPECT_EQ(d.ids, (std::vector<int32_t>{0, 1}));  // top-k the shorter prefix
  Sampler({.temperature = 0.5f, .min_p = 1.0f}).distribution(row, d);
  EXPECT_EQ(d.ids, (std::vector<int32_t>{0}));
  // Top-p after min-p is over the survivors renormalized: 0.5 / 0.95 = 0.526 >= 0.5.
  Sampler({.temperature = 1.0f, .top_p = 0.5f, .min_p = 0.25f}).distribution(row, d);
  EXPECT_EQ(d.ids, (std::vector<int32_t>{0}));
}

// log-softmax by definition: logits log(p) + 5 give log(p) back; the top by decreasing
// probability, ties to the lower id.
TEST(Logprobs, AreLogSoftmaxOfTheRawRow) {
  const std::vector<double> p = {0.1, 0.2, 0.3, 0.2, 0.2};
  std::vector<float> row;
  for (const double x : p) row.push_back(static_cast<float>(std::log(x) + 5.0));
  const TokenLogprobs t = token_logprobs(row, 1, 3);
  EXPECT_EQ(t.id, 1);
  // f32 logits near 5 are within 2^-21 of log(p) + 5: so is each logprob (the normalizer is
  // exact to double rounding).
  EXPECT_NEAR(t.logprob, std::log(0.2), 1e-6);
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].first, 2);
  EXPECT_EQ(t.top[1].first, 1);
  EXPECT_EQ(t.top[2].first, 3);
  for (const auto& [id, lp] : t.top) EXPECT_NEAR(lp, std::log(p[id]), 1e-6) << id;
  EXPECT_TRUE(token_logprobs(row, 4, 0).top.empty());
  EXPECT_EQ(token_logprobs(row, 4, 20).top.size(), 5u);
}

// Against log-softmax in double over awkward sizes and the real vocabulary, logits spread
// over 60 nats and one far below the rest: within 2e-7 (the normalizer's bound) plus the f32
// rounding of the result.
TEST(Logprobs, MatchDoubleLogSoftmaxAtEverySize) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> u(-40.0f, 20.0f);
  for (const size_t n :
       {size_t{1}, size_t{3}, size_t{31}, size_t{511}, size_t{513}, size_t{4099}, size_t{248320}}) {
    std::vector<float> row(n);
    for (float& x : row) x = u(gen);
    if (n > 3) row[n / 2] = -1e4f;
    const float max = *std::max_element(row.begin(), row.end());
    double z = 0;
    for (const float x : row) z += std::exp(static_cast<double>(x) - max);
    const double log_z = max + std::log(z);
    for (const int32_t id :
         {int32_t{0}, static_cast<int32_t>(n / 2), static_cast<int32_t>(n - 1)}) {
      const double want = row[id] - log_z;
      const float got = token_logprobs(row, id, 0).logprob;
      EXPECT_NEAR(got, want, 2e-7 + std::fabs(want) * 6e-8) << "n " << n << ", id " << id;
    }
  }
}

// A toy engine whose logits favour repeating its last token: greedy repeats it forever, and a
// presence penalty of 2 (worked by hand below) moves on to the next best each time.
TEST(Generate, PenaltiesChangeGreedyChoicesAndLogprobsFollowTheRawRows) {
  constexpr int64_t kV = 5;
  std::vector<int32_t> seq;
  // Logits after `last`: 3 for last, 2 for last + 1, 0 otherwise (mod 5).
  const auto logits_after = [](int32_t last) {
    std::vector<float> l(kV, 0.0f);
    l[last] = 3.0f;
    l[(last + 1) % kV] = 2.0f;
    return l;
  };
  const StepFn step = [&](int32_t token, float* out) {
    seq.push_back(token);
    const std::vector<float> l = logits_after(token);
    if (out) std::copy(l.begin(), l.end(), out);
    return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  };
  GenerateOptions o;
  o.max_tokens = 4;
  const std::vector<int32_t> prompt = {0};
  EXPECT_EQ(generate_with(step, kV, prompt, o, [](int32_t) {}).ids,
            (std::vector<int32_t>{0, 0, 0, 0}));
  // Presence 2: once 0 is generated, 0 scores 3 - 2 = 1 against 1's 2, so 1 comes next; then
  // 1 scores 1 against 2's 2, so 2; and so on.
  o.sampling.presence_penalty = 2.0f;
  std::vector<TokenLogprobs> lps;
  o.logprobs = 1;
  o.on_logprobs = [&](const TokenLogprobs& t) { lps.push_back(t); };
  seq.clear();
  const GenerateResult r = generate_with(step, kV, prompt, o, [](int32_t) {});
  // The first choice sees no generated id: 0 (3) as without the penalty.
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2, 3}));
  ASSERT_EQ(lps.size(), 4u);
  for (size_t i = 0; i < lps.size(); ++i) {
    const int32_t last = i == 0 ? 0 : r.ids[i - 1];
    const TokenLogprobs want = token_logprobs(logits_after(last), r.ids[i], 1);
    EXPECT_EQ(lps[i].id, r.ids[i]);
    EXPECT_EQ(lps[i].logprob, want.logprob) << i;  // from the raw row, not the penalized one
    ASSERT_EQ(lps[i].top.size(), 1u);
    EXPECT_EQ(lps[i].top[0].first, last) << i;
  }
  o.logprobs = kMaxLogprobs + 1;
  EXPECT_THROW(generate_with(step, kV, prompt, o, [](int32_t) {}), Error);
}

// Decode steps that bring back only the row's top k (TopLogits, as CudaEngine::step_top) choose
// the same ids as the whole row, seed for seed, with the same logprobs: a toy engine whose rows
// are random, in steps of 1/4 so that equal logits are common, against the same engine's rows.
TEST(Generate, TopCandidatesChooseWhatTheWholeRowWould) {
  constexpr int64_t kV = 3000;
  const auto row_after = [](int32_t token) {
    std::mt19937_64 g(static_cast<uint64_t>(token) * 7919 + 1);
    std::normal_distribution<float> d(0.0f, 2.5f);
    std::vector<float> l(kV);
    for (float& x : l) x = std::round(d(g) * 4.0f) / 4.0f;
    return l;
  };
  const StepFn step = [&](int32_t token, float* out) {
    const std::vector<float> l = row_after(token);
    if (out) std::copy(l.begin(), l.end(), out);
    return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  };
  int top_calls = 0;
  const TopStepFn top_step = [&](int32_t token, int k, TopLogits& out) {
    ++top_calls;
    test::top_logits_of(row_after(token), k, out);
    return out.ids[0];
  };
  struct Case {
    SamplingOptions s;
    int logprobs;
  };
  const std::vector<Case> cases = {
      {{.temperature = 0.6f, .top_p = 0.95f, .top_k = 20, .seed = 1}, -1},  // Qwen3.5's default
      {{.temperature = 1.0f, .top_k = 1, .seed = 2}, -1},
      {{.temperature = 0.8f, .top_k = 128, .seed = 3, .min_p = 0.05f}, -1},
      {{.temperature = 1.3f, .top_p = 0.5f, .top_k = 5, .seed = 4}, 3},
      {{.temperature = 0.7f, .top_k = 3, .seed = 5}, 8},  // more alternatives than top-k keeps
      {{.temperature = 2.0f, .top_k = 40, .seed = 6}, 0},
      {{}, 5},  // greedy with logprobs
      {{}, 0},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    GenerateOptions o;
    o.max_tokens = 64;
    o.sampling = cases[c].s;
    o.logprobs = cases[c].logprobs;
    std::vector<TokenLogprobs> row_lps, top_lps;
    o.on_logprobs = [&](const TokenLogprobs& t) { row_lps.push_back(t); };
    const std::vector<int32_t> prompt = {7, 11};
    const GenerateResult want = generate_with(step, kV, prompt, o, [](int32_t) {});
    o.on_logprobs = [&](const TokenLogprobs& t) { top_lps.push_back(t); };
    top_calls = 0;
    const GenerateResult got = generate_with(
        step, kV, prompt, o, [](int32_t) {}, {}, 0, top_step);
    EXPECT_EQ(got.ids, want.ids) << "case " << c;
    ASSERT_EQ(want.ids.size(), 64u) << "case " << c;
    EXPECT_EQ(top_calls, 63) << "case " << c << ": the top path was not taken";
    ASSERT_EQ(top_lps.size(), row_lps.size()) << "case " << c;
    for (size_t i = 0; i < top_lps.size(); ++i) {
      EXPECT_EQ(top_lps[i].id, row_lps[i].id);
      EXPECT_NEAR(top_lps[i].logprob, row_lps[i].logprob, 1e-5) << "case " << c << ", " << i;
      ASSERT_EQ(top_lps[i].top.size(), row_lps[i].top.size());
      for (size_t j = 0; j < top_lps[i].top.size(); ++j) {
        EXPECT_EQ(top_lps[i].top[j].first, row_lps[i].top[j].first);
        EXPECT_NEAR(top_lps[i].top[j].second, row_lps[i].top[j].second, 1e-5);
      }
    }
  }
}

// Where the top ids cannot decide as the row would, the loops take the row.
TEST(Generate, TopCandidatesOnlyWhereTheyDecide) {
  const auto k = [](SamplingOptions s, int logprobs) {
    GenerateOptions o;
    o.sampling = s;
    o.logprobs = logprobs;
    return TokenChooser(o, 1000, std::vector<int32_t>{1}).top_candidates();
  };
  EXPECT_EQ(k({}, -1), 0);  // plain greedy: the engine's argmax, no copy at all
  EXPECT_EQ(k({}, 0), 1);
  EXPECT_EQ(k({}, 7), 7);
  EXPECT_EQ(k({.temperature = 1.0f, .top_k = 20}, -1), 20);
  EXPECT_EQ(k({.temperature = 1.0f, .top_k = 20}, 20), 20);
  EXPECT_EQ(k({.temperature = 1.0f, .top_k = 128}, -1), 128);
  EXPECT_EQ(k({.temperature = 1.0f, .top_k = 129}, -1), 0);   // more than an engine selects
  EXPECT_EQ(k({.temperature = 1.0f}, -1), 0);                 // top-k off: the whole row
  EXPECT_EQ(k({.temperature = 1.0f, .top_k = 1000}, -1), 0);  // the whole vocabulary
  EXPECT_EQ(k({.temperature = 1.0f, .top_k = 20, .presence_penalty = 0.5f}, -1), 0);
  EXPECT_EQ(k({.temperature = 1.0f, .top_k = 20, .logit_bias = {{3, 1.0f}}}, -1), 0);
  EXPECT_EQ(k({.repetition_penalty = 1.1f}, 3), 0);
  // More alternatives than the vocabulary has ids: the whole row, which lists them all.
  GenerateOptions few;
  few.logprobs = 5;
  EXPECT_EQ(TokenChooser(few, 4, std::vector<int32_t>{1}).top_candidates(), 0);
  EXPECT_EQ(TokenChooser(few, 5, std::vector<int32_t>{1}).top_candidates(), 5);
}

}  // namespace
}  // namespace qf::rt
