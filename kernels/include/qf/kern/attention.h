// Gated full attention decode (one token, one layer), shared/docs/qwen35-architecture.md §3.4,
// in two launches: q and the new k are normalized per head with the zero-centred RMSNorm (1 + w)
// and rotated by partial NeoX RoPE (pairs (i, i + rot/2) for i < rot/2, inv_freq_i =
// 1 / theta^(2i / rot) in f32, angle = pos * inv_freq_i); k and v are appended at row `pos` of
// the caches; then causal softmax attention over rows 0..pos (scale 1/sqrt(hd), query head h on
// KV head h / (Nq / Nkv)), times sigmoid(gate). The position is read on the device (*pos) so a
// captured graph serves every step.
#pragma once

#include <cuda_runtime.h>

namespace qf::kern {

// The KV caches' element type: f32; bf16 (half the bytes; each k and v entry rounded to nearest
// even as its row is made, and the attention then uses the rounded rows, the new one included,
// so decode, prefill and the CPU twins see the same cache); or fp8 (a quarter: FP8 E4M3FN at unit
// scale, rounded to nearest even and clamped to +-448 as quant::f32_to_e4m3fn_sat, which is what
// vLLM's fp8 cache stores when a checkpoint gives no k or v scales; likewise used as stored).
enum class KvType { kF32, kBf16, kFp8 };

struct AttnShape {
  int n_q_heads = 0, n_kv_heads = 0, head_dim = 256, rot_dim = 64;
  float theta = 1e7f;
  float eps = 1e-6f;
  int max_len = 0;  // cache rows
  KvType kv = KvType::kF32;
};

// Bytes of one cache entry (4, 2 or 1); a cache is max_len * n_kv_heads * head_dim of them.
size_t attn_kv_bytes(const AttnShape& shape);

// The rotary table: [max_len, rot_dim / 2] pairs (cos, sin) of every position, filled once by
// attn_rope_table (a launch; attn_rope_floats(shape) floats, 0 for a refused shape).
size_t attn_rope_floats(const AttnShape& shape);
cudaError_t attn_rope_table(const AttnShape& shape, float* table, cudaStream_t stream);

// q_proj: [Nq, 2 * hd] (per head [query | gate]) as the projection wrote it; k_proj, v_proj:
// [Nkv * hd]; rope: the table above. Appends the normed, rotated k and v to k_cache/v_cache
// [max_len, Nkv, hd] (entries of shape.kv) at row *pos and writes out: [Nq * hd]. q: [Nq, hd], the
// normed, rotated queries, or nullptr (not written). scratch: attn_scratch_floats(shape) floats.
// Paths: kSplit, the split kernel on the CUDA cores (any shape); kMma (bf16 and fp8 caches at
// head_dim 256, where the device gives a block 98 KB of shared memory), the same splits scored and
// summed on the tensor cores with q and p as exact three-limb bf16 sums (attention_decode_mma.cu);
// kAuto: kMma where it can run, else kSplit. kMma elsewhere: cudaErrorInvalidValue.
enum class AttnDecodePath { kAuto, kSplit, kMma };
cudaError_t attn_decode(const AttnShape& shape, const float* q_proj, const float* k_proj,
                        const float* v_proj, const float* q_norm_w, const float* k_norm_w,
                        const float* rope, const int* pos, float* q, void* k_cache, void* v_cache,
                        float* out, float* scratch, cudaStream_t stream,
                        AttnDecodePath path = AttnDecodePath::kAuto);

// Gated attention over n consecutive tokens of one layer (batched prefill) at positions pos[0]
// .. pos[n - 1] (device, consecutive): their k and v appended to the caches (the same bits as
// attn_decode appends), then each token's causal attention over rows 0 .. pos[t] as attn_decode
// computes it but in one pass over the context (no partial softmaxes to combine), so within
// rounding of n attn_decode calls, not their bits. Token t's q_proj, k_proj, v_proj at t * ld of
// their pointers, its output at t * ld_out. scratch: attn_prefill_scratch_floats(shape, n)
// floats. Plain launches. Shapes as attn_decode, n * head blocks < 65536 (attn_prefill_ok);
// else cudaErrorInvalidValue.
// Paths: kScalar, a block per token and head block on the CUDA cores (any shape); kMma (head_dim
// 256 only), flash attention on the tensor cores with q, k, v and p as f16 limb pairs (f32-grade:
// attention_prefill.cu states the numerics; |k|, |v| entries below 65504), in its wide launch
// shape (192 KB of shared memory a block) or kMmaNarrow (96 KB); kAuto: the widest of those
// the device takes, else kScalar. A path the shape or the device cannot take:
// cudaErrorInvalidValue. The scratch size covers every path.
enum class AttnPrefillPath { kAuto, kScalar, kMma, kMmaNarrow };
bool attn_prefill_ok(const AttnShape& shape, int n);
size_t attn_prefill_scratch_floats(const AttnShape& shape, int n);
cudaError_t attn_prefill(const AttnShape& shape, const float* q_proj, const float* k_proj,
                         const float* v_proj, size_t ld, int n, const float* q_norm_w,
                         const float* k_norm_w, const float* rope, const int* pos, void* k_cache,
                         void* v_cache, float* out, size_t ld_out, float* scratch,
                         cudaStream_t stream, AttnPrefillPath path = AttnPrefillPath::kAuto);
// A verify's n consecutive tokens (speculative decoding) at positions pos[0] .. pos[n - 1]
// (device, consecutive) in three plain launches: their k and v rows appended (as attn_prefill
// appends them), then attn_decode's kernel for `path` over its splits for every token at once
// (a block per token, split and head block, every row read from the cache; the blocks that read
// the same rows run side by side, so the rows come from DRAM once) and the combine (grid.y:
// token).
// Bit for bit n attn_decode calls with that path (the new row a decode takes from shared memory
// holds what the append stores). Token t's q_proj, k_proj, v_proj at t * ld of their pointers,
// its output at t * ld_out. scratch: attn_decode_rows_scratch_floats(shape, n) floats. Shapes
// and paths as attn_decode, n * head blocks < 65536; else cudaErrorInvalidValue.
size_t attn_decode_rows_scratch_floats(const AttnShape& shape, int n);
cudaError_t attn_decode_rows(const AttnShape& shape, const float* q_proj, const float* k_proj,
                             const float* v_proj, size_t ld, int n, const float* q_norm_w,
                             const float* k_norm_w, const float* rope, const int* pos,
                             void* k_cache, void* v_cache, float* out, size_t ld_out,
                             float* scratch, cudaStream_t stream,
                             AttnDecodePath path = AttnDecodePath::kAuto);
size_t attn_scratch_floats(const AttnShape& shape);  // 0 for a shape attn_decode refuses

// Contracts: device pointers; stream-ordered, allocates nothing, never syncs with the host, so
// one captured graph replays at every position. 0 <= *pos < max_len; for a position outside it
// nothing is written (memory-safe). head_dim 64, 128 or 256, Nq a multiple of Nkv, rot_dim even
// and <= head_dim; otherwise cudaErrorInvalidValue. The context is split (flash-decoding) over
// enough chunks for two blocks per SM of the current device, at most min(128, ceil(max_len /
// 32)), and combined in a fixed order: deterministic for a given max_len on a given GPU. Sums of
// squares accumulate in double, as the CPU engine does; the rotary table is rounded from double,
// matching its powf/cosf/sinf. Loads *pos, the table and the cache rows before *pos before its PDL
// wait (pdl.cuh, rule (b)): they must not be written by the launch just before.

// Host twins on host pointers (pos is a host int here): attn_prepare_ref (norms, rotary, cache
// append) then attn_decode_ref (attention over the cache) compute what attn_decode does. Their
// caches are f32 whatever shape.kv says; with kBf16 or kFp8 the appended entries are rounded to
// bf16 or e4m3 values (quant::round_to_bf16, round_to_e4m3fn_sat), so they hold what the GPU's
// cache holds.
void attn_prepare_ref(const AttnShape& shape, const float* q_proj, const float* k_proj,
                      const float* v_proj, const float* q_norm_w, const float* k_norm_w, int pos,
                      float* q, float* k_cache, float* v_cache);
void attn_decode_ref(const AttnShape& shape, const float* q, const float* q_proj,
                     const float* k_cache, const float* v_cache, int pos, float* out);

}  // namespace qf::kern
