// Counter-based value generation for synthetic checkpoints.
//
// Element i of a tensor is a pure function of (seed, tensor name, i): SplitMix64 of a key plus
// the index, mapped to a value by integer arithmetic and one float multiply, so results are
// identical across chunkings, threads, compilers and CPUs (no libm calls).
#include <cstring>

#include "qf/error.h"
#include "qf/quant/formats.h"
#include "qf/quant/synth.h"

namespace qf::quant {
namespace {

using ckpt::DType;
using ckpt::TensorRole;

uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t tensor_key(uint64_t seed, const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ull ^ splitmix64(seed);  // FNV-1a over the name
  for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
  return splitmix64(h);
}

// Approximately N(0, 1): Irwin-Hall sum of four 16-bit uniforms, exact integer centring.
float gauss(uint64_t r) {
  const int64_t s =
      static_cast<int64_t>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48));
  return static_cast<float>(s - 131070) * (1.0f / 37837.2f);
}

float uniform01(uint64_t r) {
  return static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
}

float value_for(TensorRole role, uint64_t r) {
  switch (role) {
    case TensorRole::kNormOffset:
      return 0.05f * gauss(r);
    case TensorRole::kNormPlain:
      return 1.0f + 0.05f * gauss(r);
    case TensorRole::kBias:
      return 0.01f * gauss(r);
    case TensorRole::kConv:
      return 0.2f * gauss(r);
    case TensorRole::kALog:
      return 2.77f * uniform01(r);  // A = exp(A_log) in [1, 16)
    case TensorRole::kDtBias:
      return 0.5f * gauss(r);
    case TensorRole::kQScales: {  // signed, as AutoRound's (scale = -max|w|/8)
      const float s = 0.0075f * (1.0f + 0.25f * gauss(r));
      return (r & 1) ? -s : s;
    }
    case TensorRole::kFp8Weight:
      return 110.0f * gauss(r);
    case TensorRole::kFp8ScaleInv:
      return 1.8e-4f * (1.0f + 0.1f * gauss(r));
    default:
      return 0.02f * gauss(r);  // linear weights, embeddings
  }
}

void store(float v, DType dtype, std::byte* p) {
  switch (dtype) {
    case DType::kBF16: {
      const uint16_t h = f32_to_bf16(v);
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::kF16: {
      const uint16_t h = f32_to_f16(v);
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::kF32:
      std::memcpy(p, &v, 4);
      return;
    case DType::kF8E4M3:
      *p = static_cast<std::byte>(f32_to_e4m3fn_sat(v));
      return;
    default:
      QF_ASSERT(false, "synth: no float store for this dtype");
  }
}

}  // namespace

void synth_tensor_bytes(const ckpt::TensorDecl& decl, SynthValues values, uint64_t seed,
                        uint64_t offset, std::span<std::byte> out) {
  const uint32_t es = ckpt::dtype_size(decl.dtype);
  QF_ASSERT(es > 0 && offset % es == 0 && out.size() % es == 0, "synth: unaligned chunk");
  const uint64_t first = offset / es;
  const size_t n = out.size() / es;
  std::byte* p = out.data();
  if (decl.role == TensorRole::kQZeros) {  // symmetric 4-bit: true zero 8, stored minus one
    const uint32_t w = 0x77777777u;
    for (size_t i = 0; i < n; ++i) std::memcpy(p + i * 4, &w, 4);
    return;
  }
  if (values == SynthValues::kZeros) {
    std::memset(p, 0, out.size());
    return;
  }
  const uint64_t key = tensor_key(seed, decl.name);
  if (decl.role == TensorRole::kQWeight) {
    for (size_t i = 0; i < n; ++i) {
      const uint32_t w = static_cast<uint32_t>(splitmix64(key + first + i));
      std::memcpy(p + i * 4, &w, 4);
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    store(value_for(decl.role, splitmix64(key + first + i)), decl.dtype, p + i * es);
  }
}

}  // namespace qf::quant
