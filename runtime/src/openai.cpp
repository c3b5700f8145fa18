// OpenAI request bodies to ApiRequest (openai.h), and stop strings.
#include "qf/rt/openai.h"

#include <cmath>
#include <limits>
#include <utility>

#include "qf/error.h"
#include "qf/rt/chat.h"
#include "qf/rt/logits.h"
#include "utf8.h"

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
  // Finite as the float the sampler keeps (1e39 is a finite double and an infinite float:
  // a temperature of 1e39 passed here and failed in the sampler; found by fuzz_request).
  if (!std::isfinite(static_cast<float>(x)))
    bad_request(std::string("'") + name + "' must be a finite number, got " + v->dump(), name);
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

// The reply's shape that `response_format` asks for (null for text).
std::shared_ptr<const JsonGrammar> response_format(const Json& f) {
  const char* param = "response_format";
  if (!f.is_object()) bad_request("'response_format' must be an object, got " + got(f), param);
  const Json type = f.value("type", Json());
  if (type == "text") return nullptr;
  if (type == "json_object") return std::make_shared<const JsonGrammar>(JsonGrammar::any_object());
  if (type != "json_schema") {
    bad_request(
        "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", "
        "got " +
            type.dump(),
        param);
  }
  const Json* js = field(f, "json_schema");
  if (!js || !js->is_object())
    bad_request("'response_format.json_schema' must be an object with a 'schema'", param);
  const Json* schema = field(*js, "schema");
  if (!schema) bad_request("'response_format.json_schema.schema' is required", param);
  try {
    return std::make_shared<const JsonGrammar>(JsonGrammar::from_schema(*schema));
  } catch (const Error& e) {
    bad_request("'response_format.json_schema': " + std::string(e.what()), param);
  }
}

// The fields both endpoints share.
// The body's "model" ("" when absent), after checking that the body is an object.
std::string model_field(const Json& body) {
  if (!body.is_object()) bad_request("the request body must be a JSON object, got " + got(body));
  const Json* m = field(body, "model");
  if (!m) return "";
  if (!m->is_string()) bad_request("'model' must be a string, got " + got(*m), "model");
  return m->get<std::string>();
}

void parse_common(const Json& body, const SamplingOptions& defaults, ApiRequest& r) {
  r.model = model_field(body);
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
  if (const auto n = integer(body, "n")) {
    if (*n < 1 || *n > kMaxChoices) {
      bad_request("'n' must be 1 to " + std::to_string(kMaxChoices) + ", got " + std::to_string(*n),
                  "n");
    }
    r.n = static_cast<int>(*n);
  }
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    if (const auto x = number(body, name)) {
      if (*x < -2 || *x > 2) {
        bad_request(std::string("'") + name + "' must be in [-2, 2], got " + std::to_string(*x),
                    name);
      }
      (name[0] == 'p' ? r.sampling.presence_penalty : r.sampling.frequency_penalty) =
          static_cast<float>(*x);
    }
  }
  if (const auto x = number(body, "repetition_penalty")) {
    if (!(*x > 0)) {
      bad_request("'repetition_penalty' must be > 0, got " + std::to_string(*x),
                  "repetition_penalty");
    }
    r.sampling.repetition_penalty = static_cast<float>(*x);
  }
  if (const auto x = number(body, "min_p")) {
    if (*x < 0 || *x > 1)
      bad_request("'min_p' must be in [0, 1], got " + std::to_string(*x), "min_p");
    r.sampling.min_p = static_cast<float>(*x);
  }
  if (const Json* b = field(body, "logit_bias")) {
    if (!b->is_object())
      bad_request("'logit_bias' must be an object, got " + got(*b), "logit_bias");
    for (const auto& [key, value] : b->items()) {
      // Keys are token ids written as strings: decimal digits only, within int32.
      const bool digits = !key.empty() && key.size() <= 10 &&
                          key.find_first_not_of("0123456789") == std::string::npos;
      if (!digits || std::stoll(key) > INT32_MAX) {
        bad_request("'logit_bias' keys must be token ids, got \"" + key + "\"", "logit_bias");
      }
      if (!value.is_number() || !std::isfinite(value.get<double>()) ||
          std::fabs(value.get<double>()) > 100) {
        bad_request("'logit_bias' values must be numbers in [-100, 100]; \"" + key + "\" has " +
                        value.dump(),
                    "logit_bias");
      }
      r.sampling.logit_bias.emplace_back(static_cast<int32_t>(std::stoll(key)), value.get<float>());
    }
  }
  if (const Json* f = field(body, "response_format")) r.grammar = response_format(*f);
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

// `tool_choice`: "auto", "none", "required" or {"type": "function", "function": {"name"}}; the
// last two need `tools`, and what they name must be a function in it.
ToolChoice tool_choice(const Json& c, const Json& tools) {
  const char* param = "tool_choice";
  ToolChoice choice;
  if (c == "auto") return choice;
  if (c == "none") {
    choice.kind = ToolChoice::Kind::kNone;
    return choice;
  }
  if (c == "required") {
    choice.kind = ToolChoice::Kind::kRequired;
  } else if (c.is_object() && c.value("type", Json()) == "function" && c.contains("function") &&
             c["function"].is_object() && c["function"].value("name", Json()).is_string()) {
    choice.kind = ToolChoice::Kind::kNamed;
    choice.name = c["function"]["name"].get<std::string>();
  } else {
    bad_request(
        "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
        "\"function\": {\"name\": ...}}, got " +
            (c.is_object() || c.is_string() ? c.dump() : got(c)),
        param);
  }
  const std::string what = choice.kind == ToolChoice::Kind::kRequired
                               ? "'tool_choice' \"required\""
                               : "'tool_choice' naming a function";
  if (!tools.is_array() || tools.empty()) bad_request(what + " needs 'tools'", param);
  bool named = false;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = "'tools[" + std::to_string(i) + "]";
    const Json& t = tools[i];
    if (!t.is_object() || t.value("type", Json()) != "function" || !t.contains("function") ||
        !t["function"].is_object() || !t["function"].value("name", Json()).is_string()) {
      bad_request(
          at + "' must be {\"type\": \"function\", \"function\": {\"name\": ...}} for " + what,
          "tools");
    }
    named = named || t["function"]["name"] == choice.name;
  }
  if (choice.kind == ToolChoice::Kind::kNamed && !named) {
    bad_request(
        "'tool_choice' names the function \"" + choice.name + "\", which 'tools' does not define",
        param);
  }
  return choice;
}

// The grammar a forced tool choice holds the reply to, compiled once; a schema outside the
// subset is refused naming its place in the request (the compiler names it in the combined
// schema of forced_tool_schema).
std::shared_ptr<const JsonGrammar> forced_tool_grammar(const Json& tools, const ToolChoice& c) {
  std::vector<std::pair<std::string, std::string>> places;  // combined -> request
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& f = tools[i]["function"];
    if (c.kind == ToolChoice::Kind::kNamed && f["name"] != c.name) continue;
    const std::string at = "tools[" + std::to_string(i) + "].function.parameters";
    places.emplace_back(c.kind == ToolChoice::Kind::kNamed
                            ? std::string("schema")
                            : "schema.items.anyOf[" + std::to_string(i) + "].properties.parameters",
                        at);
    const auto p = f.find("parameters");
    if (p != f.end() && !p->is_null() &&
        (!p->is_object() || p->value("type", Json()) != "object")) {
      bad_request("'" + at + "' must be a JSON schema of type \"object\" for a forced tool choice",
                  "tools");
    }
  }
  try {
    return std::make_shared<const JsonGrammar>(
        JsonGrammar::from_schema(forced_tool_schema(tools, c)));
  } catch (const Error& e) {
    std::string m = e.what();
    for (const auto& [combined, request] : places) {
      const size_t n = combined.size();
      if (m.compare(0, n, combined) == 0 && m.size() > n && (m[n] == '.' || m[n] == ':')) {
        m.replace(0, n, request);
        break;
      }
    }
    bad_request("'tools': " + m, "tools");
  }
}

int64_t logprob_count(int64_t n, const char* name) {
  if (n < 0 || n > kMaxLogprobs) {
    bad_request(std::string("'") + name + "' must be in [0, " + std::to_string(kMaxLogprobs) +
                    "], got " + std::to_string(n),
                name);
  }
  return n;
}

void max_tokens(const Json& body, const char* name, ApiRequest& r, int64_t least = 1,
                const char* hint = "") {
  if (const auto m = integer(body, name)) {
    if (*m < least) {
      bad_request(std::string("'") + name + "' must be at least " + std::to_string(least) + hint +
                      ", got " + std::to_string(*m),
                  name);
    }
    r.max_tokens = *m;
  }
}

// The chat fields a chat request and POST /tokenize share: "tools" (null when absent), the
// options of "chat_template_kwargs", and the messages rendered with them.
Json tools_field(const Json& body) {
  const Json* t = field(body, "tools");
  if (!t) return Json();
  if (!t->is_array()) bad_request("'tools' must be an array, got " + got(*t), "tools");
  return *t;
}
ChatOptions chat_options(const Json& body) {
  ChatOptions co;
  if (const Json* k = field(body, "chat_template_kwargs")) {
    if (!k->is_object())
      bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    co.enable_thinking = boolean(*k, "enable_thinking").value_or(true);
  }
  return co;
}
std::string render_messages(const Json& messages, const Json& tools, const ChatOptions& co) {
  try {
    return render_chat(messages, tools, co);
  } catch (const Error& e) {
    bad_request(e.what(), "messages");
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
  r.tools = tools_field(body);
  if (const Json* c = field(body, "tool_choice")) r.tool_choice = tool_choice(*c, r.tools);
  if (r.tool_choice.forced()) {
    if (r.grammar) {
      bad_request(
          "'response_format' cannot be combined with 'tool_choice' \"required\" or a "
          "named function (both set what the reply must be)",
          "response_format");
    }
    r.grammar = forced_tool_grammar(r.tools, r.tool_choice);
  }
  r.parse_tools =
      r.tool_choice.kind == ToolChoice::Kind::kAuto && r.tools.is_array() && !r.tools.empty();
  const auto top = integer(body, "top_logprobs");
  if (boolean(body, "logprobs").value_or(false)) {
    r.logprobs = static_cast<int>(logprob_count(top.value_or(0), "top_logprobs"));
  } else if (top) {
    bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  }
  const ChatOptions co = chat_options(body);
  r.thinking = co.enable_thinking;
  r.prompts.push_back({render_messages(*messages, r.tools, co), {}});
  return r;
}

ApiRequest parse_completion_request(const Json& body, const SamplingOptions& defaults) {
  ApiRequest r;
  parse_common(body, defaults, r);
  r.max_tokens = 16;  // OpenAI's default for completions
  r.echo = boolean(body, "echo").value_or(false);
  max_tokens(body, "max_tokens", r, r.echo ? 0 : 1, r.echo ? "" : " (0 only with 'echo')");
  if (field(body, "suffix")) unsupported("'suffix'", "suffix");
  if (const auto b = integer(body, "best_of"); b && *b != 1)
    unsupported("'best_of' other than 1", "best_of");
  if (const auto n = integer(body, "logprobs")) {
    r.logprobs = static_cast<int>(logprob_count(*n, "logprobs"));
  }
  const Json* p = field(body, "prompt");
  if (!p) bad_request("'prompt' is required", "prompt");
  const auto bad_prompt = [] {
    bad_request(
        "'prompt' must be a string, an array of token ids, or a non-empty array of either kind "
        "(several prompts)",
        "prompt");
  };
  // One prompt (a string or token ids), or an array of several of one kind.
  const auto one = [&](const Json& x, const std::string& where) {
    ApiPrompt a;
    if (x.is_string()) {
      a.text = x.get<std::string>();
      if (a.text.empty()) bad_request("'" + where + "' must not be empty", "prompt");
      return a;
    }
    if (!x.is_array() || x.empty()) bad_prompt();
    for (const Json& id : x) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        bad_request("'" + where + "' token ids must be non-negative integers", "prompt");
      }
      a.ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    return a;
  };
  const bool several = p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array());
  if (!several) {
    r.prompts.push_back(one(*p, "prompt"));
    return r;
  }
  if (p->size() * static_cast<size_t>(r.n) > kMaxChoices) {
    bad_request("'n' times the number of prompts must be at most " + std::to_string(kMaxChoices) +
                    ", got " + std::to_string(r.n) + " x " + std::to_string(p->size()),
                "prompt");
  }
  for (size_t i = 0; i < p->size(); ++i) {
    const Json& x = (*p)[i];
    if (x.is_string() != (*p)[0].is_string()) {
      bad_request("'prompt' must not mix strings and token id arrays", "prompt");
    }
    r.prompts.push_back(one(x, "prompt[" + std::to_string(i) + "]"));
  }
  return r;
}

TokenizeRequest parse_tokenize_request(const Json& body) {
  TokenizeRequest r;
  r.model = model_field(body);
  r.token_strs = boolean(body, "return_token_strs").value_or(false);
  boolean(body, "add_special_tokens");  // checked; Qwen3.5's tokenizer adds none either way
  const Json* messages = field(body, "messages");
  const Json* prompt = field(body, "prompt");
  if (messages && prompt) bad_request("give 'prompt' or 'messages', not both", "messages");
  if (prompt) {
    if (!prompt->is_string())
      bad_request("'prompt' must be a string, got " + got(*prompt), "prompt");
    r.text = prompt->get<std::string>();
    return r;
  }
  if (!messages) bad_request("'prompt' or 'messages' is required", "prompt");
  ChatOptions co = chat_options(body);
  co.add_generation_prompt = boolean(body, "add_generation_prompt").value_or(true);
  r.text = render_messages(*messages, tools_field(body), co);
  return r;
}

DetokenizeRequest parse_detokenize_request(const Json& body, int64_t vocab_size) {
  DetokenizeRequest r;
  r.model = model_field(body);
  const Json* t = field(body, "tokens");
  if (!t) bad_request("'tokens' is required", "tokens");
  if (!t->is_array())
    bad_request("'tokens' must be an array of token ids, got " + got(*t), "tokens");
  for (size_t i = 0; i < t->size(); ++i) {
    const Json& x = (*t)[i];
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab_size) {
      bad_request("'tokens'[" + std::to_string(i) + "] must be a token id in [0, " +
                      std::to_string(vocab_size) + "), got " +
                      (x.is_number_integer() ? x.dump() : got(x)),
                  "tokens");
    }
    r.tokens.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  return r;
}

namespace {

std::string token_text(const Tokenizer& tok, int32_t id) {
  return detail::utf8_lossy(tok.token_bytes(id));
}

Json chat_entry(const Tokenizer& tok, int32_t id, float logprob) {
  const std::string& b = tok.token_bytes(id);
  return {{"token", token_text(tok, id)},
          {"logprob", logprob},
          {"bytes", std::vector<uint8_t>(b.begin(), b.end())}};
}

int64_t characters(const std::string& utf8) {
  int64_t n = 0;
  for (const char c : utf8) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return n;
}

}  // namespace

Json chat_logprobs_json(const Tokenizer& tok, std::span<const TokenLogprobs> entries) {
  Json content = Json::array();
  for (const TokenLogprobs& t : entries) {
    Json e = chat_entry(tok, t.id, t.logprob);
    Json top = Json::array();
    for (const auto& [id, lp] : t.top) top.push_back(chat_entry(tok, id, lp));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return {{"content", std::move(content)}};
}

Json completion_logprobs_json(const Tokenizer& tok, std::span<const TokenLogprobs> entries,
                              int64_t& text_offset) {
  Json tokens = Json::array(), values = Json::array(), tops = Json::array(),
       offsets = Json::array();
  for (const TokenLogprobs& t : entries) {
    const std::string text = token_text(tok, t.id);
    tokens.push_back(text);
    values.push_back(t.logprob);
    Json top = Json::object();
    for (const auto& [id, lp] : t.top) top[token_text(tok, id)] = lp;
    top[text] = t.logprob;
    tops.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += characters(text);
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(values)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

Json prompt_logprobs_json(const Tokenizer& tok, int32_t first, std::span<const TokenLogprobs> rest,
                          int64_t& text_offset) {
  const std::string text = token_text(tok, first);
  Json j = {{"tokens", Json::array({text})},
            {"token_logprobs", Json::array({nullptr})},
            {"top_logprobs", Json::array({nullptr})},
            {"text_offset", Json::array({text_offset})}};
  text_offset += characters(text);
  append_logprobs(j, completion_logprobs_json(tok, rest, text_offset));
  return j;
}

void append_logprobs(Json& into, const Json& more) {
  if (into.is_null()) {
    into = more;
    return;
  }
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (const Json& v : more.at(key)) into[key].push_back(v);
  }
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
