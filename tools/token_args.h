// Prompt flags shared by the engine commands: token ids as "1,2,3", or text for the model's
// tokenizer.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qf::tools {

// "1,2,3" (spaces allowed) -> ids; throws Error(kUsage) naming the flag and the bad item.
std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& flag);

// Exactly one of `tokens` (--tokens) and `text` (--text, tokenized with <model_dir>/
// tokenizer.json) must be non-empty; throws Error(kUsage) otherwise.
std::vector<int32_t> prompt_ids(const std::string& model_dir, const std::string& tokens,
                                const std::string& text);

}  // namespace qf::tools
