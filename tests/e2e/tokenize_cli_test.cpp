// `qforge tokenize` on the real Qwen3.5 tokenizer.json: ids as Hugging Face tokenizers gives
// them (tests/golden/data/tokenizer_golden.json), the three output forms, --decode, and the
// exit codes of bad input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "qf/ckpt/file_io.h"
#include "test_support.h"

namespace qf {
namespace {

using qf::test::run_command;

const std::string kModel = QF_TOKENIZER_DIR;  // holds tokenizer.json

std::string qforge(const std::string& args) {
  return std::string(QF_BIN) + " tokenize " + args;
}

std::vector<int32_t> parse_ids(const std::string& line) {
  std::vector<int32_t> ids;
  std::istringstream in(line);
  for (int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

// A few corpus strings (each run loads the tokenizer for a second; the library itself is
// checked on all of them by rt_tokenizer_golden_test).
TEST(TokenizeCli, IdsMatchHuggingFace) {
  const auto golden = nlohmann::json::parse(
      ckpt::read_text_file(std::string(QF_GOLDEN_DIR) + "/tokenizer_golden.json"));
  const test::TempDir dir;
  size_t checked = 0;
  for (const auto& c : golden.at("cases")) {
    const auto text = c.at("text").get<std::string>();
    if (text.find("<|im_start|>") == std::string::npos && text.find("Emoji") != 0 &&
        text.find("def f") != 0) {
      continue;
    }
    test::write_file(dir / "text.txt", text);
    const auto r = run_command(
        qforge("--model " + kModel + " --ids-only --file " + (dir / "text.txt").string()));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(parse_ids(r.out), c.at("ids").get<std::vector<int32_t>>()) << text;
    ++checked;
  }
  EXPECT_EQ(checked, 3u);
}

TEST(TokenizeCli, OutputForms) {
  const auto j = run_command(qforge("--model " + kModel + " --text 'Hello, world!' --json"));
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc.at("ids"), (std::vector<int32_t>{9419, 11, 1814, 0}));
  EXPECT_EQ(doc.at("n_tokens"), 4);
  EXPECT_EQ(doc.at("tokens"), (std::vector<std::string>{"Hello", ",", "\u0120world", "!"}));

  const auto human = run_command(qforge("--model " + kModel + " --text '<|im_end|> \xe4\xb8\xad'"));
  ASSERT_EQ(human.exit_code, 0) << human.err;
  EXPECT_EQ(human.out.substr(0, human.out.find('\n')), "3 tokens");
  EXPECT_NE(human.out.find("248046  \"<|im_end|>\""), std::string::npos) << human.out;

  const auto d =
      run_command(qforge("--model " + kModel + "/tokenizer.json --decode 9419,11,1814,0"));
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_EQ(d.out, "Hello, world!\n");
  const auto skip = run_command(
      qforge("--model " + kModel + " --decode 248045,9419,248046 --skip-special --json"));
  ASSERT_EQ(skip.exit_code, 0) << skip.err;
  EXPECT_EQ(nlohmann::json::parse(skip.out).at("text"), "Hello");
}

TEST(TokenizeCli, BadInputExitCodes) {
  const test::TempDir dir;
  test::write_file(dir / "bad.txt", "ok \xff");
  const auto utf8 =
      run_command(qforge("--model " + kModel + " --file " + (dir / "bad.txt").string()));
  EXPECT_EQ(utf8.exit_code, 1);
  EXPECT_NE(utf8.err.find("bad.txt: text to encode is not valid UTF-8 at byte 3"),
            std::string::npos)
      << utf8.err;
  EXPECT_EQ(run_command(qforge("--model " + kModel)).exit_code, 1);  // nothing to do
  EXPECT_EQ(run_command(qforge("--model " + kModel + " --text a --decode 1")).exit_code, 1);
  EXPECT_EQ(run_command(qforge("--model " + kModel + " --decode 1,x")).exit_code, 1);
  EXPECT_EQ(run_command(qforge("--model " + kModel + " --decode 248300")).exit_code, 1);
  EXPECT_EQ(run_command(qforge("--model " + (dir / "none").string() + " --text a")).exit_code, 3);
  test::write_file(dir / "tokenizer.json", "{\"model\": ");
  const auto invalid = run_command(qforge("--model " + dir.path().string() + " --text a"));
  EXPECT_EQ(invalid.exit_code, 2);
  EXPECT_NE(invalid.err.find("tokenizer.json: not valid JSON"), std::string::npos) << invalid.err;
  test::write_file(dir / "tokenizer.json", R"({"model": {"type": "WordPiece"}})");
  EXPECT_EQ(run_command(qforge("--model " + dir.path().string() + " --text a")).exit_code, 4);
}

}  // namespace
}  // namespace qf
