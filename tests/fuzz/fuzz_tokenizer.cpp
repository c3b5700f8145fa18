// libFuzzer target for the tokenizer (tokenizer.h) on the example model's tokenizer.json (a
// byte-level BPE with Qwen3.5's pre-tokenizer regex, NFC normalizer and added tokens): any
// bytes a client sends as a prompt. Properties: text that is not valid UTF-8 (by the checker
// below, written from RFC 3629) is refused with a usage error naming the byte; valid text
// encodes to ids of the vocabulary; decoding them gives text that encodes to the same ids
// (decode(encode(x)) is x normalized; for valid UTF-8 without added tokens' text, it is x itself
// when x is NFC, which ASCII always is); StreamDecoder, fed the ids one by one, writes what decode
// writes.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.h"
#include "qf/error.h"
#include "qf/rt/tokenizer.h"
#include "tiny_tokenizer.h"

namespace {

// The offset of the first byte that breaks UTF-8 (RFC 3629: no overlong forms, no surrogates,
// nothing past U+10FFFF), or npos.
size_t invalid_utf8_at(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    const size_t n = b < 0x80                 ? 1
                     : b >= 0xC2 && b <= 0xDF ? 2
                     : b >= 0xE0 && b <= 0xEF ? 3
                     : b >= 0xF0 && b <= 0xF4 ? 4
                                              : 0;
    if (n == 0 || i + n > s.size()) return i;
    uint32_t cp = n == 1 ? b : b & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<uint8_t>(s[i + k]);
      if ((c & 0xC0) != 0x80) return i;
      cp = cp << 6 | (c & 0x3F);
    }
    const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += n;
  }
  return std::string_view::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const qf::rt::Tokenizer& tok = qf::fuzz::tiny_tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const size_t bad = invalid_utf8_at(text);
  if (bad != std::string_view::npos) {
    try {
      tok.encode(text);
    } catch (const qf::Error& e) {
      QF_FUZZ_CHECK(e.code() == qf::Errc::kUsage &&
                        std::string(e.what()).ends_with("at byte " + std::to_string(bad)),
                    e.what());
      return 0;
    }
    qf::fuzz::fail("invalid UTF-8 encoded", std::string(text));
  }
  const std::vector<int32_t> ids = tok.encode(text);
  for (const int32_t id : ids) QF_FUZZ_CHECK(id >= 0 && id < tok.n_ids(), std::string(text));
  const std::string back = tok.decode(ids);
  QF_FUZZ_CHECK(tok.encode(back) == ids, "'" + std::string(text) + "' -> '" + back + "'");
  bool ascii = true;
  for (const char c : text) ascii = ascii && static_cast<uint8_t>(c) < 0x80;
  if (ascii) QF_FUZZ_CHECK(back == text, "'" + std::string(text) + "' -> '" + back + "'");
  qf::rt::StreamDecoder stream(tok);
  std::string streamed;
  for (const int32_t id : ids) streamed += stream.push(id);
  streamed += stream.finish();
  QF_FUZZ_CHECK(streamed == back, "'" + streamed + "' against '" + back + "'");
  return 0;
}
