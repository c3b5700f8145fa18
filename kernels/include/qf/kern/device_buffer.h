// DeviceBuffer<T>: the single owner of one cudaMalloc allocation; move-only, freed on
// destruction, so a failing test or an early return never leaks device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "qf/kern/cuda_check.h"

namespace qf::kern {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n > 0) QF_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)));
  }
  // Takes ownership of an allocation made elsewhere (e.g. a cudaMalloc whose failure the caller
  // reports as an error instead of aborting).
  static DeviceBuffer adopt(T* p, size_t n) {
    DeviceBuffer b;
    b.p_ = p;
    b.n_ = n;
    return b;
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  void reset() {
    if (p_) cudaFree(p_);  // no check: destructors must not abort during unwinding
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace qf::kern
