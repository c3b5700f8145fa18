// `qforge logits` and `qforge generate` on the tiny transformers fixtures, through the CLI:
// results equal to the references, streaming text, and clear errors for broken models.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "ckpt_edit.h"
#include "qf/ckpt/safetensors.h"
#include "qf/rt/cuda_engine.h"
#include "test_support.h"

namespace qf::test {
namespace {

namespace fs = std::filesystem;
const fs::path kDir = QF_MODEL_GOLDEN_DIR;
const fs::path kModel = kDir / "r1-hd64-e4k2" / "model";
const std::string kBin = QF_BIN;

CommandResult qforge_split(const std::string& args) {
  return run_command(kBin + " " + args);
}
// stdout and stderr together in .out
CommandResult qforge(const std::string& args) {
  CommandResult r = qforge_split(args);
  r.out += r.err;
  return r;
}

template <class T>
std::vector<T> read(const fs::path& file, const std::string& name) {
  const ckpt::SafetensorsFile f = ckpt::SafetensorsFile::open(file);
  const auto v = f.view(name).as<T>();
  return {v.begin(), v.end()};
}

std::string ids_csv(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s;
}

// Each flag added to `base` exits 1 (usage) with its `what` in the message.
void expect_usage_errors(const std::string& base,
                         const std::vector<std::pair<std::string, std::string>>& flags) {
  for (const auto& [flag, what] : flags) {
    const CommandResult bad = qforge(base + flag);
    EXPECT_EQ(bad.exit_code, 1) << flag << bad.out;
    EXPECT_NE(bad.out.find(what), std::string::npos) << flag << bad.out;
  }
}

std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// logits --text --mtp on `device` equals the fixture's reference (1e-3 x max |logit|).
void expect_reference_logits(const std::string& device) {
  TempDir tmp;
  const nlohmann::json prov = nlohmann::json::parse(read_file(kDir / "provenance.json"));
  const CommandResult r = qforge("logits --model " + kModel.string() + " --text " +
                                 quoted(prov["prompt"].get<std::string>()) + " --mtp --out " +
                                 (tmp / "l.safetensors").string() + " --device " + device);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const fs::path ref = kModel.parent_path() / "reference.safetensors";
  EXPECT_EQ(read<int32_t>(tmp / "l.safetensors", "tokens"), read<int32_t>(ref, "prompt_ids"));
  for (const char* name : {"logits", "mtp_logits"}) {
    const std::vector<float> want = read<float>(ref, name),
                             got = read<float>(tmp / "l.safetensors", name);
    ASSERT_EQ(want.size(), got.size()) << name;
    float diff = 0, top = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      diff = std::max(diff, std::fabs(want[i] - got[i]));
      top = std::max(top, std::fabs(want[i]));
    }
    EXPECT_LE(diff, 1e-3f * top) << name;
  }
}

// --text tokenizes with the model's tokenizer.json exactly as the fixture script's HF tokenizer.
TEST(EngineCli, LogitsFromTextEqualTheReference) {
  expect_reference_logits("cpu");
}

TEST(EngineCli, CudaLogitsWithMtpEqualTheReference) {
  std::string why;
  if (!rt::CudaEngine::available(&why)) GTEST_SKIP() << "no GPU: " << why;
  expect_reference_logits("cuda");
}

// Plain and speculative (the MTP head drafting) greedy decoding on `device` both give the
// reference's ids, and so does speculative sampling at top-k 1 (every distribution one-hot).
void expect_reference_greedy(const std::string& device) {
  const fs::path ref = kModel.parent_path() / "reference.safetensors";
  for (const std::string flags : {" --temperature 0", " --temperature 0 --speculative",
                                  " --temperature 0.7 --top-k 1 --seed 4 --speculative"}) {
    const CommandResult r =
        qforge_split("generate --model " + kModel.string() + " --tokens " +
                     ids_csv(read<int32_t>(ref, "prompt_ids")) +
                     " --ignore-eos --max-tokens 24 --json --device " + device + flags);
    ASSERT_EQ(r.exit_code, 0) << flags << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), read<int32_t>(ref, "greedy_ids")) << flags;
    EXPECT_EQ(j["finish_reason"], "length");
    const bool speculative = flags.find("speculative") != std::string::npos;
    EXPECT_EQ(j.contains("speculative"), speculative);
    if (speculative) {
      EXPECT_GE(j["speculative"]["rounds"].get<int>(), 12);
    }
  }
}

// --mtp-draft-vocab: speculative decoding drafting from the first 512 of the fixture's ids still
// gives the reference's greedy ids (and, where a GPU is usable, on it too; bench's MTP step then
// reads fewer bytes); without the flag it qualifies, or at a size that is no multiple of 128,
// refused.
TEST(EngineCli, MtpDraftVocabulary) {
  const fs::path ref = kModel.parent_path() / "reference.safetensors";
  const std::string gen = "generate --model " + kModel.string() + " --tokens " +
                          ids_csv(read<int32_t>(ref, "prompt_ids")) +
                          " --ignore-eos --max-tokens 24 --json --temperature 0";
  std::string why;
  const bool gpu = rt::CudaEngine::available(&why);
  for (const std::string device : {"cpu", "cuda"}) {
    if (device == "cuda" && !gpu) continue;
    const CommandResult r =
        qforge_split(gen + " --speculative --mtp-draft-vocab 512 --device " + device);
    ASSERT_EQ(r.exit_code, 0) << device << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), read<int32_t>(ref, "greedy_ids")) << device;
    EXPECT_GE(j["speculative"]["rounds"].get<int>(), 12) << device;
  }
  CommandResult r = qforge_split(gen + " --mtp-draft-vocab 512");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--speculative"), std::string::npos) << r.err;
  r = qforge_split(gen + " --speculative --mtp-draft-vocab 500");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("multiple of 128"), std::string::npos) << r.err;
  r = qforge_split(gen + " --speculative --mtp-draft-vocab -128");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--mtp-draft-vocab"), std::string::npos) << r.err;
  r = qforge_split("bench --synthetic tiny --mtp-draft-vocab 512");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--mtp"), std::string::npos) << r.err;
  if (!gpu) return;
  const std::string bench = "bench --synthetic tiny --mtp --context 8 --steps 4 --json";
  r = qforge_split(bench);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json all = nlohmann::json::parse(r.out);
  r = qforge_split(bench + " --mtp-draft-vocab 256");  // of the tiny preset's 512 ids
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json some = nlohmann::json::parse(r.out);
  EXPECT_EQ(some["mtp"]["draft_vocab"].get<int64_t>(), 256);
  EXPECT_EQ(all["mtp"]["draft_vocab"].get<int64_t>(), 512);
  EXPECT_LT(some["mtp"]["bytes_per_step"].get<uint64_t>(),
            all["mtp"]["bytes_per_step"].get<uint64_t>());
}

TEST(EngineCli, GreedyGenerateEqualsTheReference) {
  expect_reference_greedy("cpu");
}

TEST(EngineCli, CudaGreedyGenerateEqualsTheReference) {
  std::string why;
  if (!rt::CudaEngine::available(&why)) GTEST_SKIP() << "no GPU: " << why;
  expect_reference_greedy("cuda");
}

// --logprobs: the first generated token's logprobs are log-softmax of the reference's logits at
// the prompt's last position (within twice the logits' 1e-3 x max |logit| bound), its top ids
// the reference's most likely ones; speculative decoding reports the same as plain.
void expect_reference_logprobs(const std::string& device) {
  const fs::path ref = kModel.parent_path() / "reference.safetensors";
  const std::vector<int32_t> prompt = read<int32_t>(ref, "prompt_ids");
  const std::vector<float> logits = read<float>(ref, "logits");
  const size_t vocab = logits.size() / prompt.size();
  const std::vector<float> last(logits.end() - static_cast<std::ptrdiff_t>(vocab), logits.end());
  float top = 0, max = last[0];
  for (const float l : last) top = std::max(top, std::fabs(l)), max = std::max(max, l);
  double z = 0;
  for (const float l : last) z += std::exp(static_cast<double>(l) - max);
  const auto want = [&](int32_t id) { return last[id] - max - std::log(z); };
  const float tol = 2e-3f * top;
  std::vector<float> sorted = last;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  nlohmann::json first;
  for (const std::string flags : {"", " --speculative"}) {
    const CommandResult r =
        qforge_split("generate --model " + kModel.string() + " --tokens " + ids_csv(prompt) +
                     " --ignore-eos --max-tokens 6 --temperature 0 --logprobs 5 --json --device " +
                     device + flags);
    ASSERT_EQ(r.exit_code, 0) << flags << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j["logprobs"].size(), 6u) << r.out;
    const nlohmann::json& lp = j["logprobs"][0];
    EXPECT_EQ(lp["id"].get<int32_t>(), read<int32_t>(ref, "greedy_ids")[0]);
    EXPECT_NEAR(lp["logprob"].get<float>(), want(lp["id"].get<int32_t>()), tol) << flags;
    ASSERT_EQ(lp["top"].size(), 5u);
    for (const nlohmann::json& t : lp["top"]) {
      const int32_t id = t["id"].get<int32_t>();
      EXPECT_NEAR(t["logprob"].get<float>(), want(id), tol) << flags << " id " << id;
      EXPECT_GE(last[id], sorted[4] - tol) << flags << " id " << id << " is not in the top 5";
    }
    for (size_t i = 0; i < j["ids"].size(); ++i) {
      EXPECT_EQ(j["logprobs"][i]["id"], j["ids"][i]) << flags << " token " << i;
    }
    if (flags.empty()) {
      first = j["logprobs"];
    } else {
      for (size_t i = 0; i < first.size(); ++i) {
        EXPECT_EQ(j["logprobs"][i]["id"], first[i]["id"]) << i;
        EXPECT_NEAR(j["logprobs"][i]["logprob"].get<float>(), first[i]["logprob"].get<float>(),
                    1e-5f)
            << i;
      }
    }
  }
}

TEST(EngineCli, LogprobsAreTheReferencesLogSoftmax) {
  expect_reference_logprobs("cpu");
}

TEST(EngineCli, CudaLogprobsAreTheReferencesLogSoftmax) {
  std::string why;
  if (!rt::CudaEngine::available(&why)) GTEST_SKIP() << "no GPU: " << why;
  expect_reference_logprobs("cuda");
}

// --json-schema on every generation path of `device` (greedy and sampled, plain and
// speculative): the text is one of the schema's values, and generation stops at an eos token
// once it is complete. --json-object likewise; a schema outside the subset is refused naming
// the keyword.
void expect_structured_output(const std::string& device) {
  TempDir tmp;
  write_file(tmp / "enum.json", R"({"enum": ["yes", "no", {"maybe": [1, 2]}]})");
  const std::string base = "generate --model " + kModel.string() + " --device " + device +
                           " --prompt 'Is it?' --max-tokens 100 --json";
  for (const std::string mode : {" --temperature 0", " --temperature 1 --seed 3"}) {
    for (const std::string spec : {"", " --speculative"}) {
      const CommandResult r =
          qforge_split(base + " --json-schema " + (tmp / "enum.json").string() + mode + spec);
      ASSERT_EQ(r.exit_code, 0) << mode << spec << r.err;
      const nlohmann::json j = nlohmann::json::parse(r.out);
      EXPECT_EQ(j["finish_reason"], "stop") << mode << spec << r.out;
      const nlohmann::json v = nlohmann::json::parse(j["text"].get<std::string>());
      EXPECT_TRUE(v == "yes" || v == "no" || v == nlohmann::json::parse(R"({"maybe":[1,2]})"))
          << mode << spec << r.out;
    }
  }
  const CommandResult obj = qforge_split("generate --model " + kModel.string() + " --device " +
                                         device + " --prompt 'Is it?' --max-tokens 300 --json" +
                                         " --json-object --temperature 1 --seed 4");
  ASSERT_EQ(obj.exit_code, 0) << obj.err;
  const nlohmann::json j = nlohmann::json::parse(obj.out);
  const std::string text = j["text"];
  // Whole (it stopped) or cut by --max-tokens: an object, or the start of one.
  if (j["finish_reason"] == "stop") {
    EXPECT_TRUE(nlohmann::json::parse(text).is_object()) << text;
  } else {
    EXPECT_NE(text.find('{'), std::string::npos) << text;
  }
  write_file(tmp / "bad.json", R"({"type": "array", "uniqueItems": true})");
  const CommandResult bad = qforge(base + " --json-schema " + (tmp / "bad.json").string());
  EXPECT_EQ(bad.exit_code, 1) << bad.out;
  EXPECT_NE(bad.out.find("the keyword 'uniqueItems' is not supported"), std::string::npos)
      << bad.out;
}

TEST(EngineCli, StructuredOutputOnEveryPath) {
  expect_structured_output("cpu");
}

TEST(EngineCli, CudaStructuredOutputOnEveryPath) {
  std::string why;
  if (!rt::CudaEngine::available(&why)) GTEST_SKIP() << "no GPU: " << why;
  expect_structured_output("cuda");
}

// Penalties reach the sampler (a presence penalty changes greedy ids), and values out of range
// are refused naming them.
TEST(EngineCli, PenaltiesChangeGreedyIdsAndBadValuesAreRefused) {
  const fs::path ref = kModel.parent_path() / "reference.safetensors";
  const std::string base = "generate --model " + kModel.string() + " --tokens " +
                           ids_csv(read<int32_t>(ref, "prompt_ids")) +
                           " --ignore-eos --max-tokens 24 --json --temperature 0";
  const CommandResult r = qforge_split(base + " --presence-penalty 2 --repetition-penalty 1.5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_NE(j["ids"].get<std::vector<int32_t>>(), read<int32_t>(ref, "greedy_ids"));
  EXPECT_FLOAT_EQ(j["presence_penalty"].get<float>(), 2.0f);
  expect_usage_errors(base, {{" --presence-penalty 2.5", "presence penalty"},
                             {" --frequency-penalty -3", "frequency penalty"},
                             {" --repetition-penalty 0", "repetition penalty"},
                             {" --min-p 1.5", "min-p"},
                             {" --logprobs 21", "logprobs"}});
  const CommandResult no_json =
      qforge("generate --model " + kModel.string() + " --tokens 1,2 --max-tokens 2 --logprobs 1");
  EXPECT_EQ(no_json.exit_code, 1) << no_json.out;
  EXPECT_NE(no_json.out.find("--logprobs needs --json"), std::string::npos) << no_json.out;
}

// Integer flags are decimal and within 64 bits (CLI11 alone reads 010 as octal, saturates past
// 2^63 - 1 and wraps -1 on an unsigned flag), --threads at most 1024 (100000 threads ended in
// std::terminate when the system refused them), and a CUDA KV cache past kMaxCudaContext positions
// is refused before anything loads (or a GPU is looked for).
TEST(EngineCli, IntegerFlagsAreDecimalAndInRange) {
  const std::string base = "generate --model " + kModel.string() + " --tokens 1,2 --ignore-eos";
  const CommandResult ten = qforge_split(base + " --max-tokens 010 --json");
  ASSERT_EQ(ten.exit_code, 0) << ten.err;
  EXPECT_EQ(nlohmann::json::parse(ten.out)["ids"].size(), 10u);  // not octal 8
  expect_usage_errors(
      base, {{" --max-tokens 0x10", "--max-tokens: '0x10' is not a decimal integer"},
             {" --top-k +3", "--top-k: '+3' is not a decimal integer"},
             {" --max-tokens 9223372036854775808", "'9223372036854775808' is out of range"},
             {" --seed -1", "--seed: '-1' is negative"},
             {" --seed 18446744073709551616", "'18446744073709551616' is out of range"},
             {" --threads 100000", "--threads: Value 100000 not in range 0 to 1024"}});
  const CommandResult big = qforge(base + " --max-tokens 9223372036854775807 --device cuda");
  EXPECT_EQ(big.exit_code, 1) << big.out;
  EXPECT_NE(big.out.find("a KV cache of 1073741827 positions: the CUDA engine takes 1 to " +
                         std::to_string(rt::kMaxCudaContext)),
            std::string::npos)
      << big.out;
}

// --speculative samples with generation_config.json's defaults (the fixture's: temperature 0.6,
// top-p 0.95, top-k 20) like plain generation, and a seed reproduces it.
TEST(EngineCli, SpeculativeSamplesWithTheConfigsDefaults) {
  const std::string args = "generate --model " + kModel.string() +
                           " --tokens 1,2 --speculative --seed 5 --max-tokens 16 --ignore-eos "
                           "--json";
  const CommandResult a = qforge_split(args), b = qforge_split(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const nlohmann::json ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_FLOAT_EQ(ja["temperature"].get<float>(), 0.6f) << a.out;
  EXPECT_EQ(ja["top_k"].get<int>(), 20) << a.out;
  EXPECT_EQ(ja["ids"].size(), 16u);
  EXPECT_EQ(ja["ids"], jb["ids"]);
  EXPECT_GE(ja["speculative"]["rounds"].get<int>(), 8);
}

TEST(EngineCli, SpeculativeNeedsAnMtpHead) {
  CommandResult r;
  TempDir tmp;
  CheckpointEdit edit;
  const ckpt::SafetensorsFile f = ckpt::SafetensorsFile::open(kModel / "model.safetensors");
  for (const auto& t : f.tensors()) {
    if (t.name.rfind("mtp.", 0) == 0) edit.drop.insert(t.name);
  }
  ASSERT_FALSE(edit.drop.empty());
  copy_checkpoint(kModel, tmp / "m", edit);  // the config still declares the head: refused
  r = qforge("generate --model " + (tmp / "m").string() + " --tokens 1,2 --speculative");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("qforge add-mtp"), std::string::npos) << r.out;
  edit.config = [](std::string& c) {
    const std::string key = "\"mtp_num_hidden_layers\": 1";
    ASSERT_NE(c.find(key), std::string::npos);
    c.replace(c.find(key), key.size(), "\"mtp_num_hidden_layers\": 0");
  };
  copy_checkpoint(kModel, tmp / "n", edit);  // a model without one: loads, but cannot draft
  r = qforge("generate --model " + (tmp / "n").string() + " --tokens 1,2 --speculative");
  EXPECT_EQ(r.exit_code, 4) << r.out;  // unsupported
  EXPECT_NE(r.out.find("has no MTP head"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("terminate"), std::string::npos) << r.out;
}

// Text goes to stdout as it is generated, statistics to stderr; a seed reproduces a sample.
TEST(EngineCli, GenerateStreamsTextReproducibly) {
  const std::string args = "generate --model " + kModel.string() +
                           " --chat 'Hello, who are you?' --max-tokens 40 --temperature 0.8"
                           " --top-p 0.95 --top-k 50 --seed 11";
  const CommandResult a = qforge_split(args), b = qforge_split(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_FALSE(a.out.empty());
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.err.find("generated at"), std::string::npos) << a.err;
  EXPECT_NE(a.err.find("seed 11"), std::string::npos) << a.err;
  const CommandResult json = qforge_split(args + " --json");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_EQ(nlohmann::json::parse(json.out)["text"].get<std::string>() + "\n", a.out);
}

TEST(EngineCli, StopsAtAnEosToken) {
  // The greedy continuation's first token made a stop token: generation ends before it.
  const fs::path ref = kModel.parent_path() / "reference.safetensors";
  const std::vector<int32_t> greedy = read<int32_t>(ref, "greedy_ids");
  TempDir tmp;
  copy_checkpoint(kModel, tmp / "m", {});
  write_file(tmp / "m" / "generation_config.json",
             "{\"eos_token_id\": [" + std::to_string(greedy[3]) + "]}");
  const CommandResult r = qforge_split("generate --model " + (tmp / "m").string() + " --tokens " +
                                       ids_csv(read<int32_t>(ref, "prompt_ids")) +
                                       " --temperature 0 --max-tokens 24 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["finish_reason"], "stop");
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(),
            std::vector<int32_t>(greedy.begin(), greedy.begin() + 3));
}

struct BadCase {
  std::string name;
  std::function<void(const fs::path&)> breaks;
  std::string args;  // after --model DIR
  int exit_code;
  std::string message;
};

TEST(EngineCli, BrokenModelsGiveClearErrors) {
  const std::vector<BadCase> cases = {
      {"missing directory", [](const fs::path& m) { fs::remove_all(m); }, "--tokens 1,2", 3,
       "no such file or directory"},
      {"no config.json", [](const fs::path& m) { fs::remove(m / "config.json"); }, "--tokens 1", 2,
       "config.json: missing"},
      {"no tokenizer.json", [](const fs::path& m) { fs::remove(m / "tokenizer.json"); },
       "--text hi", 3, "tokenizer.json"},
      {"corrupt tokenizer.json",
       [](const fs::path& m) {
         std::string t = read_file(m / "tokenizer.json");
         write_file(m / "tokenizer.json", t.substr(0, t.size() / 2));
       },
       "--text hi", 2, "tokenizer.json"},
      {"token outside the vocabulary", [](const fs::path&) {}, "--tokens 1,99999", 1,
       "token id 99999 is outside the vocabulary [0, 1031)"},
      {"bad token list", [](const fs::path&) {}, "--tokens 1,x", 1, "item 2 ('x')"},
  };
  for (const BadCase& c : cases) {
    TempDir tmp;
    copy_checkpoint(kModel, tmp / "m", {});
    c.breaks(tmp / "m");
    const CommandResult r = qforge("logits --model " + (tmp / "m").string() + " " + c.args +
                                   " --out " + (tmp / "o.safetensors").string());
    EXPECT_EQ(r.exit_code, c.exit_code) << c.name << ": " << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.name << ": " << r.out;
    EXPECT_EQ(r.out.find("terminate"), std::string::npos) << c.name;
    EXPECT_FALSE(fs::exists(tmp / "o.safetensors")) << c.name;
  }
}

// A tensor of the wrong shape is reported by name, as qforge validate reports it.
TEST(EngineCli, WrongShapeNamesTheTensor) {
  TempDir tmp;
  const std::string name = "model.language_model.layers.1.linear_attn.in_proj_z.weight";
  CheckpointEdit edit;
  edit.retype[name] = {name, ckpt::DType::kBF16, {64, 63}};
  copy_checkpoint(kModel, tmp / "m", edit);
  for (const std::string& cmd : {"logits --tokens 1 --out " + (tmp / "o").string(),
                                 std::string("generate --tokens 1 --max-tokens 2")}) {
    const CommandResult r = qforge(cmd.substr(0, cmd.find(' ')) + " --model " +
                                   (tmp / "m").string() + cmd.substr(cmd.find(' ')));
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_NE(r.out.find(name), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("[64, 63]"), std::string::npos) << r.out;
  }
}

// Without a usable GPU (or in a build without CUDA), --device cuda says why and exits 4.
TEST(EngineCli, CudaDeviceWithoutAGpuSaysWhy) {
  std::string why;
  if (rt::CudaEngine::available(&why))
    GTEST_SKIP() << "a GPU is present: rt_cuda_golden_test runs it";
  for (const std::string cmd : {"generate --prompt hi", "logits --tokens 1,2 --out /dev/null"}) {
    const CommandResult r = qforge(cmd.substr(0, cmd.find(' ')) + " --model " + kModel.string() +
                                   cmd.substr(cmd.find(' ')) + " --device cuda");
    EXPECT_EQ(r.exit_code, 4) << r.out;
    EXPECT_NE(r.out.find("--device cuda: " + why), std::string::npos) << r.out;
  }
  const CommandResult b = qforge("bench --synthetic tiny");
  EXPECT_EQ(b.exit_code, 4) << b.out;
  EXPECT_NE(b.out.find("--device cuda: "), std::string::npos) << b.out;
}

// Where a GPU is usable: bench --mtp times the MTP head too.
TEST(EngineCli, BenchTimesTheMtpHeadAndSpeculativeDecoding) {
  std::string why;
  if (!rt::CudaEngine::available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const CommandResult r = qforge_split("bench --synthetic tiny --mtp --context 8 --steps 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["mtp"]["step_us"].get<double>(), 0);
  EXPECT_GT(j["mtp"]["bytes_per_step"].get<uint64_t>(), 0u);
  // The GB10 projections from the step's figures: this GPU's fraction of copy at 232 GB/s, or
  // the step's time beyond its bytes at the copy rate plus its bytes at 232 GB/s.
  const double us = j["step_us"].get<double>(), copy = j["copy_gbs"].get<double>();
  const auto bytes = static_cast<double>(j["bytes_per_step"].get<uint64_t>());
  const double same = 232e9 * j["fraction_of_copy"].get<double>() / bytes;
  EXPECT_NEAR(j["projected_gb10_tokens_per_s"].get<double>(), same, 1e-9 * same);
  const double beyond = std::max(0.0, us - bytes / (copy * 1e3));
  EXPECT_NEAR(j["beyond_bytes_us"].get<double>(), beyond, 1e-9 * us);
  const double at_beyond = 1e6 / (beyond + bytes / 232e3);
  EXPECT_NEAR(j["projected_gb10_tokens_per_s_same_beyond"].get<double>(), at_beyond,
              1e-9 * at_beyond);
  // Speculative decoding's parts, and its projected rate: a round of one MTP step and a verify
  // pass (host-synced, as the loop calls them), plus the MTP head's entry for a kept draft or
  // the rollback for a rejected one, per 1 + kept.
  const nlohmann::json& sp = j["speculative"];
  const double verify = sp["verify_us"].get<double>(), rollback = sp["reject_us"].get<double>(),
               entry = sp["mtp_entry_us"].get<double>(),
               round = sp["draft_then_verify_us"].get<double>();
  EXPECT_GT(entry, 0);
  EXPECT_GT(round, 0);
  EXPECT_GT(sp["step_us_host_synced"].get<double>(), 0);
  EXPECT_GT(verify, 0);
  EXPECT_NEAR(sp["prefill_tokens_per_s_in_pairs"].get<double>(), 2e6 / verify, 1e-9 * 2e6 / verify);
  for (const double kept : {0.5, 0.7, 0.9}) {
    const double want = (1 + kept) * 1e6 / (round + kept * entry + (1 - kept) * rollback);
    const std::string key = kept == 0.5 ? "0.5" : kept == 0.7 ? "0.7" : "0.9";
    EXPECT_NEAR(sp["tokens_per_s_at_kept"][key].get<double>(), want, 1e-9 * want) << key;
    // Sampled: the draft and the verify with their logits copied back and sampled from, and a
    // host draw for a kept draft's next token.
    const nlohmann::json& sm = sp["sampled"];
    const double sv = sm["verify_us"].get<double>(), sd = sm["draft_us"].get<double>(),
                 draw = sm["sample_us"].get<double>();
    EXPECT_GT(sv, 0);
    EXPECT_GT(sd, 0);
    EXPECT_GT(draw, 0);
    const double sampled =
        (1 + kept) * 1e6 / (sv + sd + kept * (entry + draw) + (1 - kept) * rollback);
    EXPECT_NEAR(sm["tokens_per_s_at_kept"][key].get<double>(), sampled, 1e-9 * sampled) << key;
  }
  EXPECT_GT(sp["sampled"]["step_us"].get<double>(), 0);
}

// Where a GPU is usable: bench --prefill times a batched prefill next to the same prompt in
// pairs (up to 4096 tokens); the rates are the token count over the times it reports.
TEST(EngineCli, BenchTimesABatchedPrefill) {
  std::string why;
  if (!rt::CudaEngine::available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const CommandResult r = qforge_split(
      "bench --synthetic tiny --context 8 --steps 4 --prefill 11 --prefill-chunk 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json p = nlohmann::json::parse(r.out)["prefill"];
  ASSERT_TRUE(p.is_object()) << r.out;
  EXPECT_EQ(p["tokens"], 11);
  EXPECT_EQ(p["tokens_per_pass"], 4);
  EXPECT_FALSE(p["kernels"].empty()) << r.out;  // one pass, family by family
  for (const char* way : {"batched", "pairs"}) {
    const double ms = p[std::string(way) + "_ms"].get<double>();
    EXPECT_GT(ms, 0) << way;
    EXPECT_NEAR(p[std::string(way) + "_tokens_per_s"].get<double>(), 11e3 / ms, 1e-9 * 11e3 / ms);
  }
  EXPECT_EQ(qforge_split("bench --synthetic tiny --prefill-chunk 0").exit_code, kExitUsage);
  // --scalar-attention is taken (tiny's head_dim 64 runs the scalar kernel either way; the
  // tensor-core path is checked by attention_test and rt_cuda_golden_test's hd256 fixture);
  // pairs are not timed past 4096 tokens (null).
  const CommandResult scalar = qforge_split(
      "bench --synthetic tiny --context 8 --steps 2 --prefill 11 --scalar-attention --json");
  ASSERT_EQ(scalar.exit_code, 0) << scalar.err;
  EXPECT_GT(nlohmann::json::parse(scalar.out)["prefill"]["batched_ms"].get<double>(), 0);
  const CommandResult long_prompt =
      qforge_split("bench --synthetic tiny --context 8 --steps 2 --prefill 4097 --json");
  ASSERT_EQ(long_prompt.exit_code, 0) << long_prompt.err;
  const nlohmann::json lp = nlohmann::json::parse(long_prompt.out)["prefill"];
  EXPECT_GT(lp["batched_ms"].get<double>(), 0);
  EXPECT_TRUE(lp["pairs_ms"].is_null()) << lp.dump();
  EXPECT_TRUE(lp["pairs_tokens_per_s"].is_null()) << lp.dump();
}

// Where a GPU is usable: bench --synthetic-format makes Intel's INT4 release (BF16 shared experts
// and LM head) and Qwen's BF16 release instead of the hybrid, each step moving more bytes than the
// one before; prefill and the MTP head run on each.
TEST(EngineCli, BenchTakesTheReleasesFormats) {
  EXPECT_EQ(qforge_split("bench --synthetic tiny --synthetic-format fp4").exit_code, 1);
  EXPECT_EQ(qforge_split("bench --model " + kModel.string() + " --synthetic-format int4").exit_code,
            kExitUsage);
  std::string why;
  if (!rt::CudaEngine::available(&why)) GTEST_SKIP() << "no GPU: " << why;
  uint64_t last = 0;
  for (const char* format : {"hybrid", "int4", "bf16"}) {
    SCOPED_TRACE(format);
    const CommandResult r =
        qforge_split(std::string("bench --synthetic tiny --synthetic-format ") + format +
                     " --mtp --context 8 --steps 4 --prefill 11 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    const auto bytes = j["bytes_per_step"].get<uint64_t>();
    EXPECT_GT(bytes, last);
    last = bytes;
    EXPECT_GT(j["prefill"]["batched_ms"].get<double>(), 0);
    EXPECT_GT(j["mtp"]["step_us"].get<double>(), 0);
    if (std::string(format) != "hybrid") {
      EXPECT_NE(j["model"].get<std::string>().find(std::string(format) == "int4" ? "INT4" : "BF16"),
                std::string::npos);
    }
  }
}

// bench --skip takes only the engine's launch names, checked before anything is loaded.
TEST(EngineCli, BenchRejectsUnknownSkip) {
  const CommandResult r = qforge("bench --synthetic tiny --skip router,bogus");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("--skip"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bogus"), std::string::npos) << r.out;
}

// --kv-cache-dtype on logits, generate and bench: bfloat16 and fp8 move the logits (float32 is
// the default, bit for bit; fp8_e4m3 is fp8's other name), the CUDA engine's logits equal the CPU
// engine's (5e-4 x max |logit|), bench counts a half and a quarter of the attention bytes, and
// other names are refused naming the flag.
TEST(EngineCli, KvCacheDtypeOnTheEngineCommands) {
  TempDir tmp;
  const std::string base = "logits --model " + kModel.string() + " --tokens 5,9,2,7,11,3,8 --out ";
  const auto logits = [&](const std::string& name, const std::string& flags) {
    const fs::path out = tmp / (name + ".safetensors");
    const CommandResult r = qforge(base + out.string() + " " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.out;
    return r.exit_code == 0 ? read<float>(out, "logits") : std::vector<float>{};
  };
  const std::vector<float> plain = logits("plain", ""),
                           f32 = logits("f32", "--kv-cache-dtype float32"),
                           b16 = logits("b16", "--kv-cache-dtype bfloat16"),
                           f8 = logits("f8", "--kv-cache-dtype fp8"),
                           e4m3 = logits("e4m3", "--kv-cache-dtype fp8_e4m3");
  ASSERT_FALSE(plain.empty());
  EXPECT_EQ(plain, f32);
  ASSERT_EQ(plain.size(), b16.size());
  ASSERT_EQ(plain.size(), f8.size());
  EXPECT_NE(plain, b16);
  EXPECT_NE(plain, f8);
  EXPECT_NE(b16, f8);
  EXPECT_EQ(f8, e4m3);
  for (const char* kv : {"bfloat16", "fp8"}) {
    const CommandResult g = qforge("generate --model " + kModel.string() +
                                   " --tokens 5,9,2 --max-tokens 4 --temperature 0 --json "
                                   "--kv-cache-dtype " +
                                   kv);
    EXPECT_EQ(g.exit_code, 0) << kv << ": " << g.out;
  }
  for (const char* cmd : {"logits", "generate", "serve", "eval-ppl", "bench"}) {
    const CommandResult r =
        qforge(std::string(cmd) + " --model " + kModel.string() + " --kv-cache-dtype fp16");
    EXPECT_EQ(r.exit_code, 1) << cmd << ": " << r.out;
    EXPECT_NE(r.out.find("--kv-cache-dtype"), std::string::npos) << cmd << ": " << r.out;
  }
  std::string why;
  if (!rt::CudaEngine::available(&why)) GTEST_SKIP() << "no GPU: " << why;
  for (const auto& [kv, cpu] : {std::pair{"bfloat16", &b16}, std::pair{"fp8", &f8}}) {
    const std::vector<float> gpu =
        logits(std::string("gpu_") + kv, std::string("--device cuda --kv-cache-dtype ") + kv);
    ASSERT_EQ(gpu.size(), cpu->size()) << kv;
    float diff = 0, top = 0;
    for (size_t i = 0; i < gpu.size(); ++i) {
      diff = std::max(diff, std::fabs(gpu[i] - (*cpu)[i]));
      top = std::max(top, std::fabs((*cpu)[i]));
    }
    EXPECT_LE(diff, 5e-4f * top) << kv;
  }
  const char* names[3] = {"float32", "bfloat16", "fp8"};
  uint64_t attention_bytes[3] = {0, 0, 0};
  for (const int i : {0, 1, 2}) {
    const CommandResult r = qforge_split(
        std::string("bench --synthetic tiny --context 64 --steps 2 --json --kv-cache-dtype ") +
        names[i]);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["kv_cache_dtype"], names[i]);
    for (const nlohmann::json& k : j["kernels"]) {
      if (k["name"] == "attention") attention_bytes[i] = k["bytes"].get<uint64_t>();
    }
  }
  EXPECT_GT(attention_bytes[2], 0u);
  EXPECT_EQ(attention_bytes[0], 2 * attention_bytes[1]);
  EXPECT_EQ(attention_bytes[0], 4 * attention_bytes[2]);
}

TEST(EngineCli, RejectsUnknownDevice) {
  const CommandResult r =
      qforge("generate --model " + kModel.string() + " --prompt hi --device tpu");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("--device"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace qf::test
