#include "qf/ckpt/json.h"

#include <cstring>

namespace qf::ckpt {
namespace {

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string describe_char(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x21 && u < 0x7F) return std::string("'") + c + "'";
  char buf[16];
  std::snprintf(buf, sizeof buf, "byte 0x%02X", u);
  return buf;
}

}  // namespace

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

void JsonReader::fail(const std::string& message) const {
  throw JsonSyntaxError(pos_, message);
}

void JsonReader::skip_ws() {
  while (pos_ < s_.size() && is_ws(s_[pos_])) ++pos_;
}

char JsonReader::next_char_or_fail(const char* expecting) {
  skip_ws();
  if (pos_ >= s_.size()) fail(std::string("unexpected end of JSON, expected ") + expecting);
  return s_[pos_];
}

JsonType JsonReader::peek() {
  const char c = next_char_or_fail("a value");
  switch (c) {
    case '{':
      return JsonType::kObject;
    case '[':
      return JsonType::kArray;
    case '"':
      return JsonType::kString;
    case 't':
    case 'f':
      return JsonType::kBool;
    case 'n':
      return JsonType::kNull;
    default:
      if (c == '-' || is_digit(c)) return JsonType::kNumber;
      fail("expected a value, found " + describe_char(c));
  }
}

void JsonReader::push() {
  if (first_.size() >= static_cast<size_t>(kMaxDepth)) {
    fail("JSON nested deeper than " + std::to_string(kMaxDepth) + " levels");
  }
  first_.push_back(true);
}

void JsonReader::begin_object() {
  if (next_char_or_fail("'{'") != '{') fail("expected '{', found " + describe_char(s_[pos_]));
  ++pos_;
  push();
}

bool JsonReader::next_key(std::string& key) {
  char c = next_char_or_fail("a key or '}'");
  if (c == '}') {
    ++pos_;
    first_.pop_back();
    return false;
  }
  if (!first_.back()) {
    if (c != ',') fail("expected ',' or '}' after an object member, found " + describe_char(c));
    ++pos_;
    c = next_char_or_fail("a key");
  }
  first_.back() = false;
  if (c != '"') fail("expected a string key, found " + describe_char(c));
  parse_string_body(key);
  if (next_char_or_fail("':'") != ':') fail("expected ':' after a key");
  ++pos_;
  return true;
}

void JsonReader::begin_array() {
  if (next_char_or_fail("'['") != '[') fail("expected '[', found " + describe_char(s_[pos_]));
  ++pos_;
  push();
}

bool JsonReader::next_element() {
  const char c = next_char_or_fail("a value or ']'");
  if (c == ']') {
    ++pos_;
    first_.pop_back();
    return false;
  }
  if (!first_.back()) {
    if (c != ',') fail("expected ',' or ']' after an array element, found " + describe_char(c));
    ++pos_;
    if (next_char_or_fail("a value") == ']') fail("trailing comma before ']'");
  }
  first_.back() = false;
  return true;
}

void JsonReader::read_string(std::string& out) {
  const char c = next_char_or_fail("a string");
  if (c != '"') fail("expected a string, found " + describe_char(c));
  parse_string_body(out);
}

// pos_ is at the opening quote.
void JsonReader::parse_string_body(std::string& out) {
  out.clear();
  ++pos_;
  const size_t n = s_.size();
  while (true) {
    size_t run = pos_;
    while (run < n) {
      const auto u = static_cast<unsigned char>(s_[run]);
      if (u == '"' || u == '\\' || u < 0x20) break;
      ++run;
    }
    out.append(s_.data() + pos_, run - pos_);
    pos_ = run;
    if (pos_ >= n) fail("unterminated string");
    const char c = s_[pos_];
    if (c == '"') {
      ++pos_;
      return;
    }
    if (c == '\\') {
      append_escape(out);
      continue;
    }
    fail("control character " + describe_char(c) + " inside a string (must be escaped)");
  }
}

// pos_ is at the backslash.
void JsonReader::append_escape(std::string& out) {
  ++pos_;
  if (pos_ >= s_.size()) fail("unterminated escape sequence");
  const char e = s_[pos_++];
  switch (e) {
    case '"':
      out += '"';
      return;
    case '\\':
      out += '\\';
      return;
    case '/':
      out += '/';
      return;
    case 'b':
      out += '\b';
      return;
    case 'f':
      out += '\f';
      return;
    case 'n':
      out += '\n';
      return;
    case 'r':
      out += '\r';
      return;
    case 't':
      out += '\t';
      return;
    case 'u':
      break;
    default:
      --pos_;
      fail("invalid escape '\\" + std::string(1, e) + "'");
  }
  auto read_hex4 = [&]() -> uint32_t {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const int h = hex_value(s_[pos_ + i]);
      if (h < 0) fail("invalid hex digit in \\u escape");
      v = v << 4 | static_cast<uint32_t>(h);
    }
    pos_ += 4;
    return v;
  };
  uint32_t cp = read_hex4();
  if (cp >= 0xDC00 && cp <= 0xDFFF) fail("lone trailing surrogate in \\u escape");
  if (cp >= 0xD800 && cp <= 0xDBFF) {
    if (pos_ + 2 > s_.size() || s_[pos_] != '\\' || s_[pos_ + 1] != 'u') {
      fail("lone leading surrogate in \\u escape");
    }
    pos_ += 2;
    const uint32_t lo = read_hex4();
    if (lo < 0xDC00 || lo > 0xDFFF) fail("invalid trailing surrogate in \\u escape");
    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
  }
  append_utf8(out, cp);
}

JsonNumber JsonReader::read_number() {
  const char c0 = next_char_or_fail("a number");
  if (c0 != '-' && !is_digit(c0)) fail("expected a number, found " + describe_char(c0));
  JsonNumber num;
  const size_t start = pos_;
  const size_t n = s_.size();
  if (s_[pos_] == '-') {
    num.negative = true;
    ++pos_;
  }
  if (pos_ >= n || !is_digit(s_[pos_])) fail("expected a digit");
  num.fits_u64 = true;
  if (s_[pos_] == '0') {
    ++pos_;
    if (pos_ < n && is_digit(s_[pos_])) fail("leading zeros are not allowed in numbers");
  } else {
    while (pos_ < n && is_digit(s_[pos_])) {
      const uint64_t d = static_cast<uint64_t>(s_[pos_] - '0');
      if (num.magnitude > (UINT64_MAX - d) / 10) num.fits_u64 = false;
      if (num.fits_u64) num.magnitude = num.magnitude * 10 + d;
      ++pos_;
    }
  }
  num.integral = true;
  if (pos_ < n && s_[pos_] == '.') {
    num.integral = false;
    ++pos_;
    if (pos_ >= n || !is_digit(s_[pos_])) fail("expected a digit after '.'");
    while (pos_ < n && is_digit(s_[pos_])) ++pos_;
  }
  if (pos_ < n && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
    num.integral = false;
    ++pos_;
    if (pos_ < n && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
    if (pos_ >= n || !is_digit(s_[pos_])) fail("expected a digit in the exponent");
    while (pos_ < n && is_digit(s_[pos_])) ++pos_;
  }
  if (!num.integral) num.fits_u64 = false;
  if (!num.fits_u64) num.magnitude = 0;
  num.text = s_.substr(start, pos_ - start);
  return num;
}

bool JsonReader::read_bool() {
  const char c = next_char_or_fail("true or false");
  if (c == 't' && s_.substr(pos_, 4) == "true") {
    pos_ += 4;
    return true;
  }
  if (c == 'f' && s_.substr(pos_, 5) == "false") {
    pos_ += 5;
    return false;
  }
  fail("expected true or false");
}

void JsonReader::read_null() {
  next_char_or_fail("null");
  if (s_.substr(pos_, 4) != "null") fail("expected null");
  pos_ += 4;
}

std::string_view JsonReader::skip_value() {
  const JsonType type = peek();
  const size_t start = pos_;
  std::string scratch;
  switch (type) {
    case JsonType::kObject:
      begin_object();
      while (next_key(scratch)) skip_value();
      break;
    case JsonType::kArray:
      begin_array();
      while (next_element()) skip_value();
      break;
    case JsonType::kString:
      read_string(scratch);
      break;
    case JsonType::kNumber:
      read_number();
      break;
    case JsonType::kBool:
      read_bool();
      break;
    case JsonType::kNull:
      read_null();
      break;
  }
  return s_.substr(start, pos_ - start);
}

void JsonReader::expect_end() {
  skip_ws();
  if (pos_ != s_.size()) {
    fail("trailing characters after the JSON value, starting with " + describe_char(s_[pos_]));
  }
}

std::optional<size_t> utf8_error_offset(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // no overlong 3-byte forms
      if (c == 0xED) hi = 0x9F;  // no UTF-16 surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // no overlong 4-byte forms
      if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
    }
    i += len;
  }
  return std::nullopt;
}

void append_json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  static constexpr char kHex[] = "0123456789abcdef";
  auto append_u = [&](uint32_t v) {
    out += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(v >> shift) & 0xF];
  };
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      default:
        break;
    }
    if (c < 0x20 || (ensure_ascii && c == 0x7F)) {
      append_u(c);
    } else if (ensure_ascii && c >= 0x80) {
      // Decode one UTF-8 sequence (input is valid UTF-8 by contract).
      const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      uint32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
      for (size_t k = 1; k < len && i + k < s.size(); ++k) {
        cp = cp << 6 | (static_cast<unsigned char>(s[i + k]) & 0x3F);
      }
      i += len - 1;
      if (cp >= 0x10000) {
        cp -= 0x10000;
        append_u(0xD800 + (cp >> 10));
        append_u(0xDC00 + (cp & 0x3FF));
      } else {
        append_u(cp);
      }
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

std::string json_context(std::string_view text, size_t offset) {
  const size_t begin = offset > 24 ? offset - 24 : 0;
  const size_t end = std::min(text.size(), offset + 24);
  std::string out;
  for (size_t i = begin; i < end; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  return out;
}

}  // namespace qf::ckpt
