// CPU twin of lm_head.cu: each weight decoded with formats.h's scalar (scale * (code - zero), as
// gemv_ref does), the exact products summed in double and rounded once to f32 (the same bits as
// gemv_ref), each row of W decoded once for all rows of x; then the top-k of each row of x in
// lm_head.h's order.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "qf/kern/lm_head.h"
#include "qf/quant/formats.h"

namespace qf::kern {

void lm_head_topk_ref(const float* logits, int n, int k, int* ids, float* top_logits) {
  std::vector<int> order;
  order.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    if (!std::isnan(logits[i])) order.push_back(i);  // NaN is never selected
  }
  const auto before = [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const size_t m = std::min(order.size(), static_cast<size_t>(k));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(m), order.end(),
                    before);
  for (int j = 0; j < k; ++j) {  // fewer than k candidates: (INT_MAX, -inf), as the kernel
    const bool real = static_cast<size_t>(j) < m;
    ids[j] = real ? order[j] : INT_MAX;
    if (top_logits != nullptr) top_logits[j] = real ? logits[order[j]] : -INFINITY;
  }
}

void lm_head_ref(const DeviceLinear& w, const float* x, int n_rows, int top_k, float* logits,
                 int* ids, float* top_logits) {
  const int64_t n = w.n, k = w.k, n_groups = (k + w.group - 1) / w.group;
  const auto* words = static_cast<const uint32_t*>(w.w);
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < n_groups; ++g) {
      const int64_t gi = r * n_groups + g;
      uint16_t scale;
      std::memcpy(&scale, w.scales + gi, sizeof scale);
      const int64_t end = std::min<int64_t>(k, (g + 1) * w.group);
      for (int64_t c = g * w.group; c < end; ++c) {  // byte c % 4 of word c / 4 (gemv.h's kInt8)
        const uint32_t code = (words[r * (k / 4) + c / 4] >> (8 * (c % 4))) & 0xFFu;
        row[c] = quant::int4_dequant(code, w.zeros[gi], scale);  // any bit width
      }
    }
    for (int b = 0; b < n_rows; ++b) {
      const float* xb = x + static_cast<size_t>(b) * k;
      double sum = 0.0;
      for (int64_t c = 0; c < k; ++c) sum += static_cast<double>(row[c]) * xb[c];
      logits[static_cast<size_t>(b) * n + r] = static_cast<float>(sum);
    }
  }
  for (int b = 0; b < n_rows; ++b) {
    lm_head_topk_ref(logits + static_cast<size_t>(b) * w.n, w.n, top_k, ids + b * top_k,
                     top_logits != nullptr ? top_logits + b * top_k : nullptr);
  }
}

}  // namespace qf::kern
