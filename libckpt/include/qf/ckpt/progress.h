// Progress counters a library call advances and a front-end renders (stderr bar, JSON, ...).
#pragma once

#include <atomic>
#include <cstdint>

namespace qf::ckpt {

struct Progress {
  std::atomic<uint64_t> done{0};   // units finished (bytes unless the caller says otherwise)
  std::atomic<uint64_t> total{0};  // units expected; 0 while unknown
};

}  // namespace qf::ckpt
