// lm_head (INT8 logits of 1..4 rows of x with the fused top-k / argmax) on the GPU against its CPU
// twin lm_head_ref: awkward N (1 .. 4099, partial tiles and bands) and K (the 16-byte chunk
// path, and K % 16 != 0, non-power-of-two groups and misaligned rows: the 4-byte word path),
// scale groups per row or of 16 .. 128 columns, 1 .. 4 rows of x, top-k 1 .. 8, planted ties,
// graph replay (the ticket), logits not written, the real 248320 x 3072 head, bad arguments.
//
// Tolerance on the logits: lm_head_ref is the exact dot product of the exactly decoded weights,
// rounded once. The kernel forms the same products exactly (fma) and sums them in fp32: a lane's
// chain holds at most 16 ceil(K / 512) <= K / 32 + 16 terms, then at most 6 more additions (two
// chains, five butterfly steps), so per logit |gpu - ref| <= (ceil(K/16) + 16) * 2^-24 *
// sum_c |w_rc x_c| with margin.
// The ids are checked exactly: they must be the top-k (lm_head.h's order) of the logits the
// kernel wrote, the top-1 must equal kern::argmax on those logits, and the reference logits at
// the kernel's ids must equal the reference top-k within the tolerance (the same top-k up to
// logits that rounding cannot separate). Per-element exactness: one-hot x gives the weights.
// Skips (and says why) where no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "mixer_check.h"
#include "qf/kern/device_buffer.h"
#include "qf/kern/lm_head.h"
#include "qf/kern/ops.h"
#include "qf/quant/formats.h"

namespace qf::kern {
namespace {

using test::download;  // mixer_check.h
using test::Rng;
using test::upload;

// An INT8 matrix in gemv.h's kernel layout, random codes, scales and zeros (any byte), on the host
// and the device; the codes start `w_offset` bytes into their buffer (4: rows not 16-byte
// aligned).
struct Head {
  int n, k, group;
  size_t w_offset = 0;
  std::vector<uint8_t> w;
  std::vector<uint16_t> scales;
  std::vector<uint8_t> zeros;
  DeviceBuffer<uint8_t> d_w, d_zeros;
  DeviceBuffer<uint16_t> d_scales;

  int n_groups() const { return (k + group - 1) / group; }
  uint8_t* code(int64_t r, int64_t c) { return w.data() + w_offset + r * k + c; }
  const uint8_t* code_at(int64_t r, int64_t c) const { return w.data() + w_offset + r * k + c; }
  DeviceLinear view(bool device) const {
    DeviceLinear d;
    d.kind = WeightKind::kInt8;
    d.n = n;
    d.k = k;
    d.group = group;
    d.w = (device ? d_w.data() : w.data()) + w_offset;
    d.scales = reinterpret_cast<const __half*>(device ? d_scales.data() : scales.data());
    d.zeros = device ? d_zeros.data() : zeros.data();
    return d;
  }
  // W[r][c] decoded independently of the twin: scale * (code - zero).
  float weight(int64_t r, int64_t c) const {
    const size_t g = static_cast<size_t>(r * n_groups() + c / group);
    return quant::f16_to_f32(scales[g]) *
           static_cast<float>(static_cast<int>(w[w_offset + r * k + c]) - zeros[g]);
  }
  void to_device() {
    d_w = upload(w);
    d_scales = upload(scales);
    d_zeros = upload(zeros);
  }
};

std::unique_ptr<Head> make_head(int n, int k, int group, uint64_t seed, size_t w_offset = 0) {
  auto h = std::make_unique<Head>();
  h->n = n;
  h->k = k;
  h->group = group;
  h->w_offset = w_offset;
  Rng rng{seed};
  h->w.resize(w_offset + static_cast<size_t>(n) * k);
  for (uint8_t& b : h->w) b = static_cast<uint8_t>(rng.next());
  const size_t ns = static_cast<size_t>(n) * h->n_groups();
  h->scales.resize(ns);
  h->zeros.resize(ns);
  for (uint16_t& s : h->scales) {  // signed (AutoRound), a few subnormal
    s = rng.below(10) == 0
            ? static_cast<uint16_t>(rng.below(0x400) | (rng.below(2) << 15))
            : quant::f32_to_f16(rng.uniform(1e-3f, 2e-2f) * (rng.below(2) ? -1.0f : 1.0f));
  }
  for (uint8_t& z : h->zeros) z = static_cast<uint8_t>(rng.below(256));
  h->to_device();
  return h;
}

std::vector<float> random_x(int n_rows, int k, uint64_t seed) {
  Rng rng{seed};
  std::vector<float> x(static_cast<size_t>(n_rows) * k);
  for (float& v : x) v = rng.uniform(-1.0f, 1.0f);
  return x;
}

// Zero-filled once, as lm_head.h asks.
DeviceBuffer<uint8_t> make_scratch() {
  DeviceBuffer<uint8_t> s(lm_head_scratch_bytes());
  QF_CUDA_CHECK(cudaMemset(s.data(), 0, s.bytes()));
  return s;
}

struct Result {
  std::vector<float> logits, top;
  std::vector<int> ids;
};

// One launch on x (host copy uploaded `x_offset` floats into its buffer), outputs poisoned first.
Result run(const Head& h, const std::vector<float>& x, int n_rows, int top_k, void* scratch,
           bool write_logits = true, size_t x_offset = 0) {
  std::vector<float> xp(x_offset, 0.0f);
  xp.insert(xp.end(), x.begin(), x.end());
  auto d_x = upload(xp);
  DeviceBuffer<float> d_logits(static_cast<size_t>(n_rows) * h.n), d_top(n_rows * top_k);
  DeviceBuffer<int> d_ids(n_rows * top_k);
  QF_CUDA_CHECK(cudaMemset(d_logits.data(), 0xFF, d_logits.bytes()));  // NaN poison
  QF_CUDA_CHECK(cudaMemset(d_ids.data(), 0xFF, d_ids.bytes()));
  EXPECT_EQ(lm_head(h.view(true), d_x.data() + x_offset, n_rows, top_k,
                    write_logits ? d_logits.data() : nullptr, d_ids.data(), d_top.data(), scratch,
                    nullptr),
            cudaSuccess);
  QF_CUDA_CHECK(cudaDeviceSynchronize());
  return {download(d_logits), download(d_top), download(d_ids)};
}

// The checks of the file comment for one launch's result.
void check(const Head& h, const std::vector<float>& x, int n_rows, int top_k, const Result& got) {
  const int n = h.n, k = h.k;
  std::vector<float> want(static_cast<size_t>(n_rows) * n), want_top(n_rows * top_k);
  std::vector<int> want_ids(n_rows * top_k);
  lm_head_ref(h.view(false), x.data(), n_rows, top_k, want.data(), want_ids.data(),
              want_top.data());
  int bad = 0;
  double max_tol = 0.0;
  std::vector<float> row(k);
  float scale = 0.0f;
  for (int r = 0; r < n; ++r) {
    for (int c = 0; c < k; ++c) {  // h.weight(r, c), its scale converted once per group
      const size_t g = static_cast<size_t>(r) * h.n_groups() + c / h.group;
      if (c % h.group == 0) scale = quant::f16_to_f32(h.scales[g]);
      row[c] = scale * static_cast<float>(static_cast<int>(*h.code_at(r, c)) - h.zeros[g]);
    }
    for (int b = 0; b < n_rows; ++b) {
      double abs_sum = 0.0;
      for (int c = 0; c < k; ++c) {
        abs_sum += std::fabs(static_cast<double>(row[c]) * x[static_cast<size_t>(b) * k + c]);
      }
      const double tol = (std::ceil(k / 16.0) + 16) * 0x1p-24 * abs_sum;
      max_tol = std::max(max_tol, tol);
      const size_t i = static_cast<size_t>(b) * n + r;
      if (!(std::fabs(static_cast<double>(got.logits[i]) - want[i]) <= tol) && ++bad <= 5) {
        ADD_FAILURE() << "x row " << b << " logit " << r << ": gpu " << got.logits[i] << " ref "
                      << want[i] << " tol " << tol;
      }
    }
  }
  EXPECT_EQ(bad, 0);
  for (int b = 0; b < n_rows; ++b) {
    std::vector<int> ids(top_k);
    std::vector<float> top(top_k);
    lm_head_topk_ref(got.logits.data() + static_cast<size_t>(b) * n, n, top_k, ids.data(),
                     top.data());
    for (int j = 0; j < top_k; ++j) {
      const int i = b * top_k + j;
      EXPECT_EQ(got.ids[i], ids[j]) << "x row " << b << " top " << j;
      EXPECT_EQ(got.top[i], top[j]) << "x row " << b << " top " << j;
      ASSERT_TRUE(got.ids[i] >= 0 && got.ids[i] < n) << "x row " << b << " top " << j;
      EXPECT_NEAR(want[static_cast<size_t>(b) * n + got.ids[i]], want_top[i], 2 * max_tol)
          << "x row " << b << " top " << j << ": not the reference's top-k";
    }
  }
  // The top-1 is kern::argmax of the same logits.
  DeviceBuffer<int> d_arg(1), d_scratch(argmax_scratch_ints(n));
  for (int b = 0; b < n_rows; ++b) {
    auto d_row = upload(std::vector<float>(got.logits.begin() + static_cast<int64_t>(b) * n,
                                           got.logits.begin() + static_cast<int64_t>(b + 1) * n));
    ASSERT_EQ(argmax(d_row.data(), n, d_arg.data(), d_scratch.data(), nullptr), cudaSuccess);
    EXPECT_EQ(download(d_arg)[0], got.ids[b * top_k]) << "x row " << b << ": argmax";
  }
}

void run_and_check(const Head& h, int n_rows, int top_k, uint64_t seed, void* scratch,
                   size_t x_offset = 0) {
  SCOPED_TRACE("n " + std::to_string(h.n) + " k " + std::to_string(h.k) + " group " +
               std::to_string(h.group) + " w_offset " + std::to_string(h.w_offset) + " rows " +
               std::to_string(n_rows) + " top_k " + std::to_string(top_k) + " x_offset " +
               std::to_string(x_offset));
  const std::vector<float> x = random_x(n_rows, h.k, seed);
  check(h, x, n_rows, top_k, run(h, x, n_rows, top_k, scratch, true, x_offset));
}

TEST(LmHead, AwkwardSizesAllRowCounts) {
  QF_REQUIRE_GPU();
  auto scratch = make_scratch();
  uint64_t seed = 1;
  for (int k : {16, 64, 1040, 3072}) {  // whole 16-byte chunks, one group per row
    for (int n : {1, 3, 31, 33, 127, 129, 1000, 4099}) {
      const auto h = make_head(n, k, k, ++seed);
      for (int rows = 1; rows <= kLmHeadMaxRows; ++rows) {
        for (int top_k : {1, 3, 8}) {
          if (top_k > n) continue;
          run_and_check(*h, rows, top_k, ++seed, scratch.data());
        }
      }
    }
  }
}

// K % 16 != 0 (rows of 4-byte words), groups of a power-of-two number of chunks, of other
// multiples of 4 columns, partial last groups, rows not 16-byte aligned, x not 16-byte aligned.
TEST(LmHead, WordPathGroupsAndAlignment) {
  QF_REQUIRE_GPU();
  auto scratch = make_scratch();
  uint64_t seed = 500;
  struct Case {
    int k, group;
    size_t w_offset;
  };
  for (const Case& cs :
       {Case{4, 4, 0}, Case{12, 12, 0}, Case{36, 36, 0}, Case{100, 100, 0}, Case{1028, 1028, 0},
        Case{1040, 16, 0}, Case{1040, 128, 0}, Case{1040, 48, 0}, Case{1028, 64, 0},
        Case{3072, 128, 0}, Case{1040, 1040, 4}, Case{1040, 128, 4}, Case{3072, 3072, 12}}) {
    for (int n : {33, 129, 700}) {
      const auto h = make_head(n, cs.k, cs.group, ++seed, cs.w_offset);
      for (int rows : {1, 2, 4}) {
        run_and_check(*h, rows, rows == 2 ? 5 : 1, ++seed, scratch.data());
      }
    }
  }
  const auto h = make_head(300, 1040, 1040, 77);
  run_and_check(*h, 3, 4, 78, scratch.data(), 1);  // x one float off: scalar staging
}

// Many tiles per block (the persistent grid), and the real head: 248320 x 3072, one group per
// row, 1 and 4 rows of x.
TEST(LmHead, ManyRowsAndTheRealHead) {
  QF_REQUIRE_GPU();
  auto scratch = make_scratch();
  const auto many = make_head(100000, 64, 64, 91);
  run_and_check(*many, 4, 8, 92, scratch.data());
  run_and_check(*many, 1, 1, 93, scratch.data());
  const auto real = make_head(248320, 3072, 3072, 94);
  run_and_check(*real, 1, 1, 95, scratch.data());
  run_and_check(*real, 4, 8, 96, scratch.data());
}

// One-hot rows of x: logit r = W[r][c] exactly, for every column c (every byte position, group
// and chunk edge), four columns per launch; both paths.
TEST(LmHead, ExactPerElement) {
  QF_REQUIRE_GPU();
  auto scratch = make_scratch();
  for (const auto& [k, group] : {std::pair{176, 32}, std::pair{180, 36}, std::pair{64, 64}}) {
    const auto h = make_head(37, k, group, 200 + k);
    int bad = 0;
    for (int c0 = 0; c0 < k; c0 += 4) {
      std::vector<float> x(4 * static_cast<size_t>(k), 0.0f);
      for (int b = 0; b < 4; ++b) x[static_cast<size_t>(b) * k + (c0 + b) % k] = 1.0f;
      const Result got = run(*h, x, 4, 1, scratch.data());
      for (int b = 0; b < 4; ++b) {
        for (int r = 0; r < h->n; ++r) {
          const float want = h->weight(r, (c0 + b) % k);
          if (got.logits[static_cast<size_t>(b) * h->n + r] != want && ++bad <= 5) {
            ADD_FAILURE() << "k " << k << " row " << r << " col " << (c0 + b) % k << ": gpu "
                          << got.logits[static_cast<size_t>(b) * h->n + r] << " want " << want;
          }
        }
      }
    }
    EXPECT_EQ(bad, 0) << "k " << k;
  }
}

// Equal logits: the lowest index first. Row b of x gets copies of one row aligned with it (codes
// zero +- 127 by the sign of x, the largest scale: far above every random row) at scattered
// indices, the last row and ones in the first and last tiles among them; the top-k must be the
// lowest copies, in index order, and their logits equal. And an all-equal head (every weight 0).
TEST(LmHead, TiesTakeTheLowestIndex) {
  QF_REQUIRE_GPU();
  auto scratch = make_scratch();
  for (int n : {5000, 100000}) {
    const int k = 64;
    auto h = make_head(n, k, k, 300 + n);
    const std::vector<float> x = random_x(4, k, 301 + n);
    Rng rng{302 + static_cast<uint64_t>(n)};
    std::vector<std::vector<int>> copies(4);
    std::vector<bool> taken(n, false);
    for (int b = 0; b < 4; ++b) {
      std::vector<int>& cp = copies[b];
      for (int r : {n - 1 - b, 3 + b, 70 + 2 * b, n / 2 + b}) cp.push_back(r);
      while (cp.size() < 12) cp.push_back(static_cast<int>(rng.below(n)));
      for (int r : cp) {
        if (taken[r]) continue;
        taken[r] = true;
        for (int c = 0; c < k; ++c) *h->code(r, c) = x[b * k + c] >= 0.0f ? 255 : 1;
        h->zeros[r] = 128;
        h->scales[r] = quant::f32_to_f16(2e-2f);
      }
      std::sort(cp.begin(), cp.end());
      cp.erase(std::unique(cp.begin(), cp.end()), cp.end());
      cp.erase(std::remove_if(cp.begin(), cp.end(),
                              [&](int r) {  // a copy taken by an earlier row of x is not b's
                                for (int b2 = 0; b2 < b; ++b2) {
                                  if (std::count(copies[b2].begin(), copies[b2].end(), r)) {
                                    return true;
                                  }
                                }
                                return false;
                              }),
               cp.end());
    }
    h->to_device();
    for (int top_k : {1, 8}) {
      SCOPED_TRACE("n " + std::to_string(n) + " top_k " + std::to_string(top_k));
      const Result got = run(*h, x, 4, top_k, scratch.data());
      check(*h, x, 4, top_k, got);
      for (int b = 0; b < 4; ++b) {
        ASSERT_GE(copies[b].size(), static_cast<size_t>(top_k));
        for (int j = 0; j < top_k; ++j) {
          EXPECT_EQ(got.ids[b * top_k + j], copies[b][j]) << "x row " << b << " top " << j;
          EXPECT_EQ(got.top[b * top_k + j], got.top[b * top_k]) << "x row " << b;
        }
      }
    }
  }
  auto flat = make_head(3000, 64, 64, 400);
  std::fill(flat->w.begin(), flat->w.end(), uint8_t{7});
  std::fill(flat->zeros.begin(), flat->zeros.end(), uint8_t{7});
  flat->to_device();
  const Result got = run(*flat, random_x(3, 64, 401), 3, 8, scratch.data());
  for (int b = 0; b < 3; ++b) {
    for (int j = 0; j < 8; ++j) EXPECT_EQ(got.ids[b * 8 + j], j) << "x row " << b;
  }
}

// Launches back to back on one scratch (the ticket reset by each), replays of a captured graph
// following new x, and logits == nullptr giving the same ids.
TEST(LmHead, ReplayAndNoLogits) {
  QF_REQUIRE_GPU();
  auto scratch = make_scratch();
  const auto h = make_head(20000, 1040, 1040, 500);
  const int rows = 2, top_k = 4;
  DeviceBuffer<float> d_x(static_cast<size_t>(rows) * h->k), d_logits(rows * h->n);
  DeviceBuffer<int> d_ids(rows * top_k);
  cudaStream_t stream;
  QF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  QF_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  ASSERT_EQ(lm_head(h->view(true), d_x.data(), rows, top_k, d_logits.data(), d_ids.data(), nullptr,
                    scratch.data(), stream),
            cudaSuccess);
  QF_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  QF_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 3; ++rep) {
    const std::vector<float> x = random_x(rows, h->k, 501 + rep);
    QF_CUDA_CHECK(cudaMemcpy(d_x.data(), x.data(), d_x.bytes(), cudaMemcpyHostToDevice));
    QF_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    QF_CUDA_CHECK(cudaStreamSynchronize(stream));
    Result got{download(d_logits), std::vector<float>(rows * top_k), download(d_ids)};
    for (int b = 0; b < rows; ++b) {  // top logits were not asked for: take them from the logits
      for (int j = 0; j < top_k; ++j) {
        got.top[b * top_k + j] = got.logits[static_cast<size_t>(b) * h->n + got.ids[b * top_k + j]];
      }
    }
    SCOPED_TRACE("replay " + std::to_string(rep));
    check(*h, x, rows, top_k, got);
    const Result bare = run(*h, x, rows, top_k, scratch.data(), false);
    EXPECT_EQ(bare.ids, got.ids);
  }
  QF_CUDA_CHECK(cudaGraphExecDestroy(exec));
  QF_CUDA_CHECK(cudaGraphDestroy(graph));
  // Back to back without a sync in between: every launch must see a reset ticket.
  std::vector<std::vector<float>> xs;
  std::vector<DeviceBuffer<float>> d_xs;
  std::vector<DeviceBuffer<int>> d_out;
  for (int i = 0; i < 4; ++i) {
    xs.push_back(random_x(1, h->k, 600 + i));
    d_xs.push_back(upload(xs.back()));
    d_out.emplace_back(1);
    ASSERT_EQ(lm_head(h->view(true), d_xs.back().data(), 1, 1, nullptr, d_out.back().data(),
                      nullptr, scratch.data(), stream),
              cudaSuccess);
  }
  QF_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (int i = 0; i < 4; ++i) {
    std::vector<float> logits(h->n);
    int id = 0;
    lm_head_ref(h->view(false), xs[i].data(), 1, 1, logits.data(), &id, nullptr);
    EXPECT_EQ(download(d_out[i])[0], id) << "launch " << i;
  }
  QF_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(LmHead, RejectsBadArguments) {
  QF_REQUIRE_GPU();
  auto scratch = make_scratch();
  const auto h = make_head(10, 64, 64, 700);
  DeviceBuffer<float> d_x(4 * 64), d_logits(4 * 10);
  DeviceBuffer<int> d_ids(4 * 8);
  auto call = [&](const DeviceLinear& w, int rows, int top_k) {
    return lm_head(w, d_x.data(), rows, top_k, d_logits.data(), d_ids.data(), nullptr,
                   scratch.data(), nullptr);
  };
  const DeviceLinear w = h->view(true);
  EXPECT_EQ(call(w, 0, 1), cudaErrorInvalidValue);
  EXPECT_EQ(call(w, 5, 1), cudaErrorInvalidValue);
  EXPECT_EQ(call(w, 1, 0), cudaErrorInvalidValue);
  EXPECT_EQ(call(w, 1, 9), cudaErrorInvalidValue);
  const auto small = make_head(5, 64, 64, 701);
  EXPECT_EQ(call(small->view(true), 1, 6), cudaErrorInvalidValue);  // k > N
  DeviceLinear bf16 = w;
  bf16.kind = WeightKind::kBf16;
  EXPECT_FALSE(lm_head_ok(bf16, 1));
  EXPECT_EQ(call(bf16, 1, 1), cudaErrorNotSupported);
  DeviceLinear odd_group = w;  // a group of 6 columns splits 4-byte words
  odd_group.group = 6;
  EXPECT_FALSE(lm_head_ok(odd_group, 1));
  EXPECT_EQ(call(odd_group, 1, 1), cudaErrorNotSupported);
  DeviceLinear huge_k = w;  // x of 4 rows no longer fits in shared memory
  huge_k.k = 1 << 16;
  EXPECT_FALSE(lm_head_ok(huge_k, 4));
  EXPECT_TRUE(lm_head_ok(w, 4));
  QF_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace qf::kern
