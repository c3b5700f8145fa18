// NFC as Hugging Face tokenizers computes it. Its normalizer carries Unicode 9.0 data, utf8proc
// a newer version, and the two differ on characters added since (a mark of Unicode 14 with a
// nonzero combining class is reordered by utf8proc, left in place by tokenizers). So text is
// cut into stretches that each start at a character tokenizers' NFC never changes nor merges
// backwards (UAX #15 "stable" characters, kNfcUnstable's complement); a stretch without unstable
// characters is copied, the others go through utf8proc, which agrees with tokenizers on every
// character tokenizers knows. A stretch that starts with a character tokenizers does not know
// but utf8proc would move or decompose gets that character copied as is.
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <new>
#include <span>

#include "qf/error.h"
#include "unicode_classes.h"
#include "utf8.h"

namespace qf::rt::detail {
namespace {

bool in_table(std::span<const unicode::Range> table, uint32_t cp) {
  const auto it = std::upper_bound(table.begin(), table.end(), cp,
                                   [](uint32_t c, const unicode::Range& r) { return c < r.first; });
  return it != table.begin() && std::prev(it)->last >= cp;
}

// Every code point below U+0300 is stable (the table starts there).
bool unstable(uint32_t cp) {
  return cp >= 0x300 && in_table(unicode::kNfcUnstable, cp);
}

void append_utf8proc_nfc(std::string_view s, std::string& out) {
  if (s.empty()) return;
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
      &mapped, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(mapped, &std::free);
  if (n == UTF8PROC_ERROR_NOMEM) throw std::bad_alloc();
  QF_ASSERT(n >= 0, "utf8proc accepts the valid UTF-8 it is given");
  out.append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
}

// One stretch: a stable character (absent at the very start of the text) and the unstable ones
// after it.
void append_stretch(std::string_view s, std::string& out) {
  size_t len = 0;
  const uint32_t first = code_point(s, 0, len);
  if (!unstable(first) &&
      (in_table(unicode::kNfcUnknown, first) ||
       utf8proc_get_property(static_cast<utf8proc_int32_t>(first))->combining_class != 0)) {
    out.append(s.substr(0, len));  // a plain starter to tokenizers, not to utf8proc
    s.remove_prefix(len);
  }
  append_utf8proc_nfc(s, out);
}

}  // namespace

std::string_view nfc(std::string_view s, std::string& buffer) {
  constexpr size_t kNone = std::string_view::npos;
  size_t copied = 0;      // s[0, copied) is in buffer
  size_t stable = kNone;  // start of the last stable character
  bool changed = false;
  for (size_t i = 0; i < s.size();) {
    if (static_cast<uint8_t>(s[i]) < 0xCC) {  // lead bytes of U+0000..U+02FF
      stable = i;
      i += static_cast<uint8_t>(s[i]) < 0x80 ? 1 : 2;
      continue;
    }
    size_t len = 0;
    if (!unstable(code_point(s, i, len))) {
      stable = i;
      i += len;
      continue;
    }
    const size_t begin = stable != kNone && stable >= copied ? stable : copied;
    size_t end = i + len;
    for (size_t n = 0; end < s.size() && unstable(code_point(s, end, n));) end += n;
    if (!changed) buffer.clear();
    changed = true;
    buffer.append(s.substr(copied, begin - copied));
    append_stretch(s.substr(begin, end - begin), buffer);
    copied = i = end;
  }
  if (!changed) return s;
  buffer.append(s.substr(copied));
  return buffer;
}

}  // namespace qf::rt::detail
