// What the fuzz targets share: a check that reports the broken property and aborts (libFuzzer
// then keeps the input), and a stream of choices read from the input's bytes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>

namespace qf::fuzz {

[[noreturn]] inline void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz property broken: %s\n%s\n", what, detail.c_str());
  std::abort();
}

#define QF_FUZZ_CHECK(cond, detail)               \
  do {                                            \
    if (!(cond)) ::qf::fuzz::fail(#cond, detail); \
  } while (0)

// Choices taken from bytes: each next(n) is in [0, n); when the bytes run out, 0.
class Choices {
 public:
  explicit Choices(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  uint32_t next(uint32_t n) {
    if (n <= 1) return 0;
    uint32_t v = 0;
    for (int i = 0; i < (n > 256 ? 2 : 1); ++i) v = v << 8 | byte();
    return v % n;
  }
  bool empty() const { return at_ >= bytes_.size(); }

 private:
  uint8_t byte() { return at_ < bytes_.size() ? bytes_[at_++] : 0; }
  std::span<const uint8_t> bytes_;
  size_t at_ = 0;
};

}  // namespace qf::fuzz
