// qforge generate --model DIR (--prompt T | --chat T): text from the reference engine, streamed
// to stdout as it is generated.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>

#include "args.h"
#include "commands.h"
#include "qf/ckpt/file_io.h"
#include "qf/error.h"
#include "qf/rt/chat.h"
#include "qf/rt/cuda_engine.h"
#include "qf/rt/generate.h"
#include "qf/rt/generation_config.h"
#include "qf/rt/json_constraint.h"
#include "qf/rt/speculative.h"
#include "qf/rt/tokenizer.h"
#include "token_args.h"

namespace qf::tools {
namespace {

struct GenerateArgs {
  std::string model, prompt, chat, system, tokens, device = "cpu", json_schema;
  int64_t max_tokens = 256;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  float presence_penalty = 0, frequency_penalty = 0;
  std::optional<int> top_k;
  int logprobs = -1;
  std::optional<uint64_t> seed;
  bool no_think = false, ignore_eos = false, json = false, speculative = false, json_object = false;
  int threads = 0;
  int64_t mtp_vocab = 0;  // --mtp-draft-vocab (0: all)
  int draft_tokens = 1;   // --draft-tokens
  rt::KvCacheType kv_cache = rt::KvCacheType::kF32;
};

// Flags win; otherwise generation_config.json's sampling defaults when it samples; else greedy.
rt::SamplingOptions sampling(const GenerateArgs& a, const rt::GenerationConfig& g) {
  rt::SamplingOptions s = rt::default_sampling(g);
  if (a.temperature) s.temperature = *a.temperature;
  if (a.top_p) s.top_p = *a.top_p;
  if (a.top_k) s.top_k = *a.top_k;
  if (a.min_p) s.min_p = *a.min_p;
  if (a.repetition_penalty) s.repetition_penalty = *a.repetition_penalty;
  s.presence_penalty = a.presence_penalty;
  s.frequency_penalty = a.frequency_penalty;
  s.seed = a.seed ? *a.seed : std::random_device{}();
  return s;
}

int run(const GenerateArgs& a) {
  if (static_cast<int>(!a.prompt.empty()) + static_cast<int>(!a.chat.empty()) +
          static_cast<int>(!a.tokens.empty()) !=
      1) {
    throw Error(Errc::kUsage, "give exactly one of --prompt, --chat or --tokens");
  }
  if (a.max_tokens < 0) throw Error(Errc::kUsage, "--max-tokens must be >= 0");
  check_draft_tokens(a.draft_tokens, a.device);
  if (a.logprobs >= 0 && !a.json) throw Error(Errc::kUsage, "--logprobs needs --json");
  if (a.json_object && !a.json_schema.empty())
    throw Error(Errc::kUsage, "give at most one of --json-object and --json-schema");
  // Structured output: the schema checked before the model loads.
  std::shared_ptr<const rt::JsonGrammar> grammar;
  if (a.json_object)
    grammar = std::make_shared<const rt::JsonGrammar>(rt::JsonGrammar::any_object());
  if (!a.json_schema.empty()) {
    nlohmann::ordered_json schema;
    try {
      schema = nlohmann::ordered_json::parse(ckpt::read_text_file(a.json_schema));
    } catch (const nlohmann::json::exception& e) {
      throw Error(Errc::kUsage, a.json_schema + ": not JSON (" + e.what() + ")");
    }
    try {
      grammar = std::make_shared<const rt::JsonGrammar>(rt::JsonGrammar::from_schema(schema));
    } catch (const Error& e) {
      throw Error(Errc::kUsage, a.json_schema + ": " + e.what());
    }
  }
  const std::filesystem::path dir(a.model);
  const std::unique_ptr<rt::Model> model = rt::Model::load(dir);
  // --tokens needs no tokenizer: without tokenizer.json the output is token ids.
  std::optional<rt::Tokenizer> tok;
  std::error_code ec;
  if (a.tokens.empty() || std::filesystem::exists(dir / "tokenizer.json", ec)) {
    tok.emplace(rt::Tokenizer::load(dir / "tokenizer.json"));
  }
  const rt::GenerationConfig gen = rt::load_generation_config(dir);

  std::vector<int32_t> prompt;
  if (!a.tokens.empty()) {
    prompt = parse_token_ids(a.tokens, "--tokens");
  } else if (!a.chat.empty()) {
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
    messages.push_back({{"role", "user"}, {"content", a.chat}});
    rt::ChatOptions co;
    co.enable_thinking = !a.no_think;
    prompt = tok->encode(rt::render_chat(messages, nlohmann::ordered_json::array(), co));
  } else {
    prompt = tok->encode(a.prompt);
  }

  rt::GenerateOptions o;
  o.max_tokens = a.max_tokens;
  o.sampling = sampling(a, gen);
  o.logprobs = a.logprobs;
  nlohmann::json logprobs = nlohmann::json::array();
  o.on_logprobs = [&](const rt::TokenLogprobs& t) {
    nlohmann::json top = nlohmann::json::array();
    for (const auto& [id, lp] : t.top) top.push_back({{"id", id}, {"logprob", lp}});
    logprobs.push_back({{"id", t.id}, {"logprob", t.logprob}, {"top", std::move(top)}});
  };
  if (!a.ignore_eos) {
    o.stop_ids = gen.eos_token_ids;
    o.stop_ids.push_back(static_cast<int32_t>(model->config().eos_token_id));
  }
  if (grammar) {
    if (!tok) throw Error(Errc::kUsage, "--json-object and --json-schema need tokenizer.json");
    o.constraint =
        std::make_shared<rt::JsonConstraint>(std::make_shared<const rt::TokenTrie>(*tok), grammar,
                                             o.stop_ids, !a.chat.empty() && !a.no_think);
  }
  std::optional<rt::StreamDecoder> stream;
  if (tok) stream.emplace(*tok, /*skip_special=*/true);
  const auto print = [&](int32_t id) {
    if (a.json) return;
    const std::string text = stream ? stream->push(id) : std::to_string(id) + " ";
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  };
  rt::GenerateResult r;
  rt::SpecStats spec;
  if (a.device == "cuda") {
    rt::CudaOptions co;
    // Past kMaxCudaContext the engine refuses it (no overflow on the way).
    co.max_context = static_cast<int64_t>(prompt.size()) +
                     std::clamp<int64_t>(a.max_tokens, 1, rt::kMaxCudaContext) + 1;
    co.mtp = a.speculative;
    co.mtp_vocab = a.mtp_vocab;
    co.kv_cache = a.kv_cache;
    rt::CudaEngine engine(*model, co);
    const rt::CudaLoadStats& ls = engine.load_stats();
    std::fprintf(
        stderr, "[%s: %.2f GiB on the GPU, %.2f GiB read and repacked in %.2f s (%.2f GB/s)]\n",
        ls.device_name.c_str(), ls.device_bytes / 1073741824.0, ls.host_bytes / 1073741824.0,
        ls.load_seconds, ls.load_seconds > 0 ? ls.host_bytes / ls.load_seconds / 1e9 : 0.0);
    if (a.speculative) {
      r = rt::generate_speculative(rt::speculative_engine(engine, a.draft_tokens), prompt, o, print,
                                   &spec);
    } else {
      r = rt::generate_with(
          [&](int32_t token, float* logits) { return engine.step(token, logits); },
          model->config().vocab_size, prompt, o, print,
          [&](std::span<const int32_t> tokens, float* logits) {
            return engine.prefill(tokens, logits);  // batched prefill
          },
          0,
          [&](int32_t token, int k, rt::TopLogits& out) { return engine.step_top(token, k, out); });
    }
  } else {
    rt::CpuEngine engine(*model, a.threads, a.kv_cache);
    if (a.mtp_vocab > 0) engine.set_mtp_vocab(a.mtp_vocab);
    r = a.speculative ? rt::generate_speculative(rt::speculative_engine(engine, a.draft_tokens),
                                                 prompt, o, print, &spec)
                      : rt::generate(engine, prompt, o, print);
  }
  const double kept = spec.drafted > 0 ? static_cast<double>(spec.accepted) / spec.drafted : 0;
  const double decode_rate = r.decode_seconds > 0 ? r.ids.size() / r.decode_seconds : 0;
  const double prefill_rate = r.prefill_seconds > 0 ? r.prompt_tokens / r.prefill_seconds : 0;
  if (a.json) {
    nlohmann::json j = {{"text", tok ? tok->decode(r.ids, true) : ""},
                        {"ids", r.ids},
                        {"finish_reason", r.finish_reason},
                        {"prompt_tokens", r.prompt_tokens},
                        {"completion_tokens", r.ids.size()},
                        {"seed", o.sampling.seed},
                        {"temperature", o.sampling.temperature},
                        {"top_p", o.sampling.top_p},
                        {"top_k", o.sampling.top_k},
                        {"min_p", o.sampling.min_p},
                        {"presence_penalty", o.sampling.presence_penalty},
                        {"frequency_penalty", o.sampling.frequency_penalty},
                        {"repetition_penalty", o.sampling.repetition_penalty},
                        {"prefill_tokens_per_s", prefill_rate},
                        {"decode_tokens_per_s", decode_rate}};
    if (a.logprobs >= 0) j["logprobs"] = std::move(logprobs);
    if (a.speculative) {
      j["speculative"] = {{"rounds", spec.rounds},  {"draft_tokens", a.draft_tokens},
                          {"drafts", spec.drafted}, {"drafts_kept", spec.accepted},
                          {"acceptance", kept},     {"mtp_steps", spec.mtp_steps}};
    }
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  const std::string tail = stream ? stream->finish() : "";
  std::fwrite(tail.data(), 1, tail.size(), stdout);
  std::printf("\n");
  std::fflush(stdout);
  std::fprintf(stderr,
               "[%lld prompt tokens at %.1f tok/s, %zu generated at %.1f tok/s, finish: %s, "
               "seed %llu]\n",
               static_cast<long long>(r.prompt_tokens), prefill_rate, r.ids.size(), decode_rate,
               r.finish_reason.c_str(), static_cast<unsigned long long>(o.sampling.seed));
  if (a.speculative) {
    std::fprintf(
        stderr, "[speculative: %lld rounds, %lld of %lld drafts kept (%.1f%%), %lld MTP steps]\n",
        static_cast<long long>(spec.rounds), static_cast<long long>(spec.accepted),
        static_cast<long long>(spec.drafted), 100.0 * kept, static_cast<long long>(spec.mtp_steps));
  }
  return kExitOk;
}

}  // namespace

Command add_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* sub = app.add_subcommand("generate", "Generate text (CPU reference engine or CUDA)");
  sub->add_option("--model", a->model, "model directory (any layout qforge reads)")->required();
  sub->add_option("--prompt", a->prompt, "raw prompt text (no chat template)");
  sub->add_option("--chat", a->chat, "a user message, rendered with the Qwen3.5 chat template");
  sub->add_option("--tokens", a->tokens, "prompt as token ids: 1,2,3");
  sub->add_option("--system", a->system, "--chat: a system message");
  sub->add_flag("--no-think", a->no_think, "--chat: thinking off (an empty think block)");
  sub->add_option("--max-tokens", a->max_tokens, "most tokens to generate")->capture_default_str();
  sub->add_option("--temperature", a->temperature, "0: greedy (default: generation_config.json)");
  sub->add_option("--top-p", a->top_p, "nucleus mass in (0, 1]");
  sub->add_option("--top-k", a->top_k, "keep the k most likely tokens (0: all)");
  sub->add_option("--min-p", a->min_p,
                  "drop tokens less likely than this times the most likely one, in [0, 1]");
  sub->add_option("--presence-penalty", a->presence_penalty,
                  "subtracted from the logit of every token generated so far, in [-2, 2]")
      ->capture_default_str();
  sub->add_option("--frequency-penalty", a->frequency_penalty,
                  "subtracted from a logit for each time its token was generated, in [-2, 2]")
      ->capture_default_str();
  sub->add_option("--repetition-penalty", a->repetition_penalty,
                  "> 0: the logits of prompt and generated tokens divided by it (positive) or "
                  "multiplied (negative); default: generation_config.json, else 1");
  sub->add_option("--logprobs", a->logprobs,
                  "--json: each token's log-probability and this many alternatives (0 to 20)");
  sub->add_option("--seed", a->seed, "sampling seed (default: random, printed)");
  sub->add_option("--device", a->device, "cpu (the reference engine) or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  sub->add_flag("--speculative", a->speculative,
                "speculative decoding with the checkpoint's MTP head, one draft token a round "
                "(--draft-tokens): greedy gives the same ids as greedy decoding, sampling ids "
                "distributed as plain sampling's");
  add_mtp_vocab_option(sub, &a->mtp_vocab, "--speculative");
  add_draft_tokens_option(sub, &a->draft_tokens);
  add_threads_option(sub, &a->threads, "worker threads");
  add_kv_cache_option(sub, &a->kv_cache);
  sub->add_flag("--ignore-eos", a->ignore_eos, "do not stop at generation_config's eos tokens");
  sub->add_flag("--json-object", a->json_object,
                "the reply (after the think block with --chat) is a JSON object");
  sub->add_option("--json-schema", a->json_schema,
                  "FILE: the reply is JSON that this JSON schema allows (subset: README)");
  sub->add_flag("--json", a->json, "print one JSON object at the end instead of streaming");
  sub->footer(
      "Stops at the eos tokens of generation_config.json (and config.json's eos_token_id) or\n"
      "after --max-tokens. Text streams to stdout; a statistics line goes to stderr.\n\n"
      "Example:\n  qforge generate --model /models/tiny --chat \"Hello\" --temperature 0");
  return {sub, [a] { return run(*a); }};
}

}  // namespace qf::tools
