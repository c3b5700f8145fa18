// The speculative decoding loop (speculative.h) over a toy engine whose argmax is a fixed
// function of the tokens consumed so far: the ids must equal the plain greedy loop's
// (generate_with) for any pattern of right and wrong drafts, stop ids and limits included, and
// the MTP head must see every position in order with the hidden state and the token the
// architecture gives it (position t: the main model's state at t, the token at t + 1).
#include <gtest/gtest.h>

#include <vector>

#include "qf/error.h"
#include "qf/rt/speculative.h"

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
  int wrong_every = 0;  // every n-th MTP call drafts a wrong token (0: never)

  SpecEngine engine() {
    SpecEngine e;
    e.verify = [this](std::span<const int32_t> tokens, int32_t* top) {
      max_verify = std::max<int64_t>(max_verify, static_cast<int64_t>(tokens.size()));
      rows.clear();
      for (size_t i = 0; i < tokens.size(); ++i) {
        seq.push_back(tokens[i]);
        rows.push_back(seq.size() - 1);
        top[i] = next_of(seq, seq.size());
      }
    };
    e.reject_last = [this] { seq.pop_back(); };
    e.draft = [this](int row, int32_t next_token) {
      const size_t p = rows.at(static_cast<size_t>(row));
      EXPECT_EQ(static_cast<int64_t>(p), mtp_pos) << "the MTP head skipped or repeated a position";
      EXPECT_EQ(next_token, reference.at(p + 1)) << "MTP position " << p;
      ++mtp_pos;
      const bool wrong = wrong_every > 0 && ++mtp_calls % wrong_every == 0;
      return (reference.at(p + 2) + (wrong ? 1 : 0)) % kVocab;
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

void expect_same(const std::vector<int32_t>& prompt, const GenerateOptions& o, int wrong_every) {
  Toy toy;
  toy.wrong_every = wrong_every;
  const GenerateResult want = plain(prompt, o, &toy.reference);
  std::vector<int32_t> streamed;
  SpecStats st;
  const GenerateResult got = generate_speculative(
      toy.engine(), prompt, o, [&](int32_t id) { streamed.push_back(id); }, &st);
  const std::string what =
      "max_tokens " + std::to_string(o.max_tokens) + ", wrong_every " + std::to_string(wrong_every);
  EXPECT_EQ(got.ids, want.ids) << what;
  EXPECT_EQ(streamed, want.ids) << what;
  EXPECT_EQ(got.finish_reason, want.finish_reason) << what;
  EXPECT_EQ(got.prompt_tokens, static_cast<int64_t>(prompt.size()));
  if (!want.ids.empty() && o.max_tokens > 1) {  // a round ran
    EXPECT_EQ(toy.max_verify, 2) << what;
  }
  // One MTP step per prompt token after the first, one draft per round and one per kept draft
  // (but after the last round, if generation ended inside it).
  EXPECT_EQ(st.mtp_steps, toy.mtp_pos) << what;
  const int64_t base = static_cast<int64_t>(prompt.size()) - 1 + st.rounds;
  EXPECT_GE(st.mtp_steps, base + st.accepted - 1) << what;
  EXPECT_LE(st.mtp_steps, base + st.accepted) << what;
  if (wrong_every == 1) {
    EXPECT_EQ(st.accepted, 0) << what;
  }
  if (wrong_every == 0 && o.stop_ids.empty() && o.max_tokens >= 5) {
    EXPECT_GT(st.accepted, 0) << what;
    EXPECT_LE(st.rounds, (o.max_tokens + 1) / 2) << what;
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

TEST(Speculative, RefusesSamplingAndEmptyPrompts) {
  Toy toy;
  GenerateOptions o;
  o.sampling.temperature = 0.7f;
  const std::vector<int32_t> prompt = {1, 2};
  try {
    generate_speculative(
        toy.engine(), prompt, o, [](int32_t) {}, nullptr);
    FAIL() << "sampling accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kUsage);
    EXPECT_NE(std::string(e.what()).find("greedy only"), std::string::npos) << e.what();
  }
  o.sampling.temperature = 0;
  EXPECT_THROW(generate_speculative(
                   toy.engine(), {}, o, [](int32_t) {}, nullptr),
               Error);
}

}  // namespace
}  // namespace qf::rt
