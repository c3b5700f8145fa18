// GEMV throughput at Qwen3.5-122B-A10B decode shapes, next to a device-to-device cudaMemcpy
// measured in the same run (prints figures; asserts nothing).
//
//   int4 moe gate+up  8 of 256 experts [2048 x 3072] (gate and up rows stacked), one launch
//   int4 moe gate     8 of 256 experts [1024 x 3072] (the gate half alone)
//   int4 moe down     8 of 256 experts [3072 x 1024], each slot its own input
//                     (down as the engine launches it: its ids read before its PDL wait)
//   int4 q_proj       [16384 x 3072], 8 copies in rotation
//   int4 gdn in_proj  [20608 x 3072] (qkv | z | b | a), 8 copies in rotation
//   int4 out_proj     [3072 x 8192] (DeltaNet out / attention o), 8 copies in rotation; and
//                     the same in two and four K parts (GemvBatch::k_splits; the engine's
//                     launch: four)
//   int8 lm head      [248320 x 3072], one scale per row; then kern::lm_head on the same weights
//                     with its fused argmax, 1 and 4 rows of x (and top-8 of 4 rows): weight
//                     bytes counted once per launch, whatever the rows (logits written)
//   fp8 shared up     [1024 x 3072], 128 x 128 blocks, 64 copies in rotation
//   bf16 router       [256 x 3072], 64 copies in rotation
//
// Every launch reads other matrices than the last ones (ids rotate over 64 random expert sets;
// copies rotate through ids too), so L2 (50-60 MB) does not serve the weights. GB/s counts
// weight_bytes() per product (codes + scales + zeros) over the time of one launch, measured with
// CUDA events over back-to-back launches on a stream and over replays of a captured graph of the
// same launches. Copy GB/s counts bytes read plus bytes written (1 GiB copied). The last two
// columns are the read ceiling (read_ceiling.cu): a kernel that only streams the same number of
// bytes, launched the same way at rotating offsets of the LM head's weights, the best of 1, 2 or
// 4 blocks per SM with 4 or 8 loads in flight per thread (graph replay); "early" issues every
// load before its PDL wait, "waits" none (the bound for a launch whose addresses its predecessor
// writes: the routed gate | up, which reads its expert ids; the others issue part of their
// weight loads early).
//
// --gemm: prefill's products instead (gemm.h), T tokens in one gemm against T gemv launches on
// the same weights, T = 1 .. 512: the DeltaNet in_proj [20608 x 3072]; the routed gate | up with
// SwiGLU (256 experts [2048 x 3072], 8 distinct random experts per token, the entries grouped by
// expert) and down [3072 x 1024]; the FP8 shared expert's gate | up [2048 x 3072] (gemv: one launch
// of T slots on the matrix, as the prefill ran it before gemm took FP8); the BF16 MTP head's routed
// experts (grouped, gate | up [2048 x 3072] and down [3072 x 1024]) and fc [3072 x 6144] (gemv:
// one launch of T x 8 or T slots, as before gemm took BF16). Microseconds per token
// each way (median of 5 timings of back- to-back launches on a stream, gemm's limb staging
// included) and gemm's GB/s over the weights its entries touch (each expert counted once).
//
// --moe-sizes: the routed MoE products alone, 8 to 128 slots in one launch, and the line through
// their times (moe_size_rows).
//
// Usage: qforge-bench-gemv [--iters N] [--gemm [T] | --moe-sizes]   (launches per timing, default
// 200; 5 timings, median; --gemm T: that token count only)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "qf/kern/cuda_check.h"
#include "qf/kern/device_buffer.h"
#include "qf/kern/gemm.h"
#include "qf/kern/gemv.h"
#include "qf/kern/lm_head.h"
#include "qf/quant/formats.h"
#include "read_ceiling.h"

namespace {

using qf::kern::DeviceBuffer;
using qf::kern::DeviceLinear;
using qf::kern::GemvBatch;
using qf::kern::WeightKind;

constexpr int kSets = 64;  // rotating id sets / copies

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

// `sets` routings of `k` distinct expert ids out of `experts` each, one after the other.
std::vector<int> expert_sets(uint64_t seed, int sets, int k, int experts) {
  Rng rng{seed};
  std::vector<int> ids;
  for (int s = 0; s < sets; ++s) {
    std::vector<int> set;
    while (static_cast<int>(set.size()) < k) {
      const int e = static_cast<int>(rng.next() % static_cast<uint64_t>(experts));
      if (std::find(set.begin(), set.end(), e) == set.end()) set.push_back(e);
    }
    ids.insert(ids.end(), set.begin(), set.end());
  }
  return ids;
}

// Fills a device buffer with random bytes (a 64 MiB host pattern, repeated).
void fill_random(void* d, size_t bytes, uint64_t seed) {
  static std::vector<uint64_t> pattern;
  if (pattern.empty()) {
    Rng rng{seed};
    pattern.resize(size_t{8} << 20);
    for (uint64_t& v : pattern) v = rng.next();
  }
  const size_t chunk = pattern.size() * 8;
  for (size_t off = 0; off < bytes; off += chunk) {
    QF_CUDA_CHECK(cudaMemcpy(static_cast<char*>(d) + off, pattern.data(),
                             std::min(chunk, bytes - off), cudaMemcpyHostToDevice));
  }
}

template <class T>
void fill_value(DeviceBuffer<T>& d, T v) {
  std::vector<T> h(d.size(), v);
  QF_CUDA_CHECK(cudaMemcpy(d.data(), h.data(), d.bytes(), cudaMemcpyHostToDevice));
}

DeviceBuffer<uint16_t> random_scales(size_t n, uint64_t seed) {
  Rng rng{seed};
  std::vector<uint16_t> h(n);
  for (uint16_t& s : h) {
    const float f = (1e-3f + static_cast<float>(rng.next() >> 40) * 0x1p-24f * 1e-2f);
    s = qf::quant::f32_to_f16(rng.next() & 1 ? f : -f);
  }
  DeviceBuffer<uint16_t> d(n);
  QF_CUDA_CHECK(cudaMemcpy(d.data(), h.data(), d.bytes(), cudaMemcpyHostToDevice));
  return d;
}

// A stack of n_experts matrices of one kind with random codes and plausible scales.
struct Stack {
  DeviceLinear lin;
  DeviceBuffer<uint8_t> w, zeros;
  DeviceBuffer<uint16_t> scales;
  DeviceBuffer<float> block_scale;
};

Stack make_stack(WeightKind kind, int n, int k, int n_experts, int group, uint64_t seed) {
  Stack s;
  DeviceLinear& l = s.lin;
  l.kind = kind;
  l.n = n;
  l.k = k;
  l.group = group;
  l.block = 128;
  const size_t nk = static_cast<size_t>(n) * k, ne = static_cast<size_t>(n_experts);
  size_t w_bytes = 0;
  switch (kind) {
    case WeightKind::kBf16:
      w_bytes = nk * 2;
      l.w_stride = nk;
      break;
    case WeightKind::kF32:
      w_bytes = nk * 4;
      l.w_stride = nk;
      break;
    case WeightKind::kInt4:
      w_bytes = nk / 2;
      l.w_stride = nk / 8;
      break;
    case WeightKind::kInt8:
      w_bytes = nk;
      l.w_stride = nk / 4;
      break;
    case WeightKind::kFp8:
      w_bytes = nk;
      l.w_stride = nk;
      break;
  }
  s.w = DeviceBuffer<uint8_t>(w_bytes * ne);
  fill_random(s.w.data(), s.w.bytes(), seed);
  l.w = s.w.data();
  if (kind == WeightKind::kBf16) {  // random bits would hold NaNs: small normal values instead
    std::vector<uint16_t> h(nk);
    Rng rng{seed};
    for (uint16_t& v : h) v = static_cast<uint16_t>(0x3C00 | (rng.next() & 0x83FF));
    for (size_t e = 0; e < ne; ++e) {
      QF_CUDA_CHECK(
          cudaMemcpy(s.w.data() + e * w_bytes, h.data(), w_bytes, cudaMemcpyHostToDevice));
    }
  }
  if (kind == WeightKind::kInt4 || kind == WeightKind::kInt8) {
    const size_t per = static_cast<size_t>(n) * ((k + group - 1) / group);
    s.scales = random_scales(per * ne, seed + 1);
    s.zeros = DeviceBuffer<uint8_t>(per * ne);
    fill_value<uint8_t>(s.zeros, kind == WeightKind::kInt4 ? 8 : 128);
    l.scales = reinterpret_cast<const __half*>(s.scales.data());
    l.zeros = s.zeros.data();
    l.scale_stride = l.zero_stride = per;
  }
  if (kind == WeightKind::kFp8) {
    const size_t per = static_cast<size_t>((n + 127) / 128) * ((k + 127) / 128);
    s.block_scale = DeviceBuffer<float>(per * ne);
    fill_value<float>(s.block_scale, 0.01f);
    l.block_scale = s.block_scale.data();
    l.block_scale_stride = per;
  }
  return s;
}

struct Timing {
  double stream_us, graph_us;
};

// Median time of one launch of `launch(i)` (i = 0 .. iters-1 selects the rotating inputs).
template <class Launch>
Timing time_launches(Launch launch, int iters, cudaStream_t stream) {
  cudaEvent_t t0, t1;
  QF_CUDA_CHECK(cudaEventCreate(&t0));
  QF_CUDA_CHECK(cudaEventCreate(&t1));
  for (int i = 0; i < 20; ++i) QF_CUDA_CHECK(launch(i, stream));
  std::vector<double> stream_us, graph_us;
  for (int rep = 0; rep < 5; ++rep) {
    QF_CUDA_CHECK(cudaEventRecord(t0, stream));
    for (int i = 0; i < iters; ++i) QF_CUDA_CHECK(launch(i, stream));
    QF_CUDA_CHECK(cudaEventRecord(t1, stream));
    QF_CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    QF_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    stream_us.push_back(1e3 * ms / iters);
  }
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  QF_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < iters; ++i) QF_CUDA_CHECK(launch(i, stream));
  QF_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  QF_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  QF_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  for (int rep = 0; rep < 5; ++rep) {
    QF_CUDA_CHECK(cudaEventRecord(t0, stream));
    QF_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    QF_CUDA_CHECK(cudaEventRecord(t1, stream));
    QF_CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    QF_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    graph_us.push_back(1e3 * ms / iters);
  }
  QF_CUDA_CHECK(cudaGraphExecDestroy(exec));
  QF_CUDA_CHECK(cudaGraphDestroy(graph));
  QF_CUDA_CHECK(cudaEventDestroy(t0));
  QF_CUDA_CHECK(cudaEventDestroy(t1));
  std::sort(stream_us.begin(), stream_us.end());
  std::sort(graph_us.begin(), graph_us.end());
  return {stream_us[2], graph_us[2]};
}

double copy_gbps(cudaStream_t stream) {
  const size_t bytes = size_t{1} << 30;
  DeviceBuffer<uint8_t> a(bytes), b(bytes);
  QF_CUDA_CHECK(cudaMemset(a.data(), 1, bytes));
  cudaEvent_t t0, t1;
  QF_CUDA_CHECK(cudaEventCreate(&t0));
  QF_CUDA_CHECK(cudaEventCreate(&t1));
  std::vector<double> gbps;
  for (int rep = 0; rep < 7; ++rep) {
    QF_CUDA_CHECK(cudaEventRecord(t0, stream));
    QF_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, stream));
    QF_CUDA_CHECK(cudaEventRecord(t1, stream));
    QF_CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    QF_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    if (rep > 0) gbps.push_back(2.0 * bytes / (ms * 1e6));
  }
  QF_CUDA_CHECK(cudaEventDestroy(t0));
  QF_CUDA_CHECK(cudaEventDestroy(t1));
  std::sort(gbps.begin(), gbps.end());
  return gbps[gbps.size() / 2];
}

// Median of 5 timings of `reps` calls of run(stream), in microseconds per call.
template <class Run>
double time_calls(Run run, int reps, cudaStream_t stream) {
  cudaEvent_t t0, t1;
  QF_CUDA_CHECK(cudaEventCreate(&t0));
  QF_CUDA_CHECK(cudaEventCreate(&t1));
  for (int i = 0; i < 2; ++i) QF_CUDA_CHECK(run(stream));
  std::vector<double> us;
  for (int rep = 0; rep < 5; ++rep) {
    QF_CUDA_CHECK(cudaEventRecord(t0, stream));
    for (int i = 0; i < reps; ++i) QF_CUDA_CHECK(run(stream));
    QF_CUDA_CHECK(cudaEventRecord(t1, stream));
    QF_CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    QF_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    us.push_back(1e3 * ms / reps);
  }
  QF_CUDA_CHECK(cudaEventDestroy(t0));
  QF_CUDA_CHECK(cudaEventDestroy(t1));
  std::sort(us.begin(), us.end());
  return us[2];
}

// --gemm (file comment).
void gemm_section(cudaStream_t stream, double copy, int only_t) {
  using qf::kern::GemmRows;
  constexpr int kMaxT = 512, kTopK = 8, kExperts = 256;
  Stack gdn_in = make_stack(WeightKind::kInt4, 20608, 3072, 1, 128, 7);
  Stack gate_up = make_stack(WeightKind::kInt4, 2048, 3072, kExperts, 128, 1);
  Stack down = make_stack(WeightKind::kInt4, 3072, 1024, kExperts, 128, 2);
  Stack fp8 = make_stack(WeightKind::kFp8, 2048, 3072, 1, 128, 3);
  constexpr int kVocab = 248320;  // the INT8 LM head (prompt scoring), one scale per row
  Stack head = make_stack(WeightKind::kInt8, kVocab, 3072, 1, 3072, 4);
  // The 122B hybrid's BF16 MTP head: its routed experts and its fc [3072 x 6144].
  Stack bf_gu = make_stack(WeightKind::kBf16, 2048, 3072, kExperts, 128, 5);
  Stack bf_dn = make_stack(WeightKind::kBf16, 3072, 1024, kExperts, 128, 6);
  Stack bf_fc = make_stack(WeightKind::kBf16, 3072, 6144, 1, 128, 8);
  DeviceBuffer<float> x(kMaxT * 3072), h(kMaxT * kTopK * 1024), y(kMaxT * kTopK * 3072);
  DeviceBuffer<float> logits(static_cast<size_t>(kMaxT) * kVocab);
  {
    std::vector<float> v(x.size());
    Rng rng{7};
    for (float& f : v) f = static_cast<float>(rng.next() >> 40) * 0x1p-24f - 0.5f;
    QF_CUDA_CHECK(cudaMemcpy(x.data(), v.data(), x.bytes(), cudaMemcpyHostToDevice));
    v.resize(h.size());
    for (float& f : v) f = static_cast<float>(rng.next() >> 40) * 0x1p-24f - 0.5f;
    QF_CUDA_CHECK(cudaMemcpy(h.data(), v.data(), h.bytes(), cudaMemcpyHostToDevice));
  }
  // Routing: token t's 8 distinct experts (ids [t][8]); the entries sorted by expert.
  const std::vector<int> ids = expert_sets(11, kMaxT, kTopK, kExperts);
  DeviceBuffer<int> d_ids(ids.size()), d_off(kExperts + 1), d_rows(ids.size());
  QF_CUDA_CHECK(cudaMemcpy(d_ids.data(), ids.data(), d_ids.bytes(), cudaMemcpyHostToDevice));
  DeviceBuffer<uint8_t> scratch(size_t{64} << 20);
  std::printf("prefill products: T tokens in one gemm against T gemv launches (us per token)\n");
  std::printf("%-26s %5s | %9s %9s %7s | %8s %6s\n", "product", "T", "gemv", "gemm", "ratio",
              "GB/s", "%copy");
  for (const int T : {1, 4, 16, 64, 128, 256, 512}) {
    if (only_t > 0 && T != only_t) continue;
    std::vector<int> count(kExperts, 0), offsets(kExperts + 1, 0), rows;
    for (int i = 0; i < T * kTopK; ++i) ++count[ids[i]];
    for (int e = 0; e < kExperts; ++e) offsets[e + 1] = offsets[e] + count[e];
    std::vector<int> fill(offsets.begin(), offsets.end() - 1);
    rows.resize(T * kTopK);
    for (int i = 0; i < T * kTopK; ++i) rows[fill[ids[i]]++] = i / kTopK;
    const int touched = static_cast<int>(kExperts - std::count(count.begin(), count.end(), 0));
    QF_CUDA_CHECK(cudaMemcpy(d_off.data(), offsets.data(), d_off.bytes(), cudaMemcpyHostToDevice));
    QF_CUDA_CHECK(cudaMemcpy(d_rows.data(), rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
    const int reps = std::max(2, 256 / T);
    struct Row {
      const char* name;
      double gemv_us, gemm_us;
      size_t bytes;
    };
    std::vector<Row> out;
    {  // the DeltaNet in_proj
      const DeviceLinear& w = gdn_in.lin;
      GemmRows r;
      r.entries = r.x_count = T;
      r.ldx = 3072;
      r.ldy = 20608;
      const double gv = time_calls(
          [&](cudaStream_t s) {
            for (int t = 0; t < T; ++t) {
              const cudaError_t e =
                  qf::kern::gemv(w, x.data() + t * 3072, y.data() + t * 20608, GemvBatch{}, s);
              if (e != cudaSuccess) return e;
            }
            return cudaSuccess;
          },
          reps, stream);
      const double gm = time_calls(
          [&](cudaStream_t s) {
            return qf::kern::gemm(w, x.data(), y.data(), r, false, scratch.data(), s);
          },
          reps, stream);
      out.push_back({"int4 gdn in_proj", gv / T, gm / T, qf::kern::weight_bytes(w)});
    }
    {  // routed gate | up with SwiGLU, then down
      DeviceLinear gu = gate_up.lin, dn = down.lin;
      GemmRows r;
      r.entries = T * kTopK;
      r.x_count = T;
      r.ldx = 3072;
      r.ldy = 1024;
      r.n_mats = kExperts;
      r.offsets = d_off.data();
      r.x_rows = d_rows.data();
      const double gv = time_calls(
          [&](cudaStream_t s) {
            for (int t = 0; t < T; ++t) {
              GemvBatch b;
              b.n_slots = kTopK;
              b.ids = d_ids.data() + t * kTopK;
              b.y_stride = 1024;
              const cudaError_t e =
                  qf::kern::gemv_swiglu(gu, x.data() + t * 3072, h.data() + t * kTopK * 1024, b, s);
              if (e != cudaSuccess) return e;
            }
            return cudaSuccess;
          },
          reps, stream);
      const double gm = time_calls(
          [&](cudaStream_t s) {
            return qf::kern::gemm(gu, x.data(), h.data(), r, true, scratch.data(), s);
          },
          reps, stream);
      out.push_back(
          {"int4 moe gate+up swiglu", gv / T, gm / T, qf::kern::weight_bytes(gu) * touched});
      GemmRows rd = r;
      rd.x_count = T * kTopK;
      rd.x_rows = nullptr;
      rd.ldx = 1024;
      rd.ldy = 3072;
      const double dv = time_calls(
          [&](cudaStream_t s) {
            for (int t = 0; t < T; ++t) {
              GemvBatch b;
              b.n_slots = kTopK;
              b.ids = d_ids.data() + t * kTopK;
              b.x_stride = 1024;
              b.y_stride = 3072;
              const cudaError_t e = qf::kern::gemv(dn, h.data() + t * kTopK * 1024,
                                                   y.data() + t * kTopK * 3072, b, s);
              if (e != cudaSuccess) return e;
            }
            return cudaSuccess;
          },
          reps, stream);
      const double dm = time_calls(
          [&](cudaStream_t s) {
            return qf::kern::gemm(dn, h.data(), y.data(), rd, false, scratch.data(), s);
          },
          reps, stream);
      out.push_back({"int4 moe down", dv / T, dm / T, qf::kern::weight_bytes(dn) * touched});
    }
    {  // the FP8 shared expert's gate | up: T slots of one gemv launch (the engine's way before
       // gemm took FP8) against gemm
      const DeviceLinear& w = fp8.lin;
      GemmRows r;
      r.entries = r.x_count = T;
      r.ldx = 3072;
      r.ldy = 2048;
      DeviceLinear one = w;  // every slot on the one matrix
      one.w_stride = one.block_scale_stride = 0;
      const double gv = time_calls(
          [&](cudaStream_t s) {
            return qf::kern::gemv(one, x.data(), y.data(), GemvBatch{T, nullptr, 3072, 2048}, s);
          },
          reps, stream);
      const double gm = time_calls(
          [&](cudaStream_t s) {
            return qf::kern::gemm(w, x.data(), y.data(), r, false, scratch.data(), s);
          },
          reps, stream);
      out.push_back({"fp8 shared gate|up", gv / T, gm / T, qf::kern::weight_bytes(w)});
    }
    {  // the BF16 MTP experts: gate | up and down, T x 8 gemv slots in one launch each (as
       // the prefill ran them before gemm took BF16) against the grouped gemm
      const DeviceLinear &gu = bf_gu.lin, &dn = bf_dn.lin;
      GemmRows r;
      r.entries = T * kTopK;
      r.x_count = T;
      r.ldx = 3072;
      r.ldy = 2048;
      r.n_mats = kExperts;
      r.offsets = d_off.data();
      r.x_rows = d_rows.data();
      GemvBatch b{T * kTopK, d_ids.data(), 3072, 2048};
      b.slots_per_x = kTopK;
      const double gv =
          time_calls([&](cudaStream_t s) { return qf::kern::gemv(gu, x.data(), y.data(), b, s); },
                     reps, stream);
      const double gm = time_calls(
          [&](cudaStream_t s) {
            return qf::kern::gemm(gu, x.data(), y.data(), r, false, scratch.data(), s);
          },
          reps, stream);
      out.push_back({"bf16 mtp gate|up", gv / T, gm / T, qf::kern::weight_bytes(gu) * touched});
      GemmRows rd = r;
      rd.x_count = T * kTopK;
      rd.x_rows = nullptr;
      rd.ldx = 1024;
      rd.ldy = 3072;
      const GemvBatch bd{T * kTopK, d_ids.data(), 1024, 3072};
      const double dv =
          time_calls([&](cudaStream_t s) { return qf::kern::gemv(dn, h.data(), y.data(), bd, s); },
                     reps, stream);
      const double dm = time_calls(
          [&](cudaStream_t s) {
            return qf::kern::gemm(dn, h.data(), y.data(), rd, false, scratch.data(), s);
          },
          reps, stream);
      out.push_back({"bf16 mtp down", dv / T, dm / T, qf::kern::weight_bytes(dn) * touched});
    }
    {  // the BF16 MTP fc: T slots of one gemv launch against gemm (x: h's rows of 6144)
      const DeviceLinear& w = bf_fc.lin;
      GemmRows r;
      r.entries = r.x_count = T;
      r.ldx = 6144;
      r.ldy = 3072;
      DeviceLinear one = w;  // every slot on the one matrix
      one.w_stride = 0;
      const double gv = time_calls(
          [&](cudaStream_t s) {
            return qf::kern::gemv(one, h.data(), y.data(), GemvBatch{T, nullptr, 6144, 3072}, s);
          },
          reps, stream);
      const double gm = time_calls(
          [&](cudaStream_t s) {
            return qf::kern::gemm(w, h.data(), y.data(), r, false, scratch.data(), s);
          },
          reps, stream);
      out.push_back({"bf16 mtp fc", gv / T, gm / T, qf::kern::weight_bytes(w)});
    }
    {  // the INT8 LM head: a gemv per token (as prefill's rows ran it) against gemm
      const DeviceLinear& w = head.lin;
      GemmRows r;
      r.entries = r.x_count = T;
      r.ldx = 3072;
      r.ldy = kVocab;
      const double gv = time_calls(
          [&](cudaStream_t s) {
            for (int t = 0; t < T; ++t) {
              const cudaError_t e = qf::kern::gemv(
                  w, x.data() + t * 3072, logits.data() + size_t{1} * t * kVocab, GemvBatch{}, s);
              if (e != cudaSuccess) return e;
            }
            return cudaSuccess;
          },
          reps, stream);
      const double gm = time_calls(
          [&](cudaStream_t s) {
            return qf::kern::gemm(w, x.data(), logits.data(), r, false, scratch.data(), s);
          },
          reps, stream);
      out.push_back({"int8 lm head", gv / T, gm / T, qf::kern::weight_bytes(w)});
    }
    for (const Row& o : out) {
      const double gbps = o.bytes / (o.gemm_us * T * 1e3);
      std::printf("%-26s %5d | %9.2f %9.2f %6.1fx | %8.0f %5.0f%%\n", o.name, T, o.gemv_us,
                  o.gemm_us, o.gemv_us / o.gemm_us, gbps, 100.0 * gbps / copy);
    }
  }
}

// The MoE block's two products as the engine can launch them: the routed experts alone
// (gemv_swiglu; down with its ids early), and the same launches with the FP8 shared expert as a
// ninth expert (gemv_moe: its gate | up [2048 x 3072] unpaired with SwiGLU, its down [3072 x
// 1024] with the sigmoid gate folded in), as the "INT4 MoE GEMV" is specified. Bytes are
// every matrix the launch reads (8 routed + the shared one); the shared copies rotate as the ids
// do, so L2 serves none of them.
template <class Ceiling>
void moe_ninth_expert_rows(const DeviceLinear& gate_up, const DeviceLinear& down, const int* ids,
                           const float* x, float* y, int iters, double copy, Ceiling& ceiling,
                           cudaStream_t stream) {
  Stack sh_gu = make_stack(WeightKind::kFp8, 2048, 3072, kSets, 128, 9);
  Stack sh_dn = make_stack(WeightKind::kFp8, 3072, 1024, kSets, 128, 10);
  DeviceBuffer<float> gate(1), sx(1024);
  fill_value<float>(gate, 0.25f);
  fill_value<float>(sx, 0.125f);
  const DeviceLinear none{};
  auto rotated = [](const DeviceLinear& w, int i) {
    DeviceLinear r = w;
    r.w = static_cast<const uint8_t*>(w.w) + (i % kSets) * w.w_stride;
    r.block_scale = w.block_scale + (i % kSets) * w.block_scale_stride;
    return r;
  };
  struct Row {
    const char* name;
    const DeviceLinear& experts;
    const DeviceLinear& shared;
    bool swiglu;
  };
  std::printf("\nthe MoE products with the FP8 shared expert as a ninth expert (gemv_moe)\n");
  for (const Row& r : {Row{"moe gate|up swiglu, 8 routed  ", gate_up, none, true},
                       Row{"  + fp8 shared [2048x3072]    ", gate_up, sh_gu.lin, true},
                       Row{"moe down (ids early), 8 routed", down, none, false},
                       Row{"  + fp8 shared [3072x1024] gate", down, sh_dn.lin, false}}) {
    const size_t bytes =
        qf::kern::weight_bytes(r.experts) * 8 + (r.shared.n ? qf::kern::weight_bytes(r.shared) : 0);
    auto launch = [&](int i, cudaStream_t s) {
      GemvBatch b{8, ids + (i % kSets) * 8, r.swiglu ? 0u : 1024u, r.swiglu ? 1024u : 3072u};
      b.ids_early = !r.swiglu;
      if (r.shared.n == 0) {
        return r.swiglu ? qf::kern::gemv_swiglu(r.experts, x, y, b, s)
                        : qf::kern::gemv(r.experts, x, y, b, s);
      }
      const qf::kern::SharedProduct sh{rotated(r.shared, i), r.swiglu ? x : sx.data(),
                                       y + 8 * b.y_stride, r.swiglu ? nullptr : gate.data()};
      return qf::kern::gemv_moe(r.experts, x, y, b, r.swiglu, sh, s);
    };
    const Timing t = time_launches(launch, iters, stream);
    const double gbps = bytes / (t.stream_us * 1e3), graph_gbps = bytes / (t.graph_us * 1e3);
    std::printf("%-31s %7.1f | %7.2f %8.0f %5.0f%% | %7.2f %8.0f %5.0f%% | %5.0f%% %5.0f%%\n",
                r.name, bytes / 1e6, t.stream_us, gbps, 100.0 * gbps / copy, t.graph_us, graph_gbps,
                100.0 * graph_gbps / copy, ceiling(bytes, false), ceiling(bytes, true));
  }
}

// --moe-sizes: the routed gate | up (waiting for its ids) and down (ids early) of S = 8 .. 128
// slots in one launch, S distinct experts of 256 rotating over kSets sets, next to the read
// ceiling at the same bytes; then a least-squares line through (bytes, us) for each: its slope is
// the rate at which a launch streams its bytes, its intercept the time a launch costs whatever its
// bytes (the ramp and drain of its one wave of blocks).
template <class Ceiling>
void moe_size_rows(const DeviceLinear& gate_up, const DeviceLinear& down, int iters, double copy,
                   Ceiling& ceiling, cudaStream_t stream) {
  constexpr int kSlots[] = {8, 16, 32, 64, 128};
  constexpr int kMax = 128;
  DeviceBuffer<int> ids(kSets * kMax);
  {
    const std::vector<int> h = expert_sets(13, kSets, kMax, 256);
    QF_CUDA_CHECK(cudaMemcpy(ids.data(), h.data(), ids.bytes(), cudaMemcpyHostToDevice));
  }
  DeviceBuffer<float> x(kMax * 1024), y(kMax * 3072);
  fill_value<float>(x, 0.25f);
  struct Fit {
    double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    void add(double mb, double us) { n += 1, sx += mb, sy += us, sxx += mb * mb, sxy += mb * us; }
    double slope() const { return (n * sxy - sx * sy) / (n * sxx - sx * sx); }
    double at0() const { return (sy - slope() * sx) / n; }
  };
  std::printf("\nthe routed MoE products by slots in one launch (graph replay)\n");
  std::printf("%-22s %5s %7s | %7s %6s | %6s %6s\n", "product", "slots", "MB", "us", "%copy",
              "early", "waits");
  for (const bool is_down : {false, true}) {
    const DeviceLinear& w = is_down ? down : gate_up;
    Fit kernel, early_fit, waits_fit;
    for (const int S : kSlots) {
      const size_t bytes = qf::kern::weight_bytes(w) * S;
      auto launch = [&](int i, cudaStream_t s) {
        GemvBatch b;
        b.n_slots = S;
        b.ids = ids.data() + (i % kSets) * kMax;
        b.x_stride = is_down ? 1024 : 0;
        b.y_stride = static_cast<size_t>(w.n);
        b.ids_early = is_down;
        return qf::kern::gemv(w, x.data(), y.data(), b, s);
      };
      const double us = time_launches(launch, iters, stream).graph_us;
      const double pct = 100.0 * bytes / (us * 1e3) / copy;
      const double waits = ceiling(bytes, true), early = ceiling(bytes, false);
      kernel.add(bytes / 1e6, us);
      early_fit.add(bytes / 1e6, 100.0 * bytes / 1e3 / copy / early);  // us from %copy
      waits_fit.add(bytes / 1e6, 100.0 * bytes / 1e3 / copy / waits);
      std::printf("%-22s %5d %7.1f | %7.2f %5.0f%% | %5.0f%% %5.0f%%\n",
                  is_down ? "int4 moe down" : "int4 moe gate+up", S, bytes / 1e6, us, pct, early,
                  waits);
    }
    for (const auto& [name, f] : {std::pair<const char*, const Fit&>{"kernel      ", kernel},
                                  std::pair<const char*, const Fit&>{"reader early", early_fit},
                                  std::pair<const char*, const Fit&>{"reader waits", waits_fit}}) {
      const double gbps = 1e3 / f.slope();
      std::printf("  %s: %5.0f GB/s (%3.0f%% of copy) for each byte more, %5.2f us a launch\n",
                  name, gbps, 100.0 * gbps / copy, f.at0());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 200;
  bool gemm = false, moe_sizes = false;
  int only_t = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--moe-sizes") == 0) {
      moe_sizes = true;
    } else if (std::strcmp(argv[i], "--gemm") == 0) {
      gemm = true;
      if (i + 1 < argc && argv[i + 1][0] != '-') only_t = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: qforge-bench-gemv [--iters N] [--gemm [T] | --moe-sizes]\n");
      return 1;
    }
  }
  int dev = 0;
  if (cudaGetDeviceCount(&dev) != cudaSuccess || dev == 0) {
    std::fprintf(stderr, "qforge-bench-gemv: no CUDA device\n");
    return 4;
  }
  cudaDeviceProp prop{};
  QF_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, L2 %.0f MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / 1e6);
  cudaStream_t stream;
  QF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy = copy_gbps(stream);
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n\n", copy);
  if (gemm) {
    gemm_section(stream, copy, only_t);
    QF_CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
  }

  // Inputs: x [8 x 3072] (slots' own activations for down), y large enough for any case (the
  // LM head's logits of 4 rows).
  DeviceBuffer<float> x(8 * 3072), y(248320 * 4);
  {
    std::vector<float> h(x.size());
    Rng rng{7};
    for (float& v : h) v = static_cast<float>(rng.next() >> 40) * 0x1p-24f - 0.5f;
    QF_CUDA_CHECK(cudaMemcpy(x.data(), h.data(), x.bytes(), cudaMemcpyHostToDevice));
  }
  // ids: kSets sets of 8 distinct experts out of 256 (for 8-slot MoE launches), and 0..kSets-1
  // for single-matrix launches that rotate through copies (n_slots 1, ids = rot + i % kSets).
  DeviceBuffer<int> moe_ids(kSets * 8), rot(kSets);
  {
    const std::vector<int> h = expert_sets(11, kSets, 8, 256);
    QF_CUDA_CHECK(cudaMemcpy(moe_ids.data(), h.data(), moe_ids.bytes(), cudaMemcpyHostToDevice));
    std::vector<int> r(kSets);
    for (int i = 0; i < kSets; ++i) r[i] = i;
    QF_CUDA_CHECK(cudaMemcpy(rot.data(), r.data(), rot.bytes(), cudaMemcpyHostToDevice));
  }

  struct Case {
    std::string name;
    DeviceLinear lin;
    int n_slots;
    size_t x_stride, y_stride;
    const int* ids;          // rotating base
    int id_step;             // ids advance by this per launch (mod kSets sets)
    int k_splits = 1;        // parts of K (GemvBatch::k_splits), n floats apart
    bool ids_early = false;  // GemvBatch::ids_early
  };
  std::vector<Case> cases;
  Stack gate_up = make_stack(WeightKind::kInt4, 2048, 3072, 256, 128, 1);
  Stack down = make_stack(WeightKind::kInt4, 3072, 1024, 256, 128, 2);
  Stack q_proj = make_stack(WeightKind::kInt4, 16384, 3072, 8, 128, 3);
  Stack gdn_in = make_stack(WeightKind::kInt4, 20608, 3072, 8, 128, 7);
  Stack out_proj = make_stack(WeightKind::kInt4, 3072, 8192, 8, 128, 8);
  Stack lm_head = make_stack(WeightKind::kInt8, 248320, 3072, 1, 3072, 4);
  Stack fp8 = make_stack(WeightKind::kFp8, 1024, 3072, kSets, 128, 5);
  Stack router = make_stack(WeightKind::kBf16, 256, 3072, kSets, 128, 6);
  DeviceLinear gate = gate_up.lin;  // the first 1024 rows of every [2048, 3072] expert
  gate.n = 1024;
  // The MoE products as the engine launches them: gate | up waits for its ids (the top-k just
  // before writes them), down reads its ids before waiting (GemvBatch::ids_early).
  cases.push_back({"int4 moe gate+up 8x[2048x3072]", gate_up.lin, 8, 0, 2048, moe_ids.data(), 8});
  cases.push_back({"int4 moe gate    8x[1024x3072]", gate, 8, 0, 1024, moe_ids.data(), 8});
  cases.push_back(
      {"int4 moe down    8x[3072x1024]", down.lin, 8, 1024, 3072, moe_ids.data(), 8, 1, true});
  cases.push_back({"int4 q_proj      [16384x3072] ", q_proj.lin, 1, 0, 0, rot.data(), 1});
  cases.push_back({"int4 gdn in_proj [20608x3072] ", gdn_in.lin, 1, 0, 0, rot.data(), 1});
  cases.push_back({"int4 out_proj    [3072x8192]  ", out_proj.lin, 1, 0, 0, rot.data(), 1});
  cases.push_back({"int4 out_proj 2 K parts        ", out_proj.lin, 1, 0, 0, rot.data(), 1, 2});
  cases.push_back({"int4 out_proj 4 K parts        ", out_proj.lin, 1, 0, 0, rot.data(), 1, 4});
  cases.push_back({"int8 lm head     [248320x3072]", lm_head.lin, 1, 0, 0, nullptr, 0});
  cases.push_back({"fp8 shared up    [1024x3072]  ", fp8.lin, 1, 0, 0, rot.data(), 1});
  cases.push_back({"bf16 router      [256x3072]   ", router.lin, 1, 0, 0, rot.data(), 1});
  DeviceLinear tiny = router.lin;  // launch floor: one warp's worth of work
  tiny.n = 8;
  tiny.k = 256;
  cases.push_back({"bf16 floor       [8x256]      ", tiny, 1, 0, 0, rot.data(), 1});

  DeviceBuffer<unsigned> sink(1);
  // The read ceiling's %copy at `bytes` (graph replay, best shape), measured once per size and
  // order (five cases read 13.2 MB).
  std::map<std::pair<size_t, bool>, double> ceilings;
  auto read_ceiling = [&](size_t bytes, bool wait_first) {
    const size_t pool = lm_head.w.bytes();
    bytes = std::min(bytes, pool) & ~size_t{15};
    const std::pair<size_t, bool> key{bytes, wait_first};
    if (const auto it = ceilings.find(key); it != ceilings.end()) return it->second;
    const size_t span = pool > bytes ? pool - bytes : 1;
    double best = 1e30;
    for (int per_sm : {1, 2, 4}) {
      for (int loads : {4, 8}) {
        auto launch = [&](int i, cudaStream_t s) {
          const size_t off = (static_cast<size_t>(i) * bytes % span) & ~size_t{255};
          return qf::bench::read_launch({per_sm, loads, wait_first}, lm_head.w.data() + off, bytes,
                                        sink.data(), s);
        };
        best = std::min(best, time_launches(launch, iters, stream).graph_us);
      }
    }
    return ceilings[key] = 100.0 * bytes / (best * 1e3) / copy;
  };

  if (moe_sizes) {
    moe_size_rows(gate_up.lin, down.lin, iters, copy, read_ceiling, stream);
    QF_CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
  }
  std::printf("%-31s %7s | %-23s | %-23s | %s\n", "", "", "stream launches", "graph replay",
              "read %copy");
  std::printf("%-31s %7s | %7s %8s %6s | %7s %8s %6s | %6s %6s\n", "kernel", "MB", "us", "GB/s",
              "%copy", "us", "GB/s", "%copy", "early", "waits");
  for (const Case& c : cases) {
    const size_t bytes = qf::kern::weight_bytes(c.lin) * c.n_slots;
    const int n_rot = c.ids == rot.data() ? (c.lin.kind == WeightKind::kInt4 ? 8 : kSets) : kSets;
    auto launch = [&](int i, cudaStream_t s) {
      GemvBatch b;
      b.n_slots = c.n_slots;
      b.ids = c.ids ? c.ids + (i % n_rot) * c.id_step : nullptr;
      b.x_stride = c.x_stride;
      b.y_stride = c.y_stride;
      b.k_splits = c.k_splits;
      b.ids_early = c.ids_early;
      b.split_stride = static_cast<size_t>(c.lin.n);
      return qf::kern::gemv(c.lin, x.data(), y.data(), b, s);
    };
    const Timing t = time_launches(launch, iters, stream);
    const double gbps = bytes / (t.stream_us * 1e3), graph_gbps = bytes / (t.graph_us * 1e3);
    std::printf("%-31s %7.1f | %7.2f %8.0f %5.0f%% | %7.2f %8.0f %5.0f%% | %5.0f%% %5.0f%%\n",
                c.name.c_str(), bytes / 1e6, t.stream_us, gbps, 100.0 * gbps / copy, t.graph_us,
                graph_gbps, 100.0 * graph_gbps / copy, read_ceiling(bytes, false),
                read_ceiling(bytes, true));
    if (c.lin.w == lm_head.lin.w) {  // the fused LM head next to the int8 gemv row
      struct Head {
        const char* name;
        int rows, top_k;
      };
      DeviceBuffer<uint8_t> scratch(qf::kern::lm_head_scratch_bytes());
      QF_CUDA_CHECK(cudaMemset(scratch.data(), 0, scratch.bytes()));
      DeviceBuffer<int> ids(qf::kern::kLmHeadMaxRows * qf::kern::kLmHeadMaxTopK);
      for (const Head& h :
           {Head{"int8 lm_head x1 + argmax", 1, 1}, Head{"int8 lm_head x4 + argmax", 4, 1},
            Head{"int8 lm_head x4 + top-8", 4, 8}}) {
        auto head = [&](int, cudaStream_t s) {
          return qf::kern::lm_head(c.lin, x.data(), h.rows, h.top_k, y.data(), ids.data(), nullptr,
                                   scratch.data(), s);
        };
        const Timing th = time_launches(head, iters, stream);
        const double hs = bytes / (th.stream_us * 1e3), hg = bytes / (th.graph_us * 1e3);
        std::printf("%-31s %7.1f | %7.2f %8.0f %5.0f%% | %7.2f %8.0f %5.0f%%\n", h.name,
                    bytes / 1e6, th.stream_us, hs, 100.0 * hs / copy, th.graph_us, hg,
                    100.0 * hg / copy);
      }
    }
  }
  moe_ninth_expert_rows(gate_up.lin, down.lin, moe_ids.data(), x.data(), y.data(), iters, copy,
                        read_ceiling, stream);
  QF_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
