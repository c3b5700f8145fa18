// Recipes: the shipped recipes parse, pin the sizes of the models they name, and run end to end
// on scaled-down synthetic checkpoints of the same layout; bad recipes and failing steps leave
// nothing behind.
#include <gtest/gtest.h>

#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/qwen35_config.h"
#include "qf/ckpt/validate.h"
#include "qf/error.h"
#include "qf/quant/model_check.h"
#include "qf/quant/recipe.h"
#include "qf/quant/synth.h"
#include "test_support.h"

namespace qf::quant {
namespace {

namespace fs = std::filesystem;

const fs::path kRecipes = QF_RECIPE_DIR;

struct Shipped {
  const char* file;
  const char* preset;
};
const Shipped kShipped[] = {{"qwen3.5-122b-a10b-spark.json", "122b-a10b"},
                            {"qwen3.5-35b-a3b-spark.json", "35b-a3b"}};

TEST(Recipe, ShippedRecipesPinTheirModelsSizes) {
  for (const Shipped& s : kShipped) {
    const Recipe r = load_recipe(kRecipes / s.file);
    const ckpt::Qwen35Config c = ckpt::qwen35_preset(s.preset);
    EXPECT_EQ(r.model.at("hidden_size"), c.hidden_size) << s.file;
    EXPECT_EQ(r.model.at("num_hidden_layers"), c.num_layers()) << s.file;
    EXPECT_EQ(r.model.at("num_experts"), c.num_experts) << s.file;
    EXPECT_EQ(r.model.at("moe_intermediate_size"), c.moe_intermediate_size) << s.file;
    EXPECT_EQ(r.model.at("vocab_size"), c.vocab_size) << s.file;
    EXPECT_EQ(r.steps.front().step, "build-hybrid");
    EXPECT_EQ(r.steps.back().step, "validate");
  }
}

// Each shipped recipe on a tiny model in its release's layout (the 35B's Intel checkpoint keeps
// the MTP experts and attention in INT4).
TEST(Recipe, RunsEndToEndOnScaledDownInputs) {
  for (const Shipped& s : kShipped) {
    SCOPED_TRACE(s.file);
    const Recipe r = load_recipe(kRecipes / s.file);
    qf::test::TempDir t;
    synth_checkpoint(ckpt::qwen35_preset("tiny"), t / "bf16", {});
    SynthOptions i4;
    i4.layout = ckpt::Qwen35Layout::kIntelInt4;
    i4.schema.mtp_int4 = r.intel_mtp_int4;
    i4.shards = 2;
    synth_from_checkpoint(t / "bf16", t / "int4", i4);
    SynthOptions f8;
    f8.layout = ckpt::Qwen35Layout::kQwenFp8;
    synth_from_checkpoint(t / "bf16", t / "fp8", f8);

    EXPECT_EQ(qf::test::error_code([&] { run_recipe(r, t / "int4", t / "fp8", t / "out", {}); }),
              Errc::kUnsupported);  // a 4-layer model is not the recipe's
    RecipeRunOptions o;
    o.any_size = true;
    const RecipeReport rep = run_recipe(r, t / "int4", t / "fp8", t / "out", o);
    ASSERT_EQ(rep.steps.size(), r.steps.size());
    EXPECT_EQ(rep.steps[0].report["replaced"], 4 * 3 + 3);  // 4 layers + the MTP layer
    EXPECT_EQ(rep.steps[1].report["added"], 0);             // build-hybrid kept the MTP listed
    EXPECT_EQ(rep.steps[3].report["checksums"], "verified");
    EXPECT_FALSE(fs::exists(t / "out.recipe.tmp"));

    std::vector<ckpt::Problem> problems;
    const ckpt::Checkpoint c = ckpt::Checkpoint::open(t / "out");
    const ModelCheckStats st = check_qwen35_model(c, {}, problems);
    EXPECT_TRUE(problems.empty()) << ckpt::format_problem(problems[0]);
    EXPECT_EQ(st.modules_by_format.at("fp8"), 15u);
    EXPECT_EQ(st.modules_by_format.at("int8"), 1u);
    EXPECT_NE(c.find("mtp.layers.0.mlp.shared_expert.up_proj.weight_scale_inv"), nullptr);
    EXPECT_EQ(c.find("mtp.layers.0.self_attn.q_proj.qweight") != nullptr, r.intel_mtp_int4);
  }
}

TEST(Recipe, AFailingStepLeavesNothing) {
  qf::test::TempDir t;
  synth_checkpoint(ckpt::qwen35_preset("tiny"), t / "bf16", {});
  SynthOptions i4;
  i4.layout = ckpt::Qwen35Layout::kIntelInt4;
  synth_from_checkpoint(t / "bf16", t / "int4", i4);
  SynthOptions f8;
  f8.layout = ckpt::Qwen35Layout::kQwenFp8;
  synth_from_checkpoint(t / "bf16", t / "fp8", f8);
  Recipe r = load_recipe(kRecipes / kShipped[0].file);
  r.steps[2].params["min_mean_row_cosine"] = 1.5;  // unreachable
  RecipeRunOptions o;
  o.any_size = true;
  EXPECT_EQ(qf::test::error_code([&] { run_recipe(r, t / "int4", t / "fp8", t / "out", o); }),
            Errc::kUnsupported);
  EXPECT_FALSE(fs::exists(t / "out"));
  EXPECT_FALSE(fs::exists(t / "out.recipe.tmp"));
  EXPECT_EQ(qf::test::error_code([&] { run_recipe(r, t / "missing", t / "fp8", t / "out", o); }),
            Errc::kIo);
}

TEST(Recipe, StrictParsing) {
  const std::string ok =
      R"({"recipe": "x", "steps": [{"step": "build-hybrid"}, {"step": "validate"}]})";
  EXPECT_EQ(parse_recipe(ok, "ok").steps.size(), 2u);
  const char* bad[] = {
      "[]",
      R"({"steps": [{"step": "build-hybrid"}, {"step": "validate"}]})",
      R"({"recipe": "x", "stpes": []})",
      R"({"recipe": "x", "steps": []})",
      R"({"recipe": "x", "steps": [{"step": "build-hybrid"}, {"step": "frobnicate"}, {"step": "validate"}]})",
      R"({"recipe": "x", "steps": [{"step": "build-hybrid", "mtp": "yes"}, {"step": "validate"}]})",
      R"({"recipe": "x", "steps": [{"step": "build-hybrid", "min_cosin": 0.9}, {"step": "validate"}]})",
      R"({"recipe": "x", "steps": [{"step": "validate"}]})",
      R"({"recipe": "x", "steps": [{"step": "build-hybrid"}, {"step": "add-mtp"}]})",
      R"({"recipe": "x", "steps": [{"step": "build-hybrid"}, {"step": "build-hybrid"}, {"step": "validate"}]})",
      R"({"recipe": "x", "model": {"hiden_size": 1}, "steps": [{"step": "build-hybrid"}, {"step": "validate"}]})",
      R"({"recipe": "x", "steps": [{"step": "build-hybrid"}, {"step": "quantize-lm-head", "samples": -1}, {"step": "validate"}]})",
      R"({"recipe": "x", "steps": [{"step": "build-hybrid"}, {"step": "quantize-lm-head", "bits": 6}, {"step": "validate"}]})",
      // Members of the wrong type (fuzz_config: a description object threw nlohmann's error).
      R"({"recipe": "x", "description": {"a": 1}, "steps": [{"step": "build-hybrid"}, {"step": "validate"}]})",
      R"({"recipe": "x", "sources": ["a"], "steps": [{"step": "build-hybrid"}, {"step": "validate"}]})",
      R"({"recipe": "x", "model": 5, "steps": [{"step": "build-hybrid"}, {"step": "validate"}]})",
      R"({"recipe": "x", "layout": null, "steps": [{"step": "build-hybrid"}, {"step": "validate"}]})",
  };
  for (const char* text : bad) {
    EXPECT_EQ(qf::test::error_code([&] { parse_recipe(text, "bad.json"); }), Errc::kConfigInvalid)
        << text;
  }
  EXPECT_EQ(qf::test::error_code([&] { load_recipe("/nonexistent/recipe.json"); }), Errc::kIo);
}

}  // namespace
}  // namespace qf::quant
