// qforge dequantize DIR --out DIR: any supported checkpoint to plain BF16 (transformers layout).
#include <cstdio>
#include <memory>
#include <optional>

#include "args.h"
#include "commands.h"
#include "output.h"
#include "qf/quant/dequantize.h"

namespace qf::tools {
namespace {

struct DequantizeArgs {
  std::string input, out, shard_size = "5GiB", dtype = "bf16";
  size_t shards = 0;
  bool force = false, dry_run = false, no_checksums = false, json = false;
  int threads = 0;
};

int run(const DequantizeArgs& a) {
  quant::DequantizeOptions o;
  o.force = a.force;
  o.dry_run = a.dry_run;
  o.checksums = !a.no_checksums;
  o.shard_bytes = parse_size(a.shard_size, "--shard-size");
  o.shards = a.shards;
  o.threads = a.threads;
  o.dtype = a.dtype == "f32" ? ckpt::DType::kF32 : ckpt::DType::kBF16;
  ckpt::Progress progress;
  quant::DequantizeReport r;
  {
    std::optional<ProgressBar> bar;
    if (!a.dry_run) bar.emplace("dequantize", progress);
    r = quant::dequantize_checkpoint(a.input, a.out, o, &progress);
  }
  if (a.json) {
    const nlohmann::json j = {{"input", a.input},
                              {"out", a.out},
                              {"dtype", a.dtype},
                              {"dry_run", a.dry_run},
                              {"input_modules", r.modules_by_format},
                              {"tensors", r.n_tensors},
                              {"tensor_bytes", r.tensor_bytes},
                              {"files", r.files},
                              {"mtp", r.mtp},
                              {"vision", r.vision},
                              {"seconds", r.seconds}};
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::string formats;
  for (const auto& [f, n] : r.modules_by_format) {
    formats += (formats.empty() ? "" : ", ") + with_commas(n) + " " + f;
  }
  std::printf("%s%s: linear modules %s%s%s\n", a.dry_run ? "plan (dry run): " : "", a.input.c_str(),
              formats.c_str(), r.mtp ? "; MTP" : "", r.vision ? "; vision" : "");
  std::printf("%s %s: %s (Qwen release layout), %s tensors, %s in %zu files\n",
              a.dry_run ? "would write" : "wrote", a.out.c_str(), a.dtype == "f32" ? "F32" : "BF16",
              with_commas(r.n_tensors).c_str(), human_bytes(r.tensor_bytes).c_str(),
              r.files.size());
  if (!a.dry_run) std::printf("done in %.2f s\n", r.seconds);
  return kExitOk;
}

}  // namespace

Command add_dequantize(CLI::App& app) {
  auto a = std::make_shared<DequantizeArgs>();
  CLI::App* sub = app.add_subcommand(
      "dequantize", "Any supported checkpoint to plain BF16 in the layout transformers loads");
  sub->add_option("dir", a->input, "checkpoint directory (BF16, FP8, INT4, hybrid, INT8 head)")
      ->required();
  sub->add_option("--out", a->out, "output directory (written as OUT.tmp, renamed at the end)")
      ->required();
  sub->add_option("--shard-size", a->shard_size, "largest shard (HF-style split)")
      ->capture_default_str();
  sub->add_option("--shards", a->shards, "exactly N shards instead of --shard-size");
  sub->add_option("--dtype", a->dtype, "bf16, or f32: the reconstructed values without rounding")
      ->check(CLI::IsMember({"bf16", "f32"}))
      ->capture_default_str();
  sub->add_flag("--no-checksums", a->no_checksums, "do not write qforge-manifest.json");
  sub->add_flag("--dry-run", a->dry_run, "check the input and print the plan; write nothing");
  sub->add_flag("--force", a->force, "replace an existing OUT");
  add_threads_option(sub, &a->threads, "worker threads");
  sub->add_flag("--json", a->json, "machine-readable report on stdout");
  sub->footer(
      "Each weight is reconstructed exactly in f32 by its format (INT4/INT8 GPTQ, FP8 block)\n"
      "and rounded to BF16 to nearest even (--dtype f32 keeps it exact: references for\n"
      "engines); tensors already in the output dtype are copied byte for byte. Routed\n"
      "experts are fused per layer (gate rows first), A_log and the gated norm are F32, and\n"
      "config.json loses quantization_config. The input must pass `qforge validate`.\n\n"
      "Example:\n  qforge dequantize /models/Qwen3.5-35B-A3B-hybrid --out /tmp/35b-bf16");
  return {sub, [a] { return run(*a); }};
}

}  // namespace qf::tools
