// The CUDA engine against the CPU reference on the tiny preset's hybrids (hidden 256, so the
// paths Qwen3.5's shapes take: paired SwiGLU experts, the shared expert as expert slots, long
// prompts in large passes, prompt scoring with the MTP head, an INT4 LM head, bf16 and fp8 KV
// caches, a draft vocabulary, the rows' top k selected on the device). Skips with a message
// where no GPU is usable.
#include <gtest/gtest.h>

#include "cuda_golden_support.h"

namespace qf::rt {
namespace {

using namespace cuda_golden;

// The fixtures' hidden sizes (64, 96) are no multiple of 128, so their experts keep gemv +
// swiglu; the tiny preset (hidden 256, expert inter 128) in intel-int4 loads its routed experts
// in kern::gemv_swiglu's paired row order. Fused and unfused engines must give the same bits
// (the epilogue computes what gemv + swiglu do), and both equal the CPU reference.
TEST(CudaGoldenTiny, PairedSwigluExpertsEqualUnfusedAndTheCpuReference) {
  std::string why;
  if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  const fs::path dir = tmp / "tiny-int4";
  ASSERT_NO_FATAL_FAILURE(synth_tiny(dir, "intel-int4", 3));
  const std::unique_ptr<Model> model = Model::load(dir);
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int32_t> prompt = {1, 17, 300, 5, 42, 99, 7, 250};
  CudaOptions o;
  o.max_context = 64;
  CudaEngine fused(*model, o);
  o.fused_swiglu = false;
  CudaEngine unfused(*model, o);
  CpuEngine cpu(*model, 2);
  const std::vector<float> f = prompt_logits(fused, prompt, vocab),
                           u = prompt_logits(unfused, prompt, vocab),
                           c = prompt_logits(cpu, prompt, vocab);
  EXPECT_EQ(std::memcmp(f.data(), u.data(), f.size() * sizeof(float)), 0)
      << "fused and unfused SwiGLU differ";
  expect_same(c, f, vocab, 1e-4, "tiny int4 paired cuda vs cpu");
  // Batched prefill: INT4 projections and experts through kern::gemm (grouped by gemm_route).
  expect_same(c, prefill_logits(fused, prompt, vocab), vocab, 1e-4, "tiny int4 paired prefill");
  expect_same(c, prefill_logits(unfused, prompt, vocab), vocab, 1e-4, "tiny int4 unfused prefill");
  o.fused_swiglu = true;
  o.prefill_chunk = 3;
  CudaEngine chunked(*model, o);
  expect_same(c, prefill_logits(chunked, prompt, vocab), vocab, 1e-4,
              "tiny int4 paired prefill, passes of 3");
}

// The tiny preset as a hybrid (INT4 experts in the paired order, FP8 shared experts): the shared
// expert as extra slots of the routed experts' launches (kern::gemv_moe) must take effect and
// equal the CPU reference, as the engine with its own launches does.
TEST(CudaGoldenTiny, SharedExpertInTheExpertLaunchesEqualsTheCpuReference) {
  std::string why;
  if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  const fs::path src = tmp / "tiny-bf16";
  ASSERT_NO_FATAL_FAILURE(synth_tiny(src, "bf16", 5));
  const std::unique_ptr<Model> bf16 = Model::load(src);
  ASSERT_NO_FATAL_FAILURE(test::build_hybrid(QF_BIN, src, tmp.path(), bf16->config().vocab_size));
  const std::unique_ptr<Model> model = Model::load(tmp / "hybrid");
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int32_t> prompt = {1, 17, 300, 5, 42, 99, 7, 250, 3, 11};
  CudaOptions o;
  o.max_context = 64;
  o.shared_in_experts = true;
  CudaEngine slots(*model, o);
  EXPECT_TRUE(slots.load_stats().shared_in_experts);
  o.shared_in_experts = false;
  CudaEngine own(*model, o);
  EXPECT_FALSE(own.load_stats().shared_in_experts);
  CpuEngine cpu(*model, 2);
  const std::vector<float> s = prompt_logits(slots, prompt, vocab),
                           w = prompt_logits(own, prompt, vocab),
                           c = prompt_logits(cpu, prompt, vocab);
  expect_same(c, s, vocab, 1e-4, "tiny hybrid shared in experts vs cpu");
  expect_same(c, w, vocab, 1e-4, "tiny hybrid shared launches vs cpu");
  // Batched prefill: INT4 and the FP8 shared expert ([256 x 256], [256 x 128]: shapes gemm_fp8
  // takes) through kern::gemm, the BF16 router as gemv slots.
  expect_same(c, prefill_logits(own, prompt, vocab), vocab, 1e-4, "tiny hybrid prefill vs cpu");
}

// A 1300-token prompt through batched prefill in passes of 1024 (the most tokens a pass that
// qforge bench measured) and of the default size: every position's logits against the CPU
// reference, through a second, partial pass and past the first pass's attention window.
TEST(CudaGoldenTiny, LongPromptInLargePassesEqualsTheCpuReference) {
  std::string why;
  if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  std::unique_ptr<Model> model;
  ASSERT_NO_FATAL_FAILURE(tiny_hybrid(tmp.path(), 9, false, model));
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int32_t> prompt = spread_tokens(1300, vocab, 13);
  CpuEngine cpu(*model, 2);
  const std::vector<float> c = prompt_logits(cpu, prompt, vocab);
  for (const int chunk : {1024, 256}) {
    CudaOptions o;
    o.max_context = static_cast<int64_t>(prompt.size()) + 1;
    o.prefill_chunk = chunk;
    CudaEngine gpu(*model, o);
    expect_same(c, prefill_logits(gpu, prompt, vocab), vocab, 5e-4,
                "tiny hybrid, 1300 tokens in passes of " + std::to_string(chunk));
    expect_scored(*model, prompt, c, nullptr, chunk, 5e-4,
                  "tiny hybrid, 1300 tokens scored in passes of " + std::to_string(chunk));
  }
}

// Prompt scoring with the MTP head on the tiny hybrid, whose main layers' experts are paired
// (INT4, kern::gemm) and whose MTP layer's are not (BF16, GEMV slots), as at 122B-A10B: 300
// tokens in passes of 1024 and of 128, every main and MTP row against the CPU's.
TEST(CudaGoldenTiny, ScoredWithMtpOnTheHybridEqualsTheCpuReference) {
  std::string why;
  if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  std::unique_ptr<Model> model;
  ASSERT_NO_FATAL_FAILURE(tiny_hybrid(tmp.path(), 17, true, model));
  ASSERT_TRUE(model->mtp());
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int32_t> prompt = spread_tokens(300, vocab, 29);
  CpuEngine cpu(*model, 2);
  std::vector<float> c(prompt.size() * vocab), c_mtp((prompt.size() - 1) * vocab);
  for (size_t t = 0; t < prompt.size(); ++t) {
    cpu.step(prompt[t], c.data() + t * vocab);
    if (t + 1 < prompt.size()) {
      cpu.mtp_step(prompt[t + 1], cpu.hidden().data(), c_mtp.data() + t * vocab);
    }
  }
  for (const int chunk : {1024, 128}) {
    expect_scored(*model, prompt, c, &c_mtp, chunk, 5e-4,
                  "tiny hybrid + MTP, 300 tokens scored in passes of " + std::to_string(chunk));
  }
}

// The tiny hybrid with an INT4 LM head (quantize-lm-head --bits 4: GPTQ 4-bit, group 128, so
// the INT4 GEMV, the INT4 GEMM in prompt scoring and whole INT4 tiles for a draft vocabulary):
// every position of a 300-token prompt by steps and by batched prefill, the MTP head's logits
// (all ids, then a draft vocabulary), prompt scoring with the MTP rows, and 128 greedy tokens,
// plain and speculative, against the CPU reference.
TEST(CudaGoldenTiny, Int4LmHeadEqualsTheCpuReference) {
  std::string why;
  if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  std::unique_ptr<Model> model;
  ASSERT_NO_FATAL_FAILURE(tiny_hybrid(tmp.path(), 41, true, model, 4));
  ASSERT_TRUE(model->mtp());
  ASSERT_EQ(model->lm_head().format(), "int4");
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int32_t> prompt = spread_tokens(300, vocab, 43);
  const size_t t_len = prompt.size();
  CpuEngine cpu(*model, 2);
  CudaOptions o;
  o.max_context = static_cast<int64_t>(t_len) + kGreedy + 1;
  o.mtp = true;
  CudaEngine gpu(*model, o);
  std::vector<float> c(t_len * vocab), g(c.size()), c_mtp((t_len - 1) * vocab), g_mtp(c_mtp.size());
  for (size_t t = 0; t < t_len; ++t) {
    cpu.step(prompt[t], c.data() + t * vocab);
    gpu.step(prompt[t], g.data() + t * vocab);
    if (t + 1 == t_len) continue;
    cpu.mtp_step(prompt[t + 1], cpu.hidden().data(), c_mtp.data() + t * vocab);
    gpu.mtp_step(prompt[t + 1], nullptr, g_mtp.data() + t * vocab);
  }
  expect_same(c, g, vocab, 5e-4, "tiny hybrid, INT4 head: steps");
  expect_same(c_mtp, g_mtp, vocab, 5e-4, "tiny hybrid, INT4 head: mtp");
  expect_same(c, prefill_logits(gpu, prompt, vocab), vocab, 5e-4,
              "tiny hybrid, INT4 head: prefill");
  expect_scored(*model, prompt, c, &c_mtp, 1024, 5e-4, "tiny hybrid, INT4 head: scored");

  const std::vector<int32_t> want = expect_same_greedy(cpu, gpu, prompt, "INT4 head");
  GenerateOptions greedy;
  greedy.max_tokens = kGreedy;
  const GenerateResult spec = generate_speculative(
      speculative_engine(gpu), prompt, greedy, [](int32_t) {}, nullptr);
  EXPECT_EQ(spec.ids, want) << "INT4 head: speculative continuation";

  // A draft vocabulary: the head's first n rows, whole INT4 tiles.
  const int64_t n = vocab / 4 / kMtpVocabStep * kMtpVocabStep;
  ASSERT_GE(n, kMtpVocabStep);
  cpu.reset();
  cpu.set_mtp_vocab(n);
  CudaOptions ov = o;
  ov.mtp_vocab = n;
  CudaEngine gv(*model, ov);
  std::vector<float> cv(static_cast<size_t>(vocab)), gvl(cv.size()), c_head, g_head;
  for (size_t t = 0; t + 1 < 64; ++t) {
    cpu.step(prompt[t], nullptr);
    gv.step(prompt[t], nullptr);
    cpu.mtp_step(prompt[t + 1], cpu.hidden().data(), cv.data());
    gv.mtp_step(prompt[t + 1], nullptr, gvl.data());
    c_head.insert(c_head.end(), cv.begin(), cv.begin() + n);
    g_head.insert(g_head.end(), gvl.begin(), gvl.begin() + n);
  }
  expect_same(c_head, g_head, n, 5e-4, "tiny hybrid, INT4 head: MTP drafts from [0, n)");
}

// The tiny hybrid with its MTP head (head_dim 64: the split kernel).
void check_tiny_hybrid_caches(KvCacheType kv) {
  std::string why;
  if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  std::unique_ptr<Model> model;
  ASSERT_NO_FATAL_FAILURE(tiny_hybrid(tmp.path(), 23, true, model));
  ASSERT_TRUE(model->mtp());
  check_narrow_caches(*model, std::string("tiny hybrid, ") + kv_cache_type_name(kv) + " KV caches",
                      kv);
}
TEST(CudaGoldenTiny, Bf16KvCacheEqualsTheCpuReferenceWithBf16Caches) {
  check_tiny_hybrid_caches(KvCacheType::kBf16);
}
TEST(CudaGoldenTiny, Fp8KvCacheEqualsTheCpuReferenceWithFp8Caches) {
  check_tiny_hybrid_caches(KvCacheType::kFp8);
}

// A draft vocabulary (CudaOptions::mtp_vocab) on the tiny hybrid's INT8 LM head: the MTP head's
// logits over [0, n) against the CPU engine's with the same vocabulary, -inf past n on the
// device as on the host; speculative decoding, greedy and through the sampling path at top-k 1
// (the head's top 1 selected on the device, and its logits copied back), gives the greedy ids.
// Prompt scoring's MTP rows and draft vocabularies that are not whole multiples of 128 are
// refused.
TEST(CudaGoldenTiny, MtpDraftVocabularyEqualsTheCpuReference) {
  std::string why;
  if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  std::unique_ptr<Model> model;
  ASSERT_NO_FATAL_FAILURE(tiny_hybrid(tmp.path(), 31, true, model));
  ASSERT_TRUE(model->mtp());
  const int64_t vocab = model->config().vocab_size;
  const int64_t n = vocab / 4 / kMtpVocabStep * kMtpVocabStep;
  ASSERT_GE(n, kMtpVocabStep);
  const std::vector<int32_t> prompt = spread_tokens(120, vocab, 37);
  CpuEngine cpu(*model, 2);
  cpu.set_mtp_vocab(n);
  CudaOptions o;
  o.max_context = static_cast<int64_t>(prompt.size()) + kGreedy + 1;
  o.mtp = true;
  o.mtp_vocab = n;
  CudaEngine gpu(*model, o);
  const size_t t_len = prompt.size(), un = static_cast<size_t>(n);
  std::vector<float> c(static_cast<size_t>(vocab)), g(c.size());
  std::vector<float> c_head((t_len - 1) * un), g_head(c_head.size());
  for (size_t t = 0; t + 1 < t_len; ++t) {
    cpu.step(prompt[t], nullptr);
    gpu.step(prompt[t], nullptr);
    cpu.mtp_step(prompt[t + 1], cpu.hidden().data(), c.data());
    gpu.mtp_step(prompt[t + 1], nullptr, g.data());
    std::copy(c.begin(), c.begin() + n, c_head.begin() + static_cast<int64_t>(t * un));
    std::copy(g.begin(), g.begin() + n, g_head.begin() + static_cast<int64_t>(t * un));
    for (int64_t i = n; i < vocab; ++i) {
      ASSERT_EQ(g[i], -std::numeric_limits<float>::infinity()) << "position " << t << ", id " << i;
    }
  }
  expect_same(c_head, g_head, n, 5e-4,
              "tiny hybrid, MTP drafts from [0, " + std::to_string(n) + ")");

  GenerateOptions greedy;
  greedy.max_tokens = kGreedy;
  cpu.reset();
  const GenerateResult want = generate(cpu, prompt, greedy, [](int32_t) {});
  SpecStats st;
  const GenerateResult spec = generate_speculative(
      speculative_engine(gpu), prompt, greedy, [](int32_t) {}, &st);
  EXPECT_EQ(spec.ids, want.ids) << "speculative continuation, draft vocabulary";
  std::printf("tiny hybrid, drafts from [0, %lld): %lld of %lld drafts kept\n",
              static_cast<long long>(n), static_cast<long long>(st.accepted),
              static_cast<long long>(st.rounds));
  GenerateOptions top1 = greedy;
  top1.sampling = {.temperature = 0.8f, .top_k = 1, .seed = 3};
  for (const bool tops : {true, false}) {
    SpecEngine e = speculative_engine(gpu);
    if (!tops) e.verify_top = nullptr, e.draft_top = nullptr;
    const GenerateResult s1 = generate_speculative(
        e, prompt, top1, [](int32_t) {}, nullptr);
    EXPECT_EQ(s1.ids, want.ids) << "sampled at top-k 1, draft vocabulary"
                                << (tops ? ", top k on the device" : "");
  }

  gpu.reset();
  const std::vector<int32_t> targets(prompt.begin() + 1, prompt.end());
  std::vector<int32_t> full_targets = targets, mtp_targets(prompt.begin() + 2, prompt.end());
  full_targets.push_back(0);
  mtp_targets.push_back(-1);
  std::vector<TopLogits> tops(t_len), mtp_tops(t_len - 1);
  std::vector<float> picked(t_len), mtp_picked(t_len - 1);
  EXPECT_THROW(gpu.prefill_scored_with_mtp(prompt, -1, full_targets, mtp_targets, 1, tops.data(),
                                           picked.data(), mtp_tops.data(), mtp_picked.data()),
               Error);
  for (const int64_t bad : {n + 1, kMtpVocabStep / 2, vocab + kMtpVocabStep, -n}) {
    CudaOptions b = o;
    b.mtp_vocab = bad;
    EXPECT_THROW({ CudaEngine e(*model, b); }, Error) << bad;
  }
}

// CudaEngine::step_top (the row's top k selected on the device) against step's whole row: the
// same ids and logit bits, the normalizer within 1e-5, and generation that samples (Qwen3.5's
// defaults, top-k 128 with min-p, top-k 5 with logprobs) or reports greedy logprobs choosing the
// same ids from the top k as from the row, seed for seed.
TEST(CudaGoldenTiny, TopStepChoosesAsTheWholeRow) {
  std::string why;
  if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  const fs::path dir = tmp / "tiny-int4";
  ASSERT_NO_FATAL_FAILURE(synth_tiny(dir, "intel-int4", 13));
  const std::unique_ptr<Model> model = Model::load(dir);
  const int64_t vocab = model->config().vocab_size;
  CudaOptions o;
  o.max_context = 128;
  CudaEngine a(*model, o), b(*model, o);
  std::vector<float> row(static_cast<size_t>(vocab));
  TopLogits top;
  for (const int32_t token : {1, 17, 300, 5, 42}) {
    const int32_t want = a.step(token, row.data());
    EXPECT_EQ(b.step_top(token, 20, top), want);
    std::vector<int32_t> ids;
    top_k_ids(row, 20, ids);
    EXPECT_EQ(top.ids, ids);
    for (size_t j = 0; j < ids.size(); ++j) EXPECT_EQ(top.logits[j], row[ids[j]]) << j;
    const TokenLogprobs lp = token_logprobs(row, ids[0], 1);
    EXPECT_NEAR(static_cast<double>(top.logits[0]) - top.log_z, lp.logprob, 1e-5);
  }
  EXPECT_THROW(b.step_top(1, 0, top), Error);
  EXPECT_THROW(b.step_top(1, 129, top), Error);
  EXPECT_THROW(b.step_top(static_cast<int32_t>(vocab), 20, top), Error);
  struct Case {
    SamplingOptions s;
    int logprobs;
  };
  for (const Case& c : {Case{{.temperature = 0.6f, .top_p = 0.95f, .top_k = 20, .seed = 1}, -1},
                        Case{{.temperature = 1.0f, .top_k = 128, .seed = 2, .min_p = 0.02f}, -1},
                        Case{{.temperature = 1.2f, .top_k = 5, .seed = 3}, 5}, Case{{}, 3}}) {
    GenerateOptions g;
    g.max_tokens = 48;
    g.sampling = c.s;
    g.logprobs = c.logprobs;
    std::vector<TokenLogprobs> want_lp, got_lp;
    const std::vector<int32_t> prompt = {1, 17, 300, 5, 42, 99, 7, 250};
    a.reset();
    g.on_logprobs = [&](const TokenLogprobs& t) { want_lp.push_back(t); };
    const GenerateResult want = generate_with([&](int32_t t, float* l) { return a.step(t, l); },
                                              vocab, prompt, g, [](int32_t) {});
    b.reset();
    g.on_logprobs = [&](const TokenLogprobs& t) { got_lp.push_back(t); };
    const GenerateResult got = generate_with(
        [&](int32_t t, float* l) { return b.step(t, l); }, vocab, prompt, g, [](int32_t) {}, {}, 0,
        [&](int32_t t, int k, TopLogits& out) { return b.step_top(t, k, out); });
    EXPECT_EQ(got.ids, want.ids) << "top-k " << c.s.top_k;
    ASSERT_EQ(got_lp.size(), want_lp.size());
    for (size_t i = 0; i < got_lp.size(); ++i) {
      EXPECT_NEAR(got_lp[i].logprob, want_lp[i].logprob, 1e-5) << i;
      ASSERT_EQ(got_lp[i].top.size(), want_lp[i].top.size());
      for (size_t j = 0; j < got_lp[i].top.size(); ++j) {
        EXPECT_EQ(got_lp[i].top[j].first, want_lp[i].top[j].first);
      }
    }
  }
}

}  // namespace
}  // namespace qf::rt
