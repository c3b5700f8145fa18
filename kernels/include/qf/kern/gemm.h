// Products of many rows of x at once (prompt prefill): each weight is read once for all the
// rows that use its matrix, where gemv reads it once per row. INT4 kernel layout (gemv.h) on the
// integer tensor cores, x in the same 8-bit limbs as the INT4 gemv (gemv_int4.cu states the
// numerics), two rows per mma: a row's result differs from gemv's only in the order its
// 128-column segments are added. FP8 (block-scaled E4M3, dense only: the shared expert) on the
// f16 tensor cores, x split per 128-column segment into two f16 limbs (gemm_fp8.cu states the
// numerics): within a few 2^-22 of the exact sums, not gemv's bits. INT8 (dense only: the LM
// head over a prompt's positions) on the integer tensor cores, x in the INT4 path's limbs
// (gemm_int8.cu): within gemv_test's bound of the exact sums, not gemv's bits. BF16 (dense or
// grouped: the router, the MTP head, BF16 checkpoints) on the bf16 tensor cores, x split into
// three bf16 limbs (gemm_bf16.cu: x to 2^-24), sums in f32: not gemv's bits.
//
// Entries: entry e reads row x_rows[e] of x (nullptr: row e) and writes row y_rows[e] of y
// (nullptr: row e). Grouped (experts): entries offsets[j] .. offsets[j + 1] - 1 use matrix j of
// the stack (w_stride apart, gemv.h), for j < n_mats; dense: offsets nullptr, every entry matrix
// 0. The offsets are read on the device, so a router's counts need no host sync; gemm_route
// sorts a router's choices into such entries.
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
  const int* y_rows = nullptr;   // device [entries] (nullptr: entry e writes row e)
  int n_mats = 1;                // grouped: matrices of the stack
  const int* offsets = nullptr;  // device [n_mats + 1], nondecreasing from 0 (nullptr: dense)
};

// Whether gemm takes `w`: kInt4 in the tiled layout (K a multiple of 128, <= kInt4TileMaxK),
// 16-byte aligned rows and matrices, groups a power-of-two multiple of 128 columns or one per
// row; with swiglu also gemv_swiglu's paired rows (n a multiple of 16). Or kFp8 without swiglu:
// K a multiple of 128, N of 16, 128 x 128 scale blocks, 16-byte aligned codes (gemm then takes
// no offsets: cudaErrorNotSupported). Or kInt8 without swiglu: K a multiple of 128 up to 10240,
// 16-byte aligned rows, groups as kInt4's (no offsets either). Or kBf16 without swiglu, dense or
// grouped: K a multiple of 8, 16-byte aligned matrices, N * K / 8 < 2^32.
bool gemm_ok(const DeviceLinear& w, bool swiglu);
// Device scratch gemm needs: x's rows as limbs (INT4, INT8: 8-bit, FP8: f16, BF16: bf16).
size_t gemm_scratch_bytes(const DeviceLinear& w, const GemmRows& rows);
// y[e] = W x[x_rows[e]] for every entry; swiglu: w in gemv_swiglu's paired row order, y[e][j] =
// silu(gate_j) * up_j (n / 2 values), bit for bit swiglu of the rows gemm would write. Device
// pointers; stream-ordered, allocates nothing, graph-capturable. cudaErrorNotSupported where
// !gemm_ok, cudaErrorInvalidValue for bad rows (or x_count * K / 4 >= 2^32).
cudaError_t gemm(const DeviceLinear& w, const float* x, float* y, const GemmRows& rows, bool swiglu,
                 void* scratch, cudaStream_t stream);
// Host twin on host arrays (offsets, x_rows and y_rows host pointers): gemv_ref /
// gemv_swiglu_ref of each entry.
void gemm_ref(const DeviceLinear& w, const float* x, float* y, const GemmRows& rows, bool swiglu);

// A router's choices as grouped entries: ids[i] (i < n, each in [0, n_mats)) is the matrix of
// choice i, made by row i / per_x of x (per_x choices per token). Writes offsets[0 .. n_mats]
// (choices per matrix, summed from 0) and, at entry e, the choice's row of x (x_rows[e] =
// i / per_x) and i itself (y_rows[e] = i), the choices of a matrix in order of i: so gemm with
// these offsets and x_rows writes matrix ids[i]'s product of row i / per_x at entry e, and a
// second gemm reading those entries (x_rows nullptr) with y_rows writes it to row i. An id
// outside [0, n_mats) gets no entry (offsets[n_mats] counts the rest). 1 <= n_mats <=
// kRouteMaxMats, n >= 0, per_x >= 1, else cudaErrorInvalidValue. One warp, deterministic,
// stream-ordered, allocates nothing.
inline constexpr int kRouteMaxMats = 1024;
cudaError_t gemm_route(const int* ids, int n, int per_x, int n_mats, int* offsets, int* x_rows,
                       int* y_rows, cudaStream_t stream);
void gemm_route_ref(const int* ids, int n, int per_x, int n_mats, int* offsets, int* x_rows,
                    int* y_rows);

}  // namespace qf::kern
