// generation_config.json: Qwen3.5's file, the int-or-list eos field, defaults without a file,
// and one refusal per malformed field naming the file and the field.
#include <gtest/gtest.h>

#include "qf/rt/generation_config.h"
#include "test_support.h"

namespace qf::rt {
namespace {

using qf::test::error_code;
using qf::test::TempDir;

// As shipped with the Qwen3.5 MoE models (qwen35-architecture.md §6).
constexpr const char* kQwen35 = R"({
  "bos_token_id": 248044,
  "do_sample": true,
  "eos_token_id": [248046, 248044],
  "pad_token_id": 248044,
  "temperature": 0.6,
  "top_k": 20,
  "top_p": 0.95,
  "transformers_version": "4.57.0.dev0"
})";

TEST(GenerationConfig, Qwen35File) {
  TempDir dir;
  qf::test::write_file(dir / "generation_config.json", kQwen35);
  const GenerationConfig c = load_generation_config(dir.path());
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{248046, 248044}));
  EXPECT_EQ(c.bos_token_id, 248044);
  EXPECT_EQ(c.pad_token_id, 248044);
  EXPECT_EQ(c.do_sample, true);
  EXPECT_EQ(c.temperature, 0.6f);
  EXPECT_EQ(c.top_k, 20);
  EXPECT_EQ(c.top_p, 0.95f);
  EXPECT_FALSE(c.min_p.has_value());
  EXPECT_FALSE(c.repetition_penalty.has_value());
}

TEST(GenerationConfig, SingleEosAndNullsAndBounds) {
  const GenerationConfig one = parse_generation_config(R"({"eos_token_id": 2})", "g.json");
  EXPECT_EQ(one.eos_token_ids, (std::vector<int32_t>{2}));
  const GenerationConfig nulls = parse_generation_config(
      R"({"eos_token_id": null, "bos_token_id": null, "temperature": null, "top_k": null})", "g");
  EXPECT_TRUE(nulls.eos_token_ids.empty());
  EXPECT_FALSE(nulls.bos_token_id.has_value());
  EXPECT_FALSE(nulls.temperature.has_value());
  const GenerationConfig edges = parse_generation_config(
      R"({"eos_token_id": [], "temperature": 0, "top_p": 1, "top_k": 0, "min_p": 0,
          "repetition_penalty": 1.05, "pad_token_id": 2147483647})",
      "g");
  EXPECT_TRUE(edges.eos_token_ids.empty());
  EXPECT_EQ(edges.temperature, 0.0f);
  EXPECT_EQ(edges.top_p, 1.0f);
  EXPECT_EQ(edges.top_k, 0);
  EXPECT_EQ(edges.min_p, 0.0f);
  EXPECT_EQ(edges.repetition_penalty, 1.05f);
  EXPECT_EQ(edges.pad_token_id, 2147483647);
}

// Sampling fields count when the model samples; the repetition penalty counts either way.
TEST(GenerationConfig, DefaultSampling) {
  const auto sampling = [](const char* json) {
    return default_sampling(parse_generation_config(json, "g.json"));
  };
  const SamplingOptions s = sampling(
      R"({"do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.1,
          "repetition_penalty": 1.05})");
  EXPECT_EQ(s.temperature, 0.6f);
  EXPECT_EQ(s.top_p, 0.95f);
  EXPECT_EQ(s.top_k, 20);
  EXPECT_EQ(s.min_p, 0.1f);
  EXPECT_EQ(s.repetition_penalty, 1.05f);
  const SamplingOptions g = sampling(
      R"({"do_sample": false, "temperature": 0.6, "min_p": 0.1, "repetition_penalty": 1.05})");
  EXPECT_EQ(g.temperature, 0.0f);
  EXPECT_EQ(g.min_p, 0.0f);
  EXPECT_EQ(g.repetition_penalty, 1.05f);
  const SamplingOptions none = sampling("{}");
  EXPECT_EQ(none.temperature, 0.0f);
  EXPECT_EQ(none.repetition_penalty, 1.0f);
  EXPECT_EQ(sampling(R"({"temperature": 0.7})").temperature, 0.7f);  // sampling implied
}

TEST(GenerationConfig, MissingFileGivesDefaults) {
  TempDir dir;
  const GenerationConfig c = load_generation_config(dir.path());
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_FALSE(c.bos_token_id || c.pad_token_id || c.do_sample || c.temperature || c.top_p ||
               c.top_k || c.min_p || c.repetition_penalty);
}

TEST(GenerationConfig, MissingDirectoryOrUnreadableFileIsIo) {
  TempDir dir;
  EXPECT_EQ(error_code([&] { load_generation_config(dir / "absent"); }), Errc::kIo);
  qf::test::write_file(dir / "file", "x");
  EXPECT_EQ(error_code([&] { load_generation_config(dir / "file"); }), Errc::kIo);
  std::filesystem::create_directory(dir / "generation_config.json");  // a directory, not a file
  EXPECT_EQ(error_code([&] { load_generation_config(dir.path()); }), Errc::kIo);
}

// The kConfigInvalid message for `text`.
std::string invalid(const std::string& text) {
  try {
    parse_generation_config(text, "m/generation_config.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kConfigInvalid) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "accepted " << text;
  return "";
}

TEST(GenerationConfig, MalformedFieldsNameFileAndField) {
  const std::string f = "m/generation_config.json: ";
  EXPECT_EQ(invalid("[1]"), f + "expected a JSON object at the top level, got array");
  EXPECT_EQ(invalid("{").rfind(f + "not valid JSON: ", 0), 0u);
  const std::string id = "expected a token id (an integer from 0 to 2^31-1), got ";
  EXPECT_EQ(invalid(R"({"eos_token_id": "2"})"), f + "\"eos_token_id\": " + id + "\"2\"");
  EXPECT_EQ(invalid(R"({"eos_token_id": [1, -2]})"), f + "\"eos_token_id[1]\": " + id + "-2");
  EXPECT_EQ(invalid(R"({"eos_token_id": [1.5]})"), f + "\"eos_token_id[0]\": " + id + "1.5");
  EXPECT_EQ(invalid(R"({"bos_token_id": 2147483648})"),
            f + "\"bos_token_id\": " + id + "2147483648");
  EXPECT_EQ(invalid(R"({"pad_token_id": {}})"), f + "\"pad_token_id\": " + id + "{}");
  EXPECT_EQ(invalid(R"({"do_sample": 1})"), f + "\"do_sample\": expected true or false, got 1");
  EXPECT_EQ(invalid(R"({"temperature": -0.1})"),
            f + "\"temperature\": expected a number >= 0.0, got -0.1");
  EXPECT_EQ(invalid(R"({"temperature": "hot"})"),
            f + "\"temperature\": expected a number >= 0.0, got \"hot\"");
  EXPECT_EQ(invalid(R"({"top_p": 0})"), f + "\"top_p\": expected a number in (0.0, 1.0], got 0");
  EXPECT_EQ(invalid(R"({"top_p": 1.5})"),
            f + "\"top_p\": expected a number in (0.0, 1.0], got 1.5");
  EXPECT_EQ(invalid(R"({"top_k": 2.5})"),
            f + "\"top_k\": expected a non-negative integer, got 2.5");
  EXPECT_EQ(invalid(R"({"top_k": -1})"), f + "\"top_k\": expected a non-negative integer, got -1");
  EXPECT_EQ(invalid(R"({"min_p": 2})"), f + "\"min_p\": expected a number in [0.0, 1.0], got 2");
  EXPECT_EQ(invalid(R"({"repetition_penalty": 0})"),
            f + "\"repetition_penalty\": expected a number > 0.0, got 0");
  EXPECT_EQ(invalid(R"({"temperature": 1e999})").rfind(f + "not valid JSON", 0), 0u);
}

TEST(GenerationConfig, MalformedFileThroughLoadNamesThePath) {
  TempDir dir;
  qf::test::write_file(dir / "generation_config.json", R"({"top_k": "many"})");
  try {
    load_generation_config(dir.path());
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kConfigInvalid);
    EXPECT_EQ(std::string(e.what()),
              (dir / "generation_config.json").string() +
                  ": \"top_k\": expected a non-negative integer, got \"many\"");
  }
}

}  // namespace
}  // namespace qf::rt
