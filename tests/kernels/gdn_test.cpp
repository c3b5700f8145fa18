// gdn_decode on the GPU against gdn_decode_ref, several tokens in sequence with the conv and
// recurrent state carried on each side, at awkward sizes (dk, dv = 16, 32, 48, 128; Nv/Nk = 1, 2,
// 4; kc = 2, 3, 4), at the edges of the launch plan (clusters of 5, 7 and 8 column tiles, a
// partly idle last tile, 128-column tiles, 1024-thread blocks, kc = 1 and 8) and the real
// 35B-A3B / 122B-A10B sizes. Tolerances (mixer_check.h):
//   conv state: exact (it only moves inputs; the kernel's two copies are checked against the
//     reference's one, the copy each step writes);
//   recurrent state: rel 1e-5 of its rms. Per token each element takes a dk-long dot product
//     (p), one multiply-add and a decay; the old error is multiplied by alpha (I - beta k k^T),
//     which does not grow it, so the error stays a few u * sqrt(dk) ~ 1e-6 of the state;
//   outputs: rel 1e-5 * sqrt(dk) of their rms. o = S^T q^ turns a state error into
//     |dS|_F |q^| while |o| ~ |S|_F |q^| / sqrt(dk) for a q^ unrelated to S, and the gated
//     RMSNorm divides by |o|; so the relative error of o is at most sqrt(dk) times the state's.
// gdn_prefill: bit for bit gdn_decode token by token (PrefillIsDecodeTokenByToken).
// Skips (and says why) where no CUDA device is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mixer_check.h"
#include "qf/kern/gdn.h"

namespace qf::kern {
namespace {

using test::download;
using test::expect_close;
using test::randn;
using test::rms;
using test::upload;
using test::upload_to;

struct HostGdn {
  std::vector<float> conv_w, dt_bias, a_log, norm_w, conv, ssm;
};

HostGdn make_layer(const GdnShape& s, std::mt19937_64& g) {
  const size_t conv_dim = static_cast<size_t>(s.conv_dim());
  HostGdn h;
  h.conv_w = randn(conv_dim * s.kc, g, 0.5f);
  h.dt_bias = randn(static_cast<size_t>(s.n_v_heads), g, 1.0f);
  h.a_log = randn(static_cast<size_t>(s.n_v_heads), g, 0.8f);  // decay rates e^-3 .. e^2.5
  h.norm_w = randn(static_cast<size_t>(s.dv), g, 0.1f, 1.0f);
  // Mid-sequence state: the first token already decays and overwrites a non-zero state.
  h.conv = randn(conv_dim * (s.kc - 1), g, 1.0f);
  h.ssm = randn(static_cast<size_t>(s.n_v_heads) * s.dk * s.dv, g, 0.05f);
  return h;
}

void run_sequence(const GdnShape& s, int steps, uint64_t seed) {
  SCOPED_TRACE("Nk " + std::to_string(s.n_k_heads) + " Nv " + std::to_string(s.n_v_heads) + " dk " +
               std::to_string(s.dk) + " dv " + std::to_string(s.dv) + " kc " +
               std::to_string(s.kc));
  std::printf("GDN Nk %d Nv %d dk %d dv %d kc %d\n", s.n_k_heads, s.n_v_heads, s.dk, s.dv, s.kc);
  std::mt19937_64 g(seed);
  HostGdn h = make_layer(s, g);
  const size_t conv_dim = static_cast<size_t>(s.conv_dim());
  const size_t nv = static_cast<size_t>(s.n_v_heads), vd = nv * s.dv;
  auto d_conv_w = upload(h.conv_w), d_dt = upload(h.dt_bias), d_alog = upload(h.a_log),
       d_norm = upload(h.norm_w), d_ssm = upload(h.ssm);
  DeviceBuffer<float> d_qkv(conv_dim), d_z(vd), d_b(nv), d_a(nv), d_out(vd);
  // Two history copies: the step at position t reads copy t % 2 and writes the other. Copy 1
  // starts as NaN, so a step that read the copy it should not would show.
  const size_t hist = h.conv.size();
  DeviceBuffer<float> d_conv(gdn_conv_state_floats(s) + 1);
  ASSERT_EQ(gdn_conv_state_floats(s), 2 * hist);
  QF_CUDA_CHECK(cudaMemset(d_conv.data(), 0xFF, d_conv.bytes()));
  QF_CUDA_CHECK(
      cudaMemcpy(d_conv.data(), h.conv.data(), hist * sizeof(float), cudaMemcpyHostToDevice));
  DeviceBuffer<int> d_pos(1);
  const GdnParams dp{d_conv_w.data(), d_dt.data(), d_alog.data(), d_norm.data()};
  const GdnParams hp{h.conv_w.data(), h.dt_bias.data(), h.a_log.data(), h.norm_w.data()};
  const double rel_state = 1e-5, rel_out = 1e-5 * std::sqrt(static_cast<double>(s.dk));

  std::vector<float> out(vd);
  for (int t = 0; t < steps; ++t) {
    SCOPED_TRACE("token " + std::to_string(t));
    const std::vector<float> qkv = randn(conv_dim, g, 1.0f, 0.1f), z = randn(vd, g, 1.5f);
    std::vector<float> b = randn(nv, g, 2.0f), a = randn(nv, g, 2.0f);
    if (t == 1) a[0] = 30.0f;  // softplus past its threshold (alpha underflows to 0)
    upload_to(qkv, d_qkv);
    upload_to(z, d_z);
    upload_to(b, d_b);
    upload_to(a, d_a);
    QF_CUDA_CHECK(cudaMemcpy(d_pos.data(), &t, sizeof(int), cudaMemcpyHostToDevice));
    ASSERT_EQ(gdn_decode(s, dp, d_qkv.data(), d_z.data(), d_b.data(), d_a.data(), d_pos.data(),
                         GdnState{d_conv.data(), d_ssm.data()}, d_out.data(), nullptr),
              cudaSuccess);
    gdn_decode_ref(s, hp, qkv.data(), z.data(), b.data(), a.data(),
                   GdnState{h.conv.data(), h.ssm.data()}, out.data());
    QF_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> conv = download(d_conv);
    EXPECT_EQ(std::memcmp(conv.data() + ((t + 1) % 2) * hist, h.conv.data(), hist * sizeof(float)),
              0)
        << "conv state";
    expect_close(download(d_ssm), h.ssm, rms(h.ssm), rel_state, "state t" + std::to_string(t));
    expect_close(download(d_out), out, rms(out), rel_out, "out t" + std::to_string(t));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(GdnKernel, TinyHeads) {
  QF_REQUIRE_GPU();
  run_sequence(GdnShape{.n_k_heads = 1, .n_v_heads = 1, .dk = 16, .dv = 16, .kc = 4}, 6, 1);
}
TEST(GdnKernel, AwkwardShapes) {
  QF_REQUIRE_GPU();
  run_sequence(GdnShape{.n_k_heads = 1, .n_v_heads = 2, .dk = 16, .dv = 32, .kc = 2}, 5, 2);
  run_sequence(GdnShape{.n_k_heads = 2, .n_v_heads = 4, .dk = 32, .dv = 16, .kc = 3}, 5, 3);
  run_sequence(GdnShape{.n_k_heads = 2, .n_v_heads = 8, .dk = 32, .dv = 128, .kc = 4}, 5, 4);
  run_sequence(GdnShape{.n_k_heads = 1, .n_v_heads = 1, .dk = 128, .dv = 128, .kc = 4}, 5, 5);
  run_sequence(GdnShape{.n_k_heads = 3, .n_v_heads = 6, .dk = 48, .dv = 48, .kc = 4}, 5, 6);
  run_sequence(GdnShape{.n_k_heads = 2, .n_v_heads = 2, .dk = 128, .dv = 16, .kc = 3}, 5, 7);
}
// The plan's edges: dv 200 -> 7 tiles of 32 (the last with 8 live columns) and no conv history;
// dv 520 -> 5 tiles of 128 columns (the last with 8 live ones) and 8 conv taps; dv 256 with
// dk 512 -> 8 tiles (the largest cluster) of 32 columns x 32 row groups = 1024 threads.
TEST(GdnKernel, PlanEdges) {
  QF_REQUIRE_GPU();
  run_sequence(GdnShape{.n_k_heads = 1, .n_v_heads = 2, .dk = 64, .dv = 200, .kc = 1}, 4, 11);
  run_sequence(GdnShape{.n_k_heads = 2, .n_v_heads = 2, .dk = 32, .dv = 520, .kc = 8}, 4, 12);
  run_sequence(GdnShape{.n_k_heads = 1, .n_v_heads = 1, .dk = 512, .dv = 256, .kc = 4}, 4, 13);
}
TEST(GdnKernel, Qwen35_35B) {
  QF_REQUIRE_GPU();
  run_sequence(GdnShape{.n_k_heads = 16, .n_v_heads = 32, .dk = 128, .dv = 128, .kc = 4}, 6, 8);
}
TEST(GdnKernel, Qwen35_122B) {
  QF_REQUIRE_GPU();
  run_sequence(GdnShape{.n_k_heads = 16, .n_v_heads = 64, .dk = 128, .dv = 128, .kc = 4}, 6, 9);
}

// Same inputs, same state: bit-identical outputs and state (every block of a head's cluster sums
// the tiles' sums of squares in index order, whatever order the blocks finish in).
TEST(GdnKernel, Deterministic) {
  QF_REQUIRE_GPU();
  const GdnShape s{.n_k_heads = 16, .n_v_heads = 64, .dk = 128, .dv = 128, .kc = 4};
  std::mt19937_64 g(10);
  const HostGdn h = make_layer(s, g);
  const size_t conv_dim = static_cast<size_t>(s.conv_dim()), nv = 64, vd = nv * s.dv;
  const std::vector<float> qkv = randn(conv_dim, g), z = randn(vd, g), b = randn(nv, g),
                           a = randn(nv, g);
  auto d_conv_w = upload(h.conv_w), d_dt = upload(h.dt_bias), d_alog = upload(h.a_log),
       d_norm = upload(h.norm_w), d_qkv = upload(qkv), d_z = upload(z), d_b = upload(b),
       d_a = upload(a);
  const GdnParams dp{d_conv_w.data(), d_dt.data(), d_alog.data(), d_norm.data()};
  DeviceBuffer<float> d_out(vd);
  DeviceBuffer<int> d_pos(1);
  std::vector<float> first_out, first_ssm;
  for (int run = 0; run < 3; ++run) {
    DeviceBuffer<float> d_conv(gdn_conv_state_floats(s));
    QF_CUDA_CHECK(cudaMemcpy(d_conv.data(), h.conv.data(), h.conv.size() * sizeof(float),
                             cudaMemcpyHostToDevice));
    auto d_ssm = upload(h.ssm);
    for (int t = 0; t < 3; ++t) {
      QF_CUDA_CHECK(cudaMemcpy(d_pos.data(), &t, sizeof(int), cudaMemcpyHostToDevice));
      ASSERT_EQ(gdn_decode(s, dp, d_qkv.data(), d_z.data(), d_b.data(), d_a.data(), d_pos.data(),
                           GdnState{d_conv.data(), d_ssm.data()}, d_out.data(), nullptr),
                cudaSuccess);
    }
    const std::vector<float> out = download(d_out), ssm = download(d_ssm);
    if (run == 0) {
      first_out = out;
      first_ssm = ssm;
    } else {
      EXPECT_EQ(std::memcmp(out.data(), first_out.data(), vd * sizeof(float)), 0) << run;
      EXPECT_EQ(std::memcmp(ssm.data(), first_ssm.data(), ssm.size() * sizeof(float)), 0) << run;
    }
  }
}

// gdn_prefill over n tokens against n gdn_decode calls from the same state: the outputs, the
// recurrent state and the conv history the next step reads, bit for bit; at an odd and an even
// start position, token counts below and above the history's length, padded input rows.
void expect_prefill_is_decode(const GdnShape& s, int n, int pos0, uint64_t seed) {
  SCOPED_TRACE("prefill Nk " + std::to_string(s.n_k_heads) + " Nv " + std::to_string(s.n_v_heads) +
               " dk " + std::to_string(s.dk) + " dv " + std::to_string(s.dv) + " kc " +
               std::to_string(s.kc) + " n " + std::to_string(n) + " from " + std::to_string(pos0));
  ASSERT_TRUE(gdn_prefill_ok(s));
  std::mt19937_64 g(seed);
  const HostGdn h = make_layer(s, g);
  const size_t conv_dim = static_cast<size_t>(s.conv_dim()), nv = s.n_v_heads, vd = nv * s.dv;
  const size_t ld = conv_dim + vd + 2 * nv + 3, ld_out = vd + 5;  // qkv | z | b | a, padded
  std::vector<float> rows = randn(n * ld, g, 1.0f, 0.1f);
  const size_t hist = h.conv.size();
  std::vector<float> conv(2 * hist + 1, std::nanf(""));  // the other copy NaN
  std::copy(h.conv.begin(), h.conv.end(), conv.begin() + (pos0 % 2) * hist);
  auto d_conv_w = upload(h.conv_w), d_dt = upload(h.dt_bias), d_alog = upload(h.a_log),
       d_norm = upload(h.norm_w), d_rows = upload(rows);
  const GdnParams dp{d_conv_w.data(), d_dt.data(), d_alog.data(), d_norm.data()};
  auto d_conv_a = upload(conv), d_conv_b = upload(conv), d_ssm_a = upload(h.ssm),
       d_ssm_b = upload(h.ssm);
  DeviceBuffer<float> d_out_a(n * ld_out), d_out_b(n * ld_out),
      d_scratch(gdn_prefill_scratch_floats(s, n));
  QF_CUDA_CHECK(cudaMemset(d_out_a.data(), 0, d_out_a.bytes()));
  QF_CUDA_CHECK(cudaMemset(d_out_b.data(), 0, d_out_b.bytes()));
  std::vector<int> pos(n);
  for (int t = 0; t < n; ++t) pos[t] = pos0 + t;
  auto d_pos = upload(pos);
  const float* r0 = d_rows.data();
  ASSERT_EQ(gdn_prefill(s, dp, r0, r0 + conv_dim, r0 + conv_dim + vd, r0 + conv_dim + vd + nv, ld,
                        n, d_pos.data(), GdnState{d_conv_a.data(), d_ssm_a.data()}, d_out_a.data(),
                        ld_out, d_scratch.data(), nullptr),
            cudaSuccess);
  for (int t = 0; t < n; ++t) {
    const float* r = r0 + t * ld;
    ASSERT_EQ(gdn_decode(s, dp, r, r + conv_dim, r + conv_dim + vd, r + conv_dim + vd + nv,
                         d_pos.data() + t, GdnState{d_conv_b.data(), d_ssm_b.data()},
                         d_out_b.data() + t * ld_out, nullptr),
              cudaSuccess);
    QF_CUDA_CHECK(cudaDeviceSynchronize());  // its early loads read what the call before wrote
  }
  QF_CUDA_CHECK(cudaDeviceSynchronize());
  const auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
  };
  EXPECT_TRUE(same(download(d_out_a), download(d_out_b))) << "outputs";
  EXPECT_TRUE(same(download(d_ssm_a), download(d_ssm_b))) << "recurrent state";
  const size_t next = ((pos0 + n) % 2) * hist;  // the copy the next step reads
  EXPECT_TRUE(same(download(d_conv_a, hist, next), download(d_conv_b, hist, next)))
      << "conv history";
}

TEST(GdnKernel, PrefillIsDecodeTokenByToken) {
  QF_REQUIRE_GPU();
  const GdnShape q122{.n_k_heads = 16, .n_v_heads = 64, .dk = 128, .dv = 128, .kc = 4};
  for (const int n : {1, 2, 3, 4, 37}) {
    expect_prefill_is_decode(q122, n, 5, 20 + n);
    expect_prefill_is_decode(q122, n, 0, 40 + n);
  }
  uint64_t seed = 60;
  for (const GdnShape& s :
       {GdnShape{.n_k_heads = 2, .n_v_heads = 4, .dk = 64, .dv = 32, .kc = 4},
        GdnShape{.n_k_heads = 2, .n_v_heads = 4, .dk = 32, .dv = 16, .kc = 3},
        GdnShape{.n_k_heads = 3, .n_v_heads = 6, .dk = 48, .dv = 48, .kc = 4},
        GdnShape{.n_k_heads = 1, .n_v_heads = 2, .dk = 64, .dv = 200, .kc = 1},
        GdnShape{.n_k_heads = 1, .n_v_heads = 2, .dk = 16, .dv = 32, .kc = 2},
        // 12 row groups, which do not divide a warp: the barrier kernel's shape.
        GdnShape{.n_k_heads = 2, .n_v_heads = 4, .dk = 12, .dv = 16, .kc = 4}}) {
    for (const int n : {1, 2, 5}) expect_prefill_is_decode(s, n, 3, ++seed);
  }
  // 1024-thread blocks are gdn_decode's only.
  EXPECT_FALSE(gdn_prefill_ok(GdnShape{.n_k_heads = 1, .n_v_heads = 1, .dk = 512, .dv = 256}));
  EXPECT_EQ(gdn_prefill(GdnShape{.n_k_heads = 1, .n_v_heads = 1, .dk = 512, .dv = 256}, {}, nullptr,
                        nullptr, nullptr, nullptr, 0, 1, nullptr, GdnState{}, nullptr, 0, nullptr,
                        nullptr),
            cudaErrorInvalidValue);
}

TEST(GdnKernel, RejectsUnsupportedShapes) {
  // Validation happens before any launch, so this needs no device.
  const GdnParams p{};
  const GdnShape bad_ratio{.n_k_heads = 3, .n_v_heads = 4, .dk = 16, .dv = 16, .kc = 4};
  EXPECT_EQ(gdn_decode(bad_ratio, p, nullptr, nullptr, nullptr, nullptr, nullptr, GdnState{},
                       nullptr, nullptr),
            cudaErrorInvalidValue);
  const GdnShape too_deep{.n_k_heads = 1, .n_v_heads = 1, .dk = 1024, .dv = 128, .kc = 4};
  EXPECT_EQ(gdn_decode(too_deep, p, nullptr, nullptr, nullptr, nullptr, nullptr, GdnState{},
                       nullptr, nullptr),
            cudaErrorInvalidValue);
  const GdnShape too_wide{.n_k_heads = 1, .n_v_heads = 1, .dk = 16, .dv = 1056, .kc = 4};
  EXPECT_EQ(gdn_decode(too_wide, p, nullptr, nullptr, nullptr, nullptr, nullptr, GdnState{},
                       nullptr, nullptr),
            cudaErrorInvalidValue);
  for (const int kc : {0, 9}) {
    const GdnShape bad_kc{.n_k_heads = 1, .n_v_heads = 1, .dk = 16, .dv = 16, .kc = kc};
    EXPECT_EQ(gdn_decode(bad_kc, p, nullptr, nullptr, nullptr, nullptr, nullptr, GdnState{},
                         nullptr, nullptr),
              cudaErrorInvalidValue)
        << kc;
  }
  // 2 dk + tile = 2056 conv channels for 512 threads (tile 8, 64 row groups): more than two a
  // thread.
  const GdnShape many_channels{.n_k_heads = 1, .n_v_heads = 1, .dk = 1024, .dv = 8, .kc = 4};
  EXPECT_EQ(gdn_decode(many_channels, p, nullptr, nullptr, nullptr, nullptr, nullptr, GdnState{},
                       nullptr, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace qf::kern
