// The reference forward pass of Qwen3.5-MoE on the CPU: fp32 activations and state, weights
// reconstructed exactly from their stored format, one token at a time (prefill included).
// Formulas: shared/docs/qwen35-architecture.md §3-§5; every step is written out plainly so that
// faster engines can be checked against it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "qf/rt/kv_cache.h"
#include "qf/rt/model.h"
#include "qf/rt/thread_pool.h"

namespace qf::rt {

// Per-sequence state: GDN conv windows and recurrent states, attention KV caches, the MTP
// layer's own KV cache.
struct SequenceState {
  std::vector<std::vector<float>> conv;  // per layer (GDN only): [conv_dim, Kc - 1], oldest first
  std::vector<std::vector<float>> ssm;   // per layer (GDN only): [Nv, dk, dv]
  std::vector<std::vector<float>> k, v;  // per layer (attention only): [T, Nkv * hd]
  std::vector<float> mtp_k, mtp_v;       // the MTP layer's cache, by MTP position
  int64_t position = 0;                  // tokens consumed by the main model
  int64_t mtp_position = 0;              // tokens consumed by the MTP head
};

class CpuEngine {
 public:
  // `threads`: workers for the row-parallel products (0: all cores). `kv`: the KV caches'
  // entries (bf16: each appended k and v entry rounded to a bf16 value, kept in the f32 caches).
  explicit CpuEngine(const Model& model, int threads = 0, KvCacheType kv = KvCacheType::kF32);
  ~CpuEngine();

  const Model& model() const { return model_; }
  SequenceState& state() { return state_; }
  void reset();

  // Consumes `token` at the next position. Writes the logits [V] when `logits` is not null.
  // Throws Error(kUsage) for a token outside [0, V).
  void step(int32_t token, float* logits);
  // The last step's hidden state after the final norm [H] (what the MTP head takes).
  const std::vector<float>& hidden() const { return hidden_; }

  // Speculative decoding's rollback: save(slot) remembers the DeltaNet states and the position
  // in a slot (0 .. kMaxSaves - 1); restore(slot) returns to them and drops the KV rows of the
  // tokens consumed since (rejected drafts). The MTP head's state is not touched. Error(kUsage)
  // for a slot out of range or never saved.
  static constexpr int kMaxSaves = 8;
  void save(int slot = 0);
  void restore(int slot = 0);

  // The MTP head at the next MTP position: `hidden` is the main model's final-normed hidden
  // state at position t, `next_token` the token at t + 1; writes the logits for position t + 2
  // and keeps the head's own normed output (mtp_hidden) for chained drafts. Throws
  // Error(kUnsupported) when the checkpoint has no MTP head.
  void mtp_step(int32_t next_token, const float* hidden, float* logits);
  const std::vector<float>& mtp_hidden() const { return mtp_hidden_; }
  // The MTP head's position back by n (0 .. its position), its cache rows past it dropped: the
  // entries chained drafts made from its own output, made again from the main model's.
  void mtp_rewind(int64_t n);
  // The MTP head's logits over token ids [0, n) only, -inf beyond (its LM head then multiplies n
  // rows): a draft vocabulary, as CudaOptions::mtp_vocab. n = the vocabulary size: all (the
  // default). Throws Error(kUsage) unless mtp_vocab_ok(n, V).
  void set_mtp_vocab(int64_t n);

 private:
  struct Scratch;
  void layer(const LayerWeights& w, size_t index, float* x);
  void attention(const AttentionWeights& w, std::vector<float>& kc, std::vector<float>& vc,
                 int64_t pos, const float* u, float* out);
  void gdn(const GdnWeights& w, size_t index, const float* u, float* out);
  void moe(const MoeWeights& w, const float* u, float* out);
  void matvec(const Linear& w, const float* x, float* y, int64_t rows = -1);  // -1: all

  const Model& model_;
  KvCacheType kv_;
  ThreadPool pool_;
  SequenceState state_;
  std::unique_ptr<Scratch> s_;
  std::vector<float> hidden_, mtp_hidden_;
  struct Saved {
    std::vector<std::vector<float>> conv, ssm;
    int64_t position = -1;
  };
  std::vector<Saved> saved_;
  int64_t mtp_vocab_ = 0;  // 0: the whole vocabulary
};

}  // namespace qf::rt
