// GPU presence for the kernel tests: they skip (with the reason) where no CUDA device is usable.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

namespace qf::kern::test {

inline bool have_gpu(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) *why = std::string("no CUDA device: ") + cudaGetErrorString(e);
  if (e == cudaSuccess && n == 0) *why = "no CUDA device";
  return e == cudaSuccess && n > 0;
}

}  // namespace qf::kern::test

#define QF_REQUIRE_GPU()                                          \
  do {                                                            \
    std::string why_;                                             \
    if (!::qf::kern::test::have_gpu(&why_)) GTEST_SKIP() << why_; \
  } while (0)
