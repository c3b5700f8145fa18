// Host twins of gemm (gemm.h: each entry through gemv_ref / gemv_swiglu_ref with its matrix)
// and of gemm_route (a counting sort).
#include "qf/kern/gemm.h"

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <vector>

namespace qf::kern {

void gemm_ref(const DeviceLinear& w, const float* x, float* y, const GemmRows& r, bool swiglu) {
  for (int j = 0; j < r.n_mats; ++j) {
    const int lo = r.offsets ? r.offsets[j] : 0;
    const int hi = r.offsets ? std::min(r.offsets[j + 1], r.entries) : r.entries;
    for (int e = lo; e < hi; ++e) {
      const float* xe = x + static_cast<size_t>(r.x_rows ? r.x_rows[e] : e) * r.ldx;
      float* ye = y + static_cast<size_t>(r.y_rows ? r.y_rows[e] : e) * r.ldy;
      if (swiglu) {
        gemv_swiglu_ref(w, xe, ye, GemvBatch{}, &j);
      } else {
        gemv_ref(w, xe, ye, GemvBatch{}, &j);
      }
    }
  }
}

void gemm_route_ref(const int* ids, int n, int per_x, int n_mats, int* offsets, int* x_rows,
                    int* y_rows) {
  std::vector<int> next(static_cast<size_t>(n_mats) + 1, 0);
  for (int i = 0; i < n; ++i) {
    if (ids[i] >= 0 && ids[i] < n_mats) ++next[static_cast<size_t>(ids[i]) + 1];
  }
  std::partial_sum(next.begin(), next.end(), next.begin());
  std::copy(next.begin(), next.end(), offsets);
  for (int i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= n_mats) continue;
    const int e = next[static_cast<size_t>(ids[i])]++;
    x_rows[e] = i / per_x;
    y_rows[e] = i;
  }
}

}  // namespace qf::kern
