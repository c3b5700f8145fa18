// dequantize: Qwen's BF16 layout back from every format. A BF16 release comes back byte for
// byte; INT4 and FP8 modules equal libquant's whole-matrix dequantizers (golden-tested against
// torch and AutoRound) rounded to BF16; fused experts stack gate rows first. The numpy
// reference of the e2e test (tests/e2e/dequant_reference.py) checks the same from the spec.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ckpt_edit.h"
#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/validate.h"
#include "qf/error.h"
#include "qf/quant/dequantize.h"
#include "qf/quant/formats.h"
#include "qf/quant/fp8_block.h"
#include "qf/quant/int4.h"
#include "qf/quant/model_check.h"
#include "qf/quant/synth.h"
#include "quant_fixture.h"
#include "test_support.h"

namespace qf::quant {
namespace {

namespace fs = std::filesystem;

class Dequantize : public qf::test::TinySourcesTest {
 protected:
  static std::string bytes(const ckpt::Checkpoint& c, const std::string& name) {
    const auto v = c.view(name).bytes;
    return {reinterpret_cast<const char*>(v.data()), v.size()};
  }
};

std::string bf16_bytes(const std::vector<float>& f) {
  std::string out(f.size() * 2, '\0');
  for (size_t i = 0; i < f.size(); ++i) {
    const uint16_t h = f32_to_bf16(f[i]);
    std::memcpy(&out[i * 2], &h, 2);
  }
  return out;
}

TEST_F(Dequantize, Bf16ComesBackByteForByte) {
  const DequantizeReport r = dequantize_checkpoint(d("bf16"), d("bf16-out"), {});
  EXPECT_TRUE(r.mtp);
  EXPECT_TRUE(r.vision);
  const ckpt::Checkpoint a = ckpt::Checkpoint::open(d("bf16")),
                         b = ckpt::Checkpoint::open(d("bf16-out"));
  ASSERT_EQ(a.n_tensors(), b.n_tensors());
  for (const auto& f : a.tensor_files()) {
    for (const auto& t : f.tensors()) EXPECT_EQ(bytes(a, t.name), bytes(b, t.name)) << t.name;
  }
  const auto cfg = nlohmann::json::parse(qf::test::read_file(d("bf16-out") / "config.json"));
  EXPECT_FALSE(cfg.contains("quantization_config"));
  EXPECT_EQ(ckpt::validate_checkpoint(d("bf16-out"), {.checksums = true}).checksums,
            ckpt::ChecksumAction::kVerified);
}

TEST_F(Dequantize, Int4AndFp8ModulesAsTheirDequantizers) {
  dequantize_checkpoint(d("intel-int4"), d("int4-out"), {});
  dequantize_checkpoint(d("qwen-fp8"), d("fp8-out"), {});
  const ckpt::Checkpoint i4 = ckpt::Checkpoint::open(d("intel-int4"));
  const ckpt::Checkpoint f8 = ckpt::Checkpoint::open(d("qwen-fp8"));
  const ckpt::Checkpoint i4o = ckpt::Checkpoint::open(d("int4-out"));
  const ckpt::Checkpoint f8o = ckpt::Checkpoint::open(d("fp8-out"));
  const ckpt::Qwen35Config cfg = ckpt::qwen35_preset("tiny");
  const int64_t h = cfg.hidden_size, in = cfg.moe_intermediate_size;
  const std::string layer = "model.language_model.layers.0.";

  // Expert 1's gate and up of layer 0, from INT4, stacked into gate_up_proj[1].
  auto int4 = [&](const std::string& m, int64_t n, int64_t k) {
    Int4View v;
    v.qweight = i4.view(m + ".qweight").as<uint32_t>().data();
    v.qzeros = i4.view(m + ".qzeros").as<uint32_t>().data();
    v.scales = i4.view(m + ".scales").as<uint16_t>().data();
    v.n = n;
    v.k = k;
    std::vector<float> w(static_cast<size_t>(n * k));
    dequantize_int4(v, w.data());
    return bf16_bytes(w);
  };
  const std::string gate_up = bytes(i4o, layer + "mlp.experts.gate_up_proj");
  const size_t expert = static_cast<size_t>(2 * in * h * 2);
  EXPECT_EQ(gate_up.substr(expert, expert / 2), int4(layer + "mlp.experts.1.gate_proj", in, h));
  EXPECT_EQ(gate_up.substr(expert + expert / 2, expert / 2),
            int4(layer + "mlp.experts.1.up_proj", in, h));
  // Intel's BF16 A_log widened to the release's F32.
  EXPECT_EQ(i4o.find(layer + "linear_attn.A_log")->info->dtype, ckpt::DType::kF32);

  // An FP8 shared expert.
  const std::string m = layer + "mlp.shared_expert.down_proj";
  const auto* w = f8.find(m + ".weight")->info;
  const auto* s = f8.find(m + ".weight_scale_inv")->info;
  const int64_t n = static_cast<int64_t>(w->shape[0]), k = static_cast<int64_t>(w->shape[1]);
  std::vector<float> deq(static_cast<size_t>(n * k));
  dequantize_fp8_block(
      f8.view(m + ".weight").as<uint8_t>().data(),
      MatrixView(f8.view(m + ".weight_scale_inv").bytes.data(), s->dtype,
                 static_cast<int64_t>(s->shape[0]), static_cast<int64_t>(s->shape[1])),
      n, k, 128, 128, deq.data());
  EXPECT_EQ(bytes(f8o, m + ".weight"), bf16_bytes(deq));
  // MTP experts stay per expert, as in the release.
  EXPECT_NE(f8o.find("mtp.layers.0.mlp.experts.0.gate_proj.weight"), nullptr);
  // Both outputs pass the model checks in the BF16 layout.
  for (const char* out : {"int4-out", "fp8-out"}) {
    std::vector<ckpt::Problem> problems;
    const ModelCheckStats st = check_qwen35_model(ckpt::Checkpoint::open(d(out)), {}, problems);
    EXPECT_TRUE(problems.empty()) << out << ": " << ckpt::format_problem(problems[0]);
    EXPECT_EQ(st.modules_by_format.count("int4") + st.modules_by_format.count("fp8"), 0u) << out;
  }
}

TEST_F(Dequantize, Refusals) {
  fs::create_directories(d("exists"));
  EXPECT_EQ(qf::test::error_code([&] { dequantize_checkpoint(d("intel-int4"), d("exists"), {}); }),
            Errc::kExists);
  // An input that fails the model checks: a missing scale.
  qf::test::CheckpointEdit e;
  e.drop.insert("model.language_model.layers.0.mlp.experts.0.up_proj.scales");
  qf::test::copy_checkpoint(d("intel-int4"), d("broken"), e);
  EXPECT_EQ(qf::test::error_code([&] { dequantize_checkpoint(d("broken"), d("broken-out"), {}); }),
            Errc::kModelTensorMissing);
  // GPTQ v2 zeros (native auto_round packing) are not read.
  qf::test::CheckpointEdit v2;
  v2.config = [](std::string& text) {
    auto j = nlohmann::json::parse(text);
    j["quantization_config"]["packing_format"] = "auto_round";
    text = j.dump();
  };
  qf::test::copy_checkpoint(d("intel-int4"), d("v2"), v2);
  EXPECT_EQ(qf::test::error_code([&] { dequantize_checkpoint(d("v2"), d("v2-out"), {}); }),
            Errc::kUnsupported);
  // Not a Qwen3.5-MoE config.
  qf::test::CheckpointEdit other;
  other.config = [](std::string& text) {
    auto j = nlohmann::json::parse(text);
    j["model_type"] = "llama";
    text = j.dump();
  };
  qf::test::copy_checkpoint(d("bf16"), d("llama"), other);
  EXPECT_EQ(qf::test::error_code([&] { dequantize_checkpoint(d("llama"), d("llama-out"), {}); }),
            Errc::kUnsupported);
  for (const char* out : {"broken-out", "v2-out", "llama-out"}) {
    EXPECT_FALSE(fs::exists(d(out))) << out;
    EXPECT_FALSE(fs::exists(d(std::string(out) + ".tmp"))) << out;
  }
}

}  // namespace
}  // namespace qf::quant
