// FP8 (E4M3, block-scaled) products of many rows of x (gemm.h, dense) on the f16 tensor cores:
// the prefill's shared expert, which ran as one GEMV slot per token (each slot converting every
// weight again). Two launches:
//   1. every row of x, per 128-column segment, scaled by the power of two 2^-e that takes its
//      largest |x| below 1 (e clamped to [-100, 127]) and split into two f16 limbs, hi =
//      f16(x') and lo = f16(x' - hi) (x' = x 2^-e): hi + lo holds x' to 2^-23 of the segment's
//      scale (f16's 11 bits twice; below 2^-14 lo's subnormals, 2^-25). Scratch: the limbs
//      [row][segment][hi | lo][128] f16, then the scales 2^e [row][segment] f32.
//   2. a block of 8 warps per 128 weight rows (a warp per tile of 16) and pass of kPass entries
//      streams the segments through kStages shared-memory stages by cp.async (the tiles' codes,
//      16 rows x 128 bytes each, the pass's limbs and scales). Per 16 columns, a lane's A
//      fragment comes from one 32-bit word of 4 codes per row (cvt.rn.f16x2.e4m3x2: e4m3 -> f16
//      is exact): the MMA's k order within each 16 columns is permuted (logical k 2t, 2t+1 = the
//      word's first two columns, 2t+8, 2t+9 its last two) and the B fragments (the entries' limbs)
//      follow it, so no shuffle is needed. mma.sync.m16n8k16 f16 x f16 -> f32, 8 entries a group,
//      hi and lo into one accumulator; per segment the sums are scaled by the rows' block scale
//      times the entry's 2^e and added in column order.
// The products of codes and limbs are exact in f32; the tensor cores sum 16 of them at a time.
// Results differ from gemv's (which rounds every scaled weight and sums in f32 on the CUDA
// cores) by x's split and the summation order: gemm_test bounds them against the exact sums.
// Shared memory is swizzled (16-byte chunks XOR'd by the row's parity) so that a quarter warp's
// 16-byte loads of two rows land in different banks.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "cp_async.cuh"
#include "gemm_entries.cuh"
#include "gemm_fp8.h"
#include "gemv_common.cuh"
#include "mma_f16.cuh"

namespace qf::kern::gemv_detail {
namespace {

constexpr int kGroups = 4;          // groups of 8 entries (the MMA's N) per pass
constexpr int kPass = 8 * kGroups;  // entries per pass
constexpr int kStages = 3;          // segments in shared memory (2 in flight)

// One segment of a block's work: codes [tile][row][128 bytes], limbs [entry][hi | lo][128 f16]
// (both swizzled), and the entries' scales.
struct Stage {
  uint4 w[kWarps][16][8];
  uint4 x[kPass][2][16];
  float scale[kPass];
};

__device__ __forceinline__ int wchunk(int row, int c) {
  return c ^ ((row & 1) << 2);
}
__device__ __forceinline__ int xchunk(int entry, int c) {
  return c ^ (entry & 1);
}

// Warp (row, segment) of x: lane l's columns 4l .. 4l + 3.
__global__ void __launch_bounds__(kThreads)
    fp8_stage_kernel(const float* __restrict__ x, size_t ldx, int k, int x_count,
                     __half* __restrict__ limbs, float* __restrict__ scales) {
  const int segs = k / 128;
  const int wi = static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x >> 5);
  const int row = wi / segs, s = wi - row * segs, lane = threadIdx.x & 31;
  if (row >= x_count) return;
  const float* xr = x + static_cast<size_t>(row) * ldx + s * 128 + 4 * lane;
  const float v[4] = {__ldg(xr), __ldg(xr + 1), __ldg(xr + 2), __ldg(xr + 3)};
  uint32_t mx = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) mx = max(mx, __float_as_uint(v[i]) & 0x7FFFFFFFu);
  mx = __reduce_max_sync(0xFFFFFFFFu, mx);
  const int e = min(max(static_cast<int>(mx >> 23) - 126, -100), 127);  // max |x| < 2^e (or 2)
  __half* out = limbs + (static_cast<size_t>(row) * segs + s) * 256 + 4 * lane;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float xs = scalbnf(v[i], -e);
    const __half hi = __float2half_rn(xs);
    out[i] = hi;
    out[128 + i] = __float2half_rn(xs - __half2float(hi));
  }
  if (lane == 0) {
    scales[static_cast<size_t>(row) * segs + s] =
        mx < 0x7F800000u ? scalbnf(1.0f, e) : __uint_as_float(0x7FC00000u);
  }
}

struct Fp8Args {
  int tiles, segs, pass_blocks;
  int cb;  // block scales per row of blocks: k / 128 (= segs; folding it in changed sm_90 code)
};

__global__ void __launch_bounds__(kThreads, 2)
    gemm_fp8_kernel(const DeviceLinear w, const uint4* __restrict__ limbs,
                    const float* __restrict__ scales, float* __restrict__ y, const GemmRows r,
                    const Fp8Args a) {
  extern __shared__ uint4 smem[];
  Stage* stage = reinterpret_cast<Stage*>(smem);
  const int pz = static_cast<int>(blockIdx.x) % a.pass_blocks;
  const int tb = static_cast<int>(blockIdx.x) / a.pass_blocks;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int S = a.segs, k = w.k;
  const int tile = min(tb * kWarps + warp, a.tiles - 1);  // past the last: recomputed, not written
  const uint8_t* w8 = static_cast<const uint8_t*>(w.w);
  const float* bs = w.block_scale + static_cast<size_t>(tile * 16 / 128) * a.cb;

  for (int base = pz * kPass; base < r.entries; base += a.pass_blocks * kPass) {
    // Staging: thread tid copies chunks tid + 256 i (i < 4) of the codes (tile, row, chunk) and
    // of the limbs (entry, limb, chunk), from offsets fixed for the pass (32-bit: fewer
    // registers through the MMAs); 8 threads copy the scales.
    uint32_t woff[4], xoff[4];  // codes: bytes from w8; limbs: uint4 from limbs (~0u: zeros)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int j = tid + kThreads * i, wt = j >> 7, row = (j >> 3) & 15, c = j & 7;
      woff[i] = static_cast<uint32_t>((min(tb * kWarps + wt, a.tiles - 1) * 16 + row) * k + c * 16);
      const int en = j >> 5, limb = (j >> 4) & 1, xc = j & 15, e = base + en;
      const int xr = e < r.entries ? (r.x_rows ? __ldg(r.x_rows + e) : e) : -1;
      xoff[i] = xr < 0 ? ~0u : static_cast<uint32_t>(xr * S * 32 + limb * 16 + xc);
    }
    const auto fill = [&](int s, int buf) {
      if (s < S) {
        Stage& st = stage[buf];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = tid + kThreads * i;
          cp_async16(&st.w[j >> 7][(j >> 3) & 15][wchunk((j >> 3) & 15, j & 7)],
                     w8 + woff[i] + s * 128);
          const int en = j >> 5;
          cp_async16(&st.x[en][(j >> 4) & 1][xchunk(en, j & 15)],
                     limbs + (xoff[i] == ~0u ? 0u : xoff[i] + s * 32), xoff[i] == ~0u ? 0 : 16);
        }
        if (tid < kPass / 4) {
          // Four scales a thread; rows of x need not be consecutive: one at a time.
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int e = base + 4 * tid + i;
            const int xr = e < r.entries ? (r.x_rows ? __ldg(r.x_rows + e) : e) : 0;
            const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(&st.scale[4 * tid + i]));
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d),
                         "l"(scales + static_cast<size_t>(xr) * S + s), "r"(e < r.entries ? 4 : 0)
                         : "memory");
          }
        }
      }
      cp_async_commit();
    };
    float acc[kGroups][4];
#pragma unroll
    for (int q = 0; q < kGroups; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.0f;
    const int groups = min(kGroups, (r.entries - base + 7) / 8);  // the same for the block
    pipeline<kStages>(S, fill, [&](int s, int buf) {
      const Stage& st = stage[buf];
      const float b = __ldg(bs + s);
      float d[kGroups][4];
#pragma unroll
      for (int q = 0; q < kGroups; ++q) d[q][0] = d[q][1] = d[q][2] = d[q][3] = 0.0f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // columns 64 h ..: lane t's 16 of them per row
        const uint4 ra = st.w[warp][g][wchunk(g, 4 * h + t)];
        const uint4 rb = st.w[warp][g + 8][wchunk(g + 8, 4 * h + t)];
        const uint32_t wa[4] = {ra.x, ra.y, ra.z, ra.w}, wb[4] = {rb.x, rb.y, rb.z, rb.w};
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {  // 8 columns of the lane's 16: two k steps
          uint32_t af[2][4];              // the A fragments of both
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int wi = 2 * jj + j;
            af[j][0] = e4m3x2_f16x2(wa[wi] & 0xFFFFu);
            af[j][1] = e4m3x2_f16x2(wb[wi] & 0xFFFFu);
            af[j][2] = e4m3x2_f16x2(wa[wi] >> 16);
            af[j][3] = e4m3x2_f16x2(wb[wi] >> 16);
          }
#pragma unroll
          for (int q = 0; q < kGroups; ++q) {
            if (q < groups) {
              const int en = 8 * q + g, c = xchunk(en, 8 * h + 2 * t + jj);
              const uint4 hi = st.x[en][0][c], lo = st.x[en][1][c];
              mma_f16(d[q], af[0], hi.x, hi.y);
              mma_f16(d[q], af[0], lo.x, lo.y);
              mma_f16(d[q], af[1], hi.z, hi.w);
              mma_f16(d[q], af[1], lo.z, lo.w);
            }
          }
        }
      }
#pragma unroll
      for (int q = 0; q < kGroups; ++q) {
        if (q < groups) {
          const float f0 = b * st.scale[8 * q + 2 * t], f1 = b * st.scale[8 * q + 2 * t + 1];
          acc[q][0] = fmaf(d[q][0], f0, acc[q][0]);
          acc[q][1] = fmaf(d[q][1], f1, acc[q][1]);
          acc[q][2] = fmaf(d[q][2], f0, acc[q][2]);
          acc[q][3] = fmaf(d[q][3], f1, acc[q][3]);
        }
      }
    });
    if (tb * kWarps + warp >= a.tiles) continue;
#pragma unroll
    for (int q = 0; q < kGroups; ++q) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int e = base + 8 * q + 2 * t + (c & 1);
        if (e >= r.entries) continue;
        const int row = tile * 16 + g + 8 * (c >> 1);
        float* ye = y + static_cast<size_t>(r.y_rows ? __ldg(r.y_rows + e) : e) * r.ldy;
        ye[row] = acc[q][c];
      }
    }
  }
}

}  // namespace

bool gemm_fp8_ok(const DeviceLinear& w) {
  return w.kind == WeightKind::kFp8 && w.k % 128 == 0 && w.n % 16 == 0 && w.block == 128 &&
         reinterpret_cast<uintptr_t>(w.w) % 16 == 0 &&
         static_cast<int64_t>(w.n) * w.k < (int64_t{1} << 31);  // 32-bit code offsets
}

size_t gemm_fp8_scratch_bytes(const DeviceLinear& w, const GemmRows& r) {
  return static_cast<size_t>(r.x_count) * (w.k / 128) * (256 * sizeof(__half) + sizeof(float));
}

cudaError_t gemm_fp8(const DeviceLinear& w, const float* x, float* y, const GemmRows& r,
                     void* scratch, cudaStream_t stream) {
  if (!gemm_fp8_ok(w) || r.offsets != nullptr) return cudaErrorNotSupported;
  const int segs = w.k / 128;
  auto* limbs = static_cast<__half*>(scratch);
  auto* scales = reinterpret_cast<float*>(limbs + static_cast<size_t>(r.x_count) * segs * 256);
  const size_t stage_warps = static_cast<size_t>(r.x_count) * segs;
  fp8_stage_kernel<<<static_cast<unsigned>((stage_warps + kWarps - 1) / kWarps), kThreads, 0,
                     stream>>>(x, r.ldx, w.k, r.x_count, limbs, scales);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  Fp8Args a;
  a.tiles = w.n / 16;
  a.segs = segs;
  a.cb = segs;
  a.pass_blocks = pass_blocks(r, kPass);  // dense
  constexpr int smem = kStages * sizeof(Stage);
  e = cudaFuncSetAttribute(gemm_fp8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  const unsigned blocks = static_cast<unsigned>((a.tiles + kWarps - 1) / kWarps * a.pass_blocks);
  gemm_fp8_kernel<<<blocks, kThreads, smem, stream>>>(w, reinterpret_cast<const uint4*>(limbs),
                                                      scales, y, r, a);
  return cudaGetLastError();
}

}  // namespace qf::kern::gemv_detail
