// The small per-token operations of the decode step (fp32): embedding lookup, the zero-centred
// RMSNorm, SwiGLU, the MoE router (softmax over all experts -> top-k -> renormalize), the MoE
// combine with the shared expert's sigmoid gate, and argmax. Token ids and positions live on
// the device so a captured graph serves every step. Formulas: qwen35-architecture.md §3-§5.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace qf::kern {

enum class FloatKind { kBf16, kF32 };

// out[0..h) = row *token of the [V, h] table (BF16 or F32).
cudaError_t embed(FloatKind kind, const void* table, int h, const int* token, float* out,
                  cudaStream_t stream);

// out = x * rsqrt(mean(x^2) + eps) * (1 + w), for `rows` consecutive rows of length n.
cudaError_t rms_norm_1p(const float* x, const float* w, int n, int rows, float eps, float* out,
                        cudaStream_t stream);

// x += y (the residual add), then out = rms_norm_1p(x): one row of length n. Deterministic:
// the sum of squares is added in the order of one 1024-thread block (ops.cu). PDL: for
// n <= 4096 it loads w and x before waiting for the kernel launched just before it (pdl.cuh), so
// no kernel that may still run when this one is launched (the one just before it on the stream,
// or one joined to it by an event) may write them; in the decode step x is written several
// launches earlier.
cudaError_t add_rms_norm_1p(float* x, const float* y, const float* w, int n, float eps, float* out,
                            cudaStream_t stream);
// The same with y in n_parts (1 .. kMaxNormParts) parts part_stride floats apart (a K-split
// product, gemv.h GemvBatch::k_splits): x += ((y_0 + y_1) + y_2) ..., then the norm.
inline constexpr int kMaxNormParts = 8;
// rows > 1: as many rows in one launch, x and out rows n floats apart, y's y_row_stride apart.
cudaError_t add_parts_rms_norm_1p(float* x, const float* y, int n_parts, size_t part_stride,
                                  const float* w, int n, float eps, float* out, cudaStream_t stream,
                                  int rows = 1, size_t y_row_stride = 0);

// out[i] = silu(gate[i]) * up[i] for i < n, where gate/up rows are `stride` floats apart over
// `rows` rows (out is dense [rows, n]).
cudaError_t swiglu(const float* gate, const float* up, int n, int rows, size_t stride, float* out,
                   cudaStream_t stream);

// Router: p = softmax(logits[0..e)); the k largest (lowest index first among equals) with
// weights p / sum of the chosen. ids[k], weights[k] on the device. 1 <= k <= e <= 1024,
// k <= 32 (else cudaErrorInvalidValue).
// rows > 1: as many rows in one launch, logits rows row_stride floats apart, ids and weights k.
cudaError_t router_topk(const float* logits, int e, int k, int* ids, float* weights,
                        cudaStream_t stream, int rows = 1, size_t row_stride = 0);

// x[i] += sum_j weights[j] * y[j * h + i] + sigmoid(*shared_gate) * shared[i] (the MoE output:
// k routed experts and the gated shared expert, added to the residual stream; shared_gate
// nullptr: shared is gated already, sigmoid(*shared_gate) reads as 1), then
// out = rms_norm_1p(x; w): the next layer's input norm (or the final norm). Deterministic, as
// add_rms_norm_1p. PDL: for h <= 4096 and k <= 16 it loads w, x, weights and *shared_gate
// before waiting, under the same condition as add_rms_norm_1p (in the decode step, the kernels
// still running are the two down projections, of the routed and of the shared expert).
// rows > 1: as many tokens in one launch, y rows k * h floats apart, weights k, shared, x and
// out h, shared_gate gate_row_stride.
cudaError_t moe_combine_norm(const float* y, const float* weights, int k, const float* shared,
                             const float* shared_gate, int h, float* x, const float* w, float eps,
                             float* out, cudaStream_t stream, int rows = 1,
                             size_t gate_row_stride = 0);

// *out = the first index of the maximum of logits[0..n); scratch: argmax_scratch_ints(n) ints.
cudaError_t argmax(const float* logits, int n, int* out, int* scratch, cudaStream_t stream);
int argmax_scratch_ints(int n);

// *dst = *src; *pos += 1: the step's epilogue (next token in, one position on).
cudaError_t advance(const int* src, int* dst, int* pos, cudaStream_t stream);

// Synthetic weights: words[i] = (hash(seed, i) & mask) | bits, over n 32-bit words.
cudaError_t fill_random_words(uint32_t* words, size_t n, uint64_t seed, uint32_t mask,
                              uint32_t bits, cudaStream_t stream);

// Host twins on host pointers (token, ids and positions as host values).
void embed_ref(FloatKind kind, const void* table, int h, int token, float* out);
void rms_norm_1p_ref(const float* x, const float* w, int n, int rows, float eps, float* out);
void swiglu_ref(const float* gate, const float* up, int n, int rows, size_t stride, float* out);
void router_topk_ref(const float* logits, int e, int k, int* ids, float* weights);
void moe_combine_ref(const float* y, const float* weights, int k, const float* shared,
                     float shared_gate, int h, float* x);
int argmax_ref(const float* logits, int n);

}  // namespace qf::kern
