// libFuzzer target for the reply's split into reasoning, content and tool calls
// (chat_output.h, and tool_choice.h's parser of forced calls): the model's text is untrusted,
// and so are the request's tools, which the parser reads the values' types from. Input: byte 0
// the flags (bit 0 the reply starts in a think block, bit 1 calls are parsed, bits 2-3 the
// forced parser's choice), then the tools as JSON up to a 0xFF byte (any JSON: a request's
// `tools` need only be an array), then the reply's text. Properties: no crash; pushed in chunks
// of 1 to 8 bytes the text splits exactly as pushed whole (README: "streamed and whole replies
// split the same way").
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "fuzz_support.h"
#include "json_mutator.h"
#include "qf/rt/chat_output.h"
#include "qf/rt/tool_choice.h"

namespace {

using Json = nlohmann::ordered_json;
using namespace qf::rt;

void add(ChatDelta& all, ChatDelta&& d) {
  all.reasoning += d.reasoning;
  all.content += d.content;
  for (ToolCall& c : d.tool_calls) all.tool_calls.push_back(std::move(c));
}

// The parts as one string to compare and print (the text may hold invalid UTF-8, which dump()
// would refuse: the server's text never does, as StreamDecoder replaces it, but here it is kept
// as given in the reasoning and content and replaced only inside the calls).
std::string show(const ChatDelta& d) {
  Json calls = Json::array();
  for (const ToolCall& c : d.tool_calls) {
    calls.push_back({{"name", c.name}, {"arguments", c.arguments}});
  }
  return "reasoning: " + d.reasoning + "\ncontent: " + d.content +
         "\ncalls: " + calls.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// The parts of `text` pushed in chunks of 1 to 8 bytes (sizes from `sizes`), or whole when
// `sizes` is empty.
template <class Parser>
ChatDelta parse(Parser p, std::string_view text, std::string_view sizes) {
  ChatDelta all;
  if (sizes.empty()) {
    add(all, p.push(text));
  } else {
    for (size_t at = 0, k = 0; at < text.size(); ++k) {
      const size_t n = 1 + static_cast<uint8_t>(sizes[k % sizes.size()]) % 8;
      add(all, p.push(text.substr(at, n)));
      at += n;
    }
  }
  add(all, p.finish());
  return all;
}

}  // namespace

QF_FUZZ_JSON_MUTATOR(1, "type", "function", "name", "parameters", "properties", "anyOf", "items")

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  const std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t cut = in.find('\xFF');
  Json tools = Json::parse(in.substr(0, cut), nullptr, /*allow_exceptions=*/false);
  if (tools.is_discarded() || !(tools.is_array() || tools.is_null())) return 0;
  const std::string_view text = cut == std::string_view::npos ? "" : in.substr(cut + 1);

  const ChatOutputParser chat(flags & 1, tools, flags & 2);
  const ChatDelta whole = parse(chat, text, "");
  const ChatDelta chunked = parse(chat, text, in);
  QF_FUZZ_CHECK(show(whole) == show(chunked), show(whole) + "\n" + show(chunked));

  ToolChoice choice;
  choice.kind = (flags & 4) ? ToolChoice::Kind::kRequired : ToolChoice::Kind::kNamed;
  choice.name = "f";
  const ForcedToolCallParser forced(choice);
  const ChatDelta f_whole = parse(forced, text, "");
  const ChatDelta f_chunked = parse(forced, text, in);
  QF_FUZZ_CHECK(show(f_whole) == show(f_chunked), show(f_whole) + "\n" + show(f_chunked));
  return 0;
}
