// qforge build-hybrid --int4 DIR --fp8 DIR --out DIR: Intel INT4 + Qwen FP8 shared experts.
#include <cstdio>
#include <memory>
#include <optional>

#include "args.h"
#include "commands.h"
#include "output.h"
#include "qf/quant/hybrid.h"

namespace qf::tools {
namespace {

struct HybridArgs {
  std::string int4, fp8, out;
  bool no_mtp = false, force = false, dry_run = false, no_checksums = false, no_check = false;
  bool json = false;
  int threads = 0;
};

void print_json(const HybridArgs& a, const quant::HybridReport& r) {
  nlohmann::json j = {
      {"int4", a.int4},
      {"fp8", a.fp8},
      {"out", a.out},
      {"dry_run", a.dry_run},
      {"replaced", {{"total", r.modules.size()}, {"layers", r.n_main}, {"mtp", r.n_mtp}}},
      {"scales_added", r.modules.size()},
      {"scale_dtype", r.scale_dtype},
      {"modules", r.modules},
      {"unexpected", r.n_unexpected},
      {"strays_ignored", r.strays_ignored},
      {"config_edits", r.config_edits},
      {"min_cosine", r.min_cosine},
      {"tensor_bytes_in", r.bytes_in},
      {"tensor_bytes_out", r.bytes_out},
      {"tensor_bytes_shared", r.bytes_shared},
      {"fp8_files_read", r.fp8_files_read},
      {"seconds", r.seconds}};
  j["unused_fp8"] = nlohmann::json::array();
  for (const auto& c : r.unused) {
    j["unused_fp8"].push_back({{"category", c.name},
                               {"meaning", c.meaning},
                               {"tensors", c.n_tensors},
                               {"examples", c.examples}});
  }
  j["files"] = nlohmann::json::array();
  for (const auto& f : r.files) {
    j["files"].push_back(
        {{"name", f.name}, {"tensors", f.n_tensors}, {"tensor_bytes", f.tensor_bytes}});
  }
  std::printf("%s\n", j.dump(2).c_str());
}

void print_human(const HybridArgs& a, const quant::HybridReport& r) {
  std::printf("%s%s + %s -> %s\n", a.dry_run ? "plan (dry run): " : "", a.int4.c_str(),
              a.fp8.c_str(), a.out.c_str());
  std::printf(
      "replaced %zu shared-expert projections with FP8 (%zu in decoder layers, %zu in the "
      "MTP layer); added %zu weight_scale_inv (%s)\n",
      r.modules.size(), r.n_main, r.n_mtp, r.modules.size(), r.scale_dtype.c_str());
  if (!r.min_cosine_module.empty()) {
    std::printf("check: FP8 vs the INT4 checkpoint's BF16, lowest cosine %.6f (%s)\n", r.min_cosine,
                r.min_cosine_module.c_str());
  }
  std::printf("FP8 tensors not used:\n");
  for (const auto& c : r.unused) {
    std::printf("  %-26s %8s  %s\n", c.name.c_str(), with_commas(c.n_tensors).c_str(),
                c.meaning.c_str());
  }
  if (r.n_unexpected)
    std::printf("  %-26s %8s  (accepted with --force)\n", "unexpected",
                with_commas(r.n_unexpected).c_str());
  for (const std::string& s : r.strays_ignored)
    std::printf("ignored stray file %s (not copied)\n", s.c_str());
  for (const std::string& m : r.config_edits)
    std::printf("config: extra_config[%s] = 16-bit\n", m.c_str());
  const double saved = static_cast<double>(r.bytes_in) - static_cast<double>(r.bytes_out);
  std::printf("tensor bytes: %s in, %s out (%s %s)\n", human_bytes(r.bytes_in).c_str(),
              human_bytes(r.bytes_out).c_str(),
              human_bytes(static_cast<uint64_t>(std::abs(saved))).c_str(),
              saved >= 0 ? "saved" : "added");
  std::printf("FP8 files read: %zu\n", r.fp8_files_read.size());
  for (const auto& f : r.files) {
    std::printf("  %-36s %10s tensors %14s\n", f.name.c_str(), with_commas(f.n_tensors).c_str(),
                human_bytes(f.tensor_bytes).c_str());
  }
  if (!a.dry_run) {
    std::printf("wrote %s in %.2f s", a.out.c_str(), r.seconds);
    if (r.bytes_shared > 0) {
      std::printf(" (%s shared with the inputs' blocks, %s written)",
                  human_bytes(r.bytes_shared).c_str(),
                  human_bytes(r.bytes_out - r.bytes_shared).c_str());
    }
    std::printf("\n");
  }
}

int run(const HybridArgs& a) {
  quant::HybridOptions o;
  o.mtp = !a.no_mtp;
  o.force = a.force;
  o.dry_run = a.dry_run;
  o.checksums = !a.no_checksums;
  o.check = !a.no_check;
  o.threads = a.threads;
  ckpt::Progress progress;
  quant::HybridReport r;
  {
    std::optional<ProgressBar> bar;
    if (!a.dry_run) bar.emplace("build-hybrid", progress);
    r = quant::build_hybrid(a.int4, a.fp8, a.out, o, &progress);
  }
  if (a.json) {
    print_json(a, r);
  } else {
    print_human(a, r);
  }
  return kExitOk;
}

}  // namespace

Command add_build_hybrid(CLI::App& app) {
  auto a = std::make_shared<HybridArgs>();
  CLI::App* sub = app.add_subcommand(
      "build-hybrid", "Intel's INT4 checkpoint with Qwen's FP8 block-128 shared experts");
  sub->add_option("--int4", a->int4, "Intel AutoRound INT4 checkpoint directory")->required();
  sub->add_option("--fp8", a->fp8,
                  "Qwen FP8 checkpoint directory (only files holding needed "
                  "tensors are read)")
      ->required();
  sub->add_option("--out", a->out, "output directory (written as OUT.tmp, renamed at the end)")
      ->required();
  sub->add_flag("--no-mtp", a->no_mtp, "keep the MTP layer's shared expert in BF16");
  sub->add_flag("--no-check", a->no_check,
                "skip comparing FP8 weights with the BF16 ones (cosine)");
  sub->add_flag("--no-checksums", a->no_checksums, "do not write qforge-manifest.json");
  sub->add_flag("--dry-run", a->dry_run,
                "print the plan (replacements, unused FP8 tensors, shards)");
  sub->add_flag("--force", a->force, "replace an existing OUT; accept unexpected FP8 tensors");
  add_threads_option(sub, &a->threads, "threads writing and hashing the output files");
  sub->add_flag("--json", a->json, "machine-readable report on stdout");
  sub->footer(
      "Everything but the shared-expert projections is copied byte for byte; the MTP sidecar is\n"
      "carried over and listed in the rebuilt index; config.json gains a \"qforge\" object.\n\n"
      "Example:\n  qforge build-hybrid --int4 /models/Qwen3.5-122B-A10B-int4-AutoRound \\\n"
      "    --fp8 /models/Qwen3.5-122B-A10B-FP8 --out /models/Qwen3.5-122B-A10B-hybrid");
  return {sub, [a] { return run(*a); }};
}

}  // namespace qf::tools
