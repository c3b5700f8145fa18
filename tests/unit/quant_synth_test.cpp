// Synthetic checkpoints: determinism, layouts that validate, sparse zeros, atomic output.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>

#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/validate.h"
#include "qf/quant/formats.h"
#include "qf/quant/synth.h"
#include "test_support.h"

namespace qf::quant {
namespace {

namespace fs = std::filesystem;
using qf::test::TempDir;

SynthOptions opts(ckpt::Qwen35Layout layout, size_t shards, int threads) {
  SynthOptions o;
  o.layout = layout;
  o.shards = shards;
  o.threads = threads;
  o.seed = 7;
  return o;
}

TEST(Synth, EveryLayoutValidates) {
  TempDir dir;
  for (auto layout :
       {ckpt::Qwen35Layout::kBf16, ckpt::Qwen35Layout::kIntelInt4, ckpt::Qwen35Layout::kQwenFp8}) {
    const fs::path out = dir / std::string(ckpt::layout_name(layout));
    const SynthPlan plan = synth_checkpoint(ckpt::qwen35_preset("tiny"), out, opts(layout, 3, 2));
    const ckpt::ValidateReport r = ckpt::validate_checkpoint(out, {});
    EXPECT_TRUE(r.ok()) << ckpt::format_problem(r.problems.at(0));
    EXPECT_EQ(r.n_tensors, plan.tensors.size());
    EXPECT_EQ(r.tensor_bytes, plan.tensor_bytes);
    EXPECT_FALSE(fs::exists(dir / (std::string(ckpt::layout_name(layout)) + ".tmp")));
  }
  EXPECT_TRUE(fs::exists(dir / "intel-int4" / "model_extra_tensors.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "intel-int4" / "quantization_config.json"));
}

TEST(Synth, ByteIdenticalAcrossThreadCounts) {
  TempDir dir;
  synth_checkpoint(ckpt::qwen35_preset("tiny"), dir / "a",
                   opts(ckpt::Qwen35Layout::kIntelInt4, 2, 1));
  synth_checkpoint(ckpt::qwen35_preset("tiny"), dir / "b",
                   opts(ckpt::Qwen35Layout::kIntelInt4, 2, 3));
  for (const auto& e : fs::directory_iterator(dir / "a")) {
    EXPECT_EQ(qf::test::read_file(e.path()), qf::test::read_file(dir / "b" / e.path().filename()))
        << e.path().filename();
  }
}

TEST(Synth, ChunkedGenerationEqualsOneShot) {
  ckpt::TensorDecl d;
  d.name = "x.weight";
  d.shape = {1000};
  std::vector<std::byte> whole(2000), parts(2000);
  synth_tensor_bytes(d, SynthValues::kRandom, 3, 0, whole);
  synth_tensor_bytes(d, SynthValues::kRandom, 3, 0, {parts.data(), 602});
  synth_tensor_bytes(d, SynthValues::kRandom, 3, 602, {parts.data() + 602, 1398});
  EXPECT_EQ(whole, parts);
  std::vector<std::byte> other(2000);
  synth_tensor_bytes(d, SynthValues::kRandom, 4, 0, other);  // another seed, other values
  EXPECT_NE(whole, other);
}

TEST(Synth, ValuesHaveTheirRolesMagnitudesAndConstants) {
  TempDir dir;
  synth_checkpoint(ckpt::qwen35_preset("tiny"), dir / "m",
                   opts(ckpt::Qwen35Layout::kIntelInt4, 1, 1));
  const ckpt::Checkpoint c = ckpt::Checkpoint::open(dir / "m");
  const std::string l0 = "model.language_model.layers.0.";
  for (uint32_t w : c.view(l0 + "mlp.experts.3.up_proj.qzeros").as<uint32_t>()) {
    ASSERT_EQ(w, 0x77777777u);
  }
  size_t negative = 0, n = 0;
  for (uint16_t h : c.view(l0 + "mlp.experts.3.up_proj.scales").as<uint16_t>()) {
    const float s = f16_to_f32(h);
    ASSERT_GT(std::abs(s), 1e-3f);
    ASSERT_LT(std::abs(s), 2e-2f);
    negative += s < 0;
    ++n;
  }
  EXPECT_GT(negative, n / 4);  // signed scales, as AutoRound writes them
  EXPECT_LT(negative, 3 * n / 4);
  double sum_sq = 0;
  const auto w = c.view(l0 + "mlp.shared_expert.up_proj.weight").as<uint16_t>();
  for (uint16_t h : w) sum_sq += bf16_to_f32(h) * bf16_to_f32(h);
  const double rms = std::sqrt(sum_sq / static_cast<double>(w.size()));
  EXPECT_NEAR(rms, 0.02, 0.002);
}

TEST(Synth, ZerosAreSparseAndStillValid) {
  TempDir dir;
  SynthOptions o = opts(ckpt::Qwen35Layout::kBf16, 1, 1);
  o.values = SynthValues::kZeros;
  synth_checkpoint(ckpt::qwen35_preset("tiny"), dir / "z", o);
  const fs::path shard = dir / "z" / "model-00001-of-00001.safetensors";
  struct stat st {};
  ASSERT_EQ(::stat(shard.c_str(), &st), 0);
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, static_cast<uint64_t>(st.st_size) / 2)
      << "zeros should leave holes";
  EXPECT_TRUE(ckpt::validate_checkpoint(dir / "z", {}).ok());
  const ckpt::Checkpoint c = ckpt::Checkpoint::open(dir / "z");
  for (std::byte b : c.view("lm_head.weight").bytes) ASSERT_EQ(b, std::byte{0});
}

TEST(Synth, RefusesExistingOutputUnlessForced) {
  TempDir dir;
  fs::create_directories(dir / "out");
  qf::test::write_file(dir / "out" / "keep", "x");
  try {
    synth_checkpoint(ckpt::qwen35_preset("tiny"), dir / "out",
                     opts(ckpt::Qwen35Layout::kBf16, 1, 1));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kExists);
  }
  EXPECT_TRUE(fs::exists(dir / "out" / "keep"));
  SynthOptions o = opts(ckpt::Qwen35Layout::kBf16, 1, 1);
  o.overwrite = true;
  synth_checkpoint(ckpt::qwen35_preset("tiny"), dir / "out", o);
  EXPECT_FALSE(fs::exists(dir / "out" / "keep"));
  EXPECT_TRUE(ckpt::validate_checkpoint(dir / "out", {}).ok());
}

}  // namespace
}  // namespace qf::quant
