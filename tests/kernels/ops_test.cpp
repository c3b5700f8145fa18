// The decode step's small operations on the GPU against their CPU twins.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu_test.h"
#include "qf/kern/device_buffer.h"
#include "qf/kern/ops.h"
#include "qf/quant/formats.h"

namespace qf::kern {
namespace {

template <class T>
DeviceBuffer<T> upload(const std::vector<T>& v) {
  DeviceBuffer<T> d(v.size());
  QF_CUDA_CHECK(cudaMemcpy(d.data(), v.data(), d.bytes(), cudaMemcpyHostToDevice));
  return d;
}

template <class T>
std::vector<T> download(const DeviceBuffer<T>& d) {
  std::vector<T> v(d.size());
  QF_CUDA_CHECK(cudaMemcpy(v.data(), d.data(), d.bytes(), cudaMemcpyDeviceToHost));
  return v;
}

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// fp32 results of the same formula in another summation order: relative 1e-5.
void expect_close(const std::vector<float>& want, const std::vector<float>& got, float rel) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rel * (1.0f + std::fabs(want[i]))) << i;
  }
}

// The sum of squares of x as one block of 1024 threads adds it (the contract of ops.cu's norms):
// thread t accumulates x[t], x[t + 1024], ... by fma, each warp adds its 32 sums by an xor
// tree (lane l + lane l ^ o, o = 16 .. 1), then an xor tree over the 32 warp sums.
float block_order_sum_sq(const std::vector<float>& x) {
  std::array<float, 1024> part{};
  for (size_t i = 0; i < x.size(); ++i) part[i % 1024] = std::fma(x[i], x[i], part[i % 1024]);
  auto xor_tree = [](const float* in) {
    std::array<float, 32> v, n;
    std::copy(in, in + 32, v.begin());
    for (int o = 16; o > 0; o >>= 1) {
      for (int l = 0; l < 32; ++l) n[l] = v[l] + v[l ^ o];
      v = n;
    }
    return v[0];
  };
  std::array<float, 32> warps;
  for (int w = 0; w < 32; ++w) warps[w] = xor_tree(part.data() + 32 * w);
  return xor_tree(warps.data());
}

// rms_norm_1p of one row with the sum of squares in that order: what the kernels give bit for
// bit (IEEE division and square root, no contraction of these products).
std::vector<float> norm_in_block_order(const std::vector<float>& x, const std::vector<float>& w,
                                       float eps) {
  const float ss = block_order_sum_sq(x);
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(x.size()) + eps);
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * inv * (1.0f + w[i]);
  return out;
}

TEST(Ops, EmbedBf16AndF32Rows) {
  QF_REQUIRE_GPU();
  const int v = 37, h = 300;
  const std::vector<float> table = randn(static_cast<size_t>(v) * h, 1);
  std::vector<uint16_t> bf(table.size());
  for (size_t i = 0; i < table.size(); ++i) bf[i] = quant::f32_to_bf16(table[i]);
  auto d_f32 = upload(table);
  auto d_bf = upload(bf);
  for (int token : {0, 17, v - 1}) {
    auto d_token = upload(std::vector<int>{token});
    DeviceBuffer<float> out(h);
    std::vector<float> want(h);
    ASSERT_EQ(embed(FloatKind::kBf16, d_bf.data(), h, d_token.data(), out.data(), nullptr),
              cudaSuccess);
    embed_ref(FloatKind::kBf16, bf.data(), h, token, want.data());
    EXPECT_EQ(download(out), want);
    ASSERT_EQ(embed(FloatKind::kF32, d_f32.data(), h, d_token.data(), out.data(), nullptr),
              cudaSuccess);
    embed_ref(FloatKind::kF32, table.data(), h, token, want.data());
    EXPECT_EQ(download(out), want);
  }
}

TEST(Ops, RmsNormRowsAndSizes) {
  QF_REQUIRE_GPU();
  for (int n : {1, 31, 256, 3072, 4097}) {
    const int rows = 3;
    const auto x = randn(static_cast<size_t>(n) * rows, n), w = randn(n, n + 1, 0.3f);
    auto dx = upload(x);
    auto dw = upload(w);
    DeviceBuffer<float> out(x.size());
    ASSERT_EQ(rms_norm_1p(dx.data(), dw.data(), n, rows, 1e-6f, out.data(), nullptr), cudaSuccess);
    std::vector<float> want(x.size());
    rms_norm_1p_ref(x.data(), w.data(), n, rows, 1e-6f, want.data());
    expect_close(want, download(out), 1e-5f);
  }
}

// Sizes on both paths (a cluster up to 4096, one block beyond), partial warps and CTAs.
TEST(Ops, AddThenNormIsTheResidualAddAndTheNorm) {
  QF_REQUIRE_GPU();
  for (int n : {1, 31, 64, 127, 129, 1000, 1025, 3072, 4095, 4096, 4097, 8191}) {
    const auto x0 = randn(n, 3 * n), y = randn(n, 3 * n + 1), w = randn(n, 3 * n + 2, 0.3f);
    auto dx = upload(x0);
    auto dy = upload(y);
    auto dw = upload(w);
    DeviceBuffer<float> out(n);
    ASSERT_EQ(add_rms_norm_1p(dx.data(), dy.data(), dw.data(), n, 1e-6f, out.data(), nullptr),
              cudaSuccess);
    std::vector<float> x = x0, want(n);
    for (int i = 0; i < n; ++i) x[i] += y[i];
    rms_norm_1p_ref(x.data(), w.data(), n, 1, 1e-6f, want.data());
    EXPECT_EQ(download(dx), x) << n;
    const std::vector<float> got = download(out);
    expect_close(want, got, 1e-5f);
    EXPECT_EQ(got, norm_in_block_order(x, w, 1e-6f)) << n;  // the documented order, exactly
  }
}

TEST(Ops, AddPartsThenNormAddsTheirSumInOrder) {
  QF_REQUIRE_GPU();
  for (int n : {1, 33, 1000, 3072, 4096, 4097, 8191}) {
    for (int parts : {2, 3, 4, kMaxNormParts}) {
      const size_t stride = static_cast<size_t>(n) + 5;  // a gap between parts
      const int seed = 5 * n + 10 * parts;
      const auto x0 = randn(n, seed), y = randn(stride * parts, seed + 1);
      const auto w = randn(n, seed + 2, 0.3f);
      auto dx = upload(x0);
      auto dy = upload(y);
      auto dw = upload(w);
      DeviceBuffer<float> out(n);
      ASSERT_EQ(add_parts_rms_norm_1p(dx.data(), dy.data(), parts, stride, dw.data(), n, 1e-6f,
                                      out.data(), nullptr),
                cudaSuccess);
      std::vector<float> x = x0, want(n);
      for (int i = 0; i < n; ++i) {
        float sum = y[i];
        for (int p = 1; p < parts; ++p) sum += y[p * stride + i];
        x[i] += sum;
      }
      rms_norm_1p_ref(x.data(), w.data(), n, 1, 1e-6f, want.data());
      EXPECT_EQ(download(dx), x) << n << " " << parts;
      const std::vector<float> got = download(out);
      expect_close(want, got, 1e-5f);
      EXPECT_EQ(got, norm_in_block_order(x, w, 1e-6f)) << n;  // the documented order, exactly
    }
  }
  DeviceBuffer<float> x(8), y(8 * 9), w(8), out(8);  // 0 or more than kMaxNormParts: refused
  for (int parts : {0, kMaxNormParts + 1}) {
    EXPECT_EQ(add_parts_rms_norm_1p(x.data(), y.data(), parts, 8, w.data(), 8, 1e-6f, out.data(),
                                    nullptr),
              cudaErrorInvalidValue);
  }
}

TEST(Ops, SwigluStridedRows) {
  QF_REQUIRE_GPU();
  const int n = 1000, rows = 9;
  const size_t stride = 2 * n;
  const auto gu = randn(stride * rows, 5, 3.0f);
  auto d = upload(gu);
  DeviceBuffer<float> out(static_cast<size_t>(n) * rows);
  ASSERT_EQ(swiglu(d.data(), d.data() + n, n, rows, stride, out.data(), nullptr), cudaSuccess);
  std::vector<float> want(static_cast<size_t>(n) * rows);
  swiglu_ref(gu.data(), gu.data() + n, n, rows, stride, want.data());
  expect_close(want, download(out), 1e-6f);
}

void expect_router_matches(const std::vector<float>& logits, int k, const std::string& what) {
  const int e = static_cast<int>(logits.size());
  auto d = upload(logits);
  DeviceBuffer<int> ids(k);
  DeviceBuffer<float> w(k);
  ASSERT_EQ(router_topk(d.data(), e, k, ids.data(), w.data(), nullptr), cudaSuccess) << what;
  std::vector<int> want_ids(k);
  std::vector<float> want_w(k);
  router_topk_ref(logits.data(), e, k, want_ids.data(), want_w.data());
  EXPECT_EQ(download(ids), want_ids) << what;
  expect_close(want_w, download(w), 1e-5f);
}

// Every per-lane register count (e up to 32, 64, ..., 1024), k from 1 to 32, ties.
TEST(Ops, RouterTopKWithTies) {
  QF_REQUIRE_GPU();
  for (int e : {1, 2, 4, 16, 31, 32, 33, 64, 100, 256, 257, 512, 1000, 1024}) {
    for (int k : {1, 2, 3, 5, 8, 10, 32}) {
      if (k > e) continue;
      std::vector<float> logits = randn(e, 100 * e + k, 2.0f);
      if (e > 2) logits[e - 1] = logits[1];  // a tie: the lower id must win
      if (e > 40) {
        // equal maxima in different lanes and in one lane (ids 3 and 35), and a tie in the tail
        const float top = *std::max_element(logits.begin(), logits.end()) + 1.0f;
        logits[35] = logits[3] = logits[e / 2] = top;
        logits[e - 2] = logits[e - 7];
      }
      expect_router_matches(logits, k, "e=" + std::to_string(e) + " k=" + std::to_string(k));
    }
  }
}

// Probabilities that underflow to 0 are chosen last, lowest ids first; all-equal logits.
TEST(Ops, RouterTopKZeroAndEqualProbabilities) {
  QF_REQUIRE_GPU();
  std::vector<float> logits(256, -1000.0f);
  logits[200] = 1.0f;
  logits[7] = 0.5f;
  logits[70] = 1.0f;
  expect_router_matches(logits, 8, "underflow");
  expect_router_matches(std::vector<float>(300, 0.25f), 10, "all equal");
}

TEST(Ops, RouterTopKRejectsUnsupportedSizes) {
  QF_REQUIRE_GPU();
  DeviceBuffer<float> logits(2048), w(64);
  DeviceBuffer<int> ids(64);
  EXPECT_EQ(router_topk(logits.data(), 1025, 8, ids.data(), w.data(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(router_topk(logits.data(), 256, 33, ids.data(), w.data(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(router_topk(logits.data(), 4, 5, ids.data(), w.data(), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(router_topk(logits.data(), 4, 0, ids.data(), w.data(), nullptr), cudaErrorInvalidValue);
}

// Runs moe_combine_norm on the inputs; returns (x, out).
std::pair<std::vector<float>, std::vector<float>> combine_on_gpu(
    const std::vector<float>& y, const std::vector<float>& wt, const std::vector<float>& shared,
    std::optional<float> gate, const std::vector<float>& x0, const std::vector<float>& w) {
  const int h = static_cast<int>(x0.size()), k = static_cast<int>(wt.size());
  auto dy = upload(y);
  auto ds = upload(shared);
  auto dwt = upload(wt);
  auto dg = upload(std::vector<float>{gate.value_or(0.0f)});
  auto dx = upload(x0);
  auto dw = upload(w);
  DeviceBuffer<float> out(h);
  EXPECT_EQ(moe_combine_norm(dy.data(), dwt.data(), k, ds.data(), gate ? dg.data() : nullptr, h,
                             dx.data(), dw.data(), 1e-6f, out.data(), nullptr),
            cudaSuccess);
  return {download(dx), download(out)};
}

// k = 1 .. 17 (the <= 8 and <= 16 register paths, one beyond), rows on both sides of 4096.
TEST(Ops, MoeCombineThenNorm) {
  QF_REQUIRE_GPU();
  for (int h : {1, 33, 64, 1000, 2048, 3072, 4096, 4097, 5000}) {
    for (int k : {1, 2, 3, 4, 5, 6, 7, 8, 10, 16, 17}) {
      if (h == 1 && k > 3) continue;
      const auto y = randn(static_cast<size_t>(h) * k, h + k), shared = randn(h, h + 1),
                 x0 = randn(h, h + 2), w = randn(h, h + 3, 0.3f);
      std::vector<float> wt = randn(k, 7 * k + 1, 0.3f);
      for (float& v : wt) v = std::fabs(v);
      const auto [got_x, got_out] = combine_on_gpu(y, wt, shared, 0.4f, x0, w);
      std::vector<float> x = x0, want(h);
      moe_combine_ref(y.data(), wt.data(), k, shared.data(), 0.4f, h, x.data());
      rms_norm_1p_ref(x.data(), w.data(), h, 1, 1e-6f, want.data());
      expect_close(x, got_x, 1e-6f);
      expect_close(want, got_out, 1e-5f);
    }
  }
}

// The documented order, exactly: x[i] + fma(sg, shared[i], acc) with acc the fma chain over
// j = 0 .. k-1, then the norm in block order. A gate of 100 makes sigmoid exactly 1 on both
// sides (expf and std::exp may differ by an ulp elsewhere); no gate (shared gated already, as
// the shared expert's down product leaves it when the gate is folded in) adds shared as is.
TEST(Ops, MoeCombineInTheDocumentedOrder) {
  QF_REQUIRE_GPU();
  for (auto [h, k] :
       {std::pair{3072, 8}, std::pair{1000, 3}, std::pair{4096, 10}, std::pair{4099, 8}}) {
    const auto y = randn(static_cast<size_t>(h) * k, 5 * h), shared = randn(h, 5 * h + 1),
               x0 = randn(h, 5 * h + 2), w = randn(h, 5 * h + 3, 0.3f), wt = randn(k, h, 0.3f);
    const auto [got_x, got_out] = combine_on_gpu(y, wt, shared, 100.0f, x0, w);
    const auto [ungated_x, ungated_out] = combine_on_gpu(y, wt, shared, std::nullopt, x0, w);
    std::vector<float> x = x0;
    for (int i = 0; i < h; ++i) {
      float acc = 0;
      for (int j = 0; j < k; ++j) acc = std::fma(wt[j], y[static_cast<size_t>(j) * h + i], acc);
      x[i] += shared[i] + acc;
    }
    EXPECT_EQ(got_x, x) << h;
    EXPECT_EQ(got_out, norm_in_block_order(x, w, 1e-6f)) << h;
    EXPECT_EQ(ungated_x, x) << h << " without a gate";
    EXPECT_EQ(ungated_out, got_out) << h << " without a gate";
  }
}

// rows = 2 (speculative decoding's verify pass): each row exactly what a one-row launch on it
// gives, for the residual norm (parts, and the one-block path past 4096), the router's top-k and
// the MoE combine (gated and not, the long path too).
TEST(Ops, TwoRowLaunchesEqualOneRowEach) {
  QF_REQUIRE_GPU();
  const float eps = 1e-6f;
  for (const int n : {3072, 5000}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const int parts = 4;
    const size_t y_row = static_cast<size_t>(parts) * n + 8;  // the part runs, then a gap
    const auto x0 = randn(2 * static_cast<size_t>(n), n), y = randn(2 * y_row, n + 1),
               w = randn(n, n + 2, 0.3f);
    auto d_x2 = upload(x0), d_x1 = upload(x0), d_y = upload(y), d_w = upload(w);
    DeviceBuffer<float> d_o2(2 * n), d_o1(2 * n);
    ASSERT_EQ(add_parts_rms_norm_1p(d_x2.data(), d_y.data(), parts, n, d_w.data(), n, eps,
                                    d_o2.data(), nullptr, 2, y_row),
              cudaSuccess);
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(add_parts_rms_norm_1p(d_x1.data() + r * n, d_y.data() + r * y_row, parts, n,
                                      d_w.data(), n, eps, d_o1.data() + r * n, nullptr),
                cudaSuccess);
    }
    EXPECT_EQ(download(d_x2), download(d_x1));
    EXPECT_EQ(download(d_o2), download(d_o1));
    EXPECT_NE(download(d_x2), x0);

    const int k = 8;
    const auto ey = randn(2 * static_cast<size_t>(k) * n, n + 3), sh = randn(2 * n, n + 4);
    std::vector<float> wt = randn(2 * k, n + 5, 0.3f), gates = {0.3f, 9.0f, -1.0f, 0.5f, -0.7f};
    for (float& v : wt) v = std::fabs(v);
    auto d_ey = upload(ey), d_sh = upload(sh), d_wt = upload(wt), d_g = upload(gates);
    for (const bool gated : {true, false}) {
      const float* g = gated ? d_g.data() + 1 : nullptr;  // rows 3 floats apart: 9.0, then -0.7
      auto d_a = upload(x0), d_b = upload(x0);
      ASSERT_EQ(moe_combine_norm(d_ey.data(), d_wt.data(), k, d_sh.data(), g, n, d_a.data(),
                                 d_w.data(), eps, d_o2.data(), nullptr, 2, 3),
                cudaSuccess);
      for (int r = 0; r < 2; ++r) {
        ASSERT_EQ(
            moe_combine_norm(d_ey.data() + r * k * n, d_wt.data() + r * k, k, d_sh.data() + r * n,
                             g ? g + 3 * r : nullptr, n, d_b.data() + r * n, d_w.data(), eps,
                             d_o1.data() + r * n, nullptr),
            cudaSuccess);
      }
      EXPECT_EQ(download(d_a), download(d_b)) << gated;
      EXPECT_EQ(download(d_o2), download(d_o1)) << gated;
    }
  }
  for (const auto& [e, k] : {std::pair{256, 8}, std::pair{512, 10}, std::pair{40, 3}}) {
    const size_t row = static_cast<size_t>(e) + 1;  // router logits | the shared gate's
    const auto logits = randn(2 * row, e);
    auto d_l = upload(logits);
    DeviceBuffer<int> d_i2(2 * k), d_i1(2 * k);
    DeviceBuffer<float> d_w2(2 * k), d_w1(2 * k);
    ASSERT_EQ(router_topk(d_l.data(), e, k, d_i2.data(), d_w2.data(), nullptr, 2, row),
              cudaSuccess);
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(router_topk(d_l.data() + r * row, e, k, d_i1.data() + r * k, d_w1.data() + r * k,
                            nullptr),
                cudaSuccess);
    }
    EXPECT_EQ(download(d_i2), download(d_i1)) << e;
    EXPECT_EQ(download(d_w2), download(d_w1)) << e;
    EXPECT_NE(download(d_i2)[0], download(d_i2)[k]) << "rows with the same top expert: weak test";
  }
}

TEST(Ops, ArgmaxFirstMaximumAtAnySize) {
  QF_REQUIRE_GPU();
  for (int n : {1, 5, 257, 65536 + 3, 248320}) {
    std::vector<float> logits = randn(n, n);
    if (n > 10) logits[n - 2] = logits[n / 3] = 100.0f;  // equal maxima: the first one wins
    auto d = upload(logits);
    DeviceBuffer<int> out(1), scratch(argmax_scratch_ints(n));
    ASSERT_EQ(argmax(d.data(), n, out.data(), scratch.data(), nullptr), cudaSuccess);
    EXPECT_EQ(download(out)[0], argmax_ref(logits.data(), n)) << n;
  }
}

TEST(Ops, AdvanceMovesTheTokenAndThePosition) {
  QF_REQUIRE_GPU();
  auto src = upload(std::vector<int>{42});
  auto dst = upload(std::vector<int>{0});
  auto pos = upload(std::vector<int>{6});
  ASSERT_EQ(advance(src.data(), dst.data(), pos.data(), nullptr), cudaSuccess);
  EXPECT_EQ(download(dst)[0], 42);
  EXPECT_EQ(download(pos)[0], 7);
}

}  // namespace
}  // namespace qf::kern
