// The reply splitter (chat_output.h): one pass over the text as it arrives, holding back only a
// possible tag start and the whitespace that the next text decides to keep or drop.
#include "qf/rt/chat_output.h"

#include <algorithm>
#include <charconv>
#include <cstdint>

namespace qf::rt {
namespace {

constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

// Length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t partial_tag(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

// The parameter's JSON schema type in `tools` ("" when the tool or parameter is not listed);
// of a list of types, the first that is not "null".
std::string schema_type(const nlohmann::ordered_json& tools, const std::string& function,
                        const std::string& param) {
  if (!tools.is_array()) return "";
  for (const auto& t : tools) {
    const auto& f = t.is_object() && t.contains("function") ? t["function"] : t;
    if (!f.is_object() || f.value("name", nlohmann::ordered_json()) != function) continue;
    const auto p = f.find("parameters");
    if (p == f.end() || !p->is_object()) return "";
    const auto props = p->find("properties");
    if (props == p->end() || !props->is_object() || !props->contains(param)) return "";
    const auto& spec = (*props)[param];
    const auto type = spec.is_object() ? spec.find("type") : spec.end();
    if (!spec.is_object() || type == spec.end()) return "object";  // untyped: parse as JSON
    if (type->is_string()) return type->get<std::string>();
    if (type->is_array()) {
      for (const auto& x : *type) {
        if (x.is_string() && x != "null") return x.get<std::string>();
      }
    }
    return "object";
  }
  return "";
}

nlohmann::ordered_json typed_value(const std::string& text, const std::string& type) {
  if (type.empty() || type == "string" || type == "str" || type == "text" || type == "enum") {
    return text;
  }
  if (text == "null" || text == "None")
    return nullptr;  // JSON's, or Python's as the template writes
  if (type == "integer" || type == "int") {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec == std::errc() && end == text.data() + text.size()) return v;
    return text;
  }
  if (type == "boolean" || type == "bool") {
    if (text == "true" || text == "True") return true;
    if (text == "false" || text == "False") return false;
    return text;
  }
  auto v = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return text;
  if ((type == "number" || type == "float") && !v.is_number()) return text;
  return v;
}

}  // namespace

bool parse_tool_call(std::string_view block, const nlohmann::ordered_json& tools, ToolCall* out) {
  constexpr std::string_view kFunc = "<function=", kFuncEnd = "</function>";
  constexpr std::string_view kParam = "<parameter=", kParamEnd = "</parameter>";
  std::string_view s = trim(block);
  if (!starts_with(s, kFunc) || s.size() < kFuncEnd.size() ||
      s.substr(s.size() - kFuncEnd.size()) != kFuncEnd) {
    return false;
  }
  s.remove_suffix(kFuncEnd.size());
  s.remove_prefix(kFunc.size());
  const size_t name_end = s.find('>');
  if (name_end == 0 || name_end == std::string_view::npos) return false;
  ToolCall call;
  call.name = std::string(trim(s.substr(0, name_end)));
  if (call.name.empty() || call.name.find('\n') != std::string::npos) return false;
  s.remove_prefix(name_end + 1);
  for (s = trim(s); !s.empty(); s = trim(s)) {
    if (!starts_with(s, kParam)) return false;
    s.remove_prefix(kParam.size());
    const size_t key_end = s.find('>');
    if (key_end == 0 || key_end == std::string_view::npos) return false;
    const std::string key(trim(s.substr(0, key_end)));
    s.remove_prefix(key_end + 1);
    const size_t value_end = s.find(kParamEnd);
    if (key.empty() || value_end == std::string_view::npos) return false;
    std::string_view value = s.substr(0, value_end);
    if (starts_with(value, "\n")) value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    call.arguments[key] = typed_value(std::string(value), schema_type(tools, call.name, key));
    s.remove_prefix(value_end + kParamEnd.size());
  }
  *out = std::move(call);
  return true;
}

ChatOutputParser::ChatOutputParser(bool in_reasoning, const nlohmann::ordered_json& tools,
                                   bool parse_tools)
    : tools_(tools),
      parse_tools_(parse_tools),
      mode_(in_reasoning ? Mode::kReasoning : Mode::kContent) {}

// Places text of the current mode, dropping the mode's leading whitespace (newlines only in
// reasoning) while nothing of it has been placed.
void ChatOutputParser::emit(ChatDelta& d, std::string_view text) {
  if (at_start_) {
    while (!text.empty() &&
           (mode_ == Mode::kReasoning ? text.front() == '\n' : is_space(text.front()))) {
      text.remove_prefix(1);
    }
    if (text.empty()) return;
    at_start_ = false;
  }
  (mode_ == Mode::kReasoning ? d.reasoning : d.content).append(text);
}

void ChatOutputParser::close_tool_call(ChatDelta& d, std::string_view block) {
  ToolCall call;
  if (parse_tool_call(block, tools_, &call)) {
    d.tool_calls.push_back(std::move(call));
  } else {
    mode_ = Mode::kContent;
    emit(d, std::string(kCallOpen) + std::string(block) + std::string(kCallClose));
  }
}

ChatDelta ChatOutputParser::push(std::string_view text) {
  ChatDelta d;
  held_.append(text);
  for (;;) {
    if (mode_ == Mode::kToolCall) {
      const size_t end = held_.find(kCallClose);
      if (end == std::string::npos) return d;
      close_tool_call(d, std::string_view(held_).substr(0, end));
      held_.erase(0, end + kCallClose.size());
      mode_ = Mode::kContent;
      at_start_ = true;
      continue;
    }
    const bool reasoning = mode_ == Mode::kReasoning;
    const std::string_view tag = reasoning ? kThinkEnd : parse_tools_ ? kCallOpen : "";
    const size_t at = tag.empty() ? std::string::npos : held_.find(tag);
    if (at != std::string::npos) {
      std::string_view before = std::string_view(held_).substr(0, at);
      while (!before.empty() && (reasoning ? before.back() == '\n' : is_space(before.back()))) {
        before.remove_suffix(1);
      }
      emit(d, before);
      held_.erase(0, at + tag.size());
      mode_ = reasoning ? Mode::kContent : Mode::kToolCall;
      at_start_ = true;
      continue;
    }
    // No whole tag: place all but a possible tag start and the trailing whitespace before it.
    size_t keep_from = held_.size() - (tag.empty() ? 0 : partial_tag(held_, tag));
    while (keep_from > 0 &&
           (reasoning ? held_[keep_from - 1] == '\n' : is_space(held_[keep_from - 1]))) {
      --keep_from;
    }
    emit(d, std::string_view(held_).substr(0, keep_from));
    held_.erase(0, keep_from);
    return d;
  }
}

ChatDelta ChatOutputParser::finish() {
  ChatDelta d;
  std::string rest;
  rest.swap(held_);
  if (mode_ == Mode::kToolCall) {  // an unfinished call: content as written
    mode_ = Mode::kContent;
    rest.insert(0, kCallOpen);
  }
  std::string_view text = rest;
  while (!text.empty() &&
         (mode_ == Mode::kReasoning ? text.back() == '\n' : is_space(text.back()))) {
    text.remove_suffix(1);
  }
  emit(d, text);
  return d;
}

}  // namespace qf::rt
