// The CUDA engine's state and launches (CudaEngine::Impl), shared by its sources: engine_impl.cpp
// (buffers, state, the MTP step's calls), step_graph.cpp (the decode step's and the MTP head's
// launches), verify_graph.cpp (speculative decoding's two-token pass) and cuda_engine.cpp (the
// public API). Internal to the CUDA engine.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "device_model.h"
#include "qf/error.h"
#include "qf/kern/attention.h"
#include "qf/kern/gdn.h"
#include "qf/kern/topk.h"
#include "qf/rt/cuda_engine.h"
#include "qf/rt/mtp_vocab.h"

namespace qf::rt {
namespace cuda {

inline void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    throw Error(Errc::kIo, what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  }
}

// Records an event after each kernel family when profiling; does nothing otherwise.
struct Marks {
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> events;
  std::vector<std::pair<std::string, uint64_t>> names;  // family and bytes, per interval
  void mark(const char* name, uint64_t bytes) {
    cudaEvent_t e;
    check(cudaEventCreate(&e), "cudaEventCreate");
    check(cudaEventRecord(e, stream), "cudaEventRecord");
    events.push_back(e);
    names.emplace_back(name, bytes);
  }
};

}  // namespace cuda

struct CudaEngine::Impl {
  std::unique_ptr<cuda::DeviceModel> m;
  CudaOptions o;
  CudaLoadStats stats;
  cudaStream_t stream = nullptr;
  // The shared expert runs beside the router and routed experts (a branch of the graph): its
  // three short launches are latency-bound and hide behind the routed experts' loads.
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  cudaGraphExec_t graph = nullptr, mtp_graph = nullptr, mtp_entry_graph = nullptr;
  kern::GdnShape gdn;
  kern::AttnShape attn;
  std::vector<float*> conv, ssm;
  std::vector<void*> k_cache, v_cache;  // per layer; entries of attn.kv
  // Outputs of row groups are contiguous: gin = qkv | z | b | a, qkvp = q | k | v,
  // rl = router logits | shared gate logit, egu = [k, gate | up] (unused where the
  // experts are paired: gemv_swiglu writes eh directly), sgu = shared gate | up.
  float *x, *u, *mix, *gin, *qkv, *z, *b, *a, *core, *qkvp, *qproj, *kp, *vp, *att, *rl, *rlogits,
      *sgl, *rweights, *egu, *eh, *ey, *sgu, *sh, *sy, *hidden, *logits, *attn_scratch, *rope;
  int *ids, *token, *next, *pos, *argmax_scratch;
  // The MTP head's (where it is loaded): its layer's KV cache, the hidden state it takes, the
  // two norms side by side (fc's input), its normed output and logits; its token in (then its
  // argmax, for a chained draft) and position.
  void *mtp_k = nullptr, *mtp_v = nullptr;
  float *mtp_in = nullptr, *cat = nullptr, *mtp_hidden = nullptr, *mtp_logits = nullptr;
  int *mtp_token = nullptr, *mtp_next = nullptr, *mtp_pos = nullptr;
  // Tokens a verify pass takes at most (speculative decoding: two drafts a round).
  static constexpr int kMaxVerify = 3;
  static_assert(kMaxVerify <= kern::kGdnMaxTokens, "a verify's DeltaNet rows take one launch");
  // Host: the token in, the argmax out; the MTP head's the same; a position to set (9) and the
  // MTP head's (10); then a verify's tokens, positions and argmaxes (kMaxVerify each), the
  // single-token step's position after them, and mtp_entries' tokens.
  int* pinned = nullptr;
  static constexpr int kPinTokens = 12, kPinPositions = kPinTokens + kMaxVerify,
                       kPinArgmax = kPinPositions + kMaxVerify,
                       kPinStepPos = kPinArgmax + kMaxVerify, kPinEntryTokens = kPinStepPos + 1,
                       kPinFold = kPinEntryTokens + kMaxVerify, kPinWords = kPinFold + 2;
  // Host, pinned: logits on their way out (up to kMaxVerify rows), as a copy to pageable memory
  // runs at a fraction of the link's speed (H100: ~340 against ~100 us for 248320 floats, with the
  // memcpy after it).
  float* pinned_logits = nullptr;
  // step_top and its kin: kern::logits_topk's outputs for up to two rows (each kTopSlot words:
  // ids, then logits, then the normalizer's two floats), on the device and pinned on the host,
  // and its scratch.
  static constexpr int kTopSlot = 2 * kern::kTopKMax + 2;
  int* top_out = nullptr;
  int* pinned_top = nullptr;
  void* top_scratch = nullptr;
  // The verify (speculative decoding: kMaxVerify tokens at most): its tokens, positions and
  // argmaxes. With the MTP head a verify defers its DeltaNet states (kern::GdnReplay): each
  // layer's state stays the one before the verify's tokens, their updates go into replay[l]
  // (two buffers, `parity` the one last written), and `pending` of them (the kept tokens:
  // reject takes the others off) are folded in by the next verify, or by settle() before
  // anything else reads the state. fold_word: {count, parity} on the device, as the host last
  // copied it (fold_on_device).
  int *vtoken = nullptr, *vpos = nullptr, *vnext = nullptr, *fold_word = nullptr;
  std::vector<float*> replay;
  int pending = 0, parity = 0, fold_on_device[2] = {0, 0};
  // CudaOptions::snapshots: each DeltaNet layer's conv history and state at snap_position (the
  // MTP head's position then: snap_mtp_position).
  std::vector<float*> conv_snap, ssm_snap;
  int64_t snap_position = -1, snap_mtp_position = 0;
  cudaGraphExec_t verify_graph = nullptr, verify3_graph = nullptr;
  // Batched prefill (prefill.cpp): o.prefill_chunk rows of each per-token buffer (experts: k
  // rows a token, egu (nullptr where every layer's experts are paired) and eh in gemm_route's
  // entry order, ey in token order), the mixers' kernels' scratch, the tokens
  // and positions of a pass (pinned on the host too), the route, the GEMM's limbs; its graph
  // serves every full pass.
  struct PrefillRows {
    int cap = 0;
    float *x, *u, *mix, *gin, *core, *qkvp, *att, *rl, *rw, *egu, *eh, *ey, *sgu, *sh, *sy, *hidden;
    int *tokens, *pos, *ids, *offsets, *x_rows, *y_rows;
    // With the MTP head: its rows' [embedding | hidden] inputs, and their next tokens.
    float* cat = nullptr;
    int* mtp_tokens = nullptr;
    int* pinned = nullptr;  // host: tokens, then positions, then the MTP head's tokens
    void* scratch = nullptr;
    float* gdn_scratch = nullptr;   // kern::gdn_prefill's (nullptr: no DeltaNet layer)
    float* attn_scratch = nullptr;  // kern::attn_prefill's (nullptr: no attention layer)
  } pf;
  cudaGraphExec_t prefill_graph = nullptr;
  int verified = 0;  // tokens of the last main-model call when it was a verify with the MTP head
                     // loaded (its states kept for reject); 0 otherwise
  int64_t position = 0, mtp_position = 0;
  cuda::Marks* marks = nullptr;

  explicit Impl(std::unique_ptr<cuda::DeviceModel> model, const CudaOptions& options);

  // Queues copies of every DeltaNet layer's conv history and state (live or snapshot slots).
  void copy_gdn_states(const std::vector<float*>& conv_from, const std::vector<float*>& ssm_from,
                       const std::vector<float*>& conv_to, const std::vector<float*>& ssm_to);

  ~Impl();

  int64_t gin_row() const {  // qkv | z | b | a
    const ckpt::Qwen35Config& c = m->config;
    return c.conv_dim() + c.value_dim() + 2 * c.linear_num_value_heads;
  }
  int64_t qkvp_row() const { return m->config.q_proj_rows() + 2 * m->config.kv_rows(); }
  int64_t ssm_floats() const {
    const ckpt::Qwen35Config& c = m->config;
    return c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
  }

  // f(part, out + its offset) for each launch of a group: the fused matrix, else each part.
  template <class F>
  static void each_part(const cuda::RowGroup& g, float* out, F f) {
    if (g.fused.n > 0) {
      f(g.fused, out);
      return;
    }
    for (size_t j = 0; j < g.parts.size(); ++j) f(g.parts[j], out + g.offsets[j]);
  }
  // The MTP head's LM head: the rows of its draft vocabulary (CudaOptions::mtp_vocab; a row-major
  // prefix, or whole INT4 tiles, of every format's layout).
  kern::DeviceLinear mtp_lm_head() const {
    kern::DeviceLinear head = m->lm_head;
    if (o.mtp_vocab > 0) head.n = static_cast<int>(o.mtp_vocab);
    return head;
  }
  // `w` with its stack strides zeroed: every slot of a batch reads matrix 0.
  static kern::DeviceLinear one_matrix(const kern::DeviceLinear& w) {
    kern::DeviceLinear one = w;
    one.w_stride = one.scale_stride = one.zero_stride = one.block_scale_stride = 0;
    return one;
  }

  static uint64_t bytes(const cuda::RowGroup& g) {
    if (g.fused.n > 0) return kern::weight_bytes(g.fused);
    uint64_t total = 0;
    for (const kern::DeviceLinear& p : g.parts) total += kern::weight_bytes(p);
    return total;
  }

  // The weights one token reads from a layer (experts: the top-k).
  uint64_t layer_bytes(const cuda::DeviceLayer& l) const;

  uint64_t step_weight_bytes() const;

  // fc, the layer and the LM head, and the embedding row (BF16 or F32).
  uint64_t mtp_weight_bytes() const;

  // Whether the launch `name` (kSkippableLaunches) is left out (CudaOptions::skip).
  bool on(const char* name) const {
    return std::find(o.skip.begin(), o.skip.end(), name) == o.skip.end();
  }

  // The batched prefill's and the decode step's attention kernels
  // (CudaOptions::tensor_core_attention).
  kern::AttnPrefillPath attn_path() const {
    return o.tensor_core_attention ? kern::AttnPrefillPath::kAuto : kern::AttnPrefillPath::kScalar;
  }
  kern::AttnDecodePath attn_decode_path() const {
    return o.tensor_core_attention ? kern::AttnDecodePath::kAuto : kern::AttnDecodePath::kSplit;
  }

  void mark(const char* name, uint64_t bytes) {
    if (marks) marks->mark(name, bytes);
  }

  // The out / o projection into mix, then x += mix and u = post_norm(x). A deep, narrow product
  // (K >= 2N: [3072 x 8192] on 122B) runs in o.out_parts K parts, more blocks with fewer units
  // each (one part fills 192 of the H200's 264 block slots), and the norm adds the parts.
  void out_proj_add_norm(const kern::DeviceLinear& w, const float* in, const float* norm,
                         const char* family);

  void gemv(const kern::DeviceLinear& w, const float* in, float* out, const kern::GemvBatch& batch,
            const char* family, cudaStream_t on = nullptr);

  // All parts of a group in one launch when fused; outputs at out + offset either way.
  void gemv(const cuda::RowGroup& g, const float* in, float* out, const kern::GemvBatch& batch,
            const char* family, cudaStream_t on = nullptr);

  // The shared expert as the routed launches' extra slots (kern::gemv_moe): its gate | up and
  // down products, or {} where the formats do not allow it (or it is off or skipped).
  std::pair<kern::SharedProduct, kern::SharedProduct> shared_slots(const cuda::DeviceMoe& w) const;

  // The routed experts' gate | up (paired: straight to eh) and down batches.
  std::pair<kern::GemvBatch, kern::GemvBatch> expert_batches() const;

  // The MoE block; its combine also applies the next norm (`next_norm`) into `next_out`.
  void moe(const cuda::DeviceMoe& w, const float* next_norm, float* next_out);

  // A full-attention layer's mixer: q | k | v from u, attention at the device position `at`
  // (`rows_before` cached rows) over the cache kc / vc, the o projection, x += it and
  // u = post_norm(x).
  void attention_mixer(const cuda::DeviceLayer& w, void* kc, void* vc, const int* at,
                       int64_t rows_before);

  // The MTP head (CpuEngine::mtp_step): [norm(embed(token)) | norm(mtp_in)] -> fc -> its layer
  // -> norm -> the LM head, at mtp_pos. Uses the step's scratch (x, u, ...), not its state.
  void launch_mtp();

  // The MTP head's layer input: [norm(embed(mtp_token)) | norm(mtp_in)] -> fc -> the layer's
  // input norm, into u (x holds the residual); launch_mtp's and launch_mtp_entry's first part.
  void mtp_layer_input();
  // The MTP head's cache entry at mtp_pos (CudaEngine::mtp_entries): launch_mtp up to its
  // layer's k and v rows (kv_rows) and their append, then mtp_pos on by one; the attention
  // output (from whatever q the scratch holds), the MoE and the LM head are not run.
  void launch_mtp_entry();
  // The k and v rows of a q | k | v group from u into kp and vp: their own parts, or a row view
  // of a fused BF16 or F32 matrix; other fused formats: the whole group.
  void kv_rows(const cuda::RowGroup& g);

  // The decode step: every layer, the LM head and argmax.
  void launch_step();

  // ---- Speculative decoding's verify pass of 2 or 3 tokens (verify_graph.cpp says how) ----

  // `w` on `rows` rows of input `in_stride` floats apart into rows `out_stride` apart.
  void gemv_rows(int rows, const kern::DeviceLinear& w, const float* in, size_t in_stride,
                 float* out, size_t out_stride, const char* family, cudaStream_t on = nullptr,
                 int k_splits = 1);
  void gemv_rows(int rows, const cuda::RowGroup& g, const float* in, size_t in_stride, float* out,
                 size_t out_stride, const char* family, cudaStream_t on = nullptr);

  // out_proj_add_norm on every row.
  void out_proj_add_norm_rows(int rows, const kern::DeviceLinear& w, const float* in,
                              size_t in_stride, const float* norm);

  void moe_verify(int rows, const cuda::DeviceMoe& w, const float* next_norm, float* next_out);

  // The routed experts of `rows` tokens as GEMV slots, k a token (ids_in [rows, k]) on row r of
  // `in` (hidden_size apart): gate | up into gu_out (unpaired layouts) and SwiGLU into h_out,
  // down into y_out [rows * k, hidden]. ids_early: GemvBatch's, for the down product.
  void experts_by_slot(const cuda::DeviceMoe& w, const float* in, int rows, const int* ids_in,
                       float* gu_out, float* h_out, float* y_out, bool ids_early);

  void launch_verify(int rows);

  // ---- Batched prefill (prefill.cpp says how) ----

  void alloc_prefill();
  // `w` on n rows of input ldx floats apart into rows ldy apart: kern::gemm where it takes w,
  // else gemv with n slots of the one matrix.
  void gemm_rows(const kern::DeviceLinear& w, const float* in, size_t ldx, float* out, size_t ldy,
                 int n);
  void gemm_rows(const cuda::RowGroup& g, const float* in, size_t ldx, float* out, size_t ldy,
                 int n);
  void moe_rows(const cuda::DeviceMoe& w, int n, const float* next_norm, float* next_out);
  // Every layer over the n tokens at pf.tokens / pf.pos; leaves their final-normed hidden states
  // in pf.hidden.
  void launch_prefill(int n);
  // One pass of n <= pf.cap tokens at the next positions: their hidden states in pf.hidden, the
  // last one's also in `hidden`, its logits in `logits` and argmax in `next` and `token` (so
  // step_greedy continues from it). top (not null): every token's argmax, and its logits [V] at
  // out + r * V where out is not null (the LM head per token, each waited for).
  // With `mtp_rows` > 0 the MTP head's entries too, at the same positions, for the first
  // mtp_rows tokens (launch_mtp_prefill), token r's made with mtp_after[r] (host) as the next.
  void prefill_pass(const int32_t* tokens, int n, int32_t* top, float* out,
                    const int32_t* mtp_after = nullptr, int mtp_rows = 0);
  // The MTP head's cache entries (its attention layer's k and v rows) for the first n rows of
  // the pass: from pf.hidden and the embeddings of pf.mtp_tokens, at positions pf.pos. Only
  // what the cache needs runs: not the layer's attention output, MoE or the LM head, unless
  // `full` (prompt scoring): then the layer's o projection and MoE and the head's final norm
  // too, its rows' normed outputs left in pf.u.
  void launch_mtp_prefill(int n, bool full = false);
  // prefill_pass's parts: the checks, uploads and layers (with the MTP head's entries), and
  // after the LM head the last hidden state to `hidden` and the step's token and position.
  void pass_layers(const int32_t* tokens, int n, const int32_t* mtp_after, int mtp_rows,
                   bool mtp_full = false);
  void pass_end(int n);
  // After passes that made the MTP head's entries: its position to the device, where
  // launch_mtp reads it (through pinned[10]; last_argmax's synchronization waits for the copy).
  void upload_mtp_position();
  // After the passes: the last token's argmax (waited for), its logits to `out` when not null.
  int32_t last_argmax(float* out);
  // prefill_with_mtp's and prefill_scored_with_mtp's preconditions: the MTP head loaded
  // (kUnsupported), tokens, and the head at the main model's position (kUsage, naming `what`).
  void check_mtp_prefill(const char* what, size_t n_tokens) const;
  // CudaEngine::advance for three or more tokens (passes with top and out as above).
  void prefill_rows(std::span<const int32_t> tokens, int32_t* top, float* out);
  // The LM head and argmax of row r of pf.hidden into logits / next.
  void head_row(int r);

  // ---- Prompt scoring (score.cpp says how) ----

  // Rows of logits one LM head product takes (its output: ~127 MB at Qwen3.5's vocabulary).
  static constexpr int kScoreRows = 128;
  // Allocated on the first prefill_scored: the rows' logits, each row's kTopSlot words
  // (queue_top's layout), targets in, picked logits out, the top-k scratch; pinned: the slots,
  // then the targets, then the picked logits.
  struct ScoreRows {
    float* logits = nullptr;
    int* top = nullptr;
    int* targets = nullptr;
    float* picked = nullptr;
    void* top_scratch = nullptr;  // kern::logits_topk_rows's
    int* pinned = nullptr;
  } sc;
  void alloc_score();
  // Rows r0 .. r0 + n - 1 of `src` (hidden_size floats apart: pf.hidden, or pf.u for the MTP
  // head's) through the LM head, reduced to tops and target logits (CudaEngine::prefill_scored),
  // waited for.
  void score_rows(const float* src, int r0, int n, const int32_t* targets, int k, TopLogits* tops,
                  float* target_logits);

  // launch_step or launch_mtp, captured into `exec` the first time (o.graph).
  template <class Launch>
  void run(cudaGraphExec_t& exec, Launch launch) {
    if (!o.graph) {
      launch();
      return;
    }
    if (!exec) {
      cudaGraph_t g;
      cuda::check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                  "begin capture");
      launch();
      cuda::check(cudaStreamEndCapture(stream, &g), "end capture");
      cuda::check(cudaGraphInstantiate(&exec, g, 0), "cudaGraphInstantiate");
      cudaGraphDestroy(g);
    }
    cuda::check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  }
  void run_step() {
    settle();
    run(graph, [&] { launch_step(); });
  }
  // {count, parity} into fold_word where it differs from what the device holds (stream-ordered).
  void put_fold_word(int count);
  // The kept tokens of the last verify folded into the DeltaNet states (kern::gdn_fold), where
  // any are pending.
  void settle();

  // Logits out through pinned_logits: queue the copy of `rows` rows at `dev` on the stream, then,
  // after the stream's synchronization, hand them to `out`.
  void queue_logits(const float* dev, int rows) {
    cuda::check(
        cudaMemcpyAsync(pinned_logits, dev, static_cast<size_t>(rows * m->config.vocab_size) * 4,
                        cudaMemcpyDeviceToHost, stream),
        "copying logits");
  }
  void take_logits(float* out, int rows) const {
    std::memcpy(out, pinned_logits, static_cast<size_t>(rows * m->config.vocab_size) * 4);
  }
  // The same for the top k of each row (step_top and its kin): kern::logits_topk on the stream,
  // the copies queued after it; take_top after the stream's synchronization.
  void queue_top(const float* dev, int rows, int k);
  void take_top(int rows, int k, TopLogits* out) const;
  // TopLogits from `rows` rows of kTopSlot words copied to the host.
  static void read_top(const int* slots, int rows, int k, TopLogits* out);
  // Where a call's logits go: the whole rows to `logits`, or their top `k` to `tops`, or
  // nowhere.
  struct Out {
    float* logits = nullptr;
    int k = 0;
    TopLogits* tops = nullptr;
  };
  void queue_out(const float* dev, int rows, const Out& out) {
    if (out.logits) queue_logits(dev, rows);
    if (out.tops) queue_top(dev, rows, out.k);
  }
  void take_out(int rows, const Out& out) const {
    if (out.logits) take_logits(out.logits, rows);
    if (out.tops) take_top(rows, out.k, out.tops);
  }
  static void check_top_k(int k);
  // CudaEngine::mtp_step from the hidden state at `src` (host or device, as `kind` says).
  int32_t mtp_step(int32_t next_token, const float* src, cudaMemcpyKind kind, const Out& out);
  // CudaEngine::step and step_top.
  int32_t step(int32_t id, const Out& out);
  // CudaEngine::verify (2 or 3 tokens), verify2 and verify2_top.
  void verify(std::span<const int32_t> tokens, int32_t* top, const Out& out);

  void before_step(int64_t at) {
    if (at >= o.max_context) {
      throw Error(Errc::kUsage,
                  "the context is full: the KV cache holds " + std::to_string(o.max_context) +
                      " positions (sized at load; generate: the prompt and --max-tokens; "
                      "serve: --max-model-len)");
    }
  }

  void reset();
};

}  // namespace qf::rt
