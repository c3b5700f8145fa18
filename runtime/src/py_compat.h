// Internal: the Python string semantics Hugging Face chat templates rely on, so that a native
// renderer produces byte-for-byte what transformers' Jinja rendering produces.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace qf::rt::detail {

// Python's str.strip() with no argument (Jinja's `trim` filter): drops leading and trailing code
// points for which str.isspace() is true (ASCII \t\n\v\f\r, space, U+001C..U+001F, U+0085,
// U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000). Bytes that are not
// valid UTF-8 count as non-space. Returns a view into `s`.
std::string_view py_strip(std::string_view s);

// Python's str.lstrip('\n') / str.rstrip('\n').
std::string_view lstrip_newlines(std::string_view s);
std::string_view rstrip_newlines(std::string_view s);

// json.dumps(value, ensure_ascii=False) with the default separators (", " and ": "): the
// `tojson` filter transformers gives chat templates. Object keys stay in their stored order;
// strings escape only '"', '\\' and U+0000..U+001F (\b \f \n \r \t, else \u00xx); numbers are
// written as Python writes the int or float json.loads makes of them.
std::string py_json_dumps(const nlohmann::ordered_json& value);

// str() of the Python object json.loads makes of the scalar `value`: strings as they are,
// True/False, None, ints in decimal, floats as repr() (shortest round-trip digits, "1e+16",
// "1e-05", "1.0"). `value` must not be an object or array (Python's str() of those is not JSON
// and no template this serves asks for it).
std::string py_str(const nlohmann::ordered_json& value);

// Python's repr() of a double.
std::string py_float_repr(double x);

}  // namespace qf::rt::detail
