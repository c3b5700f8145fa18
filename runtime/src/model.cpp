#include "qf/rt/model.h"

#include <nlohmann/json.hpp>

#include "qf/ckpt/file_io.h"
#include "qf/error.h"
#include "qf/quant/model_check.h"

namespace qf::rt {

namespace fs = std::filesystem;

// Resolves every tensor the forward pass reads. The model checks have run, so every name exists
// with its expected shape; lookups that still fail throw kTensorNotFound.
class ModelLoader {
 public:
  ModelLoader(Model& m, const ckpt::Checkpoint& c) : m_(m), c_(c) {}

  Linear linear(const std::string& module, int64_t n, int64_t k) {
    Linear s = quant::resolve_linear(c_, m_.layout_.linear(), module, n, k);
    ++m_.formats_[s.format()];
    return s;
  }

  std::vector<float> vec(const std::string& name, int64_t numel) {
    const ckpt::TensorView v = c_.view(name);
    std::vector<float> out(static_cast<size_t>(numel));
    quant::MatrixView(v.bytes.data(), v.info->dtype, 1, numel).row(0, out.data());
    return out;
  }

  MoeWeights moe(const std::string& p) {
    const ckpt::Qwen35Config& cfg = m_.config_;
    const int64_t h = cfg.hidden_size, e_count = cfg.num_experts, im = cfg.moe_intermediate_size,
                  is = cfg.shared_expert_intermediate_size;
    MoeWeights w;
    w.router = linear(p + "gate", e_count, h);
    if (const ckpt::TensorRef* gu = c_.find(p + "experts.gate_up_proj")) {  // fused [E, 2I, H]
      const ckpt::TensorRef* dn = c_.find(p + "experts.down_proj");         // [E, H, I]
      if (!dn) throw Error(Errc::kTensorNotFound, "no tensor '" + p + "experts.down_proj'");
      const auto* gu_bytes = gu->file->view(*gu->info).bytes.data();
      const auto* dn_bytes = dn->file->view(*dn->info).bytes.data();
      const int64_t es = ckpt::dtype_size(gu->info->dtype), ds = ckpt::dtype_size(dn->info->dtype);
      for (int64_t e = 0; e < e_count; ++e) {
        const std::byte* g = gu_bytes + e * 2 * im * h * es;
        w.gate.push_back(Linear::float_view(g, gu->info->dtype, im, h));
        w.up.push_back(Linear::float_view(g + im * h * es, gu->info->dtype, im, h));
        w.down.push_back(Linear::float_view(dn_bytes + e * h * im * ds, dn->info->dtype, h, im));
      }
      m_.formats_[gu->info->dtype == ckpt::DType::kF32 ? "fused-f32" : "fused-bf16"] += 3;
    } else {
      for (int64_t e = 0; e < e_count; ++e) {
        const std::string x = p + "experts." + std::to_string(e) + ".";
        w.gate.push_back(linear(x + "gate_proj", im, h));
        w.up.push_back(linear(x + "up_proj", im, h));
        w.down.push_back(linear(x + "down_proj", h, im));
      }
    }
    w.shared_gate = linear(p + "shared_expert.gate_proj", is, h);
    w.shared_up = linear(p + "shared_expert.up_proj", is, h);
    w.shared_down = linear(p + "shared_expert.down_proj", h, is);
    w.shared_expert_gate = linear(p + "shared_expert_gate", 1, h);
    return w;
  }

  LayerWeights layer(const std::string& p, bool full) {
    const ckpt::Qwen35Config& cfg = m_.config_;
    const int64_t h = cfg.hidden_size;
    LayerWeights l;
    l.full_attention = full;
    l.input_norm = vec(p + "input_layernorm.weight", h);
    l.post_norm = vec(p + "post_attention_layernorm.weight", h);
    if (full) {
      const std::string a = p + "self_attn.";
      l.attn.q = linear(a + "q_proj", cfg.q_proj_rows(), h);
      l.attn.k = linear(a + "k_proj", cfg.kv_rows(), h);
      l.attn.v = linear(a + "v_proj", cfg.kv_rows(), h);
      l.attn.o = linear(a + "o_proj", h, cfg.num_attention_heads * cfg.head_dim);
      l.attn.q_norm = vec(a + "q_norm.weight", cfg.head_dim);
      l.attn.k_norm = vec(a + "k_norm.weight", cfg.head_dim);
    } else {
      const std::string g = p + "linear_attn.";
      const int64_t nv = cfg.linear_num_value_heads;
      l.gdn.in_qkv = linear(g + "in_proj_qkv", cfg.conv_dim(), h);
      l.gdn.in_z = linear(g + "in_proj_z", cfg.value_dim(), h);
      l.gdn.in_b = linear(g + "in_proj_b", nv, h);
      l.gdn.in_a = linear(g + "in_proj_a", nv, h);
      l.gdn.out = linear(g + "out_proj", h, cfg.value_dim());
      l.gdn.conv = vec(g + "conv1d.weight", cfg.conv_dim() * cfg.linear_conv_kernel_dim);
      l.gdn.dt_bias = vec(g + "dt_bias", nv);
      l.gdn.a_log = vec(g + "A_log", nv);
      l.gdn.norm = vec(g + "norm.weight", cfg.linear_value_head_dim);
    }
    l.moe = moe(p + "mlp.");
    return l;
  }

  void load() {
    const ckpt::Qwen35Config& cfg = m_.config_;
    const std::string p = "model.language_model.";
    const ckpt::TensorView e = c_.view(p + "embed_tokens.weight");
    m_.embed_ref_ = c_.find(p + "embed_tokens.weight");
    m_.embed_.emplace(e.bytes.data(), e.info->dtype, cfg.vocab_size, cfg.hidden_size);
    for (int64_t i = 0; i < cfg.num_layers(); ++i) {
      m_.layers_.push_back(layer(p + "layers." + std::to_string(i) + ".", cfg.full_attention[i]));
    }
    m_.final_norm_ = vec(p + "norm.weight", cfg.hidden_size);
    m_.lm_head_ = linear("lm_head", cfg.vocab_size, cfg.hidden_size);
    if (c_.find("mtp.fc.weight") || c_.find("mtp.fc.qweight")) {
      MtpWeights t;
      t.fc = linear("mtp.fc", cfg.hidden_size, 2 * cfg.hidden_size);
      t.pre_fc_norm_embedding = vec("mtp.pre_fc_norm_embedding.weight", cfg.hidden_size);
      t.pre_fc_norm_hidden = vec("mtp.pre_fc_norm_hidden.weight", cfg.hidden_size);
      t.norm = vec("mtp.norm.weight", cfg.hidden_size);
      t.layer = layer("mtp.layers.0.", true);
      m_.mtp_ = std::move(t);
    }
  }

 private:
  Model& m_;
  const ckpt::Checkpoint& c_;
};

std::unique_ptr<Model> Model::load(const fs::path& dir) {
  std::unique_ptr<Model> m(new Model());
  m->dir_ = dir;
  m->ckpt_ = std::make_unique<ckpt::Checkpoint>(ckpt::Checkpoint::open(dir));
  const ckpt::Checkpoint& c = *m->ckpt_;
  const fs::path cfg_path = c.root() / "config.json";
  std::error_code ec;
  if (!fs::exists(cfg_path, ec)) {
    throw Error(Errc::kConfigInvalid, cfg_path.string() + ": missing (a model needs config.json)");
  }
  const std::string text = ckpt::read_text_file(cfg_path);
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::kConfigInvalid, cfg_path.string() + ": " + e.what());
  }
  std::vector<ckpt::Problem> problems;
  const quant::ModelCheckStats stats = quant::check_qwen35_model(c, {}, problems);
  if (!stats.checked) {
    throw Error(Errc::kConfigInvalid, cfg_path.string() + ": " + stats.skipped_because);
  }
  if (!problems.empty()) {
    throw Error(problems[0].code,
                dir.string() + " is not a loadable model: " + ckpt::format_problem(problems[0]) +
                    (problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) +
                                               " more; qforge validate lists them)"
                                         : ""));
  }
  m->config_ = ckpt::qwen35_config_from_json(text, cfg_path.string());
  m->layout_ = quant::checkpoint_layout(config, cfg_path.string());
  ModelLoader(*m, c).load();
  return m;
}

void Model::embed(int32_t token, float* out) const {
  embed_->row(token, out);
}

void Model::release_embedding(bool drop_cache) const {
  const uint64_t begin = embed_ref_->info->begin, n = embed_ref_->info->n_bytes();
  if (drop_cache) {
    embed_ref_->file->drop_cached(begin, n);
  } else {
    embed_ref_->file->release(begin, n);
  }
}

}  // namespace qf::rt
