// The attention layers' KV cache entries, for both engines (CudaOptions::kv_cache, CpuEngine):
// f32, or bf16 (half the bytes: each k and v entry rounded to nearest even as its row is made,
// and attention then runs over the rounded rows, the new one included). Named as vLLM's
// --kv-cache-dtype names them.
#pragma once

namespace qf::rt {

enum class KvCacheType { kF32, kBf16 };

inline constexpr const char* kv_cache_type_name(KvCacheType t) {
  return t == KvCacheType::kBf16 ? "bfloat16" : "float32";
}
// Bytes of one cache entry.
inline constexpr int kv_cache_entry_bytes(KvCacheType t) {
  return t == KvCacheType::kBf16 ? 2 : 4;
}

}  // namespace qf::rt
