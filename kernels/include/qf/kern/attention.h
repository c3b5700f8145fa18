// Gated full attention decode (one token, one layer), shared/docs/qwen35-architecture.md §3.4:
// attn_prepare normalizes q and k per head with the zero-centred RMSNorm (1 + w), applies partial
// NeoX RoPE (pairs (i, i + rot/2) for i < rot/2, inv_freq_i = 1 / theta^(2i / rot) in f32,
// angle = pos * inv_freq_i) and appends k, v at row `pos` of the caches; attn_decode runs causal
// softmax attention over rows 0..pos (scale 1/sqrt(hd), query head h on KV head h / (Nq / Nkv))
// and multiplies by sigmoid(gate). The position is read on the device (*pos) so a captured graph
// serves every step.
#pragma once

#include <cuda_runtime.h>

namespace qf::kern {

struct AttnShape {
  int n_q_heads = 0, n_kv_heads = 0, head_dim = 256, rot_dim = 64;
  float theta = 1e7f;
  float eps = 1e-6f;
  int max_len = 0;  // cache rows
};

// q_proj: [Nq, 2 * hd] (per head [query | gate]) as the projection wrote it; k_proj, v_proj:
// [Nkv * hd]. Writes q: [Nq, hd] (normed, rotated) and the cache rows
// k_cache/v_cache [max_len, Nkv, hd] at *pos.
cudaError_t attn_prepare(const AttnShape& shape, const float* q_proj, const float* k_proj,
                         const float* v_proj, const float* q_norm_w, const float* k_norm_w,
                         const int* pos, float* q, float* k_cache, float* v_cache,
                         cudaStream_t stream);

// out: [Nq * hd] = softmax(q k^T / sqrt(hd)) v over rows 0..*pos, times sigmoid(gate) where
// gate is the second half of each head's q_proj row. scratch: attn_scratch_floats(shape).
cudaError_t attn_decode(const AttnShape& shape, const float* q, const float* q_proj,
                        const float* k_cache, const float* v_cache, const int* pos, float* out,
                        float* scratch, cudaStream_t stream);
size_t attn_scratch_floats(const AttnShape& shape);

// Contracts (both calls): device pointers; stream-ordered, allocate nothing, never sync with the
// host, so one captured graph replays at every position. 0 <= *pos < max_len: prepare writes
// nothing for a position outside it and decode clamps its context to the cache (memory-safe,
// results meaningless). prepare: head_dim <= 512, rot_dim even and <= head_dim. decode:
// head_dim 64, 128 or 256, Nq a multiple of Nkv; otherwise cudaErrorInvalidValue. decode splits
// the context over min(128, ceil(max_len / 32)) chunks (flash-decoding) and combines them in a
// fixed order: deterministic for a given max_len. Sums of squares accumulate in double, as the
// CPU engine does; the rotary table is rounded from double, matching its powf/cosf/sinf.

// Host twins on host pointers (pos is a host int here).
void attn_prepare_ref(const AttnShape& shape, const float* q_proj, const float* k_proj,
                      const float* v_proj, const float* q_norm_w, const float* k_norm_w, int pos,
                      float* q, float* k_cache, float* v_cache);
void attn_decode_ref(const AttnShape& shape, const float* q, const float* q_proj,
                     const float* k_cache, const float* v_cache, int pos, float* out);

}  // namespace qf::kern
