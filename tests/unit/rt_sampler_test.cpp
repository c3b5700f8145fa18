// Sampling: greedy, top-k, top-p and temperature against their definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
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

TEST(Sampler, RejectsBadOptions) {
  EXPECT_EQ(test::error_code([] { Sampler({.temperature = -1.0f}); }), Errc::kUsage);
  EXPECT_EQ(test::error_code([] { Sampler({.temperature = NAN}); }), Errc::kUsage);
  EXPECT_EQ(test::error_code([] { Sampler({.top_p = 0.0f}); }), Errc::kUsage);
  EXPECT_EQ(test::error_code([] { Sampler({.top_p = 1.5f}); }), Errc::kUsage);
  EXPECT_EQ(test::error_code([] { Sampler({.top_k = -2}); }), Errc::kUsage);
}

}  // namespace
}  // namespace qf::rt
