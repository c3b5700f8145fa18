#include "py_compat.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "qf/error.h"
#include "utf8.h"

namespace qf::rt::detail {
namespace {

using Json = nlohmann::ordered_json;

bool py_isspace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// The code point of the valid `len`-byte UTF-8 sequence at s[i].
uint32_t decode_at(std::string_view s, size_t i, size_t len) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[i + k])); };
  switch (len) {
    case 1:
      return b(0);
    case 2:
      return (b(0) & 0x1F) << 6 | (b(1) & 0x3F);
    case 3:
      return (b(0) & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F);
    default:
      return (b(0) & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F);
  }
}

// Length of the whitespace code point ending at s[end - 1], or 0 if there is none.
size_t space_before(std::string_view s, size_t end) {
  for (size_t len = 1; len <= 4 && len <= end; ++len) {
    const size_t start = end - len;
    const auto byte = static_cast<uint8_t>(s[start]);
    if ((byte & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t valid = utf8_valid_length(s, start);
    return valid == len && py_isspace(decode_at(s, start, len)) ? len : 0;
  }
  return 0;
}

void append_string(std::string& out, const std::string& s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<uint8_t>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void append_json(std::string& out, const Json& v) {
  switch (v.type()) {
    case Json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out += ", ";
        first = false;
        append_string(out, key);
        out += ": ";
        append_json(out, item);
      }
      out += '}';
      break;
    }
    case Json::value_t::array: {
      out += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        if (i > 0) out += ", ";
        append_json(out, v[i]);
      }
      out += ']';
      break;
    }
    case Json::value_t::string:
      append_string(out, v.get_ref<const std::string&>());
      break;
    case Json::value_t::boolean:
      out += v.get<bool>() ? "true" : "false";
      break;
    case Json::value_t::number_float: {
      // json.dumps writes non-finite floats as JavaScript literals (allow_nan=True).
      const double x = v.get<double>();
      if (std::isnan(x)) {
        out += "NaN";
      } else if (std::isinf(x)) {
        out += x < 0 ? "-Infinity" : "Infinity";
      } else {
        out += py_float_repr(x);
      }
      break;
    }
    case Json::value_t::number_integer:
      out += std::to_string(v.get<int64_t>());
      break;
    case Json::value_t::number_unsigned:
      out += std::to_string(v.get<uint64_t>());
      break;
    default:  // null, and the binary type no JSON text produces
      out += "null";
  }
}

}  // namespace

std::string_view py_strip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    const size_t len = utf8_valid_length(s, begin);
    if (len == 0 || !py_isspace(decode_at(s, begin, len))) break;
    begin += len;
  }
  size_t end = s.size();
  while (end > begin) {
    const size_t len = space_before(s, end);
    if (len == 0) break;
    end -= len;
  }
  return s.substr(begin, end - begin);
}

std::string_view lstrip_newlines(std::string_view s) {
  const size_t i = s.find_first_not_of('\n');
  return i == std::string_view::npos ? std::string_view() : s.substr(i);
}

std::string_view rstrip_newlines(std::string_view s) {
  const size_t i = s.find_last_not_of('\n');
  return i == std::string_view::npos ? std::string_view() : s.substr(0, i + 1);
}

std::string py_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  // Shortest round-trip digits, as Python's repr (David Gay's mode 0) chooses them.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  QF_ASSERT(res.ec == std::errc(), "to_chars of a finite double");
  const std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  const size_t e_pos = sci.find('e');
  std::string out;
  std::string digits;
  for (const char c : sci.substr(0, e_pos)) {
    if (c == '-') {
      out += '-';
    } else if (c != '.') {
      digits += c;
    }
  }
  int exp10 = 0;
  const std::string_view exp_text = sci.substr(e_pos + 1);
  std::from_chars(exp_text.data() + (exp_text[0] == '+' ? 1 : 0), exp_text.data() + exp_text.size(),
                  exp10);
  // Python's float_repr_style "short": decimal point after `decpt` digits; exponent notation
  // when decpt <= -4 or decpt > 16, else positional with at least one digit after the point.
  const int decpt = exp10 + 1;
  const int n = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (n > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += exp_buf;
  } else if (decpt <= 0) {
    out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
  } else if (decpt >= n) {
    out += digits + std::string(static_cast<size_t>(decpt - n), '0') + ".0";
  } else {
    out += digits.substr(0, static_cast<size_t>(decpt)) + "." +
           digits.substr(static_cast<size_t>(decpt));
  }
  return out;
}

std::string py_json_dumps(const Json& value) {
  std::string out;
  append_json(out, value);
  return out;
}

std::string py_str(const Json& value) {
  QF_ASSERT(!value.is_structured(), "py_str takes a scalar");
  switch (value.type()) {
    case Json::value_t::string:
      return value.get<std::string>();
    case Json::value_t::boolean:
      return value.get<bool>() ? "True" : "False";
    case Json::value_t::null:
      return "None";
    case Json::value_t::number_float:
      return py_float_repr(value.get<double>());
    default:
      return py_json_dumps(value);  // integers
  }
}

}  // namespace qf::rt::detail
