// attn_decode's attention on the tensor cores, for bf16 and fp8 caches at head_dim 256:
// mma.sync.m16n8k16 bf16 x bf16 -> f32, Ampere's warp MMA, so sm_90 and sm_121 alike.
//
// Why: the split kernel (attention.cu) scores and sums on the CUDA cores, one query head a warp
// pass, so at long contexts it is bound by its arithmetic, not its bytes (an H100 at 32768 rows
// of a 122B layer: 79.4 us for 64 MiB of bf16 rows, 35% of the copy bandwidth; this kernel 39.3
// us, 70%: docs/cuda-engine-speed.md, "bf16 KV caches"). Here a block takes up to 16 query heads
// of one KV head (a Qwen3.5 group: 8 or 16) as the MMA's 16 rows, so every K and V row it stages
// serves them all in a few tensor-core instructions.
//
// Numerics (the split kernel's, to f32 rounding; attention_test holds both to one bound):
//   * k and v are bf16 values already (e4m3 entries are too: each is converted to bf16 exactly as
//     its tile is staged). q (normed and rotated as attn_split_kernel makes it:
//     attention_common.cuh) and p are split into three bf16 limbs, x = hi + mid + lo exactly
//     (each limb the remainder rounded to nearest; 24 bits, an f32's significand), so each
//     product is exact and only the tensor cores' f32 sums round. A score is the sum over the
//     256 dims of the limbs' products, in two halves (one MMA accumulator each), added in f32,
//     times 1/16.
//   * The online softmax in f32 (expf, running max and sum per head) as the split kernel's;
//     o = sum p v over the split's rows, unnormalized, for attn_combine_kernel.
//
// Work: grid (splits, KV heads, head blocks), 8 warps. The context is split as the split kernel
// splits it (split_chunk). A block stages its chunk's K and V rows in 32-row tiles by cp.async
// into two slots each, a tile's K slot refilled once it is scored and its V slot once summed, so
// up to two tiles are in flight (the first tile and the second's K before its PDL wait); each
// row's 16-byte chunks XOR-swizzled by row so that ldmatrix reads them without bank conflicts.
// Fp8 caches: a tile's K and V rows land as bytes (cp.async, two tiles in flight, a quarter of
// a bf16 tile's 32 KB each), and at the tile's start every thread converts its share into one
// bf16 K slot and one V slot in the layout above (the same 64 KB of shared memory in all).
// The new row (*pos) comes from shared memory, as the split kernel's (a verify's tokens,
// attn_decode_rows: every row from the cache, which the append filled). Per tile: warp w scores
// rows 8 (w % 4) .. + 7 over dims 128 (w / 4) .. + 127 for the 16 heads; a warp per head then runs
// the online softmax over the tile's 32 rows and writes p's limbs; warp w accumulates o for dims 32
// w
// .. 32 w + 31 of every head in registers (16 floats a lane).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attention_decode_mma.h"
#include "cp_async.cuh"
#include "device_limits.h"
#include "mma_f16.cuh"
#include "pdl.cuh"

namespace qf::kern::attn_detail {
namespace {

using gemv_detail::bf16_limbs3;
using gemv_detail::cp_async16;
using gemv_detail::cp_async_commit;
using gemv_detail::cp_async_wait;
using gemv_detail::ldsm_x4;
using gemv_detail::ldsm_x4_trans;
using gemv_detail::mma_bf16;
using gemv_detail::smem_addr;

constexpr int kHd = 256;
constexpr int kM = 16;  // query heads a block: the MMA's rows
constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kChunks = kHd / 8;     // 16-byte chunks of a bf16 row
constexpr int kLimbs = 3;            // bf16 limbs of q and p
constexpr int kPStride = kTile + 8;  // a head's p limbs, bf16s: 80 bytes, conflict-free ldmatrix

// Shared memory, bytes: two stages of a tile's K and V rows | q limbs [limb][head][chunk] |
// scores [dims half][head][row] | p limbs [limb][head][kPStride] | the new k and v rows (bf16) |
// cos, sin | m, l, corr [head].
constexpr int kStageBytes = 2 * kTile * kHd * 2;
constexpr int kRawBytes = 2 * kTile * kHd;  // Fp8: a tile's K and V rows as they land
constexpr int kQOff = 2 * kStageBytes;
constexpr int kSOff = kQOff + kLimbs * kM * kHd * 2;
constexpr int kPOff = kSOff + 2 * kM * kTile * 4;
constexpr int kNewOff = kPOff + kLimbs * kM * kPStride * 2;
constexpr int kRopeOff = kNewOff + 2 * kHd * 2;
constexpr int kStatOff = kRopeOff + kHd * 4;
constexpr int kSmemBytes = kStatOff + 3 * kM * 4;
static_assert(kM * kHd * 4 <= kStageBytes / 2, "q's f32 rows fit a V slot");
static_assert(2 * kRawBytes <= kStageBytes, "Fp8: two raw tiles fit the second stage");
static_assert(kHd * 4 <= 2 * kM * kTile * 4, "the new k row's f32 entries fit the scores");

// Chunk c of row r of a [rows][kChunks] array of 16-byte chunks, swizzled.
__device__ __forceinline__ int swz(int r, int c) {
  return r * kChunks + (c ^ (r & 7));
}

// Eight e4m3 entries as eight bf16 ones (exact; the lower address in the low half).
__device__ __forceinline__ uint4 fp8x8_to_bf16(uint2 w) {
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = i < 2 ? w.x : w.y;
    const float2 f = fp8_pair(static_cast<uint16_t>(word >> (16 * (i & 1))));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    out[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// kTokens: a verify's tokens (AttnArgs::n_tokens, attn_decode_rows), every row read from the
// cache (the append ran before; a plain launch). The block's token, split and head block:
// split_block. Kv: the caches' entries, Bf16 or Fp8.
template <bool kTokens, class Kv>
__global__ void __launch_bounds__(kThreads, 2)
    attn_decode_mma_kernel(AttnShape s, int n_splits, AttnArgs a) {
  constexpr bool kFp8 = sizeof(Kv) == 1;
  extern __shared__ __align__(16) unsigned char smem[];
  uint4* stage = reinterpret_cast<uint4*>(smem);  // [buf][k | v][row][chunk], swizzled
  uint4* q_l = reinterpret_cast<uint4*>(smem + kQOff);
  float* s_part = reinterpret_cast<float*>(smem + kSOff);
  Bf16* p_l = reinterpret_cast<Bf16*>(smem + kPOff);
  Bf16* new_s = reinterpret_cast<Bf16*>(smem + kNewOff);  // [k | v][hd]
  float* cos_s = reinterpret_cast<float*>(smem + kRopeOff);
  float* sin_s = cos_s + kHd / 2;
  float* m_s = reinterpret_cast<float*>(smem + kStatOff);
  float *l_s = m_s + kM, *corr_s = l_s + kM;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // Before the wait: *pos (written by the previous step), the rotary row and this split's first
  // tile of cached rows (written by earlier steps), through L2 (pdl.cuh, rule (b)).
  const int n_sub = (s.n_q_heads / s.n_kv_heads + kM - 1) / kM;
  const SplitBlock sb = split_block(kTokens ? a.n_tokens : 1, n_sub);
  const int tok = sb.tok, split = sb.split;
  const int pos = kTokens ? a.pos[tok] : __ldcg(a.pos), t_len = context_len(pos, s.max_len);
  const int chunk = split_chunk(t_len, n_splits), t0 = split * chunk;
  const int t1 = min(t_len, t0 + chunk);
  const int kvh = blockIdx.y, half = s.rot_dim / 2;
  const size_t row_stride = static_cast<size_t>(s.n_kv_heads) * kHd;
  const Kv* kbase = reinterpret_cast<const Kv*>(a.k_cache) + static_cast<size_t>(kvh) * kHd;
  const Kv* vbase = reinterpret_cast<const Kv*>(a.v_cache) + static_cast<size_t>(kvh) * kHd;
  const float* rope = a.rope + static_cast<size_t>(t_len - 1) * s.rot_dim;  // (cos, sin) pairs
  for (int i = tid; i < half; i += kThreads) {
    cos_s[i] = rope[2 * i];
    sin_s[i] = rope[2 * i + 1];
  }
  // The new row's K (which 0) or V (1) entries into its place in slot `buf` if tile tb holds it.
  const auto put_new_row = [&](int tb, int buf, int which) {
    if (pos < tb || pos >= tb + kTile) return;
    uint4* dst = stage + ((kFp8 ? 0 : 2 * buf) + which) * kTile * kChunks;
    const uint4* src = reinterpret_cast<const uint4*>(new_s + which * kHd);
    for (int c = tid; c < kChunks; c += kThreads) dst[swz(pos - tb, c)] = src[c];
  };
  // Fp8: the raw rows of tile tb (K and V, one commit group; an empty one past the split) into
  // raw slot `buf`, [buf][k | v][row][hd bytes]; rows past the context as zeros, the new row not
  // loaded (convert writes it).
  unsigned char* raw = smem + kStageBytes;
  const auto issue_raw = [&](int tb, int buf) {
    if (tb < t1) {
      const int end = min(t1, kTokens ? pos + 1 : pos) - tb;
      constexpr int kRawChunks = kHd / 16, kPer = kTile * kRawChunks;
      uint4* dst = reinterpret_cast<uint4*>(raw + buf * kRawBytes);
      for (int i = tid; i < 2 * kPer; i += kThreads) {
        const int which = i / kPer, r = i % kPer / kRawChunks, c = i % kRawChunks;
        if (!kTokens && tb + r == pos) continue;
        const Kv* src = (which ? vbase : kbase) + (tb + (r < end ? r : 0)) * row_stride + c * 16;
        cp_async16(dst + i, src, r < end ? 16 : 0);
      }
    }
    cp_async_commit();
  };
  // Fp8: raw slot `buf` (tile tb) into the bf16 K and V slots, swizzled; the new row from new_s.
  const auto convert = [&](int tb, int buf, bool put) {
    const uint2* src = reinterpret_cast<const uint2*>(raw + buf * kRawBytes);
    constexpr int kPer = kTile * kChunks;
    for (int i = tid; i < 2 * kPer; i += kThreads) {
      const int which = i / kPer, r = i % kPer / kChunks, c = i % kChunks;
      if (put && tb + r == pos) continue;
      stage[which * kPer + swz(r, c)] = fp8x8_to_bf16(src[i]);
    }
    if (put) {
      put_new_row(tb, 0, 0);
      put_new_row(tb, 0, 1);
    }
  };
  // Rows tb .. tb + 31 of K (which 0) or V (1) into slot `buf` as one commit group (an empty one
  // past the split): cached rows by cp.async, rows past the context as zeros; the new row by
  // put_new_row, here once its entries are made (`put`). Bf16 instances only (the cast below is
  // theirs; Fp8 ones stage by issue_raw).
  const auto issue = [&](int tb, int buf, int which, bool put) {
    if (tb < t1) {
      const int end = min(t1, kTokens ? pos + 1 : pos) - tb;  // rows tb .. tb + end - 1 cached
      uint4* dst = stage + (2 * buf + which) * kTile * kChunks;
      const Kv* base = which ? vbase : kbase;
      for (int i = tid; i < kTile * kChunks; i += kThreads) {
        const int r = i / kChunks, c = i % kChunks;
        if (!kTokens && tb + r == pos) continue;
        cp_async16(
            dst + swz(r, c),
            reinterpret_cast<const Bf16*>(base) + (tb + (r < end ? r : 0)) * row_stride + c * 8,
            r < end ? 16 : 0);
      }
      if (put) put_new_row(tb, buf, which);
    }
    cp_async_commit();
  };
  // K and V of tile 0 and K of tile 1 (groups in this order); V of tile 1 after the q prep, whose
  // f32 rows lie in its slot. Fp8: tiles 0 and 1 whole (q's rows lie in the bf16 V slot).
  if constexpr (kFp8) {
    issue_raw(t0, 0);
    issue_raw(t0 + kTile, 1);
  } else {
    issue(t0, 0, 0, false);
    issue(t0, 0, 1, false);
    issue(t0 + kTile, 1, 0, false);
  }
  pdl::wait();
  if (t0 >= t1 || pos < 0 || pos >= s.max_len) {  // contract: 0 <= *pos < max_len
    cp_async_wait<0>();                           // no copy outlives the block
    return;
  }
  __syncthreads();  // the rotary row

  const int group = s.n_q_heads / s.n_kv_heads;
  const int zb = sb.sub;
  const int h_lo = kvh * group + zb * kM, nh = min(kM, group - zb * kM);
  const bool has_new = !kTokens && pos < t1;  // this split ends with the new row
  const float* q_proj = a.q_proj + static_cast<size_t>(tok) * a.q_row;
  const size_t parts = static_cast<size_t>(s.n_q_heads) * n_splits;
  float* part_o = a.part_o + tok * parts * kHd;
  float* part_ml = a.part_ml + tok * parts * 2;
  // A warp per item: query heads 0 .. 15 (their f32 rows in slot 1's V, Fp8: in the V slot; heads
  // past nh as zero limbs), then the new k row (its f32 entries in the scores' space). Every row a
  // warp takes is loaded before the first is normed.
  float* q_f = reinterpret_cast<float*>(stage + (kFp8 ? 1 : 3) * kTile * kChunks);
  constexpr int kItems = (kM + 1 + kWarps - 1) / kWarps;
  float x[kItems][kHd / 32] = {};
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int it = warp + kWarps * i;
    if (it < nh) {
      load_row_warp<kHd>(q_proj + static_cast<size_t>(h_lo + it) * 2 * kHd, x[i]);
    } else if (it == kM && has_new) {
      load_row_warp<kHd>(a.k_proj + static_cast<size_t>(kvh) * kHd, x[i]);
    }
  }
  double ss[kItems];  // the rows' sums of squares, reduced side by side
#pragma unroll
  for (int i = 0; i < kItems; ++i) ss[i] = sum_sq_part<kHd>(x[i]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
    for (int i = 0; i < kItems; ++i) ss[i] += __shfl_xor_sync(0xffffffffu, ss[i], o);
  }
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int it = warp + kWarps * i;
    if (it < nh) {
      float* row = q_f + it * kHd;
      scale_rope_row<kHd>(x[i], ss[i], a.q_norm_w, s.eps, half, cos_s, sin_s, row);
      if (a.q && split == 0) {
        for (int e = lane; e < kHd; e += 32) a.q[static_cast<size_t>(h_lo + it) * kHd + e] = row[e];
      }
      const float4 x0 = reinterpret_cast<const float4*>(row)[2 * lane];
      const float4 x1 = reinterpret_cast<const float4*>(row)[2 * lane + 1];
      uint32_t w[4][kLimbs];
      bf16_limbs3(x0.x, x0.y, w[0]);
      bf16_limbs3(x0.z, x0.w, w[1]);
      bf16_limbs3(x1.x, x1.y, w[2]);
      bf16_limbs3(x1.z, x1.w, w[3]);
#pragma unroll
      for (int l = 0; l < kLimbs; ++l)
        q_l[l * kM * kChunks + swz(it, lane)] = make_uint4(w[0][l], w[1][l], w[2][l], w[3][l]);
    } else if (it < kM) {
#pragma unroll
      for (int l = 0; l < kLimbs; ++l)
        q_l[l * kM * kChunks + swz(it, lane)] = make_uint4(0, 0, 0, 0);
    } else if (it == kM && has_new) {
      scale_rope_row<kHd>(x[i], ss[i], a.k_norm_w, s.eps, half, cos_s, sin_s, s_part);
      for (int e = lane; e < kHd; e += 32) new_s[e] = quant::f32_to_bf16(kv_round<Kv>(s_part[e]));
    }
  }
  if (has_new) {
    for (int i = tid; i < kHd; i += kThreads)
      new_s[kHd + i] = quant::f32_to_bf16(kv_round<Kv>(a.v_proj[kvh * kHd + i]));
  }
  for (int i = tid; i < kM; i += kThreads) {
    m_s[i] = -INFINITY;
    l_s[i] = 0.0f;
  }
  __syncthreads();
  if (has_new && zb == 0) {
    const size_t row = static_cast<size_t>(pos) * row_stride + static_cast<size_t>(kvh) * kHd;
    for (int i = tid; i < kHd; i += kThreads) {
      reinterpret_cast<Kv*>(a.k_cache)[row + i] = kv_entry<Kv>(quant::bf16_to_f32(new_s[i]));
      reinterpret_cast<Kv*>(a.v_cache)[row + i] = kv_entry<Kv>(quant::bf16_to_f32(new_s[kHd + i]));
    }
  }
  if constexpr (!kFp8) {
    if (has_new) {
      put_new_row(t0, 0, 0);
      put_new_row(t0, 0, 1);
      put_new_row(t0 + kTile, 1, 0);
    }
    issue(t0 + kTile, 1, 1, has_new);
  }

  // This lane's MMA coordinates: fragment rows g and g + 8 (heads), columns 2 tq and the next;
  // ldmatrix row addresses: matrix lane / 8, its row lane % 8.
  const int g = lane >> 2, tq = lane & 3, mrow = (lane & 7) + 8 * ((lane >> 3) & 1);
  float o[4][4] = {};  // heads g, g + 8 x dims 32 warp + 8 n + 2 tq (+1)
  const float scale = 1.0f / sqrtf(static_cast<float>(kHd));
  const int n_tiles = (t1 - t0 + kTile - 1) / kTile;
  // Two slots each of K and V: tile j's K is refilled with tile j + 2's once scored, its V once
  // summed (at the next tile's start), so up to two tiles are in flight. Commit groups in order:
  // K0 V0 K1 V1, then K(j + 2) in tile j and V(j + 2) at tile j + 1's start.
  // Fp8: tile j (raw slot j % 2) is converted at its start, then its raw slot refilled with
  // tile j + 2's rows; groups in order: tiles 0, 1, then tile j + 2 in tile j.
  for (int j = 0; j < n_tiles; ++j) {
    const int tb = t0 + j * kTile, buf = j & 1;
    if constexpr (kFp8) {
      cp_async_wait<1>();  // tile j (tile j + 1 pending)
      __syncthreads();     // tile j landed; every thread is done with tile j - 1
      convert(tb, buf, has_new && pos >= tb && pos < tb + kTile);
      __syncthreads();
      issue_raw(tb + 2 * kTile, buf);
    } else {
      if (j == 0) {
        cp_async_wait<3>();  // K0 (V0 K1 V1 pending)
      } else {
        cp_async_wait<2>();  // K(j) (V(j) K(j + 1) pending)
      }
      __syncthreads();  // K(j) landed; every thread is done with tile j - 1
      if (j > 0) issue(tb + kTile, buf ^ 1, 1, has_new);  // V(j + 1), in tile j - 1's V slot
    }
    const uint4* kt = stage + (kFp8 ? 0 : 2 * buf) * kTile * kChunks;
    const uint4* vt = kt + kTile * kChunks;

    {  // Scores: rows n0 .. n0 + 7 over chunks 16 kh .. 16 kh + 15 (dims 128 kh ..), one sum.
      const int n0 = 8 * (warp & 3), kh = warp >> 2;
      float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int k4 = 0; k4 < 4; ++k4) {  // 32 dims: two k-steps
        const int c0 = 16 * kh + 4 * k4;
        uint32_t b[4];
        ldsm_x4(b, smem_addr(kt + swz(n0 + (lane & 7), c0 + (lane >> 3))));
#pragma unroll
        for (int l = 0; l < kLimbs; ++l) {
#pragma unroll
          for (int st = 0; st < 2; ++st) {
            uint32_t aq[4];
            ldsm_x4(aq, smem_addr(q_l + l * kM * kChunks + swz(mrow, c0 + 2 * st + (lane >> 4))));
            mma_bf16(sum, aq, b[2 * st], b[2 * st + 1]);
          }
        }
      }
      float* sp = s_part + kh * kM * kTile + n0 + 2 * tq;
      *reinterpret_cast<float2*>(sp + g * kTile) = make_float2(sum[0], sum[1]);
      *reinterpret_cast<float2*>(sp + (g + 8) * kTile) = make_float2(sum[2], sum[3]);
    }
    __syncthreads();
    if constexpr (!kFp8) issue(tb + 2 * kTile, buf, 0, has_new);  // K(j + 2), in tile j's K slot
    // Online softmax, a warp per head (lane: row); rows past the split get p = 0.
    const int nt = min(kTile, t1 - tb);
    for (int h = warp; h < kM; h += kWarps) {
      const float sc = lane < nt
                           ? (s_part[h * kTile + lane] + s_part[(kM + h) * kTile + lane]) * scale
                           : -INFINITY;
      const float m_old = m_s[h], m_new = fmaxf(m_old, mixer::warp_max(sc));
      const float pe = lane < nt ? expf(sc - m_new) : 0.0f;
      uint32_t w[kLimbs];
      bf16_limbs3(pe, 0.0f, w);
#pragma unroll
      for (int l = 0; l < kLimbs; ++l)
        p_l[(l * kM + h) * kPStride + lane] = static_cast<Bf16>(w[l] & 0xFFFFu);
      const float l_tile = mixer::warp_sum(pe);
      if (lane == 0) {
        const float corr = expf(m_old - m_new);
        corr_s[h] = corr;
        l_s[h] = l_s[h] * corr + l_tile;
        m_s[h] = m_new;
      }
    }
    if constexpr (!kFp8) cp_async_wait<3>();  // V(j) (K(j + 1) V(j + 1) K(j + 2) pending)
    __syncthreads();
    {  // o = o corr + p v for dims 32 warp .. 32 warp + 31.
      const float c_g = corr_s[g], c_g8 = corr_s[g + 8];
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        o[n][0] *= c_g, o[n][1] *= c_g, o[n][2] *= c_g8, o[n][3] *= c_g8;
      }
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {  // rows 16 ks .. 16 ks + 15
        uint32_t ap[kLimbs][4];
#pragma unroll
        for (int l = 0; l < kLimbs; ++l)
          ldsm_x4(ap[l], smem_addr(p_l + (l * kM + mrow) * kPStride + 16 * ks + 8 * (lane >> 4)));
#pragma unroll
        for (int np = 0; np < 2; ++np) {  // dims 32 warp + 16 np .. + 15: two n-tiles
          uint32_t b[4];
          ldsm_x4_trans(b, smem_addr(vt + swz(16 * ks + mrow, 4 * warp + 2 * np + (lane >> 4))));
#pragma unroll
          for (int l = 0; l < kLimbs; ++l) {
            mma_bf16(o[2 * np], ap[l], b[0], b[1]);
            mma_bf16(o[2 * np + 1], ap[l], b[2], b[3]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    const int dim = 32 * warp + 8 * n + 2 * tq;
    if (g < nh) {
      *reinterpret_cast<float2*>(part_o + (static_cast<size_t>(h_lo + g) * n_splits + split) * kHd +
                                 dim) = make_float2(o[n][0], o[n][1]);
    }
    if (g + 8 < nh) {
      *reinterpret_cast<float2*>(
          part_o + (static_cast<size_t>(h_lo + g + 8) * n_splits + split) * kHd + dim) =
          make_float2(o[n][2], o[n][3]);
    }
  }
  for (int i = tid; i < nh; i += kThreads) {
    float* ml = part_ml + (static_cast<size_t>(h_lo + i) * n_splits + split) * 2;
    ml[0] = m_s[i];
    ml[1] = l_s[i];
  }
}

}  // namespace

bool mma_decode_shape_ok(const AttnShape& shape) {
  return (shape.kv == KvType::kBf16 || shape.kv == KvType::kFp8) && shape.head_dim == kHd;
}

bool mma_decode_fits() {
  return max_smem_optin() >= kSmemBytes;
}

int mma_decode_head_blocks(const AttnShape& shape) {
  return (shape.n_q_heads / shape.n_kv_heads + kM - 1) / kM;
}

cudaError_t launch_decode_mma(const AttnShape& shape, int n_splits, const AttnArgs& a,
                              cudaStream_t stream) {
  const int n = a.n_tokens > 0 ? a.n_tokens : 1;
  const bool fp8 = shape.kv == KvType::kFp8;
  const auto kernel =
      a.n_tokens > 0
          ? (fp8 ? attn_decode_mma_kernel<true, Fp8> : attn_decode_mma_kernel<true, Bf16>)
          : (fp8 ? attn_decode_mma_kernel<false, Fp8> : attn_decode_mma_kernel<false, Bf16>);
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(n * n_splits * mma_decode_head_blocks(shape)),
                  static_cast<unsigned>(shape.n_kv_heads));
  if (a.n_tokens > 0) {
    kernel<<<grid, kThreads, kSmemBytes, stream>>>(shape, n_splits, a);
    return cudaGetLastError();
  }
  return pdl::launch(kernel, grid, kThreads, kSmemBytes, stream, shape, n_splits, a);
}

}  // namespace qf::kern::attn_detail
