// CPU twin of topk.cu: a partial sort in topk.h's order (lm_head_topk_ref's) and the
// normalizer summed in double.
#include <cmath>

#include "qf/kern/lm_head.h"
#include "qf/kern/topk.h"

namespace qf::kern {

void logits_topk_ref(const float* logits, int n, int k, int* ids, float* vals, double* stats) {
  lm_head_topk_ref(logits, n, k, ids, vals);
  double m = -INFINITY, sum = 0;
  for (int i = 0; i < n; ++i) {
    if (!std::isnan(logits[i])) m = std::max(m, static_cast<double>(logits[i]));
  }
  for (int i = 0; i < n; ++i) {
    if (!std::isnan(logits[i]) && logits[i] != -INFINITY) sum += std::exp(logits[i] - m);
  }
  stats[0] = m;
  stats[1] = sum;
}

void logits_pick_ref(const float* logits, int n, size_t ld, const int* ids, int rows, float* out) {
  for (int r = 0; r < rows; ++r) {
    out[r] = ids[r] >= 0 && ids[r] < n ? logits[static_cast<size_t>(r) * ld + ids[r]] : NAN;
  }
}

}  // namespace qf::kern
