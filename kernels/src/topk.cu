// logits_topk (topk.h): one launch over a row of logits.
//
// Every warp takes chunks of 32 consecutive logits: their largest (as an ordered key, below) to
// the scratch, and a running (max, sum of exp) per lane for the normalizer. The last block to
// finish (atomic ticket, lm_head.cu's pattern) then selects:
//   1. t = the k-th largest chunk maximum (radix select over the chunk maxima, 8 bits a pass).
//      At least k logits are >= t (k chunks' maxima), so the top k are all >= t; and at most
//      k - 1 chunks have a maximum > t, so fewer than 32 k logits are > t.
//   2. G = the logits > t, gathered from those chunks into shared memory, sorted (bitonic) by
//      (key descending, index ascending).
//   3. If G holds k or more, its first k are the answer. Otherwise the rest are logits equal to
//      t, taken in index order by a scan of the chunks whose maximum is >= t.
// A key is the float's bits mapped to an unsigned order (larger float, larger key); NaN maps to
// 0, below every other key, and is never taken.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "qf/kern/topk.h"

namespace qf::kern {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBlocks = 256;
constexpr size_t kHeadBytes = 16 + kMaxBlocks * 2 * sizeof(float);  // ticket, block partials

__device__ __forceinline__ uint32_t key_of(float x) {
  if (x != x) return 0u;
  const uint32_t u = x == 0.0f ? 0u : __float_as_uint(x);  // -0 ties with +0
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
  uint32_t prefix, want;   // radix select: the key's bits so far, the rank left to find
  int count;               // entries gathered (step 2)
  int warp_count[kWarps];  // ties a warp found (step 3)
  float wm[kWarps], ws[kWarps];
  bool is_last;
};

// The `rank`-th largest (1-based) of keys[0, n) in the global scratch, by block `sh`.
__device__ uint32_t radix_select(const uint32_t* keys, int n, uint32_t rank, Shared& sh) {
  uint32_t prefix = 0, mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kThreads) sh.hist[i] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const uint32_t key = __ldcg(keys + i);
      if ((key & mask) == prefix) atomicAdd(&sh.hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // lane l holds digits 255 - 8l down to 248 - 8l
      const int lane = static_cast<int>(threadIdx.x);
      unsigned mine = 0;
      for (int j = 0; j < 8; ++j) mine += sh.hist[255 - 8 * lane - j];
      unsigned incl = mine;  // inclusive sum of lanes 0 .. lane (digits from the top)
      for (int d = 1; d < 32; d <<= 1) {
        const unsigned o = __shfl_up_sync(0xFFFFFFFFu, incl, d);
        if (lane >= d) incl += o;
      }
      const unsigned hit = __ballot_sync(0xFFFFFFFFu, incl >= rank);
      const int first = __ffs(hit) - 1;  // hit is never empty: the keys counted hold `rank`
      if (lane == first) {
        unsigned above = incl - mine;
        int d = 255 - 8 * lane;
        for (;; --d) {
          if (above + sh.hist[d] >= rank) break;
          above += sh.hist[d];
        }
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
      for (int i = threadIdx.x; i < p / 2; i += kThreads) {
        const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
        const bool desc = (lo & size) == 0;
        const unsigned long long a = buf[lo], b = buf[hi];
        if ((a < b) == desc) buf[lo] = b, buf[hi] = a;
      }
      __syncthreads();
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    topk_kernel(const float* __restrict__ logits, int n, int k, int* __restrict__ ids,
                float* __restrict__ vals, float* __restrict__ stats, unsigned char* scratch) {
  extern __shared__ unsigned long long buf[];  // G: (key << 32) | ~index
  __shared__ Shared sh;
  unsigned* ticket = reinterpret_cast<unsigned*>(scratch);
  float* partial = reinterpret_cast<float*>(scratch + 16);  // [block] (m, s)
  uint32_t* cmax = reinterpret_cast<uint32_t*>(scratch + kHeadBytes);
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int chunks = (n + 31) / 32;

  float m = -INFINITY, s = 0.0f;
  for (int c = blockIdx.x * kWarps + warp; c < chunks; c += gridDim.x * kWarps) {
    const int i = c * 32 + lane;
    const float x = i < n ? __ldg(logits + i) : __int_as_float(0x7FC00000);
    const uint32_t top = __reduce_max_sync(0xFFFFFFFFu, key_of(x));
    if (lane == 0) cmax[c] = top;
    if (x > -INFINITY) combine(m, s, x, 1.0f);
  }
  for (int d = 16; d > 0; d >>= 1) {
    combine(m, s, __shfl_xor_sync(0xFFFFFFFFu, m, d), __shfl_xor_sync(0xFFFFFFFFu, s, d));
  }
  if (lane == 0) sh.wm[warp] = m, sh.ws[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) combine(m, s, sh.wm[w], sh.ws[w]);
    partial[2 * blockIdx.x] = m, partial[2 * blockIdx.x + 1] = s;
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) sh.is_last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!sh.is_last) return;
  __threadfence();
  if (threadIdx.x == 0) {
    *ticket = 0;  // every block has taken its ticket: ready for the next launch
    float bm = -INFINITY, bs = 0.0f;
    for (unsigned b = 0; b < gridDim.x; ++b) {
      combine(bm, bs, __ldcg(partial + 2 * b), __ldcg(partial + 2 * b + 1));
    }
    stats[0] = bm, stats[1] = bs;
    sh.count = 0;
  }

  // 1. The k-th largest chunk maximum; with fewer than k chunks, 0 (every logit but NaN is > 0).
  const uint32_t t = k <= chunks ? radix_select(cmax, chunks, static_cast<uint32_t>(k), sh) : 0u;
  __syncthreads();
  // 2. G: the logits > t, each warp a chunk, gathered in warp-sized groups.
  for (int c = warp; c < chunks; c += kWarps) {
    if (__ldcg(cmax + c) <= t) continue;  // the same for the whole warp
    const int i = c * 32 + lane;
    const uint32_t key = i < n ? key_of(__ldg(logits + i)) : 0u;
    const unsigned take = __ballot_sync(0xFFFFFFFFu, key > t);
    int base = 0;
    if (lane == 0) base = atomicAdd(&sh.count, __popc(take));
    base = __shfl_sync(0xFFFFFFFFu, base, 0);
    if (key > t) {
      const int at = base + __popc(take & ((1u << lane) - 1u));
      buf[at] = (static_cast<unsigned long long>(key) << 32) | static_cast<uint32_t>(~i);
    }
  }
  __syncthreads();
  const int g = sh.count;
  int p = 1;
  while (p < g) p <<= 1;
  for (int i = g + static_cast<int>(threadIdx.x); i < p; i += kThreads) buf[i] = 0ull;
  __syncthreads();
  bitonic_desc(buf, p);
  for (int j = static_cast<int>(threadIdx.x); j < min(g, k); j += kThreads) {
    ids[j] = static_cast<int>(~static_cast<uint32_t>(buf[j]));
    vals[j] = __ldg(logits + ids[j]);  // the logit's own bits (-0 stays -0)
  }
  if (g >= k) return;
  // 3. The rest: logits equal to t in index order (none when t is 0: NaN is never taken).
  int filled = g;
  if (t != 0u) {
    for (int c0 = 0; c0 < chunks && filled < k; c0 += kWarps) {
      const int c = c0 + warp;
      bool eq = false;
      if (c < chunks && __ldcg(cmax + c) >= t) {
        const int i = c * 32 + lane;
        eq = i < n && key_of(__ldg(logits + i)) == t;
      }
      const unsigned take = __ballot_sync(0xFFFFFFFFu, eq);
      if (lane == 0) sh.warp_count[warp] = __popc(take);
      __syncthreads();
      int before = filled;
      for (int w = 0; w < warp; ++w) before += sh.warp_count[w];
      int total = filled;
      for (int w = 0; w < kWarps; ++w) total += sh.warp_count[w];
      const int at = before + __popc(take & ((1u << lane) - 1u));
      if (eq && at < k) ids[at] = c * 32 + lane, vals[at] = __ldg(logits + c * 32 + lane);
      filled = total;
      __syncthreads();  // warp_count is rewritten next round
    }
  }
  for (int j = max(filled, g) + static_cast<int>(threadIdx.x); j < k; j += kThreads) {
    ids[j] = INT_MAX, vals[j] = -INFINITY;
  }
}

int chunk_count(int n) {
  return (n + 31) / 32;
}

int buffer_entries(int k) {
  int p = 1;
  while (p < 32 * k) p <<= 1;
  return p;
}

}  // namespace

size_t logits_topk_scratch_bytes(int n) {
  return kHeadBytes + static_cast<size_t>(chunk_count(n > 0 ? n : 1)) * sizeof(uint32_t);
}

cudaError_t logits_topk(const float* logits, int n, int k, int* ids, float* vals, float* stats,
                        void* scratch, cudaStream_t stream) {
  if (logits == nullptr || ids == nullptr || vals == nullptr || stats == nullptr ||
      scratch == nullptr || n < 1 || k < 1 || k > kTopKMax) {
    return cudaErrorInvalidValue;
  }
  const int chunks = chunk_count(n);
  // Fewer than 32 k logits are > t (with fewer than k chunks, at most n), sorted in the next
  // power of two.
  const size_t smem = static_cast<size_t>(buffer_entries(k)) * sizeof(unsigned long long);
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(
        topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  const int blocks = std::min(kMaxBlocks, std::max(1, (chunks + 4 * kWarps - 1) / (4 * kWarps)));
  topk_kernel<<<blocks, kThreads, smem, stream>>>(logits, n, k, ids, vals, stats,
                                                  static_cast<unsigned char*>(scratch));
  return cudaGetLastError();
}

}  // namespace qf::kern
