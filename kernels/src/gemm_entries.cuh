// The entries one matrix of a kern::gemm launch takes (gemm.h's GemmRows): grouped, offsets[mat]
// .. offsets[mat + 1] - 1 (none past rows.entries); dense, every entry. Internal to kernels/src.
#pragma once

#include <cuda_runtime.h>

#include "qf/kern/gemm.h"

namespace qf::kern::gemv_detail {

struct EntryRange {
  int lo, hi;  // entries lo .. hi - 1
};

__device__ __forceinline__ EntryRange matrix_entries(const GemmRows& r, int mat) {
  const int lo = r.offsets ? __ldg(r.offsets + mat) : 0;
  const int hi = r.offsets ? min(__ldg(r.offsets + mat + 1), r.entries) : r.entries;
  return {lo, hi};
}

}  // namespace qf::kern::gemv_detail
