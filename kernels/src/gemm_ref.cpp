// Host twin of gemm (gemm.h): each entry through gemv_ref / gemv_swiglu_ref with its matrix.
#include "qf/kern/gemm.h"

#include <algorithm>
#include <cstddef>

namespace qf::kern {

void gemm_ref(const DeviceLinear& w, const float* x, float* y, const GemmRows& r, bool swiglu) {
  for (int j = 0; j < r.n_mats; ++j) {
    const int lo = r.offsets ? r.offsets[j] : 0;
    const int hi = r.offsets ? std::min(r.offsets[j + 1], r.entries) : r.entries;
    for (int e = lo; e < hi; ++e) {
      const float* xe = x + static_cast<size_t>(r.x_rows ? r.x_rows[e] : e) * r.ldx;
      float* ye = y + static_cast<size_t>(e) * r.ldy;
      if (swiglu) {
        gemv_swiglu_ref(w, xe, ye, GemvBatch{}, &j);
      } else {
        gemv_ref(w, xe, ye, GemvBatch{}, &j);
      }
    }
  }
}

}  // namespace qf::kern
