// A checker of JSON values against a JSON schema, written from the JSON Schema rules (not from
// qforge's matcher), for the keywords JsonGrammar takes (json_grammar.h). Header-only and
// without gtest, so that the fuzz targets (tests/fuzz) use it too.
#pragma once

#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>
#include <stdexcept>
#include <string>

namespace qf::test {

using Json = nlohmann::ordered_json;

// Whether `s` is what JSON Schema's `format` names (RFC 3339 date, time, date-time with
// February 29 in any year; RFC 4122 uuid; dotted-quad ipv4).
inline bool has_format(const std::string& s, const std::string& format) {
  const auto digits = [&](size_t at, size_t n) {
    if (at + n > s.size()) return -1;
    int v = 0;
    for (size_t i = at; i < at + n; ++i) {
      if (s[i] < '0' || s[i] > '9') return -1;
      v = v * 10 + (s[i] - '0');
    }
    return v;
  };
  const auto date = [&](size_t at) {  // yyyy-mm-dd at `at`
    const int y = digits(at, 4), m = digits(at + 5, 2), d = digits(at + 8, 2);
    const int days[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return y >= 0 && s.size() >= at + 10 && s[at + 4] == '-' && s[at + 7] == '-' && m >= 1 &&
           m <= 12 && d >= 1 && d <= days[m - 1];
  };
  const auto time = [&](size_t at) {  // hh:mm:ss[.f+](Z|+hh:mm) from `at` to the end
    const int h = digits(at, 2), m = digits(at + 3, 2), sec = digits(at + 6, 2);
    if (h < 0 || h > 23 || m < 0 || m > 59 || sec < 0 || sec > 60 || s[at + 2] != ':' ||
        s[at + 5] != ':')
      return false;
    size_t i = at + 8;
    if (i < s.size() && s[i] == '.') {
      const size_t f = ++i;
      while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
      if (i == f) return false;
    }
    if (i + 1 == s.size() && (s[i] == 'Z' || s[i] == 'z')) return true;
    const int oh = digits(i + 1, 2), om = digits(i + 4, 2);
    return i + 6 == s.size() && (s[i] == '+' || s[i] == '-') && oh >= 0 && oh <= 23 &&
           s[i + 3] == ':' && om >= 0 && om <= 59;
  };
  if (format == "date") return s.size() == 10 && date(0);
  if (format == "time") return time(0);
  if (format == "date-time")
    return s.size() > 11 && date(0) && (s[10] == 'T' || s[10] == 't') && time(11);
  if (format == "uuid") {
    if (s.size() != 36) return false;
    for (size_t i = 0; i < 36; ++i) {
      const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
      if (dash != (s[i] == '-') || (!dash && !std::isxdigit(static_cast<unsigned char>(s[i]))))
        return false;
    }
    return true;
  }
  if (format == "ipv4") {
    size_t at = 0;
    for (int part = 0; part < 4; ++part) {
      size_t end = at;
      while (end < s.size() && s[end] >= '0' && s[end] <= '9') ++end;
      const size_t n = end - at;
      if (n == 0 || n > 3 || (n > 1 && s[at] == '0') || std::stoi(s.substr(at, n)) > 255)
        return false;
      if (part < 3 && (end >= s.size() || s[end] != '.')) return false;
      at = end + 1;
    }
    return at == s.size() + 1;
  }
  throw std::logic_error("json_satisfies.h has no check for the format " + format);
}

// Whether `v` satisfies `schema` (the keywords JsonGrammar takes), by the JSON Schema rules;
// `doc` resolves $ref.
inline bool satisfies(const Json& v, const Json& schema, const Json& doc) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (schema.contains("$ref"))
    return satisfies(v, doc.at(Json::json_pointer(schema["$ref"].get<std::string>().substr(1))),
                     doc);
  if (schema.contains("allOf")) return satisfies(v, schema["allOf"][0], doc);
  if (schema.contains("const")) return v == schema["const"];
  if (schema.contains("enum")) {
    for (const Json& e : schema["enum"]) {
      if (v == e) return true;
    }
    return false;
  }
  if (schema.contains("anyOf")) {
    for (const Json& alt : schema["anyOf"]) {
      if (satisfies(v, alt, doc)) return true;
    }
    return false;
  }
  if (schema.contains("oneOf")) {
    int matches = 0;
    for (const Json& alt : schema["oneOf"]) matches += satisfies(v, alt, doc);
    return matches == 1;
  }
  if (schema.contains("type")) {
    const Json t = schema["type"].is_array() ? schema["type"] : Json::array({schema["type"]});
    bool typed = false;
    for (const Json& name : t) {
      typed = typed || (name == "object" && v.is_object()) || (name == "array" && v.is_array()) ||
              (name == "string" && v.is_string()) || (name == "number" && v.is_number()) ||
              (name == "integer" && v.is_number() &&  // a whole number, however large
               (v.is_number_integer() || std::floor(v.get<double>()) == v.get<double>())) ||
              (name == "boolean" && v.is_boolean()) || (name == "null" && v.is_null());
    }
    if (!typed) return false;
  }
  if (v.is_object()) {
    const Json props = schema.value("properties", Json::object());
    for (const Json& r : schema.value("required", Json::array())) {
      if (!v.contains(r.get<std::string>())) return false;
    }
    for (const auto& [key, value] : v.items()) {
      if (props.contains(key)) {
        if (!satisfies(value, props[key], doc)) return false;
      } else if (schema.contains("additionalProperties")) {
        if (!satisfies(value, schema["additionalProperties"], doc)) return false;
      }
    }
  }
  if (v.is_array()) {
    if (v.size() < schema.value("minItems", size_t{0})) return false;
    if (schema.contains("maxItems") && v.size() > schema["maxItems"].get<size_t>()) return false;
    for (const Json& item : v) {
      if (schema.contains("items") && !satisfies(item, schema["items"], doc)) return false;
    }
  }
  if (v.is_string()) {
    size_t chars = 0;  // code points
    for (const char c : v.get<std::string>()) chars += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
    if (chars < schema.value("minLength", size_t{0})) return false;
    if (schema.contains("maxLength") && chars > schema["maxLength"].get<size_t>()) return false;
    if (schema.contains("pattern") &&
        !std::regex_search(v.get<std::string>(), std::regex(schema["pattern"].get<std::string>(),
                                                            std::regex::ECMAScript)))
      return false;
    if (schema.contains("format") && !has_format(v.get<std::string>(), schema["format"]))
      return false;
  }
  if (v.is_number()) {  // as doubles, as most validators compare them
    const double x = v.get<double>();
    const auto flag = [&](const char* key) {
      return schema.contains(key) && schema[key].is_boolean() && schema[key].get<bool>();
    };
    const auto number = [&](const char* key) {
      return schema.contains(key) && schema[key].is_number();
    };
    if (number("minimum") && (flag("exclusiveMinimum") ? !(x > schema["minimum"].get<double>())
                                                       : !(x >= schema["minimum"].get<double>())))
      return false;
    if (number("maximum") && (flag("exclusiveMaximum") ? !(x < schema["maximum"].get<double>())
                                                       : !(x <= schema["maximum"].get<double>())))
      return false;
    if (number("exclusiveMinimum") && !(x > schema["exclusiveMinimum"].get<double>())) return false;
    if (number("exclusiveMaximum") && !(x < schema["exclusiveMaximum"].get<double>())) return false;
  }
  return true;
}

}  // namespace qf::test
