// The INT4 tensor-core products' shared pieces (gemv_int4.cu: one x, gemm_int4.cu: many rows):
// x's segments as 8-bit limbs and their SegStats, the u8 x s8 MMA and the group scale and zero
// loads. gemv_int4.cu's file comment states the numerics. Internal to kernels/src.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cp_async.cuh"
#include "gemv_common.cuh"
#include "qf/kern/gemm.h"

namespace qf::kern::gemv_detail {

constexpr int kSegCols = 128;              // columns of a layout segment (gemv.h)
constexpr int kSegChunks = kSegCols / 32;  // 16-byte chunks of a row per segment (4)
constexpr uint32_t kLowNibbles = 0x0F0F0F0Fu;

// x's limbs (the GEMV's shared memory, the GEMM's scratch): per 32-column block kb, 16 uint2
// (lane g * 4 + t, g < 4): the B fragment of
// limb column g, .x = columns 32 kb + 4t .. +3, .y = columns 32 kb + 16 + 4t .. +3 (one byte
// each); then per segment a SegStat, read as two uint2 by lanes t = 0 (H) and t = 1 (L).
struct SegStat {
  uint32_t p_hi;  // f32 bits of 2^(e - 18) (NaN: x not finite)
  int32_t sum_hi;
  uint32_t p_lo;  // 2^(e - 34)
  int32_t sum_lo;
};
static_assert(sizeof(SegStat) == 16, "two uint2");

// d += a * b over 16 rows x 32 columns x 8 columns (u8 codes, s8 limbs, s32 sums).
__device__ __forceinline__ void mma_u8s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, const uint2& b) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y));
}

// Columns 128 s + 4 lane .. + 3 of x.
__device__ __forceinline__ float4 load_x4(const float* xg, bool aligned, int s, int lane) {
  const int c0 = s * kSegCols + 4 * lane;
  if (aligned) return __ldg(reinterpret_cast<const float4*>(xg + c0));
  return make_float4(__ldg(xg + c0), __ldg(xg + c0 + 1), __ldg(xg + c0 + 2), __ldg(xg + c0 + 3));
}

// Segment s of x (columns 128 s ..; this lane's four in f) into limbs at xq (the layout above:
// 64 uint2 per segment) and its SegStat at stat[s]; one whole warp. kWordOrder (the INT8 GEMM,
// gemm_int8.cu): 32-column block kb of the layout instead holds the segment's words (4 columns
// each) 4t + kb and 16 + 4t + kb in its .x and .y for t = 0..3, so that a lane's two 16-byte
// loads of a row-major INT8 row (words 4t .. 4t + 3 and 16 + 4t ..) are its A fragments for all
// four blocks.
template <bool kWordOrder = false>
__device__ __forceinline__ void stage_segment(const float4& f, int s, int lane, uint32_t* xq,
                                              SegStat* stat) {
  const float v[4] = {f.x, f.y, f.z, f.w};
  uint32_t mx = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) mx = max(mx, __float_as_uint(v[i]) & 0x7FFFFFFFu);
  mx = __reduce_max_sync(0xFFFFFFFFu, mx);
  const int e = max(static_cast<int>(mx >> 23) - 126, -90);  // max |x| < 2^e
  const float q = __uint_as_float(static_cast<uint32_t>(30 - e + 127) << 23);
  uint32_t digits[4];
  int sum_hi = 0, sum_lo = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int xi = __float2int_rn(v[i] * q);
    const int t = xi + 0x00808080;
    digits[i] = static_cast<uint32_t>(t) ^ 0x00808080u;  // bytes: l0, l1, l2, top
    const int lo = (t & 0xFFFF) - 0x8080;
    sum_lo += lo;
    sum_hi += (xi - lo) >> 16;
  }
  sum_hi = __reduce_add_sync(0xFFFFFFFFu, sum_hi);
  sum_lo = __reduce_add_sync(0xFFFFFFFFu, sum_lo);
  // 4 x 4 byte transpose: limb column g = byte 3 - g of each of the 4 columns.
  const uint32_t a01 = __byte_perm(digits[0], digits[1], 0x5140);
  const uint32_t b01 = __byte_perm(digits[0], digits[1], 0x7362);
  const uint32_t a23 = __byte_perm(digits[2], digits[3], 0x5140);
  const uint32_t b23 = __byte_perm(digits[2], digits[3], 0x7362);
  const uint32_t limb[4] = {__byte_perm(b01, b23, 0x7632), __byte_perm(b01, b23, 0x5410),
                            __byte_perm(a01, a23, 0x7632), __byte_perm(a01, a23, 0x5410)};
  // Columns 4 lane .. + 3: block 4 s + lane / 8, fragment half (lane / 4) % 2, t = lane % 4;
  // kWordOrder: word `lane` = 16 h + 4 t + j goes to block 4 s + j, half h.
  const int kb = 4 * s + (kWordOrder ? lane & 3 : lane / 8);
  const int frag_half = kWordOrder ? lane >> 4 : (lane / 4) & 1;
  const int t = kWordOrder ? (lane >> 2) & 3 : lane & 3;
#pragma unroll
  for (int g = 0; g < 4; ++g) xq[2 * (kb * 16 + g * 4 + t) + frag_half] = limb[g];
  if (lane == 0) {
    const bool finite = mx < 0x7F800000u;
    stat[s] = {finite ? static_cast<uint32_t>(e - 18 + 127) << 23 : 0x7FC00000u, sum_hi,
               finite ? static_cast<uint32_t>(e - 34 + 127) << 23 : 0x7FC00000u, sum_lo};
  }
}

// The GEMMs' first launch: warp (row, segment) of x into limbs, 64 uint2 per segment at
// xq + row * segs * 64, SegStats at stats + row * segs.
template <bool kWordOrder>
__global__ void __launch_bounds__(kThreads)
    stage_rows_kernel(const float* __restrict__ x, size_t ldx, int k, int x_count,
                      uint2* __restrict__ xq, SegStat* __restrict__ stats) {
  const int segs = k / kSegCols;
  const int wi = static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x >> 5);
  const int row = wi / segs, s = wi - row * segs, lane = threadIdx.x & 31;
  if (row >= x_count) return;
  const float* xr = x + static_cast<size_t>(row) * ldx;
  const float4 f = load_x4(xr, (reinterpret_cast<uintptr_t>(xr) & 15) == 0, s, lane);
  stage_segment<kWordOrder>(f, s, lane,
                            reinterpret_cast<uint32_t*>(xq + static_cast<size_t>(row) * segs * 64),
                            stats + static_cast<size_t>(row) * segs);
}
template <bool kWordOrder>
inline cudaError_t stage_rows(const float* x, size_t ldx, int k, int x_count, uint2* xq,
                              SegStat* stats, cudaStream_t stream) {
  const size_t warps = static_cast<size_t>(x_count) * (k / kSegCols);
  stage_rows_kernel<kWordOrder>
      <<<static_cast<unsigned>((warps + kWarps - 1) / kWarps), kThreads, 0, stream>>>(
          x, ldx, k, x_count, xq, stats);
  return cudaGetLastError();
}

// Where the thread staging 32-byte chunk sc of entry e (of entries before `hi`) finds that entry's
// limbs and SegStats in the GEMMs' scratch: uint4 offsets from xq (the stats follow the limbs),
// and 16 bytes to copy, or 0 past the entries (the copies then write zeros).
struct EntrySrc {
  int have;
  uint32_t lofs, sofs;
};
__device__ __forceinline__ EntrySrc entry_src(const GemmRows& r, int e, int hi, int segs, int sc,
                                              const uint2* xq, const uint2* stats) {
  const int xrow = e < hi ? (r.x_rows ? __ldg(r.x_rows + e) : e) : -1;
  EntrySrc src;
  src.lofs = static_cast<uint32_t>(max(xrow, 0)) * segs * 32 + 2 * sc;
  src.sofs = static_cast<uint32_t>(stats - xq) / 2 + src.lofs / 32;
  src.have = xrow >= 0 ? 16 : 0;
  return src;
}
// Segment s of that entry into a stage: its chunk of the limbs (64 uint2 an entry) by cp.async,
// and the SegStat by chunk 0's thread.
__device__ __forceinline__ void copy_entry(uint2* limbs, uint4* stat, const uint2* xq,
                                           const EntrySrc& src, int s, int sc) {
  const uint4* x4 = reinterpret_cast<const uint4*>(xq);
  cp_async16(limbs + 4 * sc, x4 + src.lofs + s * 32, src.have);
  cp_async16(limbs + 4 * sc + 2, x4 + src.lofs + s * 32 + 1, src.have);
  if (sc == 0) cp_async16(stat, x4 + src.sofs + s, src.have);
}

// Group scale (f16 bits, low half) and zero (bits 16..23) of one row and group.
__device__ __forceinline__ uint32_t load_scale_zero(const Mat& m, uint32_t i) {
  return __half_as_ushort(__ldg(m.scales + i)) | static_cast<uint32_t>(__ldg(m.zeros + i)) << 16;
}

// Where quarter t of rows g and g + 8 (lane (g, t)) of a tile's segments are: a tiled tile's
// 1 KB block per segment (step 64 uint4), or, in the last, partial tile, the rows themselves
// (step kSegChunks); segment j of the tile at pa + j * step. sa, sb: the rows' first scale
// indices (n_groups per row). The GEMM's; gemv_int4.cu's locate() and compute() write the same
// addressing and epilogue inline: calling these from the GEMV cost the 122B step 61.4 -> 60.8-60.9%
// of copy on an H100 (two pairs in one run).
struct TileSrc {
  const uint4 *pa, *pb;
  int step;
  uint32_t sa, sb;
};
__device__ __forceinline__ TileSrc tile_src(const void* w, int n, int k, int tile,
                                            uint32_t n_groups, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const int ra = min(tile * 16 + g, n - 1), rb = min(tile * 16 + g + 8, n - 1);
  const uint4* w4 = static_cast<const uint4*>(w);
  TileSrc s;
  if (tile * 16 + 16 <= n) {
    s.pa = w4 + static_cast<size_t>(tile) * (k / 2) + lane;
    s.pb = s.pa + 32;
    s.step = 64;
  } else {
    s.pa = w4 + static_cast<size_t>(ra) * (k / 32) + t;
    s.pb = w4 + static_cast<size_t>(rb) * (k / 32) + t;
    s.step = kSegChunks;
  }
  s.sa = static_cast<uint32_t>(ra) * n_groups;
  s.sb = static_cast<uint32_t>(rb) * n_groups;
  return s;
}

// One segment's sums into rows g and g + 8: dl / dh are the low- and high-nibble MMA
// accumulators (limb columns as the file comment of gemv_int4.cu), fa / fb and za / zb the rows'
// group scales and zeros, p the segment's power of two (this lane's H or L part) and sum its
// limb sum (SegStat). Exact integer combination, one conversion, one product, one fma.
__device__ __forceinline__ void add_segment(const int (&dl)[4], const int (&dh)[4], float fa,
                                            float fb, int za, int zb, float p, int sum,
                                            float& acc_a, float& acc_b) {
  const int va = (dh[0] + 16 * dl[0]) * 256 + dh[1] + 16 * dl[1] - 16 * za * sum;
  const int vb = (dh[2] + 16 * dl[2]) * 256 + dh[3] + 16 * dl[3] - 16 * zb * sum;
  acc_a = fmaf(static_cast<float>(va) * fa, p, acc_a);
  acc_b = fmaf(static_cast<float>(vb) * fb, p, acc_b);
}

}  // namespace qf::kern::gemv_detail
