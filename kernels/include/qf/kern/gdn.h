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

// A verify's deferred state (speculative decoding, kernel-anchors §3.4): instead of the state
// after each token, a deferring launch leaves the state as it was before its tokens and writes
// each token's update: k^ [Nk * dk] (the l2-normed k), delta [Nv * dv] (beta (v - S^T k) per
// column, S decayed) and alpha [Nv] (gdn_replay_entry_floats). The tokens that were kept are
// folded into the state by the next gdn_decode_tokens launch with the replay, or by gdn_fold
// (before a gdn_decode step, a batched prefill or a copy of the state): per token S <- alpha S,
// then S += k^ delta^T, the operations the token's own update made, so the state is bit for bit the
// one steps would have left; a rejected token is one not folded, and rolling back copies nothing.
//   buf: [2][kGdnMaxTokens][gdn_replay_entry_floats] (null: no replay; the launch writes the
//   state after its last token, and nothing is folded). word (device): {count, parity}: fold
//   the first `count` (0 .. kGdnMaxTokens) entries of buffer `parity`, and a deferring launch
//   writes its tokens' entries into buffer 1 - parity (so a verify after a verify reads the one
//   while it writes the other). The caller flips the parity after a deferring launch.
//   defer: write the entries and the state with the fold applied (where count > 0), not the
//   tokens' states.
struct GdnReplay {
  float* buf = nullptr;
  const int* word = nullptr;
  bool defer = false;
};
size_t gdn_replay_entry_floats(const GdnShape& shape);

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
// (the in_proj's rows), its output at t * ld_out; the state read once (and the replay's kept
// tokens folded into it), kept in registers across the tokens, written after the last, or with
// replay.defer as GdnReplay says. As gdn_decode otherwise (shapes, early loads: the replay's
// entries and word too). One token without a replay runs gdn_decode's instance; the
// several-token one holds the replay's registers. n outside 1..kGdnMaxTokens:
// cudaErrorInvalidValue.
cudaError_t gdn_decode_tokens(const GdnShape& shape, const GdnParams& p, const float* qkv,
                              const float* z, const float* b, const float* a, size_t ld, int n,
                              const int* pos, GdnState state, GdnReplay replay, float* out,
                              size_t ld_out, cudaStream_t stream);
// The replay's kept tokens folded into state.ssm alone (before anything else reads the state:
// batched prefill, a copy). replay.defer is ignored. Plain launch.
cudaError_t gdn_fold(const GdnShape& shape, GdnReplay replay, float* ssm, cudaStream_t stream);
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
