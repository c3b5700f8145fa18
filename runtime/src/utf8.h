// Internal: UTF-8 and the GPT-2 byte-level alphabet, as Hugging Face tokenizers use them.
#pragma once

#include "qf/ckpt/json.h"

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace qf::rt::detail {

// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 if the bytes there are not
// one (bad lead byte, bad continuation, overlong, surrogate, beyond U+10FFFF, or truncated).
size_t utf8_valid_length(std::string_view s, size_t i);

// Number of bytes at the end of `s` that form a valid but incomplete UTF-8 sequence (a prefix
// that further bytes could complete); 0 when the end is complete or plainly invalid.
size_t utf8_incomplete_tail(std::string_view s);

// UTF-8 of `bytes` with each maximal invalid subpart replaced by U+FFFD: Rust's
// String::from_utf8_lossy and Python's decode(errors="replace") (Unicode §3.9, "substitution of
// maximal subparts").
std::string utf8_lossy(std::string_view bytes);

// The code point at s[i] and its length in `len`; len is 0 where the bytes there are not
// valid UTF-8 (the value is then meaningless).
uint32_t code_point(std::string_view s, size_t i, size_t& len);

// Appends code point `cp` (< 0x110000, not a surrogate) as UTF-8.
using ckpt::append_utf8;  // code point -> UTF-8

// The GPT-2 byte-to-character map: printable Latin-1 bytes map to themselves, the other 68
// bytes to U+0100 + n in byte order. byte_char(b) is the code point for byte b.
uint32_t byte_char(uint8_t b);
// The inverse: -1 for code points that are not in the alphabet.
int char_byte(uint32_t cp);

// Decodes `s` (valid UTF-8) as the byte-level alphabet: true and the raw bytes in `out` when
// every code point is in it.
bool byte_level_to_bytes(std::string_view s, std::string& out);

// NFC of valid UTF-8 as Hugging Face tokenizers computes it (its normalizer has Unicode 9.0
// data; characters added since stay as they are): `s` itself when it is already normalized,
// else the result written to `buffer` (normalize.cpp).
std::string_view nfc(std::string_view s, std::string& buffer);

}  // namespace qf::rt::detail
