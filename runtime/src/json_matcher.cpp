// The byte-level JSON matcher (json_matcher.h). Each frame kind has its phases; a value's first
// byte opens its frame (open_value), its last pops it and advances the parent (value_done). A
// number has no last byte of its own: the byte after it pops it and then goes to the parent.
#include "qf/rt/json_matcher.h"

#include <algorithm>
#include <cstdint>

namespace qf::rt {
namespace {

using Kind = JsonShape::Kind;

enum FrameKind : uint8_t { kRoot, kObject, kArray, kString, kNumber, kLiteral, kKey };

enum RootPhase : uint8_t { kBefore, kInValue, kDone };
enum ObjectPhase : uint8_t { kOpen, kInKey, kColon, kBeforeValue, kInMember, kAfter, kNext };
enum StringPhase : uint8_t { kChars, kEscape, kHex, kLowEscape, kLowU };

// A \u escape's state in a string frame's `aux`: digits so far, their value, and whether it is
// the low half of a surrogate pair (which must follow a high half, and only it may).
constexpr uint32_t kHexCount = 7, kHexShift = 3, kLowHalf = 1u << 20;

int hex_value(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
enum NumberPhase : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kE, kESign, kExp };

bool is_ws(uint8_t c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}
bool is_digit(uint8_t c) {
  return c >= '0' && c <= '9';
}

JsonFrame with_phase(const JsonFrame& f, uint8_t phase) {
  JsonFrame g = f;
  g.phase = phase;
  g.ws = 0;
  return g;
}

// One more whitespace byte in the frame's phase, when the limit allows it.
void add_ws(const JsonFrame* f, JsonFrameArena& a, JsonState& out) {
  if (f->ws >= kMaxJsonWhitespace) return;
  JsonFrame g = *f;
  ++g.ws;
  out.push_back(a.make(g));
}

bool same(const JsonFrame* x, const JsonFrame* y) {
  return x->parent == y->parent && x->shape == y->shape && x->kind == y->kind &&
         x->phase == y->phase && x->ws == y->ws && x->n == y->n && x->aux == y->aux;
}

}  // namespace

int json_string_byte(int state, uint8_t c) {
  const auto in = [c](int lo, int hi) { return c >= lo && c <= hi; };
  switch (state) {
    case 0:
      if (c < 0x80) return c >= 0x20 && c != '"' && c != '\\' ? 0 : -1;
      if (in(0xC2, 0xDF)) return 1;
      if (c == 0xE0) return 4;
      if (c == 0xED) return 5;
      if (in(0xE1, 0xEF)) return 2;
      if (c == 0xF0) return 6;
      if (c == 0xF4) return 7;
      if (in(0xF1, 0xF3)) return 3;
      return -1;
    case 1:
    case 2:
    case 3:
      return in(0x80, 0xBF) ? state - 1 : -1;
    case 4:  // E0: no overlong form
      return in(0xA0, 0xBF) ? 1 : -1;
    case 5:  // ED: no surrogate
      return in(0x80, 0x9F) ? 1 : -1;
    case 6:  // F0: no overlong form
      return in(0x90, 0xBF) ? 2 : -1;
    default:  // F4: nothing past U+10FFFF
      return in(0x80, 0x8F) ? 2 : -1;
  }
}

const JsonFrame* JsonFrameArena::make(const JsonFrame& f) {
  const size_t chunk = used_ / kChunk;
  if (chunk == chunks_.size()) chunks_.push_back(std::make_unique<JsonFrame[]>(kChunk));
  JsonFrame* p = &chunks_[chunk][used_ % kChunk];
  *p = f;
  ++used_;
  return p;
}

JsonMatcher::JsonMatcher(const JsonGrammar& grammar, bool trailing_whitespace)
    : g_(grammar), trailing_whitespace_(trailing_whitespace) {}

JsonState JsonMatcher::start(JsonFrameArena& a) const {
  return {a.make(JsonFrame{nullptr, g_.root(), kRoot, kBefore, 0, 0, 0})};
}

void JsonMatcher::open_value(const JsonFrame* parent, int32_t shape, uint8_t c, JsonFrameArena& a,
                             JsonState& out) const {
  const JsonShape& s = g_.shape(shape);
  const auto push = [&](uint8_t kind, uint8_t phase, uint32_t n, uint32_t aux) {
    out.push_back(a.make(JsonFrame{parent, shape, kind, phase, 0, n, aux}));
  };
  switch (s.kind) {
    case Kind::kAny: {
      int32_t to = -1;
      if (c == '{') to = JsonGrammar::kAnyObject;
      if (c == '[') to = JsonGrammar::kAnyArray;
      if (c == '"') to = JsonGrammar::kAnyString;
      if (c == '-' || is_digit(c)) to = JsonGrammar::kAnyNumber;
      if (c == 't' || c == 'f') to = JsonGrammar::kBoolean;
      if (c == 'n') to = JsonGrammar::kNull;
      if (to >= 0) open_value(parent, to, c, a, out);
      return;
    }
    case Kind::kAnyOf:
      for (const int32_t alt : s.alternatives) open_value(parent, alt, c, a, out);
      return;
    case Kind::kObject:
      if (c == '{') push(kObject, kOpen, 0, 0);
      return;
    case Kind::kArray:
      if (c == '[') push(kArray, kOpen, 0, 0);
      return;
    case Kind::kString:
      if (c == '"') push(kString, kChars, 0, 0);
      return;
    case Kind::kNumber:
    case Kind::kInteger:
      if (s.pattern >= 0) {  // bounds: `aux` is their DFA's state
        const int32_t next = g_.pattern(s.pattern).next(0, c);
        if (next != ByteDfa::kDead) push(kNumber, kInt, 1, static_cast<uint32_t>(next));
        return;
      }
      if (c == '-') push(kNumber, kMinus, 1, 0);
      if (c == '0') push(kNumber, kZero, 1, 0);
      if (c >= '1' && c <= '9') push(kNumber, kInt, 1, 0);
      return;
    case Kind::kLiteral:
      for (size_t i = 0; i < s.literals.size(); ++i) {
        const std::string& lit = s.literals[i];
        if (static_cast<uint8_t>(lit[0]) != c) continue;
        if (lit.size() == 1) {
          out.push_back(value_done(parent, a));
        } else {
          push(kLiteral, 0, 1, static_cast<uint32_t>(i));
        }
      }
      return;
  }
}

const JsonFrame* JsonMatcher::value_done(const JsonFrame* p, JsonFrameArena& a) const {
  JsonFrame g = with_phase(*p, 0);
  switch (p->kind) {
    case kRoot:
      g.phase = kDone;
      break;
    case kObject:
      if (p->phase == kInKey) {
        g.phase = kColon;
      } else {  // kInMember
        g.phase = kAfter;
        g.n = g_.shape(p->shape).open ? p->n + 1 : p->aux + 1;
      }
      break;
    case kArray:
      g.phase = kAfter;
      g.n = p->n + 1;
      break;
  }
  return a.make(g);
}

void JsonMatcher::open_key(const JsonFrame* f, JsonFrameArena& a, JsonState& out) const {
  const JsonShape& s = g_.shape(f->shape);
  if (s.open) {
    JsonFrame o = with_phase(*f, kInKey);
    const JsonFrame* obj = a.make(o);
    out.push_back(a.make(JsonFrame{obj, JsonGrammar::kAnyString, kString, kChars, 0, 0, 0}));
    return;
  }
  // Any property from the next one up to and including the first required one.
  const uint32_t last =
      std::min<uint32_t>(s.first_required[f->n], static_cast<uint32_t>(s.properties.size()) - 1);
  for (uint32_t j = f->n; j < s.properties.size() && j <= last; ++j) {
    JsonFrame o = with_phase(*f, kInKey);
    o.aux = j;
    const JsonFrame* obj = a.make(o);
    out.push_back(a.make(JsonFrame{obj, f->shape, kKey, 0, 0, 1, j}));
  }
}

void JsonMatcher::feed_object(const JsonFrame* f, uint8_t c, JsonFrameArena& a,
                              JsonState& out) const {
  const JsonShape& s = g_.shape(f->shape);
  const size_t n_props = s.properties.size();
  // Whether the object may close here: nothing required from property n on.
  const bool may_close = s.open || s.first_required[f->n] == n_props;
  if (is_ws(c) && f->phase != kInKey && f->phase != kInMember) return add_ws(f, a, out);
  switch (f->phase) {
    case kOpen:
    case kNext:
      if (c == '"') open_key(f, a, out);
      if (c == '}' && f->phase == kOpen && may_close) out.push_back(value_done(f->parent, a));
      return;
    case kColon:
      if (c == ':') out.push_back(a.make(with_phase(*f, kBeforeValue)));
      return;
    case kBeforeValue: {
      const JsonFrame* in = a.make(with_phase(*f, kInMember));
      open_value(in, s.open ? s.values : s.properties[f->aux].shape, c, a, out);
      return;
    }
    case kAfter:
      if (c == ',' && (s.open || f->n < n_props)) out.push_back(a.make(with_phase(*f, kNext)));
      if (c == '}' && may_close) out.push_back(value_done(f->parent, a));
      return;
    default:
      return;
  }
}

void JsonMatcher::feed_array(const JsonFrame* f, uint8_t c, JsonFrameArena& a,
                             JsonState& out) const {
  const JsonShape& s = g_.shape(f->shape);
  if (is_ws(c)) return add_ws(f, a, out);
  const bool room = s.max_items < 0 || static_cast<int64_t>(f->n) < s.max_items;
  const bool enough = static_cast<int64_t>(f->n) >= s.min_items;
  switch (f->phase) {
    case kOpen:
      if (c == ']' && enough) return out.push_back(value_done(f->parent, a));
      [[fallthrough]];
    case kNext:
      if (room) open_value(a.make(with_phase(*f, kInMember)), s.items, c, a, out);
      return;
    case kAfter:
      if (c == ',' && room) out.push_back(a.make(with_phase(*f, kNext)));
      if (c == ']' && enough) out.push_back(value_done(f->parent, a));
      return;
    default:
      return;
  }
}

void JsonMatcher::feed_string(const JsonFrame* f, uint8_t c, JsonFrameArena& a,
                              JsonState& out) const {
  const JsonShape& s = g_.shape(f->shape);
  const bool room = s.max_length < 0 || static_cast<int64_t>(f->n) < s.max_length;
  JsonFrame g = *f;
  if (s.pattern >= 0) {  // `aux`: the pattern's DFA state (it also holds the lengths)
    const ByteDfa& d = g_.pattern(s.pattern);
    if (c == '"') {
      if (d.accepting(static_cast<int32_t>(f->aux))) out.push_back(value_done(f->parent, a));
      return;
    }
    const int32_t next = d.next(static_cast<int32_t>(f->aux), c);
    if (next == ByteDfa::kDead) return;
    g.aux = static_cast<uint32_t>(next);
    g.n += (c & 0xC0) != 0x80;
    out.push_back(a.make(g));
    return;
  }
  switch (f->phase) {
    case kChars: {
      if (f->aux == 0 && c == '"') {
        if (static_cast<int64_t>(f->n) >= s.min_length) out.push_back(value_done(f->parent, a));
        return;
      }
      if (f->aux == 0 && c == '\\') {
        if (!room) return;
        g.phase = kEscape;
        ++g.n;
        break;
      }
      const int next = json_string_byte(static_cast<int>(f->aux), c);
      if (next < 0 || (f->aux == 0 && !room)) return;
      g.n += f->aux == 0;  // a character's first byte
      g.aux = static_cast<uint32_t>(next);
      break;
    }
    case kEscape:
      if (c == 'u') {
        g.phase = kHex;
        g.aux = 0;
      } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                 c == 'r' || c == 't') {
        g.phase = kChars;
        g.aux = 0;
      } else {
        return;
      }
      break;
    case kLowEscape:  // a high surrogate's \uD8xx-\uDBxx must be followed by a low one
      if (c != '\\') return;
      g.phase = kLowU;
      break;
    case kLowU:
      if (c != 'u') return;
      g.phase = kHex;
      g.aux = kLowHalf;
      break;
    default: {  // kHex: refused at the second digit where no pairing can follow
      const int v = hex_value(c);
      if (v < 0) return;
      const uint32_t count = (f->aux & kHexCount) + 1;
      const uint32_t value = ((f->aux >> kHexShift) & 0xFFFF) << 4 | static_cast<uint32_t>(v);
      const bool low = f->aux & kLowHalf;
      if (count == 1 && low && value != 0xD) return;
      if (count == 2 && (value >= 0xDC && value <= 0xDF) != low) return;  // low halves
      g.aux = (f->aux & kLowHalf) | value << kHexShift | count;
      if (count == 4) {
        g.phase = !low && value >= 0xD800 && value < 0xDC00 ? kLowEscape : kChars;
        if (g.phase == kChars) g.aux = 0;
      }
      break;
    }
  }
  out.push_back(a.make(g));
}

void JsonMatcher::feed_number(const JsonFrame* f, uint8_t c, JsonFrameArena& a,
                              JsonState& out) const {
  const JsonShape& s = g_.shape(f->shape);
  if (s.pattern >= 0) {
    const ByteDfa& d = g_.pattern(s.pattern);
    const int32_t to = d.next(static_cast<int32_t>(f->aux), c);
    if (to != ByteDfa::kDead) {
      JsonFrame g = *f;
      g.aux = static_cast<uint32_t>(to);
      ++g.n;
      return out.push_back(a.make(g));
    }
    if (number_complete(f)) feed(value_done(f->parent, a), c, a, out);
    return;
  }
  const bool integer = s.kind == Kind::kInteger;
  int next = -1;
  switch (f->phase) {
    case kMinus:
      if (c == '0') next = kZero;
      if (c >= '1' && c <= '9') next = kInt;
      break;
    case kZero:
    case kInt:
      if (is_digit(c) && f->phase == kInt) next = kInt;
      if (c == '.' && !integer) next = kDot;
      if ((c == 'e' || c == 'E') && !integer) next = kE;
      break;
    case kDot:
    case kFrac:
      if (is_digit(c)) next = kFrac;
      if ((c == 'e' || c == 'E') && f->phase == kFrac) next = kE;
      break;
    case kE:
      if (c == '+' || c == '-') next = kESign;
      if (is_digit(c)) next = kExp;
      break;
    default:  // kESign, kExp: at most two exponent digits, so no number overflows a double
      if (is_digit(c) && (f->phase == kESign || f->aux < 2)) next = kExp;
      break;
  }
  if (next >= 0) {
    // Within kMaxJsonNumberBytes, with room left for the digit that '-', '.', 'e' or an
    // exponent's sign needs before the number may end (found by fuzz_schema: a 40th byte 'E').
    const bool open = next == kMinus || next == kDot || next == kE || next == kESign;
    if (f->n + 1 + (open ? 1 : 0) > static_cast<uint32_t>(kMaxJsonNumberBytes)) return;
    JsonFrame g = *f;
    g.phase = static_cast<uint8_t>(next);
    ++g.n;
    if (next == kExp) ++g.aux;  // exponent digits
    return out.push_back(a.make(g));
  }
  if (number_complete(f)) feed(value_done(f->parent, a), c, a, out);
}

void JsonMatcher::feed(const JsonFrame* f, uint8_t c, JsonFrameArena& a, JsonState& out) const {
  switch (f->kind) {
    case kRoot:
      if (f->phase == kBefore) {
        if (is_ws(c)) return add_ws(f, a, out);
        return open_value(a.make(with_phase(*f, kInValue)), f->shape, c, a, out);
      }
      if (f->phase == kDone && is_ws(c)) {
        if (trailing_whitespace_) return out.push_back(f);
        return add_ws(f, a, out);
      }
      return;
    case kObject:
      return feed_object(f, c, a, out);
    case kArray:
      return feed_array(f, c, a, out);
    case kString:
      return feed_string(f, c, a, out);
    case kNumber:
      return feed_number(f, c, a, out);
    default: {  // kLiteral, kKey
      const std::string& text = f->kind == kKey ? g_.shape(f->shape).properties[f->aux].key
                                                : g_.shape(f->shape).literals[f->aux];
      if (static_cast<uint8_t>(text[f->n]) != c) return;
      if (f->n + 1 == text.size()) return out.push_back(value_done(f->parent, a));
      JsonFrame g = *f;
      ++g.n;
      return out.push_back(a.make(g));
    }
  }
}

bool JsonMatcher::feed(const JsonState& in, uint8_t c, JsonFrameArena& a, JsonState& out) const {
  out.clear();
  for (const JsonFrame* f : in) {
    const size_t from = out.size();
    feed(f, c, a, out);
    // Drop a stack equal to one already there (same frame on the same parent).
    for (size_t i = from; i < out.size();) {
      const bool dup = std::any_of(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(i),
                                   [&](const JsonFrame* x) { return same(x, out[i]); });
      if (dup) {
        out.erase(out.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  return !out.empty();
}

bool JsonMatcher::number_complete(const JsonFrame* f) const {
  const int32_t p = g_.shape(f->shape).pattern;
  if (p >= 0) return g_.pattern(p).accepting(static_cast<int32_t>(f->aux));
  return f->phase == kZero || f->phase == kInt || f->phase == kFrac || f->phase == kExp;
}

bool JsonMatcher::can_end(const JsonFrame* f, JsonFrameArena& a) const {
  while (f->kind == kNumber && number_complete(f)) f = value_done(f->parent, a);
  return f->kind == kRoot && f->phase == kDone;
}

const ByteDfa* JsonMatcher::string_pattern(const JsonFrame* f) const {
  if (f->kind != kString || f->phase != kChars) return nullptr;
  const int32_t p = g_.shape(f->shape).pattern;
  return p < 0 ? nullptr : &g_.pattern(p);
}

int64_t JsonMatcher::string_room(const JsonFrame* f) const {
  if (f->kind != kString || f->phase != kChars || g_.shape(f->shape).pattern >= 0) return -1;
  const int64_t max = g_.shape(f->shape).max_length;
  return max < 0 ? INT64_MAX : max - static_cast<int64_t>(f->n);
}

}  // namespace qf::rt
