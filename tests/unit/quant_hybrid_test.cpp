// build-hybrid on synthetic checkpoints made from one BF16 model: what is replaced, what is
// copied byte for byte, the index, configs and manifest, and every refusal.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/file_io.h"
#include "qf/ckpt/validate.h"
#include "qf/ckpt/writer.h"
#include "qf/quant/hybrid.h"
#include "qf/quant/synth.h"
#include "test_support.h"

namespace qf::quant {
namespace {

namespace fs = std::filesystem;

std::string bytes_of(const ckpt::TensorView& v) {
  return {reinterpret_cast<const char*>(v.bytes.data()), v.bytes.size()};
}

class Hybrid : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new qf::test::TempDir();
    SynthOptions bf16;
    bf16.seed = 5;
    synth_checkpoint(ckpt::qwen35_preset("tiny"), *dir_ / "bf16", bf16);
    qf::test::write_file(*dir_ / "bf16" / "tokenizer.json", "{}");
    SynthOptions int4;
    int4.layout = ckpt::Qwen35Layout::kIntelInt4;
    int4.shards = 2;
    synth_from_checkpoint(*dir_ / "bf16", *dir_ / "int4", int4);
    SynthOptions fp8;
    fp8.layout = ckpt::Qwen35Layout::kQwenFp8;
    fp8.shards = 3;
    synth_from_checkpoint(*dir_ / "bf16", *dir_ / "fp8", fp8);
  }
  static void TearDownTestSuite() { delete dir_; }
  static fs::path d(const char* name) { return *dir_ / name; }
  static qf::test::TempDir* dir_;
};
qf::test::TempDir* Hybrid::dir_ = nullptr;

TEST_F(Hybrid, ReplacesSharedExpertsAndCopiesEverythingElse) {
  HybridOptions o;
  const HybridReport r = build_hybrid(d("int4"), d("fp8"), d("out"), o);
  EXPECT_EQ(r.n_main, 12u);  // 4 layers x gate/up/down
  EXPECT_EQ(r.n_mtp, 3u);
  EXPECT_EQ(r.n_unexpected, 0u);
  EXPECT_GT(r.min_cosine, 0.999);
  std::map<std::string, size_t> cats;
  for (const auto& c : r.unused) cats[c.name] = c.n_tensors;
  EXPECT_EQ(cats["routed-experts"], (4 + 1) * 8 * 3 * 2u);
  EXPECT_EQ(cats["int4-in-int4-checkpoint"], 3 * 8 + 1 * 8u);  // GDN 6+2, attention 8
  EXPECT_EQ(cats["bf16-in-int4-checkpoint"], 8u);              // MTP attention weights + scales

  const ckpt::Checkpoint in = ckpt::Checkpoint::open(d("int4"));
  const ckpt::Checkpoint fp8 = ckpt::Checkpoint::open(d("fp8"));
  const ckpt::Checkpoint out = ckpt::Checkpoint::open(d("out"));
  EXPECT_EQ(out.n_tensors(), in.n_tensors() + 15);
  std::set<std::string> replaced(r.modules.begin(), r.modules.end());
  for (const ckpt::SafetensorsFile& f : out.tensor_files()) {
    for (const ckpt::TensorInfo& t : f.tensors()) {
      const std::string module = t.name.substr(0, t.name.rfind('.'));
      if (replaced.count(module)) {
        ASSERT_EQ(bytes_of(out.view(t.name)), bytes_of(fp8.view(t.name))) << t.name;
        // Same shard as the BF16 weight it replaces.
        EXPECT_EQ(out.file_name(f), in.file_name(*in.find(module + ".weight")->file)) << t.name;
      } else {
        ASSERT_EQ(bytes_of(out.view(t.name)), bytes_of(in.view(t.name))) << t.name;
      }
    }
  }
  EXPECT_EQ(out.find("mtp.layers.0.mlp.shared_expert.up_proj.weight")->info->dtype,
            ckpt::DType::kF8E4M3);
  EXPECT_EQ(out.file_name(*out.find("mtp.fc.weight")->file), "model_extra_tensors.safetensors");
  EXPECT_TRUE(fs::exists(d("out") / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(d("out") / "quantization_config.json"));
  const auto cfg = nlohmann::json::parse(qf::test::read_file(d("out") / "config.json"));
  EXPECT_EQ(cfg["qforge"]["hybrid"]["modules"].size(), 15u);
  EXPECT_EQ(cfg["qforge"]["hybrid"]["weight_block_size"], nlohmann::json({128, 128}));
  EXPECT_EQ(cfg["quantization_config"]["packing_format"], "auto_round:auto_gptq");
  EXPECT_TRUE(r.config_edits.empty());  // shared experts are 16-bit in the INT4 config already
  ckpt::ValidateOptions vo;
  vo.checksums = true;  // the manifest written while writing must verify
  const ckpt::ValidateReport v = ckpt::validate_checkpoint(d("out"), vo);
  EXPECT_TRUE(v.ok()) << (v.problems.empty() ? "" : ckpt::format_problem(v.problems[0]));
  EXPECT_EQ(v.checksums, ckpt::ChecksumAction::kVerified);
}

// Output shards keep the input's data order with each FP8 weight in its BF16 weight's place and
// the scales last; unchanged tensors keep their file offsets modulo the block size, which is
// what lets a copy-on-write filesystem share them. There (TMPDIR on XFS or btrfs) the report
// counts the shared bytes; elsewhere nothing is shared and the output is the same.
TEST_F(Hybrid, KeepsTheInputLayoutSoUnchangedBytesCanBeShared) {
  HybridOptions o;
  const HybridReport r = build_hybrid(d("int4"), d("fp8"), d("layout"), o);
  const ckpt::Checkpoint in = ckpt::Checkpoint::open(d("int4"));
  const ckpt::Checkpoint out = ckpt::Checkpoint::open(d("layout"));
  uint64_t unchanged = 0;
  for (const ckpt::SafetensorsFile& f : out.tensor_files()) {
    std::vector<const ckpt::TensorInfo*> by_offset;
    for (const ckpt::TensorInfo& t : f.tensors()) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const auto* a, const auto* b) { return a->begin < b->begin; });
    uint64_t last_in = 0;
    bool scales = false;
    for (const ckpt::TensorInfo* t : by_offset) {
      const bool scale = t->name.ends_with(".weight_scale_inv");
      EXPECT_TRUE(scale || !scales) << t->name << " after the scales";
      scales |= scale;
      if (scale) continue;
      const ckpt::TensorRef* src = in.find(t->name);
      ASSERT_NE(src, nullptr) << t->name;
      EXPECT_EQ(in.file_name(*src->file), out.file_name(f)) << t->name;
      EXPECT_GE(src->info->begin, last_in) << t->name << " out of the input's order";
      last_in = src->info->begin;
      if (t->dtype != src->info->dtype) continue;  // a replaced weight
      unchanged += t->n_bytes();
      EXPECT_EQ((f.header().data_offset() + t->begin) % ckpt::kCloneBlock,
                (src->file->header().data_offset() + src->info->begin) % ckpt::kCloneBlock)
          << t->name;
      EXPECT_EQ(t->begin % (ckpt::dtype_bits(t->dtype) / 8), 0u) << t->name;
    }
    EXPECT_TRUE(scales) << out.file_name(f);
  }
  const ckpt::SafetensorsFile& first = in.tensor_files().front();
  if (ckpt::can_clone(first.path(), d(""))) {
    // Whole blocks of every run of unchanged tensors; the runs' ragged ends are copied.
    EXPECT_GT(r.bytes_shared, unchanged * 9 / 10);
    EXPECT_LE(r.bytes_shared, unchanged);
  } else {
    std::printf("note: %s does not share blocks; TMPDIR on XFS or btrfs tests sharing\n",
                d("").c_str());
    EXPECT_EQ(r.bytes_shared, 0u);
  }
}

TEST_F(Hybrid, DeterministicAndNoMtpOption) {
  // One thread hashes each file as it writes it; with two threads a file (the two output files
  // here), each is hashed from its sources by a task of its own. The files, the manifest among
  // them, are the same bytes.
  HybridOptions o;
  o.threads = 1;
  build_hybrid(d("int4"), d("fp8"), d("a"), o);
  o.threads = 4;
  build_hybrid(d("int4"), d("fp8"), d("b"), o);
  for (const auto& e : fs::directory_iterator(d("a"))) {
    EXPECT_EQ(qf::test::read_file(e.path()), qf::test::read_file(d("b") / e.path().filename()));
  }
  o.mtp = false;
  const HybridReport r = build_hybrid(d("int4"), d("fp8"), d("c"), o);
  EXPECT_EQ(r.n_mtp, 0u);
  const ckpt::Checkpoint c = ckpt::Checkpoint::open(d("c"));
  EXPECT_EQ(c.find("mtp.layers.0.mlp.shared_expert.up_proj.weight")->info->dtype,
            ckpt::DType::kBF16);
}

TEST_F(Hybrid, Refusals) {
  HybridOptions o;
  // The output exists.
  fs::create_directories(d("exists"));
  EXPECT_EQ(qf::test::error_code([&] { build_hybrid(d("int4"), d("fp8"), d("exists"), o); }),
            Errc::kExists);
  // Missing inputs.
  EXPECT_EQ(qf::test::error_code([&] { build_hybrid(d("nope"), d("fp8"), d("x"), o); }), Errc::kIo);
  EXPECT_EQ(qf::test::error_code([&] { build_hybrid(d("int4"), d("nope"), d("x"), o); }),
            Errc::kIo);
  // A hybrid is not an INT4 input.
  build_hybrid(d("int4"), d("fp8"), d("once"), o);
  EXPECT_EQ(qf::test::error_code([&] { build_hybrid(d("once"), d("fp8"), d("twice"), o); }),
            Errc::kUnsupported);
  // FP8 from another model: same names, other values.
  SynthOptions other;
  other.layout = ckpt::Qwen35Layout::kQwenFp8;
  other.seed = 99;
  synth_checkpoint(ckpt::qwen35_preset("tiny"), d("fp8-other"), other);
  EXPECT_EQ(qf::test::error_code([&] { build_hybrid(d("int4"), d("fp8-other"), d("x"), o); }),
            Errc::kUnsupported);
  // FP8 of another shape.
  ckpt::Qwen35Config wide = ckpt::qwen35_preset("tiny");
  wide.shared_expert_intermediate_size = 256;
  synth_checkpoint(wide, d("fp8-wide"), other);
  EXPECT_EQ(qf::test::error_code([&] { build_hybrid(d("int4"), d("fp8-wide"), d("x"), o); }),
            Errc::kUnsupported);
  // FP8 missing a projection (dropped from its index).
  fs::create_directories(d("fp8-missing"));
  for (const auto& e : fs::directory_iterator(d("fp8"))) {
    fs::copy_file(e.path(), d("fp8-missing") / e.path().filename());
  }
  auto idx = ckpt::parse_index(qf::test::read_file(d("fp8-missing") / ckpt::kIndexFileName)).index;
  std::erase_if(idx.weight_map, [](const auto& kv) {
    return kv.first == "model.language_model.layers.2.mlp.shared_expert.down_proj.weight";
  });
  ckpt::write_file_atomic(d("fp8-missing") / ckpt::kIndexFileName, ckpt::serialize_index(idx),
                          true);
  EXPECT_EQ(qf::test::error_code([&] { build_hybrid(d("int4"), d("fp8-missing"), d("x"), o); }),
            Errc::kTensorNotFound);
  EXPECT_FALSE(fs::exists(d("x")));
  EXPECT_FALSE(fs::exists(d("x.tmp")));
}

TEST_F(Hybrid, UnexpectedFp8TensorsNeedForce) {
  fs::create_directories(d("fp8-extra"));
  for (const auto& e : fs::directory_iterator(d("fp8"))) {
    fs::copy_file(e.path(), d("fp8-extra") / e.path().filename());
  }
  {
    ckpt::SafetensorsWriter w(
        d("fp8-extra") / "extra.safetensors",
        ckpt::plan_safetensors({{"lm_head.bias", ckpt::DType::kBF16, {512}}}, std::nullopt));
    w.write_zeros(1024);
    w.commit();
  }
  auto idx = ckpt::parse_index(qf::test::read_file(d("fp8-extra") / ckpt::kIndexFileName)).index;
  idx.weight_map.emplace_back("lm_head.bias", "extra.safetensors");
  idx.sort();
  ckpt::write_file_atomic(d("fp8-extra") / ckpt::kIndexFileName, ckpt::serialize_index(idx), true);
  HybridOptions o;
  EXPECT_EQ(qf::test::error_code([&] { build_hybrid(d("int4"), d("fp8-extra"), d("y"), o); }),
            Errc::kUnsupported);
  o.force = true;
  const HybridReport r = build_hybrid(d("int4"), d("fp8-extra"), d("y"), o);
  EXPECT_EQ(r.n_unexpected, 1u);
  EXPECT_EQ(r.fp8_files_read.size(), 3u);  // the extra file held nothing needed: not opened
}

}  // namespace
}  // namespace qf::quant
