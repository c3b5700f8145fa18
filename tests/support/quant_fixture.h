// Test helpers over libquant: the synthetic sources most quant tests start from.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "test_support.h"

namespace qf::test {

// Under `dir`: "bf16" (the tiny preset, Qwen's BF16 layout) and, quantized from it with
// synth --from, "intel-int4" and "qwen-fp8" (2 shards each): consistent inputs for
// build-hybrid and the steps after it.
void synth_tiny_sources(const std::filesystem::path& dir);

// A test suite whose tests share one temporary directory holding synth_tiny_sources.
class TinySourcesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    synth_tiny_sources(dir_->path());
  }
  static void TearDownTestSuite() { dir_.reset(); }
  static std::filesystem::path d(const std::string& name) { return *dir_ / name; }

 private:
  static inline std::unique_ptr<TempDir> dir_;
};

}  // namespace qf::test
