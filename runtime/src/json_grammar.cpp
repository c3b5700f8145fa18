// JSON schemas to JsonGrammar shapes (json_grammar.h): one pass over the schema, `$ref`s
// compiled once each (so recursive schemas close on themselves).
#include "qf/rt/json_grammar.h"

#include <functional>
#include <map>
#include <set>

#include "json_disjoint.h"
#include "qf/error.h"
#include "qf/rt/json_number.h"

namespace qf::rt {

using Json = nlohmann::ordered_json;
using Kind = JsonShape::Kind;

namespace {

JsonShape of_kind(Kind k) {
  JsonShape s;
  s.kind = k;
  return s;
}

JsonShape literal(std::vector<std::string> values) {
  JsonShape s = of_kind(Kind::kLiteral);
  s.literals = std::move(values);
  return s;
}

// Keywords that only annotate: they never make a value invalid.
const std::set<std::string>& annotations() {
  static const std::set<std::string> k = {
      "title",         "description", "default",          "examples",
      "$schema",       "$id",         "$comment",         "deprecated",
      "readOnly",      "writeOnly",   "contentMediaType", "contentEncoding",
      "$defs",         "definitions", "$anchor",          "nullable",
      "discriminator", "$vocabulary", "$dynamicAnchor"};
  return k;
}

// The keywords this compiler enforces; any other key that is not an annotation is refused.
const std::set<std::string>& enforced() {
  static const std::set<std::string> k = {"type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "items",
                                          "minItems",
                                          "maxItems",
                                          "minLength",
                                          "maxLength",
                                          "enum",
                                          "const",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref",
                                          "pattern",
                                          "format",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum"};
  return k;
}

}  // namespace

class SchemaCompiler {
 public:
  SchemaCompiler(JsonGrammar& g, const Json& doc) : g_(g), doc_(doc) {}

  int32_t compile(const Json& s, const std::string& at) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(at, "the schema false admits no value");
      return JsonGrammar::kAnyValue;
    }
    if (!s.is_object()) fail(at, "a schema must be an object or a boolean, got " + dump(s));
    for (const auto& [key, value] : s.items()) {
      if (!enforced().count(key) && !annotations().count(key)) {
        fail(at, "the keyword '" + key + "' is not supported (supported: type, properties, " +
                     "required, additionalProperties, items, minItems, maxItems, minLength, " +
                     "maxLength, pattern, format, minimum, maximum, exclusiveMinimum, " +
                     "exclusiveMaximum, enum, const, anyOf, oneOf of disjoint schemas, allOf of " +
                     "one schema, $ref)");
      }
    }
    if (const auto r = s.find("$ref"); r != s.end()) {
      for (const auto& [key, value] : s.items()) {
        if (key != "$ref" && enforced().count(key))
          fail(at, "'" + key + "' beside '$ref' is not supported");
      }
      return reference(*r, at + ".$ref");
    }
    if (const auto a = s.find("allOf"); a != s.end()) {
      if (!a->is_array() || a->size() != 1)
        fail(at + ".allOf", "only an allOf of exactly one schema is supported");
      for (const auto& [key, value] : s.items()) {
        if (key != "allOf" && enforced().count(key))
          fail(at, "'" + key + "' beside 'allOf' is not supported");
      }
      return compile((*a)[0], at + ".allOf[0]");
    }
    if (const auto c = s.find("const"); c != s.end()) return add(literal({c->dump()}));
    if (const auto e = s.find("enum"); e != s.end()) {
      if (!e->is_array() || e->empty()) fail(at + ".enum", "must be a non-empty array");
      std::vector<std::string> values;
      for (const Json& v : *e) values.push_back(v.dump());
      return add(literal(std::move(values)));
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      const auto a = s.find(key);
      if (a == s.end()) continue;
      const std::string where = at + "." + key;
      if (!a->is_array() || a->empty()) fail(where, "must be a non-empty array");
      for (const char* other : {"type", "anyOf", "oneOf"}) {
        if (other != std::string(key) && s.contains(other))
          fail(at, "'" + std::string(other) + "' beside '" + key + "' is not supported");
      }
      JsonShape any = of_kind(Kind::kAnyOf);
      for (size_t i = 0; i < a->size(); ++i)
        any.alternatives.push_back(compile((*a)[i], where + "[" + std::to_string(i) + "]"));
      const int32_t id = add(std::move(any));
      if (key == std::string("oneOf")) one_of_.emplace_back(id, where);
      return id;
    }
    const auto t = s.find("type");
    if (t == s.end()) {
      const std::string implied = implied_type(s);
      if (implied.empty()) return JsonGrammar::kAnyValue;
      JsonShape shape = g_.shapes_[static_cast<size_t>(typed(s, implied, at))];
      shape.implied_type = true;
      return add(std::move(shape));
    }
    if (t->is_string()) return typed(s, t->get<std::string>(), at);
    if (!t->is_array() || t->empty())
      fail(at + ".type", "must be a type name or a non-empty array of them");
    JsonShape any = of_kind(Kind::kAnyOf);
    for (const Json& name : *t) {
      if (!name.is_string()) fail(at + ".type", "must hold type names, got " + dump(name));
      any.alternatives.push_back(typed(s, name.get<std::string>(), at));
    }
    return any.alternatives.size() == 1 ? any.alternatives[0] : add(std::move(any));
  }

  // No shape reaches itself through anyOf alternatives alone (a `$ref` back to its own target
  // with no object, array or string around it): the matcher would open such a value forever.
  void check_left_recursion() const {
    std::map<int32_t, std::string> target;  // a $ref's shape -> the pointer it names
    for (const auto& [pointer, id] : refs_) target[id] = pointer;
    std::vector<uint8_t> state(g_.shapes_.size(), 0);  // 0 new, 1 on the path, 2 done
    const std::function<void(int32_t)> visit = [&](int32_t i) {
      state[static_cast<size_t>(i)] = 1;
      for (const int32_t alt : g_.shape(i).alternatives) {
        if (g_.shape(alt).kind != Kind::kAnyOf || state[static_cast<size_t>(alt)] == 2) continue;
        if (state[static_cast<size_t>(alt)] == 1) {
          const auto t = target.find(alt);
          fail(t == target.end() ? "schema" : "schema" + t->second.substr(1),
               "it refers back to itself through anyOf, oneOf, allOf or $ref alone, before any "
               "object, array or string (left recursion is not supported)");
        }
        visit(alt);
      }
      state[static_cast<size_t>(i)] = 2;
    };
    for (size_t i = 0; i < g_.shapes_.size(); ++i) {
      if (g_.shapes_[i].kind == Kind::kAnyOf && state[i] == 0) visit(static_cast<int32_t>(i));
    }
  }

  // Every oneOf's alternatives pairwise disjoint (json_disjoint.h), so that the anyOf the
  // matcher walks writes values that match exactly one; run once every shape is compiled.
  void check_one_of() const {
    int64_t steps = kDisjointSteps;
    for (const auto& [id, at] : one_of_) {
      const std::vector<int32_t>& alt = g_.shape(id).alternatives;
      for (size_t i = 0; i < alt.size(); ++i) {
        for (size_t j = i + 1; j < alt.size(); ++j) {
          if (disjoint_shapes(g_, alt[i], alt[j], steps)) continue;
          if (steps < 0) {
            fail(at, "its alternatives could not be told apart within " +
                         std::to_string(kDisjointSteps) + " proof steps; use anyOf");
          }
          fail(at, "alternatives " + std::to_string(i) + " and " + std::to_string(j) +
                       " may both match a value (oneOf is enforced where its alternatives are "
                       "disjoint: of different types, different enum or const values, or "
                       "objects told apart by a required property; use anyOf if a value may "
                       "match more than one)");
        }
      }
    }
  }

 private:
  [[noreturn]] static void fail(const std::string& at, const std::string& what) {
    throw Error(Errc::kUsage, at + ": " + what);
  }
  static std::string dump(const Json& v) {
    std::string d = v.dump();
    return d.size() > 60 ? d.substr(0, 57) + "..." : d;
  }

  int32_t add(JsonShape s) {
    g_.shapes_.push_back(std::move(s));
    return static_cast<int32_t>(g_.shapes_.size() - 1);
  }

  // With no `type`, what the other keywords imply ("" for any value).
  static std::string implied_type(const Json& s) {
    if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties"))
      return "object";
    if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) return "array";
    if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern") ||
        s.contains("format"))
      return "string";
    if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
        s.contains("exclusiveMaximum"))
      return "number";
    return "";
  }

  int64_t count(const Json& s, const char* key, int64_t none, const std::string& at) const {
    const auto it = s.find(key);
    if (it == s.end()) return none;
    if (!it->is_number_integer() || it->get<int64_t>() < 0)
      fail(at + "." + key, "must be a non-negative integer, got " + dump(*it));
    return it->get<int64_t>();
  }

  // `type` a type name ("" is none: refused as unknown; fuzz_schema found it taken as any).
  int32_t typed(const Json& s, const std::string& type, const std::string& at) {
    if (type == "object") return object(s, at);
    if (type == "array") {
      JsonShape a = of_kind(Kind::kArray);
      const auto items = s.find("items");
      a.items = items == s.end() ? JsonGrammar::kAnyValue : compile(*items, at + ".items");
      a.min_items = count(s, "minItems", 0, at);
      a.max_items = count(s, "maxItems", -1, at);
      if (a.max_items >= 0 && a.min_items > a.max_items)
        fail(at, "minItems " + std::to_string(a.min_items) + " > maxItems " +
                     std::to_string(a.max_items));
      return add(std::move(a));
    }
    if (type == "string") {
      JsonShape str = of_kind(Kind::kString);
      str.min_length = count(s, "minLength", 0, at);
      str.max_length = count(s, "maxLength", -1, at);
      if (str.max_length >= 0 && str.min_length > str.max_length)
        fail(at, "minLength " + std::to_string(str.min_length) + " > maxLength " +
                     std::to_string(str.max_length));
      str.pattern = pattern(s, str.min_length, str.max_length, at);
      if (str.min_length == 0 && str.max_length < 0 && str.pattern < 0)
        return JsonGrammar::kAnyString;
      return add(std::move(str));
    }
    if (type == "number" || type == "integer") return number(s, type == "integer", at);
    if (type == "boolean") return JsonGrammar::kBoolean;
    if (type == "null") return JsonGrammar::kNull;
    fail(at + ".type", "unknown type \"" + type + "\"");
  }

  // The string's `pattern` or `format` with its lengths, as a DFA of the grammar (-1: none).
  int32_t pattern(const Json& s, int64_t min_length, int64_t max_length, const std::string& at) {
    const auto p = s.find("pattern");
    const auto f = s.find("format");
    if (p == s.end() && f == s.end()) return -1;
    if (p != s.end() && f != s.end()) fail(at, "'format' beside 'pattern' is not supported");
    std::string where = at + ".pattern", regex;
    if (p != s.end()) {
      if (!p->is_string()) fail(where, "must be a string, got " + dump(*p));
      regex = p->get<std::string>();
    } else {
      where = at + ".format";
      if (!f->is_string()) fail(where, "must be a string, got " + dump(*f));
      regex = format_pattern(f->get<std::string>(), where);
    }
    try {
      g_.patterns_.push_back(ByteDfa::compile(regex, min_length, max_length));
    } catch (const Error& e) {
      fail(where, e.what());
    }
    return static_cast<int32_t>(g_.patterns_.size() - 1);
  }

  // A number or integer, with its bounds as a DFA of the grammar when it has any.
  int32_t number(const Json& s, bool integer, const std::string& at) {
    NumberBounds b;
    b.integer = integer;
    const auto bound = [&](const char* key, std::string& out) {
      const auto it = s.find(key);
      // A boolean exclusive bound is draft 4's form, below.
      if (it == s.end() || (it->is_boolean() && std::string(key).rfind("exclusive", 0) == 0))
        return;
      if (!it->is_number()) fail(at + "." + key, "must be a number, got " + dump(*it));
      out = it->dump();
    };
    bound("minimum", b.minimum);
    bound("maximum", b.maximum);
    bound("exclusiveMinimum", b.exclusive_minimum);
    bound("exclusiveMaximum", b.exclusive_maximum);
    // Draft 4's form: a boolean that makes minimum or maximum exclusive.
    const auto draft4 = [&](const char* key, const char* of, std::string& from, std::string& to) {
      const auto it = s.find(key);
      if (it == s.end() || !it->is_boolean() || !it->get<bool>()) return;
      if (from.empty()) fail(at + "." + key, std::string("true needs '") + of + "' beside it");
      to = from;
      from.clear();
    };
    draft4("exclusiveMinimum", "minimum", b.minimum, b.exclusive_minimum);
    draft4("exclusiveMaximum", "maximum", b.maximum, b.exclusive_maximum);
    JsonShape n = of_kind(integer ? Kind::kInteger : Kind::kNumber);
    if (b.minimum.empty() && b.maximum.empty() && b.exclusive_minimum.empty() &&
        b.exclusive_maximum.empty())
      return integer ? add(std::move(n)) : JsonGrammar::kAnyNumber;
    try {
      g_.patterns_.push_back(bounded_number_dfa(b));
    } catch (const Error& e) {
      fail(at, e.what());
    }
    n.pattern = static_cast<int32_t>(g_.patterns_.size() - 1);
    return add(std::move(n));
  }

  static std::string format_pattern(const std::string& format, const std::string& at) {
    const std::string date =
        "\\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])|(0[469]|11)-(0[1-9]|[12]\\d|30)|"
        "02-(0[1-9]|1\\d|2\\d))";
    const std::string time =
        "([01]\\d|2[0-3]):[0-5]\\d:([0-5]\\d|60)(\\.\\d+)?([Zz]|[+-]([01]\\d|2[0-3]):[0-5]\\d)";
    const std::string octet = "(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)";
    if (format == "date") return "^" + date + "$";
    if (format == "time") return "^" + time + "$";
    if (format == "date-time") return "^" + date + "[Tt]" + time + "$";
    if (format == "uuid") {
      return "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
    }
    if (format == "ipv4") return "^(" + octet + "\\.){3}" + octet + "$";
    fail(at, "the format \"" + format +
                 "\" is not supported (supported: date, time, date-time, uuid, ipv4)");
  }

  int32_t object(const Json& s, const std::string& at) {
    JsonShape o = of_kind(Kind::kObject);
    const auto props = s.find("properties");
    const auto extra = s.find("additionalProperties");
    if (props != s.end() && !props->is_object())
      fail(at + ".properties", "must be an object, got " + dump(*props));
    const bool listed = props != s.end();
    if (extra != s.end() && !extra->is_boolean() && !extra->is_object())
      fail(at + ".additionalProperties", "must be a boolean or a schema");
    const bool closed_extra = extra != s.end() && extra->is_boolean() && !extra->get<bool>();
    if (listed && extra != s.end() && !closed_extra) {
      fail(at + ".additionalProperties",
           "keys beyond 'properties' are not supported (set it to false or leave it out)");
    }
    std::set<std::string> required;
    if (const auto r = s.find("required"); r != s.end()) {
      if (!r->is_array()) fail(at + ".required", "must be an array of property names");
      for (const Json& name : *r) {
        if (!name.is_string()) fail(at + ".required", "must hold strings, got " + dump(name));
        if (!listed || !props->contains(name.get<std::string>())) {
          fail(at + ".required",
               "names \"" + name.get<std::string>() + "\", which 'properties' does not list");
        }
        required.insert(name.get<std::string>());
      }
    }
    if (!listed && !closed_extra) {  // any keys: their values as additionalProperties says
      o.open = true;
      o.values = extra == s.end() || extra->is_boolean()
                     ? JsonGrammar::kAnyValue
                     : compile(*extra, at + ".additionalProperties");
      return add(std::move(o));
    }
    if (listed) {
      for (const auto& [key, value] : props->items()) {
        JsonShape::Property p;
        p.key = Json(key).dump();
        p.required = required.count(key) > 0;
        p.shape = compile(value, at + ".properties." + key);
        o.properties.push_back(std::move(p));
      }
    }
    o.closed = closed_extra;
    const size_t n = o.properties.size();
    o.first_required.assign(n + 1, static_cast<uint32_t>(n));
    for (size_t i = n; i-- > 0;)
      o.first_required[i] =
          o.properties[i].required ? static_cast<uint32_t>(i) : o.first_required[i + 1];
    return add(std::move(o));
  }

  int32_t reference(const Json& ref, const std::string& at) {
    if (!ref.is_string() || ref.get<std::string>().rfind('#', 0) != 0)
      fail(at, "only references within the document (\"#...\") are supported, got " + dump(ref));
    const std::string target = ref.get<std::string>();
    if (const auto it = refs_.find(target); it != refs_.end()) return it->second;
    const Json* t = nullptr;
    try {
      t = &doc_.at(Json::json_pointer(target.substr(1)));
    } catch (const Json::exception&) {
      fail(at, "\"" + target + "\" names nothing in the schema");
    }
    // An anyOf of one alternative stands for the target, so a recursive reference can name it
    // before it is compiled.
    JsonShape forward = of_kind(Kind::kAnyOf);
    const int32_t id = add(std::move(forward));
    refs_[target] = id;
    const int32_t body = compile(*t, "schema" + std::string(target.begin() + 1, target.end()));
    g_.shapes_[static_cast<size_t>(id)].alternatives = {body};
    return id;
  }

  JsonGrammar& g_;
  const Json& doc_;
  std::map<std::string, int32_t> refs_;
  std::vector<std::pair<int32_t, std::string>> one_of_;  // shape, place
};

JsonGrammar::JsonGrammar() {
  shapes_.resize(7);
  shapes_[kAnyValue] = of_kind(Kind::kAny);
  shapes_[kAnyObject] = of_kind(Kind::kObject);
  shapes_[kAnyObject].open = true;
  shapes_[kAnyObject].values = kAnyValue;
  shapes_[kAnyArray] = of_kind(Kind::kArray);
  shapes_[kAnyArray].items = kAnyValue;
  shapes_[kAnyString] = of_kind(Kind::kString);
  shapes_[kAnyNumber] = of_kind(Kind::kNumber);
  shapes_[kBoolean] = literal({"true", "false"});
  shapes_[kNull] = literal({"null"});
}

JsonGrammar JsonGrammar::any_object() {
  JsonGrammar g;
  g.root_ = kAnyObject;
  return g;
}

bool json_deeper_than(const Json& v, int limit) {
  std::vector<std::pair<const Json*, int>> todo = {{&v, 0}};
  while (!todo.empty()) {
    const auto [j, depth] = todo.back();
    todo.pop_back();
    if (!j->is_structured()) continue;
    if (depth >= limit) return true;
    for (const Json& child : *j) todo.emplace_back(&child, depth + 1);
  }
  return false;
}

JsonGrammar JsonGrammar::from_schema(const Json& schema) {
  if (json_deeper_than(schema, kMaxJsonNesting)) {
    throw Error(Errc::kUsage, "schema: nested more than " + std::to_string(kMaxJsonNesting) +
                                  " arrays and objects deep");
  }
  JsonGrammar g;
  SchemaCompiler c(g, schema);
  g.root_ = c.compile(schema, "schema");
  c.check_left_recursion();
  c.check_one_of();
  return g;
}

}  // namespace qf::rt
