// The CUDA engine against the CPU reference (itself equal to transformers) on every fixture and
// its hybrid + INT8-head build: logits at every prompt position and the MTP head's (argmax
// identical, max |diff| <= 5e-4 x max |logit|; 1e-4 on the tiny preset), transformers' logits
// too (1e-3), and 128 greedy tokens identical, also by speculative decoding (two-token verify
// passes) and after a batched prefill, whose logits at every position are held to the same
// bounds, as are the MTP head's after its batched prefill (prefill_with_mtp) and prompt scoring's
// rows (prefill_scored). Skips with a message where no GPU is usable.
#include <gtest/gtest.h>

#include "cuda_golden_support.h"

namespace qf::rt {
namespace {

using namespace cuda_golden;

void check(const fs::path& model_dir, const fs::path& reference, const std::string& name) {
  const std::unique_ptr<Model> model = Model::load(model_dir);
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int32_t> prompt = prompt_of(reference);
  CudaOptions o;
  o.max_context = static_cast<int64_t>(prompt.size()) + kGreedy + 1;
  o.mtp = true;
  CudaEngine gpu(*model, o);
  ASSERT_EQ(gpu.has_mtp(), model->mtp().has_value()) << name;
  CpuEngine cpu(*model, 2);
  const size_t h = static_cast<size_t>(model->config().hidden_size), t_len = prompt.size();
  std::vector<float> g(t_len * vocab), c(t_len * vocab), gh(t_len * h);
  std::vector<float> g_mtp(gpu.has_mtp() ? (t_len - 1) * vocab : 0), c_mtp(g_mtp.size());
  // The MTP head right after each step, from the hidden state the step left on the device.
  for (size_t t = 0; t < t_len; ++t) {
    gpu.step(prompt[t], g.data() + t * vocab);
    cpu.step(prompt[t], c.data() + t * vocab);
    gpu.hidden(gh.data() + t * h);
    if (!gpu.has_mtp() || t + 1 == t_len) continue;
    gpu.mtp_step(prompt[t + 1], nullptr, g_mtp.data() + t * vocab);
    cpu.mtp_step(prompt[t + 1], cpu.hidden().data(), c_mtp.data() + t * vocab);
  }
  // Rounding differences, amplified over the prompt's recurrent steps: 3e-6 to 1.3e-4 on the
  // fixtures (H100); one INT4 code one step off moves logits by 9.3e-2 (rt_model_golden_test).
  expect_same(c, g, vocab, 5e-4, name + " cuda vs cpu");
  expect_same(logits_of(reference), g, vocab, 1e-3, name + " cuda vs transformers");
  if (gpu.has_mtp()) {
    expect_same(c_mtp, g_mtp, vocab, 5e-4, name + " mtp cuda vs cpu");
    const std::vector<float> want = logits_of(reference, "mtp_logits");
    ASSERT_EQ(want.size(), g_mtp.size()) << name << ": the reference's mtp_logits";
    expect_same(want, g_mtp, vocab, 1e-3, name + " mtp cuda vs transformers");
    // Again from the hidden states copied to the host, after a reset: the same bits.
    gpu.reset();
    std::vector<float> again(g_mtp.size());
    for (size_t t = 0; t + 1 < t_len; ++t) {
      gpu.step(prompt[t], nullptr);
      EXPECT_EQ(gpu.mtp_position(), static_cast<int64_t>(t));
      gpu.mtp_step(prompt[t + 1], gh.data() + t * h, again.data() + t * vocab);
    }
    EXPECT_EQ(std::memcmp(again.data(), g_mtp.data(), again.size() * sizeof(float)), 0)
        << name << ": mtp logits from host and device hidden states differ";
    expect_mtp_prefill(*model, prompt, g_mtp, name);
  }

  GenerateOptions greedy;
  greedy.max_tokens = kGreedy;
  const GenerateResult want = generate(cpu, prompt, greedy, [](int32_t) {});
  gpu.reset();
  const GenerateResult got =
      generate_with([&](int32_t token, float* logits) { return gpu.step(token, logits); }, vocab,
                    prompt, greedy, [](int32_t) {});
  EXPECT_EQ(got.ids, want.ids) << name << ": greedy continuations differ";
  expect_pairs_equal_steps(gpu, prompt, want.ids, name);
  expect_prefill(*model, gpu, prompt, c, g, want.ids, name);
  for (const int chunk : {1024, 3, 0}) {
    expect_scored(*model, prompt, c, nullptr, chunk, 5e-4,
                  name + " scored in passes of " + std::to_string(chunk));
    if (gpu.has_mtp()) {
      expect_scored(*model, prompt, c, &c_mtp, chunk, 5e-4,
                    name + " scored with MTP, passes of " + std::to_string(chunk));
    }
  }
  {  // An echoed prompt's logprobs (PrefixEngine::score: prefill_scored) against the CPU's rows
    GenerateOptions echo;
    echo.max_tokens = 8;
    echo.prompt_logprobs = 4;
    const PrefixEngine pe = prefix_engine(gpu);
    pe.reset();
    const GenerateResult e = generate_with(
        pe.step, vocab, prompt, echo, [](int32_t) {}, pe.prefill, 0, pe.top_step, pe.score);
    const std::vector<int32_t> first8(want.ids.begin(), want.ids.begin() + 8);
    EXPECT_EQ(e.ids, first8) << name << ": greedy after prompt logprobs";
    ASSERT_EQ(e.prompt_logprobs.size(), t_len - 1) << name;
    double worst = 0;
    for (size_t t = 0; t + 1 < t_len; ++t) {
      const TokenLogprobs want_lp = token_logprobs(
          std::span(c.data() + t * vocab, static_cast<size_t>(vocab)), prompt[t + 1], 4);
      const TokenLogprobs& lp = e.prompt_logprobs[t];
      EXPECT_EQ(lp.id, want_lp.id) << name;
      worst = std::max(worst, static_cast<double>(std::fabs(lp.logprob - want_lp.logprob)));
      ASSERT_EQ(lp.top.size(), 4u) << name;
      EXPECT_EQ(lp.top[0].first, want_lp.top[0].first) << name << " position " << t;
      for (size_t j = 0; j < 4; ++j) {
        worst = std::max(worst,
                         static_cast<double>(std::fabs(lp.top[j].second - want_lp.top[j].second)));
      }
    }
    EXPECT_LE(worst, 1e-3 * top_logit(c)) << name;
    std::printf("%-44s prompt logprobs max |diff| %.3g\n", name.c_str(), worst);
  }
  {  // without the MTP head, verify2 defers nothing and nothing can be rejected
    CudaOptions plain_o = o;
    plain_o.mtp = false;
    CudaEngine plain(*model, plain_o);
    expect_pairs_equal_steps(plain, prompt, want.ids, name + " (no MTP head)");
    int32_t top[2];
    plain.verify2(prompt.data(), top);
    EXPECT_THROW(plain.reject_last(), Error) << name;
    EXPECT_THROW(plain.advance(std::span(prompt.data(), 0), top, nullptr), Error) << name;
  }
  if (!gpu.has_mtp()) return;
  // Speculative decoding: the fixtures' random MTP heads draft (nearly all rejected: the rollback
  // path), then an oracle drafts the greedy tokens (all kept: the verify's second argmax).
  SpecStats st;
  const GenerateResult spec = generate_speculative(
      speculative_engine(gpu), prompt, greedy, [](int32_t) {}, &st);
  EXPECT_EQ(spec.ids, want.ids) << name << ": speculative continuation differs";
  std::printf("%-40s speculative: %lld rounds, %lld drafts kept\n", name.c_str(),
              static_cast<long long>(st.rounds), static_cast<long long>(st.accepted));
  SpecEngine oracle = speculative_engine(gpu);
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), want.ids.begin(), want.ids.end());
  size_t p = 0;
  test::use_oracle(oracle, seq, p, vocab);
  const GenerateResult kept = generate_speculative(
      oracle, prompt, greedy, [](int32_t) {}, &st);
  EXPECT_EQ(kept.ids, want.ids) << name << ": speculative continuation with kept drafts";
  EXPECT_EQ(st.accepted, st.rounds) << name;
  // Sampling at top-k 1 (every distribution one-hot): the greedy ids through the sampling path,
  // with the rows' top 1 selected on the device (verify2_top, draft_top) and with the verify's
  // and the head's logits copied back.
  GenerateOptions top1 = greedy;
  top1.sampling = {.temperature = 0.8f, .top_k = 1, .seed = 3};
  for (const bool tops : {true, false}) {
    SpecEngine e = speculative_engine(gpu);
    if (!tops) e.verify_top = nullptr, e.draft_top = nullptr;
    const GenerateResult s1 = generate_speculative(
        e, prompt, top1, [](int32_t) {}, nullptr);
    EXPECT_EQ(s1.ids, want.ids) << name << ": sampled speculative continuation at top-k 1"
                                << (tops ? ", top k on the device" : "");
    oracle = speculative_engine(gpu);
    test::use_oracle(oracle, seq, p, vocab);
    if (tops) {
      oracle.draft_top = [&](int row, int32_t next, int k, TopLogits& out) {
        std::vector<float> l(static_cast<size_t>(vocab));
        const int32_t id = oracle.draft(row, next, l.data());
        top_k_ids(l, k, out.ids);
        out.logits.assign(static_cast<size_t>(k), 0.0f);
        for (int j = 0; j < k; ++j) out.logits[j] = l[out.ids[j]];
        out.log_z = std::log(std::exp(1.0) + static_cast<double>(vocab - 1));
        return id;
      };
    } else {
      oracle.verify_top = nullptr, oracle.draft_top = nullptr;
    }
    const GenerateResult o1 = generate_speculative(
        oracle, prompt, top1, [](int32_t) {}, &st);
    EXPECT_EQ(o1.ids, want.ids) << name << ": sampled, with kept drafts";
    EXPECT_EQ(st.accepted, st.rounds) << name;
  }

  // Three tokens a pass (two drafts a round): the three steps' bits; a rollback of one or two
  // tokens, then steps, the bits of steps that never saw them; then the loop with the head's
  // drafts, the oracle's (all kept) and the oracle's with every third draft wrong (rounds that
  // keep one of two), greedy and sampled at top-k 1.
  {
    std::vector<float> three(3 * vocab), steps(3 * vocab), after(vocab), want_after(vocab);
    int32_t top3[3];
    gpu.reset();
    gpu.step(prompt[0], nullptr);
    gpu.verify(std::span(prompt.data() + 1, 3), top3, three.data());
    gpu.reset();
    gpu.step(prompt[0], nullptr);
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(gpu.step(prompt[1 + r], steps.data() + r * vocab), top3[r]) << name << " row " << r;
    }
    EXPECT_EQ(std::memcmp(three.data(), steps.data(), three.size() * sizeof(float)), 0)
        << name << ": a three-token verify's logits differ from three steps'";
    for (const int n : {1, 2}) {
      gpu.reset();
      gpu.step(prompt[0], nullptr);
      gpu.verify(std::span(prompt.data() + 1, 3), top3, nullptr);
      gpu.reject(n);
      EXPECT_EQ(gpu.position(), 4 - n) << name;
      gpu.step(prompt[4 - n], after.data());  // a token the rejected ones did not see
      gpu.step(prompt[5 - n], after.data());
      gpu.reset();
      for (int t = 0; t < 6 - n; ++t) gpu.step(prompt[t], want_after.data());
      EXPECT_EQ(std::memcmp(after.data(), want_after.data(), after.size() * sizeof(float)), 0)
          << name << ": steps after rejecting " << n << " of three tokens";
    }
    EXPECT_THROW(gpu.reject(1), Error) << name;
    gpu.verify(std::span(prompt.data(), 3), top3, nullptr);
    EXPECT_THROW(gpu.reject(3), Error) << name;
    EXPECT_THROW(gpu.verify(std::span(prompt.data(), 4), top3, nullptr), Error) << name;
    const GenerateResult s2 = generate_speculative(
        speculative_engine(gpu, 2), prompt, greedy, [](int32_t) {}, &st);
    EXPECT_EQ(s2.ids, want.ids) << name << ": two drafts a round";
    for (const int wrong_every : {0, 3}) {
      oracle = speculative_engine(gpu, 2);
      test::use_oracle(oracle, seq, p, vocab, wrong_every);
      const GenerateResult o2 = generate_speculative(
          oracle, prompt, greedy, [](int32_t) {}, &st);
      EXPECT_EQ(o2.ids, want.ids) << name << ": two drafts a round, oracle wrong every "
                                  << wrong_every;
      if (wrong_every == 0) {
        EXPECT_GE(st.accepted, st.drafted - 2) << name;
      } else {
        EXPECT_LT(st.accepted, st.drafted - 2) << name;
      }
      EXPECT_GT(st.accepted, 0) << name;
      oracle = speculative_engine(gpu, 2);
      test::use_oracle(oracle, seq, p, vocab, wrong_every);
      EXPECT_EQ(generate_speculative(
                    oracle, prompt, top1, [](int32_t) {}, nullptr)
                    .ids,
                want.ids)
          << name << ": sampled at top-k 1, two drafts a round, oracle wrong every " << wrong_every;
    }
    EXPECT_THROW(speculative_engine(gpu, 3), Error) << name;
  }

  gpu.reset();
  gpu.step(prompt[0], nullptr);  // a rollback is only for a verify's later tokens
  EXPECT_THROW(gpu.reject_last(), Error) << name;
}

// The logits of every prompt position, one engine stepping through the prompt.

class CudaGolden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  }
};

TEST_P(CudaGolden, Bf16ModelEqualsTheCpuReference) {
  check(kDir / GetParam() / "model", kDir / GetParam() / "reference.safetensors", GetParam());
}

TEST_P(CudaGolden, HybridEqualsTheCpuReference) {
  test::TempDir tmp;
  const fs::path src = kDir / GetParam() / "model";
  ASSERT_NO_FATAL_FAILURE(
      test::build_hybrid(QF_BIN, src, tmp.path(), Model::load(src)->config().vocab_size));
  check(tmp / "hybrid", kDir / GetParam() / "hybrid_reference.safetensors", GetParam() + " hybrid");
}

// The head_dim-256 fixture's hybrid build with bf16 KV caches: its decode steps run the
// tensor-core kernel (attention_decode_mma.cu), as Qwen3.5's shapes do. Not the hd-64 fixtures:
// they run the split kernel, which the tiny preset covers, and r4 amplifies the caches'
// single-ulp differences (attention_test: a k entry rounded either side of a midpoint) past the
// bound: its steps measured 1.1e-2 x max |logit| from the CPU's, whose own logits move 1.7e-2
// between bf16 and f32 caches (likely near-tied choices among its 16 experts; not traced).
void check_r2_hybrid_caches(KvCacheType kv) {
  std::string why;
  if (!CudaEngine::available(&why)) GTEST_SKIP() << why;
  test::TempDir tmp;
  const fs::path src = kDir / "r2-hd256-e8k3" / "model";
  ASSERT_NO_FATAL_FAILURE(
      test::build_hybrid(QF_BIN, src, tmp.path(), Model::load(src)->config().vocab_size));
  const std::unique_ptr<Model> model = Model::load(tmp / "hybrid");
  ASSERT_EQ(model->config().head_dim, 256);
  check_narrow_caches(
      *model, std::string("r2-hd256-e8k3 hybrid, ") + kv_cache_type_name(kv) + " KV caches", kv);
}
TEST(CudaGoldenR2, HybridWithBf16KvCachesEqualsTheCpuReference) {
  check_r2_hybrid_caches(KvCacheType::kBf16);
}
// The same with fp8 caches (the tensor-core decode's fp8 staging, the prefill's fp8 limbs).
TEST(CudaGoldenR2, HybridWithFp8KvCachesEqualsTheCpuReference) {
  check_r2_hybrid_caches(KvCacheType::kFp8);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGolden, ::testing::ValuesIn(test::model_fixtures()),
                         test::fixture_test_name);

}  // namespace
}  // namespace qf::rt
