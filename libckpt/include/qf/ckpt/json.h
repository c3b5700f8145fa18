// Strict, fast JSON pull reader and writer helpers for checkpoint metadata.
//
// Why not a DOM library: safetensors headers and index files of a 122B checkpoint carry ~110,000
// entries, must be parsed in milliseconds, must keep 64-bit integers exact (never via double),
// and must report duplicate keys, which DOM parsers silently merge. The reader follows RFC 8259
// exactly as serde_json does (no comments, no trailing commas, no NaN, lone surrogates
// rejected), nests at most kMaxDepth levels, and never recurses deeper than that.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace qf::ckpt {

// Malformed JSON: `offset` is the byte position in the text where the problem was found.
class JsonSyntaxError : public std::runtime_error {
 public:
  JsonSyntaxError(size_t offset, const std::string& message)
      : std::runtime_error(message), offset_(offset) {}
  size_t offset() const { return offset_; }

 private:
  size_t offset_;
};

enum class JsonType { kObject, kArray, kString, kNumber, kBool, kNull };

struct JsonNumber {
  std::string_view text;   // the literal as written
  bool negative = false;   // leading '-' (also for -0)
  bool integral = false;   // no fraction and no exponent
  bool fits_u64 = false;   // integral and magnitude <= UINT64_MAX
  uint64_t magnitude = 0;  // |value|, valid when fits_u64
};

// Reads one JSON text. The caller walks the structure with the typed calls below and must
// consume every value it starts (skip_value for those it does not need). All calls throw
// JsonSyntaxError on malformed input. The text must be valid UTF-8 (see utf8_error_offset);
// string contents are returned decoded.
class JsonReader {
 public:
  static constexpr int kMaxDepth = 128;  // serde_json's default recursion limit

  explicit JsonReader(std::string_view text) : s_(text) {}

  // Type of the next value (skips whitespace). Throws at end of input or on a bad character.
  JsonType peek();

  void begin_object();
  // Reads the next key and its ':'; false (and leaves the object) at the closing brace.
  bool next_key(std::string& key);
  void begin_array();
  // Prepares the next element; false (and leaves the array) at the closing bracket.
  bool next_element();

  void read_string(std::string& out);
  JsonNumber read_number();
  bool read_bool();
  void read_null();
  // Skips one complete value of any type and returns its raw text.
  std::string_view skip_value();
  // Only whitespace may follow the top-level value.
  void expect_end();

  size_t offset() const { return pos_; }

 private:
  [[noreturn]] void fail(const std::string& message) const;
  void skip_ws();
  char next_char_or_fail(const char* expecting);
  void push();
  void parse_string_body(std::string& out);
  void append_escape(std::string& out);

  std::string_view s_;
  size_t pos_ = 0;
  // One entry per open container: true until its first member has been read.
  std::vector<bool> first_;
};

// Position of the first byte that breaks UTF-8 validity (overlong forms, surrogates, code
// points above U+10FFFF and truncated sequences are all invalid), or nullopt if valid.
std::optional<size_t> utf8_error_offset(std::string_view text);

// Appends code point `cp` (< 0x110000) to `out` as UTF-8.
void append_utf8(std::string& out, uint32_t cp);

// Appends `s` as a quoted JSON string. serde style (ensure_ascii = false): escapes '"', '\\'
// and control characters (\b \f \n \r \t short forms, others \u00xx), as the safetensors
// writer does. Python style (ensure_ascii = true) also escapes DEL and every non-ASCII code
// point as \uxxxx (surrogate pairs above U+FFFF), as json.dumps does by default.
void append_json_string(std::string& out, std::string_view s, bool ensure_ascii = false);

// Human-readable excerpt of `text` around `offset` for error messages.
std::string json_context(std::string_view text, size_t offset);

}  // namespace qf::ckpt
