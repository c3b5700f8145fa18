#include "qf/quant/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace qf::quant {

ErrorStats error_stats(const float* ref, const float* got, int64_t n) {
  ErrorStats s;
  s.n = n;
  double sum_abs = 0, sum_sq_err = 0, sum_sq_ref = 0, sum_sq_got = 0, dot = 0;
  int64_t used = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double r = ref[i], g = got[i];
    if (!std::isfinite(r) || !std::isfinite(g)) {
      ++s.n_nonfinite;
      continue;
    }
    const double d = g - r;
    s.max_abs = std::max(s.max_abs, std::fabs(d));
    sum_abs += std::fabs(d);
    sum_sq_err += d * d;
    sum_sq_ref += r * r;
    sum_sq_got += g * g;
    dot += r * g;
    ++used;
  }
  if (used == 0) return s;
  s.mean_abs = sum_abs / static_cast<double>(used);
  s.rmse = std::sqrt(sum_sq_err / static_cast<double>(used));
  s.nmse = sum_sq_ref > 0 ? sum_sq_err / sum_sq_ref : (sum_sq_err > 0 ? 1.0 : 0.0);
  if (sum_sq_ref > 0 && sum_sq_got > 0) {
    s.cosine = dot / std::sqrt(sum_sq_ref * sum_sq_got);
  } else {
    s.cosine = sum_sq_ref == sum_sq_got ? 1.0 : 0.0;
  }
  s.snr_db = sum_sq_err > 0 ? 10.0 * std::log10(sum_sq_ref / sum_sq_err)
                            : std::numeric_limits<double>::infinity();
  return s;
}

namespace {

std::vector<int64_t> topk_indices(const float* x, int64_t n, int k) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int64_t a, int64_t b) { return x[a] != x[b] ? x[a] > x[b] : a < b; });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

}  // namespace

TopKAgreement topk_agreement(const float* ref, const float* got, int64_t n, int k) {
  k = static_cast<int>(std::clamp<int64_t>(k, 1, n));
  std::vector<int64_t> a = topk_indices(ref, n, k), b = topk_indices(got, n, k);
  TopKAgreement t;
  t.top1_equal = a[0] == b[0];
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::vector<int64_t> common;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
  t.overlap = static_cast<double>(common.size()) / k;
  return t;
}

}  // namespace qf::quant
