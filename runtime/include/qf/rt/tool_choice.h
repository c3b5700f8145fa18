// `tool_choice` "required" and a named function (OpenAI's chat API), served as vLLM serves them:
// the reply after any think block is constrained (json_constraint.h) to JSON that names the
// calls, instead of the model's own <tool_call> XML:
//   * named {"type": "function", "function": {"name": F}}: the arguments object itself, by F's
//     `parameters` schema ({"type": "object", "properties": {}} when it has none or null);
//   * "required": an array of at least one {"name": F, "parameters": {...}}, each element one of
//     the tools (an anyOf of their schemas).
// The chat template still lists the tools in the prompt. The reply's finish reason stays the
// generation's ("stop"), as vLLM gives it for both.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "qf/rt/chat_output.h"

namespace qf::rt {

struct ToolChoice {
  enum class Kind { kAuto, kNone, kRequired, kNamed };
  Kind kind = Kind::kAuto;
  std::string name;  // kNamed: the function
  bool forced() const { return kind == Kind::kRequired || kind == Kind::kNamed; }
};

// The JSON schema a forced choice holds the reply to. `tools` as the request gives them: each
// {"type": "function", "function": {"name", "parameters"}} (checked by the caller). For
// "required", each tool's `$ref`s ("#/...") are re-rooted at its place in the array schema, so
// that references into its own `$defs` still resolve.
nlohmann::ordered_json forced_tool_schema(const nlohmann::ordered_json& tools,
                                          const ToolChoice& choice);

// The calls in a forced reply's content (ChatOutputParser's content: the text after the think
// block), each as soon as its JSON closes. Text that never completes a call (a reply cut by
// max_tokens or a stop string) is content as written, given by finish().
class ForcedToolCallParser {
 public:
  explicit ForcedToolCallParser(ToolChoice choice) : choice_(std::move(choice)) {}

  ChatDelta push(std::string_view text);
  ChatDelta finish();

 private:
  // The call in `json` (an arguments object, or an element of the "required" array); false when
  // it does not parse as one.
  bool take(const std::string& json, ChatDelta& d) const;

  ToolChoice choice_;
  std::string pending_;  // the text of the value being read, from its first byte
  int depth_ = 0;        // brackets open
  bool in_string_ = false, escaped_ = false, done_ = false;
};

}  // namespace qf::rt
