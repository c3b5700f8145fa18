// INT4 products of many rows of x (gemm.h) on the integer tensor cores, in two launches:
//   1. every row of x into 8-bit limbs and SegStats in the scratch (one warp per 128-column
//      segment: int4_mma.cuh's stage_segment, so the limbs are the INT4 gemv's);
//   2. a block of 8 warps per 256 weight rows (kBlockTiles tiles of 16) of a matrix and pass of up
//      to kPass entries: it streams the segments through a ring of kStages shared-memory stages
//      by cp.async, kStages - 1 segments ahead (the tiles' 1 KB units and the pass's limbs and
//      SegStats), and each warp runs its kTiles tiles' units against every pair of entries, one
//      mma.sync.m16n8k32 per 32 columns, pair and tile: B columns 0..3 hold the limbs of the
//      pair's first entry, 4..7 those of its second (the gemv leaves 4..7 empty), so lanes t = 0,
//      1 of the accumulator hold the first entry's H and L sums and t = 2, 3 the second's; each
//      limb load serves all kTiles tiles.
// Per segment and entry the exact integer sum is scaled as the gemv does (one rounding to f32,
// one product with the group scale, one fma with the segment's power of two); the segments are
// then added in column order. The weights are read once per pass. Numerics and limits otherwise
// as gemv_int4.cu.
//
// Before the ring (each warp loading its units and the limbs with __ldg as it went, 184
// registers, one block per SM), Nsight Compute on the 122B shapes at 256 tokens (H100) had the
// SMs issuing in 24% of cycles, most stalls on those loads; qforge-bench-gemv --gemm, µs per token
// at 256 tokens, both kernels in one run: DeltaNet in_proj 3.54 -> 1.09, routed gate | up 3.56 ->
// 1.34 (31% -> 83% of the copy bandwidth over the experts touched), down 2.07 -> 0.76; the 122B
// prefill 1390 -> 2846 tok/s. Measured and not kept (same runs): the high nibbles shifted down so
// that the four MMAs share accumulators (a shorter epilogue: the same speed with two chains, slower
// with one); the scales loaded a segment ahead (kStages-deep registers: slower than from L1 in the
// segment); 6 pairs a pass (no spill, in_proj 1.09 -> 1.24 us a token); one block per SM (160
// registers: every product 9-34% slower). So ptxas spills 4 bytes on sm_90 at 128 registers (none
// on sm_121), measured harmless.
#include <algorithm>
#include <cstdint>

#include "cp_async.cuh"
#include "gemm_bf16.h"
#include "gemm_entries.cuh"
#include "gemm_fp8.h"
#include "gemm_int8.h"
#include "gemv_common.cuh"
#include "int4_mma.cuh"
#include "moe_shared.cuh"
#include "qf/kern/gemm.h"

namespace qf::kern {
namespace gemv_detail {
namespace {

constexpr int kPairs = 8;                     // pairs of entries per pass
constexpr int kPass = 2 * kPairs;             // entries per pass (16 threads stage each)
constexpr int kTiles = 2;                     // tiles of 16 rows per warp: a limb load serves both
constexpr int kBlockTiles = kWarps * kTiles;  // tiles per block
constexpr int kStages = 3;                    // segments in shared memory (2 in flight)
constexpr int kGemmBlocks = 2;                // resident blocks per SM the registers allow
static_assert(kPass * 16 <= kThreads, "16 threads stage an entry's limbs");

struct GemmArgs {
  int tiles;          // of 16 rows per matrix
  int segs;           // k / 128
  int seg_shift;      // segment s lies in group s >> seg_shift
  uint32_t n_groups;  // scales per row
  int pass_blocks;    // blocks sharing a tile range's passes (adjacent in blockIdx.x)
};

// A tile's segment: its two A fragments per 32-column half (low and high nibbles) and the rows'
// scales and zeros.
struct Unit {
  uint32_t lo[2][4], hi[2][4];  // [words 0, 1 | words 2, 3][fragment register]
  float fa, fb;
  int za, zb;
};
// From quarter t of rows g and g + 8 (wa, wc: the layout's 1 KB block) and their scale | zero.
__device__ __forceinline__ Unit make_unit(const uint4& wa, const uint4& wc, uint32_t sza,
                                          uint32_t szb) {
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

// One segment of the block's work in shared memory: its tiles' 1 KB units and the pass's entries'
// limbs and SegStats. kStages of them form the pipeline.
struct Stage {
  uint4 w[kBlockTiles][64];
  uint2 limbs[kPass][64];
  uint4 stat[kPass];
};

// Block (x: kBlockTiles tiles and a share of their passes, y: matrix); warp: kTiles tiles. Per pass
// the segments stream through kStages stages of shared memory (cp.async, kStages - 1 ahead): each
// warp copies its own tiles' units, each thread 32 bytes of one entry's limbs (16 threads an
// entry); the rows' scales and zeros are read in their segment (from L1 after the first).
template <bool kSwiglu>
__global__ void __launch_bounds__(kThreads, kGemmBlocks)
    gemm_int4_kernel(const DeviceLinear w, const uint2* __restrict__ xq,
                     const uint2* __restrict__ stats, float* __restrict__ y, const GemmRows r,
                     const GemmArgs a) {
  extern __shared__ uint4 smem[];
  Stage* stage = reinterpret_cast<Stage*>(smem);
  const int mat = blockIdx.y;
  const EntryRange range = matrix_entries(r, mat);
  const int lo = range.lo, hi = range.hi;
  const int pz = static_cast<int>(blockIdx.x) % a.pass_blocks;
  if (lo + pz * kPass >= hi) return;  // the whole block
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int tile0 = static_cast<int>(blockIdx.x) / a.pass_blocks * kBlockTiles + warp * kTiles;
  GemvBatch one;
  const Mat m = expert(w, one, mat);
  const int n = w.n, S = a.segs;
  // The tiles' units (TileSrc) as 32-bit offsets in uint4 from the matrix: fewer registers.
  const uint4* w4 = reinterpret_cast<const uint4*>(m.w);
  uint32_t oa[kTiles], ob[kTiles], sa[kTiles], sb[kTiles];
  int step[kTiles];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    const TileSrc ts = tile_src(m.w, w.n, w.k, min(tile0 + i, a.tiles - 1), a.n_groups, lane);
    oa[i] = static_cast<uint32_t>(ts.pa - w4);
    ob[i] = static_cast<uint32_t>(ts.pb - w4);
    step[i] = ts.step;
    sa[i] = ts.sa;
    sb[i] = ts.sb;
  }
  const int se = tid >> 4, sc = tid & 15;  // the entry and 32-byte chunk this thread stages

  for (int base = lo + pz * kPass; base < hi; base += a.pass_blocks * kPass) {
    const EntrySrc ent = entry_src(r, base + se, hi, S, sc, xq, stats);
    const auto fill = [&](int s, int buf) {
      if (s < S) {
        Stage& st = stage[buf];
#pragma unroll
        for (int i = 0; i < kTiles; ++i) {
          cp_async16(&st.w[warp * kTiles + i][lane], w4 + oa[i] + s * step[i]);
          cp_async16(&st.w[warp * kTiles + i][lane + 32], w4 + ob[i] + s * step[i]);
        }
        if (se < kPass) {  // always at kPass 16; dropping the test changed sm_90 code
          copy_entry(st.limbs[se], &st.stat[se], xq, ent, s, sc);
        }
      }
      cp_async_commit();
    };
    // Scale | zero of rows g, g + 8 per tile (from L1 after the pass's first segment).
    uint32_t cur[kTiles][2];
    const auto load_sz = [&](int s, uint32_t(&sz)[kTiles][2]) {
      const uint32_t grp = static_cast<uint32_t>(s) >> a.seg_shift;
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        sz[i][0] = load_scale_zero(m, sa[i] + grp);
        sz[i][1] = load_scale_zero(m, sb[i] + grp);
      }
    };
    float acc[kTiles][kPairs][2];
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
#pragma unroll
      for (int p = 0; p < kPairs; ++p) acc[i][p][0] = acc[i][p][1] = 0.0f;
    }
    const auto compute = [&](int buf, const uint32_t(&sz)[kTiles][2]) {
      const Stage& st = stage[buf];
      Unit u[kTiles];
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        u[i] = make_unit(st.w[warp * kTiles + i][lane], st.w[warp * kTiles + i][lane + 32],
                         sz[i][0], sz[i][1]);
      }
#pragma unroll
      for (int p = 0; p < kPairs; ++p) {
        if (base + 2 * p >= hi) break;  // the same for the whole warp
        // Lanes < 16: B columns 0..3, the pair's first entry; lanes >= 16 its second.
        const uint2* xs = &st.limbs[2 * p + (lane >> 4)][lane & 15];
        uint2 b[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = xs[16 * j];
        // This lane's entry (t < 2: the first): its H (t even) or L (t odd) SegStat half.
        const uint2 ss = reinterpret_cast<const uint2*>(&st.stat[2 * p + (t >> 1)])[t & 1];
#pragma unroll
        for (int i = 0; i < kTiles; ++i) unit_pair(u[i], b, ss, acc[i][p][0], acc[i][p][1]);
      }
    };
    pipeline<kStages>(S, fill, [&](int s, int buf) {
      load_sz(s, cur);
      compute(buf, cur);
    });
    // H + L of each entry (lanes t, t ^ 1), written by lanes t = 0 (first entry) and t = 2.
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      const int tile = tile0 + i;
#pragma unroll
      for (int p = 0; p < kPairs; ++p) {
        if (base + 2 * p >= hi) break;
        const float ya = acc[i][p][0] + __shfl_xor_sync(0xFFFFFFFFu, acc[i][p][0], 1);
        const float yb = acc[i][p][1] + __shfl_xor_sync(0xFFFFFFFFu, acc[i][p][1], 1);
        const int ye_i = base + 2 * p + (t >> 1);
        if ((t & 1) || ye_i >= hi || tile >= a.tiles) continue;
        float* ye = y + static_cast<size_t>(r.y_rows ? __ldg(r.y_rows + ye_i) : ye_i) * r.ldy;
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
  if (w.kind == WeightKind::kFp8) return !swiglu && gemm_fp8_ok(w);
  if (w.kind == WeightKind::kBf16) return !swiglu && gemm_bf16_ok(w);
  if (w.kind == WeightKind::kInt8) return !swiglu && gemm_int8_ok(w);
  if (w.kind != WeightKind::kInt4 || !int4_tiled(w.k) || !int4_mma_ok(w, b)) return false;
  return !swiglu || w.n % 16 == 0;
}

size_t gemm_scratch_bytes(const DeviceLinear& w, const GemmRows& rows) {
  if (w.kind == WeightKind::kFp8) return gemv_detail::gemm_fp8_scratch_bytes(w, rows);
  if (w.kind == WeightKind::kBf16) return gemv_detail::gemm_bf16_scratch_bytes(w, rows);
  if (w.kind == WeightKind::kInt8) return gemv_detail::gemm_int8_scratch_bytes(w, rows);
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
  // Both kernels address a row's staged segments (32 uint4 each) by 32-bit offsets.
  if (static_cast<uint64_t>(r.x_count) * (w.k / kSegCols) * 32 >= (uint64_t{1} << 32)) {
    return cudaErrorInvalidValue;
  }
  if (r.entries == 0 || r.x_count == 0) return cudaSuccess;
  if (w.kind == WeightKind::kFp8) return gemm_fp8(w, x, y, r, scratch, stream);
  if (w.kind == WeightKind::kBf16) return gemm_bf16(w, x, y, r, scratch, stream);
  if (w.kind == WeightKind::kInt8) return gemm_int8(w, x, y, r, scratch, stream);
  GemmArgs a;
  a.tiles = (w.n + 15) / 16;
  a.segs = w.k / kSegCols;
  a.seg_shift = w.group >= w.k ? 30 : __builtin_ctz(static_cast<unsigned>(w.group / kSegCols));
  a.n_groups = static_cast<uint32_t>((w.k + w.group - 1) / w.group);
  auto* xq = static_cast<uint2*>(scratch);
  auto* stats = reinterpret_cast<SegStat*>(xq + static_cast<size_t>(r.x_count) * a.segs * 64);
  cudaError_t e = stage_rows<false>(x, r.ldx, w.k, r.x_count, xq, stats, stream);
  if (e != cudaSuccess) return e;
  a.pass_blocks = pass_blocks(r, kPass);
  const dim3 grid(static_cast<unsigned>((a.tiles + kBlockTiles - 1) / kBlockTiles * a.pass_blocks),
                  static_cast<unsigned>(r.n_mats));
  const auto* st = reinterpret_cast<const uint2*>(stats);
  const auto kernel = swiglu ? gemm_int4_kernel<true> : gemm_int4_kernel<false>;
  constexpr int smem = kStages * sizeof(Stage);
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  kernel<<<grid, kThreads, smem, stream>>>(w, xq, st, y, r, a);
  return cudaGetLastError();
}

}  // namespace qf::kern
