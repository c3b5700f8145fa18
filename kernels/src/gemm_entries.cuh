// How the GEMM kernels (gemm_int4.cu, gemm_int8.cu, gemm_fp8.cu, gemm_bf16.cu) share out a
// launch's entries (gemm.h's GemmRows). Internal to kernels/src.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "qf/kern/gemm.h"

namespace qf::kern::gemv_detail {

// The passes of a tile range (pass entries each) spread over this many blocks, adjacent in
// blockIdx.x so that they run together and read the tiles' weights from DRAM about once. Dense:
// up to 64; grouped: a matrix has at most x_count entries where every row of x picks distinct
// matrices (gemm_route), and up to 4 (the blocks past a matrix's entries exit at once).
inline int pass_blocks(const GemmRows& r, int pass) {
  const int most = r.offsets ? std::min(r.entries, r.x_count) : r.entries;
  return std::clamp((most + pass - 1) / pass, 1, r.offsets ? 4 : 64);
}

// The entries one matrix of a launch takes: grouped, offsets[mat] .. offsets[mat + 1] - 1 (none
// past rows.entries); dense, every entry.
struct EntryRange {
  int lo, hi;  // entries lo .. hi - 1
};

__device__ __forceinline__ EntryRange matrix_entries(const GemmRows& r, int mat) {
  const int lo = r.offsets ? __ldg(r.offsets + mat) : 0;
  const int hi = r.offsets ? min(__ldg(r.offsets + mat + 1), r.entries) : r.entries;
  return {lo, hi};
}

}  // namespace qf::kern::gemv_detail
