// libquant without golden files: the spec's worked examples, exact round trips at awkward sizes,
// analytical error bounds, the v2 zero convention, asymmetric INT4, INT8 rows and metrics.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>

#include "qf/error.h"
#include "qf/quant/formats.h"
#include "qf/quant/fp8_block.h"
#include "qf/quant/int4.h"
#include "qf/quant/int8_row.h"
#include "qf/quant/metrics.h"

namespace qf::quant {
namespace {

using ckpt::DType;

std::vector<float> random_matrix(int64_t n, int64_t k, float std, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, std);
  std::vector<float> w(static_cast<size_t>(n * k));
  for (float& x : w) x = d(rng);
  return w;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& w) {
  std::vector<uint16_t> b(w.size());
  for (size_t i = 0; i < w.size(); ++i) b[i] = f32_to_bf16(w[i]);
  return b;
}

TEST(Int4Layout, WorkedExamplesFromTheSpec) {
  // checkpoint-formats.md §2.3: codes 0..7 along k give 0x76543210; 15..8 give 0x89ABCDEF,
  // which is -1985229329 as I32.
  std::vector<uint8_t> codes = {0, 1, 2, 3, 4, 5, 6, 7, 15, 14, 13, 12, 11, 10, 9, 8};
  // N = 8 outputs, K = 16: row 0 of W holds the codes above, other rows zero.
  std::vector<uint8_t> w(8 * 16, 0);
  std::copy(codes.begin(), codes.end(), w.begin());
  const auto q = pack_int4(w.data(), 8, 16);
  ASSERT_EQ(q.size(), 16u);  // [K/8, N] = [2, 8]
  EXPECT_EQ(q[0 * 8 + 0], 0x76543210u);
  EXPECT_EQ(q[1 * 8 + 0], 0x89ABCDEFu);
  EXPECT_EQ(static_cast<int32_t>(q[1 * 8 + 0]), -1985229329);
  EXPECT_EQ(unpack_int4(q.data(), 8, 16), w);
  // Symmetric zero 8 is stored 7 in v1: 0x77777777; v2 stores 0x88888888.
  const uint32_t v1 = 0x77777777u, v2 = 0x88888888u;
  EXPECT_EQ(int4_zero(&v1, 8, 0, 5, ZeroPoint::kV1StoredMinusOne), 8u);
  EXPECT_EQ(int4_zero(&v2, 8, 0, 5, ZeroPoint::kV2True), 8u);
  EXPECT_EQ(int4_dequant(0, 8, f32_to_f16(-0.25f)), 2.0f);  // code 0 is -8 steps
}

TEST(Int4Layout, PackRoundTripAwkwardSizes) {
  std::mt19937 rng(3);
  for (int64_t n : {8, 16, 24, 136}) {
    for (int64_t k : {8, 24, 128, 136, 1032}) {
      std::vector<uint8_t> codes(static_cast<size_t>(n * k));
      for (auto& c : codes) c = static_cast<uint8_t>(rng() & 0xF);
      const auto q = pack_int4(codes.data(), n, k);
      ASSERT_EQ(unpack_int4(q.data(), n, k), codes) << n << "x" << k;
    }
  }
}

TEST(Int4Rtn, ScaleSignExtremesAndClamps) {
  // One output row, K = 256 (two groups): group 0's extreme is positive, group 1's negative.
  std::vector<float> w(8 * 256, 0.0f);  // rows 1..7 all zero
  for (int c = 0; c < 256; ++c) w[c] = 0.001f * static_cast<float>((c % 7) - 3);
  w[10] = 0.5f;
  w[200] = -0.25f;
  const auto b = to_bf16(w);
  const Int4Tensors q = quantize_int4(MatrixView(b.data(), DType::kBF16, 8, 256), {});
  EXPECT_EQ(q.scales[0 * 8 + 0], f32_to_f16(-0.5f / 8));  // positive extreme: negative scale
  EXPECT_EQ(q.scales[1 * 8 + 0], f32_to_f16(0.25f / 8));  // negative extreme: positive scale
  EXPECT_EQ(q.scales[0 * 8 + 3], 0x00A8u);                // all-zero group: +f16(1e-5)
  const auto codes = unpack_int4(q.qweight.data(), 8, 256);
  EXPECT_EQ(codes[10], 0u);  // the extreme maps to -8
  EXPECT_EQ(codes[200], 0u);
  EXPECT_EQ(codes[3 * 256 + 7], 8u);  // zero weights are the zero code
  for (uint32_t z : q.qzeros) EXPECT_EQ(z, 0x77777777u);
}

TEST(Int4Rtn, ErrorWithinHalfAStepAndDeterministic) {
  for (auto [n, k] : {std::pair<int64_t, int64_t>{8, 8}, {24, 136}, {64, 1024}, {40, 200}}) {
    const auto w = random_matrix(n, k, 0.02f, static_cast<uint64_t>(n * k));
    const auto b = to_bf16(w);
    const MatrixView mv(b.data(), DType::kBF16, n, k);
    const Int4Tensors q1 = quantize_int4(mv, {}, 1);
    const Int4Tensors q3 = quantize_int4(mv, {}, 3);
    EXPECT_EQ(q1.qweight, q3.qweight);
    EXPECT_EQ(q1.scales, q3.scales);
    std::vector<float> deq(static_cast<size_t>(n * k));
    dequantize_int4(view_of(q1), deq.data());
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < k; ++c) {
        const float s = f16_to_f32(q1.scales[(c / 128) * n + r]);  // signed
        const float x = bf16_to_f32(b[r * k + c]);
        // Round to nearest: within |s|/2, except quotients above +7.5 (the side opposite the
        // group's extreme may reach +8 steps), which clamp to +7.
        const float d = x / s;
        const float bound = d > 7.5f ? std::fabs(s) * (d - 7.0f) : 0.5f * std::fabs(s);
        ASSERT_LE(std::fabs(deq[r * k + c] - x), bound * 1.0001f) << r << "," << c;
      }
    }
  }
}

TEST(Int4Rtn, AsymmetricNeedsV2AndStaysWithinHalfAStep) {
  const auto w = random_matrix(16, 256, 0.02f, 5);
  std::vector<float> shifted = w;
  for (float& x : shifted) x += 0.03f;  // all positive: zero point at 0
  const auto b = to_bf16(shifted);
  const MatrixView mv(b.data(), DType::kBF16, 16, 256);
  Int4Options o;
  o.sym = false;
  EXPECT_THROW(quantize_int4(mv, o), qf::Error);  // v1 cannot store zero 0
  o.zeros = ZeroPoint::kV2True;
  const Int4Tensors q = quantize_int4(mv, o);
  std::vector<float> deq(16 * 256);
  dequantize_int4(view_of(q), deq.data());
  for (int64_t r = 0; r < 16; ++r) {
    for (int64_t c = 0; c < 256; ++c) {
      const float s = f16_to_f32(q.scales[(c / 128) * 16 + r]);
      ASSERT_LE(std::fabs(deq[r * 256 + c] - bf16_to_f32(b[r * 256 + c])), 0.5f * s * 1.0001f);
    }
  }
}

TEST(Int4Rtn, ReadsV2ZerosAsTrueZeros) {
  const auto b = to_bf16(random_matrix(8, 128, 0.02f, 9));
  const Int4Tensors v1 = quantize_int4(MatrixView(b.data(), DType::kBF16, 8, 128), {});
  Int4Tensors v2 = v1;
  for (uint32_t& z : v2.qzeros) z += 0x11111111u;  // what AutoRound's v1 -> v2 conversion does
  v2.zeros = ZeroPoint::kV2True;
  std::vector<float> a(8 * 128), c(8 * 128);
  dequantize_int4(view_of(v1), a.data());
  dequantize_int4(view_of(v2), c.data());
  EXPECT_EQ(a, c);
  // Reading v1 data as v2 shifts every weight by one step (trap T14).
  Int4View wrong = view_of(v1);
  wrong.zeros = ZeroPoint::kV2True;
  dequantize_int4(wrong, c.data());
  EXPECT_NE(a, c);
}

TEST(Int4Rtn, RejectsUnpackableShapes) {
  std::vector<uint16_t> b(12 * 20, 0);
  EXPECT_THROW(quantize_int4(MatrixView(b.data(), DType::kBF16, 12, 20), {}), qf::Error);  // N % 8
  EXPECT_THROW(quantize_int4(MatrixView(b.data(), DType::kBF16, 8, 30), {}), qf::Error);   // K % 8
  EXPECT_THROW(MatrixView(b.data(), DType::kI32, 8, 8), qf::Error);
}

TEST(Fp8Block, PartialBlocksZeroBlocksAndErrorBound) {
  const int64_t n = 130, k = 200;  // 2 x 2 blocks, the last ones partial
  auto w = random_matrix(n, k, 0.05f, 11);
  for (int64_t r = 0; r < 128; ++r) {
    for (int64_t c = 128; c < k; ++c) w[r * k + c] = 0.0f;  // block (0, 1) all zero
  }
  const Fp8BlockTensors q = quantize_fp8_block(MatrixView(w.data(), DType::kF32, n, k), {});
  ASSERT_EQ(q.scales_f32.size(), 4u);
  EXPECT_EQ(q.scales_f32[1], 1.0f);
  std::vector<float> deq(static_cast<size_t>(n * k));
  dequantize_fp8_block(q.codes.data(), MatrixView(q.scales.data(), DType::kF32, 2, 2), n, k, 128,
                       128, deq.data());
  for (int64_t i = 0; i < n * k; ++i) {
    // E4M3 keeps 3 mantissa bits: relative error <= 2^-4 in the normal range, absolute
    // <= 2^-10 * scale below it.
    const float s = q.scales_f32[(i / k / 128) * 2 + (i % k) / 128];
    ASSERT_LE(std::fabs(deq[i] - w[i]),
              std::max(std::fabs(w[i]) * 0.0625f, s * 0.0009765625f) * 1.0001f)
        << i;
  }
}

TEST(Fp8Block, Bf16ScalesAreStoredFirstThenUsed) {
  const auto w = random_matrix(128, 256, 0.05f, 12);
  Fp8BlockOptions o;
  o.scale_dtype = DType::kBF16;
  const MatrixView mv(w.data(), DType::kF32, 128, 256);
  const Fp8BlockTensors q = quantize_fp8_block(mv, o);
  ASSERT_EQ(q.scales.size(), 2u * 2);
  for (size_t j = 0; j < 2; ++j) {
    const uint16_t h = static_cast<uint16_t>(q.scales[2 * j] | q.scales[2 * j + 1] << 8);
    EXPECT_EQ(bf16_to_f32(h), q.scales_f32[j]);
  }
  // Codes are computed against the stored (rounded) multiplier.
  for (int64_t c = 0; c < 256; ++c) {
    EXPECT_EQ(q.codes[c], f32_to_e4m3fn_sat(w[c] / q.scales_f32[c / 128]));
  }
  EXPECT_EQ(fp8_block_scales(mv, o), q.scales);
}

TEST(Int8Rows, StoredScaleReconstructsExactly) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    auto w = random_matrix(33, 129, 0.03f, 13);
    for (int64_t c = 0; c < 129; ++c) w[5 * 129 + c] = 0.0f;  // an all-zero row
    const Int8RowTensors q = quantize_int8_rows(MatrixView(w.data(), DType::kF32, 33, 129), dt);
    EXPECT_EQ(q.scales_f32[5], 1.0f);
    std::vector<float> deq(33 * 129);
    dequantize_int8_rows(q.q.data(), MatrixView(q.scales.data(), dt, 33, 1), 33, 129, deq.data());
    for (int64_t r = 0; r < 33; ++r) {
      const float s = q.scales_f32[r];
      for (int64_t c = 0; c < 129; ++c) {
        const int8_t v = q.q[r * 129 + c];
        ASSERT_GE(v, -127);
        ASSERT_EQ(deq[r * 129 + c], static_cast<float>(v) * s);  // exact
        ASSERT_LE(std::fabs(deq[r * 129 + c] - w[r * 129 + c]), 0.5f * s * 1.0001f + 1e-9f);
      }
    }
  }
}

TEST(Int8Rows, TinyRowKeepsANonzeroScaleAndHugeRowsAreRefused) {
  std::vector<float> w(2 * 8, 0.0f);
  for (int c = 0; c < 8; ++c) w[c] = 0.75e-6f * static_cast<float>(c - 4);  // amax 3e-6
  for (DType dt : {DType::kF16, DType::kBF16}) {
    const Int8RowTensors q = quantize_int8_rows(MatrixView(w.data(), DType::kF32, 2, 8), dt);
    uint16_t h;
    std::memcpy(&h, q.scales.data(), 2);
    if (dt == DType::kF16) {  // 3e-6 / 127 is under half of 2^-24: F16 would round it to 0
      EXPECT_EQ(h, 0x0001);
      EXPECT_EQ(q.q[0], -50);  // round(-3e-6 / 2^-24) = round(-50.33)
      EXPECT_EQ(q.q[7], 38);   // round(2.25e-6 / 2^-24) = round(37.75)
    } else {
      EXPECT_EQ(q.q[0], -127);  // BF16 holds the scale itself
    }
    EXPECT_EQ(q.scales_f32[1], 1.0f);  // the all-zero row
  }
  std::vector<float> huge = {1e7f, 0, 0, 0};
  EXPECT_THROW(quantize_int8_rows(MatrixView(huge.data(), DType::kF32, 1, 4), DType::kF16), Error);
}

TEST(Metrics, KnownValues) {
  const float ref[4] = {1, 2, 3, 4};
  const ErrorStats same = error_stats(ref, ref, 4);
  EXPECT_EQ(same.max_abs, 0);
  EXPECT_EQ(same.nmse, 0);
  EXPECT_EQ(same.cosine, 1);
  EXPECT_TRUE(std::isinf(same.snr_db));
  const float got[4] = {1, 2, 3, 5};
  const ErrorStats e = error_stats(ref, got, 4);
  EXPECT_EQ(e.max_abs, 1);
  EXPECT_DOUBLE_EQ(e.rmse, 0.5);
  EXPECT_DOUBLE_EQ(e.nmse, 1.0 / 30);
  EXPECT_NEAR(e.snr_db, 10 * std::log10(30.0), 1e-12);
  EXPECT_NEAR(e.cosine, 34.0 / std::sqrt(30.0 * 39.0), 1e-12);
  const float orth_a[2] = {1, 0}, orth_b[2] = {0, 1};
  EXPECT_EQ(error_stats(orth_a, orth_b, 2).cosine, 0);
  const float nan_got[4] = {1, NAN, 3, 4};
  EXPECT_EQ(error_stats(ref, nan_got, 4).n_nonfinite, 1);

  const float la[5] = {0.1f, 5, 3, 4, -1}, lb[5] = {0.1f, 4, 5, 3, -1};
  const TopKAgreement t1 = topk_agreement(la, lb, 5, 1);
  EXPECT_FALSE(t1.top1_equal);
  EXPECT_EQ(topk_agreement(la, lb, 5, 3).overlap, 1.0);
  EXPECT_EQ(topk_agreement(la, la, 5, 2).top1_equal, true);
}

TEST(ParallelFor, CoversTheRangeOnceWithAlignedChunks) {
  for (int64_t n : {1, 7, 8, 9, 1000}) {
    for (int threads : {1, 2, 3, 8}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      parallel_for(n, threads, 8, [&](int64_t b, int64_t e) {
        EXPECT_EQ(b % 8, 0);
        for (int64_t i = b; i < e; ++i) ++hits[i];
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
  }
}

}  // namespace
}  // namespace qf::quant
