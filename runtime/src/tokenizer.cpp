// Encoding pipeline (added tokens, normalization, pre-tokenization, BPE) and decoding.
// Each step follows `tokenizers` (AddedVocabulary::extract_and_normalize, the Split and
// ByteLevel pre-tokenizers, BPE::tokenize, the ByteLevel decoder) so ids match exactly.
#include "qf/rt/tokenizer.h"

#include <utf8proc.h>

#include <deque>

#include "qf/error.h"
#include "tokenizer_impl.h"
#include "utf8.h"

namespace qf::rt {
namespace {

using Impl = Tokenizer::Impl;

using detail::code_point;

// Code point ending at byte `end` (exclusive) of valid UTF-8, and where it starts.
uint32_t code_point_before(std::string_view s, size_t end, size_t& start) {
  start = end - 1;
  while (start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
  size_t len;
  return code_point(s, start, len);
}

// Rust regex \s: the Unicode White_Space property.
bool is_whitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// Rust regex \w, which single_word tokens use: Alphabetic (letters, Nl and the marks and
// symbols of Other_Alphabetic), marks, decimal digits, connector punctuation, Join_Control.
bool is_word_char(uint32_t cp) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:  // Join_Control, and the circled and squared Latin letters (Other_Alphabetic, So)
      return cp == 0x200C || cp == 0x200D || (cp >= 0x24B6 && cp <= 0x24E9) ||
             (cp >= 0x1F130 && cp <= 0x1F149) || (cp >= 0x1F150 && cp <= 0x1F169) ||
             (cp >= 0x1F170 && cp <= 0x1F189);
  }
}

// A stretch of text, or an added token.
struct Segment {
  size_t begin, end;
  int32_t added;  // -1: text
};

// AddedVocabulary::find_matches: leftmost-longest matches, scanning on after each match's end
// even when single_word discards it; lstrip/rstrip then widen a kept match over whitespace.
void split_added(std::string_view s, const Impl::AddedIndex& index, std::vector<Segment>& out) {
  out.clear();
  size_t text_start = 0;
  for (size_t i = 0; !index.empty && i < s.size();) {
    const Impl::AddedPattern* hit = nullptr;
    for (const Impl::AddedPattern& p : index.by_first_byte[static_cast<uint8_t>(s[i])]) {
      if (s.compare(i, p.text.size(), p.text) == 0) {
        hit = &p;  // longest first
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t begin = i, end = i + hit->text.size(), at, len;
    i = end;
    const AddedToken& a = *hit->token;
    if (a.single_word && ((begin > 0 && is_word_char(code_point_before(s, begin, at))) ||
                          (end < s.size() && is_word_char(code_point(s, end, len))))) {
      continue;
    }
    if (a.lstrip) {
      while (begin > 0 && is_whitespace(code_point_before(s, begin, at))) begin = at;
      begin = std::max(begin, text_start);  // whitespace an earlier match took stays there
    }
    if (a.rstrip) {
      while (end < s.size() && is_whitespace(code_point(s, end, len))) end += len;
    }
    if (text_start < begin) out.push_back({text_start, begin, -1});
    out.push_back({begin, end, a.id});
    text_start = end;
  }
  if (text_start < s.size()) out.push_back({text_start, s.size(), -1});
}

// Buffers encode reuses: one set per thread, kept between calls (PCRE2's JIT stack alone is an
// mmap), trimmed after a large text so that a thread does not hold on to its size.
struct EncodeState {
  std::vector<Segment> raw, normalized;
  std::string normalized_text;
  std::vector<std::string_view> pieces, next;
  std::deque<std::string> prefixed;  // pieces ByteLevel gave a leading space (stable addresses)
  std::vector<std::pair<size_t, size_t>> matches;
  Regex::Scratch regex;
  BpeScratch bpe;

  void trim() {
    constexpr size_t kKeep = 1 << 16;  // elements (or bytes) a thread may keep
    auto release = [](auto& v) {
      if (v.capacity() > kKeep) std::remove_reference_t<decltype(v)>().swap(v);
    };
    release(raw);
    release(normalized);
    release(normalized_text);
    release(pieces);
    release(next);
    release(matches);
    release(bpe.symbols);
    release(bpe.heap);
    prefixed.clear();
  }
};

// One pre-tokenizer step over every piece (views into the text or into state.prefixed).
// Empty pieces are dropped, as PreTokenizedString::split does.
void pre_tokenize_step(const PreTokenizeStep& step, EncodeState& st) {
  st.next.clear();
  for (std::string_view p : st.pieces) {
    if (p.empty()) continue;
    if (step.kind == PreTokenizeStep::Kind::kByteLevel && step.add_prefix_space && p[0] != ' ') {
      p = st.prefixed.emplace_back(" " + std::string(p));
    }
    if (!step.regex) {
      st.next.push_back(p);
      continue;
    }
    st.matches.clear();
    step.regex->find_all(p, st.regex, st.matches);
    // Adjacent pieces are adjacent in p, so merged pieces are views too.
    size_t last = 0, carry = std::string_view::npos;  // carry: start of a match kept for the next
    for (const auto& [b, e] : st.matches) {
      switch (step.behavior) {
        case SplitBehavior::kIsolated:
          st.next.push_back(p.substr(last, b - last));
          st.next.push_back(p.substr(b, e - b));
          break;
        case SplitBehavior::kRemoved:
          st.next.push_back(p.substr(last, b - last));
          break;
        case SplitBehavior::kMergedWithPrevious:
          st.next.push_back(p.substr(last, e - last));
          break;
        case SplitBehavior::kMergedWithNext: {  // the previous match joins the text after it
          const size_t from = carry != std::string_view::npos ? carry : last;
          st.next.push_back(p.substr(from, b - from));
          carry = b;
          break;
        }
      }
      last = e;
    }
    const size_t rest = carry != std::string_view::npos ? carry : last;
    st.next.push_back(p.substr(rest));
  }
  std::swap(st.pieces, st.next);
}

// Steps 2-4 for a stretch of text between raw-matched added tokens.
void encode_text(const Impl& t, std::string_view text, EncodeState& st, std::vector<int32_t>& ids) {
  const std::string_view s = t.nfc ? detail::nfc(text, st.normalized_text) : text;
  split_added(s, t.added_normalized, st.normalized);
  for (const Segment& g : st.normalized) {
    if (g.added >= 0) {
      ids.push_back(g.added);
      continue;
    }
    st.prefixed.clear();
    st.pieces.assign(1, s.substr(g.begin, g.end - g.begin));
    for (const PreTokenizeStep& step : t.pre) pre_tokenize_step(step, st);
    for (const std::string_view p : st.pieces) bpe_encode(t, p, st.bpe, ids);
  }
}

// Throws Error(kUsage) naming the first byte that is not part of valid UTF-8.
void check_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    if (static_cast<uint8_t>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = detail::utf8_valid_length(text, i);
    if (n == 0) {
      throw Error(Errc::kUsage, "text to encode is not valid UTF-8 at byte " + std::to_string(i));
    }
    i += n;
  }
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  check_utf8(text);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  thread_local EncodeState st;  // encode never re-enters itself
  split_added(text, impl_->added_raw, st.raw);
  for (const Segment& g : st.raw) {
    if (g.added >= 0) {
      ids.push_back(g.added);
    } else {
      encode_text(*impl_, text.substr(g.begin, g.end - g.begin), st, ids);
    }
  }
  st.trim();
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (const int32_t id : ids) {
    if (id < 0 || id >= n_ids() || (skip_special && impl_->id_special[id])) continue;
    bytes += impl_->id_bytes[id];
  }
  return detail::utf8_lossy(bytes);
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  static const std::string kNone;
  return id >= 0 && id < n_ids() ? impl_->id_bytes[id] : kNone;
}

const std::string& Tokenizer::token_content(int32_t id) const {
  static const std::string kNone;
  return id >= 0 && id < n_ids() ? impl_->id_content[id] : kNone;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view content) const {
  const auto it = impl_->content_to_id.find(content);
  return it == impl_->content_to_id.end() ? std::nullopt : std::optional<int32_t>(it->second);
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < n_ids() && impl_->id_special[id];
}

int32_t Tokenizer::n_ids() const {
  return static_cast<int32_t>(impl_->id_bytes.size());
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const {
  return impl_->added;
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(&tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tokenizer_->is_special(id)) return {};
  pending_ += tokenizer_->token_bytes(id);
  const size_t keep = detail::utf8_incomplete_tail(pending_);
  std::string out =
      detail::utf8_lossy(std::string_view(pending_).substr(0, pending_.size() - keep));
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = detail::utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace qf::rt
