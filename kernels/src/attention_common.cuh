// Device helpers shared by attention.cu (decode, the scalar prefill) and attention_prefill.cu
// (the tensor-core prefill), so that both make the same normed, rotated q and k bits.
#pragma once

#include <cuda_runtime.h>

#include "mixer_common.cuh"

namespace qf::kern::attn_detail {

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
