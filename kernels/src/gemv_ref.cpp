// CPU twin of gemv.cu / gemv_int4.cu on host copies of the kernel layouts (gemv.h). Each weight is
// reconstructed in f32 with the scalar decoders of qf/quant/formats.h, exactly as the kernel does
// (INT4/INT8 scale * (code - zero), FP8 e4m3(code) * block_scale as a rounded f32 product), and
// the products are summed in double: w * x of two floats is exact in double, so the reference is
// the exact dot product rounded once (up to double rounding far below f32's), and a test's
// tolerance only has to cover the kernel's own fp32 summation.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "qf/kern/gemv.h"
#include "qf/kern/ops.h"
#include "qf/quant/formats.h"

namespace qf::kern {
namespace {

uint16_t half_bits(const __half* p) {
  uint16_t u;
  std::memcpy(&u, p, sizeof u);
  return u;
}

size_t w_elem_bytes(WeightKind k) {
  return k == WeightKind::kBf16 ? 2 : k == WeightKind::kFp8 ? 1 : 4;
}

int64_t n_groups(const DeviceLinear& w) {
  return (static_cast<int64_t>(w.k) + w.group - 1) / w.group;
}

// Row r of expert e in f32, exactly as the format defines it.
void weight_row(const DeviceLinear& w, size_t e, int64_t r, float* out) {
  const int64_t k = w.k;
  const auto* base = static_cast<const uint8_t*>(w.w) + e * w.w_stride * w_elem_bytes(w.kind);
  switch (w.kind) {
    case WeightKind::kBf16: {
      const auto* row = reinterpret_cast<const uint16_t*>(base) + r * k;
      for (int64_t c = 0; c < k; ++c) out[c] = quant::bf16_to_f32(row[c]);
      return;
    }
    case WeightKind::kF32: {
      std::memcpy(out, reinterpret_cast<const float*>(base) + r * k, sizeof(float) * k);
      return;
    }
    case WeightKind::kInt4:
    case WeightKind::kInt8: {
      const int bits = w.kind == WeightKind::kInt4 ? 4 : 8;
      const int per = 32 / bits;
      const uint32_t mask = (1u << bits) - 1u;
      const auto* words = reinterpret_cast<const uint32_t*>(base);
      const int64_t g_row = r * n_groups(w);
      const __half* scales = w.scales + e * w.scale_stride + g_row;
      const uint8_t* zeros = w.zeros + e * w.zero_stride + g_row;
      for (int64_t p = 0; p < k / per; ++p) {
        for (int j = 0; j < per; ++j) {
          // INT4: the kernel layout's column of nibble j (gemv.h); INT8: byte j is column 4p + j.
          const int64_t c =
              bits == 4 ? int4_column(static_cast<int>(k), static_cast<int>(p), j) : p * per + j;
          const size_t word = bits == 4 ? int4_word_index(w.n, static_cast<int>(k),
                                                          static_cast<int>(r), static_cast<int>(p))
                                        : static_cast<size_t>(r * (k / per) + p);
          const uint32_t code = (words[word] >> (bits * j)) & mask;
          const int64_t g = c / w.group;
          out[c] = quant::int4_dequant(code, zeros[g], half_bits(scales + g));  // any bit width
        }
      }
      return;
    }
    case WeightKind::kFp8: {
      const auto* row = base + r * k;
      const int64_t n_col_blocks = (k + w.block - 1) / w.block;
      const float* bs = w.block_scale + e * w.block_scale_stride + (r / w.block) * n_col_blocks;
      for (int64_t c = 0; c < k; ++c) out[c] = quant::e4m3fn_to_f32(row[c]) * bs[c / w.block];
      return;
    }
  }
}

}  // namespace

void gemv_ref(const DeviceLinear& w, const float* x, float* y, const GemvBatch& batch,
              const int* host_ids) {
  std::vector<float> row(static_cast<size_t>(w.k));
  const int64_t cols = batch.k_splits > 1 ? split_cols(w.k, batch.k_splits) : w.k;
  for (int s = 0; s < batch.n_slots; ++s) {
    const size_t e = static_cast<size_t>(host_ids ? host_ids[s] : s);
    const float* xs = x + s / batch.slots_per_x * batch.x_stride;
    for (int64_t r = 0; r < w.n; ++r) {
      weight_row(w, e, r, row.data());
      for (int j = 0; j < batch.k_splits; ++j) {  // part j: columns [j cols, (j + 1) cols)
        double acc = 0.0;
        for (int64_t c = j * cols; c < std::min<int64_t>((j + 1) * cols, w.k); ++c) {
          acc += static_cast<double>(row[c]) * xs[c];
        }
        y[s * batch.y_stride + j * batch.split_stride + r] = static_cast<float>(acc);
      }
    }
  }
}

void gemv_swiglu_ref(const DeviceLinear& w, const float* x, float* h, const GemvBatch& batch,
                     const int* host_ids) {
  // gemv_ref per slot, then swiglu_ref (ops.h) on each pair of gate and up rows.
  const int n_h = w.n / 2;
  std::vector<float> y(static_cast<size_t>(w.n)), gate(static_cast<size_t>(n_h)),
      up(static_cast<size_t>(n_h));
  for (int s = 0; s < batch.n_slots; ++s) {
    const int id = host_ids ? host_ids[s] : s;
    gemv_ref(w, x + s / batch.slots_per_x * batch.x_stride, y.data(), GemvBatch{},
             &id);  // one slot: expert id
    for (int j = 0; j < n_h; ++j) {
      gate[j] = y[swiglu_pair_row(j, false)];
      up[j] = y[swiglu_pair_row(j, true)];
    }
    swiglu_ref(gate.data(), up.data(), n_h, 1, 0, h + s * batch.y_stride);
  }
}

void gemv_moe_ref(const DeviceLinear& experts, const float* x, float* y, const GemvBatch& batch,
                  bool swiglu, const SharedProduct& shared, const int* host_ids) {
  // The routed slots as gemv_ref / gemv_swiglu_ref; the shared product as gemv_ref, then
  // swiglu_ref on its unpaired gate and up halves.
  if (swiglu) {
    gemv_swiglu_ref(experts, x, y, batch, host_ids);
  } else {
    gemv_ref(experts, x, y, batch, host_ids);
  }
  const int n = shared.w.n;
  if (!swiglu) {
    gemv_ref(shared.w, shared.x, shared.y, GemvBatch{}, nullptr);
    if (shared.gate) {  // a host pointer here
      const float sg = 1.0f / (1.0f + std::exp(-*shared.gate));
      for (int i = 0; i < n; ++i) shared.y[i] *= sg;
    }
    return;
  }
  std::vector<float> t(static_cast<size_t>(n));
  gemv_ref(shared.w, shared.x, t.data(), GemvBatch{}, nullptr);
  swiglu_ref(t.data(), t.data() + n / 2, n / 2, 1, 0, shared.y);
}

size_t weight_bytes(const DeviceLinear& w) {
  const size_t n = static_cast<size_t>(w.n), k = static_cast<size_t>(w.k);
  switch (w.kind) {
    case WeightKind::kBf16:
      return n * k * 2;
    case WeightKind::kF32:
      return n * k * 4;
    case WeightKind::kInt4:
    case WeightKind::kInt8: {
      const size_t codes = w.kind == WeightKind::kInt4 ? n * k / 2 : n * k;
      return codes + n * static_cast<size_t>(n_groups(w)) * (sizeof(__half) + sizeof(uint8_t));
    }
    case WeightKind::kFp8: {
      const size_t b = static_cast<size_t>(w.block);
      return n * k + ((n + b - 1) / b) * ((k + b - 1) / b) * sizeof(float);
    }
  }
  return 0;
}

}  // namespace qf::kern
