// add-mtp: restoring a dropped MTP head (the public builder's bug), idempotence, extraction from
// mixed shards, hard links, manifest upkeep, and every refusal.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "ckpt_edit.h"
#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/file_io.h"
#include "qf/ckpt/validate.h"
#include "qf/quant/add_mtp.h"
#include "qf/quant/hybrid.h"
#include "qf/quant/model_check.h"
#include "qf/quant/synth.h"
#include "quant_fixture.h"
#include "test_support.h"

namespace qf::quant {
namespace {

namespace fs = std::filesystem;

class AddMtp : public qf::test::TinySourcesTest {
 protected:
  // The INT4 checkpoint as the public builder leaves it: shards copied, index rebuilt from
  // them (no mtp.* entries), sidecar gone.
  static fs::path broken(const std::string& name) {
    qf::test::CheckpointEdit e;
    const ckpt::Checkpoint c = ckpt::Checkpoint::open(d("intel-int4"));
    for (const auto& f : c.tensor_files()) {
      for (const auto& t : f.tensors()) {
        if (t.name.rfind("mtp.", 0) == 0) e.drop.insert(t.name);
      }
    }
    qf::test::copy_checkpoint(d("intel-int4"), d(name), e);
    fs::remove(d(name) / "model_extra_tensors.safetensors");
    return d(name);
  }
  static bool model_ok(const fs::path& p) {
    std::vector<ckpt::Problem> problems;
    const ckpt::ValidateReport r = ckpt::validate_checkpoint(p, {});
    check_qwen35_model(ckpt::Checkpoint::open(p), {}, problems);
    return r.ok() && problems.empty();
  }
};

TEST_F(AddMtp, RestoresTheSidecarAndIndexThenDoesNothing) {
  const fs::path t = broken("t");
  EXPECT_FALSE(model_ok(t));
  const AddMtpReport r = add_mtp(d("intel-int4"), t, {});
  EXPECT_EQ(r.found, 41u);
  EXPECT_EQ(r.added, 41u);
  EXPECT_EQ(r.already, 0u);
  EXPECT_TRUE(r.transfer == "copy" || r.transfer == "reflink") << r.transfer;
  EXPECT_TRUE(model_ok(t));
  EXPECT_EQ(qf::test::read_file(t / ckpt::kIndexFileName),
            qf::test::read_file(d("intel-int4") / ckpt::kIndexFileName));
  EXPECT_EQ(qf::test::read_file(t / "model_extra_tensors.safetensors"),
            qf::test::read_file(d("intel-int4") / "model_extra_tensors.safetensors"));
  const AddMtpReport again = add_mtp(d("intel-int4"), t, {});
  EXPECT_EQ(again.added, 0u);
  EXPECT_EQ(again.already, 41u);
  EXPECT_EQ(again.transfer, "already present");
}

TEST_F(AddMtp, HardLinkWhenAsked) {
  const fs::path t = broken("link");
  AddMtpOptions o;
  o.link = true;
  EXPECT_EQ(add_mtp(d("intel-int4"), t, o).transfer, "hardlink");
  struct stat a {
  }, b{};
  ASSERT_EQ(::stat((t / "model_extra_tensors.safetensors").c_str(), &a), 0);
  ASSERT_EQ(::stat((d("intel-int4") / "model_extra_tensors.safetensors").c_str(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
}

TEST_F(AddMtp, ExtractsMtpFromMixedShards) {
  // Qwen's FP8 release keeps its MTP head inside the main shards.
  const fs::path t = broken("mixed");
  const AddMtpReport r = add_mtp(d("qwen-fp8"), t, {});
  EXPECT_EQ(r.transfer, "extract");
  EXPECT_EQ(r.found, 8u * 3 * 2 + 24);  // FP8 experts + 7 FP8 pairs + 10 BF16
  const ckpt::Checkpoint c = ckpt::Checkpoint::open(t);
  EXPECT_EQ(c.file_name(*c.find("mtp.fc.weight")->file), "model_extra_tensors.safetensors");
  EXPECT_TRUE(model_ok(t));
}

TEST_F(AddMtp, KeepsTheManifestTrue) {
  const fs::path t = broken("manifest");
  ckpt::ValidateOptions o;
  o.checksums = true;
  ckpt::validate_checkpoint(t,
                            o);  // the manifest of the broken checkpoint (it is valid, if poorer)
  ASSERT_TRUE(fs::exists(t / ckpt::kManifestFileName));
  EXPECT_TRUE(add_mtp(d("intel-int4"), t, {}).manifest_updated);
  const ckpt::ValidateReport r = ckpt::validate_checkpoint(t, o);
  EXPECT_TRUE(r.ok()) << ckpt::format_problem(r.problems.at(0));
  EXPECT_EQ(r.checksums, ckpt::ChecksumAction::kVerified);
}

TEST_F(AddMtp, Refusals) {
  // A source without MTP.
  SynthOptions no_mtp;
  no_mtp.schema.mtp = false;
  synth_checkpoint(ckpt::qwen35_preset("tiny"), d("no-mtp"), no_mtp);
  EXPECT_EQ(qf::test::error_code([&] { add_mtp(d("no-mtp"), broken("r1"), {}); }),
            Errc::kTensorNotFound);
  // An MTP head of another shape.
  ckpt::Qwen35Config wide = ckpt::qwen35_preset("tiny");
  wide.moe_intermediate_size = 256;
  synth_checkpoint(wide, d("wide"), {});
  EXPECT_EQ(qf::test::error_code([&] { add_mtp(d("wide"), broken("r2"), {}); }),
            Errc::kModelTensorShape);
  // A different sidecar already in place.
  const fs::path t = broken("r3");
  fs::copy_file(d("wide") / "model-00001-of-00001.safetensors",
                t / "model_extra_tensors.safetensors");
  EXPECT_EQ(qf::test::error_code([&] { add_mtp(d("intel-int4"), t, {}); }), Errc::kExists);
  AddMtpOptions force;
  force.force = true;
  EXPECT_EQ(add_mtp(d("intel-int4"), t, force).added, 41u);
  EXPECT_TRUE(model_ok(t));
}

// build-hybrid keeps the MTP head listed, with its shared expert in FP8: a complete head of
// another format than the source's. add-mtp leaves it alone; an incomplete one is refused.
TEST_F(AddMtp, KeepsACompleteHeadTheTargetAlreadyLists) {
  build_hybrid(d("intel-int4"), d("qwen-fp8"), d("hybrid"), {});
  const std::string index = qf::test::read_file(d("hybrid") / ckpt::kIndexFileName);
  const AddMtpReport r = add_mtp(d("intel-int4"), d("hybrid"), {});
  EXPECT_EQ(r.added, 0u);
  EXPECT_EQ(r.already, 44u);  // 41 + the 3 FP8 scales
  EXPECT_EQ(r.transfer, "already present");
  EXPECT_EQ(qf::test::read_file(d("hybrid") / ckpt::kIndexFileName), index);
  EXPECT_TRUE(model_ok(d("hybrid")));

  qf::test::CheckpointEdit e;
  e.drop.insert("mtp.fc.weight");
  qf::test::copy_checkpoint(d("hybrid"), d("hybrid-partial"), e);
  EXPECT_EQ(qf::test::error_code([&] { add_mtp(d("intel-int4"), d("hybrid-partial"), {}); }),
            Errc::kModelTensorMissing);
}

}  // namespace
}  // namespace qf::quant
