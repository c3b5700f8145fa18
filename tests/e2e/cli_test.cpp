// The qforge command line: exit codes, stdout/stderr split, --json, on checkpoints built here.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "qf/ckpt/file_io.h"
#include "qf/ckpt/index.h"
#include "qf/ckpt/writer.h"
#include "test_support.h"

namespace qf {
namespace {

namespace fs = std::filesystem;
using qf::test::run_command;
using qf::test::TempDir;

std::string qforge(const std::string& args) {
  return std::string(QF_BIN) + " " + args;
}

// A two-shard checkpoint with an INT4 GPTQ triplet, an FP8 block pair and BF16 tensors.
void write_model(const fs::path& dir) {
  using namespace ckpt;
  const std::vector<std::vector<TensorSpec>> shards = {
      {{"m.layers.0.mlp.experts.0.up_proj.qweight", DType::kI32, {16, 64}},
       {"m.layers.0.mlp.experts.0.up_proj.qzeros", DType::kI32, {1, 8}},
       {"m.layers.0.mlp.experts.0.up_proj.scales", DType::kF16, {1, 64}}},
      {{"m.layers.0.mlp.shared_expert.up_proj.weight", DType::kF8E4M3, {128, 128}},
       {"m.layers.0.mlp.shared_expert.up_proj.weight_scale_inv", DType::kBF16, {1, 1}},
       {"m.norm.weight", DType::kBF16, {128}}}};
  ShardIndex idx;
  idx.total_size = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = "model-0000" + std::to_string(i + 1) + "-of-00002.safetensors";
    SafetensorsWriter w(dir / name, plan_safetensors(shards[i], Metadata{{"format", "pt"}}));
    w.write_zeros(w.plan().data_bytes);
    w.commit();
    *idx.total_size += w.plan().data_bytes;
    for (const TensorSpec& t : shards[i]) idx.weight_map.emplace_back(t.name, name);
  }
  idx.sort();
  write_file_atomic(dir / kIndexFileName, serialize_index(idx), false);
  qf::test::write_file(dir / "config.json", "{}");
}

TEST(Cli, UsageErrorsExitOne) {
  EXPECT_EQ(run_command(qforge("")).exit_code, 1);
  EXPECT_EQ(run_command(qforge("inspect")).exit_code, 1);
  EXPECT_EQ(run_command(qforge("frobnicate")).exit_code, 1);
  EXPECT_EQ(run_command(qforge("validate --threads -2 .")).exit_code, 1);
  const auto help = run_command(qforge("--help"));
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("Exit codes"), std::string::npos);
  const auto sub_help = run_command(qforge("validate --help"));
  EXPECT_NE(sub_help.out.find("Example:"), std::string::npos);
}

TEST(Cli, MissingPathIsAnIoError) {
  const auto r = run_command(qforge("validate /nonexistent/qforge-dir"));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.err.find("/nonexistent/qforge-dir"), std::string::npos) << r.err;
}

TEST(Cli, InspectSummarizesFormats) {
  TempDir dir;
  write_model(dir.path());
  const auto r = run_command(qforge("inspect " + dir.path().string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("2 shards, index with 6 entries"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("int4-gptq"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fp8-block"), std::string::npos) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;

  const auto j = run_command(qforge("inspect --json --tensors " + dir.path().string()));
  ASSERT_EQ(j.exit_code, 0);
  const auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["n_tensors"], 6);
  EXPECT_EQ(doc["tensors"].size(), 6u);
  EXPECT_EQ(doc["by_dtype"]["I32"]["tensors"], 2);
  std::map<std::string, int> modules;
  for (const auto& f : doc["by_format"]) modules[f["family"]] = f["modules"];
  EXPECT_EQ(modules["int4-gptq"], 1);
  EXPECT_EQ(modules["fp8-block"], 1);
  EXPECT_EQ(modules["bf16"], 1);
}

TEST(Cli, ValidateOkThenBrokenWithJson) {
  TempDir dir;
  write_model(dir.path());
  auto r = run_command(qforge("validate " + dir.path().string()));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("OK: 2 model files, 6 tensors"), std::string::npos) << r.out;

  qf::test::write_file(dir / "old.safetensors", "short");
  fs::remove(dir / "model-00002-of-00002.safetensors");
  r = run_command(qforge("validate " + dir.path().string()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("error[index-missing-file]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("error[stray-file]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("error[header-too-small] old.safetensors"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FAILED: 3 problems"), std::string::npos) << r.out;

  const auto j = run_command(qforge("validate --json " + dir.path().string()));
  EXPECT_EQ(j.exit_code, 2);
  const auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["ok"], false);
  EXPECT_EQ(doc["problems"].size(), 3u);
  EXPECT_EQ(doc["problems"][0]["code"], "index-missing-file");

  const auto insp = run_command(qforge("inspect " + dir.path().string()));
  EXPECT_EQ(insp.exit_code, 2);  // cannot be loaded
  EXPECT_NE(insp.err.find("qforge validate"), std::string::npos);
}

TEST(Cli, ChecksumsCreateVerifyDetect) {
  TempDir dir;
  write_model(dir.path());
  auto r = run_command(qforge("validate --checksums " + dir.path().string()));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("checksums: wrote"), std::string::npos) << r.out;
  r = run_command(qforge("validate --checksums " + dir.path().string()));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("checksums: verified"), std::string::npos) << r.out;
  qf::test::write_file(dir / "config.json", "{\"changed\": 1}");
  r = run_command(qforge("validate --checksums --json " + dir.path().string()));
  EXPECT_EQ(r.exit_code, 2);
  const auto doc = nlohmann::json::parse(r.out);
  ASSERT_EQ(doc["problems"].size(), 1u);
  EXPECT_EQ(doc["problems"][0]["code"], "checksum-mismatch");
  EXPECT_EQ(doc["problems"][0]["file"], "config.json");
  EXPECT_EQ(doc["checksums"]["action"], "verified");
}

}  // namespace
}  // namespace qf
