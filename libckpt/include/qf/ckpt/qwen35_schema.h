// The complete tensor set of a Qwen3.5-MoE checkpoint in each released layout: names, dtypes,
// shapes, which file group holds them, and which linear module each quantized part belongs to.
//
//   bf16        Qwen's original release: fused 3-D routed experts in the main layers
//               (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]), per-expert MTP
//               experts, FP32 linear_attn.A_log and linear_attn.norm.
//   intel-int4  Intel's AutoRound (auto_round:auto_gptq): qweight/qzeros/scales for routed
//               experts and every attention / linear-attention projection; BF16 shared
//               experts, gates, router, norms, embeddings, lm_head, vision; MTP in the sidecar
//               model_extra_tensors.safetensors (BF16, or INT4 experts+attention as in 35B).
//   qwen-fp8    Qwen's block-FP8 release: F8_E4M3 weight + weight_scale_inv for experts, shared
//               experts, attention and in_proj_qkv/in_proj_z/out_proj; BF16 for in_proj_a/b,
//               gates, norms, embeddings, lm_head, vision; MTP in the main shards.
// Sources: qwen35-architecture.md §2, checkpoint-formats.md §2.2, §2.8-2.10, §3.4.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "qf/ckpt/dtype.h"
#include "qf/ckpt/qwen35_config.h"
#include "qf/ckpt/safetensors.h"

namespace qf::ckpt {

enum class Qwen35Layout { kBf16, kIntelInt4, kQwenFp8 };
std::string_view layout_name(Qwen35Layout layout);
// "bf16", "intel-int4", "qwen-fp8"; throws Error(kUsage) otherwise.
Qwen35Layout layout_from_name(std::string_view name);

// How a tensor's bytes are to be read (and what a generator should put in them).
enum class TensorRole {
  kLinear,       // float matrix [N, K] (2-D), or fused experts [E, N, K] (3-D)
  kEmbedding,    // [V, H]
  kNormOffset,   // zero-centred RMSNorm weight: stored w, gain is (1 + w)
  kNormPlain,    // gated RMSNorm / LayerNorm weight: gain is w
  kBias,         // vision LayerNorm / linear biases
  kConv,         // linear_attn.conv1d.weight [conv_dim, 1, Kc]
  kALog,         // linear_attn.A_log [Nv]
  kDtBias,       // linear_attn.dt_bias [Nv]
  kQWeight,      // GPTQ qweight  I32 [K/8, N]
  kQZeros,       // GPTQ qzeros   I32 [ceil(K/G), N/8], stored zero - 1
  kQScales,      // GPTQ scales   F16 [ceil(K/G), N], signed
  kFp8Weight,    // F8_E4M3 [N, K]
  kFp8ScaleInv,  // multiplier per 128x128 block [ceil(N/128), ceil(K/128)]
};

// Numeric format of one linear module in a layout.
enum class LinearFormat { kBf16, kInt4, kFp8 };

struct TensorDecl {
  std::string name;
  DType dtype = DType::kBF16;
  Shape shape;
  TensorRole role = TensorRole::kLinear;
  std::string file;    // "" = main shards; otherwise the sidecar file name
  std::string module;  // linear module the tensor belongs to ("" for non-linear tensors)
  LinearFormat format = LinearFormat::kBf16;
  int64_t n = 0;  // module output features (rows of the logical [N, K] weight)
  int64_t k = 0;  // module input features
};

struct SchemaOptions {
  int64_t layers = -1;                   // main layers to emit (a prefix of the model); -1 = all
  bool mtp = true;                       // emit the MTP head (mtp.*) when the config has one
  bool vision = true;                    // emit the vision tower when the config has one
  int64_t group_size = 128;              // INT4 group along K
  int64_t fp8_block = 128;               // FP8 block edge along N and K
  DType fp8_scale_dtype = DType::kBF16;  // weight_scale_inv dtype (Qwen ships BF16)
  bool mtp_int4 = false;  // intel-int4: MTP experts and attention INT4 (Intel's 35B) vs BF16
};

inline constexpr std::string_view kMtpSidecarName = "model_extra_tensors.safetensors";

// Every tensor, in model order (vision, embeddings, layers, final norm, lm_head, MTP).
// Throws Error(kUnsupported) for shapes a layout cannot hold (e.g. K not a multiple of 8 for
// INT4 packing).
std::vector<TensorDecl> qwen35_tensors(const Qwen35Config& config, Qwen35Layout layout,
                                       const SchemaOptions& options = {});

}  // namespace qf::ckpt
