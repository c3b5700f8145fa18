// logits_topk on the GPU against its CPU twin logits_topk_ref: ids exactly, logits bit for bit,
// the largest logit exactly and the normalizer's sum within 1e-5 relative (positive terms, each
// within a few ulps of exp, summed in fp32 over a lane's few logits, then trees over 32 lanes,
// 16 warps and at most 256 blocks, with rescalings: ~50 roundings of 6e-8 at most, well under
// 1e-5; the double reference is exact to 1e-16).
// Rows: Qwen3.5's 248320 and awkward lengths (1, 31, 33, fewer chunks than k), random normal,
// heavy ties (planted at the k-th place and everywhere), all equal, -0 beside +0, NaN and -inf
// sprinkled, more NaN than k allows; k 1 .. 128; the scratch reused (the ticket), in a captured
// graph; bad arguments. Skips where no CUDA device is present.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_test.h"
#include "mixer_check.h"
#include "qf/kern/device_buffer.h"
#include "qf/kern/topk.h"

namespace qf::kern {
namespace {

using test::download;
using test::upload;

struct Scratch {
  DeviceBuffer<unsigned char> bytes;
  explicit Scratch(int n) : bytes(logits_topk_scratch_bytes(n)) {
    QF_CUDA_CHECK(cudaMemset(bytes.data(), 0, bytes.size()));
  }
};

// Runs the kernel on `row` with k (the scratch given, or a fresh one) and checks it against the
// reference.
void check(const std::vector<float>& row, int k, const std::string& what,
           Scratch* scratch = nullptr, size_t offset = 0) {
  SCOPED_TRACE(what + ", n " + std::to_string(row.size()) + ", k " + std::to_string(k));
  const int n = static_cast<int>(row.size());
  Scratch own(scratch ? 1 : n);
  Scratch& s = scratch ? *scratch : own;
  std::vector<float> padded(offset, 0.0f);  // `offset` floats before the row: not 16-byte aligned
  padded.insert(padded.end(), row.begin(), row.end());
  const DeviceBuffer<float> d_row = upload(padded);
  DeviceBuffer<int> d_ids(k);
  DeviceBuffer<float> d_vals(k), d_stats(2);
  ASSERT_EQ(logits_topk(d_row.data() + offset, n, k, d_ids.data(), d_vals.data(), d_stats.data(),
                        s.bytes.data(), nullptr),
            cudaSuccess);
  QF_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<int> ids = download(d_ids);
  const std::vector<float> vals = download(d_vals), stats = download(d_stats);
  std::vector<int> want_ids(k);
  std::vector<float> want_vals(k);
  double want_stats[2];
  logits_topk_ref(row.data(), n, k, want_ids.data(), want_vals.data(), want_stats);
  EXPECT_EQ(ids, want_ids);
  EXPECT_EQ(std::memcmp(vals.data(), want_vals.data(), vals.size() * sizeof(float)), 0)
      << "logits differ in bits";
  EXPECT_EQ(static_cast<double>(stats[0]), want_stats[0]) << "largest logit";
  if (want_stats[1] == 0) {
    EXPECT_EQ(stats[1], 0.0f);
  } else {
    EXPECT_LE(std::fabs(stats[1] - want_stats[1]) / want_stats[1], 1e-5) << "normalizer sum";
  }
}

std::vector<float> normal_row(int n, uint64_t seed, float scale = 3.0f) {
  std::mt19937_64 g(seed);
  return test::randn(static_cast<size_t>(n), g, scale);
}

TEST(LogitsTopK, RandomRowsOfQwenAndAwkwardLengths) {
  QF_REQUIRE_GPU();
  uint64_t seed = 1;
  for (const int n : {248320, 1, 5, 31, 32, 33, 100, 1000, 4099, 65537, 524288}) {
    for (const int k : {1, 2, 20, 64, 128}) check(normal_row(n, ++seed), k, "normal");
  }
  // A row that does not start on 16 bytes: 4-byte loads.
  for (const int n : {248320, 1001}) check(normal_row(n, ++seed), 20, "misaligned", nullptr, 1);
}

// logits_topk_rows: each row's results those of the reference on it alone (ids and logit bits
// exact, the normalizer within 1e-5), rows ld apart (aligned and not) with outputs interleaved as
// the engine's slots are, ties across rows, launch after launch on one scratch; bad arguments.
TEST(LogitsTopK, RowsInOneLaunchAreEachRowAlone) {
  QF_REQUIRE_GPU();
  for (const auto& [n, ld, rows, k] : std::vector<std::tuple<int, size_t, int, int>>{
           {248320, 248320, 5, 1}, {1000, 1003, 37, 20}, {33, 36, 3, 7}, {4099, 4100, 130, 128}}) {
    SCOPED_TRACE("n " + std::to_string(n) + " ld " + std::to_string(ld) + " rows " +
                 std::to_string(rows) + " k " + std::to_string(k));
    std::vector<float> logits(ld * rows, 1e30f);  // the padding is never taken
    for (int r = 0; r < rows; ++r) {
      const std::vector<float> row = normal_row(n, 900 + r);
      std::copy(row.begin(), row.end(), logits.begin() + static_cast<int64_t>(r * ld));
      if (r % 3 == 1) std::fill_n(logits.begin() + static_cast<int64_t>(r * ld), 40 % n, 9.0f);
    }
    const DeviceBuffer<float> d = upload(logits);
    const size_t stride = 2 * k + 2;  // ids, then logits, then the two stats: one slot a row
    DeviceBuffer<int> out(stride * rows);
    DeviceBuffer<unsigned char> scratch(logits_topk_rows_scratch_bytes(n, rows));
    QF_CUDA_CHECK(cudaMemset(scratch.data(), 0, scratch.size()));
    for (int launch = 0; launch < 2; ++launch) {
      QF_CUDA_CHECK(cudaMemset(out.data(), 0xFF, out.bytes()));
      float* vals = reinterpret_cast<float*>(out.data() + k);
      ASSERT_EQ(logits_topk_rows(d.data(), n, ld, rows, k, out.data(), vals, vals + k, stride,
                                 scratch.data(), nullptr),
                cudaSuccess);
      const std::vector<int> got = download(out);
      for (int r = 0; r < rows; ++r) {
        std::vector<int> want_ids(k);
        std::vector<float> want_vals(k);
        double want_stats[2];
        logits_topk_ref(logits.data() + r * ld, n, k, want_ids.data(), want_vals.data(),
                        want_stats);
        const int* slot = got.data() + r * stride;
        EXPECT_EQ(std::vector<int>(slot, slot + k), want_ids) << "row " << r;
        EXPECT_EQ(std::memcmp(slot + k, want_vals.data(), k * sizeof(float)), 0) << "row " << r;
        float stats[2];
        std::memcpy(stats, slot + 2 * k, sizeof(stats));
        EXPECT_EQ(static_cast<double>(stats[0]), want_stats[0]) << "row " << r;
        EXPECT_LE(std::fabs(stats[1] - want_stats[1]) / want_stats[1], 1e-5) << "row " << r;
      }
    }
  }
  Scratch s(100);
  DeviceBuffer<float> row(300), vals(8), stats(6);
  DeviceBuffer<int> ids(8);
  const auto call = [&](size_t ld, int rows, size_t stride) {
    return logits_topk_rows(row.data(), 100, ld, rows, 1, ids.data(), vals.data(), stats.data(),
                            stride, s.bytes.data(), nullptr);
  };
  EXPECT_EQ(call(100, 0, 2), cudaErrorInvalidValue);
  EXPECT_EQ(call(99, 2, 2), cudaErrorInvalidValue);  // rows overlap
  EXPECT_EQ(call(100, 2, 1), cudaErrorInvalidValue);
  EXPECT_EQ(call(100, 65536, 2), cudaErrorInvalidValue);
}

TEST(LogitsTopK, TiesAreTakenInIndexOrder) {
  QF_REQUIRE_GPU();
  const int n = 248320;
  std::mt19937_64 g(7);
  // Four levels only: every k-th place is a tie among ~62000 logits.
  std::vector<float> levels(n);
  for (float& x : levels) x = static_cast<float>(g() % 4);
  for (const int k : {1, 20, 128}) check(levels, k, "four levels");
  // All equal: the first k indices.
  for (const int k : {1, 20, 128}) check(std::vector<float>(n, 0.5f), k, "all equal");
  // A tie planted across the k-th place, the rest well below: some of the equal logits make the
  // top k, the rest do not.
  std::vector<float> planted = normal_row(n, 8, 1.0f);
  for (int i = 0; i < 30; ++i) planted[static_cast<size_t>(g() % n)] = 9.0f;
  for (int i = 0; i < 10; ++i) planted[static_cast<size_t>(g() % n)] = 7.5f;
  for (const int k : {5, 10, 20, 35, 40, 41, 128}) check(planted, k, "planted ties");
  // The same chunk holding many of the top logits.
  std::vector<float> one_chunk = normal_row(n, 9, 1.0f);
  for (int i = 0; i < 32; ++i) one_chunk[64 + i] = 10.0f + static_cast<float>(i % 3);
  for (const int k : {1, 20, 32, 33, 128}) check(one_chunk, k, "one chunk");
  // -0 and +0 are equal logits.
  std::vector<float> zeros(1000, -1.0f);
  for (int i = 0; i < 40; ++i) zeros[static_cast<size_t>(7 * i + 3)] = i % 2 ? 0.0f : -0.0f;
  for (const int k : {1, 20, 40, 64}) check(zeros, k, "signed zeros");
}

TEST(LogitsTopK, NanIsNeverTakenAndMinusInfinityIsLast) {
  QF_REQUIRE_GPU();
  const int n = 248320;
  std::mt19937_64 g(11);
  std::vector<float> row = normal_row(n, 12);
  for (int i = 0; i < 5000; ++i) row[static_cast<size_t>(g() % n)] = NAN;
  for (int i = 0; i < 5000; ++i) row[static_cast<size_t>(g() % n)] = -INFINITY;
  row[17] = NAN, row[0] = 100.0f;
  for (const int k : {1, 20, 128}) check(row, k, "NaN and -inf sprinkled");
  // Masked: all but 10 are -inf, so the top 20 end with -inf logits in index order.
  std::vector<float> masked(n, -INFINITY);
  for (int i = 0; i < 10; ++i) masked[static_cast<size_t>(g() % n)] = static_cast<float>(i);
  for (const int k : {5, 20, 128}) check(masked, k, "masked");
  // Fewer than k logits are not NaN: the rest are (INT_MAX, -inf).
  std::vector<float> mostly_nan(3000, NAN);
  for (int i = 0; i < 12; ++i) mostly_nan[static_cast<size_t>(250 * i)] = static_cast<float>(i % 5);
  for (const int k : {12, 13, 20, 128}) check(mostly_nan, k, "mostly NaN");
  check(std::vector<float>(100, NAN), 20, "all NaN");
}

TEST(LogitsTopK, ScratchServesLaunchAfterLaunchAndGraphReplays) {
  QF_REQUIRE_GPU();
  const int n = 248320;
  Scratch s(n);
  for (int i = 0; i < 3; ++i) check(normal_row(n, 20 + i), 20, "reused scratch", &s);
  // Captured once, replayed over rows written into the captured buffer.
  const DeviceBuffer<float> d_row = upload(normal_row(n, 30));
  DeviceBuffer<int> d_ids(20);
  DeviceBuffer<float> d_vals(20), d_stats(2);
  cudaStream_t stream;
  QF_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  QF_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  ASSERT_EQ(logits_topk(d_row.data(), n, 20, d_ids.data(), d_vals.data(), d_stats.data(),
                        s.bytes.data(), stream),
            cudaSuccess);
  QF_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  QF_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int r = 0; r < 3; ++r) {
    const std::vector<float> row = normal_row(n, 40 + r);
    QF_CUDA_CHECK(cudaMemcpy(d_row.data(), row.data(), row.size() * 4, cudaMemcpyHostToDevice));
    QF_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    QF_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<int> want(20);
    std::vector<float> want_vals(20);
    double st[2];
    logits_topk_ref(row.data(), n, 20, want.data(), want_vals.data(), st);
    EXPECT_EQ(download(d_ids), want) << "replay " << r;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(LogitsTopK, RejectsBadArguments) {
  QF_REQUIRE_GPU();
  Scratch s(100);
  DeviceBuffer<float> row(100), vals(kTopKMax + 1), stats(2);
  DeviceBuffer<int> ids(kTopKMax + 1);
  const auto call = [&](const float* r, int n, int k) {
    return logits_topk(r, n, k, ids.data(), vals.data(), stats.data(), s.bytes.data(), nullptr);
  };
  EXPECT_EQ(call(row.data(), 100, 0), cudaErrorInvalidValue);
  EXPECT_EQ(call(row.data(), 100, kTopKMax + 1), cudaErrorInvalidValue);
  EXPECT_EQ(call(row.data(), 0, 1), cudaErrorInvalidValue);
  EXPECT_EQ(call(row.data(), 524289, 1), cudaErrorInvalidValue);  // past kTopKMaxN
  EXPECT_EQ(call(nullptr, 100, 1), cudaErrorInvalidValue);
  EXPECT_EQ(
      logits_topk(row.data(), 100, 1, ids.data(), vals.data(), stats.data(), nullptr, nullptr),
      cudaErrorInvalidValue);
}

// logits_pick against its twin, bit for bit: rows ld apart, ids at the row's ends, outside it
// (NaN) and -1; no rows; bad arguments.
TEST(LogitsPick, PicksEachRowsLogitAndNanOutside) {
  QF_REQUIRE_GPU();
  const int n = 1000, rows = 300;
  const size_t ld = 1003;
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-30.0f, 30.0f);
  std::vector<float> logits(rows * ld);
  for (float& v : logits) v = u(gen);
  std::vector<int> ids(rows);
  for (int r = 0; r < rows; ++r) {
    const int pick[] = {0, n - 1, -1, n, static_cast<int>(gen() % n)};
    ids[r] = pick[r % 5];
  }
  const DeviceBuffer<float> d_logits = upload(logits);
  const DeviceBuffer<int> d_ids = upload(ids);
  DeviceBuffer<float> d_out(rows);
  ASSERT_EQ(logits_pick(d_logits.data(), n, ld, d_ids.data(), rows, d_out.data(), nullptr),
            cudaSuccess);
  const std::vector<float> got = download(d_out);
  std::vector<float> want(rows);
  logits_pick_ref(logits.data(), n, ld, ids.data(), rows, want.data());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), rows * sizeof(float)), 0);
  for (int r = 0; r < rows; ++r) {
    EXPECT_EQ(std::isnan(got[r]), ids[r] < 0 || ids[r] >= n) << "row " << r;
  }
  EXPECT_EQ(logits_pick(nullptr, n, ld, nullptr, 0, nullptr, nullptr), cudaSuccess);
  EXPECT_EQ(logits_pick(d_logits.data(), n, n - 1, d_ids.data(), 1, d_out.data(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(logits_pick(d_logits.data(), 0, ld, d_ids.data(), 1, d_out.data(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(logits_pick(d_logits.data(), n, ld, d_ids.data(), -1, d_out.data(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(logits_pick(nullptr, n, ld, d_ids.data(), 1, d_out.data(), nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace qf::kern
