#include "qf/quant/fp8_block.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "qf/error.h"
#include "qf/quant/formats.h"

namespace qf::quant {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The quantizer's multiplier 448/amax exactly as torch evaluates `448.0 / tensor` in
// transformers: reciprocal first, then the product (two roundings, not one division).
float block_multiplier(float amax) {
  return amax > 0.0f ? (1.0f / amax) * kE4M3Max : 1.0f;
}

// Stores multiplier m in dtype at p; returns the stored value as f32.
float store_scale(float m, ckpt::DType dtype, uint8_t* p) {
  switch (dtype) {
    case ckpt::DType::kF32:
      std::memcpy(p, &m, 4);
      return m;
    case ckpt::DType::kBF16: {
      const uint16_t h = f32_to_bf16(m);
      std::memcpy(p, &h, 2);
      return bf16_to_f32(h);
    }
    case ckpt::DType::kF16: {
      const uint16_t h = f32_to_f16(m);
      std::memcpy(p, &h, 2);
      return f16_to_f32(h);
    }
    default:
      QF_ASSERT(false, "fp8 scale dtype");
  }
}

void check(const Fp8BlockOptions& o) {
  if (o.block_n <= 0 || o.block_k <= 0)
    throw Error(Errc::kUsage, "FP8 block sizes must be positive");
  if (o.scale_dtype != ckpt::DType::kF32 && o.scale_dtype != ckpt::DType::kBF16 &&
      o.scale_dtype != ckpt::DType::kF16) {
    throw Error(Errc::kUnsupported, "FP8 scales are stored as F32, BF16 or F16, not " +
                                        std::string(ckpt::dtype_name(o.scale_dtype)));
  }
}

// Runs fn(block_row, rows [n0, n1), amax per block column) for every block row in parallel.
template <class Fn>
void for_block_rows(const MatrixView& w, const Fp8BlockOptions& o, int threads, Fn&& fn) {
  const int64_t bn_count = ceil_div(w.rows, o.block_n), bk_count = ceil_div(w.cols, o.block_k);
  parallel_for(bn_count, threads, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> row(static_cast<size_t>(w.cols));
    std::vector<float> amax(static_cast<size_t>(bk_count));
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * o.block_n, n1 = std::min(w.rows, n0 + o.block_n);
      std::fill(amax.begin(), amax.end(), 0.0f);
      for (int64_t r = n0; r < n1; ++r) {
        w.row(r, row.data());
        for (int64_t j = 0; j < static_cast<int64_t>(amax.size()); ++j) {
          const int64_t c0 = j * o.block_k, len = std::min(o.block_k, w.cols - c0);
          amax[j] = std::max(amax[j], max_abs(row.data() + c0, len));
        }
      }
      fn(b, n0, n1, amax, row);
    }
  });
}

}  // namespace

Fp8BlockTensors quantize_fp8_block(const MatrixView& w, const Fp8BlockOptions& o, int threads) {
  check(o);
  Fp8BlockTensors t;
  t.n = w.rows;
  t.k = w.cols;
  t.block_n = o.block_n;
  t.block_k = o.block_k;
  t.scale_dtype = o.scale_dtype;
  const int64_t bk_count = ceil_div(w.cols, o.block_k);
  const size_t es = ckpt::dtype_size(o.scale_dtype);
  t.codes.resize(static_cast<size_t>(w.rows * w.cols));
  t.scales.resize(static_cast<size_t>(ceil_div(w.rows, o.block_n) * bk_count) * es);
  t.scales_f32.resize(static_cast<size_t>(ceil_div(w.rows, o.block_n) * bk_count));
  const bool f32 = o.scale_dtype == ckpt::DType::kF32;
  for_block_rows(
      w, o, threads,
      [&](int64_t b, int64_t n0, int64_t n1, const std::vector<float>& amax,
          std::vector<float>& row) {
        std::vector<float> mult(static_cast<size_t>(bk_count));  // what the codes are computed with
        for (int64_t j = 0; j < bk_count; ++j) {
          const float s = block_multiplier(amax[j]);
          const size_t idx = static_cast<size_t>(b * bk_count + j);
          const float stored = store_scale(1.0f / s, o.scale_dtype, &t.scales[idx * es]);
          t.scales_f32[idx] = stored;
          mult[j] = f32 ? s : stored;
        }
        // Per-column multiplier, and codes into uint32 first (a uint8_t* may alias the row).
        std::vector<float> m_of(static_cast<size_t>(w.cols));
        for (int64_t c = 0; c < w.cols; ++c) m_of[c] = mult[c / o.block_k];
        std::vector<uint32_t> codes(static_cast<size_t>(w.cols));
        for (int64_t r = n0; r < n1; ++r) {
          w.row(r, row.data());
          const float *x = row.data(), *mv = m_of.data();
          uint32_t* cv = codes.data();
          if (f32) {
            for (int64_t c = 0; c < w.cols; ++c) cv[c] = f32_to_e4m3fn_sat(x[c] * mv[c]);
          } else {
            for (int64_t c = 0; c < w.cols; ++c) cv[c] = f32_to_e4m3fn_sat(x[c] / mv[c]);
          }
          uint8_t* __restrict out = &t.codes[static_cast<size_t>(r * w.cols)];
          for (int64_t c = 0; c < w.cols; ++c) out[c] = static_cast<uint8_t>(cv[c]);
        }
      });
  return t;
}

std::vector<uint8_t> fp8_block_scales(const MatrixView& w, const Fp8BlockOptions& o, int threads) {
  check(o);
  const int64_t bk_count = ceil_div(w.cols, o.block_k);
  const size_t es = ckpt::dtype_size(o.scale_dtype);
  std::vector<uint8_t> scales(static_cast<size_t>(ceil_div(w.rows, o.block_n) * bk_count) * es);
  for_block_rows(
      w, o, threads,
      [&](int64_t b, int64_t, int64_t, const std::vector<float>& amax, std::vector<float>&) {
        for (int64_t j = 0; j < bk_count; ++j) {
          const float s = block_multiplier(amax[j]);
          store_scale(1.0f / s, o.scale_dtype, &scales[static_cast<size_t>(b * bk_count + j) * es]);
        }
      });
  return scales;
}

void dequantize_fp8_block(const uint8_t* codes, const MatrixView& scales, int64_t n, int64_t k,
                          int64_t block_n, int64_t block_k, float* out, int threads) {
  if (scales.rows != ceil_div(n, block_n) || scales.cols != ceil_div(k, block_k)) {
    throw Error(Errc::kUnsupported, "FP8 scale grid [" + std::to_string(scales.rows) + ", " +
                                        std::to_string(scales.cols) + "] does not fit [" +
                                        std::to_string(n) + ", " + std::to_string(k) +
                                        "] in blocks of " + std::to_string(block_n) + "x" +
                                        std::to_string(block_k));
  }
  parallel_for(n, threads, 1, [&](int64_t n0, int64_t n1) {
    for (int64_t r = n0; r < n1; ++r) {
      for (int64_t c = 0; c < k; ++c) {
        out[r * k + c] = e4m3fn_to_f32(codes[r * k + c]) * scales.at(r / block_n, c / block_k);
      }
    }
  });
}

}  // namespace qf::quant
