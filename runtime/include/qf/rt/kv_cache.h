// The attention layers' KV cache entries, for both engines (CudaOptions::kv_cache, CpuEngine):
// f32; bf16 (half the bytes: each k and v entry rounded to nearest even as its row is made, and
// attention then runs over the rounded rows, the new one included); or fp8 (a quarter: FP8
// E4M3FN at unit scale, rounded to nearest even and clamped to +-448, likewise used as stored;
// vLLM's fp8 cache with no k or v scales in the checkpoint). Named as vLLM's --kv-cache-dtype
// names them.
#pragma once

namespace qf::rt {

enum class KvCacheType { kF32, kBf16, kFp8 };

inline constexpr const char* kv_cache_type_name(KvCacheType t) {
  return t == KvCacheType::kFp8 ? "fp8" : t == KvCacheType::kBf16 ? "bfloat16" : "float32";
}
// Bytes of one cache entry.
inline constexpr int kv_cache_entry_bytes(KvCacheType t) {
  return t == KvCacheType::kFp8 ? 1 : t == KvCacheType::kBf16 ? 2 : 4;
}

}  // namespace qf::rt
