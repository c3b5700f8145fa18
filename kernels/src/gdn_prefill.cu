// Gated DeltaNet over many tokens (gdn_prefill, qf/kern/gdn.h): gdn_decode's arithmetic, token
// by token in the same order, split so that the recurrence is the only sequential part:
//   1. gdn_prefill_conv_kernel, grid (token, key head): the conv + SiLU of every channel, the q
//      and k channels by the same threads and slots as gdn_decode (so their sums of squares are
//      added in its order), q and k scaled by their l2 norms; into the scratch [n, conv_dim]
//      (for the Qwen3.5 shape each head's q and k rows in the warp kernel's order, below); and
//      each value head's decay alpha and beta into gates [n, Nv].
//   2. gdn_prefill_recur_warp_kernel, grid (column tile, value head) as gdn_decode: the block
//      keeps its tile of the state in registers across the tokens, each warp whole columns (its
//      lanes a column's row groups), so a column's groups add their sums by shuffles, in group
//      order as gdn_decode adds them from shared memory, and each warp goes through the tokens
//      on its own, its inputs loaded a token ahead; it writes each token's o (before the norm)
//      to the scratch [n, Nv * dv]. Where a warp cannot hold whole columns (row groups not
//      dividing 32), gdn_prefill_recur_kernel: gdn_decode's thread layout, q and k in shared
//      memory and three block barriers a token.
//   3. gdn_prefill_norm_kernel, grid (token, value head): the gated RMSNorm, the head's sum of
//      squares added per tile in column order, then the tiles in order, as gdn_decode's cluster.
//   4. gdn_prefill_hist_kernel: the last kc - 1 inputs of each channel into the conv ring
//      (GdnState::conv), after launch 1 has read the slots before *pos.
// The state is read and written once per layer, not once per token: the recurrence's cost is
// its per-token chain, bound by its loads and shuffles rather than its arithmetic (H100,
// 122B-A10B, 1024 tokens, the four launches a layer: 1205 us with the barrier kernel for every
// shape, 1060 with the warp kernel loading a row at a time, 919 with its rows in 16-byte loads).
// Both files spell their products and sums with __fmul_rn / __fmaf_rn, so that the compiler
// cannot contract them differently in the two kernels (gdn_test checks the bits).
#include <algorithm>
#include <cstdint>

#include "gdn_common.cuh"
#include "mixer_common.cuh"
#include "qf/kern/gdn.h"

namespace qf::kern {
namespace {

using namespace gdn_detail;
using mixer::silu;

constexpr int kPrefillThreads = 256;  // blocks of the conv and recurrence kernels, at most
constexpr int kAhead = 8;             // tokens the recurrence prefetches its inputs ahead

struct Dims {
  int dk, dv, kc, key_dim, r, conv_dim, n_v;
  int ring;    // the conv ring's slots
  size_t nvd;  // floats of a token's output
};

Dims dims_of(const GdnShape& s) {
  Dims d;
  d.dk = s.dk, d.dv = s.dv, d.kc = s.kc, d.key_dim = s.n_k_heads * s.dk;
  d.r = s.n_v_heads / s.n_k_heads, d.conv_dim = s.conv_dim(), d.n_v = s.n_v_heads;
  d.nvd = static_cast<size_t>(s.n_v_heads) * s.dv;
  d.ring = ring_len(s.kc);
  return d;
}

// Channel ch of token t (at position pos + t) through the causal conv and SiLU: inputs before
// token 0 come from the conv ring, summed as gdn_decode sums them (the newest tap first).
__device__ __forceinline__ float conv_at(const float* __restrict__ qkv, size_t ld,
                                         const float* __restrict__ conv_state, int ring,
                                         int conv_dim, int pos, const float* __restrict__ w, int kc,
                                         int ch, int t) {
  const int n_hist = kc - 1;
  const float* wc = w + static_cast<size_t>(ch) * kc;
  float acc = __fmul_rn(__ldg(wc + n_hist), qkv[static_cast<size_t>(t) * ld + ch]);
  for (int tt = 0; tt < n_hist; ++tt) {
    const int src = t - n_hist + tt;
    const float in =
        src >= 0 ? qkv[static_cast<size_t>(src) * ld + ch]
                 : conv_state[static_cast<size_t>(ring_slot(pos + src, ring)) * conv_dim + ch];
    acc = __fmaf_rn(__ldg(wc + tt), in, acc);
  }
  return silu(acc);
}

// Also each of the key head's value heads' decay alpha and beta for token t into gates [n, Nv],
// gdn_decode's expressions, for either recurrence kernel.
__global__ void __launch_bounds__(kPrefillThreads)
    gdn_prefill_conv_kernel(Dims d, const float* __restrict__ qkv, size_t ld,
                            const float* __restrict__ conv_w, const int* __restrict__ pos_p,
                            const float* __restrict__ conv_state, float* __restrict__ xs,
                            GdnParams p, const float* __restrict__ b, const float* __restrict__ a,
                            float2* __restrict__ gates, int t_groups) {
  __shared__ double warp_sq[2][32];
  const int t = blockIdx.x, kh = blockIdx.y, tid = threadIdx.x, n_thr = blockDim.x;
  // Where q or k channel c of the head goes: c, or with t_groups > 0 (the warp recurrence's kT)
  // row c = g + t_groups i at 4 t_groups (i / 4) + 4 g + i % 4: the four rows i = 4m .. 4m + 3
  // of every group g side by side, one 128-byte line for t_groups 8.
  const auto qk_at = [&](int c) {
    if (t_groups == 0) return c;
    const int g = c % t_groups, i = c / t_groups;
    return 4 * t_groups * (i / 4) + 4 * g + i % 4;
  };
  for (int jj = tid; jj < d.r; jj += n_thr) {
    const int j = kh * d.r + jj;
    const float neg_a = -expf(__ldg(p.a_log + j)), dt_bias = __ldg(p.dt_bias + j);
    const float beta = mixer::sigmoid(b[static_cast<size_t>(t) * ld + j]);
    const float alpha = expf(neg_a * mixer::softplus(a[static_cast<size_t>(t) * ld + j] + dt_bias));
    gates[static_cast<size_t>(t) * d.n_v + j] = make_float2(alpha, beta);
  }
  const int pos = *pos_p;
  float* row = xs + static_cast<size_t>(t) * d.conv_dim;
  // q and k: slot c = tid + n_thr i as gdn_decode (c < dk: q channel c, then k channel c - dk).
  float y[kConvSlots];
  double sq_q = 0, sq_k = 0;
#pragma unroll
  for (int i = 0; i < kConvSlots; ++i) {
    const int c = tid + n_thr * i;
    y[i] = 0.0f;
    if (c >= 2 * d.dk) continue;
    const int ch = c < d.dk ? kh * d.dk + c : d.key_dim + kh * d.dk + c - d.dk;
    y[i] = conv_at(qkv, ld, conv_state, d.ring, d.conv_dim, pos, conv_w, d.kc, ch, t);
    if (c < d.dk) {
      sq_q = __fma_rn(static_cast<double>(y[i]), y[i], sq_q);
    } else {
      sq_k = __fma_rn(static_cast<double>(y[i]), y[i], sq_k);
    }
  }
  // v: the channels of this key head's value heads, in any order (no reduction).
  const int v0 = 2 * d.key_dim + kh * d.r * d.dv;
  for (int c = tid; c < d.r * d.dv; c += n_thr) {
    row[v0 + c] = conv_at(qkv, ld, conv_state, d.ring, d.conv_dim, pos, conv_w, d.kc, v0 + c, t);
  }
  const QkNorm nq = qk_norm(sq_q, sq_k, warp_sq, n_thr, d.dk);
#pragma unroll
  for (int i = 0; i < kConvSlots; ++i) {
    const int c = tid + n_thr * i;
    if (c < d.dk) {
      row[kh * d.dk + qk_at(c)] = y[i] * nq.inv_q * nq.q_scale;
    } else if (c < 2 * d.dk) {
      row[d.key_dim + kh * d.dk + qk_at(c - d.dk)] = y[i] * nq.inv_k;
    }
  }
}

// A recurrence thread's rows g + groups i of its state column (S: the column's first row, rows
// dv apart): into st (zeros past dk, or for a column past dv), and back.
__device__ __forceinline__ void column_rows(float (&st)[kMaxRows], const float* S, int g,
                                            int groups, int dk, int dv, bool live) {
#pragma unroll
  for (int i = 0; i < kMaxRows; ++i) {
    const int d = g + groups * i;
    st[i] = live && d < dk ? S[static_cast<size_t>(d) * dv] : 0.0f;
  }
}
__device__ __forceinline__ void store_rows(const float (&st)[kMaxRows], float* S, int g, int groups,
                                           int dk, int dv, bool live) {
#pragma unroll
  for (int i = 0; i < kMaxRows; ++i) {
    const int d = g + groups * i;
    if (live && d < dk) S[static_cast<size_t>(d) * dv] = st[i];
  }
}

// The recurrence with gdn_decode's thread layout, where a warp cannot hold whole columns.
__global__ void __launch_bounds__(kPrefillThreads, 1)
    gdn_prefill_recur_kernel(Dims dm, Plan pl, const float* __restrict__ xs,
                             const float2* __restrict__ gates, int n, float* __restrict__ ssm,
                             float* __restrict__ o_raw) {
  extern __shared__ __align__(16) float smem[];  // k^ [dk] | q^ [dk] | red_p | red_o
  const int dk = dm.dk, dv = dm.dv, tile = pl.tile, groups = pl.groups, n_thr = tile * groups;
  const int j = blockIdx.y, tid = threadIdx.x, kh = j / dm.r;
  const int col = tid % tile, g = tid / tile, e = blockIdx.x * tile + col;
  const bool live = e < dv;
  float* ks = smem;
  float* qs = smem + dk;
  float* red_p = smem + 2 * dk;
  float* red_o = red_p + groups * tile;
  float* S = ssm + static_cast<size_t>(j) * dk * dv + e;
  float st[kMaxRows];
  column_rows(st, S, g, groups, dk, dv, live);
  // Token t's inputs, fetched one token ahead: this thread's q / k elements (slots tid +
  // n_thr i < 2 dk: q then k), its v column, alpha and beta (the conv kernel's gates).
  float pre[kConvSlots], pre_v = 0;
  float2 pre_ab = {0.0f, 0.0f};
  const auto fetch = [&](int t) {
    const float* row = xs + static_cast<size_t>(t) * dm.conv_dim;
#pragma unroll
    for (int i = 0; i < kConvSlots; ++i) {
      const int c = tid + n_thr * i;
      pre[i] = c < dk ? row[kh * dk + c] : c < 2 * dk ? row[dm.key_dim + kh * dk + c - dk] : 0.0f;
    }
    pre_v = live ? row[2 * dm.key_dim + j * dv + e] : 0.0f;
    pre_ab = gates[static_cast<size_t>(t) * dm.n_v + j];
  };
  fetch(0);
  for (int t = 0; t < n; ++t) {
#pragma unroll
    for (int i = 0; i < kConvSlots; ++i) {
      const int c = tid + n_thr * i;
      if (c < dk) {
        qs[c] = pre[i];
      } else if (c < 2 * dk) {
        ks[c - dk] = pre[i];
      }
    }
    const float v = pre_v, alpha = pre_ab.x, beta = pre_ab.y;
    if (t + 1 < n) fetch(t + 1);
    __syncthreads();  // ks, qs ready
    const float o = delta_rule<false>(st, g, groups, col, tile, dk, ks, qs, alpha, beta, v, red_p,
                                      red_o, live, nullptr, 0);
    if (g == 0 && live) {
      o_raw[static_cast<size_t>(t) * dm.nvd + static_cast<size_t>(j) * dv + e] = o;
    }
  }
  store_rows(st, S, g, groups, dk, dv, live);
}

// The recurrence where a warp holds whole columns (32 % groups == 0): lane (c, g) of warp w keeps
// rows g + groups i of column w * (32 / groups) + c. Per token: the decay and the prediction's
// partial sum over the lane's rows, the column's partials added in group order from 0 (each lane
// reads all of them by shuffles), the update and the output's partials, added alike:
// delta_rule's operations in its order, with no barrier. alpha and beta come from the conv
// kernel (gates [n, Nv]); token t + 1's inputs load into a second set of registers while token
// t runs, and token t + kAhead's lines are prefetched into L2 (xs is about L2's size at
// 122B-A10B). kT (the Qwen3.5 instance): the conv kernel wrote each head's q and k with row
// g + groups i at 4 groups (i / 4) + 4 g + i % 4, so a lane reads its 16 rows in four 16-byte
// loads, each load of the warp one 128-byte line (a load per row took ~30% longer: the loads
// and shuffles, not the arithmetic, bound this kernel).
template <int kDk, bool kT>
__global__ void __launch_bounds__(kPrefillThreads)
    gdn_prefill_recur_warp_kernel(Dims dm, Plan pl, const float* __restrict__ xs,
                                  const float2* __restrict__ gates, int n, float* __restrict__ ssm,
                                  float* __restrict__ o_raw) {
  const int dk = kDk ? kDk : dm.dk, dv = kDk ? kDk : dm.dv;
  const int tile = kDk ? kFixedTile : pl.tile, groups = kDk ? kFixedGroups : pl.groups;
  const int j = blockIdx.y, kh = j / dm.r, lane = threadIdx.x & 31, g = lane % groups;
  const int col = static_cast<int>(threadIdx.x >> 5) * (32 / groups) + lane / groups;
  const int e = blockIdx.x * tile + col, first = lane - g;  // first: the column's group 0
  const bool live = e < dv;
  float* S = ssm + static_cast<size_t>(j) * dk * dv + e;
  float st[kMaxRows];
  column_rows(st, S, g, groups, dk, dv, live);
  struct In {
    float k[kMaxRows], q[kMaxRows], v;
    float2 ab;  // alpha, beta
  };
  const auto fetch = [&](int t, In& in) {
    const float* row = xs + static_cast<size_t>(t) * dm.conv_dim;
    const float *qr = row + kh * dk, *kr = row + dm.key_dim + kh * dk;
    if constexpr (kT) {  // rows g + groups i at 4 groups (i / 4) + 4 g + i % 4
      static_assert(kFixedDk == kFixedGroups * kMaxRows, "16 rows a lane");
#pragma unroll
      for (int i = 0; i < kMaxRows; i += 4) {
        const float4 kv = *reinterpret_cast<const float4*>(kr + groups * i + 4 * g);
        const float4 qv = *reinterpret_cast<const float4*>(qr + groups * i + 4 * g);
        in.k[i] = kv.x, in.k[i + 1] = kv.y, in.k[i + 2] = kv.z, in.k[i + 3] = kv.w;
        in.q[i] = qv.x, in.q[i + 1] = qv.y, in.q[i + 2] = qv.z, in.q[i + 3] = qv.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kMaxRows; ++i) {
        const int d = g + groups * i;
        in.k[i] = d < dk ? kr[d] : 0.0f;
        in.q[i] = d < dk ? qr[d] : 0.0f;
      }
    }
    in.v = live ? row[2 * dm.key_dim + j * dv + e] : 0.0f;
    in.ab = gates[static_cast<size_t>(t) * dm.n_v + j];
  };
  // Token t's lines into L2 (lanes 0-3: q, 4-7: k, 8: v, 9: the gates).
  const auto prefetch = [&](int t) {
    if (t >= n || lane >= 10) return;
    const float* row = xs + static_cast<size_t>(t) * dm.conv_dim;
    const float* at =
        lane < 4    ? row + kh * dk + 32 * lane
        : lane < 8  ? row + dm.key_dim + kh * dk + 32 * (lane - 4)
        : lane == 8 ? row + 2 * dm.key_dim + j * dv + e
                    : reinterpret_cast<const float*>(gates + static_cast<size_t>(t) * dm.n_v + j);
    asm volatile("prefetch.global.L2 [%0];" ::"l"(at));
  };
  // The column's partial sums added in group order, from 0.
  const auto column_sum = [&](float part) {
    float sum = 0.0f;
    for (int gi = 0; gi < groups; ++gi) sum += __shfl_sync(0xFFFFFFFFu, part, first + gi);
    return sum;
  };
  const auto token = [&](int t, const In& in) {
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxRows; ++i) {
      if (g + groups * i < dk) {
        st[i] = __fmul_rn(st[i], in.ab.x);
        acc = __fmaf_rn(st[i], in.k[i], acc);
      }
    }
    const float delta = in.ab.y * (in.v - column_sum(acc));
    acc = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxRows; ++i) {
      if (g + groups * i < dk) {
        st[i] = __fmaf_rn(in.k[i], delta, st[i]);
        acc = __fmaf_rn(st[i], in.q[i], acc);
      }
    }
    const float o = column_sum(acc);
    if (g == 0 && live) {
      o_raw[static_cast<size_t>(t) * dm.nvd + static_cast<size_t>(j) * dv + e] = o;
    }
  };
  for (int t = 0; t < kAhead; ++t) prefetch(t);
  In a, b;
  fetch(0, a);
  for (int t = 0; t < n; t += 2) {  // token t from a while t + 1 loads into b, and back
    prefetch(t + kAhead);
    prefetch(t + 1 + kAhead);
    if (t + 1 < n) fetch(t + 1, b);
    token(t, a);
    if (t + 1 >= n) break;
    if (t + 2 < n) fetch(t + 2, a);
    token(t + 1, b);
  }
  store_rows(st, S, g, groups, dk, dv, live);
}

// Block (token, value head), one thread per column of the head's tiles.
__global__ void gdn_prefill_norm_kernel(Dims dm, Plan pl, float eps,
                                        const float* __restrict__ norm_w,
                                        const float* __restrict__ z, size_t ld,
                                        const float* __restrict__ o_raw, float* __restrict__ out,
                                        size_t ld_out) {
  __shared__ double col_sq[kMaxTiles * kMaxTileCols];
  __shared__ double tile_sq[kMaxTiles];
  const int t = blockIdx.x, j = blockIdx.y, e = threadIdx.x, dv = dm.dv;
  const bool live = e < dv;
  const size_t head = static_cast<size_t>(j) * dv;
  const float o = live ? o_raw[static_cast<size_t>(t) * dm.nvd + head + e] : 0.0f;
  col_sq[e] = live ? static_cast<double>(o) * o : 0.0;
  __syncthreads();
  if (e < pl.n_tiles) {
    double sq = 0.0;
    for (int c = 0; c < pl.tile; ++c) sq += col_sq[e * pl.tile + c];
    tile_sq[e] = sq;
  }
  __syncthreads();
  if (!live) return;
  double total = 0.0;
  for (int tt = 0; tt < pl.n_tiles; ++tt) total += tile_sq[tt];
  const float inv = 1.0f / sqrtf(static_cast<float>(total) / static_cast<float>(dv) + eps);
  const float gate = silu(z[static_cast<size_t>(t) * ld + head + e]);
  out[static_cast<size_t>(t) * ld_out + head + e] = o * inv * __ldg(norm_w + e) * gate;
}

// Thread per channel: the inputs of the last kc - 1 tokens (those of positions *pos + n - kc + 1
// .. *pos + n - 1 not before *pos; the ring holds the older ones) into their ring slots.
__global__ void gdn_prefill_hist_kernel(Dims d, const float* __restrict__ qkv, size_t ld, int n,
                                        const int* __restrict__ pos_p, float* conv_state) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x, n_hist = d.kc - 1;
  if (ch >= d.conv_dim) return;
  const int pos = *pos_p;
  for (int t = n > n_hist ? n - n_hist : 0; t < n; ++t) {
    conv_state[static_cast<size_t>(ring_slot(pos + t, d.ring)) * d.conv_dim + ch] =
        qkv[static_cast<size_t>(t) * ld + ch];
  }
}

}  // namespace

bool gdn_prefill_ok(const GdnShape& shape) {
  if (!supported(shape)) return false;
  const Plan p = make_plan(shape);
  return p.tile * p.groups <= kPrefillThreads && p.n_tiles * p.tile <= 1024;
}

// xs [n, conv_dim] | o_raw [n, Nv dv] | (to an even float) gates [n, Nv] float2.
size_t gdn_prefill_scratch_floats(const GdnShape& shape, int n) {
  return static_cast<size_t>(n) * (static_cast<size_t>(shape.conv_dim()) +
                                   static_cast<size_t>(shape.n_v_heads) * (shape.dv + 2)) +
         1;
}

cudaError_t gdn_prefill(const GdnShape& shape, const GdnParams& p, const float* qkv, const float* z,
                        const float* b, const float* a, size_t ld, int n, const int* pos,
                        GdnState state, float* out, size_t ld_out, float* scratch,
                        cudaStream_t stream) {
  if (!gdn_prefill_ok(shape) || n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const Plan pl = make_plan(shape);
  const Dims d = dims_of(shape);
  const int threads = pl.tile * pl.groups;
  float* xs = scratch;
  float* o_raw = scratch + static_cast<size_t>(n) * d.conv_dim;
  auto* gates = reinterpret_cast<float2*>(
      scratch + ((static_cast<size_t>(n) * (d.conv_dim + d.nvd) + 1) & ~size_t{1}));
  const bool fixed = shape.dk == kFixedDk && shape.dv == kFixedDk && pl.tile == kFixedTile &&
                     pl.groups == kFixedGroups;
  gdn_prefill_conv_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(shape.n_k_heads)),
                            threads, 0, stream>>>(d, qkv, ld, p.conv_w, pos, state.conv, xs, p, b,
                                                  a, gates, fixed ? kFixedGroups : 0);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const size_t smem = (2 * static_cast<size_t>(shape.dk) + 2 * pl.groups * pl.tile) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(pl.n_tiles), static_cast<unsigned>(shape.n_v_heads));
  if (fixed) {  // Qwen3.5's shape: a warp holds whole columns, its q and k transposed
    gdn_prefill_recur_warp_kernel<kFixedDk, true>
        <<<grid, threads, 0, stream>>>(d, pl, xs, gates, n, state.ssm, o_raw);
  } else if (32 % pl.groups == 0 && threads % 32 == 0) {  // a warp holds whole columns
    gdn_prefill_recur_warp_kernel<0, false>
        <<<grid, threads, 0, stream>>>(d, pl, xs, gates, n, state.ssm, o_raw);
  } else {
    gdn_prefill_recur_kernel<<<grid, threads, smem, stream>>>(d, pl, xs, gates, n, state.ssm,
                                                              o_raw);
  }
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  gdn_prefill_norm_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(shape.n_v_heads)),
                            pl.n_tiles * pl.tile, 0, stream>>>(d, pl, shape.eps, p.norm_w, z, ld,
                                                               o_raw, out, ld_out);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  gdn_prefill_hist_kernel<<<static_cast<unsigned>((d.conv_dim + 255) / 256), 256, 0, stream>>>(
      d, qkv, ld, n, pos, state.conv);
  return cudaGetLastError();
}

}  // namespace qf::kern
