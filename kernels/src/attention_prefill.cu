// attn_prefill's attention on the tensor cores (flash attention over the KV caches), for head_dim
// 256: mma.sync.m16n8k16 f16 x f16 -> f32, Ampere's warp MMA, so sm_90 and sm_121 alike.
//
// Why: the scalar prefill (attention.cu) gives each token's block the whole prefix to read and
// multiply on the CUDA cores, so at 4096 tokens attention took 18.6% of a 122B-A10B pass (H100,
// 184.6 ms of 992.7) and grew with the square of the prompt. Here a block takes 128 (token, query
// head) rows of one KV head, so every K and V row it stages serves them all, and the products run
// on the tensor cores.
//
// Numerics (f32-grade, as the scalar path; attention_test holds both to the same bound):
//   * q (normed and rotated exactly as attn_decode does: attention_common.cuh), k and v are each
//     split into two f16 limbs, hi = f16(x), lo = f16(x - hi): hi + lo holds x to 2^-22 of |x|
//     (or 2^-25 absolute where lo is subnormal). Scores are q_hi k_hi + q_hi k_lo + q_lo k_hi
//     with f32 sums (the lo x lo term is below 2^-22 of the product), times 1/sqrt(hd) in f32.
//   * The online softmax in f32 (expf, running max and sum per row, as the scalar kernel); p
//     (<= 1) is scaled by 2^15 before its split, so that its lo limb stays a normal f16 for p >
//     2^-18, and the output is divided by 2^15 and the row's sum at the end.
//   * |k| and |v| entries must stay below 65504 (f16's largest finite): larger ones give inf or
//     NaN outputs. q and k are RMS-normed (|entry| <= sqrt(hd) max |1 + w|).
//
// Work: kv_limbs_kernel writes rows 0 .. pos[n - 1] of both caches as limb pairs (scratch, per
// (row, KV head) [hi: hd | lo: hd] halves), so that the attention kernel stages them by cp.async
// into 16-byte chunks, XOR-swizzled by row (conflict-free ldmatrix). The attention kernel's block
// takes kM rows of the flattened (token, query head of the KV head's group) list, the blocks with
// the longest prefixes first; each warp 16 of them, their q limbs in shared memory, their output
// (16 x hd f32) in registers. K and V tiles of kKeys rows go through kStages buffers.
#include <cuda_fp16.h>
#include <cstdint>

#include "attention_common.cuh"
#include "attention_prefill.h"
#include "cp_async.cuh"
#include "device_limits.h"
#include "mma_f16.cuh"

namespace qf::kern::attn_detail {
namespace {

using gemv_detail::cp_async16;
using gemv_detail::cp_async_commit;
using gemv_detail::cp_async_wait;
using gemv_detail::ldsm_x4;
using gemv_detail::ldsm_x4_trans;
using gemv_detail::mma_f16;
using gemv_detail::smem_addr;

constexpr int kHd = 256;
constexpr int kChunks = kHd / 8;  // 16-byte chunks of one limb of a row
constexpr float kPScale = 32768.0f;

// f16 limb pairs of (a, b): hi = f16(x), lo = f16(x - hi), a in the low half of each word.
__device__ __forceinline__ void split2(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(a, b);
  const float2 hf = __half22float2(h);
  const __half2 l = __floats2half2_rn(a - hf.x, b - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

// The limb pairs of 8 floats (x0, x1), hi and lo each 8 f16s.
__device__ __forceinline__ void split8(const float4& x0, const float4& x1, uint4& hi, uint4& lo) {
  split2(x0.x, x0.y, hi.x, lo.x);
  split2(x0.z, x0.w, hi.y, lo.y);
  split2(x1.x, x1.y, hi.z, lo.z);
  split2(x1.z, x1.w, hi.w, lo.w);
}

// d += a b to f32-grade from limbs: a_hi b_hi + a_hi b_lo + a_lo b_hi (a_lo b_lo is below 2^-22
// of the product); b_hi, b_lo each the B fragment's two registers.
__device__ __forceinline__ void mma_limbs(float (&d)[4], const uint32_t (&a_hi)[4],
                                          const uint32_t (&a_lo)[4], uint32_t bh0, uint32_t bh1,
                                          uint32_t bl0, uint32_t bl1) {
  mma_f16(d, a_hi, bh0, bh1);
  mma_f16(d, a_hi, bl0, bl1);
  mma_f16(d, a_lo, bh0, bh1);
}

// Rows 0 .. pos[n - 1] of both caches ([max_len, n_kv, hd] of Kv: float, Bf16 or Fp8) as limb
// pairs (an Fp8 entry's lo limb is 0: every e4m3 value is an f16 value).
template <class Kv>
__global__ void __launch_bounds__(256)
    kv_limbs_kernel(const Kv* __restrict__ k_cache, const Kv* __restrict__ v_cache,
                    const int* __restrict__ pos_last, int n_kv, int max_len,
                    uint4* __restrict__ k_limbs, uint4* __restrict__ v_limbs) {
  const int rows = min(max(*pos_last + 1, 0), max_len);
  const size_t per_cache = static_cast<size_t>(rows) * n_kv * kChunks;  // 8-float groups
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < 2 * per_cache;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const bool is_v = i >= per_cache;
    const size_t j = is_v ? i - per_cache : i;
    const Kv* src = (is_v ? v_cache : k_cache) + 8 * j;
    uint4 hi, lo;
    split8(kv_load4<true>(src), kv_load4<true>(src + 4), hi, lo);
    uint4* dst = (is_v ? v_limbs : k_limbs) + j / kChunks * 2 * kChunks + j % kChunks;
    dst[0] = hi;
    dst[kChunks] = lo;
  }
}

struct PrefillArgs {
  const float *q_proj, *q_norm_w, *rope;  // q_proj row t at t * q_row
  const int* pos;                         // [n] consecutive positions
  const uint4 *k_limbs, *v_limbs;         // kv_limbs_kernel's
  float* out;                             // row t at t * out_row
  size_t q_row, out_row;
  int n;
};

template <int kWarps_, int kKeys_, int kStages_>
struct Layout {
  static constexpr int kWarps = kWarps_, kKeys = kKeys_, kStages = kStages_;
  static constexpr int kM = 16 * kWarps;                // query rows a block
  static constexpr int kQChunks = 2 * kM * kChunks;     // q limbs: [limb][row][chunk]
  static constexpr int kTileChunks = kKeys * kChunks;   // one limb of a K or V tile
  static constexpr int kStageChunks = 4 * kTileChunks;  // [K hi, K lo, V hi, V lo]
  static constexpr size_t kBytes = 16 * (kQChunks + static_cast<size_t>(kStages) * kStageChunks);
  static_assert(kStages >= 2 && kKeys % 16 == 0);
  // The q prep's per-warp staging (hd floats, then cos and sin) lies in the last stage's
  // buffer, which no copy fills before the first tile's barrier.
  static_assert(kWarps * 2 * kHd * 4 <= kStageChunks * 16);
};

template <class L>
__global__ void __launch_bounds__(L::kWarps * 32, 1)
    attn_prefill_mma_kernel(AttnShape s, PrefillArgs a) {
  constexpr int kWarps = L::kWarps, kKeys = L::kKeys, kStages = L::kStages;
  constexpr int kM = L::kM, kThreads = kWarps * 32;
  extern __shared__ __align__(128) uint4 smem[];
  uint4* qs = smem;
  uint4* stages = smem + L::kQChunks;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  const int n_kv = s.n_kv_heads, group = s.n_q_heads / n_kv, kvh = blockIdx.y;
  const int n_rows = a.n * group;
  const int r0 = (static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)) * kM;
  const int t_last = min(a.n - 1, (r0 + kM - 1) / group);
  const int pos_max = min(a.pos[t_last], s.max_len - 1);
  if (pos_max < 0) return;  // contract: 0 <= pos < max_len
  const int n_tiles = pos_max / kKeys + 1;

  // Tile `tile`'s K and V limbs into buffer `buf`; rows past pos_max as zeros (their p is 0, and
  // 0 x a stale row's NaN would not be).
  const auto fill = [&](int tile, int buf) {
    if (tile < n_tiles) {
      uint4* dst = stages + buf * L::kStageChunks;
      for (int i = tid; i < 2 * kKeys * 2 * kChunks; i += kThreads) {
        const int is_v = i / (kKeys * 2 * kChunks), rem = i - is_v * kKeys * 2 * kChunks;
        const int key = rem / (2 * kChunks), c = rem % (2 * kChunks);
        const int limb = c / kChunks, ch = c % kChunks, row = tile * kKeys + key;
        const uint4* src = (is_v ? a.v_limbs : a.k_limbs) +
                           (static_cast<size_t>(min(row, pos_max)) * n_kv + kvh) * 2 * kChunks + c;
        cp_async16(dst + (2 * is_v + limb) * L::kTileChunks + key * kChunks + (ch ^ (key & 7)), src,
                   row <= pos_max ? 16 : 0);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) fill(st, st);

  // q limbs: each warp norms and rotates its 16 rows (a row past the tokens stays zero).
  {
    float* xf = reinterpret_cast<float*>(stages + (kStages - 1) * L::kStageChunks) + warp * 2 * kHd;
    float *cos_s = xf + kHd, *sin_s = cos_s + kHd / 2;
    const int half = s.rot_dim / 2;
    for (int i = 0; i < 16; ++i) {
      const int r = warp * 16 + i, row = r0 + r;
      uint4 hi = make_uint4(0, 0, 0, 0), lo = hi;
      if (row < n_rows) {
        const int tok = row / group, h = kvh * group + row % group;
        const int p = min(max(a.pos[tok], 0), s.max_len - 1);
        const float* rope = a.rope + static_cast<size_t>(p) * s.rot_dim;
        for (int j = lane; j < half; j += 32) {
          cos_s[j] = rope[2 * j];
          sin_s[j] = rope[2 * j + 1];
        }
        __syncwarp();
        norm_rope_warp<kHd>(a.q_proj + tok * a.q_row + static_cast<size_t>(h) * 2 * kHd, a.q_norm_w,
                            s.eps, half, cos_s, sin_s, xf);
        const float4 x0 = reinterpret_cast<const float4*>(xf)[2 * lane];
        const float4 x1 = reinterpret_cast<const float4*>(xf)[2 * lane + 1];
        split8(x0, x1, hi, lo);
        __syncwarp();  // xf, cos_s and sin_s are rewritten for the next row
      }
      qs[r * kChunks + (lane ^ (r & 7))] = hi;
      qs[kM * kChunks + r * kChunks + (lane ^ (r & 7))] = lo;
    }
  }

  // This lane's rows: g and g + 8 of the warp's 16; a key is masked past its row's position.
  const int ra = r0 + warp * 16 + g, rb = ra + 8;
  const int lim_a = ra < n_rows ? min(a.pos[ra / group], pos_max) : 0;
  const int lim_b = rb < n_rows ? min(a.pos[rb / group], pos_max) : 0;
  const float scale = 1.0f / sqrtf(static_cast<float>(kHd));
  float o[kHd / 8][4];
#pragma unroll
  for (int d = 0; d < kHd / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;  // l: this lane's columns

  // ldmatrix addresses (bytes in shared memory) for this lane: q rows (A, row-major), K rows (B:
  // keys as columns) and V rows (B through .trans: keys as k), each before the tile's offset.
  const int q_row = warp * 16 + (lane & 15);
  const uint32_t q_base = smem_addr(qs + q_row * kChunks);
  const int k_key = (lane & 7) + ((lane >> 4) << 3), k_half = (lane >> 3) & 1;
  const int v_key = lane & 15, v_half = lane >> 4;

#pragma unroll 1
  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile landed; every warp is done with the buffer refilled next
    fill(tile + kStages - 1, (tile + kStages - 1) % kStages);
    const uint4* ks = stages + (tile % kStages) * L::kStageChunks;
    const uint32_t k_hi = smem_addr(ks + k_key * kChunks);
    const uint32_t v_hi = smem_addr(ks + 2 * L::kTileChunks + v_key * kChunks);
    constexpr uint32_t kLimb = L::kTileChunks * 16;  // hi -> lo, bytes

    float sc[kKeys / 8][4];
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kHd / 16; ++kk) {
      uint32_t qh[4], ql[4];
      const int qc = (2 * kk + (lane >> 4)) ^ (q_row & 7);
      ldsm_x4(qh, q_base + qc * 16);
      ldsm_x4(ql, q_base + kM * kChunks * 16 + qc * 16);
#pragma unroll
      for (int np = 0; np < kKeys / 16; ++np) {
        const int key = np * 16 + k_key, kc = (2 * kk + k_half) ^ (key & 7);
        const uint32_t addr = k_hi + np * 16 * kChunks * 16 + kc * 16;
        uint32_t bh[4], bl[4];
        ldsm_x4(bh, addr);
        ldsm_x4(bl, addr + kLimb);
        mma_limbs(sc[2 * np], qh, ql, bh[0], bh[1], bl[0], bl[1]);
        mma_limbs(sc[2 * np + 1], qh, ql, bh[2], bh[3], bl[2], bl[3]);
      }
    }

    // Online softmax: rows g (entries 0, 1) and g + 8 (2, 3); the row max over the quad.
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
      const int key = tile * kKeys + nt * 8 + 2 * tq;
      sc[nt][0] = key <= lim_a ? sc[nt][0] * scale : -INFINITY;
      sc[nt][1] = key + 1 <= lim_a ? sc[nt][1] * scale : -INFINITY;
      sc[nt][2] = key <= lim_b ? sc[nt][2] * scale : -INFINITY;
      sc[nt][3] = key + 1 <= lim_b ? sc[nt][3] * scale : -INFINITY;
      mx_a = fmaxf(mx_a, fmaxf(sc[nt][0], sc[nt][1]));
      mx_b = fmaxf(mx_b, fmaxf(sc[nt][2], sc[nt][3]));
    }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
    }
    // Key 0 is in every row's range, so after the first tile both maxima are finite.
    const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
    const float corr_a = expf(m_a - mn_a), corr_b = expf(m_b - mn_b);
    m_a = mn_a;
    m_b = mn_b;
    l_a *= corr_a;
    l_b *= corr_b;
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
      sc[nt][0] = expf(sc[nt][0] - mn_a);
      sc[nt][1] = expf(sc[nt][1] - mn_a);
      sc[nt][2] = expf(sc[nt][2] - mn_b);
      sc[nt][3] = expf(sc[nt][3] - mn_b);
      l_a += sc[nt][0] + sc[nt][1];
      l_b += sc[nt][2] + sc[nt][3];
    }
#pragma unroll
    for (int d = 0; d < kHd / 8; ++d) {
      o[d][0] *= corr_a;
      o[d][1] *= corr_a;
      o[d][2] *= corr_b;
      o[d][3] *= corr_b;
    }

    // o += p v: p's accumulator layout is the A fragment's (two 8-key tiles per 16 keys).
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t ph[4], pl[4];
      split2(sc[2 * kk][0] * kPScale, sc[2 * kk][1] * kPScale, ph[0], pl[0]);
      split2(sc[2 * kk][2] * kPScale, sc[2 * kk][3] * kPScale, ph[1], pl[1]);
      split2(sc[2 * kk + 1][0] * kPScale, sc[2 * kk + 1][1] * kPScale, ph[2], pl[2]);
      split2(sc[2 * kk + 1][2] * kPScale, sc[2 * kk + 1][3] * kPScale, ph[3], pl[3]);
      const int key = kk * 16 + v_key;
      const uint32_t row_addr = v_hi + kk * 16 * kChunks * 16;
#pragma unroll
      for (int dp = 0; dp < kHd / 16; ++dp) {
        const uint32_t addr = row_addr + (((2 * dp + v_half) ^ (key & 7)) * 16);
        uint32_t vh[4], vl[4];
        ldsm_x4_trans(vh, addr);
        ldsm_x4_trans(vl, addr + kLimb);
        mma_limbs(o[2 * dp], ph, pl, vh[0], vh[1], vl[0], vl[1]);
        mma_limbs(o[2 * dp + 1], ph, pl, vh[2], vh[3], vl[2], vl[3]);
      }
    }
  }
  cp_async_wait<0>();

  // Row sums over the quad, then out = o / (2^15 l) * sigmoid(gate).
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, off);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, off);
  }
#pragma unroll
  for (int half_row = 0; half_row < 2; ++half_row) {
    const int row = half_row ? rb : ra;
    if (row >= n_rows) continue;
    const int tok = row / group, h = kvh * group + row % group;
    const float l = half_row ? l_b : l_a;
    const float* gate = a.q_proj + tok * a.q_row + static_cast<size_t>(h) * 2 * kHd + kHd;
    float* dst = a.out + tok * a.out_row + static_cast<size_t>(h) * kHd;
#pragma unroll
    for (int d = 0; d < kHd / 8; ++d) {
      const int col = d * 8 + 2 * tq;
      dst[col] = o[d][2 * half_row] * (1.0f / kPScale) / l * mixer::sigmoid(gate[col]);
      dst[col + 1] = o[d][2 * half_row + 1] * (1.0f / kPScale) / l * mixer::sigmoid(gate[col + 1]);
    }
  }
}

template <class L>
cudaError_t launch(const AttnShape& s, const PrefillArgs& a, cudaStream_t stream) {
  auto* kernel = attn_prefill_mma_kernel<L>;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(L::kBytes));
  if (e != cudaSuccess) return e;
  const int n_rows = a.n * (s.n_q_heads / s.n_kv_heads);
  const dim3 grid(static_cast<unsigned>((n_rows + L::kM - 1) / L::kM),
                  static_cast<unsigned>(s.n_kv_heads));
  kernel<<<grid, L::kWarps * 32, L::kBytes, stream>>>(s, a);
  return cudaGetLastError();
}

// The wide shape: 8 warps (128 rows) and 16-key tiles in two stages, 192 KB. qforge-bench-mixers
// (H100, 122B, one layer, 1024 tokens deep into a cache of 32768 rows): 4 warps with 32-key tiles
// 14.83 ms, 4 warps with 16 keys in two or three stages 17.1-17.2, 8 warps with 16 keys in two
// stages 12.41-12.47, in three (224 KB) 12.17-12.18; two stages leave room on GPUs with less
// shared memory.
using Wide = Layout<8, 16, 2>;
using Narrow = Layout<2, 16, 2>;

}  // namespace

bool mma_prefill_shape_ok(const AttnShape& shape) {
  return shape.head_dim == kHd;
}

bool mma_prefill_fits(MmaShape m) {
  const size_t need = m == MmaShape::kWide ? Wide::kBytes : Narrow::kBytes;
  return static_cast<size_t>(max_smem_optin()) >= need;
}

size_t mma_prefill_scratch_floats(const AttnShape& shape) {
  // Two caches, each max_len x n_kv x hd entries as two halves (one float's bytes).
  return 2 * static_cast<size_t>(shape.max_len) * shape.n_kv_heads * shape.head_dim;
}

cudaError_t launch_prefill_mma(MmaShape m, const AttnShape& shape, const float* q_proj, size_t ld,
                               int n, const float* q_norm_w, const float* rope, const int* pos,
                               const void* k_cache, const void* v_cache, float* out, size_t ld_out,
                               float* scratch, cudaStream_t stream) {
  auto* k_limbs = reinterpret_cast<uint4*>(scratch);
  auto* v_limbs = k_limbs + static_cast<size_t>(shape.max_len) * shape.n_kv_heads * 2 * kChunks;
  const int n_sm = sm_count();
  if (n_sm == 0) return cudaGetLastError();
  const int* pos_last = pos + (n - 1);
  if (shape.kv == KvType::kFp8) {
    kv_limbs_kernel<<<4 * n_sm, 256, 0, stream>>>(
        static_cast<const Fp8*>(k_cache), static_cast<const Fp8*>(v_cache), pos_last,
        shape.n_kv_heads, shape.max_len, k_limbs, v_limbs);
  } else if (shape.kv == KvType::kBf16) {
    kv_limbs_kernel<<<4 * n_sm, 256, 0, stream>>>(
        static_cast<const Bf16*>(k_cache), static_cast<const Bf16*>(v_cache), pos_last,
        shape.n_kv_heads, shape.max_len, k_limbs, v_limbs);
  } else {
    kv_limbs_kernel<<<4 * n_sm, 256, 0, stream>>>(
        static_cast<const float*>(k_cache), static_cast<const float*>(v_cache), pos_last,
        shape.n_kv_heads, shape.max_len, k_limbs, v_limbs);
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const PrefillArgs a{q_proj, q_norm_w, rope, pos, k_limbs, v_limbs, out, ld, ld_out, n};
  return m == MmaShape::kWide ? launch<Wide>(shape, a, stream) : launch<Narrow>(shape, a, stream);
}

}  // namespace qf::kern::attn_detail
