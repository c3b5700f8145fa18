// Pieces shared by the gemv kernels (gemv.cu: every format; gemv_int4.cu: the INT4 tensor-core
// kernel): block shape, the expert lookup and the streaming load. Internal to kernels/src.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "qf/kern/gemv.h"

namespace qf::kern::gemv_detail {

constexpr int kWarps = 8;  // warps per block (every gemv kernel)
constexpr int kThreads = kWarps * 32;
// x in shared memory: at most 4.5 K bytes <= 48 KiB (gemv.cu: no opt-in; the INT4 kernel adds
// its 24 KiB of rings and its partial sums, past 48 KiB by the opt-in).
constexpr int kMaxSmemK = 10240;

// One expert's arrays, resolved from ids on the device.
struct Mat {
  const char* w;
  const __half* scales;
  const uint8_t* zeros;
  const float* block_scale;
};

// Bytes of one stored weight element of w.w (int4/int8: the u32 words).
__host__ __device__ constexpr size_t w_elem_bytes(WeightKind k) {
  return k == WeightKind::kBf16 ? 2 : k == WeightKind::kFp8 ? 1 : 4;
}

// through_l2: ids loaded with ld.global.cg (an early load, pdl.cuh (b)), not the read-only path.
__device__ __forceinline__ Mat expert(const DeviceLinear& w, const GemvBatch& b, int slot,
                                      bool through_l2 = false) {
  const int id = !b.ids ? slot : through_l2 ? __ldcg(b.ids + slot) : __ldg(b.ids + slot);
  const size_t e = static_cast<size_t>(id);
  Mat m;
  m.w = static_cast<const char*>(w.w) + e * w.w_stride * w_elem_bytes(w.kind);
  m.scales = w.scales ? w.scales + e * w.scale_stride : nullptr;
  m.zeros = w.zeros ? w.zeros + e * w.zero_stride : nullptr;
  m.block_scale = w.block_scale ? w.block_scale + e * w.block_scale_stride : nullptr;
  return m;
}

// Streaming 16-byte load: read once, keep it out of L1 so x and the scales stay there.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

__device__ __forceinline__ float f16_bits_to_f32(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}

// Two E4M3 codes (low byte first) as exact f16x2 (the first in the low half; cvt.rn.f16x2.e4m3x2:
// sm_89 and later, sm_90 and sm_121 alike), and as exact f32 values (e4m3 -> f16 -> f32).
__device__ __forceinline__ uint32_t e4m3x2_f16x2(uint32_t pair) {
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(static_cast<unsigned short>(pair)));
  return h2;
}
__device__ __forceinline__ float2 e4m3x2(uint32_t pair) {
  const uint32_t h2 = e4m3x2_f16x2(pair);
  return make_float2(f16_bits_to_f32(h2 & 0xFFFFu), f16_bits_to_f32(h2 >> 16));
}

// x in shared memory as float4s with one float4 of padding after every 8 (128 bytes): float4 l
// lives at l + l / 8. Lanes read consecutive chunks of P = 1, 2, 4 or 8 float4s; with the padding
// the 8 lanes of a quarter-warp hit 8 different 16-byte bank groups (P = 8: 9v + i; P = 4:
// 4v + v/2 + i; ...), a chunk never straddles a pad (P divides 8), so chunk v's float4 i is at
// x_pos(v * P) + i, and chunk v + 32u at x_pos(v * P) + 36 u P: immediate offsets.
__host__ __device__ constexpr int x_pos(int l) {
  return l + (l >> 3);
}
__host__ __device__ constexpr size_t x_smem_bytes(int k) {
  return sizeof(float4) * x_pos(k / 4);
}

// Sums of kR rows spread over the lanes -> lane l returns the whole sum of row l / (32 / kR)
// (gemv.cu, lm_head.cu). Every row is summed by the same butterfly tree, so equal inputs give
// equal bits wherever they sit.
// Transposed: each offset-16, 8, ... step halves the rows a lane carries (log2 kR steps of kR/2,
// kR/4, ... shuffles), then a plain butterfly finishes within groups of 32 / kR lanes.
template <int kR>
__device__ __forceinline__ float reduce_rows(float (&s)[kR], int lane) {
#pragma unroll
  for (int half = kR / 2, off = 16; half >= 1; half /= 2, off /= 2) {
    const bool hi = lane & off;
#pragma unroll
    for (int i = 0; i < half; ++i) {
      const float keep = hi ? s[i + half] : s[i], send = hi ? s[i] : s[i + half];
      s[i] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, off);
    }
  }
#pragma unroll
  for (int off = 16 / kR; off >= 1; off /= 2) s[0] += __shfl_xor_sync(0xFFFFFFFFu, s[0], off);
  return s[0];
}

// INT4 through the tensor-core kernel (gemv_int4.cu): whether it takes `w` (K a multiple of 128
// and at most kMaxSmemK, 16-byte aligned rows and experts, groups a power-of-two multiple of 128
// columns or one group per row), and its launch.
bool int4_mma_ok(const DeviceLinear& w, const GemvBatch& b);
// swiglu: w in the paired row order (gemv.h), y = silu(gate) * up (n / 2 per slot). shared: the
// FP8 shared expert's product in extra blocks of the same launch (moe_shared.cuh, gemv_moe).
struct SharedArgs;
cudaError_t launch_int4_mma(const DeviceLinear& w, const float* x, float* y, const GemvBatch& b,
                            cudaStream_t stream, bool swiglu = false,
                            const SharedArgs* shared = nullptr);

}  // namespace qf::kern::gemv_detail
