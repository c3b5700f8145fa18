// FP8 E4M3FN block quantization in the layout of Qwen's FP8 releases (formats.h): codes [N, K]
// and one multiplier `weight_scale_inv` per block [ceil(N/bn), ceil(K/bk)]; partial blocks at
// the edges have their own scale.
//
// With F32 scales it reproduces transformers' fine-grained FP8 quantizer (Fp8Quantize) bit for
// bit: per block amax = max|w| (f32), s = (1 / amax) * 448 (1 when amax is 0; rounded after
// the reciprocal and after the product, as torch evaluates `448.0 / tensor`),
// code = e4m3(clamp(w * s, -448, 448)), weight_scale_inv = 1 / s. transformers requires whole
// blocks; partial blocks here use the same formula over the elements they have.
// With BF16 (or F16) scales, the multiplier is rounded to its stored dtype first and codes are
// computed against the stored value, code = e4m3(clamp(w / stored, -448, 448)), so
// e4m3(code) * stored is the reconstruction a loader will compute.
#pragma once

#include <cstdint>
#include <vector>

#include "qf/ckpt/dtype.h"
#include "qf/quant/matrix.h"

namespace qf::quant {

struct Fp8BlockOptions {
  int64_t block_n = 128;
  int64_t block_k = 128;
  ckpt::DType scale_dtype = ckpt::DType::kF32;  // F32 (transformers), BF16 (Qwen) or F16
};

struct Fp8BlockTensors {
  int64_t n = 0, k = 0, block_n = 128, block_k = 128;
  ckpt::DType scale_dtype = ckpt::DType::kF32;
  std::vector<uint8_t> codes;     // [N, K] E4M3FN
  std::vector<uint8_t> scales;    // [ceil(N/bn), ceil(K/bk)] in scale_dtype, little-endian bytes
  std::vector<float> scales_f32;  // the same multipliers, as f32
};

Fp8BlockTensors quantize_fp8_block(const MatrixView& w, const Fp8BlockOptions& options,
                                   int threads = 0);

// Only the stored scales (bytes in scale_dtype), equal to quantize_fp8_block(...).scales.
std::vector<uint8_t> fp8_block_scales(const MatrixView& w, const Fp8BlockOptions& options,
                                      int threads = 0);

// W [N, K] in f32: e4m3(code) * scale_inv, exact. `scales` is a [ceil(N/bn), ceil(K/bk)]
// matrix of BF16, F16 or F32 multipliers.
void dequantize_fp8_block(const uint8_t* codes, const MatrixView& scales, int64_t n, int64_t k,
                          int64_t block_n, int64_t block_k, float* out, int threads = 0);

}  // namespace qf::quant
