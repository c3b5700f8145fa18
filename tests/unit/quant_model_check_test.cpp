// Model-aware checks: every layout qforge writes passes; one malformed variant per rule fails
// with that rule's code and names the tensor.
#include <gtest/gtest.h>

#include "ckpt_edit.h"
#include "qf/ckpt/checkpoint.h"
#include "qf/quant/hybrid.h"
#include "qf/quant/model_check.h"
#include "qf/quant/synth.h"
#include "quant_fixture.h"
#include "test_support.h"

namespace qf::quant {
namespace {

namespace fs = std::filesystem;
using ckpt::DType;

class ModelCheck : public qf::test::TinySourcesTest {
 protected:
  static void SetUpTestSuite() {
    TinySourcesTest::SetUpTestSuite();
    build_hybrid(d("intel-int4"), d("qwen-fp8"), d("hybrid"), {});
  }

  static std::vector<ckpt::Problem> check(const fs::path& p, bool scan = false) {
    std::vector<ckpt::Problem> problems;
    const ckpt::Checkpoint c = ckpt::Checkpoint::open(p);
    ModelCheckOptions o;
    o.scan_values = scan;
    const ModelCheckStats s = check_qwen35_model(c, o, problems);
    EXPECT_TRUE(s.checked) << s.skipped_because;
    return problems;
  }
  // Exactly the problems of `code`, at least one, each naming a tensor containing `needle`.
  static void expect_only(const std::vector<ckpt::Problem>& ps, Errc code,
                          const std::string& needle) {
    ASSERT_FALSE(ps.empty());
    for (const ckpt::Problem& p : ps) {
      EXPECT_EQ(p.code, code) << ckpt::format_problem(p);
      EXPECT_NE(p.tensor.find(needle), std::string::npos) << ckpt::format_problem(p);
    }
  }
};

const std::string kL0 = "model.language_model.layers.0.";

TEST_F(ModelCheck, EveryLayoutPasses) {
  for (const char* layout : {"bf16", "intel-int4", "qwen-fp8", "hybrid"}) {
    const auto ps = check(d(layout), true);
    EXPECT_TRUE(ps.empty()) << layout << ": " << ckpt::format_problem(ps.front());
  }
}

TEST_F(ModelCheck, MissingTensor) {
  qf::test::copy_checkpoint(d("intel-int4"), d("missing"),
                            {.drop = {kL0 + "post_attention_layernorm.weight"}});
  expect_only(check(d("missing")), Errc::kModelTensorMissing, "post_attention_layernorm");
}

TEST_F(ModelCheck, MtpDeclaredButAbsent) {
  qf::test::CheckpointEdit e;
  const ckpt::Checkpoint c = ckpt::Checkpoint::open(d("intel-int4"));
  for (const auto& f : c.tensor_files()) {
    for (const auto& t : f.tensors()) {
      if (t.name.rfind("mtp.", 0) == 0) e.drop.insert(t.name);
    }
  }
  qf::test::copy_checkpoint(d("intel-int4"), d("no-mtp"), e);
  const auto ps = check(d("no-mtp"));
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].code, Errc::kModelTensorMissing);
  EXPECT_NE(ps[0].message.find("speculative decoding"), std::string::npos);
}

TEST_F(ModelCheck, UnexpectedTensor) {
  qf::test::copy_checkpoint(d("qwen-fp8"), d("extra"),
                            {.add = {{"lm_head.bias", {"lm_head.bias", DType::kBF16, {512}}}}});
  expect_only(check(d("extra")), Errc::kModelTensorUnexpected, "lm_head.bias");
}

TEST_F(ModelCheck, WrongDtypeOrShape) {
  qf::test::copy_checkpoint(d("bf16"), d("dtype"),
                            {.retype = {{kL0 + "input_layernorm.weight",
                                         {kL0 + "input_layernorm.weight", DType::kF16, {256}}}}});
  expect_only(check(d("dtype")), Errc::kModelTensorShape, "input_layernorm");
  qf::test::copy_checkpoint(
      d("hybrid"), d("shape"),
      {.retype = {{kL0 + "mlp.shared_expert.up_proj.weight_scale_inv",
                   {kL0 + "mlp.shared_expert.up_proj.weight_scale_inv", DType::kBF16, {2, 1}}}}});
  expect_only(check(d("shape")), Errc::kModelTensorShape, "weight_scale_inv");
}

TEST_F(ModelCheck, Int4TripletAgainstTheGroupSize) {
  // The config now claims groups of 64: every scales/qzeros shape is off.
  qf::test::copy_checkpoint(d("intel-int4"), d("group"), {.config = [](std::string& s) {
                              const size_t at = s.find("\"group_size\": 128");
                              ASSERT_NE(at, std::string::npos);
                              s.replace(at, 17, "\"group_size\": 64");
                            }});
  const auto ps = check(d("group"));
  ASSERT_GT(ps.size(), 100u);
  for (const auto& p : ps) {
    EXPECT_EQ(p.code, Errc::kModelTensorShape) << ckpt::format_problem(p);
    EXPECT_TRUE(p.tensor.find(".scales") != std::string::npos ||
                p.tensor.find(".qzeros") != std::string::npos)
        << p.tensor;
  }
}

TEST_F(ModelCheck, QZerosMustBeSymmetric) {
  const std::string q = kL0 + "mlp.experts.3.down_proj.qzeros";
  qf::test::copy_checkpoint(d("intel-int4"), d("zeros"),
                            {.patch = [&](const std::string& name, std::string& b) {
                              if (name == q) b[5] = 0x78;
                            }});
  expect_only(check(d("zeros")), Errc::kQZerosNotSymmetric, "experts.3.down_proj.qzeros");
}

TEST_F(ModelCheck, Fp8WeightWithoutScaleAndWeightBesideQweight) {
  qf::test::copy_checkpoint(d("hybrid"), d("noscale"),
                            {.drop = {kL0 + "mlp.shared_expert.down_proj.weight_scale_inv"}});
  expect_only(check(d("noscale")), Errc::kModelTensorMissing,
              "shared_expert.down_proj.weight_scale_inv");
  const std::string w = kL0 + "mlp.experts.1.up_proj.weight";
  qf::test::copy_checkpoint(d("intel-int4"), d("both"),
                            {.add = {{w, {w, DType::kBF16, {128, 256}}}}});
  const auto ps = check(d("both"));
  ASSERT_FALSE(ps.empty());
  EXPECT_EQ(ps[0].code, Errc::kModelTensorUnexpected);
  EXPECT_NE(ps[0].message.find("both weight and qweight"), std::string::npos);
}

TEST_F(ModelCheck, QuantizationConfigAgainstTensors) {
  // extra_config says an INT4-stored expert is 16-bit: INC would look for a BF16 weight.
  qf::test::copy_checkpoint(
      d("intel-int4"), d("qcfg"), {.config = [](std::string& s) {
        const size_t at = s.find("\"extra_config\": {");
        ASSERT_NE(at, std::string::npos);
        s.insert(at + 17,
                 "\"model.language_model.layers.0.mlp.experts.2.gate_proj\": {\"bits\": 16}, ");
      }});
  expect_only(check(d("qcfg")), Errc::kQuantConfigMismatch, "experts.2.gate_proj");
  // An FP8 checkpoint whose config has no quantization_config at all.
  qf::test::copy_checkpoint(d("qwen-fp8"), d("noqcfg"), {.config = [](std::string& s) {
                              const size_t at = s.find("\"quantization_config\"");
                              ASSERT_NE(at, std::string::npos);
                              s.replace(at, 21, "\"unused_config\"");
                            }});
  const auto ps = check(d("noqcfg"));
  ASSERT_EQ(ps.size(), 152u);  // every FP8 module
  EXPECT_EQ(ps[0].code, Errc::kQuantConfigMismatch);
}

TEST_F(ModelCheck, ScanValuesFindsNaN) {
  const std::string t = kL0 + "mlp.shared_expert.gate_proj.weight";
  qf::test::copy_checkpoint(d("bf16"), d("nan"),
                            {.patch = [&](const std::string& name, std::string& b) {
                              if (name == t)
                                b[101] = static_cast<char>(0x7F), b[100] = static_cast<char>(0xC0);
                            }});
  EXPECT_TRUE(check(d("nan"), false).empty());
  expect_only(check(d("nan"), true), Errc::kNonFiniteValues, "shared_expert.gate_proj");
}

// A config.json whose quantization members have the wrong type is one config problem naming
// the member, never an exception from inside the JSON library (fuzz_validate's cases).
TEST_F(ModelCheck, MalformedQuantizationConfigIsAProblemNamingTheMember) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"quant_method": "gptq", "sym": "yes"})", "quantization_config.sym"},
      {R"({"quant_method": 5})", "quantization_config.quant_method"},
      {R"({"quant_method": "auto-round", "bits": "4"})", "quantization_config.bits"},
      {R"({"quant_method": "fp8", "weight_block_size": []})",
       "quantization_config.weight_block_size"},
      {R"({"quant_method": "fp8", "weight_block_size": [0, 0]})",
       "quantization_config.weight_block_size"},
      {R"({"quant_method": "auto-round", "extra_config": {"lm_head": 8}})",
       "quantization_config.extra_config[\"lm_head\"]"},
      {R"("int4")", "quantization_config must be an object"},
  };
  for (const auto& [qcfg, member] : cases) {
    fs::remove_all(d("bad-qcfg"));
    qf::test::copy_checkpoint(d("hybrid"), d("bad-qcfg"), {.config = [&](std::string& s) {
                                nlohmann::json doc = nlohmann::json::parse(s);
                                doc["quantization_config"] = nlohmann::json::parse(qcfg);
                                s = doc.dump(2);
                              }});
    const std::vector<ckpt::Problem> ps = check(d("bad-qcfg"));
    ASSERT_EQ(ps.size(), 1u) << qcfg;
    EXPECT_EQ(ps[0].code, Errc::kConfigInvalid);
    EXPECT_NE(ps[0].message.find(member), std::string::npos) << ps[0].message;
  }
}

}  // namespace
}  // namespace qf::quant
