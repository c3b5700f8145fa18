// qforge tokenize --model DIR (--text T | --file F | --decode IDS): a model's tokenizer.json
// applied to text (ids and tokens out) or to ids (text out), exactly as Hugging Face
// `tokenizers` does it.
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "qf/ckpt/file_io.h"
#include "qf/error.h"
#include "qf/rt/tokenizer.h"
#include "token_args.h"

namespace qf::tools {
namespace {

struct TokenizeArgs {
  std::string model, text, file, decode;
  CLI::Option *text_opt = nullptr, *file_opt = nullptr, *decode_opt = nullptr;
  bool ids_only = false, json = false, skip_special = false;
};

// DIR/tokenizer.json, or the file itself when --model names one.
std::filesystem::path tokenizer_path(const std::string& model) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(model, ec)) return model;
  return std::filesystem::path(model) / "tokenizer.json";
}

void write_stdout(const std::string& s) {
  if (std::fwrite(s.data(), 1, s.size(), stdout) != s.size()) throw_io("write", "stdout", errno);
}

// "1 2 3\n", built in one buffer: the benchmark prints millions of ids.
std::string ids_line(const std::vector<int32_t>& ids) {
  std::string out;
  out.reserve(ids.size() * 7 + 1);
  char buf[16];
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out.append(buf, std::to_chars(buf, buf + sizeof buf, ids[i]).ptr);
  }
  out += '\n';
  return out;
}

// A token for people: its text as a JSON string, or its bytes in hex when they are not
// UTF-8 on their own (part of a character).
std::string token_for_humans(const rt::Tokenizer& tok, int32_t id) {
  const std::string& bytes = tok.token_bytes(id);
  if (tok.decode(std::vector<int32_t>{id}) == bytes) return nlohmann::json(bytes).dump();
  std::string out = "bytes";
  char buf[4];
  for (const char c : bytes) {
    std::snprintf(buf, sizeof buf, " %02x", static_cast<unsigned>(static_cast<uint8_t>(c)));
    out += buf;
  }
  return out;
}

int run_encode(const TokenizeArgs& a, const rt::Tokenizer& tok) {
  std::string text = a.text;
  if (a.file_opt->count()) text = ckpt::read_text_file(a.file);
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(text);
  } catch (const Error& e) {
    throw Error(e.code(), (a.file_opt->count() ? a.file : std::string("--text")) + ": " + e.what());
  }
  if (a.json) {
    nlohmann::json j = {{"n_tokens", ids.size()}, {"ids", ids}};
    if (!a.ids_only) {
      nlohmann::json tokens = nlohmann::json::array();
      for (const int32_t id : ids) tokens.push_back(tok.token_content(id));
      j["tokens"] = std::move(tokens);
    }
    write_stdout(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  } else if (a.ids_only) {
    write_stdout(ids_line(ids));
  } else {
    std::string out = std::to_string(ids.size()) + (ids.size() == 1 ? " token\n" : " tokens\n");
    for (const int32_t id : ids) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "%10d  ", id);
      out += buf + token_for_humans(tok, id) + "\n";
    }
    write_stdout(out);
  }
  return kExitOk;
}

int run_decode(const TokenizeArgs& a, const rt::Tokenizer& tok) {
  const std::vector<int32_t> ids = parse_token_ids(a.decode, "--decode");
  for (const int32_t id : ids) {
    if (id >= tok.n_ids() || tok.token_bytes(id).empty()) {
      throw Error(Errc::kUsage, "--decode: no token has id " + std::to_string(id) + " (" +
                                    tokenizer_path(a.model).string() + " has ids below " +
                                    std::to_string(tok.n_ids()) + ")");
    }
  }
  const std::string text = tok.decode(ids, a.skip_special);
  if (a.json) {
    write_stdout(nlohmann::json{{"ids", ids}, {"text", text}}.dump() + "\n");
  } else {
    write_stdout(text + "\n");
  }
  return kExitOk;
}

int run(const TokenizeArgs& a) {
  if (a.text_opt->count() + a.file_opt->count() + a.decode_opt->count() != 1) {
    throw Error(Errc::kUsage, "give exactly one of --text, --file or --decode");
  }
  const rt::Tokenizer tok = rt::Tokenizer::load(tokenizer_path(a.model));
  return a.decode_opt->count() ? run_decode(a, tok) : run_encode(a, tok);
}

}  // namespace

Command add_tokenize(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* sub = app.add_subcommand(
      "tokenize", "Encode text to token ids (or decode ids) with a model's tokenizer.json");
  sub->add_option("--model", a->model, "model directory holding tokenizer.json (or the file)")
      ->required();
  a->text_opt = sub->add_option("--text", a->text, "text to encode (UTF-8)");
  a->file_opt = sub->add_option("--file", a->file, "file whose whole content is encoded");
  a->decode_opt = sub->add_option("--decode", a->decode, "ids to decode, e.g. 9419,11,1814");
  sub->add_flag("--ids-only", a->ids_only, "print only the ids, space-separated on one line");
  sub->add_flag("--skip-special", a->skip_special, "--decode: leave special tokens out");
  sub->add_flag("--json", a->json,
                "one JSON object: n_tokens, ids and tokens (as written in tokenizer.json); "
                "with --decode: ids and text");
  sub->footer(
      "Added tokens such as <|im_start|> in the text are recognized. The default output is\n"
      "the count, then one line per token: id and its text (or its bytes in hex when it\n"
      "holds part of a character). Exits 1 for text that is not UTF-8.\n\n"
      "Example:\n"
      "  qforge tokenize --model /models/Qwen3.5-35B-A3B --text 'Hello, world!' --json\n"
      "  qforge tokenize --model /models/Qwen3.5-35B-A3B --decode 9419,11,1814,0");
  return {sub, [a] { return run(*a); }};
}

}  // namespace qf::tools
