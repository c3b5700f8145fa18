// A Qwen3.5-MoE text model (and its MTP head) mapped from a checkpoint directory in any layout
// qforge handles: Qwen's BF16 release (fused or per-expert experts), Intel's AutoRound INT4,
// Qwen's FP8, hybrids, an INT8 LM head, and F32 dequantized copies. Linear weights stay in the
// mapped files in their stored format (quant::StoredLinear reconstructs them exactly); norms,
// gates and the conv kernel are widened to f32 at load. Names and shapes:
// shared/docs/qwen35-architecture.md §2.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/qwen35_config.h"
#include "qf/quant/stored_linear.h"

namespace qf::rt {

using Linear = quant::StoredLinear;

struct MoeWeights {
  Linear router;                               // [E, H]
  std::vector<Linear> gate, up, down;          // per routed expert: [I, H], [I, H], [H, I]
  Linear shared_gate, shared_up, shared_down;  // [Is, H], [Is, H], [H, Is]
  Linear shared_expert_gate;                   // [1, H]
};

struct GdnWeights {  // Gated DeltaNet (linear_attention)
  Linear in_qkv, in_z, in_b, in_a, out;
  std::vector<float> conv;  // [conv_dim, Kc]
  std::vector<float> dt_bias, a_log, norm;
};

struct AttentionWeights {  // gated full attention
  Linear q, k, v, o;       // q: [2 Nq hd, H], per head [query | gate]
  std::vector<float> q_norm, k_norm;
};

struct LayerWeights {
  bool full_attention = false;
  std::vector<float> input_norm, post_norm;
  GdnWeights gdn;
  AttentionWeights attn;
  MoeWeights moe;
};

struct MtpWeights {
  Linear fc;  // [H, 2H]
  std::vector<float> pre_fc_norm_embedding, pre_fc_norm_hidden, norm;
  LayerWeights layer;  // a full-attention layer with its MoE
};

class Model {
 public:
  // Opens the checkpoint, reads config.json and runs the model checks (qforge validate's): a
  // missing tensor, a wrong shape or dtype is thrown as that check's Error with its message.
  // Throws kConfigInvalid (config.json absent or not Qwen3.5-MoE), kUnsupported, kIo.
  static std::unique_ptr<Model> load(const std::filesystem::path& dir);

  const ckpt::Qwen35Config& config() const { return config_; }
  const std::filesystem::path& dir() const { return dir_; }
  // Linear modules by stored format ("bf16": 120, "int4": 3000, ...).
  const std::map<std::string, size_t>& formats() const { return formats_; }

  // Row `token` of the embedding, widened to f32.
  void embed(int32_t token, float* out) const;
  const quant::MatrixView& embedding() const { return *embed_; }  // [V, H] as stored
  // Unmaps the embedding's pages from this process (they stay in the page cache; drop_cache:
  // they leave it too, SafetensorsFile::drop_cached).
  void release_embedding(bool drop_cache = false) const;
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const std::vector<float>& final_norm() const { return final_norm_; }
  const Linear& lm_head() const { return lm_head_; }
  const std::optional<MtpWeights>& mtp() const { return mtp_; }

 private:
  Model() = default;

  std::filesystem::path dir_;
  std::unique_ptr<ckpt::Checkpoint> ckpt_;
  ckpt::Qwen35Config config_;
  quant::CheckpointLayout layout_;
  std::map<std::string, size_t> formats_;
  std::optional<quant::MatrixView> embed_;
  const ckpt::TensorRef* embed_ref_ = nullptr;
  std::vector<LayerWeights> layers_;
  std::vector<float> final_norm_;
  Linear lm_head_;
  std::optional<MtpWeights> mtp_;

  friend class ModelLoader;
};

}  // namespace qf::rt
