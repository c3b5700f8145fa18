// The tokenizer against Hugging Face `tokenizers` on the real Qwen3.5 tokenizer.json: ids and
// decode per string of a multilingual corpus (tests/golden/make_tokenizer_goldens.py, checked
// there against tiktoken with Qwen's own ranks; its decode equals Python's NFC of the input)
// and of adversarial strings (make_tokenizer_cases.py: Unicode spaces, marks, characters newer
// than the system's Unicode data, specials in odd places, random code points).
// QF_TOKENIZER_JSON is the tokenizer.json CMake extracts from qwen35_tokenizer.tar.xz.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "qf/ckpt/file_io.h"
#include "qf/rt/tokenizer.h"

namespace qf::rt {
namespace {

struct Case {
  std::string text;
  std::vector<int32_t> ids;
  std::string decoded;
};

std::vector<Case> load_cases(const std::string& file) {
  const auto doc =
      nlohmann::json::parse(ckpt::read_text_file(std::string(QF_GOLDEN_DIR) + "/" + file, 1 << 24));
  std::vector<Case> out;
  for (const auto& c : doc.at("cases")) {
    out.push_back({c.at("text").get<std::string>(), c.at("ids").get<std::vector<int32_t>>(),
                   c.at("decoded").get<std::string>()});
  }
  return out;
}

class TokenizerGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {  // loading takes a second: once for all tests
    tok_ = new Tokenizer(Tokenizer::load(QF_TOKENIZER_JSON));
    cases_ = new std::vector<Case>(load_cases("tokenizer_golden.json"));
    stress_ = new std::vector<Case>(load_cases("tokenizer_stress_golden.json"));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete cases_;
    delete stress_;
  }
  static const Tokenizer* tok_;
  static std::vector<Case>*cases_, *stress_;
};
const Tokenizer* TokenizerGolden::tok_ = nullptr;
std::vector<Case>* TokenizerGolden::cases_ = nullptr;
std::vector<Case>* TokenizerGolden::stress_ = nullptr;

TEST_F(TokenizerGolden, CorpusIsNotTrivial) {
  ASSERT_GE(cases_->size(), 30u);
  ASSERT_GE(stress_->size(), 700u);
  size_t n_tokens = 0;
  for (const Case& c : *cases_) n_tokens += c.ids.size();
  EXPECT_GT(n_tokens, 500u);
}

TEST_F(TokenizerGolden, StressStringsMatchHuggingFace) {
  for (const Case& c : *stress_) {
    EXPECT_EQ(tok_->encode(c.text), c.ids) << "text: " << c.text;
    EXPECT_EQ(tok_->decode(c.ids), c.decoded) << "text: " << c.text;
  }
}

TEST_F(TokenizerGolden, EncodeMatchesHuggingFace) {
  for (const Case& c : *cases_) {
    EXPECT_EQ(tok_->encode(c.text), c.ids) << "text: " << c.text;
  }
}

TEST_F(TokenizerGolden, DecodeMatchesHuggingFace) {
  for (const Case& c : *cases_) {
    EXPECT_EQ(tok_->decode(c.ids), c.decoded) << "text: " << c.text;
  }
}

// decoded is NFC(text) (the generator asserts it), so this is decode(encode(s)) == NFC(s).
TEST_F(TokenizerGolden, RoundTripIsNfc) {
  for (const Case& c : *cases_) {
    EXPECT_EQ(tok_->decode(tok_->encode(c.text)), c.decoded) << "text: " << c.text;
  }
}

TEST_F(TokenizerGolden, StreamDecoderMatchesDecode) {
  std::vector<Case> all = *cases_;
  all.insert(all.end(), stress_->begin(), stress_->end());
  for (const Case& c : all) {
    StreamDecoder stream(*tok_);
    std::string out;
    for (const int32_t id : c.ids) out += stream.push(id);
    out += stream.finish();
    EXPECT_EQ(out, c.decoded) << "text: " << c.text;
  }
}

// qwen35-architecture.md §6: 248,044 regular ids, 33 specials from 248044.
TEST_F(TokenizerGolden, SpecialTokens) {
  EXPECT_EQ(tok_->n_ids(), 248077);
  EXPECT_EQ(tok_->added_tokens().size(), 33u);
  const std::pair<const char*, int32_t> known[] = {
      {"<|endoftext|>", 248044}, {"<|im_start|>", 248045}, {"<|im_end|>", 248046},
      {"<tool_call>", 248058},   {"</tool_call>", 248059}, {"<think>", 248068},
      {"</think>", 248069},      {"<|audio_pad|>", 248076}};
  for (const auto& [content, id] : known) {
    EXPECT_EQ(tok_->token_id(content), id) << content;
    EXPECT_TRUE(tok_->is_special(id)) << content;
    EXPECT_EQ(tok_->token_bytes(id), content);
  }
  EXPECT_FALSE(tok_->is_special(0));
  const std::vector<int32_t> chat = {248045, 846, 198, 248046};
  EXPECT_EQ(tok_->decode(chat, /*skip_special=*/true),
            tok_->decode(std::vector<int32_t>{846, 198}));
}

}  // namespace
}  // namespace qf::rt
