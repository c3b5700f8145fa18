// The CUDA decode engine: the same forward pass as CpuEngine (qwen35-architecture.md §3-§5) on
// the GPU, weights in the kernels' layouts, fp32 activations and state, the whole decode step
// (all layers, LM head, argmax) captured in one CUDA graph that reads the token and position on
// the device. No CUDA types here: tools include this header in builds without CUDA, where
// available() says why it cannot run.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "qf/ckpt/qwen35_config.h"
#include "qf/rt/kv_cache.h"
#include "qf/rt/logits.h"
#include "qf/rt/model.h"

namespace qf::rt {

// The formats of CudaEngine::synthetic's random weights: the hybrid qforge builds (INT4 decoder
// modules, FP8 block-128 shared experts, INT8 LM head), the same with an INT4 LM head
// (quantize-lm-head --bits 4), Intel's AutoRound INT4 release it starts from (the same with
// BF16 shared experts and a BF16 LM head), or Qwen's BF16 release (every linear module BF16).
// The router, shared-expert gate and embeddings are BF16 in all of them.
enum class SyntheticFormat { kHybrid, kHybridInt4Head, kInt4, kBf16 };

// The most KV cache rows a CudaEngine takes (positions are 32-bit on the device).
inline constexpr int64_t kMaxCudaContext = int64_t{1} << 30;
struct CudaOptions;
// Error(kUsage) naming what is out of range in `options`; CudaEngine's constructors call it
// first, before they look for a GPU or load anything (built with or without CUDA).
void check_cuda_options(const CudaOptions& options);

struct CudaOptions {
  int device = 0;
  int64_t max_context = 4096;  // KV cache rows per attention layer: 1 .. kMaxCudaContext
  // The KV caches' entries (the MTP head's too): f32, or bf16 (half the bytes a row; at
  // 122B-A10B's 12 attention layers 48 KiB a token in f32, so 1.5 GiB at 32768 rows).
  KvCacheType kv_cache = KvCacheType::kF32;
  bool graph = true;  // false: launch kernel by kernel (profiling)
  // The FP8 shared expert as extra slots of the routed experts' two launches (kern::gemv_moe),
  // where the formats allow; false, or where they do not: launches of its own, placed by
  // parallel_shared. Off: slower on the H200 (122B synthetic, context 1024: 3159.6 against
  // 2819.0 us per step beside them), where the branch hides those launches behind the router's.
  bool shared_in_experts = false;
  // The shared expert's own launches on a second stream, a branch of the step's graph beside the
  // router and the routed experts; false: one after the other.
  bool parallel_shared = true;
  // The routed experts' gate | up product applies SwiGLU in its epilogue (weights loaded in
  // kern::gemv_swiglu's paired row order where it takes them); false: gemv, then swiglu.
  bool fused_swiglu = true;
  // Deep, narrow out / o projections (K >= 2N) run as this many K parts (1 to 8) that the
  // following norm adds (kern::GemvBatch::k_splits); 1: one part.
  int out_parts = 4;
  // Upload the MTP head too (Model::mtp(), where the checkpoint has one; ~5 GB of BF16 on
  // 122B-A10B), for mtp_step; with it a verify defers its DeltaNet states (kern::GdnReplay:
  // each token's update kept, ~41 KB at 122B-A10B, the kept ones folded in later), so that a
  // rejected draft costs no copy.
  bool mtp = false;
  // The MTP head's draft vocabulary (qf/rt/mtp_vocab.h): its logits over token ids [0, mtp_vocab)
  // only, -inf beyond, its LM head reading those rows (at 122B-A10B 32768 of 248320 rows: 101
  // instead of 763 MB an MTP step). 0, or the vocabulary size: all. Prompt scoring's MTP rows
  // (prefill_scored_with_mtp) need all and refuse it.
  int64_t mtp_vocab = 0;
  // Keep one snapshot slot (snapshot / restore_snapshot: prefix reuse across requests in
  // qforge serve): another copy of the DeltaNet states and conv histories (~72 MB at 122B-A10B).
  bool snapshots = false;
  // Batched prefill (prefill / advance of three or more tokens): tokens per pass, each
  // projection's weights read once per pass (kern::gemm where it takes them), at most
  // max_context; 0, or mixer shapes the prefill kernels do not take (none of Qwen3.5's): no
  // prefill buffers, prompts go in pairs. 1024 at 122B-A10B: ~440 MB of buffers, and every
  // routed expert read once per 1024 prompt tokens (docs/cuda-engine-speed.md, "Batched
  // prefill").
  int prefill_chunk = 1024;
  // Attention on the tensor cores where the shape and the device take it: the batched prefill's
  // (kern::attn_prefill's kMma paths) and, with bf16 KV caches, the decode step's
  // (kern::attn_decode's kMma); false: the CUDA-core kernels, to compare.
  bool tensor_core_attention = true;
  // Timing studies only (qforge bench --skip): launches left out of every step, named as in
  // kSkippableLaunches, so that the step time without them bounds what fusing them away could
  // gain. Their outputs go stale, so the results are wrong; the weights still stream as in a
  // real step (the expert ids start distinct and stay so when the top-k is left out).
  std::vector<std::string> skip;
};

inline constexpr const char* kSkippableLaunches[] = {
    "out-norm",     "router",      "router-topk",   "experts-gate-up",
    "experts-down", "moe-combine", "shared-expert", "shared-swiglu",
    "gdn-in-proj",  "gdn-mixer",   "out-proj",      "attention"};

// One line per kernel family of a profiled step.
struct KernelShare {
  std::string name;
  double microseconds = 0;
  uint64_t bytes = 0;  // weights and state it read or wrote
};

struct CudaLoadStats {
  std::string device_name;
  uint64_t device_bytes = 0;      // weights + state + scratch on the GPU
  uint64_t weight_bytes = 0;      // read by one decode step (experts: top-k of each layer)
  uint64_t mtp_weight_bytes = 0;  // read by one MTP step (its LM head included); 0: no MTP head
  uint64_t host_bytes = 0;        // copied from the checkpoint
  double load_seconds = 0;
  // CudaOptions::shared_in_experts took effect: every layer's shared expert runs as extra slots
  // of its routed experts' launches.
  bool shared_in_experts = false;
};

class CudaEngine {
 public:
  // False (with the reason) when qforge was built without CUDA or no GPU is usable.
  static bool available(std::string* why);

  // Uploads `model` (repacked to the kernels' layouts). Throws Error(kUnsupported) when CUDA is
  // not available, kIo when the GPU runs out of memory.
  CudaEngine(const Model& model, const CudaOptions& options = {});
  // Random weights of `config`'s shapes in `format`, made on the GPU (benchmarks); with
  // options.mtp an MTP head too (BF16, its shared expert FP8 in the hybrid, as the 122B hybrid's).
  static std::unique_ptr<CudaEngine> synthetic(const ckpt::Qwen35Config& config, uint64_t seed,
                                               const CudaOptions& options = {},
                                               SyntheticFormat format = SyntheticFormat::kHybrid);
  ~CudaEngine();

  const ckpt::Qwen35Config& config() const;
  const CudaLoadStats& load_stats() const;
  void reset();
  int64_t position() const;
  // With CudaOptions::snapshots (else Error(kUsage)): snapshot() keeps the sequence state at
  // the current position, restore_snapshot() returns to it (Error(kUsage) without one). The
  // DeltaNet states and conv histories are copied; the KV rows before the position stay valid
  // as steps only write at and past theirs. The MTP head's position is kept too (its cache rows
  // likewise).
  void snapshot();
  void restore_snapshot();

  // Consumes `token` at the next position; copies the logits [V] to `logits` when not null;
  // returns the argmax of the logits (lowest id among equal maxima). Throws Error(kUsage) for a
  // token outside the vocabulary or a full context.
  int32_t step(int32_t token, float* logits);
  // step() that copies, instead of the logits, their top `k` (1 .. 128) ids and logits and the
  // row's log-normalizer (TopLogits, selected on the device by kern::logits_topk: a few KB to
  // copy rather than the whole row); returns the argmax. Error(kUsage) for k out of range, as
  // step() for the token.
  int32_t step_top(int32_t token, int k, TopLogits& out);
  // Feeds the previous step's argmax back in without leaving the device; returns the new argmax.
  int32_t step_greedy();
  // The last step's hidden state after the final norm [H], copied to `out`.
  void hidden(float* out);

  // Whether the MTP head is on the GPU (CudaOptions::mtp and a checkpoint that has one).
  bool has_mtp() const;
  // The MTP head at the next MTP position, as CpuEngine::mtp_step: `hidden` [H] is the main
  // model's final-normed hidden state at position t on the host, or nullptr for the last step's
  // (it stays on the device), `next_token` the token at t + 1. Copies the logits for position
  // t + 2 to `logits` when not null and returns their argmax. Its own graph, the main step's
  // kernels. Throws Error(kUnsupported) without an MTP head, kUsage for a token outside the
  // vocabulary or a full context.
  int32_t mtp_step(int32_t next_token, const float* hidden, float* logits);
  int64_t mtp_position() const;

  // Two tokens a pass: speculative decoding (speculative.h) and prefill.
  // verify2 consumes two tokens at the next two positions in one pass (its own graph,
  // verify_graph.cpp; ~1.33 steps of time at 122B-A10B on an H100) and writes each one's argmax
  // to top, and their logits [2][V] to `logits` when not null (the same bits as two steps');
  // both hidden states stay on the device for draft(). reject_last(), right after verify2 and
  // with the MTP head loaded only (else Error(kUsage)), forgets the second token (its deferred
  // DeltaNet update never folded in, its KV rows left to be overwritten). draft(row, token,
  // logits) is mtp_step from the hidden state of token `row` of the last verify2 (row 0 is also
  // the last step's); it returns the argmax; Error(kUnsupported) without the MTP head.
  void verify2(const int32_t tokens[2], int32_t top[2], float* logits = nullptr);
  // verify2 and draft with each row's top `k` (1 .. 128) instead of the logits, as step_top.
  void verify2_top(const int32_t tokens[2], int32_t top[2], int k, TopLogits out[2]);
  int32_t draft_top(int row, int32_t next_token, int k, TopLogits& out);
  // One token (step), two (verify2) or more (batched prefill, below) at the next positions: each
  // one's argmax to top, their logits [n][V] to `logits` when not null (more than two: the LM
  // head runs once per token). Error(kUsage) for none.
  void advance(std::span<const int32_t> tokens, int32_t* top, float* logits);
  void reject_last();
  int32_t draft(int row, int32_t next_token, float* logits = nullptr);
  // Chained drafts (SpecEngine::drafts > 1): verify consumes two or three tokens in one pass (a
  // graph each; else Error(kUsage)), as verify2 does two: the same bits as as many steps'.
  // reject(n) forgets its last n tokens (n < its tokens; with the MTP head loaded only): their
  // deferred DeltaNet updates are never folded in (the conv rings keep every position's
  // history), and nothing is copied. draft(row) takes rows 0 to 2.
  // draft_chain is mtp_step from the MTP head's own last normed output (its hidden state) with
  // `next_token`, the draft before; mtp_rewind(n) takes the head's position back by n, its
  // cache rows there to be made again.
  void verify(std::span<const int32_t> tokens, int32_t* top, float* logits = nullptr);
  void reject(int n);
  // The MTP head's cache entries at its next positions from the hidden states of rows
  // first_row .. of the last verify (row 0: also the last step's), tokens[i] as row i's next
  // token, and nothing else: its graph up to the k and v rows of its layer's projection and
  // their append (not the q rows where the projection is BF16 or F32, the attention output, the
  // MoE or the LM head): the entries draft() makes, for a fraction of an MTP step's bytes
  // (122B-A10B: fc 38 MB and k | v 6 MB of its ~1 GB). Speculative decoding's kept drafts.
  // Error(kUnsupported) without the MTP head; kUsage for rows past the verify's or tokens
  // outside the vocabulary.
  void mtp_entries(int first_row, std::span<const int32_t> tokens);
  int32_t draft_chain(int32_t next_token, float* logits = nullptr);
  void mtp_rewind(int n);

  // Batched prefill: consumes `tokens` (one or more) at the next positions in passes of up to
  // CudaOptions::prefill_chunk tokens. Each pass runs every layer over its tokens: the
  // projections and experts read their weights once per pass (kern::gemm, the routed experts
  // grouped by kern::gemm_route; gemv with a slot per token where gemm does not take a format),
  // the DeltaNet layers run kern::gdn_prefill and attention kern::attn_prefill over all the
  // pass's tokens. Returns the last token's argmax and copies its logits [V] to `logits` when
  // not null; its hidden state stays on the device (as a step's), and step_greedy continues from
  // the argmax. Results equal steps' up to the order of the sums (kern::gemm adds its 128-column
  // segments in another order than the GEMV; attention sums its context in one split). The MTP
  // head is not run. Without prefill buffers (CudaOptions::prefill_chunk) it goes through
  // advance's pairs. Error(kUsage) as step.
  int32_t prefill(std::span<const int32_t> tokens, float* logits = nullptr);
  // prefill, and the MTP head's entries at the same positions in the same passes (speculative
  // decoding's prompt; its position must be the main model's): each token's made with the token
  // after it as the next, `next` for the last (-1: the last gets none, and draft(0, token) makes
  // it once the token is known; row 0 is the last token's). Only the MTP layer's k and v rows
  // are made (its fc, norms, q|k|v projection and kern::attn_prefill's appends; not its MoE or
  // LM head): the same entries as draft()'s, up to the order of the sums where kern::gemm takes
  // a format. Without prefill buffers: advance's pairs, then draft per token. Error(kUnsupported)
  // without the MTP head; kUsage as prefill, or for the positions or `next` out of range.
  int32_t prefill_with_mtp(std::span<const int32_t> tokens, int32_t next, float* logits = nullptr);

  // Prompt scoring (qforge eval-ppl): prefill over `tokens`, and each token's row of logits (the
  // prediction of the token after it) reduced on the device to its top `k` (1 .. 128) ids and
  // logits and its log-normalizer (tops[i], as step_top) and to the logit of targets[i]
  // (target_logits[i]; NaN where targets[i] is -1). The LM head runs over up to 128 rows a
  // product: kern::gemm where it takes the head (INT8: within gemv's bound of the exact sums,
  // not its bits), else a GEMV slot per row; ~127 MB of device memory for the rows (Qwen3.5's
  // vocabulary), allocated on the first call. The engine is then where prefill leaves it (the
  // last token's logits from the GEMV, to `logits` when not null; returns their argmax). Without
  // prefill buffers: steps, each row reduced on the host. tokens and targets of equal length;
  // Error(kUsage) as prefill, for k out of range or a target outside [-1, V), nothing consumed.
  int32_t prefill_scored(std::span<const int32_t> tokens, std::span<const int32_t> targets, int k,
                         TopLogits* tops, float* target_logits, float* logits = nullptr);
  // prefill_scored, and the MTP head's rows at the same positions in the same passes (its
  // position must be the main model's; eval-ppl's MTP figures): row i from token i's hidden
  // state with token i + 1 as the next (`next` for the last; -1: the last token gets no row),
  // its layer, norm and the LM head, reduced as the main rows into mtp_tops[i] and
  // mtp_target_logits[i] (the logit of mtp_targets[i], one per row). Its cache entries are
  // prefill_with_mtp's. Without prefill buffers: steps and MTP steps, rows reduced on the host.
  // Error(kUnsupported) without the MTP head; kUsage as prefill_scored, for mtp_targets of
  // another length or the positions apart.
  int32_t prefill_scored_with_mtp(std::span<const int32_t> tokens, int32_t next,
                                  std::span<const int32_t> targets,
                                  std::span<const int32_t> mtp_targets, int k, TopLogits* tops,
                                  float* target_logits, TopLogits* mtp_tops,
                                  float* mtp_target_logits, float* logits = nullptr);

  // One step launched kernel by kernel with events between them: time and bytes per family.
  std::vector<KernelShare> profile_step();
  // One batched prefill pass over the first min(n, prefill_chunk) tokens at the next positions,
  // launched kernel by kernel with events between them: time and bytes (weights read once) per
  // family. Error(kUsage) without prefill buffers.
  std::vector<KernelShare> profile_prefill(std::span<const int32_t> tokens);
  // Mean microseconds of `steps` graph-launched decode steps (greedy, position advancing).
  double time_steps(int steps);
  // The same for MTP steps from the last step's hidden state (chained: each takes the argmax of
  // the one before as its token), the MTP position advancing.
  double time_mtp_steps(int steps);

  struct Impl;

 private:
  // prefill, and with `after` (each token's next, [tokens.size()]) prefill_with_mtp's entries
  // for the first `entries` tokens.
  int32_t prefill_tokens(std::span<const int32_t> tokens, float* logits, const int32_t* after,
                         size_t entries);
  // prefill_scored, and with `after` (each token's next) prefill_scored_with_mtp's MTP rows for
  // the first mtp_targets.size() tokens.
  int32_t score_tokens(std::span<const int32_t> tokens, std::span<const int32_t> targets, int k,
                       TopLogits* tops, float* target_logits, const int32_t* after,
                       std::span<const int32_t> mtp_targets, TopLogits* mtp_tops,
                       float* mtp_target_logits, float* logits);
  explicit CudaEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Device-to-device cudaMemcpy bandwidth of the current GPU in GB/s, counting bytes read plus
// bytes written (what a copy moves), over `bytes` of buffer.
double device_copy_bandwidth(uint64_t bytes);

}  // namespace qf::rt
