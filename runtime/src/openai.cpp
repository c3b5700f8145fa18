// OpenAI request bodies to ApiRequest (openai.h), and stop strings.
#include "qf/rt/openai.h"

#include <cmath>
#include <limits>
#include <utility>

#include "qf/error.h"
#include "qf/rt/chat.h"

namespace qf::rt {
namespace {

using Json = nlohmann::ordered_json;

std::string got(const Json& v) {
  std::string t = v.type_name();
  if (v.is_number_float()) t = "a non-integer number";
  return t == "null" ? "null" : t;
}

// The field, or nullptr when it is absent or null (OpenAI treats both as "not given").
const Json* field(const Json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::optional<double> number(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number())
    bad_request(std::string("'") + name + "' must be a number, got " + got(*v), name);
  const double x = v->get<double>();
  if (!std::isfinite(x)) bad_request(std::string("'") + name + "' must be finite", name);
  return x;
}

std::optional<int64_t> integer(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) {
    bad_request(std::string("'") + name + "' must be an integer, got " + got(*v), name);
  }
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    bad_request(std::string("'") + name + "' is out of range", name);
  }
  return v->get<int64_t>();
}

std::optional<bool> boolean(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean())
    bad_request(std::string("'") + name + "' must be a boolean, got " + got(*v), name);
  return v->get<bool>();
}

[[noreturn]] void unsupported(const std::string& what, const char* param) {
  bad_request(what + " is not supported by this server", param);
}

// The fields both endpoints share.
void parse_common(const Json& body, const SamplingOptions& defaults, ApiRequest& r) {
  if (!body.is_object()) bad_request("the request body must be a JSON object, got " + got(body));
  if (const Json* m = field(body, "model")) {
    if (!m->is_string()) bad_request("'model' must be a string, got " + got(*m), "model");
    r.model = m->get<std::string>();
  }
  r.sampling = defaults;
  if (const auto t = number(body, "temperature")) {
    if (*t < 0) bad_request("'temperature' must be >= 0, got " + std::to_string(*t), "temperature");
    r.sampling.temperature = static_cast<float>(*t);
  }
  if (const auto p = number(body, "top_p")) {
    if (!(*p > 0 && *p <= 1))
      bad_request("'top_p' must be in (0, 1], got " + std::to_string(*p), "top_p");
    r.sampling.top_p = static_cast<float>(*p);
  }
  if (const auto k = integer(body, "top_k")) {
    if (*k < -1 || *k > INT32_MAX)
      bad_request("'top_k' must be -1, 0 (no limit) or a positive count", "top_k");
    r.sampling.top_k = *k < 0 ? 0 : static_cast<int>(*k);
  }
  if (const auto s = integer(body, "seed")) r.sampling.seed = static_cast<uint64_t>(*s);
  if (const auto n = integer(body, "n"); n && *n != 1) unsupported("'n' other than 1", "n");
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    if (const auto x = number(body, name); x && *x != 0)
      unsupported(std::string("'") + name + "' other than 0", name);
  }
  if (const auto x = number(body, "repetition_penalty"); x && *x != 1) {
    unsupported("'repetition_penalty' other than 1", "repetition_penalty");
  }
  if (const auto x = number(body, "min_p"); x && *x != 0)
    unsupported("'min_p' other than 0", "min_p");
  if (const Json* b = field(body, "logit_bias"); b && !(b->is_object() && b->empty())) {
    unsupported("'logit_bias'", "logit_bias");
  }
  if (const Json* l = field(body, "logprobs"); l && !(l->is_boolean() && !l->get<bool>())) {
    unsupported("'logprobs'", "logprobs");
  }
  if (field(body, "top_logprobs")) unsupported("'top_logprobs'", "top_logprobs");
  if (const Json* f = field(body, "response_format")) {
    if (!f->is_object() || f->value("type", Json()) != "text") {
      unsupported("'response_format' other than {\"type\": \"text\"}", "response_format");
    }
  }
  r.stream = boolean(body, "stream").value_or(false);
  if (const Json* o = field(body, "stream_options")) {
    if (!r.stream)
      bad_request("'stream_options' is only allowed with 'stream': true", "stream_options");
    if (!o->is_object())
      bad_request("'stream_options' must be an object, got " + got(*o), "stream_options");
    r.include_usage = boolean(*o, "include_usage").value_or(false);
  }
  r.ignore_eos = boolean(body, "ignore_eos").value_or(false);
  if (const Json* s = field(body, "stop")) {
    const auto add = [&](const Json& x) {
      if (!x.is_string()) bad_request("'stop' must be a string or an array of strings", "stop");
      if (x.get<std::string>().empty()) bad_request("'stop' strings must not be empty", "stop");
      r.stop.push_back(x.get<std::string>());
    };
    if (s->is_array()) {
      for (const Json& x : *s) add(x);
    } else {
      add(*s);
    }
  }
}

void max_tokens(const Json& body, const char* name, ApiRequest& r) {
  if (const auto m = integer(body, name)) {
    if (*m < 1)
      bad_request(std::string("'") + name + "' must be at least 1, got " + std::to_string(*m),
                  name);
    r.max_tokens = *m;
  }
}

}  // namespace

ApiError::ApiError(int status, std::string type, const std::string& message, std::string param)
    : std::runtime_error(message),
      status_(status),
      type_(std::move(type)),
      param_(std::move(param)) {}

Json ApiError::to_json() const {
  return {{"error",
           {{"message", what()},
            {"type", type_},
            {"param", param_.empty() ? Json() : Json(param_)},
            {"code", nullptr}}}};
}

void bad_request(const std::string& message, const std::string& param) {
  throw ApiError(400, "invalid_request_error", message, param);
}

ApiRequest parse_chat_request(const Json& body, const SamplingOptions& defaults) {
  ApiRequest r;
  r.chat = true;
  parse_common(body, defaults, r);
  max_tokens(body, "max_tokens", r);
  max_tokens(body, "max_completion_tokens", r);
  const Json* messages = field(body, "messages");
  if (!messages) bad_request("'messages' is required", "messages");
  if (const Json* t = field(body, "tools")) {
    if (!t->is_array()) bad_request("'tools' must be an array, got " + got(*t), "tools");
    r.tools = *t;
  }
  bool tools_on = true;
  if (const Json* c = field(body, "tool_choice")) {
    if (*c == "none") {
      tools_on = false;
    } else if (*c != "auto") {
      unsupported("'tool_choice' other than \"auto\" or \"none\"", "tool_choice");
    }
  }
  r.parse_tools = tools_on && r.tools.is_array() && !r.tools.empty();
  ChatOptions co;
  if (const Json* k = field(body, "chat_template_kwargs")) {
    if (!k->is_object())
      bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    co.enable_thinking = boolean(*k, "enable_thinking").value_or(true);
  }
  r.thinking = co.enable_thinking;
  try {
    r.prompt = render_chat(*messages, r.tools, co);
  } catch (const Error& e) {
    bad_request(e.what(), "messages");
  }
  return r;
}

ApiRequest parse_completion_request(const Json& body, const SamplingOptions& defaults) {
  ApiRequest r;
  parse_common(body, defaults, r);
  r.max_tokens = 16;  // OpenAI's default for completions
  max_tokens(body, "max_tokens", r);
  if (boolean(body, "echo").value_or(false)) unsupported("'echo'", "echo");
  if (field(body, "suffix")) unsupported("'suffix'", "suffix");
  if (const auto b = integer(body, "best_of"); b && *b != 1)
    unsupported("'best_of' other than 1", "best_of");
  const Json* p = field(body, "prompt");
  if (!p) bad_request("'prompt' is required", "prompt");
  // One prompt: a string, token ids, or an array holding one of those.
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    r.prompt = p->get<std::string>();
    if (r.prompt.empty()) bad_request("'prompt' must not be empty", "prompt");
    return r;
  }
  if (!p->is_array() || p->empty()) {
    bad_request("'prompt' must be a string or a non-empty array of token ids (one prompt)",
                "prompt");
  }
  for (const Json& x : *p) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX) {
      bad_request(x.is_string() || x.is_array()
                      ? "several prompts in one request are not supported"
                      : "'prompt' token ids must be non-negative integers",
                  "prompt");
    }
    r.ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  return r;
}

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {}

std::string StopStrings::push(std::string_view text) {
  if (matched_) return "";
  held_.append(text);
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    matched_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that some stop string starts with.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t n = std::min(held_.size(), s.size() - 1); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStrings::finish() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace qf::rt
