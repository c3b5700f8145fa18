// logits_topk (topk.h): one launch over a row of logits.
//
// Every warp takes chunks of 32 consecutive logits: their largest (as an ordered key, below) to
// the scratch, and a running (max, sum of exp) per lane for the normalizer. The last block to
// finish (atomic ticket, lm_head.cu's pattern) then selects, with every value it works on held
// in registers (each of its loads issued at once: a single block is latency-bound, and a loop of
// dependent L2 reads cost ~300 us in the first version):
//   1. t = the k-th largest chunk maximum (radix select, 8 bits a pass). At least k logits are
//      >= t (k chunks' maxima), so the top k are all >= t.
//   2. The hot chunks, in index order: every chunk whose maximum is > t (at most k - 1) and the
//      first k whose maximum equals t (each holds a logit equal to t, and the top k need at most
//      k of those). Every logit of the top k is in one of them.
//   3. T = the k-th largest logit of the hot chunks (radix select again): the top k are the
//      logits > T (fewer than k; sorted by key, bitonic) and then the logits equal to T in index
//      order (an ordered compaction of the hot chunks' logits).
// A key is the float's bits mapped to an unsigned order (larger float, larger key; -0 as +0);
// NaN and padding map to 0, below every other key, and are never taken.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "qf/kern/topk.h"

namespace qf::kern {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBlocks = 256;
constexpr int kChunkRegs = 32;  // chunk maxima per thread of the last block
static_assert(kTopKMaxN == kThreads * kChunkRegs * 32);
constexpr int kMaxHot = 2 * kTopKMax;
constexpr int kHotRegs = kMaxHot * 32 / kThreads;                   // hot logits per thread
constexpr size_t kHeadBytes = 16 + kMaxBlocks * 2 * sizeof(float);  // ticket, block partials

__device__ __forceinline__ uint32_t key_of(float x) {
  if (x != x) return 0u;
  const uint32_t u = x == 0.0f ? 0u : __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// (m, s) += (m2, s2): sums of exp(l - m), rescaled to the larger maximum.
__device__ __forceinline__ void combine(float& m, float& s, float m2, float s2) {
  if (m2 > m) {
    s = s * expf(m - m2) + s2;  // m = -inf: s is 0 and exp(-inf) is 0
    m = m2;
  } else if (m2 > -INFINITY) {
    s += s2 * expf(m2 - m);
  }
}

struct Shared {
  unsigned hist[256];
  uint32_t prefix, want;      // radix select: the key's bits so far, the rank left to find
  int warp_count[2][kWarps];  // block scans
  float wm[kWarps], ws[kWarps];
  int hot[kMaxHot];
  unsigned long long g[kTopKMax];  // the logits > T: (key << 32) | ~index
  int n_g;
  bool is_last;
};

// For two flags at once: the number of threads before this one whose flag f is set (rank[f])
// and of all threads (total[f]). Every thread of the block calls it.
__device__ void block_rank(const bool (&flag)[2], int (&rank)[2], int (&total)[2], Shared& sh) {
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  unsigned ballot[2];
  for (int f = 0; f < 2; ++f) {
    ballot[f] = __ballot_sync(0xFFFFFFFFu, flag[f]);
    if (lane == 0) sh.warp_count[f][warp] = __popc(ballot[f]);
  }
  __syncthreads();
  for (int f = 0; f < 2; ++f) {  // lane w scans the warps' counts: an inclusive sum to warp w
    int incl = lane < kWarps ? sh.warp_count[f][lane] : 0;
    for (int d = 1; d < kWarps; d <<= 1) {
      const int o = __shfl_up_sync(0xFFFFFFFFu, incl, d);
      if (lane >= d) incl += o;
    }
    const int before = __shfl_sync(0xFFFFFFFFu, incl, (warp + 31) & 31);  // warp - 1's sum
    rank[f] = (warp > 0 ? before : 0) + __popc(ballot[f] & ((1u << lane) - 1u));
    total[f] = __shfl_sync(0xFFFFFFFFu, incl, kWarps - 1);
  }
  __syncthreads();  // warp_count is rewritten by the next call
}

// The `rank`-th largest (1-based) of the R keys each thread holds: keys[j] is entry
// j kThreads + tid, of `count` (>= rank) entries. Every thread of the block calls it.
template <int R>
__device__ uint32_t radix_select(const uint32_t (&keys)[R], int count, uint32_t rank, Shared& sh) {
  uint32_t prefix = 0, mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = static_cast<int>(threadIdx.x); i < 256; i += kThreads) sh.hist[i] = 0;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (j * kThreads >= count) break;  // the same for the whole block
      // One atomic per digit a warp holds: near keys share their high digits, and same-address
      // shared atomics serialize.
      const bool take =
          j * kThreads + static_cast<int>(threadIdx.x) < count && (keys[j] & mask) == prefix;
      const unsigned active = __ballot_sync(0xFFFFFFFFu, take);
      if (take) {
        const uint32_t digit = (keys[j] >> shift) & 255u;
        const unsigned same = __match_any_sync(active, digit);
        if (__ffs(same) - 1 == static_cast<int>(threadIdx.x & 31)) {
          atomicAdd(&sh.hist[digit], static_cast<unsigned>(__popc(same)));
        }
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // lane l holds digits 255 - 8l down to 248 - 8l
      const int lane = static_cast<int>(threadIdx.x);
      unsigned mine = 0;
      for (int j = 0; j < 8; ++j) mine += sh.hist[255 - 8 * lane - j];
      unsigned incl = mine;  // sum over lanes 0 .. lane: the digits from the top
      for (int d = 1; d < 32; d <<= 1) {
        const unsigned o = __shfl_up_sync(0xFFFFFFFFu, incl, d);
        if (lane >= d) incl += o;
      }
      const unsigned hit = __ballot_sync(0xFFFFFFFFu, incl >= rank);
      if (lane == __ffs(hit) - 1) {  // hit is never empty: the keys counted hold `rank`
        unsigned above = incl - mine;
        int d = 255 - 8 * lane;
        while (above + sh.hist[d] < rank) above += sh.hist[d--];
        sh.prefix = prefix | (static_cast<uint32_t>(d) << shift);
        sh.want = rank - above;
      }
    }
    __syncthreads();
    prefix = sh.prefix;
    rank = sh.want;
    mask |= 255u << shift;
  }
  return prefix;
}

// Sorts buf[0, p) (p a power of two) descending.
__device__ void bitonic_desc(unsigned long long* buf, int p) {
  for (int size = 2; size <= p; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = static_cast<int>(threadIdx.x); i < p / 2; i += kThreads) {
        const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
        const bool desc = (lo & size) == 0;
        const unsigned long long a = buf[lo], b = buf[hi];
        if ((a < b) == desc) buf[lo] = b, buf[hi] = a;
      }
      __syncthreads();
    }
  }
}

// One row's work; kRows: row blockIdx.y, its logits ld floats apart, its outputs out_stride
// elements apart, its scratch scratch_stride bytes apart (logits_topk_rows), the outputs'
// offsets added where they are written. The one-row kernel takes its pointers as they come: the
// offsets' registers made ptxas spill on sm_121 (64 registers there), none before them.
template <bool kRows>
__device__ __forceinline__ void topk_row(const float* __restrict__ logits, int n, size_t ld,
                                         bool vec, int k, int* __restrict__ ids,
                                         float* __restrict__ vals, float* __restrict__ stats,
                                         size_t out_stride, unsigned char* scratch,
                                         size_t scratch_stride) {
  __shared__ Shared sh;
  if constexpr (kRows) logits += blockIdx.y * ld, scratch += blockIdx.y * scratch_stride;
  unsigned* ticket = reinterpret_cast<unsigned*>(scratch);
  float* partial = reinterpret_cast<float*>(scratch + 16);  // [block] (m, s)
  uint32_t* cmax = reinterpret_cast<uint32_t*>(scratch + kHeadBytes);
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int tid = static_cast<int>(threadIdx.x);
  const int chunks = (n + 31) / 32;

  // A warp takes four chunks at a time, a lane four consecutive logits (one 16-byte load where
  // they are whole and aligned): lanes 8c .. 8c + 7 hold chunk c of the four.
  float m = -INFINITY, s = 0.0f;
  for (int q = blockIdx.x * kWarps + warp; q < (chunks + 3) / 4; q += gridDim.x * kWarps) {
    const int i = q * 128 + lane * 4;
    float x[4];
    if (vec && i + 3 < n) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(logits + i));
      x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
    } else {
      for (int e = 0; e < 4; ++e)
        x[e] = i + e < n ? __ldg(logits + i + e) : __int_as_float(0x7FC00000);
    }
    uint32_t top = 0;
    for (int e = 0; e < 4; ++e) {
      top = max(top, key_of(x[e]));
      if (x[e] > -INFINITY) combine(m, s, x[e], 1.0f);
    }
    for (int d = 4; d > 0; d >>= 1) top = max(top, __shfl_xor_sync(0xFFFFFFFFu, top, d));
    const int c = 4 * q + lane / 8;
    if ((lane & 7) == 0 && c < chunks) cmax[c] = top;
  }
  for (int d = 16; d > 0; d >>= 1) {
    combine(m, s, __shfl_xor_sync(0xFFFFFFFFu, m, d), __shfl_xor_sync(0xFFFFFFFFu, s, d));
  }
  if (lane == 0) sh.wm[warp] = m, sh.ws[warp] = s;
  __syncthreads();
  if (warp == 0) {
    m = lane < kWarps ? sh.wm[lane] : -INFINITY, s = lane < kWarps ? sh.ws[lane] : 0.0f;
    for (int d = 16; d > 0; d >>= 1) {
      combine(m, s, __shfl_xor_sync(0xFFFFFFFFu, m, d), __shfl_xor_sync(0xFFFFFFFFu, s, d));
    }
    if (lane == 0) partial[2 * blockIdx.x] = m, partial[2 * blockIdx.x + 1] = s;
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) sh.is_last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!sh.is_last) return;
  __threadfence();

  // The last block. Its chunk maxima: chunk j * kThreads + tid in keys[j].
  uint32_t cm[kChunkRegs];
  unsigned cm_valid = 0;
#pragma unroll
  for (int j = 0; j < kChunkRegs; ++j) {
    const int c = j * kThreads + tid;
    cm[j] = c < chunks ? __ldcg(cmax + c) : 0u;
    cm_valid |= (c < chunks ? 1u : 0u) << j;
  }
  if (warp == 0) {  // the normalizer from the blocks' partials
    m = -INFINITY, s = 0.0f;
    for (int b = lane; b < static_cast<int>(gridDim.x); b += 32) {
      combine(m, s, __ldcg(partial + 2 * b), __ldcg(partial + 2 * b + 1));
    }
    for (int d = 16; d > 0; d >>= 1) {
      combine(m, s, __shfl_xor_sync(0xFFFFFFFFu, m, d), __shfl_xor_sync(0xFFFFFFFFu, s, d));
    }
    if (lane == 0) {
      float* st = stats + (kRows ? blockIdx.y * out_stride : 0);
      st[0] = m, st[1] = s;
      *ticket = 0;  // every block has taken its ticket: ready for the next launch
    }
  }

  // 1. t; with fewer than k chunks, 0 (every chunk holding a logit that is not NaN is hot).
  const uint32_t t = k <= chunks ? radix_select(cm, chunks, static_cast<uint32_t>(k), sh) : 0u;
  // 2. The hot chunks, in index order: chunk c's place is the number of chunks before it with a
  // maximum > t, plus those equal to t, up to k.
  int gt_before = 0, eq_before = 0;
#pragma unroll
  for (int j = 0; j < kChunkRegs; ++j) {
    if (j * kThreads >= chunks) break;  // the same for the whole block
    const bool real = (cm_valid >> j) & 1u;
    const bool flag[2] = {real && cm[j] > t, real && t != 0u && cm[j] == t};
    int rank[2], total[2];
    block_rank(flag, rank, total, sh);
    const int eq_rank = eq_before + rank[1];
    if (flag[0] || (flag[1] && eq_rank < k)) {
      sh.hot[gt_before + rank[0] + min(eq_rank, k)] = j * kThreads + tid;
    }
    gt_before += total[0], eq_before += total[1];
  }
  const int n_hot = gt_before + min(eq_before, k);
  __syncthreads();
  // 3. Their logits: hot logit e (chunk sh.hot[e / 32], lane e % 32) in keys[j], e = j kThreads
  // + tid, so that index order is e order.
  uint32_t hk[kHotRegs];
#pragma unroll
  for (int j = 0; j < kHotRegs; ++j) {
    const int e = j * kThreads + tid;
    const int i = e < 32 * n_hot ? sh.hot[e >> 5] * 32 + (e & 31) : n;
    hk[j] = i < n ? key_of(__ldg(logits + i)) : 0u;
  }
  // Fewer hot logits than k (a row shorter than k, or mostly NaN): all but NaN and padding.
  const uint32_t big_t =
      32 * n_hot >= k ? radix_select(hk, 32 * n_hot, static_cast<uint32_t>(k), sh) : 0u;
  if (tid == 0) sh.n_g = 0;
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kHotRegs; ++j) {
    if (hk[j] > big_t) {
      const int e = j * kThreads + tid, i = sh.hot[e >> 5] * 32 + (e & 31);
      sh.g[atomicAdd(&sh.n_g, 1)] =
          (static_cast<unsigned long long>(hk[j]) << 32) | static_cast<uint32_t>(~i);
    }
  }
  __syncthreads();
  const int n_g = sh.n_g;  // < k
  if constexpr (kRows) ids += blockIdx.y * out_stride, vals += blockIdx.y * out_stride;
  int p = 1;
  while (p < n_g) p <<= 1;
  for (int i = n_g + tid; i < p; i += kThreads) sh.g[i] = 0ull;
  __syncthreads();
  bitonic_desc(sh.g, p);
  for (int j = tid; j < n_g; j += kThreads) {
    ids[j] = static_cast<int>(~static_cast<uint32_t>(sh.g[j]));
    vals[j] = __ldg(logits + ids[j]);  // the logit's own bits (-0 stays -0)
  }
  // The logits equal to T, in index order (none when T is 0: NaN and padding are never taken).
  int filled = n_g;
  if (big_t != 0u) {
#pragma unroll
    for (int j = 0; j < kHotRegs; ++j) {
      if (filled >= k || j * kThreads >= 32 * n_hot) break;  // the same for the whole block
      const bool flag[2] = {hk[j] == big_t, false};
      int rank[2], total[2];
      block_rank(flag, rank, total, sh);
      const int at = filled + rank[0];
      if (flag[0] && at < k) {
        const int e = j * kThreads + tid, i = sh.hot[e >> 5] * 32 + (e & 31);
        ids[at] = i, vals[at] = __ldg(logits + i);
      }
      filled += total[0];
    }
  }
  for (int j = filled + tid; j < k; j += kThreads) ids[j] = INT_MAX, vals[j] = -INFINITY;
}

__global__ void __launch_bounds__(kThreads)
    topk_kernel(const float* __restrict__ logits, int n, bool vec, int k, int* __restrict__ ids,
                float* __restrict__ vals, float* __restrict__ stats, unsigned char* scratch) {
  topk_row<false>(logits, n, 0, vec, k, ids, vals, stats, 0, scratch, 0);
}

// Many rows (grid.y): one block per SM asked for, so that ptxas gives the rows' offsets their
// registers (without it, sm_121's 64 spilled 52 bytes).
__global__ void __launch_bounds__(kThreads, 1)
    topk_rows_kernel(const float* __restrict__ logits, int n, size_t ld, bool vec, int k,
                     int* __restrict__ ids, float* __restrict__ vals, float* __restrict__ stats,
                     size_t out_stride, unsigned char* scratch, size_t scratch_stride) {
  topk_row<true>(logits, n, ld, vec, k, ids, vals, stats, out_stride, scratch, scratch_stride);
}

__global__ void pick_kernel(const float* __restrict__ logits, int n, size_t ld,
                            const int* __restrict__ ids, int rows, float* __restrict__ out) {
  const int r = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (r >= rows) return;
  const int id = ids[r];
  out[r] =
      id >= 0 && id < n ? logits[static_cast<size_t>(r) * ld + id] : __int_as_float(0x7FC00000);
}

int chunk_count(int n) {
  return (n + 31) / 32;
}

}  // namespace

size_t logits_topk_scratch_bytes(int n) {
  return kHeadBytes + static_cast<size_t>(chunk_count(std::max(n, 1))) * sizeof(uint32_t);
}

size_t logits_topk_rows_scratch_bytes(int n, int rows) {
  return (logits_topk_scratch_bytes(n) + 15) / 16 * 16 * static_cast<size_t>(std::max(rows, 0));
}

cudaError_t logits_topk(const float* logits, int n, int k, int* ids, float* vals, float* stats,
                        void* scratch, cudaStream_t stream) {
  return logits_topk_rows(logits, n, static_cast<size_t>(n), 1, k, ids, vals, stats, 0, scratch,
                          stream);
}

cudaError_t logits_topk_rows(const float* logits, int n, size_t ld, int rows, int k, int* ids,
                             float* vals, float* stats, size_t out_stride, void* scratch,
                             cudaStream_t stream) {
  if (logits == nullptr || ids == nullptr || vals == nullptr || stats == nullptr ||
      scratch == nullptr || n < 1 || n > kTopKMaxN || k < 1 || k > kTopKMax || rows < 1 ||
      rows > 65535 || (rows > 1 && (ld < static_cast<size_t>(n) || out_stride < 2))) {
    return cudaErrorInvalidValue;
  }
  // Four chunks a warp: one block per SM at most (128 registers a thread), one wave at 248320.
  const int blocks =
      std::min(kMaxBlocks, std::max(1, (chunk_count(n) + 4 * kWarps - 1) / (4 * kWarps)));
  // Vector loads where every row is 16-byte aligned.
  const bool vec = reinterpret_cast<uintptr_t>(logits) % 16 == 0 && (rows == 1 || ld % 4 == 0);
  auto* sc = static_cast<unsigned char*>(scratch);
  if (rows == 1) {
    topk_kernel<<<blocks, kThreads, 0, stream>>>(logits, n, vec, k, ids, vals, stats, sc);
  } else {
    const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(rows));
    topk_rows_kernel<<<grid, kThreads, 0, stream>>>(logits, n, ld, vec, k, ids, vals, stats,
                                                    out_stride, sc,
                                                    logits_topk_rows_scratch_bytes(n, 1));
  }
  return cudaGetLastError();
}

cudaError_t logits_pick(const float* logits, int n, size_t ld, const int* ids, int rows, float* out,
                        cudaStream_t stream) {
  if (rows < 0 || n < 1 || ld < static_cast<size_t>(n) ||
      (rows > 0 && (logits == nullptr || ids == nullptr || out == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  pick_kernel<<<(rows + 127) / 128, 128, 0, stream>>>(logits, n, ld, ids, rows, out);
  return cudaGetLastError();
}

}  // namespace qf::kern
