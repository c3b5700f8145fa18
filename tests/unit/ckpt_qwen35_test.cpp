// The Qwen3.5-MoE schema against the tensor counts and shapes documented for the real releases
// (checkpoint-formats.md §2.8-2.10, §3.4, §6; qwen35-architecture.md §2), shard planning, and
// config.json round trips.
#include <gtest/gtest.h>

#include <map>

#include "qf/ckpt/qwen35_schema.h"
#include "qf/ckpt/shard_plan.h"
#include "test_support.h"

namespace qf::ckpt {
namespace {

std::map<std::string, const TensorDecl*> by_name(const std::vector<TensorDecl>& ts) {
  std::map<std::string, const TensorDecl*> m;
  for (const TensorDecl& t : ts) m[t.name] = &t;
  return m;
}

size_t count_if_file(const std::vector<TensorDecl>& ts, const std::string& file) {
  size_t n = 0;
  for (const TensorDecl& t : ts) n += t.file == file;
  return n;
}

TEST(Qwen35Schema, Intel35bIndexCountMatchesTheRelease) {
  // Intel 35B: 93,486 main entries + 2,329 MTP (INT4 experts and attention) = 95,815.
  SchemaOptions o;
  o.mtp_int4 = true;
  const auto ts = qwen35_tensors(qwen35_preset("35b-a3b"), Qwen35Layout::kIntelInt4, o);
  EXPECT_EQ(ts.size(), 95815u);
  EXPECT_EQ(count_if_file(ts, std::string(kMtpSidecarName)), 2329u);
}

TEST(Qwen35Schema, QwenFp8CountsMatchTheRelease) {
  // 35B FP8: 64,196 tensors incl. 1,560 MTP; 122B predicted 76,656.
  const auto t35 = qwen35_tensors(qwen35_preset("35b-a3b"), Qwen35Layout::kQwenFp8);
  EXPECT_EQ(t35.size(), 64196u);
  size_t mtp = 0;
  for (const TensorDecl& t : t35) mtp += t.name.rfind("mtp.", 0) == 0;
  EXPECT_EQ(mtp, 1560u);
  EXPECT_EQ(qwen35_tensors(qwen35_preset("122b-a10b"), Qwen35Layout::kQwenFp8).size(), 76656u);
}

TEST(Qwen35Schema, Intel122bShapesAndSidecar) {
  const auto ts = qwen35_tensors(qwen35_preset("122b-a10b"), Qwen35Layout::kIntelInt4);
  EXPECT_EQ(count_if_file(ts, std::string(kMtpSidecarName)), 785u);  // BF16 MTP
  EXPECT_EQ(ts.size(), 110592u + 48 * 7 + 36 * 19 + 12 * 14 + 3 + 333 + 785);
  const auto m = by_name(ts);
  const std::string l0 = "model.language_model.layers.0.";
  const std::string l3 = "model.language_model.layers.3.";
  // checkpoint-formats.md §2.10.
  auto shape = [&](const std::string& n) { return m.at(n)->shape; };
  EXPECT_EQ(shape(l0 + "mlp.experts.0.gate_proj.qweight"), (Shape{384, 1024}));
  EXPECT_EQ(shape(l0 + "mlp.experts.255.down_proj.qzeros"), (Shape{8, 384}));
  EXPECT_EQ(shape(l0 + "mlp.experts.7.down_proj.scales"), (Shape{8, 3072}));
  EXPECT_EQ(shape(l0 + "linear_attn.in_proj_qkv.qweight"), (Shape{384, 12288}));
  EXPECT_EQ(shape(l0 + "linear_attn.in_proj_z.qzeros"), (Shape{24, 1024}));
  EXPECT_EQ(shape(l0 + "linear_attn.in_proj_a.qzeros"), (Shape{24, 8}));
  EXPECT_EQ(shape(l0 + "linear_attn.out_proj.qweight"), (Shape{1024, 3072}));
  EXPECT_EQ(shape(l3 + "self_attn.q_proj.qweight"), (Shape{384, 16384}));
  EXPECT_EQ(shape(l3 + "self_attn.k_proj.scales"), (Shape{24, 512}));
  EXPECT_EQ(shape(l3 + "self_attn.o_proj.qzeros"), (Shape{64, 384}));
  EXPECT_EQ(m.at(l0 + "mlp.shared_expert.down_proj.weight")->dtype, DType::kBF16);
  EXPECT_EQ(shape(l0 + "mlp.shared_expert.down_proj.weight"), (Shape{3072, 1024}));
  EXPECT_EQ(shape(l0 + "mlp.shared_expert_gate.weight"), (Shape{1, 3072}));
  EXPECT_EQ(shape("lm_head.weight"), (Shape{248320, 3072}));
  EXPECT_EQ(shape("mtp.fc.weight"), (Shape{3072, 6144}));
  EXPECT_EQ(m.at("mtp.layers.0.mlp.experts.0.up_proj.weight")->file, kMtpSidecarName);
  EXPECT_EQ(m.count(l0 + "mlp.experts.0.gate_proj.weight"), 0u);  // INT4: no .weight
}

TEST(Qwen35Schema, Fp8ScaleGridsAndBf16Release) {
  const auto fp8_list = qwen35_tensors(qwen35_preset("122b-a10b"), Qwen35Layout::kQwenFp8);
  const auto fp8 = by_name(fp8_list);
  const std::string l0 = "model.language_model.layers.0.";
  EXPECT_EQ(fp8.at(l0 + "mlp.shared_expert.gate_proj.weight_scale_inv")->shape, (Shape{8, 24}));
  EXPECT_EQ(fp8.at(l0 + "mlp.shared_expert.down_proj.weight_scale_inv")->shape, (Shape{24, 8}));
  EXPECT_EQ(fp8.at(l0 + "mlp.shared_expert.down_proj.weight")->dtype, DType::kF8E4M3);
  EXPECT_EQ(fp8.at(l0 + "linear_attn.in_proj_a.weight")->dtype, DType::kBF16);
  EXPECT_EQ(fp8.at(l0 + "linear_attn.A_log")->dtype, DType::kF32);

  const auto bf_list = qwen35_tensors(qwen35_preset("35b-a3b"), Qwen35Layout::kBf16);
  const auto bf = by_name(bf_list);
  EXPECT_EQ(bf.at(l0 + "mlp.experts.gate_up_proj")->shape, (Shape{256, 1024, 2048}));
  EXPECT_EQ(bf.at(l0 + "mlp.experts.down_proj")->shape, (Shape{256, 2048, 512}));
  EXPECT_EQ(bf.at(l0 + "linear_attn.conv1d.weight")->shape, (Shape{8192, 1, 4}));
  EXPECT_EQ(bf.at(l0 + "linear_attn.norm.weight")->dtype, DType::kF32);
  EXPECT_EQ(bf.count("mtp.layers.0.mlp.experts.gate_up_proj"), 0u);  // MTP experts per-expert
  EXPECT_EQ(bf.at("mtp.layers.0.mlp.experts.255.down_proj.weight")->shape, (Shape{2048, 512}));
  size_t visual = 0;
  for (const auto& [name, d] : bf) visual += name.rfind("model.visual.", 0) == 0;
  EXPECT_EQ(visual, 333u);
}

TEST(Qwen35Schema, LayerPrefixAndOptions) {
  SchemaOptions o;
  o.layers = 2;
  o.mtp = false;
  o.vision = false;
  const auto ts = qwen35_tensors(qwen35_preset("tiny"), Qwen35Layout::kIntelInt4, o);
  for (const TensorDecl& t : ts) {
    EXPECT_EQ(t.name.find("layers.2."), std::string::npos) << t.name;
    EXPECT_NE(t.name.rfind("mtp.", 0), 0u) << t.name;
    EXPECT_TRUE(t.file.empty());
  }
}

TEST(Qwen35Config, JsonRoundTripAndErrors) {
  for (const std::string& p : qwen35_preset_names()) {
    const Qwen35Config c = qwen35_preset(p);
    const Qwen35Config back = qwen35_config_from_json(qwen35_config_json(c), "config.json");
    EXPECT_EQ(back.full_attention, c.full_attention) << p;
    EXPECT_EQ(back.hidden_size, c.hidden_size);
    EXPECT_EQ(back.linear_num_value_heads, c.linear_num_value_heads);
    EXPECT_EQ(back.num_experts, c.num_experts);
    EXPECT_EQ(back.vision.depth, c.vision.depth);
    EXPECT_EQ(qwen35_tensors(back, Qwen35Layout::kQwenFp8).size(),
              qwen35_tensors(c, Qwen35Layout::kQwenFp8).size());
  }
  EXPECT_THROW(qwen35_preset("7b"), Error);
  EXPECT_THROW(qwen35_config_from_json("{\"model_type\": \"llama\"}", "c"), Error);
  EXPECT_THROW(qwen35_config_from_json("{\"model_type\": \"qwen3_5_moe\", \"text_config\": "
                                       "{\"hidden_size\": -1}}",
                                       "c"),
               Error);
  EXPECT_THROW(qwen35_config_from_json("{", "c"), Error);
  // What fuzz_config found: a model_type of the wrong type threw nlohmann's error, 10^12
  // layers sized a 125 GB table, interval 0 divided by zero. Each is now a config error.
  const auto code = [](const std::string& text) {
    return qf::test::error_code([&] { qwen35_config_from_json(text, "c"); });
  };
  const std::string base = R"({"model_type": "qwen3_5_moe", "hidden_size": 64, )"
                           R"("num_attention_heads": 2, "num_key_value_heads": 1, )"
                           R"("linear_num_value_heads": 4, "num_experts": 4, )"
                           R"("moe_intermediate_size": 32, )";
  EXPECT_NO_THROW(qwen35_config_from_json(base + R"("num_hidden_layers": 4})", "c"));
  EXPECT_EQ(code(R"({"model_type": 5})"), Errc::kConfigInvalid);
  EXPECT_EQ(code(base + R"("num_hidden_layers": 1000000000000})"), Errc::kConfigInvalid);
  EXPECT_EQ(code(base + R"("num_hidden_layers": 4, "full_attention_interval": 0})"),
            Errc::kConfigInvalid);
  // fuzz_validate: 2^63 - 1 MTP layers listed expected tensors until memory ran out.
  EXPECT_EQ(code(base + R"("num_hidden_layers": 4, "mtp_num_hidden_layers": 9223372036854775807})"),
            Errc::kConfigInvalid);
  EXPECT_EQ(code(base + R"("num_hidden_layers": 4, "head_dim": 1099511627776})"),
            Errc::kConfigInvalid);
  EXPECT_EQ(code(base + R"("num_hidden_layers": 4, "num_experts_per_tok": 5})"),
            Errc::kConfigInvalid);
}

TEST(ShardPlan, GreedyBySizeAndEvenByCount) {
  EXPECT_EQ(plan_shards_by_size({4, 4, 4, 10, 1}, 8), (std::vector<size_t>{0, 0, 1, 2, 3}));
  EXPECT_EQ(plan_shards_by_size({}, 8), (std::vector<size_t>{}));
  EXPECT_EQ(plan_shards_by_count({1, 1, 1, 1, 1, 1}, 3), (std::vector<size_t>{0, 0, 1, 1, 2, 2}));
  // One huge tensor: still exactly n non-empty shards, in order.
  const auto s = plan_shards_by_count({1, 1, 100, 1, 1, 1}, 4);
  EXPECT_EQ(s.back(), 3u);
  for (size_t i = 1; i < s.size(); ++i) EXPECT_LE(s[i] - s[i - 1], 1u);
  EXPECT_EQ(plan_shards_by_count({5, 5}, 7), (std::vector<size_t>{0, 1}));
  EXPECT_EQ(shard_file_name(0, 14), "model-00001-of-00014.safetensors");
}

}  // namespace
}  // namespace qf::ckpt
