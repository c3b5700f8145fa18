#include "qf/ckpt/qwen35_schema.h"

#include "qf/error.h"

namespace qf::ckpt {
namespace {

enum class ModuleKind {
  kRoutedExpert,
  kSharedExpert,
  kAttention,
  kLinearBig,
  kLinearSmall,
  kFloat
};

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

uint64_t u(int64_t v) {
  return static_cast<uint64_t>(v);
}

class Emitter {
 public:
  Emitter(const Qwen35Config& c, Qwen35Layout layout, const SchemaOptions& o)
      : c_(c), layout_(layout), o_(o) {}

  std::vector<TensorDecl> run() {
    if (o_.vision && c_.vision.depth > 0) vision();
    const std::string lm = "model.language_model.";
    add(lm + "embed_tokens.weight", DType::kBF16, {u(c_.vocab_size), u(c_.hidden_size)},
        TensorRole::kEmbedding);
    const int64_t n_layers = o_.layers < 0 ? c_.num_layers() : std::min(o_.layers, c_.num_layers());
    for (int64_t i = 0; i < n_layers; ++i) {
      decoder_layer(lm + "layers." + std::to_string(i) + ".", c_.full_attention[i]);
    }
    add(lm + "norm.weight", DType::kBF16, {u(c_.hidden_size)}, TensorRole::kNormOffset);
    linear("lm_head", c_.vocab_size, c_.hidden_size, ModuleKind::kFloat);
    if (o_.mtp && c_.mtp_num_hidden_layers > 0) mtp();
    return std::move(out_);
  }

 private:
  void add(std::string name, DType dtype, Shape shape, TensorRole role) {
    TensorDecl d;
    d.name = std::move(name);
    d.dtype = dtype;
    d.shape = std::move(shape);
    d.role = role;
    d.file = file_;
    out_.push_back(std::move(d));
  }

  LinearFormat format_of(ModuleKind kind) const {
    switch (layout_) {
      case Qwen35Layout::kBf16:
        return LinearFormat::kBf16;
      case Qwen35Layout::kIntelInt4: {
        const bool quantized = kind == ModuleKind::kRoutedExpert ||
                               kind == ModuleKind::kAttention || kind == ModuleKind::kLinearBig ||
                               kind == ModuleKind::kLinearSmall;
        if (!quantized || (in_mtp_ && !o_.mtp_int4)) return LinearFormat::kBf16;
        return LinearFormat::kInt4;
      }
      case Qwen35Layout::kQwenFp8: {
        const bool fp8 = kind == ModuleKind::kRoutedExpert || kind == ModuleKind::kSharedExpert ||
                         kind == ModuleKind::kAttention || kind == ModuleKind::kLinearBig;
        return fp8 ? LinearFormat::kFp8 : LinearFormat::kBf16;
      }
    }
    return LinearFormat::kBf16;
  }

  // One linear module [n, k] in the layout's format for its kind.
  void linear(const std::string& module, int64_t n, int64_t k, ModuleKind kind) {
    const LinearFormat fmt = format_of(kind);
    const size_t first = out_.size();
    switch (fmt) {
      case LinearFormat::kBf16:
        add(module + ".weight", DType::kBF16, {u(n), u(k)}, TensorRole::kLinear);
        break;
      case LinearFormat::kInt4: {
        if (k % 8 != 0 || n % 8 != 0) {
          throw Error(Errc::kUnsupported,
                      module + ": INT4 GPTQ packing needs K and N divisible by 8, got N=" +
                          std::to_string(n) + " K=" + std::to_string(k));
        }
        const int64_t groups = ceil_div(k, o_.group_size);
        add(module + ".qweight", DType::kI32, {u(k / 8), u(n)}, TensorRole::kQWeight);
        add(module + ".qzeros", DType::kI32, {u(groups), u(n / 8)}, TensorRole::kQZeros);
        add(module + ".scales", DType::kF16, {u(groups), u(n)}, TensorRole::kQScales);
        break;
      }
      case LinearFormat::kFp8: {
        const int64_t b = o_.fp8_block;
        add(module + ".weight", DType::kF8E4M3, {u(n), u(k)}, TensorRole::kFp8Weight);
        add(module + ".weight_scale_inv", o_.fp8_scale_dtype,
            {u(ceil_div(n, b)), u(ceil_div(k, b))}, TensorRole::kFp8ScaleInv);
        break;
      }
    }
    for (size_t i = first; i < out_.size(); ++i) {
      out_[i].module = module;
      out_[i].format = fmt;
      out_[i].n = n;
      out_[i].k = k;
    }
  }

  void decoder_layer(const std::string& p, bool full) {
    const int64_t h = c_.hidden_size;
    if (full) {
      const std::string a = p + "self_attn.";
      linear(a + "q_proj", c_.q_proj_rows(), h, ModuleKind::kAttention);
      linear(a + "k_proj", c_.kv_rows(), h, ModuleKind::kAttention);
      linear(a + "v_proj", c_.kv_rows(), h, ModuleKind::kAttention);
      linear(a + "o_proj", h, c_.num_attention_heads * c_.head_dim, ModuleKind::kAttention);
      add(a + "q_norm.weight", DType::kBF16, {u(c_.head_dim)}, TensorRole::kNormOffset);
      add(a + "k_norm.weight", DType::kBF16, {u(c_.head_dim)}, TensorRole::kNormOffset);
    } else {
      // A_log and the gated norm are FP32 in Qwen's releases, BF16 in Intel's export.
      const DType f32 = layout_ == Qwen35Layout::kIntelInt4 ? DType::kBF16 : DType::kF32;
      const std::string l = p + "linear_attn.";
      const int64_t nv = c_.linear_num_value_heads;
      linear(l + "in_proj_qkv", c_.conv_dim(), h, ModuleKind::kLinearBig);
      linear(l + "in_proj_z", c_.value_dim(), h, ModuleKind::kLinearBig);
      linear(l + "in_proj_b", nv, h, ModuleKind::kLinearSmall);
      linear(l + "in_proj_a", nv, h, ModuleKind::kLinearSmall);
      add(l + "conv1d.weight", DType::kBF16, {u(c_.conv_dim()), 1, u(c_.linear_conv_kernel_dim)},
          TensorRole::kConv);
      add(l + "dt_bias", DType::kBF16, {u(nv)}, TensorRole::kDtBias);
      add(l + "A_log", f32, {u(nv)}, TensorRole::kALog);
      add(l + "norm.weight", f32, {u(c_.linear_value_head_dim)}, TensorRole::kNormPlain);
      linear(l + "out_proj", h, c_.value_dim(), ModuleKind::kLinearBig);
    }
    add(p + "input_layernorm.weight", DType::kBF16, {u(h)}, TensorRole::kNormOffset);
    add(p + "post_attention_layernorm.weight", DType::kBF16, {u(h)}, TensorRole::kNormOffset);
    moe(p + "mlp.");
  }

  void moe(const std::string& m) {
    const int64_t h = c_.hidden_size, e = c_.num_experts, i = c_.moe_intermediate_size;
    linear(m + "gate", e, h, ModuleKind::kFloat);  // router
    if (layout_ == Qwen35Layout::kBf16 && !in_mtp_) {
      // Fused 3-D, gate rows first in gate_up_proj, no ".weight" suffix.
      add(m + "experts.gate_up_proj", DType::kBF16, {u(e), u(2 * i), u(h)}, TensorRole::kLinear);
      add(m + "experts.down_proj", DType::kBF16, {u(e), u(h), u(i)}, TensorRole::kLinear);
    } else {
      for (int64_t x = 0; x < e; ++x) {
        const std::string ex = m + "experts." + std::to_string(x) + ".";
        linear(ex + "gate_proj", i, h, ModuleKind::kRoutedExpert);
        linear(ex + "up_proj", i, h, ModuleKind::kRoutedExpert);
        linear(ex + "down_proj", h, i, ModuleKind::kRoutedExpert);
      }
    }
    const int64_t is = c_.shared_expert_intermediate_size;
    linear(m + "shared_expert.gate_proj", is, h, ModuleKind::kSharedExpert);
    linear(m + "shared_expert.up_proj", is, h, ModuleKind::kSharedExpert);
    linear(m + "shared_expert.down_proj", h, is, ModuleKind::kSharedExpert);
    linear(m + "shared_expert_gate", 1, h, ModuleKind::kFloat);
  }

  void mtp() {
    in_mtp_ = true;
    if (layout_ == Qwen35Layout::kIntelInt4) file_ = std::string(kMtpSidecarName);
    const int64_t h = c_.hidden_size;
    linear("mtp.fc", h, 2 * h, ModuleKind::kFloat);
    add("mtp.pre_fc_norm_embedding.weight", DType::kBF16, {u(h)}, TensorRole::kNormOffset);
    add("mtp.pre_fc_norm_hidden.weight", DType::kBF16, {u(h)}, TensorRole::kNormOffset);
    for (int64_t n = 0; n < c_.mtp_num_hidden_layers; ++n) {
      decoder_layer("mtp.layers." + std::to_string(n) + ".", /*full=*/true);
    }
    add("mtp.norm.weight", DType::kBF16, {u(h)}, TensorRole::kNormOffset);
    file_.clear();
    in_mtp_ = false;
  }

  void vision() {
    const Qwen35VisionConfig& v = c_.vision;
    const std::string p = "model.visual.";
    const int64_t vh = v.hidden_size, vi = v.intermediate_size;
    const int64_t merged = vh * v.spatial_merge_size * v.spatial_merge_size;
    auto dense = [&](const std::string& module, int64_t n, int64_t k) {
      linear(module, n, k, ModuleKind::kFloat);
      add(module + ".bias", DType::kBF16, {u(n)}, TensorRole::kBias);
    };
    auto layer_norm = [&](const std::string& module, int64_t n) {
      add(module + ".weight", DType::kBF16, {u(n)}, TensorRole::kNormPlain);
      add(module + ".bias", DType::kBF16, {u(n)}, TensorRole::kBias);
    };
    add(p + "patch_embed.proj.weight", DType::kBF16,
        {u(vh), u(v.in_channels), u(v.temporal_patch_size), u(v.patch_size), u(v.patch_size)},
        TensorRole::kLinear);
    add(p + "patch_embed.proj.bias", DType::kBF16, {u(vh)}, TensorRole::kBias);
    add(p + "pos_embed.weight", DType::kBF16, {u(v.num_position_embeddings), u(vh)},
        TensorRole::kEmbedding);
    for (int64_t b = 0; b < v.depth; ++b) {
      const std::string blk = p + "blocks." + std::to_string(b) + ".";
      layer_norm(blk + "norm1", vh);
      layer_norm(blk + "norm2", vh);
      dense(blk + "attn.qkv", 3 * vh, vh);
      dense(blk + "attn.proj", vh, vh);
      dense(blk + "mlp.linear_fc1", vi, vh);
      dense(blk + "mlp.linear_fc2", vh, vi);
    }
    layer_norm(p + "merger.norm", vh);
    dense(p + "merger.linear_fc1", merged, merged);
    dense(p + "merger.linear_fc2", c_.hidden_size, merged);
  }

  const Qwen35Config& c_;
  Qwen35Layout layout_;
  const SchemaOptions& o_;
  std::vector<TensorDecl> out_;
  std::string file_;
  bool in_mtp_ = false;
};

}  // namespace

std::string_view layout_name(Qwen35Layout layout) {
  switch (layout) {
    case Qwen35Layout::kBf16:
      return "bf16";
    case Qwen35Layout::kIntelInt4:
      return "intel-int4";
    case Qwen35Layout::kQwenFp8:
      return "qwen-fp8";
  }
  return "bf16";
}

Qwen35Layout layout_from_name(std::string_view name) {
  for (Qwen35Layout l : {Qwen35Layout::kBf16, Qwen35Layout::kIntelInt4, Qwen35Layout::kQwenFp8}) {
    if (layout_name(l) == name) return l;
  }
  throw Error(Errc::kUsage,
              "unknown layout '" + std::string(name) + "' (known: bf16, intel-int4, qwen-fp8)");
}

std::vector<TensorDecl> qwen35_tensors(const Qwen35Config& config, Qwen35Layout layout,
                                       const SchemaOptions& options) {
  if (options.group_size <= 0 || options.fp8_block <= 0) {
    throw Error(Errc::kUsage, "group size and FP8 block must be positive");
  }
  return Emitter(config, layout, options).run();
}

}  // namespace qf::ckpt
