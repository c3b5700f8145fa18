// quantize-lm-head on synthetic Qwen3.5 checkpoints: the result passes the model-aware checks,
// --in-place swaps the directory (unchanged files hard-linked, never modified), the dry run
// writes nothing, the manifest stays true, and every refusal names what is wrong.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "ckpt_edit.h"
#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/validate.h"
#include "qf/error.h"
#include "qf/quant/lm_head.h"
#include "qf/quant/model_check.h"
#include "qf/quant/synth.h"
#include "quant_fixture.h"
#include "test_support.h"

namespace qf::quant {
namespace {

namespace fs = std::filesystem;

class LmHead : public qf::test::TinySourcesTest {
 protected:
  static fs::path copy(const std::string& name) {
    qf::test::copy_checkpoint(d("intel-int4"), d(name), {});
    return d(name);
  }
  static std::vector<ckpt::Problem> problems(const fs::path& p) {
    ckpt::ValidateOptions vo;
    vo.checksums = fs::exists(p / ckpt::kManifestFileName);
    ckpt::ValidateReport r = ckpt::validate_checkpoint(p, vo);
    check_qwen35_model(ckpt::Checkpoint::open(p), {}, r.problems);
    return r.problems;
  }
};

ino_t inode(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_ino;
}

TEST_F(LmHead, OutPassesTheModelChecks) {
  LmHeadOptions o;
  o.out = d("out");
  const LmHeadReport r = quantize_lm_head(d("intel-int4"), o);
  EXPECT_GT(r.min_row_cosine, 0.999);
  EXPECT_EQ(r.bytes_after, static_cast<uint64_t>(r.rows * r.cols + r.rows + 2 * r.rows));
  EXPECT_TRUE(problems(d("out")).empty()) << ckpt::format_problem(problems(d("out"))[0]);
  const ckpt::Checkpoint c = ckpt::Checkpoint::open(d("out"));
  EXPECT_EQ(c.find("lm_head.weight"), nullptr);
  EXPECT_NE(c.find("lm_head.qweight"), nullptr);
  EXPECT_EQ(c.n_tensors(), ckpt::Checkpoint::open(d("intel-int4")).n_tensors() + 2);
  // The input is untouched and still valid.
  EXPECT_TRUE(problems(d("intel-int4")).empty());
  // Twice: the head is already INT8.
  LmHeadOptions again;
  again.out = d("out2");
  EXPECT_EQ(qf::test::error_code([&] { quantize_lm_head(d("out"), again); }), Errc::kUnsupported);
  EXPECT_FALSE(fs::exists(d("out2")));
}

TEST_F(LmHead, InPlaceSwapsTheDirectoryAndKeepsTheManifestTrue) {
  const fs::path p = copy("inplace");
  ckpt::ValidateOptions vo;
  vo.checksums = true;
  ASSERT_EQ(ckpt::validate_checkpoint(p, vo).checksums, ckpt::ChecksumAction::kCreated);
  const ckpt::Checkpoint c0 = ckpt::Checkpoint::open(p);
  const std::string head_shard = c0.file_name(*c0.find("lm_head.weight")->file);
  const std::string untouched = head_shard == "model-00001-of-00002.safetensors"
                                    ? "model-00002-of-00002.safetensors"
                                    : "model-00001-of-00002.safetensors";
  const ino_t before = inode(p / untouched);
  LmHeadOptions o;
  o.in_place = true;
  const LmHeadReport r = quantize_lm_head(p, o);
  EXPECT_TRUE(r.manifest_updated);
  EXPECT_EQ(inode(p / untouched), before);  // hard-linked, not rewritten
  EXPECT_FALSE(fs::exists(p.string() + ".tmp"));
  const auto ps = problems(p);  // verifies the updated manifest too
  EXPECT_TRUE(ps.empty()) << ckpt::format_problem(ps[0]);
  EXPECT_EQ(ckpt::validate_checkpoint(p, vo).checksums, ckpt::ChecksumAction::kVerified);
}

TEST_F(LmHead, DryRunMeasuresAndWritesNothing) {
  const fs::path p = copy("dry");
  const std::string index = qf::test::read_file(p / ckpt::kIndexFileName);
  LmHeadOptions o;
  o.in_place = true;
  o.dry_run = true;
  o.samples = 4;
  const LmHeadReport r = quantize_lm_head(p, o);
  EXPECT_EQ(r.samples, 4);
  EXPECT_GT(r.max_abs_error, 0);
  EXPECT_EQ(qf::test::read_file(p / ckpt::kIndexFileName), index);
  EXPECT_NE(ckpt::Checkpoint::open(p).find("lm_head.weight"), nullptr);
  EXPECT_FALSE(fs::exists(p.string() + ".tmp"));
}

TEST_F(LmHead, StaleStagingDirectoryIsReplaced) {
  fs::create_directories(d("stale.tmp"));
  qf::test::write_file(d("stale.tmp") / "junk.safetensors", "half a file");
  LmHeadOptions o;
  o.out = d("stale");
  quantize_lm_head(d("intel-int4"), o);
  EXPECT_FALSE(fs::exists(d("stale") / "junk.safetensors"));
  EXPECT_FALSE(fs::exists(d("stale.tmp")));
  EXPECT_TRUE(problems(d("stale")).empty());
}

TEST_F(LmHead, Refusals) {
  LmHeadOptions o;
  o.out = d("refused");
  // Not an AutoRound checkpoint: no INC quantization_config to declare the head in.
  EXPECT_EQ(qf::test::error_code([&] { quantize_lm_head(d("qwen-fp8"), o); }), Errc::kUnsupported);
  EXPECT_EQ(qf::test::error_code([&] { quantize_lm_head(d("bf16"), o); }), Errc::kUnsupported);
  // No lm_head.weight.
  qf::test::CheckpointEdit e;
  e.drop.insert("lm_head.weight");
  qf::test::copy_checkpoint(d("intel-int4"), d("nohead"), e);
  EXPECT_EQ(qf::test::error_code([&] { quantize_lm_head(d("nohead"), o); }), Errc::kTensorNotFound);
  // A head whose vocabulary is not a multiple of 4.
  qf::test::CheckpointEdit odd;
  odd.retype["lm_head.weight"] = {"lm_head.weight", ckpt::DType::kBF16, {511, 256}};
  qf::test::copy_checkpoint(d("intel-int4"), d("odd"), odd);
  EXPECT_EQ(qf::test::error_code([&] { quantize_lm_head(d("odd"), o); }), Errc::kUnsupported);
  // Missing input, both or neither destination, --out = input.
  EXPECT_EQ(qf::test::error_code([&] { quantize_lm_head(d("missing"), o); }), Errc::kIo);
  LmHeadOptions both = o;
  both.in_place = true;
  EXPECT_EQ(qf::test::error_code([&] { quantize_lm_head(d("intel-int4"), both); }), Errc::kUsage);
  EXPECT_EQ(qf::test::error_code([&] { quantize_lm_head(d("intel-int4"), {}); }), Errc::kUsage);
  LmHeadOptions same;
  same.out = d("intel-int4") / ".";
  EXPECT_EQ(qf::test::error_code([&] { quantize_lm_head(d("intel-int4"), same); }), Errc::kUsage);
  EXPECT_FALSE(fs::exists(d("refused")));
  // An existing --out: refused, then replaced with --force.
  fs::create_directories(d("exists"));
  qf::test::write_file(d("exists") / "keep", "x");
  LmHeadOptions ex;
  ex.out = d("exists");
  EXPECT_EQ(qf::test::error_code([&] { quantize_lm_head(d("intel-int4"), ex); }), Errc::kExists);
  EXPECT_TRUE(fs::exists(d("exists") / "keep"));
  ex.force = true;
  quantize_lm_head(d("intel-int4"), ex);
  EXPECT_FALSE(fs::exists(d("exists") / "keep"));
  EXPECT_TRUE(problems(d("exists")).empty());
}

}  // namespace
}  // namespace qf::quant
