// qforge synth OUT: a deterministic synthetic Qwen3.5-MoE checkpoint in a released layout.
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include "args.h"
#include "commands.h"
#include "output.h"
#include "qf/ckpt/file_io.h"
#include "qf/quant/synth.h"

namespace qf::tools {
namespace {

struct SynthArgs {
  std::string out;
  std::string preset;
  std::string config;
  std::string from;
  std::string layout = "bf16";
  std::string values = "random";
  uint64_t seed = 0;
  int64_t layers = -1;
  bool no_mtp = false;
  bool no_vision = false;
  bool mtp_int4 = false;
  std::string shard_size = "5GiB";
  size_t shards = 0;
  std::string fp8_scale_dtype = "bf16";
  int threads = 0;
  bool dry_run = false;
  bool force = false;
};

int run_synth(const SynthArgs& a) {
  if (!a.preset.empty() + !a.config.empty() + !a.from.empty() != 1) {
    throw Error(Errc::kUsage, "give exactly one of --preset, --config or --from");
  }
  const std::string config_path =
      a.from.empty() ? a.config : (std::filesystem::path(a.from) / "config.json").string();
  const ckpt::Qwen35Config cfg =
      a.preset.empty()
          ? ckpt::qwen35_config_from_json(ckpt::read_text_file(config_path), config_path)
          : ckpt::qwen35_preset(a.preset);
  quant::SynthOptions o;
  o.layout = ckpt::layout_from_name(a.layout);
  if (a.values != "random" && a.values != "zeros") {
    throw Error(Errc::kUsage, "--values must be random or zeros, not '" + a.values + "'");
  }
  o.values = a.values == "zeros" ? quant::SynthValues::kZeros : quant::SynthValues::kRandom;
  o.seed = a.seed;
  o.schema.layers = a.layers;
  o.schema.mtp = !a.no_mtp;
  o.schema.vision = !a.no_vision;
  o.schema.mtp_int4 = a.mtp_int4;
  if (a.fp8_scale_dtype != "bf16" && a.fp8_scale_dtype != "f32") {
    throw Error(Errc::kUsage, "--fp8-scale-dtype must be bf16 or f32");
  }
  o.schema.fp8_scale_dtype = a.fp8_scale_dtype == "f32" ? ckpt::DType::kF32 : ckpt::DType::kBF16;
  o.shard_bytes = parse_size(a.shard_size, "--shard-size");
  o.shards = a.shards;
  o.overwrite = a.force;
  o.threads = a.threads;

  if (a.dry_run) {
    const quant::SynthPlan plan = quant::plan_synth(quant::effective_config(cfg, o), o);
    std::printf("would write %s: %s layout, %s tensors, %s in %zu files\n", a.out.c_str(),
                a.layout.c_str(), with_commas(plan.tensors.size()).c_str(),
                human_bytes(plan.tensor_bytes).c_str(), plan.files.size());
    for (const quant::SynthFile& f : plan.files) {
      std::printf("  %-36s %10s tensors %14s\n", f.name.c_str(), with_commas(f.n_tensors).c_str(),
                  human_bytes(f.tensor_bytes).c_str());
    }
    return kExitOk;
  }
  ckpt::Progress progress;
  const auto t0 = std::chrono::steady_clock::now();
  quant::SynthPlan plan;
  {
    ProgressBar bar("synth", progress);
    plan = a.from.empty() ? quant::synth_checkpoint(cfg, a.out, o, &progress)
                          : quant::synth_from_checkpoint(a.from, a.out, o, &progress);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string what = a.from.empty() ? a.values + " values" : "RTN from " + a.from;
  std::printf("wrote %s: %s layout (%s, %s), %s tensors, %s in %zu files, %.2f s\n", a.out.c_str(),
              a.layout.c_str(), cfg.name.c_str(), what.c_str(),
              with_commas(plan.tensors.size()).c_str(), human_bytes(plan.tensor_bytes).c_str(),
              plan.files.size(), secs);
  return kExitOk;
}

}  // namespace

Command add_synth(CLI::App& app) {
  auto a = std::make_shared<SynthArgs>();
  CLI::App* sub = app.add_subcommand(
      "synth", "Write a deterministic synthetic Qwen3.5-MoE checkpoint in a released layout");
  sub->add_option("OUT", a->out, "output directory (must not exist unless --force)")->required();
  sub->add_option("--preset", a->preset, "tiny, 35b-a3b, 122b-a10b or 397b-a17b");
  sub->add_option("--config", a->config, "a Qwen3.5-MoE config.json instead of a preset");
  sub->add_option("--from", a->from,
                  "quantize this bf16-layout checkpoint (RTN) into --layout intel-int4 or "
                  "qwen-fp8 instead of generating values");
  sub->add_option("--layout", a->layout, "bf16 (Qwen's release), intel-int4, qwen-fp8")
      ->capture_default_str();
  sub->add_option("--values", a->values, "random or zeros (zeros: sparse files)")
      ->capture_default_str();
  sub->add_option("--seed", a->seed, "seed of the value generator")->capture_default_str();
  sub->add_option("--layers", a->layers, "emit only the first N decoder layers (disk is short)");
  sub->add_flag("--no-mtp", a->no_mtp, "leave out the MTP head");
  sub->add_flag("--no-vision", a->no_vision, "leave out the vision tower");
  sub->add_flag("--mtp-int4", a->mtp_int4,
                "intel-int4: quantize MTP experts and attention (Intel's 35B), not BF16");
  sub->add_option("--fp8-scale-dtype", a->fp8_scale_dtype, "qwen-fp8 weight_scale_inv: bf16 or f32")
      ->capture_default_str();
  sub->add_option("--shard-size", a->shard_size, "largest shard (HF-style split)")
      ->capture_default_str();
  sub->add_option("--shards", a->shards, "exactly N main shards instead of --shard-size");
  add_threads_option(sub, &a->threads, "files written in parallel");
  sub->add_flag("--dry-run", a->dry_run, "print the plan (files, tensors, bytes); write nothing");
  sub->add_flag("--force", a->force, "replace an existing OUT");
  sub->footer(
      "Values are a pure function of (seed, tensor name, index): the same flags give\n"
      "byte-identical files on any machine.\n\n"
      "--from splits fused experts, quantizes INT4 exactly as AutoRound's RTN (iters=0,\n"
      "disable_opt_rtn) and FP8 exactly as transformers' fine-grained quantizer, and copies\n"
      "everything else byte for byte.\n\n"
      "Example:\n  qforge synth /tmp/tiny-bf16 --preset tiny --layout bf16\n"
      "  qforge synth /tmp/tiny-int4 --from /tmp/tiny-bf16 --layout intel-int4 --shards 2");
  return {sub, [a] { return run_synth(*a); }};
}

}  // namespace qf::tools
