// Sampling: greedy, top-k, top-p and temperature against their definitions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "qf/error.h"
#include "qf/rt/sampler.h"
#include "test_support.h"

namespace qf::rt {
namespace {

TEST(Sampler, GreedyTakesTheFirstMaximum) {
  Sampler s({});
  EXPECT_EQ(s.sample(std::vector<float>{0.5f, 2.0f, -1.0f, 2.0f}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{-3.0f}), 0);
}

TEST(Sampler, TopKOneIsGreedyAtAnyTemperature) {
  Sampler s({.temperature = 5.0f, .top_k = 1, .seed = 7});
  const std::vector<float> logits = {0.1f, 0.3f, 0.2f, -0.5f};
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.sample(logits), 1);
}

TEST(Sampler, SameSeedSameDraws) {
  const std::vector<float> logits = {0.0f, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
  Sampler a({.temperature = 1.0f, .seed = 42}), b({.temperature = 1.0f, .seed = 42});
  std::vector<int32_t> da, db;
  for (int i = 0; i < 200; ++i) {
    da.push_back(a.sample(logits));
    db.push_back(b.sample(logits));
  }
  EXPECT_EQ(da, db);
}

// Frequencies of 200k draws against softmax(logits / T): every bucket within 1% absolute.
TEST(Sampler, FrequenciesFollowTheTemperatureSoftmax) {
  const std::vector<float> logits = {1.0f, 0.0f, -1.0f, 2.0f};
  const float temp = 0.7f;
  Sampler s({.temperature = temp, .seed = 1});
  std::map<int32_t, int> count;
  const int n = 200000;
  for (int i = 0; i < n; ++i) ++count[s.sample(logits)];
  double z = 0;
  for (float l : logits) z += std::exp(l / temp);
  for (size_t i = 0; i < logits.size(); ++i) {
    const double want = std::exp(logits[i] / temp) / z;
    EXPECT_NEAR(count[static_cast<int32_t>(i)] / static_cast<double>(n), want, 0.01) << i;
  }
}

// Probabilities 0.5, 0.3, 0.15, 0.05: top-p 0.75 keeps exactly the first two, renormalized.
TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  Sampler s({.temperature = 1.0f, .top_p = 0.75f, .seed = 3});
  std::map<int32_t, int> count;
  const int n = 100000;
  for (int i = 0; i < n; ++i) ++count[s.sample(logits)];
  EXPECT_EQ(count[2] + count[3], 0);
  EXPECT_NEAR(count[0] / static_cast<double>(n), 0.625, 0.01);
}

// sample() is distribution() then draw(): the same seed, the same ids.
TEST(Sampler, SampleIsDrawFromDistribution) {
  const std::vector<float> logits = {0.3f, -1.0f, 2.0f, 0.5f, 0.5f, 1.1f, -0.2f};
  for (const SamplingOptions& o : {SamplingOptions{.temperature = 0.9f, .seed = 5},
                                   SamplingOptions{.temperature = 1.3f, .top_p = 0.8f, .seed = 6},
                                   SamplingOptions{.temperature = 0.6f, .top_k = 3, .seed = 7}}) {
    Sampler a(o), b(o);
    TokenDist d;
    b.distribution(logits, d);
    double sum = 0;
    for (const int32_t id : d.ids) sum += d.prob(id);
    EXPECT_NEAR(sum, 1.0, 1e-12);
    EXPECT_EQ(d.prob(99), 0.0);
    if (o.top_k == 3) {
      EXPECT_EQ(d.ids, (std::vector<int32_t>{2, 5, 3}));  // ties: the lower id first
    }
    for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(logits), b.draw(d));
  }
}

// The surviving ids of top-k are the k largest logits by decreasing value, ties by increasing
// id, whatever the path (a scan for k <= 256, a partial sort above), or every id in id order:
// against a full stable sort, on logits with many ties and lengths around the scan's 32-wide
// blocks.
TEST(Sampler, TopKTakesTheLargestInOrder) {
  std::mt19937_64 rng(21);
  for (const int n : {1, 17, 31, 32, 33, 100, 1000, 4099}) {
    for (const int levels : {3, 50, 100000}) {
      std::vector<float> logits(static_cast<size_t>(n));
      for (float& l : logits) l = static_cast<float>(rng() % levels) * 0.25f - 3.0f;
      std::vector<int32_t> order(logits.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
      for (const int k : {1, 2, 20, 256, 257, 5000}) {
        Sampler s({.temperature = 1.0f, .top_k = k});
        TokenDist d;
        s.distribution(logits, d);
        std::vector<int32_t> want(order.begin(), order.begin() + std::min(k, n));
        if (k >= n) std::sort(want.begin(), want.end());  // every id survives: in id order
        EXPECT_EQ(d.ids, want) << "n " << n << ", levels " << levels << ", k " << k;
      }
    }
  }
}

// Top-p over the whole vocabulary: the smallest prefix of the stable order by decreasing logit
// whose softmax mass reaches p, here ~1500 of 40000 ids (past the first sorted prefix of 256).
TEST(Sampler, TopPKeepsTheNucleusOfALargeVocabulary) {
  std::mt19937_64 rng(5);
  std::vector<float> logits(40000);
  for (size_t i = 0; i < logits.size(); ++i) {
    logits[i] = i % 13 == 0 ? 8.0f + 0.001f * static_cast<float>(i % 97)
                            : -static_cast<float>(rng() % 1000) / 1000.0f;
  }
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  for (const float top_p : {0.5f, 0.9f, 0.999f}) {
    double z = 0, mass = 0;
    for (const float l : logits) z += std::exp(static_cast<double>(l) - 8.096);
    size_t keep = 0;
    while (mass < top_p) mass += std::exp(static_cast<double>(logits[order[keep++]]) - 8.096) / z;
    Sampler s({.temperature = 1.0f, .top_p = top_p});
    TokenDist d;
    s.distribution(logits, d);
    EXPECT_EQ(d.ids, std::vector<int32_t>(order.begin(), order.begin() + keep)) << top_p;
    EXPECT_GT(keep, 256u);
  }
}

TokenDist dist_of(const std::vector<std::pair<int32_t, float>>& probs) {
  TokenDist d;
  for (const auto& [id, p] : probs) {
    d.ids.push_back(id);
    d.weights.push_back(p);
    d.total += p;
  }
  return d;
}

// resolve_draft over drafts drawn from q: the ids must follow p whatever q is. 200k draws; every
// probability within 0.005 absolute (over 5 standard deviations), and the share of drafts kept
// sum_x min(p(x), q(x)).
void expect_follows_p(const TokenDist& p, const TokenDist& q) {
  std::mt19937_64 rng(11);
  std::vector<double> qp;
  for (const int32_t id : q.ids) qp.push_back(q.prob(id));
  std::discrete_distribution<size_t> from_q(qp.begin(), qp.end());
  Sampler s({.temperature = 1.0f, .seed = 12});
  std::map<int32_t, int> count;
  int kept = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const int32_t draft = q.ids[from_q(rng)];
    const DraftChoice c = s.resolve_draft(p, q, draft);
    ++count[c.id];
    if (c.accepted) {
      EXPECT_EQ(c.id, draft);
      ++kept;
    }
  }
  double overlap = 0;
  for (int32_t id = 0; id < 64; ++id) {
    EXPECT_NEAR(count[id] / static_cast<double>(n), p.prob(id), 0.005) << "id " << id;
    overlap += std::min(p.prob(id), q.prob(id));
  }
  EXPECT_NEAR(kept / static_cast<double>(n), overlap, 0.005);
}

TEST(Sampler, ResolvedDraftsFollowTheTargetDistribution) {
  const TokenDist p = dist_of({{3, 0.5f}, {7, 0.3f}, {1, 0.15f}, {40, 0.05f}});
  expect_follows_p(p, dist_of({{7, 0.6f}, {3, 0.2f}, {9, 0.1f}, {1, 0.1f}}));  // overlapping
  expect_follows_p(p, dist_of({{2, 0.7f}, {63, 0.3f}}));                       // disjoint
  expect_follows_p(p, p);                                                      // all kept
  expect_follows_p(dist_of({{5, 1.0f}}), dist_of({{5, 0.25f}, {6, 0.75f}}));   // one-hot p
}

TEST(Sampler, RejectsBadOptions) {
  EXPECT_EQ(test::error_code([] { Sampler({.temperature = -1.0f}); }), Errc::kUsage);
  EXPECT_EQ(test::error_code([] { Sampler({.temperature = NAN}); }), Errc::kUsage);
  EXPECT_EQ(test::error_code([] { Sampler({.top_p = 0.0f}); }), Errc::kUsage);
  EXPECT_EQ(test::error_code([] { Sampler({.top_p = 1.5f}); }), Errc::kUsage);
  EXPECT_EQ(test::error_code([] { Sampler({.top_k = -2}); }), Errc::kUsage);
}

}  // namespace
}  // namespace qf::rt
