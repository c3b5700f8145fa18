// Helpers of the GEMV tests (gemv_test, gemv_fused_test): random matrices of every weight format
// written directly in the kernel layouts (gemv.h), on the host and on the device; an independent
// decoder of their weights (weight_at); expert batches and their random inputs.
//
// Tolerance: gemv_ref is the exact dot product of the exactly reconstructed weights, rounded once
// (it sums the exact products in double). The kernel forms the same products exactly (fma) and
// sums them in fp32 through a tree of depth at most ceil(K/32) + 8 (a lane's chain plus the warp
// reduction; the generic path's lanes take whole words), so per row
//   |y - ref| <= (ceil(K/32) + 16) * 2^-24 * sum_c |w_rc * x_c|,
// the standard bound gamma_n * sum|terms| with margin for the reference's own final rounding.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mixer_check.h"
#include "qf/kern/device_buffer.h"
#include "qf/kern/gemv.h"
#include "qf/quant/formats.h"

namespace qf::kern::test {

inline const char* kind_name(WeightKind k) {
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

inline uint16_t random_scale(Rng& rng) {
  if (rng.below(10) == 0) return static_cast<uint16_t>(rng.below(0x400) | (rng.below(2) << 15));
  const float s = rng.uniform(1e-3f, 2e-2f) * (rng.below(2) ? -1.0f : 1.0f);  // AutoRound: signed
  return quant::f32_to_f16(s);
}

inline std::unique_ptr<TestLinear> make_linear(WeightKind kind, int n, int k, int n_experts,
                                               int group, int block, uint64_t seed,
                                               size_t w_offset_bytes = 0) {
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
inline float weight_at(const TestLinear& t, size_t e, int64_t r, int64_t c) {
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
  int slots_per_x = 1;  // slot s reads x + (s / slots_per_x) * x_stride
  // x of slot s on the host
  const float* x_of(const std::vector<float>& x, int s) const {
    return x.data() + s / slots_per_x * x_stride;
  }
};

// Random x in [-1, 1) for every slot of `b` and the ids, on the host and on the device, with the
// batch gemv takes (outputs `y_stride` apart, 0 for one slot).
struct Inputs {
  std::vector<float> x;
  DeviceBuffer<float> d_x;
  DeviceBuffer<int> d_ids;
  GemvBatch gb;
};

inline Inputs make_inputs(const TestLinear& t, const Batch& b, Rng& rng) {
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
  in.gb.slots_per_x = b.slots_per_x;
  return in;
}

// Every element of `got` outside `written` still holds the NaN poison (all bits set) its buffer
// was filled with: nothing outside the product's outputs was written.
inline void expect_poison_outside(const std::vector<float>& got, const std::vector<bool>& written,
                                  const char* what) {
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &got[i], 4);
    if (!written[i]) {
      ASSERT_EQ(bits, 0xFFFFFFFFu) << what << "[" << i << "] outside the outputs written";
    }
  }
}

}  // namespace qf::kern::test
