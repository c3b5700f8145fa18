// gemm (gemm.h): many rows of x through one INT4 (INT8, FP8, BF16) weight stream, against gemm_ref
// (gemv_ref per entry) within the gemv tolerance (gemv_check.h), over dense and grouped (expert)
// products, entry counts around the kernel's pass of 16 and its pairs, partial tiles, group sizes,
// x rows picked by x_rows; the SwiGLU epilogue bit for bit the plain product's rows through swiglu
// (ops.h); nothing written outside the entries' rows.
#include "qf/kern/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "gemv_check.h"
#include "gpu_test.h"
#include "qf/kern/ops.h"

namespace qf::kern {
namespace {

using test::make_linear;
using test::Rng;
using test::TestLinear;
using test::weight_at;

struct Case {
  int n, k, group, n_mats;
  std::vector<int> counts;  // entries per matrix (dense: one count)
  int extra_entries = 0;    // rows of y past the last matrix's entries (left untouched)
  bool pick_rows = false;   // x_rows: a random row of x per entry (else entry e reads row e)
  bool scatter = false;     // y_rows: a random permutation (else entry e writes row e)
  WeightKind kind = WeightKind::kInt4;
};

std::string name(const Case& c) {
  std::string s = std::string(c.kind == WeightKind::kInt8 ? "int8 " : "") + "n " +
                  std::to_string(c.n) + " k " + std::to_string(c.k) + " group " +
                  std::to_string(c.group) + " counts";
  for (const int n : c.counts) s += " " + std::to_string(n);
  return s + (c.pick_rows ? " picked rows" : "") + (c.scatter ? " scattered" : "");
}

// The entries' y from gemm on the device (swiglu or not), NaN-poisoned elsewhere.
struct Product {
  std::vector<float> x, y;
  std::vector<int> offsets, x_rows, y_rows;
  GemmRows rows;
  int entry_at(int row) const {  // the entry that writes row `row` of y
    if (y_rows.empty()) return row;
    return static_cast<int>(std::find(y_rows.begin(), y_rows.end(), row) - y_rows.begin());
  }
};

Product run(const TestLinear& t, const Case& c, bool swiglu, uint64_t seed,
            const std::function<void(std::vector<float>&, size_t)>& shape_x = {}) {
  Rng rng{seed};
  Product r;
  const int entries = std::accumulate(c.counts.begin(), c.counts.end(), 0);
  r.rows.entries = entries + c.extra_entries;
  r.rows.x_count = c.pick_rows ? std::max(1, entries / 2 + 3) : r.rows.entries;
  r.rows.ldx = static_cast<size_t>(c.k) + 4;  // padded rows
  r.rows.ldy = static_cast<size_t>(swiglu ? c.n / 2 : c.n) + 3;
  r.rows.n_mats = c.n_mats;
  r.x.resize(r.rows.x_count * r.rows.ldx);
  for (float& v : r.x) v = rng.uniform(-1.0f, 1.0f);
  if (shape_x) shape_x(r.x, r.rows.ldx);
  if (c.n_mats > 1 || c.counts.size() > 1) {
    r.offsets.push_back(0);
    for (const int n : c.counts) r.offsets.push_back(r.offsets.back() + n);
  }
  if (c.pick_rows) {
    for (int e = 0; e < r.rows.entries; ++e) r.x_rows.push_back(rng.below(r.rows.x_count));
  }
  if (c.scatter) {
    r.y_rows.resize(r.rows.entries);
    std::iota(r.y_rows.begin(), r.y_rows.end(), 0);
    for (int e = r.rows.entries - 1; e > 0; --e) std::swap(r.y_rows[e], r.y_rows[rng.below(e + 1)]);
  }
  DeviceBuffer<float> d_x(r.x.size()), d_y(r.rows.entries * r.rows.ldy);
  DeviceBuffer<int> d_off(r.offsets.size()), d_rows(r.x_rows.size()), d_out(r.y_rows.size());
  QF_CUDA_CHECK(cudaMemcpy(d_x.data(), r.x.data(), d_x.bytes(), cudaMemcpyHostToDevice));
  QF_CUDA_CHECK(cudaMemset(d_y.data(), 0xFF, d_y.bytes()));  // NaN poison
  GemmRows dr = r.rows;
  if (!r.offsets.empty()) {
    QF_CUDA_CHECK(
        cudaMemcpy(d_off.data(), r.offsets.data(), d_off.bytes(), cudaMemcpyHostToDevice));
    dr.offsets = d_off.data();
  }
  if (!r.x_rows.empty()) {
    QF_CUDA_CHECK(
        cudaMemcpy(d_rows.data(), r.x_rows.data(), d_rows.bytes(), cudaMemcpyHostToDevice));
    dr.x_rows = d_rows.data();
  }
  if (!r.y_rows.empty()) {
    QF_CUDA_CHECK(cudaMemcpy(d_out.data(), r.y_rows.data(), d_out.bytes(), cudaMemcpyHostToDevice));
    dr.y_rows = d_out.data();
  }
  DeviceBuffer<uint8_t> scratch(std::max<size_t>(1, gemm_scratch_bytes(t.view(true), dr)));
  EXPECT_EQ(gemm(t.view(true), d_x.data(), d_y.data(), dr, swiglu, scratch.data(), nullptr),
            cudaSuccess);
  QF_CUDA_CHECK(cudaDeviceSynchronize());
  r.y.resize(d_y.size());
  QF_CUDA_CHECK(cudaMemcpy(r.y.data(), d_y.data(), d_y.bytes(), cudaMemcpyDeviceToHost));
  if (!r.offsets.empty()) r.rows.offsets = r.offsets.data();
  if (!r.x_rows.empty()) r.rows.x_rows = r.x_rows.data();
  if (!r.y_rows.empty()) r.rows.y_rows = r.y_rows.data();
  return r;
}

// Matrix of entry e, -1 past the last matrix's entries.
int mat_of(const Product& r, int e) {
  if (r.offsets.empty()) return e < r.rows.entries ? 0 : -1;
  for (size_t j = 0; j + 1 < r.offsets.size(); ++j) {
    if (e >= r.offsets[j] && e < r.offsets[j + 1]) return static_cast<int>(j);
  }
  return -1;
}

void check(const Case& c, uint64_t seed) {
  SCOPED_TRACE(name(c));
  const auto t = make_linear(c.kind, c.n, c.k, c.n_mats, c.group, 128, seed);
  ASSERT_TRUE(gemm_ok(t->view(true), false));
  const Product r = run(*t, c, false, seed + 1);
  std::vector<float> want(r.y.size(), 0.0f);
  gemm_ref(t->view(false), r.x.data(), want.data(), r.rows, false);
  int bad = 0;
  for (int row = 0; row < r.rows.entries; ++row) {
    const int e = r.entry_at(row), j = mat_of(r, e);
    const float* xe = r.x.data() + (r.x_rows.empty() ? e : r.x_rows[e]) * r.rows.ldx;
    for (size_t i = 0; i < r.rows.ldy; ++i) {
      const size_t at = row * r.rows.ldy + i;
      uint32_t bits;
      std::memcpy(&bits, &r.y[at], 4);
      if (j < 0 || i >= static_cast<size_t>(c.n)) {  // not an output: the poison stays
        if (bits != 0xFFFFFFFFu && ++bad <= 5) ADD_FAILURE() << "entry " << e << " [" << i << "]";
        continue;
      }
      double exact = 0.0, abs_sum = 0.0;
      for (int col = 0; col < c.k; ++col) {
        const double p = static_cast<double>(weight_at(*t, j, i, col)) * xe[col];
        exact += p;
        abs_sum += std::fabs(p);
      }
      const double tol = (std::ceil(c.k / 32.0) + 16) * 0x1p-24 * abs_sum;
      if ((std::fabs(static_cast<double>(r.y[at]) - want[at]) > tol ||
           want[at] != static_cast<float>(exact)) &&
          ++bad <= 5) {
        ADD_FAILURE() << "entry " << e << " matrix " << j << " row " << i << ": gpu " << r.y[at]
                      << " ref " << want[at] << " tol " << tol;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(Gemm, DenseEntryCountsAndPartialTiles) {
  QF_REQUIRE_GPU();
  uint64_t seed = 1;
  for (const int entries : {1, 2, 3, 15, 16, 17, 33}) {
    check({40, 256, 128, 1, {entries}}, ++seed);
  }
  check({16, 128, 128, 1, {5}}, ++seed);
  check({200, 384, 128, 1, {20}, 0, true}, ++seed);
}

TEST(Gemm, GroupSizes) {
  QF_REQUIRE_GPU();
  check({48, 512, 256, 1, {9}}, 11);
  check({48, 512, 512, 1, {9}}, 12);  // one group per row
  check({48, 512, 4096, 1, {9}}, 13);
}

TEST(Gemm, RealShapes) {
  QF_REQUIRE_GPU();
  check({3072, 3072, 128, 1, {37}}, 21);           // a 122B-A10B projection, 37 tokens
  check({1024, 3072, 128, 1, {64}, 0, true}, 22);  // 64 tokens
}

TEST(Gemm, GroupedExperts) {
  QF_REQUIRE_GPU();
  // Counts across the pass edges, empty experts, entries past the last expert's.
  check({64, 256, 128, 8, {3, 0, 17, 1, 0, 40, 2, 16}, 5, true}, 31);
  check({128, 3072, 128, 6, {1, 2, 0, 33, 8, 1}, 0, true}, 32);   // 122B routed gate | up
  check({3072, 1024, 128, 3, {4, 0, 19}}, 33);                    // 122B routed down
  check({64, 256, 128, 5, {7, 0, 18, 1, 9}, 4, true, true}, 34);  // rows gathered and scattered
  check({64, 256, 128, 2, {70, 5}}, 35);  // 5 passes of matrix 0 over its 4 blocks
  check({48, 256, 128, 2, {40, 1}, 0, true},
        36);  // more entries than rows of x: 3 passes, 2 blocks
}

// INT8 (the LM head's format, dense): the same bound of the exact sums, as its segments' sums are
// exact too (codes of any byte, zeros of any byte); entry counts around the pass and its pairs,
// partial tiles, a tile range's passes over many blocks, groups, rows picked and scattered, and
// a slice of a 122B-A10B LM head at the prefill's 128 rows.
TEST(Gemm, Int8Dense) {
  QF_REQUIRE_GPU();
  const WeightKind i8 = WeightKind::kInt8;
  uint64_t seed = 71;
  for (const int entries : {1, 2, 3, 15, 16, 17, 33}) {
    check({40, 256, 256, 1, {entries}, 0, false, false, i8}, ++seed);
  }
  check({16, 128, 128, 1, {5}, 0, false, false, i8}, ++seed);
  check({200, 384, 128, 1, {20}, 0, true, true, i8}, ++seed);  // 13 tiles: two blocks
  check({48, 512, 256, 1, {9}, 0, false, false, i8}, ++seed);
  check({48, 512, 4096, 1, {9}, 0, false, false, i8}, ++seed);    // one group per row
  check({24, 256, 256, 1, {1100}, 0, false, false, i8}, ++seed);  // 69 passes over 64 blocks
  check({512, 3072, 3072, 1, {128}, 0, false, false, i8}, ++seed);
}

// With one 128-column segment no order of segments can differ: every entry's row is gemv's bits
// (the same exact integer sums, converted, scaled and added with the same three roundings).
TEST(Gemm, OneSegmentIsGemvBitForBit) {
  QF_REQUIRE_GPU();
  uint64_t seed = 41;
  for (const int n : {16, 40, 64}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const Case c{n, 128, 128, 1, {19}};
    const auto t = make_linear(WeightKind::kInt4, n, 128, 1, 128, 128, ++seed);
    const Product r = run(*t, c, false, ++seed);
    DeviceBuffer<float> d_x(128), d_y(n);
    std::vector<float> y(n);
    int bad = 0;
    for (int e = 0; e < 19; ++e) {
      QF_CUDA_CHECK(
          cudaMemcpy(d_x.data(), r.x.data() + e * r.rows.ldx, d_x.bytes(), cudaMemcpyHostToDevice));
      ASSERT_EQ(gemv(t->view(true), d_x.data(), d_y.data(), GemvBatch{}, nullptr), cudaSuccess);
      QF_CUDA_CHECK(cudaMemcpy(y.data(), d_y.data(), d_y.bytes(), cudaMemcpyDeviceToHost));
      for (int i = 0; i < n; ++i) {
        if (std::memcmp(&y[i], &r.y[e * r.rows.ldy + i], 4) != 0 && ++bad <= 5) {
          ADD_FAILURE() << "entry " << e << " row " << i << ": gemm " << r.y[e * r.rows.ldy + i]
                        << " gemv " << y[i];
        }
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

// FP8 (the shared expert's format, dense): against the exact sums of the decoded weights. x
// enters as two f16 limbs per 128-column segment, within 2^-23 of the segment's power of two
// 2^e (max |x| < 2^e), and the tensor cores sum exact products 16 at a time in f32, so
//   |y - exact| <= sum_c |w_c| 2^(e(c) - 22) + (K / 16 + 16) 2^-22 sum_c |w_c x_c|
// (margins of 2 on both terms). The x rows span 2^-9 .. 2^9 per segment, so a wrong segment
// scale cannot hide; entries around the pass of 32 and its groups of 8, tiles past a block's
// 8, rows picked and scattered, and a 122B-A10B shared expert's shapes.
void check_fp8(int n, int k, int entries, bool pick, uint64_t seed) {
  SCOPED_TRACE("fp8 n " + std::to_string(n) + " k " + std::to_string(k) + " entries " +
               std::to_string(entries) + (pick ? " picked" : ""));
  const auto t = make_linear(WeightKind::kFp8, n, k, 1, 128, 128, seed);
  ASSERT_TRUE(gemm_ok(t->view(true), false));
  EXPECT_FALSE(gemm_ok(t->view(true), true));
  Case c{n, k, 128, 1, {entries}, 0, pick, pick};
  const Product r = run(*t, c, false, seed + 1, [&](std::vector<float>& x, size_t ldx) {
    for (size_t i = 0; i < x.size(); ++i) {  // each segment its own magnitude
      const int seg = static_cast<int>((i % ldx) / 128), row = static_cast<int>(i / ldx);
      x[i] *= std::ldexp(1.0f, (seg * 5 + row * 3) % 19 - 9);
    }
  });
  int bad = 0;
  for (int row = 0; row < r.rows.entries; ++row) {
    const int e = r.entry_at(row);
    const float* xe = r.x.data() + (r.x_rows.empty() ? e : r.x_rows[e]) * r.rows.ldx;
    std::vector<double> seg_scale(k / 128);
    for (int s = 0; s < k / 128; ++s) {
      float mx = 0.0f;
      for (int col = 128 * s; col < 128 * s + 128; ++col) mx = std::max(mx, std::fabs(xe[col]));
      seg_scale[s] = std::ldexp(1.0, std::ilogb(mx) + 1);
    }
    for (int i = 0; i < n; ++i) {
      double exact = 0.0, abs_sum = 0.0, split = 0.0;
      for (int col = 0; col < k; ++col) {
        const double wv = weight_at(*t, 0, i, col);
        exact += wv * xe[col];
        abs_sum += std::fabs(wv * xe[col]);
        split += std::fabs(wv) * seg_scale[col / 128];
      }
      const double tol = 2 * (split * 0x1p-22 + (k / 16 + 16) * 0x1p-22 * abs_sum);
      const float got = r.y[row * r.rows.ldy + i];
      if (!(std::fabs(got - exact) <= tol) && ++bad <= 5) {
        ADD_FAILURE() << "entry " << e << " row " << i << ": gpu " << got << " exact " << exact
                      << " tol " << tol;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(Gemm, Fp8WithinItsSplitBound) {
  QF_REQUIRE_GPU();
  uint64_t seed = 51;
  for (const int entries : {1, 7, 8, 9, 31, 32, 33, 70}) check_fp8(32, 256, entries, false, ++seed);
  check_fp8(48, 128, 5, true, ++seed);       // 3 tiles: a block's other warps idle
  check_fp8(144, 384, 40, true, ++seed);     // 9 tiles: a second block
  check_fp8(2048, 3072, 37, false, ++seed);  // 122B-A10B shared expert gate | up
  check_fp8(3072, 1024, 64, true, ++seed);   // and down
}

// BF16 (the router, the MTP head, BF16 checkpoints; dense or grouped): against the exact sums.
// x enters as three bf16 limbs, their sum within 2^-24 |x|, and the tensor cores sum exact
// products 16 at a time in f32, so |y - exact| <= (2^-24 + (K / 16 + 16) 2^-22) sum_c |w_c x_c|
// (a margin of 2). The x elements span 2^-20 .. 2^20, so a lost limb or a wrong column cannot
// hide at small K; entries around the pass of 32 and its groups of 8, K past whole 64-column
// segments, partial tiles, rows picked and scattered, grouped matrices with empty ones and more
// passes than blocks; nothing written outside the entries' rows.
void check_bf16(const Case& c, uint64_t seed) {
  SCOPED_TRACE("bf16 " + name(c));
  const auto t = make_linear(WeightKind::kBf16, c.n, c.k, c.n_mats, c.group, 128, seed);
  ASSERT_TRUE(gemm_ok(t->view(true), false));
  EXPECT_FALSE(gemm_ok(t->view(true), true));
  const Product r = run(*t, c, false, seed + 1, [](std::vector<float>& x, size_t ldx) {
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] *= std::ldexp(1.0f, static_cast<int>((i % ldx) * 7 + i / ldx * 3) % 41 - 20);
    }
  });
  int bad = 0;
  for (int row = 0; row < r.rows.entries; ++row) {
    const int e = r.entry_at(row), j = mat_of(r, e);
    const float* xe = r.x.data() + (r.x_rows.empty() ? e : r.x_rows[e]) * r.rows.ldx;
    for (size_t i = 0; i < r.rows.ldy; ++i) {
      const float got = r.y[row * r.rows.ldy + i];
      if (j < 0 || i >= static_cast<size_t>(c.n)) {  // not an output: the poison stays
        uint32_t bits;
        std::memcpy(&bits, &got, 4);
        if (bits != 0xFFFFFFFFu && ++bad <= 5) ADD_FAILURE() << "entry " << e << " [" << i << "]";
        continue;
      }
      double exact = 0.0, abs_sum = 0.0;
      for (int col = 0; col < c.k; ++col) {
        const double p =
            static_cast<double>(weight_at(*t, j, static_cast<int64_t>(i), col)) * xe[col];
        exact += p;
        abs_sum += std::fabs(p);
      }
      const double tol = 2 * (0x1p-24 + (c.k / 16 + 16) * 0x1p-22) * abs_sum;
      if (!(std::fabs(got - exact) <= tol) && ++bad <= 5) {
        ADD_FAILURE() << "entry " << e << " matrix " << j << " row " << i << ": gpu " << got
                      << " exact " << exact << " tol " << tol;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(Gemm, Bf16Dense) {
  QF_REQUIRE_GPU();
  uint64_t seed = 81;
  for (const int entries : {1, 7, 8, 9, 31, 32, 33, 70})
    check_bf16({32, 256, 128, 1, {entries}}, ++seed);
  for (const int k : {8, 40, 96, 200, 328}) check_bf16({24, k, 128, 1, {11}}, ++seed);  // K tails
  check_bf16({1, 64, 128, 1, {5}}, ++seed);                                             // one row
  check_bf16({257, 192, 128, 1, {20}, 0, true, true}, ++seed);  // 17 tiles: a partial one
  check_bf16({24, 128, 128, 1, {2100}}, ++seed);                // 66 passes over 64 blocks
  check_bf16({257, 3072, 128, 1, {37}}, ++seed);                // 122B-A10B router | gate
  check_bf16({3072, 6144, 128, 1, {40}, 0, true}, ++seed);      // its MTP head's fc
}

TEST(Gemm, Bf16GroupedExperts) {
  QF_REQUIRE_GPU();
  uint64_t seed = 91;
  check_bf16({64, 256, 128, 8, {3, 0, 17, 1, 0, 40, 2, 16}, 5, true}, ++seed);
  check_bf16({40, 96, 128, 5, {7, 0, 33, 1, 9}, 4, true, true}, ++seed);  // gathered, scattered
  check_bf16({48, 256, 128, 2, {140, 1}, 0, true}, ++seed);  // 5 passes of matrix 0, 3 blocks
  check_bf16({2048, 3072, 128, 4, {30, 0, 41, 5}, 0, true}, ++seed);  // MTP experts' gate | up
  check_bf16({3072, 1024, 128, 3, {33, 2, 0}}, ++seed);               // and down
}

// gemm_route against its host twin (a counting sort): sizes around the warp's window of 32,
// matrix counts up to the limit, ids outside the range (no entry), and a prefill's real shape.
TEST(Gemm, RouteSortsChoicesByMatrix) {
  QF_REQUIRE_GPU();
  Rng rng{61};
  struct R {
    int n, per_x, n_mats;
    bool stray;
  };
  for (const R c : {R{0, 1, 4, false}, R{1, 1, 1, false}, R{31, 8, 3, false}, R{32, 8, 64, false},
                    R{33, 4, 5, true}, R{100, 2, 1024, false}, R{2048, 8, 256, false},
                    R{2048, 8, 256, true}, R{777, 3, 33, true}}) {
    SCOPED_TRACE("n " + std::to_string(c.n) + " mats " + std::to_string(c.n_mats));
    std::vector<int> ids(std::max(c.n, 1));
    for (int& id : ids) id = rng.below(c.n_mats);
    if (c.stray) {
      for (int i = 0; i < c.n; i += 7) ids[i] = i % 2 ? c.n_mats : -1 - i;
    }
    std::vector<int> off(c.n_mats + 1, -1), xr(ids.size(), -1), yr(ids.size(), -1);
    std::vector<int> want_off = off, want_x = xr, want_y = yr;
    gemm_route_ref(ids.data(), c.n, c.per_x, c.n_mats, want_off.data(), want_x.data(),
                   want_y.data());
    DeviceBuffer<int> d_ids(ids.size()), d_off(off.size()), d_x(xr.size()), d_y(yr.size());
    QF_CUDA_CHECK(cudaMemcpy(d_ids.data(), ids.data(), d_ids.bytes(), cudaMemcpyHostToDevice));
    QF_CUDA_CHECK(cudaMemset(d_x.data(), 0xFF, d_x.bytes()));
    QF_CUDA_CHECK(cudaMemset(d_y.data(), 0xFF, d_y.bytes()));
    ASSERT_EQ(gemm_route(d_ids.data(), c.n, c.per_x, c.n_mats, d_off.data(), d_x.data(), d_y.data(),
                         nullptr),
              cudaSuccess);
    QF_CUDA_CHECK(cudaMemcpy(off.data(), d_off.data(), d_off.bytes(), cudaMemcpyDeviceToHost));
    QF_CUDA_CHECK(cudaMemcpy(xr.data(), d_x.data(), d_x.bytes(), cudaMemcpyDeviceToHost));
    QF_CUDA_CHECK(cudaMemcpy(yr.data(), d_y.data(), d_y.bytes(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(off, want_off);
    EXPECT_EQ(xr, want_x);
    EXPECT_EQ(yr, want_y);
    // The ref is a stable counting sort: entries of a matrix in choice order.
    for (int m = 0; m < c.n_mats; ++m) {
      for (int e = want_off[m]; e < want_off[m + 1]; ++e) {
        EXPECT_EQ(ids[want_y[e]], m);
        if (e > want_off[m]) {
          EXPECT_LT(want_y[e - 1], want_y[e]);
        }
      }
    }
  }
  EXPECT_EQ(gemm_route(nullptr, 1, 1, 0, nullptr, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(gemm_route(nullptr, 1, 1, kRouteMaxMats + 1, nullptr, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(gemm_route(nullptr, 1, 0, 4, nullptr, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
}

// swiglu: bit for bit the plain product's paired rows through kern::swiglu.
TEST(Gemm, SwigluIsThePlainRowsThroughSwiglu) {
  QF_REQUIRE_GPU();
  for (const Case& c :
       {Case{64, 256, 128, 1, {19}}, Case{2048, 3072, 128, 4, {5, 0, 21, 2}, 3, true}}) {
    SCOPED_TRACE(name(c));
    const auto t = make_linear(WeightKind::kInt4, c.n, c.k, c.n_mats, c.group, 128, 41);
    ASSERT_TRUE(gemm_ok(t->view(true), true));
    const Product plain = run(*t, c, false, 42), fused = run(*t, c, true, 42);
    const int n_h = c.n / 2, entries = plain.rows.entries;
    std::vector<float> gate(entries * n_h), up(entries * n_h);
    for (int e = 0; e < entries; ++e) {
      for (int j = 0; j < n_h; ++j) {
        gate[e * n_h + j] = plain.y[e * plain.rows.ldy + swiglu_pair_row(j, false)];
        up[e * n_h + j] = plain.y[e * plain.rows.ldy + swiglu_pair_row(j, true)];
      }
    }
    DeviceBuffer<float> d_g(gate.size()), d_u(up.size()), d_h(gate.size());
    QF_CUDA_CHECK(cudaMemcpy(d_g.data(), gate.data(), d_g.bytes(), cudaMemcpyHostToDevice));
    QF_CUDA_CHECK(cudaMemcpy(d_u.data(), up.data(), d_u.bytes(), cudaMemcpyHostToDevice));
    ASSERT_EQ(swiglu(d_g.data(), d_u.data(), n_h, entries, n_h, d_h.data(), nullptr), cudaSuccess);
    std::vector<float> h(gate.size());
    QF_CUDA_CHECK(cudaMemcpy(h.data(), d_h.data(), d_h.bytes(), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int e = 0; e < entries; ++e) {
      const bool out = mat_of(fused, e) >= 0;
      for (size_t j = 0; j < fused.rows.ldy; ++j) {
        const float got = fused.y[e * fused.rows.ldy + j];
        uint32_t gb, wb;
        std::memcpy(&gb, &got, 4);
        const float want = out && j < static_cast<size_t>(n_h) ? h[e * n_h + j] : 0.0f;
        std::memcpy(&wb, &want, 4);
        if (!(out && j < static_cast<size_t>(n_h))) wb = 0xFFFFFFFFu;  // untouched
        if (gb != wb && ++bad <= 5) {
          ADD_FAILURE() << "entry " << e << " [" << j << "]: " << got << " want " << want;
        }
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

TEST(Gemm, RefusesWhatItCannotTake) {
  QF_REQUIRE_GPU();
  const auto t = make_linear(WeightKind::kInt4, 40, 256, 1, 128, 128, 51);
  const auto odd = make_linear(WeightKind::kInt4, 40, 264, 1, 8, 128, 52);  // K % 128 != 0
  const auto f32 = make_linear(WeightKind::kF32, 40, 256, 1, 128, 128, 53);
  GemmRows r;
  r.entries = r.x_count = 1;
  r.ldx = 256;
  r.ldy = 40;
  EXPECT_EQ(gemm(odd->view(true), nullptr, nullptr, r, false, nullptr, nullptr),
            cudaErrorNotSupported);
  EXPECT_EQ(gemm(f32->view(true), nullptr, nullptr, r, false, nullptr, nullptr),
            cudaErrorNotSupported);
  // BF16: K a multiple of 8 (16-byte rows), no SwiGLU epilogue.
  const auto bf16 = make_linear(WeightKind::kBf16, 40, 256, 1, 128, 128, 58);
  const auto bf16_odd = make_linear(WeightKind::kBf16, 40, 68, 1, 128, 128, 59);
  EXPECT_TRUE(gemm_ok(bf16->view(true), false));
  EXPECT_FALSE(gemm_ok(bf16->view(true), true));
  EXPECT_FALSE(gemm_ok(bf16_odd->view(true), false));
  EXPECT_EQ(gemm(bf16_odd->view(true), nullptr, nullptr, r, false, nullptr, nullptr),
            cudaErrorNotSupported);
  EXPECT_FALSE(gemm_ok(t->view(true), true));  // 40 rows cannot pair
  r.ldx = 100;
  EXPECT_EQ(gemm(t->view(true), nullptr, nullptr, r, false, nullptr, nullptr),
            cudaErrorInvalidValue);
  r.ldx = 256;
  r.x_count = 1 << 30;  // its staged segments past 32-bit offsets
  EXPECT_EQ(gemm(t->view(true), nullptr, nullptr, r, false, nullptr, nullptr),
            cudaErrorInvalidValue);
  r.x_count = 1;
  // FP8: dense only, no SwiGLU epilogue, 128 x 128 scale blocks.
  const auto fp8 = make_linear(WeightKind::kFp8, 32, 256, 2, 128, 128, 54);
  const auto fp8_64 = make_linear(WeightKind::kFp8, 32, 256, 1, 128, 64, 55);
  EXPECT_TRUE(gemm_ok(fp8->view(true), false));
  EXPECT_FALSE(gemm_ok(fp8->view(true), true));
  EXPECT_FALSE(gemm_ok(fp8_64->view(true), false));
  DeviceBuffer<int> d_off(3);
  GemmRows grouped = r;
  grouped.n_mats = 2;
  grouped.offsets = d_off.data();
  EXPECT_EQ(gemm(fp8->view(true), nullptr, nullptr, grouped, false, nullptr, nullptr),
            cudaErrorNotSupported);
  // INT8: dense only, no SwiGLU epilogue, K a multiple of 128.
  const auto i8 = make_linear(WeightKind::kInt8, 32, 256, 2, 256, 128, 56);
  const auto i8_odd = make_linear(WeightKind::kInt8, 32, 260, 1, 260, 128, 57);
  EXPECT_TRUE(gemm_ok(i8->view(true), false));
  EXPECT_FALSE(gemm_ok(i8->view(true), true));
  EXPECT_FALSE(gemm_ok(i8_odd->view(true), false));
  EXPECT_EQ(gemm(i8->view(true), nullptr, nullptr, grouped, false, nullptr, nullptr),
            cudaErrorNotSupported);
  r.entries = 0;
  EXPECT_EQ(gemm(t->view(true), nullptr, nullptr, r, false, nullptr, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace qf::kern
