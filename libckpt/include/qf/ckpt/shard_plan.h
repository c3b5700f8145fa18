// Splitting a tensor list into shards, as Hugging Face writers do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace qf::ckpt {

inline constexpr uint64_t kDefaultShardBytes = 5ull << 30;  // HF's "5GB" is 5 GiB

// Shard index of each tensor, keeping the given order: a new shard starts when the next tensor
// would push the current one past max_bytes (a tensor larger than max_bytes gets a shard to
// itself), as huggingface_hub's split_state_dict_into_shards does.
std::vector<size_t> plan_shards_by_size(const std::vector<uint64_t>& sizes, uint64_t max_bytes);
// Exactly min(n, number of tensors) shards of roughly equal bytes, keeping the order.
std::vector<size_t> plan_shards_by_count(const std::vector<uint64_t>& sizes, size_t n);

// "model-00001-of-00014.safetensors" for i = 0, n = 14.
std::string shard_file_name(size_t i, size_t n);

}  // namespace qf::ckpt
