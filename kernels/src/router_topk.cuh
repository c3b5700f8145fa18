// The MoE router's softmax and top-k on one warp, each lane holding its logits in registers:
// router_kernel's body (ops.cu), kept apart for any kernel that would end with the router. (The
// router GEMV ending with it in its last block, by an atomic ticket, was measured: 1 us per
// layer slower than the separate PDL launch on an H200: branch ops-latency-router-tail.)
//
// Contract: p = softmax(logits[0..e)); the k largest p (lowest index first among equal p) go to
// ids[0..k) and weights[j] = p[ids[j]] / (sum of the chosen p, added in selection order).
// e <= 32 * kPer, 1 <= k <= min(e, 32); all 32 lanes of the warp call it, lanes j < k store
// entry j. Determinism: fixed reduction trees; p, the choice and the weights are bit for bit
// those of the shared-memory warp router this replaced (same max, same per-lane then xor-tree
// sum, same division), so the twin router_topk_ref agrees within rounding (it sums in double).
// Finite logits assumed (p is then in [0, 1]).
#pragma once

#include <cfloat>
#include <climits>
#include <cstdint>

namespace qf::kern::detail {

// Selection key of a probability p >= 0: its bits + 1 (ordered as p; 0 marks "not a candidate").
__device__ __forceinline__ uint32_t router_key(float p) {
  return __float_as_uint(p) + 1u;
}

// load(i) returns logit i (called for i < e only, before any other work: the loads overlap).
template <int kPer, class Load>
__device__ __forceinline__ void router_topk_warp(Load load, int e, int k, int* ids,
                                                 float* weights) {
  const int lane = threadIdx.x & 31;
  float p[kPer];
#pragma unroll
  for (int t = 0; t < kPer; ++t) p[t] = lane + 32 * t < e ? load(lane + 32 * t) : -FLT_MAX;
  // The maximum through one redux: floats as order-preserving ints (exact, as fmaxf's tree).
  int top_bits = INT_MIN;
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const int b = __float_as_int(p[t]);
    top_bits = max(top_bits, b ^ ((b >> 31) & 0x7fffffff));
  }
  top_bits = __reduce_max_sync(0xffffffffu, top_bits);
  const float top = __int_as_float(top_bits ^ ((top_bits >> 31) & 0x7fffffff));
  float sum = 0;
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    if (lane + 32 * t < e) sum += p[t] = expf(p[t] - top);  // in t order, as before
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  uint32_t key[kPer];
#pragma unroll
  for (int t = 0; t < kPer; ++t) key[t] = lane + 32 * t < e ? router_key(p[t] / sum) : 0u;
  // k rounds: the largest key (one redux), then the lowest index holding it (another); the
  // owner clears it. Lane j keeps round j's pick.
  float picked = 0, mine = 0;
  int my_id = 0;
  for (int j = 0; j < k; ++j) {
    uint32_t best = 0;
#pragma unroll
    for (int t = 0; t < kPer; ++t) best = max(best, key[t]);
    best = __reduce_max_sync(0xffffffffu, best);
    uint32_t cand = 0xffffffffu;
#pragma unroll
    for (int t = kPer - 1; t >= 0; --t) cand = key[t] == best ? lane + 32 * t : cand;
    const uint32_t idx = __reduce_min_sync(0xffffffffu, cand);
#pragma unroll
    for (int t = 0; t < kPer; ++t) key[t] = lane + 32 * t == idx ? 0u : key[t];
    const float v = __uint_as_float(best - 1u);
    picked += v;
    if (lane == j) {
      mine = v;
      my_id = static_cast<int>(idx);
    }
  }
  if (lane < k) {
    ids[lane] = my_id;
    weights[lane] = mine / picked;
  }
}

}  // namespace qf::kern::detail
