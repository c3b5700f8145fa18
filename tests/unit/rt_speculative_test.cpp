// The speculative decoding loop (speculative.h) over a toy engine whose argmax is a fixed
// function of the tokens consumed so far: the ids must equal the plain greedy loop's
// (generate_with) for any pattern of right and wrong drafts, one to four a round, stop ids and
// limits included, and the MTP head must see every position in order with the hidden state and
// the token the architecture gives it (position t: the main model's state at t, the token at
// t + 1); chained drafts take its own output and the draft before, and their entries are made
// again from the main model's states before any later position reads them.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "qf/error.h"
#include "qf/rt/logits.h"
#include "qf/rt/sampler.h"
#include "qf/rt/speculative.h"
#include "top_logits.h"

namespace qf::rt {
namespace {

constexpr int32_t kVocab = 23;

// The argmax after consuming seq[0..n).
int32_t next_of(const std::vector<int32_t>& seq, size_t n) {
  const int32_t a = seq[n - 1], b = n >= 2 ? seq[n - 2] : 5;
  return static_cast<int32_t>((7 * a + 3 * b + static_cast<int32_t>(n)) % kVocab);
}

struct Toy {
  std::vector<int32_t> seq;        // consumed by the main model
  std::vector<size_t> rows;        // positions of the last verify's tokens
  std::vector<int32_t> reference;  // prompt, then plain greedy far enough
  int64_t mtp_pos = 0, mtp_calls = 0, max_verify = 0;
  int wrong_every = 0;   // every n-th MTP call drafts a wrong token (0: never)
  bool batched = false;  // the prompt through SpecEngine::prefill
  int drafts = 1;        // SpecEngine::drafts
  bool entries = false;  // SpecEngine::mtp_entries for the kept drafts' positions
  int64_t prefill_calls = 0;
  std::vector<bool> own;  // each MTP entry: made from the head's own output (a chained draft)
  int32_t last_draft = -1;

  int32_t drafted(size_t p) {
    const bool wrong = wrong_every > 0 && ++mtp_calls % wrong_every == 0;
    return last_draft = (reference.at(p + 2) + (wrong ? 1 : 0)) % kVocab;
  }
  SpecEngine engine() {
    SpecEngine e;
    e.vocab = kVocab;
    e.drafts = drafts;
    e.verify = [this](std::span<const int32_t> tokens, int32_t* top, float*) {
      max_verify = std::max<int64_t>(max_verify, static_cast<int64_t>(tokens.size()));
      EXPECT_LE(static_cast<int>(tokens.size()), std::max(2, drafts + 1));
      rows.clear();
      for (size_t i = 0; i < tokens.size(); ++i) {
        seq.push_back(tokens[i]);
        rows.push_back(seq.size() - 1);
        top[i] = next_of(seq, seq.size());
      }
    };
    e.reject = [this](int n) {
      EXPECT_GE(n, 1);
      EXPECT_LT(static_cast<size_t>(n), rows.size());
      seq.resize(seq.size() - static_cast<size_t>(n));
    };
    // The head's entry at row `row`'s position, from the main model's state there.
    const auto entry = [this](int row, int32_t next_token) {
      const size_t p = rows.at(static_cast<size_t>(row));
      EXPECT_EQ(static_cast<int64_t>(p), mtp_pos) << "the MTP head skipped or repeated a position";
      EXPECT_EQ(next_token, reference.at(p + 1)) << "MTP position " << p;
      own.resize(std::max(own.size(), p + 1));
      EXPECT_EQ(std::count(own.begin(), own.begin() + static_cast<int64_t>(p), true), 0)
          << "MTP position " << p << " reads an entry made from the head's own output";
      own[p] = false;
      ++mtp_pos;
      return p;
    };
    e.draft = [this, entry](int row, int32_t next_token, float*) {
      return drafted(entry(row, next_token));
    };
    if (entries) {
      e.mtp_entries = [entry](int first, std::span<const int32_t> tokens) {
        for (size_t i = 0; i < tokens.size(); ++i) entry(first + static_cast<int>(i), tokens[i]);
      };
    }
    e.draft_chain = [this](int32_t next_token, float*) {
      EXPECT_GT(drafts, 1);
      EXPECT_EQ(next_token, last_draft) << "a chained draft follows the draft before it";
      const size_t p = static_cast<size_t>(mtp_pos++);
      own.resize(std::max(own.size(), p + 1));
      own[p] = true;
      return drafted(p);
    };
    e.mtp_rewind = [this](int n) {
      EXPECT_GE(n, 0);
      EXPECT_LE(n, mtp_pos);
      mtp_pos -= n;
      own.resize(std::min(own.size(), static_cast<size_t>(mtp_pos)));
    };
    if (!batched) return e;
    e.prefill = [this](std::span<const int32_t> tokens, int32_t next, float*) {
      ++prefill_calls;
      for (size_t i = 0; i < tokens.size(); ++i) {
        seq.push_back(tokens[i]);
        const int32_t after = i + 1 < tokens.size() ? tokens[i + 1] : next;
        if (after < 0) continue;
        const int64_t p = static_cast<int64_t>(seq.size()) - 1;
        EXPECT_EQ(p, mtp_pos) << "the MTP head skipped or repeated a position";
        EXPECT_EQ(after, reference.at(static_cast<size_t>(p) + 1)) << "MTP position " << p;
        ++mtp_pos;
      }
      rows = {seq.size() - 1};
      return next_of(seq, seq.size());
    };
    return e;
  }
};

GenerateResult plain(const std::vector<int32_t>& prompt, const GenerateOptions& o,
                     std::vector<int32_t>* reference) {
  std::vector<int32_t> seq;
  const StepFn step = [&](int32_t token, float*) {
    seq.push_back(token);
    return next_of(seq, seq.size());
  };
  GenerateResult r = generate_with(step, kVocab, prompt, o, [](int32_t) {});
  *reference = prompt;  // extended past the limit without stop ids: the drafts look ahead
  while (reference->size() < prompt.size() + static_cast<size_t>(o.max_tokens) + 4) {
    reference->push_back(next_of(*reference, reference->size()));
  }
  return r;
}

void expect_same(const std::vector<int32_t>& prompt, const GenerateOptions& o, int wrong_every,
                 bool batched, int drafts, bool entries) {
  Toy toy;
  toy.wrong_every = wrong_every;
  toy.batched = batched;
  toy.drafts = drafts;
  toy.entries = entries;
  const GenerateResult want = plain(prompt, o, &toy.reference);
  std::vector<int32_t> streamed;
  SpecStats st;
  const GenerateResult got = generate_speculative(
      toy.engine(), prompt, o, [&](int32_t id) { streamed.push_back(id); }, &st);
  const std::string what = "max_tokens " + std::to_string(o.max_tokens) + ", wrong_every " +
                           std::to_string(wrong_every) + (batched ? ", prefill" : "") +
                           ", drafts " + std::to_string(drafts) + (entries ? ", entries" : "");
  EXPECT_EQ(toy.prefill_calls, batched ? 1 : 0) << what;
  EXPECT_EQ(got.ids, want.ids) << what;
  EXPECT_EQ(streamed, want.ids) << what;
  EXPECT_EQ(got.finish_reason, want.finish_reason) << what;
  EXPECT_EQ(got.prompt_tokens, static_cast<int64_t>(prompt.size()));
  if (!want.ids.empty() && o.max_tokens > 1) {  // a round ran
    EXPECT_EQ(toy.max_verify, drafts + 1) << what;
  }
  // One MTP step per prompt token after the first, `drafts` per round and one per kept draft
  // (but after the last round, if generation ended inside it); the head's position is then
  // that of the main model's last token, less the rounds' last chained entries.
  EXPECT_EQ(st.drafted, st.rounds * drafts) << what;
  const int64_t base = static_cast<int64_t>(prompt.size()) - 1 + st.drafted;
  EXPECT_GE(st.mtp_steps, base + st.accepted - drafts) << what;
  EXPECT_LE(st.mtp_steps, base + st.accepted) << what;
  if (wrong_every == 1) {
    EXPECT_EQ(st.accepted, 0) << what;
  }
  if (wrong_every == 0 && o.stop_ids.empty() && o.max_tokens >= 5) {
    EXPECT_GT(st.accepted, 0) << what;
    EXPECT_LE(st.rounds, (o.max_tokens - 1 + drafts) / (drafts + 1)) << what;
  }
}

void expect_same(const std::vector<int32_t>& prompt, const GenerateOptions& o, int wrong_every) {
  for (const int drafts : {1, 2, 3, 4}) {
    for (const bool batched : {false, true}) {
      for (const bool entries : {false, true}) {
        expect_same(prompt, o, wrong_every, batched, drafts, entries);
      }
    }
  }
}

TEST(Speculative, EqualsGreedyForAnyDrafts) {
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  for (const int wrong_every : {0, 1, 2, 3, 7}) {
    for (const int64_t max_tokens : {0, 1, 2, 3, 8, 9, 40}) {
      GenerateOptions o;
      o.max_tokens = max_tokens;
      expect_same(prompt, o, wrong_every);
    }
  }
}

// From a state the prefix cache restored (`done` tokens in, the MTP head at `done`) and with a
// snapshot: the snapshot sees the engine at snapshot_at, both heads, and the ids equal greedy's.
TEST(Speculative, GoesOnFromDoneAndStopsForTheSnapshot) {
  const std::vector<int32_t> prompt = {3, 9, 14, 1, 7, 22, 8};
  GenerateOptions o;
  o.max_tokens = 9;
  for (const bool batched : {false, true}) {
    for (const size_t done : {0u, 2u, 3u}) {
      for (size_t at = done + 1; at < prompt.size(); ++at) {
        Toy toy;
        toy.batched = batched;
        const GenerateResult want = plain(prompt, o, &toy.reference);
        toy.seq.assign(prompt.begin(), prompt.begin() + static_cast<int64_t>(done));
        toy.mtp_pos = static_cast<int64_t>(done);
        int snapshots = 0;
        SpecPrefill pf;
        pf.done = done;
        pf.snapshot_at = at;
        pf.snapshot = [&] {
          ++snapshots;
          EXPECT_EQ(toy.seq.size(), at);
          EXPECT_EQ(toy.mtp_pos, static_cast<int64_t>(at));
        };
        SpecStats st;
        const GenerateResult got = generate_speculative(
            toy.engine(), prompt, o, [](int32_t) {}, &st, pf);
        const std::string what = "done " + std::to_string(done) + ", snapshot at " +
                                 std::to_string(at) + (batched ? ", prefill" : "");
        EXPECT_EQ(got.ids, want.ids) << what;
        EXPECT_EQ(snapshots, 1) << what;
        EXPECT_EQ(toy.prefill_calls, batched ? 2 : 0) << what;
      }
    }
  }
}

TEST(Speculative, OneTokenPrompt) {
  GenerateOptions o;
  o.max_tokens = 17;
  for (const int wrong_every : {0, 2}) expect_same({11}, o, wrong_every);
}

// A stop id ends generation whether it is the first token, a kept draft or the token after one.
TEST(Speculative, StopsWhereGreedyStops) {
  const std::vector<int32_t> prompt = {2, 7, 1, 8};
  std::vector<int32_t> reference;
  GenerateOptions o;
  o.max_tokens = 30;
  plain(prompt, o, &reference);
  for (size_t i = prompt.size(); i < prompt.size() + 12; ++i) {
    o.stop_ids = {reference[i]};
    for (const int wrong_every : {0, 1, 3}) expect_same(prompt, o, wrong_every);
  }
}

TEST(Speculative, RefusesEmptyPromptsAndBadSampling) {
  Toy toy;
  GenerateOptions o;
  EXPECT_THROW(generate_speculative(
                   toy.engine(), {}, o, [](int32_t) {}, nullptr),
               Error);
  o.sampling.top_p = 0;
  const std::vector<int32_t> prompt = {1, 2};
  EXPECT_THROW(generate_speculative(
                   toy.engine(), prompt, o, [](int32_t) {}, nullptr),
               Error);
}

// Sampling. A toy of 4 tokens whose main model's and MTP head's logits are fixed, different
// functions of the tokens before, computed from scratch at every call from what the loop fed
// it. Over many seeds, the first three generated tokens must follow plain sampling's joint
// distribution, the product of the main model's probabilities (softmax at the temperature over
// the top k, computed here from the definition), within a chi-square bound.
constexpr int kSmall = 4;

std::array<float, kSmall> main_logits(const std::vector<int32_t>& ctx) {
  const int32_t a = ctx.back(), b = ctx.size() >= 2 ? ctx[ctx.size() - 2] : 0;
  std::array<float, kSmall> l{};
  for (int v = 0; v < kSmall; ++v) {
    l[v] = 0.9f * static_cast<float>((3 * a + 5 * b + 7 * v + static_cast<int>(ctx.size())) % 5) -
           0.5f * static_cast<float>(v == a);
  }
  return l;
}

// What the MTP head predicts for the token after `ctx`'s next one, from ctx (its last token the
// next one): unlike the main model's, often far off.
std::array<float, kSmall> mtp_logits(const std::vector<int32_t>& ctx) {
  const int32_t a = ctx.back();
  std::array<float, kSmall> l{};
  for (int v = 0; v < kSmall; ++v) l[v] = 1.3f * static_cast<float>((2 * a + 3 * v) % 4);
  return l;
}

struct SampledToy {
  std::vector<int32_t> seq;
  std::vector<size_t> rows;
  int draft_vocab = kSmall;  // the head's logits past it are -inf (mtp_vocab.h)
  int drafts = 1;
  std::vector<int32_t> chain;  // what the head's last draft saw: its context, then the drafts

  std::array<float, kSmall> head(float* logits) const {
    auto l = mtp_logits(chain);
    std::fill(l.begin() + draft_vocab, l.end(), -std::numeric_limits<float>::infinity());
    if (logits) std::copy(l.begin(), l.end(), logits);
    return l;
  }
  SpecEngine engine() {
    SpecEngine e;
    e.vocab = kSmall;
    e.drafts = drafts;
    e.verify = [this](std::span<const int32_t> tokens, int32_t* top, float* logits) {
      rows.clear();
      for (size_t i = 0; i < tokens.size(); ++i) {
        seq.push_back(tokens[i]);
        rows.push_back(seq.size() - 1);
        const auto l = main_logits(seq);
        top[i] = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
        if (logits) std::copy(l.begin(), l.end(), logits + i * kSmall);
      }
    };
    e.reject = [this](int n) { seq.resize(seq.size() - static_cast<size_t>(n)); };
    e.draft = [this](int row, int32_t next_token, float* logits) {
      chain.assign(seq.begin(), seq.begin() + rows.at(row) + 1);
      chain.push_back(next_token);
      const auto l = head(logits);
      return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    };
    e.draft_chain = [this](int32_t next_token, float* logits) {
      chain.push_back(next_token);
      const auto l = head(logits);
      return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    };
    e.mtp_rewind = [](int) {};
    return e;
  }
};

// softmax(l / t) over the k largest (k = 0: all), by definition.
std::array<double, kSmall> reference_probs(const std::array<float, kSmall>& l, float t, int k) {
  std::array<int, kSmall> order{};
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  std::array<double, kSmall> p{};
  double z = 0;
  for (int i = 0; i < (k > 0 ? k : kSmall); ++i) z += p[order[i]] = std::exp(l[order[i]] / t);
  for (double& x : p) x /= z;
  return p;
}

// The penalties by their definition (vLLM's): repetition over the prompt and the generated
// ids, then frequency and presence over the generated ones.
std::array<float, kSmall> penalized(std::array<float, kSmall> l, const std::vector<int32_t>& prompt,
                                    const std::vector<int32_t>& generated,
                                    const SamplingOptions& o) {
  for (int v = 0; v < kSmall; ++v) {
    const auto n = std::count(generated.begin(), generated.end(), v);
    if (n > 0 || std::count(prompt.begin(), prompt.end(), v) > 0) {
      l[v] = l[v] > 0 ? l[v] / o.repetition_penalty : l[v] * o.repetition_penalty;
    }
    l[v] -= o.frequency_penalty * static_cast<float>(n) + (n > 0 ? o.presence_penalty : 0.0f);
  }
  return l;
}

// Ids 0 and 1 may not come at even positions of the output (0, 2, ...): with a draft
// vocabulary of 2 ids, the draft for such a position has nothing left to draw from.
struct NoLowIdsAtEven : TokenConstraint {
  static bool allowed(size_t at, int32_t id) { return at % 2 == 1 || id >= 2; }
  void accept(int32_t) override { ++at; }
  bool allows(int32_t id) const override { return allowed(at, id); }
  void mask(std::span<float> row) const override {
    for (size_t id = 0; id < row.size(); ++id) {
      if (!allows(static_cast<int32_t>(id))) row[id] = -std::numeric_limits<float>::infinity();
    }
  }
  size_t at = 0;
};

// Over many seeds, speculative sampling's first three ids against plain sampling's joint
// distribution; `draft_vocab` and `constrained` (NoLowIdsAtEven) as the loop's options.
void expect_plain_distribution(const SamplingOptions& sampling, int draft_vocab = kSmall,
                               bool constrained = false, int drafts = 1) {
  const float temperature = sampling.temperature;
  const int top_k = sampling.top_k;
  const std::vector<int32_t> prompt = {2, 1};
  constexpr int kRuns = 40000, kLen = 3, kCells = kSmall * kSmall * kSmall;
  std::array<double, kCells> want{};
  for (int c = 0; c < kCells; ++c) {
    std::vector<int32_t> ctx = prompt, generated;
    double prob = 1;
    for (int i = 0, rest = c; i < kLen; ++i, rest /= kSmall) {
      auto l = penalized(main_logits(ctx), prompt, generated, sampling);
      for (int v = 0; v < kSmall && constrained; ++v) {
        if (!NoLowIdsAtEven::allowed(static_cast<size_t>(i), v)) {
          l[v] = -std::numeric_limits<float>::infinity();
        }
      }
      prob *= reference_probs(l, temperature, top_k)[rest % kSmall];
      ctx.push_back(rest % kSmall);
      generated.push_back(rest % kSmall);
    }
    want[c] = prob;
  }
  std::array<int, kCells> seen{};
  int64_t rounds = 0, kept = 0, verified = 0;
  for (int run = 0; run < kRuns; ++run) {
    GenerateOptions o;
    o.max_tokens = kLen;
    o.sampling = sampling;
    o.sampling.seed = static_cast<uint64_t>(run);
    if (constrained) o.constraint = std::make_shared<NoLowIdsAtEven>();
    SampledToy toy;
    toy.draft_vocab = draft_vocab;
    toy.drafts = drafts;
    SpecStats st;
    const GenerateResult r = generate_speculative(
        toy.engine(), prompt, o, [](int32_t) {}, &st);
    ASSERT_EQ(r.ids.size(), static_cast<size_t>(kLen));
    ++seen[r.ids[0] + kSmall * r.ids[1] + kSmall * kSmall * r.ids[2]];
    rounds += st.rounds, kept += st.accepted, verified += st.drafted;
  }
  double chi2 = 0;
  int cells = 0;
  for (int c = 0; c < kCells; ++c) {
    const double e = want[c] * kRuns;
    if (e == 0) {
      EXPECT_EQ(seen[c], 0) << "cell " << c << " has probability 0";
      continue;
    }
    chi2 += (seen[c] - e) * (seen[c] - e) / e;
    ++cells;
  }
  // 2 * cells + 40 is past chi-square's 1e-6 tail at cells - 1 degrees of freedom (63: 132,
  // 7: 42, by the Wilson-Hilferty approximation).
  EXPECT_LT(chi2, 2.0 * cells + 40)
      << "T " << temperature << ", top-k " << top_k << ": " << cells << " cells";
  // Both paths ran: drafts kept and drafts replaced (fewer kept from a draft vocabulary: 5-7%).
  EXPECT_GT(kept, verified / (draft_vocab < kSmall ? 40 : 10) / drafts);
  EXPECT_LT(kept, verified * 9 / 10);
  EXPECT_EQ(verified, rounds * drafts);
  std::printf(
      "T %.1f top-k %d, penalties %.2f %.2f %.2f, draft vocabulary %d%s, %d draft%s a round: "
      "chi-square %.1f over %d cells, %lld of %lld drafts kept\n",
      temperature, top_k, sampling.presence_penalty, sampling.frequency_penalty,
      sampling.repetition_penalty, draft_vocab, constrained ? ", constrained" : "", drafts,
      drafts > 1 ? "s" : "", chi2, cells, static_cast<long long>(kept),
      static_cast<long long>(verified));
}

TEST(Speculative, SamplingFollowsPlainSamplingsDistribution) {
  expect_plain_distribution({.temperature = 0.8f});
  expect_plain_distribution({.temperature = 1.5f, .top_k = 2});
}

// With penalties the distribution of each token depends on the ids before it: the verify's
// second row must be processed with the accepted draft counted, the draft's with `next`.
TEST(Speculative, SamplingWithPenaltiesFollowsPlainSamplingsDistribution) {
  expect_plain_distribution(
      {.temperature = 1.0f, .presence_penalty = 0.7f, .frequency_penalty = 0.4f});
  expect_plain_distribution({.temperature = 0.8f, .top_k = 3, .repetition_penalty = 1.6f});
}

// Two and three drafts a round: the later drafts from the head's own chain, unprocessed, each
// resolved against the verify's row after the drafts before it (with penalties, counted), so
// the three ids of a round come from one verify.
TEST(Speculative, SamplingWithChainedDraftsFollowsPlainSamplingsDistribution) {
  for (const int drafts : {2, 3}) {
    expect_plain_distribution({.temperature = 0.8f}, kSmall, false, drafts);
    expect_plain_distribution({.temperature = 1.5f, .top_k = 2}, kSmall, false, drafts);
    expect_plain_distribution(
        {.temperature = 1.0f, .presence_penalty = 0.7f, .frequency_penalty = 0.4f}, kSmall, false,
        drafts);
    expect_plain_distribution({.temperature = 1.2f}, 2, true, drafts);
  }
}

// Plain decoding's step over main_logits, the tokens consumed kept in `seq`.
StepFn main_step(std::vector<int32_t>& seq) {
  return [&seq](int32_t token, float* out) {
    seq.push_back(token);
    const auto l = main_logits(seq);
    if (out) std::copy(l.begin(), l.end(), out);
    return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  };
}

// A draft vocabulary (mtp_vocab.h): the head never drafts ids 2 and 3. Alone, and with a
// constraint that masks the whole draft vocabulary at every other position (the draft is then
// the head's argmax with q all on it, which resolve_draft keeps with probability p(draft)).
TEST(Speculative, SamplingWithADraftVocabularyFollowsPlainSamplingsDistribution) {
  expect_plain_distribution({.temperature = 0.8f}, 2);
  expect_plain_distribution({.temperature = 1.2f}, 2, true);
  expect_plain_distribution({.temperature = 1.0f, .presence_penalty = 0.5f}, 2, true);
}

// Greedy under the same constraint: the ids equal plain greedy decoding's with it, whatever
// the masked drafts are.
TEST(Speculative, GreedyWithADraftVocabularyTheConstraintMasksEqualsPlainGreedy) {
  const std::vector<int32_t> prompt = {3, 0, 1};
  GenerateOptions o;
  o.max_tokens = 30;
  o.constraint = std::make_shared<NoLowIdsAtEven>();
  std::vector<int32_t> seq;
  const StepFn step = main_step(seq);
  const GenerateResult want = generate_with(step, kSmall, prompt, o, [](int32_t) {});
  o.constraint = std::make_shared<NoLowIdsAtEven>();
  SampledToy toy;
  toy.draft_vocab = 2;
  SpecStats st;
  const GenerateResult got = generate_speculative(
      toy.engine(), prompt, o, [](int32_t) {}, &st);
  EXPECT_EQ(got.ids, want.ids);
  for (size_t i = 0; i < got.ids.size(); i += 2) EXPECT_GE(got.ids[i], 2) << i;
  EXPECT_GT(st.rounds, 0);
}

// Greedy with penalties needs the logits on the host: the ids, and every token's logprobs,
// equal plain greedy decoding's with the same penalties.
TEST(Speculative, GreedyWithPenaltiesEqualsPlainGreedy) {
  const std::vector<int32_t> prompt = {3, 0, 1};
  GenerateOptions o;
  o.max_tokens = 30;
  o.sampling = {.presence_penalty = 0.8f, .frequency_penalty = 0.3f, .repetition_penalty = 1.3f};
  o.logprobs = 2;
  std::vector<TokenLogprobs> want_lp, got_lp;
  std::vector<int32_t> seq;
  const StepFn step = main_step(seq);
  o.on_logprobs = [&](const TokenLogprobs& t) { want_lp.push_back(t); };
  const GenerateResult want = generate_with(step, kSmall, prompt, o, [](int32_t) {});
  o.on_logprobs = [&](const TokenLogprobs& t) { got_lp.push_back(t); };
  SampledToy toy;
  SpecStats st;
  const GenerateResult got = generate_speculative(
      toy.engine(), prompt, o, [](int32_t) {}, &st);
  EXPECT_EQ(got.ids, want.ids);
  GenerateOptions plain;
  plain.max_tokens = o.max_tokens;
  seq.clear();
  EXPECT_NE(generate_with(step, kSmall, prompt, plain, [](int32_t) {}).ids, want.ids)
      << "the penalties changed nothing: the test shows nothing";
  ASSERT_EQ(got_lp.size(), want_lp.size());
  for (size_t i = 0; i < got_lp.size(); ++i) {
    EXPECT_EQ(got_lp[i].id, want_lp[i].id) << i;
    EXPECT_EQ(got_lp[i].logprob, want_lp[i].logprob) << i;
    EXPECT_EQ(got_lp[i].top, want_lp[i].top) << i;
  }
  EXPECT_GT(st.accepted, 0);
  EXPECT_LT(st.accepted, st.rounds);
}

// Top-k 1 makes both distributions one-hot: sampling must give the greedy ids.
TEST(Speculative, TopKOneSamplingIsGreedy) {
  const std::vector<int32_t> prompt = {3, 0, 1};
  GenerateOptions greedy;
  greedy.max_tokens = 25;
  SampledToy a, b;
  const GenerateResult want = generate_speculative(
      a.engine(), prompt, greedy, [](int32_t) {}, nullptr);
  GenerateOptions o = greedy;
  o.sampling = {.temperature = 2.0f, .top_k = 1, .seed = 9};
  const GenerateResult got = generate_speculative(
      b.engine(), prompt, o, [](int32_t) {}, nullptr);
  EXPECT_EQ(got.ids, want.ids);
}

// `e` with verify_top and draft_top made from its own rows (top_k_ids, the exact normalizer), as
// an engine that selects the top k itself gives them; calls[0] and calls[1] count their calls.
SpecEngine with_tops(SpecEngine e, int* calls) {
  const auto top_of = [](const float* row, int k, TopLogits& out) {
    test::top_logits_of(std::span(row, kSmall), k, out);
  };
  const SpecEngine plain = e;
  e.verify_top = [plain, top_of, calls](const int32_t tokens[2], int32_t top[2], int k,
                                        TopLogits out[2]) {
    ++calls[0];
    float rows[2 * kSmall];
    plain.verify(std::span(tokens, 2), top, rows);
    top_of(rows, k, out[0]);
    top_of(rows + kSmall, k, out[1]);
  };
  e.draft_top = [plain, top_of, calls](int row, int32_t next, int k, TopLogits& out) {
    ++calls[1];
    float l[kSmall];
    const int32_t top = plain.draft(row, next, l);
    top_of(l, k, out);
    return top;
  };
  return e;
}

// Rounds from the rows' top k (an engine's verify_top and draft_top) choose what the whole rows
// choose, seed for seed, with the same logprobs: sampled with top-k (ties common: the toy's
// logits are multiples of 0.9), and greedy with logprobs.
TEST(Speculative, TopCandidatesChooseWhatTheRowsWould) {
  const std::vector<int32_t> prompt = {3, 0, 1};
  for (const auto& [sampling, logprobs] : std::vector<std::pair<SamplingOptions, int>>{
           {{.temperature = 1.0f, .top_k = 2}, -1},
           {{.temperature = 0.7f, .top_p = 0.8f, .top_k = 3}, 2},
           {{.temperature = 1.5f, .top_k = kSmall - 1, .min_p = 0.1f}, kSmall},
           {{}, 2}}) {
    for (uint64_t seed = 0; seed < 50; ++seed) {
      GenerateOptions o;
      o.max_tokens = 16;
      o.sampling = sampling;
      o.sampling.seed = seed;
      o.logprobs = logprobs;
      std::vector<TokenLogprobs> want_lp, got_lp;
      o.on_logprobs = [&](const TokenLogprobs& t) { want_lp.push_back(t); };
      SampledToy a, b;
      SpecStats sa, sb;
      const GenerateResult want = generate_speculative(
          a.engine(), prompt, o, [](int32_t) {}, &sa);
      o.on_logprobs = [&](const TokenLogprobs& t) { got_lp.push_back(t); };
      int calls[2] = {0, 0};
      const GenerateResult got = generate_speculative(
          with_tops(b.engine(), calls), prompt, o, [](int32_t) {}, &sb);
      ASSERT_EQ(got.ids, want.ids) << "top-k " << sampling.top_k << ", seed " << seed;
      EXPECT_EQ(sb.accepted, sa.accepted);
      EXPECT_EQ(calls[0], sb.rounds) << "the top path was not taken";
      // Greedy drafts need only the head's argmax: no top k copied for them.
      EXPECT_EQ(calls[1], sampling.temperature > 0 ? sb.rounds : 0);
      ASSERT_EQ(got_lp.size(), want_lp.size());
      for (size_t i = 0; i < got_lp.size(); ++i) {
        EXPECT_EQ(got_lp[i].id, want_lp[i].id);
        EXPECT_NEAR(got_lp[i].logprob, want_lp[i].logprob, 1e-5);
        ASSERT_EQ(got_lp[i].top.size(), want_lp[i].top.size());
        for (size_t j = 0; j < got_lp[i].top.size(); ++j) {
          EXPECT_EQ(got_lp[i].top[j].first, want_lp[i].top[j].first);
        }
      }
    }
  }
}

// generate_with with a PrefillFn: the prompt in one call gives the ids single steps give,
// greedy and sampled with one seed (the prefill's logits are what the sampler draws from first).
TEST(Prefill, OneCallEqualsSingleSteps) {
  for (const float temperature : {0.0f, 0.9f}) {
    for (size_t len = 1; len <= 6; ++len) {
      std::vector<int32_t> prompt;
      for (size_t i = 0; i < len; ++i) prompt.push_back(static_cast<int32_t>((5 * i + 2) % 4));
      GenerateOptions o;
      o.max_tokens = 12;
      o.sampling = {.temperature = temperature, .seed = 17};
      std::vector<int32_t> seq;
      const auto logits_of = [&](float* out) {
        const auto l = main_logits(seq);
        if (out) std::copy(l.begin(), l.end(), out);
        return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
      };
      const StepFn step = [&](int32_t token, float* out) {
        seq.push_back(token);
        return logits_of(out);
      };
      int calls = 0;
      const PrefillFn prefill = [&](std::span<const int32_t> tokens, float* out) {
        ++calls;
        seq.insert(seq.end(), tokens.begin(), tokens.end());
        return logits_of(out);
      };
      const GenerateResult want = generate_with(step, kSmall, prompt, o, [](int32_t) {});
      const std::vector<int32_t> want_seq = seq;
      seq.clear();
      const GenerateResult got = generate_with(
          step, kSmall, prompt, o, [](int32_t) {}, prefill);
      const std::string what =
          "T " + std::to_string(temperature) + ", length " + std::to_string(len);
      EXPECT_EQ(got.ids, want.ids) << what;
      EXPECT_EQ(seq, want_seq) << what;
      EXPECT_EQ(calls, 1) << what;
    }
  }
}

}  // namespace
}  // namespace qf::rt
