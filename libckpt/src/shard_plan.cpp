#include "qf/ckpt/shard_plan.h"

#include <algorithm>
#include <cstdio>

namespace qf::ckpt {

std::vector<size_t> plan_shards_by_size(const std::vector<uint64_t>& sizes, uint64_t max_bytes) {
  std::vector<size_t> out(sizes.size());
  size_t shard = 0;
  uint64_t used = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (used > 0 && used + sizes[i] > max_bytes) {
      ++shard;
      used = 0;
    }
    out[i] = shard;
    used += sizes[i];
  }
  return out;
}

std::vector<size_t> plan_shards_by_count(const std::vector<uint64_t>& sizes, size_t n) {
  std::vector<size_t> out(sizes.size());
  if (sizes.empty()) return out;
  n = std::max<size_t>(1, std::min(n, sizes.size()));
  uint64_t total = 0;
  for (uint64_t s : sizes) total += s;
  // Tensor i goes to the shard its midpoint falls in; then empty shards are squeezed out and,
  // if big tensors made fewer than n, the largest shards are split at tensor boundaries.
  uint64_t before = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const long double mid = static_cast<long double>(before) + sizes[i] / 2.0L;
    out[i] = total ? std::min(n - 1, static_cast<size_t>(mid * n / total)) : i * n / sizes.size();
    before += sizes[i];
  }
  size_t next = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const size_t raw = out[i];
    out[i] = next;
    if (i + 1 < out.size() && out[i + 1] != raw) ++next;
  }
  size_t have = next + 1;
  while (have < n) {  // halve the shard with the most tensors
    std::vector<size_t> count(have, 0);
    for (size_t s : out) ++count[s];
    const size_t big =
        static_cast<size_t>(std::max_element(count.begin(), count.end()) - count.begin());
    if (count[big] < 2) break;
    size_t seen = 0;
    for (size_t& s : out) {
      if (s > big) {
        ++s;
      } else if (s == big && seen++ >= count[big] / 2) {
        s = big + 1;
      }
    }
    ++have;
  }
  return out;
}

std::string shard_file_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

}  // namespace qf::ckpt
