// safetensors element types: the one table of dtype strings and bit sizes.
//
// Declared in the reference crate's order (safetensors/src/tensor.rs `enum Dtype`), which is
// increasing alignment: the writer sorts by descending enum value, then by name, so every
// tensor lands naturally aligned in an 8-aligned data section.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace qf::ckpt {

enum class DType : uint8_t {
  kBool,
  kF4,      // MX FP4 (E2M1), two per byte
  kF6E2M3,  // MX FP6
  kF6E3M2,  // MX FP6
  kU8,
  kI8,
  kF8E5M2,      // IEEE-like FP8 with inf
  kF8E4M3,      // E4M3FN: bias 7, max 448, NaN 0x7F/0xFF, no inf (torch float8_e4m3fn)
  kF8E8M0,      // exponent-only MX scale
  kF8E4M3Fnuz,  // AMD variant: bias 8, NaN 0x80; not the same bits as kF8E4M3
  kF8E5M2Fnuz,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kC64,  // complex of two F32
  kF64,
  kI64,
  kU64,
};
inline constexpr int kNumDTypes = static_cast<int>(DType::kU64) + 1;

// The exact header string ("F8_E4M3", "BF16", ...).
std::string_view dtype_name(DType dtype);
// Size of one element in bits (4 for F4, 6 for F6_*, 8..64 otherwise).
uint32_t dtype_bits(DType dtype);
// nullopt for strings outside the list (case-sensitive, as the reference reader).
std::optional<DType> dtype_from_name(std::string_view name);

// Bytes per element for byte-sized types; 0 for the sub-byte F4/F6 types.
inline uint32_t dtype_size(DType dtype) {
  const uint32_t bits = dtype_bits(dtype);
  return bits % 8 == 0 ? bits / 8 : 0;
}

}  // namespace qf::ckpt
