// Read-only float matrices in their stored dtype, and a row-parallel loop.
#pragma once

#include <cstdint>
#include <functional>

#include "qf/ckpt/dtype.h"

namespace qf::quant {

// A row-major [rows, cols] matrix of BF16, F16 or F32 (e.g. a mapped tensor). Reads widen to
// f32 exactly. Does not own the data.
struct MatrixView {
  const void* data = nullptr;
  ckpt::DType dtype = ckpt::DType::kBF16;
  int64_t rows = 0;
  int64_t cols = 0;

  // Throws Error(kUnsupported) for dtypes other than BF16, F16, F32.
  MatrixView(const void* d, ckpt::DType t, int64_t r, int64_t c);
  float at(int64_t r, int64_t c) const;
  // out[0..cols) = row r, widened to f32.
  void row(int64_t r, float* out) const { row_range(r, 0, cols, out); }
  // out[0..n) = elements [c0, c0 + n) of row r, widened to f32.
  void row_range(int64_t r, int64_t c0, int64_t n, float* out) const;
};

// max |x[i]| over n values, NaN ignored, in eight independent lanes so it vectorizes.
float max_abs(const float* x, int64_t n);

// Runs fn(begin, end) over [0, n) split into contiguous chunks that are multiples of `align`
// (except the last), on up to `threads` threads (0: hardware concurrency). Blocks until done;
// rethrows the first exception.
void parallel_for(int64_t n, int threads, int64_t align,
                  const std::function<void(int64_t, int64_t)>& fn);

}  // namespace qf::quant
