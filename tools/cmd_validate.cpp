// qforge validate PATH: every structural problem of a checkpoint, and optionally checksums.
#include <cstdio>
#include <memory>
#include <optional>

#include "args.h"
#include "commands.h"
#include "output.h"
#include "qf/ckpt/validate.h"
#include "qf/quant/model_check.h"

namespace qf::tools {
namespace {

struct ValidateArgs {
  std::string path;
  bool checksums = false;
  bool json = false;
  int threads = 0;
  size_t max_per_code = 20;
  bool no_model = false;
  bool scan_values = false;
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
  quant::ModelCheckStats model;
  ckpt::Progress scan_progress;
  if (!args.no_model || args.scan_values) {
    opts.extra_checks = [&](const ckpt::Checkpoint& c, std::vector<ckpt::Problem>& problems) {
      quant::ModelCheckOptions mo;
      mo.scan_values = args.scan_values;
      mo.threads = args.threads;
      mo.progress = &scan_progress;
      std::optional<ProgressBar> bar;
      if (args.scan_values) bar.emplace("scan-values", scan_progress);
      if (args.no_model) {  // values only
        std::vector<ckpt::Problem> ignored;
        model = quant::check_qwen35_model(c, mo, ignored);
        for (auto& p : ignored) {
          if (p.code == Errc::kNonFiniteValues) problems.push_back(std::move(p));
        }
        model.checked = false;
      } else {
        model = quant::check_qwen35_model(c, mo, problems);
      }
    };
  }
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
    j["model"] = {{"checked", model.checked},
                  {"skipped_because", model.skipped_because},
                  {"modules_by_format", model.modules_by_format},
                  {"mtp", model.has_mtp},
                  {"vision", model.has_vision}};
    if (args.scan_values) j["scanned_bytes"] = model.scanned_bytes;
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
  if (model.checked) {
    std::string formats;
    for (const auto& [f, n] : model.modules_by_format) {
      formats += (formats.empty() ? "" : ", ") + with_commas(n) + " " + f;
    }
    std::printf("model: Qwen3.5-MoE per config.json; linear modules: %s; MTP %s; vision %s\n",
                formats.c_str(), model.has_mtp ? "present" : "absent",
                model.has_vision ? "present" : "absent");
  } else if (!args.no_model && !model.skipped_because.empty()) {
    std::printf("model: not checked (%s)\n", model.skipped_because.c_str());
  }
  if (args.scan_values)
    std::printf("values: scanned %s for NaN/Inf\n", human_bytes(model.scanned_bytes).c_str());
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
  add_threads_option(sub, &args->threads, "hashing threads");
  sub->add_flag("--no-model", args->no_model,
                "structural checks only (skip the checks against config.json)");
  sub->add_flag("--scan-values", args->scan_values,
                "read every float tensor and report NaN/Inf (reads the whole checkpoint)");
  sub->add_option("--max-problems", args->max_per_code,
                  "problems printed per error code in text output (default 20; --json has all)");
  sub->footer(
      "Checks every safetensors rule of the reference reader, index <-> shard agreement\n"
      "(missing or unlisted tensors, duplicates across files, total_size, stray files), JSON\n"
      "configs, and, for a Qwen3.5-MoE config.json, the expected tensor set in any layout\n"
      "(dtypes, shapes, INT4 triplets, FP8 scales, quantization_config vs tensors, MTP).\n"
      "Exits 2 when any problem is found.\n\n"
      "Example:\n  qforge validate /models/Qwen3.5-122B-A10B-hybrid --checksums");
  return {sub, [args] { return run_validate(*args); }};
}

}  // namespace qf::tools
