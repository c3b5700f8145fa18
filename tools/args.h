// Parsing helpers for command-line values.
#pragma once

#include <cstdint>
#include <string>

namespace qf::tools {

// "5GiB", "512MiB", "4096", "5G" (decimal), "1.5GiB"; throws Error(kUsage) naming the flag.
uint64_t parse_size(const std::string& text, const std::string& flag);

}  // namespace qf::tools
