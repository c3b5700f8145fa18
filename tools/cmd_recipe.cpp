// qforge recipe run RECIPE --int4 DIR --fp8 DIR --out DIR: a recipe's steps end to end.
#include <cstdio>
#include <memory>
#include <optional>

#include "args.h"
#include "commands.h"
#include "output.h"
#include "qf/quant/recipe.h"

namespace qf::tools {
namespace {

struct RecipeArgs {
  std::string recipe, int4, fp8, out;
  bool any_size = false, force = false, dry_run = false, json = false;
  int threads = 0;
};

void print_step(const quant::RecipeStepResult& s) {
  const nlohmann::json& r = s.report;
  std::printf("  %-17s %7.2f s  ", s.step.c_str(), s.seconds);
  if (s.step == "build-hybrid") {
    std::printf(
        "replaced %s shared-expert projections (%s in layers, %s MTP) + %s scales; "
        "lowest cosine %.6f\n",
        r["replaced"].dump().c_str(), r["replaced_layers"].dump().c_str(),
        r["replaced_mtp"].dump().c_str(), r["scales_added"].dump().c_str(),
        r["min_cosine"].get<double>());
    std::string unused;
    for (const auto& [k, v] : r["unused_fp8"].items()) unused += " " + k + " " + v.dump();
    std::printf("  %-17s            FP8 tensors not used:%s\n", "", unused.c_str());
  } else if (s.step == "add-mtp") {
    std::printf("MTP: %s added, %s already listed (%s)\n", r["added"].dump().c_str(),
                r["already"].dump().c_str(), r["transfer"].get<std::string>().c_str());
  } else if (s.step == "quantize-lm-head") {
    std::printf("INT8 head: row cosine min %.6f mean %.6f, top-1 %.1f%%, top-5 %.1f%%\n",
                r["min_row_cosine"].get<double>(), r["mean_row_cosine"].get<double>(),
                100 * r["top1_agreement"].get<double>(), 100 * r["top5_overlap"].get<double>());
  } else {
    std::string formats;
    for (const auto& [k, v] : r["modules_by_format"].items()) formats += " " + v.dump() + " " + k;
    std::printf("OK: %s files, %s tensors, checksums verified; modules:%s\n",
                r["files"].dump().c_str(), with_commas(r["tensors"].get<uint64_t>()).c_str(),
                formats.c_str());
  }
}

int run(const RecipeArgs& a) {
  const quant::Recipe recipe = quant::load_recipe(a.recipe);
  quant::RecipeRunOptions o;
  o.any_size = a.any_size;
  o.force = a.force;
  o.dry_run = a.dry_run;
  o.threads = a.threads;
  ckpt::Progress progress;
  std::optional<ProgressBar> bar;
  auto hook = [&](size_t i, const quant::RecipeStep& s) -> ckpt::Progress* {
    bar.reset();
    progress.done = 0;
    progress.total = 0;
    bar.emplace("recipe [" + std::to_string(i + 1) + "/" + std::to_string(recipe.steps.size()) +
                    "] " + s.step,
                progress);
    return &progress;
  };
  const quant::RecipeReport r = quant::run_recipe(recipe, a.int4, a.fp8, a.out, o, hook);
  bar.reset();
  if (a.json) {
    nlohmann::json j = {{"recipe", recipe.name}, {"out", a.out},
                        {"dry_run", a.dry_run},  {"any_size", a.any_size},
                        {"seconds", r.seconds},  {"steps", nlohmann::json::array()}};
    for (const auto& s : r.steps) {
      j["steps"].push_back({{"step", s.step}, {"seconds", s.seconds}, {"report", s.report}});
    }
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::printf("recipe %s: %s\n", recipe.name.c_str(), recipe.description.c_str());
  if (a.dry_run) {
    std::printf("plan (dry run): inputs match the recipe%s; steps:",
                a.any_size ? " (any size)" : "");
    for (const auto& s : recipe.steps)
      std::printf(" %s%s", s.step.c_str(), s.params.empty() ? "" : (" " + s.params.dump()).c_str());
    std::printf("\n");
    return kExitOk;
  }
  for (const auto& s : r.steps) print_step(s);
  std::printf("wrote %s in %.2f s\n", a.out.c_str(), r.seconds);
  return kExitOk;
}

}  // namespace

Command add_recipe(CLI::App& app) {
  auto a = std::make_shared<RecipeArgs>();
  CLI::App* sub = app.add_subcommand("recipe", "Run a recipe (recipes/*.json) end to end");
  sub->require_subcommand(1, 1);
  CLI::App* run_cmd = sub->add_subcommand("run", "Run every step of RECIPE, then validate");
  run_cmd->add_option("recipe", a->recipe, "recipe file, e.g. recipes/qwen3.5-122b-a10b-spark.json")
      ->required();
  run_cmd->add_option("--int4", a->int4, "Intel AutoRound INT4 checkpoint directory")->required();
  run_cmd->add_option("--fp8", a->fp8, "Qwen FP8 checkpoint directory")->required();
  run_cmd
      ->add_option("--out", a->out,
                   "output directory (built as OUT.recipe.tmp, renamed at the end)")
      ->required();
  run_cmd->add_flag("--any-size", a->any_size,
                    "accept inputs of another size than the recipe's model (scaled-down tests)");
  run_cmd->add_flag("--force", a->force, "replace an existing OUT");
  run_cmd->add_flag("--dry-run", a->dry_run, "check the recipe and the inputs; run nothing");
  add_threads_option(run_cmd, &a->threads, "worker threads");
  run_cmd->add_flag("--json", a->json, "machine-readable report on stdout");
  run_cmd->footer(
      "Steps run on OUT.recipe.tmp; OUT appears only after the final validate (checksums\n"
      "verified) passed.\n\n"
      "Example:\n  qforge recipe run recipes/qwen3.5-122b-a10b-spark.json \\\n"
      "    --int4 /models/Qwen3.5-122B-A10B-int4-AutoRound --fp8 /models/Qwen3.5-122B-A10B-FP8 \\\n"
      "    --out /models/Qwen3.5-122B-A10B-spark");
  return {sub, [a] { return run(*a); }};
}

}  // namespace qf::tools
