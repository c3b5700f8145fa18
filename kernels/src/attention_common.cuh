// Device helpers shared by attention.cu (decode, the scalar prefill) and attention_prefill.cu
// (the tensor-core prefill), so that both make the same normed, rotated q and k bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "mixer_common.cuh"
#include "qf/quant/formats.h"

namespace qf::kern::attn_detail {

// The caches' element types (AttnShape::kv): float, or Bf16 (a bf16's bits). kv_round gives the
// value an entry holds once stored (formats.h's round to nearest even, the CPU twins' too),
// kv_entry the entry itself, kv_f32 an entry's value (bf16_pair: two packed Bf16 entries');
// kv_load4 reads four consecutive entries (16-byte or 8-byte aligned), through L2 only
// (ld.global.cg) when kCg.
using Bf16 = uint16_t;
template <class Kv>
__device__ __forceinline__ float kv_round(float x) {
  if constexpr (sizeof(Kv) == 2) return quant::round_to_bf16(x);
  return x;
}
template <class Kv>
__device__ __forceinline__ Kv kv_entry(float x) {
  if constexpr (sizeof(Kv) == 2) return quant::f32_to_bf16(x);
  return x;
}
__device__ __forceinline__ float kv_f32(float x) {
  return x;
}
__device__ __forceinline__ float kv_f32(Bf16 x) {
  return quant::bf16_to_f32(x);
}
__device__ __forceinline__ float2 bf16_pair(uint32_t w) {  // the lower address in the low half
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
}
template <bool kCg>
__device__ __forceinline__ float4 kv_load4(const float* p) {
  const float4* p4 = reinterpret_cast<const float4*>(p);
  return kCg ? __ldcg(p4) : *p4;
}
template <bool kCg>
__device__ __forceinline__ float4 kv_load4(const Bf16* p) {
  const uint2* p2 = reinterpret_cast<const uint2*>(p);
  const uint2 w = kCg ? __ldcg(p2) : *p2;
  const float2 a = bf16_pair(w.x), b = bf16_pair(w.y);
  return make_float4(a.x, a.y, b.x, b.y);
}

// Writes the zero-centred RMSNorm of src (hd floats; sum of squares in double, as the CPU
// engine) times (1 + w) to dst, then rotates pairs (i, i + half) for i < half. One warp.
template <int kHd>
__device__ __forceinline__ void norm_rope_warp(const float* src, const float* w, float eps,
                                               int half, const float* cos_s, const float* sin_s,
                                               float* dst) {
  constexpr int kE = kHd / 32;
  const int lane = threadIdx.x & 31;
  float x[kE];
  double ss = 0;
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    x[e] = src[lane + 32 * e];
    ss += static_cast<double>(x[e]) * x[e];
  }
  ss = mixer::warp_sum(ss);
  const float inv = 1.0f / sqrtf(static_cast<float>(ss) / static_cast<float>(kHd) + eps);
#pragma unroll
  for (int e = 0; e < kE; ++e) dst[lane + 32 * e] = x[e] * inv * (1.0f + w[lane + 32 * e]);
  __syncwarp();
  // Unfused products so the rounding is the CPU engine's; a lane rewrites only its own pairs.
  for (int i = lane; i < half; i += 32) {
    const float a = dst[i], b = dst[i + half];
    dst[i] = __fsub_rn(__fmul_rn(a, cos_s[i]), __fmul_rn(b, sin_s[i]));
    dst[i + half] = __fadd_rn(__fmul_rn(b, cos_s[i]), __fmul_rn(a, sin_s[i]));
  }
  __syncwarp();
}

}  // namespace qf::kern::attn_detail
