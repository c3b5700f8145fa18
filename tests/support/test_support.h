// Helpers shared by the tests: temporary directories, raw file building, running commands.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "qf/error.h"

namespace qf::test {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// Bytes of a safetensors file: 8-byte little-endian length (the header's size unless
// `length_override` is given), the header text as is, then `data`.
std::string safetensors_bytes(std::string_view header, std::string_view data,
                              std::optional<uint64_t> length_override = std::nullopt);
std::string safetensors_bytes(std::string_view header, size_t n_data_bytes);

void write_file(const std::filesystem::path& path, std::string_view bytes);
std::string read_file(const std::filesystem::path& path);

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs `command` through /bin/sh, capturing stdout and stderr.
CommandResult run_command(const std::string& command);

// The code of the qf::Error `fn` throws, or nullopt when it throws none.
std::optional<Errc> error_code(const std::function<void()>& fn);

// Deterministic pseudo-random bytes (splitmix64 of seed and position).
std::string pattern_bytes(size_t n, uint64_t seed);

}  // namespace qf::test
