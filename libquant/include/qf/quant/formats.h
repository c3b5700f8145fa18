// Number formats: THE layout contract shared by libquant (host) and the CUDA kernels (device).
// Host/device neutral (no std:: containers, no exceptions); include from .cpp and .cu alike.
//
// Scalar conversions reproduce PyTorch bit for bit (c10/util/BFloat16.h, Half.h,
// Float8_e4m3fn.h, Float8_e5m2.h), with integer-only round-to-nearest-even so host and device
// agree and no FPU mode (FTZ, fast-math) can change a result:
//   f32 -> bf16   RNE; overflow rounds to +-inf.
//   f32 -> f16    RNE incl. subnormals; |x| >= 65520 -> +-inf.
//   NaN -> 0x7FFF for both, what torch 2.11 produces on CUDA (its CPU path differs only on
//   NaN: 0xFFFF for BF16, sign|0x7E00|payload for F16). tests/golden/formats.safetensors
//   holds torch's results for every code and every rounding midpoint.
//   f32 -> e4m3fn RNE incl. subnormals. NaN policy (torch's, non-saturating): NaN, +-inf and
//                 |x| > 464 give the NaN code 0x7F|sign (464 itself ties to 448). Quantizers use
//                 f32_to_e4m3fn_sat, which clamps to +-448 first, as every FP8 producer does.
//   f32 -> e5m2   RNE incl. subnormals; |x| >= 61440 rounds to +-inf (0x7C); NaN -> 0x7F|sign.
// Decoders are exact (every narrow value is representable in f32).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define QF_HD __host__ __device__ __forceinline__
#else
#define QF_HD inline
#endif

namespace qf::quant {

QF_HD uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

QF_HD float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// ---- BF16: the upper half of an f32 --------------------------------------------------------

QF_HD float bf16_to_f32(uint16_t h) {
  return f32_from_bits(static_cast<uint32_t>(h) << 16);
}

QF_HD uint16_t f32_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;  // NaN, as torch on CUDA
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// f as a bf16 holds it: f32 -> bf16 -> f32.
QF_HD float round_to_bf16(float f) {
  return bf16_to_f32(f32_to_bf16(f));
}

// ---- helpers for narrow IEEE-style formats ------------------------------------------------

namespace detail {

// Rounds |x| (f32 bits without sign, finite, not above the format's range) to a float with
// kMant mantissa bits, exponent bias kBias and minimum normal exponent 1 - kBias, with
// round-to-nearest-even. Returns exponent_field << kMant | mantissa; a carry out of the
// mantissa moves into the exponent, as it should.
template <int kMant, int kBias>
QF_HD uint32_t round_narrow(uint32_t ax) {
  const int e = static_cast<int>(ax >> 23) - 127;   // unbiased exponent (f32 subnormals: tiny)
  if ((ax >> 23) == 0) return 0;                    // f32 zero or subnormal: far below range
  const uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;  // 24-bit significand: value = m * 2^(e-23)
  const int emin = 1 - kBias;
  int shift;
  uint32_t base;
  if (e >= emin) {  // normal: keep kMant fraction bits
    shift = 23 - kMant;
    base = static_cast<uint32_t>(e + kBias - 1) << kMant;  // (e+bias) << M, minus the hidden 1
  } else {                                                 // subnormal: units of 2^(emin - kMant)
    shift = 23 - kMant + (emin - e);
    base = 0;
    if (shift > 24) return 0;  // below half the smallest subnormal
  }
  const uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  const uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
  return base + r;  // for normals the hidden bit of r adds the missing 1 to the exponent field
}

}  // namespace detail

// ---- F16 (IEEE binary16) ------------------------------------------------------------------

QF_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
  // subnormal: mant * 2^-24, exact in f32
  const float v = static_cast<float>(mant) * f32_from_bits(0x33800000u);  // 2^-24
  return sign ? -v : v;
}

QF_HD uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t ax = u & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return 0x7FFF;           // NaN, as torch on CUDA
  if (ax >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to inf (ties to even)
  return sign | static_cast<uint16_t>(detail::round_narrow<10, 15>(ax));
}

// ---- FP8 E4M3FN (safetensors F8_E4M3, torch float8_e4m3fn) ----------------------------------

inline constexpr float kE4M3Max = 448.0f;

QF_HD float e4m3fn_to_f32(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t exp = (c >> 3) & 0xFu;
  const uint32_t mant = c & 0x7u;
  if (exp == 0xF && mant == 0x7) return f32_from_bits(0x7FC00000u | sign);  // the NaN codes
  if (exp != 0) return f32_from_bits(sign | ((exp + 120u) << 23) | (mant << 20));
  const float v = static_cast<float>(mant) * 0.001953125f;  // mant * 2^-9
  return sign ? -v : v;
}

namespace detail {

// RNE of a finite |x| < 480 (f32 bits without sign) to E4M3FN, as c10's
// fp8e4m3fn_from_fp32_value: normals by a biased integer add on the bits (the odd-mantissa bit
// breaks ties to even), subnormals (< 2^-6) by one f32 add of 2^14, which rounds to the 2^-9
// grid in the FPU's default round-to-nearest-even mode. Branch-light, so loops vectorize.
QF_HD uint32_t e4m3fn_round_finite(uint32_t ax) {
  const uint32_t normal = (ax + ((7u - 127u) << 23) + 0x7FFFFu + ((ax >> 20) & 1u)) >> 20;
  const uint32_t sub = f32_bits(f32_from_bits(ax) + 16384.0f) - (141u << 23);
  return ax < (121u << 23) ? sub : normal;
}

}  // namespace detail

// torch semantics, non-saturating (see the file comment).
QF_HD uint8_t f32_to_e4m3fn(float f) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t ax = u & 0x7FFFFFFFu;
  if (ax >= 0x43F00000u) return sign | 0x7Fu;                           // >= 480, inf, NaN -> NaN
  return sign | static_cast<uint8_t>(detail::e4m3fn_round_finite(ax));  // (464, 480) -> 0x7F
}

// Clamps to +-448 first: what FP8 weight quantizers store. NaN stays NaN.
QF_HD uint8_t f32_to_e4m3fn_sat(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t ax = u & 0x7FFFFFFFu;
  const uint32_t clamped = ax > 0x43E00000u ? 0x43E00000u : ax;  // |x| > 448 and inf -> 448
  const uint32_t code = ax > 0x7F800000u ? 0x7Fu : detail::e4m3fn_round_finite(clamped);
  return static_cast<uint8_t>(sign | code);
}

// The value f32_to_e4m3fn_sat stores: what an FP8 KV cache entry holds (unit scale).
QF_HD float round_to_e4m3fn_sat(float f) {
  return e4m3fn_to_f32(f32_to_e4m3fn_sat(f));
}

// Round half to even of |x| < 2^22, exactly: adding 1.5 * 2^23 moves x into the binade where
// the spacing is 1, so the FPU's default rounding does the work (vectorizes; no libm call).
QF_HD float round_half_even_small(float x) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (x + kMagic) - kMagic;
}

// ---- FP8 E5M2 (safetensors F8_E5M2, torch float8_e5m2) -------------------------------------

QF_HD float e5m2_to_f32(uint8_t c) {
  // E5M2 is the upper byte of an F16.
  return f16_to_f32(static_cast<uint16_t>(static_cast<uint16_t>(c) << 8));
}

QF_HD uint8_t f32_to_e5m2(float f) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t ax = u & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return sign | 0x7Fu;   // NaN
  if (ax >= 0x47700000u) return sign | 0x7Cu;  // >= 61440 rounds to inf (ties to even)
  return sign | static_cast<uint8_t>(detail::round_narrow<2, 15>(ax));
}

// ---- INT4, GPTQ packing as written by AutoRound (auto_round:auto_gptq) --------------------
//
// For a linear W [N, K] (N outputs, K inputs), group size G along K:
//   qweight I32 [K/8, N]      nibble j of word [r][n] is the code of W[n][8r + j], lowest
//                             nibble = smallest k. Codes are unsigned 0..15.
//   qzeros  I32 [ceil(K/G), N/8]  nibble j of word [g][c] is the zero point of output 8c + j.
//                             v1 (auto_round:auto_gptq, GPTQ "v1"): stored = zero - 1, so a
//                             symmetric 4-bit zero of 8 is stored 7 (0x77777777 words).
//                             v2 (native auto_round, GPTQ v2): stored = zero.
//   scales  F16 [ceil(K/G), N]  signed (AutoRound's sym scale is -max|w|/8 when the extreme
//                             element is positive).
//   W[n][k] = scale[k/G][n] * (code - zero), exact in f32.
// Words are read as uint32 (they are frequently negative as I32).
inline constexpr int kInt4PerWord = 8;
inline constexpr uint32_t kInt4SymZeroWordV1 = 0x77777777u;

enum class ZeroPoint { kV1StoredMinusOne, kV2True };

QF_HD uint32_t int4_code(const uint32_t* qweight, int64_t n_out, int64_t k, int64_t n) {
  return (qweight[(k / 8) * n_out + n] >> (4 * (k % 8))) & 0xFu;
}

QF_HD uint32_t int4_zero(const uint32_t* qzeros, int64_t n_out, int64_t g, int64_t n,
                         ZeroPoint zp) {
  const uint32_t stored = (qzeros[g * (n_out / 8) + n / 8] >> (4 * (n % 8))) & 0xFu;
  return zp == ZeroPoint::kV1StoredMinusOne ? stored + 1 : stored;
}

QF_HD float int4_dequant(uint32_t code, uint32_t zero, uint16_t scale_f16) {
  return f16_to_f32(scale_f16) *
         static_cast<float>(static_cast<int32_t>(code) - static_cast<int32_t>(zero));
}

// ---- INT8, GPTQ 8-bit packing (the INT8 LM head, checkpoint-formats.md §4.5 option B) -----
//   qweight I32 [K/4, N]      byte j of word [r][n] is the code of W[n][4r + j], lowest byte =
//                             smallest k; code = q + 128 for q in [-127, 127].
//   qzeros  I32 [ceil(K/G), N/4]  v1: zero 128 stored as 127 (0x7F7F7F7F words).
//   scales  F16 [ceil(K/G), N]; W[n][k] = scale[k/G][n] * (code - 128), exact in f32.
inline constexpr int kInt8PerWord = 4;
inline constexpr uint32_t kInt8SymZeroWordV1 = 0x7F7F7F7Fu;

QF_HD uint32_t int8_code(const uint32_t* qweight, int64_t n_out, int64_t k, int64_t n) {
  return (qweight[(k / 4) * n_out + n] >> (8 * (k % 4))) & 0xFFu;
}

// Four signed codes q0..q3 (k ascending) as one word.
QF_HD uint32_t int8_pack4(int32_t q0, int32_t q1, int32_t q2, int32_t q3) {
  return static_cast<uint32_t>(q0 + 128) | static_cast<uint32_t>(q1 + 128) << 8 |
         static_cast<uint32_t>(q2 + 128) << 16 | static_cast<uint32_t>(q3 + 128) << 24;
}

// ---- FP8 block scaling (Qwen / DeepSeek "weight_scale_inv") -------------------------------
// W [N, K] as F8_E4M3 codes; scale_inv [ceil(N/bn), ceil(K/bk)] is a MULTIPLIER despite its
// name: W[n][k] = e4m3(code) * scale_inv[n/bn][k/bk]. The last block row/column may be partial.

static_assert(sizeof(float) == 4, "f32 must be 32-bit IEEE");

}  // namespace qf::quant
