// Gated full attention decode for one token (qf/kern/attention.h, qwen35-architecture.md §3.4).
// Twins: attention_ref.cpp (attn_prepare_ref, then attn_decode_ref). Test:
// tests/kernels/attention_test.cpp.
//
// Flash-decoding, two launches. attn_split_kernel, grid (n_splits, Nkv, head blocks): a block takes
// one KV head and up to 8 (hd 256; 8 * 256 / hd in general) of its query heads over one chunk of
// the context, so each K/V row is read once per head block and the GQA group's blocks fill the GPU.
//   * Before its PDL wait a block reads the rotary table's row *pos and loads its first tile of
//     cached rows (both written by earlier steps), so those loads overlap the projection before.
//     The table (attn_rope_kernel, once at load) holds cos/sin computed in double and rounded
//     once (inv_freq = 1 / (float)theta^(2i/rot), angle = (float)pos * inv_freq, cos/sin of that
//     float angle): the correctly rounded value of the CPU engine's f32 powf/cosf/sinf, so q and k
//     agree with it to an ulp at any position, and no double arithmetic is left in the step (a
//     GB10 runs it at 1/64 of the f32 rate).
//   * Then a warp per query head applies the zero-centred RMSNorm and partial NeoX RoPE to its
//     q_proj row in shared memory. The split holding row *pos (the last one) does the same for
//     the new k row, copies the new v row, uses both from shared memory and appends them to the
//     caches (head block 0 writes); no block reads row *pos from memory.
//   * Rows go in tiles of 32: a warp computes the heads' scores for 4 rows, a warp per head
//     updates the online softmax (running max m, sum l), then thread `dim` accumulates p * v[dim]
//     for its heads. Each split leaves m, l and the unnormalized output in scratch.
//   * attn_combine_kernel, one block per query head, rescales the splits to the global max,
//     divides by the total sum and multiplies by sigmoid(gate), in split order.
// attn_prefill (many tokens, batched prefill): attn_append_kernel writes every token's k and v
// rows first (the same normed, rotated rows); then, at head_dim 256 where the device takes it,
// flash attention on the tensor cores (attention_prefill.cu); else the split kernel's kPrefill
// instance (the scalar path) runs a block per token and head block in one split each, every row
// read from the cache, and the combine runs grid.y = token: no launch per token and no memset
// between them. A block's token, split and head block come from blockIdx.x (split_block), so the
// blocks that read the same rows run side by side and the rows come from DRAM once.
// attn_decode_rows (a verify's tokens) runs the same launches over attn_decode's splits and
// kernel (the split kernel or the tensor-core one): bit for bit attn_decode's results, as the new
// row a decode takes from shared memory holds the values the append stores (the same normed,
// rotated, rounded k; v rounded).
// bf16 and fp8 caches (AttnShape::kv): entries rounded as rows are appended (the new row used
// rounded too); the split kernel's Bf16 and Fp8 instances stage each tile's rows through
// shared memory by cp.async one tile ahead (docs/cuda-engine-speed.md, "bf16 KV caches"). At
// head_dim 256, bf16 and fp8 decode run attention_decode_mma.cu's tensor-core kernel in the split
// kernel's place (AttnDecodePath), over the same splits, into the same combine.
// The chunk length is derived on the device from *pos with a fixed split count, so graphs replay
// at any position, every result is the same for the same position (deterministic), and splits
// past the context exit at once.
// The Qwen3.5 shape (head_dim 256, 2 KV heads, rotary 64, 8 query heads a block) runs a split
// instance with those fixed at compile time (kFixed): qforge-bench-mixers, 122B, per layer at
// context 1024 / 4096: H100 10.14 -> 9.44 / 18.9 -> 18.2 us, H200 9.95 -> 9.28 / 18.2 -> 17.1;
// the 122B step 60.7% -> 60.9% of copy (H100), 48.7% -> 48.9% (H200).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention_common.cuh"
#include "attention_decode_mma.h"
#include "attention_prefill.h"
#include "cp_async.cuh"
#include "device_limits.h"
#include "mixer_common.cuh"
#include "pdl.cuh"
#include "qf/kern/attention.h"

namespace qf::kern {
namespace {

using attn_detail::AttnArgs;
using attn_detail::context_len;
using attn_detail::kMaxSplits;
using attn_detail::kTile;
using attn_detail::split_block;
using attn_detail::split_chunk;

constexpr int kThreads = 256;
constexpr int kMaxAcc = 8;             // query heads one thread accumulates (times kThreads / hd)
constexpr int kCombineThreads = 1024;  // a multiple of every supported hd
// The Qwen3.5 attention shape (35B-A3B, 122B-A10B): head_dim 256, 2 KV heads, a 64-wide rotary,
// query groups a multiple of 8 heads a block, for which launch_decode takes a fixed instance.
constexpr int kFixedHd = 256, kFixedKv = 2, kFixedRot = 64, kFixedHpb = 8;

int heads_per_block(const AttnShape& s) {
  return std::min(s.n_q_heads / s.n_kv_heads, kMaxAcc * (kThreads / s.head_dim));
}
int head_blocks(const AttnShape& s) {
  const int group = s.n_q_heads / s.n_kv_heads, hpb = heads_per_block(s);
  return (group + hpb - 1) / hpb;
}
// Splits of the context: at most one per 32-row tile of the cache and kMaxSplits (scratch is
// sized for this many).
int max_splits(const AttnShape& s) {
  return std::min(kMaxSplits, (s.max_len + kTile - 1) / kTile);
}
// Splits for a launch: as many as give every SM of the current device two split blocks (the
// split kernel's occupancy: 128 registers x 256 threads), so that a long context runs in one
// wave of longer chunks rather than two of short ones (H200, 122B synthetic at context 4000:
// 2905 us per step with 64-row chunks against 2968 with 32-row ones; at 1024, 32-row chunks).
// n_head_blocks: the blocks a KV head's query group takes (head_blocks, or the tensor-core
// kernel's, which also fits two blocks an SM on an H100 or H200 by its 98 KB of shared memory, and
// one on sm_120/121, so two waves there).
int n_splits_for(const AttnShape& s, int n_head_blocks) {
  const int n_sm = sm_count();
  if (n_sm == 0) {
    cudaGetLastError();  // clear it: the launch reports its own errors
    return max_splits(s);
  }
  return std::clamp(2 * n_sm / (s.n_kv_heads * n_head_blocks), 1, max_splits(s));
}

// The split kernel's shared memory (its layout there): floats before the staged tiles, rounded
// to 16 bytes, and bytes in all.
__host__ __device__ constexpr int staged_offset(int hpb, int hd) {
  return (hpb * (hd + kTile + 3) + 3 * hd + 3) / 4 * 4;
}
template <int kHd, class Kv>
size_t split_smem_bytes(int hpb) {
  if constexpr (sizeof(Kv) == sizeof(float)) {
    return (static_cast<size_t>(hpb) * (kHd + kTile + 3) + 3 * kHd) * sizeof(float);
  }
  return staged_offset(hpb, kHd) * sizeof(float) + 2 * 2 * kTile * kHd * sizeof(Kv);
}
// Lets `kernel` take `bytes` of dynamic shared memory where that is past the default 48 KB.
template <class K>
cudaError_t allow_smem(K* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

// kVec consecutive cache entries at p (floats: 16-byte aligned for 4, 8 for 2; Bf16: half
// that; Fp8: a quarter) as floats. kCg: through L2 only (ld.global.cg): the cache rows may be
// loaded before the PDL wait (pdl.cuh, rule (b)).
template <int kVec, bool kCg>
__device__ __forceinline__ void load_vec(const float* p, float* out) {
  if constexpr (kVec == 4) {
    const float4* p4 = reinterpret_cast<const float4*>(p);
    const float4 v = kCg ? __ldcg(p4) : *p4;
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  } else if constexpr (kVec == 2) {
    const float2* p2 = reinterpret_cast<const float2*>(p);
    const float2 v = kCg ? __ldcg(p2) : *p2;
    out[0] = v.x, out[1] = v.y;
  } else {
    out[0] = kCg ? __ldcg(p) : *p;
  }
}
template <int kVec, bool kCg, class Kv>  // Bf16, Fp8
__device__ __forceinline__ void load_vec(const Kv* p, float* out) {
  static_assert(kVec == 2 || kVec == 4, "hd / 32 entries a lane, hd 64 to 256");
  if constexpr (kVec == 4) {
    const float4 v = attn_detail::kv_load4<kCg>(p);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  } else {
    const float2 v = attn_detail::kv_load2<kCg>(p);
    out[0] = v.x, out[1] = v.y;
  }
}

// One level of a warp's reduce-scatter: lanes with bit kO clear keep v[0..kO) and add their
// partner's, lanes with it set keep v[kO..2 kO) and add their partner's, stored at v[0..kO).
// After levels 16, 8, 4, 2, 1, lane L holds the warp's sum of the lanes' v[L]. The same tree as
// gemv_detail::reduce_rows<32> (gemv_common.cuh), whose loop form leaves v in local memory on
// sm_90 (a 128-byte stack frame, ptxas); moving gemv and lm_head to this form changes their
// SASS, which is left for a session with a GPU to time it.
template <int kO>
__device__ __forceinline__ void reduce_scatter(float (&v)[32], int lane) {
  const bool upper = lane & kO;
#pragma unroll
  for (int i = 0; i < kO; ++i) {
    const float send = upper ? v[i] : v[i + kO];
    const float keep = upper ? v[i + kO] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kO);
  }
}

// kFixed: the Qwen3.5 attention shape (kFixed* below) with its head count per block, KV heads
// and rotary width as compile-time constants, so that the head loops and row strides fold.
// kPrefill: attn_prefill's tokens (AttnArgs), an instance of its own so that decode's keeps its
// registers (one instance for both spilled). Kv: the caches' entries (float, Bf16 or Fp8).
// Bf16 and Fp8 caches: two blocks an SM, so at most 128 registers (unbounded, ptxas took 182: one
// block). f32: no minimum (0), which compiles as the bound's absence (1 does not).
template <int kHd, bool kFixed, bool kPrefill, class Kv>
__global__ void __launch_bounds__(kThreads, sizeof(Kv) == sizeof(float) ? 0 : 2)
    attn_split_kernel(AttnShape s, int n_splits, int hpb_arg, AttnArgs a) {
  static_assert(!kFixed || kHd == kFixedHd, "the fixed shape only");
  const int hpb = kFixed ? kFixedHpb : hpb_arg;
  constexpr int kE = kHd / 32;  // elements of a K row per lane
  constexpr int kVec = kE < 4 ? kE : 4;
  constexpr int kWarps = kThreads / 32, kRowsPerWarp = kTile / kWarps;
  constexpr int kSlices = kThreads / kHd;   // threads sharing one output dim
  constexpr int kPass = 32 / kRowsPerWarp;  // heads per scoring pass: one pair per lane
  static_assert(kE % kVec == 0 && kTile % kWarps == 0 && kThreads % kHd == 0 &&
                kRowsPerWarp * kPass == 32);

  // q [hpb, hd] | p [hpb, kTile] | m, l, corr [hpb] | new k, new v [hd] | cos, sin [hd / 2]
  // | Bf16 and Fp8 caches: two stages of a tile's K and V rows ([2][2][kTile][hd], 16-byte aligned)
  extern __shared__ __align__(16) float smem[];
  float* qs = smem;
  float* ps = qs + hpb * kHd;
  float* m_s = ps + hpb * kTile;
  float* l_s = m_s + hpb;
  float* corr_s = l_s + hpb;
  float* kn_s = corr_s + hpb;
  float* vn_s = kn_s + kHd;
  float* cos_s = vn_s + kHd;
  float* sin_s = cos_s + kHd / 2;
  Kv* stage_s = reinterpret_cast<Kv*>(smem + staged_offset(hpb, kHd));
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, dim = tid % kHd, slice = tid / kHd;

  // Before the wait: *pos (written by the previous step) and this split's first tile of cached
  // rows (written by earlier steps), both through L2 (pdl.cuh, rule (b)); the rotary row.
  // The block's token, split and head block (split_block); prefill: the token's rows are all
  // cached.
  constexpr bool cached = kPrefill;
  const int n_sub = (s.n_q_heads / s.n_kv_heads + hpb - 1) / hpb;
  const attn_detail::SplitBlock sb = split_block(cached ? a.n_tokens : 1, n_sub);
  const int tok = sb.tok, split = sb.split, zb = sb.sub;
  const int pos = cached ? a.pos[tok] : __ldcg(a.pos);
  const int t_len = context_len(pos, s.max_len);
  const int chunk = split_chunk(t_len, n_splits), t0 = split * chunk;
  const int t1 = min(t_len, t0 + chunk);
  const int rot_dim = kFixed ? kFixedRot : s.rot_dim, n_kv = kFixed ? kFixedKv : s.n_kv_heads;
  const int kvh = blockIdx.y, half = rot_dim / 2;
  const size_t row_stride = static_cast<size_t>(n_kv) * kHd;
  const Kv* kbase = reinterpret_cast<const Kv*>(a.k_cache) + static_cast<size_t>(kvh) * kHd;
  const Kv* vbase = reinterpret_cast<const Kv*>(a.v_cache) + static_cast<size_t>(kvh) * kHd;
  const float* rope = a.rope + static_cast<size_t>(t_len - 1) * rot_dim;  // (cos, sin) pairs
  for (int i = tid; i < half; i += kThreads) {
    cos_s[i] = rope[2 * i];
    sin_s[i] = rope[2 * i + 1];
  }
  // Lane holds elements c * 32 * kVec + lane * kVec + v of rows warp + kWarps * rr (coalesced
  // rows, conflict-free q reads from shared memory); thread `dim` holds v[dim] of every row.
  // Rows from *pos on stay zero here (the new row comes from shared memory, see below).
  float kr[kRowsPerWarp][kE], vr[kTile];
  const auto load_tile = [&](int tb) {
    const int end = min(t1, cached ? pos + 1 : pos) - tb;  // rows tb .. tb + end - 1 are cached
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp + kWarps * rr;
#pragma unroll
      for (int c = 0; c < kE / kVec; ++c) {
        if (r < end) {
          load_vec<kVec, true>(kbase + (tb + r) * row_stride + c * 32 * kVec + lane * kVec,
                               &kr[rr][c * kVec]);
        } else {
#pragma unroll
          for (int v = 0; v < kVec; ++v) kr[rr][c * kVec + v] = 0.0f;
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kTile; ++t)
      vr[t] = t < end ? attn_detail::kv_f32(__ldcg(vbase + (tb + t) * row_stride + dim)) : 0.0f;
  };
  // Bf16 and Fp8 caches (kStaged): half or a quarter of the bytes a load, so the tiles go through
  // shared memory instead, by cp.async one tile ahead (the registers could not hold two), and are
  // read from there in the registers' layout above; rows from the end are zero-filled.
  constexpr bool kStaged = sizeof(Kv) != sizeof(float);
  const auto issue_tile = [&](int tb, int buf) {
    const int end = min(t1, cached ? pos + 1 : pos) - tb;
    constexpr int kIn = 16 / sizeof(Kv);                        // entries a 16-byte chunk
    constexpr int kChunks = kHd / kIn, kPer = kTile * kChunks;  // chunks a row, a cache's tile
    Kv* dst = stage_s + buf * 2 * kTile * kHd;
    for (int i = tid; i < 2 * kPer; i += kThreads) {
      const int which = i / kPer, r = i % kPer / kChunks, c = i % kChunks;
      const Kv* src = (which ? vbase : kbase) + (tb + (r < end ? r : 0)) * row_stride + c * kIn;
      gemv_detail::cp_async16(dst + (which * kTile + r) * kHd + c * kIn, src, r < end ? 16 : 0);
    }
    gemv_detail::cp_async_commit();
  };
  const auto tile_from_smem = [&](int buf) {
    const Kv* ks = stage_s + buf * 2 * kTile * kHd;
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
#pragma unroll
      for (int c = 0; c < kE / kVec; ++c) {
        load_vec<kVec, false>(ks + (warp + kWarps * rr) * kHd + c * 32 * kVec + lane * kVec,
                              &kr[rr][c * kVec]);
      }
    }
#pragma unroll
    for (int t = 0; t < kTile; ++t) vr[t] = attn_detail::kv_f32(ks[(kTile + t) * kHd + dim]);
  };
  if (t0 < t1) {
    if constexpr (kStaged) {
      issue_tile(t0, 0);
    } else {
      load_tile(t0);
    }
  }
  pdl::wait();
  if (t0 >= t1 || pos < 0 || pos >= s.max_len) {             // contract: 0 <= *pos < max_len
    if constexpr (kStaged) gemv_detail::cp_async_wait<0>();  // no copy outlives the block
    return;
  }
  __syncthreads();  // the rotary row

  const int group = s.n_q_heads / n_kv;
  const int h_lo = kvh * group + zb * hpb;
  // (the fixed shape's groups are whole multiples of kFixedHpb)
  const int nh = kFixed ? kFixedHpb : min(hpb, group - zb * hpb);
  const bool has_new = !cached && pos < t1;  // this split ends with the new row
  const float* q_proj = a.q_proj + static_cast<size_t>(tok) * a.q_row;
  // Warp per item: query heads 0 .. nh - 1, then the new k row. The new row as the cache will
  // hold it (kv_round), so that it is used as later steps will read it.
  for (int it = warp; it < nh + (has_new ? 1 : 0); it += kWarps) {
    if (it < nh) {
      attn_detail::norm_rope_warp<kHd>(q_proj + static_cast<size_t>(h_lo + it) * 2 * kHd,
                                       a.q_norm_w, s.eps, half, cos_s, sin_s, qs + it * kHd);
    } else {
      attn_detail::norm_rope_warp<kHd>(a.k_proj + static_cast<size_t>(kvh) * kHd, a.k_norm_w, s.eps,
                                       half, cos_s, sin_s, kn_s);
      if constexpr (sizeof(Kv) != sizeof(float)) {
        for (int i = lane; i < kHd; i += 32) kn_s[i] = attn_detail::kv_round<Kv>(kn_s[i]);
      }
    }
  }
  if (has_new) {
    for (int i = tid; i < kHd; i += kThreads)
      vn_s[i] = attn_detail::kv_round<Kv>(a.v_proj[kvh * kHd + i]);
  }
  for (int i = tid; i < nh; i += kThreads) {
    m_s[i] = -INFINITY;
    l_s[i] = 0.0f;
  }
  __syncthreads();
  if (has_new && zb == 0) {
    const size_t row = static_cast<size_t>(pos) * row_stride + static_cast<size_t>(kvh) * kHd;
    for (int i = tid; i < kHd; i += kThreads) {
      reinterpret_cast<Kv*>(a.k_cache)[row + i] = attn_detail::kv_entry<Kv>(kn_s[i]);
      reinterpret_cast<Kv*>(a.v_cache)[row + i] = attn_detail::kv_entry<Kv>(vn_s[i]);
    }
  }
  if (a.q && split == 0) {
    for (int i = tid; i < nh * kHd; i += kThreads) a.q[static_cast<size_t>(h_lo) * kHd + i] = qs[i];
  }

  float acc[kMaxAcc];
#pragma unroll
  for (int u = 0; u < kMaxAcc; ++u) acc[u] = 0.0f;
  const float scale = 1.0f / sqrtf(static_cast<float>(kHd));
  for (int tb = t0, buf = 0; tb < t1; tb += kTile, buf ^= 1) {
    const int nt = min(kTile, t1 - tb);
    if constexpr (kStaged) {
      if (tb + kTile < t1) {
        issue_tile(tb + kTile, buf ^ 1);  // its buffer's last reader was the tile before's
      } else {
        gemv_detail::cp_async_commit();
      }
      gemv_detail::cp_async_wait<1>();
      __syncthreads();
      tile_from_smem(buf);
    } else if (tb != t0) {
      load_tile(tb);
    }
    if (has_new && pos < tb + kTile) {  // the new row is in this tile: from shared memory
      const int r_new = pos - tb;
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        if (warp + kWarps * rr == r_new) {
#pragma unroll
          for (int c = 0; c < kE / kVec; ++c) {
#pragma unroll
            for (int v = 0; v < kVec; ++v)
              kr[rr][c * kVec + v] = kn_s[c * 32 * kVec + lane * kVec + v];
          }
        }
      }
#pragma unroll
      for (int t = 0; t < kTile; ++t) {
        if (t == r_new) vr[t] = vn_s[dim];
      }
    }
    // Scores, kPass heads at a time: a lane sums its elements of every (row, head) pair, then a
    // reduce-scatter butterfly (31 shuffles instead of 5 per pair) leaves pair
    // (lane / kPass, lane % kPass) complete on lane `lane`.
    for (int h0 = 0; h0 < nh; h0 += kPass) {
      float v[32];
#pragma unroll
      for (int j = 0; j < kPass; ++j) {
        const float* qh = qs + min(h0 + j, nh - 1) * kHd;  // past nh: a real row, result unused
        float qv[kE];
#pragma unroll
        for (int c = 0; c < kE / kVec; ++c) {
          load_vec<kVec, false>(qh + c * 32 * kVec + lane * kVec, &qv[c * kVec]);
        }
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
          float d = 0.0f;
#pragma unroll
          for (int e = 0; e < kE; ++e) d += qv[e] * kr[rr][e];
          v[rr * kPass + j] = d;
        }
      }
      reduce_scatter<16>(v, lane);
      reduce_scatter<8>(v, lane);
      reduce_scatter<4>(v, lane);
      reduce_scatter<2>(v, lane);
      reduce_scatter<1>(v, lane);
      const int h = h0 + lane % kPass, r = warp + kWarps * (lane / kPass);
      if (h < nh && r < nt) ps[h * kTile + r] = v[0] * scale;
    }
    __syncthreads();
    // Online softmax, one warp per head: rows past the context get p = 0.
    for (int h = warp; h < nh; h += kWarps) {
      const float sc = lane < nt ? ps[h * kTile + lane] : -INFINITY;
      const float m_old = m_s[h], m_new = fmaxf(m_old, mixer::warp_max(sc));
      const float pe = lane < nt ? expf(sc - m_new) : 0.0f;
      ps[h * kTile + lane] = pe;
      const float l_tile = mixer::warp_sum(pe);
      if (lane == 0) {
        const float corr = expf(m_old - m_new);
        corr_s[h] = corr;
        l_s[h] = l_s[h] * corr + l_tile;
        m_s[h] = m_new;
      }
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kMaxAcc; ++u) {
      const int h = slice + kSlices * u;
      if (h < nh) {
        float acc_h = acc[u] * corr_s[h];
        const float4* ph = reinterpret_cast<const float4*>(ps + h * kTile);
#pragma unroll
        for (int t4 = 0; t4 < kTile / 4; ++t4) {
          const float4 p = ph[t4];
          acc_h +=
              p.x * vr[4 * t4] + p.y * vr[4 * t4 + 1] + p.z * vr[4 * t4 + 2] + p.w * vr[4 * t4 + 3];
        }
        acc[u] = acc_h;
      }
    }
    __syncthreads();  // ps and corr_s are rewritten by the next tile
  }
  const size_t parts = static_cast<size_t>(s.n_q_heads) * n_splits;
  float* part_o = a.part_o + tok * parts * kHd;
#pragma unroll
  for (int u = 0; u < kMaxAcc; ++u) {
    const int h = slice + kSlices * u;
    if (h < nh) part_o[(static_cast<size_t>(h_lo + h) * n_splits + split) * kHd + dim] = acc[u];
  }
  for (int i = tid; i < nh; i += kThreads) {
    float* ml =
        a.part_ml + tok * parts * 2 + (static_cast<size_t>(h_lo + i) * n_splits + split) * 2;
    ml[0] = m_s[i];
    ml[1] = l_s[i];
  }
}

// One block per query head (and token: blockIdx.y, prefill). Thread sp < n_active takes split
// sp for the global max and the total sum (fixed shuffle trees); thread (dim, grp) then sums
// splits grp, grp + n_grp, ... of output dim `dim` (many loads in flight), and group 0 adds the
// groups in index order. kPrefill: an instance of its own, as the split kernel's.
template <bool kPrefill>
__global__ void __launch_bounds__(kCombineThreads)
    attn_combine_kernel(AttnShape s, int n_splits, const float* __restrict__ q_proj,
                        const int* __restrict__ pos_p, const float* __restrict__ part_o,
                        const float* __restrict__ part_ml, float* __restrict__ out, size_t q_row,
                        size_t out_row) {
  pdl::wait();
  if constexpr (kPrefill) {
    const size_t tok = blockIdx.y, parts = static_cast<size_t>(s.n_q_heads) * n_splits;
    pos_p += tok;
    q_proj += tok * q_row;
    out += tok * out_row;
    part_o += tok * parts * s.head_dim;
    part_ml += tok * parts * 2;
  }
  __shared__ float weight[kMaxSplits];
  __shared__ float red[kCombineThreads];
  __shared__ float warp_stat[kCombineThreads / 32];
  __shared__ float m_all, l_all;
  const int t_len = context_len(*pos_p, s.max_len);
  const int chunk = split_chunk(t_len, n_splits), n_active = (t_len + chunk - 1) / chunk;
  const int h = blockIdx.x, hd = s.head_dim, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n_warps = blockDim.x >> 5;
  const float* ml = part_ml + static_cast<size_t>(h) * n_splits * 2;
  const float m_sp = tid < n_active ? ml[2 * tid] : -INFINITY;
  const float l_sp = tid < n_active ? ml[2 * tid + 1] : 0.0f;
  float v = mixer::warp_max(m_sp);
  if (lane == 0) warp_stat[warp] = v;
  __syncthreads();
  if (tid == 0) {
    float m = -INFINITY;
    for (int w = 0; w < n_warps; ++w) m = fmaxf(m, warp_stat[w]);
    m_all = m;
  }
  __syncthreads();
  const float w_sp = tid < n_active ? expf(m_sp - m_all) : 0.0f;
  if (tid < n_active) weight[tid] = w_sp;
  v = mixer::warp_sum(w_sp * l_sp);
  if (lane == 0) warp_stat[warp] = v;
  __syncthreads();
  if (tid == 0) {
    float l = 0.0f;
    for (int w = 0; w < n_warps; ++w) l += warp_stat[w];
    l_all = l;
  }
  const int n_grp = blockDim.x / hd, dim = tid % hd, grp = tid / hd;
  const float* po = part_o + static_cast<size_t>(h) * n_splits * hd + dim;
  float o = 0.0f;
#pragma unroll 8
  for (int sp = grp; sp < n_active; sp += n_grp) o += weight[sp] * po[static_cast<size_t>(sp) * hd];
  red[tid] = o;
  __syncthreads();
  if (grp == 0) {
    float total = 0.0f;
    for (int gi = 0; gi < n_grp; ++gi) total += red[gi * hd + dim];
    const float gate = q_proj[static_cast<size_t>(h) * 2 * hd + hd + dim];
    out[static_cast<size_t>(h) * hd + dim] = total / l_all * mixer::sigmoid(gate);
  }
}

// Entry (p, i) of the table: (cos, sin) of pos p at frequency i, computed in double and rounded
// once (inv_freq = 1 / (float)theta^(2i/rot), angle = (float)p * inv_freq): the correctly
// rounded value of the CPU engine's f32 powf/cosf/sinf.
__global__ void attn_rope_kernel(AttnShape s, float* __restrict__ table) {
  const int half = s.rot_dim / 2;
  const int64_t n = static_cast<int64_t>(s.max_len) * half;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int p = static_cast<int>(j / half), i = static_cast<int>(j % half);
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(s.rot_dim);
    const float inv_freq =
        1.0f / static_cast<float>(pow(static_cast<double>(s.theta), static_cast<double>(exponent)));
    const float angle = static_cast<float>(p) * inv_freq;
    table[2 * j] = static_cast<float>(cos(static_cast<double>(angle)));
    table[2 * j + 1] = static_cast<float>(sin(static_cast<double>(angle)));
  }
}

// The split kernel for the shape: the fixed Qwen3.5 instance where it takes it (its query groups
// a multiple of kFixedHpb), else the general one.
template <int kHd, bool kPrefill, class Kv>
auto split_kernel_for(const AttnShape& s, int hpb) {
  if constexpr (kHd == kFixedHd) {
    if (s.n_kv_heads == kFixedKv && s.rot_dim == kFixedRot && hpb == kFixedHpb &&
        (s.n_q_heads / s.n_kv_heads) % kFixedHpb == 0) {
      return attn_split_kernel<kHd, true, kPrefill, Kv>;
    }
  }
  return attn_split_kernel<kHd, false, kPrefill, Kv>;
}

template <int kHd, class Kv>
cudaError_t launch_decode(const AttnShape& s, AttnArgs a, float* scratch, bool mma,
                          cudaStream_t stream) {
  const int n_sub = mma ? attn_detail::mma_decode_head_blocks(s) : head_blocks(s);
  const int n_splits = n_splits_for(s, n_sub), hpb = heads_per_block(s);
  a.part_o = scratch;
  a.part_ml = scratch + static_cast<size_t>(s.n_q_heads) * n_splits * kHd;
  cudaError_t err = cudaSuccess;
  if (mma) {
    err = attn_detail::launch_decode_mma(s, n_splits, a, stream);
  } else {
    const dim3 grid(static_cast<unsigned>(n_splits * n_sub), static_cast<unsigned>(s.n_kv_heads));
    const size_t smem = split_smem_bytes<kHd, Kv>(hpb);
    const auto kernel = split_kernel_for<kHd, false, Kv>(s, hpb);
    err = allow_smem(kernel, smem);
    if (err == cudaSuccess)
      err = pdl::launch(kernel, grid, kThreads, smem, stream, s, n_splits, hpb, a);
  }
  if (err != cudaSuccess) return err;
  return pdl::launch(attn_combine_kernel<false>, s.n_q_heads, kCombineThreads, 0, stream, s,
                     n_splits, a.q_proj, a.pos, a.part_o, a.part_ml, a.out, size_t{0}, size_t{0});
}

// Prefill: token t's k and v rows into the caches at pos[t] (one warp per token and KV head, the
// normed, rotated k exactly as attn_split_kernel makes it).
template <int kHd, class Kv>
__global__ void __launch_bounds__(32) attn_append_kernel(AttnShape s, AttnArgs a, size_t ld) {
  __shared__ float kn[kHd], cos_s[kHd / 2], sin_s[kHd / 2];
  const int t = blockIdx.x, kvh = blockIdx.y, lane = threadIdx.x, half = s.rot_dim / 2;
  const int pos = a.pos[t];
  if (pos < 0 || pos >= s.max_len) return;  // contract: 0 <= pos < max_len
  const float* rope = a.rope + static_cast<size_t>(pos) * s.rot_dim;
  for (int i = lane; i < half; i += 32) {
    cos_s[i] = rope[2 * i];
    sin_s[i] = rope[2 * i + 1];
  }
  __syncwarp();
  const size_t src = static_cast<size_t>(t) * ld + static_cast<size_t>(kvh) * kHd;
  attn_detail::norm_rope_warp<kHd>(a.k_proj + src, a.k_norm_w, s.eps, half, cos_s, sin_s, kn);
  const size_t row = (static_cast<size_t>(pos) * s.n_kv_heads + kvh) * kHd;
  for (int i = lane; i < kHd; i += 32) {
    reinterpret_cast<Kv*>(a.k_cache)[row + i] = attn_detail::kv_entry<Kv>(kn[i]);
    reinterpret_cast<Kv*>(a.v_cache)[row + i] = attn_detail::kv_entry<Kv>(a.v_proj[src + i]);
  }
}

template <int kHd, class Kv>
void append(const AttnShape& s, const AttnArgs& a, size_t ld, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(s.n_kv_heads));
  attn_append_kernel<kHd, Kv><<<grid, 32, 0, stream>>>(s, a, ld);
}

// Many tokens: the append, then the split kernel (or with `mma` the tensor-core kernel) over
// n_splits splits for every token at once (split_block; every row read from the cache) and the
// combine (grid.y: token), plain launches. Prefill takes one split a token on the
// split kernel; a verify (attn_decode_rows) attn_decode's splits and kernel.
template <int kHd, class Kv>
cudaError_t launch_tokens(const AttnShape& s, AttnArgs a, size_t ld, int n_splits, bool mma,
                          float* scratch, cudaStream_t stream) {
  const int n = a.n_tokens, hpb = heads_per_block(s), n_sub = head_blocks(s);
  append<kHd, Kv>(s, a, ld, stream);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  a.part_o = scratch;
  a.part_ml = scratch + static_cast<size_t>(n) * s.n_q_heads * n_splits * kHd;
  if (mma) {
    err = attn_detail::launch_decode_mma(s, n_splits, a, stream);
  } else {
    const dim3 grid(static_cast<unsigned>(n * n_splits * n_sub),
                    static_cast<unsigned>(s.n_kv_heads));
    const size_t smem = split_smem_bytes<kHd, Kv>(hpb);
    const auto kernel = split_kernel_for<kHd, true, Kv>(s, hpb);
    if ((err = allow_smem(kernel, smem)) != cudaSuccess) return err;
    kernel<<<grid, kThreads, smem, stream>>>(s, n_splits, hpb, a);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) return err;
  attn_combine_kernel<true>
      <<<dim3(static_cast<unsigned>(s.n_q_heads), static_cast<unsigned>(n)), kCombineThreads, 0,
         stream>>>(s, n_splits, a.q_proj, a.pos, a.part_o, a.part_ml, a.out, a.q_row, a.out_row);
  return cudaGetLastError();
}

bool shape_ok(const AttnShape& s) {
  return s.n_q_heads > 0 && s.n_kv_heads > 0 && s.n_q_heads % s.n_kv_heads == 0 && s.max_len > 0 &&
         (s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256) && s.rot_dim >= 0 &&
         s.rot_dim % 2 == 0 && s.rot_dim <= s.head_dim &&
         (s.kv == KvType::kF32 || s.kv == KvType::kBf16 || s.kv == KvType::kFp8);
}

// f(std::integral_constant<int, hd>, Kv()) for the shape's head_dim and cache entries (shapes
// shape_ok takes).
template <int kHd, class F>
cudaError_t dispatch_kv(const AttnShape& s, F&& f) {
  const std::integral_constant<int, kHd> hd;
  if (s.kv == KvType::kFp8) return f(hd, attn_detail::Fp8());
  return s.kv == KvType::kBf16 ? f(hd, attn_detail::Bf16()) : f(hd, 0.0f);
}
template <class F>
cudaError_t dispatch(const AttnShape& s, F&& f) {
  switch (s.head_dim) {
    case 64:
      return dispatch_kv<64>(s, f);
    case 128:
      return dispatch_kv<128>(s, f);
    default:
      return dispatch_kv<256>(s, f);
  }
}

}  // namespace

size_t attn_kv_bytes(const AttnShape& shape) {
  return shape.kv == KvType::kFp8    ? sizeof(attn_detail::Fp8)
         : shape.kv == KvType::kBf16 ? sizeof(attn_detail::Bf16)
                                     : sizeof(float);
}

size_t attn_rope_floats(const AttnShape& shape) {
  return shape_ok(shape) ? static_cast<size_t>(shape.max_len) * shape.rot_dim : 0;
}

cudaError_t attn_rope_table(const AttnShape& shape, float* table, cudaStream_t stream) {
  if (!shape_ok(shape)) return cudaErrorInvalidValue;
  if (shape.rot_dim == 0) return cudaSuccess;
  const int64_t n = static_cast<int64_t>(shape.max_len) * (shape.rot_dim / 2);
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 4096));
  attn_rope_kernel<<<blocks, 256, 0, stream>>>(shape, table);
  return cudaGetLastError();
}

size_t attn_scratch_floats(const AttnShape& shape) {
  if (!shape_ok(shape)) return 0;
  return static_cast<size_t>(shape.n_q_heads) * max_splits(shape) * (shape.head_dim + 2);
}

cudaError_t attn_decode(const AttnShape& shape, const float* q_proj, const float* k_proj,
                        const float* v_proj, const float* q_norm_w, const float* k_norm_w,
                        const float* rope, const int* pos, float* q, void* k_cache, void* v_cache,
                        float* out, float* scratch, cudaStream_t stream, AttnDecodePath path) {
  if (!shape_ok(shape)) return cudaErrorInvalidValue;
  const bool mma_ok = attn_detail::mma_decode_shape_ok(shape) && attn_detail::mma_decode_fits();
  if (path == AttnDecodePath::kMma && !mma_ok) return cudaErrorInvalidValue;
  const bool mma = path != AttnDecodePath::kSplit && mma_ok;
  AttnArgs a{q_proj, k_proj, v_proj, q_norm_w, k_norm_w, rope, pos, q};
  a.k_cache = static_cast<float*>(k_cache), a.v_cache = static_cast<float*>(v_cache), a.out = out;
  return dispatch(shape, [&](auto hd, auto kv) {
    return launch_decode<decltype(hd)::value, decltype(kv)>(shape, a, scratch, mma, stream);
  });
}

bool attn_prefill_ok(const AttnShape& shape, int n) {
  return shape_ok(shape) && n >= 0 && static_cast<long>(n) * head_blocks(shape) < 65536;
}

size_t attn_prefill_scratch_floats(const AttnShape& shape, int n) {
  if (!shape_ok(shape) || n < 0) return 0;
  const size_t scalar = static_cast<size_t>(n) * shape.n_q_heads * (shape.head_dim + 2);
  return attn_detail::mma_prefill_shape_ok(shape)
             ? std::max(scalar, attn_detail::mma_prefill_scratch_floats(shape))
             : scalar;
}

cudaError_t attn_prefill(const AttnShape& shape, const float* q_proj, const float* k_proj,
                         const float* v_proj, size_t ld, int n, const float* q_norm_w,
                         const float* k_norm_w, const float* rope, const int* pos, void* k_cache,
                         void* v_cache, float* out, size_t ld_out, float* scratch,
                         cudaStream_t stream, AttnPrefillPath path) {
  if (!attn_prefill_ok(shape, n)) return cudaErrorInvalidValue;
  using attn_detail::MmaShape;
  const bool mma_shape = attn_detail::mma_prefill_shape_ok(shape);
  const auto shape_of = [](AttnPrefillPath p) {
    return p == AttnPrefillPath::kMma ? MmaShape::kWide : MmaShape::kNarrow;
  };
  if (path == AttnPrefillPath::kAuto) {
    path = !mma_shape                                         ? AttnPrefillPath::kScalar
           : attn_detail::mma_prefill_fits(MmaShape::kWide)   ? AttnPrefillPath::kMma
           : attn_detail::mma_prefill_fits(MmaShape::kNarrow) ? AttnPrefillPath::kMmaNarrow
                                                              : AttnPrefillPath::kScalar;
  } else if (path != AttnPrefillPath::kScalar &&
             (!mma_shape || !attn_detail::mma_prefill_fits(shape_of(path)))) {
    return cudaErrorInvalidValue;  // asked for a path the shape or the device cannot take
  }
  if (n == 0) return cudaSuccess;
  AttnArgs a{q_proj, k_proj, v_proj, q_norm_w, k_norm_w, rope, pos, nullptr};
  a.k_cache = static_cast<float*>(k_cache), a.v_cache = static_cast<float*>(v_cache), a.out = out;
  a.n_tokens = n, a.q_row = ld, a.out_row = ld_out;
  return dispatch(shape, [&](auto hd, auto kv) {
    constexpr int kHd = decltype(hd)::value;
    using Kv = decltype(kv);
    if (path == AttnPrefillPath::kScalar)
      return launch_tokens<kHd, Kv>(shape, a, ld, 1, false, scratch, stream);
    append<kHd, Kv>(shape, a, ld, stream);  // kHd is 256 here (mma_prefill_shape_ok)
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    return attn_detail::launch_prefill_mma(shape_of(path), shape, q_proj, ld, n, q_norm_w, rope,
                                           pos, k_cache, v_cache, out, ld_out, scratch, stream);
  });
}

size_t attn_decode_rows_scratch_floats(const AttnShape& shape, int n) {
  return n > 0 ? static_cast<size_t>(n) * attn_scratch_floats(shape) : 0;
}

cudaError_t attn_decode_rows(const AttnShape& shape, const float* q_proj, const float* k_proj,
                             const float* v_proj, size_t ld, int n, const float* q_norm_w,
                             const float* k_norm_w, const float* rope, const int* pos,
                             void* k_cache, void* v_cache, float* out, size_t ld_out,
                             float* scratch, cudaStream_t stream, AttnDecodePath path) {
  if (!shape_ok(shape) || n < 1 || static_cast<long>(n) * head_blocks(shape) >= 65536) {
    return cudaErrorInvalidValue;
  }
  const bool mma_ok = attn_detail::mma_decode_shape_ok(shape) && attn_detail::mma_decode_fits();
  if (path == AttnDecodePath::kMma && !mma_ok) return cudaErrorInvalidValue;
  const bool mma = path != AttnDecodePath::kSplit && mma_ok;  // as attn_decode chooses
  AttnArgs a{q_proj, k_proj, v_proj, q_norm_w, k_norm_w, rope, pos, nullptr};
  a.k_cache = static_cast<float*>(k_cache), a.v_cache = static_cast<float*>(v_cache), a.out = out;
  a.n_tokens = n, a.q_row = ld, a.out_row = ld_out;
  const int n_splits =
      n_splits_for(shape, mma ? attn_detail::mma_decode_head_blocks(shape) : head_blocks(shape));
  return dispatch(shape, [&](auto hd, auto kv) {
    return launch_tokens<decltype(hd)::value, decltype(kv)>(shape, a, ld, n_splits, mma, scratch,
                                                            stream);
  });
}

}  // namespace qf::kern
