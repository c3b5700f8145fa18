// lm_head: INT8 logits of 1..4 hidden vectors from one pass over the weights, with the per-row
// top-k (argmax at k = 1) fused in (qf/kern/lm_head.h). Twin: lm_head_ref.cpp; test:
// tests/kernels/lm_head_test.cpp.
//
// Shape of the work:
//   * a persistent grid of the resident blocks (8 warps) walks tiles of 8 * kR rows in
//     grid-stride order; x (n_rows vectors) is staged in shared memory once per block (padded:
//     conflict-free float4 reads, gemv.cu's x_pos);
//   * warp w of a tile owns kR consecutive rows; lane l streams 16-byte chunks l, l + 32, ... of
//     each (512 contiguous bytes of a row per load), kU chunks of each row per batch, the first
//     batch issued before pdl::wait();
//   * every weight is decoded once and used for all rows of x: (code - zero) * scale with
//     code - zero formed exactly as gemv's Fmt<kInt8> does (PRMT builds 2^23 + code, 2^23 + zero
//     likewise), then one fma per row of x; x read from shared memory once per kR rows;
//   * per tile, a transposed warp reduction (every sum through the same butterfly tree, so a
//     row's logit does not depend on where it sits), the logits written, and the sums offered to
//     the warp's running top-k lists (one per row of x, held by lanes 0..k-1: a ballot against
//     the k-th entry rejects nearly every candidate once the lists have filled).
//   Merge: each block merges its warps' lists in shared memory and writes them to scratch; the
//   last block to finish (atomic ticket, gdn.cu's pattern) merges every block's lists, writes
//   the ids and resets the ticket for the next launch. The lists are kept in a total order
//   (logit, then index), so the result depends neither on the order of insertion nor on the
//   order in which blocks finish.
// Rows whose K is not a whole number of 16-byte chunks (or groups that are no power of two
// chunks) take the same kernel with 4-byte words instead of chunks (Path::kWord): the same
// results at a fraction of the bandwidth.
//
// PDL (pdl.cuh): weight, scale and zero loads of the first batch go out before pdl::wait(); x,
// the scratch and the outputs are touched only after it (every thread waits, none returns
// before).
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "device_limits.h"
#include "gemv_common.cuh"
#include "pdl.cuh"
#include "qf/kern/lm_head.h"

namespace qf::kern {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxBlocks = 1024;
constexpr size_t kTicketBytes = 256;  // the ticket, then the per-block candidates

struct Cand {
  float v;
  int i;
};
constexpr size_t kScratchBytes =
    kTicketBytes + sizeof(Cand) * kMaxBlocks * kLmHeadMaxRows * kLmHeadMaxTopK;

// kRowGroup: 16-byte chunks, one scale group per row (the LM head). kShift: 16-byte chunks, the
// group of chunk v is v >> gshift. kWord: 4-byte words (4 columns), group of word v = 4v / group.
enum class Path { kRowGroup, kShift, kWord };

template <Path kPath>
struct Vec {
  using T = uint4;
  static constexpr int kCols = 16;
  static __device__ __forceinline__ uint4 load(const uint4* p) { return gemv_detail::ld_stream(p); }
  static __device__ __forceinline__ uint32_t word(const uint4& v, int q) {
    return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
  }
};
template <>
struct Vec<Path::kWord> {
  using T = uint32_t;
  static constexpr int kCols = 4;
  static __device__ __forceinline__ uint32_t load(const uint32_t* p) {
    uint32_t r;
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(r) : "l"(p));
    return r;
  }
  static __device__ __forceinline__ uint32_t word(uint32_t v, int) { return v; }
};

// x in shared memory: float4 l of a row at x_pos(l) (gemv_common.cuh: the padding that keeps a
// lane group's 8 chunks on 8 distinct 16-byte bank groups); rows x_row(k) float4s apart.
using gemv_detail::x_pos;
__host__ __device__ constexpr int x_row(int k) {
  return x_pos(k / 4) + 1;
}

// Total order of the candidates: a before b.
__device__ __forceinline__ bool before(float av, int ai, float bv, int bi) {
  return av > bv || (av == bv && ai < bi);
}

// A warp's top-k list: lane j < k holds the j-th entry (lv, li). Empty entries are (-inf,
// INT_MAX), after every real candidate (NaN: never inserted).
struct TopK {
  float lv = -INFINITY;
  int li = INT_MAX;

  // Inserts each lane's candidate (cv, ci) where `has`; all 32 lanes call it. The ballot against
  // the k-th entry rejects every candidate at once in the common case.
  __device__ __forceinline__ void offer(bool has, float cv, int ci, int k, int lane) {
    float kv = __shfl_sync(0xFFFFFFFFu, lv, k - 1);
    int ki = __shfl_sync(0xFFFFFFFFu, li, k - 1);
    unsigned m = __ballot_sync(0xFFFFFFFFu, has && before(cv, ci, kv, ki));
    while (m != 0) {
      const int src = __ffs(m) - 1;
      m &= m - 1;
      const float v = __shfl_sync(0xFFFFFFFFu, cv, src);
      const int i = __shfl_sync(0xFFFFFFFFu, ci, src);
      if (!before(v, i, kv, ki)) continue;  // the k-th entry moved up since the ballot
      const int pos = __popc(__ballot_sync(0xFFFFFFFFu, lane < k && before(lv, li, v, i)));
      const float uv = __shfl_up_sync(0xFFFFFFFFu, lv, 1);
      const int ui = __shfl_up_sync(0xFFFFFFFFu, li, 1);
      if (lane == pos) {
        lv = v;
        li = i;
      } else if (lane > pos) {
        lv = uv;
        li = ui;
      }
      kv = __shfl_sync(0xFFFFFFFFu, lv, k - 1);
      ki = __shfl_sync(0xFFFFFFFFu, li, k - 1);
    }
  }

  // offer() for many candidates at once (the merges): where more than two pass the k-th entry,
  // every lane ranks its candidate and its list entry in the union (candidates are distinct
  // rows) and the first k are placed through `buf` (k entries of warp-private shared memory),
  // instead of one insertion after the other.
  __device__ __forceinline__ void offer_bulk(bool has, float cv, int ci, int k, int lane,
                                             Cand* buf) {
    const float kv = __shfl_sync(0xFFFFFFFFu, lv, k - 1);
    const int ki = __shfl_sync(0xFFFFFFFFu, li, k - 1);
    const bool in = has && before(cv, ci, kv, ki);
    const unsigned m = __ballot_sync(0xFFFFFFFFu, in);
    if (__popc(m) <= 2) {
      offer(has, cv, ci, k, lane);
      return;
    }
    const bool mine = lane < k && li != INT_MAX;  // a real entry (rows are < INT_MAX)
    int rc = 0, rl = lane;  // ranks of this lane's candidate and of its list entry
#pragma unroll 8
    for (int j = 0; j < 32; ++j) {  // candidates passing the k-th entry (others rank after it)
      const float v = __shfl_sync(0xFFFFFFFFu, cv, j);
      const int i = __shfl_sync(0xFFFFFFFFu, ci, j);
      if ((m >> j) & 1u) {
        rc += before(v, i, cv, ci);
        rl += before(v, i, lv, li);
      }
    }
    for (int j = 0; j < k; ++j) {  // list entries (empty ones are never before a candidate)
      rc += before(__shfl_sync(0xFFFFFFFFu, lv, j), __shfl_sync(0xFFFFFFFFu, li, j), cv, ci);
    }
    const int total = min(k, __popc(m) + __popc(__ballot_sync(0xFFFFFFFFu, mine)));
    __syncwarp();
    if (in && rc < k) buf[rc] = {cv, ci};
    if (mine && rl < k) buf[rl] = {lv, li};
    __syncwarp();
    if (lane < total) {
      lv = buf[lane].v;
      li = buf[lane].i;
    }
    __syncwarp();
  }
};

struct Args {
  int top_k;
  int gshift;      // kShift: 2^gshift chunks per group
  uint32_t magic;  // 0x4B000000 (2^23) in a register: (u & 0xFF) | magic is one PRMT
};

__host__ __device__ constexpr int pow2_at_least(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// Offers `n` candidates read by `at(i)` (i < n, in any order) to `list`, all 32 lanes calling;
// loads kAhead rounds of 32 before offering them, so their latencies overlap.
template <class At>
__device__ __forceinline__ void offer_all(TopK& list, int n, int k, int lane, Cand* buf, At at) {
  constexpr int kAhead = 4;
  for (int i0 = 0; i0 < n; i0 += 32 * kAhead) {
    Cand cd[kAhead];
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      const int i = i0 + 32 * a + lane;
      cd[a] = i < n ? at(i) : Cand{-INFINITY, INT_MAX};
    }
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      list.offer_bulk(i0 + 32 * a + lane < n, cd[a].v, cd[a].i, k, lane, buf);
    }
  }
}

// kB rows of x; warp w of tile t owns rows (t * kWarps + w) * kR .. + kR - 1; lane l streams
// chunks l, l + 32, ... of each (512 contiguous bytes of a row per load), kU chunks of each row
// per batch; registers budgeted for kMinBlocks blocks per SM.
template <int kB, Path kPath, int kR, int kU, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    lm_head_kernel(const DeviceLinear w, const float* __restrict__ x, float* __restrict__ logits,
                   int* __restrict__ ids, float* __restrict__ top_logits, Cand* __restrict__ cands,
                   unsigned* __restrict__ ticket, const Args args) {
  using V = Vec<kPath>;
  using VT = typename V::T;
  constexpr int kSz = kPath == Path::kRowGroup ? 1 : kU;  // scale/zero loads per row per batch
  constexpr int kA = kB == 1 ? 2 : 1;  // accumulators per (row, row of x): ILP for one row of x
  constexpr int kVals = pow2_at_least(kR * kB);  // sums reduced per tile (padded)
  static_assert(kVals <= 32, "one sum per lane at most");
  extern __shared__ float4 xs[];  // kB rows of x, x_row(k) apart
  __shared__ Cand wlist[kWarps][kB][kLmHeadMaxTopK];
  __shared__ Cand mbuf[kWarps][kLmHeadMaxTopK];  // offer_bulk's, per warp
  __shared__ bool is_last;
  const int n = w.n, k = w.k, top_k = args.top_k;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_vec = k / V::kCols;  // chunks (words) per row
  const int n_batches = (n_vec + 32 * kU - 1) / (32 * kU);
  const int n_groups = (k + w.group - 1) / w.group;
  const VT* wbase = static_cast<const VT*>(w.w);
  auto first_row = [&](int tile) { return (tile * kWarps + warp) * kR; };

  // The tile being loaded and computed; its rows from lrow (clamped to n - 1: rows past n
  // re-read row n - 1 and their sums are dropped).
  int tile = blockIdx.x, lrow = first_row(tile);
  auto row_of = [&](int r) { return static_cast<uint32_t>(min(lrow + r, n - 1)); };
  VT wv[kU][kR];
  uint32_t sz[kSz][kR];  // scale f16 bits | zero << 16
  auto load = [&](VT(&dw)[kU][kR], uint32_t(&ds)[kSz][kR], int b) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int v = lane + 32 * (b * kU + u);
      if (v < n_vec) {
        uint32_t grp = 0;
        if constexpr (kPath == Path::kShift) grp = static_cast<uint32_t>(v >> args.gshift);
        if constexpr (kPath == Path::kWord) grp = static_cast<uint32_t>(4 * v / w.group);
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          dw[u][r] = V::load(wbase + (row_of(r) * static_cast<uint32_t>(n_vec) + v));
          if (kPath != Path::kRowGroup || u == 0) {
            const uint32_t i = row_of(r) * static_cast<uint32_t>(n_groups) + grp;
            ds[kPath == Path::kRowGroup ? 0 : u][r] =
                __half_as_ushort(__ldg(w.scales + i)) | static_cast<uint32_t>(__ldg(w.zeros + i))
                                                            << 16;
          }
        }
      }
    }
  };

  const bool active = lrow < n;  // warp-uniform: the warp has a first tile
  if (active) load(wv, sz, 0);
  pdl::wait();  // x is the previous kernel's output; before any return and any write

  const int xrow = x_row(k), n_x4 = k / 4;
  for (int b = 0; b < kB; ++b) {
    const float* xb = x + static_cast<size_t>(b) * k;
    if ((reinterpret_cast<uintptr_t>(x) & 15) == 0) {
      for (int l = threadIdx.x; l < n_x4; l += blockDim.x) {
        xs[b * xrow + x_pos(l)] = __ldg(reinterpret_cast<const float4*>(xb) + l);
      }
    } else {
      float* xf = reinterpret_cast<float*>(xs + b * xrow);
      for (int i = threadIdx.x; i < k; i += blockDim.x)
        xf[4 * x_pos(i / 4) + i % 4] = __ldg(xb + i);
    }
  }
  __syncthreads();

  TopK list[kB];
  if (active) {
    float acc[kR][kB][kA] = {};
    // Batch b of the current tile from (dw, ds): acc += decoded chunks * x.
    auto compute = [&](const VT(&dw)[kU][kR], const uint32_t(&ds)[kSz][kR], int b) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int v = lane + 32 * (b * kU + u);
        if (v >= n_vec) continue;
        float s[kR], fz[kR];
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          const uint32_t bits = ds[kPath == Path::kRowGroup ? 0 : u][r];
          s[r] = __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xFFFFu)));
          fz[r] = __uint_as_float(__byte_perm(bits, args.magic, 0x7442));  // 2^23 + zero
        }
        constexpr int kQ = V::kCols / 4;  // words per chunk
        const int x0 = kPath == Path::kWord ? x_pos(v) : x_pos(4 * v);
#pragma unroll
        for (int q = 0; q < kQ; ++q) {
          float wf[kR][4];  // the weights of word q of each row, decoded once for every row of x
#pragma unroll
          for (int r = 0; r < kR; ++r) {
            const uint32_t word = V::word(dw[u][r], q);
#pragma unroll
            for (int j = 0; j < 4; ++j) {  // byte j: (2^23 + code) - (2^23 + zero), exact
              wf[r][j] =
                  (__uint_as_float(__byte_perm(word, args.magic, 0x7440 | j)) - fz[r]) * s[r];
            }
          }
#pragma unroll
          for (int bb = 0; bb < kB; ++bb) {
            const float4 xq = xs[bb * xrow + x0 + q];
#pragma unroll
            for (int r = 0; r < kR; ++r) {
              acc[r][bb][0] = fmaf(wf[r][0], xq.x, acc[r][bb][0]);
              acc[r][bb][kA - 1] = fmaf(wf[r][1], xq.y, acc[r][bb][kA - 1]);
              acc[r][bb][0] = fmaf(wf[r][2], xq.z, acc[r][bb][0]);
              acc[r][bb][kA - 1] = fmaf(wf[r][3], xq.w, acc[r][bb][kA - 1]);
            }
          }
        }
      }
    };
    // The tile's sums: logits and the top-k lists; acc cleared.
    auto finish_tile = [&](int t) {
      float sums[kVals];
#pragma unroll
      for (int i = 0; i < kVals; ++i) {
        sums[i] = 0.0f;
        if (i < kR * kB) {
          const int r = i / kB, bb = i % kB;
          sums[i] = kA == 2 ? acc[r][bb][0] + acc[r][bb][kA - 1] : acc[r][bb][0];
        }
      }
#pragma unroll
      for (int r = 0; r < kR; ++r) {
#pragma unroll
        for (int bb = 0; bb < kB; ++bb) {
#pragma unroll
          for (int a = 0; a < kA; ++a) acc[r][bb][a] = 0.0f;
        }
      }
      const float sum = gemv_detail::reduce_rows<kVals>(sums, lane);
      const int vi = lane / (32 / kVals), row = first_row(t) + vi / kB, xb = vi % kB;
      const bool has = lane % (32 / kVals) == 0 && vi < kR * kB && row < n;
      if (logits != nullptr && has) logits[static_cast<size_t>(xb) * n + row] = sum;
#pragma unroll
      for (int bb = 0; bb < kB; ++bb) list[bb].offer(has && xb == bb, sum, row, top_k, lane);
    };
    // Load a batch, compute it (the first one was loaded before the wait). One batch of kR
    // rows x kU chunks in flight per warp, and the occupancy, carry the bandwidth: measured
    // faster than loading the next batch while computing one (fewer warps, registers).
    for (;;) {
      for (int b = 0; b < n_batches; ++b) {
        if (b > 0 || tile != static_cast<int>(blockIdx.x)) load(wv, sz, b);
        compute(wv, sz, b);
      }
      finish_tile(tile);
      tile += gridDim.x;
      lrow = first_row(tile);
      if (lrow >= n) break;
    }
  }

  // Block merge: the warps' lists through shared memory, warp b merging row b of x.
  auto merge_warps = [&] {  // warp b (< kB): the 8 warps' lists of row b in wlist
    TopK m;
    offer_all(m, kWarps * top_k, top_k, lane, mbuf[warp],
              [&](int i) { return wlist[i / top_k][warp][i % top_k]; });
    return m;
  };
#pragma unroll
  for (int bb = 0; bb < kB; ++bb) {
    if (lane < top_k) wlist[warp][bb][lane] = {list[bb].lv, list[bb].li};
  }
  __syncthreads();
  if (warp < kB) {
    const TopK m = merge_warps();
    if (lane < top_k) {
      cands[(static_cast<size_t>(blockIdx.x) * kLmHeadMaxRows + warp) * kLmHeadMaxTopK + lane] = {
          m.lv, m.li};
    }
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  if (threadIdx.x == 0) *ticket = 0;  // every block has taken its ticket: ready for the next launch
  // Last block: warp w merges blocks w, w + 8, ... for every row of x, then warp b merges the
  // 8 warps' lists of row b.
  const int per_warp = (static_cast<int>(gridDim.x) - warp + kWarps - 1) / kWarps;
#pragma unroll
  for (int bb = 0; bb < kB; ++bb) {
    TopK m;
    offer_all(m, per_warp * top_k, top_k, lane, mbuf[warp], [&](int i) {
      const size_t blk = static_cast<size_t>(warp) + static_cast<size_t>(i / top_k) * kWarps;
      const Cand* p = cands + (blk * kLmHeadMaxRows + bb) * kLmHeadMaxTopK + i % top_k;
      return Cand{__ldcg(&p->v), __ldcg(&p->i)};
    });
    if (lane < top_k) wlist[warp][bb][lane] = {m.lv, m.li};
  }
  __syncthreads();
  if (warp < kB) {
    const TopK m = merge_warps();
    if (lane < top_k) {
      ids[warp * top_k + lane] = m.li;
      if (top_logits != nullptr) top_logits[warp * top_k + lane] = m.lv;
    }
  }
}

// Launch shape per rows of x (kR rows per warp, kU chunks of each per batch, blocks per SM the
// registers are budgeted for), chosen on the H200 (bench/gemv_bench.cpp, 248320 x 3072): one row
// of x 4 x 3 at 2 blocks (16 warps, 192 bytes in flight per lane) beat 2 x 2 / 4 x 1 / 2 x 4 at
// 3-4 blocks; more rows of x: 4 x 2 at 2 blocks (x reused by 4 rows halves the shared-memory
// reads that bound 2-row shapes; 4 x 3 spills).
template <int kB>
struct Shape {
  static constexpr int kR = 4, kU = kB == 1 ? 3 : 2, kMinBlocks = 2;
};

size_t smem_bytes(int k, int n_rows) {
  return sizeof(float4) * static_cast<size_t>(x_row(k)) * n_rows;
}

Path path_of(const DeviceLinear& w) {
  const bool chunks = w.k % 16 == 0 && reinterpret_cast<uintptr_t>(w.w) % 16 == 0;
  if (chunks && w.group >= w.k) return Path::kRowGroup;
  const int gc = w.group / 16;
  if (chunks && w.group % 16 == 0 && (gc & (gc - 1)) == 0) return Path::kShift;
  return Path::kWord;
}

template <int kB, Path kPath>
cudaError_t launch_path(const DeviceLinear& w, const float* x, int top_k, float* logits, int* ids,
                        float* top_logits, void* scratch, cudaStream_t stream) {
  constexpr int kR = Shape<kB>::kR;
  auto* kernel = lm_head_kernel<kB, kPath, kR, Shape<kB>::kU, Shape<kB>::kMinBlocks>;
  const size_t smem = smem_bytes(w.k, kB);
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem));
  int device = 0, n_sm = 0, per_sm = 0;
  if (e == cudaSuccess) e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) {
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem);
  }
  if (e != cudaSuccess) return e;
  if (per_sm == 0) return cudaErrorNotSupported;
  const long tile_rows = static_cast<long>(kWarps) * kR;
  const long tiles = (w.n + tile_rows - 1) / tile_rows;
  const long grid = std::min({tiles, static_cast<long>(n_sm) * per_sm, long{kMaxBlocks}});
  Args args{top_k, 0, 0x4B000000u};
  if (kPath == Path::kShift) args.gshift = __builtin_ctz(static_cast<unsigned>(w.group / 16));
  auto* base = static_cast<char*>(scratch);
  return pdl::launch(kernel, dim3(static_cast<unsigned>(grid)), dim3(kThreads), smem, stream, w, x,
                     logits, ids, top_logits, reinterpret_cast<Cand*>(base + kTicketBytes),
                     reinterpret_cast<unsigned*>(base), args);
}

template <int kB>
cudaError_t launch_rows(const DeviceLinear& w, const float* x, int top_k, float* logits, int* ids,
                        float* top_logits, void* scratch, cudaStream_t stream) {
  switch (path_of(w)) {
    case Path::kRowGroup:
      return launch_path<kB, Path::kRowGroup>(w, x, top_k, logits, ids, top_logits, scratch,
                                              stream);
    case Path::kShift:
      return launch_path<kB, Path::kShift>(w, x, top_k, logits, ids, top_logits, scratch, stream);
    case Path::kWord:
      return launch_path<kB, Path::kWord>(w, x, top_k, logits, ids, top_logits, scratch, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

size_t lm_head_scratch_bytes() {
  return kScratchBytes;
}

bool lm_head_ok(const DeviceLinear& w, int n_rows) {
  if (w.kind != WeightKind::kInt8 || w.n <= 0 || w.k <= 0 || w.k % 4 != 0 || w.group <= 0) {
    return false;
  }
  if (w.group < w.k && w.group % 4 != 0) return false;  // a word in one group
  if (static_cast<uint64_t>(w.n) * (w.k / 4) >= (uint64_t{1} << 32)) return false;
  if (n_rows < 1 || n_rows > kLmHeadMaxRows) return false;
  constexpr size_t kStaticSmem = 4096;  // the kernel's own arrays (lists, merge buffers) fit
  return smem_bytes(w.k, n_rows) + kStaticSmem <= static_cast<size_t>(max_smem_optin());
}

cudaError_t lm_head(const DeviceLinear& w, const float* x, int n_rows, int top_k, float* logits,
                    int* ids, float* top_logits, void* scratch, cudaStream_t stream) {
  if (n_rows < 1 || n_rows > kLmHeadMaxRows || top_k < 1 || top_k > kLmHeadMaxTopK || top_k > w.n ||
      x == nullptr || ids == nullptr || scratch == nullptr || w.w == nullptr ||
      w.scales == nullptr || w.zeros == nullptr || reinterpret_cast<uintptr_t>(scratch) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  if (!lm_head_ok(w, n_rows)) return cudaErrorNotSupported;
  switch (n_rows) {
    case 1:
      return launch_rows<1>(w, x, top_k, logits, ids, top_logits, scratch, stream);
    case 2:
      return launch_rows<2>(w, x, top_k, logits, ids, top_logits, scratch, stream);
    case 3:
      return launch_rows<3>(w, x, top_k, logits, ids, top_logits, scratch, stream);
    default:
      return launch_rows<4>(w, x, top_k, logits, ids, top_logits, scratch, stream);
  }
}

}  // namespace qf::kern
