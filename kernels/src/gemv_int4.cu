// INT4 gemv on the integer tensor cores: y = W x with W the INT4 kernel layout of gemv.h
// (128-column segments in the mma fragment order) and x split into 8-bit limbs, one
// mma.sync.m16n8k32.u8.s8.s32 per 16 rows x 32 columns. mma.sync is Ampere's warp-level MMA:
// sm_90 and sm_121 alike (no wgmma, no TMA).
//
// Why: the f32 path spent ~3.9 instructions per weight (extract, exact dequant, fma) and stayed
// near 40% of the H200's copy bandwidth; here a weight costs a quarter of a LOP3 (one mask gives
// four codes as bytes) plus a sixteenth of an MMA, so the kernel is bound by memory alone.
//
// Numerics (exact except x's rounding to 31 bits relative to its 128-column segment maximum):
//   * x, per 128-column segment s with max |x| < 2^e (e = exponent + 1, clamped to >= -90):
//     X = rint(x * 2^(30 - e)), |X| < 2^30, exact for every x within 2^7 of the maximum (f32 has
//     24 bits) and within 2^(e - 31) otherwise. X = top*2^24 + l2*2^16 + l1*2^8 + l0 in signed
//     digits (l* in [-128, 127], |top| <= 64): the bytes of (X + 0x808080) ^ 0x808080.
//     H = top*256 + l2, L = l1*256 + l0, X = H*2^16 + L; sums of H and L per segment.
//   * A = codes as u8 (low nibbles: c; high nibbles masked in place: 16c), B columns 0..3 = top,
//     l2, l1, l0: the s32 accumulators hold exact integer sums. Per segment and row
//     16 * sum((c - z) H) = 256 (16 D_lo[top] + D_hi[top]) + 16 D_lo[l2] + D_hi[l2] - 16 z sum(H)
//     (and L alike) fits in 31 bits for zeros z <= 16 (gemv.h; |L| <= 32896, so the terms are
//     at most 256 * 16 * 15 * 128 * 128 and 256 * 128 * 32896, < 2^31 together): exact. One
//     rounding converts it to f32, one multiplies by the group scale, one adds it (fma with the
//     exact 2^(e-18) or 2^(e-34)) to the lane's accumulator. A segment's error is thus a few ulps
//     of its own sum plus x's rounding, well inside gemv_test's tolerance; one-hot x is exact (y =
//     the weight).
//   * x NaN or infinite in a segment: the segment's factor is NaN, so y is NaN (the reference
//     gives inf or NaN). Segments whose max |x| < 2^-91 lose precision (clamped exponent).
//
// Work: an item is one m-tile (16 rows) of one K part (k_splits, gemv.h) of one slot; a unit is
// one 128-column segment of an item. Each block takes an equal run of its slot's items and each
// of its 8 warps an equal, contiguous run of the block's units, crossing item edges; lane
// (g, t) = (lane / 4, lane % 4) loads quarter t of rows g and g + 8 of a unit: one contiguous
// 1 KB per segment in a tiled tile (gemv.h; 64 bytes of each row in the last, partial tile).
// A ring of kU units per warp lands in shared memory by cp.async (no register holds them in
// flight), each slot refilled as soon as it has been used. At an item's last unit (or the
// warp's) the warp's sums go to shared memory; after the loop every item's rows add the sums of
// the warps that met it, in warp order (deterministic). Every block first turns x's segments of
// its parts into limbs in shared memory (one warp per segment), behind one barrier, while the
// first weight loads are in flight. A launch that waits for its ids first (the routed gate | up)
// issues its first x loads before its weight loads: behind them, in the SM's queue of ~48 KB of
// weights, their L2 round trip took ~2 us (a globaltimer trace of the blocks, branch `trace`,
// H100) and held back the whole block (qforge-bench-gemv, H100: MoE gate+up 73% -> 77-78%).
// Any other launch issues two of its three units before the PDL wait and the third after its
// first x loads, for the same reason.
//
// SwiGLU epilogue (gemv_swiglu, gemv.h): with paired rows a tile's rows g and g + 8 are a gate
// row and its up row, so the thread that adds row g's sums adds row g + 8's too and writes
// silu(gate) * up; the sums are formed exactly as without it.
#include <algorithm>
#include <cstdint>

#include "cp_async.cuh"
#include "gemv_common.cuh"
#include "int4_mma.cuh"
#include "moe_shared.cuh"
#include "pdl.cuh"

namespace qf::kern {
namespace gemv_detail {
namespace {

struct Int4Args {
  int tiles;          // tiles of 16 rows per matrix: ceil(n / 16)
  int items;          // items per slot: (k part, tile) pairs, k_splits * tiles
  int per_block;      // items per block (the slot's last block may have fewer)
  int part_segs;      // segments per k part: split_cols(k, k_splits) / 128
  int seg_shift;      // segment s lies in group s >> seg_shift
  uint32_t n_groups;  // scales per row: ceil(K / group)
  bool swiglu;        // paired rows (gemv.h): y = silu(gate) * up, n / 2 per slot
};

// 16 bytes global -> shared without a register (Ampere's LDGSTS; sm_90 and sm_121 alike),
// through L2 only (.cg): the weights are read once, so their lines are marked the first L2
// evicts (createpolicy and .L2::cache_hint: sm_80 and later). qforge-bench-gemv, against the
// default policy in one run: H100 MoE gate+up 77 -> 78-79%, down 75%, in_proj 80 -> 84%, q_proj
// 77 -> 81%; H200 66 -> 67%, 55 -> 56%, 70 -> 74%, 66 -> 70%. The 122B step, three pairs: H100
// 3094-3096 -> 3092 us, H200 2716-2719 -> 2704-2706 us. Not kept: the same hint on the other
// kernels' streaming loads (ld_stream: kern::lm_head with its argmax 99 -> 96%) and on the scale
// and zero loads (step 3096 -> 3166 us), the L2 prefetch-size hints .L2::128B (neutral) and
// .L2::256B (step +14 us; with evict_first: mixed).
__device__ __forceinline__ void cp_async16_evict_first(uint4* dst, const uint4* src) {
  const auto d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(d), "l"(src),
               "l"(policy)
               : "memory");
}
constexpr int kU = 3;          // units in flight per warp (the ring's slots)
constexpr int kPreWait = 2;    // of them issued before the PDL wait (launches not x-first)
constexpr int kMinBlocks = 2;  // resident blocks per SM the registers are budgeted for

// kShared: the first sh.rows rows of blocks (blockIdx.y < sh.rows, dispatched first) compute the
// FP8 shared expert's rows (moe_shared.cuh, gemv_moe) and slot s is block row sh.rows + s; a
// separate instance, so the plain kernel's code and registers stay as they were.
template <bool kShared>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    gemv_int4_mma_kernel(const DeviceLinear w, const float* __restrict__ x, float* __restrict__ y,
                         const GemvBatch b, const Int4Args args, const SharedArgs sh) {
  extern __shared__ uint4 smem[];  // limbs (k / 4 uint4), SegStats, then the partial sums
  if constexpr (kShared) {
    if (static_cast<int>(blockIdx.y) < sh.rows) {
      shared_fp8(sh, reinterpret_cast<float4*>(smem));  // x as padded float4s over the limbs
      return;
    }
  }
  const int slot = static_cast<int>(blockIdx.y) - (kShared ? sh.rows : 0);
  // The ids are the router's output: wait for it unless it ran two or more launches back.
  if (b.ids != nullptr && !b.ids_early) pdl::wait();
  const Mat m = expert(w, b, slot, b.ids_early);
  const int k = w.k, n = w.n, tiles = args.tiles, S = args.part_segs;
  // This block's items (k part, tile) of its slot: i_lo .. i_lo + n_items - 1, tile fastest;
  // its units: S per item (segment j of the item's part; j >= the part's length: none).
  const int i_lo = blockIdx.x * args.per_block;
  const int n_items = min(args.per_block, args.items - i_lo);
  const int n_units = n_items * S;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  // The warp's units: u_lo .. u_hi - 1, a contiguous share of the block's.
  const int u_lo = warp * n_units / kWarps, n_mine = (warp + 1) * n_units / kWarps - u_lo;
  const uint4* w4 = reinterpret_cast<const uint4*>(m.w);
  const int n_seg_all = k / kSegCols;

  // Where item i's rows are: quarter t of rows g and g + 8 of segment (gseg0 + j) at pa + j *
  // step (a tiled tile's 1 KB block, gemv.h, or the rows themselves in the last, partial tile),
  // their scales and zeros from sa / sb + group. 32-bit scale indices: < 2^32 per matrix.
  struct Src {
    const uint4 *pa, *pb;
    uint32_t sa, sb;
    int step, gseg0, ns;  // ns: segments of the item's part
  };
  auto locate = [&](int i) {
    const int part = i / tiles, tile = i - part * tiles;
    const int ra = min(tile * 16 + g, n - 1), rb = min(tile * 16 + g + 8, n - 1);
    Src s;
    s.gseg0 = part * S;
    s.ns = min(S, n_seg_all - s.gseg0);
    if (tile * 16 + 16 <= n) {
      s.pa = w4 + static_cast<size_t>(tile) * (k / 2) + lane + s.gseg0 * 64;
      s.pb = s.pa + 32;
      s.step = 64;
    } else {
      s.pa = w4 + static_cast<size_t>(ra) * (k / 32) + t + s.gseg0 * kSegChunks;
      s.pb = w4 + static_cast<size_t>(rb) * (k / 32) + t + s.gseg0 * kSegChunks;
      s.step = kSegChunks;
    }
    s.sa = static_cast<uint32_t>(ra) * args.n_groups;
    s.sb = static_cast<uint32_t>(rb) * args.n_groups;
    return s;
  };

  // A ring of kU units in shared memory (the weights, 1 KB each, by cp.async: no register
  // holds them in flight) and registers (scales and zeros): slot r holds the warp's units r,
  // r + kU, ...; a slot is refilled as soon as it has been used, so kU - 1 to kU units stay in
  // flight, across item boundaries. One cp.async group per unit (empty past the warp's last),
  // so the unit computed next is always the one kU - 1 groups back.
  uint4* ring = smem + k / 4 + n_seg_all + 64 * kU * warp + lane;  // [slot][a: 32, b: 32]
  uint32_t sza[kU], szb[kU];
  int li = u_lo / S, lj = u_lo - li * S, left = n_mine;  // the load cursor
  Src src = locate(i_lo + li);
  auto load_next = [&](int r) {
    if (lj < src.ns) {
      cp_async16_evict_first(ring + 64 * r, src.pa + lj * src.step);
      cp_async16_evict_first(ring + 64 * r + 32, src.pb + lj * src.step);
      const uint32_t grp = static_cast<uint32_t>(src.gseg0 + lj) >> args.seg_shift;
      sza[r] = load_scale_zero(m, src.sa + grp);
      szb[r] = load_scale_zero(m, src.sb + grp);
    }
    cp_async_commit();
    --left;
    if (++lj == S) {
      lj = 0;
      if (left > 0) src = locate(i_lo + ++li);
    }
  };
  // x's segments for this block: those of the parts its items lie in, four per warp at a time
  // (their L2 round trips overlap); each warp's first four are loaded ahead of the staging loop,
  // in the order below.
  const float* xg = x + (b.slots_per_x == 1 ? slot : slot / b.slots_per_x) * b.x_stride;
  const bool x_aligned = (reinterpret_cast<uintptr_t>(xg) & 15) == 0;
  const int xs_lo = i_lo / tiles * S;
  const int xs_hi = min(((i_lo + n_items - 1) / tiles + 1) * S, n_seg_all);
  const bool x_first = b.ids != nullptr && !b.ids_early;
  float4 xf[4];
  auto load_x = [&](int s0) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (s0 + j * kWarps < xs_hi) xf[j] = load_x4(xg, x_aligned, s0 + j * kWarps, lane);
    }
  };
  auto fill = [&](int r) {
    if (r < n_mine) {
      load_next(r);
    } else {
      cp_async_commit();
    }
  };
  // Weights, scales and zeros are not written by the previous kernel. A launch that has already
  // waited (for its ids) loads its first x before the whole ring, so that x does not queue behind
  // the weight stream; one that has not issues kPreWait units before the wait, then its first x
  // loads, then the rest of the ring, for the same reason (122B step against all three
  // before the wait: 3126 -> 3099, 3114 -> 3089 and 3109 -> 3083 us on three H100 machines, 2736
  // -> 2713 us on an H200; one unit before the wait, or two of a ring of four: slower).
  if (x_first) load_x(xs_lo + warp);
#pragma unroll
  for (int r = 0; r < (x_first ? kU : kPreWait); ++r) fill(r);
  pdl::wait();  // x is the previous kernel's output
  if (!x_first) {
    load_x(xs_lo + warp);
#pragma unroll
    for (int r = kPreWait; r < kU; ++r) fill(r);
  }

  // x into limbs while the first weight loads are in flight.
  uint32_t* xq = reinterpret_cast<uint32_t*>(smem);
  SegStat* stat = reinterpret_cast<SegStat*>(smem + k / 4);
  float* part_sums = reinterpret_cast<float*>(smem + k / 4 + n_seg_all + 64 * kU * kWarps);
  for (int s0 = xs_lo + warp; s0 < xs_hi; s0 += 4 * kWarps) {
    if (s0 != xs_lo + warp) load_x(s0);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (s0 + j * kWarps < xs_hi) stage_segment(xf[j], s0 + j * kWarps, lane, xq, stat);
    }
  }
  __syncthreads();

  const uint2* xb = reinterpret_cast<const uint2*>(smem) + lane;
  const uint2* st = reinterpret_cast<const uint2*>(stat) + (t & 1);
  float acc_a = 0.0f, acc_b = 0.0f;  // rows g and g + 8: the H (t = 0) or L (t = 1) part
  auto compute = [&](int r, int seg) {
    const uint2 zero2 = make_uint2(0, 0);
    const uint2* xs = xb + seg * 64;  // 4 blocks x 16 uint2
    const uint2 b0 = lane < 16 ? xs[0] : zero2, b1 = lane < 16 ? xs[16] : zero2;
    const uint2 b2 = lane < 16 ? xs[32] : zero2, b3 = lane < 16 ? xs[48] : zero2;
    cp_async_wait<kU - 1>();
    const uint4 a = ring[64 * r], c = ring[64 * r + 32];
    int dl[4] = {0, 0, 0, 0}, dh[4] = {0, 0, 0, 0};
    // Words 0, 1: blocks 0 (low nibbles) and 1 (high); words 2, 3: blocks 2 and 3.
    mma_u8s8(dl, a.x & kLowNibbles, c.x & kLowNibbles, a.y & kLowNibbles, c.y & kLowNibbles, b0);
    mma_u8s8(dh, a.x & ~kLowNibbles, c.x & ~kLowNibbles, a.y & ~kLowNibbles, c.y & ~kLowNibbles,
             b1);
    mma_u8s8(dl, a.z & kLowNibbles, c.z & kLowNibbles, a.w & kLowNibbles, c.w & kLowNibbles, b2);
    mma_u8s8(dh, a.z & ~kLowNibbles, c.z & ~kLowNibbles, a.w & ~kLowNibbles, c.w & ~kLowNibbles,
             b3);
    const uint2 ss = st[2 * seg];
    const float p = t < 2 ? __uint_as_float(ss.x) : 0.0f;
    const int sum = static_cast<int>(ss.y);
    const int za = static_cast<int>(sza[r] >> 16), zb = static_cast<int>(szb[r] >> 16);
    const int va = (dh[0] + 16 * dl[0]) * 256 + dh[1] + 16 * dl[1] - 16 * za * sum;
    const int vb = (dh[2] + 16 * dl[2]) * 256 + dh[3] + 16 * dl[3] - 16 * zb * sum;
    const float fa = __half2float(__ushort_as_half(static_cast<unsigned short>(sza[r])));
    const float fb = __half2float(__ushort_as_half(static_cast<unsigned short>(szb[r])));
    acc_a = fmaf(static_cast<float>(va) * fa, p, acc_a);
    acc_b = fmaf(static_cast<float>(vb) * fb, p, acc_b);
  };
  // The compute cursor: item ci (of the block), segment cj of its part; at the item's last unit
  // (or the warp's) the sums of rows g and g + 8 (H + L: lanes t = 2, 3 hold zeros) go to
  // part_sums[ci][warp].
  int ci = u_lo / S, cj = u_lo - ci * S;
  int c_gseg0 = (i_lo + ci) / tiles * S, c_ns = min(S, n_seg_all - c_gseg0);
  auto compute_next = [&](int r, bool warp_last) {
    if (cj < c_ns) compute(r, c_gseg0 + cj);
    if (cj == S - 1 || warp_last) {
      acc_a += __shfl_xor_sync(0xFFFFFFFFu, acc_a, 1);
      acc_b += __shfl_xor_sync(0xFFFFFFFFu, acc_b, 1);
      acc_a += __shfl_xor_sync(0xFFFFFFFFu, acc_a, 2);
      acc_b += __shfl_xor_sync(0xFFFFFFFFu, acc_b, 2);
      if (t == 0) {
        float* ps = part_sums + (ci * kWarps + warp) * 16;
        ps[g] = acc_a;
        ps[g + 8] = acc_b;
      }
      acc_a = acc_b = 0.0f;
    }
    if (++cj == S) {
      cj = 0;
      c_gseg0 = (i_lo + ++ci) / tiles * S;
      c_ns = min(S, n_seg_all - c_gseg0);
    }
  };
#pragma unroll 1
  for (int done = 0; done < n_mine; done += kU) {
#pragma unroll
    for (int r = 0; r < kU; ++r) {
      if (done + r < n_mine) {
        compute_next(r, done + r + 1 == n_mine);
        if (done + r + kU < n_mine) {
          load_next(r);
        } else {
          cp_async_commit();
        }
      }
    }
  }
  __syncthreads();

  // Each row's sum: its item's partial sums in warp order (the warps whose units meet the
  // item's), so the result does not depend on timing.
  const int rows = args.swiglu ? 8 : 16;  // outputs per item
  for (int idx = threadIdx.x; idx < n_items * rows; idx += kThreads) {
    const int it = idx / rows, r = idx - it * rows;
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) {
      const int lo = v * n_units / kWarps, hi = (v + 1) * n_units / kWarps;
      if (lo < hi && lo < (it + 1) * S && hi > it * S) {
        const float* ps = part_sums + (it * kWarps + v) * 16;
        s0 += ps[r];
        if (args.swiglu) s1 += ps[r + 8];
      }
    }
    const int item = i_lo + it, part = item / tiles, tile = item - part * tiles;
    float* yg = y + slot * b.y_stride + part * b.split_stride;
    if (args.swiglu) {  // paired rows: a tile holds gate 8T + r (row r), up 8T + r (row r + 8)
      yg[tile * 8 + r] = silu_mul(s0, s1);
    } else if (tile * 16 + r < n) {
      yg[tile * 16 + r] = s0;
    }
  }
}

// Retiles rows 16T .. 16T + 15 of matrix blockIdx.y in place: the block reads the tile's rows
// (row-major, 16 * k / 2 bytes) into shared memory, then writes its 1 KB segment blocks.
__global__ void __launch_bounds__(kThreads) int4_tile_kernel(uint32_t* w, int k, size_t mat_words) {
  extern __shared__ uint4 rows[];
  const size_t n4 = static_cast<size_t>(k) / 2;  // uint4 per tile: 16 rows of k / 32
  uint4* base = reinterpret_cast<uint4*>(w + blockIdx.y * mat_words) + blockIdx.x * n4;
  for (size_t i = threadIdx.x; i < n4; i += blockDim.x) rows[i] = base[i];
  __syncthreads();
  // Tiled uint4 j of segment s: row 8 (j / 32) + (j % 32) / 4, quarter j % 4.
  for (size_t i = threadIdx.x; i < n4; i += blockDim.x) {
    const int s = static_cast<int>(i / 64), j = static_cast<int>(i % 64);
    const int row = 8 * (j / 32) + (j % 32) / 4, q = j % 4;
    base[i] = rows[static_cast<size_t>(row) * (k / 32) + s * kSegChunks + q];
  }
}

// Dynamic shared memory: x's limbs and SegStats, the warps' rings (kU KB each), then
// per_block items x 8 warps x 16 partial sums.
size_t smem_bytes(int k, int per_block) {
  return size_t{4} * k + sizeof(SegStat) * (k / kSegCols) + size_t{1024} * kU * kWarps +
         sizeof(float) * 16 * kWarps * static_cast<size_t>(per_block);
}

// Blocks of the plain kernel with `smem` bytes resident per SM (past 48 KiB of shared memory:
// after the opt-in).
cudaError_t resident_blocks(size_t smem, int* per_sm) {
  cudaError_t e = cudaSuccess;
  if (smem > 48 * 1024) {
    e = cudaFuncSetAttribute(gemv_int4_mma_kernel<false>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  }
  if (e == cudaSuccess) {
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, gemv_int4_mma_kernel<false>, kThreads,
                                                      smem);
  }
  return e;
}

// The whole launch, its routed slots sized by launch_int4_mma.
template <bool kShared>
cudaError_t launch_kernel(const DeviceLinear& w, const float* x, float* y, const GemvBatch& b,
                          const Int4Args& args, const SharedArgs& sh, cudaStream_t stream) {
  size_t smem = smem_bytes(w.k, args.per_block);
  if (kShared) smem = std::max(smem, x_smem_bytes(sh.w.k));
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(gemv_int4_mma_kernel<kShared>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(static_cast<unsigned>((args.items + args.per_block - 1) / args.per_block),
                  b.n_slots + (kShared ? sh.rows : 0));
  return pdl::launch(gemv_int4_mma_kernel<kShared>, grid, kThreads, smem, stream, w, x, y, b, args,
                     sh);
}

}  // namespace

bool int4_mma_ok(const DeviceLinear& w, const GemvBatch& b) {
  if (w.k % kSegCols != 0 || w.k > kMaxSmemK) return false;
  if (reinterpret_cast<uintptr_t>(w.w) % 16 != 0) return false;
  if ((b.ids != nullptr || b.n_slots > 1) && w.w_stride % 4 != 0) return false;  // 16-byte experts
  if (w.group >= w.k) return true;
  const int spg = w.group / kSegCols;
  return w.group % kSegCols == 0 && (spg & (spg - 1)) == 0;
}

// Shape: one wave of resident blocks, each given an equal run of its slot's items (k part x
// tile), its warps an equal run of the block's units (segment of an item), so every warp streams
// the same number of 1 KB blocks and the ring does not drain at a tile's edge; the warps of an
// item meet in shared memory at the end. H200, against the ring in registers with K slices per
// tile (the kernel before): rings of 3 units at 2 blocks per SM beat 2, 4, 6, 8 and 12 units at
// 1 to 3 blocks (deeper rings and more blocks were slower, one block per SM slower still),
// INT4 MoE gate|up 57% -> 64% of copy bandwidth, the 122B step 3116 -> 2987 us. A shared
// expert (gemv_moe) adds rows of blocks beyond that wave.
cudaError_t launch_int4_mma(const DeviceLinear& w, const float* x, float* y, const GemvBatch& b,
                            cudaStream_t stream, bool swiglu, const SharedArgs* shared) {
  int device = 0, n_sm = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  Int4Args args;
  args.tiles = (w.n + 15) / 16;
  args.items = args.tiles * b.k_splits;
  args.part_segs = split_cols(w.k, b.k_splits) / kSegCols;
  args.seg_shift = w.group >= w.k ? 30 : __builtin_ctz(static_cast<unsigned>(w.group / kSegCols));
  args.n_groups = static_cast<uint32_t>((w.k + w.group - 1) / w.group);
  args.swiglu = swiglu;
  // Items per block for one wave; the partial sums' shared memory grows with them, so the
  // residency is taken again for the second pass. The same with a shared expert, so that the
  // routed slots sum in the same order (bit for bit gemv's).
  args.per_block = 1;
  for (int pass = 0; pass < 2; ++pass) {
    int per_sm = 0;
    if ((e = resident_blocks(smem_bytes(w.k, args.per_block), &per_sm)) != cudaSuccess) {
      return e;
    }
    if (per_sm == 0) return cudaErrorInvalidConfiguration;
    const long cap = std::max(1L, static_cast<long>(per_sm) * n_sm / b.n_slots);  // per slot
    args.per_block = static_cast<int>((args.items + cap - 1) / cap);
  }
  if (!shared) return launch_kernel<false>(w, x, y, b, args, SharedArgs{}, stream);
  // The shared expert's rows of blocks: as many as its bytes are routed experts' (at least 1).
  SharedArgs sh = *shared;
  sh.rows = static_cast<int>(
      std::clamp<size_t>((weight_bytes(shared->w) + weight_bytes(w) / 2) / weight_bytes(w), 1, 8));
  return launch_kernel<true>(w, x, y, b, args, sh, stream);
}

}  // namespace gemv_detail

cudaError_t int4_tile(void* w, int n, int k, size_t n_mats, size_t mat_words, cudaStream_t stream) {
  if (!int4_tiled(k) || n < 16 || n_mats == 0) return cudaSuccess;
  const size_t smem = size_t{8} * k;  // 16 rows of k / 2 bytes
  cudaError_t e =
      cudaFuncSetAttribute(gemv_detail::int4_tile_kernel,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  gemv_detail::int4_tile_kernel<<<dim3(n / 16, static_cast<unsigned>(n_mats)),
                                  gemv_detail::kThreads, smem, stream>>>(static_cast<uint32_t*>(w),
                                                                         k, mat_words);
  return cudaGetLastError();
}

}  // namespace qf::kern
