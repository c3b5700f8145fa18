// The INT8 LM head of a decode step: logits of up to kLmHeadMaxRows hidden vectors from one pass
// over the weights, with the per-row top-k (argmax: k = 1) fused into the same launch.
//
// Weights: a kInt8 DeviceLinear in the kernel layout of gemv.h ([N, K/4] u32 words, byte j of
// word p = column 4p + j; scales [N, G] f16, zeros [N, G] u8), one matrix (strides ignored).
// Each weight is (code - zero) * scale, exactly as gemv's INT8 path forms it (exact in f32), and
// the products are summed in fp32 with fma, so logits equal gemv's up to summation order.
//
// Top-k order: by logit, larger first; equal logits by index, lower first (argmax: the first
// maximum, as kern::argmax). NaN logits are never selected. ids[b * k + j] is row b's j-th best
// (top_logits the same place: its logit); k <= N.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "qf/kern/gemv.h"

namespace qf::kern {

inline constexpr int kLmHeadMaxRows = 4;  // hidden vectors per launch
inline constexpr int kLmHeadMaxTopK = 8;  // candidates per row

// Bytes of the scratch lm_head needs (a fixed size: per-block candidates and the launch ticket).
size_t lm_head_scratch_bytes();

// Whether lm_head takes `w`: kInt8, K % 4 == 0, groups a multiple of 4 columns (or one per row),
// x of K floats fitting in shared memory for n_rows rows (K <= 12288 at 4 rows on sm_90),
// fewer than 2^32 words. Rows of whole 16-byte chunks (K % 16 == 0, 16-byte aligned w) with
// groups of a power-of-two number of 16 columns (or one per row) take the fast path; others a
// path of 4-byte loads (same results, a fraction of the bandwidth).
bool lm_head_ok(const DeviceLinear& w, int n_rows);

// For b < n_rows: logits[b * N + r] = row r of W . x[b * K ..] (logits may be nullptr: not
// written), and the top `top_k` (1 .. kLmHeadMaxTopK) of row b's logits into ids (and
// top_logits unless nullptr), [n_rows, top_k] each. x: [n_rows, K] fp32 contiguous.
// scratch: lm_head_scratch_bytes() bytes, 16-byte aligned, zero-filled once before its first
// use; each launch leaves it zeroed where it matters (the ticket), so a captured graph replays
// the launch. One launch at a time per scratch. Device pointers; stream-ordered, allocates
// nothing. Launched with PDL (pdl.cuh): weight loads are issued before the wait for the previous
// kernel. cudaErrorInvalidValue on bad arguments, cudaErrorNotSupported where !lm_head_ok.
cudaError_t lm_head(const DeviceLinear& w, const float* x, int n_rows, int top_k, float* logits,
                    int* ids, float* top_logits, void* scratch, cudaStream_t stream);

// Host twin on host copies of the arrays: logits (required here) from gemv_ref's exact sums,
// rounded once to f32, then lm_head_topk_ref per row.
void lm_head_ref(const DeviceLinear& w, const float* x, int n_rows, int top_k, float* logits,
                 int* ids, float* top_logits);

// The top `k` of logits[0 .. n) in the order above (ids and, unless nullptr, their logits).
void lm_head_topk_ref(const float* logits, int n, int k, int* ids, float* top_logits);

}  // namespace qf::kern
