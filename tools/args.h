// Parsing helpers for command-line values.
#pragma once

#include <cstdint>
#include <string>

#include "qf/rt/kv_cache.h"

namespace CLI {
class App;
}

namespace qf::tools {

// Every integer option of `app` and of its subcommands, at any depth, takes decimal digits only,
// with a '-' on signed ones, within 64 bits: CLI11 2.1 reads 010 as octal and 0x10 as hex, gives
// 2^63 - 1 for anything past it and 2^64 - 1 for -1 on an unsigned option. The option's own
// type and checks then bound it as before. Call once every option is added.
void strict_integers(CLI::App& app);

// "5GiB", "512MiB", "4096", "5G" (decimal), "1.5GiB"; throws Error(kUsage) naming the flag.
uint64_t parse_size(const std::string& text, const std::string& flag);

// --threads N into *out: 0 (the default) for all cores, else 1 .. 1024; `what` says what they do.
void add_threads_option(CLI::App* sub, int* out, const std::string& what);
// --kv-cache-dtype float32 | bfloat16 | fp8 on an engine command (qf/rt/kv_cache.h), into *out.
void add_kv_cache_option(CLI::App* sub, rt::KvCacheType* out);
// --mtp-draft-vocab N (qf/rt/mtp_vocab.h) into *out (0: not given), needing the flag `needs`
// (--speculative, --mtp) on the same command.
void add_mtp_vocab_option(CLI::App* sub, int64_t* out, const std::string& needs);
// --draft-tokens N (1 .. rt::kMaxDrafts: the MTP head's drafts a speculative round) into *out,
// needing --speculative on the same command.
void add_draft_tokens_option(CLI::App* sub, int* out);
// Before a model loads: Error(kUnsupported) for more drafts a round than `device` takes.
void check_draft_tokens(int drafts, const std::string& device);

}  // namespace qf::tools
