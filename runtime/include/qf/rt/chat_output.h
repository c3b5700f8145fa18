// A Qwen3.5 chat reply as an OpenAI message: its reasoning (the think block), its content and its
// tool calls (Qwen3-Coder XML), split as the text arrives so that a stream and a whole reply give
// the same parts. The formats are those the chat template writes (chat.h, qwen35-architecture.md
// §6), the split is the one vLLM's qwen3 reasoning parser and qwen3_coder tool parser make:
//   * a reply to a generation prompt that opened a think block starts as reasoning, up to
//     `</think>`; its leading and trailing newlines are dropped, and so are the content's leading
//     newlines after `</think>`;
//   * `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n
//     </tool_call>` is a call; each VALUE loses one leading and one trailing newline and is
//     typed by the tool's JSON schema (`string` as written, `integer`, `number`, `boolean`,
//     `object`, `array` parsed as JSON, `null` (or Python's `None`) as null but for a string; a
//     value that does not parse, or a parameter the schema does not list, stays a string);
//   * whitespace around calls and at the end of the content is dropped; a block that is not a
//     well-formed call, or one left open at the end, is content as written.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace qf::rt {

struct ToolCall {
  std::string name;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();  // parameter -> value
};

// The parts completed by one push: append each to what came before.
struct ChatDelta {
  std::string reasoning, content;
  std::vector<ToolCall> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class ChatOutputParser {
 public:
  // `in_reasoning`: the prompt ended inside an open think block (thinking on). `tools`: the
  // request's tool definitions (null or an array of {type: "function", function: {name,
  // parameters}}), for the values' types; `parse_tools` false leaves calls in the content.
  ChatOutputParser(bool in_reasoning, const nlohmann::ordered_json& tools, bool parse_tools = true);

  // Text of the reply as decoded; what may still be the start of a tag or of dropped whitespace
  // is held back until the next push or finish.
  ChatDelta push(std::string_view text);
  // The end of the reply: whatever is held back, placed as its mode says.
  ChatDelta finish();

 private:
  enum class Mode { kReasoning, kContent, kToolCall };
  void emit(ChatDelta& d, std::string_view text);
  void close_tool_call(ChatDelta& d, std::string_view block);

  nlohmann::ordered_json tools_;
  bool parse_tools_;
  Mode mode_;
  bool at_start_ = true;  // no text yet in this mode: its leading newlines are dropped
  std::string held_;      // text not yet placed: a possible tag start, trailing whitespace, or an
                          // open tool call's text after `<tool_call>`
};

// Parses one `<tool_call>` block's inside (`\n<function=...>...</function>\n`) with the value
// types of `tools`; false when it is not a well-formed call.
bool parse_tool_call(std::string_view block, const nlohmann::ordered_json& tools, ToolCall* out);

}  // namespace qf::rt
