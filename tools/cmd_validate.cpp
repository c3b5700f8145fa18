// qforge validate PATH: every structural problem of a checkpoint, and optionally checksums.
#include <cstdio>
#include <memory>
#include <optional>

#include "commands.h"
#include "output.h"
#include "qf/ckpt/validate.h"

namespace qf::tools {
namespace {

struct ValidateArgs {
  std::string path;
  bool checksums = false;
  bool json = false;
  int threads = 0;
  size_t max_per_code = 20;
};

std::string_view action_name(ckpt::ChecksumAction a) {
  switch (a) {
    case ckpt::ChecksumAction::kNone:
      return "none";
    case ckpt::ChecksumAction::kVerified:
      return "verified";
    case ckpt::ChecksumAction::kCreated:
      return "created";
    case ckpt::ChecksumAction::kNotCreated:
      return "not-created";
  }
  return "none";
}

int run_validate(const ValidateArgs& args) {
  ckpt::Progress progress;
  ckpt::ValidateOptions opts;
  opts.checksums = args.checksums;
  opts.threads = args.threads;
  opts.progress = &progress;
  ckpt::ValidateReport r;
  {
    std::optional<ProgressBar> bar;
    if (args.checksums) bar.emplace("checksums", progress);
    r = ckpt::validate_checkpoint(args.path, opts);
  }
  const double gbps =
      r.hash_seconds > 0 ? static_cast<double>(r.hashed_bytes) / r.hash_seconds / 1e9 : 0.0;
  if (args.json) {
    nlohmann::json j = {{"path", args.path},
                        {"ok", r.ok()},
                        {"model_files", r.n_model_files},
                        {"files", r.n_files},
                        {"tensors", r.n_tensors},
                        {"tensor_bytes", r.tensor_bytes},
                        {"problems", problems_json(r.problems)}};
    if (args.checksums) {
      j["checksums"] = {{"action", action_name(r.checksums)},
                        {"manifest", r.manifest_path.string()},
                        {"hashed_bytes", r.hashed_bytes},
                        {"seconds", r.hash_seconds}};
    }
    std::printf("%s\n", j.dump(2).c_str());
    return r.ok() ? kExitOk : kExitInvalid;
  }
  print_problems(stdout, r.problems, args.max_per_code);
  if (r.checksums == ckpt::ChecksumAction::kVerified ||
      r.checksums == ckpt::ChecksumAction::kCreated) {
    std::printf("checksums: %s %s (%s in %.2f s, %.2f GB/s)\n",
                r.checksums == ckpt::ChecksumAction::kVerified ? "verified against" : "wrote",
                r.manifest_path.string().c_str(), human_bytes(r.hashed_bytes).c_str(),
                r.hash_seconds, gbps);
  } else if (r.checksums == ckpt::ChecksumAction::kNotCreated) {
    std::printf("checksums: no manifest written for an invalid checkpoint\n");
  }
  if (r.ok()) {
    std::printf("OK: %zu model file%s, %s tensors, %s\n", r.n_model_files,
                r.n_model_files == 1 ? "" : "s", with_commas(r.n_tensors).c_str(),
                human_bytes(r.tensor_bytes).c_str());
    return kExitOk;
  }
  std::printf("FAILED: %s problem%s in %s\n", with_commas(r.problems.size()).c_str(),
              r.problems.size() == 1 ? "" : "s", args.path.c_str());
  return kExitInvalid;
}

}  // namespace

Command add_validate(CLI::App& app) {
  auto args = std::make_shared<ValidateArgs>();
  CLI::App* sub = app.add_subcommand(
      "validate", "Check every file, the index and (optionally) checksums; report all problems");
  sub->add_option("PATH", args->path, "checkpoint directory or .safetensors file")->required();
  sub->add_flag("--checksums", args->checksums,
                "verify qforge-manifest.json, or create it when absent and the checkpoint is "
                "valid (XXH3-64 per file and per tensor)");
  sub->add_flag("--json", args->json, "machine-readable report on stdout");
  sub->add_option("--threads", args->threads, "hashing threads (default: all cores)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--max-problems", args->max_per_code,
                  "problems printed per error code in text output (default 20; --json has all)");
  sub->footer(
      "Checks every safetensors rule of the reference reader, index <-> shard agreement\n"
      "(missing or unlisted tensors, duplicates across files, total_size, stray files) and\n"
      "JSON configs. Exits 2 when any problem is found.\n\n"
      "Example:\n  qforge validate /models/Qwen3.5-122B-A10B-hybrid --checksums");
  return {sub, [args] { return run_validate(*args); }};
}

}  // namespace qf::tools
