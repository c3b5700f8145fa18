// synth --from: every output tensor against its source (quantized modules re-quantized from the
// source slab, copies byte-identical, F32 -> BF16 rounded), determinism, failure modes.
#include <gtest/gtest.h>

#include <cstring>

#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/file_io.h"
#include "qf/quant/formats.h"
#include "qf/quant/fp8_block.h"
#include "qf/quant/int4.h"
#include "qf/quant/synth.h"
#include "test_support.h"

namespace qf::quant {
namespace {

namespace fs = std::filesystem;
using ckpt::DType;

std::string bytes_of(const ckpt::TensorView& v) {
  return {reinterpret_cast<const char*>(v.bytes.data()), v.bytes.size()};
}

class SynthFrom : public ::testing::Test {
 protected:
  void SetUp() override {
    SynthOptions o;
    o.seed = 21;
    o.shards = 2;
    synth_checkpoint(ckpt::qwen35_preset("tiny"), dir_ / "bf16", o);
    qf::test::write_file(dir_ / "bf16" / "tokenizer.json", "{\"model\": {}}");
  }
  SynthOptions target(ckpt::Qwen35Layout layout, int threads = 2) const {
    SynthOptions o;
    o.layout = layout;
    o.threads = threads;
    return o;
  }
  qf::test::TempDir dir_;
};

// The source weight [n, k] of a module, from a per-expert name or the fused 3-D tensors.
std::vector<uint16_t> source_weight(const ckpt::Checkpoint& src, const ckpt::TensorDecl& d) {
  std::vector<uint16_t> w(static_cast<size_t>(d.n * d.k));
  if (const ckpt::TensorRef* r = src.find(d.module + ".weight")) {
    std::memcpy(w.data(), src.view(r->info->name).bytes.data(), w.size() * 2);
    return w;
  }
  const size_t at = d.module.rfind(".experts.");
  const std::string rest = d.module.substr(at + 9);  // "<e>.<proj>"
  const int64_t e = std::stoll(rest.substr(0, rest.find('.')));
  const std::string proj = rest.substr(rest.find('.') + 1);
  const std::string prefix = d.module.substr(0, at) + ".experts.";
  const auto fused = src.view(prefix + (proj == "down_proj" ? "down_proj" : "gate_up_proj"));
  const int64_t per_expert = (proj == "down_proj" ? 1 : 2) * d.n * d.k;
  const int64_t skip = proj == "up_proj" ? d.n * d.k : 0;
  std::memcpy(w.data(), fused.bytes.data() + (e * per_expert + skip) * 2, w.size() * 2);
  return w;
}

TEST_F(SynthFrom, EveryTensorFollowsFromItsSource) {
  for (auto layout : {ckpt::Qwen35Layout::kIntelInt4, ckpt::Qwen35Layout::kQwenFp8}) {
    SCOPED_TRACE(std::string(ckpt::layout_name(layout)));
    const fs::path out = dir_ / std::string(ckpt::layout_name(layout));
    const SynthPlan plan = synth_from_checkpoint(dir_ / "bf16", out, target(layout));
    const ckpt::Checkpoint src = ckpt::Checkpoint::open(dir_ / "bf16");
    const ckpt::Checkpoint dst = ckpt::Checkpoint::open(out);
    EXPECT_EQ(dst.n_tensors(), plan.tensors.size());
    EXPECT_TRUE(fs::exists(out / "tokenizer.json"));
    Fp8BlockOptions fp8;
    fp8.scale_dtype = DType::kBF16;
    size_t n_int4 = 0, n_fp8 = 0, n_copy = 0, n_conv = 0;
    for (const ckpt::TensorDecl& d : plan.tensors) {
      const std::string got = bytes_of(dst.view(d.name));
      if (d.format == ckpt::LinearFormat::kBf16) {
        const ckpt::TensorRef* s = src.find(d.name);
        ASSERT_NE(s, nullptr) << d.name;
        if (s->info->dtype == d.dtype) {
          ASSERT_EQ(got, bytes_of(src.view(d.name))) << d.name;
          ++n_copy;
        } else {  // F32 A_log / gated norm stored as BF16 by Intel's layout
          ASSERT_EQ(s->info->dtype, DType::kF32) << d.name;
          const auto f = src.view(d.name).as<float>();
          const auto h = dst.view(d.name).as<uint16_t>();
          for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(h[i], f32_to_bf16(f[i])) << d.name;
          ++n_conv;
        }
        continue;
      }
      const auto w = source_weight(src, d);
      const MatrixView mv(w.data(), DType::kBF16, d.n, d.k);
      std::string want;
      if (d.format == ckpt::LinearFormat::kInt4) {
        const Int4Tensors q = quantize_int4(mv, {});
        const auto& v = d.role == ckpt::TensorRole::kQWeight ? q.qweight : q.qzeros;
        want =
            d.role == ckpt::TensorRole::kQScales
                ? std::string(reinterpret_cast<const char*>(q.scales.data()), q.scales.size() * 2)
                : std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
        ++n_int4;
      } else {
        const Fp8BlockTensors q = quantize_fp8_block(mv, fp8);
        const auto& v = d.role == ckpt::TensorRole::kFp8Weight ? q.codes : q.scales;
        want.assign(reinterpret_cast<const char*>(v.data()), v.size());
        ++n_fp8;
      }
      ASSERT_EQ(got, want) << d.name;
    }
    EXPECT_GT(n_int4 + n_fp8, 100u);
    EXPECT_GT(n_copy, 50u);
    if (layout == ckpt::Qwen35Layout::kIntelInt4) {
      EXPECT_EQ(n_conv, 6u);  // 3 GDN layers x (A_log, norm)
    }
  }
}

TEST_F(SynthFrom, DeterministicAcrossThreads) {
  synth_from_checkpoint(dir_ / "bf16", dir_ / "a", target(ckpt::Qwen35Layout::kIntelInt4, 1));
  synth_from_checkpoint(dir_ / "bf16", dir_ / "b", target(ckpt::Qwen35Layout::kIntelInt4, 4));
  for (const auto& e : fs::directory_iterator(dir_ / "a")) {
    EXPECT_EQ(qf::test::read_file(e.path()), qf::test::read_file(dir_ / "b" / e.path().filename()))
        << e.path().filename();
  }
}

TEST_F(SynthFrom, FailsBeforeWritingOnABadSource) {
  auto expect_error = [&](Errc code, const std::string& needle) {
    try {
      synth_from_checkpoint(dir_ / "bf16", dir_ / "out", target(ckpt::Qwen35Layout::kIntelInt4));
      FAIL() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(dir_ / "out"));
    EXPECT_FALSE(fs::exists(dir_ / "out.tmp"));
  };
  // The config promises a layer the tensors do not have.
  std::string cfg = qf::test::read_file(dir_ / "bf16" / "config.json");
  const ckpt::Qwen35Config c = ckpt::qwen35_config_from_json(cfg, "config.json");
  ckpt::Qwen35Config bigger = c;
  bigger.full_attention = ckpt::qwen35_layer_types(5);
  qf::test::write_file(dir_ / "bf16" / "config.json", ckpt::qwen35_config_json(bigger));
  expect_error(Errc::kTensorNotFound, "layers.4.");
  // A different hidden size: every shape is off.
  ckpt::Qwen35Config wider = c;
  wider.hidden_size = 384;
  qf::test::write_file(dir_ / "bf16" / "config.json", ckpt::qwen35_config_json(wider));
  expect_error(Errc::kUnsupported, "expected");
  qf::test::write_file(dir_ / "bf16" / "config.json", cfg);
  try {
    synth_from_checkpoint(dir_ / "bf16", dir_ / "out", target(ckpt::Qwen35Layout::kBf16));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kUsage);
  }
}

}  // namespace
}  // namespace qf::quant
