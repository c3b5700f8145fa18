#include "qf/ckpt/qwen35_config.h"

#include <nlohmann/json.hpp>

#include "qf/error.h"

namespace qf::ckpt {
namespace {

using nlohmann::json;

Qwen35Config base(std::string name, int64_t h, int64_t layers, int64_t nq, int64_t nv,
                  int64_t experts, int64_t topk, int64_t inter) {
  Qwen35Config c;
  c.name = std::move(name);
  c.hidden_size = h;
  c.full_attention = qwen35_layer_types(layers);
  c.num_attention_heads = nq;
  c.num_key_value_heads = 2;
  c.linear_num_value_heads = nv;
  c.num_experts = experts;
  c.num_experts_per_tok = topk;
  c.moe_intermediate_size = inter;
  c.shared_expert_intermediate_size = inter;
  return c;
}

int64_t get_int(const json& obj, const char* key, int64_t fallback, std::string_view source) {
  const auto it = obj.find(key);
  if (it == obj.end()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < 0) {
    throw Error(Errc::kConfigInvalid,
                std::string(source) + ": \"" + key + "\" must be a non-negative integer");
  }
  return it->get<int64_t>();
}

double get_double(const json& obj, const char* key, double fallback, std::string_view source) {
  const auto it = obj.find(key);
  if (it == obj.end()) return fallback;
  if (!it->is_number()) {
    throw Error(Errc::kConfigInvalid, std::string(source) + ": \"" + key + "\" must be a number");
  }
  return it->get<double>();
}

}  // namespace

std::vector<bool> qwen35_layer_types(int64_t n_layers, int64_t full_attention_interval) {
  std::vector<bool> full(static_cast<size_t>(n_layers));
  for (int64_t i = 0; i < n_layers; ++i) full[i] = (i + 1) % full_attention_interval == 0;
  return full;
}

std::vector<std::string> qwen35_preset_names() {
  return {"tiny", "35b-a3b", "122b-a10b", "397b-a17b"};
}

Qwen35Config qwen35_preset(std::string_view name) {
  // Released models: qwen35-architecture.md §1.1.
  if (name == "35b-a3b") return base("35b-a3b", 2048, 40, 16, 32, 256, 8, 512);
  if (name == "122b-a10b") return base("122b-a10b", 3072, 48, 32, 64, 256, 8, 1024);
  if (name == "397b-a17b") return base("397b-a17b", 4096, 60, 32, 64, 512, 10, 1024);
  if (name == "tiny") {
    // Every dimension that is an input (K) of a projection is a multiple of 128, so INT4 groups
    // and FP8 blocks are whole; output dims are small multiples of 8 or partial blocks.
    // 8 value heads over 2 key heads (r = 4, as in 122B) so in_proj_a/b (N = Nv) packs as INT4.
    Qwen35Config c = base("tiny", 256, 4, 4, 8, 8, 2, 128);
    c.vocab_size = 512;
    c.num_key_value_heads = 1;
    c.head_dim = 64;
    c.linear_num_key_heads = 2;
    c.linear_key_head_dim = 64;
    c.linear_value_head_dim = 32;
    c.max_position_embeddings = 4096;
    c.eos_token_id = 1;
    c.vision = {2, 64, 128, 4, 3, 16, 2, 2, 64};
    return c;
  }
  std::string known;
  for (const std::string& n : qwen35_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(Errc::kUsage, "unknown preset '" + std::string(name) + "' (known: " + known + ")");
}

namespace {

// Bounds far past every release that keep the expected tensor set small and its shapes' sizes
// without overflow: a fuzzed config of 2^63 MTP layers made validate list tensors until memory
// ran out (found by fuzz_validate).
void check_bounds(const Qwen35Config& c, std::string_view source) {
  const auto bad = [&](const std::string& what) {
    throw Error(Errc::kConfigInvalid, std::string(source) + ": " + what);
  };
  const Qwen35VisionConfig& v = c.vision;
  for (const auto& [key, x] :
       {std::pair{"vocab_size", c.vocab_size},
        std::pair{"hidden_size", c.hidden_size},
        std::pair{"num_attention_heads", c.num_attention_heads},
        std::pair{"num_key_value_heads", c.num_key_value_heads},
        std::pair{"head_dim", c.head_dim},
        std::pair{"linear_num_key_heads", c.linear_num_key_heads},
        std::pair{"linear_num_value_heads", c.linear_num_value_heads},
        std::pair{"linear_key_head_dim", c.linear_key_head_dim},
        std::pair{"linear_value_head_dim", c.linear_value_head_dim},
        std::pair{"linear_conv_kernel_dim", c.linear_conv_kernel_dim},
        std::pair{"num_experts", c.num_experts},
        std::pair{"num_experts_per_tok", c.num_experts_per_tok},
        std::pair{"moe_intermediate_size", c.moe_intermediate_size},
        std::pair{"shared_expert_intermediate_size", c.shared_expert_intermediate_size},
        std::pair{"mtp_num_hidden_layers", c.mtp_num_hidden_layers},
        std::pair{"vision_config.depth", v.depth},
        std::pair{"vision_config.hidden_size", v.hidden_size},
        std::pair{"vision_config.intermediate_size", v.intermediate_size},
        std::pair{"vision_config.num_heads", v.num_heads},
        std::pair{"vision_config.in_channels", v.in_channels},
        std::pair{"vision_config.patch_size", v.patch_size},
        std::pair{"vision_config.temporal_patch_size", v.temporal_patch_size},
        std::pair{"vision_config.spatial_merge_size", v.spatial_merge_size},
        std::pair{"vision_config.num_position_embeddings", v.num_position_embeddings}}) {
    if (x > kMaxQwen35Dim) {
      bad(std::string(key) + " " + std::to_string(x) + " is past " + std::to_string(kMaxQwen35Dim));
    }
  }
  const int64_t layers = c.num_layers() + c.mtp_num_hidden_layers;
  if (layers * c.num_experts > kMaxQwen35LayerExperts) {
    bad("(num_hidden_layers + mtp_num_hidden_layers) x num_experts = " +
        std::to_string(layers * c.num_experts) + " is past " +
        std::to_string(kMaxQwen35LayerExperts));
  }
  if (c.num_experts_per_tok > c.num_experts) {
    bad("num_experts_per_tok " + std::to_string(c.num_experts_per_tok) + " is past num_experts " +
        std::to_string(c.num_experts));
  }
}

}  // namespace

Qwen35Config qwen35_config_from_json(std::string_view text, std::string_view source) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(Errc::kConfigInvalid, std::string(source) + ": " + e.what());
  }
  if (!doc.is_object()) throw Error(Errc::kConfigInvalid, std::string(source) + ": not an object");
  if (doc.contains("model_type") && !doc["model_type"].is_string()) {
    throw Error(Errc::kConfigInvalid, std::string(source) + ": model_type must be a string");
  }
  const std::string model_type = doc.value("model_type", "");
  const json& tc = doc.contains("text_config") ? doc["text_config"] : doc;
  if (model_type != "qwen3_5_moe" && model_type != "qwen3_5_moe_text") {
    throw Error(Errc::kUnsupported,
                std::string(source) + ": model_type \"" + model_type + "\" is not qwen3_5_moe");
  }
  if (!tc.is_object()) throw Error(Errc::kConfigInvalid, std::string(source) + ": text_config");
  Qwen35Config c;
  c.name = std::string(source);
  c.vocab_size = get_int(tc, "vocab_size", c.vocab_size, source);
  c.hidden_size = get_int(tc, "hidden_size", 0, source);
  const int64_t n_layers = get_int(tc, "num_hidden_layers", 0, source);
  const int64_t interval = get_int(tc, "full_attention_interval", 4, source);
  // Bounds that keep the layer table small and the interval a divisor (a fuzzed config of
  // 10^12 layers took 125 GB, one of interval 0 divided by zero: found by fuzz_config).
  if (n_layers > kMaxQwen35Layers) {
    throw Error(Errc::kConfigInvalid, std::string(source) + ": num_hidden_layers " +
                                          std::to_string(n_layers) + " is past " +
                                          std::to_string(kMaxQwen35Layers));
  }
  if (interval < 1) {
    throw Error(Errc::kConfigInvalid,
                std::string(source) + ": full_attention_interval must be at least 1");
  }
  c.full_attention = qwen35_layer_types(n_layers, interval);
  if (tc.contains("layer_types")) {
    const json& lt = tc["layer_types"];
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != n_layers) {
      throw Error(Errc::kConfigInvalid,
                  std::string(source) + ": layer_types must list num_hidden_layers entries");
    }
    for (size_t i = 0; i < lt.size(); ++i) {
      const std::string t = lt[i].is_string() ? lt[i].get<std::string>() : "";
      if (t != "full_attention" && t != "linear_attention") {
        throw Error(Errc::kConfigInvalid, std::string(source) + ": layer_types[" +
                                              std::to_string(i) + "] is \"" + t +
                                              "\", expected full_attention or linear_attention");
      }
      c.full_attention[i] = t == "full_attention";
    }
  }
  c.num_attention_heads = get_int(tc, "num_attention_heads", 0, source);
  c.num_key_value_heads = get_int(tc, "num_key_value_heads", 0, source);
  c.head_dim = get_int(tc, "head_dim", c.head_dim, source);
  c.linear_num_key_heads = get_int(tc, "linear_num_key_heads", c.linear_num_key_heads, source);
  c.linear_num_value_heads = get_int(tc, "linear_num_value_heads", 0, source);
  c.linear_key_head_dim = get_int(tc, "linear_key_head_dim", c.linear_key_head_dim, source);
  c.linear_value_head_dim = get_int(tc, "linear_value_head_dim", c.linear_value_head_dim, source);
  c.linear_conv_kernel_dim =
      get_int(tc, "linear_conv_kernel_dim", c.linear_conv_kernel_dim, source);
  c.num_experts = get_int(tc, "num_experts", 0, source);
  c.num_experts_per_tok = get_int(tc, "num_experts_per_tok", 0, source);
  c.moe_intermediate_size = get_int(tc, "moe_intermediate_size", 0, source);
  c.shared_expert_intermediate_size =
      get_int(tc, "shared_expert_intermediate_size", c.moe_intermediate_size, source);
  c.mtp_num_hidden_layers = get_int(tc, "mtp_num_hidden_layers", 1, source);
  c.rms_norm_eps = get_double(tc, "rms_norm_eps", c.rms_norm_eps, source);
  c.max_position_embeddings =
      get_int(tc, "max_position_embeddings", c.max_position_embeddings, source);
  // rope_parameters wins over the legacy top-level keys, as in transformers (which also writes
  // a stale top-level partial_rotary_factor of 0.25 beside it).
  c.rope_theta = get_double(tc, "rope_theta", c.rope_theta, source);
  c.partial_rotary_factor =
      get_double(tc, "partial_rotary_factor", c.partial_rotary_factor, source);
  if (tc.contains("rope_parameters") && tc["rope_parameters"].is_object()) {
    const json& rp = tc["rope_parameters"];
    c.rope_theta = get_double(rp, "rope_theta", c.rope_theta, source);
    c.partial_rotary_factor =
        get_double(rp, "partial_rotary_factor", c.partial_rotary_factor, source);
  }
  for (const auto& [key, v] :
       {std::pair{"hidden_size", c.hidden_size}, std::pair{"num_hidden_layers", n_layers},
        std::pair{"num_attention_heads", c.num_attention_heads},
        std::pair{"num_key_value_heads", c.num_key_value_heads},
        std::pair{"linear_num_value_heads", c.linear_num_value_heads},
        std::pair{"num_experts", c.num_experts},
        std::pair{"moe_intermediate_size", c.moe_intermediate_size}}) {
    if (v <= 0)
      throw Error(Errc::kConfigInvalid, std::string(source) + ": missing \"" + key + "\"");
  }
  c.vision.depth = 0;
  if (doc.contains("vision_config") && doc["vision_config"].is_object()) {
    const json& vc = doc["vision_config"];
    Qwen35VisionConfig& v = c.vision;
    v.depth = get_int(vc, "depth", 27, source);
    v.hidden_size = get_int(vc, "hidden_size", v.hidden_size, source);
    v.intermediate_size = get_int(vc, "intermediate_size", v.intermediate_size, source);
    v.num_heads = get_int(vc, "num_heads", v.num_heads, source);
    v.in_channels = get_int(vc, "in_channels", v.in_channels, source);
    v.patch_size = get_int(vc, "patch_size", v.patch_size, source);
    v.temporal_patch_size = get_int(vc, "temporal_patch_size", v.temporal_patch_size, source);
    v.spatial_merge_size = get_int(vc, "spatial_merge_size", v.spatial_merge_size, source);
    v.num_position_embeddings =
        get_int(vc, "num_position_embeddings", v.num_position_embeddings, source);
  }
  check_bounds(c, source);
  return c;
}

std::string qwen35_config_json(const Qwen35Config& c, std::string_view quantization_config_json) {
  json layer_types = json::array();
  for (bool full : c.full_attention)
    layer_types.push_back(full ? "full_attention" : "linear_attention");
  json text = {{"model_type", "qwen3_5_moe_text"},
               {"vocab_size", c.vocab_size},
               {"hidden_size", c.hidden_size},
               {"num_hidden_layers", c.num_layers()},
               {"layer_types", layer_types},
               {"full_attention_interval", 4},
               {"num_attention_heads", c.num_attention_heads},
               {"num_key_value_heads", c.num_key_value_heads},
               {"head_dim", c.head_dim},
               {"attn_output_gate", true},
               {"linear_num_key_heads", c.linear_num_key_heads},
               {"linear_num_value_heads", c.linear_num_value_heads},
               {"linear_key_head_dim", c.linear_key_head_dim},
               {"linear_value_head_dim", c.linear_value_head_dim},
               {"linear_conv_kernel_dim", c.linear_conv_kernel_dim},
               {"num_experts", c.num_experts},
               {"num_experts_per_tok", c.num_experts_per_tok},
               {"moe_intermediate_size", c.moe_intermediate_size},
               {"shared_expert_intermediate_size", c.shared_expert_intermediate_size},
               {"mtp_num_hidden_layers", c.mtp_num_hidden_layers},
               {"mtp_use_dedicated_embeddings", false},
               {"rms_norm_eps", c.rms_norm_eps},
               {"hidden_act", "silu"},
               {"max_position_embeddings", c.max_position_embeddings},
               {"rope_parameters",
                {{"rope_type", "default"},
                 {"rope_theta", c.rope_theta},
                 {"partial_rotary_factor", c.partial_rotary_factor},
                 {"mrope_section", {11, 11, 10}},
                 {"mrope_interleaved", true}}},
               {"tie_word_embeddings", false},
               {"attention_bias", false},
               {"mamba_ssm_dtype", "float32"},
               {"eos_token_id", c.eos_token_id},
               {"dtype", "bfloat16"}};
  json doc = {{"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
              {"model_type", "qwen3_5_moe"},
              {"text_config", text},
              {"tie_word_embeddings", false}};
  if (c.vision.depth > 0) {
    const Qwen35VisionConfig& v = c.vision;
    doc["vision_config"] = {{"model_type", "qwen3_5_moe"},
                            {"depth", v.depth},
                            {"hidden_size", v.hidden_size},
                            {"intermediate_size", v.intermediate_size},
                            {"num_heads", v.num_heads},
                            {"in_channels", v.in_channels},
                            {"patch_size", v.patch_size},
                            {"temporal_patch_size", v.temporal_patch_size},
                            {"spatial_merge_size", v.spatial_merge_size},
                            {"num_position_embeddings", v.num_position_embeddings},
                            {"out_hidden_size", c.hidden_size},
                            {"hidden_act", "gelu_pytorch_tanh"}};
  }
  if (!quantization_config_json.empty()) {
    doc["quantization_config"] = json::parse(quantization_config_json);
  }
  return doc.dump(2) + "\n";
}

}  // namespace qf::ckpt
