// qforge bench (--model DIR | --synthetic PRESET): decode speed of the CUDA engine at batch 1,
// with the bytes each step moves, the achieved bandwidth next to the GPU's measured copy
// bandwidth, each kernel family's share of a step, and what a DGX Spark (GB10, ~232 GB/s measured
// read bandwidth) would give at that efficiency or with the same time beyond the step's bytes.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "args.h"
#include "commands.h"
#include "output.h"
#include "qf/ckpt/qwen35_config.h"
#include "qf/error.h"
#include "qf/rt/cuda_engine.h"
#include "qf/rt/sampler.h"

namespace qf::tools {
namespace {

constexpr double kGb10Bandwidth =
    232e9;  // measured read bandwidth of the Spark (kernel-anchors §0)

// The sampling that --mtp times: Qwen3.5's recommended defaults (its generation_config.json).
constexpr rt::SamplingOptions kBenchSampling{.temperature = 0.6f, .top_p = 0.95f, .top_k = 20};

struct BenchArgs {
  std::string model, synthetic;
  // hybrid, hybrid-int4-head, int4 or bf16 (rt::SyntheticFormat)
  std::string synthetic_format = "hybrid";
  int steps = 64;
  int64_t context = 512;
  uint64_t seed = 1;
  bool json = false;
  bool serial_shared = false;
  bool unfused_swiglu = false;
  bool scalar_attention = false;
  bool shared_in_experts = false;
  bool mtp = false;
  int64_t mtp_vocab = 0;  // --mtp-draft-vocab (0: all)
  int prefill = 0;        // prompt tokens to time a batched prefill on (0: none)
  bool score = false;     // also time prompt scoring over those tokens
  int prefill_chunk = rt::CudaOptions{}.prefill_chunk;
  int out_parts = rt::CudaOptions{}.out_parts;
  std::vector<std::string> skip;
  rt::KvCacheType kv_cache = rt::KvCacheType::kF32;
};

nlohmann::json shares_json(const std::vector<rt::KernelShare>& shares) {
  nlohmann::json out = nlohmann::json::array();
  for (const rt::KernelShare& k : shares) {
    out.push_back({{"name", k.name}, {"us", k.microseconds}, {"bytes", k.bytes}});
  }
  return out;
}

// " (N us):" and a table of the families' time, share, bytes and GB/s.
void print_shares(const std::vector<rt::KernelShare>& shares) {
  double total = 0;
  for (const rt::KernelShare& k : shares) total += k.microseconds;
  std::printf(" (%.1f us):\n", total);
  std::printf("  %-36s %10s %7s %12s %9s\n", "kernel family", "us", "share", "bytes", "GB/s");
  for (const rt::KernelShare& k : shares) {
    std::printf("  %-36s %10.1f %6.1f%% %12s %9.0f\n", k.name.c_str(), k.microseconds,
                100 * k.microseconds / total, human_bytes(k.bytes).c_str(),
                k.microseconds > 0 ? static_cast<double>(k.bytes) / (k.microseconds * 1e3) : 0.0);
  }
}

// "synthetic PRESET" and its format where not the hybrid's.
std::string synthetic_name(const BenchArgs& a) {
  const std::string s = "synthetic " + a.synthetic;
  if (a.synthetic_format == "int4") return s + " (Intel's INT4 formats)";
  if (a.synthetic_format == "bf16") return s + " (BF16)";
  if (a.synthetic_format == "hybrid-int4-head") return s + " (INT4 LM head)";
  return s;
}

// The host's sums in the --score comparison land here, so that they are not optimized away.
volatile double g_host_sums = 0;

int run(const BenchArgs& a) {
  if (a.model.empty() == a.synthetic.empty()) {
    throw Error(Errc::kUsage, "give exactly one of --model DIR or --synthetic PRESET");
  }
  if (!a.model.empty() && a.synthetic_format != "hybrid") {
    throw Error(Errc::kUsage, "--synthetic-format goes with --synthetic, not --model");
  }
  if (a.score && a.prefill < 2) throw Error(Errc::kUsage, "--score needs --prefill N (N >= 2)");
  if (a.score && a.mtp_vocab > 0) {
    throw Error(Errc::kUsage,
                "--score times the MTP head over the whole vocabulary: drop "
                "--mtp-draft-vocab or --score");
  }
  rt::CudaOptions o;
  // --mtp also times speculative decoding's steps, verify passes (two or three positions each)
  // and the MTP head's steps and entries, greedy and sampled.
  o.max_context =
      std::max<int64_t>(a.context + a.steps + 2 + (a.mtp ? 21 * a.steps + 30 : 0), a.prefill + 1);
  o.prefill_chunk = a.prefill_chunk;
  o.parallel_shared = !a.serial_shared;
  o.shared_in_experts = a.shared_in_experts;
  o.fused_swiglu = !a.unfused_swiglu;
  o.tensor_core_attention = !a.scalar_attention;
  o.out_parts = a.out_parts;
  o.skip = a.skip;
  o.mtp = a.mtp;
  o.mtp_vocab = a.mtp_vocab;
  o.kv_cache = a.kv_cache;
  std::unique_ptr<rt::Model> model;
  std::unique_ptr<rt::CudaEngine> engine;
  if (!a.synthetic.empty()) {
    const rt::SyntheticFormat format = a.synthetic_format == "int4"   ? rt::SyntheticFormat::kInt4
                                       : a.synthetic_format == "bf16" ? rt::SyntheticFormat::kBf16
                                       : a.synthetic_format == "hybrid-int4-head"
                                           ? rt::SyntheticFormat::kHybridInt4Head
                                           : rt::SyntheticFormat::kHybrid;
    engine = rt::CudaEngine::synthetic(ckpt::qwen35_preset(a.synthetic), a.seed, o, format);
  } else {
    model = rt::Model::load(a.model);
    engine = std::make_unique<rt::CudaEngine>(*model, o);
  }
  const rt::CudaLoadStats& ls = engine->load_stats();
  const double copy_gbs = rt::device_copy_bandwidth(1ull << 30);

  // Fill the context: by steps, as every figure before; past 4096 tokens by a batched prefill of
  // ids spread over the vocabulary (a minute of steps at 16384 tokens, two at 32768; the state
  // differs, so the routing: at context 1024 the step measured 0.6% slower after a prefill, H100).
  // Then profile one step kernel by kernel and time graph-launched steps.
  if (a.context > 4096) {
    const int64_t vocab = engine->config().vocab_size;
    std::vector<int32_t> fill(static_cast<size_t>(a.context - 1));
    for (size_t i = 0; i < fill.size(); ++i) {
      fill[i] = static_cast<int32_t>((static_cast<int64_t>(i) * 7919 + 1) % vocab);
    }
    engine->prefill(fill);
  } else {
    engine->step(0, nullptr);
    while (engine->position() < a.context - 1) engine->step_greedy();
  }
  const std::vector<rt::KernelShare> shares = engine->profile_step();
  const double us = engine->time_steps(a.steps);
  uint64_t step_bytes = 0;
  for (const rt::KernelShare& k : shares) step_bytes += k.bytes;
  const double gbs = static_cast<double>(step_bytes) / (us * 1e-6) / 1e9;
  const double efficiency = gbs / copy_gbs;
  const double gb10_tps = kGb10Bandwidth * efficiency / static_cast<double>(step_bytes);
  // The other way to carry the step over: the time it spends here beyond its bytes at the copy
  // rate (launch ramps and drains, waits, dependent loads: a cost per launch more than per byte,
  // docs/cuda-engine-speed.md) taken as the same in us on a GB10, plus its bytes at 232 GB/s.
  // Neither way was measured on a GB10; the first keeps this GPU's fraction, which a slower
  // memory should raise, the second this GPU's latencies, which a GB10 may not match.
  const double beyond_us = std::max(0.0, us - static_cast<double>(step_bytes) / (copy_gbs * 1e3));
  const double gb10_beyond_tps =
      1e6 / (beyond_us + static_cast<double>(step_bytes) / kGb10Bandwidth * 1e6);

  // The MTP head at the same context: its cache filled as far as the main model's, then timed.
  double mtp_us = 0;
  uint64_t mtp_bytes = 0;
  if (a.mtp) {
    if (!engine->has_mtp()) {
      throw Error(Errc::kUnsupported, a.model + " has no MTP head (mtp.* tensors); drop --mtp");
    }
    if (a.context > 1) engine->time_mtp_steps(static_cast<int>(a.context - 1));
    mtp_us = engine->time_mtp_steps(a.steps);
    const ckpt::Qwen35Config& c = engine->config();
    const uint64_t mean_rows = static_cast<uint64_t>(a.context) + (a.steps + 1) / 2;
    mtp_bytes = ls.mtp_weight_bytes + 2 * mean_rows * static_cast<uint64_t>(c.kv_rows()) *
                                          rt::kv_cache_entry_bytes(a.kv_cache);
  }
  const double mtp_gbs = mtp_us > 0 ? static_cast<double>(mtp_bytes) / (mtp_us * 1e-6) / 1e9 : 0;

  // Speculative decoding's parts, each call waited for as generate waits for it: a step, a
  // two-token verify pass, and a verify pass whose second token is rejected.
  double sync_step_us = 0, verify_us = 0, reject_us = 0;
  // Two drafts a round: a three-token verify, its rollbacks of one and two tokens, and the
  // chained draft with the head's rewind after it.
  double verify3_us = 0, reject3_1_us = 0, reject3_2_us = 0, chain_us = 0;
  // The MTP head's entries for one and two kept drafts (CudaEngine::mtp_entries), which the loop
  // makes instead of MTP steps.
  double entry_us = 0, entries2_us = 0;
  // A greedy round's draft and verify, host-synced as the loop calls them.
  double draft_then_verify_us = 0;
  struct {
    double step_us = 0, verify_us = 0, draft_us = 0, sample_us = 0;
    // The same with the top k selected on the device (CudaEngine::step_top, verify2_top,
    // draft_top).
    double top_step_us = 0, top_verify_us = 0, top_draft_us = 0;
  } sampled;
  if (a.mtp) {
    const auto per_call = [&](const std::function<void()>& f) {
      f();  // warm: captures the graph
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < a.steps; ++i) f();
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                 .count() /
             a.steps;
    };
    const int32_t tokens[2] = {1, 2};
    int32_t top[2];
    sync_step_us = per_call([&] { engine->step(1, nullptr); });
    verify_us = per_call([&] { engine->verify2(tokens, top); });
    reject_us = per_call([&] {
                  engine->verify2(tokens, top);
                  engine->reject_last();
                }) -
                verify_us;
    const int32_t tokens3[3] = {1, 2, 3};
    int32_t top3[3];
    verify3_us = per_call([&] { engine->verify(tokens3, top3); });
    reject3_1_us = per_call([&] {
                     engine->verify(tokens3, top3);
                     engine->reject(1);
                   }) -
                   verify3_us;
    reject3_2_us = per_call([&] {
                     engine->verify(tokens3, top3);
                     engine->reject(2);
                   }) -
                   verify3_us;
    chain_us = per_call([&] {
      engine->draft_chain(1);
      engine->mtp_rewind(1);
    });
    entry_us = per_call([&] { engine->mtp_entries(0, std::span(tokens, 1)); });
    draft_then_verify_us = per_call([&] {
      const int32_t pair[2] = {1, engine->draft(0, 1)};
      engine->verify2(pair, top);
    });
    entries2_us = per_call([&] { engine->mtp_entries(0, std::span(tokens, 2)); });
    // Sampled: the logits come back to the host sampler, which draws the draft from the head's
    // distribution, resolves it against the verify's first row, and draws the token after a
    // kept draft from its second.
    const size_t vocab = static_cast<size_t>(engine->config().vocab_size);
    std::vector<float> logits(2 * vocab);
    const std::span<const float> row0(logits.data(), vocab), row1(logits.data() + vocab, vocab);
    rt::Sampler sampler(kBenchSampling);
    rt::TokenDist dist;
    sampled.step_us = per_call([&] {
      engine->step(1, logits.data());
      sampler.sample(row0);
    });
    rt::Sampler top_sampler(kBenchSampling);
    rt::TopLogits tops;
    sampled.top_step_us = per_call([&] {
      engine->step_top(1, kBenchSampling.top_k, tops);
      top_sampler.sample(tops.logits);
    });
    rt::TopLogits rows[2];
    rt::TokenDist top_dist;
    sampled.top_verify_us = per_call([&] {
      engine->verify2_top(tokens, top, kBenchSampling.top_k, rows);
      top_sampler.distribution(rows[0].logits, top_dist);
    });
    sampled.top_draft_us = per_call([&] {
      engine->draft_top(0, 1, kBenchSampling.top_k, tops);
      top_sampler.distribution(tops.logits, top_dist);
      top_sampler.draw(top_dist);
    });
    sampled.verify_us = per_call([&] {
      engine->verify2(tokens, top, logits.data());
      sampler.distribution(row0, dist);
    });
    sampled.draft_us = per_call([&] {
      engine->draft(0, 1, logits.data());
      sampler.distribution(row0, dist);
      sampler.draw(dist);
    });
    sampled.sample_us = per_call([&] { sampler.sample(row1); });
  }
  // A prompt of a.prefill tokens (pseudo-random ids), from a fresh state, host-synced as generate
  // calls it: batched, then in pairs (verify2), as prefill went before it. The first batched
  // call captures the pass's graph and is not timed.
  double prefill_us = 0, pairs_us = 0;
  // With --mtp: the same prompt as speculative decoding takes it, the MTP head's entries made:
  // prefill_with_mtp, and pairs with a draft per token (as the loop went before it).
  double mtp_prefill_us = 0, mtp_pairs_us = 0;
  std::vector<rt::KernelShare> prefill_shares;  // one pass launched kernel by kernel
  // With --score: prompt scoring as eval-ppl runs it (prefill_scored: every row's normalizer,
  // argmax and next token's logit), and as eval-ppl ran it before (advance, 128 tokens a call,
  // every row's logits to the host, reduced there in double).
  // With --mtp too: the MTP head's rows as well (prefill_scored_with_mtp; before, pairs
  // (verify2) and a draft a position, every row to the host).
  double score_us = 0, score_host_us = 0, score_mtp_us = 0, score_mtp_host_us = 0;
  // Two-token passes take ~1.5 steps a pair: beyond this many tokens they are not timed.
  constexpr int kPairsMax = 4096;
  if (a.prefill > 0) {
    std::vector<int32_t> prompt(static_cast<size_t>(a.prefill));
    uint64_t h = a.seed;
    for (int32_t& t : prompt) {
      h = h * 6364136223846793005ull + 1442695040888963407ull;
      t = static_cast<int32_t>((h >> 33) % static_cast<uint64_t>(engine->config().vocab_size));
    }
    const auto timed = [&](const std::function<void()>& f) {
      engine->reset();
      const auto t0 = std::chrono::steady_clock::now();
      f();
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
          .count();
    };
    const auto batched = [&] { engine->prefill(prompt, nullptr); };
    const auto pairs = [&] {
      int32_t top[2];
      size_t i = 0;
      for (; i + 2 <= prompt.size(); i += 2) engine->verify2(prompt.data() + i, top);
      if (i < prompt.size()) engine->step(prompt[i], nullptr);
    };
    timed(batched);
    constexpr int kReps = 3;
    for (int r = 0; r < kReps; ++r) prefill_us += timed(batched) / kReps;
    if (a.prefill <= kPairsMax) {
      timed(pairs);
      pairs_us = timed(pairs);
    }
    if (a.mtp) {
      const auto mtp_batched = [&] { engine->prefill_with_mtp(prompt, -1); };
      const auto mtp_pairs = [&] {
        int32_t top[2];
        size_t i = 0;
        for (; i + 2 <= prompt.size(); i += 2) {
          engine->verify2(prompt.data() + i, top);
          engine->draft(0, prompt[i + 1]);
          if (i + 2 < prompt.size()) engine->draft(1, prompt[i + 2]);
        }
        if (i < prompt.size()) engine->step(prompt[i], nullptr);
      };
      timed(mtp_batched);
      for (int r = 0; r < kReps; ++r) mtp_prefill_us += timed(mtp_batched) / kReps;
      if (a.prefill <= kPairsMax) {
        timed(mtp_pairs);
        mtp_pairs_us = timed(mtp_pairs);
      }
    }
    if (a.score) {
      const size_t v = static_cast<size_t>(engine->config().vocab_size);
      std::vector<int32_t> targets(prompt.begin() + 1, prompt.end());
      targets.push_back(-1);
      std::vector<rt::TopLogits> tops(prompt.size());
      std::vector<float> picked(prompt.size()), rows(128 * v);
      std::vector<int32_t> top(128);
      double sink = 0;  // the host's sums, kept so that they are not optimized away
      const auto reduce = [&](const float* row) {
        const double mx = *std::max_element(row, row + v);
        double sum = 0;
        for (size_t j = 0; j < v; ++j) sum += std::exp(static_cast<double>(row[j]) - mx);
        sink += mx + std::log(sum);
      };
      const auto scored = [&] {
        engine->prefill_scored(prompt, targets, 1, tops.data(), picked.data());
      };
      const auto on_host = [&] {
        for (size_t i = 0; i < prompt.size(); i += 128) {
          const size_t n = std::min<size_t>(128, prompt.size() - i);
          engine->advance({prompt.data() + i, n}, top.data(), rows.data());
          for (size_t r = 0; r < n; ++r) reduce(rows.data() + r * v);
        }
      };
      timed(scored);
      for (int r = 0; r < kReps; ++r) score_us += timed(scored) / kReps;
      score_host_us = timed(on_host);
      if (a.mtp) {
        std::vector<int32_t> mtp_targets(prompt.begin() + 2, prompt.end());
        mtp_targets.push_back(-1);
        std::vector<rt::TopLogits> mtp_tops(prompt.size() - 1);
        std::vector<float> mtp_picked(prompt.size() - 1);
        const auto scored_mtp = [&] {
          engine->prefill_scored_with_mtp(prompt, -1, targets, mtp_targets, 1, tops.data(),
                                          picked.data(), mtp_tops.data(), mtp_picked.data());
        };
        const auto on_host_mtp = [&] {
          for (size_t i = 0; i < prompt.size(); i += 2) {
            const size_t n = std::min<size_t>(2, prompt.size() - i);
            engine->advance({prompt.data() + i, n}, top.data(), rows.data());
            for (size_t r = 0; r < n; ++r) {
              reduce(rows.data() + r * v);
              if (i + r + 1 < prompt.size()) {
                engine->draft(static_cast<int>(r), prompt[i + r + 1], rows.data() + 2 * v);
                reduce(rows.data() + 2 * v);
              }
            }
          }
        };
        timed(scored_mtp);
        for (int r = 0; r < kReps; ++r) score_mtp_us += timed(scored_mtp) / kReps;
        score_mtp_host_us = timed(on_host_mtp);
      }
      g_host_sums = sink;
    }
    engine->reset();
    prefill_shares = engine->profile_prefill(prompt);
  }
  const auto prefill_tps = [&](double t_us) { return t_us > 0 ? a.prefill * 1e6 / t_us : 0.0; };
  // A figure not measured (the pairs beyond kPairsMax tokens): null in --json.
  const auto or_null = [](double v) { return v > 0 ? nlohmann::json(v) : nlohmann::json(); };

  // Tokens per second when a fraction `kept` of the drafts is kept: a round is one MTP step and
  // a verify pass (each host-synced, as the loop calls them; plus the MTP head's entry for a kept
  // draft's position, or the rollback) for 1 + kept tokens. Sampled, the draft and the verify
  // bring their logits back, and a kept draft's next token is drawn on the host.
  const auto spec_tps = [&](double kept) {
    return (1 + kept) * 1e6 / (draft_then_verify_us + kept * entry_us + (1 - kept) * reject_us);
  };
  // Two drafts a round, each kept with probability `kept` (the second only after the first): a
  // round is an MTP step, a chained one with the rewind, a three-token verify, the entries of
  // the kept drafts, and the rollback of the two or the last one where not both are kept; it
  // yields 1 + kept + kept^2 tokens on average (greedy).
  const auto spec2_tps = [&](double kept) {
    const double draft_us = draft_then_verify_us - verify_us;  // host-synced, as the loop's
    return (1 + kept + kept * kept) * 1e6 /
           (draft_us + chain_us + verify3_us + kept * (1 - kept) * entry_us +
            kept * kept * entries2_us + (1 - kept) * reject3_2_us +
            kept * (1 - kept) * reject3_1_us);
  };
  const auto sampled_tps = [&](double kept) {
    return (1 + kept) * 1e6 /
           (sampled.verify_us + sampled.draft_us + kept * (entry_us + sampled.sample_us) +
            (1 - kept) * reject_us);
  };
  const auto top_tps = [&](double kept) {  // a draw from 20 candidates: no time worth counting
    return (1 + kept) * 1e6 /
           (sampled.top_verify_us + sampled.top_draft_us + kept * entry_us +
            (1 - kept) * reject_us);
  };

  if (a.json) {
    nlohmann::json j = {{"device", ls.device_name},
                        {"model", a.model.empty() ? synthetic_name(a) : a.model},
                        {"context", a.context},
                        {"kv_cache_dtype", rt::kv_cache_type_name(a.kv_cache)},
                        {"tensor_core_attention", !a.scalar_attention},
                        {"steps", a.steps},
                        {"step_us", us},
                        {"tokens_per_s", 1e6 / us},
                        {"bytes_per_step", step_bytes},
                        {"achieved_gbs", gbs},
                        {"copy_gbs", copy_gbs},
                        {"fraction_of_copy", efficiency},
                        {"projected_gb10_tokens_per_s", gb10_tps},
                        {"beyond_bytes_us", beyond_us},
                        {"projected_gb10_tokens_per_s_same_beyond", gb10_beyond_tps},
                        {"device_bytes", ls.device_bytes},
                        {"load_seconds", ls.load_seconds},
                        {"skipped", a.skip},
                        {"shared_in_experts", ls.shared_in_experts},
                        {"kernels", nlohmann::json::array()}};
    if (a.mtp) {
      j["mtp"] = {{"draft_vocab", a.mtp_vocab > 0 ? a.mtp_vocab : engine->config().vocab_size},
                  {"step_us", mtp_us},
                  {"bytes_per_step", mtp_bytes},
                  {"achieved_gbs", mtp_gbs},
                  {"fraction_of_copy", mtp_gbs / copy_gbs},
                  {"fraction_of_main_step", mtp_us / us}};
      j["speculative"] = {
          {"step_us_host_synced", sync_step_us},
          {"verify_us", verify_us},
          {"prefill_tokens_per_s_in_pairs", 2e6 / verify_us},
          {"reject_us", reject_us},
          {"mtp_entry_us", entry_us},
          {"draft_then_verify_us", draft_then_verify_us},
          {"tokens_per_s_at_kept",
           {{"0.5", spec_tps(0.5)}, {"0.7", spec_tps(0.7)}, {"0.9", spec_tps(0.9)}}},
          {"two_drafts",
           {{"verify3_us", verify3_us},
            {"reject_one_us", reject3_1_us},
            {"reject_two_us", reject3_2_us},
            {"chained_draft_and_rewind_us", chain_us},
            {"mtp_entries_two_us", entries2_us},
            {"tokens_per_s_at_kept",
             {{"0.5", spec2_tps(0.5)}, {"0.7", spec2_tps(0.7)}, {"0.9", spec2_tps(0.9)}}}}},
          {"sampled",
           {{"temperature", kBenchSampling.temperature},
            {"top_p", kBenchSampling.top_p},
            {"top_k", kBenchSampling.top_k},
            {"step_us", sampled.step_us},
            {"verify_us", sampled.verify_us},
            {"draft_us", sampled.draft_us},
            {"sample_us", sampled.sample_us},
            {"top_step_us", sampled.top_step_us},
            {"top_verify_us", sampled.top_verify_us},
            {"top_draft_us", sampled.top_draft_us},
            {"top_tok_s_if_kept",
             {{"0.5", top_tps(0.5)}, {"0.7", top_tps(0.7)}, {"0.9", top_tps(0.9)}}},
            {"tokens_per_s_at_kept",
             {{"0.5", sampled_tps(0.5)}, {"0.7", sampled_tps(0.7)}, {"0.9", sampled_tps(0.9)}}}}}};
    }
    if (a.prefill > 0) {
      j["prefill"] = {{"tokens", a.prefill},
                      {"tokens_per_pass", a.prefill_chunk},
                      {"batched_ms", prefill_us / 1e3},
                      {"batched_tokens_per_s", prefill_tps(prefill_us)},
                      {"pairs_ms", or_null(pairs_us / 1e3)},
                      {"pairs_tokens_per_s", or_null(prefill_tps(pairs_us))},
                      {"kernels", shares_json(prefill_shares)}};
      if (a.score) {
        j["prefill"]["scoring"] = {{"scored_ms", score_us / 1e3},
                                   {"scored_tokens_per_s", prefill_tps(score_us)},
                                   {"rows_to_host_ms", score_host_us / 1e3},
                                   {"rows_to_host_tokens_per_s", prefill_tps(score_host_us)}};
        if (a.mtp) {
          j["prefill"]["scoring"]["with_mtp"] = {
              {"scored_ms", score_mtp_us / 1e3},
              {"scored_tokens_per_s", prefill_tps(score_mtp_us)},
              {"rows_to_host_ms", score_mtp_host_us / 1e3},
              {"rows_to_host_tokens_per_s", prefill_tps(score_mtp_host_us)}};
        }
      }
      if (a.mtp) {
        j["prefill"]["with_mtp"] = {
            {"batched_ms", mtp_prefill_us / 1e3},
            {"batched_tokens_per_s", prefill_tps(mtp_prefill_us)},
            {"pairs_and_drafts_ms", or_null(mtp_pairs_us / 1e3)},
            {"pairs_and_drafts_tokens_per_s", or_null(prefill_tps(mtp_pairs_us))}};
      }
    }
    j["kernels"] = shares_json(shares);
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::printf("%s on %s: %s on the GPU",
              a.model.empty() ? synthetic_name(a).c_str() : a.model.c_str(), ls.device_name.c_str(),
              human_bytes(ls.device_bytes).c_str());
  if (!a.model.empty()) std::printf(" (loaded in %.1f s)", ls.load_seconds);
  std::printf(
      "\ndecode at context %lld (%s KV cache%s), %d graph-launched steps: %.1f us/step = %.1f "
      "tok/s\n",
      static_cast<long long>(a.context), rt::kv_cache_type_name(a.kv_cache),
      a.scalar_attention ? ", attention on the CUDA cores" : "", a.steps, us, 1e6 / us);
  std::printf("bytes per step %s -> %.0f GB/s; device copy %.0f GB/s (read + write): %.1f%%\n",
              human_bytes(step_bytes).c_str(), gbs, copy_gbs, 100 * efficiency);
  std::printf("projected on a GB10 (232 GB/s) at the same efficiency: %.1f tok/s\n", gb10_tps);
  std::printf(
      "  or %.1f tok/s if the %.0f us a step spends here beyond its bytes at the copy rate stayed "
      "the same there\n",
      gb10_beyond_tps, beyond_us);
  if (a.mtp) {
    const int64_t vocab = engine->config().vocab_size;
    const std::string drafts = a.mtp_vocab > 0 && a.mtp_vocab < vocab
                                   ? " (drafts from ids [0, " + std::to_string(a.mtp_vocab) + "))"
                                   : "";
    std::printf(
        "MTP head%s: %.1f us/step (%.1f%% of a main step), %s per step -> %.0f GB/s: %.1f%% of "
        "copy\n",
        drafts.c_str(), mtp_us, 100 * mtp_us / us, human_bytes(mtp_bytes).c_str(), mtp_gbs,
        100 * mtp_gbs / copy_gbs);
    std::printf(
        "speculative (host-synced calls): step %.1f us, two-token verify %.1f us (%.2f steps; "
        "prefill in such pairs %.1f tok/s), rollback %.1f us, a kept draft's MTP entry %.1f us\n"
        "  a greedy round's draft and verify: %.1f us\n",
        sync_step_us, verify_us, verify_us / sync_step_us, 2e6 / verify_us, reject_us, entry_us,
        draft_then_verify_us);
    std::printf(
        "  tok/s if 50%% / 70%% / 90%% of drafts are kept: %.1f / %.1f / %.1f (plain: %.1f; the "
        "fraction depends on the real weights)\n",
        spec_tps(0.5), spec_tps(0.7), spec_tps(0.9), 1e6 / sync_step_us);
    std::printf(
        "two drafts a round: three-token verify %.1f us (%.2f steps), rollback of one %.1f us, "
        "of two %.1f us, chained draft + rewind %.1f us, two MTP entries %.1f us\n"
        "  tok/s if 50%% / 70%% / 90%% of each draft is kept: %.1f / %.1f / %.1f (greedy)\n",
        verify3_us, verify3_us / sync_step_us, reject3_1_us, reject3_2_us, chain_us, entries2_us,
        spec2_tps(0.5), spec2_tps(0.7), spec2_tps(0.9));
    std::printf(
        "sampled (T %.1f, top-p %.2f, top-k %d; logits to the host sampler): step %.1f us, "
        "verify %.1f us, draft %.1f us, a draw %.1f us\n",
        kBenchSampling.temperature, kBenchSampling.top_p, kBenchSampling.top_k, sampled.step_us,
        sampled.verify_us, sampled.draft_us, sampled.sample_us);
    std::printf(
        "  tok/s if 50%% / 70%% / 90%% of drafts are kept: %.1f / %.1f / %.1f (plain: %.1f)\n",
        sampled_tps(0.5), sampled_tps(0.7), sampled_tps(0.9), 1e6 / sampled.step_us);
    std::printf(
        "  the top %d selected on the device (as generate and serve sample): step %.1f us = "
        "%.1f tok/s, verify %.1f us, draft %.1f us\n",
        kBenchSampling.top_k, sampled.top_step_us, 1e6 / sampled.top_step_us, sampled.top_verify_us,
        sampled.top_draft_us);
    std::printf("  tok/s if 50%% / 70%% / 90%% of drafts are kept: %.1f / %.1f / %.1f\n",
                top_tps(0.5), top_tps(0.7), top_tps(0.9));
  }
  if (a.prefill > 0) {
    std::printf("prefill of %d tokens (passes of %d): batched %.1f ms = %.1f tok/s", a.prefill,
                a.prefill_chunk, prefill_us / 1e3, prefill_tps(prefill_us));
    if (pairs_us > 0) {
      std::printf("; in pairs (verify2) %.1f ms = %.1f tok/s; batched %.2fx faster\n",
                  pairs_us / 1e3, prefill_tps(pairs_us), pairs_us / prefill_us);
    } else {
      std::printf(" (in pairs: not timed beyond %d tokens)\n", kPairsMax);
    }
    if (a.score) {
      std::printf(
          "  prompt scoring (eval-ppl: each row's normalizer, argmax and next token's logit): "
          "prefill_scored %.1f ms = %.1f tok/s; every row's logits to the host (advance, 128 "
          "tokens a call) %.1f ms = %.1f tok/s; %.2fx faster\n",
          score_us / 1e3, prefill_tps(score_us), score_host_us / 1e3, prefill_tps(score_host_us),
          score_host_us / score_us);
      if (a.mtp) {
        std::printf(
            "  with the MTP head's rows too (eval-ppl with its MTP figures): "
            "prefill_scored_with_mtp %.1f ms = %.1f tok/s; pairs and a draft a position, every "
            "row to the host %.1f ms = %.1f tok/s; %.2fx faster\n",
            score_mtp_us / 1e3, prefill_tps(score_mtp_us), score_mtp_host_us / 1e3,
            prefill_tps(score_mtp_host_us), score_mtp_host_us / score_mtp_us);
      }
    }
    if (a.mtp) {
      std::printf(
          "  with the MTP head's entries (speculative decoding's prompt): batched %.1f ms = %.1f "
          "tok/s",
          mtp_prefill_us / 1e3, prefill_tps(mtp_prefill_us));
      if (mtp_pairs_us > 0) {
        std::printf(
            "; in pairs with an MTP step a token %.1f ms = %.1f tok/s; batched %.2fx faster",
            mtp_pairs_us / 1e3, prefill_tps(mtp_pairs_us), mtp_pairs_us / mtp_prefill_us);
      }
      std::printf("\n");
    }
  }
  if (a.shared_in_experts) {
    std::printf("shared expert: %s\n", ls.shared_in_experts
                                           ? "extra slots of the routed experts' launches"
                                           : "its own launches (the formats do not allow slots)");
  }
  if (!a.skip.empty()) {
    std::string left_out;
    for (const std::string& n : a.skip) left_out += (left_out.empty() ? "" : ", ") + n;
    std::printf(
        "timing study: %s left out of every step (outputs wrong; bytes and %% above "
        "still count their weights)\n",
        left_out.c_str());
  }
  std::printf("\none step launched kernel by kernel");
  print_shares(shares);
  if (!prefill_shares.empty()) {
    std::printf("\none prefill pass of %d tokens launched kernel by kernel",
                std::min(a.prefill, a.prefill_chunk));
    print_shares(prefill_shares);
  }
  return kExitOk;
}

}  // namespace

Command add_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand("bench", "Decode speed and bandwidth of the CUDA engine");
  sub->add_option("--model", a->model, "model directory (any layout qforge reads)");
  sub->add_option("--synthetic", a->synthetic,
                  "random weights of a preset's shapes made on the GPU: tiny, 35b-a3b, "
                  "122b-a10b, 397b-a17b (hybrid formats: INT4, FP8 shared experts, INT8 head)");
  sub->add_option("--synthetic-format", a->synthetic_format,
                  "--synthetic's formats: hybrid (above), hybrid-int4-head (its LM head INT4, "
                  "quantize-lm-head --bits 4), int4 (Intel's AutoRound release: BF16 shared "
                  "experts and LM head) or bf16 (Qwen's BF16 release)")
      ->check(CLI::IsMember({"hybrid", "hybrid-int4-head", "int4", "bf16"}))
      ->capture_default_str();
  sub->add_option("--steps", a->steps, "timed decode steps")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--context", a->context,
                  "tokens in the context when timing (filled by steps; past 4096 by a batched "
                  "prefill)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  sub->add_option("--seed", a->seed, "--synthetic: value seed")->capture_default_str();
  sub->add_flag("--shared-in-experts", a->shared_in_experts,
                "run the shared expert as extra slots of the routed experts' two launches, not "
                "in launches of its own (to compare)");
  sub->add_flag("--mtp", a->mtp,
                "also time the MTP head's step (a draft token; --synthetic: BF16 but for the "
                "format's shared expert, as the 122B hybrid's) and speculative decoding's verify "
                "pass and "
                "rollback, greedy and sampled");
  add_mtp_vocab_option(sub, &a->mtp_vocab, "--mtp");
  sub->add_option("--prefill", a->prefill,
                  "also time a batched prefill of this many prompt tokens, and (up to 4096) the "
                  "same prompt in two-token passes (0: not timed)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  sub->add_flag("--score", a->score,
                "with --prefill: also time prompt scoring over the prompt (eval-ppl's "
                "CudaEngine::prefill_scored), and every row's logits to the host as before it");
  sub->add_option("--prefill-chunk", a->prefill_chunk, "tokens per batched prefill pass")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  sub->add_flag("--scalar-attention", a->scalar_attention,
                "attention on the CUDA cores, not the tensor cores (to compare): the batched "
                "prefill's (--prefill), and decode's with --kv-cache-dtype bfloat16 or fp8");
  add_kv_cache_option(sub, &a->kv_cache);
  sub->add_flag("--serial-shared", a->serial_shared,
                "run the shared expert after the routed experts, not beside them (to compare)");
  sub->add_flag("--unfused-swiglu", a->unfused_swiglu,
                "routed experts: gate|up product, then a separate SwiGLU launch (to compare)");
  sub->add_option("--out-parts", a->out_parts,
                  "K parts of the out / o projections, 1 to 8 (1: one part, to compare)")
      ->capture_default_str()
      ->check(CLI::Range(1, 8));
  sub->add_option("--skip", a->skip,
                  "timing study: leave these launches out of every step (the results are then "
                  "wrong); the time saved bounds what fusing them away could gain")
      ->delimiter(',')
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(rt::kSkippableLaunches),
                                                     std::end(rt::kSkippableLaunches))));
  sub->add_flag("--json", a->json, "machine-readable report on stdout");
  sub->footer(
      "Bytes per step count what the step reads and writes: every weight it uses (routed\n"
      "experts: the top-k of each layer), the DeltaNet states and the KV cache; an MTP step its\n"
      "fc, layer, KV cache and the LM head. Copy bandwidth is a device-to-device cudaMemcpy of\n"
      "1 GiB in the same run.\n\n"
      "Example:\n  qforge bench --synthetic 122b-a10b --context 1024");
  return {sub, [a] { return run(*a); }};
}

}  // namespace qf::tools
