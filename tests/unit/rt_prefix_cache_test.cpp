// PrefixCache (prefix_cache.h): where it snapshots and what it reuses, and, on the example model's
// CPU engine, generations through it bit-equal to fresh ones: the same ids greedy and sampled,
// plain and speculative, over a conversation whose turns extend each other, prompts that do not,
// and a repeat.
#include <gtest/gtest.h>

#include <algorithm>

#include "qf/error.h"
#include "qf/rt/model.h"
#include "qf/rt/prefix_cache.h"
#include "qf/rt/tokenizer.h"

namespace qf::rt {
namespace {

constexpr int32_t kB = 9;  // the boundary token in the plan tests

// Runs a prompt through the cache on an engine that computes nothing, so that it keeps a
// snapshot's tokens.
void keep(PrefixCache& c, const std::vector<int32_t>& prompt) {
  PrefixEngine e;
  e.vocab = 16;
  e.reset = e.snapshot = e.restore = [] {};
  e.step = [](int32_t, float*) { return 0; };
  GenerateOptions o;
  o.max_tokens = 0;
  c.generate(e, prompt, o, [](int32_t) {});
}

// The same through the speculative path.
void keep_speculative(PrefixCache& c, const std::vector<int32_t>& prompt) {
  SpecPrefixEngine e;
  e.snapshot = e.restore = e.spec.reset = [] {};
  e.spec.vocab = 16;
  e.spec.verify = [](std::span<const int32_t> t, int32_t* top, float*) {
    std::fill(top, top + t.size(), 0);
  };
  e.spec.reject = [](int) {};
  e.spec.draft = [](int, int32_t, float*) { return 0; };
  GenerateOptions o;
  o.max_tokens = 0;
  c.generate(e, prompt, o, [](int32_t) {});
}

TEST(PrefixCache, Plans) {
  PrefixCache c(kB);
  using V = std::vector<int32_t>;
  // Nothing kept: snapshot before the last boundary, else before the last token.
  EXPECT_EQ(c.plan(V{1, 2, kB, 3, kB, 4}).snapshot_at, 4u);
  EXPECT_EQ(c.plan(V{1, 2, 3}).snapshot_at, 2u);
  EXPECT_EQ(c.plan(V{kB, 1}).snapshot_at, 1u);  // a boundary at 0 leaves nothing to keep
  EXPECT_EQ(c.plan(V{5}).snapshot_at, 0u);      // one token: nothing to keep
  EXPECT_EQ(c.plan(V{1, 2, 3}).reuse, 0u);
  // With a snapshot kept: reused where it is a whole prefix with a token left to run; a repeat
  // of a prompt with a boundary keeps the snapshot there, one without moves it.
  keep(c, V{1, kB, 2, kB, 7});  // keeps {1, kB, 2}
  EXPECT_EQ(c.plan(V{1, kB, 2, 3}).reuse, 3u);
  EXPECT_EQ(c.plan(V{1, kB, 2, 3}).snapshot_at, 0u);
  EXPECT_EQ(c.plan(V{1, kB, 2, 5, kB, 4}).snapshot_at, 4u);
  EXPECT_EQ(c.plan(V{1, kB, 2}).reuse, 0u);  // nothing left to run
  EXPECT_EQ(c.plan(V{1, kB, 3, 4}).reuse, 0u);
  // A prompt that reuses nothing and keeps nothing (one token) still runs from position 0,
  // over the KV rows the snapshot relies on: it is forgotten.
  keep(c, V{5});
  EXPECT_EQ(c.plan(V{1, kB, 2, 3}).reuse, 0u);
  keep(c, V{1, 2, 3});  // keeps {1, 2}
  EXPECT_EQ(c.plan(V{1, 2, 3, 4}).reuse, 2u);
  EXPECT_EQ(c.plan(V{1, 2, 3, 4}).snapshot_at, 3u);
  keep(c, V{1, 2, 3});  // a repeat reuses 2 and keeps the snapshot as it is
  EXPECT_EQ(c.plan(V{1, 2, 3, 4}).reuse, 2u);
  // Speculative: the snapshot also depends on the token after it, which a prompt must repeat.
  keep_speculative(c, V{1, kB, 2, kB, 7});  // at 3, keeps {1, kB, 2, kB}
  EXPECT_EQ(c.plan(V{1, kB, 2, kB, 8}).reuse, 3u);
  EXPECT_EQ(c.plan(V{1, kB, 2, kB}).reuse, 3u);
  EXPECT_EQ(c.plan(V{1, kB, 2, 5, 8}).reuse, 0u);
  EXPECT_EQ(c.plan(V{1, kB, 2}).reuse, 0u);
  keep_speculative(c, V{1, 2, 3});  // at 2, keeps {1, 2, 3}: a repeat reuses 2
  EXPECT_EQ(c.plan(V{1, 2, 3}).reuse, 2u);
  EXPECT_EQ(c.plan(V{1, 2, 4}).reuse, 0u);
}

// The example model's engine behind the cache, and a fresh one for reference.
class PrefixCacheModel : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = std::string(QF_SOURCE_DIR) + "/models/tiny/model";
    model_ = Model::load(dir);
    tok_.emplace(Tokenizer::load(dir + "/tokenizer.json"));
    engine_ = std::make_unique<CpuEngine>(*model_, 2);
    fresh_ = std::make_unique<CpuEngine>(*model_, 2);
    pe_ = prefix_engine(*engine_);
  }
  // Runs the conversation below through a cache, plain or speculative, against fresh runs.
  void converse(bool speculative);

  std::unique_ptr<Model> model_;
  std::optional<Tokenizer> tok_;
  std::unique_ptr<CpuEngine> engine_, fresh_;
  PrefixEngine pe_;
};

void PrefixCacheModel::converse(bool speculative) {
  const SpecPrefixEngine spe =
      speculative ? speculative_prefix_engine(*engine_) : SpecPrefixEngine{};
  const int32_t im_start = *tok_->token_id("<|im_start|>");
  const std::string t1 = "<|im_start|>user\ndef add(a, b):<|im_end|>\n<|im_start|>assistant\n";
  const std::string t2 =
      "<|im_start|>user\ndef add(a, b):<|im_end|>\n<|im_start|>assistant\n"
      "return a + b<|im_end|>\n<|im_start|>user\nand sub?<|im_end|>\n"
      "<|im_start|>assistant\n";
  const std::string t3 =
      t2.substr(0, t2.size() - 22) + "import os<|im_end|>\n" + "<|im_start|>assistant\n";
  struct Turn {
    std::string text;
    bool expect_reuse;
  };
  // t2 extends t1 up to t1's last header, t3 extends t2 the same way, "import sys" extends
  // nothing kept, and its repeat reuses all but its last token.
  const std::vector<Turn> turns = {{t1, false},           {t2, true},           {t3, true},
                                   {"import sys", false}, {"import sys", true}, {t1, false}};
  // Greedy, sampled, and greedy with penalties (the repetition penalty takes in the whole
  // prompt, the reused part included).
  const std::vector<SamplingOptions> samplings = {
      {.top_k = 40, .seed = 5},
      {.temperature = 0.8f, .top_k = 40, .seed = 5},
      {.presence_penalty = 0.5f, .repetition_penalty = 1.5f}};
  for (const SamplingOptions& sampling : samplings) {
    PrefixCache cache(im_start);
    for (const Turn& turn : turns) {
      const std::vector<int32_t> prompt = tok_->encode(turn.text);
      GenerateOptions o;
      o.max_tokens = 12;
      o.sampling = sampling;
      const size_t expected = cache.plan(prompt).reuse;
      int64_t cached = -1;
      const auto none = [](int32_t) {};
      SpecStats got_st, want_st;  // the drafts kept: the MTP head's state shows in them
      const GenerateResult got = speculative
                                     ? cache.generate(spe, prompt, o, none, &cached, &got_st)
                                     : cache.generate(pe_, prompt, o, none, &cached);
      const GenerateResult want =
          speculative ? generate_speculative(speculative_engine(*fresh_), prompt, o, none, &want_st)
                      : generate(*fresh_, prompt, o, none);
      SCOPED_TRACE(turn.text + " at temperature " + std::to_string(sampling.temperature) +
                   ", repetition penalty " + std::to_string(sampling.repetition_penalty) +
                   (speculative ? ", speculative" : ""));
      EXPECT_EQ(got.ids, want.ids);
      EXPECT_EQ(got_st.rounds, want_st.rounds);
      EXPECT_EQ(got_st.accepted, want_st.accepted);
      EXPECT_EQ(got.finish_reason, want.finish_reason);
      EXPECT_EQ(got.prompt_tokens, static_cast<int64_t>(prompt.size()));
      EXPECT_EQ(got.cached_tokens, cached);
      EXPECT_EQ(static_cast<size_t>(cached), expected);
      // t3 puts other tokens where t2's snapshot took <|im_start|> as its next token: the MTP
      // head's last entry does not hold for it.
      EXPECT_EQ(cached > 0, turn.expect_reuse && !(speculative && turn.text == t3));
      if (turn.expect_reuse && turn.text == t2) {
        // Everything before t1's generation prompt: t1's tokens up to its last <|im_start|>.
        const std::vector<int32_t> p1 = tok_->encode(t1);
        const auto last = std::find(p1.rbegin(), p1.rend(), im_start);
        EXPECT_EQ(cached, static_cast<int64_t>(p1.rend() - last - 1));
      }
    }
  }
}

TEST_F(PrefixCacheModel, GenerationsEqualFreshOnesAndSkipTheSharedPrefix) {
  converse(false);
}

// With the MTP head: the snapshot carries its position and cache, so sampled drafts, and with
// them the ids, are those of a fresh run.
TEST_F(PrefixCacheModel, SpeculativeGenerationsEqualFreshOnes) {
  converse(true);
}

// A callback that throws after the snapshot leaves it usable; one on a failed request before it
// leaves the cache empty, and the next request starts afresh.
TEST_F(PrefixCacheModel, ExceptionsAndTheSnapshot) {
  PrefixCache cache(*tok_->token_id("<|im_start|>"));
  const std::vector<int32_t> p = tok_->encode("import os\nimport sys\n");
  GenerateOptions o;
  o.max_tokens = 8;
  struct Stop {};
  EXPECT_THROW(cache.generate(pe_, p, o, [](int32_t) { throw Stop{}; }), Stop);
  std::vector<int32_t> longer = p;
  longer.push_back(p.back());
  EXPECT_EQ(cache.plan(longer).reuse, p.size() - 1);
  const GenerateResult want = generate(*fresh_, longer, o, [](int32_t) {});
  EXPECT_EQ(cache.generate(pe_, longer, o, [](int32_t) {}).ids, want.ids);
  // The engine fails while a prompt that reuses nothing runs, before its snapshot: nothing is
  // kept afterwards.
  const StepFn good = pe_.step;
  pe_.step = [](int32_t, float*) -> int32_t { throw Error(Errc::kIo, "engine failure"); };
  EXPECT_THROW(cache.generate(pe_, tok_->encode("x = 1\ny = 2\n"), o, [](int32_t) {}), Error);
  EXPECT_EQ(cache.plan(longer).reuse, 0u);
  pe_.step = good;
  EXPECT_EQ(cache.generate(pe_, longer, o, [](int32_t) {}).ids, want.ids);
}

}  // namespace
}  // namespace qf::rt
