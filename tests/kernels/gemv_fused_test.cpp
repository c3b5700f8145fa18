// The fused GEMV products on the GPU: gemv_swiglu (the gate|up product with SwiGLU in its
// epilogue) and gemv_moe (the routed experts with the FP8 shared expert in the same launch),
// against the unfused GPU path bit for bit where they claim it and against their CPU twins within
// gemv_check.h's bound (propagated through SwiGLU below). Skips (and says why) where no CUDA
// device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gemv_check.h"
#include "qf/kern/ops.h"

namespace qf::kern {
namespace {

using test::Batch;     // gemv_check.h
using test::download;  // mixer_check.h, through gemv_check.h
using test::expect_poison_outside;
using test::Inputs;
using test::make_inputs;
using test::make_linear;
using test::Rng;
using test::TestLinear;
using test::upload;
using test::weight_at;

// ---- gemv_swiglu: gate|up in the paired row order, SwiGLU in the epilogue --------------------
//
// Checked two ways. (1) Bit for bit against the unfused GPU path on the same weights: gemv, then
// swiglu (ops.h) reading the paired rows (gate = y + 16T, up = y + 16T + 8: n = 8, rows = tiles,
// stride 16); the epilogue adds the warps' sums in the same order and evaluates silu(g) * u as
// swiglu does. (2) Against gemv_swiglu_ref, the tolerance propagated from gemv's (file comment):
// with |g' - g| <= tg and |u' - u| <= tu that bound per row, silu 1.1-Lipschitz (|silu'| <=
// 1.0999) and |silu(g)| <= |g|,
//   |h' - h| <= 1.1 tg (|u| + tu) + |silu(g)| tu + 16 * 2^-24 (|silu(g)| + 1.1 tg)(|u| + tu),
// the last term the two evaluations' own roundings (GPU expf within 2 ulps, a division, two
// products; the reference's std::exp, division, two products: under 16 ulps together). The
// reference's pairing is checked against weight_at's own sums.
float silu_mul_f(float g, float u) {  // swiglu_ref's formula
  return g * (1.0f / (1.0f + std::exp(-g))) * u;
}

void check_swiglu(const TestLinear& t, const Batch& b, uint64_t seed) {
  SCOPED_TRACE("swiglu n " + std::to_string(t.n) + " k " + std::to_string(t.k) + " group " +
               std::to_string(t.group) + " slots " + std::to_string(b.n_slots) + " x_stride " +
               std::to_string(b.x_stride) + " h_stride " + std::to_string(b.y_stride));
  Rng rng{seed};
  const int n_h = t.n / 2;
  Inputs in = make_inputs(t, b, rng);
  const std::vector<float>& x = in.x;
  const DeviceBuffer<float>& d_x = in.d_x;
  const GemvBatch& gb = in.gb;
  const size_t h_stride = gb.y_stride;
  const size_t nh = (b.n_slots - 1) * h_stride + n_h;
  DeviceBuffer<float> d_h(nh), d_y(static_cast<size_t>(b.n_slots) * t.n),
      d_h2(static_cast<size_t>(b.n_slots) * n_h);
  QF_CUDA_CHECK(cudaMemset(d_h.data(), 0xFF, d_h.bytes()));  // NaN poison
  ASSERT_TRUE(gemv_swiglu_ok(t.view(true), gb));
  ASSERT_EQ(gemv_swiglu(t.view(true), d_x.data(), d_h.data(), gb, nullptr), cudaSuccess);
  GemvBatch gy = gb;  // the unfused path: every slot's n rows back to back
  gy.y_stride = static_cast<size_t>(t.n);
  ASSERT_EQ(gemv(t.view(true), d_x.data(), d_y.data(), gy, nullptr), cudaSuccess);
  ASSERT_EQ(
      swiglu(d_y.data(), d_y.data() + kSwigluPairRows, kSwigluPairRows,
             b.n_slots * t.n / (2 * kSwigluPairRows), 2 * kSwigluPairRows, d_h2.data(), nullptr),
      cudaSuccess);
  QF_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = download(d_h), unfused = download(d_h2);
  std::vector<float> want(nh, 0.0f);
  gemv_swiglu_ref(t.view(false), x.data(), want.data(), gb, b.ids.empty() ? nullptr : b.ids.data());

  std::vector<bool> written(nh, false);
  int bad = 0;
  for (int s = 0; s < b.n_slots; ++s) {
    const size_t e = b.ids.empty() ? s : b.ids[s];
    const float* xs = b.x_of(x, s);
    for (int j = 0; j < n_h; ++j) {
      const size_t i = s * h_stride + j;
      written[i] = true;
      double sum[2] = {0, 0}, abs_sum[2] = {0, 0};
      for (int up = 0; up < 2; ++up) {
        const int64_t r = (j / 8) * 16 + 8 * up + j % 8;  // the paired row order, spelled out
        for (int64_t c = 0; c < t.k; ++c) {
          const double p = static_cast<double>(weight_at(t, e, r, c)) * xs[c];
          sum[up] += p;
          abs_sum[up] += std::fabs(p);
        }
      }
      const double tg = (std::ceil(t.k / 32.0) + 16) * 0x1p-24 * abs_sum[0];
      const double tu = (std::ceil(t.k / 32.0) + 16) * 0x1p-24 * abs_sum[1];
      const float g = static_cast<float>(sum[0]), u = static_cast<float>(sum[1]);
      const double sg = std::fabs(silu_mul_f(g, 1.0f)), au = std::fabs(u);
      const double tol =
          1.1 * tg * (au + tu) + sg * tu + 16 * 0x1p-24 * (sg + 1.1 * tg) * (au + tu);
      const bool ok_ref = want[i] == silu_mul_f(g, u);
      const bool ok = std::fabs(static_cast<double>(got[i]) - want[i]) <= tol;
      const float f = unfused[static_cast<size_t>(s) * n_h + j];
      const bool same = std::memcmp(&got[i], &f, 4) == 0;
      if ((!ok || !ok_ref || !same) && ++bad <= 5) {
        ADD_FAILURE() << "slot " << s << " pair " << j << ": gpu " << got[i] << " unfused gpu " << f
                      << " ref " << want[i] << " own " << silu_mul_f(g, u) << " tol " << tol;
      }
    }
  }
  EXPECT_EQ(bad, 0);
  expect_poison_outside(got, written, "h");
}

// Awkward sizes: one pair tile (n_h = 8), a few, an odd count of tiles (136 = 17 x 8), many;
// K from one segment to 4096 (1 to 32 units per item), groups of 128, 256 and one per row.
TEST(GemvSwiglu, AwkwardSizes) {
  QF_REQUIRE_GPU();
  uint64_t seed = 500;
  for (int k : {128, 384, 1152, 3072, 4096}) {
    for (int n_h : {8, 24, 136, 1032}) {
      for (int group : {128, 256, 1 << 20}) {
        if (group == 256 && k % 256 != 0) continue;
        const auto t = make_linear(WeightKind::kInt4, 2 * n_h, k, 1, group, 128, ++seed);
        check_swiglu(*t, Batch{}, ++seed);
      }
    }
  }
}

TEST(GemvSwiglu, ExpertBatch) {
  QF_REQUIRE_GPU();
  const auto t = make_linear(WeightKind::kInt4, 2 * 40, 1024, 12, 128, 128, 541);
  const std::vector<int> ids = {7, 2, 7, 0, 11, 3, 3, 5};
  check_swiglu(*t, Batch{8, ids, 0, 40}, 542);         // one shared x
  check_swiglu(*t, Batch{8, ids, 1024 + 4, 45}, 543);  // x per slot, gaps between outputs
  check_swiglu(*t, Batch{3, {}, 1024, 40}, 544);       // no ids: slot s uses expert s
  check_swiglu(*t, Batch{1, {11}, 0, 0}, 545);         // one slot through ids
}

// Qwen3.5-122B-A10B routed experts (hidden 3072, inter 1024, 256 experts, top 8) and 35B-A3B's
// (hidden 2048, inter 512).
TEST(GemvSwiglu, RealShapes) {
  QF_REQUIRE_GPU();
  const auto t = make_linear(WeightKind::kInt4, 2 * 1024, 3072, 256, 128, 128, 551);
  check_swiglu(*t, Batch{8, {201, 17, 88, 17, 3, 255, 140, 64}, 0, 1024}, 552);
  Batch two{16, {201, 17, 88, 17, 3, 255, 140, 64, 17, 5, 201, 99, 0, 64, 7, 8}, 3072, 1024};
  two.slots_per_x = 8;  // two tokens' experts in one launch (the verify pass)
  check_swiglu(*t, two, 555);
  const auto s = make_linear(WeightKind::kInt4, 2 * 512, 2048, 256, 128, 128, 553);
  check_swiglu(*s, Batch{8, {0, 255, 9, 9, 100, 31, 77, 200}, 0, 512}, 554);
}

// Where the fused epilogue does not apply, gemv_swiglu says so and the caller keeps gemv + swiglu.
TEST(GemvSwiglu, RefusesWhatItCannotPair) {
  EXPECT_TRUE(gemv_swiglu_shape_ok(WeightKind::kInt4, 1024, 3072, 128));
  EXPECT_TRUE(gemv_swiglu_shape_ok(WeightKind::kInt4, 8, 128, 4096));
  EXPECT_FALSE(gemv_swiglu_shape_ok(WeightKind::kInt4, 12, 3072, 128));    // n_h % 8
  EXPECT_FALSE(gemv_swiglu_shape_ok(WeightKind::kInt4, 1024, 136, 8));     // K % 128
  EXPECT_FALSE(gemv_swiglu_shape_ok(WeightKind::kInt4, 1024, 3072, 384));  // 3 segments a group
  EXPECT_FALSE(gemv_swiglu_shape_ok(WeightKind::kFp8, 1024, 3072, 128));
  EXPECT_FALSE(gemv_swiglu_shape_ok(WeightKind::kInt8, 1024, 3072, 128));
  QF_REQUIRE_GPU();
  const auto t = make_linear(WeightKind::kInt4, 24, 1024, 1, 128, 128, 561);  // 24 % 16 != 0
  DeviceBuffer<float> d_x(1024), d_h(12);
  EXPECT_EQ(gemv_swiglu(t->view(true), d_x.data(), d_h.data(), GemvBatch{}, nullptr),
            cudaErrorNotSupported);
  const auto f = make_linear(WeightKind::kFp8, 32, 1024, 1, 128, 128, 562);
  EXPECT_EQ(gemv_swiglu(f->view(true), d_x.data(), d_h.data(), GemvBatch{}, nullptr),
            cudaErrorNotSupported);
}

// gemv_moe: the routed slots bit for bit what gemv_swiglu (or gemv) writes, NaN poison included
// (so nothing else is written there); the shared expert's rows within the file's bound of their
// exact sums (swiglu: check_swiglu's bound, its gate rows 0 .. n/2 - 1 and up rows n/2 ..),
// gemv_moe_ref's shared rows equal to the exact sums rounded (then swiglu_ref's formula), and
// nothing past the shared outputs written. gate (down only): the shared expert's gate logit,
// folded in: each output is sigmoid(gate) * sum, the bound scaled by sigmoid(gate) plus 16 *
// 2^-24 relative for the two sigmoids (expf within 2 ulps, a division) and the products, and the
// reference's output exactly the rounded sum times the host sigmoid.
void check_moe(const TestLinear& ex, const Batch& b, bool swiglu, const TestLinear& sh,
               uint64_t seed, std::optional<float> gate = std::nullopt) {
  SCOPED_TRACE(std::string("moe ") + (swiglu ? "gate|up" : "down") + " experts n " +
               std::to_string(ex.n) + " k " + std::to_string(ex.k) + ", shared n " +
               std::to_string(sh.n) + " k " + std::to_string(sh.k) + " block " +
               std::to_string(sh.block) + " slots " + std::to_string(b.n_slots) +
               (gate ? " gate " + std::to_string(*gate) : ""));
  Rng rng{seed};
  Inputs in = make_inputs(ex, b, rng);
  const size_t n_out = swiglu ? ex.n / 2 : ex.n, sh_out = swiglu ? sh.n / 2 : sh.n;
  const size_t ny = (b.n_slots - 1) * in.gb.y_stride + n_out;
  std::vector<float> xs(static_cast<size_t>(sh.k));
  for (float& v : xs) v = rng.uniform(-1.0f, 1.0f);
  const DeviceBuffer<float> d_xs = upload(xs), d_gate = upload(std::vector{gate.value_or(0.0f)});
  DeviceBuffer<float> d_y(ny), d_y2(ny), d_ys(sh_out + 8);
  for (auto* d : {&d_y, &d_y2, &d_ys}) QF_CUDA_CHECK(cudaMemset(d->data(), 0xFF, d->bytes()));
  const SharedProduct sp{sh.view(true), d_xs.data(), d_ys.data(), gate ? d_gate.data() : nullptr};
  ASSERT_TRUE(gemv_moe_ok(ex.view(true), in.gb, swiglu, sp));
  ASSERT_EQ(gemv_moe(ex.view(true), in.d_x.data(), d_y.data(), in.gb, swiglu, sp, nullptr),
            cudaSuccess);
  ASSERT_EQ(swiglu ? gemv_swiglu(ex.view(true), in.d_x.data(), d_y2.data(), in.gb, nullptr)
                   : gemv(ex.view(true), in.d_x.data(), d_y2.data(), in.gb, nullptr),
            cudaSuccess);
  QF_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> y = download(d_y), y2 = download(d_y2), ys = download(d_ys);
  std::vector<float> want_y(ny), want_s(sh_out);
  EXPECT_EQ(std::memcmp(y.data(), y2.data(), ny * sizeof(float)), 0) << "routed slots differ";
  const SharedProduct host{sh.view(false), xs.data(), want_s.data(), gate ? &*gate : nullptr};
  const float gate_sg = gate ? 1.0f / (1.0f + std::exp(-*gate)) : 1.0f;
  gemv_moe_ref(ex.view(false), in.x.data(), want_y.data(), in.gb, swiglu, host,
               b.ids.empty() ? nullptr : b.ids.data());

  int bad = 0;
  for (size_t j = 0; j < sh_out; ++j) {
    double sum[2] = {0, 0}, abs_sum[2] = {0, 0};
    for (int part = 0; part < (swiglu ? 2 : 1); ++part) {
      const int64_t r = static_cast<int64_t>(j + part * sh_out);
      for (int64_t c = 0; c < sh.k; ++c) {
        const double p = static_cast<double>(weight_at(sh, 0, r, c)) * xs[c];
        sum[part] += p;
        abs_sum[part] += std::fabs(p);
      }
    }
    const double tg = (std::ceil(sh.k / 32.0) + 16) * 0x1p-24 * abs_sum[0];
    double tol = tg, own = sum[0];
    if (swiglu) {
      const double tu = (std::ceil(sh.k / 32.0) + 16) * 0x1p-24 * abs_sum[1];
      const float g = static_cast<float>(sum[0]), u = static_cast<float>(sum[1]);
      const double sg = std::fabs(silu_mul_f(g, 1.0f)), au = std::fabs(u);
      tol = 1.1 * tg * (au + tu) + sg * tu + 16 * 0x1p-24 * (sg + 1.1 * tg) * (au + tu);
      own = silu_mul_f(g, u);
    }
    float own_f = static_cast<float>(own);
    if (gate) {
      own_f *= gate_sg;
      tol = gate_sg * tol + 16 * 0x1p-24 * std::fabs(gate_sg * own);
    }
    const bool ok_ref = want_s[j] == own_f;
    const bool ok = std::fabs(static_cast<double>(ys[j]) - want_s[j]) <= tol;
    if ((!ok || !ok_ref) && ++bad <= 5) {
      ADD_FAILURE() << "shared output " << j << ": gpu " << ys[j] << " ref " << want_s[j] << " own "
                    << own_f << " tol " << tol;
    }
  }
  EXPECT_EQ(bad, 0);
  std::vector<bool> shared_written(ys.size(), false);
  std::fill_n(shared_written.begin(), sh_out, true);
  expect_poison_outside(ys, shared_written, "shared y");
}

// Qwen3.5-122B-A10B (hidden 3072, expert and shared inter 1024) and 35B-A3B (2048, 512): the
// gate | up launch (one x) and the down launch (x per slot), 8 of 256 experts.
TEST(GemvMoe, RealShapes) {
  QF_REQUIRE_GPU();
  const std::vector<int> ids = {201, 17, 88, 17, 3, 255, 140, 64};
  for (const auto& [h, i] : {std::pair{3072, 1024}, std::pair{2048, 512}}) {
    const auto gu = make_linear(WeightKind::kInt4, 2 * i, h, 256, 128, 128, 601 + h);
    const auto sgu = make_linear(WeightKind::kFp8, 2 * i, h, 1, 128, 128, 602 + h);
    check_moe(*gu, Batch{8, ids, 0, static_cast<size_t>(i)}, true, *sgu, 603 + h);
    const auto dn = make_linear(WeightKind::kInt4, h, i, 256, 128, 128, 604 + h);
    const auto sdn = make_linear(WeightKind::kFp8, h, i, 1, 128, 128, 605 + h);
    check_moe(*dn, Batch{8, ids, static_cast<size_t>(i), static_cast<size_t>(h)}, false, *sdn,
              606 + h);
    for (float g : {0.37f, -2.5f, 9.0f}) {  // the shared expert's gate folded in
      check_moe(*dn, Batch{8, ids, static_cast<size_t>(i), static_cast<size_t>(h)}, false, *sdn,
                607 + h, g);
    }
  }
}

// Shared shapes off the models' grid: K of 1 to 6 chunks a lane (16 .. 3072 columns, partial
// lanes), odd row counts, few and many units per block, FP8 blocks of 16 .. past K.
TEST(GemvMoe, AwkwardSharedShapes) {
  QF_REQUIRE_GPU();
  uint64_t seed = 620;
  const auto gu = make_linear(WeightKind::kInt4, 32, 256, 4, 128, 128, ++seed);
  const auto dn = make_linear(WeightKind::kInt4, 48, 128, 4, 128, 128, ++seed);
  for (int k : {16, 48, 528, 1040, 1552, 2064, 2576, 3072}) {
    for (int n : {2, 26, 301 * 2}) {
      for (int block : {16, 128, 4096}) {
        const auto s = make_linear(WeightKind::kFp8, n, k, 1, 128, block, ++seed);
        check_moe(*gu, Batch{3, {2, 0, 2}, 0, 16}, true, *s, ++seed);
        check_moe(*dn, Batch{2, {3, 1}, 132, 50}, false, *s, ++seed);
      }
    }
  }
  const auto odd = make_linear(WeightKind::kFp8, 37, 512, 1, 128, 128, ++seed);
  check_moe(*dn, Batch{1, {2}, 0, 0}, false, *odd, ++seed);
  check_moe(*dn, Batch{1, {2}, 0, 0}, false, *odd, ++seed, -0.8f);
}

TEST(GemvMoe, RefusesWhatItCannotCarry) {
  QF_REQUIRE_GPU();
  const auto gu = make_linear(WeightKind::kInt4, 32, 256, 4, 128, 128, 640);
  DeviceBuffer<float> d_x(4096), d_y(4096);
  const GemvBatch b{2, nullptr, 0, 16};
  const auto ok = [&](const TestLinear& s, bool swiglu, const float* x) {
    return gemv_moe_ok(gu->view(true), b, swiglu, SharedProduct{s.view(true), x, d_y.data()});
  };
  const auto fine = make_linear(WeightKind::kFp8, 32, 512, 1, 128, 128, 641);
  EXPECT_TRUE(ok(*fine, true, d_x.data()));
  EXPECT_FALSE(ok(*fine, true, d_x.data() + 1));  // x not 16-byte aligned
  EXPECT_FALSE(ok(*make_linear(WeightKind::kFp8, 32, 3088, 1, 128, 128, 642), true, d_x.data()));
  EXPECT_FALSE(ok(*make_linear(WeightKind::kFp8, 32, 520, 1, 128, 128, 643), true, d_x.data()));
  EXPECT_FALSE(ok(*make_linear(WeightKind::kFp8, 32, 512, 1, 128, 96, 644), true, d_x.data()));
  EXPECT_FALSE(ok(*make_linear(WeightKind::kFp8, 31, 512, 1, 128, 128, 645), true, d_x.data()));
  EXPECT_FALSE(ok(*make_linear(WeightKind::kInt8, 32, 512, 1, 128, 128, 646), true, d_x.data()));
  const SharedProduct sp{fine->view(true), d_x.data(), d_y.data()};
  GemvBatch split = b;
  split.k_splits = 2;
  split.split_stride = 32;
  EXPECT_FALSE(gemv_moe_ok(gu->view(true), split, false, sp));  // K parts
  const auto unpaired = make_linear(WeightKind::kInt4, 24, 256, 4, 128, 128, 647);
  EXPECT_EQ(gemv_moe(unpaired->view(true), d_x.data(), d_y.data(), b, true, sp, nullptr),
            cudaErrorNotSupported);
  const SharedProduct gated{fine->view(true), d_x.data(), d_y.data(), d_x.data()};
  EXPECT_EQ(gemv_moe(gu->view(true), d_x.data(), d_y.data(), b, true, gated, nullptr),
            cudaErrorInvalidValue);  // the gate goes on the down product, not SwiGLU's outputs
}

}  // namespace
}  // namespace qf::kern
