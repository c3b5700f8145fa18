// qforge eval-ppl --model DIR --text FILE: perplexity of a model on held-out text, in windows
// that each start from a fresh state, and the MTP head's top-1 accuracy and perplexity on it.
// The figures are defined so that a PyTorch script computes the same ones (see the footer).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "args.h"
#include "commands.h"
#include "output.h"
#include "qf/ckpt/file_io.h"
#include "qf/error.h"
#include "qf/rt/cpu_engine.h"
#include "qf/rt/cuda_engine.h"
#include "qf/rt/tokenizer.h"
#include "qf/tasks.h"

namespace qf::tools {
namespace {

struct EvalPplArgs {
  std::vector<std::string> models;
  std::string text, device = "cpu";
  int64_t window = 512;
  std::optional<int64_t> max_tokens;
  bool no_mtp = false, json = false;
  int threads = 0;
  rt::KvCacheType kv_cache = rt::KvCacheType::kF32;
};

// Next-token predictions scored so far: NLL summed in double, top-1 hits.
struct Score {
  int64_t predictions = 0, hits = 0;
  double nll = 0;

  // logits [V] predicting `target`: NLL = logsumexp(logits) - logits[target]; a hit when the
  // argmax (lowest id among equal maxima) is the target.
  void add(const float* logits, int64_t vocab, int32_t target) {
    const int64_t top = std::max_element(logits, logits + vocab) - logits;
    const double max = logits[top];
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
    nll += max + std::log(sum) - static_cast<double>(logits[target]);
    hits += top == target ? 1 : 0;
    ++predictions;
  }
  // The same from a row reduced on the device (CudaEngine::prefill_scored): its log-normalizer,
  // the target's logit and the argmax.
  void add(double log_z, float target_logit, int32_t top, int32_t target) {
    nll += log_z - static_cast<double>(target_logit);
    hits += top == target ? 1 : 0;
    ++predictions;
  }
  void merge(const Score& o) {
    predictions += o.predictions;
    hits += o.hits;
    nll += o.nll;
  }
  double mean_nll() const { return predictions ? nll / static_cast<double>(predictions) : 0.0; }
  double ppl() const { return std::exp(mean_nll()); }
  double top1() const {
    return predictions ? static_cast<double>(hits) / static_cast<double>(predictions) : 0.0;
  }
};

// Windows [begin, end) of `window` tokens over the first `n` ids; the last may be shorter, one
// of fewer than 2 tokens (no prediction) is dropped.
std::vector<std::pair<int64_t, int64_t>> windows_of(int64_t n, int64_t window) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t b = 0; b < n; b += window) {
    const int64_t e = std::min(n, b + window);
    if (e - b >= 2) out.emplace_back(b, e);
  }
  return out;
}

// One window on the CPU engine, from a fresh state; with `mtp` (not null) also the MTP head, run
// after the main pass over the stored hidden states, in position order (it keeps its own cache).
void eval_window(rt::CpuEngine& engine, const int32_t* w, int64_t n, Score& main, Score* mtp,
                 ckpt::Progress& progress) {
  const int64_t vocab = engine.model().config().vocab_size;
  const size_t h = static_cast<size_t>(engine.model().config().hidden_size);
  std::vector<float> logits(static_cast<size_t>(vocab)), hidden;
  engine.reset();  // also the MTP head's cache and position
  if (mtp) hidden.resize(static_cast<size_t>(n) * h);
  for (int64_t t = 0; t < n; ++t) {
    const bool scored = t + 1 < n;
    engine.step(w[t], scored ? logits.data() : nullptr);
    if (scored) main.add(logits.data(), vocab, w[t + 1]);
    if (mtp) std::copy(engine.hidden().begin(), engine.hidden().end(), hidden.begin() + t * h);
    progress.done.fetch_add(1);
  }
  if (!mtp) return;
  for (int64_t t = 0; t + 2 < n; ++t) {
    engine.mtp_step(w[t + 1], hidden.data() + t * h, logits.data());
    mtp->add(logits.data(), vocab, w[t + 2]);
  }
}

// Windows are independent: up to `threads` engines take them in turn (a small model's products
// are too short to split over threads), and the scores are summed in window order, so the
// figures do not depend on the thread count.
void eval_cpu(const rt::Model& model, const std::vector<int32_t>& ids,
              const std::vector<std::pair<int64_t, int64_t>>& windows, int threads,
              rt::KvCacheType kv, Score& main, Score* mtp, ckpt::Progress& progress) {
  const int cores =
      threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int engines =
      static_cast<int>(std::min<size_t>(static_cast<size_t>(cores), windows.size()));
  std::vector<Score> mains(windows.size()), mtps(windows.size());
  run_tasks(windows.size(), engines, [&] {
    auto engine = std::make_shared<rt::CpuEngine>(model, std::max(1, cores / engines), kv);
    return [&, engine](size_t i) {
      const auto [b, e] = windows[i];
      eval_window(*engine, ids.data() + b, e - b, mains[i], mtp ? &mtps[i] : nullptr, progress);
    };
  });
  for (size_t i = 0; i < windows.size(); ++i) {
    main.merge(mains[i]);
    if (mtp) mtp->merge(mtps[i]);
  }
}

// The same on the CUDA engine (its context at least the longest window), reset per window: each
// window is one prompt scoring (CudaEngine::prefill_scored, with the MTP head
// prefill_scored_with_mtp: batched prefill, the LM head over 128 positions a product, each row
// reduced on the device to its normalizer, argmax and target's logit; equal to steps' up to the
// order of the sums).
void eval_cuda(rt::CudaEngine& engine, const std::vector<int32_t>& ids,
               const std::vector<std::pair<int64_t, int64_t>>& windows, Score& main, Score* mtp,
               ckpt::Progress& progress) {
  std::vector<int32_t> targets, mtp_targets;
  std::vector<rt::TopLogits> tops, mtp_tops;
  std::vector<float> picked, mtp_picked;
  for (const auto& [b, e] : windows) {
    engine.reset();
    const int32_t* w = ids.data() + b;
    const auto n = static_cast<size_t>(e - b);
    targets.assign(w + 1, w + n);
    targets.push_back(-1);
    tops.resize(n);
    picked.resize(n);
    const std::span<const int32_t> window(w, n);
    if (mtp) {  // row t (t < n - 1) predicts token t + 2
      mtp_targets.assign(w + 2, w + n);
      mtp_targets.push_back(-1);
      mtp_tops.resize(n - 1);
      mtp_picked.resize(n - 1);
      engine.prefill_scored_with_mtp(window, -1, targets, mtp_targets, 1, tops.data(),
                                     picked.data(), mtp_tops.data(), mtp_picked.data());
      for (size_t t = 0; t + 2 < n; ++t) {
        mtp->add(mtp_tops[t].log_z, mtp_picked[t], mtp_tops[t].ids[0], w[t + 2]);
      }
    } else {
      engine.prefill_scored(window, targets, 1, tops.data(), picked.data());
    }
    for (size_t t = 0; t + 1 < n; ++t) main.add(tops[t].log_z, picked[t], tops[t].ids[0], w[t + 1]);
    progress.done.fetch_add(n);
  }
}

nlohmann::json score_json(const Score& s) {
  return {
      {"predictions", s.predictions}, {"nll", s.mean_nll()}, {"ppl", s.ppl()}, {"top1", s.top1()}};
}

// Bytes of a checkpoint's .safetensors files.
uint64_t weight_bytes(const std::string& dir) {
  uint64_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".safetensors") n += e.file_size();
  }
  return n;
}

// One model on the text: the --json object of the help text.
nlohmann::json evaluate(const EvalPplArgs& a, const std::string& model_dir,
                        const std::string& text) {
  const std::unique_ptr<rt::Model> model = rt::Model::load(model_dir);
  const rt::Tokenizer tok =
      rt::Tokenizer::load(std::filesystem::path(model_dir) / "tokenizer.json");
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(text);
  } catch (const Error& e) {
    throw Error(e.code(), a.text + ": " + e.what());
  }
  const int64_t n_text = static_cast<int64_t>(ids.size());
  if (n_text < 2) {
    throw Error(Errc::kUsage, a.text + ": the text has " + std::to_string(n_text) +
                                  (n_text == 1 ? " token" : " tokens") +
                                  "; perplexity needs at least 2");
  }
  if (a.max_tokens && *a.max_tokens < n_text) ids.resize(static_cast<size_t>(*a.max_tokens));
  const int64_t vocab = model->config().vocab_size;
  for (const int32_t id : ids) {
    if (id >= vocab) {
      throw Error(Errc::kUsage, a.text + ": token id " + std::to_string(id) + " of " + model_dir +
                                    "/tokenizer.json is outside the model's vocabulary [0, " +
                                    std::to_string(vocab) + ")");
    }
  }
  const auto windows = windows_of(static_cast<int64_t>(ids.size()), a.window);
  int64_t n_eval = 0;
  for (const auto& [b, e] : windows) n_eval += e - b;

  // The MTP head: null in the report without a head or with --no-mtp.
  const bool cuda = a.device == "cuda";
  const bool mtp_on = model->mtp() && !a.no_mtp;
  Score main, mtp;
  ckpt::Progress progress;
  progress.total = static_cast<uint64_t>(n_eval);
  // Built before the clock and the progress bar start; without a usable GPU it throws as
  // `qforge logits --device cuda` does.
  std::optional<rt::CudaEngine> gpu;
  if (cuda) {
    rt::CudaOptions o;
    o.max_context = std::max<int64_t>(std::min<int64_t>(a.window, n_eval), 16);
    o.mtp = mtp_on;
    o.kv_cache = a.kv_cache;
    gpu.emplace(*model, o);
  }
  const auto t0 = std::chrono::steady_clock::now();
  {
    ProgressBar bar("eval-ppl", progress, "tokens");
    if (gpu) {
      eval_cuda(*gpu, ids, windows, main, mtp_on ? &mtp : nullptr, progress);
    } else {
      eval_cpu(*model, ids, windows, a.threads, a.kv_cache, main, mtp_on ? &mtp : nullptr,
               progress);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Also null when no window has the 3 tokens an MTP prediction needs.
  const bool mtp_scored = mtp_on && mtp.predictions > 0;
  const char* why_no_mtp = !model->mtp() ? "the checkpoint has no MTP head"
                           : a.no_mtp    ? "--no-mtp"
                                         : "no window of 3 tokens or more";
  return {{"model", model_dir},
          {"text", a.text},
          {"device", a.device},
          {"window", a.window},
          {"weight_bytes", weight_bytes(model_dir)},
          {"text_tokens", n_text},
          {"tokens", static_cast<int64_t>(ids.size())},
          {"tokens_evaluated", n_eval},
          {"windows", windows.size()},
          {"predictions", main.predictions},
          {"nll", main.mean_nll()},
          {"ppl", main.ppl()},
          {"top1", main.top1()},
          {"mtp", mtp_scored ? score_json(mtp) : nlohmann::json(nullptr)},
          {"mtp_missing_because", mtp_scored ? nlohmann::json(nullptr) : why_no_mtp},
          {"seconds", seconds},
          {"tokens_per_s", seconds > 0 ? static_cast<double>(n_eval) / seconds : 0.0}};
}

void print_one(const nlohmann::json& r) {
  const auto count = [&](const char* key) { return with_commas(r[key].get<uint64_t>()); };
  std::printf("model        %s (%s)\n", r["model"].get<std::string>().c_str(),
              r["device"].get<std::string>().c_str());
  const std::string kept =
      r["tokens"] < r["text_tokens"] ? ", first " + count("tokens") + " kept" : "";
  std::printf("text         %s: %s tokens%s, %s evaluated in %s windows of %lld\n",
              r["text"].get<std::string>().c_str(), count("text_tokens").c_str(), kept.c_str(),
              count("tokens_evaluated").c_str(), count("windows").c_str(),
              r["window"].get<long long>());
  std::printf("main         perplexity %.4f, NLL %.6f nats, top-1 %.2f%% of %s predictions\n",
              r["ppl"].get<double>(), r["nll"].get<double>(), 100.0 * r["top1"].get<double>(),
              count("predictions").c_str());
  if (const nlohmann::json& m = r["mtp"]; !m.is_null()) {
    std::printf("mtp          perplexity %.4f, NLL %.6f nats, top-1 %.2f%% of %s predictions\n",
                m["ppl"].get<double>(), m["nll"].get<double>(), 100.0 * m["top1"].get<double>(),
                with_commas(m["predictions"].get<uint64_t>()).c_str());
  } else {
    std::printf("mtp          -  (%s)\n", r["mtp_missing_because"].get<std::string>().c_str());
  }
  std::printf("speed        %.1f tokens/s (%.2f s)\n", r["tokens_per_s"].get<double>(),
              r["seconds"].get<double>());
}

// Several models: one table, perplexity also relative to the first model's.
void print_table(const std::vector<nlohmann::json>& rs) {
  const nlohmann::json& f = rs.front();
  std::printf("text: %s, %s tokens evaluated in %s windows of %lld (%s)\n",
              f["text"].get<std::string>().c_str(),
              with_commas(f["tokens_evaluated"].get<uint64_t>()).c_str(),
              with_commas(f["windows"].get<uint64_t>()).c_str(), f["window"].get<long long>(),
              f["device"].get<std::string>().c_str());
  size_t width = 5;
  for (const nlohmann::json& r : rs) width = std::max(width, r["model"].get<std::string>().size());
  const int w = static_cast<int>(width);
  std::printf("%-*s  %9s  %10s  %8s  %6s  %8s  %9s  %8s\n", w, "model", "weights", "perplexity",
              "vs first", "top-1", "MTP ppl", "MTP top-1", "tokens/s");
  const double base = f["ppl"].get<double>();
  for (const nlohmann::json& r : rs) {
    const double ppl = r["ppl"].get<double>();
    const nlohmann::json& m = r["mtp"];
    char rel[32], mppl[32] = "-", mtop[32] = "-";
    std::snprintf(rel, sizeof rel, "%+.2f%%", 100.0 * (ppl / base - 1.0));
    if (!m.is_null()) {
      std::snprintf(mppl, sizeof mppl, "%.4f", m["ppl"].get<double>());
      std::snprintf(mtop, sizeof mtop, "%.2f%%", 100.0 * m["top1"].get<double>());
    }
    std::printf("%-*s  %5.1f MiB  %10.4f  %8s  %5.2f%%  %8s  %9s  %8.0f\n", w,
                r["model"].get<std::string>().c_str(),
                static_cast<double>(r["weight_bytes"].get<uint64_t>()) / (1 << 20), ppl,
                &r == &f ? "-" : rel, 100.0 * r["top1"].get<double>(), mppl, mtop,
                r["tokens_per_s"].get<double>());
  }
}

int run(const EvalPplArgs& a) {
  if (a.window < 2) {
    throw Error(Errc::kUsage, "--window must be at least 2 tokens (got " +
                                  std::to_string(a.window) + "): a prediction needs two");
  }
  if (a.max_tokens && *a.max_tokens < 2) {
    throw Error(Errc::kUsage, "--max-tokens must be at least 2 (got " +
                                  std::to_string(*a.max_tokens) + "): a prediction needs two");
  }
  const std::string text = ckpt::read_text_file(a.text);
  std::vector<nlohmann::json> results;
  for (const std::string& m : a.models) results.push_back(evaluate(a, m, text));
  if (a.json) {
    const nlohmann::json j = results.size() == 1 ? results.front() : nlohmann::json(results);
    std::printf("%s\n", j.dump(2).c_str());
  } else if (results.size() == 1) {
    print_one(results.front());
  } else {
    print_table(results);
  }
  return kExitOk;
}

}  // namespace

Command add_eval_ppl(CLI::App& app) {
  auto a = std::make_shared<EvalPplArgs>();
  CLI::App* sub = app.add_subcommand(
      "eval-ppl", "Perplexity on held-out text, and the MTP head's top-1 accuracy on it");
  sub->add_option("--model", a->models,
                  "model directory with tokenizer.json; repeat it to compare checkpoints")
      ->required();
  sub->add_option("--text", a->text, "UTF-8 text file, tokenized whole with tokenizer.json")
      ->required();
  sub->add_option("--window", a->window, "tokens per window; each starts from a fresh state")
      ->capture_default_str();
  sub->add_option("--max-tokens", a->max_tokens, "keep only the text's first N tokens");
  sub->add_option("--device", a->device, "cpu (the reference engine) or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  add_threads_option(sub, &a->threads, "worker threads");
  add_kv_cache_option(sub, &a->kv_cache);
  sub->add_flag("--no-mtp", a->no_mtp, "leave the MTP head out (mtp: null)");
  sub->add_flag("--json", a->json, "machine-readable report on stdout");
  sub->footer(
      "Added tokens such as <|endoftext|> in the text are recognized. The ids are cut into\n"
      "consecutive windows of --window tokens (the last may be shorter; one of a single token is\n"
      "dropped); each window runs from a fresh state at positions 0..n-1. Position t predicts\n"
      "token t+1: NLL = logsumexp(logits) - logits[target] in double (--device cuda: the sum\n"
      "of exponentials taken on the GPU in fp32, within 1e-5 relative, so each NLL within\n"
      "1e-5), top-1 a hit when the argmax (lowest id on ties) is the target; ppl = exp(mean\n"
      "NLL) over every prediction of every window. The MTP head predicts t+2 from the hidden\n"
      "state at t and token t+1, for t = 0..n-3. --json: tokens counts the ids after\n"
      "--max-tokens (text_tokens all of them, tokens_evaluated those in windows); mtp is null\n"
      "without a head, with --no-mtp, or with no window of 3 tokens (mtp_missing_because says\n"
      "which). weight_bytes: the .safetensors files. seconds and tokens/s cover the evaluation,\n"
      "not the loading. With several --model, a table (perplexity also relative to the first\n"
      "model's) and, with --json, an array of the objects.\n\n"
      "Example:\n  qforge eval-ppl --model /models/Qwen3.5-35B-A3B --text wiki.test.txt --window "
      "512 --json");
  return {sub, [a] { return run(*a); }};
}

}  // namespace qf::tools
