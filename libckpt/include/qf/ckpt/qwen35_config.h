// Qwen3.5-MoE (`qwen3_5_moe`) model configuration: the values that decide tensor names and
// shapes, the presets of the released models, and config.json reading and writing.
// Values and provenance: shared/docs/qwen35-architecture.md §1.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qf::ckpt {

struct Qwen35VisionConfig {
  int64_t depth = 27;  // 0: no vision tower
  int64_t hidden_size = 1152;
  int64_t intermediate_size = 4304;
  int64_t num_heads = 16;
  int64_t in_channels = 3;
  int64_t patch_size = 16;
  int64_t temporal_patch_size = 2;
  int64_t spatial_merge_size = 2;
  int64_t num_position_embeddings = 2304;
};

struct Qwen35Config {
  std::string name;  // preset name, or where the config came from
  int64_t vocab_size = 248320;
  int64_t hidden_size = 0;                      // H
  std::vector<bool> full_attention;             // per layer; false = Gated DeltaNet (linear)
  int64_t num_attention_heads = 0;              // Nq
  int64_t num_key_value_heads = 0;              // Nkv
  int64_t head_dim = 256;                       // hd
  int64_t linear_num_key_heads = 16;            // Nk
  int64_t linear_num_value_heads = 0;           // Nv
  int64_t linear_key_head_dim = 128;            // dk
  int64_t linear_value_head_dim = 128;          // dv
  int64_t linear_conv_kernel_dim = 4;           // Kc
  int64_t num_experts = 0;                      // E
  int64_t num_experts_per_tok = 0;              // k
  int64_t moe_intermediate_size = 0;            // I
  int64_t shared_expert_intermediate_size = 0;  // Is
  int64_t mtp_num_hidden_layers = 1;
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e7;
  double partial_rotary_factor = 0.25;
  int64_t max_position_embeddings = 262144;
  int64_t eos_token_id = 248044;
  Qwen35VisionConfig vision;

  int64_t num_layers() const { return static_cast<int64_t>(full_attention.size()); }
  int64_t key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int64_t value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  int64_t q_proj_rows() const { return 2 * num_attention_heads * head_dim; }  // query + gate
  int64_t kv_rows() const { return num_key_value_heads * head_dim; }
};

// Bounds a config.json must keep (qwen35_config_from_json), far past every release: decoder
// layers (40 to 60 there), any one dimension or count (vocab_size 248320 is the largest), and
// (layers + MTP layers) x experts, the size of the expected tensor set (61 x 512 at 397B-A17B).
inline constexpr int64_t kMaxQwen35Layers = 4096;
inline constexpr int64_t kMaxQwen35Dim = int64_t{1} << 22;
inline constexpr int64_t kMaxQwen35LayerExperts = int64_t{1} << 18;

// Layer i is full attention iff (i + 1) % interval == 0 (interval 4 in every release).
std::vector<bool> qwen35_layer_types(int64_t n_layers, int64_t full_attention_interval = 4);

// "tiny" (a 4-layer model with small dimensions for tests and demos), "35b-a3b", "122b-a10b",
// "397b-a17b". Throws Error(kUsage) naming the known presets.
Qwen35Config qwen35_preset(std::string_view name);
std::vector<std::string> qwen35_preset_names();

// Reads the text (and vision) configuration of a config.json (composite `qwen3_5_moe` with
// text_config, or a bare `qwen3_5_moe_text`). Throws Error(kConfigInvalid) naming the field.
Qwen35Config qwen35_config_from_json(std::string_view text, std::string_view source);

// A config.json in the layout Qwen's releases use (composite, text_config + vision_config),
// pretty-printed with two-space indents. `quantization_config_json` (a JSON object text, may
// be empty) becomes the top-level "quantization_config", where quantized releases keep it.
std::string qwen35_config_json(const Qwen35Config& config,
                               std::string_view quantization_config_json = {});

}  // namespace qf::ckpt
