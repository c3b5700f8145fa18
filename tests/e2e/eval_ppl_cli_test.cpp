// `qforge eval-ppl` on the tiny transformers fixtures, through the CLI. One window: NLL,
// perplexity and top-1 counts equal those computed here from transformers' logits (main model
// and MTP head). Several windows (a shorter last one, a dropped single token, --max-tokens): equal
// to the sums over `qforge logits --mtp` run on each window alone, which proves every window
// starts from a fresh state. A zeroed LM head: figures known in closed form (ppl = V, top-1 hits
// = targets that are id 0), so top-1 counting is tested on non-zero counts. Plus the MTP-less
// cases, clear errors and --device cuda.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <tuple>

#include "ckpt_edit.h"
#include "model_fixtures.h"
#include "qf/ckpt/safetensors.h"
#include "qf/rt/cuda_engine.h"
#include "test_support.h"

namespace qf::test {
namespace {

namespace fs = std::filesystem;
const fs::path kDir = QF_MODEL_GOLDEN_DIR;
const std::string kBin = QF_BIN;

// eval-ppl on a fixture against transformers' fp32 logits. The relative perplexity error is
// about |mean NLL difference|, at most twice the largest logit difference (logsumexp moves by
// at most that much, the target's logit too). rt_model_golden_test bounds the worst logit by
// 1e-3 x max |logit|, but the differences are fp32 rounding that mostly cancels in the mean:
// observed at most 1.8e-5 (r4's MTP head), so 1e-4 holds with margin and still catches a
// scoring defect (an error of 1e-3 in one sum of exponentials fails it).
constexpr double kVsTransformers = 1e-4;
// eval-ppl against `qforge logits` on the same windows: the same engine and the same fp32
// logits, so only the order of the double sums differs.
constexpr double kVsLogitsTool = 1e-9;

CommandResult qforge(const std::string& args) {
  return run_command(kBin + " " + args);
}

template <class T>
std::vector<T> read(const fs::path& file, const std::string& name) {
  const ckpt::SafetensorsFile f = ckpt::SafetensorsFile::open(file);
  const auto v = f.view(name).as<T>();
  return {v.begin(), v.end()};
}

std::string ids_csv(const int32_t* ids, int64_t n) {
  std::string s;
  for (int64_t i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

std::string prompt_text() {
  return nlohmann::json::parse(read_file(kDir / "provenance.json"))["prompt"].get<std::string>();
}

// Next-token predictions scored independently of the tool: NLL in double, first-max argmax.
struct Tally {
  int64_t n = 0, hits = 0;
  double nll = 0;
  // rows [n_rows, V] of `logits` from `first_row`; row r predicts targets[r].
  void add(const std::vector<float>& logits, int64_t vocab, int64_t first_row, int64_t n_rows,
           const int32_t* targets) {
    for (int64_t r = 0; r < n_rows; ++r) {
      const float* row = logits.data() + (first_row + r) * vocab;
      double max = row[0];
      int64_t top = 0;
      for (int64_t i = 1; i < vocab; ++i) {
        if (row[i] > max) max = row[i], top = i;
      }
      double sum = 0;
      for (int64_t i = 0; i < vocab; ++i) sum += std::exp(row[i] - max);
      nll += std::log(sum) + max - row[targets[r]];
      hits += top == targets[r] ? 1 : 0;
      ++n;
    }
  }
};

// One score object of the report ({predictions, nll, ppl, top1}) against a tally: counts exact,
// perplexity within `rel`.
void expect_score(const nlohmann::json& j, const Tally& want, double rel, const std::string& what) {
  ASSERT_TRUE(j.is_object()) << what << ": " << j.dump();
  ASSERT_EQ(j["predictions"].get<int64_t>(), want.n) << what;
  ASSERT_GT(want.n, 0) << what;
  const double n = static_cast<double>(want.n), ppl = std::exp(want.nll / n);
  EXPECT_EQ(std::llround(j["top1"].get<double>() * n), want.hits) << what << ": top-1 hits";
  EXPECT_NEAR(j["top1"].get<double>(), static_cast<double>(want.hits) / n, 1e-12) << what;
  EXPECT_NEAR(j["nll"].get<double>(), want.nll / n, rel) << what;
  EXPECT_LE(std::fabs(j["ppl"].get<double>() - ppl), rel * ppl)
      << what << ": ppl " << j["ppl"].get<double>() << ", want " << ppl;
  std::printf("%-44s ppl %.6f (want %.6f, rel diff %.2g), top-1 %lld / %lld\n", what.c_str(),
              j["ppl"].get<double>(), ppl, std::fabs(j["ppl"].get<double>() - ppl) / ppl,
              static_cast<long long>(want.hits), static_cast<long long>(want.n));
}

nlohmann::json eval_json(const fs::path& model, const fs::path& text, const std::string& flags) {
  const CommandResult r = qforge("eval-ppl --model " + model.string() + " --text " + text.string() +
                                 " --threads 2 --json " + flags);
  EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.err;
  if (r.exit_code != 0) return nullptr;
  return nlohmann::json::parse(r.out);
}

class EvalPpl : public ::testing::TestWithParam<std::string> {
 protected:
  fs::path model() const { return kDir / GetParam() / "model"; }
  fs::path reference() const { return kDir / GetParam() / "reference.safetensors"; }
  fs::path text() {
    if (!fs::exists(tmp_ / "prompt.txt")) write_file(tmp_ / "prompt.txt", prompt_text());
    return tmp_ / "prompt.txt";
  }
  TempDir tmp_;
};

// A window holding the whole prompt is exactly the sequence transformers ran: the figures are
// computed here from its logits (rows t < T-1 predict t+1; MTP rows t < T-2 predict t+2).
TEST_P(EvalPpl, OneWindowMatchesTransformers) {
  const std::vector<int32_t> ids = read<int32_t>(reference(), "prompt_ids");
  const std::vector<float> logits = read<float>(reference(), "logits"),
                           mtp_logits = read<float>(reference(), "mtp_logits");
  const int64_t t_len = static_cast<int64_t>(ids.size()),
                vocab = static_cast<int64_t>(logits.size()) / t_len;
  ASSERT_GE(t_len, 40);
  Tally main, mtp;
  main.add(logits, vocab, 0, t_len - 1, ids.data() + 1);
  mtp.add(mtp_logits, vocab, 0, t_len - 2, ids.data() + 2);
  for (const int64_t window : {t_len, int64_t{512}}) {
    const std::string what = GetParam() + " --window " + std::to_string(window);
    const nlohmann::json j = eval_json(model(), text(), "--window " + std::to_string(window));
    ASSERT_TRUE(j.is_object()) << what;
    EXPECT_EQ(j["tokens"], t_len) << what;  // the special tokens in the text are single ids
    EXPECT_EQ(j["text_tokens"], t_len) << what;
    EXPECT_EQ(j["tokens_evaluated"], t_len) << what;
    EXPECT_EQ(j["windows"], 1) << what;
    EXPECT_EQ(j["window"], window) << what;
    EXPECT_EQ(j["device"], "cpu") << what;
    EXPECT_GT(j["tokens_per_s"].get<double>(), 0) << what;
    expect_score(j, main, kVsTransformers, what);
    expect_score(j["mtp"], mtp, kVsTransformers, what + " mtp");
  }
}

struct WindowCase {
  int64_t window;
  std::optional<int64_t> max_tokens;
  int64_t n_windows, n_evaluated;  // on the 74-token prompt
};

// Shorter windows: each must equal `qforge logits --mtp` on that window alone (a fresh engine).
// 74 tokens: 32+32+10; 73 and a dropped single token; --max-tokens 65: 32+32, one dropped.
TEST_P(EvalPpl, WindowsEachStartFromAFreshState) {
  const std::vector<int32_t> ids = read<int32_t>(reference(), "prompt_ids");
  ASSERT_EQ(ids.size(), 74u) << "the window cases below assume the 74-token prompt";
  const std::vector<WindowCase> cases = {{32, {}, 3, 74}, {73, {}, 1, 73}, {32, 65, 2, 64}};
  for (const WindowCase& c : cases) {
    const int64_t n_ids = c.max_tokens ? *c.max_tokens : static_cast<int64_t>(ids.size());
    Tally main, mtp;
    int64_t n_windows = 0;
    for (int64_t b = 0; b < n_ids; b += c.window) {
      const int64_t n = std::min(n_ids - b, c.window);
      if (n < 2) continue;
      ++n_windows;
      const fs::path out = tmp_ / ("w" + std::to_string(b) + ".safetensors");
      const CommandResult r =
          qforge("logits --model " + model().string() + " --tokens " + ids_csv(ids.data() + b, n) +
                 " --mtp --threads 2 --force" + " --out " + out.string());
      ASSERT_EQ(r.exit_code, 0) << r.err;
      const std::vector<float> logits = read<float>(out, "logits");
      const int64_t vocab = static_cast<int64_t>(logits.size()) / n;
      main.add(logits, vocab, 0, n - 1, ids.data() + b + 1);
      mtp.add(read<float>(out, "mtp_logits"), vocab, 0, n - 2, ids.data() + b + 2);
    }
    std::string flags = "--window " + std::to_string(c.window);
    if (c.max_tokens) flags += " --max-tokens " + std::to_string(*c.max_tokens);
    const std::string what = GetParam() + " " + flags;
    ASSERT_EQ(n_windows, c.n_windows) << what;
    const nlohmann::json j = eval_json(model(), text(), flags);
    ASSERT_TRUE(j.is_object()) << what;
    EXPECT_EQ(j["tokens"], n_ids) << what;
    EXPECT_EQ(j["text_tokens"], ids.size()) << what;
    EXPECT_EQ(j["tokens_evaluated"], c.n_evaluated) << what;
    EXPECT_EQ(j["windows"], c.n_windows) << what;
    expect_score(j, main, kVsLogitsTool, what);
    expect_score(j["mtp"], mtp, kVsLogitsTool, what + " mtp");
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EvalPpl, ::testing::ValuesIn(model_fixtures()),
                         fixture_test_name);

const fs::path kModel = kDir / "r1-hd64-e4k2" / "model";

// The human report: aligned lines on stdout with the same figures as --json; nothing else there.
TEST(EvalPplCli, HumanReport) {
  TempDir tmp;
  write_file(tmp / "t.txt", prompt_text());
  const std::string args = "eval-ppl --model " + kModel.string() + " --text " +
                           (tmp / "t.txt").string() + " --window 32 --threads 2";
  const CommandResult human = qforge(args), json = qforge(args + " --json");
  ASSERT_EQ(human.exit_code, 0) << human.err;
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const nlohmann::json j = nlohmann::json::parse(json.out);
  char main[64], mtp[64];
  std::snprintf(main, sizeof main, "main         perplexity %.4f,", j["ppl"].get<double>());
  std::snprintf(mtp, sizeof mtp, "mtp          perplexity %.4f,", j["mtp"]["ppl"].get<double>());
  EXPECT_NE(human.out.find(main), std::string::npos) << human.out;
  EXPECT_NE(human.out.find(mtp), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("74 tokens, 74 evaluated in 3 windows of 32"), std::string::npos)
      << human.out;
  EXPECT_NE(human.out.find("tokens/s"), std::string::npos) << human.out;
  EXPECT_EQ(std::count(human.out.begin(), human.out.end(), '\n'), 5) << human.out;
  const CommandResult cut = qforge(args + " --max-tokens 65");
  ASSERT_EQ(cut.exit_code, 0) << cut.err;
  EXPECT_NE(cut.out.find("74 tokens, first 65 kept, 64 evaluated in 2 windows of 32"),
            std::string::npos)
      << cut.out;
}

// --no-mtp, and a checkpoint without the head: mtp is null, the main figures unchanged; also
// null where no window has the 3 tokens an MTP prediction needs.
TEST(EvalPplCli, WithoutTheMtpHeadMtpIsNull) {
  TempDir tmp;
  write_file(tmp / "t.txt", prompt_text());
  CheckpointEdit edit;
  const ckpt::SafetensorsFile weights = ckpt::SafetensorsFile::open(kModel / "model.safetensors");
  for (const ckpt::TensorInfo& t : weights.tensors()) {
    if (t.name.rfind("mtp.", 0) == 0) edit.drop.insert(t.name);
  }
  ASSERT_FALSE(edit.drop.empty());
  edit.config = [](std::string& text) {
    const std::string key = "\"mtp_num_hidden_layers\": 1";
    for (size_t at; (at = text.find(key)) != std::string::npos;) {
      text.replace(at, key.size(), "\"mtp_num_hidden_layers\": 0");
    }
  };
  copy_checkpoint(kModel, tmp / "no-mtp", edit);
  const nlohmann::json with = eval_json(kModel, tmp / "t.txt", "--window 32");
  ASSERT_TRUE(with["mtp"].is_object());
  for (const auto& [model, flags] :
       {std::pair{kModel, std::string("--no-mtp")}, std::pair{tmp / "no-mtp", std::string()},
        std::pair{tmp / "no-mtp", std::string("--no-mtp")}}) {
    const nlohmann::json j = eval_json(model, tmp / "t.txt", "--window 32 " + flags);
    ASSERT_TRUE(j.is_object()) << model << " " << flags;
    EXPECT_TRUE(j["mtp"].is_null()) << model << " " << flags;
    for (const char* key : {"predictions", "nll", "ppl", "top1", "tokens_evaluated", "windows"}) {
      EXPECT_EQ(j[key], with[key]) << key << ": " << model << " " << flags;
    }
  }
  const CommandResult human = qforge("eval-ppl --model " + (tmp / "no-mtp").string() + " --text " +
                                     (tmp / "t.txt").string());
  EXPECT_EQ(human.exit_code, 0) << human.err;
  EXPECT_NE(human.out.find("the checkpoint has no MTP head"), std::string::npos) << human.out;
  // Windows of 2 tokens: 37 main predictions, none for the head (it needs 3 tokens).
  const nlohmann::json pairs = eval_json(kModel, tmp / "t.txt", "--window 2");
  ASSERT_TRUE(pairs.is_object());
  EXPECT_EQ(pairs["predictions"], 37);
  EXPECT_TRUE(pairs["mtp"].is_null()) << pairs.dump();
}

// The random fixtures never predict their text (their argmax lies outside the tokenizer's 565
// ids), so top-1 is 0 above. With the LM head zeroed every logit is 0: NLL = log V for every
// prediction, ppl = V, and the argmax is id 0 ('!', lowest id among equal maxima), so the hits
// are the targets that are '!' -- for the main model (t+1) and the MTP head (t+2) alike.
TEST(EvalPplCli, ZeroLmHeadScoresAnalytically) {
  TempDir tmp;
  CheckpointEdit edit;
  edit.patch = [](const std::string& name, std::string& bytes) {
    if (name == "lm_head.weight") bytes.assign(bytes.size(), '\0');
  };
  copy_checkpoint(kModel, tmp / "zero", edit);
  write_file(tmp / "t.txt", "!a!!b!!!<|im_end|>!c, d!\n!!e<|im_start|>!!!!f!g");
  const CommandResult tok = qforge("tokenize --model " + kModel.string() + " --ids-only --file " +
                                   (tmp / "t.txt").string());
  ASSERT_EQ(tok.exit_code, 0) << tok.err;
  std::vector<int32_t> ids;
  std::istringstream in(tok.out);
  for (int32_t id; in >> id;) ids.push_back(id);
  ASSERT_GE(ids.size(), 20u);
  const double vocab = 1031;
  for (const int64_t window : {int64_t{5}, int64_t{512}}) {
    int64_t n_main = 0, hits_main = 0, n_mtp = 0, hits_mtp = 0;
    for (size_t b = 0; b < ids.size(); b += static_cast<size_t>(window)) {
      const size_t e = std::min(ids.size(), b + static_cast<size_t>(window));
      if (e - b < 2) continue;
      for (size_t t = b + 1; t < e; ++t, ++n_main) hits_main += ids[t] == 0 ? 1 : 0;
      for (size_t t = b + 2; t < e; ++t, ++n_mtp) hits_mtp += ids[t] == 0 ? 1 : 0;
    }
    const std::string what = "--window " + std::to_string(window);
    ASSERT_GT(hits_main, 0) << what;
    ASSERT_LT(hits_main, n_main) << what;
    const nlohmann::json j = eval_json(tmp / "zero", tmp / "t.txt", what);
    ASSERT_TRUE(j.is_object()) << what;
    ASSERT_TRUE(j["mtp"].is_object()) << what;
    for (const auto& [got, n, hits] :
         {std::tuple{j, n_main, hits_main}, std::tuple{j["mtp"], n_mtp, hits_mtp}}) {
      EXPECT_EQ(got["predictions"], n) << what;
      EXPECT_EQ(std::llround(got["top1"].get<double>() * static_cast<double>(n)), hits) << what;
      EXPECT_NEAR(got["nll"].get<double>(), std::log(vocab), 1e-12) << what;
      EXPECT_NEAR(got["ppl"].get<double>(), vocab, 1e-9) << what;
    }
  }
}

struct BadCase {
  std::string name, args;  // args after --model M
  int exit_code;
  std::string message;
};

TEST(EvalPplCli, BadInputsGiveClearErrors) {
  TempDir tmp;
  const std::string t = (tmp / "t.txt").string(), m = kModel.string();
  write_file(tmp / "t.txt", prompt_text());
  write_file(tmp / "empty.txt", "");
  write_file(tmp / "one.txt", "<|im_start|>");  // one special token
  write_file(tmp / "latin1.txt", "caf\xe9 au lait");
  const std::vector<BadCase> cases = {
      {"missing text file", "--model " + m + " --text " + (tmp / "nope.txt").string(), 3,
       (tmp / "nope.txt").string()},
      {"empty text", "--model " + m + " --text " + (tmp / "empty.txt").string(), 1,
       (tmp / "empty.txt").string() + ": the text has 0 tokens; perplexity needs at least 2"},
      {"one token", "--model " + m + " --text " + (tmp / "one.txt").string(), 1,
       (tmp / "one.txt").string() + ": the text has 1 token;"},
      {"not UTF-8", "--model " + m + " --text " + (tmp / "latin1.txt").string(), 1,
       (tmp / "latin1.txt").string() + ": text to encode is not valid UTF-8 at byte 3"},
      {"window 1", "--model " + m + " --text " + t + " --window 1", 1,
       "--window must be at least 2 tokens (got 1)"},
      {"window 0", "--model " + m + " --text " + t + " --window 0", 1, "--window must be"},
      {"max-tokens 1", "--model " + m + " --text " + t + " --max-tokens 1", 1,
       "--max-tokens must be at least 2 (got 1)"},
      {"missing model", "--model " + (tmp / "none").string() + " --text " + t, 3,
       "no such file or directory"},
      {"no --text", "--model " + m, 1, "--text is required"},
      {"bad window", "--model " + m + " --text " + t + " --window x", 1, "--window"},
      {"unknown device", "--model " + m + " --text " + t + " --device tpu", 1, "--device"},
  };
  for (const BadCase& c : cases) {
    const CommandResult r = qforge("eval-ppl " + c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.name << ": " << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.name << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << c.name << ": " << r.out;
    EXPECT_EQ(r.err.find("terminate"), std::string::npos) << c.name;
  }
}

TEST(EvalPplCli, HelpEndsWithAnExample) {
  const CommandResult r = qforge("eval-ppl --help");
  EXPECT_EQ(r.exit_code, 0);
  const size_t at = r.out.rfind("Example:\n  qforge eval-ppl --model ");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\n', r.out.find('\n', at) + 1), r.out.size() - 1) << r.out;
}

// Without a usable GPU (or in a build without CUDA), --device cuda fails as logits does: exit 4.
TEST(EvalPplCli, CudaDeviceWithoutAGpuSaysWhy) {
  std::string why;
  if (rt::CudaEngine::available(&why)) GTEST_SKIP() << "a GPU is present: see CudaMatchesCpu";
  TempDir tmp;
  write_file(tmp / "t.txt", prompt_text());
  const CommandResult r = qforge("eval-ppl --model " + kModel.string() + " --text " +
                                 (tmp / "t.txt").string() + " --device cuda");
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_NE(r.err.find("qforge eval-ppl: error: --device cuda: " + why), std::string::npos)
      << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

// Where a GPU is usable: the CUDA engine's windows (reset between them) score as the CPU's, the
// MTP head's too. Its logits are within 5e-4 x max |logit| of the CPU's (rt_cuda_golden_test),
// so the mean NLL within twice that; argmax is identical on these fixtures, so the top-1 figures
// are exact.
TEST(EvalPplCli, CudaMatchesCpu) {
  std::string why;
  if (!rt::CudaEngine::available(&why)) GTEST_SKIP() << "no GPU: " << why;
  TempDir tmp;
  write_file(tmp / "t.txt", prompt_text());
  const std::vector<float> ref =
      read<float>(kModel.parent_path() / "reference.safetensors", "logits");
  double top = 0;
  for (const float v : ref) top = std::max(top, static_cast<double>(std::fabs(v)));
  const nlohmann::json cpu = eval_json(kModel, tmp / "t.txt", "--window 32");
  const CommandResult r = qforge("eval-ppl --model " + kModel.string() + " --text " +
                                 (tmp / "t.txt").string() + " --window 32 --device cuda --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json gpu = nlohmann::json::parse(r.out);
  EXPECT_EQ(gpu["device"], "cuda");
  for (const char* key : {"tokens_evaluated", "windows", "predictions", "top1"}) {
    EXPECT_EQ(gpu[key], cpu[key]) << key;
  }
  EXPECT_NEAR(gpu["nll"].get<double>(), cpu["nll"].get<double>(), 1e-3 * top);
  ASSERT_FALSE(cpu["mtp"].is_null());
  ASSERT_FALSE(gpu["mtp"].is_null()) << gpu["mtp_missing_because"];
  for (const char* key : {"predictions", "top1"}) EXPECT_EQ(gpu["mtp"][key], cpu["mtp"][key]);
  EXPECT_NEAR(gpu["mtp"]["nll"].get<double>(), cpu["mtp"]["nll"].get<double>(), 1e-3 * top);
  // Without the MTP head each window is one prompt scoring (CudaEngine::prefill_scored: the rows
  // reduced on the device), in one window and in windows of 32.
  for (const char* window : {"--window 32", "--window 4096"}) {
    const std::string args = std::string(window) + " --no-mtp";
    const nlohmann::json cpu_plain = eval_json(kModel, tmp / "t.txt", args);
    const CommandResult p = qforge("eval-ppl --model " + kModel.string() + " --text " +
                                   (tmp / "t.txt").string() + " " + args + " --device cuda --json");
    ASSERT_EQ(p.exit_code, 0) << p.err;
    const nlohmann::json plain = nlohmann::json::parse(p.out);
    for (const char* key : {"tokens_evaluated", "windows", "predictions", "top1"}) {
      EXPECT_EQ(plain[key], cpu_plain[key]) << key << " " << window;
    }
    EXPECT_NEAR(plain["nll"].get<double>(), cpu_plain["nll"].get<double>(), 1e-3 * top) << window;
    EXPECT_TRUE(plain["mtp"].is_null()) << window;
  }
}

}  // namespace
}  // namespace qf::test
