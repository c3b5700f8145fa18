// The Qwen3.5 chat template (chat.h). Messages are first checked and reduced to what the
// template reads (role, trimmed text, reasoning, tool calls), so every malformed input is
// reported by index and field before anything is written; the second half follows the Jinja
// template statement by statement (tests/golden/data/qwen35_chat_template.jinja).
#include "qf/rt/chat.h"

#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "py_compat.h"
#include "qf/error.h"

namespace qf::rt {
namespace {

using Json = nlohmann::ordered_json;
using detail::py_strip;

enum class Role { kSystem, kUser, kAssistant, kTool };

struct ToolCall {
  std::string name;
  Json arguments;  // an object
};

struct Message {
  Role role = Role::kUser;
  std::string content;                   // text parts joined, then trimmed
  std::optional<std::string> reasoning;  // assistant only: the first non-null reasoning field
  std::vector<ToolCall> tool_calls;      // assistant only
};

constexpr std::string_view kToolInstructions =
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
    "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\n"
    "Reminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is "
    "no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>";

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw Error(Errc::kUsage, where + ": " + what);
}

std::string got(const Json& v) {
  return std::string("got ") + v.type_name();
}

Role parse_role(const Json& m, const std::string& where) {
  if (!m.contains("role")) bad(where, "missing \"role\"");
  const Json& r = m["role"];
  if (r.is_string()) {
    const std::string& s = r.get_ref<const std::string&>();
    if (s == "system") return Role::kSystem;
    if (s == "user") return Role::kUser;
    if (s == "assistant") return Role::kAssistant;
    if (s == "tool") return Role::kTool;
  }
  bad(where + ".role", "expected one of system, user, assistant, tool, " +
                           (r.is_string() ? "got '" + r.get<std::string>() + "'" : got(r)));
}

// The template's render_content: a string, or the text of each part in order; null is "".
std::string content_text(const Json& m, const std::string& where) {
  const auto it = m.find("content");
  if (it == m.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) {
    bad(where + ".content", "expected a string, an array of text parts or null, " + got(*it));
  }
  std::string text;
  for (size_t k = 0; k < it->size(); ++k) {
    const Json& part = (*it)[k];
    const std::string pw = where + ".content[" + std::to_string(k) + "]";
    if (!part.is_object())
      bad(pw, "expected an object {\"type\": \"text\", \"text\": ...}, " + got(part));
    const std::string type =
        part.value("type", Json()).is_string() ? part["type"].get<std::string>() : "";
    if (part.contains("image") || part.contains("image_url") || part.contains("video") ||
        type == "image" || type == "image_url" || type == "video") {
      throw Error(Errc::kUnsupported, pw + ": image and video parts are not supported (text only)");
    }
    if (!part.contains("text")) bad(pw, "expected a text part with a \"text\" field");
    if (!part["text"].is_string()) bad(pw + ".text", "expected a string, " + got(part["text"]));
    text += part["text"].get<std::string>();
  }
  return text;
}

// transformers' reasoning aliases: the first of these that is present and not null.
std::optional<std::string> reasoning_of(const Json& m, const std::string& where) {
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    const auto it = m.find(key);
    if (it == m.end() || it->is_null()) continue;
    if (!it->is_string()) bad(where + "." + key, "expected a string or null, " + got(*it));
    return it->get<std::string>();
  }
  return std::nullopt;
}

// vLLM's normalization before templating: a JSON string is decoded, "" and null are {}.
Json arguments_of(const Json& fn, const std::string& where) {
  const auto it = fn.find("arguments");
  if (it == fn.end() || it->is_null()) return Json::object();
  if (it->is_object()) return *it;
  if (!it->is_string()) bad(where, "expected an object or a JSON string holding one, " + got(*it));
  const std::string& text = it->get_ref<const std::string&>();
  if (py_strip(text).empty()) return Json::object();
  Json parsed;
  try {
    parsed = Json::parse(text);
  } catch (const Json::exception& e) {
    bad(where, std::string("not valid JSON: ") + e.what());
  }
  if (!parsed.is_object())
    bad(where, std::string("expected a JSON object, got ") + parsed.type_name());
  return parsed;
}

std::vector<ToolCall> tool_calls_of(const Json& m, const std::string& where) {
  const auto it = m.find("tool_calls");
  if (it == m.end() || it->is_null()) return {};
  if (!it->is_array()) bad(where + ".tool_calls", "expected an array or null, " + got(*it));
  std::vector<ToolCall> calls;
  for (size_t j = 0; j < it->size(); ++j) {
    const std::string cw = where + ".tool_calls[" + std::to_string(j) + "]";
    const Json& call = (*it)[j];
    if (!call.is_object()) bad(cw, "expected an object, " + got(call));
    const bool wrapped = call.contains("function");
    const Json& fn = wrapped ? call["function"] : call;
    const std::string fw = wrapped ? cw + ".function" : cw;
    if (!fn.is_object()) bad(fw, "expected an object, " + got(fn));
    if (!fn.contains("name")) bad(fw, "missing \"name\"");
    if (!fn["name"].is_string()) bad(fw + ".name", "expected a string, " + got(fn["name"]));
    calls.push_back({fn["name"].get<std::string>(), arguments_of(fn, fw + ".arguments")});
  }
  return calls;
}

std::vector<Message> parse_messages(const Json& messages) {
  if (!messages.is_array() || messages.empty()) {
    bad("messages", "expected a non-empty array of messages, " +
                        (messages.is_array() ? std::string("got an empty array") : got(messages)));
  }
  std::vector<Message> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const Json& m = messages[i];
    if (!m.is_object()) bad(where, "expected an object, " + got(m));
    Message msg;
    msg.role = parse_role(m, where);
    if (msg.role == Role::kSystem && i != 0) {
      bad(where + ".role", "a system message is only allowed as the first message");
    }
    msg.content = std::string(py_strip(content_text(m, where)));
    if (msg.role == Role::kAssistant) {
      msg.reasoning = reasoning_of(m, where);
      msg.tool_calls = tool_calls_of(m, where);
    }
    out.push_back(std::move(msg));
  }
  return out;
}

bool is_wrapped_tool_response(std::string_view s) {
  return s.starts_with("<tool_response>") && s.ends_with("</tool_response>");
}

void append_tools_system(std::string& out, const Json& tools, const std::vector<Message>& msgs) {
  out += "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>";
  for (const Json& tool : tools) out += "\n" + detail::py_json_dumps(tool);
  out += "\n</tools>";
  out += kToolInstructions;
  if (msgs[0].role == Role::kSystem && !msgs[0].content.empty()) out += "\n\n" + msgs[0].content;
  out += "<|im_end|>\n";
}

void append_assistant(std::string& out, const Message& m, bool keep_reasoning) {
  std::string_view content = m.content;
  std::string_view reasoning;
  if (m.reasoning) {
    reasoning = *m.reasoning;
  } else if (const size_t close = content.find("</think>"); close != std::string_view::npos) {
    // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n'), and the
    // text after the last '</think>' with leading newlines dropped.
    std::string_view before = detail::rstrip_newlines(content.substr(0, close));
    if (const size_t open = before.rfind("<think>"); open != std::string_view::npos) {
      before = before.substr(open + std::string_view("<think>").size());
    }
    reasoning = detail::lstrip_newlines(before);
    content = detail::lstrip_newlines(
        content.substr(content.rfind("</think>") + std::string_view("</think>").size()));
  }
  out += "<|im_start|>assistant\n";
  if (keep_reasoning) {
    out += "<think>\n";
    out += py_strip(reasoning);
    out += "\n</think>\n\n";
  }
  out += content;
  for (size_t j = 0; j < m.tool_calls.size(); ++j) {
    const ToolCall& call = m.tool_calls[j];
    if (j > 0) {
      out += "\n";
    } else if (!py_strip(content).empty()) {
      out += "\n\n";
    }
    out += "<tool_call>\n<function=" + call.name + ">\n";
    for (const auto& [key, value] : call.arguments.items()) {
      out += "<parameter=" + key + ">\n";
      out += value.is_structured() ? detail::py_json_dumps(value) : detail::py_str(value);
      out += "\n</parameter>\n";
    }
    out += "</function>\n</tool_call>";
  }
  out += "<|im_end|>\n";
}

}  // namespace

std::string render_chat(const Json& messages, const Json& tools, const ChatOptions& opts) {
  const std::vector<Message> msgs = parse_messages(messages);
  if (!tools.is_null() && !tools.is_array())
    bad("tools", "expected an array or null, " + got(tools));
  for (size_t t = 0; t < tools.size() && tools.is_array(); ++t) {
    if (!tools[t].is_object())
      bad("tools[" + std::to_string(t) + "]", "expected an object, " + got(tools[t]));
  }
  // The last user message that is a real query (not a wrapped tool response); reasoning is
  // kept on the assistant turns after it.
  std::optional<size_t> last_query;
  for (size_t i = msgs.size(); i-- > 0 && !last_query;) {
    if (msgs[i].role == Role::kUser && !is_wrapped_tool_response(msgs[i].content)) last_query = i;
  }
  if (!last_query) {
    bad("messages",
        "no user query: every user message is a wrapped <tool_response> (or there is "
        "no user message)");
  }

  std::string out;
  if (tools.is_array() && !tools.empty()) {
    append_tools_system(out, tools, msgs);
  } else if (msgs[0].role == Role::kSystem) {
    out += "<|im_start|>system\n" + msgs[0].content + "<|im_end|>\n";
  }
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Message& m = msgs[i];
    switch (m.role) {
      case Role::kSystem:  // written above; parse_messages allows it only first
        break;
      case Role::kUser:
        out += "<|im_start|>user\n" + m.content + "<|im_end|>\n";
        break;
      case Role::kAssistant:
        append_assistant(out, m, i > *last_query);
        break;
      case Role::kTool:
        // A run of tool messages shares one user turn. (The template opens it only after a
        // message that is not a tool, so a conversation starting with a tool message gets no
        // header; kept for parity.)
        if (i > 0 && msgs[i - 1].role != Role::kTool) out += "<|im_start|>user";
        out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
        if (i + 1 == msgs.size() || msgs[i + 1].role != Role::kTool) out += "<|im_end|>\n";
        break;
    }
  }
  if (opts.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    out += opts.enable_thinking ? "<think>\n" : "<think>\n\n</think>\n\n";
  }
  return out;
}

}  // namespace qf::rt
