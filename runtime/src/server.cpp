// The OpenAI-compatible server (server.h) on cpp-httplib: routes, the request -> generation ->
// reply pipeline (ids -> text -> stop strings -> reasoning / content / tool calls), and the
// replies' JSON, whole or as server-sent events.
#include "qf/rt/server.h"

#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <iterator>
#include <mutex>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "qf/error.h"
#include "qf/rt/chat_output.h"
#include "qf/rt/json_constraint.h"
#include "qf/rt/openai.h"
#include "qf/rt/tool_choice.h"
#include "serve_metrics.h"

namespace qf::rt {
namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;
constexpr size_t kMaxBodyBytes = size_t{32} << 20;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status();
  res.set_content(dump(e.to_json()), "application/json");
}

void append(ChatDelta& a, ChatDelta b) {
  a.reasoning += b.reasoning;
  a.content += b.content;
  for (ToolCall& c : b.tool_calls) a.tool_calls.push_back(std::move(c));
}

// Thrown from the token callback: a stop string matched, or a streaming client went away.
struct StopHit {};
struct ClientGone {};

struct Outcome {
  std::string finish_reason;
  int64_t completion_tokens = 0, cached_tokens = 0;
  double seconds = 0;
  std::vector<TokenLogprobs> logprobs;         // of tokens no delta carried (held text, the last)
  std::vector<TokenLogprobs> prompt_logprobs;  // echo: GenerateResult::prompt_logprobs
};

// The request's totals over its choices: completion tokens and seconds summed, the first
// choice's cached prompt tokens and finish reason.
void add(Outcome& total, const Outcome& out, int i) {
  total.completion_tokens += out.completion_tokens;
  total.seconds += out.seconds;
  if (i == 0) total.cached_tokens = out.cached_tokens, total.finish_reason = out.finish_reason;
}

// What a reply part carries: its text, and the logprobs of the tokens generated since the last
// part (their text may be held back by a stop string or the output parser, or empty).
using DeltaFn = std::function<void(const ChatDelta&, std::vector<TokenLogprobs>&&)>;

}  // namespace

struct Server::Impl {
  Impl(const Tokenizer& t, GenerateFn g, ServeOptions o)
      : tok(t),
        generate(std::move(g)),
        opt(std::move(o)),
        metrics(opt.model_name, opt.max_model_len) {}

  const Tokenizer& tok;
  GenerateFn generate;
  ServeOptions opt;
  ServeMetrics metrics;  // GET /metrics
  httplib::Server http;
  std::mutex engine_mutex;  // one request on the engine at a time
  std::mutex rng_mutex;
  std::mt19937_64 rng{std::random_device{}()};
  std::once_flag trie_once;
  std::shared_ptr<const TokenTrie> trie;  // built for the first structured-output request

  std::shared_ptr<const TokenTrie> token_trie() {
    std::call_once(trie_once, [this] { trie = std::make_shared<const TokenTrie>(tok); });
    return trie;
  }

  std::string random_hex(int n) {
    std::lock_guard<std::mutex> lock(rng_mutex);
    std::string s;
    for (int i = 0; i < n; ++i) s += "0123456789abcdef"[rng() & 15];
    return s;
  }

  // Runs one choice of a request that arrived at `arrival` on the engine; on_delta gets the
  // reply's parts as they are decided, and on_prompt (when set) the prompt's logprobs once they
  // are known (o.prompt_logprobs >= 0). The first choice's first token is the request's.
  Outcome run(const ApiRequest& r, std::span<const int32_t> prompt, GenerateOptions o,
              Clock::time_point arrival, bool first_choice, const DeltaFn& on_delta,
              const std::function<void(const std::vector<TokenLogprobs>&)>& on_prompt = {}) {
    Outcome out;
    o.on_logprobs = [&out](const TokenLogprobs& t) { out.logprobs.push_back(t); };
    o.on_prompt_logprobs = [&out, &on_prompt](const std::vector<TokenLogprobs>& v) {
      out.prompt_logprobs = v;
      if (on_prompt) on_prompt(v);
    };
    StreamDecoder decoder(tok, /*skip_special=*/true);
    StopStrings stops(r.stop);
    std::optional<ChatOutputParser> parser;
    if (r.chat) parser.emplace(r.thinking, r.tools, r.parse_tools);
    std::optional<ForcedToolCallParser> forced;  // the content is the calls' JSON
    if (r.tool_choice.forced()) forced.emplace(r.tool_choice);
    bool any_call = false;
    const auto place = [&](const std::string& text, bool end) {
      ChatDelta d;
      if (parser) {
        d = parser->push(text);
        if (end) append(d, parser->finish());
      } else {
        d.content = text;
      }
      if (forced) {
        ChatDelta calls = forced->push(std::exchange(d.content, {}));
        if (end) append(calls, forced->finish());
        append(d, std::move(calls));
      }
      any_call = any_call || !d.tool_calls.empty();
      if (!d.empty()) on_delta(d, std::exchange(out.logprobs, {}));
    };
    const auto asked = Clock::now();
    metrics.add_waiting(1);
    std::lock_guard<std::mutex> lock(engine_mutex);
    metrics.add_waiting(-1);
    metrics.add_running(1);
    metrics.queued(seconds_since(asked));
    const auto t0 = Clock::now();
    // The generation's end for /metrics, however it ends: "error" unless a finish reason is set.
    std::string finished = "error";
    struct Done {
      ServeMetrics& m;
      const std::string& finished;
      int64_t prompt;
      const Outcome& out;
      ~Done() {
        m.add_running(-1);
        m.generation_done(prompt, out.cached_tokens, out.completion_tokens, finished);
      }
    } done{metrics, finished, static_cast<int64_t>(prompt.size()), out};
    Clock::time_point last = t0;
    try {
      const GenerateResult g = generate(
          prompt, o,
          [&](int32_t id) {
            const auto now = Clock::now();
            if (out.completion_tokens > 0) {
              metrics.inter_token(std::chrono::duration<double>(now - last).count());
            } else if (first_choice) {
              metrics.first_token(std::chrono::duration<double>(now - arrival).count());
            }
            last = now;
            ++out.completion_tokens;
            const std::string text = stops.push(decoder.push(id));
            place(text, stops.matched());
            if (stops.matched()) throw StopHit{};
          },
          &out.cached_tokens);
      out.finish_reason = g.finish_reason;
      std::string text = stops.push(decoder.finish());
      if (stops.matched()) {
        out.finish_reason = "stop";
      } else {
        text += stops.finish();
      }
      place(text, true);
    } catch (const StopHit&) {
      out.finish_reason = "stop";
    } catch (const ClientGone&) {
      finished = "abort";
      throw;
    }
    finished = out.finish_reason;
    // vLLM's finish reason: "tool_calls" for calls the model chose to make, not forced ones.
    if (any_call && !forced && out.finish_reason == "stop") out.finish_reason = "tool_calls";
    out.seconds = seconds_since(t0);
    return out;
  }

  Json tool_calls_json(const std::vector<ToolCall>& calls, size_t first_index, bool stream) {
    Json a = Json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
      Json c;
      if (stream) c["index"] = first_index + i;
      c["id"] = "call_" + random_hex(24);
      c["type"] = "function";
      c["function"] = {{"name", calls[i].name}, {"arguments", dump(calls[i].arguments)}};
      a.push_back(std::move(c));
    }
    return a;
  }

  void log(const char* what, int64_t prompt_tokens, const Outcome& out) {
    std::fprintf(
        stderr,
        "[serve] %s: %lld prompt (%lld cached) + %lld completion tokens in %.2f s "
        "(%.1f tok/s), finish: %s\n",
        what, static_cast<long long>(prompt_tokens), static_cast<long long>(out.cached_tokens),
        static_cast<long long>(out.completion_tokens), out.seconds,
        out.seconds > 0 ? out.completion_tokens / out.seconds : 0.0, out.finish_reason.c_str());
  }

  // The body as JSON, bounded in depth; a model named other than this one's (404).
  Json parse_body(const httplib::Request& req);
  void check_model(const std::string& model) const;
  void handle(const httplib::Request& req, httplib::Response& res, bool chat);
  void chat(const httplib::Request& req, httplib::Response& res) { handle(req, res, true); }
  void completion(const httplib::Request& req, httplib::Response& res) { handle(req, res, false); }
  void tokenize(const httplib::Request& req, httplib::Response& res);
  void detokenize(const httplib::Request& req, httplib::Response& res);
};

Json Server::Impl::parse_body(const httplib::Request& req) {
  Json body;
  try {
    body = Json::parse(req.body);
  } catch (const Json::exception& e) {
    bad_request(std::string("the request body is not valid JSON: ") + e.what());
  }
  if (json_deeper_than(body, kMaxJsonNesting)) {
    bad_request("the request body nests more than " + std::to_string(kMaxJsonNesting) +
                " arrays and objects deep");
  }
  return body;
}

void Server::Impl::check_model(const std::string& model) const {
  if (!model.empty() && model != opt.model_name) {
    throw ApiError(
        404, "not_found_error",
        "the model '" + model + "' does not exist; this server has '" + opt.model_name + "'",
        "model");
  }
}

void Server::Impl::tokenize(const httplib::Request& req, httplib::Response& res) {
  const TokenizeRequest t = parse_tokenize_request(parse_body(req));
  check_model(t.model);
  const std::vector<int32_t> ids = tok.encode(t.text);
  Json j = {{"count", ids.size()}, {"max_model_len", opt.max_model_len}, {"tokens", ids}};
  j["token_strs"] = nullptr;
  if (t.token_strs) {
    j["token_strs"] = Json::array();
    for (const int32_t id : ids) j["token_strs"].push_back(tok.token_content(id));
  }
  res.set_content(dump(j), "application/json");
}

void Server::Impl::detokenize(const httplib::Request& req, httplib::Response& res) {
  const DetokenizeRequest d = parse_detokenize_request(parse_body(req), opt.vocab_size);
  check_model(d.model);
  res.set_content(dump(Json{{"prompt", tok.decode(d.tokens)}}), "application/json");
}

void Server::Impl::handle(const httplib::Request& req, httplib::Response& res, bool chat) {
  const auto arrival = Clock::now();
  const Json body = parse_body(req);
  SamplingOptions defaults = opt.defaults;
  {
    std::lock_guard<std::mutex> lock(rng_mutex);
    defaults.seed = rng();
  }
  auto r = std::make_shared<ApiRequest>(chat ? parse_chat_request(body, defaults)
                                             : parse_completion_request(body, defaults));
  check_model(r->model);
  // Each prompt's ids, echo text and token budget, all checked before any generation.
  struct Prompt {
    std::vector<int32_t> ids;
    std::string echo;  // echo: the prompt's text (the ids decoded where they were given)
    int64_t max_tokens = 0;
  };
  auto prompts = std::make_shared<std::vector<Prompt>>();
  int64_t n_prompt = 0;  // tokens of all prompts (usage.prompt_tokens)
  const int64_t least = r->max_tokens && *r->max_tokens == 0 ? 0 : 1;  // 0: echo scoring only
  const bool several = r->prompts.size() > 1;                          // messages name the prompt
  for (size_t p = 0; p < r->prompts.size(); ++p) {
    const ApiPrompt& a = r->prompts[p];
    Prompt q{a.ids.empty() ? tok.encode(a.text) : a.ids, {}, 0};
    const std::string which = several ? "prompt " + std::to_string(p) + "'s " : "prompt ";
    for (size_t i = 0; i < q.ids.size(); ++i) {
      if (q.ids[i] >= opt.vocab_size) {
        bad_request(which + "token " + std::to_string(i) + " is " + std::to_string(q.ids[i]) +
                        ", past the vocabulary (" + std::to_string(opt.vocab_size) + " ids)",
                    "prompt");
      }
    }
    const auto n = static_cast<int64_t>(q.ids.size());
    const int64_t room = opt.max_model_len - n;
    if (room < least || (r->max_tokens && *r->max_tokens > room)) {
      const std::string has =
          several ? "prompt " + std::to_string(p) + " has " + std::to_string(n) + " tokens"
                  : "the request has " + std::to_string(n) + " prompt tokens";
      bad_request("this model's maximum context length is " + std::to_string(opt.max_model_len) +
                      " tokens; " + has + " and asks for " +
                      (r->max_tokens ? std::to_string(*r->max_tokens) : std::string("at least 1")) +
                      " more",
                  r->max_tokens ? "max_tokens" : (chat ? "messages" : "prompt"));
    }
    q.max_tokens = r->max_tokens.value_or(room);
    if (r->echo) q.echo = a.ids.empty() ? a.text : tok.decode(a.ids);
    n_prompt += n;
    prompts->push_back(std::move(q));
  }
  for (const auto& [bias_id, bias] : r->sampling.logit_bias) {
    if (bias_id >= opt.vocab_size) {
      bad_request("'logit_bias' names token " + std::to_string(bias_id) +
                      ", past the vocabulary (" + std::to_string(opt.vocab_size) + " ids)",
                  "logit_bias");
    }
  }
  GenerateOptions o;
  o.sampling = r->sampling;
  o.logprobs = r->logprobs;
  if (r->echo && r->logprobs >= 0) o.prompt_logprobs = r->logprobs;
  if (!r->ignore_eos) o.stop_ids = opt.eos_ids;
  // Choice i (of prompt i / n): its options are the seed + i, its prompt's budget, and a
  // structured-output state of its own.
  const auto prompt_of = [r, prompts](int i) -> const Prompt& {
    return (*prompts)[static_cast<size_t>(i / r->n)];
  };
  const auto options_for = [this, r, o, prompt_of](int i) {
    GenerateOptions c = o;
    c.max_tokens = prompt_of(i).max_tokens;
    c.sampling.seed = o.sampling.seed + static_cast<uint64_t>(i);
    if (r->grammar) {
      c.constraint = std::make_shared<JsonConstraint>(token_trie(), r->grammar, c.stop_ids,
                                                      r->chat && r->thinking);
    }
    return c;
  };

  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + random_hex(24);
  const auto created = static_cast<int64_t>(std::time(nullptr));
  const char* object = chat ? "chat.completion" : "text_completion";
  const auto usage = [n_prompt](const Outcome& out) {
    return Json{{"prompt_tokens", n_prompt},
                {"completion_tokens", out.completion_tokens},
                {"total_tokens", n_prompt + out.completion_tokens},
                {"prompt_tokens_details", {{"cached_tokens", out.cached_tokens}}}};
  };

  // The logprobs of some tokens, in the endpoint's shape (null when the request asks none).
  const auto logprobs_json = [this, r, chat](std::span<const TokenLogprobs> entries,
                                             int64_t& text_offset) {
    if (r->logprobs < 0) return Json();
    return chat ? chat_logprobs_json(tok, entries)
                : completion_logprobs_json(tok, entries, text_offset);
  };

  if (!r->stream) {
    Json choices = Json::array();
    Outcome total;
    for (int i = 0; i < r->choices(); ++i) {
      const Prompt& prompt = prompt_of(i);
      ChatDelta all;
      std::vector<TokenLogprobs> lps;
      const Outcome out = run(*r, prompt.ids, options_for(i), arrival, i == 0,
                              [&](const ChatDelta& d, std::vector<TokenLogprobs>&& l) {
                                append(all, d);
                                lps.insert(lps.end(), std::make_move_iterator(l.begin()),
                                           std::make_move_iterator(l.end()));
                              });
      add(total, out, i);
      lps.insert(lps.end(), out.logprobs.begin(), out.logprobs.end());
      Json choice = {{"index", i}};
      if (chat) {
        Json m = {{"role", "assistant"}};
        m["content"] = all.content.empty() && !all.tool_calls.empty() ? Json() : Json(all.content);
        if (!all.reasoning.empty()) m["reasoning_content"] = all.reasoning;
        if (!all.tool_calls.empty()) m["tool_calls"] = tool_calls_json(all.tool_calls, 0, false);
        choice["message"] = std::move(m);
      } else {
        choice["text"] = prompt.echo + all.content;
      }
      int64_t text_offset = 0;
      Json lp_json;
      if (o.prompt_logprobs >= 0) {
        lp_json = prompt_logprobs_json(tok, prompt.ids.front(), out.prompt_logprobs, text_offset);
      }
      if (r->logprobs >= 0) append_logprobs(lp_json, logprobs_json(lps, text_offset));
      choice["logprobs"] = std::move(lp_json);
      choice["finish_reason"] = out.finish_reason;
      choices.push_back(std::move(choice));
    }
    const Json reply = {{"id", id},
                        {"object", object},
                        {"created", created},
                        {"model", opt.model_name},
                        {"choices", std::move(choices)},
                        {"usage", usage(total)}};
    res.set_content(dump(reply), "application/json");
    log(chat ? "chat" : "completion", n_prompt, total);
    metrics.request_done(seconds_since(arrival));
    return;
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [this, r, o, id, created, chat, usage, n_prompt, logprobs_json,
                            prompt_of, options_for, arrival](size_t, httplib::DataSink& sink) {
        const char* chunk_object = chat ? "chat.completion.chunk" : "text_completion";
        const auto send = [&](const Json& j) {
          const std::string event = "data: " + dump(j) + "\n\n";
          if (!sink.write(event.data(), event.size())) throw ClientGone{};
        };
        const auto chunk = [&](Json choice) {
          return Json{{"id", id},
                      {"object", chunk_object},
                      {"created", created},
                      {"model", opt.model_name},
                      {"choices", Json::array({std::move(choice)})}};
        };
        Outcome total;
        try {
          // Choice after choice, each from its role (chat) or echo chunk to its finish_reason.
          for (int i = 0; i < r->choices(); ++i) {
            const Prompt& prompt = prompt_of(i);
            size_t n_calls = 0;
            int64_t text_offset = 0;
            if (chat) {
              send(chunk({{"index", i},
                          {"delta", {{"role", "assistant"}, {"content", ""}}},
                          {"logprobs", nullptr},
                          {"finish_reason", nullptr}}));
            }
            // echo: the prompt's text (and its logprobs, once scored) in the first chunk.
            const auto echo = [&](const std::vector<TokenLogprobs>* prompt_lps) {
              Json choice = {{"index", i}, {"text", prompt.echo}};
              choice["logprobs"] = prompt_lps ? prompt_logprobs_json(tok, prompt.ids.front(),
                                                                     *prompt_lps, text_offset)
                                              : Json();
              choice["finish_reason"] = nullptr;
              send(chunk(std::move(choice)));
            };
            if (r->echo && o.prompt_logprobs < 0) echo(nullptr);
            const Outcome out = run(
                *r, prompt.ids, options_for(i), arrival, i == 0,
                [&](const ChatDelta& d, std::vector<TokenLogprobs>&& l) {
                  Json choice = {{"index", i}};
                  if (chat) {
                    Json delta = Json::object();
                    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
                    if (!d.content.empty()) delta["content"] = d.content;
                    if (!d.tool_calls.empty()) {
                      delta["tool_calls"] = tool_calls_json(d.tool_calls, n_calls, true);
                      n_calls += d.tool_calls.size();
                    }
                    choice["delta"] = std::move(delta);
                  } else {
                    choice["text"] = d.content;
                  }
                  choice["logprobs"] = logprobs_json(l, text_offset);
                  choice["finish_reason"] = nullptr;
                  send(chunk(std::move(choice)));
                },
                [&](const std::vector<TokenLogprobs>& v) { echo(&v); });
            add(total, out, i);
            Json last = {{"index", i}};
            if (chat) {
              last["delta"] = Json::object();
            } else {
              last["text"] = "";
            }
            last["logprobs"] =
                out.logprobs.empty() ? Json() : logprobs_json(out.logprobs, text_offset);
            last["finish_reason"] = out.finish_reason;
            send(chunk(std::move(last)));
          }
          if (r->include_usage) {
            Json u = chunk(Json());
            u["choices"] = Json::array();
            u["usage"] = usage(total);
            send(u);
          }
          const std::string done = "data: [DONE]\n\n";
          if (!sink.write(done.data(), done.size())) throw ClientGone{};
          metrics.request_done(seconds_since(arrival));
          sink.done();
          log(chat ? "chat, streamed" : "completion, streamed", n_prompt, total);
          return true;
        } catch (const ClientGone&) {
          std::fprintf(stderr, "[serve] %s: the client closed the stream; generation stopped\n",
                       id.c_str());
          return false;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "[serve] %s failed: %s\n", id.c_str(), e.what());
          const std::string event =
              "data: " + dump(ApiError(500, "server_error", e.what()).to_json()) + "\n\n";
          sink.write(event.data(), event.size());
          sink.done();
          return true;
        }
      });
}

Server::Server(const Tokenizer& tokenizer, GenerateFn generate, ServeOptions options)
    : impl_(std::make_unique<Impl>(tokenizer, std::move(generate), std::move(options))) {
  Impl& im = *impl_;
  httplib::Server& h = im.http;
  h.set_payload_max_length(kMaxBodyBytes);
  // Each streamed event is a small write: without TCP_NODELAY, Nagle's algorithm holds it for
  // the client's delayed ACK (~40 ms to the first token on Linux).
  h.set_tcp_nodelay(true);
  // SO_REUSEADDR alone: httplib's default adds SO_REUSEPORT, which lets a second server bind the
  // same port and take half its connections; this way the second one fails to bind.
  h.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  h.set_pre_routing_handler([&im](const httplib::Request& req, httplib::Response& res) {
    if (im.opt.api_key.empty() || req.path.rfind("/v1/", 0) != 0) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    if (req.get_header_value("Authorization") != "Bearer " + im.opt.api_key) {
      send_error(res, ApiError(401, "authentication_error",
                               "a valid API key is required: Authorization: Bearer KEY"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  const auto guarded = [&im](void (Impl::*handler)(const httplib::Request&, httplib::Response&)) {
    return [&im, handler](const httplib::Request& req, httplib::Response& res) {
      try {
        (im.*handler)(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const Error& e) {  // the tokenizer or the engine
        send_error(res, ApiError(500, "server_error", e.what()));
      }
    };
  };
  h.Post("/v1/chat/completions", guarded(&Impl::chat));
  h.Post("/v1/completions", guarded(&Impl::completion));
  // vLLM's, outside /v1 (so not behind --api-key, as there).
  h.Post("/tokenize", guarded(&Impl::tokenize));
  h.Post("/detokenize", guarded(&Impl::detokenize));
  h.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{}", "application/json");
  });
  h.Get("/metrics", [&im](const httplib::Request&, httplib::Response& res) {
    res.set_content(im.metrics.render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  // Every answered request, whatever answered it (a route, the key check, the error handler).
  h.set_logger([&im](const httplib::Request& req, const httplib::Response& res) {
    im.metrics.http(req.path, req.method, res.status);
  });
  h.Get("/v1/models", [&im](const httplib::Request&, httplib::Response& res) {
    const Json model = {{"id", im.opt.model_name},
                        {"object", "model"},
                        {"created", static_cast<int64_t>(std::time(nullptr))},
                        {"owned_by", "qforge"},
                        {"max_model_len", im.opt.max_model_len}};
    res.set_content(dump(Json{{"object", "list"}, {"data", Json::array({model})}}),
                    "application/json");
  });
  // httplib's own errors (no route, body too large, unreadable request) in OpenAI's shape.
  h.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        std::string message = "bad request";
        if (res.status == 404) message = "no route for " + req.method + " " + req.path;
        if (res.status == 405) message = req.method + " is not allowed on " + req.path;
        if (res.status == 413) {
          message = "the request body is over " + std::to_string(kMaxBodyBytes) + " bytes";
        }
        send_error(res, ApiError(res.status,
                                 res.status == 404 ? "not_found_error" : "invalid_request_error",
                                 message));
        return httplib::Server::HandlerResponse::Handled;
      }));
  h.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string message = "internal error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          message = e.what();
        } catch (...) {
        }
        send_error(res, ApiError(500, "server_error", message));
      });
}

Server::~Server() = default;

int Server::bind() {
  const int port =
      impl_->opt.port == 0
          ? impl_->http.bind_to_any_port(impl_->opt.host)
          : (impl_->http.bind_to_port(impl_->opt.host, impl_->opt.port) ? impl_->opt.port : -1);
  if (port < 0) {
    throw Error(Errc::kIo, "cannot listen on " + impl_->opt.host + ":" +
                               std::to_string(impl_->opt.port) +
                               " (address in use, or not an address of this machine)");
  }
  return port;
}

void Server::run() {
  impl_->http.listen_after_bind();
}

void Server::stop() {
  impl_->http.stop();
}

}  // namespace qf::rt
