// gdn_decode on the GPU against gdn_decode_ref, several tokens in sequence with the conv and
// recurrent state carried on each side, at awkward sizes (dk, dv = 16, 32, 48, 128; Nv/Nk = 1, 2,
// 4; kc = 2, 3, 4), at the edges of the launch plan (clusters of 5, 7 and 8 column tiles, a
// partly idle last tile, 128-column tiles, 1024-thread blocks, kc = 1 and 8) and the real
// 35B-A3B / 122B-A10B sizes. Tolerances (mixer_check.h):
//   conv state: exact (it only moves inputs; the kernel's ring, read at the next position, is
//     checked against the reference's history);
//   recurrent state: rel 1e-5 of its rms. Per token each element takes a dk-long dot product
//     (p), one multiply-add and a decay; the old error is multiplied by alpha (I - beta k k^T),
//     which does not grow it, so the error stays a few u * sqrt(dk) ~ 1e-6 of the state;
//   outputs: rel 1e-5 * sqrt(dk) of their rms. o = S^T q^ turns a state error into
//     |dS|_F |q^| while |o| ~ |S|_F |q^| / sqrt(dk) for a q^ unrelated to S, and the gated
//     RMSNorm divides by |o|; so the relative error of o is at most sqrt(dk) times the state's.
// gdn_prefill: bit for bit gdn_decode token by token (PrefillIsDecodeTokenByToken), and so is
// gdn_decode_tokens, plain and deferring, its kept tokens folded in (TokensAreDecodeCalls).
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

// The conv ring (GdnState::conv) holding `hist` ([conv_dim, kc - 1], oldest first) as the
// history at position pos; every other slot NaN, so that a read of the wrong slot shows.
std::vector<float> ring_at(const GdnShape& s, const std::vector<float>& hist, int pos) {
  const size_t conv_dim = static_cast<size_t>(s.conv_dim());
  const int n_hist = s.kc - 1, ring = gdn_conv_ring(s);
  std::vector<float> v(gdn_conv_state_floats(s) + 1, std::nanf(""));
  for (size_t ch = 0; ch < conv_dim; ++ch) {
    for (int t = 0; t < n_hist; ++t) {
      const int q = pos - n_hist + t, slot = ((q % static_cast<int>(ring)) + ring) % ring;
      v[slot * conv_dim + ch] = hist[ch * n_hist + t];
    }
  }
  return v;
}

// The history ([conv_dim, kc - 1], oldest first) that the step at position pos reads from a
// ring.
std::vector<float> history_at(const GdnShape& s, const std::vector<float>& ring_floats, int pos) {
  const size_t conv_dim = static_cast<size_t>(s.conv_dim());
  const int n_hist = s.kc - 1, ring = gdn_conv_ring(s);
  std::vector<float> h(conv_dim * n_hist);
  for (size_t ch = 0; ch < conv_dim; ++ch) {
    for (int t = 0; t < n_hist; ++t) {
      const int q = pos - n_hist + t, slot = ((q % static_cast<int>(ring)) + ring) % ring;
      h[ch * n_hist + t] = ring_floats[slot * conv_dim + ch];
    }
  }
  return h;
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
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
  // From position 4, so that the ring (6 slots at kc 4) wraps within the steps.
  const int pos0 = 4;
  ASSERT_EQ(gdn_conv_ring(s), s.kc - 1 + kGdnMaxTokens);
  ASSERT_EQ(gdn_conv_state_floats(s), conv_dim * static_cast<size_t>(gdn_conv_ring(s)));
  auto d_conv = upload(ring_at(s, h.conv, pos0));
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
    const int pos = pos0 + t;
    QF_CUDA_CHECK(cudaMemcpy(d_pos.data(), &pos, sizeof(int), cudaMemcpyHostToDevice));
    ASSERT_EQ(gdn_decode(s, dp, d_qkv.data(), d_z.data(), d_b.data(), d_a.data(), d_pos.data(),
                         GdnState{d_conv.data(), d_ssm.data()}, d_out.data(), nullptr),
              cudaSuccess);
    gdn_decode_ref(s, hp, qkv.data(), z.data(), b.data(), a.data(),
                   GdnState{h.conv.data(), h.ssm.data()}, out.data());
    QF_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bits(history_at(s, download(d_conv), pos + 1), h.conv)) << "conv state";
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
    auto d_conv = upload(ring_at(s, h.conv, 0));
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
  const std::vector<float> conv = ring_at(s, h.conv, pos0);
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
  EXPECT_TRUE(same_bits(download(d_out_a), download(d_out_b))) << "outputs";
  EXPECT_TRUE(same_bits(download(d_ssm_a), download(d_ssm_b))) << "recurrent state";
  EXPECT_TRUE(same_bits(history_at(s, download(d_conv_a), pos0 + n),
                        history_at(s, download(d_conv_b), pos0 + n)))
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

// gdn_decode_tokens against gdn_decode calls from the same state, bit for bit, as speculative
// decoding runs it. A plain launch of n tokens: the outputs, the state after the last, the conv
// history at every position the pass reaches (a rollback to any of them reads it from the ring).
// A deferring launch of n tokens (GdnReplay): the same outputs and the state left as it was; then
// `kept` of its tokens folded in three ways, each the state `kept` calls leave: by gdn_fold; by
// a second deferring launch of m tokens after them (its outputs the calls', the state it writes
// back the calls' after `kept`, its own tokens folded by gdn_fold after it, reading the other
// buffer); and by a plain launch of one token with the replay.
struct Layer {
  GdnShape s;
  std::vector<float> rows;  // token t's qkv | z | b | a at t * ld
  size_t conv_dim, vd, ld, ld_out;
  DeviceBuffer<float> conv_w, dt, alog, norm, d_rows;
  GdnParams p() const { return {conv_w.data(), dt.data(), alog.data(), norm.data()}; }
  const float* row(int t) const { return d_rows.data() + t * ld; }
};

// gdn_decode calls for tokens [t0, t1) (rows t0.. of the layer) at positions pos0 + t on (conv,
// ssm), outputs at t * ld_out of out.
void decode_calls(const Layer& L, int t0, int t1, int pos0, float* conv, float* ssm, float* out) {
  for (int t = t0; t < t1; ++t) {
    const int pos = pos0 + t;
    auto d_pos = upload(std::vector<int>{pos});
    const float* r = L.row(t);
    ASSERT_EQ(gdn_decode(L.s, L.p(), r, r + L.conv_dim, r + L.conv_dim + L.vd,
                         r + L.conv_dim + L.vd + L.s.n_v_heads, d_pos.data(), GdnState{conv, ssm},
                         out + t * L.ld_out, nullptr),
              cudaSuccess);
    QF_CUDA_CHECK(cudaDeviceSynchronize());  // its early loads read what the call before wrote
  }
}

void expect_tokens_are_decode(const GdnShape& s, int n, int pos0, int kept, uint64_t seed) {
  SCOPED_TRACE("tokens Nk " + std::to_string(s.n_k_heads) + " Nv " + std::to_string(s.n_v_heads) +
               " dk " + std::to_string(s.dk) + " dv " + std::to_string(s.dv) + " kc " +
               std::to_string(s.kc) + " n " + std::to_string(n) + " from " + std::to_string(pos0) +
               " kept " + std::to_string(kept));
  std::mt19937_64 g(seed);
  const HostGdn h = make_layer(s, g);
  const int m = 2;  // the second verify's tokens: rows n .. n + m - 1
  Layer L{s, {}, static_cast<size_t>(s.conv_dim()), static_cast<size_t>(s.n_v_heads) * s.dv};
  L.ld = L.conv_dim + L.vd + 2 * s.n_v_heads + 1, L.ld_out = L.vd + 3;  // padded rows
  L.rows = randn((n + m) * L.ld, g, 1.0f, 0.1f);
  L.conv_w = upload(h.conv_w), L.dt = upload(h.dt_bias), L.alog = upload(h.a_log);
  L.norm = upload(h.norm_w), L.d_rows = upload(L.rows);
  const std::vector<float> ring = ring_at(s, h.conv, pos0);
  const size_t n_out = (n + m) * L.ld_out;
  std::vector<int> pos(n + m);
  for (int t = 0; t < n + m; ++t) pos[t] = pos0 + t;
  auto d_pos = upload(pos);
  const auto launch = [&](int t0, int count, float* conv, float* ssm, GdnReplay replay,
                          float* out) {
    const float* r = L.row(t0);
    return gdn_decode_tokens(s, L.p(), r, r + L.conv_dim, r + L.conv_dim + L.vd,
                             r + L.conv_dim + L.vd + s.n_v_heads, L.ld, count, d_pos.data() + t0,
                             GdnState{conv, ssm}, replay, out + t0 * L.ld_out, L.ld_out, nullptr);
  };
  const auto set_word = [](DeviceBuffer<int>& w, int count, int parity) {
    upload_to(std::vector<int>{count, parity}, w);
  };
  // The calls' reference: every row's output, the state after `kept` and after kept + 1, and
  // after the second verify's tokens (rows kept .. kept + m - 1 then, at their positions).
  auto b_conv = upload(ring), b_ssm = upload(h.ssm);
  DeviceBuffer<float> b_out(n_out), b_out2(n_out);
  ASSERT_NO_FATAL_FAILURE(decode_calls(L, 0, n, pos0, b_conv.data(), b_ssm.data(), b_out.data()));
  const std::vector<float> b_conv_n = download(b_conv), b_ssm_n = download(b_ssm);
  auto c_conv = upload(ring), c_ssm = upload(h.ssm);
  ASSERT_NO_FATAL_FAILURE(
      decode_calls(L, 0, kept, pos0, c_conv.data(), c_ssm.data(), b_out2.data()));
  const std::vector<float> ssm_kept = download(c_ssm);

  {  // A plain launch: the calls' bits.
    auto a_conv = upload(ring), a_ssm = upload(h.ssm);
    DeviceBuffer<float> a_out(n_out);
    QF_CUDA_CHECK(cudaMemset(a_out.data(), 0, a_out.bytes()));
    ASSERT_EQ(launch(0, n, a_conv.data(), a_ssm.data(), {}, a_out.data()), cudaSuccess);
    QF_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bits(download(a_out, n * L.ld_out), download(b_out, n * L.ld_out)))
        << "plain: outputs";
    EXPECT_TRUE(same_bits(download(a_ssm), b_ssm_n)) << "plain: state";
    const std::vector<float> a_ring = download(a_conv);
    for (int t = 1; t <= n; ++t) {
      EXPECT_TRUE(same_bits(history_at(s, a_ring, pos0 + t), history_at(s, b_conv_n, pos0 + t)))
          << "plain: conv history at " << pos0 + t;
    }
  }
  // A deferring launch, its entries into buffer 1 (parity 0).
  DeviceBuffer<float> buf(2 * kGdnMaxTokens * gdn_replay_entry_floats(s));
  DeviceBuffer<int> word(2);
  set_word(word, 0, 0);
  auto a_conv = upload(ring), a_ssm = upload(h.ssm);
  DeviceBuffer<float> a_out(n_out);
  QF_CUDA_CHECK(cudaMemset(a_out.data(), 0, a_out.bytes()));
  ASSERT_EQ(
      launch(0, n, a_conv.data(), a_ssm.data(), {buf.data(), word.data(), true}, a_out.data()),
      cudaSuccess);
  QF_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(same_bits(download(a_out, n * L.ld_out), download(b_out, n * L.ld_out)))
      << "deferred: outputs";
  EXPECT_TRUE(same_bits(download(a_ssm), h.ssm)) << "deferred: the state was written";
  const std::vector<float> a_ring = download(a_conv), a_state = download(a_ssm);

  {  // gdn_fold of the kept tokens.
    set_word(word, kept, 1);
    ASSERT_EQ(gdn_fold(s, {buf.data(), word.data(), false}, a_ssm.data(), nullptr), cudaSuccess);
    QF_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bits(download(a_ssm), ssm_kept)) << "gdn_fold: state after the kept tokens";
  }
  {  // A second deferring verify of rows kept .. kept + m - 1 folds them first.
    auto conv2 = upload(a_ring), ssm2 = upload(a_state);
    DeviceBuffer<float> out2(n_out);
    QF_CUDA_CHECK(cudaMemset(out2.data(), 0, out2.bytes()));
    set_word(word, kept, 1);  // reads buffer 1, writes buffer 0
    ASSERT_EQ(
        launch(kept, m, conv2.data(), ssm2.data(), {buf.data(), word.data(), true}, out2.data()),
        cudaSuccess);
    QF_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bits(download(ssm2), ssm_kept)) << "second verify: the folded state";
    auto ref_conv = upload(download(c_conv)), ref_ssm = upload(ssm_kept);
    DeviceBuffer<float> ref_out(n_out);
    ASSERT_NO_FATAL_FAILURE(
        decode_calls(L, kept, kept + m, pos0, ref_conv.data(), ref_ssm.data(), ref_out.data()));
    EXPECT_TRUE(same_bits(download(out2, m * L.ld_out, kept * L.ld_out),
                          download(ref_out, m * L.ld_out, kept * L.ld_out)))
        << "second verify: outputs";
    set_word(word, m, 0);
    ASSERT_EQ(gdn_fold(s, {buf.data(), word.data(), false}, ssm2.data(), nullptr), cudaSuccess);
    QF_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bits(download(ssm2), download(ref_ssm))) << "second verify: all folded";
  }
  {  // A plain launch of one token with the replay folds the kept ones first.
    auto conv3 = upload(a_ring), ssm3 = upload(a_state);
    DeviceBuffer<float> out3(n_out);
    QF_CUDA_CHECK(cudaMemset(out3.data(), 0, out3.bytes()));
    set_word(word, kept, 1);
    ASSERT_EQ(
        launch(kept, 1, conv3.data(), ssm3.data(), {buf.data(), word.data(), false}, out3.data()),
        cudaSuccess);
    QF_CUDA_CHECK(cudaDeviceSynchronize());
    auto ref_conv = upload(download(c_conv)), ref_ssm = upload(ssm_kept);
    DeviceBuffer<float> ref_out(n_out);
    ASSERT_NO_FATAL_FAILURE(
        decode_calls(L, kept, kept + 1, pos0, ref_conv.data(), ref_ssm.data(), ref_out.data()));
    EXPECT_TRUE(same_bits(download(out3, L.ld_out, kept * L.ld_out),
                          download(ref_out, L.ld_out, kept * L.ld_out)))
        << "one token after the fold: output";
    EXPECT_TRUE(same_bits(download(ssm3), download(ref_ssm))) << "one token after the fold: state";
  }
}

TEST(GdnKernel, TokensAreDecodeCalls) {
  QF_REQUIRE_GPU();
  uint64_t seed = 80;
  // Qwen3.5's shapes (122B: 256 blocks; 35B: 128, the conv staged before the wait on a GPU of
  // 128 SMs or more), then the plan's edges: no history, 8 taps in 128-column tiles, 1024-thread
  // blocks, a partly idle last tile, 12 row groups.
  for (const GdnShape& s :
       {GdnShape{.n_k_heads = 16, .n_v_heads = 64, .dk = 128, .dv = 128, .kc = 4},
        GdnShape{.n_k_heads = 16, .n_v_heads = 32, .dk = 128, .dv = 128, .kc = 4},
        GdnShape{.n_k_heads = 3, .n_v_heads = 6, .dk = 48, .dv = 48, .kc = 4},
        GdnShape{.n_k_heads = 1, .n_v_heads = 2, .dk = 64, .dv = 200, .kc = 1},
        GdnShape{.n_k_heads = 2, .n_v_heads = 2, .dk = 32, .dv = 520, .kc = 8},
        GdnShape{.n_k_heads = 1, .n_v_heads = 1, .dk = 512, .dv = 256, .kc = 4},
        GdnShape{.n_k_heads = 2, .n_v_heads = 4, .dk = 12, .dv = 16, .kc = 3}}) {
    for (int n = 1; n <= kGdnMaxTokens; ++n) {
      expect_tokens_are_decode(s, n, 0, n, ++seed);            // every token kept
      expect_tokens_are_decode(s, n, 7, (n + 1) / 2, ++seed);  // some rejected
    }
  }
  const GdnShape q122{.n_k_heads = 16, .n_v_heads = 64, .dk = 128, .dv = 128, .kc = 4};
  for (const int n : {0, kGdnMaxTokens + 1}) {
    EXPECT_EQ(gdn_decode_tokens(q122, {}, nullptr, nullptr, nullptr, nullptr, 0, n, nullptr,
                                GdnState{}, {}, nullptr, 0, nullptr),
              cudaErrorInvalidValue)
        << n;
  }
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
