// PCRE2 behind the pre-tokenizer's Split patterns. tokenizers uses Oniguruma; both are
// backtracking engines with the same leftmost-first alternation, but their Unicode data
// differ, so \p{L}, \p{M}, \p{N} get the characters Oniguruma has beyond PCRE2's older Unicode
// data, and \s becomes Oniguruma's set (unicode_classes.h; rt_tokenizer_test checks every code
// point). Other properties keep PCRE2's meaning.
#include <algorithm>
#include <new>
#include <span>

#include "qf/error.h"
#include "tokenizer_impl.h"
#include "unicode_classes.h"
#include "utf8.h"

namespace qf::rt {
namespace {

// JIT stack bounds: the start fits ordinary text; the cap lets patterns such as \s+(?!\S)
// backtrack over megabytes of whitespace.
constexpr size_t kJitStackStart = 32 << 10;
constexpr size_t kJitStackMax = 64 << 20;

// `out` followed by ranges for the inside of a character class: "\x{41}-\x{5A}\x{2B0}...".
std::string class_body(std::string out, std::span<const unicode::Range> ranges) {
  char buf[32];
  for (const unicode::Range& r : ranges) {
    const int n = r.first == r.last
                      ? std::snprintf(buf, sizeof buf, "\\x{%X}", r.first)
                      : std::snprintf(buf, sizeof buf, "\\x{%X}-\\x{%X}", r.first, r.last);
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// The inside of a character class for \p{name} as Oniguruma has it (PCRE2's property, which
// keeps its fast lookup, plus what Oniguruma adds), or "" for PCRE2's property as is.
std::string class_for(std::string_view name) {
  if (name == "L" || name == "Letter") return class_body("\\p{L}", unicode::kLetterAdded);
  if (name == "M" || name == "Mark") return class_body("\\p{M}", unicode::kMarkAdded);
  if (name == "N" || name == "Number") return class_body("\\p{N}", unicode::kNumberAdded);
  return "";
}

}  // namespace

std::string with_oniguruma_classes(const std::string& p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size();) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[i + 1];
      size_t end = i + 2;  // one past the escape
      std::string body;    // the class contents replacing it, if any
      bool negated = false;
      if (d == 'Q') {  // literal text up to \E
        const size_t e = p.find("\\E", i + 2);
        end = e == std::string::npos ? p.size() : e + 2;
      } else if (d == 's' || d == 'S') {
        body = class_body("", unicode::kWhiteSpace);
        negated = d == 'S';
      } else if ((d == 'p' || d == 'P') && i + 2 < p.size()) {
        std::string_view name(&p[i + 2], 1);
        if (p[i + 2] == '{') {
          const size_t close = p.find('}', i + 3);
          if (close == std::string::npos) break;  // malformed: PCRE2 reports it
          name = std::string_view(p).substr(i + 3, close - i - 3);
          end = close + 1;
        } else {
          end = i + 3;
        }
        negated = d == 'P';
        if (!name.empty() && name[0] == '^') {
          negated = !negated;
          name.remove_prefix(1);
        }
        body = class_for(name);
      }
      if (body.empty() || (in_class && negated)) {
        out.append(p, i, end - i);
      } else if (in_class) {
        out += body;
      } else {
        out += (negated ? "[^" : "[") + body + "]";
      }
      i = end;
    } else if (in_class) {
      if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
        const size_t e = p.find(":]", i + 2);
        const size_t stop = e == std::string::npos ? p.size() : e + 2;
        out.append(p, i, stop - i);
        i = stop;
        continue;
      }
      if (c == ']') in_class = false;
      out += c;
      ++i;
    } else {
      out += c;
      ++i;
      if (c == '[') {  // a ']' right after '[' or '[^' is a literal
        in_class = true;
        if (i < p.size() && p[i] == '^') out += p[i++];
        if (i < p.size() && p[i] == ']') out += p[i++];
      }
    }
  }
  return out;
}

Regex::Regex(const std::string& pattern, const std::string& where) {
  auto compile = [](const std::string& text, int& err, PCRE2_SIZE& offset) {
    return pcre2_compile(reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                         PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  };
  int err = 0;
  PCRE2_SIZE offset = 0;
  // The pattern as written first, so that an error points into it.
  pcre2_code* original = compile(pattern, err, offset);
  if (!original) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw Error(Errc::kTokenizerInvalid, where + ": regex error at offset " +
                                             std::to_string(offset) + ": " +
                                             reinterpret_cast<const char*>(msg));
  }
  pcre2_code_free(original);
  code_ = compile(with_oniguruma_classes(pattern), err, offset);
  QF_ASSERT(code_ != nullptr, "a valid pattern stays valid with Oniguruma's classes");
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;  // else the interpreter runs it
}

Regex::~Regex() {
  if (code_) pcre2_code_free(code_);
}

Regex::Scratch::Scratch() {
  // One ovector pair is enough: only the whole match is used (pcre2_match returns 0 for a
  // match whose groups did not fit, with pair 0 set).
  md_ = pcre2_match_data_create(1, nullptr);
  ctx_ = pcre2_match_context_create(nullptr);
  stack_ = pcre2_jit_stack_create(kJitStackStart, kJitStackMax, nullptr);
  if (!md_ || !ctx_ || !stack_) throw std::bad_alloc();
  pcre2_jit_stack_assign(ctx_, nullptr, stack_);
}

Regex::Scratch::~Scratch() {
  pcre2_jit_stack_free(stack_);
  pcre2_match_context_free(ctx_);
  pcre2_match_data_free(md_);
}

void Regex::find_all(std::string_view s, Scratch& scratch,
                     std::vector<std::pair<size_t, size_t>>& out) const {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.md_);
  size_t start = 0;
  while (start < s.size()) {
    const int rc =
        jit_ ? pcre2_jit_match(code_, subject, s.size(), start, 0, scratch.md_, scratch.ctx_)
             : pcre2_match(code_, subject, s.size(), start, PCRE2_NO_UTF_CHECK, scratch.md_,
                           scratch.ctx_);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw Error(Errc::kUnsupported, "pre-tokenizer regex gave up at byte " +
                                          std::to_string(start) + " of a " +
                                          std::to_string(s.size()) +
                                          "-byte piece: " + reinterpret_cast<const char*>(msg));
    }
    if (ov[1] > ov[0]) {
      out.emplace_back(ov[0], ov[1]);
      start = ov[1];
    } else {  // an empty match: step over one character
      start = ov[0] + std::max<size_t>(1, detail::utf8_valid_length(s, ov[0]));
    }
  }
}

}  // namespace qf::rt
