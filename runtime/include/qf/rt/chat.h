// The Qwen3.5 chat template, natively: OpenAI-style messages and tool definitions to the prompt
// text, byte-for-byte what transformers renders with the chat_template.jinja of the Qwen3.5
// MoE models (Qwen/Qwen3.5-35B-A3B, -122B-A10B, -397B-A17B; tests/golden/make_chat_goldens.py
// holds the provenance). qwen35-architecture.md §6 summarizes it:
//   * ChatML turns `<|im_start|>{role}\n{content}<|im_end|>\n`; every content is trimmed
//     (Python str.strip);
//   * tools: a system turn "# Tools ... <tools>" with one JSON schema per line (json.dumps
//     spacing, keys in the given order), the XML call-format instructions, then the user's own
//     system prompt;
//   * assistant tool calls as Qwen3-Coder XML: `<tool_call>\n<function=NAME>\n<parameter=KEY>\n
//     VALUE\n</parameter>\n</function>\n</tool_call>`; string values as they are, objects and
//     arrays as JSON, other scalars as Python's str() writes them (True, None, 1e+16: the
//     official Qwen3.5 template's behaviour, kept for byte parity);
//   * consecutive tool results in one user turn as `\n<tool_response>\n...\n</tool_response>`;
//   * reasoning (`<think>\n...\n</think>\n\n`) kept only on assistant turns after the last real
//     user query (a user turn that is not itself a wrapped tool response); earlier turns drop it;
//   * generation prompt `<|im_start|>assistant\n<think>\n`, or with thinking off
//     `<|im_start|>assistant\n<think>\n\n</think>\n\n`.
// Input conventions follow transformers 5 and vLLM: assistant reasoning is read from
// `reasoning_content`, else `thinking`, else `reasoning` (the first that is not null); without
// any, a `<think>...</think>` prefix in the content is split off as the reasoning. Tool-call
// `arguments` may be an object or a JSON string holding one ("" and null mean no arguments).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace qf::rt {

struct ChatOptions {
  bool add_generation_prompt = true;  // end with the assistant header and the thinking prefix
  bool enable_thinking = true;        // false: the prefix is an empty, closed think block
};

// `messages`: a non-empty array of {role: system|user|assistant|tool, content: string, array of
// {type: "text", text} parts, or null}; a system message only first; assistant messages may carry
// reasoning (see above) and `tool_calls` [{type: "function", function: {name, arguments}}] (or
// the function objects themselves); at least one user message that is not a wrapped
// `<tool_response>`. `tools`: null or an array of tool objects, written as given.
// Object key order is kept, so parse requests as ordered_json: it decides the order of the tool
// schemas' keys and of the call parameters in the prompt.
// Throws Error(kUsage) naming the message index and field for malformed input, and
// Error(kUnsupported) for image or video content parts (this runtime is text-only).
std::string render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                        const ChatOptions& opts = {});

}  // namespace qf::rt
