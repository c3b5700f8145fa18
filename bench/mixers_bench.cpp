// Token-mixer decode kernels on the GPU: figures, not asserts.
//   GDN decode at the 35B-A3B and 122B-A10B shapes, every layer with its own state (so the
//   states do not sit in L2 between calls, as in a real decode step): time per layer and the
//   recurrent-state bytes read + written per token / time, against device-to-device copy
//   bandwidth (cudaMemcpy, counted as read + write).
//   GDN verify (gdn_decode_tokens: 2 and 3 tokens in one launch, deferred) at the same shapes
//   against a launch a token with the state copied between: time per layer.
//   GDN prefill (gdn_prefill: a pass of 1024 tokens through the conv, the recurrence, the norm
//   and the history's shift) at the same shapes: time per layer and per token.
//   Attention decode (norms, rotary, cache append and split-K attention in one launch, then the
//   combine) at the 122B and 35B shapes, 12 and 10 layers with their own caches, at several
//   contexts: time per layer and KV bytes read / time; f32 caches on the split kernel, bf16 and
//   fp8 ones on it and on the tensor cores (AttnDecodePath).
//   Attention prefill (attn_prefill, one layer at the 122B shape) by each path: the scalar
//   kernel and the tensor-core one in both launch shapes, prompts of 1024 and 4096 tokens and
//   1024 tokens deep into a cache of up to 32768 rows: time per layer and the useful FLOP rate.
// All layers of one measurement are captured into one CUDA graph and replayed (launch gaps as in
// the engine's captured decode step). Usage: qforge-bench-mixers [--quick]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "qf/kern/attention.h"
#include "qf/kern/cuda_check.h"
#include "qf/kern/device_buffer.h"
#include "qf/kern/gdn.h"

namespace {

using qf::kern::DeviceBuffer;

template <class Body>
double time_graph_us(cudaStream_t stream, int reps, Body body) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  QF_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  body();
  QF_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  QF_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) QF_CUDA_CHECK(cudaGraphLaunch(exec, stream));  // warm-up
  cudaEvent_t t0, t1;
  QF_CUDA_CHECK(cudaEventCreate(&t0));
  QF_CUDA_CHECK(cudaEventCreate(&t1));
  QF_CUDA_CHECK(cudaEventRecord(t0, stream));
  for (int i = 0; i < reps; ++i) QF_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  QF_CUDA_CHECK(cudaEventRecord(t1, stream));
  QF_CUDA_CHECK(cudaEventSynchronize(t1));
  float ms = 0;
  QF_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
  QF_CUDA_CHECK(cudaEventDestroy(t0));
  QF_CUDA_CHECK(cudaEventDestroy(t1));
  QF_CUDA_CHECK(cudaGraphExecDestroy(exec));
  QF_CUDA_CHECK(cudaGraphDestroy(graph));
  return 1e3 * ms / reps;
}

// Large buffers: every byte 0x3C, i.e. every float 0x3C3C3C3C (about 0.0115).
DeviceBuffer<float> patterned(size_t n) {
  DeviceBuffer<float> d(n);
  QF_CUDA_CHECK(cudaMemset(d.data(), 0x3C, d.bytes()));
  return d;
}

qf::kern::GdnShape gdn_shape(int nk, int nv) {
  qf::kern::GdnShape s;
  s.n_k_heads = nk;
  s.n_v_heads = nv;
  s.dk = s.dv = 128;
  s.kc = 4;
  return s;
}

DeviceBuffer<float> filled(size_t n, float value) {
  DeviceBuffer<float> d(n);
  std::vector<float> h(n, value);
  QF_CUDA_CHECK(cudaMemcpy(d.data(), h.data(), d.bytes(), cudaMemcpyHostToDevice));
  return d;
}

double copy_bandwidth_gbs(cudaStream_t stream) {
  const size_t bytes = size_t{1} << 29;
  DeviceBuffer<char> a(bytes), b(bytes);
  QF_CUDA_CHECK(cudaMemset(a.data(), 1, bytes));
  const double us = time_graph_us(stream, 10, [&] {
    QF_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, stream));
  });
  return 2.0 * bytes / (us * 1e3);
}

// A GDN layer's parameters and n_layers layers' own conv and recurrent states.
struct GdnLayers {
  DeviceBuffer<float> conv_w, dt, a_log, norm_w;
  std::vector<DeviceBuffer<float>> convs, ssms;
};
GdnLayers gdn_layers(const qf::kern::GdnShape& s, int n_layers) {
  GdnLayers layers{filled(static_cast<size_t>(s.conv_dim()) * s.kc, 0.25f),
                   filled(s.n_v_heads, 0.5f),
                   filled(s.n_v_heads, 0.1f),
                   filled(s.dv, 1.0f),
                   {},
                   {}};
  for (int l = 0; l < n_layers; ++l) {
    layers.convs.push_back(filled(qf::kern::gdn_conv_state_floats(s), 0.0f));
    layers.ssms.push_back(patterned(static_cast<size_t>(s.n_v_heads) * s.dk * s.dv));
  }
  return layers;
}

void bench_gdn(const char* name, qf::kern::GdnShape s, int n_layers, double copy_gbs,
               cudaStream_t stream) {
  const size_t conv_dim = static_cast<size_t>(s.conv_dim());
  const size_t vd = static_cast<size_t>(s.n_v_heads) * s.dv;
  const size_t state = static_cast<size_t>(s.n_v_heads) * s.dk * s.dv;
  auto qkv = filled(conv_dim, 0.3f), z = filled(vd, 0.2f), b = filled(s.n_v_heads, 0.1f),
       a = filled(s.n_v_heads, -0.2f);
  DeviceBuffer<float> out(vd);
  DeviceBuffer<int> pos(1);
  QF_CUDA_CHECK(cudaMemset(pos.data(), 0, sizeof(int)));
  GdnLayers layers = gdn_layers(s, n_layers);
  const qf::kern::GdnParams p{layers.conv_w.data(), layers.dt.data(), layers.a_log.data(),
                              layers.norm_w.data()};
  const double us =
      time_graph_us(stream, 20,
                    [&] {
                      for (int l = 0; l < n_layers; ++l) {
                        QF_CUDA_CHECK(qf::kern::gdn_decode(
                            s, p, qkv.data(), z.data(), b.data(), a.data(), pos.data(),
                            {layers.convs[l].data(), layers.ssms[l].data()}, out.data(), stream));
                      }
                    }) /
      n_layers;
  const double bytes = 2.0 * state * sizeof(float);
  std::printf(
      "gdn %-5s Nk %2d Nv %2d dk %3d dv %3d: %6.2f us/layer, state %4.1f MiB r+w, "
      "%6.0f GB/s (%3.0f%% of copy)\n",
      name, s.n_k_heads, s.n_v_heads, s.dk, s.dv, us, bytes / (1 << 20), bytes / (us * 1e3),
      100.0 * bytes / (us * 1e3) / copy_gbs);
}

// gdn_prefill over n tokens at once (the batched prefill's pass): time per layer and per token,
// n_layers layers with their own states in one graph.
void bench_gdn_prefill(const char* name, qf::kern::GdnShape s, int n, int n_layers,
                       cudaStream_t stream) {
  const size_t conv_dim = static_cast<size_t>(s.conv_dim());
  const size_t vd = static_cast<size_t>(s.n_v_heads) * s.dv;
  const size_t ld = conv_dim + vd + 2 * static_cast<size_t>(s.n_v_heads);  // in_proj's rows
  auto rows = filled(static_cast<size_t>(n) * ld, 0.3f);
  DeviceBuffer<float> out(static_cast<size_t>(n) * vd);
  DeviceBuffer<float> scratch(qf::kern::gdn_prefill_scratch_floats(s, n));
  DeviceBuffer<int> pos(1);
  QF_CUDA_CHECK(cudaMemset(pos.data(), 0, sizeof(int)));
  GdnLayers layers = gdn_layers(s, n_layers);
  const qf::kern::GdnParams p{layers.conv_w.data(), layers.dt.data(), layers.a_log.data(),
                              layers.norm_w.data()};
  const float* z = rows.data() + conv_dim;
  const double us =
      time_graph_us(stream, 5,
                    [&] {
                      for (int l = 0; l < n_layers; ++l) {
                        QF_CUDA_CHECK(qf::kern::gdn_prefill(
                            s, p, rows.data(), z, z + vd, z + vd + s.n_v_heads, ld, n, pos.data(),
                            {layers.convs[l].data(), layers.ssms[l].data()}, out.data(), vd,
                            scratch.data(), stream));
                      }
                    }) /
      n_layers;
  std::printf("gdn prefill %-5s Nk %2d Nv %2d, %d tokens: %8.1f us/layer, %6.3f us/token\n", name,
              s.n_k_heads, s.n_v_heads, n, us, us / n);
}

// A verify's n tokens through every layer's GDN (speculative decoding): gdn_decode_tokens as the
// engine runs it (the last verify's n tokens folded in, the state written back before this
// one's tokens, their updates deferred), against a gdn_decode launch per token with the state
// copied out before each token after the first (how the engine ran them before 16aa901).
void bench_gdn_tokens(const char* name, qf::kern::GdnShape s, int n_layers, int n,
                      cudaStream_t stream) {
  const size_t conv_dim = static_cast<size_t>(s.conv_dim());
  const size_t vd = static_cast<size_t>(s.n_v_heads) * s.dv;
  const size_t ld = conv_dim + vd + 2 * static_cast<size_t>(s.n_v_heads);  // in_proj's rows
  const size_t state = static_cast<size_t>(s.n_v_heads) * s.dk * s.dv;
  auto rows = filled(static_cast<size_t>(n) * ld, 0.3f);
  DeviceBuffer<float> out(static_cast<size_t>(n) * vd);
  std::vector<int> host_pos(static_cast<size_t>(n));
  for (int t = 0; t < n; ++t) host_pos[static_cast<size_t>(t)] = 100 + t;
  DeviceBuffer<int> pos(static_cast<size_t>(n));
  QF_CUDA_CHECK(cudaMemcpy(pos.data(), host_pos.data(), pos.bytes(), cudaMemcpyHostToDevice));
  GdnLayers layers = gdn_layers(s, n_layers);
  std::vector<DeviceBuffer<float>> saved, replays;
  for (int i = 0; i < n_layers * (n - 1); ++i) saved.push_back(filled(state, 0.0f));
  const size_t entries = 2 * qf::kern::kGdnMaxTokens * qf::kern::gdn_replay_entry_floats(s);
  for (int l = 0; l < n_layers; ++l) replays.push_back(filled(entries, 0.5f));
  const int word_host[2] = {n, 0};  // fold the last verify's n tokens, all kept (the most work)
  DeviceBuffer<int> word(2);
  QF_CUDA_CHECK(cudaMemcpy(word.data(), word_host, sizeof(word_host), cudaMemcpyHostToDevice));
  const qf::kern::GdnParams p{layers.conv_w.data(), layers.dt.data(), layers.a_log.data(),
                              layers.norm_w.data()};
  const float* z = rows.data() + conv_dim;
  const auto saved_of = [&](int l, int t) -> float* {
    return saved[static_cast<size_t>(l * (n - 1) + t)].data();
  };
  const double one =
      time_graph_us(stream, 20,
                    [&] {
                      for (int l = 0; l < n_layers; ++l) {
                        const qf::kern::GdnReplay deferred{replays[l].data(), word.data(), true};
                        QF_CUDA_CHECK(qf::kern::gdn_decode_tokens(
                            s, p, rows.data(), z, z + vd, z + vd + s.n_v_heads, ld, n, pos.data(),
                            {layers.convs[l].data(), layers.ssms[l].data()}, deferred, out.data(),
                            vd, stream));
                      }
                    }) /
      n_layers;
  const double each =
      time_graph_us(
          stream, 20,
          [&] {
            for (int l = 0; l < n_layers; ++l) {
              for (int t = 0; t < n; ++t) {
                if (t > 0) {
                  QF_CUDA_CHECK(cudaMemcpyAsync(saved_of(l, t - 1), layers.ssms[l].data(),
                                                state * sizeof(float), cudaMemcpyDeviceToDevice,
                                                stream));
                }
                const float* r = rows.data() + t * ld;
                QF_CUDA_CHECK(qf::kern::gdn_decode(s, p, r, r + conv_dim, r + conv_dim + vd,
                                                   r + conv_dim + vd + s.n_v_heads, pos.data() + t,
                                                   {layers.convs[l].data(), layers.ssms[l].data()},
                                                   out.data() + t * vd, stream));
              }
            }
          }) /
      n_layers;
  std::printf(
      "gdn %-5s Nk %2d Nv %2d, %d tokens: %6.2f us/layer in one launch (deferred, folding the "
      "last verify's %d), %6.2f as a launch a token with the state copied between\n",
      name, s.n_k_heads, s.n_v_heads, n, one, n, each);
}

void bench_attention(const char* name, qf::kern::AttnShape s, int n_layers, int context,
                     qf::kern::AttnDecodePath path, double copy_gbs, cudaStream_t stream) {
  s.max_len = context;
  const size_t hd = static_cast<size_t>(s.head_dim), nq = static_cast<size_t>(s.n_q_heads);
  const size_t kv_row = static_cast<size_t>(s.n_kv_heads) * hd;
  auto q_proj = filled(nq * 2 * hd, 0.5f), k_proj = filled(kv_row, 0.3f),
       v_proj = filled(kv_row, 0.7f), qn = filled(hd, 0.0f), kn = filled(hd, 0.0f);
  DeviceBuffer<float> out(nq * hd), scratch(qf::kern::attn_scratch_floats(s)),
      rope(qf::kern::attn_rope_floats(s));
  QF_CUDA_CHECK(qf::kern::attn_rope_table(s, rope.data(), stream));
  DeviceBuffer<int> pos(1);
  // The last row: each replay rewrites it with the same values and reads the rows before it.
  const int last = context - 1;
  QF_CUDA_CHECK(cudaMemcpy(pos.data(), &last, sizeof(int), cudaMemcpyHostToDevice));
  std::vector<DeviceBuffer<float>> kc, vc;
  // 0x3C bytes: ~0.0115 as f32 and as bf16, 1.5 as e4m3
  const size_t entry = qf::kern::attn_kv_bytes(s);
  const size_t cache_floats = (static_cast<size_t>(context) * kv_row * entry + 3) / 4;
  for (int l = 0; l < n_layers; ++l) {
    kc.push_back(patterned(cache_floats));
    vc.push_back(patterned(cache_floats));
  }
  const double us = time_graph_us(stream, 20,
                                  [&] {
                                    for (int l = 0; l < n_layers; ++l) {
                                      QF_CUDA_CHECK(qf::kern::attn_decode(
                                          s, q_proj.data(), k_proj.data(), v_proj.data(), qn.data(),
                                          kn.data(), rope.data(), pos.data(), nullptr, kc[l].data(),
                                          vc[l].data(), out.data(), scratch.data(), stream, path));
                                    }
                                  }) /
                    n_layers;
  const double bytes = 2.0 * context * kv_row * entry;
  std::printf(
      "attention %-5s Nq %2d Nkv %d hd %d ctx %6d %s %-5s: %7.2f us/layer, KV %6.1f MiB, %6.0f "
      "GB/s (%3.0f%% of copy)\n",
      name, s.n_q_heads, s.n_kv_heads, s.head_dim, context,
      entry == 1   ? "fp8 "
      : entry == 2 ? "bf16"
                   : "f32 ",
      path == qf::kern::AttnDecodePath::kMma ? "mma" : "split", us, bytes / (1 << 20),
      bytes / (us * 1e3), 100.0 * bytes / (us * 1e3) / copy_gbs);
}

// attn_prefill over n tokens at positions p0 .. p0 + n - 1 (the cache's first p0 rows already
// there), one layer, by each path the device takes: time per layer and the useful multiply-adds'
// rate (q.k and p.v over every token's rows 0 .. pos, 2 FLOP each).
void bench_attention_prefill(const char* name, qf::kern::AttnShape s, int p0, int n,
                             cudaStream_t stream) {
  using qf::kern::AttnPrefillPath;
  s.max_len = p0 + n;
  const size_t hd = static_cast<size_t>(s.head_dim), nq = static_cast<size_t>(s.n_q_heads);
  const size_t kv_row = static_cast<size_t>(s.n_kv_heads) * hd, ld = nq * 2 * hd + 2 * kv_row;
  auto rows = filled(n * ld, 0.5f), qn = filled(hd, 0.0f), kn = filled(hd, 0.0f);
  auto kc = patterned(static_cast<size_t>(s.max_len) * kv_row),
       vc = patterned(static_cast<size_t>(s.max_len) * kv_row);
  DeviceBuffer<float> out(n * nq * hd), scratch(qf::kern::attn_prefill_scratch_floats(s, n)),
      rope(qf::kern::attn_rope_floats(s));
  QF_CUDA_CHECK(qf::kern::attn_rope_table(s, rope.data(), stream));
  std::vector<int> pos(n);
  for (int t = 0; t < n; ++t) pos[t] = p0 + t;
  DeviceBuffer<int> d_pos(n);
  QF_CUDA_CHECK(cudaMemcpy(d_pos.data(), pos.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  const double flop = 4.0 * nq * hd * (static_cast<double>(n) * p0 + 0.5 * n * (n + 1.0));
  std::printf("attention prefill %-5s Nq %2d Nkv %d, %5d tokens from %6d:", name, s.n_q_heads,
              s.n_kv_heads, n, p0);
  const std::pair<AttnPrefillPath, const char*> paths[] = {{AttnPrefillPath::kScalar, "scalar"},
                                                           {AttnPrefillPath::kMma, "mma"},
                                                           {AttnPrefillPath::kMmaNarrow, "narrow"}};
  for (const auto& [path, label] : paths) {
    const float* r = rows.data();
    if (qf::kern::attn_prefill(s, r, r + nq * 2 * hd, r + nq * 2 * hd + kv_row, ld, n, qn.data(),
                               kn.data(), rope.data(), d_pos.data(), kc.data(), vc.data(),
                               out.data(), nq * hd, scratch.data(), stream,
                               path) == cudaErrorInvalidValue) {
      continue;  // not on this device
    }
    const int reps = path == AttnPrefillPath::kScalar && flop > 1e12 ? 1 : 5;
    const double us = time_graph_us(stream, reps, [&] {
      QF_CUDA_CHECK(qf::kern::attn_prefill(
          s, r, r + nq * 2 * hd, r + nq * 2 * hd + kv_row, ld, n, qn.data(), kn.data(), rope.data(),
          d_pos.data(), kc.data(), vc.data(), out.data(), nq * hd, scratch.data(), stream, path));
    });
    std::printf("  %s %9.1f us (%5.1f TFLOP/s)", label, us, flop / (us * 1e6));
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::fprintf(stderr, "qforge-bench-mixers: no CUDA device\n");
    return 4;
  }
  cudaDeviceProp prop;
  QF_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  QF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy_gbs = copy_bandwidth_gbs(stream);
  std::printf("device %s, %d SMs; device copy %.0f GB/s (read + write)\n", prop.name,
              prop.multiProcessorCount, copy_gbs);

  bench_gdn("35B", gdn_shape(16, 32), 30, copy_gbs, stream);
  bench_gdn("122B", gdn_shape(16, 64), 36, copy_gbs, stream);
  for (int n = 2; n <= qf::kern::kGdnMaxTokens; ++n) {
    bench_gdn_tokens("35B", gdn_shape(16, 32), 30, n, stream);
    bench_gdn_tokens("122B", gdn_shape(16, 64), 36, n, stream);
  }
  bench_gdn_prefill("35B", gdn_shape(16, 32), 1024, 4, stream);
  bench_gdn_prefill("122B", gdn_shape(16, 64), 1024, 4, stream);
  qf::kern::AttnShape a122;
  a122.n_q_heads = 32;
  a122.n_kv_heads = 2;
  a122.head_dim = 256;
  a122.rot_dim = 64;
  qf::kern::AttnShape a35 = a122;  // 35B-A3B: 16 query heads, 10 attention layers
  a35.n_q_heads = 16;
  for (int ctx : {1, 1024, 4096, 32768, 131072}) {
    if (quick && ctx > 4096) break;
    // f32 on the split kernel; bf16 and fp8 on it and on the tensor cores.
    using Path = qf::kern::AttnDecodePath;
    using qf::kern::KvType;
    for (const auto& [kv, path] :
         {std::pair{KvType::kF32, Path::kSplit}, std::pair{KvType::kBf16, Path::kSplit},
          std::pair{KvType::kBf16, Path::kMma}, std::pair{KvType::kFp8, Path::kSplit},
          std::pair{KvType::kFp8, Path::kMma}}) {
      a122.kv = a35.kv = kv;
      bench_attention("122B", a122, 12, ctx, path, copy_gbs, stream);
      bench_attention("35B", a35, 10, ctx, path, copy_gbs, stream);
    }
  }
  a122.kv = qf::kern::KvType::kF32;
  for (const auto& [p0, n] :
       {std::pair{0, 1024}, {0, 4096}, {3072, 1024}, {15360, 1024}, {31744, 1024}}) {
    if (quick && p0 + n > 4096) break;
    bench_attention_prefill("122B", a122, p0, n, stream);
  }
  QF_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
