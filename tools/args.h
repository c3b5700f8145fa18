// Parsing helpers for command-line values.
#pragma once

#include <cstdint>
#include <string>

#include "qf/rt/kv_cache.h"

namespace CLI {
class App;
}

namespace qf::tools {

// "5GiB", "512MiB", "4096", "5G" (decimal), "1.5GiB"; throws Error(kUsage) naming the flag.
uint64_t parse_size(const std::string& text, const std::string& flag);

// --kv-cache-dtype float32 | bfloat16 on an engine command (qf/rt/kv_cache.h), into *out.
void add_kv_cache_option(CLI::App* sub, rt::KvCacheType* out);

}  // namespace qf::tools
