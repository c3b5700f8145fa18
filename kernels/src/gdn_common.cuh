// The Gated DeltaNet kernels' shared plan (gdn.cu: one token; gdn_prefill.cu: many): how a
// head's columns split into the blocks of a cluster and a block's threads into row groups, so
// that both kernels sum in the same order.
#pragma once

#include <algorithm>
#include <cstddef>

#include "mixer_common.cuh"
#include "qf/kern/gdn.h"

namespace qf::kern::gdn_detail {

constexpr int kRecurThreads = 256;  // preferred recurrence block size
constexpr int kMaxRows = 16;        // state rows one recurrence thread keeps in registers
constexpr int kMaxTiles = 8;        // column tiles per head = cluster size (portable maximum)
constexpr int kMaxKc = 8;           // conv taps a thread keeps in registers
constexpr int kConvSlots = 2;       // conv channels per thread: 2 dk + tile <= 2 threads
constexpr int kMaxTileCols = 128;   // dv <= 1024 = kMaxTiles * 128
// The Qwen3.5 shape (every released size): dk = dv = 128, a 4-tap conv, and its plan (32-column
// tiles, 8 row groups, 256 threads), for which gdn_decode takes an instance with them fixed.
constexpr int kFixedDk = 128, kFixedKc = 4, kFixedTile = 32, kFixedGroups = 8;

// The conv ring (GdnState::conv): slots per channel, and the slot of position q (q < 0: the
// zeros before position 0).
__host__ __device__ inline int ring_len(int kc) {
  return kc - 1 + kGdnMaxTokens;
}
__host__ __device__ inline int ring_slot(int q, int len) {
  const int r = q % len;
  return r < 0 ? r + len : r;
}

// A GdnReplay entry: k^ [Nk * dk] | delta [Nv * dv] | alpha [Nv]; where each part starts and
// the entry's floats (dk and dv given, so that the fixed-shape instance folds them).
struct ReplayEntry {
  int delta, alpha, floats;
};
__host__ __device__ inline ReplayEntry replay_entry(const GdnShape& s, int dk, int dv) {
  const int delta = s.n_k_heads * dk, alpha = delta + s.n_v_heads * dv;
  return {delta, alpha, alpha + s.n_v_heads};
}

struct Plan {
  int tile = 0;     // columns per block: min(32, dv rounded up to a power of two), doubled
                    // until n_tiles <= kMaxTiles; the last tile may be partly idle
  int groups = 0;   // row groups per block (block = tile * groups threads)
  int n_tiles = 0;  // ceil(dv / tile), the cluster size
};

inline Plan make_plan(const GdnShape& s) {
  Plan p;
  p.tile = 32;
  while (p.tile > 1 && p.tile / 2 >= s.dv) p.tile /= 2;
  while ((s.dv + p.tile - 1) / p.tile > kMaxTiles) p.tile *= 2;
  p.groups = std::min(s.dk, std::max(1, kRecurThreads / p.tile));
  p.groups = std::max(p.groups, (s.dk + kMaxRows - 1) / kMaxRows);
  p.n_tiles = (s.dv + p.tile - 1) / p.tile;
  return p;
}

inline bool supported(const GdnShape& s) {
  if (s.n_k_heads <= 0 || s.n_v_heads <= 0 || s.dk <= 0 || s.dv <= 0) return false;
  if (s.kc < 1 || s.kc > kMaxKc || s.dk > 1024 || s.dv > 1024) return false;
  if (s.n_v_heads % s.n_k_heads != 0) return false;
  const Plan p = make_plan(s);
  return p.n_tiles <= kMaxTiles && p.tile <= kMaxTileCols && p.tile * p.groups <= 1024 &&
         (s.dk + p.groups - 1) / p.groups <= kMaxRows &&
         2 * s.dk + p.tile <= kConvSlots * p.tile * p.groups;
}

#ifdef __CUDACC__
// The l2 norms' factors from each thread's sums of squares of its q and k channels (warp trees,
// then the warps in order: both kernels add in one order). Ends with the sums read after a
// block barrier; q^ = q * inv_q * q_scale, k^ = k * inv_k.
struct QkNorm {
  float inv_q, q_scale, inv_k;
};
__device__ __forceinline__ QkNorm qk_norm(double sq_q, double sq_k, double (&warp_sq)[2][32],
                                          int n_thr, int dk) {
  sq_q = mixer::warp_sum(sq_q);
  sq_k = mixer::warp_sum(sq_k);
  if ((threadIdx.x & 31) == 0) {
    warp_sq[0][threadIdx.x >> 5] = sq_q;
    warp_sq[1][threadIdx.x >> 5] = sq_k;
  }
  __syncthreads();
  double tq = 0, tk = 0;
  for (int w = 0; w < (n_thr >> 5); ++w) {
    tq += warp_sq[0][w];
    tk += warp_sq[1][w];
  }
  return {1.0f / sqrtf(static_cast<float>(tq) + 1e-6f), 1.0f / sqrtf(static_cast<float>(dk)),
          1.0f / sqrtf(static_cast<float>(tk) + 1e-6f)};
}

// One token of the delta rule for thread (g, col) of a recurrence block, which keeps rows
// d = g + groups i of the state column in st: decay by alpha; the prediction p = sum_d S[d] k[d]
// over the block's row groups (red_p [groups, tile], a barrier); S[d] += k[d] beta (v - p),
// with kStore each updated row also stored at S[d * dv] where live; the output partials
// sum_d S[d] q[d] summed over the row groups (red_o, a barrier). Returns the column's output
// to the g == 0 threads (0 to the others), and the column's delta to *delta_out where given.
// Spelled with __fmul_rn / __fmaf_rn, so that
// gdn_decode and gdn_prefill round alike whatever the compiler would contract.
template <bool kStore>
__device__ __forceinline__ float delta_rule(float (&st)[kMaxRows], int g, int groups, int col,
                                            int tile, int dk, const float* ks, const float* qs,
                                            float alpha, float beta, float v, float* red_p,
                                            float* red_o, bool live, float* S, size_t dv,
                                            float* delta_out = nullptr) {
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxRows; ++i) {
    const int d = g + groups * i;
    if (d < dk) {
      st[i] = __fmul_rn(st[i], alpha);
      acc = __fmaf_rn(st[i], ks[d], acc);
    }
  }
  red_p[g * tile + col] = acc;
  __syncthreads();
  float pred = 0.0f;
#pragma unroll 8
  for (int gi = 0; gi < groups; ++gi) pred += red_p[gi * tile + col];
  const float delta = beta * (v - pred);
  if (delta_out) *delta_out = delta;
  acc = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxRows; ++i) {
    const int d = g + groups * i;
    if (d < dk) {
      st[i] = __fmaf_rn(ks[d], delta, st[i]);
      if constexpr (kStore) {
        if (live) S[static_cast<size_t>(d) * dv] = st[i];
      }
      acc = __fmaf_rn(st[i], qs[d], acc);
    }
  }
  red_o[g * tile + col] = acc;
  __syncthreads();
  float o = 0.0f;
  if (g == 0) {
#pragma unroll 8
    for (int gi = 0; gi < groups; ++gi) o += red_o[gi * tile + col];
  }
  return o;
}

// Folds the first n_fold entries of replay buffer `parity` (GdnReplay) into rows d = g + groups i
// (i < kRows) of state column e of value head j (key head kh), held in st: per entry S <- alpha S,
// then S += k^ delta^T, the operations delta_rule made (so the bits are the steps'). Loads through
// L2 (the entries are a verify's, launches back: early loads, pdl.cuh (b)).
template <int kRows>
__device__ __forceinline__ void fold_replay(float (&st)[kRows], const GdnReplay& replay, int n_fold,
                                            int parity, ReplayEntry at, int kh, int j, int e,
                                            bool live, int g, int groups, int dk, int dv) {
  for (int f = 0; f < n_fold; ++f) {
    const float* en = replay.buf + static_cast<size_t>(parity * kGdnMaxTokens + f) * at.floats;
    const float alpha = __ldcg(en + at.alpha + j);
    const float delta = live ? __ldcg(en + at.delta + static_cast<size_t>(j) * dv + e) : 0.0f;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int d = g + groups * i;
      if (d < dk) st[i] = __fmaf_rn(__ldcg(en + kh * dk + d), delta, __fmul_rn(st[i], alpha));
    }
  }
}
#endif

}  // namespace qf::kern::gdn_detail
