#include "qf/quant/matrix.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "qf/error.h"
#include "qf/quant/formats.h"

namespace qf::quant {

MatrixView::MatrixView(const void* d, ckpt::DType t, int64_t r, int64_t c)
    : data(d), dtype(t), rows(r), cols(c) {
  if (t != ckpt::DType::kBF16 && t != ckpt::DType::kF16 && t != ckpt::DType::kF32) {
    throw Error(Errc::kUnsupported, "quantizers read BF16, F16 or F32 weights, not " +
                                        std::string(ckpt::dtype_name(t)));
  }
}

float MatrixView::at(int64_t r, int64_t c) const {
  const int64_t i = r * cols + c;
  switch (dtype) {
    case ckpt::DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case ckpt::DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    default:
      return static_cast<const float*>(data)[i];
  }
}

void MatrixView::row_range(int64_t r, int64_t c0, int64_t n, float* out) const {
  const int64_t base = r * cols + c0;
  switch (dtype) {
    case ckpt::DType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(data) + base;
      for (int64_t c = 0; c < n; ++c) out[c] = bf16_to_f32(p[c]);
      return;
    }
    case ckpt::DType::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(data) + base;
      for (int64_t c = 0; c < n; ++c) out[c] = f16_to_f32(p[c]);
      return;
    }
    default:
      std::memcpy(out, static_cast<const float*>(data) + base, static_cast<size_t>(n) * 4);
  }
}

float max_abs(const float* x, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      const float a = std::fabs(x[i + j]);
      lane[j] = a > lane[j] ? a : lane[j];
    }
  }
  for (; i < n; ++i) lane[0] = std::max(lane[0], std::fabs(x[i]));
  float m = 0.0f;
  for (float l : lane) m = std::max(m, l);
  return m;
}

void parallel_for(int64_t n, int threads, int64_t align,
                  const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  align = std::max<int64_t>(1, align);
  const int64_t units = (n + align - 1) / align;
  threads = static_cast<int>(std::min<int64_t>(threads, units));
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  std::mutex mu;
  std::exception_ptr err;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    const int64_t b = std::min(n, units * t / threads * align);
    const int64_t e = std::min(n, units * (t + 1) / threads * align);
    pool.emplace_back([&, b, e] {
      try {
        if (b < e) fn(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!err) err = std::current_exception();
      }
    });
  }
  for (std::thread& th : pool) th.join();
  if (err) std::rethrow_exception(err);
}

}  // namespace qf::quant
