// Gated DeltaNet decode for one token (qf/kern/gdn.h, shared/docs/qwen35-architecture.md §3.3).
// Twin: gdn_ref.cpp. Test: tests/kernels/gdn_test.cpp.
//
// Launch 1, gdn_conv_kernel: one block per head segment of the conv channels
// [q heads (dk) | k heads (dk) | v heads (dv)]: causal depthwise conv + SiLU, conv-state shift,
// and for q/k the l2 norm (q also x 1/sqrt(dk)); activations go to scratch. It also zeroes the
// per-head tile counters launch 2 uses.
// Launch 2, gdn_recur_kernel: grid (dv / tile, Nv). The delta rule is independent per value
// column e (p[e], delta[e], S[:, e], o[e] only touch column e), so a block owns `tile` columns of
// one head and all dk rows: thread (g, c) keeps rows d = g, g + groups, ... of column
// tile * blockIdx.x + c in registers. Consecutive threads read consecutive columns of one state
// row, so the state is read and written once per token, coalesced. Column reductions over d go
// through shared memory in a fixed order. The gated RMSNorm needs the whole head: each tile
// leaves its raw outputs and its sum of squares in scratch, and the last tile to finish (atomic
// ticket) normalizes the head, summing the tiles in index order (deterministic).
#include <algorithm>
#include <cstdint>

#include "mixer_common.cuh"
#include "pdl.cuh"
#include "qf/kern/gdn.h"

namespace qf::kern {
namespace {

using mixer::silu;

constexpr int kConvThreads = 128;
constexpr int kRecurThreads = 256;  // preferred recurrence block size
constexpr int kMaxRows = 16;        // state rows one recurrence thread keeps in registers

struct Plan {
  int tile = 0;     // columns per block: the largest power of two <= 32 dividing dv
  int groups = 0;   // row groups per block (block = tile * groups threads)
  int n_tiles = 0;  // dv / tile
};

Plan make_plan(const GdnShape& s) {
  Plan p;
  p.tile = 32;
  while (p.tile > 1 && s.dv % p.tile != 0) p.tile /= 2;
  p.groups = std::min(s.dk, std::max(1, kRecurThreads / p.tile));
  p.groups = std::max(p.groups, (s.dk + kMaxRows - 1) / kMaxRows);
  p.n_tiles = s.dv / p.tile;
  return p;
}

// Scratch layout in floats, each part starting at a multiple of 4 floats (16 bytes):
// act [conv_dim] | o_raw [Nv * dv] | tile sums of squares [Nv * n_tiles] doubles | tickets [Nv].
struct ScratchLayout {
  size_t act = 0, o_raw = 0, partial = 0, tickets = 0, total = 0;
};

size_t round4(size_t n) {
  return (n + 3) / 4 * 4;
}

ScratchLayout scratch_layout(const GdnShape& s) {
  const Plan p = make_plan(s);
  ScratchLayout l;
  l.act = 0;
  l.o_raw = round4(static_cast<size_t>(s.conv_dim()));
  l.partial = l.o_raw + round4(static_cast<size_t>(s.n_v_heads) * s.dv);
  l.tickets = l.partial + round4(2 * static_cast<size_t>(s.n_v_heads) * p.n_tiles);
  l.total = l.tickets + round4(static_cast<size_t>(s.n_v_heads));
  return l;
}

__global__ void __launch_bounds__(kConvThreads)
    gdn_conv_kernel(GdnShape s, const float* __restrict__ conv_w, const float* __restrict__ qkv,
                    float* __restrict__ conv_state, float* __restrict__ act,
                    unsigned* __restrict__ tickets) {
  pdl::wait();
  __shared__ double red[32];
  const int nk = s.n_k_heads, key_dim = nk * s.dk, seg = blockIdx.x;
  const bool is_q = seg < nk, is_k = !is_q && seg < 2 * nk;
  const int c0 = is_q ? seg * s.dk
                      : (is_k ? key_dim + (seg - nk) * s.dk : 2 * key_dim + (seg - 2 * nk) * s.dv);
  const int len = (is_q || is_k) ? s.dk : s.dv;
  if (seg == 0) {
    for (int i = threadIdx.x; i < s.n_v_heads; i += blockDim.x) tickets[i] = 0;
  }
  const int kc = s.kc, n_hist = kc - 1;
  double ss = 0;
  for (int i = threadIdx.x; i < len; i += blockDim.x) {
    const size_t ch = static_cast<size_t>(c0 + i);
    float* hist = conv_state + ch * n_hist;
    const float* kw = conv_w + ch * kc;
    const float x = qkv[ch];
    float y = kw[kc - 1] * x;
    for (int j = 0; j < n_hist; ++j) y += kw[j] * hist[j];
    for (int j = 0; j + 1 < n_hist; ++j) hist[j] = hist[j + 1];
    if (n_hist > 0) hist[n_hist - 1] = x;
    y = silu(y);
    act[ch] = y;
    ss += static_cast<double>(y) * y;
  }
  if (!is_q && !is_k) return;  // uniform per block: v is used raw
  const float inv = 1.0f / sqrtf(static_cast<float>(mixer::block_sum(ss, red)) + 1e-6f);
  const float q_scale = 1.0f / sqrtf(static_cast<float>(s.dk));
  for (int i = threadIdx.x; i < len; i += blockDim.x) {
    const size_t ch = static_cast<size_t>(c0 + i);
    act[ch] = is_q ? act[ch] * inv * q_scale : act[ch] * inv;
  }
}

__global__ void __launch_bounds__(1024)
    gdn_recur_kernel(GdnShape s, Plan pl, GdnParams p, const float* __restrict__ act,
                     const float* __restrict__ z, const float* __restrict__ b,
                     const float* __restrict__ a, float* __restrict__ ssm, float* __restrict__ out,
                     float* __restrict__ o_raw, double* __restrict__ partial,
                     unsigned* __restrict__ tickets) {
  pdl::wait();
  extern __shared__ __align__(
      16) float smem[];  // k^ [dk] | q^ [dk] | column partials [groups, tile]
  __shared__ double col_sq[32];
  __shared__ double head_ss;
  __shared__ bool is_last;
  const int dk = s.dk, dv = s.dv, j = blockIdx.y, tid = threadIdx.x;
  const int col = tid % pl.tile, g = tid / pl.tile, e = blockIdx.x * pl.tile + col;
  float* ks = smem;
  float* qs = smem + dk;
  float* red = smem + 2 * dk;

  const int key_dim = s.n_k_heads * dk, kh = j / (s.n_v_heads / s.n_k_heads);
  for (int i = tid; i < dk; i += blockDim.x) {
    qs[i] = act[kh * dk + i];
    ks[i] = act[key_dim + kh * dk + i];
  }
  const float beta = mixer::sigmoid(b[j]);
  const float alpha = expf(-expf(p.a_log[j]) * mixer::softplus(a[j] + p.dt_bias[j]));
  const float v = act[2 * key_dim + j * dv + e];
  float* S = ssm + static_cast<size_t>(j) * dk * dv + e;  // column e of head j: S[d * dv]
  float st[kMaxRows];
#pragma unroll
  for (int i = 0; i < kMaxRows; ++i) {
    const int d = g + pl.groups * i;
    st[i] = d < dk ? S[static_cast<size_t>(d) * dv] : 0.0f;
  }
  __syncthreads();  // ks, qs ready

  // Decay, then predict with the decayed state: p[e] = sum_d S[d][e] k[d].
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxRows; ++i) {
    const int d = g + pl.groups * i;
    if (d < dk) {
      st[i] *= alpha;
      acc += st[i] * ks[d];
    }
  }
  red[g * pl.tile + col] = acc;
  __syncthreads();
  float pred = 0.0f;
  for (int gi = 0; gi < pl.groups; ++gi) pred += red[gi * pl.tile + col];
  const float delta = beta * (v - pred);
  __syncthreads();  // every thread has read red

  // Rank-1 write, store, and read the output from the updated state.
  acc = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxRows; ++i) {
    const int d = g + pl.groups * i;
    if (d < dk) {
      st[i] += ks[d] * delta;
      S[static_cast<size_t>(d) * dv] = st[i];
      acc += st[i] * qs[d];
    }
  }
  red[g * pl.tile + col] = acc;
  __syncthreads();
  float o = 0.0f;
  if (g == 0) {
    for (int gi = 0; gi < pl.groups; ++gi) o += red[gi * pl.tile + col];
    col_sq[col] = static_cast<double>(o) * o;
  }
  __syncthreads();
  double sq = 0.0;  // this tile's sum of squares, meaningful in thread 0
  if (tid == 0) {
    for (int c = 0; c < pl.tile; ++c) sq += col_sq[c];
  }

  const size_t head = static_cast<size_t>(j) * dv;
  if (pl.n_tiles == 1) {
    if (tid == 0) head_ss = sq;
    __syncthreads();
    if (g == 0) {
      const float inv = 1.0f / sqrtf(static_cast<float>(head_ss) / static_cast<float>(dv) + s.eps);
      out[head + e] = o * inv * p.norm_w[e] * silu(z[head + e]);
    }
    return;
  }
  if (g == 0) o_raw[head + e] = o;
  if (tid == 0) partial[static_cast<size_t>(j) * pl.n_tiles + blockIdx.x] = sq;
  __threadfence();
  __syncthreads();
  if (tid == 0) is_last = atomicAdd(&tickets[j], 1u) == static_cast<unsigned>(pl.n_tiles - 1);
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  if (tid == 0) {
    double total = 0.0;
    for (int t = 0; t < pl.n_tiles; ++t)
      total += __ldcg(&partial[static_cast<size_t>(j) * pl.n_tiles + t]);
    head_ss = total;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(static_cast<float>(head_ss) / static_cast<float>(dv) + s.eps);
  for (int i = tid; i < dv; i += blockDim.x) {
    out[head + i] = __ldcg(&o_raw[head + i]) * inv * p.norm_w[i] * silu(z[head + i]);
  }
}

bool supported(const GdnShape& s) {
  if (s.n_k_heads <= 0 || s.n_v_heads <= 0 || s.dk <= 0 || s.dv <= 0 || s.kc < 1) return false;
  if (s.n_v_heads % s.n_k_heads != 0) return false;
  const Plan p = make_plan(s);
  return p.tile * p.groups <= 1024 && (s.dk + p.groups - 1) / p.groups <= kMaxRows;
}

}  // namespace

size_t gdn_scratch_floats(const GdnShape& shape) {
  return scratch_layout(shape).total;
}

cudaError_t gdn_decode(const GdnShape& shape, const GdnParams& p, const float* qkv, const float* z,
                       const float* b, const float* a, GdnState state, float* out, float* scratch,
                       cudaStream_t stream) {
  if (!supported(shape)) return cudaErrorInvalidValue;
  const Plan pl = make_plan(shape);
  const ScratchLayout l = scratch_layout(shape);
  float* act = scratch + l.act;
  auto* partial = reinterpret_cast<double*>(scratch + l.partial);
  auto* tickets = reinterpret_cast<unsigned*>(scratch + l.tickets);
  const int n_seg = 2 * shape.n_k_heads + shape.n_v_heads;
  const cudaError_t err = pdl::launch(gdn_conv_kernel, n_seg, kConvThreads, 0, stream, shape,
                                      p.conv_w, qkv, state.conv, act, tickets);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(pl.n_tiles), static_cast<unsigned>(shape.n_v_heads));
  const size_t smem = (2 * static_cast<size_t>(shape.dk) + pl.groups * pl.tile) * sizeof(float);
  return pdl::launch(gdn_recur_kernel, grid, pl.tile * pl.groups, smem, stream, shape, pl, p, act,
                     z, b, a, state.ssm, out, scratch + l.o_raw, partial, tickets);
}

}  // namespace qf::kern
