// INT4 in the GPTQ layout AutoRound exports (auto_round:auto_gptq): round-to-nearest
// quantization, packing, unpacking and exact dequantization. Layout: formats.h.
//
// RTN reproduces AutoRound's `int_sym` (iters=0, disable_opt_rtn; auto_round/data_type/int.py)
// bit for bit: per group of G inputs, with wmin = min(w, 0) and wmax = max(w, 0),
//   scale = f16(+|wmin|/8)  if |wmin| > wmax, else f16(-wmax/8)     (the extreme maps to -8)
//   |scale| clamped to at least f16(1e-5); a group of zeros gets +f16(1e-5)
//   q     = clamp(round_half_even(w / scale), -8, 7), stored as q + 8; zero 8 (v1: stored 7)
// computed in f32 from the exactly widened weights. The asymmetric option follows `int_asym`
// (scale = f16((wmax - wmin)/15), zero = round(-wmin/scale), q = clamp(round(w/scale)+zero,
// 0, 15)), computed in f32; it needs the v2 zero convention (v1 cannot store a zero of 0).
// AutoRound's model-free route (auto-round >= 0.16 picks it for iters=0 on a checkpoint path)
// quantizes in torch.compile'd kernels with an approximate division: its codes equal ours
// except where w / scale is an exact tie (m + 0.5), and it pads qweight to whole groups of K
// (tests/golden/quant_golden_test.cpp pins both facts).
#pragma once

#include <cstdint>
#include <vector>

#include "qf/quant/formats.h"
#include "qf/quant/matrix.h"

namespace qf::quant {

struct Int4Options {
  int64_t group_size = 128;
  bool sym = true;
  ZeroPoint zeros = ZeroPoint::kV1StoredMinusOne;
};

// The three tensors of one quantized linear, in checkpoint layout.
struct Int4Tensors {
  int64_t n = 0, k = 0, group = 128;
  ZeroPoint zeros = ZeroPoint::kV1StoredMinusOne;
  std::vector<uint32_t> qweight;  // [K/8, N]
  std::vector<uint32_t> qzeros;   // [ceil(K/G), N/8]
  std::vector<uint16_t> scales;   // [ceil(K/G), N], F16 bits
};

// Non-owning view of the same tensors (e.g. mapped from a checkpoint).
struct Int4View {
  const uint32_t* qweight = nullptr;  // [K/8, N]
  const uint32_t* qzeros = nullptr;   // [ceil(K/G), N/8]
  const uint16_t* scales = nullptr;   // [ceil(K/G), N] F16
  int64_t n = 0, k = 0, group = 128;
  ZeroPoint zeros = ZeroPoint::kV1StoredMinusOne;
};

inline int64_t int4_groups(int64_t k, int64_t group) {
  return (k + group - 1) / group;
}

// Quantizes W [N, K] (w.rows = N, w.cols = K). Needs K % 8 == 0 and N % 8 == 0 (the packed
// shapes), else Error(kUnsupported). Deterministic; threads split the outputs.
Int4Tensors quantize_int4(const MatrixView& w, const Int4Options& options, int threads = 0);

// Only the scales, equal to quantize_int4(...).scales (a cheap max pass).
std::vector<uint16_t> int4_scales(const MatrixView& w, const Int4Options& options, int threads = 0);

// One group of a row as quantize_int4 quantizes it (symmetric): its F16 scale, and the codes
// (0..15, q + 8) of x[0..len) under a scale. Streaming tools (quantize-lm-head) call them a
// group at a time; the results are quantize_int4's bits.
uint16_t int4_sym_scale(const float* x, int64_t len);
void int4_sym_codes(const float* x, int64_t len, uint16_t scale, uint8_t* codes);

// W [N, K] in f32, exact.
void dequantize_int4(const Int4View& v, float* out, int threads = 0);
Int4View view_of(const Int4Tensors& t);

// Codes [N, K] (0..15) from a packed qweight, and the inverse. Bit-exact round trip.
std::vector<uint8_t> unpack_int4(const uint32_t* qweight, int64_t n, int64_t k);
std::vector<uint32_t> pack_int4(const uint8_t* codes, int64_t n, int64_t k);

}  // namespace qf::quant
