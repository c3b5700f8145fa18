// OpenAI-compatible requests (`/v1/chat/completions`, `/v1/completions`): their JSON bodies read
// and checked field by field into what generation needs, and the stop strings applied to the
// reply's text. Field names, ranges and defaults follow OpenAI's API reference, with vLLM's
// extensions that serving Qwen3.5 needs (`top_k`, `ignore_eos`, `chat_template_kwargs.
// enable_thinking`). Sampling fields a request leaves out take the model's generation_config.json
// defaults, as vLLM does; so do vLLM's `repetition_penalty` and `min_p`. Unknown fields are
// ignored (as vLLM does); known ones of the wrong type or range, and features this runtime lacks
// (suffix, best_of > 1), are refused with an ApiError naming the field. `response_format`:
// "text", "json_object" or "json_schema" ({"json_schema": {"name", "schema", "strict"}}, the
// schema in JsonGrammar's subset; one outside it is refused naming the keyword).
// Logprobs: chat's `logprobs` + `top_logprobs`, completions' integer `logprobs`, at most
// kMaxLogprobs alternatives.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "qf/rt/json_grammar.h"
#include "qf/rt/logits.h"
#include "qf/rt/sampler.h"
#include "qf/rt/tokenizer.h"
#include "qf/rt/tool_choice.h"

namespace qf::rt {

// An error to send back: HTTP status, OpenAI's error type and the offending parameter ("" when
// none). to_json gives the body {"error": {message, type, param, code}}.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, const std::string& message, std::string param = "");
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }
  nlohmann::ordered_json to_json() const;

 private:
  int status_;
  std::string type_, param_;
};

// 400 invalid_request_error.
[[noreturn]] void bad_request(const std::string& message, const std::string& param = "");

// The most choices a request may ask for (`n`, times its prompts; OpenAI's limit on `n`).
constexpr int kMaxChoices = 128;

// One prompt of a request: its text (chat: the rendered template), or the token ids a
// completions request gave (then `text` is empty).
struct ApiPrompt {
  std::string text;
  std::vector<int32_t> ids;
};

struct ApiRequest {
  bool chat = false;
  std::string model;  // as given ("" when absent)
  // Chat: one. Completions: one or more (a list of prompts, as vLLM takes it): prompt p's
  // choice i is the reply's choice p * n + i, of choices().
  std::vector<ApiPrompt> prompts;
  bool thinking = false;         // chat: the prompt ends inside an open think block
  nlohmann::ordered_json tools;  // chat: the tool definitions (null when none)
  ToolChoice tool_choice;        // chat: "auto" when not given
  bool parse_tools = false;      // chat: tools given and tool_choice "auto" (calls as XML)
  std::optional<int64_t> max_tokens;
  SamplingOptions sampling;  // logit_bias ids not yet checked against the vocabulary
  int logprobs = -1;         // >= 0: each token's logprob and this many alternatives
  std::vector<std::string> stop;
  // What the reply's content must be (null: anything): response_format json_object or
  // json_schema, or the JSON of a forced tool choice (tool_choice.h).
  std::shared_ptr<const JsonGrammar> grammar;
  bool stream = false, include_usage = false, ignore_eos = false;
  // Completions: the reply's text starts with the prompt's (as given, or the ids decoded); with
  // `logprobs`, so do its logprobs (the first token's null, each other's under the position
  // before it). max_tokens 0 is then allowed: the prompt scored, nothing generated.
  bool echo = false;
  // Choices (`n`): generated one after the other, choice i with the seed + i (the request's, or
  // one drawn for it), each its own structured-output state.
  int n = 1;
  int choices() const { return n * static_cast<int>(prompts.size()); }
};

// `body` as parsed from the request (ordered, so that tool schemas keep their key order);
// `defaults`: the model's sampling (generation_config), its seed used when the request has none.
// Throws ApiError (400) naming the field.
ApiRequest parse_chat_request(const nlohmann::ordered_json& body, const SamplingOptions& defaults);
ApiRequest parse_completion_request(const nlohmann::ordered_json& body,
                                    const SamplingOptions& defaults);

// POST /tokenize and /detokenize, as vLLM's server has them. Tokenize: {"prompt": text} (with
// "add_special_tokens", which adds nothing for Qwen3.5's tokenizer), or {"messages": [...]} with
// "tools", "add_generation_prompt" (default true) and "chat_template_kwargs": {"enable_thinking"}
// rendered as a chat request's prompt; "return_token_strs" asks for each token's string too.
// Detokenize: {"tokens": [ids]}. Both take "model". Throw ApiError (400) naming the field.
struct TokenizeRequest {
  std::string model;
  std::string text;  // the prompt, or the messages rendered
  bool token_strs = false;
};
TokenizeRequest parse_tokenize_request(const nlohmann::ordered_json& body);
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;  // each in [0, vocab_size)
};
DetokenizeRequest parse_detokenize_request(const nlohmann::ordered_json& body, int64_t vocab_size);

// Tokens' logprobs in a reply. A token's string is its bytes as UTF-8, U+FFFD where they are
// not (a token may hold part of a character); chat entries also give the exact bytes.
// Chat: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
nlohmann::ordered_json chat_logprobs_json(const Tokenizer& tok,
                                          std::span<const TokenLogprobs> entries);
// Completions: {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}, the
// chosen token in its top_logprobs map too (as OpenAI's legacy API and vLLM give it).
// `text_offset`: where the first entry's text starts in the completion, in characters;
// advanced past the entries.
nlohmann::ordered_json completion_logprobs_json(const Tokenizer& tok,
                                                std::span<const TokenLogprobs> entries,
                                                int64_t& text_offset);
// An echoed prompt's entries in the same shape: `first` (the prompt's first token: null
// logprob and top_logprobs), then `rest` (GenerateResult::prompt_logprobs).
nlohmann::ordered_json prompt_logprobs_json(const Tokenizer& tok, int32_t first,
                                            std::span<const TokenLogprobs> rest,
                                            int64_t& text_offset);
// `more`'s entries after `into`'s (two completion_logprobs_json objects; null `into`: `more`).
void append_logprobs(nlohmann::ordered_json& into, const nlohmann::ordered_json& more);

// Cuts the reply's text at the first occurrence of any stop string, as the text streams: text
// that may be the start of one is held back until it is decided.
class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);
  // The text now known to come before any stop string; after a match, the text before it, and
  // nothing more ever.
  std::string push(std::string_view text);
  std::string finish();  // what was held back (no match came)
  bool matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool matched_ = false;
};

}  // namespace qf::rt
