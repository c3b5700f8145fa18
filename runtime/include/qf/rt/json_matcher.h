// The bytes a JsonGrammar (json_grammar.h) allows next: a pushdown matcher whose stack is a chain
// of immutable frames, so that one state can branch into many (every token of a vocabulary
// tried from the same state) without copying it. A state is a set of such stacks: the
// alternatives still alive (anyOf, enum values and optional keys sharing a prefix).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "qf/rt/json_grammar.h"

namespace qf::rt {

// The UTF-8 state after byte `c` among a JSON string's characters, from state `state` (0: at a
// character boundary; 1-7: inside a character, the bytes it still needs); -1 when `c` cannot
// come there: '"', '\\' or a control at a boundary, or a byte that would make the text
// invalid UTF-8 (overlong forms, surrogates, past U+10FFFF included).
int json_string_byte(int state, uint8_t c);
constexpr int kUtf8States = 8;

struct JsonFrame {
  const JsonFrame* parent;  // null for the root
  int32_t shape;            // the JsonGrammar shape this frame matches (root: grammar.root())
  uint8_t kind;             // JsonMatcher's frame kinds
  uint8_t phase;            // where in the value
  uint8_t ws;               // whitespace bytes since the phase began
  uint32_t n;               // object: next property; array: items; string: characters;
                            // number, literal, key: bytes matched
  uint32_t aux;             // object: the property being written; literal: which one;
                            // string: its UTF-8 state, or a \u escape's digits; string with
                            // a pattern, number with bounds: the DFA's state; number: its
                            // exponent digits
};

// Frames by the chunk; pointers stay valid until a rewind below them or the arena's end.
class JsonFrameArena {
 public:
  const JsonFrame* make(const JsonFrame& f);
  size_t mark() const { return used_; }
  void rewind(size_t mark) { used_ = mark; }

 private:
  static constexpr size_t kChunk = 4096;
  std::vector<std::unique_ptr<JsonFrame[]>> chunks_;
  size_t used_ = 0;
};

using JsonState = std::vector<const JsonFrame*>;  // the alternatives' top frames

class JsonMatcher {
 public:
  // `trailing_whitespace`: after the value, whitespace may follow without limit (for a
  // generation with no stop token to end it); else up to kMaxJsonWhitespace bytes.
  JsonMatcher(const JsonGrammar& grammar, bool trailing_whitespace);

  // The state before the first byte.
  JsonState start(JsonFrameArena& arena) const;
  // Appends to `out` the stacks that byte `c` leads to from the stack topped by `top` (none
  // when it cannot come next).
  void feed(const JsonFrame* top, uint8_t c, JsonFrameArena& arena, JsonState& out) const;
  // `out` = every alternative of `in` fed `c`, duplicates dropped; false when none is left.
  bool feed(const JsonState& in, uint8_t c, JsonFrameArena& arena, JsonState& out) const;
  // Whether the stack's value is complete, so that the text may end here.
  bool can_end(const JsonFrame* top, JsonFrameArena& arena) const;
  // When the stack is inside a string's characters, how many more its maxLength allows (-1
  // when it is not, or when a pattern holds them; INT64_MAX with no maxLength): any further
  // bytes that json_string_byte takes from its UTF-8 state (`top->aux`) continue it, up to that
  // many characters.
  int64_t string_room(const JsonFrame* top) const;
  // When the stack is inside the characters of a string with a pattern, its DFA (the frame's
  // `aux` is the DFA's state; any byte but '"' goes to that DFA alone); else null.
  const ByteDfa* string_pattern(const JsonFrame* top) const;

 private:
  void open_value(const JsonFrame* parent, int32_t shape, uint8_t c, JsonFrameArena& a,
                  JsonState& out) const;
  const JsonFrame* value_done(const JsonFrame* parent, JsonFrameArena& a) const;
  void feed_object(const JsonFrame* f, uint8_t c, JsonFrameArena& a, JsonState& out) const;
  void feed_array(const JsonFrame* f, uint8_t c, JsonFrameArena& a, JsonState& out) const;
  void feed_string(const JsonFrame* f, uint8_t c, JsonFrameArena& a, JsonState& out) const;
  void feed_number(const JsonFrame* f, uint8_t c, JsonFrameArena& a, JsonState& out) const;
  bool number_complete(const JsonFrame* f) const;  // whether the number may end here
  void open_key(const JsonFrame* f, JsonFrameArena& a, JsonState& out) const;

  const JsonGrammar& g_;
  bool trailing_whitespace_;
};

}  // namespace qf::rt
