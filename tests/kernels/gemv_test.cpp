// gemv on the GPU against its CPU twin gemv_ref, for every weight format, on random data written
// directly in the kernel layouts (gemv.h): awkward sizes (N = 1..129, K not a multiple of 128,
// partial groups and FP8 blocks, misaligned rows and inputs: the generic path) and the real
// Qwen3.5-122B-A10B shapes (expert gate/up/down, q_proj, the INT8 LM head, the FP8 shared expert,
// the BF16 router), expert batches with repeated and out-of-order ids, and graph replay;
// gemv_swiglu, the gate|up product with SwiGLU in its epilogue (its own tolerance, below); and
// gemv_moe, the routed experts with the FP8 shared expert in the same launch.
//
// Tolerance: gemv_ref is the exact dot product of the exactly reconstructed weights, rounded once
// (it sums the exact products in double). The kernel forms the same products exactly (fma) and
// sums them in fp32 through a tree of depth at most ceil(K/32) + 8 (a lane's chain plus the warp
// reduction; the generic path's lanes take whole words), so per row
//   |y - ref| <= (ceil(K/32) + 16) * 2^-24 * sum_c |w_rc * x_c|,
// the standard bound gamma_n * sum|terms| with margin for the reference's own final rounding.
// Per-element exactness is checked with one-hot inputs: y = column c of W exactly.
// Skips (and says why) where no CUDA device is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gpu_test.h"
#include "mixer_check.h"
#include "qf/kern/device_buffer.h"
#include "qf/kern/gemv.h"
#include "qf/kern/ops.h"
#include "qf/quant/formats.h"

namespace qf::kern {
namespace {

using test::Rng;  // mixer_check.h

const char* kind_name(WeightKind k) {
  switch (k) {
    case WeightKind::kBf16:
      return "bf16";
    case WeightKind::kF32:
      return "f32";
    case WeightKind::kInt4:
      return "int4";
    case WeightKind::kInt8:
      return "int8";
    case WeightKind::kFp8:
      return "fp8";
  }
  return "?";
}

// A stack of `n_experts` equal matrices in the kernel layout, on the host and on the device.
// `w_offset_bytes` places the codes that many bytes into their buffer (misaligned rows: generic
// path); experts are packed back to back, so w_stride is one matrix.
struct TestLinear {
  WeightKind kind;
  int n, k, n_experts, group, block;
  size_t w_elems = 0, n_scales = 0;  // per expert
  std::vector<uint8_t> w;            // codes, w_offset_bytes first
  std::vector<uint16_t> scales;      // f16 bits
  std::vector<uint8_t> zeros;
  std::vector<float> block_scale;
  size_t w_offset_bytes = 0;
  DeviceBuffer<uint8_t> d_w, d_zeros;
  DeviceBuffer<uint16_t> d_scales;
  DeviceBuffer<float> d_block_scale;

  size_t elem_bytes() const {
    return kind == WeightKind::kBf16 ? 2 : kind == WeightKind::kFp8 ? 1 : 4;
  }
  DeviceLinear view(bool device) const {
    DeviceLinear d;
    d.kind = kind;
    d.n = n;
    d.k = k;
    d.group = group;
    d.block = block;
    d.w = (device ? d_w.data() : w.data()) + w_offset_bytes;
    d.scales = reinterpret_cast<const __half*>(device ? d_scales.data() : scales.data());
    d.zeros = device ? d_zeros.data() : zeros.data();
    d.block_scale = device ? d_block_scale.data() : block_scale.data();
    d.w_stride = w_elems;
    d.scale_stride = d.zero_stride = n_scales;
    d.block_scale_stride = n_scales;
    if (kind != WeightKind::kInt4 && kind != WeightKind::kInt8)
      d.scales = nullptr, d.zeros = nullptr;
    if (kind != WeightKind::kFp8) d.block_scale = nullptr;
    return d;
  }
};

uint16_t random_scale(Rng& rng) {
  if (rng.below(10) == 0) return static_cast<uint16_t>(rng.below(0x400) | (rng.below(2) << 15));
  const float s = rng.uniform(1e-3f, 2e-2f) * (rng.below(2) ? -1.0f : 1.0f);  // AutoRound: signed
  return quant::f32_to_f16(s);
}

std::unique_ptr<TestLinear> make_linear(WeightKind kind, int n, int k, int n_experts, int group,
                                        int block, uint64_t seed, size_t w_offset_bytes = 0) {
  auto t = std::make_unique<TestLinear>();
  t->kind = kind;
  t->n = n;
  t->k = k;
  t->n_experts = n_experts;
  t->group = group;
  t->block = block;
  t->w_offset_bytes = w_offset_bytes;
  Rng rng{seed};
  const size_t nn = static_cast<size_t>(n), kk = static_cast<size_t>(k);
  const size_t ne = static_cast<size_t>(n_experts);
  switch (kind) {
    case WeightKind::kBf16:
      t->w_elems = nn * kk;
      break;
    case WeightKind::kF32:
      t->w_elems = nn * kk;
      break;
    case WeightKind::kInt4:
      t->w_elems = nn * kk / 8;
      t->n_scales = nn * ((kk + group - 1) / group);
      break;
    case WeightKind::kInt8:
      t->w_elems = nn * kk / 4;
      t->n_scales = nn * ((kk + group - 1) / group);
      break;
    case WeightKind::kFp8:
      t->w_elems = nn * kk;
      t->n_scales = ((nn + block - 1) / block) * ((kk + block - 1) / block);
      break;
  }
  const size_t w_bytes = t->w_elems * t->elem_bytes() * ne;
  t->w.resize(w_offset_bytes + w_bytes);
  uint8_t* w = t->w.data() + w_offset_bytes;
  if (kind == WeightKind::kBf16) {
    for (size_t i = 0; i < w_bytes / 2; ++i) {
      const uint16_t b = quant::f32_to_bf16(rng.uniform(-1.0f, 1.0f));
      std::memcpy(w + 2 * i, &b, 2);
    }
  } else if (kind == WeightKind::kF32) {
    for (size_t i = 0; i < w_bytes / 4; ++i) {
      const float f = rng.uniform(-1.0f, 1.0f);
      std::memcpy(w + 4 * i, &f, 4);
    }
  } else if (kind == WeightKind::kFp8) {
    for (size_t i = 0; i < w_bytes; ++i) {
      uint8_t c = static_cast<uint8_t>(rng.next());
      if ((c & 0x7F) == 0x7F) c ^= 1;  // no NaN codes
      w[i] = c;
    }
  } else {
    size_t i = 0;
    for (; i + 8 <= w_bytes; i += 8) {
      const uint64_t r = rng.next();
      std::memcpy(w + i, &r, 8);
    }
    for (; i < w_bytes; ++i) w[i] = static_cast<uint8_t>(rng.next());
  }
  if (kind == WeightKind::kInt4 || kind == WeightKind::kInt8) {
    t->scales.resize(t->n_scales * ne);
    t->zeros.resize(t->n_scales * ne);
    for (uint16_t& s : t->scales) s = random_scale(rng);
    // INT4 holds the v1 zero point + 1 (1..16; 0 too, for coverage); INT8 any byte.
    for (uint8_t& z : t->zeros)
      z = static_cast<uint8_t>(kind == WeightKind::kInt4 ? rng.below(17) : rng.below(256));
  }
  if (kind == WeightKind::kFp8) {
    t->block_scale.resize(t->n_scales * ne);
    for (float& s : t->block_scale) s = rng.uniform(1e-4f, 1e-2f);
  }
  t->d_w = DeviceBuffer<uint8_t>(t->w.size());
  QF_CUDA_CHECK(cudaMemcpy(t->d_w.data(), t->w.data(), t->w.size(), cudaMemcpyHostToDevice));
  if (!t->scales.empty()) {
    t->d_scales = DeviceBuffer<uint16_t>(t->scales.size());
    t->d_zeros = DeviceBuffer<uint8_t>(t->zeros.size());
    QF_CUDA_CHECK(cudaMemcpy(t->d_scales.data(), t->scales.data(), t->d_scales.bytes(),
                             cudaMemcpyHostToDevice));
    QF_CUDA_CHECK(
        cudaMemcpy(t->d_zeros.data(), t->zeros.data(), t->d_zeros.bytes(), cudaMemcpyHostToDevice));
  }
  if (!t->block_scale.empty()) {
    t->d_block_scale = DeviceBuffer<float>(t->block_scale.size());
    QF_CUDA_CHECK(cudaMemcpy(t->d_block_scale.data(), t->block_scale.data(),
                             t->d_block_scale.bytes(), cudaMemcpyHostToDevice));
  }
  return t;
}

// W[r][c] of expert e, decoded independently of gemv_ref (formats.h scalars, own indexing).
float weight_at(const TestLinear& t, size_t e, int64_t r, int64_t c) {
  const uint8_t* w = t.w.data() + t.w_offset_bytes + e * t.w_elems * t.elem_bytes();
  const int64_t k = t.k;
  switch (t.kind) {
    case WeightKind::kBf16: {
      uint16_t b;
      std::memcpy(&b, w + 2 * (r * k + c), 2);
      return quant::bf16_to_f32(b);
    }
    case WeightKind::kF32: {
      float f;
      std::memcpy(&f, w + 4 * (r * k + c), 4);
      return f;
    }
    case WeightKind::kInt4:
    case WeightKind::kInt8: {
      const int bits = t.kind == WeightKind::kInt4 ? 4 : 8, per = 32 / bits;
      // Word and nibble/byte of column c in its row (rows are whole words: K % per == 0). INT4
      // 128-column segments (gemv.h): column 32 b + 16 half + 4 q + i of a segment sits in word
      // 4 q + 2 (b / 2) + half, byte i, high nibble for odd b.
      int64_t word = c / per, pos = c % per;
      if (bits == 4 && c < k / 128 * 128) {
        const int64_t cc = c % 128, b = cc / 32, half = cc % 32 / 16, q = cc % 16 / 4, i = cc % 4;
        word = c / 128 * 16 + 4 * q + 2 * (b / 2) + half;
        pos = 2 * i + b % 2;
      }
      // Tiled INT4 (K % 128 == 0, K <= 10240): whole tiles of 16 rows hold, per segment, 64
      // quarters: quarter q of row 16T + 8h + g at slot 32h + 4g + q.
      int64_t index = r * (k / per) + word;
      if (bits == 4 && k % 128 == 0 && k <= 10240 && r < t.n / 16 * 16) {
        const int64_t rl = r % 16, slot = 32 * (rl / 8) + 4 * (rl % 8) + word % 16 / 4;
        index = r / 16 * 16 * (k / 8) + word / 16 * 256 + slot * 4 + word % 4;
      }
      uint32_t u;
      std::memcpy(&u, w + 4 * index, 4);
      const uint32_t code = (u >> (bits * pos)) & ((1u << bits) - 1);
      const size_t g =
          e * t.n_scales + static_cast<size_t>(r * ((k + t.group - 1) / t.group) + c / t.group);
      const float scale = quant::f16_to_f32(t.scales[g]);
      return scale * static_cast<float>(static_cast<int>(code) - static_cast<int>(t.zeros[g]));
    }
    case WeightKind::kFp8: {
      const int64_t cb = (k + t.block - 1) / t.block;
      const float s =
          t.block_scale[e * t.n_scales + static_cast<size_t>((r / t.block) * cb + c / t.block)];
      return quant::e4m3fn_to_f32(w[r * k + c]) * s;
    }
  }
  return 0.0f;
}

struct Batch {
  int n_slots = 1;
  std::vector<int> ids;  // empty: slot s uses expert s
  size_t x_stride = 0, y_stride = 0;
  int k_splits = 1;  // parts of K, split_stride floats apart in y
  size_t split_stride = 0;
};

// Random x in [-1, 1) for every slot of `b` and the ids, on the host and on the device, with the
// batch gemv takes (outputs `y_stride` apart, 0 for one slot).
struct Inputs {
  std::vector<float> x;
  DeviceBuffer<float> d_x;
  DeviceBuffer<int> d_ids;
  GemvBatch gb;
};

Inputs make_inputs(const TestLinear& t, const Batch& b, Rng& rng) {
  const size_t nx = (b.n_slots - 1) * b.x_stride + t.k;
  Inputs in{std::vector<float>(nx), DeviceBuffer<float>(nx), DeviceBuffer<int>(b.ids.size()), {}};
  for (float& v : in.x) v = rng.uniform(-1.0f, 1.0f);
  QF_CUDA_CHECK(cudaMemcpy(in.d_x.data(), in.x.data(), nx * sizeof(float), cudaMemcpyHostToDevice));
  if (!b.ids.empty()) {
    QF_CUDA_CHECK(cudaMemcpy(in.d_ids.data(), b.ids.data(), b.ids.size() * sizeof(int),
                             cudaMemcpyHostToDevice));
  }
  in.gb.n_slots = b.n_slots;
  in.gb.ids = b.ids.empty() ? nullptr : in.d_ids.data();
  in.gb.x_stride = b.x_stride;
  in.gb.y_stride = b.n_slots > 1 ? b.y_stride : 0;
  in.gb.k_splits = b.k_splits;
  in.gb.split_stride = b.split_stride;
  return in;
}

// Runs gemv and gemv_ref on random x, checks every row against the tolerance (file comment), the
// reference's decoding against weight_at, and that nothing outside the slots' rows was written.
void check(const TestLinear& t, const Batch& b, uint64_t seed) {
  SCOPED_TRACE(std::string(kind_name(t.kind)) + " n " + std::to_string(t.n) + " k " +
               std::to_string(t.k) + " group " + std::to_string(t.group) + " block " +
               std::to_string(t.block) + " slots " + std::to_string(b.n_slots) + " x_stride " +
               std::to_string(b.x_stride) + " y_stride " + std::to_string(b.y_stride) +
               " k_splits " + std::to_string(b.k_splits) + " w_offset " +
               std::to_string(t.w_offset_bytes));
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
    const float* xs = x.data() + s * b.x_stride;
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
  for (size_t i = 0; i < ny; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &got[i], 4);
    if (!written[i]) {
      ASSERT_EQ(bits, 0xFFFFFFFFu) << "y[" << i << "] outside the slots' rows written";
    }
  }
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
  std::vector<float> got(nh), unfused(static_cast<size_t>(b.n_slots) * n_h), want(nh, 0.0f);
  QF_CUDA_CHECK(cudaMemcpy(got.data(), d_h.data(), nh * sizeof(float), cudaMemcpyDeviceToHost));
  QF_CUDA_CHECK(cudaMemcpy(unfused.data(), d_h2.data(), d_h2.bytes(), cudaMemcpyDeviceToHost));
  gemv_swiglu_ref(t.view(false), x.data(), want.data(), gb, b.ids.empty() ? nullptr : b.ids.data());

  std::vector<bool> written(nh, false);
  int bad = 0;
  for (int s = 0; s < b.n_slots; ++s) {
    const size_t e = b.ids.empty() ? s : b.ids[s];
    const float* xs = x.data() + s * b.x_stride;
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
  for (size_t i = 0; i < nh; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &got[i], 4);
    if (!written[i]) {
      ASSERT_EQ(bits, 0xFFFFFFFFu) << "h[" << i << "] outside the slots' rows written";
    }
  }
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
// nothing past the shared outputs written.
void check_moe(const TestLinear& ex, const Batch& b, bool swiglu, const TestLinear& sh,
               uint64_t seed) {
  SCOPED_TRACE(std::string("moe ") + (swiglu ? "gate|up" : "down") + " experts n " +
               std::to_string(ex.n) + " k " + std::to_string(ex.k) + ", shared n " +
               std::to_string(sh.n) + " k " + std::to_string(sh.k) + " block " +
               std::to_string(sh.block) + " slots " + std::to_string(b.n_slots));
  Rng rng{seed};
  Inputs in = make_inputs(ex, b, rng);
  const size_t n_out = swiglu ? ex.n / 2 : ex.n, sh_out = swiglu ? sh.n / 2 : sh.n;
  const size_t ny = (b.n_slots - 1) * in.gb.y_stride + n_out;
  std::vector<float> xs(static_cast<size_t>(sh.k));
  for (float& v : xs) v = rng.uniform(-1.0f, 1.0f);
  DeviceBuffer<float> d_xs(xs.size()), d_y(ny), d_y2(ny), d_ys(sh_out + 8);
  QF_CUDA_CHECK(cudaMemcpy(d_xs.data(), xs.data(), d_xs.bytes(), cudaMemcpyHostToDevice));
  for (auto* d : {&d_y, &d_y2, &d_ys}) QF_CUDA_CHECK(cudaMemset(d->data(), 0xFF, d->bytes()));
  const SharedProduct sp{sh.view(true), d_xs.data(), d_ys.data()};
  ASSERT_TRUE(gemv_moe_ok(ex.view(true), in.gb, swiglu, sp));
  ASSERT_EQ(gemv_moe(ex.view(true), in.d_x.data(), d_y.data(), in.gb, swiglu, sp, nullptr),
            cudaSuccess);
  ASSERT_EQ(swiglu ? gemv_swiglu(ex.view(true), in.d_x.data(), d_y2.data(), in.gb, nullptr)
                   : gemv(ex.view(true), in.d_x.data(), d_y2.data(), in.gb, nullptr),
            cudaSuccess);
  QF_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> y(ny), y2(ny), ys(sh_out + 8), want_y(ny), want_s(sh_out);
  QF_CUDA_CHECK(cudaMemcpy(y.data(), d_y.data(), d_y.bytes(), cudaMemcpyDeviceToHost));
  QF_CUDA_CHECK(cudaMemcpy(y2.data(), d_y2.data(), d_y2.bytes(), cudaMemcpyDeviceToHost));
  QF_CUDA_CHECK(cudaMemcpy(ys.data(), d_ys.data(), d_ys.bytes(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(y.data(), y2.data(), ny * sizeof(float)), 0) << "routed slots differ";
  const SharedProduct host{sh.view(false), xs.data(), want_s.data()};
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
    const bool ok_ref = want_s[j] == static_cast<float>(own);
    const bool ok = std::fabs(static_cast<double>(ys[j]) - want_s[j]) <= tol;
    if ((!ok || !ok_ref) && ++bad <= 5) {
      ADD_FAILURE() << "shared output " << j << ": gpu " << ys[j] << " ref " << want_s[j] << " own "
                    << own << " tol " << tol;
    }
  }
  EXPECT_EQ(bad, 0);
  for (size_t j = sh_out; j < ys.size(); ++j) {
    uint32_t bits;
    std::memcpy(&bits, &ys[j], 4);
    ASSERT_EQ(bits, 0xFFFFFFFFu) << "shared y[" << j << "] past its outputs written";
  }
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
