// Helpers for the token-mixer kernel tests (gdn_test, attention_test; lm_head_test takes its
// host/device copies and Rng, gemv_check.h its Rng): GPU presence, host/device copies, seeded
// random data and the tolerance check.
//
// Tolerance model. The kernels and their _ref twins evaluate the same fp32 formulas; they differ
// only in summation order (trees vs sequential loops), FMA contraction and last-ulp libm results.
// Each such difference is a few units of fp32 rounding (u = 2^-24 = 6e-8) times the magnitude of
// the terms being summed, grown by at most the reduction length (128..4096 here). So the error is
// measured against `scale`, the rms of the quantity the terms are made of (named per call), and
// must satisfy rms(err) <= rel * scale (norm-wise) and max|err| <= 8 * rel * scale
// (elementwise: 8 sigma of a norm-wise-sized error; a single wrong element of ordinary size
// fails it). Every element must be finite.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "qf/kern/device_buffer.h"

namespace qf::kern::test {

template <class T>
DeviceBuffer<T> upload(const std::vector<T>& v) {
  DeviceBuffer<T> d(v.size());
  if (!v.empty()) {
    QF_CUDA_CHECK(cudaMemcpy(d.data(), v.data(), d.bytes(), cudaMemcpyHostToDevice));
  }
  return d;
}

template <class T>
void upload_to(const std::vector<T>& v, const DeviceBuffer<T>& d) {
  ASSERT_EQ(v.size(), d.size());
  if (!v.empty()) {
    QF_CUDA_CHECK(cudaMemcpy(d.data(), v.data(), d.bytes(), cudaMemcpyHostToDevice));
  }
}

template <class T>
std::vector<T> download(const DeviceBuffer<T>& d, size_t n = SIZE_MAX, size_t first = 0) {
  if (n == SIZE_MAX) n = d.size() - first;
  std::vector<T> v(n);
  if (n > 0) {
    QF_CUDA_CHECK(cudaMemcpy(v.data(), d.data() + first, n * sizeof(T), cudaMemcpyDeviceToHost));
  }
  return v;
}

// Seeded uniform data where the tests must draw exactly the same values on every platform
// (splitmix64; std:: distributions are implementation-defined): gemv_test, lm_head_test.
struct Rng {
  uint64_t s;
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) {  // [lo, hi)
    return lo + (hi - lo) * static_cast<float>(next() >> 40) * 0x1p-24f;
  }
  uint32_t below(uint32_t n) { return static_cast<uint32_t>(next() % n); }
};

inline std::vector<float> randn(size_t n, std::mt19937_64& g, float scale = 1.0f,
                                float mean = 0.0f) {
  std::normal_distribution<float> d(mean, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

inline double rms(const float* x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return n ? std::sqrt(s / static_cast<double>(n)) : 0.0;
}
inline double rms(const std::vector<float>& x) {
  return rms(x.data(), x.size());
}

// Checks `got` against `want` (see the tolerance model above); prints the observed ratios so a
// run on the device records how much margin is left.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                         double scale, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_GT(scale, 0.0) << what;
  double sum_sq = 0, worst = 0;
  size_t worst_i = 0, n_bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++n_bad;
      continue;
    }
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
    sum_sq += e * e;
    if (e > worst) worst = e, worst_i = i;
  }
  const double rms_err = std::sqrt(sum_sq / static_cast<double>(got.size()));
  EXPECT_EQ(n_bad, 0u) << what << ": non-finite outputs";
  EXPECT_LE(rms_err, rel * scale) << what << ": rms error / scale = " << rms_err / scale;
  EXPECT_LE(worst, 8 * rel * scale) << what << ": element " << worst_i << " got " << got[worst_i]
                                    << " want " << want[worst_i] << ", scale " << scale;
  std::printf("  %-28s rms err/scale %.2e  max err/scale %.2e  (limits %.0e, %.0e)\n", what.c_str(),
              rms_err / scale, worst / scale, rel, 8 * rel);
}

}  // namespace qf::kern::test
