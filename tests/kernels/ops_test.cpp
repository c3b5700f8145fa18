// The decode step's small operations on the GPU against their CPU twins.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
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

TEST(Ops, AddThenNormIsTheResidualAddAndTheNorm) {
  QF_REQUIRE_GPU();
  for (int n : {1, 64, 3072, 4096, 8191}) {
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
    expect_close(want, download(out), 1e-5f);
  }
}

TEST(Ops, AddTwoPartsThenNormAddsTheirSum) {
  QF_REQUIRE_GPU();
  for (int n : {1, 3072, 8191}) {
    const auto x0 = randn(n, 5 * n), y0 = randn(n, 5 * n + 1), y1 = randn(n, 5 * n + 2);
    const auto w = randn(n, 5 * n + 3, 0.3f);
    auto dx = upload(x0);
    auto dy0 = upload(y0);
    auto dy1 = upload(y1);
    auto dw = upload(w);
    DeviceBuffer<float> out(n);
    ASSERT_EQ(add2_rms_norm_1p(dx.data(), dy0.data(), dy1.data(), dw.data(), n, 1e-6f, out.data(),
                               nullptr),
              cudaSuccess);
    std::vector<float> x = x0, want(n);
    for (int i = 0; i < n; ++i) x[i] += y0[i] + y1[i];
    rms_norm_1p_ref(x.data(), w.data(), n, 1, 1e-6f, want.data());
    EXPECT_EQ(download(dx), x) << n;
    expect_close(want, download(out), 1e-5f);
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

TEST(Ops, RouterTopKWithTies) {
  QF_REQUIRE_GPU();
  for (auto [e, k] : {std::pair{4, 2}, std::pair{16, 4}, std::pair{256, 8}, std::pair{512, 10}}) {
    std::vector<float> logits = randn(e, e, 2.0f);
    logits[e - 1] = logits[1];  // a tie: the lower id must win
    auto d = upload(logits);
    DeviceBuffer<int> ids(k);
    DeviceBuffer<float> w(k);
    ASSERT_EQ(router_topk(d.data(), e, k, ids.data(), w.data(), nullptr), cudaSuccess);
    std::vector<int> want_ids(k);
    std::vector<float> want_w(k);
    router_topk_ref(logits.data(), e, k, want_ids.data(), want_w.data());
    EXPECT_EQ(download(ids), want_ids) << e;
    expect_close(want_w, download(w), 1e-5f);
  }
}

TEST(Ops, MoeCombineThenNorm) {
  QF_REQUIRE_GPU();
  for (int h : {64, 2048, 3072, 4096}) {
    const int k = 8;
    const auto y = randn(static_cast<size_t>(h) * k, h), shared = randn(h, h + 1),
               x0 = randn(h, h + 2), w = randn(h, h + 3, 0.3f);
    const std::vector<float> wt = {0.3f, 0.2f, 0.1f, 0.1f, 0.1f, 0.1f, 0.05f, 0.05f}, g = {0.4f};
    auto dy = upload(y);
    auto ds = upload(shared);
    auto dwt = upload(wt);
    auto dg = upload(g);
    auto dx = upload(x0);
    auto dw = upload(w);
    DeviceBuffer<float> out(h);
    ASSERT_EQ(moe_combine_norm(dy.data(), dwt.data(), k, ds.data(), dg.data(), h, dx.data(),
                               dw.data(), 1e-6f, out.data(), nullptr),
              cudaSuccess);
    std::vector<float> x = x0, want(h);
    moe_combine_ref(y.data(), wt.data(), k, shared.data(), g[0], h, x.data());
    rms_norm_1p_ref(x.data(), w.data(), h, 1, 1e-6f, want.data());
    expect_close(x, download(dx), 1e-6f);
    expect_close(want, download(out), 1e-5f);
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
