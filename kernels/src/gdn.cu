// Gated DeltaNet decode for one token, or a verify's few (qf/kern/gdn.h,
// shared/docs/qwen35-architecture.md §3.3). Twin: gdn_ref.cpp. Test: tests/kernels/gdn_test.cpp.
//
// One launch, gdn_decode_kernel: grid (n_tiles, Nv), the n_tiles column tiles of one head forming
// one thread-block cluster.
//   * Conv: a block computes the causal depthwise conv + SiLU of the channels it needs itself,
//     the q and k channels of its key head (then their l2 norms, q also x 1/sqrt(dk)) and the v
//     channels of its columns, a thread per channel (two at most), for each of the launch's
//     tokens. The blocks of a key head all compute its q and k, so the history is a ring indexed
//     by position (GdnState::conv) with room for the launch's tokens: every block reads the
//     slots before *pos, and each channel's inputs go into the slots from *pos on, written by
//     one block only.
//   * Recurrence: the delta rule is independent per value column e (p[e], delta[e], S[:, e],
//     o[e] only touch column e), so a block owns `tile` columns of one head and all dk rows:
//     thread (g, c) keeps rows d = g, g + groups, ... of column tile * blockIdx.x + c in
//     registers, across the launch's tokens. Consecutive threads read consecutive columns of one
//     state row, so the state is read once a launch and written once (after the last token, or
//     deferring, GdnReplay: before the first, with the last verify's kept tokens folded in, and
//     each token's update written instead), coalesced. Column reductions over d go through
//     shared memory in a fixed order.
//   * The gated RMSNorm needs the whole head: each block pushes its tile's sums of squares (one
//     a token) into every block of its cluster (distributed shared memory), and after one
//     cluster barrier each block sums the tiles in index order (deterministic) and normalizes
//     its columns.
//
// Products and sums go through __fmul_rn / __fmaf_rn: gdn_prefill.cu repeats this arithmetic
// token by token and must give its bits, whatever the compiler would contract.
//
// Latency (a decode step launches this 36 times, PDL, pdl.cuh): everything the kernel launched
// just before (the in_proj GEMV) does not write is loaded before pdl::wait() (pdl.cuh, "early
// loads"): *pos, the recurrent state (up to 256 threads a block), dt_bias, A_log and norm_w.
// After its wait it reads its qkv channels, z, b, a (the in_proj's outputs) and the conv
// weights and history, all in one round trip (loading the conv's taps in a loop, one round trip
// each, made the fused kernel slower than the two launches it replaced); where the grid is at
// most one block per SM, the conv weights and history are staged in shared memory before the
// wait instead (kStageConv, gdn_decode). The conv was a launch
// of its own until then: one launch is faster (H200, 122B synthetic, ctx 1024: 2840 -> 2822 us
// per step; 35B unchanged, 1634 -> 1632). Measured slower and dropped earlier: 512-thread
// recurrence blocks (+55 us/step), 128 threads x 32 rows (+58), 16-column tiles in clusters of 8
// (+100), 64-column tiles (+4), an L2 prefetch of the state (+12).
//
// The Qwen3.5 shape (dk = dv = 128, 4 conv taps) runs an instance with the shape and its plan as
// compile-time constants (kDk): the row loops unroll without bounds checks and the state rows sit
// at immediate offsets, half the instructions of the generic instance (48 registers instead of
// 80). Nsight Compute had the generic one issuing ~1500 instructions a warp, a dependent chain
// that was most of its time. qforge-bench-mixers, per layer: H100 122B 8.16 -> 6.87 us, 35B
// 6.48 -> 4.41; H200 7.93 -> 6.12 and 6.21 -> 4.13. The 122B step: H100 59.6% -> 60.3% of copy,
// H200 47.6% -> 48.7% (35B: 38.9 -> 40.5%, 29.8 -> 31.1%).
//
// Several tokens (gdn_decode_tokens, a verify's) have instances of their own (kMaxTok), so the
// step's single-token instance keeps its registers; the 1024-thread one for several tokens spills
// a few (deep heads only, no Qwen3.5 shape). The conv ring is slot-major (a warp's channels side
// by side in a slot) and its slots come from one modulo a launch and steps: channel-major slots,
// or a modulo a slot, each cost the single-token kernel ~0.4 us a layer at 122B on an H100
// (docs/cuda-engine-speed.md, the DeltaNet rows in one launch).
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "gdn_common.cuh"
#include "mixer_common.cuh"
#include "pdl.cuh"
#include "qf/kern/gdn.h"

namespace qf::kern {
namespace {

using namespace gdn_detail;
using mixer::silu;

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

// kStageConv (kMaxThreads <= 256; gdn_decode says when): the conv taps and history are loaded
// before the wait into shared memory after the other arrays (red_o's end), kc taps then kc - 1
// history entries for each slot i of each thread tid, here.
__device__ __forceinline__ float* staged_conv(float* base, int tid, int i, int kc) {
  return base + (tid * kConvSlots + i) * (2 * kc - 1);
}

template <int kMaxThreads, bool kStageConv, int kDk, int kMaxTok>
__global__ void __launch_bounds__(kMaxThreads)
    gdn_decode_kernel(GdnShape s, Plan pl, GdnParams p, const float* __restrict__ qkv,
                      const float* __restrict__ z, const float* __restrict__ b,
                      const float* __restrict__ a, size_t ld, int n_tok,
                      const int* __restrict__ pos_p, float* __restrict__ conv_state,
                      float* __restrict__ ssm, GdnReplay replay, float* __restrict__ out,
                      size_t ld_out) {
  namespace cg = cooperative_groups;
  cluster_arrive_relaxed();  // "this block has started", waited for before the first DSMEM store
  // Per token k^ [dk] | q^ [dk] | v [tile]; then the column partials of the prediction
  // [groups, tile] and of the output (same).
  extern __shared__ __align__(16) float smem[];
  __shared__ double col_sq[kMaxTok][kMaxTileCols];
  __shared__ double tile_sq[kMaxTok][kMaxTiles];  // tile t's sums of squares, pushed by block t
  __shared__ double warp_sq[kMaxTok][2][32];      // per warp: its q and k channels' squares
  // kDk > 0: the Qwen3.5 shape (the kFixed* constants) at compile time, so that the row loops,
  // their bounds and the state's addresses fold.
  static_assert(kDk == 0 || (kDk == kFixedDk && kMaxThreads == kFixedTile * kFixedGroups),
                "the fixed shape only");
  static_assert(kMaxTok >= 1 && kMaxTok <= kGdnMaxTokens, "tokens a launch");
  const int dk = kDk ? kDk : s.dk, dv = kDk ? kDk : s.dv, kc = kDk ? kFixedKc : s.kc;
  const int tile = kDk ? kFixedTile : pl.tile, groups = kDk ? kFixedGroups : pl.groups;
  const int n_tiles = kDk ? kDk / kFixedTile : pl.n_tiles;
  const int n = kMaxTok == 1 ? 1 : n_tok;
  const int j = blockIdx.y, tid = threadIdx.x, n_thr = kDk ? kMaxThreads : blockDim.x;
  const int col = tid % tile, g = tid / tile, e = blockIdx.x * tile + col;
  const bool live = kDk || e < dv;  // the last tile may be partly idle (not in the fixed shape)
  const int tok_floats = 2 * dk + tile;
  const auto ks = [&](int t) { return smem + t * tok_floats; };
  const auto qs = [&](int t) { return smem + t * tok_floats + dk; };
  const auto vs = [&](int t) { return smem + t * tok_floats + 2 * dk; };
  float* red_p = smem + n * tok_floats;
  float* red_o = red_p + groups * tile;

  // The conv channels this block needs: slot c < dk is q channel c of key head kh, c < 2 dk k
  // channel c - dk, then v channel c - 2 dk of this tile; thread tid takes slots tid + n_thr i.
  // Every block reads the ring's slots of positions *pos - kc + 1 .. *pos - 1 and one block
  // writes each channel's inputs into the slots of *pos .. *pos + n - 1: the v channels' own
  // block, the q and k channels' block (first value head of the key head, tile 0). The ring is
  // long enough that no block reads what another writes.
  const int key_dim = s.n_k_heads * dk, r = s.n_v_heads / s.n_k_heads, kh = j / r;
  const int n_hist = kc - 1, ring = kDk ? kFixedKc - 1 + kGdnMaxTokens : ring_len(kc);
  const auto channel = [&](int c) -> int {  // -1: a v slot past dv
    if (c < dk) return kh * dk + c;
    if (c < 2 * dk) return key_dim + kh * dk + c - dk;
    const int ev = blockIdx.x * tile + c - 2 * dk;
    return c < 2 * dk + tile && ev < dv ? 2 * key_dim + j * dv + ev : -1;
  };

  // Early loads (pdl.cuh): none of this is written by the in_proj launched just before. *pos
  // and the state were written by the step before (this kernel, one token earlier).
  const int pos = __ldcg(pos_p);
  const int conv_dim = 2 * key_dim + s.n_v_heads * dv;
  // The ring's offsets (slot x conv_dim) of positions pos - n_hist .. pos - 1, which every
  // block reads, and of pos .. pos + n - 1, which the writers write: one modulo, then steps.
  int hist_at[kMaxKc - 1], put_at[kMaxTok];
  {
    int slot = ring_slot(pos - n_hist, ring);
    const auto next = [&] { slot = slot + 1 == ring ? 0 : slot + 1; };
#pragma unroll
    for (int u = 0; u < kMaxKc - 1; ++u) {
      hist_at[u] = u < n_hist ? slot * conv_dim : 0;
      if (u < n_hist) next();
    }
#pragma unroll
    for (int t = 0; t < kMaxTok; ++t) {
      put_at[t] = slot * conv_dim;
      next();
    }
  }

  const float neg_a = -expf(__ldg(p.a_log + j)), dt_bias = __ldg(p.dt_bias + j);
  const size_t head = static_cast<size_t>(j) * dv, state_at = static_cast<size_t>(j) * dk * dv + e;
  const float norm_w = g == 0 && live ? __ldg(p.norm_w + e) : 0.0f;  // for the output threads
  float* S = ssm + state_at;  // column e of head j: S[d * dv]
  float st[kMaxRows];
  const auto load_state = [&] {
#pragma unroll
    for (int i = 0; i < kMaxRows; ++i) {
      const int d = g + groups * i;
      st[i] = live && d < dk ? __ldcg(S + static_cast<size_t>(d) * dv) : 0.0f;
    }
  };
  // Up to 256 threads the state rows load before the wait; 1024-thread blocks (64 registers a
  // thread) load them after the conv, so that nothing spills.
  constexpr bool kEarlyState = kMaxThreads <= 256;
  static_assert(kEarlyState || !kStageConv, "conv staging is for blocks of up to 256 threads");
  // kStageConv: this thread's conv taps (weights) and history (written by this kernel a step
  // earlier) go through registers into shared memory before the state rows, so that they hold no
  // register past here and only the in_proj's outputs follow the wait.
  if constexpr (kStageConv) {
#pragma unroll
    for (int i = 0; i < kConvSlots; ++i) {
      const int ch = channel(tid + n_thr * i);
      if (ch < 0) continue;
      const float* w = p.conv_w + static_cast<size_t>(ch) * kc;
      const float* h_in = conv_state + ch;
      float* dst = staged_conv(red_o + groups * tile, tid, i, kc);
      float v[2 * kMaxKc - 1];
#pragma unroll
      for (int t = 0; t < kMaxKc; ++t) v[t] = t < kc ? __ldg(w + t) : 0.0f;
#pragma unroll
      for (int t = 0; t < kMaxKc - 1; ++t) {
        v[kMaxKc + t] = t < n_hist ? __ldcg(h_in + hist_at[t]) : 0.0f;
      }
#pragma unroll
      for (int t = 0; t < kMaxKc; ++t) {
        if (t < kc) dst[t] = v[t];
        if (t < n_hist) dst[kc + t] = v[kMaxKc + t];
      }
    }
  }
  // The replay's kept tokens (GdnReplay; written by a verify launches back, its word by the
  // host before the graph: early loads, pdl.cuh (b)), folded into st after it loads. Several-
  // token instances only: the step's keeps its registers (a replay takes it from 48 to 64).
  const ReplayEntry at = replay_entry(s, dk, dv);
  constexpr bool kReplay = kMaxTok > 1;
  const int n_fold = kReplay && replay.buf ? __ldcg(replay.word) : 0;
  const int parity = kReplay && replay.buf ? __ldcg(replay.word + 1) : 0;
  const bool defer = kReplay && replay.defer;
  const auto fold = [&] {
    fold_replay(st, replay, n_fold, parity, at, kh, j, e, live, g, groups, dk, dv);
  };
  if constexpr (kEarlyState) {
    load_state();
    fold();
  }
  pdl::wait();

  // z, b, a: the in_proj launched just before wrote them.
  float beta[kMaxTok], alpha[kMaxTok], gate[kMaxTok];
#pragma unroll
  for (int t = 0; t < kMaxTok; ++t) {
    if (t >= n) break;
    const size_t row = t * ld;
    beta[t] = mixer::sigmoid(__ldcg(b + row + j));
    alpha[t] = expf(neg_a * mixer::softplus(__ldcg(a + row + j) + dt_bias));
    gate[t] = g == 0 && live ? silu(__ldcg(z + row + head + e)) : 0.0f;  // silu(z[e])
  }

  // Causal depthwise conv + SiLU of the slots into each token's qs / ks / vs (0 for v past dv),
  // the inputs into the ring.
  double sq_q[kMaxTok], sq_k[kMaxTok];
#pragma unroll
  for (int t = 0; t < kMaxTok; ++t) sq_q[t] = sq_k[t] = 0;
#pragma unroll
  for (int i = 0; i < kConvSlots; ++i) {
    const int c = tid + n_thr * i, ch = channel(c);
    const int at = c < dk ? c : c < 2 * dk ? c - dk : c - 2 * dk;
    const auto dst = [&](int t) { return (c < dk ? qs(t) : c < 2 * dk ? ks(t) : vs(t)) + at; };
    if (ch < 0) {
      if (c < 2 * dk + tile) {
#pragma unroll
        for (int t = 0; t < kMaxTok; ++t) {
          if (t < n) *dst(t) = 0.0f;
        }
      }
      continue;
    }
    float x[kMaxTok];  // the in_proj's outputs
#pragma unroll
    for (int t = 0; t < kMaxTok; ++t) x[t] = t < n ? __ldcg(qkv + t * ld + ch) : 0.0f;
    float* ring_ch = conv_state + ch;
    const bool write = c >= 2 * dk || (j % r == 0 && blockIdx.x == 0);
    // Taps t < n_hist multiply the inputs of positions pos + token - n_hist + t; the last tap,
    // the token's own. All loads first (one round trip, or staged before the wait), then each
    // token's sum in tap order.
    const float* w = p.conv_w + static_cast<size_t>(ch) * kc;
    float wt[kMaxKc - 1], h[kMaxKc - 1], w_last;
    if constexpr (kStageConv) {
      const float* staged = staged_conv(red_o + groups * tile, tid, i, kc);
#pragma unroll
      for (int t = 0; t < kMaxKc - 1; ++t) {
        wt[t] = t < n_hist ? staged[t] : 0.0f;
        h[t] = t < n_hist ? staged[kc + t] : 0.0f;
      }
      w_last = staged[n_hist];
    } else {
#pragma unroll
      for (int t = 0; t < kMaxKc - 1; ++t) {
        wt[t] = t < n_hist ? __ldg(w + t) : 0.0f;
        h[t] = t < n_hist ? __ldcg(ring_ch + hist_at[t]) : 0.0f;
      }
      w_last = __ldg(w + n_hist);
    }
#pragma unroll
    for (int t = 0; t < kMaxTok; ++t) {
      if (t >= n) break;
      if (write) ring_ch[put_at[t]] = x[t];
      float acc = __fmul_rn(w_last, x[t]);
#pragma unroll
      for (int tt = 0; tt < kMaxKc - 1; ++tt) {
        const int u = t + tt;  // in the sequence history [n_hist] | inputs [n]
        if (tt < n_hist) acc = __fmaf_rn(wt[tt], u < n_hist ? h[u] : x[u - n_hist], acc);
      }
      const float y = silu(acc);
      *dst(t) = y;
      if (c < dk) {
        sq_q[t] = __fma_rn(static_cast<double>(y), y, sq_q[t]);
      } else if (c < 2 * dk) {
        sq_k[t] = __fma_rn(static_cast<double>(y), y, sq_k[t]);
      }
    }
  }
  // l2 norms of q and k over their dk channels: warp trees, then the warps in order.
#pragma unroll
  for (int t = 0; t < kMaxTok; ++t) {
    if (t >= n) break;
    const QkNorm nq = qk_norm(sq_q[t], sq_k[t], warp_sq[t], n_thr, dk);
#pragma unroll
    for (int i = 0; i < kConvSlots; ++i) {
      const int c = tid + n_thr * i;  // the thread's own slots: no other thread touches them
      if (c < dk) {
        qs(t)[c] = qs(t)[c] * nq.inv_q * nq.q_scale;
      } else if (c < 2 * dk) {
        ks(t)[c - dk] = ks(t)[c - dk] * nq.inv_k;
      }
    }
  }
  if constexpr (!kEarlyState) {
    load_state();
    fold();
  }
  // Deferring: the state with the fold applied is the checkpoint (unchanged without a fold).
  if (defer && n_fold > 0 && live) {
#pragma unroll
    for (int i = 0; i < kMaxRows; ++i) {
      const int d = g + groups * i;
      if (d < dk) S[static_cast<size_t>(d) * dv] = st[i];
    }
  }
  __syncthreads();  // ks, qs, vs ready

  // Per token: decay, predict with the decayed state, the rank-1 write (stored after the last
  // token unless deferring), the output. Deferring, each token's entry: k^ by the key head's
  // writer block, delta by each column's g == 0 thread, alpha by tile 0's first thread.
  float o[kMaxTok];
  float* put =
      defer ? replay.buf + static_cast<size_t>((1 - parity) * kGdnMaxTokens) * at.floats : nullptr;
  const bool k_writer = j % r == 0 && blockIdx.x == 0;
#pragma unroll
  for (int t = 0; t < kMaxTok; ++t) {
    if (t >= n) break;
    const bool store = t == n - 1 && !defer;
    float delta = 0.0f;
    o[t] =
        delta_rule<true>(st, g, groups, col, tile, dk, ks(t), qs(t), alpha[t], beta[t], vs(t)[col],
                         red_p, red_o, live && store, S, static_cast<size_t>(dv), &delta);
    if (put) {
      float* en = put + static_cast<size_t>(t) * at.floats;
      if (k_writer) {
        for (int c = tid; c < dk; c += n_thr) en[kh * dk + c] = ks(t)[c];
      }
      if (g == 0 && live) en[at.delta + head + e] = delta;
      if (blockIdx.x == 0 && tid == 0) en[at.alpha + j] = alpha[t];
    }
    if (g == 0) col_sq[t][col] = live ? static_cast<double>(o[t]) * o[t] : 0.0;
  }
  if (tile <= 32) {
    __syncwarp();  // the g == 0 threads are warp 0
  } else {
    __syncthreads();
  }
  cluster_wait_acquire();  // every block of the cluster has started (long since, by now)
  // Each token's tile sum of squares in column order, pushed into tile_sq[t][blockIdx.x] of
  // every block of the cluster (block rank = blockIdx.x: the cluster spans the grid's x).
  if (tid == 0) {
    const cg::cluster_group cluster = cg::this_cluster();
    for (int t = 0; t < n; ++t) {
      double sq = 0.0;
#pragma unroll 32
      for (int c = 0; c < tile; ++c) sq += col_sq[t][c];
      for (int rank = 0; rank < n_tiles; ++rank) {
        *cluster.map_shared_rank(&tile_sq[t][blockIdx.x], rank) = sq;
      }
    }
  }
  cluster_arrive_release();
  cluster_wait_acquire();  // no block reads or writes another's shared memory after this
  if (g == 0 && live) {
#pragma unroll
    for (int t = 0; t < kMaxTok; ++t) {
      if (t >= n) break;
      double total = 0.0;
      for (int tl = 0; tl < n_tiles; ++tl) total += tile_sq[t][tl];
      const float inv = 1.0f / sqrtf(static_cast<float>(total) / static_cast<float>(dv) + s.eps);
      out[t * ld_out + head + e] = o[t] * inv * norm_w * gate[t];
    }
  }
}

// The instance for a launch: kMaxTok tokens at most, blocks of up to 256 threads or 1024,
// the Qwen3.5 shape fixed or not, the conv staged before the wait or not.
template <int kMaxTok>
auto decode_kernel(bool big, bool fixed, bool stage) {
  return big     ? gdn_decode_kernel<1024, false, 0, kMaxTok>
         : fixed ? (stage ? gdn_decode_kernel<256, true, kFixedDk, kMaxTok>
                          : gdn_decode_kernel<256, false, kFixedDk, kMaxTok>)
         : stage ? gdn_decode_kernel<256, true, 0, kMaxTok>
                 : gdn_decode_kernel<256, false, 0, kMaxTok>;
}

// gdn_fold: the replay's kept tokens folded into the state, a thread per (column, row group) as
// in gdn_decode's blocks, a row at a time through fold_replay as gdn_decode folds them.
__global__ void gdn_fold_kernel(GdnShape s, Plan pl, GdnReplay replay, float* __restrict__ ssm) {
  const int j = blockIdx.y, col = threadIdx.x % pl.tile, g = threadIdx.x / pl.tile;
  const int e = blockIdx.x * pl.tile + col, dk = s.dk, dv = s.dv;
  if (e >= dv) return;
  const int n_fold = replay.word[0], parity = replay.word[1];
  const int kh = j / (s.n_v_heads / s.n_k_heads);
  float* S = ssm + static_cast<size_t>(j) * dk * dv + e;
  for (int d = g; d < dk; d += pl.groups) {
    float st[1] = {S[static_cast<size_t>(d) * dv]};
    fold_replay(st, replay, n_fold, parity, replay_entry(s, dk, dv), kh, j, e, true, d, 1, dk, dv);
    S[static_cast<size_t>(d) * dv] = st[0];
  }
}

}  // namespace

cudaError_t gdn_fold(const GdnShape& shape, GdnReplay replay, float* ssm, cudaStream_t stream) {
  if (!supported(shape)) return cudaErrorInvalidValue;
  if (!replay.buf) return cudaSuccess;
  const Plan pl = make_plan(shape);
  gdn_fold_kernel<<<dim3(static_cast<unsigned>(pl.n_tiles), static_cast<unsigned>(shape.n_v_heads)),
                    pl.tile * pl.groups, 0, stream>>>(shape, pl, replay, ssm);
  return cudaGetLastError();
}

int gdn_conv_ring(const GdnShape& shape) {
  return ring_len(shape.kc);
}

size_t gdn_conv_state_floats(const GdnShape& shape) {
  return static_cast<size_t>(shape.conv_dim()) * ring_len(shape.kc);
}

size_t gdn_replay_entry_floats(const GdnShape& shape) {
  return static_cast<size_t>(replay_entry(shape, shape.dk, shape.dv).floats);
}

cudaError_t gdn_decode(const GdnShape& shape, const GdnParams& p, const float* qkv, const float* z,
                       const float* b, const float* a, const int* pos, GdnState state, float* out,
                       cudaStream_t stream) {
  return gdn_decode_tokens(shape, p, qkv, z, b, a, 0, 1, pos, state, {}, out, 0, stream);
}

cudaError_t gdn_decode_tokens(const GdnShape& shape, const GdnParams& p, const float* qkv,
                              const float* z, const float* b, const float* a, size_t ld, int n,
                              const int* pos, GdnState state, GdnReplay replay, float* out,
                              size_t ld_out, cudaStream_t stream) {
  if (!supported(shape) || n < 1 || n > kGdnMaxTokens) return cudaErrorInvalidValue;
  const Plan pl = make_plan(shape);
  const dim3 grid(static_cast<unsigned>(pl.n_tiles), static_cast<unsigned>(shape.n_v_heads));
  // Conv staging where the grid is at most one block per SM: its blocks then start beside the
  // in_proj's (one slot per SM is left), so loads before the wait cost nothing; with more
  // blocks, those that start late would stall on them before the wait, which delays the grid's
  // trigger of the next launch. H100: 35B (128 blocks) 1.78 -> 1.75 ms per step; 122B (256)
  // 3.20 -> 3.24 ms with staging, hence not there.
  int device = 0, n_sm = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  const int threads = pl.tile * pl.groups;
  const bool stage = threads <= 256 && static_cast<long>(grid.x) * grid.y <= n_sm;
  const size_t smem =
      (static_cast<size_t>(n) * (2 * shape.dk + pl.tile) + 2 * pl.groups * pl.tile +
       (stage ? static_cast<size_t>(threads) * kConvSlots * (2 * shape.kc - 1) : 0)) *
      sizeof(float);
  // Up to 256 threads (every Qwen3.5 shape) the compiler may use 255 registers a thread, and the
  // conv slots and state rows stay in registers; only deep heads need more threads. One token
  // (the decode step) has instances of its own, without the other tokens' registers and loops.
  const bool fixed = shape.dk == kFixedDk && shape.dv == kFixedDk && shape.kc == kFixedKc &&
                     pl.tile == kFixedTile && pl.groups == kFixedGroups;
  const auto kernel = n == 1 && !replay.buf
                          ? decode_kernel<1>(threads > 256, fixed, stage)
                          : decode_kernel<kGdnMaxTokens>(threads > 256, fixed, stage);
  return pdl::launch_cluster(kernel, grid, dim3(pl.n_tiles), threads, smem, stream, shape, pl, p,
                             qkv, z, b, a, ld, n, pos, state.conv, state.ssm, replay, out, ld_out);
}

}  // namespace qf::kern
