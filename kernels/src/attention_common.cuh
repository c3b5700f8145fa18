// Device helpers shared by attention.cu (decode, the scalar prefill), attention_decode_mma.cu
// (decode on the tensor cores) and attention_prefill.cu (the tensor-core prefill), so that all
// make the same normed, rotated q and k bits; and the decode split kernels' common ground (their
// arguments, and the split of the context that attn_combine_kernel undoes).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "mixer_common.cuh"
#include "qf/quant/formats.h"

namespace qf::kern::attn_detail {

constexpr int kTile = 32;  // context rows per online-softmax step
constexpr int kMaxSplits = 128;

// Rows per split for a context of t rows: a multiple of kTile, at least one tile.
__device__ __forceinline__ int split_chunk(int t, int n_splits) {
  const int c = max(1, (t + n_splits - 1) / n_splits);
  return (c + kTile - 1) / kTile * kTile;
}

// The work of a split kernel's block (either kernel): token `tok` (a many-token launch's; 0 in
// decode), split `split` of the context, head block `sub` of KV head blockIdx.y, from blockIdx.x
// = (split * n_tokens + tok) * n_sub + sub. So the blocks that read the same cache rows (a
// split's head blocks and tokens) are neighbours in the launch order and run side by side: the
// rows come from DRAM once and from L2 for the others (Nsight Compute, a 122B layer's two-token
// verify at 32768 f32 rows, H100: 274 MB read from DRAM when split was fastest, now 134).
struct SplitBlock {
  int tok, split, sub;
};
__device__ __forceinline__ SplitBlock split_block(int n_tokens, int n_sub) {
  const int x = static_cast<int>(blockIdx.x), ts = x / n_sub;
  return {ts % n_tokens, ts / n_tokens, x - ts * n_sub};
}

// Context length for *pos, clamped to the cache so a bad position cannot fault.
__device__ __forceinline__ int context_len(int pos, int max_len) {
  return min(max(pos + 1, 1), max_len);
}

// The decode split kernels' arguments (attention.cu's launchers fill them).
struct AttnArgs {
  const float *q_proj, *k_proj, *v_proj, *q_norm_w, *k_norm_w, *rope;
  const int* pos;
  float* q;
  // Entries of AttnShape::kv (the kernels' Kv, by reinterpret_cast): typed float so that the f32
  // instances compile as before the bf16 cache (through void*, nvcc placed their address
  // arithmetic differently).
  float *k_cache, *v_cache;
  float* out;
  float *part_o, *part_ml;  // [Nq, n_splits, hd] unnormalized outputs; [Nq, n_splits, 2] (m, l)
  // Prefill (attn_prefill): n_tokens > 0 tokens, token t at pos[t], its q_proj row q_row floats
  // after the one before, its output out_row floats, its partials after the token before's; the
  // caches already hold every row up to pos[t] (attn_append_kernel). 0: decode.
  int n_tokens;
  size_t q_row, out_row;
};

// The caches' element types (AttnShape::kv): float, Bf16 (a bf16's bits) or Fp8 (an e4m3fn's).
// kv_round gives the value an entry holds once stored (formats.h's round to nearest even, the
// CPU twins' too; e4m3 clamped to +-448), kv_entry the entry itself, kv_f32 an entry's value
// (bf16_pair, fp8_pair: two packed entries'); kv_load2 and kv_load4 read two or four consecutive
// entries (aligned to their size), through L2 only (ld.global.cg) when kCg.
using Bf16 = uint16_t;
using Fp8 = uint8_t;
template <class Kv>
__device__ __forceinline__ float kv_round(float x) {
  if constexpr (sizeof(Kv) == 2) return quant::round_to_bf16(x);
  if constexpr (sizeof(Kv) == 1) return quant::round_to_e4m3fn_sat(x);
  return x;
}
template <class Kv>
__device__ __forceinline__ Kv kv_entry(float x) {
  if constexpr (sizeof(Kv) == 2) return quant::f32_to_bf16(x);
  if constexpr (sizeof(Kv) == 1) return quant::f32_to_e4m3fn_sat(x);
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
// Two e4m3 entries (the lower address in the low byte) by the hardware's conversion to f16 (sm_89
// and later; emulated before), exact: every e4m3 value is an f16 value.
__device__ __forceinline__ float2 fp8_pair(uint16_t w) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}
__device__ __forceinline__ float kv_f32(Fp8 x) {
  return fp8_pair(x).x;
}
template <bool kCg>
__device__ __forceinline__ float2 kv_load2(const Bf16* p) {
  const unsigned* p2 = reinterpret_cast<const unsigned*>(p);
  return bf16_pair(kCg ? __ldcg(p2) : *p2);
}
template <bool kCg>
__device__ __forceinline__ float2 kv_load2(const Fp8* p) {
  const unsigned short* p2 = reinterpret_cast<const unsigned short*>(p);
  return fp8_pair(kCg ? __ldcg(p2) : *p2);
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
template <bool kCg>
__device__ __forceinline__ float4 kv_load4(const Fp8* p) {
  const unsigned* p1 = reinterpret_cast<const unsigned*>(p);
  const unsigned w = kCg ? __ldcg(p1) : *p1;
  const float2 a = fp8_pair(static_cast<uint16_t>(w)), b = fp8_pair(static_cast<uint16_t>(w >> 16));
  return make_float4(a.x, a.y, b.x, b.y);
}

// A warp's row of kHd floats: lane holds src[lane + 32 e].
template <int kHd>
__device__ __forceinline__ void load_row_warp(const float* src, float (&x)[kHd / 32]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int e = 0; e < kHd / 32; ++e) x[e] = src[lane + 32 * e];
}

// A lane's part of the sum of squares of a warp's row (in double, as the CPU engine).
template <int kHd>
__device__ __forceinline__ double sum_sq_part(const float (&x)[kHd / 32]) {
  double ss = 0;
#pragma unroll
  for (int e = 0; e < kHd / 32; ++e) ss += static_cast<double>(x[e]) * x[e];
  return ss;
}

// Writes the zero-centred RMSNorm of a warp's row x (load_row_warp's) with the warp's sum of
// squares ss, times (1 + w), to dst, then rotates pairs (i, i + half) for i < half. One warp.
template <int kHd>
__device__ __forceinline__ void scale_rope_row(const float (&x)[kHd / 32], double ss,
                                               const float* w, float eps, int half,
                                               const float* cos_s, const float* sin_s, float* dst) {
  constexpr int kE = kHd / 32;
  const int lane = threadIdx.x & 31;
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

// Writes the zero-centred RMSNorm of src (hd floats) times (1 + w) to dst, then rotates pairs
// (i, i + half) for i < half. One warp.
template <int kHd>
__device__ __forceinline__ void norm_rope_warp(const float* src, const float* w, float eps,
                                               int half, const float* cos_s, const float* sin_s,
                                               float* dst) {
  constexpr int kE = kHd / 32;
  const int lane = threadIdx.x & 31;
  float x[kE];
  double ss = 0;
#pragma unroll
  for (int e = 0; e < kE; ++e) {  // each load's square as it lands (load_row_warp issues all)
    x[e] = src[lane + 32 * e];
    ss += static_cast<double>(x[e]) * x[e];
  }
  scale_rope_row<kHd>(x, mixer::warp_sum(ss), w, eps, half, cos_s, sin_s, dst);
}

}  // namespace qf::kern::attn_detail
