// The whole M3 pipeline through the command line, as a user runs it: synth BF16 -> synth --from
// into intel-int4 and qwen-fp8 -> build-hybrid -> add-mtp -> quantize-lm-head -> validate, then
// dequantize, compared byte for byte with a numpy reference written from the format specs
// (dequant_reference.py). And the failure paths: missing inputs, shape mismatch, existing
// output, a full disk (RLIMIT_FSIZE), kill -9 mid-run then a re-run.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "test_support.h"

extern char** environ;

namespace qf {
namespace {

namespace fs = std::filesystem;
using qf::test::run_command;

std::string qforge(const std::string& args) {
  return std::string(QF_BIN) + " " + args;
}

nlohmann::json json_of(const qf::test::CommandResult& r) {
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

class Pipeline : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new qf::test::TempDir();
    const std::string d = dir_->path().string();
    for (const std::string& cmd :
         {"synth " + d + "/bf16 --preset tiny",
          "synth " + d + "/int4 --from " + d + "/bf16 --layout intel-int4 --shards 2",
          "synth " + d + "/fp8 --from " + d + "/bf16 --layout qwen-fp8 --shards 2"}) {
      const auto r = run_command(qforge(cmd));
      ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.err;
    }
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string d(const std::string& name) { return (dir_->path() / name).string(); }
  static qf::test::TempDir* dir_;
};
qf::test::TempDir* Pipeline::dir_ = nullptr;

TEST_F(Pipeline, HybridThenMtpThenLmHeadValidatesAndDequantizesToTheReference) {
  const auto hybrid = json_of(run_command(qforge("build-hybrid --json --int4 " + d("int4") +
                                                 " --fp8 " + d("fp8") + " --out " + d("h"))));
  EXPECT_EQ(hybrid["replaced"]["layers"], 12);  // 4 layers x gate/up/down
  EXPECT_EQ(hybrid["replaced"]["mtp"], 3);
  EXPECT_EQ(hybrid["scales_added"], 15);
  EXPECT_EQ(hybrid["unexpected"], 0);

  const auto mtp =
      json_of(run_command(qforge("add-mtp --json --source " + d("int4") + " --target " + d("h"))));
  EXPECT_EQ(mtp["added"], 0);  // build-hybrid kept the head listed
  EXPECT_EQ(mtp["already_present"], 44);

  const auto head = json_of(run_command(qforge("quantize-lm-head --json --in-place " + d("h"))));
  EXPECT_GT(head["mean_row_cosine"].get<double>(), 0.999);
  EXPECT_TRUE(head["manifest_updated"]);

  const auto v = run_command(qforge("validate --checksums " + d("h")));
  EXPECT_EQ(v.exit_code, 0) << v.out;
  EXPECT_NE(v.out.find("15 fp8, 115 int4, 1 int8; MTP present"), std::string::npos) << v.out;
  EXPECT_NE(v.out.find("checksums: verified"), std::string::npos) << v.out;

  const auto dq = run_command(qforge("dequantize " + d("h") + " --out " + d("h-bf16")));
  ASSERT_EQ(dq.exit_code, 0) << dq.err;
  const auto ref = run_command(std::string(QF_PYTHON) + " " + QF_E2E_DIR +
                               "/dequant_reference.py " + d("h") + " " + d("h-bf16"));
  EXPECT_EQ(ref.exit_code, 0) << ref.out << ref.err;
  const auto summary = nlohmann::json::parse(ref.out);
  EXPECT_EQ(summary["tensors"], 146);
  EXPECT_EQ(summary["mismatched"], 0);
  EXPECT_EQ(summary["n_unused"], 0);
  // And the BF16 result is itself a valid checkpoint of the model.
  EXPECT_EQ(run_command(qforge("validate --checksums " + d("h-bf16"))).exit_code, 0);
}

// The INT4 head (quantize-lm-head --bits 4): validate accepts it as one more INT4 module, and
// qforge dequantize's BF16 equals the Python reference's dequantization of its GPTQ 4-bit triplet.
TEST_F(Pipeline, Int4LmHeadValidatesAndDequantizes) {
  ASSERT_EQ(run_command(qforge("build-hybrid --int4 " + d("int4") + " --fp8 " + d("fp8") +
                               " --out " + d("h4")))
                .exit_code,
            0);
  const auto head =
      json_of(run_command(qforge("quantize-lm-head --json --bits 4 --in-place " + d("h4"))));
  EXPECT_EQ(head["bits"], 4);
  EXPECT_EQ(head["group_size"], 128);
  EXPECT_GT(head["mean_row_cosine"].get<double>(), 0.99);
  EXPECT_LT(head["tensor_bytes_after"].get<uint64_t>(),
            head["tensor_bytes_before"].get<uint64_t>() * 27 / 100);

  const auto v = run_command(qforge("validate --checksums " + d("h4")));
  EXPECT_EQ(v.exit_code, 0) << v.out;
  EXPECT_NE(v.out.find("15 fp8, 116 int4; MTP present"), std::string::npos) << v.out;

  ASSERT_EQ(run_command(qforge("dequantize " + d("h4") + " --out " + d("h4-bf16"))).exit_code, 0);
  const auto ref = run_command(std::string(QF_PYTHON) + " " + QF_E2E_DIR +
                               "/dequant_reference.py " + d("h4") + " " + d("h4-bf16"));
  EXPECT_EQ(ref.exit_code, 0) << ref.out << ref.err;
  const auto summary = nlohmann::json::parse(ref.out);
  EXPECT_EQ(summary["mismatched"], 0);
  EXPECT_EQ(summary["n_unused"], 0);
}

TEST_F(Pipeline, RecipeRunsTheSameSteps) {
  const auto r =
      json_of(run_command(qforge("recipe run " + std::string(QF_RECIPE_DIR) +
                                 "/qwen3.5-122b-a10b-spark.json --any-size --json --int4 " +
                                 d("int4") + " --fp8 " + d("fp8") + " --out " + d("recipe-out"))));
  ASSERT_EQ(r["steps"].size(), 4u);
  EXPECT_EQ(r["steps"][0]["report"]["replaced"], 15);
  EXPECT_EQ(r["steps"][3]["report"]["checksums"], "verified");
  EXPECT_EQ(run_command(qforge("validate " + d("recipe-out"))).exit_code, 0);
}

TEST_F(Pipeline, MissingInputsNameThePath) {
  struct Case {
    std::string args, path;
  };
  const Case cases[] = {
      {"build-hybrid --int4 /nonexistent/int4 --fp8 " + d("fp8") + " --out " + d("x"),
       "/nonexistent/int4"},
      {"build-hybrid --int4 " + d("int4") + " --fp8 /nonexistent/fp8 --out " + d("x"),
       "/nonexistent/fp8"},
      {"add-mtp --source /nonexistent/src --target " + d("int4"), "/nonexistent/src"},
      {"quantize-lm-head /nonexistent/ckpt --out " + d("x"), "/nonexistent/ckpt"},
      {"dequantize /nonexistent/ckpt --out " + d("x"), "/nonexistent/ckpt"},
      {"recipe run /nonexistent/r.json --int4 " + d("int4") + " --fp8 " + d("fp8") + " --out " +
           d("x"),
       "/nonexistent/r.json"},
  };
  for (const Case& c : cases) {
    const auto r = run_command(qforge(c.args));
    EXPECT_EQ(r.exit_code, 3) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.path), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(d("x")));
  }
}

TEST_F(Pipeline, ShapeMismatchNamesTheTensor) {
  // An FP8 checkpoint of a model with wider shared experts.
  const std::string cfg = d("wide.json");
  auto doc = nlohmann::json::parse(qf::test::read_file(d("bf16") + "/config.json"));
  doc["text_config"]["shared_expert_intermediate_size"] = 256;
  qf::test::write_file(cfg, doc.dump());
  ASSERT_EQ(
      run_command(qforge("synth " + d("wide-fp8") + " --config " + cfg + " --layout qwen-fp8"))
          .exit_code,
      0);
  const auto r = run_command(
      qforge("build-hybrid --int4 " + d("int4") + " --fp8 " + d("wide-fp8") + " --out " + d("x")));
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_NE(r.err.find("shared_expert"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("is F8_E4M3 [256, 256], INT4 input has BF16 [256, 128]"), std::string::npos)
      << r.err;  // down_proj [H, Is] comes first
  EXPECT_FALSE(fs::exists(d("x")));
  EXPECT_FALSE(fs::exists(d("x.tmp")));
}

TEST_F(Pipeline, ExistingOutputIsRefusedThenReplacedWithForce) {
  fs::create_directories(d("taken"));
  qf::test::write_file(d("taken") + "/keep", "mine");
  const std::string base = "--int4 " + d("int4") + " --fp8 " + d("fp8") + " --out " + d("taken");
  auto r = run_command(qforge("build-hybrid " + base));
  EXPECT_EQ(r.exit_code, 1) << r.err;  // kExists: the user's to resolve (--force)
  EXPECT_NE(r.err.find("exists"), std::string::npos) << r.err;
  EXPECT_EQ(qf::test::read_file(d("taken") + "/keep"), "mine");
  for (const std::string& cmd : {"quantize-lm-head " + d("int4") + " --out " + d("taken"),
                                 "dequantize " + d("int4") + " --out " + d("taken")}) {
    r = run_command(qforge(cmd));
    EXPECT_EQ(r.exit_code, 1) << cmd << "\n" << r.err;
    EXPECT_EQ(qf::test::read_file(d("taken") + "/keep"), "mine");
  }
  r = run_command(qforge("build-hybrid --force " + base));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(d("taken") + "/keep"));
  EXPECT_EQ(run_command(qforge("validate " + d("taken"))).exit_code, 0);
}

// A file-size limit makes every write past it fail with EFBIG, as a full disk fails with ENOSPC:
// the writers preallocate, so they fail at once, remove their staging directory and exit 3.
TEST_F(Pipeline, FullDiskFailsCleanly) {
  const std::string limit = "ulimit -f 256; ";  // 128 KiB in sh's 512-byte blocks or more
  const std::string cmds[] = {
      "build-hybrid --int4 " + d("int4") + " --fp8 " + d("fp8") + " --out " + d("full"),
      "quantize-lm-head " + d("int4") + " --out " + d("full"),
      "dequantize " + d("int4") + " --out " + d("full"),
  };
  for (const std::string& cmd : cmds) {
    const auto r = run_command("sh -c '" + limit + "exec " + qforge(cmd) + "'");
    EXPECT_EQ(r.exit_code, 3) << cmd << "\n" << r.err;
    EXPECT_NE(r.err.find("too large"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(d("full"))) << cmd;
    EXPECT_FALSE(fs::exists(d("full.tmp"))) << cmd;
  }
}

// Starts `args` and SIGKILLs it as soon as `marker` exists. True when it was killed mid-run.
bool kill_when_exists(const std::vector<std::string>& args, const fs::path& marker) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  EXPECT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  bool killed = false;
  for (int i = 0; i < 20000; ++i) {
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) return false;  // finished first
    if (fs::exists(marker)) {
      kill(pid, SIGKILL);
      killed = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  int status;
  waitpid(pid, &status, 0);
  return killed && WIFSIGNALED(status);
}

TEST_F(Pipeline, KillMidRunThenRerun) {
  // Inputs big enough to take a moment: 256 experts, 8 layers, a 64k vocabulary.
  auto doc = nlohmann::json::parse(qf::test::read_file(d("bf16") + "/config.json"));
  auto& text = doc["text_config"];
  text["num_experts"] = 256;
  text["num_hidden_layers"] = 8;
  text["vocab_size"] = 65536;
  if (text.contains("layer_types")) {
    nlohmann::json types = nlohmann::json::array();
    for (int i = 0; i < 8; ++i)
      types.push_back((i + 1) % 4 == 0 ? "full_attention" : "linear_attention");
    text["layer_types"] = types;
  }
  qf::test::write_file(d("big.json"), doc.dump());
  for (const char* layout : {"intel-int4", "qwen-fp8"}) {
    ASSERT_EQ(run_command(qforge("synth " + d(std::string("big-") + layout) + " --config " +
                                 d("big.json") + " --layout " + layout + " --shards 4"))
                  .exit_code,
              0);
  }
  // build-hybrid (values of the two synthetic inputs are unrelated: --no-check).
  const std::vector<std::string> hybrid = {
      QF_BIN,  "build-hybrid",    "--no-check", "--int4",  d("big-intel-int4"),
      "--fp8", d("big-qwen-fp8"), "--out",      d("big-h")};
  bool killed = false;
  for (int attempt = 0; attempt < 5 && !killed; ++attempt) {
    fs::remove_all(d("big-h"));
    killed = kill_when_exists(hybrid, d("big-h.tmp"));
    if (killed) {
      EXPECT_FALSE(fs::exists(d("big-h"))) << "a partial checkpoint under the final name";
    }
  }
  EXPECT_TRUE(killed) << "build-hybrid always finished before it could be killed";
  auto r = run_command(qforge("build-hybrid --no-check --int4 " + d("big-intel-int4") + " --fp8 " +
                              d("big-qwen-fp8") + " --out " + d("big-h")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(d("big-h.tmp")));
  EXPECT_EQ(run_command(qforge("validate --checksums " + d("big-h"))).exit_code, 0);

  // quantize-lm-head --in-place: a kill leaves the original checkpoint, whole and valid.
  const std::string index_before =
      qf::test::read_file(d("big-h") + "/model.safetensors.index.json");
  killed = kill_when_exists({QF_BIN, "quantize-lm-head", "--in-place", d("big-h")}, d("big-h.tmp"));
  if (killed) {
    EXPECT_EQ(qf::test::read_file(d("big-h") + "/model.safetensors.index.json"), index_before);
    EXPECT_EQ(run_command(qforge("validate --checksums " + d("big-h"))).exit_code, 0);
    r = run_command(qforge("quantize-lm-head --in-place " + d("big-h")));
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
  EXPECT_FALSE(fs::exists(d("big-h.tmp")));
  r = run_command(qforge("validate --checksums " + d("big-h")));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("1 int8"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace qf
