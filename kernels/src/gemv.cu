// gemv: y = W x for batch-1 decode, every weight format of gemv.h, one launch per call
// (all expert slots of a GemvBatch in the same launch, ids read on the device). INT4 runs on the
// integer tensor cores (gemv_int4.cu) where its layout allows, else on the generic path here.
//
// Fast path for BF16, F32, INT8 and FP8 (rows 16-byte aligned, K <= kMaxSmemK, groups/blocks a
// power-of-two number of 16-byte chunks):
//   * a block of up to 8 warps stages x in shared memory once (padded: conflict-free float4
//     reads), after issuing its first weight loads;
//   * each warp owns kR (1, 2 or 4) consecutive rows; lane l streams 16-byte chunks l, l+32, ...
//     of each row with ld.global.nc.L1::no_allocate (a row is one contiguous stream, so a warp
//     reads 512 contiguous bytes per row per load), kU chunks per row in flight, and reuses every
//     x chunk for its kR rows;
//   * dequantization in registers, then one fma per weight into two accumulators per row;
//   * a transposed warp-shuffle reduction; one lane per row writes it.
//   Large grids become persistent (grid-stride over row tiles) so x is staged once per block.
//   Small N (router, shared expert) splits K over the warps of a block, sums meeting in shared
//   memory in a fixed order (Walk::kSplit).
// Generic path (any alignment, any group/block, any K): one warp per row, a 4-byte word (INT4/INT8)
// or one element per lane step, x read through the read-only cache.
//
// Exactness (the weights are those of qf/quant/formats.h, bit for bit):
//   INT4  (generic path) w = scale * (code - zero) as formats.h computes it.
//   INT8  f = 2^23 + code by PRMT, w = (f - (2^23 + zero)) * scale: both steps exact.
//   FP8   e4m3 -> f16 (cvt.rn.f16x2.e4m3x2, exact) -> f32 (exact), then w = e4m3 * block_scale,
//         the rounded f32 product, as the CPU reference.
//   BF16  the upper half of an f32; F32 as is.
// Then acc = fma(w, x, acc). Scales that are inf/NaN (never produced by a quantizer) may give NaN
// where the reference gives inf. Twin: gemv_ref.cpp. Test: tests/kernels/gemv_test.cpp.
//
// Launched with PDL (pdl.cuh): the fast kernel issues its first weight loads before waiting for
// the previous kernel (x and the expert ids are its outputs; weights, scales and zeros must not
// be written by the kernel launched just before on the stream: none is during a decode step).
// With expert ids it waits first, as the ids select the weights.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "gemv_common.cuh"
#include "moe_shared.cuh"
#include "pdl.cuh"
#include "qf/kern/gemv.h"
#include "qf/quant/formats.h"

namespace qf::kern {
namespace {

using gemv_detail::e4m3x2;
using gemv_detail::expert;
using gemv_detail::f16_bits_to_f32;
using gemv_detail::kMaxSmemK;
using gemv_detail::kThreads;
using gemv_detail::kWarps;
using gemv_detail::ld_stream;
using gemv_detail::Mat;
using gemv_detail::reduce_rows;
using gemv_detail::w_elem_bytes;
using gemv_detail::x_pos;
using gemv_detail::x_smem_bytes;

constexpr int kPersistFactor = 4;  // go persistent beyond this many waves of tiles
// Fast-path blocks per SM the register budget is cut for (ptxas must not spill): 4 x 256 threads
// = 64 registers where a lane holds at most 4 chunks; 8 chunks in flight need 80 (3 blocks).
// sm_12x (GB10: 1536 threads per SM, 273 GB/s over 48 SMs, so a few KiB in flight per SM
// suffice) gets 128 registers (2 blocks).
template <int kR, int kU>
constexpr int min_blocks() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
  return 2;
#else
  return kR * kU >= 8 ? 3 : 4;
#endif
}

// Bytes of one row of codes.
__host__ __device__ constexpr size_t row_bytes(WeightKind kind, int k) {
  switch (kind) {
    case WeightKind::kBf16:
      return size_t{2} * k;
    case WeightKind::kF32:
      return size_t{4} * k;
    case WeightKind::kInt4:
      return size_t(k) / 2;
    case WeightKind::kInt8:
    case WeightKind::kFp8:
      return size_t(k);
  }
  return 0;
}

__device__ __forceinline__ uint32_t word(const uint4& v, int q) {
  return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
}

// ---- fast path: per-format chunk decoders --------------------------------------------------

// Index of row r's first scale: INT8 r * G (its group scales and zeros), FP8 its row of
// block scales (32-bit: a matrix has fewer than 2^32 scales).
template <WeightKind kKind>
__device__ __forceinline__ uint32_t scale_row(const DeviceLinear& w, int r) {
  if constexpr (kKind == WeightKind::kInt8) {
    return static_cast<uint32_t>(r) * static_cast<uint32_t>((w.k + w.group - 1) / w.group);
  } else if constexpr (kKind == WeightKind::kFp8) {
    return static_cast<uint32_t>(r / w.block) *
           static_cast<uint32_t>((w.k + w.block - 1) / w.block);
  }
  return 0;
}

// Run-time constants of the fast kernel. The group (INT8) or column block (FP8) of chunk v
// is v >> gshift (2^gshift chunks per group: the fast path takes power-of-two multiples of a
// chunk). `magic` is 0x4B000000 (the bits of 2^23): passed at run time so that it lives in a
// register and (u & mask) | magic is one LOP3; as a literal the compiler splits it into two (a
// LOP3 takes one immediate).
struct FastArgs {
  int gshift;
  uint32_t magic;
  int n_slices;  // Walk::kSplit: warps per row group (2, 4 or 8)
  __device__ __forceinline__ int group(int v) const { return v >> gshift; }
};

// Per format: kCols columns per 16-byte chunk; Raw, the chunk's scale data as loaded; Param,
// the constants its decoder uses; dot(), the chunk of kR rows against x into the accumulators.
// INT8 group scale (f16 bits, low half) and zero (bits 16..23) in one register, loaded with
// the chunk and decoded when used.
struct ScaleZero {
  uint32_t bits;
  __device__ __forceinline__ float scale() const { return f16_bits_to_f32(bits & 0xFFFFu); }
  __device__ __forceinline__ float zero() const { return static_cast<float>(bits >> 16); }
};

__device__ __forceinline__ ScaleZero load_scale_zero(const Mat& m, uint32_t i) {
  return {__half_as_ushort(__ldg(m.scales + i)) | static_cast<uint32_t>(__ldg(m.zeros + i)) << 16};
}

template <WeightKind kKind>
struct Fmt;

template <>
struct Fmt<WeightKind::kInt8> {
  static constexpr int kCols = 16;
  using Raw = ScaleZero;
  struct Param {
    float s, fz;  // scale, 2^23 + zero
  };
  static __device__ __forceinline__ Raw load_raw(const Mat& m, uint32_t i) {
    return load_scale_zero(m, i);
  }
  static __device__ __forceinline__ Param param(const Raw& raw) {
    return {raw.scale(), 8388608.0f + raw.zero()};
  }
  // Byte j of u as (code - zero) * scale: PRMT builds the bits of 2^23 + code.
  template <int kJ>
  static __device__ __forceinline__ float at(uint32_t u, const Param& p, uint32_t magic) {
    return (__uint_as_float(__byte_perm(u, magic, 0x7440 | kJ)) - p.fz) * p.s;
  }
  template <int kR, class XAt>
  static __device__ __forceinline__ void dot(const uint4 (&wv)[kR], const Param (&p)[kR], XAt x_at,
                                             float (&acc)[kR][2], uint32_t magic) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 xa = x_at(q);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const uint32_t u = word(wv[r], q);
        acc[r][0] = fmaf(at<0>(u, p[r], magic), xa.x, acc[r][0]);
        acc[r][1] = fmaf(at<1>(u, p[r], magic), xa.y, acc[r][1]);
        acc[r][0] = fmaf(at<2>(u, p[r], magic), xa.z, acc[r][0]);
        acc[r][1] = fmaf(at<3>(u, p[r], magic), xa.w, acc[r][1]);
      }
    }
  }
};

template <>
struct Fmt<WeightKind::kFp8> {
  static constexpr int kCols = 16;
  struct Param {
    float s;
  };
  using Raw = Param;
  static __device__ __forceinline__ Raw load_raw(const Mat& m, uint32_t i) {
    return {__ldg(m.block_scale + i)};
  }
  static __device__ __forceinline__ Param param(const Raw& raw) { return raw; }
  template <int kR, class XAt>
  static __device__ __forceinline__ void dot(const uint4 (&wv)[kR], const Param (&p)[kR], XAt x_at,
                                             float (&acc)[kR][2], uint32_t magic) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 xa = x_at(q);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const uint32_t u = word(wv[r], q);
        const float2 lo = e4m3x2(u & 0xFFFFu), hi = e4m3x2(u >> 16);
        acc[r][0] = fmaf(lo.x * p[r].s, xa.x, acc[r][0]);
        acc[r][1] = fmaf(lo.y * p[r].s, xa.y, acc[r][1]);
        acc[r][0] = fmaf(hi.x * p[r].s, xa.z, acc[r][0]);
        acc[r][1] = fmaf(hi.y * p[r].s, xa.w, acc[r][1]);
      }
    }
  }
};

// The formats without scales: nothing to load or decode beside the chunk.
struct NoScales {
  struct Param {};
  using Raw = Param;
  static __device__ __forceinline__ Raw load_raw(const Mat&, uint32_t) { return {}; }
  static __device__ __forceinline__ Param param(const Raw&) { return {}; }
};

template <>
struct Fmt<WeightKind::kBf16> : NoScales {
  static constexpr int kCols = 8;
  template <int kR, class XAt>
  static __device__ __forceinline__ void dot(const uint4 (&wv)[kR], const Param (&)[kR], XAt x_at,
                                             float (&acc)[kR][2], uint32_t) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float4 xa = x_at(h);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const uint32_t u0 = word(wv[r], 2 * h), u1 = word(wv[r], 2 * h + 1);
        acc[r][0] = fmaf(__uint_as_float(u0 << 16), xa.x, acc[r][0]);
        acc[r][1] = fmaf(__uint_as_float(u0 & 0xFFFF0000u), xa.y, acc[r][1]);
        acc[r][0] = fmaf(__uint_as_float(u1 << 16), xa.z, acc[r][0]);
        acc[r][1] = fmaf(__uint_as_float(u1 & 0xFFFF0000u), xa.w, acc[r][1]);
      }
    }
  }
};

template <>
struct Fmt<WeightKind::kF32> : NoScales {
  static constexpr int kCols = 4;
  template <int kR, class XAt>
  static __device__ __forceinline__ void dot(const uint4 (&wv)[kR], const Param (&)[kR], XAt x_at,
                                             float (&acc)[kR][2], uint32_t) {
    const float4 xa = x_at(0);
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      acc[r][0] = fmaf(__uint_as_float(wv[r].x), xa.x, acc[r][0]);
      acc[r][1] = fmaf(__uint_as_float(wv[r].y), xa.y, acc[r][1]);
      acc[r][0] = fmaf(__uint_as_float(wv[r].z), xa.z, acc[r][0]);
      acc[r][1] = fmaf(__uint_as_float(wv[r].w), xa.w, acc[r][1]);
    }
  }
};

// How a fast-kernel warp walks its rows (template argument of gemv_fast_kernel):
//   kPlain  each warp owns kR rows of a tile and all their chunks, lane l reads chunks
//           l, l + 32, ...; blocks take tiles in grid-stride order (persistent grids).
//   kSplit  small N: the block's warps are n_warps / n_slices row groups of n_slices warps; the
//           warps of a group take K slices of the same kR rows (warp slice s reads chunks
//           l + 32 (s + n_slices u)), and their sums meet in shared memory, added in slice
//           order by slice 0 (deterministic). One tile per block, every warp reaches the barrier.
enum class Walk { kPlain, kSplit };

// A block of blockDim.x / 32 warps (1..kWarps); warp w of tile t owns rows (t * warps + w) * kR
// .. + kR - 1 (kSplit: row group w / n_slices) and loads kU chunks of each at a time before
// using them.
template <WeightKind kKind, int kR, int kU, Walk kWalk>
__global__ void __launch_bounds__(kThreads, min_blocks<kR, kU>())
    gemv_fast_kernel(const DeviceLinear w, const float* __restrict__ x, float* __restrict__ y,
                     const GemvBatch b, const FastArgs args) {
  using F = Fmt<kKind>;
  constexpr bool kSplit = kWalk == Walk::kSplit;
  constexpr int kP = F::kCols / 4;                  // float4s of x per chunk
  extern __shared__ float4 xs[];                    // x, padded (x_pos)
  __shared__ float part[kSplit ? kWarps * kR : 1];  // kSplit: per-warp row sums
  const int slot = blockIdx.y;
  if (b.ids != nullptr) pdl::wait();  // the ids are the router's output
  const Mat m = expert(w, b, slot);
  const int k = w.k, n = w.n;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const int n_vec = k / F::kCols;
  // kSplit: this warp's slice and row group; chunk u of a load round is 32 * n_slices chunks
  // after chunk u - 1 (kSplit) or 32 (else: a compile-time stride, immediate offsets).
  const int n_slices = kSplit ? args.n_slices : 1;
  const int slice = kSplit ? warp % n_slices : 0;
  const int group_warp = kSplit ? warp / n_slices : warp;
  const int n_groups = kSplit ? n_warps / n_slices : n_warps;
  const int ustride = kSplit ? 32 * n_slices : 32;
  const int v_first = lane + 32 * slice, v_step = ustride * kU;

  // The warp's rows: their first chunk and first scale as 32-bit indices (registers are the
  // limit here; an index costs one IMAD per load).
  const uint4* wbase = reinterpret_cast<const uint4*>(m.w);
  uint32_t w_row[kR], s_row[kR];
  auto set_rows = [&](int r0) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {  // rows past n re-read row n-1; their sums are dropped
      const int row = min(r0 + r, n - 1);
      w_row[r] = static_cast<uint32_t>(row) * static_cast<uint32_t>(n_vec);
      s_row[r] = scale_row<kKind>(w, row);
    }
  };
  uint4 wv[kU][kR];
  typename F::Raw raw[kU][kR];
  // Chunks v0 + ustride u into (dw, dr); lanes past the row's end load nothing. full: all kU are
  // inside the row.
  auto load_into = [&](uint4(&dw)[kU][kR], typename F::Raw(&dr)[kU][kR], int v0, auto full) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int v = v0 + ustride * u;
      if (decltype(full)::value || v < n_vec) {
        const uint32_t g = args.group(v);
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          dw[u][r] = ld_stream(wbase + (w_row[r] + v));
          dr[u][r] = F::load_raw(m, s_row[r] + g);
        }
      }
    }
  };
  auto load = [&](int v0, auto full) { load_into(wv, raw, v0, full); };
  // The first chunks' loads go out before x is staged, so the two latencies overlap.
  const int r_first = (blockIdx.x * n_groups + group_warp) * kR;
  set_rows(r_first);
  if (r_first < n) load(v_first, std::false_type{});
  pdl::wait();  // x is the previous kernel's output; before any return and any write of y

  const float* xg = x + (b.slots_per_x == 1 ? slot : slot / b.slots_per_x) * b.x_stride;
  const int n_x4 = k / 4;
  if ((reinterpret_cast<uintptr_t>(xg) & 15) == 0) {
    for (int l = threadIdx.x; l < n_x4; l += blockDim.x) {
      xs[x_pos(l)] = __ldg(reinterpret_cast<const float4*>(xg) + l);
    }
  } else {
    float* xf = reinterpret_cast<float*>(xs);
    for (int c = threadIdx.x; c < k; c += blockDim.x) xf[4 * x_pos(c / 4) + c % 4] = __ldg(xg + c);
  }
  __syncthreads();

  float* yg = y + slot * b.y_stride;
  // Accumulates the chunks v0 + ustride u held in (sw, sr).
  auto compute = [&](const uint4(&sw)[kU][kR], const typename F::Raw(&sr)[kU][kR],
                     float(&acc)[kR][2], int v0, auto full) {
    const float4* xv = xs + x_pos(v0 * kP);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (decltype(full)::value || v0 + ustride * u < n_vec) {
        typename F::Param prm[kR];
#pragma unroll
        for (int r = 0; r < kR; ++r) prm[r] = F::param(sr[u][r]);
        // chunk v0 + ustride u: x_pos advances 36 float4s per 32 (file comment at x_pos)
        const float4* xu = xv + (ustride / 32) * 36 * u * kP;
        F::dot(
            sw[u], prm, [&](int i) { return xu[i]; }, acc, args.magic);
      }
    }
  };
  // Row sums of acc -> lane l holds row l / (32 / kR) of the warp's rows.
  auto finish = [&](float(&acc)[kR][2]) {
    float sums[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) sums[r] = acc[r][0] + acc[r][1];
    return reduce_rows<kR>(sums, lane);
  };
  auto store = [&](int r0, float t) {
    const int row = r0 + lane / (32 / kR);
    if (lane % (32 / kR) == 0 && row < n) yg[row] = t;
  };
  // One tile's chunks from v0 on: load, compute (v0 = v_first: already loaded when pre).
  auto run_chunks = [&](float(&acc)[kR][2], auto pre) {
    int v0 = v_first;
    if constexpr (decltype(pre)::value) {
      if (v0 + ustride * (kU - 1) < n_vec) {
        compute(wv, raw, acc, v0, std::true_type{});
      } else {
        compute(wv, raw, acc, v0, std::false_type{});
      }
      v0 += v_step;
    }
#pragma unroll 1
    for (; v0 < n_vec; v0 += v_step) {
      if (v0 + ustride * (kU - 1) < n_vec) {  // the common case: no per-chunk guards
        load(v0, std::true_type{});
        compute(wv, raw, acc, v0, std::true_type{});
      } else {
        load(v0, std::false_type{});
        compute(wv, raw, acc, v0, std::false_type{});
      }
    }
  };

  if constexpr (kSplit) {
    const bool active = r_first < n;  // warp-uniform; every warp reaches the barrier
    float t = 0.0f;
    if (active) {
      float acc[kR][2] = {};
      run_chunks(acc, std::true_type{});
      t = finish(acc);
    }
    if (lane % (32 / kR) == 0) part[warp * kR + lane / (32 / kR)] = t;
    __syncthreads();
    if (active && slice == 0 && lane % (32 / kR) == 0) {
      const int i = lane / (32 / kR);
      float s = part[warp * kR + i];
      for (int sl = 1; sl < n_slices; ++sl) s += part[(warp + sl) * kR + i];
      const int row = r_first + i;
      if (row < n) yg[row] = s;
    }
  } else {
    if (r_first >= n) return;  // warp-uniform; no barrier follows
    {
      float acc[kR][2] = {};
      run_chunks(acc, std::true_type{});
      store(r_first, finish(acc));
    }
    const int tile_rows = n_warps * kR;
    const int n_tiles = (n + tile_rows - 1) / tile_rows;
    for (int tile = blockIdx.x + gridDim.x; tile < n_tiles; tile += gridDim.x) {
      const int r0 = (tile * n_warps + warp) * kR;
      if (r0 >= n) break;  // later tiles only start further down
      set_rows(r0);
      float acc[kR][2] = {};
      run_chunks(acc, std::false_type{});
      store(r0, finish(acc));
    }
  }
}

// ---- generic path ----------------------------------------------------------------------------

// Columns per unit a lane handles at a time: a u32 word of INT4/INT8 codes, else one element.
__host__ __device__ constexpr int unit_cols(WeightKind k) {
  return k == WeightKind::kInt4 ? 8 : k == WeightKind::kInt8 ? 4 : 1;
}

template <WeightKind kKind>
__device__ __forceinline__ float generic_unit(const Mat& m, const DeviceLinear& w, int n_groups,
                                              int r, int u, const float* x, float acc) {
  const int k = w.k;
  if constexpr (kKind == WeightKind::kBf16) {
    const auto* row = reinterpret_cast<const uint16_t*>(m.w) + static_cast<size_t>(r) * k;
    return fmaf(quant::bf16_to_f32(__ldg(row + u)), __ldg(x + u), acc);
  } else if constexpr (kKind == WeightKind::kF32) {
    const auto* row = reinterpret_cast<const float*>(m.w) + static_cast<size_t>(r) * k;
    return fmaf(__ldg(row + u), __ldg(x + u), acc);
  } else if constexpr (kKind == WeightKind::kFp8) {
    const auto* row = reinterpret_cast<const uint8_t*>(m.w) + static_cast<size_t>(r) * k;
    const int n_col_blocks = (k + w.block - 1) / w.block;
    const float s =
        __ldg(m.block_scale + static_cast<size_t>(r / w.block) * n_col_blocks + u / w.block);
    return fmaf(quant::e4m3fn_to_f32(__ldg(row + u)) * s, __ldg(x + u), acc);
  } else {
    constexpr int kBits = kKind == WeightKind::kInt4 ? 4 : 8;
    constexpr int kPer = 32 / kBits;
    const auto* words = reinterpret_cast<const uint32_t*>(m.w);
    const uint32_t wd =
        __ldg(words + (kKind == WeightKind::kInt4 ? int4_word_index(w.n, k, r, u)
                                                  : static_cast<size_t>(r) * (k / kPer) + u));
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      // INT4: the kernel layout's column of nibble j (gemv.h); INT8: byte j is column 4u + j.
      const int c = kKind == WeightKind::kInt4 ? int4_column(k, u, j) : u * kPer + j;
      const size_t gi = static_cast<size_t>(r) * n_groups + c / w.group;
      const uint32_t code = (wd >> (kBits * j)) & ((1u << kBits) - 1u);
      const float wf =
          quant::int4_dequant(code, __ldg(m.zeros + gi), __half_as_ushort(__ldg(m.scales + gi)));
      acc = fmaf(wf, __ldg(x + c), acc);
    }
    return acc;
  }
}

template <WeightKind kKind>
__global__ void __launch_bounds__(kThreads)
    gemv_generic_kernel(const DeviceLinear w, const float* __restrict__ x, float* __restrict__ y,
                        const GemvBatch b) {
  pdl::wait();
  const int slot = blockIdx.y;
  const int r = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (r >= w.n) return;
  const int lane = threadIdx.x & 31;
  const Mat m = expert(w, b, slot);
  const bool grouped = kKind == WeightKind::kInt4 || kKind == WeightKind::kInt8;
  const int n_groups = grouped ? (w.k + w.group - 1) / w.group : 0;
  const float* xg = x + (b.slots_per_x == 1 ? slot : slot / b.slots_per_x) * b.x_stride;
  const int n_units = w.k / unit_cols(kKind);
  float acc = 0.0f;
  for (int u = lane; u < n_units; u += 32) acc = generic_unit<kKind>(m, w, n_groups, r, u, xg, acc);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);
  if (lane == 0) y[slot * b.y_stride + r] = acc;
}

// ---- launchers -------------------------------------------------------------------------------

template <WeightKind kKind>
bool fast_path_ok(const DeviceLinear& w, const GemvBatch& b) {
  const size_t rb = row_bytes(kKind, w.k);
  const bool stacked = b.ids != nullptr || b.n_slots > 1;
  if (w.k > kMaxSmemK || rb % 16 != 0 || reinterpret_cast<uintptr_t>(w.w) % 16 != 0) return false;
  if (stacked && (w.w_stride * w_elem_bytes(kKind)) % 16 != 0) return false;
  // Groups / blocks of a power-of-two number of chunks (128, 64, 32, ...), or one per row (the
  // per-row INT8 LM head): a shift finds them.
  auto pow2_chunks = [&](int edge) {
    const int c = edge / Fmt<kKind>::kCols;
    return edge >= w.k || (edge % Fmt<kKind>::kCols == 0 && (c & (c - 1)) == 0);
  };
  if constexpr (kKind == WeightKind::kInt8) {
    return pow2_chunks(w.group);
  } else if constexpr (kKind == WeightKind::kFp8) {
    return pow2_chunks(w.block);
  }
  return true;
}

// Blocks of kThreads of the fast kernel resident per SM at this K.
template <WeightKind kKind, int kR, int kU, Walk kWalk>
cudaError_t resident_blocks(int k, int n_sm, long* resident) {
  int per_sm = 0;
  const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, gemv_fast_kernel<kKind, kR, kU, kWalk>, kThreads, x_smem_bytes(k));
  *resident = static_cast<long>(n_sm) * per_sm;
  return e;
}

template <WeightKind kKind>
FastArgs fast_args(const DeviceLinear& w, int n_slices) {
  FastArgs args{0, 0x4B000000u, n_slices};
  auto shift = [&](int edge) {  // one group per row: every chunk is in group 0
    return edge >= w.k ? 30 : __builtin_ctz(static_cast<unsigned>(edge / Fmt<kKind>::kCols));
  };
  if constexpr (kKind == WeightKind::kInt4 || kKind == WeightKind::kInt8) {
    args.gshift = shift(w.group);
  } else if constexpr (kKind == WeightKind::kFp8) {
    args.gshift = shift(w.block);
  }
  return args;
}

// Launches gemv_fast_kernel<kKind, kR, kU, kWalk> over all rows of all slots.
//   kPlain: blocks of 8 warps (fewer where that leaves SMs idle), one tile per block, or a
//           persistent grid of the resident blocks (grid-stride over tiles, x staged once per
//           block) when there are many waves of tiles.
//   kSplit: blocks of 8 warps, kWarps / n_slices row groups, one tile per block.
template <WeightKind kKind, int kR, int kU, Walk kWalk>
cudaError_t launch_fast(const DeviceLinear& w, const float* x, float* y, const GemvBatch& b,
                        int n_sm, cudaStream_t stream, int n_slices = 1) {
  const FastArgs args = fast_args<kKind>(w, n_slices);
  int n_warps = kWarps;
  if constexpr (kWalk == Walk::kPlain) {
    const long warps = (static_cast<long>(w.n) + kR - 1) / kR * b.n_slots;
    n_warps = static_cast<int>(std::clamp(warps / n_sm, 1L, static_cast<long>(kWarps)));
  }
  const int tile_rows = (kWalk == Walk::kSplit ? kWarps / n_slices : n_warps) * kR;
  const long tiles = (w.n + tile_rows - 1) / tile_rows;
  long grid_x = tiles;
  if (kWalk != Walk::kSplit && n_warps == kWarps) {
    long resident = 0;
    const cudaError_t e = resident_blocks<kKind, kR, kU, kWalk>(w.k, n_sm, &resident);
    if (e != cudaSuccess) return e;
    if (tiles * b.n_slots > kPersistFactor * resident) grid_x = std::max(1L, resident / b.n_slots);
  }
  return pdl::launch(gemv_fast_kernel<kKind, kR, kU, kWalk>,
                     dim3(static_cast<unsigned>(grid_x), b.n_slots), n_warps * 32,
                     x_smem_bytes(w.k), stream, w, x, y, b, args);
}

// Small N (fewer rows than 2 warps per SM slot of 8-warp blocks): split K over the warps of a
// block (Walk::kSplit, one row per warp) so that every SM gets warps and each lane has at most a
// few chunks: the fewest slices (2, 4, 8) that give 16 warps per SM, keeping >= 32 chunks per
// slice. Returns false where splitting does not apply.
template <WeightKind kKind>
bool launch_split(const DeviceLinear& w, const float* x, float* y, const GemvBatch& b, int n_sm,
                  cudaStream_t stream, cudaError_t* err) {
  const long rows = static_cast<long>(w.n) * b.n_slots;
  const int n_vec = w.k / Fmt<kKind>::kCols;
  const long want = 2L * kWarps * n_sm;
  if (rows >= want || n_vec < 64) return false;
  int slices = 2;
  while (slices < kWarps && rows * slices < want && n_vec / (2 * slices) >= 32) slices *= 2;
  const int per_lane = (n_vec + 32 * slices - 1) / (32 * slices);
  if (per_lane <= 1) {
    *err = launch_fast<kKind, 1, 1, Walk::kSplit>(w, x, y, b, n_sm, stream, slices);
  } else if (per_lane <= 2) {
    *err = launch_fast<kKind, 1, 2, Walk::kSplit>(w, x, y, b, n_sm, stream, slices);
  } else {
    *err = launch_fast<kKind, 1, 4, Walk::kSplit>(w, x, y, b, n_sm, stream, slices);
  }
  return true;
}

// Shape of the fast path. Loads in flight per lane (kR rows x kU chunks) carry the bandwidth:
// decode launches are a few microseconds long, so each warp should fetch its rows in one or two
// round trips. Small N splits K (launch_split). Rows per warp divide the x reads from shared
// memory: 1 row per warp when that is needed to give every SM warps, else 4 (x reuse, fewer
// reductions). INT4 goes to the tensor-core kernel where its layout allows, else generic.
template <WeightKind kKind>
cudaError_t launch(const DeviceLinear& w, const float* x, float* y, const GemvBatch& b,
                   cudaStream_t stream) {
  bool fast = false;
  if constexpr (kKind == WeightKind::kInt4) {
    if (gemv_detail::int4_mma_ok(w, b)) return gemv_detail::launch_int4_mma(w, x, y, b, stream);
  } else {
    fast = fast_path_ok<kKind>(w, b);
  }
  if (!fast) {
    const dim3 grid((w.n + kWarps - 1) / kWarps, b.n_slots);
    return pdl::launch(gemv_generic_kernel<kKind>, grid, kThreads, 0, stream, w, x, y, b);
  }
  if constexpr (kKind != WeightKind::kInt4) {
    int device = 0, n_sm = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, device);
    if (e != cudaSuccess) return e;
    if (launch_split<kKind>(w, x, y, b, n_sm, stream, &e)) return e;
    const int per_lane = (w.k / Fmt<kKind>::kCols + 31) / 32;  // chunks of a row per lane
    const long rows = static_cast<long>(w.n) * b.n_slots;
    if (rows >= 4L * kWarps * n_sm) {  // 4 rows per warp still fills every SM with 8 warps
      // INT8 / FP8 at 4 x 2 chunks would spill at 80 registers; 4 x 1 already keeps 64 KiB per
      // SM in flight (the LM head: many tiles per block, persistent).
      if constexpr (kKind == WeightKind::kInt8 || kKind == WeightKind::kFp8) {
        return launch_fast<kKind, 4, 1, Walk::kPlain>(w, x, y, b, n_sm, stream);
      } else {
        if (per_lane <= 1) return launch_fast<kKind, 4, 1, Walk::kPlain>(w, x, y, b, n_sm, stream);
        return launch_fast<kKind, 4, 2, Walk::kPlain>(w, x, y, b, n_sm, stream);
      }
    }
    if (per_lane <= 1) return launch_fast<kKind, 1, 1, Walk::kPlain>(w, x, y, b, n_sm, stream);
    if (per_lane <= 2) return launch_fast<kKind, 1, 2, Walk::kPlain>(w, x, y, b, n_sm, stream);
    if constexpr (kKind == WeightKind::kInt8) {  // 8 chunks of INT8 spill at 80 registers
      return launch_fast<kKind, 1, 4, Walk::kPlain>(w, x, y, b, n_sm, stream);
    } else {
      if (per_lane <= 4) return launch_fast<kKind, 1, 4, Walk::kPlain>(w, x, y, b, n_sm, stream);
      return launch_fast<kKind, 1, 8, Walk::kPlain>(w, x, y, b, n_sm, stream);
    }
  }
  return cudaSuccess;
}

bool valid(const DeviceLinear& w, const float* x, const float* y, const GemvBatch& b) {
  if (w.n < 0 || w.k < 0 || b.n_slots < 0 || b.n_slots > 65535 || b.slots_per_x < 1) return false;
  if (b.k_splits < 1 || (b.k_splits > 1 && !gemv_k_split_ok(w, b))) return false;
  if (w.n == 0 || b.n_slots == 0) return true;
  if (y == nullptr || (w.k > 0 && (x == nullptr || w.w == nullptr))) return false;
  switch (w.kind) {
    case WeightKind::kInt4:
    case WeightKind::kInt8:
      return w.k % unit_cols(w.kind) == 0 && w.group > 0 && w.scales && w.zeros;
    case WeightKind::kFp8:
      return w.block > 0 && w.block_scale;
    case WeightKind::kBf16:
    case WeightKind::kF32:
      return true;
  }
  return false;
}

}  // namespace

cudaError_t gemv(const DeviceLinear& w, const float* x, float* y, const GemvBatch& batch,
                 cudaStream_t stream) {
  if (!valid(w, x, y, batch)) return cudaErrorInvalidValue;
  if (w.n == 0 || batch.n_slots == 0) return cudaSuccess;
  switch (w.kind) {
    case WeightKind::kBf16:
      return launch<WeightKind::kBf16>(w, x, y, batch, stream);
    case WeightKind::kF32:
      return launch<WeightKind::kF32>(w, x, y, batch, stream);
    case WeightKind::kInt4:
      return launch<WeightKind::kInt4>(w, x, y, batch, stream);
    case WeightKind::kInt8:
      return launch<WeightKind::kInt8>(w, x, y, batch, stream);
    case WeightKind::kFp8:
      return launch<WeightKind::kFp8>(w, x, y, batch, stream);
  }
  return cudaErrorInvalidValue;
}

bool gemv_k_split_ok(const DeviceLinear& w, const GemvBatch& batch) {
  if (batch.k_splits == 1) return true;
  return w.kind == WeightKind::kInt4 && batch.k_splits > 1 && batch.k_splits <= w.k / 128 &&
         static_cast<long>(batch.n_slots) * batch.k_splits <= 65535 &&
         gemv_detail::int4_mma_ok(w, batch);
}

bool gemv_swiglu_ok(const DeviceLinear& w, const GemvBatch& batch) {
  return w.kind == WeightKind::kInt4 && w.n % (2 * kSwigluPairRows) == 0 &&
         gemv_detail::int4_mma_ok(w, batch);
}

bool gemv_swiglu_shape_ok(WeightKind kind, int n_h, int k, int group) {
  if (kind != WeightKind::kInt4 || n_h <= 0 || k <= 0 || group <= 0) return false;
  DeviceLinear w;
  w.kind = kind;
  w.n = 2 * n_h;
  w.k = k;
  w.group = group;
  w.w = reinterpret_cast<const void*>(uintptr_t{256});  // the loader's alignment
  w.w_stride = static_cast<size_t>(w.n) * (k / 8);
  return k % 8 == 0 && gemv_swiglu_ok(w, GemvBatch{2, nullptr, 0, 0});
}

cudaError_t gemv_swiglu(const DeviceLinear& w, const float* x, float* h, const GemvBatch& batch,
                        cudaStream_t stream) {
  if (!valid(w, x, h, batch)) return cudaErrorInvalidValue;
  if (w.n == 0 || batch.n_slots == 0) return cudaSuccess;
  if (!gemv_swiglu_ok(w, batch) || batch.k_splits != 1) return cudaErrorNotSupported;
  return gemv_detail::launch_int4_mma(w, x, h, batch, stream, true);
}

bool gemv_moe_ok(const DeviceLinear& experts, const GemvBatch& batch, bool swiglu,
                 const SharedProduct& shared) {
  const DeviceLinear& w = shared.w;
  const bool routed =
      swiglu ? gemv_swiglu_ok(experts, batch)
             : experts.kind == WeightKind::kInt4 && gemv_detail::int4_mma_ok(experts, batch);
  return routed && batch.k_splits == 1 && w.kind == WeightKind::kFp8 && w.n > 0 &&
         (!swiglu || w.n % 2 == 0) && w.k > 0 && w.k % 16 == 0 && w.k <= gemv_detail::kSharedMaxK &&
         w.block >= 16 && (w.block & (w.block - 1)) == 0 &&
         reinterpret_cast<uintptr_t>(w.w) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(shared.x) % 16 == 0 && batch.n_slots + 8 <= 65535;
}

cudaError_t gemv_moe(const DeviceLinear& experts, const float* x, float* y, const GemvBatch& batch,
                     bool swiglu, const SharedProduct& shared, cudaStream_t stream) {
  if (!valid(experts, x, y, batch) || !valid(shared.w, shared.x, shared.y, GemvBatch{})) {
    return cudaErrorInvalidValue;
  }
  if (experts.n == 0 || batch.n_slots == 0) return cudaErrorNotSupported;
  if (!gemv_moe_ok(experts, batch, swiglu, shared)) return cudaErrorNotSupported;
  if (swiglu && shared.gate) return cudaErrorInvalidValue;  // the gate goes on the down product
  // rows: set by the launch
  const gemv_detail::SharedArgs sh{shared.w, shared.x, shared.y, 0, swiglu, shared.gate};
  return gemv_detail::launch_int4_mma(experts, x, y, batch, stream, swiglu, &sh);
}

}  // namespace qf::kern
