// qforge add-mtp --source DIR --target DIR: give a checkpoint back its MTP head.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "output.h"
#include "qf/quant/add_mtp.h"

namespace qf::tools {
namespace {

struct AddMtpArgs {
  std::string source, target;
  bool link = false, force = false, dry_run = false, json = false;
};

int run(const AddMtpArgs& a) {
  quant::AddMtpOptions o;
  o.link = a.link;
  o.force = a.force;
  o.dry_run = a.dry_run;
  const quant::AddMtpReport r = quant::add_mtp(a.source, a.target, o);
  if (a.json) {
    const nlohmann::json j = {{"source", a.source},
                              {"target", a.target},
                              {"dry_run", a.dry_run},
                              {"found", r.found},
                              {"added", r.added},
                              {"already_present", r.already},
                              {"files", r.files},
                              {"transfer", r.transfer},
                              {"total_size", r.total_size_after},
                              {"manifest_updated", r.manifest_updated}};
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::string files;
  for (const std::string& f : r.files) files += (files.empty() ? "" : ", ") + f;
  std::printf("%ssource %s: %s mtp.* tensors\n", a.dry_run ? "plan (dry run): " : "",
              a.source.c_str(), with_commas(r.found).c_str());
  std::printf("target %s: %s: %s\n", a.target.c_str(), files.c_str(), r.transfer.c_str());
  if (r.added == 0) {
    std::printf("index: nothing to add, all %s MTP tensors already listed\n",
                with_commas(r.already).c_str());
  } else {
    std::printf("index: %s %s MTP tensors (%s already listed)\n", a.dry_run ? "would add" : "added",
                with_commas(r.added).c_str(), with_commas(r.already).c_str());
  }
  if (!a.dry_run && r.total_size_after != r.total_size_before) {
    std::printf("index: total_size %llu -> %llu\n",
                static_cast<unsigned long long>(r.total_size_before),
                static_cast<unsigned long long>(r.total_size_after));
  }
  if (r.manifest_updated) std::printf("checksums: manifest updated\n");
  return kExitOk;
}

}  // namespace

Command add_add_mtp(CLI::App& app) {
  auto a = std::make_shared<AddMtpArgs>();
  CLI::App* sub =
      app.add_subcommand("add-mtp", "Restore a checkpoint's MTP head (sidecar + index entries)");
  sub->add_option("--source", a->source,
                  "checkpoint with the mtp.* tensors (e.g. Intel's INT4 release)")
      ->required();
  sub->add_option("--target", a->target, "checkpoint directory to restore them into")->required();
  sub->add_flag("--link", a->link, "hard link the sidecar when possible instead of reflink/copy");
  sub->add_flag("--force", a->force, "replace a differing sidecar already in the target");
  sub->add_flag("--dry-run", a->dry_run, "report what would be added; change nothing");
  sub->add_flag("--json", a->json, "machine-readable report on stdout");
  sub->footer(
      "Checks every MTP tensor against the target's config.json, brings the sidecar, adds exactly\n"
      "the mtp.* names to the index (total_size recomputed) and updates the checksum manifest.\n"
      "Running it twice adds nothing.\n\n"
      "Example:\n  qforge add-mtp --source /models/Qwen3.5-122B-A10B-int4-AutoRound \\\n"
      "    --target /models/Qwen3.5-122B-A10B-hybrid");
  return {sub, [a] { return run(*a); }};
}

}  // namespace qf::tools
