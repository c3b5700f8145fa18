// libFuzzer target for what `qforge serve` does with a request body before the engine runs:
// the body parsed and checked (openai.h; the chat template rendered for chat), the prompt
// encoded, and, where the reply is constrained (response_format, a forced tool_choice), a
// structured-output walk over the example model's vocabulary. The body is the whole input; one
// with "messages" goes to /v1/chat/completions, any other to /v1/completions; every body also
// goes to /tokenize and /detokenize. Properties:
//   * a request is accepted or refused with an ApiError of status 400 and a message (anything
//     else would reach the client as a 500); so is a /tokenize or /detokenize body, and what
//     they accept encodes or decodes;
//   * the prompt encodes, and a stop-string cut of its text equals the text up to the first
//     stop string (found by std::string::find);
//   * the request's bias, penalties and sampling, applied to a row of logits (some of them
//     at +-1e4) as the generation loop applies them, throw nothing (the parser checked every
//     value) and pick an id of the row whose processed logit is finite: the argmax when greedy;
//   * at each step of the walk the token mask (JsonConstraint::allowed, a walk of the
//     vocabulary's trie with its shortcuts) equals allows() of every id (each id's bytes fed to
//     the matcher), and some id is allowed; a walk that ends holds JSON that satisfies the
//     reply's schema by json_satisfies.h's checker.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.h"
#include "json_mutator.h"
#include "json_satisfies.h"
#include "qf/error.h"
#include "qf/rt/json_constraint.h"
#include "qf/rt/logits.h"
#include "qf/rt/openai.h"
#include "qf/rt/tool_choice.h"
#include "tiny_tokenizer.h"

namespace {

using Json = nlohmann::ordered_json;
using namespace qf::rt;

const std::shared_ptr<const TokenTrie>& trie() {
  static const auto t = std::make_shared<const TokenTrie>(qf::fuzz::tiny_tokenizer());
  return t;
}

// The schema the reply is held to (null: any object, json_object).
Json reply_schema(const Json& body, const ApiRequest& r) {
  if (r.tool_choice.forced()) return forced_tool_schema(r.tools, r.tool_choice);
  const Json& f = body.at("response_format");  // there: the grammar came from it
  if (f.value("type", Json()) == "json_object") return Json();
  return f.at("json_schema").at("schema");
}

void check_stop_strings(const ApiRequest& r, const std::string& text) {
  if (r.stop.empty() || text.empty()) return;
  size_t first = std::string::npos;
  for (const std::string& s : r.stop) first = std::min(first, text.find(s));
  StopStrings cut(r.stop);
  std::string out;
  for (size_t at = 0; at < text.size(); at += 3) out += cut.push(text.substr(at, 3));
  out += cut.finish();
  QF_FUZZ_CHECK(cut.matched() == (first != std::string::npos), text);
  QF_FUZZ_CHECK(out == text.substr(0, first), "'" + text + "' cut to '" + out + "'");
}

void check_sampling(const ApiRequest& r, std::span<const int32_t> prompt, uint64_t seed) {
  const int32_t n = qf::fuzz::tiny_tokenizer().n_ids();
  for (const auto& [id, bias] : r.sampling.logit_bias) {
    if (id >= n) return;  // the server refuses it (past the vocabulary)
  }
  std::vector<float> row(static_cast<size_t>(n)), out(row.size());
  for (float& x : row) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    const auto u = static_cast<uint32_t>(seed >> 40);  // 24 bits
    x = u % 97 == 0 ? (u & 1 ? 1e4f : -1e4f) : static_cast<float>(u) / (1 << 24) * 60 - 30;
  }
  const std::string what = "sampling " + std::to_string(r.sampling.temperature) + " " +
                           std::to_string(r.sampling.top_p) + " " +
                           std::to_string(r.sampling.top_k) + " " +
                           std::to_string(r.sampling.min_p);
  try {
    LogitsProcessor lp(r.sampling, n, prompt);
    const std::vector<int32_t> generated = {static_cast<int32_t>(seed % n), 1, 1};
    lp.sync(generated);
    lp.apply(row, out);
    Sampler sampler(r.sampling);
    const int32_t id = sampler.sample(out);
    QF_FUZZ_CHECK(id >= 0 && id < n && std::isfinite(out[static_cast<size_t>(id)]),
                  what + ": id " + std::to_string(id));
    if (r.sampling.temperature == 0) {
      QF_FUZZ_CHECK(out[static_cast<size_t>(id)] == *std::max_element(out.begin(), out.end()),
                    what);
    }
  } catch (const qf::Error& e) {
    qf::fuzz::fail("an accepted request's sampling threw", what + ": " + e.what());
  }
}

void walk(const Json& body, const ApiRequest& r, uint64_t seed) {
  const Tokenizer& tok = qf::fuzz::tiny_tokenizer();
  const int32_t end = *tok.token_id("<|im_end|>");
  const int32_t think_end = *tok.token_id("</think>");
  const bool reasoning = r.chat && r.thinking;
  JsonConstraint c(trie(), r.grammar, {end}, reasoning);
  const int32_t n = tok.n_ids();
  std::vector<uint64_t> bits;
  std::string text;
  const std::string what = body.dump();
  // 48 tokens at most; from the 12th on, single-byte closers ('"', '}', ']') when allowed and
  // the end as soon as it is, so that walks end; the mask is checked at the first 12 steps and
  // every 4th after (each check tries every id).
  for (int step = 0; step < 48; ++step) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    if (c.in_reasoning()) {  // free text: leave it now and then
      const int32_t id = seed >> 62 == 0 ? think_end : static_cast<int32_t>(seed >> 33) % n;
      c.accept(id);
      text += tok.token_bytes(id);
      continue;
    }
    c.allowed(n, bits);
    std::vector<int32_t> ids;
    const bool check = step < 12 || step % 4 == 0;
    for (int32_t id = 0; id < n; ++id) {
      const bool bit = bits[static_cast<size_t>(id) >> 6] >> (id & 63) & 1;
      if (check) {
        QF_FUZZ_CHECK(bit == c.allows(id), what + " after '" + text + "': id " +
                                               std::to_string(id) + " '" + tok.token_bytes(id) +
                                               "'");
      }
      if (bit) ids.push_back(id);
    }
    QF_FUZZ_CHECK(!ids.empty(), what + ": nothing allowed after '" + text + "'");
    const bool closing = step >= 12;
    int32_t id = ids[(seed >> 33) % ids.size()];
    if (c.complete() && (closing || seed >> 61 == 0)) {
      id = end;
    } else if (closing) {
      for (const int32_t x : ids) {
        const std::string& b = tok.token_bytes(x);
        if (b == "\"" || b == "}" || b == "]") id = x;
      }
    }
    if (id == end) {
      std::string value = text;
      if (reasoning) value = value.substr(value.find("</think>") + 8);
      const Json v = Json::parse(value, nullptr, /*allow_exceptions=*/false);
      QF_FUZZ_CHECK(!v.is_discarded(), what + ": '" + value + "' is not JSON");
      const Json schema = reply_schema(body, r);
      if (schema.is_null()) {
        QF_FUZZ_CHECK(v.is_object(), what + ": '" + value + "'");
      } else {
        QF_FUZZ_CHECK(qf::test::satisfies(v, schema, schema), what + ": '" + value + "'");
      }
      return;
    }
    c.accept(id);
    text += tok.token_bytes(id);
  }
}

}  // namespace

QF_FUZZ_JSON_MUTATOR(0, "messages", "role", "content", "tools", "tool_choice", "response_format",
                     "json_schema", "schema", "type", "properties", "required", "items", "pattern",
                     "enum", "anyOf", "$ref", "max_tokens", "temperature", "top_p", "top_k",
                     "min_p", "logit_bias", "logprobs", "top_logprobs", "stop", "n", "seed",
                     "prompt", "echo", "stream", "stream_options", "presence_penalty",
                     "frequency_penalty", "repetition_penalty", "chat_template_kwargs",
                     "enable_thinking", "tool_calls", "function", "name", "arguments", "parameters",
                     "tokens", "return_token_strs", "add_generation_prompt", "add_special_tokens")

// The same body as a POST /tokenize and /detokenize: accepted or refused with a 400; what is
// accepted encodes, or decodes (its ids within the vocabulary).
void check_token_routes(const Json& body) {
  const Tokenizer& tok = qf::fuzz::tiny_tokenizer();
  try {
    const TokenizeRequest t = parse_tokenize_request(body);
    for (const int32_t id : tok.encode(t.text)) QF_FUZZ_CHECK(id >= 0 && id < tok.n_ids(), t.text);
  } catch (const ApiError& e) {
    QF_FUZZ_CHECK(e.status() == 400 && std::string(e.what()).size() > 0, e.what());
  }
  try {
    const DetokenizeRequest d = parse_detokenize_request(body, tok.n_ids());
    for (const int32_t id : d.tokens) QF_FUZZ_CHECK(id >= 0 && id < tok.n_ids(), body.dump());
    tok.decode(d.tokens);
  } catch (const ApiError& e) {
    QF_FUZZ_CHECK(e.status() == 400 && std::string(e.what()).size() > 0, e.what());
  }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const Json body = Json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || json_deeper_than(body, kMaxJsonNesting)) return 0;
  check_token_routes(body);
  const bool chat = body.is_object() && body.contains("messages");
  SamplingOptions defaults;
  defaults.temperature = 0.6f;
  defaults.top_p = 0.95f;
  defaults.top_k = 20;
  ApiRequest r;
  try {
    r = chat ? parse_chat_request(body, defaults) : parse_completion_request(body, defaults);
  } catch (const ApiError& e) {
    QF_FUZZ_CHECK(e.status() == 400 && std::string(e.what()).size() > 0, e.what());
    return 0;
  }
  QF_FUZZ_CHECK(!r.prompts.empty() && r.choices() <= kMaxChoices,
                std::to_string(r.prompts.size()) + " prompts");
  const Tokenizer& tok = qf::fuzz::tiny_tokenizer();
  uint64_t seed = 1469598103934665603ULL;
  for (size_t i = 0; i < size; ++i) seed = (seed ^ data[i]) * 1099511628211ULL;
  for (const ApiPrompt& p : r.prompts) {
    QF_FUZZ_CHECK(p.text.empty() != p.ids.empty(), "a prompt is text or ids");
    const std::vector<int32_t> ids = p.ids.empty() ? tok.encode(p.text) : p.ids;
    check_stop_strings(r, p.ids.empty() ? p.text : tok.decode(p.ids));
    // (Token ids past the vocabulary are refused by the server.)
    if (std::all_of(ids.begin(), ids.end(), [&](int32_t id) { return id < tok.n_ids(); })) {
      check_sampling(r, ids, seed);
    }
    if (p.ids.empty()) {
      for (const int32_t id : ids) QF_FUZZ_CHECK(id >= 0 && id < tok.n_ids(), p.text);
    }
  }
  if (r.grammar) walk(body, r, seed);
  return 0;
}
