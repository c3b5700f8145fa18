// Gated full attention decode for one token (qf/kern/attention.h, qwen35-architecture.md §3.4).
// Twin: attention_ref.cpp. Test: tests/kernels/attention_test.cpp.
//
// attn_prepare_kernel: one block per q head and per k head (the k blocks also copy v): the
// zero-centred RMSNorm, then partial NeoX RoPE, written to q or to cache row *pos. The rotary
// table is built in double and rounded once (inv_freq = 1 / (float)theta^(2i/rot), angle =
// (float)pos * inv_freq, cos/sin of that float angle): that is the correctly rounded value of
// the CPU engine's f32 powf/cosf/sinf, so q and k agree with it to an ulp at any position.
//
// Flash-decoding, two launches. attn_split_kernel, grid (n_splits, Nkv, head blocks): a block
// takes one KV head and up to 16 (hd 256) of its query heads over one chunk of the context, so
// each K/V row is read once for the whole GQA group. Rows go in tiles of 32: a warp computes the
// group's scores for 4 rows, a warp per head updates the online softmax (running max m, sum l),
// then thread `dim` accumulates p * v[dim] for its heads. Each split leaves m, l and the
// unnormalized output. attn_combine_kernel, one block per query head, rescales the splits to the
// global max, divides by the total sum and multiplies by sigmoid(gate). The chunk length is
// derived on the device from *pos with a fixed split count, so graphs replay at any position,
// every split count is the same for the same position (deterministic), and splits past the
// context exit at once.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "mixer_common.cuh"
#include "pdl.cuh"
#include "qf/kern/attention.h"

namespace qf::kern {
namespace {

constexpr int kPrepThreads = 128;
constexpr int kMaxHeadDim = 512;  // attn_prepare (shared-memory row)
constexpr int kTile = 32;         // context rows per online-softmax step (one per lane)
constexpr int kDecThreads = 256;
constexpr int kMaxSplits = 128;
constexpr int kMaxAcc = 16;  // query heads one thread accumulates (times kDecThreads / hd)
constexpr int kCombineThreads = 1024;  // a multiple of every supported hd

int n_splits_for(const AttnShape& s) {
  return std::min(kMaxSplits, (s.max_len + kTile - 1) / kTile);
}

// Rows per split for a context of t rows: a multiple of kTile, at least one tile.
__device__ __forceinline__ int split_chunk(int t, int n_splits) {
  const int c = max(1, (t + n_splits - 1) / n_splits);
  return (c + kTile - 1) / kTile * kTile;
}

// Context length for *pos, clamped to the cache so a bad position cannot fault.
__device__ __forceinline__ int context_len(const int* pos, int max_len) {
  return min(max(*pos + 1, 1), max_len);
}

__global__ void __launch_bounds__(kPrepThreads)
    attn_prepare_kernel(AttnShape s, const float* __restrict__ q_proj,
                        const float* __restrict__ k_proj, const float* __restrict__ v_proj,
                        const float* __restrict__ q_norm_w, const float* __restrict__ k_norm_w,
                        const int* __restrict__ pos_p, float* __restrict__ q,
                        float* __restrict__ k_cache, float* __restrict__ v_cache) {
  pdl::wait();
  __shared__ float x[kMaxHeadDim];
  __shared__ float cos_s[kMaxHeadDim / 2], sin_s[kMaxHeadDim / 2];
  __shared__ double red[32];
  const int pos = *pos_p;
  if (pos < 0 || pos >= s.max_len) return;  // contract: 0 <= *pos < max_len; write nothing
  const int hd = s.head_dim, half = s.rot_dim / 2, tid = threadIdx.x;
  const bool is_q = static_cast<int>(blockIdx.x) < s.n_q_heads;
  const int kvh = blockIdx.x - s.n_q_heads;
  const size_t row = (static_cast<size_t>(pos) * s.n_kv_heads + kvh) * hd;
  const float* src = is_q ? q_proj + static_cast<size_t>(blockIdx.x) * 2 * hd
                          : k_proj + static_cast<size_t>(kvh) * hd;
  const float* w = is_q ? q_norm_w : k_norm_w;
  float* dst = is_q ? q + static_cast<size_t>(blockIdx.x) * hd : k_cache + row;
  if (!is_q) {
    for (int i = tid; i < hd; i += blockDim.x) v_cache[row + i] = v_proj[kvh * hd + i];
  }
  for (int i = tid; i < half; i += blockDim.x) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(s.rot_dim);
    const float inv_freq =
        1.0f / static_cast<float>(pow(static_cast<double>(s.theta), static_cast<double>(exponent)));
    const float angle = static_cast<float>(pos) * inv_freq;
    cos_s[i] = static_cast<float>(cos(static_cast<double>(angle)));
    sin_s[i] = static_cast<float>(sin(static_cast<double>(angle)));
  }
  double ss = 0;
  for (int i = tid; i < hd; i += blockDim.x) {
    x[i] = src[i];
    ss += static_cast<double>(x[i]) * x[i];
  }
  const float inv =
      1.0f / sqrtf(static_cast<float>(mixer::block_sum(ss, red)) / static_cast<float>(hd) + s.eps);
  for (int i = tid; i < hd; i += blockDim.x) x[i] = x[i] * inv * (1.0f + w[i]);
  __syncthreads();
  // Rotate-half pairs (i, i + half); unfused products so the rounding is the CPU engine's.
  for (int i = tid; i < hd; i += blockDim.x) {
    float y = x[i];
    if (i < half) {
      y = __fsub_rn(__fmul_rn(x[i], cos_s[i]), __fmul_rn(x[i + half], sin_s[i]));
    } else if (i < 2 * half) {
      const int f = i - half;
      y = __fadd_rn(__fmul_rn(x[i], cos_s[f]), __fmul_rn(x[f], sin_s[f]));
    }
    dst[i] = y;
  }
}

template <int kVec>
__device__ __forceinline__ void load_vec(const float* p, float* out) {
  if constexpr (kVec == 4) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  } else if constexpr (kVec == 2) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    out[0] = v.x, out[1] = v.y;
  } else {
    out[0] = *p;
  }
}

// part_o: [Nq, n_splits, hd] unnormalized outputs; part_ml: [Nq, n_splits, 2] (max, sum).
template <int kHd>
__global__ void __launch_bounds__(kDecThreads)
    attn_split_kernel(AttnShape s, int n_splits, int heads_per_block, const float* __restrict__ q,
                      const float* __restrict__ k_cache, const float* __restrict__ v_cache,
                      const int* __restrict__ pos_p, float* __restrict__ part_o,
                      float* __restrict__ part_ml) {
  pdl::wait();
  constexpr int kE = kHd / 32;  // elements of a K row per lane
  constexpr int kVec = kE < 4 ? kE : 4;
  constexpr int kWarps = kDecThreads / 32, kRowsPerWarp = kTile / kWarps;
  constexpr int kSlices = kDecThreads / kHd;  // threads sharing one output dim
  static_assert(kE % kVec == 0 && kTile % kWarps == 0 && kDecThreads % kHd == 0);

  const int t_len = context_len(pos_p, s.max_len);
  const int chunk = split_chunk(t_len, n_splits), t0 = blockIdx.x * chunk;
  if (t0 >= t_len) return;
  const int t1 = min(t_len, t0 + chunk);
  const int group = s.n_q_heads / s.n_kv_heads, kvh = blockIdx.y;
  const int h_lo = kvh * group + blockIdx.z * heads_per_block;
  const int nh = min(heads_per_block, group - static_cast<int>(blockIdx.z) * heads_per_block);

  extern __shared__ __align__(16) float smem[];  // q [hpb, hd] | p [hpb, kTile] | m, l, corr [hpb]
  float* qs = smem;
  float* ps = qs + heads_per_block * kHd;
  float* m_s = ps + heads_per_block * kTile;
  float* l_s = m_s + heads_per_block;
  float* corr_s = l_s + heads_per_block;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int i = tid; i < nh * kHd; i += kDecThreads) qs[i] = q[static_cast<size_t>(h_lo) * kHd + i];
  for (int i = tid; i < nh; i += kDecThreads) {
    m_s[i] = -INFINITY;
    l_s[i] = 0.0f;
  }

  const int dim = tid % kHd, slice = tid / kHd;
  float acc[kMaxAcc];
#pragma unroll
  for (int u = 0; u < kMaxAcc; ++u) acc[u] = 0.0f;
  const size_t row_stride = static_cast<size_t>(s.n_kv_heads) * kHd;
  const float* kbase = k_cache + static_cast<size_t>(kvh) * kHd;
  const float* vbase = v_cache + static_cast<size_t>(kvh) * kHd;
  const float scale = 1.0f / sqrtf(static_cast<float>(kHd));
  __syncthreads();

  for (int tb = t0; tb < t1; tb += kTile) {
    const int nt = min(kTile, t1 - tb);
    // Scores: lane holds elements c * 32 * kVec + lane * kVec + v of its rows (coalesced rows,
    // conflict-free q reads from shared memory).
    float kr[kRowsPerWarp][kE];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp + kWarps * rr;
#pragma unroll
      for (int c = 0; c < kE / kVec; ++c) {
        if (r < nt) {
          load_vec<kVec>(kbase + (tb + r) * row_stride + c * 32 * kVec + lane * kVec,
                         &kr[rr][c * kVec]);
        } else {
#pragma unroll
          for (int v = 0; v < kVec; ++v) kr[rr][c * kVec + v] = 0.0f;
        }
      }
    }
    // V rows now too, so both DRAM round trips overlap the score and softmax work.
    float vr[kTile];
#pragma unroll
    for (int t = 0; t < kTile; ++t) vr[t] = t < nt ? vbase[(tb + t) * row_stride + dim] : 0.0f;
    for (int h = 0; h < nh; ++h) {
      const float* qh = qs + h * kHd;
      float part[kRowsPerWarp];
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) part[rr] = 0.0f;
#pragma unroll
      for (int c = 0; c < kE / kVec; ++c) {
        float qv[kVec];
        load_vec<kVec>(qh + c * 32 * kVec + lane * kVec, qv);
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
#pragma unroll
          for (int v = 0; v < kVec; ++v) part[rr] += qv[v] * kr[rr][c * kVec + v];
        }
      }
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        part[rr] = mixer::warp_sum(part[rr]);
        const int r = warp + kWarps * rr;
        if (lane == 0 && r < nt) ps[h * kTile + r] = part[rr] * scale;
      }
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
        float a = acc[u] * corr_s[h];
        const float* ph = ps + h * kTile;
#pragma unroll
        for (int t = 0; t < kTile; ++t) a += ph[t] * vr[t];
        acc[u] = a;
      }
    }
    __syncthreads();  // ps and corr_s are rewritten by the next tile
  }
#pragma unroll
  for (int u = 0; u < kMaxAcc; ++u) {
    const int h = slice + kSlices * u;
    if (h < nh)
      part_o[(static_cast<size_t>(h_lo + h) * n_splits + blockIdx.x) * kHd + dim] = acc[u];
  }
  for (int i = tid; i < nh; i += kDecThreads) {
    float* ml = part_ml + (static_cast<size_t>(h_lo + i) * n_splits + blockIdx.x) * 2;
    ml[0] = m_s[i];
    ml[1] = l_s[i];
  }
}

// One block per query head. Thread sp < n_active takes split sp for the global max and the
// total sum (fixed shuffle trees); thread (dim, grp) then sums splits grp, grp + n_grp, ... of
// output dim `dim` (many loads in flight), and group 0 adds the groups in index order.
__global__ void __launch_bounds__(kCombineThreads)
    attn_combine_kernel(AttnShape s, int n_splits, const float* __restrict__ q_proj,
                        const int* __restrict__ pos_p, const float* __restrict__ part_o,
                        const float* __restrict__ part_ml, float* __restrict__ out) {
  pdl::wait();
  __shared__ float weight[kMaxSplits];
  __shared__ float red[kCombineThreads];
  __shared__ float warp_stat[kCombineThreads / 32];
  __shared__ float m_all, l_all;
  const int t_len = context_len(pos_p, s.max_len);
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

bool shape_ok(const AttnShape& s) {
  return s.n_q_heads > 0 && s.n_kv_heads > 0 && s.n_q_heads % s.n_kv_heads == 0 && s.max_len > 0 &&
         s.head_dim > 0;
}

template <int kHd>
cudaError_t launch_decode(const AttnShape& s, const float* q, const float* q_proj,
                          const float* k_cache, const float* v_cache, const int* pos, float* out,
                          float* scratch, cudaStream_t stream) {
  const int n_splits = n_splits_for(s), group = s.n_q_heads / s.n_kv_heads;
  const int hpb = std::min(group, kMaxAcc * (kDecThreads / kHd));
  const int n_sub = (group + hpb - 1) / hpb;
  float* part_o = scratch;
  float* part_ml = scratch + static_cast<size_t>(s.n_q_heads) * n_splits * kHd;
  const dim3 grid(static_cast<unsigned>(n_splits), static_cast<unsigned>(s.n_kv_heads),
                  static_cast<unsigned>(n_sub));
  const size_t smem = static_cast<size_t>(hpb) * (kHd + kTile + 3) * sizeof(float);
  const cudaError_t err = pdl::launch(attn_split_kernel<kHd>, grid, kDecThreads, smem, stream, s,
                                      n_splits, hpb, q, k_cache, v_cache, pos, part_o, part_ml);
  if (err != cudaSuccess) return err;
  return pdl::launch(attn_combine_kernel, s.n_q_heads, kCombineThreads, 0, stream, s, n_splits,
                     q_proj, pos, part_o, part_ml, out);
}

}  // namespace

cudaError_t attn_prepare(const AttnShape& shape, const float* q_proj, const float* k_proj,
                         const float* v_proj, const float* q_norm_w, const float* k_norm_w,
                         const int* pos, float* q, float* k_cache, float* v_cache,
                         cudaStream_t stream) {
  if (!shape_ok(shape) || shape.head_dim > kMaxHeadDim || shape.rot_dim < 0 ||
      shape.rot_dim % 2 != 0 || shape.rot_dim > shape.head_dim) {
    return cudaErrorInvalidValue;
  }
  return pdl::launch(attn_prepare_kernel, shape.n_q_heads + shape.n_kv_heads, kPrepThreads, 0,
                     stream, shape, q_proj, k_proj, v_proj, q_norm_w, k_norm_w, pos, q, k_cache,
                     v_cache);
}

size_t attn_scratch_floats(const AttnShape& shape) {
  return static_cast<size_t>(shape.n_q_heads) * n_splits_for(shape) * (shape.head_dim + 2);
}

cudaError_t attn_decode(const AttnShape& shape, const float* q, const float* q_proj,
                        const float* k_cache, const float* v_cache, const int* pos, float* out,
                        float* scratch, cudaStream_t stream) {
  if (!shape_ok(shape)) return cudaErrorInvalidValue;
  switch (shape.head_dim) {
    case 64:
      return launch_decode<64>(shape, q, q_proj, k_cache, v_cache, pos, out, scratch, stream);
    case 128:
      return launch_decode<128>(shape, q, q_proj, k_cache, v_cache, pos, out, scratch, stream);
    case 256:
      return launch_decode<256>(shape, q, q_proj, k_cache, v_cache, pos, out, scratch, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace qf::kern
