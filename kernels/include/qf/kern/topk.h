// The k most likely ids of a row of logits (k <= kTopKMax) and the row's softmax normalizer, so
// that a host sampler with top-k <= k, and logprobs of up to k alternatives, need k ids and
// logits from the device instead of the whole row (248320 floats on Qwen3.5).
//
// Order: by logit, larger first; equal logits by index, lower first (lm_head.h's order, that of
// the host's top_k_ids). NaN logits are never selected; where fewer than k logits are not NaN,
// the remaining entries are (INT_MAX, -inf).
// Normalizer: stats[0] = the largest logit m (NaN ignored), stats[1] = the sum over the logits
// that are neither NaN nor -inf of exp(l - m), in fp32; the row's log-softmax is
// l - m - log(stats[1]). Meant for finite logits and -inf (masked ids).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace qf::kern {

inline constexpr int kTopKMax = 128;
inline constexpr int kTopKMaxN = 524288;  // the longest row

// Bytes of the scratch logits_topk needs for a row of n logits.
size_t logits_topk_scratch_bytes(int n);

// ids[0, k), vals[0, k) and stats[0, 2) of logits[0, n) as above, 1 <= k <= kTopKMax,
// 1 <= n <= kTopKMaxN.
// scratch: logits_topk_scratch_bytes(n) bytes, 16-byte aligned, zero-filled once before its
// first use (a launch leaves it ready for the next, so a captured graph replays the launch); one
// launch at a time per scratch. Device pointers; stream-ordered, allocates nothing.
// cudaErrorInvalidValue on bad arguments.
cudaError_t logits_topk(const float* logits, int n, int k, int* ids, float* vals, float* stats,
                        void* scratch, cudaStream_t stream);

// The same for `rows` rows in one launch (prompt scoring): row r's logits at logits + r * ld,
// its k ids, k vals and 2 stats at ids, vals and stats + r * out_stride elements (the caller
// keeps the rows' outputs apart), each row's results those of logits_topk on it alone.
// scratch: logits_topk_rows_scratch_bytes(n, rows) bytes, zero-filled once, as above.
// 1 <= rows <= 65535, and where rows > 1 ld >= n and out_stride >= 2; cudaErrorInvalidValue
// otherwise.
size_t logits_topk_rows_scratch_bytes(int n, int rows);
cudaError_t logits_topk_rows(const float* logits, int n, size_t ld, int rows, int k, int* ids,
                             float* vals, float* stats, size_t out_stride, void* scratch,
                             cudaStream_t stream);

// Host twin on host arrays; stats in double (the exact sum's rounding only).
void logits_topk_ref(const float* logits, int n, int k, int* ids, float* vals, double* stats);

// One logit of each of `rows` rows of n logits, ld floats apart (prompt scoring: each position's
// logit of the token that follows it): out[r] = logits[r * ld + ids[r]], NaN where ids[r] is
// outside [0, n). Device pointers; stream-ordered, allocates nothing. cudaErrorInvalidValue on
// bad arguments (rows < 0, n < 1, ld < n).
cudaError_t logits_pick(const float* logits, int n, size_t ld, const int* ids, int rows, float* out,
                        cudaStream_t stream);
void logits_pick_ref(const float* logits, int n, size_t ld, const int* ids, int rows, float* out);

}  // namespace qf::kern
