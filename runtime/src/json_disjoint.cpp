// Disjointness of grammar shapes (json_disjoint.h): a few sound proofs, tried recursively over
// anyOf alternatives, literal values and object properties, to a bounded depth.
#include "json_disjoint.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

namespace qf::rt {
namespace {

using Kind = JsonShape::Kind;
using Value = nlohmann::json;  // unordered: objects are equal whatever their keys' order

constexpr int kMaxDepth = 24;

// JSON types as bits.
constexpr uint8_t kObjectT = 1, kArrayT = 2, kStringT = 4, kNumberT = 8, kBooleanT = 16,
                  kNullT = 32, kAnyT = 63;

// The JSON type of a value by its first byte as written.
uint8_t type_of_text(char c) {
  switch (c) {
    case '{':
      return kObjectT;
    case '[':
      return kArrayT;
    case '"':
      return kStringT;
    case 't':
    case 'f':
      return kBooleanT;
    case 'n':
      return kNullT;
    default:
      return kNumberT;
  }
}

uint8_t type_of(const Value& v) {
  if (v.is_object()) return kObjectT;
  if (v.is_array()) return kArrayT;
  if (v.is_string()) return kStringT;
  if (v.is_number()) return kNumberT;
  if (v.is_boolean()) return kBooleanT;
  return kNullT;
}

class Prover {
 public:
  Prover(const JsonGrammar& g, int64_t& steps) : g_(g), steps_(steps) {}

  // The JSON types of the values that satisfy shape `s`'s schema.
  uint8_t types(int32_t s, int depth) const {
    const JsonShape& x = g_.shape(s);
    if (depth > kMaxDepth || --steps_ < 0 || x.implied_type) return kAnyT;
    switch (x.kind) {
      case Kind::kAny:
        return kAnyT;
      case Kind::kObject:
        return kObjectT;
      case Kind::kArray:
        return kArrayT;
      case Kind::kString:
        return kStringT;
      case Kind::kNumber:
      case Kind::kInteger:
        return kNumberT;
      case Kind::kLiteral: {
        uint8_t t = 0;
        for (const std::string& l : x.literals) t |= type_of_text(l[0]);
        return t;
      }
      case Kind::kAnyOf: {
        uint8_t t = 0;
        for (const int32_t alt : x.alternatives) t |= types(alt, depth + 1);
        return t;
      }
    }
    return kAnyT;
  }

  bool shapes(int32_t a, int32_t b, int depth) const {
    if (depth > kMaxDepth || --steps_ < 0) return false;
    if ((types(a, 0) & types(b, 0)) == 0) return true;
    const JsonShape& x = g_.shape(a);
    const JsonShape& y = g_.shape(b);
    if (x.kind == Kind::kAnyOf || y.kind == Kind::kAnyOf) {
      const bool left = x.kind == Kind::kAnyOf;
      for (const int32_t alt : (left ? x : y).alternatives) {
        if (!shapes(left ? alt : a, left ? b : alt, depth + 1)) return false;
      }
      return true;
    }
    if (x.kind == Kind::kLiteral || y.kind == Kind::kLiteral) {
      const bool left = x.kind == Kind::kLiteral;
      for (const std::string& l : (left ? x : y).literals) {
        if (!value(Value::parse(l), left ? b : a, depth + 1)) return false;
      }
      return true;
    }
    if (x.kind == Kind::kObject && y.kind == Kind::kObject)
      return objects(x, y, depth) || objects(y, x, depth);
    return false;
  }

 private:
  // Whether value `v` fails shape `s`.
  bool value(const Value& v, int32_t s, int depth) const {
    if (depth > kMaxDepth || --steps_ < 0) return false;
    if ((type_of(v) & types(s, 0)) == 0) return true;
    const JsonShape& x = g_.shape(s);
    switch (x.kind) {
      case Kind::kAnyOf:
        for (const int32_t alt : x.alternatives) {
          if (!value(v, alt, depth + 1)) return false;
        }
        return true;
      case Kind::kLiteral:
        for (const std::string& l : x.literals) {
          if (Value::parse(l) == v) return false;
        }
        return true;
      case Kind::kInteger:  // 1.0 is an integer; 1.5 is not
        return v.is_number_float() && std::floor(v.get<double>()) != v.get<double>();
      case Kind::kObject:
        if (!v.is_object()) return false;  // an object's schema without a type
        if (x.open) {
          for (const auto& [key, item] : v.items()) {
            if (value(item, x.values, depth + 1)) return true;
          }
          return false;
        }
        for (const JsonShape::Property& p : x.properties) {
          const std::string key = Value::parse(p.key).get<std::string>();
          const auto it = v.find(key);
          if (it == v.end() ? p.required : value(*it, p.shape, depth + 1)) return true;
        }
        if (x.closed) {
          for (const auto& [key, item] : v.items()) {
            if (!listed(x, key)) return true;
          }
        }
        return false;
      default:
        return false;
    }
  }

  static const JsonShape::Property* property(const JsonShape& o, const std::string& key) {
    for (const JsonShape::Property& p : o.properties) {
      if (p.key == key) return &p;
    }
    return nullptr;
  }
  static bool listed(const JsonShape& o, const std::string& raw_key) {
    return property(o, Value(raw_key).dump()) != nullptr;
  }

  // Whether a property `x` requires rules out every value of `y`: `y` does not allow it, or
  // its shapes in the two are disjoint.
  bool objects(const JsonShape& x, const JsonShape& y, int depth) const {
    if (x.open || y.open) return false;
    for (const JsonShape::Property& p : x.properties) {
      if (!p.required) continue;
      const JsonShape::Property* q = property(y, p.key);
      if (q == nullptr ? y.closed : shapes(p.shape, q->shape, depth + 1)) return true;
    }
    return false;
  }

  const JsonGrammar& g_;
  int64_t& steps_;
};

}  // namespace

bool disjoint_shapes(const JsonGrammar& g, int32_t a, int32_t b, int64_t& steps) {
  return Prover(g, steps).shapes(a, b, 0);
}

}  // namespace qf::rt
