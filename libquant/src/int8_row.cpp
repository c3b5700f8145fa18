#include "qf/quant/int8_row.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "qf/error.h"
#include "qf/quant/formats.h"

namespace qf::quant {

void int8_codes(const float* __restrict x, int64_t n, float scale, int32_t* __restrict out) {
  for (int64_t c = 0; c < n; ++c) {  // clamp, then round half to even; NaN -> 0
    float d = x[c] / scale;
    d = d != d ? 0.0f : d;
    d = d < -127.0f ? -127.0f : (d > 127.0f ? 127.0f : d);
    out[c] = static_cast<int32_t>(round_half_even_small(d));
  }
}

void quantize_int8_rows_into(const MatrixView& w, int64_t row0, int64_t n_rows, ckpt::DType dtype,
                             int8_t* q, uint8_t* scales, float* scales_f32, int threads) {
  if (dtype != ckpt::DType::kF32 && dtype != ckpt::DType::kF16 && dtype != ckpt::DType::kBF16) {
    throw Error(Errc::kUnsupported, "INT8 row scales are F32, F16 or BF16, not " +
                                        std::string(ckpt::dtype_name(dtype)));
  }
  const size_t es = ckpt::dtype_size(dtype);
  const int64_t k = w.cols;
  parallel_for(n_rows, threads, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(k));
    std::vector<int32_t> qi(static_cast<size_t>(k));
    for (int64_t r = r0; r < r1; ++r) {
      w.row(row0 + r, row.data());
      const float amax = max_abs(row.data(), k);
      const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
      float stored = s;
      uint8_t* sp = scales + static_cast<size_t>(r) * es;
      if (dtype == ckpt::DType::kF32) {
        std::memcpy(sp, &s, 4);
      } else {
        uint16_t h = dtype == ckpt::DType::kF16 ? f32_to_f16(s) : f32_to_bf16(s);
        if ((h & 0x7FFFu) == 0) h = 1;  // a nonzero row never gets scale 0 (underflow)
        stored = dtype == ckpt::DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
        std::memcpy(sp, &h, 2);
      }
      if (!std::isfinite(stored)) {
        throw Error(Errc::kUnsupported,
                    "row " + std::to_string(row0 + r) + ": max |w| = " + std::to_string(amax) +
                        " needs a scale beyond " + std::string(ckpt::dtype_name(dtype)));
      }
      scales_f32[r] = stored;
      // Into int32 first: an int8_t* may alias the row, which would stop the vectorizer.
      int8_codes(row.data(), k, stored, qi.data());
      const int32_t* qv = qi.data();
      int8_t* __restrict out = q + r * k;
      for (int64_t c = 0; c < k; ++c) out[c] = static_cast<int8_t>(qv[c]);
    }
  });
}

Int8RowTensors quantize_int8_rows(const MatrixView& w, ckpt::DType dtype, int threads) {
  Int8RowTensors t;
  t.n = w.rows;
  t.k = w.cols;
  t.scale_dtype = dtype;
  t.q.resize(static_cast<size_t>(w.rows * w.cols));
  t.scales.resize(static_cast<size_t>(w.rows) * ckpt::dtype_size(dtype));
  t.scales_f32.resize(static_cast<size_t>(w.rows));
  quantize_int8_rows_into(w, 0, w.rows, dtype, t.q.data(), t.scales.data(), t.scales_f32.data(),
                          threads);
  return t;
}

void dequantize_int8_rows(const int8_t* q, const MatrixView& scales, int64_t n, int64_t k,
                          float* out, int threads) {
  if (scales.rows * scales.cols != n) {
    throw Error(Errc::kUnsupported, "INT8 row scales hold " +
                                        std::to_string(scales.rows * scales.cols) + " values for " +
                                        std::to_string(n) + " rows");
  }
  const MatrixView flat(scales.data, scales.dtype, n, 1);
  parallel_for(n, threads, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float s = flat.at(r, 0);
      for (int64_t c = 0; c < k; ++c) out[r * k + c] = static_cast<float>(q[r * k + c]) * s;
    }
  });
}

}  // namespace qf::quant
