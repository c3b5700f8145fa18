// Gated DeltaNet decode (one token, one layer), shared/docs/qwen35-architecture.md §3.3:
// causal depthwise conv over the last Kc pre-conv inputs (state keeps Kc - 1 of them) + SiLU,
// l2-normed q (x 1/sqrt(dk)) and k per key head, beta = sigmoid(b),
// g = -exp(A_log) * softplus(a + dt_bias) (threshold 20), then per value head j (key head j / r):
// S <- exp(g) S; delta = beta (v - S^T k); S <- S + k delta^T; o = S^T q; and the gated RMSNorm
// o * rsqrt(mean(o^2) + eps) * norm_w * silu(z). fp32 throughout, state fp32.
#pragma once

#include <cuda_runtime.h>

namespace qf::kern {

struct GdnShape {
  int n_k_heads = 0, n_v_heads = 0, dk = 0, dv = 0, kc = 4;
  float eps = 1e-6f;
  int conv_dim() const { return 2 * n_k_heads * dk + n_v_heads * dv; }
};

struct GdnParams {
  const float* conv_w = nullptr;   // [conv_dim, kc]
  const float* dt_bias = nullptr;  // [Nv]
  const float* a_log = nullptr;    // [Nv]
  const float* norm_w = nullptr;   // [dv], plain weight
};

// Tokens one gdn_decode_tokens launch takes (speculative decoding's verify: a token and two
// drafts).
constexpr int kGdnMaxTokens = 3;

struct GdnState {
  // gdn_decode: a ring of the last inputs, [gdn_conv_ring(shape), conv_dim], the inputs at
  // position q in slot q mod gdn_conv_ring(shape) (a warp's channels side by side): the step at
  // position p reads the slots of p - kc + 1 .. p - 1 and writes that of p. The ring has
  // kGdnMaxTokens slots past the kc - 1 read, so tokens p .. p + kGdnMaxTokens - 1 of one launch
  // write none of the slots it reads, and after a verify of n tokens the history at every position
  // p + 1 .. p + n is still there (rolling back needs no copy of it). Zeros: no history (position
  // 0). gdn_decode_ref: one copy [conv_dim, kc - 1], oldest first, updated in place.
  float* conv = nullptr;
  float* ssm = nullptr;  // [Nv, dk, dv]  (S[j][d][e])
};

// The verify's rollback points: ssm[t] (may be null: not kept) receives the state after token t
// of a gdn_decode_tokens launch, for t < n - 1.
struct GdnSaved {
  float* ssm[kGdnMaxTokens - 1] = {};
};

// qkv: [conv_dim]; z: [Nv * dv]; b, a: [Nv]; pos: the token's position (device); out:
// [Nv * dv]. Device pointers; stream-ordered, allocates nothing, no host sync, so a captured
// graph replays it. One PDL launch (pdl.cuh): one block per (value head, column tile), the
// tiles of a head forming a thread-block cluster that shares the gated RMSNorm's sum of squares
// (summed in tile order: deterministic); each block computes the conv of the channels it needs.
// Early loads (pdl.cuh, (b)): *pos and state.ssm are loaded before the PDL wait; so the kernel
// launched just before gdn_decode on the stream may write qkv, z, b, a (the in_proj GEMV does),
// but not pos or the states.
// Shapes: Nv a multiple of Nk; 1 <= kc <= 8; dk, dv <= 1024 and dk <= 16 * 1024 / tile, where
// tile = min(32, dv rounded up to a power of two), doubled while ceil(dv / tile) > 8 (dk <= 512
// at 16 < dv <= 256), and 2 dk + tile <= 2 * tile * groups (the block's threads, two conv
// channels each; every Qwen3.5 shape and dk <= 512 at dv >= 32); otherwise
// cudaErrorInvalidValue. Sums of squares accumulate in double, as the CPU engine does.
cudaError_t gdn_decode(const GdnShape& shape, const GdnParams& p, const float* qkv, const float* z,
                       const float* b, const float* a, const int* pos, GdnState state, float* out,
                       cudaStream_t stream);
// n consecutive tokens (1 <= n <= kGdnMaxTokens) at positions *pos .. *pos + n - 1 in one
// launch, bit for bit n gdn_decode calls: token t's qkv, z, b and a at t * ld of their pointers
// (the in_proj's rows), its output at t * ld_out; the state read once, kept in registers across
// the tokens, written after the last (and after token t to saved.ssm[t] where not null). As
// gdn_decode otherwise (shapes, early loads). n outside 1..kGdnMaxTokens: cudaErrorInvalidValue.
cudaError_t gdn_decode_tokens(const GdnShape& shape, const GdnParams& p, const float* qkv,
                              const float* z, const float* b, const float* a, size_t ld, int n,
                              const int* pos, GdnState state, GdnSaved saved, float* out,
                              size_t ld_out, cudaStream_t stream);
// The ring's slots (kc - 1 + kGdnMaxTokens), and GdnState::conv's floats.
int gdn_conv_ring(const GdnShape& shape);
size_t gdn_conv_state_floats(const GdnShape& shape);

// Gated DeltaNet over n consecutive tokens of one layer (batched prefill), at positions *pos to
// *pos + n - 1: bit for bit n gdn_decode calls (the same arithmetic in the same order per token),
// in four launches: the conv + SiLU + l2 norms of every token (a block per token and key head),
// the recurrence (a block per head and column tile as gdn_decode's, its state in registers
// across the tokens: read and written once), the gated RMSNorm of every token, and the last
// kc - 1 inputs into the conv ring. Token t's qkv, z, b and a are at t * ld of their pointers (the
// in_proj's rows), its output at t * ld_out. scratch: gdn_prefill_scratch_floats(shape, n) floats.
// Plain launches (no early loads): each waits for the work before it. Shapes: gdn_decode's with
// blocks of at most 256 threads (gdn_prefill_ok; every Qwen3.5 shape), else cudaErrorInvalidValue.
bool gdn_prefill_ok(const GdnShape& shape);
size_t gdn_prefill_scratch_floats(const GdnShape& shape, int n);
cudaError_t gdn_prefill(const GdnShape& shape, const GdnParams& p, const float* qkv, const float* z,
                        const float* b, const float* a, size_t ld, int n, const int* pos,
                        GdnState state, float* out, size_t ld_out, float* scratch,
                        cudaStream_t stream);

// Host twin on host pointers (the same arithmetic as the CPU engine), its conv state one copy.
void gdn_decode_ref(const GdnShape& shape, const GdnParams& p, const float* qkv, const float* z,
                    const float* b, const float* a, GdnState state, float* out);

}  // namespace qf::kern
