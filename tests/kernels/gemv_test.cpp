// gemv on the GPU against its CPU twin gemv_ref, for every weight format, on random data written
// directly in the kernel layouts (gemv.h): awkward sizes (N = 1..129, K not a multiple of 128,
// partial groups and FP8 blocks, misaligned rows and inputs: the generic path) and the real
// Qwen3.5-122B-A10B shapes (expert gate/up/down, q_proj, the INT8 LM head, the FP8 shared expert,
// the BF16 router), expert batches with repeated and out-of-order ids, and graph replay. The fused
// products (gemv_swiglu, gemv_moe) are gemv_fused_test's.
//
// Tolerance: gemv_check.h. Per-element exactness is checked with one-hot inputs: y = column c of
// W exactly. Skips (and says why) where no CUDA device is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gemv_check.h"

namespace qf::kern {
namespace {

using test::Batch;  // gemv_check.h
using test::expect_poison_outside;
using test::Inputs;
using test::kind_name;
using test::make_inputs;
using test::make_linear;
using test::Rng;
using test::TestLinear;
using test::weight_at;

// Runs gemv and gemv_ref on random x, checks every row against the tolerance (file comment), the
// reference's decoding against weight_at, and that nothing outside the slots' rows was written.
void check(const TestLinear& t, const Batch& b, uint64_t seed) {
  SCOPED_TRACE(std::string(kind_name(t.kind)) + " n " + std::to_string(t.n) + " k " +
               std::to_string(t.k) + " group " + std::to_string(t.group) + " block " +
               std::to_string(t.block) + " slots " + std::to_string(b.n_slots) + " x_stride " +
               std::to_string(b.x_stride) + " y_stride " + std::to_string(b.y_stride) +
               " k_splits " + std::to_string(b.k_splits) + " slots_per_x " +
               std::to_string(b.slots_per_x) + " w_offset " + std::to_string(t.w_offset_bytes));
  Rng rng{seed};
  Inputs in = make_inputs(t, b, rng);
  const std::vector<float>& x = in.x;
  const DeviceBuffer<float>& d_x = in.d_x;
  const GemvBatch& gb = in.gb;
  const size_t y_stride = gb.y_stride;
  const size_t ny = (b.n_slots - 1) * y_stride + (b.k_splits - 1) * b.split_stride + t.n;
  const int64_t cols = b.k_splits > 1 ? split_cols(t.k, b.k_splits) : t.k;  // per part
  DeviceBuffer<float> d_y(ny);
  QF_CUDA_CHECK(cudaMemset(d_y.data(), 0xFF, d_y.bytes()));  // NaN poison
  ASSERT_EQ(gemv(t.view(true), d_x.data(), d_y.data(), gb, nullptr), cudaSuccess);
  QF_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got(ny), want(ny, 0.0f);
  QF_CUDA_CHECK(cudaMemcpy(got.data(), d_y.data(), ny * sizeof(float), cudaMemcpyDeviceToHost));
  gemv_ref(t.view(false), x.data(), want.data(), gb, b.ids.empty() ? nullptr : b.ids.data());

  std::vector<bool> written(ny, false);
  int bad = 0;
  for (int s = 0; s < b.n_slots; ++s) {
    const size_t e = b.ids.empty() ? s : b.ids[s];
    const float* xs = b.x_of(x, s);
    for (int64_t r = 0; r < t.n; ++r) {
      for (int j = 0; j < b.k_splits; ++j) {  // part j: columns [j cols, (j + 1) cols)
        const size_t i = s * y_stride + j * b.split_stride + r;
        written[i] = true;
        double exact = 0.0, abs_sum = 0.0;
        for (int64_t c = j * cols; c < std::min<int64_t>((j + 1) * cols, t.k); ++c) {
          const double p = static_cast<double>(weight_at(t, e, r, c)) * xs[c];
          exact += p;
          abs_sum += std::fabs(p);
        }
        const double tol = (std::ceil(t.k / 32.0) + 16) * 0x1p-24 * abs_sum;
        const bool ok_ref = want[i] == static_cast<float>(exact);
        const bool ok = std::fabs(static_cast<double>(got[i]) - want[i]) <= tol;
        if ((!ok || !ok_ref) && ++bad <= 5) {
          ADD_FAILURE() << "slot " << s << " part " << j << " row " << r << ": gpu " << got[i]
                        << " ref " << want[i] << " own " << exact << " tol " << tol;
        }
      }
    }
  }
  EXPECT_EQ(bad, 0);
  expect_poison_outside(got, written, "y");
}

// One-hot x: y = column c of W must equal the reference exactly (no summation error is left),
// for every column c: every nibble/byte position, group and block edge.
void check_exact_columns(const TestLinear& t) {
  SCOPED_TRACE(std::string(kind_name(t.kind)) + " exact columns, n " + std::to_string(t.n) + " k " +
               std::to_string(t.k) + " w_offset " + std::to_string(t.w_offset_bytes));
  DeviceBuffer<float> d_x(t.k), d_y(t.n);
  std::vector<float> x(t.k, 0.0f), got(t.n), want(t.n);
  int bad = 0;
  for (int c = 0; c < t.k; ++c) {
    x.assign(t.k, 0.0f);
    x[c] = 1.0f;
    QF_CUDA_CHECK(cudaMemcpy(d_x.data(), x.data(), t.k * sizeof(float), cudaMemcpyHostToDevice));
    ASSERT_EQ(gemv(t.view(true), d_x.data(), d_y.data(), GemvBatch{}, nullptr), cudaSuccess);
    QF_CUDA_CHECK(cudaMemcpy(got.data(), d_y.data(), t.n * sizeof(float), cudaMemcpyDeviceToHost));
    gemv_ref(t.view(false), x.data(), want.data(), GemvBatch{}, nullptr);
    for (int r = 0; r < t.n; ++r) {
      const float w = weight_at(t, 0, r, c);
      if ((got[r] != want[r] || want[r] != w) && ++bad <= 5) {
        ADD_FAILURE() << "row " << r << " col " << c << ": gpu " << got[r] << " ref " << want[r]
                      << " weight " << w;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

// Sizes per kind: K multiple of 8 (INT4) / 4 (INT8) as the layout needs; fast-path sizes (rows of
// whole 16-byte chunks) and generic ones (K = 136: 68-byte INT4 rows; odd K for float kinds).
std::vector<int> awkward_k(WeightKind kind) {
  switch (kind) {
    case WeightKind::kInt4:  // multiples of 128 (and <= 10240): the tensor-core kernel
      return {8, 24, 32, 128, 136, 1000, 1056, 1152, 3072, 4128};
    case WeightKind::kInt8:
      return {4, 12, 16, 136, 1000, 1040, 3072};
    default:
      return {1, 3, 8, 24, 33, 136, 1000, 1040, 3072};
  }
}

class GemvKinds : public ::testing::TestWithParam<WeightKind> {};

TEST_P(GemvKinds, AwkwardSizes) {
  QF_REQUIRE_GPU();
  const WeightKind kind = GetParam();
  uint64_t seed = 1;
  for (int k : awkward_k(kind)) {
    for (int n : {1, 3, 31, 33, 127, 129}) {
      const auto t = make_linear(kind, n, k, 1, 128, 128, ++seed);
      check(*t, Batch{}, ++seed);
    }
  }
}

// Enough rows for 4 rows per warp (and, at 100000 x 64, a persistent grid of resident blocks).
TEST_P(GemvKinds, ManyRows) {
  QF_REQUIRE_GPU();
  const WeightKind kind = GetParam();
  uint64_t seed = 300;
  for (const auto& [n, k] : {std::pair{4500, 1040}, std::pair{4500, 3072}, std::pair{100000, 64}}) {
    const int kk = kind == WeightKind::kInt4 && k == 1040 ? 1152 : k;  // INT4 tensor cores: K % 128
    const auto t = make_linear(kind, n, kk, 1, 128, 128, ++seed);
    check(*t, Batch{}, ++seed);
  }
}

TEST_P(GemvKinds, GroupsAndBlocks) {
  QF_REQUIRE_GPU();
  const WeightKind kind = GetParam();
  if (kind == WeightKind::kBf16 || kind == WeightKind::kF32) GTEST_SKIP() << "no scales";
  uint64_t seed = 100;
  // Groups/blocks that are multiples of a chunk (fast path), that are not (generic), larger
  // than K, and that leave a partial last group/block (K = 1056 / 1040 with 128).
  const int unit = kind == WeightKind::kInt4 ? 8 : 4;
  for (int gb : {16, 32, 48, 64, 100, 128, 256, 4096}) {
    if (kind != WeightKind::kFp8 && gb % unit != 0) continue;
    for (int k : {kind == WeightKind::kInt4 ? 1056 : 1040, 3072}) {
      for (int n : {33, 129, 300}) {
        const auto t = make_linear(kind, n, k, 1, gb, gb, ++seed);
        check(*t, Batch{}, ++seed);
      }
    }
  }
}

TEST_P(GemvKinds, ExactPerElement) {
  QF_REQUIRE_GPU();
  const WeightKind kind = GetParam();
  const int k = kind == WeightKind::kInt4 ? 320 : kind == WeightKind::kInt8 ? 176 : 144;
  const int group = kind == WeightKind::kInt4 ? 64 : 32;
  for (size_t offset : {size_t{0}, size_t{4}}) {  // fast path, generic path
    const auto t = make_linear(kind, 37, k, 1, group, 32, 7 + offset, offset);
    check_exact_columns(*t);
  }
  if (kind == WeightKind::kInt4) {  // the tensor-core kernel: K % 128 == 0, groups of 128
    const auto t = make_linear(kind, 37, 256, 1, 128, 32, 9);
    check_exact_columns(*t);
  }
}

TEST_P(GemvKinds, MisalignedRowsAndInputs) {
  QF_REQUIRE_GPU();
  const WeightKind kind = GetParam();
  const int k = kind == WeightKind::kInt4 ? 1024 : 1040;
  const auto t = make_linear(kind, 65, k, 3, 128, 128, 31, 4);  // rows 4 bytes off: generic
  check(*t, Batch{3, {2, 0, 2}, static_cast<size_t>(k) + 1, 70}, 32);
  const auto a = make_linear(kind, 65, k, 3, 128, 128, 33);  // aligned rows, x off by 1 float
  check(*a, Batch{3, {2, 0, 2}, static_cast<size_t>(k) + 1, 70}, 34);
}

TEST_P(GemvKinds, ExpertBatch) {
  QF_REQUIRE_GPU();
  const WeightKind kind = GetParam();
  const auto t = make_linear(kind, 96, 1024, 12, 128, 128, 41);
  const std::vector<int> ids = {7, 2, 7, 0, 11, 3, 3, 5};
  check(*t, Batch{8, ids, 0, 96}, 42);        // one shared x
  check(*t, Batch{8, ids, 1024, 101}, 43);    // x per slot, gaps between outputs
  check(*t, Batch{3, {}, 1024 + 4, 96}, 44);  // no ids: slot s uses expert s
  check(*t, Batch{1, {11}, 0, 0}, 45);        // one slot through ids
}

INSTANTIATE_TEST_SUITE_P(All, GemvKinds,
                         ::testing::Values(WeightKind::kBf16, WeightKind::kF32, WeightKind::kInt4,
                                           WeightKind::kInt8, WeightKind::kFp8),
                         [](const ::testing::TestParamInfo<WeightKind>& i) {
                           return std::string(kind_name(i.param));
                         });

// ---- Qwen3.5-122B-A10B shapes (hidden 3072, expert inter 1024, 32 x 2 x 256 q_proj) ----------

TEST(GemvRealShapes, Int4ExpertGateUpAndDown) {
  QF_REQUIRE_GPU();
  const std::vector<int> ids = {201, 17, 88, 17, 3, 255, 140, 64};
  const auto gate = make_linear(WeightKind::kInt4, 1024, 3072, 256, 128, 128, 51);
  check(*gate, Batch{8, ids, 0, 1024}, 52);
  const auto down = make_linear(WeightKind::kInt4, 3072, 1024, 256, 128, 128, 53);
  check(*down, Batch{8, ids, 1024, 3072}, 54);  // each slot's own activation
}

// Slots sharing inputs (GemvBatch::slots_per_x): two tokens' routed experts, 8 slots on each
// token's x, in one launch; and odd groupings on every format.
TEST(GemvRealShapes, Int4ExpertsOfTwoTokens) {
  QF_REQUIRE_GPU();
  const std::vector<int> ids = {201, 17, 88, 17, 3, 255, 140, 64, 17, 5, 201, 99, 0, 64, 7, 8};
  const auto gate = make_linear(WeightKind::kInt4, 1024, 3072, 256, 128, 128, 55);
  Batch b{16, ids, 3072 + 4, 1024};
  b.slots_per_x = 8;
  check(*gate, b, 56);
  for (const WeightKind kind :
       {WeightKind::kBf16, WeightKind::kInt4, WeightKind::kInt8, WeightKind::kFp8}) {
    const auto t = make_linear(kind, 100, 1024, 5, 128, 128, 57);
    Batch odd{5, {4, 0, 4, 2, 1}, 1024 + 8, 128};
    odd.slots_per_x = 2;  // x rows 0, 0, 1, 1, 2
    check(*t, odd, 58);
  }
}

TEST(GemvRealShapes, Int4QProj) {
  QF_REQUIRE_GPU();
  const auto t = make_linear(WeightKind::kInt4, 16384, 3072, 1, 128, 128, 61);
  check(*t, Batch{}, 62);
}

// The DeltaNet in_proj (qkv | z | b | a, 20608 rows) and the out / o projection (K = 8192):
// the widest and the deepest INT4 products of a step, each launched with its own items per block.
TEST(GemvRealShapes, Int4GdnInProjAndOutProj) {
  QF_REQUIRE_GPU();
  const auto in = make_linear(WeightKind::kInt4, 20608, 3072, 1, 128, 128, 63);
  check(*in, Batch{}, 64);
  const auto out = make_linear(WeightKind::kInt4, 3072, 8192, 1, 128, 128, 65);
  check(*out, Batch{}, 66);
}

// K split into parts (GemvBatch::k_splits): each part's partial product over its columns, in
// place of the whole, for the out projection and for awkward splits (uneven last part, parts of
// one segment, experts with their own x, outputs with gaps).
TEST(GemvKSplit, PartsArePartialProductsOverTheirColumns) {
  QF_REQUIRE_GPU();
  const auto out = make_linear(WeightKind::kInt4, 3072, 8192, 1, 128, 128, 67);
  check(*out, Batch{1, {}, 0, 0, 2, 3072}, 68);
  const auto odd = make_linear(WeightKind::kInt4, 200, 1152, 6, 128, 128, 69);  // 9 segments
  check(*odd, Batch{1, {}, 0, 0, 2, 200 + 7}, 70);  // parts of 5 and 4 segments
  check(*odd, Batch{1, {}, 0, 0, 9, 256}, 71);      // one segment each
  check(*odd, Batch{3, {4, 0, 4}, 1152 + 4, 3 * 256, 3, 256}, 72);
  const auto whole = make_linear(WeightKind::kInt4, 40, 1024, 1, 1024, 128, 73);  // group = K
  check(*whole, Batch{1, {}, 0, 0, 2, 40}, 74);
  // More items (K part x tile) than any GPU holds blocks, so blocks take runs of them that
  // cross part edges (1002 tiles a part), the partial last tile and the short last part (3, 3
  // and 2 segments: empty units), in two slots with their own x.
  constexpr int kMany = 16 * 1001 + 5;
  const auto many = make_linear(WeightKind::kInt4, kMany, 1024, 3, 256, 128, 76);
  check(*many, Batch{2, {2, 0}, 1024, 3 * kMany, 3, kMany}, 77);
  // Not on other formats or with more parts than segments: refused, nothing written.
  const auto bf16 = make_linear(WeightKind::kBf16, 64, 1024, 1, 128, 128, 75);
  DeviceBuffer<float> d_x(1024), d_y(256);
  GemvBatch gb;
  gb.k_splits = 2;
  gb.split_stride = 64;
  EXPECT_FALSE(gemv_k_split_ok(bf16->view(true), gb));
  EXPECT_EQ(gemv(bf16->view(true), d_x.data(), d_y.data(), gb, nullptr), cudaErrorInvalidValue);
  gb.k_splits = 9;
  EXPECT_FALSE(gemv_k_split_ok(whole->view(true), gb));
}

TEST(GemvRealShapes, Int8LmHead) {
  QF_REQUIRE_GPU();
  const auto t = make_linear(WeightKind::kInt8, 248320, 3072, 1, 3072, 128, 71);  // per row
  check(*t, Batch{}, 72);
}

TEST(GemvRealShapes, Fp8SharedExpertAndBf16Router) {
  QF_REQUIRE_GPU();
  const auto up = make_linear(WeightKind::kFp8, 1024, 3072, 1, 128, 128, 81);
  check(*up, Batch{}, 82);
  const auto down = make_linear(WeightKind::kFp8, 3072, 1024, 1, 128, 128, 83);
  check(*down, Batch{}, 84);
  const auto router = make_linear(WeightKind::kBf16, 256, 3072, 1, 128, 128, 85);
  check(*router, Batch{}, 86);
}

// ids are read on the device at run time: a captured graph follows new ids without re-capture.
// With ids_early (ids written before the launch just before: here a copy ahead of the graph) the
// INT4 kernel reads them before its PDL wait; the products are the same, bit for bit.
TEST(GemvGraph, ReplayFollowsDeviceIds) {
  QF_REQUIRE_GPU();
  const auto t = make_linear(WeightKind::kInt4, 256, 1024, 6, 128, 128, 91);
  Rng rng{92};
  std::vector<float> x(1024);
  for (float& v : x) v = rng.uniform(-1.0f, 1.0f);
  DeviceBuffer<float> d_x(1024), d_y(4 * 256);
  DeviceBuffer<int> d_ids(4);
  QF_CUDA_CHECK(cudaMemcpy(d_x.data(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  cudaStream_t stream;
  QF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<std::vector<float>> first;  // per ids set, ids_early = false
  for (bool early : {false, true}) {
    GemvBatch gb;
    gb.n_slots = 4;
    gb.ids = d_ids.data();
    gb.y_stride = 256;
    gb.ids_early = early;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    QF_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    ASSERT_EQ(gemv(t->view(true), d_x.data(), d_y.data(), gb, stream), cudaSuccess);
    QF_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    QF_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    int set = 0;
    for (const std::vector<int>& ids : {std::vector<int>{0, 1, 2, 3}, {5, 5, 1, 4}}) {
      QF_CUDA_CHECK(cudaMemcpyAsync(d_ids.data(), ids.data(), 16, cudaMemcpyHostToDevice, stream));
      QF_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      QF_CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<float> got(4 * 256), want(4 * 256);
      QF_CUDA_CHECK(cudaMemcpy(got.data(), d_y.data(), d_y.bytes(), cudaMemcpyDeviceToHost));
      gemv_ref(t->view(false), x.data(), want.data(), gb, ids.data());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << "i " << i;
      }
      if (early) {
        EXPECT_EQ(got, first[set]) << "ids set " << set;
      } else {
        first.push_back(got);
      }
      ++set;
    }
    QF_CUDA_CHECK(cudaGraphExecDestroy(exec));
    QF_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  QF_CUDA_CHECK(cudaStreamDestroy(stream));
}

// Host-side checks of the contract: these need no device.
TEST(GemvArgs, RejectsBadShapesAndAcceptsEmpty) {
  DeviceLinear w;
  w.kind = WeightKind::kInt4;
  w.n = 4;
  w.k = 12;  // not a multiple of 8
  float dummy = 0;
  w.w = &dummy;
  w.scales = reinterpret_cast<const __half*>(&dummy);
  w.zeros = reinterpret_cast<const uint8_t*>(&dummy);
  EXPECT_EQ(gemv(w, &dummy, &dummy, GemvBatch{}, nullptr), cudaErrorInvalidValue);
  w.k = 16;
  w.group = 0;
  EXPECT_EQ(gemv(w, &dummy, &dummy, GemvBatch{}, nullptr), cudaErrorInvalidValue);
  w.kind = WeightKind::kFp8;
  w.block_scale = nullptr;
  EXPECT_EQ(gemv(w, &dummy, &dummy, GemvBatch{}, nullptr), cudaErrorInvalidValue);
  w.n = 0;  // nothing to do: no launch
  EXPECT_EQ(gemv(w, &dummy, &dummy, GemvBatch{}, nullptr), cudaSuccess);
}

TEST(GemvArgs, WeightBytes) {
  DeviceLinear w;
  w.kind = WeightKind::kInt4;
  w.n = 1024;
  w.k = 3072;
  EXPECT_EQ(weight_bytes(w), 1024u * 1536 + 1024u * 24 * 3);
  w.k = 3100 / 8 * 8;  // 3096: 25 groups, the last partial
  EXPECT_EQ(weight_bytes(w), 1024u * 1548 + 1024u * 25 * 3);
  w.kind = WeightKind::kInt8;
  w.group = 3072;
  w.n = 248320;
  w.k = 3072;
  EXPECT_EQ(weight_bytes(w), 248320ull * 3072 + 248320ull * 3);
  w.kind = WeightKind::kFp8;
  w.n = 1000;
  w.k = 3072;
  EXPECT_EQ(weight_bytes(w), 1000u * 3072 + 8u * 24 * 4);
  w.kind = WeightKind::kBf16;
  EXPECT_EQ(weight_bytes(w), 1000u * 3072 * 2);
}

}  // namespace
}  // namespace qf::kern
