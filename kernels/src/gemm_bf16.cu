// BF16 products of many rows of x (gemm.h, dense or grouped) on the bf16 tensor cores: what the
// prefill ran as one GEMV slot per token (the router, the MTP head's fc, attention projections
// and 256 experts, every product of a BF16 checkpoint), each slot reading the whole matrix. Two
// launches:
//   1. every row of x, per 64-column segment, split into three bf16 limbs, hi = bf16(x), mid =
//      bf16(x - hi), lo = bf16(x - hi - mid) (each difference exact in f32): hi + mid + lo holds
//      x to 2^-24 of |x|, f32's own precision (bf16's 8 bits three times; x below ~2^-110 loses
//      lo to subnormals). Two limbs (2^-16) took the r4 fixture's prefill logits to 5.9e-4 x
//      max |logit| from the CPU reference's (rt_cuda_golden_test's bound: 5e-4). Columns past K
//      are zeros. Scratch: [row][segment][hi | mid | lo][64] bf16.
//   2. a block of 8 warps per 128 weight rows of a matrix (a warp per tile of 16) and pass of
//      kPass entries streams the segments through kStages shared-memory stages by cp.async (the
//      tiles' rows, 128 bytes each, and the pass's limbs; chunks of a row past K read as zeros).
//      Lane (g, t) reads the 16 columns 16t .. 16t + 15 of rows g and g + 8 and of its entry's
//      limbs; k step j of the segment's four takes columns 16t + 4j .. + 3 as the MMA's logical k
//      2t, 2t + 1, 2t + 8, 2t + 9 in both operands (the same permutation, so the sum is over the
//      segment's columns), so no shuffle is needed. mma.sync.m16n8k16 bf16 x bf16 -> f32, 8
//      entries a group, the three limbs into one accumulator across the whole row.
// The products of weights and limbs are exact in f32; the tensor cores sum 16 of them at a time
// into the accumulator. Results differ from gemv's (an f32 fma per weight on the CUDA cores) by
// the summation order: gemm_test bounds them against the exact sums. Inf or NaN in x gives NaN
// (mid = Inf - Inf). Grouped: blockIdx.y is the matrix, its entries between its offsets; the
// passes of a tile range run in blocks adjacent in launch order, so they read the weights from
// DRAM about once. Shared memory is swizzled (16-byte chunk c of a row or entry at c ^ its
// parity) so that a quarter warp's loads of two rows land in different banks.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "cp_async.cuh"
#include "gemm_bf16.h"
#include "gemm_entries.cuh"
#include "gemv_common.cuh"
#include "mma_f16.cuh"

namespace qf::kern::gemv_detail {
namespace {

constexpr int kSeg = 64;            // columns per segment: a weight row's 128 bytes
constexpr int kChunks = kSeg / 8;   // 16-byte chunks of a segment's row
constexpr int kGroups = 4;          // groups of 8 entries (the MMA's N) per pass
constexpr int kPass = 8 * kGroups;  // entries per pass
constexpr int kStages = 3;          // segments in shared memory (2 in flight)
constexpr int kWChunks = kWarps * 16 * kChunks / kThreads;     // weight chunks a thread stages
constexpr int kLimbs = 3;                                      // bf16 limbs of x
constexpr int kXChunks = kPass * kLimbs * kChunks / kThreads;  // limb chunks a thread stages
static_assert(kWChunks * kThreads == kWarps * 16 * kChunks &&
              kXChunks * kThreads == kPass * kLimbs * kChunks);

// One segment of a block's work: its tiles' rows [tile][row][chunk] and the pass's limbs
// [entry][hi | mid | lo][chunk], both swizzled.
struct Stage {
  uint4 w[kWarps][16][kChunks];
  uint4 x[kPass][kLimbs][kChunks];
};

__device__ __forceinline__ int swz(int row, int c) {
  return c ^ (row & 1);
}

__device__ __forceinline__ void words(const uint4& a, const uint4& b, uint32_t (&out)[8]) {
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
  out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}

// Warp (row, segment) of x: lane l's columns 2l, 2l + 1 (K is a multiple of 8: both or neither
// past K).
__global__ void __launch_bounds__(kThreads)
    bf16_stage_kernel(const float* __restrict__ x, size_t ldx, int k, int segs, int x_count,
                      __nv_bfloat162* __restrict__ limbs) {
  const int wi = static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x >> 5);
  const int row = wi / segs, s = wi - row * segs, lane = threadIdx.x & 31;
  if (row >= x_count) return;
  const int col = s * kSeg + 2 * lane;
  float2 v = {0.0f, 0.0f};
  if (col < k) {
    const float* xr = x + static_cast<size_t>(row) * ldx + col;
    v = {__ldg(xr), __ldg(xr + 1)};
  }
  __nv_bfloat162* out = limbs + (static_cast<size_t>(row) * segs + s) * (kLimbs * kSeg / 2);
  uint32_t w[kLimbs];
  bf16_limbs3(v.x, v.y, w);
#pragma unroll
  for (int i = 0; i < kLimbs; ++i)
    out[32 * i + lane] = *reinterpret_cast<const __nv_bfloat162*>(&w[i]);
}

struct Bf16Args {
  int tiles;        // of 16 rows per matrix
  int segs;         // ceil(k / kSeg)
  int pass_blocks;  // blocks sharing a tile range's passes (adjacent in blockIdx.x)
};

__global__ void __launch_bounds__(kThreads, 2)
    gemm_bf16_kernel(const DeviceLinear w, const uint4* __restrict__ limbs, float* __restrict__ y,
                     const GemmRows r, const Bf16Args a) {
  extern __shared__ uint4 smem[];
  Stage* stage = reinterpret_cast<Stage*>(smem);
  const int mat = blockIdx.y;
  const EntryRange range = matrix_entries(r, mat);
  const int lo = range.lo, hi = range.hi;
  const int pz = static_cast<int>(blockIdx.x) % a.pass_blocks;
  const int tb = static_cast<int>(blockIdx.x) / a.pass_blocks;
  if (lo + pz * kPass >= hi) return;  // the whole block
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int S = a.segs, n = w.n, row_chunks = w.k / 8;
  const int tile = tb * kWarps + warp;  // past the last: loads clamped, nothing written
  const uint4* w4 = reinterpret_cast<const uint4*>(static_cast<const char*>(w.w) +
                                                   static_cast<size_t>(mat) * w.w_stride * 2);
  // Staging: thread tid copies chunks tid + kThreads i of the rows (tile, row, chunk) and of the
  // limbs (entry, limb, chunk): its chunk c is tid's low bits either way.
  const int c = tid % kChunks;
  uint32_t woff[kWChunks];  // uint4 from w4, rows past n clamped to the last
#pragma unroll
  for (int i = 0; i < kWChunks; ++i) {
    const int j = tid + kThreads * i, row = (j / kChunks) % 16, wt = j / (16 * kChunks);
    const int rg = min((tb * kWarps + wt) * 16 + row, n - 1);
    woff[i] = static_cast<uint32_t>(rg) * static_cast<uint32_t>(row_chunks) + c;
  }

  for (int base = lo + pz * kPass; base < hi; base += a.pass_blocks * kPass) {
    uint32_t xoff[kXChunks];  // uint4 from limbs (~0u: zeros, past the entries)
#pragma unroll
    for (int i = 0; i < kXChunks; ++i) {
      const int j = tid + kThreads * i, limb = (j / kChunks) % kLimbs;
      const int e = base + j / (kLimbs * kChunks);
      const int xr = e < hi ? (r.x_rows ? __ldg(r.x_rows + e) : e) : -1;
      xoff[i] =
          xr < 0 ? ~0u : static_cast<uint32_t>((xr * S) * kLimbs * kChunks + limb * kChunks + c);
    }
    const auto fill = [&](int s, int buf) {
      if (s < S) {
        Stage& st = stage[buf];
        const bool in = s * kChunks + c < row_chunks;
#pragma unroll
        for (int i = 0; i < kWChunks; ++i) {
          const int j = tid + kThreads * i, row = (j / kChunks) % 16;
          cp_async16(&st.w[j / (16 * kChunks)][row][swz(row, c)],
                     w4 + woff[i] + (in ? s * kChunks : 0), in ? 16 : 0);
        }
#pragma unroll
        for (int i = 0; i < kXChunks; ++i) {
          const int j = tid + kThreads * i, en = j / (kLimbs * kChunks);
          const bool x_in = xoff[i] != ~0u;
          cp_async16(&st.x[en][(j / kChunks) % kLimbs][swz(en, c)],
                     limbs + (x_in ? xoff[i] + s * kLimbs * kChunks : 0u), x_in ? 16 : 0);
        }
      }
      cp_async_commit();
    };
    float acc[kGroups][4];
#pragma unroll
    for (int q = 0; q < kGroups; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.0f;
    const int groups = min(kGroups, (hi - base + 7) / 8);  // the same for the block
    pipeline<kStages>(S, fill, [&](int, int buf) {
      const Stage& st = stage[buf];
      uint32_t ra[8], rb[8];  // rows g and g + 8 (the same parity), columns 16t .. 16t + 15
      words(st.w[warp][g][swz(g, 2 * t)], st.w[warp][g][swz(g, 2 * t + 1)], ra);
      words(st.w[warp][g + 8][swz(g, 2 * t)], st.w[warp][g + 8][swz(g, 2 * t + 1)], rb);
#pragma unroll
      for (int q = 0; q < kGroups; ++q) {
        if (q < groups) {
          const int en = 8 * q + g;
#pragma unroll
          for (int l = 0; l < kLimbs; ++l) {
            uint32_t xb[8];
            words(st.x[en][l][swz(en, 2 * t)], st.x[en][l][swz(en, 2 * t + 1)], xb);
#pragma unroll
            for (int j = 0; j < 4; ++j) {  // k step j: columns 16t + 4j .. + 3, words 2j, 2j + 1
              const uint32_t a[4] = {ra[2 * j], rb[2 * j], ra[2 * j + 1], rb[2 * j + 1]};
              mma_bf16(acc[q], a, xb[2 * j], xb[2 * j + 1]);
            }
          }
        }
      }
    });
    if (tile >= a.tiles) continue;
#pragma unroll
    for (int q = 0; q < kGroups; ++q) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // accumulator i: row g (+ 8 for i >= 2), entry 2t (+ 1)
        const int e = base + 8 * q + 2 * t + (i & 1), row = tile * 16 + g + 8 * (i >> 1);
        if (e >= hi || row >= n) continue;
        y[static_cast<size_t>(r.y_rows ? __ldg(r.y_rows + e) : e) * r.ldy + row] = acc[q][i];
      }
    }
  }
}

}  // namespace

bool gemm_bf16_ok(const DeviceLinear& w) {
  return w.kind == WeightKind::kBf16 && w.n > 0 && w.k > 0 && w.k % 8 == 0 &&
         reinterpret_cast<uintptr_t>(w.w) % 16 == 0 && w.w_stride % 8 == 0 &&
         static_cast<int64_t>(w.n) * (w.k / 8) < (int64_t{1} << 32);  // 32-bit chunk offsets
}

size_t gemm_bf16_scratch_bytes(const DeviceLinear& w, const GemmRows& r) {
  return static_cast<size_t>(r.x_count) * ((w.k + kSeg - 1) / kSeg) * kLimbs * kSeg *
         sizeof(__nv_bfloat16);
}

cudaError_t gemm_bf16(const DeviceLinear& w, const float* x, float* y, const GemmRows& r,
                      void* scratch, cudaStream_t stream) {
  if (!gemm_bf16_ok(w)) return cudaErrorNotSupported;
  const int segs = (w.k + kSeg - 1) / kSeg;
  // The kernel addresses a row's staged segments (kLimbs kChunks uint4 each) by 32-bit offsets.
  if (static_cast<uint64_t>(r.x_count) * segs * kLimbs * kChunks >= (uint64_t{1} << 32)) {
    return cudaErrorInvalidValue;
  }
  auto* limbs = static_cast<__nv_bfloat162*>(scratch);
  const size_t stage_warps = static_cast<size_t>(r.x_count) * segs;
  bf16_stage_kernel<<<static_cast<unsigned>((stage_warps + kWarps - 1) / kWarps), kThreads, 0,
                      stream>>>(x, r.ldx, w.k, segs, r.x_count, limbs);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  Bf16Args a;
  a.tiles = (w.n + 15) / 16;
  a.segs = segs;
  a.pass_blocks = pass_blocks(r, kPass);
  constexpr int smem = kStages * sizeof(Stage);
  e = cudaFuncSetAttribute(gemm_bf16_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>((a.tiles + kWarps - 1) / kWarps * a.pass_blocks),
                  static_cast<unsigned>(r.n_mats));
  gemm_bf16_kernel<<<grid, kThreads, smem, stream>>>(w, reinterpret_cast<const uint4*>(limbs), y, r,
                                                     a);
  return cudaGetLastError();
}

}  // namespace qf::kern::gemv_detail
