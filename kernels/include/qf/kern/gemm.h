// Products of many rows of x at once (prompt prefill): each weight is read once for all the
// rows that use its matrix, where gemv reads it once per row. INT4 kernel layout (gemv.h) on the
// integer tensor cores, x in the same 8-bit limbs as the INT4 gemv (gemv_int4.cu states the
// numerics), two rows per mma: a row's result differs from gemv's only in the order its
// 128-column segments are added.
//
// Entries: y has `entries` rows; entry e reads row x_rows[e] of x (nullptr: row e) and writes
// row e of y. Grouped (experts): entries offsets[j] .. offsets[j + 1] - 1 use matrix j of the
// stack (w_stride apart, gemv.h), for j < n_mats; dense: offsets nullptr, every entry matrix 0.
// The offsets are read on the device, so a router's counts need no host sync.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "qf/kern/gemv.h"

namespace qf::kern {

struct GemmRows {
  int entries = 0;  // rows of y (grouped: offsets[n_mats] <= entries, rows past it untouched)
  int x_count = 0;  // rows of x
  size_t ldx = 0, ldy = 0;       // floats between rows (ldx >= k; ldy >= n, n / 2 with swiglu)
  const int* x_rows = nullptr;   // device [entries] (nullptr: entry e reads row e)
  int n_mats = 1;                // grouped: matrices of the stack
  const int* offsets = nullptr;  // device [n_mats + 1], nondecreasing from 0 (nullptr: dense)
};

// Whether gemm takes `w`: kInt4 in the tiled layout (K a multiple of 128, <= kInt4TileMaxK),
// 16-byte aligned rows and matrices, groups a power-of-two multiple of 128 columns or one per
// row; with swiglu also gemv_swiglu's paired rows (n a multiple of 16).
bool gemm_ok(const DeviceLinear& w, bool swiglu);
// Device scratch gemm needs: x's rows as limbs.
size_t gemm_scratch_bytes(const DeviceLinear& w, const GemmRows& rows);
// y[e] = W x[x_rows[e]] for every entry; swiglu: w in gemv_swiglu's paired row order, y[e][j] =
// silu(gate_j) * up_j (n / 2 values), bit for bit swiglu of the rows gemm would write. Device
// pointers; stream-ordered, allocates nothing, graph-capturable. cudaErrorNotSupported where
// !gemm_ok, cudaErrorInvalidValue for bad rows.
cudaError_t gemm(const DeviceLinear& w, const float* x, float* y, const GemmRows& rows, bool swiglu,
                 void* scratch, cudaStream_t stream);
// Host twin on host arrays (offsets and x_rows host pointers): gemv_ref / gemv_swiglu_ref of each
// entry.
void gemm_ref(const DeviceLinear& w, const float* x, float* y, const GemmRows& rows, bool swiglu);

}  // namespace qf::kern
