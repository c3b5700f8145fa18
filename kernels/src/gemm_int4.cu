// INT4 products of many rows of x (gemm.h) on the integer tensor cores, in two launches:
//   1. every row of x into 8-bit limbs and SegStats in the scratch (one warp per 128-column
//      segment: int4_mma.cuh's stage_segment, so the limbs are the INT4 gemv's);
//   2. one warp per kTiles tiles of 16 weight rows of a matrix: for each pass of up to kPass
//      entries it walks the tiles' segments, loads each 1 KB unit once and runs it against every
//      pair of entries, one mma.sync.m16n8k32 per 32 columns, pair and tile: B columns 0..3 hold
//      the limbs of the pair's first entry, 4..7 those of its second (the gemv leaves 4..7
//      empty), so lanes t = 0, 1 of the accumulator hold the first entry's H and L sums and
//      t = 2, 3 the second's; each limb load serves all kTiles tiles.
// Per segment and entry the exact integer sum is scaled as the gemv does (one rounding to f32,
// one product with the group scale, one fma with the segment's power of two); the segments are
// then added in column order. The weights are read once per pass. Numerics and limits otherwise
// as gemv_int4.cu.
#include <algorithm>
#include <cstdint>

#include "gemv_common.cuh"
#include "int4_mma.cuh"
#include "moe_shared.cuh"
#include "qf/kern/gemm.h"

namespace qf::kern {
namespace gemv_detail {
namespace {

constexpr int kPairs = 8;           // pairs of entries per pass
constexpr int kPass = 2 * kPairs;   // entries per pass
constexpr int kTiles = 2;           // tiles of 16 rows per warp: each limb load serves both
constexpr int kMaxPassBlocks = 64;  // dense: blocks along a matrix's passes (grid.z)

struct GemmArgs {
  int tiles;          // of 16 rows per matrix
  int segs;           // k / 128
  int seg_shift;      // segment s lies in group s >> seg_shift
  uint32_t n_groups;  // scales per row
};

// Warp (row, segment) of x into limbs: 64 uint2 per segment at xq + row * segs * 64, SegStats at
// stats + row * segs.
__global__ void __launch_bounds__(kThreads)
    gemm_stage_kernel(const float* __restrict__ x, size_t ldx, int k, int x_count,
                      uint2* __restrict__ xq, SegStat* __restrict__ stats) {
  const int segs = k / kSegCols;
  const int wi = static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x >> 5);
  const int row = wi / segs, s = wi - row * segs, lane = threadIdx.x & 31;
  if (row >= x_count) return;
  const float* xr = x + static_cast<size_t>(row) * ldx;
  const float4 f = load_x4(xr, (reinterpret_cast<uintptr_t>(xr) & 15) == 0, s, lane);
  stage_segment(f, s, lane, reinterpret_cast<uint32_t*>(xq + static_cast<size_t>(row) * segs * 64),
                stats + static_cast<size_t>(row) * segs);
}

// A tile's segment: its two A fragments per 32-column half (low and high nibbles) and the rows'
// scales and zeros.
struct Unit {
  uint32_t lo[2][4], hi[2][4];  // [words 0, 1 | words 2, 3][fragment register]
  float fa, fb;
  int za, zb;
};
__device__ __forceinline__ Unit load_unit(const TileSrc& src, const Mat& m, int s, int seg_shift) {
  const uint4 wa = __ldg(src.pa + s * src.step), wc = __ldg(src.pb + s * src.step);
  const uint32_t grp = static_cast<uint32_t>(s) >> seg_shift;
  const uint32_t sza = load_scale_zero(m, src.sa + grp), szb = load_scale_zero(m, src.sb + grp);
  Unit u;
  const uint32_t r0[4] = {wa.x, wc.x, wa.y, wc.y}, r1[4] = {wa.z, wc.z, wa.w, wc.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    u.lo[0][i] = r0[i] & kLowNibbles;
    u.hi[0][i] = r0[i] & ~kLowNibbles;
    u.lo[1][i] = r1[i] & kLowNibbles;
    u.hi[1][i] = r1[i] & ~kLowNibbles;
  }
  u.fa = f16_bits_to_f32(sza & 0xFFFFu);
  u.fb = f16_bits_to_f32(szb & 0xFFFFu);
  u.za = static_cast<int>(sza >> 16);
  u.zb = static_cast<int>(szb >> 16);
  return u;
}

// acc (rows g, g + 8) += the unit against one pair's limbs b0..b3 and this lane's SegStat half.
__device__ __forceinline__ void unit_pair(const Unit& u, const uint2 (&b)[4], const uint2& ss,
                                          float& acc_a, float& acc_b) {
  int dl[4] = {0, 0, 0, 0}, dh[4] = {0, 0, 0, 0};
  mma_u8s8(dl, u.lo[0][0], u.lo[0][1], u.lo[0][2], u.lo[0][3], b[0]);
  mma_u8s8(dh, u.hi[0][0], u.hi[0][1], u.hi[0][2], u.hi[0][3], b[1]);
  mma_u8s8(dl, u.lo[1][0], u.lo[1][1], u.lo[1][2], u.lo[1][3], b[2]);
  mma_u8s8(dh, u.hi[1][0], u.hi[1][1], u.hi[1][2], u.hi[1][3], b[3]);
  add_segment(dl, dh, u.fa, u.fb, u.za, u.zb, __uint_as_float(ss.x), static_cast<int>(ss.y), acc_a,
              acc_b);
}

// Block (x: kWarps * kTiles tiles, y: matrix, z: a share of its passes); warp: kTiles tiles.
template <bool kSwiglu>
__global__ void __launch_bounds__(kThreads)
    gemm_int4_kernel(const DeviceLinear w, const uint2* __restrict__ xq,
                     const uint2* __restrict__ stats, float* __restrict__ y, const GemmRows r,
                     const GemmArgs a) {
  const int mat = blockIdx.y;
  const int lo = r.offsets ? __ldg(r.offsets + mat) : 0;
  const int hi = r.offsets ? min(__ldg(r.offsets + mat + 1), r.entries) : r.entries;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile0 =
      (static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x >> 5)) * kTiles;
  if (lo >= hi || tile0 >= a.tiles) return;
  GemvBatch one;
  const Mat m = expert(w, one, mat);
  const int n = w.n, S = a.segs;
  TileSrc src[kTiles];
#pragma unroll
  for (int i = 0; i < kTiles; ++i)
    src[i] = tile_src(m.w, w.n, w.k, min(tile0 + i, a.tiles - 1), a.n_groups, lane);
  const uint2 zero2 = make_uint2(0, 0);

  for (int base = lo + static_cast<int>(blockIdx.z) * kPass; base < hi;
       base += static_cast<int>(gridDim.z) * kPass) {
    // Pair p: entries base + 2p (B columns 0..3: lanes < 16; accumulator lanes t < 2) and
    // base + 2p + 1 (lanes >= 16; t >= 2). Their rows of x (-1: past the matrix's entries).
    int xb[kPairs], xc[kPairs];
#pragma unroll
    for (int p = 0; p < kPairs; ++p) {
      const int eb = base + 2 * p + (lane >= 16), ec = base + 2 * p + (t >= 2);
      xb[p] = eb < hi ? (r.x_rows ? __ldg(r.x_rows + eb) : eb) : -1;
      xc[p] = ec < hi ? (r.x_rows ? __ldg(r.x_rows + ec) : ec) : -1;
    }
    float acc[kTiles][kPairs][2];
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
#pragma unroll
      for (int p = 0; p < kPairs; ++p) acc[i][p][0] = acc[i][p][1] = 0.0f;
    }
#pragma unroll 1
    for (int s = 0; s < S; ++s) {
      Unit u[kTiles];
#pragma unroll
      for (int i = 0; i < kTiles; ++i) u[i] = load_unit(src[i], m, s, a.seg_shift);
#pragma unroll
      for (int p = 0; p < kPairs; ++p) {
        if (base + 2 * p >= hi) break;  // the same for the whole warp
        const uint2* xs = xq + (static_cast<size_t>(max(xb[p], 0)) * S + s) * 64 + (lane & 15);
        const bool have_b = xb[p] >= 0;
        uint2 b[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = have_b ? __ldg(xs + 16 * j) : zero2;
        // This lane's entry: its H (t even) or L (t odd) part, from its SegStat.
        const uint2 ss =
            xc[p] >= 0 ? __ldg(stats + (static_cast<size_t>(xc[p]) * S + s) * 2 + (t & 1)) : zero2;
#pragma unroll
        for (int i = 0; i < kTiles; ++i) unit_pair(u[i], b, ss, acc[i][p][0], acc[i][p][1]);
      }
    }
    // H + L of each entry (lanes t, t ^ 1), written by lanes t = 0 (first entry) and t = 2.
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      const int tile = tile0 + i;
#pragma unroll
      for (int p = 0; p < kPairs; ++p) {
        if (base + 2 * p >= hi) break;
        const float ya = acc[i][p][0] + __shfl_xor_sync(0xFFFFFFFFu, acc[i][p][0], 1);
        const float yb = acc[i][p][1] + __shfl_xor_sync(0xFFFFFFFFu, acc[i][p][1], 1);
        const int e = base + 2 * p + (t >> 1);
        if ((t & 1) || e >= hi || tile >= a.tiles) continue;
        float* ye = y + static_cast<size_t>(r.y_rows ? __ldg(r.y_rows + e) : e) * r.ldy;
        if constexpr (kSwiglu) {  // paired rows: gate 8T + g (row g), up 8T + g (row g + 8)
          ye[tile * 8 + g] = silu_mul(ya, yb);
        } else {
          if (tile * 16 + g < n) ye[tile * 16 + g] = ya;
          if (tile * 16 + g + 8 < n) ye[tile * 16 + g + 8] = yb;
        }
      }
    }
  }
}

size_t limb_bytes(const DeviceLinear& w, const GemmRows& r) {
  return static_cast<size_t>(r.x_count) * (w.k / kSegCols) * (64 * sizeof(uint2) + sizeof(SegStat));
}

}  // namespace
}  // namespace gemv_detail

bool gemm_ok(const DeviceLinear& w, bool swiglu) {
  using namespace gemv_detail;
  GemvBatch b;
  b.n_slots = 2;  // a stack: experts 16-byte aligned too
  if (w.kind != WeightKind::kInt4 || !int4_tiled(w.k) || !int4_mma_ok(w, b)) return false;
  return !swiglu || w.n % 16 == 0;
}

size_t gemm_scratch_bytes(const DeviceLinear& w, const GemmRows& rows) {
  return gemv_detail::limb_bytes(w, rows);
}

cudaError_t gemm(const DeviceLinear& w, const float* x, float* y, const GemmRows& r, bool swiglu,
                 void* scratch, cudaStream_t stream) {
  using namespace gemv_detail;
  if (!gemm_ok(w, swiglu)) return cudaErrorNotSupported;
  if (r.entries < 0 || r.x_count < 0 || r.n_mats < 1 || r.ldx < static_cast<size_t>(w.k) ||
      r.ldy < static_cast<size_t>(swiglu ? w.n / 2 : w.n) ||
      (r.offsets == nullptr && r.n_mats != 1)) {
    return cudaErrorInvalidValue;
  }
  if (r.entries == 0 || r.x_count == 0) return cudaSuccess;
  GemmArgs a;
  a.tiles = (w.n + 15) / 16;
  a.segs = w.k / kSegCols;
  a.seg_shift = w.group >= w.k ? 30 : __builtin_ctz(static_cast<unsigned>(w.group / kSegCols));
  a.n_groups = static_cast<uint32_t>((w.k + w.group - 1) / w.group);
  auto* xq = static_cast<uint2*>(scratch);
  auto* stats = reinterpret_cast<SegStat*>(xq + static_cast<size_t>(r.x_count) * a.segs * 64);
  const size_t stage_warps = static_cast<size_t>(r.x_count) * a.segs;
  gemm_stage_kernel<<<static_cast<unsigned>((stage_warps + kWarps - 1) / kWarps), kThreads, 0,
                      stream>>>(x, r.ldx, w.k, r.x_count, xq, stats);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  // Dense: the passes spread over grid.z (each block re-reads its tiles' weights, from L2 where
  // they fit); grouped: a block walks its matrix's passes, the matrices giving the parallelism.
  const int passes = r.offsets ? 1 : std::min((r.entries + kPass - 1) / kPass, kMaxPassBlocks);
  const dim3 grid(static_cast<unsigned>((a.tiles + kWarps * kTiles - 1) / (kWarps * kTiles)),
                  static_cast<unsigned>(r.n_mats), static_cast<unsigned>(passes));
  const auto* st = reinterpret_cast<const uint2*>(stats);
  if (swiglu) {
    gemm_int4_kernel<true><<<grid, kThreads, 0, stream>>>(w, xq, st, y, r, a);
  } else {
    gemm_int4_kernel<false><<<grid, kThreads, 0, stream>>>(w, xq, st, y, r, a);
  }
  return cudaGetLastError();
}

}  // namespace qf::kern
