// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json, giving the ids the
// `tokenizers` library (0.23) gives, for the Qwen3.5 family and other byte-level BPE models
// (qwen35-architecture.md §6):
//   1. added tokens (special or not) are split out first: those with normalized=false on the
//      raw text, the others on the normalized text; leftmost, then longest match, with
//      single_word, lstrip and rstrip as tokenizers applies them;
//   2. each remaining piece is normalized: NFC or nothing, with tokenizers' Unicode 9.0 data
//      (characters added since are left alone, as it does);
//   3. pre-tokenized: Split steps (PCRE2 regexes whose \p{L} \p{M} \p{N} \s are given the
//      code points they have in tokenizers' Oniguruma), then ByteLevel (bytes -> the GPT-2
//      alphabet, optionally with GPT-2's own split and a prefix space);
//   4. BPE: the lowest-ranked merge first, leftmost among equals; ignore_merges and an
//      unknown token (fused or not) honoured.
// Decoding maps tokens back to bytes (the ByteLevel decoder's rule: a token whose characters
// are all in the byte alphabet becomes those bytes, any other token its UTF-8) and converts
// to text with U+FFFD for invalid sequences (from_utf8_lossy). StreamDecoder emits text as
// soon as it is complete, so concatenating its output equals decode() of all ids.
// A Tokenizer is immutable once loaded and may be used from several threads at once; each
// thread keeps its own buffers and a cache of recent words (bounded, a few MB at most).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qf::rt {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool single_word = false;  // match only when not inside a word
  bool lstrip = false;       // absorb whitespace on the left
  bool rstrip = false;       // absorb whitespace on the right
  bool normalized = true;    // matched on normalized text (false: on the raw text)
};

class Tokenizer {
 public:
  // Throws Error: kIo (unreadable), kTokenizerInvalid (malformed JSON, merges naming unknown
  // tokens, ids that collide or that tokenizers would number differently), kUnsupported (a
  // model, normalizer, pre-tokenizer, decoder or post-processor this implementation does not
  // have), each naming the file and the field.
  static Tokenizer load(const std::filesystem::path& tokenizer_json);
  static Tokenizer parse(std::string_view json_text, const std::string& source);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // `text` must be valid UTF-8 (Error kUsage naming the byte otherwise). Added tokens in the
  // text are always recognized and no token is added around it (HF's encode with
  // add_special_tokens=False: the chat template writes the special tokens itself).
  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The bytes a token stands for ("" for ids no token has).
  const std::string& token_bytes(int32_t id) const;
  // The token's string as written in tokenizer.json, e.g. "Ġworld" ("" for ids no token has).
  const std::string& token_content(int32_t id) const;
  // The id of an added token or vocabulary entry with this content (as written in the JSON).
  std::optional<int32_t> token_id(std::string_view content) const;
  bool is_special(int32_t id) const;
  // One past the largest id of any token.
  int32_t n_ids() const;
  const std::vector<AddedToken>& added_tokens() const;

  struct Impl;  // internal (runtime/src/tokenizer_impl.h)

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class StreamDecoder;
};

// Incremental decoding for streaming output.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false);
  // Text completed by this token (may be empty while a character is incomplete).
  std::string push(int32_t id);
  // Whatever is still pending, with U+FFFD for an unfinished character.
  std::string finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace qf::rt
