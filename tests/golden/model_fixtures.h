// The tiny transformers fixtures (tests/golden/make_model_goldens.py) and the Spark recipe's
// steps on them, shared by the engine tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "qf/rt/speculative.h"
#include "test_support.h"

namespace qf::test {

inline const std::vector<std::string>& model_fixtures() {
  static const std::vector<std::string> names = {"r1-hd64-e4k2", "r2-hd256-e8k3", "r4-hd64-e16k4"};
  return names;
}

// gtest parameter names: "r1-hd64-e4k2" -> "r1_hd64_e4k2".
inline std::string fixture_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

// Intel INT4 + Qwen FP8 from the fixture (synth --from), build-hybrid, and the INT8 LM head when
// the vocabulary packs (a multiple of 4): exactly what make_model_goldens.py ran before taking
// the hybrid reference (lm_head_bits 4: the INT4 head instead, a vocabulary multiple of 8).
// Fails the test on any command error.
inline void build_hybrid(const std::string& qforge, const std::filesystem::path& src,
                         const std::filesystem::path& work, int64_t vocab, int lm_head_bits = 8) {
  const std::string h = (work / "hybrid").string(), int4 = (work / "int4").string(),
                    fp8 = (work / "fp8").string();
  std::vector<std::string> steps = {
      "synth " + int4 + " --from " + src.string() + " --layout intel-int4 --no-vision",
      "synth " + fp8 + " --from " + src.string() + " --layout qwen-fp8 --no-vision",
      "build-hybrid --int4 " + int4 + " --fp8 " + fp8 + " --out " + h + " --no-check"};
  if (vocab % (32 / lm_head_bits) == 0) {
    steps.push_back("quantize-lm-head " + h + " --in-place --bits " + std::to_string(lm_head_bits));
  }
  for (const std::string& s : steps) {
    const CommandResult r = run_command(qforge + " " + s + " 2>&1");
    ASSERT_EQ(r.exit_code, 0) << s << "\n" << r.out;
  }
}

// An MTP head that drafts seq's tokens (prompt, then the expected continuation), the position
// counted in `next`, so every draft is kept (but every wrong_every-th, the next id instead);
// its logits, where asked, are one-hot on the draft.
inline auto oracle_drafts(const std::vector<int32_t>& seq, size_t& next, int64_t vocab,
                          int wrong_every = 0) {
  return [&seq, &next, vocab, wrong_every, calls = std::make_shared<int>(0)](int, int32_t,
                                                                             float* logits) {
    int32_t id = next + 2 < seq.size() ? seq[next++ + 2] : 0;
    if (wrong_every > 0 && ++*calls % wrong_every == 0) {
      id = static_cast<int32_t>((id + 1) % vocab);
    }
    if (logits) {
      std::fill(logits, logits + vocab, 0.0f);
      logits[id] = 1.0f;
    }
    return id;
  };
}

// `e` drafting as oracle_drafts (its chained drafts too, and its rewinds taking `next` back),
// with its prefill (when it has one) counting the prompt's MTP
// entries it makes as drafts made, so that the oracle's positions go on after them.
inline void use_oracle(rt::SpecEngine& e, const std::vector<int32_t>& seq, size_t& next,
                       int64_t vocab, int wrong_every = 0) {
  next = 0;
  e.draft = oracle_drafts(seq, next, vocab, wrong_every);
  e.draft_chain = [d = e.draft](int32_t token, float* logits) { return d(0, token, logits); };
  e.mtp_rewind = [&next](int n) { next -= static_cast<size_t>(n); };
  // Entries without drafts (the kept drafts' positions): the engine's own where it has them,
  // the positions counted.
  e.mtp_entries = [&next, inner = e.mtp_entries](int first, std::span<const int32_t> tokens) {
    if (inner) inner(first, tokens);
    next += tokens.size();
  };
  if (!e.prefill) return;
  e.prefill = [&next, prefill = e.prefill](std::span<const int32_t> t, int32_t after, float* l) {
    next += t.size() - (after < 0 ? 1 : 0);
    return prefill(t, after, l);
  };
}

}  // namespace qf::test
