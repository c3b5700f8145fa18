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
// Work: a warp owns one m-tile (16 rows) and a contiguous range of its 128-column segments (a K
// slice); lane (g, t) = (lane / 4, lane % 4) loads quarter t of rows g and g + 8 of a segment:
// one contiguous 1 KB per segment in a tiled tile (gemv.h; 64 bytes of each row in the last,
// partial tile). A register ring keeps kU segments in flight, each slot refilled as soon as it
// has been used. The block's 8 warps are 8 / n_slices m-tiles; slices meet in shared memory,
// added in slice order (deterministic). Every block turns its slot's x into limbs in shared
// memory (one warp per segment): first the segments of every slice's first kU items, behind a
// barrier, while the first weight loads are in flight; then the rest, while the refills are.
//
// SwiGLU epilogue (gemv_swiglu, gemv.h): with paired rows a tile's rows g and g + 8 are a gate
// row and its up row, so lane (g, 0) (or, with slices, lane g of the slice reduction) holds both
// sums and writes silu(gate) * up; the sums are formed exactly as without it.
#include <algorithm>
#include <cstdint>

#include "gemv_common.cuh"
#include "pdl.cuh"

namespace qf::kern {
namespace gemv_detail {
namespace {

constexpr int kSegCols = 128;              // columns of a layout segment (gemv.h)
constexpr int kSegChunks = kSegCols / 32;  // 16-byte chunks of a row per segment (4)
constexpr uint32_t kLowNibbles = 0x0F0F0F0Fu;

struct Int4Args {
  int n_slices;       // warps per m-tile (1, 2, 4 or 8), each a contiguous range of segments
  int slice_shift;    // log2(n_slices)
  int per_slice;      // segments per slice: ceil(K / 128 / n_slices)
  int seg_shift;      // segment s lies in group s >> seg_shift
  uint32_t n_groups;  // scales per row: ceil(K / group)
  bool swiglu;        // paired rows (gemv.h): y = silu(gate) * up, n / 2 per slot
};

// silu(g) * u exactly as swiglu_kernel (ops.cu) evaluates it, so fusing changes no bit.
__device__ __forceinline__ float silu_mul(float g, float u) {
  return g * (1.0f / (1.0f + expf(-g))) * u;
}

// Shared memory: per 32-column block kb, 16 uint2 (lane g * 4 + t, g < 4): the B fragment of
// limb column g, .x = columns 32 kb + 4t .. +3, .y = columns 32 kb + 16 + 4t .. +3 (one byte
// each); then per segment a SegStat, read as two uint2 by lanes t = 0 (H) and t = 1 (L).
struct SegStat {
  uint32_t p_hi;  // f32 bits of 2^(e - 18) (NaN: x not finite)
  int32_t sum_hi;
  uint32_t p_lo;  // 2^(e - 34)
  int32_t sum_lo;
};
static_assert(sizeof(SegStat) == 16, "two uint2");

size_t smem_bytes(int k) {
  return size_t{4} * k + sizeof(SegStat) * (k / kSegCols);
}

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

// Segment s of x (columns 128 s ..; this lane's four in f) into limbs and its SegStat; one whole
// warp.
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
  // Columns 4 lane .. + 3: block 4 s + lane / 8, fragment half (lane / 4) % 2, t = lane % 4.
  const int kb = 4 * s + lane / 8, frag_half = (lane / 4) & 1, t = lane & 3;
#pragma unroll
  for (int g = 0; g < 4; ++g) xq[2 * (kb * 16 + g * 4 + t) + frag_half] = limb[g];
  if (lane == 0) {
    const bool finite = mx < 0x7F800000u;
    stat[s] = {finite ? static_cast<uint32_t>(e - 18 + 127) << 23 : 0x7FC00000u, sum_hi,
               finite ? static_cast<uint32_t>(e - 34 + 127) << 23 : 0x7FC00000u, sum_lo};
  }
}

// Group scale (f16 bits, low half) and zero (bits 16..23) of one row and group.
__device__ __forceinline__ uint32_t load_scale_zero(const Mat& m, uint32_t i) {
  return __half_as_ushort(__ldg(m.scales + i)) | static_cast<uint32_t>(__ldg(m.zeros + i)) << 16;
}

template <int kU>
__global__ void __launch_bounds__(kThreads, kU <= 2 ? 3 : 2)  // 80 / 128 registers
    gemv_int4_mma_kernel(const DeviceLinear w, const float* __restrict__ x, float* __restrict__ y,
                         const GemvBatch b, const Int4Args args) {
  extern __shared__ uint4 smem[];  // limbs (k / 4 uint4), then SegStats
  __shared__ float part[kWarps][16];
  const int slot = blockIdx.y / b.k_splits, k_part = blockIdx.y - slot * b.k_splits;
  if (b.ids != nullptr) pdl::wait();  // the ids are the router's output
  const Mat m = expert(w, b, slot);
  // This block's K range: segments seg0 .. seg0 + n_seg - 1 (all of them unless split).
  const int k = w.k, n = w.n, seg0 = k_part * (split_cols(k, b.k_splits) / kSegCols);
  const int n_seg = min(split_cols(k, b.k_splits) / kSegCols, k / kSegCols - seg0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n_slices = args.n_slices, slice = warp & (n_slices - 1);
  const int tile = (blockIdx.x << (3 - args.slice_shift)) + (warp >> args.slice_shift);
  const bool active = tile * 16 < n;  // warp-uniform; every warp reaches the barriers
  // Quarter t of rows g and g + 8 of segment s: a tiled tile's 1 KB block (gemv.h), or the rows
  // themselves in the last, partial tile. 32-bit scale indices: fewer than 2^32 per matrix.
  const uint4* w4 = reinterpret_cast<const uint4*>(m.w);
  const int ra = min(tile * 16 + g, n - 1), rb = min(tile * 16 + g + 8, n - 1);
  const bool tiled = tile * 16 + 16 <= n;
  const uint4* pa = tiled ? w4 + static_cast<size_t>(tile) * (k / 2) + lane
                          : w4 + static_cast<size_t>(ra) * (k / 32) + t;
  const uint4* pb = tiled ? pa + 32 : w4 + static_cast<size_t>(rb) * (k / 32) + t;
  const int seg_step = tiled ? 64 : kSegChunks;
  const uint32_t sa = static_cast<uint32_t>(ra) * args.n_groups;
  const uint32_t sb = static_cast<uint32_t>(rb) * args.n_groups;
  // The warp's segments: first .. first + n_mine - 1.
  const int first = seg0 + slice * args.per_slice;
  const int n_mine = active ? max(0, min(args.per_slice, seg0 + n_seg - first)) : 0;

  // A ring of kU segments in registers: slot u holds items u, u + kU, ...; a slot is refilled
  // as soon as it has been used, so kU - 1 to kU segments stay in flight.
  uint4 qa[kU], qb[kU];
  uint32_t sza[kU], szb[kU];
  auto load = [&](int u, int i) {
    const int seg = first + i;
    qa[u] = ld_stream(pa + seg * seg_step);
    qb[u] = ld_stream(pb + seg * seg_step);
    const uint32_t grp = static_cast<uint32_t>(seg) >> args.seg_shift;
    sza[u] = load_scale_zero(m, sa + grp);
    szb[u] = load_scale_zero(m, sb + grp);
  };
#pragma unroll
  for (int u = 0; u < kU; ++u) {  // weights, scales, zeros: not written by the previous kernel
    if (u < n_mine) load(u, u);
  }
  pdl::wait();  // x is the previous kernel's output

  // x into limbs in two phases: first the segments of every slice's first kU items, so that
  // compute (and the ring's refills) starts after a short barrier; the rest while those refills
  // are in flight.
  uint32_t* xq = reinterpret_cast<uint32_t*>(smem);
  SegStat* stat = reinterpret_cast<SegStat*>(smem + k / 4);
  const float* xg = x + slot * b.x_stride;
  const bool aligned = (reinterpret_cast<uintptr_t>(xg) & 15) == 0;
  auto stage = [&](bool early) {
    // Segment s is early when it is among the first kU of its slice. A warp's segments, four at
    // a time: their loads (L2 round trips) overlap.
    auto pick = [&](int j) {  // the j-th early or late segment, or -1
      if (early) {
        const int sl = j / kU, s = sl * args.per_slice + j % kU;
        return sl < n_slices && j % kU < args.per_slice && s < n_seg ? seg0 + s : -1;
      }
      // The part's range again from blockIdx.y and the parameters (cheaper than keeping it live
      // through the first items: kU = 6 spilled for sm_90).
      const int part_segs = split_cols(w.k, b.k_splits) / kSegCols;
      const int seg_lo = (static_cast<int>(blockIdx.y) % b.k_splits) * part_segs;
      const int seg_n = min(part_segs, w.k / kSegCols - seg_lo);
      const int per_late = max(args.per_slice - kU, 0), sl = per_late ? j / per_late : n_slices;
      const int s = sl * args.per_slice + kU + (per_late ? j % per_late : 0);
      return sl < n_slices && s < seg_n ? seg_lo + s : -1;
    };
    const int n_pick = early ? n_slices * kU : n_slices * max(args.per_slice - kU, 0);
    for (int j0 = warp; j0 < n_pick; j0 += 4 * kWarps) {
      float4 f[4];
      int sg[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        sg[j] = j0 + j * kWarps < n_pick ? pick(j0 + j * kWarps) : -1;
        if (sg[j] >= 0) f[j] = load_x4(xg, aligned, sg[j], lane);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (sg[j] >= 0) stage_segment(f[j], sg[j], lane, xq, stat);
      }
    }
  };
  stage(true);
  __syncthreads();

  const uint2* xb = reinterpret_cast<const uint2*>(smem) + lane;
  const uint2* st = reinterpret_cast<const uint2*>(stat) + (t & 1);
  float acc_a = 0.0f, acc_b = 0.0f;  // rows g and g + 8: the H (t = 0) or L (t = 1) part
  auto compute = [&](int u, int seg) {
    const uint2 zero2 = make_uint2(0, 0);
    const uint2* xs = xb + seg * 64;  // 4 blocks x 16 uint2
    const uint2 b0 = lane < 16 ? xs[0] : zero2, b1 = lane < 16 ? xs[16] : zero2;
    const uint2 b2 = lane < 16 ? xs[32] : zero2, b3 = lane < 16 ? xs[48] : zero2;
    const uint4 a = qa[u], c = qb[u];
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
    const int za = static_cast<int>(sza[u] >> 16), zb = static_cast<int>(szb[u] >> 16);
    const int va = (dh[0] + 16 * dl[0]) * 256 + dh[1] + 16 * dl[1] - 16 * za * sum;
    const int vb = (dh[2] + 16 * dl[2]) * 256 + dh[3] + 16 * dl[3] - 16 * zb * sum;
    const float fa = __half2float(__ushort_as_half(static_cast<unsigned short>(sza[u])));
    const float fb = __half2float(__ushort_as_half(static_cast<unsigned short>(szb[u])));
    acc_a = fmaf(static_cast<float>(va) * fa, p, acc_a);
    acc_b = fmaf(static_cast<float>(vb) * fb, p, acc_b);
  };
  auto run = [&](int i0, int i1) {  // items i0 .. i1 - 1 (i0 a multiple of kU)
#pragma unroll 1
    for (; i0 < i1; i0 += kU) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int i = i0 + u;
        if (i < i1) {
          compute(u, first + i);
          if (i + kU < n_mine) load(u, i + kU);
        }
      }
    }
  };
  run(0, min(n_mine, kU));
  if (args.per_slice > kU) {  // block-uniform
    stage(false);
    __syncthreads();
    run(kU, n_mine);
  }
  // H + L of each row (lanes t = 2, 3 hold zeros), then the slices in order.
  acc_a += __shfl_xor_sync(0xFFFFFFFFu, acc_a, 1);
  acc_b += __shfl_xor_sync(0xFFFFFFFFu, acc_b, 1);
  acc_a += __shfl_xor_sync(0xFFFFFFFFu, acc_a, 2);
  acc_b += __shfl_xor_sync(0xFFFFFFFFu, acc_b, 2);
  float* yg = y + slot * b.y_stride + k_part * b.split_stride;
  if (args.swiglu) {  // block-uniform; paired rows: a tile holds gate 8T + g (a), up 8T + g (b)
    if (n_slices == 1) {
      if (active && t == 0) yg[tile * 8 + g] = silu_mul(acc_a, acc_b);
      return;
    }
    if (t == 0) {
      part[warp][g] = acc_a;
      part[warp][g + 8] = acc_b;
    }
    __syncthreads();
    if (active && slice == 0 && lane < 8) {  // the slices in order, as for unpaired rows
      float sg = part[warp][lane], su = part[warp][lane + 8];
      for (int sl = 1; sl < n_slices; ++sl) {
        sg += part[warp + sl][lane];
        su += part[warp + sl][lane + 8];
      }
      yg[tile * 8 + lane] = silu_mul(sg, su);
    }
    return;
  }
  if (n_slices == 1) {
    if (active && t == 0) {
      if (tile * 16 + g < n) yg[tile * 16 + g] = acc_a;
      if (tile * 16 + g + 8 < n) yg[tile * 16 + g + 8] = acc_b;
    }
    return;
  }
  if (t == 0) {
    part[warp][g] = acc_a;
    part[warp][g + 8] = acc_b;
  }
  __syncthreads();
  if (active && slice == 0 && lane < 16) {
    float s = part[warp][lane];
    for (int sl = 1; sl < n_slices; ++sl) s += part[warp + sl][lane];
    const int row = tile * 16 + lane;
    if (row < n) yg[row] = s;
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

template <int kU>
cudaError_t launch_u(const DeviceLinear& w, const float* x, float* y, const GemvBatch& b,
                     cudaStream_t stream, const Int4Args& args, long tiles) {
  const long per_block = kWarps / args.n_slices;
  const dim3 grid(static_cast<unsigned>((tiles + per_block - 1) / per_block),
                  b.n_slots * b.k_splits);
  return pdl::launch(gemv_int4_mma_kernel<kU>, grid, kThreads, smem_bytes(w.k), stream, w, x, y, b,
                     args);
}

template <int kU>
cudaError_t resident_blocks(int k, long* per_sm) {
  int n = 0;
  const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_int4_mma_kernel<kU>,
                                                                      kThreads, smem_bytes(k));
  *per_sm = n;
  return e;
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

// Shape: kU segments in flight per warp (a register ring: 4, or 2 when that is what gives
// every SM at least 12 warps, or 6 when that holds a whole slice), and K split into as many
// slices as still fit every warp in one wave of resident blocks (a second wave starts late; a
// persistent grid would repeat x's staging). H200, 8 x [2048 x 3072]: 4 beats 2 and 6 by 9%;
// 8 x [3072 x 1024]: 2 beats 4 by 19% (two slices instead of one); 8 x [1024 x 3072]: 6 beats 4
// by 8%. One block per 8 tiles of 16 rows (no slices) loses a further 15%.
cudaError_t launch_int4_mma(const DeviceLinear& w, const float* x, float* y, const GemvBatch& b,
                            cudaStream_t stream, bool swiglu) {
  int device = 0, n_sm = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  const int n_seg = split_cols(w.k, b.k_splits) / kSegCols;  // per part
  const long tiles = (w.n + 15) / 16;                        // per slot
  const long n_parts = static_cast<long>(b.n_slots) * b.k_splits;
  auto slices_for = [&](long per_sm, int* slices) {  // one wave of per_sm blocks per SM
    *slices = 1;
    while (*slices < kWarps && *slices < n_seg &&
           (tiles * 2 * *slices + kWarps - 1) / kWarps * n_parts <= per_sm * n_sm) {
      *slices *= 2;
    }
  };
  long per_sm = 0;
  int u = 4, slices = 1;
  if ((e = resident_blocks<4>(w.k, &per_sm)) != cudaSuccess) return e;
  slices_for(per_sm, &slices);
  if (tiles * n_parts * slices < 12L * n_sm) {
    if ((e = resident_blocks<2>(w.k, &per_sm)) != cudaSuccess) return e;
    u = 2;
    slices_for(per_sm, &slices);
  }
  int per_slice = (n_seg + slices - 1) / slices;
  if (u == 4 && per_slice > 4 && per_slice <= 6) {
    if ((e = resident_blocks<6>(w.k, &per_sm)) != cudaSuccess) return e;
    if ((tiles * slices + kWarps - 1) / kWarps * n_parts <= per_sm * n_sm) u = 6;
  }
  Int4Args args;
  args.n_slices = slices;
  args.slice_shift = __builtin_ctz(static_cast<unsigned>(slices));
  args.per_slice = per_slice;
  args.seg_shift = w.group >= w.k ? 30 : __builtin_ctz(static_cast<unsigned>(w.group / kSegCols));
  args.n_groups = static_cast<uint32_t>((w.k + w.group - 1) / w.group);
  args.swiglu = swiglu;
  if (u == 2) return launch_u<2>(w, x, y, b, stream, args, tiles);
  if (u == 4) return launch_u<4>(w, x, y, b, stream, args, tiles);
  return launch_u<6>(w, x, y, b, stream, args, tiles);
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
