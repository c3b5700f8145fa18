// The FP8 shared expert's blocks in a routed-expert launch (gemv_moe, gemv.h): the INT4 tensor-core
// kernel (gemv_int4.cu) runs them as the first rows of its grid (blockIdx.y < rows), so
// the shared expert needs no launch, no graph branch and no join of its own.
//
// Work: the shared rows are cut into units of kRows rows (swiglu: kRows / 2 gate rows j and their
// up rows n / 2 + j, one output each); each block takes an equal run of the units, each warp every
// eighth unit of the run. A lane loads 16-byte chunks lane, lane + 32, ... (kCpl of them) of
// each row of its unit, all before using any (kRows * kCpl <= 12 loads: up to 6 KB a warp in
// flight), the first unit's before pdl::wait() (weights: pdl.cuh (a)). x is staged in shared
// memory as padded float4s (x_pos). Per chunk: 16 exact products e4m3 * x in f32 (two chains),
// then one fma by the chunk's block scale into the row's sum (a chunk lies in one 128-column
// block); rows are summed across the warp by reduce_rows, gate and up meet through one shuffle.
//
// Measured slower than the shared expert's own launches on a graph branch beside the router's
// (the engine's default; CudaOptions::shared_in_experts): H200, 122B synthetic, context 1024,
// 3159.6 against 2819.0 us per step; with the shared blocks counted into the routed launch's
// wave instead of added to it (the routed items then split differently, not bit for bit gemv),
// 3000 against 2827. The branch hides the shared expert behind the router and top-k launches,
// which leave the memory system idle; here its 9.4 MB a layer lengthen the two expert launches
// on the critical path.
//
// The shared expert's sigmoid gate can be folded into the down product's epilogue (SharedArgs::
// gate): sigmoid(g) * sum, so the MoE combine adds that output as it is.
//
// Numerics: the block scale multiplies a chunk's 16-term sum rather than each weight (gemv.cu
// rounds w = e4m3 * scale first): the same products up to one rounding per chunk, within
// gemv_test's bound for the chain length.
#pragma once

#include "gemv_common.cuh"
#include "mixer_common.cuh"
#include "pdl.cuh"

namespace qf::kern::gemv_detail {

struct SharedArgs {
  DeviceLinear w;     // kFp8 [n, k]: k % 16 == 0, k <= kSharedMaxK, block 2^i >= 16
  const float* x;     // [k]
  float* y;           // swiglu: [n / 2], else [n]
  int rows;           // rows of blocks (blockIdx.y < rows) that compute the shared product
  bool swiglu;        // rows j (gate) and n / 2 + j (up): y[j] = silu(gate) * up
  const float* gate;  // nullptr, or (not swiglu) the gate logit: y[j] = sigmoid(*gate) * sum
};

inline constexpr int kSharedMaxK = 3072;  // kCpl <= 6 chunks a lane per row

__device__ __forceinline__ float silu_mul(float g, float u) {  // as swiglu_kernel (ops.cu)
  return g * (1.0f / (1.0f + expf(-g))) * u;
}

// Rows of a unit: at most 12 loads a lane (more spill on sm_121), at least 2 (a gate | up pair).
template <int kCpl>
__host__ __device__ constexpr int shared_rows() {
  return kCpl == 1 ? 8 : kCpl <= 3 ? 4 : 2;
}

template <int kCpl>
__device__ __forceinline__ void shared_fp8_block(const SharedArgs& s, float4* xs) {
  constexpr int kRows = shared_rows<kCpl>();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int k = s.w.k, n = s.w.n, n_vec = k / 16;
  const int n_out = s.swiglu ? n / 2 : n, per_unit = s.swiglu ? kRows / 2 : kRows;
  const int n_units = (n_out + per_unit - 1) / per_unit;
  const int nb = s.rows * gridDim.x, bi = blockIdx.y * gridDim.x + blockIdx.x;
  const int u_lo = static_cast<int>(static_cast<long>(bi) * n_units / nb);
  const int u_hi = static_cast<int>(static_cast<long>(bi + 1) * n_units / nb);
  const uint4* w4 = static_cast<const uint4*>(s.w.w);
  const int n_cb = (k + s.w.block - 1) / s.w.block, cb_shift = __ffs(s.w.block / 16) - 1;

  // Row i of unit u (outputs past the end re-read the last row; their sums are dropped).
  const auto row = [&](int u, int i) {
    const int o = min(u * per_unit + (s.swiglu ? i % per_unit : i), n_out - 1);
    return s.swiglu && i >= per_unit ? o + n_out : o;
  };
  uint4 wv[kRows][kCpl];
  const auto load = [&](int u) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const uint4* p = w4 + static_cast<size_t>(row(u, i)) * n_vec;
#pragma unroll
      for (int c = 0; c < kCpl; ++c) {
        if (lane + 32 * c < n_vec) wv[i][c] = ld_stream(p + lane + 32 * c);
      }
    }
  };
  int u = u_lo + warp;
  if (u < u_hi) load(u);
  pdl::wait();  // x is an earlier kernel's output

  const float* xg = s.x;
  // The gate logit is an earlier kernel's output (the router's): read after the wait.
  const float sg = s.gate ? mixer::sigmoid(__ldg(s.gate)) : 1.0f;
  for (int l = threadIdx.x; l < k / 4; l += blockDim.x) {
    xs[x_pos(l)] = __ldg(reinterpret_cast<const float4*>(xg) + l);
  }
  __syncthreads();

  for (; u < u_hi; u += kWarps) {
    float acc[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = row(u, i);
      const float* bs = s.w.block_scale + static_cast<size_t>(r / s.w.block) * n_cb;
      acc[i] = 0.0f;
#pragma unroll
      for (int c = 0; c < kCpl; ++c) {
        const int v = lane + 32 * c;
        if (v >= n_vec) continue;
        const float4* xv = xs + x_pos(4 * v);  // chunk v: float4s 4v .. 4v + 3, no pad between
        float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint32_t word = q == 0   ? wv[i][c].x
                                : q == 1 ? wv[i][c].y
                                : q == 2 ? wv[i][c].z
                                         : wv[i][c].w;
          const float2 lo = e4m3x2(word & 0xFFFFu), hi = e4m3x2(word >> 16);
          const float4 xa = xv[q];
          d0 = fmaf(lo.x, xa.x, d0);
          d1 = fmaf(lo.y, xa.y, d1);
          d0 = fmaf(hi.x, xa.z, d0);
          d1 = fmaf(hi.y, xa.w, d1);
        }
        acc[i] = fmaf(d0 + d1, __ldg(bs + (v >> cb_shift)), acc[i]);
      }
    }
    if (u + kWarps < u_hi) load(u + kWarps);  // the warp's next unit, in flight during the sums
    const float t = reduce_rows<kRows>(acc, lane);  // lane l: row l / (32 / kRows) of the unit
    constexpr int kLanesPerRow = 32 / kRows;
    if (s.swiglu) {
      const float up = __shfl_down_sync(0xFFFFFFFFu, t, 16);  // row i + kRows / 2
      const int o = u * per_unit + lane / kLanesPerRow;
      if (lane < 16 && lane % kLanesPerRow == 0 && o < n_out) s.y[o] = silu_mul(t, up);
    } else {
      const int o = u * per_unit + lane / kLanesPerRow;
      if (lane % kLanesPerRow == 0 && o < n_out) s.y[o] = s.gate ? sg * t : t;
    }
  }
}

// The shared expert's part of a block: kCpl = ceil(k / 512) chunks a lane per row.
__device__ __forceinline__ void shared_fp8(const SharedArgs& s, float4* xs) {
  switch ((s.w.k / 16 + 31) / 32) {
    case 1:
      return shared_fp8_block<1>(s, xs);
    case 2:
      return shared_fp8_block<2>(s, xs);
    case 3:
      return shared_fp8_block<3>(s, xs);
    case 4:
      return shared_fp8_block<4>(s, xs);
    case 5:
      return shared_fp8_block<5>(s, xs);
    default:
      return shared_fp8_block<6>(s, xs);
  }
}

}  // namespace qf::kern::gemv_detail
