#include "qf/ckpt/dtype.h"

#include <array>

namespace qf::ckpt {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  uint32_t bits;
};

constexpr std::array<DTypeInfo, kNumDTypes> kDTypes = {{
    {DType::kBool, "BOOL", 8},
    {DType::kF4, "F4", 4},
    {DType::kF6E2M3, "F6_E2M3", 6},
    {DType::kF6E3M2, "F6_E3M2", 6},
    {DType::kU8, "U8", 8},
    {DType::kI8, "I8", 8},
    {DType::kF8E5M2, "F8_E5M2", 8},
    {DType::kF8E4M3, "F8_E4M3", 8},
    {DType::kF8E8M0, "F8_E8M0", 8},
    {DType::kF8E4M3Fnuz, "F8_E4M3FNUZ", 8},
    {DType::kF8E5M2Fnuz, "F8_E5M2FNUZ", 8},
    {DType::kI16, "I16", 16},
    {DType::kU16, "U16", 16},
    {DType::kF16, "F16", 16},
    {DType::kBF16, "BF16", 16},
    {DType::kI32, "I32", 32},
    {DType::kU32, "U32", 32},
    {DType::kF32, "F32", 32},
    {DType::kC64, "C64", 64},
    {DType::kF64, "F64", 64},
    {DType::kI64, "I64", 64},
    {DType::kU64, "U64", 64},
}};

constexpr bool table_in_order() {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (static_cast<int>(kDTypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(table_in_order(), "kDTypes must follow the DType declaration order");

}  // namespace

std::string_view dtype_name(DType dtype) {
  return kDTypes[static_cast<size_t>(dtype)].name;
}

uint32_t dtype_bits(DType dtype) {
  return kDTypes[static_cast<size_t>(dtype)].bits;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.name == name) return d.dtype;
  }
  return std::nullopt;
}

}  // namespace qf::ckpt
