#include "args.h"

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "qf/error.h"
#include "qf/rt/speculative.h"

namespace qf::tools {

void add_threads_option(CLI::App* sub, int* out, const std::string& what) {
  sub->add_option("--threads", *out, what + " (default: all cores)")->check(CLI::Range(0, 1024));
}

void add_kv_cache_option(CLI::App* sub, rt::KvCacheType* out) {
  using rt::KvCacheType;
  const std::string f32 = rt::kv_cache_type_name(KvCacheType::kF32),
                    bf16 = rt::kv_cache_type_name(KvCacheType::kBf16),
                    fp8 = rt::kv_cache_type_name(KvCacheType::kFp8);
  sub->add_option_function<std::string>(
         "--kv-cache-dtype",
         [out, bf16, fp8](const std::string& v) {
           *out = v == bf16                     ? KvCacheType::kBf16
                  : v == fp8 || v == "fp8_e4m3" ? KvCacheType::kFp8
                                                : KvCacheType::kF32;
         },
         "the attention layers' KV cache entries: float32 (exact), bfloat16 (half the bytes; "
         "each entry rounded to nearest even), or fp8 (also fp8_e4m3: a quarter of the bytes; "
         "FP8 E4M3 at unit scale, rounded to nearest even, clamped to +-448)")
      ->check(CLI::IsMember({f32, bf16, fp8, std::string("fp8_e4m3")}))
      ->default_str(f32);
}

void add_mtp_vocab_option(CLI::App* sub, int64_t* out, const std::string& needs) {
  sub->add_option("--mtp-draft-vocab", *out,
                  "the MTP head drafts from token ids [0, N) only, its LM head reading N rows "
                  "(a multiple of 128; the ids keep speculative decoding's guarantees, only how "
                  "many drafts are kept changes; default: all)")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()))
      ->needs(sub->get_option(needs));
}

void add_draft_tokens_option(CLI::App* sub, int* out) {
  sub->add_option("--draft-tokens", *out,
                  "tokens the MTP head drafts a round, each later one from its own output (1 to " +
                      std::to_string(rt::kMaxDrafts) + "; the CUDA engine up to " +
                      std::to_string(rt::kMaxCudaDrafts) + "; default 1)")
      ->check(CLI::Range(1, rt::kMaxDrafts))
      ->needs(sub->get_option("--speculative"));
}

void check_draft_tokens(int drafts, const std::string& device) {
  if (drafts > rt::kMaxCudaDrafts && device == "cuda") {
    throw Error(Errc::kUnsupported, "--draft-tokens " + std::to_string(drafts) +
                                        ": the CUDA engine verifies up to " +
                                        std::to_string(rt::kMaxCudaDrafts) +
                                        " drafts a round (more run on the CPU engine, --device "
                                        "cpu)");
  }
}

namespace {

// Empty if `v` is a decimal integer within 64 bits ('-' only where `is_signed`), which it then
// leaves without leading zeros (else CLI11 reads 010 as octal); else why not.
std::string integer_problem(std::string& v, bool is_signed) {
  const bool minus = !v.empty() && v[0] == '-';
  const size_t d0 = minus ? 1 : 0;
  if (v.size() == d0 || v.find_first_not_of("0123456789", d0) != std::string::npos) {
    return "'" + v + "' is not a decimal integer";
  }
  const size_t first = v.find_first_not_of('0', d0);
  if (first == std::string::npos) {
    v = "0";
    return "";
  }
  if (minus && !is_signed) return "'" + v + "' is negative: it takes 0 or more";
  const std::string digits = v.substr(first);
  const std::string max = !is_signed ? "18446744073709551615"
                          : minus    ? "9223372036854775808"
                                     : "9223372036854775807";
  if (digits.size() > max.size() || (digits.size() == max.size() && digits > max)) {
    return "'" + v + "' is out of range";
  }
  v = (minus ? "-" : "") + digits;
  return "";
}

}  // namespace

void strict_integers(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    const std::string type = opt->get_type_name();
    const bool is_unsigned = type.rfind("UINT", 0) == 0;
    if (!is_unsigned && type.rfind("INT", 0) != 0) continue;
    opt->transform(CLI::Validator(
        [is_unsigned](std::string& v) { return integer_problem(v, !is_unsigned); }, ""));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) strict_integers(*sub);
}

uint64_t parse_size(const std::string& text, const std::string& flag) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  const std::string unit = end ? std::string(end) : "";
  double mult = 0;
  if (unit.empty() || unit == "B") mult = 1;
  if (unit == "K" || unit == "KB") mult = 1e3;
  if (unit == "M" || unit == "MB") mult = 1e6;
  if (unit == "G" || unit == "GB") mult = 1e9;
  if (unit == "T" || unit == "TB") mult = 1e12;
  if (unit == "KiB") mult = 1024.0;
  if (unit == "MiB") mult = 1024.0 * 1024;
  if (unit == "GiB") mult = 1024.0 * 1024 * 1024;
  if (unit == "TiB") mult = 1024.0 * 1024 * 1024 * 1024;
  if (end == text.c_str() || mult == 0 || !(v > 0) || !std::isfinite(v * mult) ||
      v * mult > 1.8e19) {
    throw Error(Errc::kUsage, flag + " '" + text + "' is not a size such as 5GiB, 512MiB or 4096");
  }
  return static_cast<uint64_t>(std::llround(v * mult));
}

}  // namespace qf::tools
