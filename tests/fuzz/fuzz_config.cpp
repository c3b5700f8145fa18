// libFuzzer target for the small JSON files a checkpoint or a run brings: byte 0 picks the
// parser, the rest is the file's text. 0: config.json (qwen35_config_from_json), 1: the shard
// index (parse_index), 2: a recipe (parse_recipe), 3: generation_config.json, 4: tokenizer.json
// (Tokenizer::parse). Properties: a file is read or refused with an Error of a known code (the
// index parser reports problems instead, and never throws); a config read is written back by
// qwen35_config_json and reads again to the same values; an index read is serialized and
// parses again to the same entries.
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.h"
#include "json_mutator.h"
#include "qf/ckpt/index.h"
#include "qf/ckpt/qwen35_config.h"
#include "qf/error.h"
#include "qf/quant/recipe.h"
#include "qf/rt/generation_config.h"
#include "qf/rt/tokenizer.h"

namespace {

using namespace qf;

// The values that name and shape tensors, as one string to compare.
std::string shape_of(const ckpt::Qwen35Config& c) {
  std::vector<int64_t> v = {c.vocab_size,
                            c.hidden_size,
                            c.num_attention_heads,
                            c.num_key_value_heads,
                            c.head_dim,
                            c.linear_num_key_heads,
                            c.linear_num_value_heads,
                            c.linear_key_head_dim,
                            c.linear_value_head_dim,
                            c.linear_conv_kernel_dim,
                            c.num_experts,
                            c.num_experts_per_tok,
                            c.moe_intermediate_size,
                            c.shared_expert_intermediate_size,
                            c.mtp_num_hidden_layers,
                            c.max_position_embeddings,
                            c.eos_token_id,
                            c.vision.depth};
  if (c.vision.depth > 0) {  // depth 0: no vision tower, whose other values mean nothing
    const ckpt::Qwen35VisionConfig& t = c.vision;
    v.insert(v.end(), {t.hidden_size, t.intermediate_size, t.num_heads, t.in_channels, t.patch_size,
                       t.temporal_patch_size, t.spatial_merge_size, t.num_position_embeddings});
  }
  std::string s;
  for (const int64_t x : v) s += std::to_string(x) + ",";
  for (const bool f : c.full_attention) s += f ? 'F' : 'L';
  for (const double x : {c.rms_norm_eps, c.rope_theta, c.partial_rotary_factor}) {
    char buf[32];
    std::snprintf(buf, sizeof buf, ",%.17g", x);
    s += buf;
  }
  return s;
}

void config(std::string_view text) {
  ckpt::Qwen35Config c;
  try {
    c = ckpt::qwen35_config_from_json(text, "config.json");
  } catch (const Error&) {
    return;
  }
  const std::string again = ckpt::qwen35_config_json(c);
  ckpt::Qwen35Config d;
  try {
    d = ckpt::qwen35_config_from_json(again, "rewritten");
  } catch (const Error& e) {
    fuzz::fail("a config read does not read again when written", e.what() + ("\n" + again));
  }
  QF_FUZZ_CHECK(shape_of(c) == shape_of(d), shape_of(c) + "\n" + shape_of(d) + "\n" + again);
}

void index(std::string_view text) {
  const ckpt::IndexParse p = ckpt::parse_index(text);
  for (const ckpt::Problem& pr : p.problems) {
    QF_FUZZ_CHECK(static_cast<int>(pr.code) < kNumErrc, pr.message);
  }
  if (!p.problems.empty()) return;
  const std::string again = ckpt::serialize_index(p.index);
  const ckpt::IndexParse q = ckpt::parse_index(again);
  QF_FUZZ_CHECK(q.problems.empty(), again);
  QF_FUZZ_CHECK(
      q.index.weight_map == p.index.weight_map && q.index.total_size == p.index.total_size, again);
}

}  // namespace

QF_FUZZ_JSON_MUTATOR(1, "model_type", "text_config", "vision_config", "quantization_config",
                     "hidden_size", "num_hidden_layers", "full_attention_interval", "layer_types",
                     "num_experts", "vocab_size", "head_dim", "depth", "recipe", "description",
                     "sources", "model", "layout", "steps", "step", "bits", "weight_map",
                     "metadata", "total_size", "eos_token_id", "temperature", "top_k",
                     "added_tokens", "vocab", "merges", "normalizer", "pre_tokenizer", "decoder",
                     "id", "special")

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    switch (data[0] % 5) {
      case 0:
        config(text);
        break;
      case 1:
        index(text);
        break;
      case 2:
        quant::parse_recipe(std::string(text), "recipe.json");
        break;
      case 3:
        rt::parse_generation_config(text, "generation_config.json");
        break;
      default:
        rt::Tokenizer::parse(text, "tokenizer.json");
        break;
    }
  } catch (const Error& e) {
    QF_FUZZ_CHECK(static_cast<int>(e.code()) < kNumErrc && std::string(e.what()).size() > 0,
                  e.what());
  }
  return 0;
}
