// The embedded example model (models/tiny, trained by models/tiny/train.py): qforge's figures
// against those PyTorch computed after training (provenance.json), the FP8 source qforge makes
// against transformers' quantizer byte for byte (fp8_reference.json), and `make demo`'s whole
// pipeline with the quality its quantized checkpoints keep.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_support.h"

namespace qf {
namespace {

namespace fs = std::filesystem;
using qf::test::run_command;

const fs::path kTiny = fs::path(QF_SOURCE_DIR) / "models" / "tiny";

std::string qforge(const std::string& args) {
  return std::string(QF_BIN) + " " + args;
}

nlohmann::json json_of(const qf::test::CommandResult& r) {
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

nlohmann::json provenance() {
  std::ifstream f(kTiny / "provenance.json");
  return nlohmann::json::parse(f);
}

std::string eval_ppl(const std::vector<std::string>& models, int tokens) {
  std::string cmd = "eval-ppl --json --text " + (kTiny / "heldout.txt").string() +
                    " --max-tokens " + std::to_string(tokens);
  for (const std::string& m : models) cmd += " --model " + m;
  return qforge(cmd);
}

// Hits may differ by a near tie between two fp32 implementations; not more than two of a thousand.
void expect_same_score(const nlohmann::json& got, const nlohmann::json& want) {
  EXPECT_EQ(got["predictions"], want["predictions"]);
  EXPECT_NEAR(got["ppl"].get<double>() / want["ppl"].get<double>(), 1.0, 1e-4);
  const double n = want["predictions"].get<double>();
  EXPECT_NEAR(got["top1"].get<double>() * n, want["top1"].get<double>() * n, 2.01);
}

// Speculative decoding with the trained MTP head drafting one, two and three tokens a round
// (the later ones from its own output): plain greedy decoding's ids, most drafts kept, fewer
// rounds as the drafts grow; and the refusals of --draft-tokens.
TEST(ExampleModel, ChainedDraftsGiveGreedyIds) {
  std::ifstream f(kTiny / "heldout.txt");
  std::string prompt(400, '\0');
  f.read(prompt.data(), static_cast<std::streamsize>(prompt.size()));
  const fs::path text = fs::path(::testing::TempDir()) / "qf_chained_drafts_prompt.txt";
  std::ofstream(text) << prompt;
  const std::string gen = "generate --model " + (kTiny / "model").string() + " --prompt \"$(cat " +
                          text.string() + ")\" --ignore-eos --max-tokens 96 --temperature 0 --json";
  const nlohmann::json plain = json_of(run_command(qforge(gen) + " 2>/dev/null"));
  int64_t rounds_before = 1 << 30;
  for (const int drafts : {1, 2, 3}) {
    const nlohmann::json j = json_of(run_command(
        qforge(gen + " --speculative --draft-tokens " + std::to_string(drafts)) + " 2>/dev/null"));
    EXPECT_EQ(j["ids"], plain["ids"]) << drafts << " drafts a round";
    const nlohmann::json& s = j["speculative"];
    EXPECT_EQ(s["draft_tokens"].get<int>(), drafts);
    EXPECT_EQ(s["drafts"].get<int64_t>(), s["rounds"].get<int64_t>() * drafts);
    EXPECT_GT(s["acceptance"].get<double>(), 0.8) << drafts << " drafts a round";
    EXPECT_LT(s["rounds"].get<int64_t>(), rounds_before) << drafts << " drafts a round";
    rounds_before = s["rounds"].get<int64_t>();
    std::printf("%d drafts a round: %lld rounds, %lld of %lld drafts kept\n", drafts,
                static_cast<long long>(s["rounds"].get<int64_t>()),
                static_cast<long long>(s["drafts_kept"].get<int64_t>()),
                static_cast<long long>(s["drafts"].get<int64_t>()));
  }
  struct Refusal {
    std::string flags, says;
  };
  for (const Refusal& r : {Refusal{" --draft-tokens 2", "--speculative"},
                           Refusal{" --speculative --draft-tokens 5", "--draft-tokens"},
                           Refusal{" --speculative --draft-tokens 0", "--draft-tokens"},
                           Refusal{" --speculative --draft-tokens 3 --device cuda", "CUDA"}}) {
    const qf::test::CommandResult c = run_command(qforge(gen + r.flags));
    EXPECT_NE(c.exit_code, 0) << r.flags;
    EXPECT_NE(c.err.find(r.says), std::string::npos) << r.flags << ": " << c.err;
  }
}

TEST(ExampleModel, EvalPplEqualsPyTorch) {
  const nlohmann::json want = provenance()["eval"]["heldout_txt_first_1024"];
  const nlohmann::json got = json_of(run_command(eval_ppl({(kTiny / "model").string()}, 1024)));
  EXPECT_EQ(got["tokens"], want["tokens"]);
  EXPECT_EQ(got["windows"], want["windows"]);
  expect_same_score(got, want);
  ASSERT_FALSE(got["mtp"].is_null());
  expect_same_score(got["mtp"], want["mtp"]);
}

TEST(ExampleModel, Fp8SourceEqualsTransformersQuantizer) {
  qf::test::TempDir dir;
  const auto r = run_command(qforge("synth " + (dir / "fp8").string() + " --from " +
                                    (kTiny / "model").string() +
                                    " --layout qwen-fp8 --no-vision --fp8-scale-dtype f32"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json got = json_of(
      run_command(std::string(QF_PYTHON) + " " + QF_SOURCE_DIR + "/tests/e2e/fp8_hashes.py " +
                  (dir / "fp8").string() + " " + (kTiny / "fp8_reference.json").string()));
  // At least every routed and shared expert projection of every layer and the MTP layer, each
  // with its scale.
  std::ifstream f(kTiny / "model" / "config.json");
  const nlohmann::json text = nlohmann::json::parse(f)["text_config"];
  const int experts = 3 * (text["num_experts"].get<int>() + 1);
  EXPECT_GE(got["compared"].get<int>(), 2 * experts * (text["num_hidden_layers"].get<int>() + 1));
  EXPECT_EQ(got["equal"], got["compared"]);
  EXPECT_TRUE(got["mismatched"].empty()) << got["mismatched"];
  EXPECT_TRUE(got["unreferenced"].empty()) << got["unreferenced"];
  EXPECT_TRUE(got["bad_scales"].empty()) << got["bad_scales"];
}

TEST(ExampleModel, DemoRunsAndTheQuantizedCheckpointsKeepQuality) {
  qf::test::TempDir dir;
  const fs::path work = dir / "demo";
  const auto demo = run_command("cd " + std::string(QF_SOURCE_DIR) + " && bash tools/demo.sh " +
                                QF_BIN + " " + work.string());
  ASSERT_EQ(demo.exit_code, 0) << demo.out << demo.err;
  EXPECT_NE(demo.out.find("demo: OK"), std::string::npos);
  EXPECT_NE(demo.out.find("MTP top-1"), std::string::npos) << "no quality table";
  const size_t gen = demo.out.find("== qforge generate");
  ASSERT_NE(gen, std::string::npos);
  EXPECT_NE(demo.out.find("return", gen), std::string::npos) << "no Python in:\n"
                                                             << demo.out.substr(gen);

  const nlohmann::json rs =
      json_of(run_command(eval_ppl({(kTiny / "model").string(), (work / "int4").string(),
                                    (work / "hybrid").string(), (work / "hybrid-int8").string()},
                                   1024)));
  ASSERT_EQ(rs.size(), 4u);
  const double bf16 = rs[0]["ppl"].get<double>();
  for (const nlohmann::json& r : rs) {
    SCOPED_TRACE(r["model"].get<std::string>());
    EXPECT_LT(r["ppl"].get<double>() / bf16, 1.03);  // within a few percent of BF16
    ASSERT_FALSE(r["mtp"].is_null());
    EXPECT_GT(r["mtp"]["top1"].get<double>(), 0.30);  // chance: 1 in 8192
  }
}

}  // namespace
}  // namespace qf
