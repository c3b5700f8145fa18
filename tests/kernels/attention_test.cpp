// attn_decode on the GPU against its _ref twins (attn_prepare_ref, then attn_decode_ref): token
// after token from position 0, each side appending to its own KV cache, the GPU launch captured
// once in a CUDA graph and replayed with only the device-side position changing. Checked at
// contexts 1, 7, 300 and 4096 for the 122B-A10B shape (Nq 32, Nkv 2, hd 256, rot 64), past 4096
// (several tiles per split), at tile edges, and at awkward shapes (hd 64 and 128, full rotary,
// groups of 1, 3 and > 16 query heads). Tolerances (mixer_check.h):
//   v cache rows: exact (a copy);
//   q and k rows: rel 1e-5 of their rms. They are normed (a 256-long sum of squares in double
//     on both sides) and rotated with cos/sin that both sides round from the same f32 angle, so
//     they differ by an ulp or two (~1e-7);
//   outputs: rel 1e-5 of the rms of the cached v rows. An output is a convex combination of v
//     rows (times a sigmoid <= 1), so the rounding of the scores, exponentials and the
//     context-long sums is relative to |v|, not to |o| (which shrinks like 1/sqrt(context)
//     through cancellation); u * sqrt(4096) ~ 4e-6 bounds the typical error of the sums.
// attn_prefill: the appended rows bit for bit attn_decode's, the outputs within the same bound
// (PrefillIsDecodeWithinRounding).
// bf16 and fp8 caches (AttnShape::kv): the twins round their appended rows as the GPU does
// (quant::f32_to_bf16, f32_to_e4m3fn_sat). v rows: exact; k rows: each entry the twin's or one
// ulp of the format from it (the ~1e-7 differences above can fall on either side of a rounding
// midpoint); outputs: the twin's attention over the GPU's own cache rows, within the f32 bound.
// bf16 and fp8 caches at head_dim 256 run on both decode paths (AttnDecodePath): the split kernel
// and the tensor-core kernel, each held to the same bound.
// Skips (and says why) where no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mixer_check.h"
#include "qf/kern/attention.h"
#include "qf/quant/formats.h"

namespace qf::kern {
namespace {

using test::download;
using test::expect_close;
using test::randn;
using test::rms;
using test::upload;
using test::upload_to;

// A KV cache of n entries of shape.kv on the device, zeroed, and read back as floats.
class DeviceCache {
 public:
  DeviceCache(const AttnShape& s, size_t n)
      : kv_(s.kv),
        f32_(kv_ == KvType::kF32 ? n : 0),
        b16_(kv_ == KvType::kBf16 ? n : 0),
        f8_(kv_ == KvType::kFp8 ? n : 0) {
    if (n > 0) QF_CUDA_CHECK(cudaMemset(data(), 0, n * attn_kv_bytes(s)));
  }
  // From floats (bf16, fp8: rounded; `values` then holds what the cache holds).
  DeviceCache(const AttnShape& s, std::vector<float>& values) : DeviceCache(s, values.size()) {
    if (kv_ == KvType::kF32) {
      upload_to(values, f32_);
    } else if (kv_ == KvType::kBf16) {
      std::vector<uint16_t> bits(values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        bits[i] = quant::f32_to_bf16(values[i]);
        values[i] = quant::bf16_to_f32(bits[i]);
      }
      upload_to(bits, b16_);
    } else {
      std::vector<uint8_t> bits(values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        bits[i] = quant::f32_to_e4m3fn_sat(values[i]);
        values[i] = quant::e4m3fn_to_f32(bits[i]);
      }
      upload_to(bits, f8_);
    }
  }
  void* data() {
    return kv_ == KvType::kF32    ? static_cast<void*>(f32_.data())
           : kv_ == KvType::kBf16 ? static_cast<void*>(b16_.data())
                                  : static_cast<void*>(f8_.data());
  }
  std::vector<float> read(size_t n = SIZE_MAX) const {
    if (kv_ == KvType::kF32) return download(f32_, n);
    std::vector<float> out;
    if (kv_ == KvType::kBf16) {
      for (const uint16_t b : download(b16_, n)) out.push_back(quant::bf16_to_f32(b));
    } else {
      for (const uint8_t b : download(f8_, n)) out.push_back(quant::e4m3fn_to_f32(b));
    }
    return out;
  }

 private:
  KvType kv_;
  DeviceBuffer<float> f32_;
  DeviceBuffer<uint16_t> b16_;
  DeviceBuffer<uint8_t> f8_;
};

// Entries equal or one ulp of the cache's format apart (both values of it: bf16, 7 stored
// significand bits, or e4m3, 3 and subnormals from 2^-6), counting the latter.
void expect_within_ulp(const std::vector<float>& got, const std::vector<float>& want, KvType kv,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const int bits = kv == KvType::kFp8 ? 3 : 7;
  const int min_exp = kv == KvType::kFp8 ? -6 : -126;
  size_t off = 0, bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    const int e = std::ilogb(std::max(std::fabs(got[i]), std::fabs(want[i])));
    const float ulp = std::ldexp(1.0f, std::max(e, min_exp) - bits);
    ++(std::fabs(got[i] - want[i]) <= ulp ? off : bad);
  }
  EXPECT_EQ(bad, 0u) << what << ": entries more than an ulp from the twin's";
  EXPECT_LE(off, got.size() / 1000 + 1) << what << ": entries an ulp off";
}

std::string kv_name(const AttnShape& s) {
  return s.kv == KvType::kFp8 ? " fp8" : s.kv == KvType::kBf16 ? " bf16" : " f32";
}
std::string path_name(AttnDecodePath p) {
  return p == AttnDecodePath::kMma ? " mma" : p == AttnDecodePath::kSplit ? " split" : "";
}

// Runs positions 0 .. max_len - 1 (or n_steps) and compares everything at `checks`.
void run_sequence(const AttnShape& s, int n_steps, const std::vector<int>& checks, uint64_t seed,
                  AttnDecodePath path = AttnDecodePath::kAuto) {
  const std::string name = "Nq " + std::to_string(s.n_q_heads) + " Nkv " +
                           std::to_string(s.n_kv_heads) + " hd " + std::to_string(s.head_dim) +
                           " rot " + std::to_string(s.rot_dim) + kv_name(s) + path_name(path);
  SCOPED_TRACE(name);
  std::printf("attention %s max_len %d\n", name.c_str(), s.max_len);
  std::mt19937_64 g(seed);
  const size_t nq = static_cast<size_t>(s.n_q_heads), hd = static_cast<size_t>(s.head_dim);
  const size_t kv_row = static_cast<size_t>(s.n_kv_heads) * hd;
  const size_t cache = static_cast<size_t>(s.max_len) * kv_row;
  const std::vector<float> q_norm_w = randn(hd, g, 0.1f), k_norm_w = randn(hd, g, 0.1f);
  auto d_qn = upload(q_norm_w), d_kn = upload(k_norm_w);
  DeviceBuffer<float> d_qproj(nq * 2 * hd), d_kproj(kv_row), d_vproj(kv_row), d_q(nq * hd),
      d_out(nq * hd), d_scratch(attn_scratch_floats(s)), d_rope(attn_rope_floats(s) + 1);
  DeviceCache d_kc(s, cache), d_vc(s, cache);
  DeviceBuffer<int> d_pos(1);
  ASSERT_EQ(attn_rope_table(s, d_rope.data(), nullptr), cudaSuccess);
  std::vector<float> kc(cache, 0.0f), vc(cache, 0.0f), q(nq * hd), out(nq * hd);

  cudaStream_t stream;
  QF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  QF_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const cudaError_t err =
      attn_decode(s, d_qproj.data(), d_kproj.data(), d_vproj.data(), d_qn.data(), d_kn.data(),
                  d_rope.data(), d_pos.data(), d_q.data(), d_kc.data(), d_vc.data(), d_out.data(),
                  d_scratch.data(), stream, path);
  QF_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  ASSERT_EQ(err, cudaSuccess);
  QF_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  for (int pos = 0; pos < n_steps; ++pos) {
    // Projections with an offset and a spread so the norms do real work.
    const std::vector<float> q_proj = randn(nq * 2 * hd, g, 1.5f, 0.2f),
                             k_proj = randn(kv_row, g, 0.7f, -0.1f), v_proj = randn(kv_row, g);
    QF_CUDA_CHECK(cudaMemcpyAsync(d_qproj.data(), q_proj.data(), d_qproj.bytes(),
                                  cudaMemcpyHostToDevice, stream));
    QF_CUDA_CHECK(cudaMemcpyAsync(d_kproj.data(), k_proj.data(), d_kproj.bytes(),
                                  cudaMemcpyHostToDevice, stream));
    QF_CUDA_CHECK(cudaMemcpyAsync(d_vproj.data(), v_proj.data(), d_vproj.bytes(),
                                  cudaMemcpyHostToDevice, stream));
    QF_CUDA_CHECK(cudaMemcpyAsync(d_pos.data(), &pos, sizeof(int), cudaMemcpyHostToDevice, stream));
    QF_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    QF_CUDA_CHECK(cudaStreamSynchronize(stream));  // the host buffers above die at loop end
    attn_prepare_ref(s, q_proj.data(), k_proj.data(), v_proj.data(), q_norm_w.data(),
                     k_norm_w.data(), pos, q.data(), kc.data(), vc.data());
    if (std::find(checks.begin(), checks.end(), pos) == checks.end()) continue;

    SCOPED_TRACE("context " + std::to_string(pos + 1));
    const size_t used = static_cast<size_t>(pos + 1) * kv_row;
    const std::vector<float> got_k = d_kc.read(used), got_v = d_vc.read(used);
    const std::vector<float> want_k(kc.begin(), kc.begin() + static_cast<ptrdiff_t>(used)),
        want_v(vc.begin(), vc.begin() + static_cast<ptrdiff_t>(used));
    const std::string at = " T" + std::to_string(pos + 1);
    EXPECT_EQ(std::memcmp(got_v.data(), want_v.data(), used * sizeof(float)), 0) << "v cache";
    expect_close(download(d_q), q, rms(q), 1e-5, "q" + at);
    if (s.kv != KvType::kF32) {
      expect_within_ulp(got_k, want_k, s.kv, "k cache" + at);
      attn_decode_ref(s, q.data(), q_proj.data(), got_k.data(), got_v.data(), pos, out.data());
    } else {
      expect_close(got_k, want_k, rms(want_k), 1e-5, "k cache" + at);
      attn_decode_ref(s, q.data(), q_proj.data(), kc.data(), vc.data(), pos, out.data());
    }
    expect_close(download(d_out), out, rms(want_v), 1e-5, "out" + at);
    if (::testing::Test::HasFailure()) break;
  }
  QF_CUDA_CHECK(cudaGraphExecDestroy(exec));
  QF_CUDA_CHECK(cudaGraphDestroy(graph));
  QF_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(AttentionKernel, Qwen35_122B) {
  QF_REQUIRE_GPU();
  AttnShape s{.n_q_heads = 32, .n_kv_heads = 2, .head_dim = 256, .rot_dim = 64, .max_len = 4096};
  run_sequence(s, 4096, {0, 6, 31, 32, 299, 1000, 4095}, 11);
  for (const KvType kv : {KvType::kBf16, KvType::kFp8}) {
    s.kv = kv;
    for (const AttnDecodePath path : {AttnDecodePath::kSplit, AttnDecodePath::kMma})
      run_sequence(s, 4096, {0, 6, 31, 32, 299, 1000, 4095}, 21, path);
  }
}
TEST(AttentionKernel, Qwen35_35BLongContext) {
  QF_REQUIRE_GPU();
  // 5000 rows, on an H200 over 128 splits: 64-row chunks, two online-softmax tiles per split
  // (fewer SMs: fewer, longer chunks).
  AttnShape s{.n_q_heads = 16, .n_kv_heads = 2, .head_dim = 256, .rot_dim = 64, .max_len = 6000};
  run_sequence(s, 5000, {0, 4095, 4096, 4999}, 12);
  // bf16 on the tensor cores: 8 query heads in the MMA's 16 rows, two tiles per split.
  s.kv = KvType::kBf16;
  run_sequence(s, 5000, {0, 63, 64, 4095, 4999}, 22, AttnDecodePath::kMma);
  s.kv = KvType::kFp8;
  run_sequence(s, 5000, {0, 63, 64, 4095, 4999}, 23, AttnDecodePath::kMma);
}
TEST(AttentionKernel, AwkwardShapes) {
  QF_REQUIRE_GPU();
  run_sequence(AttnShape{.n_q_heads = 3,
                         .n_kv_heads = 1,
                         .head_dim = 64,
                         .rot_dim = 16,
                         .theta = 1e4f,
                         .max_len = 50},
               50, {0, 1, 2, 30, 31, 32, 33, 49}, 13);
  run_sequence(AttnShape{.n_q_heads = 6,
                         .n_kv_heads = 3,
                         .head_dim = 128,
                         .rot_dim = 128,
                         .theta = 5e5f,
                         .max_len = 300},
               300, {0, 100, 299}, 14);
  run_sequence(
      AttnShape{.n_q_heads = 4, .n_kv_heads = 4, .head_dim = 256, .rot_dim = 0, .max_len = 40}, 40,
      {0, 39}, 15);
  // bf16 and fp8 caches at each head size (kVec 2 and 4 loads) and the general instance; at hd
  // 256 on both paths (groups of 2 in the MMA's 16 rows).
  for (const KvType kv : {KvType::kBf16, KvType::kFp8}) {
    for (const int hd : {64, 128, 256}) {
      for (const AttnDecodePath path : {AttnDecodePath::kSplit, AttnDecodePath::kMma}) {
        if (hd != 256 && path == AttnDecodePath::kMma) continue;
        run_sequence(AttnShape{.n_q_heads = 6,
                               .n_kv_heads = 3,
                               .head_dim = hd,
                               .rot_dim = hd / 2,
                               .theta = 1e4f,
                               .max_len = 70,
                               .kv = kv},
                     70, {0, 31, 32, 69}, 30 + hd, path);
      }
    }
  }
}
TEST(AttentionKernel, LargeGroupsSplitAcrossBlocks) {
  QF_REQUIRE_GPU();
  // 40 query heads on one KV head at hd 256 (8 per block, 5 blocks), 70 at hd 64 (32 + 32 + 6).
  run_sequence(
      AttnShape{.n_q_heads = 40, .n_kv_heads = 1, .head_dim = 256, .rot_dim = 64, .max_len = 100},
      100, {0, 99}, 16);
  run_sequence(
      AttnShape{.n_q_heads = 70, .n_kv_heads = 1, .head_dim = 64, .rot_dim = 32, .max_len = 40}, 40,
      {0, 39}, 17);
  // bf16 and fp8 on the tensor cores: 40 heads in blocks of 16, 16 and 8.
  for (const KvType kv : {KvType::kBf16, KvType::kFp8}) {
    run_sequence(AttnShape{.n_q_heads = 40,
                           .n_kv_heads = 1,
                           .head_dim = 256,
                           .rot_dim = 64,
                           .max_len = 100,
                           .kv = kv},
                 100, {0, 99}, 18, AttnDecodePath::kMma);
  }
}

TEST(AttentionKernel, RotaryTableIsTheRoundedDoubleValue) {
  QF_REQUIRE_GPU();
  // Every entry equals cos/sin of the f32 angle in double, rounded once (on the host here).
  const AttnShape s{
      .n_q_heads = 32, .n_kv_heads = 2, .head_dim = 256, .rot_dim = 64, .max_len = 5000};
  DeviceBuffer<float> d_rope(attn_rope_floats(s));
  ASSERT_EQ(d_rope.size(), 5000u * 64);
  ASSERT_EQ(attn_rope_table(s, d_rope.data(), nullptr), cudaSuccess);
  const std::vector<float> got = download(d_rope);
  size_t wrong = 0;
  for (int p = 0; p < s.max_len; ++p) {
    for (int i = 0; i < s.rot_dim / 2; ++i) {
      const float exponent = static_cast<float>(2 * i) / static_cast<float>(s.rot_dim);
      const float inv_freq = 1.0f / static_cast<float>(std::pow(static_cast<double>(s.theta),
                                                                static_cast<double>(exponent)));
      const double angle = static_cast<float>(p) * inv_freq;
      const size_t j = (static_cast<size_t>(p) * (s.rot_dim / 2) + i) * 2;
      wrong += got[j] != static_cast<float>(std::cos(angle));
      wrong += got[j + 1] != static_cast<float>(std::sin(angle));
    }
  }
  EXPECT_EQ(wrong, 0u) << "of " << got.size();
}

// One call over n tokens from position p0 (`many`: attn_prefill or attn_decode_rows, given the
// rows, the norms, the rotary table, the positions, the caches and the outputs) against n
// attn_decode calls on `path` from the same cache: the appended k and v rows bit for bit, the
// outputs bit for bit (`exact`) or within the bound above. The first p0 rows come from random
// cache contents.
using ManyTokens = std::function<cudaError_t(
    const float* q_proj, const float* k_proj, const float* v_proj, size_t ld, const float* q_norm,
    const float* k_norm, const float* rope, const int* pos, void* k_cache, void* v_cache,
    float* out, size_t ld_out)>;
void expect_many_is_decode(const AttnShape& s, int p0, int n, uint64_t seed, const ManyTokens& many,
                           AttnDecodePath path, bool exact) {
  std::mt19937_64 g(seed);
  const size_t nq = s.n_q_heads, hd = s.head_dim, kv_row = s.n_kv_heads * hd;
  const size_t ld = nq * 2 * hd + 2 * kv_row + 3, ld_out = nq * hd + 1;  // q | k | v, padded
  const size_t cache = static_cast<size_t>(s.max_len) * kv_row;
  const std::vector<float> q_norm_w = randn(hd, g, 0.1f), k_norm_w = randn(hd, g, 0.1f);
  std::vector<float> rows = randn(n * ld, g, 1.0f, 0.1f), kc = randn(cache, g, 0.5f),
                     vc = randn(cache, g);
  auto d_qn = upload(q_norm_w), d_kn = upload(k_norm_w), d_rows = upload(rows);
  DeviceCache d_kc_a(s, kc), d_vc_a(s, vc), d_kc_b(s, kc), d_vc_b(s, vc);
  std::vector<int> pos(n);
  for (int t = 0; t < n; ++t) pos[t] = p0 + t;
  auto d_pos = upload(pos);
  DeviceBuffer<float> d_out_a(n * ld_out), d_out_b(n * ld_out), d_rope(attn_rope_floats(s) + 1),
      d_scratch_b(attn_scratch_floats(s));
  QF_CUDA_CHECK(cudaMemset(d_out_a.data(), 0, d_out_a.bytes()));
  QF_CUDA_CHECK(cudaMemset(d_out_b.data(), 0, d_out_b.bytes()));
  ASSERT_EQ(attn_rope_table(s, d_rope.data(), nullptr), cudaSuccess);
  const float* r0 = d_rows.data();
  const size_t k_at = nq * 2 * hd, v_at = k_at + kv_row;
  ASSERT_EQ(many(r0, r0 + k_at, r0 + v_at, ld, d_qn.data(), d_kn.data(), d_rope.data(),
                 d_pos.data(), d_kc_a.data(), d_vc_a.data(), d_out_a.data(), ld_out),
            cudaSuccess);
  for (int t = 0; t < n; ++t) {
    const float* r = r0 + t * ld;
    ASSERT_EQ(attn_decode(s, r, r + k_at, r + v_at, d_qn.data(), d_kn.data(), d_rope.data(),
                          d_pos.data() + t, nullptr, d_kc_b.data(), d_vc_b.data(),
                          d_out_b.data() + t * ld_out, d_scratch_b.data(), nullptr, path),
              cudaSuccess);
    QF_CUDA_CHECK(cudaDeviceSynchronize());  // its early loads read the row the call before wrote
  }
  const auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
  };
  EXPECT_TRUE(same(d_kc_a.read(), d_kc_b.read())) << "k cache";
  EXPECT_TRUE(same(d_vc_a.read(), d_vc_b.read())) << "v cache";
  if (exact) {
    EXPECT_TRUE(same(download(d_out_a), download(d_out_b))) << "outputs";
  } else {
    const std::vector<float> used_v(vc.begin(), vc.begin() + (p0 + n) * kv_row);
    expect_close(download(d_out_a), download(d_out_b), rms(used_v), 1e-5, "outputs");
  }
}

// attn_prefill: its rows bit for bit attn_decode's, its outputs within the bound (one split of
// the context against attn_decode's several).
void expect_prefill_is_decode(const AttnShape& s, int p0, int n, uint64_t seed,
                              AttnPrefillPath path = AttnPrefillPath::kScalar) {
  SCOPED_TRACE("prefill Nq " + std::to_string(s.n_q_heads) + " hd " + std::to_string(s.head_dim) +
               " from " + std::to_string(p0) + " n " + std::to_string(n) + " path " +
               std::to_string(static_cast<int>(path)) + kv_name(s));
  DeviceBuffer<float> scratch(attn_prefill_scratch_floats(s, n));
  expect_many_is_decode(
      s, p0, n, seed,
      [&](const float* q, const float* k, const float* v, size_t ld, const float* qn,
          const float* kn, const float* rope, const int* pos, void* kc, void* vc, float* out,
          size_t ld_out) {
        return attn_prefill(s, q, k, v, ld, n, qn, kn, rope, pos, kc, vc, out, ld_out,
                            scratch.data(), nullptr, path);
      },
      AttnDecodePath::kAuto, false);
}

TEST(AttentionKernel, PrefillIsDecodeWithinRounding) {
  QF_REQUIRE_GPU();
  AttnShape q122{.n_q_heads = 32, .n_kv_heads = 2, .head_dim = 256, .rot_dim = 64};
  q122.max_len = 700;
  expect_prefill_is_decode(q122, 0, 1, 1);
  expect_prefill_is_decode(q122, 0, 37, 2);
  expect_prefill_is_decode(q122, 300, 256, 3);
  expect_prefill_is_decode(q122, 31, 33, 4);  // across tile edges
  AttnShape odd{.n_q_heads = 6, .n_kv_heads = 2, .head_dim = 64, .rot_dim = 64, .theta = 1e4f};
  odd.max_len = 100;
  expect_prefill_is_decode(odd, 5, 40, 5);
  AttnShape big_group{.n_q_heads = 40, .n_kv_heads = 2, .head_dim = 128, .rot_dim = 32};
  big_group.max_len = 80;  // 20 heads a KV head: head blocks of 16 and 4
  expect_prefill_is_decode(big_group, 10, 17, 6);
  for (const KvType kv : {KvType::kBf16, KvType::kFp8}) {
    for (AttnShape b : {q122, odd, big_group}) {
      b.kv = kv;
      expect_prefill_is_decode(b, 31, 33, 7);
    }
  }
  EXPECT_EQ(attn_prefill(q122, nullptr, nullptr, nullptr, 0, 65535, nullptr, nullptr, nullptr,
                         nullptr, nullptr, nullptr, nullptr, 0, nullptr, nullptr),
            cudaErrorInvalidValue);
}

// attn_decode_rows: bit for bit attn_decode calls on the same path.
void expect_rows_are_decode(const AttnShape& s, int p0, int n, uint64_t seed,
                            AttnDecodePath path = AttnDecodePath::kSplit) {
  SCOPED_TRACE("rows Nq " + std::to_string(s.n_q_heads) + " hd " + std::to_string(s.head_dim) +
               " from " + std::to_string(p0) + " n " + std::to_string(n) + kv_name(s) +
               path_name(path));
  DeviceBuffer<float> scratch(attn_decode_rows_scratch_floats(s, n));
  expect_many_is_decode(
      s, p0, n, seed,
      [&](const float* q, const float* k, const float* v, size_t ld, const float* qn,
          const float* kn, const float* rope, const int* pos, void* kc, void* vc, float* out,
          size_t ld_out) {
        return attn_decode_rows(s, q, k, v, ld, n, qn, kn, rope, pos, kc, vc, out, ld_out,
                                scratch.data(), nullptr, path);
      },
      path, true);
}

// A verify's 1 to 3 rows: at the start of the cache, across tile edges, at the end of a long cache
// (several tiles a split) and where the splits' chunk grows between one row and the next, on the
// split kernel's Qwen3.5 instance and general one, f32, bf16 and fp8 caches, and on the
// tensor-core kernel (bf16 and fp8 at head_dim 256).
TEST(AttentionKernel, DecodeRowsAreDecodeCalls) {
  QF_REQUIRE_GPU();
  AttnShape q122{.n_q_heads = 32, .n_kv_heads = 2, .head_dim = 256, .rot_dim = 64};
  q122.max_len = 4200;  // past every split count's edge below
  AttnShape odd{.n_q_heads = 6, .n_kv_heads = 2, .head_dim = 64, .rot_dim = 64, .theta = 1e4f};
  odd.max_len = 700;
  AttnShape big_group{.n_q_heads = 40, .n_kv_heads = 2, .head_dim = 128, .rot_dim = 32};
  big_group.max_len = 300;  // 20 heads a KV head: head blocks of 16 and 4
  AttnShape q35 = q122;     // 35B-A3B: 8 query heads a KV head (half a tensor-core block)
  q35.n_q_heads = 16;
  AttnShape wide = q122;  // 20 query heads a KV head: tensor-core head blocks of 16 and 4 too
  wide.n_q_heads = 40;
  wide.max_len = 300;
  uint64_t seed = 100;
  using Path = AttnDecodePath;
  for (AttnShape s : {q122, odd, big_group, q35, wide}) {
    for (const auto& [kv, path] :
         {std::pair{KvType::kF32, Path::kSplit}, std::pair{KvType::kBf16, Path::kSplit},
          std::pair{KvType::kBf16, Path::kMma}, std::pair{KvType::kFp8, Path::kSplit},
          std::pair{KvType::kFp8, Path::kMma}}) {
      if (path == Path::kMma && s.head_dim != 256) continue;
      s.kv = kv;
      for (int n = 1; n <= 3; ++n) {
        expect_rows_are_decode(s, 0, n, ++seed, path);
        expect_rows_are_decode(s, 31, n, ++seed, path);
        expect_rows_are_decode(s, s.max_len - 3, n, ++seed, path);
      }
    }
  }
  // The chunk is 32 rows up to 32 x splits rows of context, then 64 (two blocks an SM: at this
  // shape 2 KV heads of 2 split-kernel head blocks or 1 tensor-core block, so SMs / 2 or SMs
  // splits): a verify whose rows straddle that edge, so the rows' splits differ.
  int device = 0, n_sm = 0;
  QF_CUDA_CHECK(cudaGetDevice(&device));
  QF_CUDA_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, device));
  for (const auto& [kv, path, splits] : {std::tuple{KvType::kF32, Path::kSplit, n_sm / 2},
                                         {KvType::kBf16, Path::kSplit, n_sm / 2},
                                         {KvType::kBf16, Path::kMma, n_sm},
                                         {KvType::kFp8, Path::kSplit, n_sm / 2},
                                         {KvType::kFp8, Path::kMma, n_sm}}) {
    q122.kv = kv;
    const int edge = 32 * std::clamp(splits, 1, 128);
    for (int p0 = edge - 4; p0 <= edge + 1; ++p0) expect_rows_are_decode(q122, p0, 3, ++seed, path);
  }
  EXPECT_EQ(attn_decode_rows(q122, nullptr, nullptr, nullptr, 0, 0, nullptr, nullptr, nullptr,
                             nullptr, nullptr, nullptr, nullptr, 0, nullptr, nullptr),
            cudaErrorInvalidValue);
  q122.kv = KvType::kF32;
  EXPECT_EQ(attn_decode_rows(q122, nullptr, nullptr, nullptr, 0, 1, nullptr, nullptr, nullptr,
                             nullptr, nullptr, nullptr, nullptr, 0, nullptr, nullptr, Path::kMma),
            cudaErrorInvalidValue);
}

// The tensor-core path (head_dim 256), both launch shapes, against attn_decode: across 16-key
// tiles and query blocks (128 and 32 rows), a partial last block, groups of 16, 8, 3 and 1 query
// heads a KV head (the wide shape's blocks hold 8, 16, 42 2/3 and 128 tokens, so rows whose keys
// end tiles before the block's last), and a prompt deep into a long cache (hundreds of tiles).
TEST(AttentionKernel, TensorCorePrefillIsDecodeWithinRounding) {
  QF_REQUIRE_GPU();
  AttnShape q122{.n_q_heads = 32, .n_kv_heads = 2, .head_dim = 256, .rot_dim = 64};
  q122.max_len = 700;
  AttnShape q35{.n_q_heads = 16, .n_kv_heads = 2, .head_dim = 256, .rot_dim = 64};
  q35.max_len = 300;
  AttnShape g3{.n_q_heads = 3, .n_kv_heads = 1, .head_dim = 256, .rot_dim = 256, .theta = 1e4f};
  g3.max_len = 200;
  AttnShape mha{.n_q_heads = 4, .n_kv_heads = 4, .head_dim = 256, .rot_dim = 0};
  mha.max_len = 160;
  AttnShape deep = q122;
  deep.max_len = 6000;
  for (const AttnPrefillPath path : {AttnPrefillPath::kMma, AttnPrefillPath::kMmaNarrow}) {
    expect_prefill_is_decode(q122, 0, 1, 11, path);
    expect_prefill_is_decode(q122, 0, 37, 12, path);
    expect_prefill_is_decode(q122, 300, 256, 13, path);
    expect_prefill_is_decode(q122, 31, 33, 14, path);
    expect_prefill_is_decode(q35, 17, 129, 15, path);
    expect_prefill_is_decode(g3, 3, 131, 16, path);
    expect_prefill_is_decode(mha, 1, 127, 17, path);
    expect_prefill_is_decode(deep, 5700, 70, 18, path);
    AttnShape b = q122;
    for (const KvType kv : {KvType::kBf16, KvType::kFp8}) {
      b.kv = kv;
      expect_prefill_is_decode(b, 300, 256, 19, path);
    }
  }
  // A shape the path does not take: refused before any launch.
  AttnShape hd128{.n_q_heads = 4, .n_kv_heads = 2, .head_dim = 128, .rot_dim = 64};
  hd128.max_len = 16;
  EXPECT_EQ(attn_prefill(hd128, nullptr, nullptr, nullptr, 0, 1, nullptr, nullptr, nullptr, nullptr,
                         nullptr, nullptr, nullptr, 0, nullptr, nullptr, AttnPrefillPath::kMma),
            cudaErrorInvalidValue);
}

TEST(AttentionKernel, RejectsUnsupportedShapes) {
  // Validation happens before any launch, so this needs no device.
  const auto refused = [](const AttnShape& s) {
    EXPECT_EQ(attn_scratch_floats(s), 0u);
    EXPECT_EQ(attn_rope_floats(s), 0u);
    EXPECT_EQ(attn_rope_table(s, nullptr, nullptr), cudaErrorInvalidValue);
    return attn_decode(s, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                       nullptr, nullptr, nullptr, nullptr, nullptr) == cudaErrorInvalidValue;
  };
  EXPECT_TRUE(
      refused({.n_q_heads = 2, .n_kv_heads = 1, .head_dim = 96, .rot_dim = 32, .max_len = 8}));
  EXPECT_TRUE(
      refused({.n_q_heads = 3, .n_kv_heads = 2, .head_dim = 64, .rot_dim = 32, .max_len = 8}));
  EXPECT_TRUE(
      refused({.n_q_heads = 2, .n_kv_heads = 1, .head_dim = 64, .rot_dim = 7, .max_len = 8}));
  EXPECT_TRUE(
      refused({.n_q_heads = 2, .n_kv_heads = 1, .head_dim = 64, .rot_dim = 66, .max_len = 8}));
  EXPECT_TRUE(
      refused({.n_q_heads = 2, .n_kv_heads = 1, .head_dim = 64, .rot_dim = 32, .max_len = 0}));
  EXPECT_TRUE(refused({.n_q_heads = 2,
                       .n_kv_heads = 1,
                       .head_dim = 64,
                       .rot_dim = 32,
                       .max_len = 8,
                       .kv = static_cast<KvType>(7)}));
  // The tensor-core path: bf16 and fp8 caches at head_dim 256 only.
  const auto mma_refused = [](const AttnShape& s) {
    return attn_decode(s, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                       nullptr, nullptr, nullptr, nullptr, nullptr,
                       AttnDecodePath::kMma) == cudaErrorInvalidValue;
  };
  EXPECT_TRUE(
      mma_refused({.n_q_heads = 4, .n_kv_heads = 2, .head_dim = 256, .rot_dim = 64, .max_len = 8}));
  EXPECT_TRUE(mma_refused({.n_q_heads = 4,
                           .n_kv_heads = 2,
                           .head_dim = 128,
                           .rot_dim = 64,
                           .max_len = 8,
                           .kv = KvType::kBf16}));
}

}  // namespace
}  // namespace qf::kern
