#include "token_args.h"

#include <charconv>
#include <filesystem>

#include "qf/error.h"
#include "qf/rt/tokenizer.h"

namespace qf::tools {

std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  for (size_t item = 0;; ++item) {
    const size_t comma = text.find(',', pos);
    std::string s = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    s.erase(0, s.find_first_not_of(' '));
    s.erase(s.find_last_not_of(' ') + 1);
    int32_t id = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), id);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size() || id < 0) {
      throw Error(Errc::kUsage, flag + ": item " + std::to_string(item + 1) + " ('" + s +
                                    "') is not a token id (a non-negative integer)");
    }
    ids.push_back(id);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return ids;
}

std::vector<int32_t> prompt_ids(const std::string& model_dir, const std::string& tokens,
                                const std::string& text) {
  if (tokens.empty() == text.empty()) {
    throw Error(Errc::kUsage, "give the prompt as exactly one of --tokens or --text");
  }
  if (!tokens.empty()) return parse_token_ids(tokens, "--tokens");
  const rt::Tokenizer tok =
      rt::Tokenizer::load(std::filesystem::path(model_dir) / "tokenizer.json");
  std::vector<int32_t> ids = tok.encode(text);
  if (ids.empty()) throw Error(Errc::kUsage, "--text: the text has no tokens");
  return ids;
}

}  // namespace qf::tools
