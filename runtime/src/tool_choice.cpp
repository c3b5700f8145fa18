// Forced tool choices (tool_choice.h): the schema the reply is held to, and the calls read back
// from the JSON it writes.
#include "qf/rt/tool_choice.h"

namespace qf::rt {

using Json = nlohmann::ordered_json;

namespace {

// Prefixes every in-document `$ref` of a schema with `root` (a JSON pointer without the '#'),
// leaving alone the values that are data, not schemas (`enum`, `const`, `default`, `examples`).
void reroot(Json& s, const std::string& root) {
  if (s.is_array()) {
    for (Json& x : s) reroot(x, root);
    return;
  }
  if (!s.is_object()) return;
  for (auto& [key, value] : s.items()) {
    if (key == "enum" || key == "const" || key == "default" || key == "examples") continue;
    if (key == "$ref" && value.is_string() && value.get<std::string>().rfind('#', 0) == 0) {
      value = "#" + root + value.get<std::string>().substr(1);
    } else {
      reroot(value, root);
    }
  }
}

Json parameters(const Json& tool) {
  const Json& f = tool["function"];
  const auto p = f.find("parameters");
  return p == f.end() || p->is_null() ? Json{{"type", "object"}, {"properties", Json::object()}}
                                      : *p;
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

}  // namespace

Json forced_tool_schema(const Json& tools, const ToolChoice& choice) {
  if (choice.kind == ToolChoice::Kind::kNamed) {
    for (const Json& t : tools) {
      if (t["function"]["name"] == choice.name) return parameters(t);
    }
    return Json();
  }
  Json any = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    Json p = parameters(tools[i]);
    reroot(p, "/items/anyOf/" + std::to_string(i) + "/properties/parameters");
    any.push_back(
        {{"type", "object"},
         {"properties",
          {{"name", {{"const", tools[i]["function"]["name"]}}}, {"parameters", std::move(p)}}},
         {"required", {"name", "parameters"}}});
  }
  return {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", std::move(any)}}}};
}

bool ForcedToolCallParser::take(const std::string& json, ChatDelta& d) const {
  Json v = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  ToolCall call;
  if (choice_.kind == ToolChoice::Kind::kNamed) {
    if (v.is_discarded()) return false;
    call.name = choice_.name;
    call.arguments = std::move(v);
  } else {
    if (!v.is_object() || !v.contains("name") || !v["name"].is_string() ||
        !v.contains("parameters")) {
      return false;
    }
    call.name = v["name"].get<std::string>();
    call.arguments = std::move(v["parameters"]);
  }
  d.tool_calls.push_back(std::move(call));
  return true;
}

ChatDelta ForcedToolCallParser::push(std::string_view text) {
  ChatDelta d;
  // The value a call is read from: the whole reply (named) or each element of the array
  // ("required"), which starts at the bracket that opens depth 2.
  const int call_depth = choice_.kind == ToolChoice::Kind::kNamed ? 0 : 1;
  for (const char c : text) {
    if (done_) {
      if (!is_space(c)) pending_ += c;  // past the value: nothing the constraint lets through
      continue;
    }
    const bool in_call = depth_ > call_depth || in_string_;
    if (in_call || (depth_ == call_depth && !is_space(c) && c != ',' && c != ']')) pending_ += c;
    if (in_string_) {
      if (escaped_) {
        escaped_ = false;
      } else if (c == '\\') {
        escaped_ = true;
      } else if (c == '"') {
        in_string_ = false;
      }
      continue;
    }
    if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if (c == '}' || c == ']') {
      --depth_;
      if (depth_ == call_depth && !pending_.empty()) {
        if (!take(pending_, d)) d.content += pending_;
        pending_.clear();
      }
      if (depth_ <= 0) done_ = true;
    }
  }
  return d;
}

ChatDelta ForcedToolCallParser::finish() {
  ChatDelta d;
  d.content = std::move(pending_);
  pending_.clear();
  return d;
}

}  // namespace qf::rt
