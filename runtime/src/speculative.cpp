#include "qf/rt/speculative.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "qf/error.h"

namespace qf::rt {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

}  // namespace

GenerateResult generate_speculative(const SpecEngine& e, std::span<const int32_t> prompt,
                                    const GenerateOptions& o,
                                    const std::function<void(int32_t)>& on_token, SpecStats* stats,
                                    const SpecPrefill& prefill) {
  if (prompt.empty()) throw Error(Errc::kUsage, "the prompt has no tokens");
  if (prefill.done >= prompt.size() ||
      (prefill.snapshot_at > 0 &&
       (prefill.snapshot_at <= prefill.done || prefill.snapshot_at >= prompt.size()))) {
    throw Error(Errc::kUsage, "speculative prefill: " + std::to_string(prefill.done) +
                                  " tokens done and a snapshot at " +
                                  std::to_string(prefill.snapshot_at) + " do not fit a prompt of " +
                                  std::to_string(prompt.size()));
  }
  check_drafts(e.drafts, "drafts");
  using clock = std::chrono::steady_clock;
  TokenChooser chooser(o, e.vocab, prompt);
  const bool copy = chooser.needs_logits(), greedy = chooser.greedy();
  const size_t vocab = static_cast<size_t>(e.vocab);
  const int nd = e.drafts;
  const size_t n_rows = static_cast<size_t>(std::max(2, nd + 1));  // a verify's
  // With logits: the verify's rows, the drafts', and the sampling distributions.
  std::vector<float> logits(copy ? n_rows * vocab : 0), draft_logits(copy ? vocab : 0);
  const auto row_of = [&](int i) {
    return std::span<const float>(logits.data() + (copy ? i * vocab : 0), copy ? vocab : 0);
  };
  TokenDist p;
  std::vector<TokenDist> qs(static_cast<size_t>(nd));
  SpecStats st;
  GenerateResult r;
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  const auto t0 = clock::now();
  // The prompt through the engine's prefill (each part's MTP entries with it), or two tokens a
  // verify (the last alone when the length is odd, or before the snapshot), then the MTP
  // head's entries for the positions whose next token is known.
  std::vector<int32_t> tops(n_rows);
  int row = 0;  // of the last prompt token in the last verify
  for (size_t i = prefill.done; e.prefill && i < prompt.size();) {
    const size_t end = i < prefill.snapshot_at ? prefill.snapshot_at : prompt.size();
    const bool last = end == prompt.size();
    tops[0] = e.prefill(prompt.subspan(i, end - i), last ? -1 : prompt[end],
                        last && copy ? logits.data() : nullptr);
    st.mtp_steps += static_cast<int64_t>(end - i - last);
    i = end;
    if (i == prefill.snapshot_at) prefill.snapshot();
  }
  for (size_t i = prefill.done; !e.prefill && i < prompt.size();) {
    const size_t end = i < prefill.snapshot_at ? prefill.snapshot_at : prompt.size();
    const size_t take = std::min<size_t>(2, end - i);
    const bool last = i + take == prompt.size();
    e.verify(prompt.subspan(i, take), tops.data(), last && copy ? logits.data() : nullptr);
    for (size_t j = 0; j < take && i + j + 1 < prompt.size(); ++j) {
      e.draft(static_cast<int>(j), prompt[i + j + 1], nullptr);
      ++st.mtp_steps;
    }
    row = static_cast<int>(take) - 1;
    i += take;
    if (i == prefill.snapshot_at) prefill.snapshot();
  }
  const auto t1 = clock::now();
  r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  r.finish_reason = "length";
  // Each choice sees the ids reported before it (r.ids) for its penalties.
  const auto pick = [&](int32_t top, std::span<const float> raw) {
    return copy ? chooser.choose(raw, r.ids) : top;
  };
  // Decode rounds with the rows' top k (no bias or penalty, so no ids before them matter), where
  // the engine selects them and they decide as the rows would (one draft a round).
  const int k = e.verify_top && e.draft_top && nd == 1 ? chooser.top_candidates() : 0;
  TopLogits draft_top, verify_top[2];
  // Round row `i` of the verify: the choice from it, its distribution, the report of `id`.
  const auto pick_row = [&](int i, int32_t top) {
    return k == 0 ? pick(top, row_of(i)) : chooser.choose(verify_top[i]);
  };
  const auto emit_row = [&](int32_t id, int i) {
    if (k > 0) return report_token(r, o, on_token, id, verify_top[i]);
    return report_token(r, o, on_token, id, row_of(i));
  };
  // The first draft of a round: from the processed row as the verify's first row sees it (the
  // same ids before them), into q.
  const auto first_draft = [&](int32_t next, TokenDist& q) {
    int32_t draft;
    if (k > 0 && !greedy) {
      e.draft_top(row, next, k, draft_top);
      chooser.distribution(draft_top, q);
      draft = chooser.sampler().draw(q);
    } else if (k > 0) {  // greedy with nothing to process: the head's argmax, nothing copied
      draft = e.draft(row, next, nullptr);
    } else {
      draft = e.draft(row, next, copy ? draft_logits.data() : nullptr);
      if (copy && greedy) {
        draft = chooser.choose(draft_logits, r.ids);
      } else if (!greedy) {
        const std::span<const float> seen = chooser.process(draft_logits, r.ids);
        if (std::any_of(seen.begin(), seen.end(), [](float l) { return l > -kInf; })) {
          chooser.sampler().distribution(seen, q);
          draft = chooser.sampler().draw(q);
        } else {
          // A draft vocabulary (mtp_vocab.h) that the constraint masks whole: q all on the
          // head's argmax, which resolve_draft then keeps with probability p(draft), so the id
          // is still distributed as p.
          q.ids.assign(1, draft);
          q.weights.assign(1, 1.0f);
          q.total = 1;
        }
      }
    }
    return draft;
  };
  // A later draft, after `before`: the head's raw argmax, or drawn from its raw row (file
  // comment of speculative.h).
  const auto chained_draft = [&](int32_t before, TokenDist& q) {
    if (greedy) return e.draft_chain(before, nullptr);
    e.draft_chain(before, draft_logits.data());
    chooser.sampler().distribution(draft_logits, q);
    return chooser.sampler().draw(q);
  };
  // `next` is chosen but not consumed; the MTP head drafts from the hidden state of the token
  // before it, row `row` of the last verify.
  int32_t next = pick(tops[static_cast<size_t>(row)], row_of(row));
  std::vector<int32_t> in(static_cast<size_t>(nd) + 1), got(static_cast<size_t>(nd) + 1);
  bool going = o.max_tokens > 0 && report_token(r, o, on_token, next, row_of(row));
  while (going) {
    // in = next, then the drafts: each after the one before it.
    in[0] = next;
    for (int j = 0; j < nd; ++j) {
      in[j + 1] = j == 0 ? first_draft(next, qs[0]) : chained_draft(in[j], qs[j]);
      ++st.mtp_steps;
    }
    if (k > 0) {
      e.verify_top(in.data(), got.data(), k, verify_top);
    } else {
      e.verify(in, got.data(), copy ? logits.data() : nullptr);
    }
    ++st.rounds;
    st.drafted += nd;
    // Row i resolves draft i (in[i + 1]), the ids before it reported; the first one not kept
    // ends the round with the main model's choice, and after nd kept, row nd gives one more.
    int kept = 0;
    int32_t last = 0;
    for (; kept < nd && going; ++kept) {
      const int32_t draft = in[static_cast<size_t>(kept) + 1];
      DraftChoice choice;
      if (greedy) {
        choice.id = pick_row(kept, got[static_cast<size_t>(kept)]);
        choice.accepted = choice.id == draft;
      } else {
        if (k > 0) {
          chooser.distribution(verify_top[kept], p);
        } else {
          chooser.distribution(row_of(kept), r.ids, p);
        }
        choice = chooser.sampler().resolve_draft(p, qs[static_cast<size_t>(kept)], draft);
      }
      going = emit_row(choice.id, kept);
      last = choice.id;
      if (!choice.accepted) break;
      ++st.accepted;
    }
    if (!going) break;
    if (kept == nd) {
      last = pick_row(nd, got[static_cast<size_t>(nd)]);  // after the last draft, now reported
      if (!emit_row(last, nd)) break;
    }
    // The MTP head's entries for the kept drafts' positions, from the main model's hidden
    // states (those the later drafts made from its own output are made again).
    if (nd > 1) e.mtp_rewind(nd - 1);
    if (e.mtp_entries) {
      if (kept > 0) e.mtp_entries(0, std::span<const int32_t>(in).subspan(1, kept));
    } else {
      for (int j = 0; j < kept; ++j) e.draft(j, in[static_cast<size_t>(j) + 1], nullptr);
    }
    st.mtp_steps += kept;
    if (kept < nd) e.reject(nd - kept);
    next = last;
    row = kept;
  }
  r.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  if (stats) *stats = st;
  return r;
}

void check_drafts(int drafts, const char* what) {
  if (drafts < 1 || drafts > kMaxDrafts) {
    throw Error(Errc::kUsage, std::string(what) + " " + std::to_string(drafts) +
                                  ": speculative decoding drafts 1 to " +
                                  std::to_string(kMaxDrafts) + " tokens a round");
  }
}

SpecEngine speculative_engine(CpuEngine& engine, int drafts) {
  check_drafts(drafts, "drafts");
  const Model& model = engine.model();
  if (!model.mtp()) {
    throw Error(Errc::kUnsupported, model.dir().string() +
                                        " has no MTP head (mtp.* tensors): speculative decoding "
                                        "needs one (qforge add-mtp)");
  }
  struct Buffers {
    std::vector<float> logits;
    std::vector<std::vector<float>> hidden;  // of each token of the last verify
    size_t verified = 0;                     // its tokens
    int32_t argmax() const {
      return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
  };
  const auto b = std::make_shared<Buffers>();
  b->logits.resize(static_cast<size_t>(model.config().vocab_size));
  b->hidden.resize(static_cast<size_t>(std::max(2, drafts + 1)));
  engine.reset();
  SpecEngine e;
  e.vocab = model.config().vocab_size;
  e.drafts = drafts;
  e.reset = [&engine] { engine.reset(); };
  // Before each token but the first, the state so far goes to save slot i - 1: reject(n) returns
  // to the one before the n-th last token.
  e.verify = [&engine, b](std::span<const int32_t> tokens, int32_t* top, float* logits) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) engine.save(static_cast<int>(i) - 1);
      engine.step(tokens[i], b->logits.data());
      b->hidden.at(i) = engine.hidden();
      top[i] = b->argmax();
      if (logits) std::copy(b->logits.begin(), b->logits.end(), logits + i * b->logits.size());
    }
    b->verified = tokens.size();
  };
  e.reject = [&engine, b](int n) {
    if (n < 1 || static_cast<size_t>(n) >= b->verified) {
      throw Error(Errc::kUsage, "reject " + std::to_string(n) + " of a verify of " +
                                    std::to_string(b->verified) + " tokens");
    }
    engine.restore(static_cast<int>(b->verified) - n - 1);
    b->verified = 0;
  };
  e.draft = [&engine, b](int row, int32_t next_token, float* logits) {
    engine.mtp_step(next_token, b->hidden.at(static_cast<size_t>(row)).data(), b->logits.data());
    if (logits) std::copy(b->logits.begin(), b->logits.end(), logits);
    return b->argmax();
  };
  e.draft_chain = [&engine, b](int32_t next_token, float* logits) {
    const std::vector<float> own = engine.mtp_hidden();
    engine.mtp_step(next_token, own.data(), b->logits.data());
    if (logits) std::copy(b->logits.begin(), b->logits.end(), logits);
    return b->argmax();
  };
  e.mtp_rewind = [&engine](int n) { engine.mtp_rewind(n); };
  e.prefill = [&engine, b](std::span<const int32_t> tokens, int32_t next, float* logits) {
    std::vector<float> h;
    int32_t top = 0;
    for (size_t i = 0; i < tokens.size(); ++i) {
      engine.step(tokens[i], b->logits.data());
      top = b->argmax();
      if (i + 1 == tokens.size() && logits) std::copy(b->logits.begin(), b->logits.end(), logits);
      h = engine.hidden();
      const int32_t after = i + 1 < tokens.size() ? tokens[i + 1] : next;
      if (after >= 0) engine.mtp_step(after, h.data(), b->logits.data());
    }
    b->hidden[0] = std::move(h);
    return top;
  };
  return e;
}

SpecEngine speculative_engine(CudaEngine& engine, int drafts) {
  check_drafts(drafts, "drafts");
  if (drafts > kMaxCudaDrafts) {
    throw Error(Errc::kUnsupported, std::to_string(drafts) +
                                        " drafts a round: the CUDA engine verifies up to " +
                                        std::to_string(kMaxCudaDrafts) +
                                        " a round (more run on the CPU engine, --device cpu)");
  }
  if (!engine.has_mtp()) {
    throw Error(Errc::kUnsupported,
                "no MTP head on the GPU: speculative decoding needs a checkpoint with one (qforge "
                "add-mtp), loaded with CudaOptions::mtp");
  }
  engine.reset();
  SpecEngine e;
  e.vocab = engine.config().vocab_size;
  e.reset = [&engine] { engine.reset(); };
  e.drafts = drafts;
  e.verify = [&engine](std::span<const int32_t> tokens, int32_t* top, float* logits) {
    if (tokens.size() == 1) {
      top[0] = engine.step(tokens[0], logits);
    } else {
      engine.verify(tokens, top, logits);
    }
  };
  e.reject = [&engine](int n) { engine.reject(n); };
  e.draft_chain = [&engine](int32_t next_token, float* logits) {
    return engine.draft_chain(next_token, logits);
  };
  e.mtp_rewind = [&engine](int n) { engine.mtp_rewind(n); };
  e.mtp_entries = [&engine](int first_row, std::span<const int32_t> tokens) {
    engine.mtp_entries(first_row, tokens);
  };
  e.draft = [&engine](int row, int32_t next_token, float* logits) {
    return engine.draft(row, next_token, logits);
  };
  e.verify_top = [&engine](const int32_t tokens[2], int32_t top[2], int k, TopLogits out[2]) {
    engine.verify2_top(tokens, top, k, out);
  };
  e.draft_top = [&engine](int row, int32_t next_token, int k, TopLogits& out) {
    return engine.draft_top(row, next_token, k, out);
  };
  e.prefill = [&engine](std::span<const int32_t> tokens, int32_t next, float* logits) {
    return engine.prefill_with_mtp(tokens, next, logits);
  };
  return e;
}

}  // namespace qf::rt
