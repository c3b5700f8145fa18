// INT8 products of many rows of x (gemm.h) on the integer tensor cores: the LM head over every
// position of a prompt (prompt scoring), where a GEMV per position reads its 764 MB (122B-A10B)
// once per row. The INT4 GEMM's scheme (gemm_int4.cu) on kInt8's row-major layout:
//   1. every row of x into 8-bit limbs and SegStats (int4_mma.cuh's stage_segment in its word
//      order: the 32-column block j of a segment holds words 4t + j and 16 + 4t + j, so a lane's
//      two 16-byte chunks of a weight row, words 4t .. 4t + 3 and 16 + 4t .. + 3, are its A
//      fragments for all four blocks; the sums are over the same columns in another order);
//   2. a block of 8 warps per 128 weight rows (a tile of 16 per warp) and pass of up to kPass
//      entries streams the segments (a tile's 16 rows x 128 bytes, the pass's limbs and
//      SegStats) through kStages shared-memory stages by cp.async, and each warp runs its tile
//      against every pair of entries: four mma.sync.m16n8k32 per segment and pair, B columns 0..3
//      the first entry's limbs, 4..7 the second's.
// Per segment and entry the exact integer sum (codes u8, limbs s8, s32: |sum| < 2^31 for any
// codes, zeros and x) less zero x the limbs' sum is converted once, multiplied by the row's group
// scale and added with one fma scaled by the segment's power of two; the segments are added in
// column order. So a row differs from gemv's INT8 path (an fp32 fma per weight) by its roundings:
// within gemv_test's bound of the exact sums. The weights are read from DRAM about once: the
// passes of a tile range run in up to 64 blocks adjacent in launch order (pass_blocks).
#include <algorithm>
#include <cstdint>

#include "cp_async.cuh"
#include "gemm_entries.cuh"
#include "gemm_int8.h"
#include "gemv_common.cuh"
#include "int4_mma.cuh"

namespace qf::kern::gemv_detail {
namespace {

constexpr int kPairs = 8;            // pairs of entries per pass
constexpr int kPass = 2 * kPairs;    // entries per pass (16 threads stage each)
constexpr int kStages = 3;           // segments in shared memory (2 in flight)
constexpr int kBlocks = 2;           // resident blocks per SM the launch bounds ask for
constexpr int kTileChunks = 16 * 8;  // 16-byte chunks of a tile's segment (16 rows)
constexpr int kChunksPerLane = kTileChunks / 32;
static_assert(kPass * 16 == kThreads, "16 threads stage an entry's limbs");

struct Args {
  int tiles;          // of 16 rows
  int segs;           // k / 128
  int seg_shift;      // segment s lies in group s >> seg_shift
  uint32_t n_groups;  // scales per row
  int pass_blocks;    // blocks sharing a tile range's passes (adjacent in blockIdx.x)
};

struct Stage {
  uint4 w[kWarps][kTileChunks];
  uint2 limbs[kPass][64];
  uint4 stat[kPass];
};

// Where chunk c (0..7) of row r (0..15) of a tile's segment sits in its stage: odd rows swap
// their halves, so that the 8 lanes of a quarter-warp (rows g and g + 1, chunks t or 4 + t for
// t = 0..3) read 8 distinct 16-byte bank groups.
__device__ __forceinline__ int chunk_at(int r, int c) {
  return r * 8 + (c ^ ((r & 1) << 2));
}

// Block: 8 tiles (blockIdx.x / pass_blocks) and a share of their passes; warp: one tile. Each
// lane copies 4 chunks of its warp's tile per segment, each thread 32 bytes of one entry's limbs.
__global__ void __launch_bounds__(kThreads, kBlocks)
    gemm_int8_kernel(const DeviceLinear w, const uint2* __restrict__ xq,
                     const uint2* __restrict__ stats, float* __restrict__ y, const GemmRows r,
                     const Args a) {
  extern __shared__ uint4 smem[];
  Stage* stage = reinterpret_cast<Stage*>(smem);
  const int pz = static_cast<int>(blockIdx.x) % a.pass_blocks;
  if (pz * kPass >= r.entries) return;  // the whole block
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int tile = static_cast<int>(blockIdx.x) / a.pass_blocks * kWarps + warp;
  const int tc = min(tile, a.tiles - 1), n = w.n, S = a.segs;
  const Mat m = expert(w, GemvBatch{}, 0);
  const uint4* w4 = static_cast<const uint4*>(w.w);
  const uint32_t row_chunks = static_cast<uint32_t>(w.k / 16);
  uint32_t src[kChunksPerLane];  // in uint4 from the matrix, segment 0
  int dst[kChunksPerLane];
#pragma unroll
  for (int j = 0; j < kChunksPerLane; ++j) {
    const int i = lane + 32 * j, rr = i >> 3, c = i & 7;
    src[j] = static_cast<uint32_t>(min(tc * 16 + rr, n - 1)) * row_chunks + c;
    dst[j] = chunk_at(rr, c);
  }
  const uint32_t sa = static_cast<uint32_t>(min(tc * 16 + g, n - 1)) * a.n_groups;
  const uint32_t sb = static_cast<uint32_t>(min(tc * 16 + g + 8, n - 1)) * a.n_groups;
  const int se = tid >> 4, sc = tid & 15;  // the entry and 32-byte chunk this thread stages

  for (int base = pz * kPass; base < r.entries; base += a.pass_blocks * kPass) {
    const EntrySrc ent = entry_src(r, base + se, r.entries, S, sc, xq, stats);
    const auto fill = [&](int s, int buf) {
      if (s < S) {
        Stage& st = stage[buf];
#pragma unroll
        for (int j = 0; j < kChunksPerLane; ++j) {
          cp_async16(&st.w[warp][dst[j]], w4 + src[j] + s * 8);
        }
        copy_entry(st.limbs[se], &st.stat[se], xq, ent, s, sc);
      }
      cp_async_commit();
    };
    float acc[kPairs][2];
#pragma unroll
    for (int p = 0; p < kPairs; ++p) acc[p][0] = acc[p][1] = 0.0f;
    const auto compute = [&](int s, int buf) {
      const Stage& st = stage[buf];
      const uint32_t grp = static_cast<uint32_t>(s) >> a.seg_shift;
      const uint32_t sza = load_scale_zero(m, sa + grp), szb = load_scale_zero(m, sb + grp);
      const float fa = f16_bits_to_f32(sza & 0xFFFFu), fb = f16_bits_to_f32(szb & 0xFFFFu);
      const int za = static_cast<int>(sza >> 16), zb = static_cast<int>(szb >> 16);
      // Rows g and g + 8: words 4t .. 4t + 3 (k 4t .. of every block) and 16 + 4t .. (k 16 + 4t).
      const uint4 ag = st.w[warp][chunk_at(g, t)], bg = st.w[warp][chunk_at(g, 4 + t)];
      const uint4 ah = st.w[warp][chunk_at(g + 8, t)], bh = st.w[warp][chunk_at(g + 8, 4 + t)];
      const uint32_t a0[4] = {ag.x, ag.y, ag.z, ag.w}, a1[4] = {ah.x, ah.y, ah.z, ah.w};
      const uint32_t a2[4] = {bg.x, bg.y, bg.z, bg.w}, a3[4] = {bh.x, bh.y, bh.z, bh.w};
#pragma unroll
      for (int p = 0; p < kPairs; ++p) {
        if (base + 2 * p >= r.entries) break;  // the same for the whole warp
        // Lanes < 16: B columns 0..3, the pair's first entry; lanes >= 16 its second.
        const uint2* xs = &st.limbs[2 * p + (lane >> 4)][lane & 15];
        int d[4] = {0, 0, 0, 0};
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_u8s8(d, a0[j], a1[j], a2[j], a3[j], xs[16 * j]);
        // This lane's entry (t < 2: the first): its H (t even) or L (t odd) SegStat half. The
        // SegStat's powers carry the INT4 GEMV's 1/16 (its high nibbles are 16 x code).
        const uint2 ss = reinterpret_cast<const uint2*>(&st.stat[2 * p + (t >> 1)])[t & 1];
        const float p16 = __uint_as_float(ss.x) * 16.0f;
        const int sum = static_cast<int>(ss.y);
        const int va = d[0] * 256 + d[1] - za * sum, vb = d[2] * 256 + d[3] - zb * sum;
        acc[p][0] = fmaf(static_cast<float>(va) * fa, p16, acc[p][0]);
        acc[p][1] = fmaf(static_cast<float>(vb) * fb, p16, acc[p][1]);
      }
    };
    pipeline<kStages>(S, fill, compute);
    // H + L of each entry (lanes t, t ^ 1), written by lanes t = 0 (first entry) and t = 2.
#pragma unroll
    for (int p = 0; p < kPairs; ++p) {
      if (base + 2 * p >= r.entries) break;
      const float ya = acc[p][0] + __shfl_xor_sync(0xFFFFFFFFu, acc[p][0], 1);
      const float yb = acc[p][1] + __shfl_xor_sync(0xFFFFFFFFu, acc[p][1], 1);
      const int ye_i = base + 2 * p + (t >> 1);
      if ((t & 1) || ye_i >= r.entries || tile >= a.tiles) continue;
      float* ye = y + static_cast<size_t>(r.y_rows ? __ldg(r.y_rows + ye_i) : ye_i) * r.ldy;
      if (tile * 16 + g < n) ye[tile * 16 + g] = ya;
      if (tile * 16 + g + 8 < n) ye[tile * 16 + g + 8] = yb;
    }
  }
}

}  // namespace

bool gemm_int8_ok(const DeviceLinear& w) {
  if (w.kind != WeightKind::kInt8 || w.n < 1) return false;
  // Chunks of the matrix addressed by 32-bit offsets.
  if (static_cast<uint64_t>(w.n) * (w.k / 16) >= (uint64_t{1} << 32)) return false;
  GemvBatch one;
  return int4_mma_ok(w, one);  // K, alignment and groups: the same rules
}

size_t gemm_int8_scratch_bytes(const DeviceLinear& w, const GemmRows& r) {
  return static_cast<size_t>(r.x_count) * (w.k / kSegCols) * (64 * sizeof(uint2) + sizeof(SegStat));
}

cudaError_t gemm_int8(const DeviceLinear& w, const float* x, float* y, const GemmRows& r,
                      void* scratch, cudaStream_t stream) {
  if (r.offsets != nullptr) return cudaErrorNotSupported;
  Args a;
  a.tiles = (w.n + 15) / 16;
  a.segs = w.k / kSegCols;
  a.seg_shift = w.group >= w.k ? 30 : __builtin_ctz(static_cast<unsigned>(w.group / kSegCols));
  a.n_groups = static_cast<uint32_t>((w.k + w.group - 1) / w.group);
  a.pass_blocks = pass_blocks(r, kPass);  // dense
  auto* xq = static_cast<uint2*>(scratch);
  auto* stats = reinterpret_cast<SegStat*>(xq + static_cast<size_t>(r.x_count) * a.segs * 64);
  cudaError_t e = stage_rows<true>(x, r.ldx, w.k, r.x_count, xq, stats, stream);
  if (e != cudaSuccess) return e;
  const unsigned grid = static_cast<unsigned>((a.tiles + kWarps - 1) / kWarps * a.pass_blocks);
  constexpr int smem = kStages * sizeof(Stage);
  e = cudaFuncSetAttribute(gemm_int8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  gemm_int8_kernel<<<grid, kThreads, smem, stream>>>(w, xq, reinterpret_cast<const uint2*>(stats),
                                                     y, r, a);
  return cudaGetLastError();
}

}  // namespace qf::kern::gemv_detail
