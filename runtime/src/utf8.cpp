#include "utf8.h"

namespace qf::rt::detail {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// Bounds of the second byte for a lead byte (Unicode Table 3-7), or {0, 0} for a bad lead.
struct SecondByte {
  uint8_t lo, hi;
  int length;
};
SecondByte second_byte(uint8_t b0) {
  if (b0 >= 0xC2 && b0 <= 0xDF) return {0x80, 0xBF, 2};
  if (b0 == 0xE0) return {0xA0, 0xBF, 3};
  if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) return {0x80, 0xBF, 3};
  if (b0 == 0xED) return {0x80, 0x9F, 3};
  if (b0 == 0xF0) return {0x90, 0xBF, 4};
  if (b0 >= 0xF1 && b0 <= 0xF3) return {0x80, 0xBF, 4};
  if (b0 == 0xF4) return {0x80, 0x8F, 4};
  return {0, 0, 0};
}

// How many bytes from s[i] on match a well-formed sequence (possibly a truncated one), and the
// full length that sequence needs. matched == need means a complete character.
struct Prefix {
  size_t matched;
  int need;
};
Prefix valid_prefix(std::string_view s, size_t i) {
  const uint8_t b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return {1, 1};
  const SecondByte sb = second_byte(b0);
  if (sb.length == 0) return {0, 0};
  size_t n = 1;
  for (int k = 1; k < sb.length && i + n < s.size(); ++k) {
    const uint8_t b = static_cast<uint8_t>(s[i + n]);
    const uint8_t lo = k == 1 ? sb.lo : 0x80, hi = k == 1 ? sb.hi : 0xBF;
    if (b < lo || b > hi) break;
    ++n;
  }
  return {n, sb.length};
}

struct ByteTables {
  std::array<uint32_t, 256> to_char{};
  std::array<int16_t, 324> to_byte{};  // code points < 0x144
  ByteTables() {
    to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_char[b] = printable ? static_cast<uint32_t>(b) : 0x100u + static_cast<uint32_t>(extra++);
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteTables& tables() {
  static const ByteTables t;
  return t;
}

}  // namespace

size_t utf8_valid_length(std::string_view s, size_t i) {
  const Prefix p = valid_prefix(s, i);
  return p.need > 0 && p.matched == static_cast<size_t>(p.need) ? p.matched : 0;
}

size_t utf8_incomplete_tail(std::string_view s) {
  // A sequence is at most 4 bytes: its lead is among the last 3 bytes.
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const size_t i = s.size() - back;
    const uint8_t b = static_cast<uint8_t>(s[i]);
    if (b < 0x80) return 0;
    if (b >= 0xC0) {
      const Prefix p = valid_prefix(s, i);
      return p.need > 0 && p.matched == back && back < static_cast<size_t>(p.need) ? back : 0;
    }
  }
  return 0;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const Prefix p = valid_prefix(bytes, i);
    if (p.need > 0 && p.matched == static_cast<size_t>(p.need)) {
      out.append(bytes.substr(i, p.matched));
      i += p.matched;
    } else {
      out += kReplacement;  // one U+FFFD per maximal subpart (at least one byte)
      i += p.matched > 0 ? p.matched : 1;
    }
  }
  return out;
}

uint32_t byte_char(uint8_t b) {
  return tables().to_char[b];
}

int char_byte(uint32_t cp) {
  return cp < tables().to_byte.size() ? tables().to_byte[cp] : -1;
}

uint32_t code_point(std::string_view s, size_t i, size_t& len) {
  len = utf8_valid_length(s, i);
  uint32_t cp = static_cast<uint8_t>(s[i]);
  if (len > 1) {
    cp &= 0xFFu >> (len + 1);
    for (size_t k = 1; k < len; ++k) cp = cp << 6 | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  }
  return cp;
}

bool byte_level_to_bytes(std::string_view s, std::string& out) {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    size_t n = 0;
    const uint32_t cp = code_point(s, i, n);
    if (n == 0) return false;
    const int b = char_byte(cp);
    if (b < 0) return false;
    out += static_cast<char>(b);
    i += n;
  }
  return true;
}

}  // namespace qf::rt::detail
