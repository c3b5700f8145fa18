#include "qf/quant/int8_row.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "qf/error.h"
#include "qf/quant/formats.h"

namespace qf::quant {

Int8RowTensors quantize_int8_rows(const MatrixView& w, ckpt::DType dtype, int threads) {
  if (dtype != ckpt::DType::kF32 && dtype != ckpt::DType::kF16 && dtype != ckpt::DType::kBF16) {
    throw Error(Errc::kUnsupported, "INT8 row scales are F32, F16 or BF16, not " +
                                        std::string(ckpt::dtype_name(dtype)));
  }
  Int8RowTensors t;
  t.n = w.rows;
  t.k = w.cols;
  t.scale_dtype = dtype;
  const size_t es = ckpt::dtype_size(dtype);
  t.q.resize(static_cast<size_t>(w.rows * w.cols));
  t.scales.resize(static_cast<size_t>(w.rows) * es);
  t.scales_f32.resize(static_cast<size_t>(w.rows));
  parallel_for(w.rows, threads, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(w.cols));
    for (int64_t r = r0; r < r1; ++r) {
      w.row(r, row.data());
      float amax = 0.0f;
      for (float v : row) amax = std::max(amax, std::fabs(v));
      const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
      float stored = s;
      uint8_t* sp = &t.scales[static_cast<size_t>(r) * es];
      if (dtype == ckpt::DType::kF32) {
        std::memcpy(sp, &s, 4);
      } else {
        const uint16_t h = dtype == ckpt::DType::kF16 ? f32_to_f16(s) : f32_to_bf16(s);
        stored = dtype == ckpt::DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
        std::memcpy(sp, &h, 2);
      }
      t.scales_f32[r] = stored;
      int8_t* out = &t.q[static_cast<size_t>(r * w.cols)];
      for (int64_t c = 0; c < w.cols; ++c) {
        const float q = std::nearbyint(row[c] / stored);
        out[c] = std::isnan(q) ? 0 : static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
      }
    }
  });
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
