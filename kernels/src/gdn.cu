// Gated DeltaNet decode for one token (qf/kern/gdn.h, shared/docs/qwen35-architecture.md §3.3).
// Twin: gdn_ref.cpp. Test: tests/kernels/gdn_test.cpp.
//
// Launch 1, gdn_conv_kernel: one block per head segment of the conv channels
// [q heads (dk) | k heads (dk) | v heads (dv)], one thread per channel: causal depthwise conv +
// SiLU, conv-state shift, and for q/k the l2 norm (q also x 1/sqrt(dk)); activations go to
// scratch.
// Launch 2, gdn_recur_kernel: grid (n_tiles, Nv), the n_tiles column tiles of one head forming
// one thread-block cluster. The delta rule is independent per value column e (p[e], delta[e],
// S[:, e], o[e] only touch column e), so a block owns `tile` columns of one head and all dk rows:
// thread (g, c) keeps rows d = g, g + groups, ... of column tile * blockIdx.x + c in registers.
// Consecutive threads read consecutive columns of one state row, so the state is read and
// written once per token, coalesced. Column reductions over d go through shared memory in a
// fixed order. The gated RMSNorm needs the whole head: each block pushes its tile's sum of
// squares into every block of its cluster (distributed shared memory), and after one cluster
// barrier each block sums the tiles in index order (deterministic) and normalizes its columns.
//
// Latency (a decode step launches these 36 times, PDL, pdl.cuh): everything the kernel launched
// just before does not write is loaded before pdl::wait() (pdl.cuh, "early loads"): the conv
// history and weights in launch 1; the recurrent state, z, b, a, dt_bias, A_log and norm_w in
// launch 2 (z, b, a are the in_proj outputs, two launches back), with beta, alpha and silu(z)
// computed before the wait too. After its wait, launch 2 only reads q^, k^ and v from scratch.
// H200, 122B synthetic, same run: 3.68 -> 3.58 ms/step against the previous version (per-head
// tickets, last tile normalizing through global scratch, loads after the wait); the early loads
// are 82 us of it. Measured slower and dropped: 512-thread recurrence blocks (+55 us/step),
// 128 threads x 32 rows (+58), 16-column tiles in clusters of 8 (+100), 64-column tiles (+4),
// an L2 prefetch of the state issued early by launch 1 (+12). Without launch 1 at all (wrong
// results, a bound for fusing it into launch 2) a step would be 51 us faster.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "mixer_common.cuh"
#include "pdl.cuh"
#include "qf/kern/gdn.h"

namespace qf::kern {
namespace {

using mixer::silu;

constexpr int kRecurThreads = 256;  // preferred recurrence block size
constexpr int kMaxRows = 16;        // state rows one recurrence thread keeps in registers
constexpr int kMaxTiles = 8;        // column tiles per head = cluster size (portable maximum)
constexpr int kMaxKc = 8;           // conv taps one conv thread keeps in registers
constexpr int kMaxTileCols = 128;   // dv <= 1024 = kMaxTiles * 128

struct Plan {
  int tile = 0;     // columns per block: min(32, dv rounded up to a power of two), doubled
                    // until n_tiles <= kMaxTiles; the last tile may be partly idle
  int groups = 0;   // row groups per block (block = tile * groups threads)
  int n_tiles = 0;  // ceil(dv / tile), the cluster size
};

Plan make_plan(const GdnShape& s) {
  Plan p;
  p.tile = 32;
  while (p.tile > 1 && p.tile / 2 >= s.dv) p.tile /= 2;
  while ((s.dv + p.tile - 1) / p.tile > kMaxTiles) p.tile *= 2;
  p.groups = std::min(s.dk, std::max(1, kRecurThreads / p.tile));
  p.groups = std::max(p.groups, (s.dk + kMaxRows - 1) / kMaxRows);
  p.n_tiles = (s.dv + p.tile - 1) / p.tile;
  return p;
}

// One conv thread per channel of the largest segment.
int conv_threads(const GdnShape& s) {
  return (std::max(s.dk, s.dv) + 31) / 32 * 32;
}

// Cluster barrier halves (PTX barrier.cluster): every thread of the cluster arrives, then waits.
// The release / acquire pair orders distributed-shared-memory stores made before the arrive
// with loads made after the wait; the relaxed arrive orders nothing (only "every block of the
// cluster has started", which distributed shared memory needs before its first access).
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_arrive_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait_acquire() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

__global__ void __launch_bounds__(1024)
    gdn_conv_kernel(GdnShape s, const float* __restrict__ conv_w, const float* __restrict__ qkv,
                    float* __restrict__ conv_state, float* __restrict__ act) {
  __shared__ double red[32];
  const int nk = s.n_k_heads, key_dim = nk * s.dk, seg = blockIdx.x, i = threadIdx.x;
  const bool is_q = seg < nk, is_k = !is_q && seg < 2 * nk;
  const int c0 = is_q ? seg * s.dk
                      : (is_k ? key_dim + (seg - nk) * s.dk : 2 * key_dim + (seg - 2 * nk) * s.dv);
  const int len = (is_q || is_k) ? s.dk : s.dv;
  const bool mine = i < len;
  const int kc = s.kc, n_hist = kc - 1;
  const size_t ch = static_cast<size_t>(c0 + (mine ? i : 0));
  float* hist = conv_state + ch * n_hist;

  // Early loads: conv weights, and this channel's history (last written by this kernel one
  // token earlier; gdn_decode's contract keeps it out of the previous launch).
  float w[kMaxKc - 1] = {}, h[kMaxKc - 1] = {}, w_last = 0.0f;
  if (mine) {
    w_last = __ldg(conv_w + ch * kc + kc - 1);
#pragma unroll
    for (int j = 0; j < kMaxKc - 1; ++j) {
      if (j < n_hist) {
        w[j] = __ldg(conv_w + ch * kc + j);
        h[j] = __ldcg(hist + j);
      }
    }
  }
  pdl::wait();

  float y = 0.0f;
  if (mine) {
    const float x = __ldcg(qkv + ch);  // the in_proj output
    y = w_last * x;
#pragma unroll
    for (int j = 0; j < kMaxKc - 1; ++j) {
      if (j < n_hist) y += w[j] * h[j];
    }
#pragma unroll
    for (int j = 0; j + 1 < kMaxKc - 1; ++j) {
      if (j + 1 < n_hist) hist[j] = h[j + 1];
    }
    if (n_hist > 0) hist[n_hist - 1] = x;
    y = silu(y);
  }
  if (!is_q && !is_k) {  // uniform per block: v is used raw
    if (mine) act[ch] = y;
    return;
  }
  // Sum of squares over the segment: warp trees, then the warps in order (mixer::block_sum
  // without its trailing barrier: red is not reused).
  const double ws = mixer::warp_sum(static_cast<double>(y) * y);
  if ((i & 31) == 0) red[i >> 5] = ws;
  __syncthreads();
  double ss = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) ss += red[w];
  const float inv = 1.0f / sqrtf(static_cast<float>(ss) + 1e-6f);
  const float q_scale = 1.0f / sqrtf(static_cast<float>(s.dk));
  if (mine) act[ch] = is_q ? y * inv * q_scale : y * inv;
}

__global__ void __launch_bounds__(1024)
    gdn_recur_kernel(GdnShape s, Plan pl, GdnParams p, const float* __restrict__ act,
                     const float* __restrict__ z, const float* __restrict__ b,
                     const float* __restrict__ a, float* __restrict__ ssm,
                     float* __restrict__ out) {
  namespace cg = cooperative_groups;
  cluster_arrive_relaxed();  // "this block has started", waited for before the first DSMEM store
  // k^ [dk] | q^ [dk] | column partials of the prediction [groups, tile] | of the output (same)
  extern __shared__ __align__(16) float smem[];
  __shared__ double col_sq[kMaxTileCols];
  __shared__ double tile_sq[kMaxTiles];  // tile t's sum of squares, pushed by block t
  const int dk = s.dk, dv = s.dv, j = blockIdx.y, tid = threadIdx.x;
  const int col = tid % pl.tile, g = tid / pl.tile, e = blockIdx.x * pl.tile + col;
  const bool live = e < dv;  // the last tile may be partly idle
  float* ks = smem;
  float* qs = smem + dk;
  float* red_p = smem + 2 * dk;
  float* red_o = red_p + pl.groups * pl.tile;

  // Early loads (pdl.cuh): none of this is written by the conv kernel launched just before.
  const float beta = mixer::sigmoid(__ldcg(b + j));
  const float alpha =
      expf(-expf(__ldg(p.a_log + j)) * mixer::softplus(__ldcg(a + j) + __ldg(p.dt_bias + j)));
  const size_t head = static_cast<size_t>(j) * dv;
  float gate = 0.0f;  // norm_w[e] and silu(z[e]), for the threads that write the output
  float norm_w = 0.0f;
  if (g == 0 && live) {
    norm_w = __ldg(p.norm_w + e);
    gate = silu(__ldcg(z + head + e));
  }
  float* S = ssm + static_cast<size_t>(j) * dk * dv + e;  // column e of head j: S[d * dv]
  float st[kMaxRows];
#pragma unroll
  for (int i = 0; i < kMaxRows; ++i) {
    const int d = g + pl.groups * i;
    st[i] = live && d < dk ? __ldcg(S + static_cast<size_t>(d) * dv) : 0.0f;
  }
  pdl::wait();

  const int key_dim = s.n_k_heads * dk, kh = j / (s.n_v_heads / s.n_k_heads);
  for (int i = tid; i < dk; i += blockDim.x) {
    qs[i] = __ldcg(act + kh * dk + i);
    ks[i] = __ldcg(act + key_dim + kh * dk + i);
  }
  const float v = live ? __ldcg(act + 2 * key_dim + head + e) : 0.0f;
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
  red_p[g * pl.tile + col] = acc;
  __syncthreads();
  float pred = 0.0f;
#pragma unroll 8
  for (int gi = 0; gi < pl.groups; ++gi) pred += red_p[gi * pl.tile + col];
  const float delta = beta * (v - pred);

  // Rank-1 write, store, and read the output from the updated state.
  acc = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxRows; ++i) {
    const int d = g + pl.groups * i;
    if (d < dk) {
      st[i] += ks[d] * delta;
      if (live) S[static_cast<size_t>(d) * dv] = st[i];
      acc += st[i] * qs[d];
    }
  }
  red_o[g * pl.tile + col] = acc;
  __syncthreads();
  float o = 0.0f;
  if (g == 0) {
#pragma unroll 8
    for (int gi = 0; gi < pl.groups; ++gi) o += red_o[gi * pl.tile + col];
    col_sq[col] = live ? static_cast<double>(o) * o : 0.0;
  }
  if (pl.tile <= 32) {
    __syncwarp();  // the g == 0 threads are warp 0
  } else {
    __syncthreads();
  }
  cluster_wait_acquire();  // every block of the cluster has started (long since, by now)
  // This tile's sum of squares in column order, pushed into tile_sq[blockIdx.x] of every block
  // of the cluster (block rank = blockIdx.x: the cluster spans the grid's x).
  if (tid == 0) {
    double sq = 0.0;
#pragma unroll 32
    for (int c = 0; c < pl.tile; ++c) sq += col_sq[c];
    const cg::cluster_group cluster = cg::this_cluster();
    for (int t = 0; t < pl.n_tiles; ++t) *cluster.map_shared_rank(&tile_sq[blockIdx.x], t) = sq;
  }
  cluster_arrive_release();
  cluster_wait_acquire();  // no block reads or writes another's shared memory after this
  if (g == 0 && live) {
    double total = 0.0;
    for (int t = 0; t < pl.n_tiles; ++t) total += tile_sq[t];
    const float inv = 1.0f / sqrtf(static_cast<float>(total) / static_cast<float>(dv) + s.eps);
    out[head + e] = o * inv * norm_w * gate;
  }
}

bool supported(const GdnShape& s) {
  if (s.n_k_heads <= 0 || s.n_v_heads <= 0 || s.dk <= 0 || s.dv <= 0) return false;
  if (s.kc < 1 || s.kc > kMaxKc || s.dk > 1024 || s.dv > 1024) return false;
  if (s.n_v_heads % s.n_k_heads != 0) return false;
  const Plan p = make_plan(s);
  return p.n_tiles <= kMaxTiles && p.tile <= kMaxTileCols && p.tile * p.groups <= 1024 &&
         (s.dk + p.groups - 1) / p.groups <= kMaxRows;
}

}  // namespace

size_t gdn_scratch_floats(const GdnShape& shape) {
  return static_cast<size_t>(shape.conv_dim());
}

cudaError_t gdn_decode(const GdnShape& shape, const GdnParams& p, const float* qkv, const float* z,
                       const float* b, const float* a, GdnState state, float* out, float* scratch,
                       cudaStream_t stream) {
  if (!supported(shape)) return cudaErrorInvalidValue;
  const Plan pl = make_plan(shape);
  float* act = scratch;  // [conv_dim]
  const int n_seg = 2 * shape.n_k_heads + shape.n_v_heads;
  const cudaError_t err = pdl::launch(gdn_conv_kernel, n_seg, conv_threads(shape), 0, stream, shape,
                                      p.conv_w, qkv, state.conv, act);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(pl.n_tiles), static_cast<unsigned>(shape.n_v_heads));
  const size_t smem = 2 * (static_cast<size_t>(shape.dk) + pl.groups * pl.tile) * sizeof(float);
  return pdl::launch_cluster(gdn_recur_kernel, grid, dim3(pl.n_tiles), pl.tile * pl.groups, smem,
                             stream, shape, pl, p, act, z, b, a, state.ssm, out);
}

}  // namespace qf::kern
