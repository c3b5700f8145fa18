// INT8 symmetric per-row quantization (the INT8 LM head): q [N, K] in [-127, 127] and one
// scale per row. The scale max|row|/127 (1 for an all-zero row) is rounded to its stored dtype
// first and the codes are computed against the stored value,
//   q = clamp(round_half_even(w / s_stored), -127, 127),
// so q * s_stored is exactly the reconstruction a loader computes (checkpoint-formats.md T27).
// A nonzero row whose scale would round to 0 in F16/BF16 gets the smallest positive value
// (code 0x0001) instead, so it is not erased; a scale that overflows throws kUnsupported.
#pragma once

#include <cstdint>
#include <vector>

#include "qf/ckpt/dtype.h"
#include "qf/quant/matrix.h"

namespace qf::quant {

struct Int8RowTensors {
  int64_t n = 0, k = 0;
  ckpt::DType scale_dtype = ckpt::DType::kF32;
  std::vector<int8_t> q;          // [N, K]
  std::vector<uint8_t> scales;    // [N] in scale_dtype, little-endian bytes
  std::vector<float> scales_f32;  // the same, as f32
};

// scale_dtype: F32, F16 or BF16.
Int8RowTensors quantize_int8_rows(const MatrixView& w, ckpt::DType scale_dtype, int threads = 0);

// The same for rows [row0, row0 + n_rows) of w, into caller-owned buffers (no allocation, for
// streaming writers): q [n_rows, K], scales [n_rows] stored bytes, scales_f32 [n_rows].
void quantize_int8_rows_into(const MatrixView& w, int64_t row0, int64_t n_rows,
                             ckpt::DType scale_dtype, int8_t* q, uint8_t* scales, float* scales_f32,
                             int threads = 0);

// out[i] = clamp(round_half_even(x[i] / scale), -127, 127) (NaN -> 0): the code every INT8
// row quantizer here stores, given the stored scale.
void int8_codes(const float* x, int64_t n, float scale, int32_t* out);

// W [N, K] in f32: q * s, exact. `scales` holds N values (any [N] or [N, 1] shape).
void dequantize_int8_rows(const int8_t* q, const MatrixView& scales, int64_t n, int64_t k,
                          float* out, int threads = 0);

}  // namespace qf::quant
