// qforge quantize-lm-head DIR (--out DIR | --in-place) [--bits 4]: the LM head as INT8 per row
// (GPTQ 8-bit) or INT4 per group of 128 (GPTQ 4-bit).
#include <cstdio>
#include <memory>
#include <optional>

#include "args.h"
#include "commands.h"
#include "output.h"
#include "qf/quant/lm_head.h"

namespace qf::tools {
namespace {

struct LmHeadArgs {
  std::string dir, out;
  bool in_place = false, force = false, dry_run = false, json = false;
  int bits = 8, samples = 16, threads = 0;
  uint64_t seed = 0;
};

int run(const LmHeadArgs& a) {
  quant::LmHeadOptions o;
  o.out = a.out;
  o.in_place = a.in_place;
  o.force = a.force;
  o.dry_run = a.dry_run;
  o.bits = a.bits;
  o.samples = a.samples;
  o.seed = a.seed;
  o.threads = a.threads;
  ckpt::Progress progress;
  quant::LmHeadReport r;
  {
    ProgressBar bar("quantize-lm-head", progress);
    r = quant::quantize_lm_head(a.dir, o, &progress);
  }
  const std::string dest = a.in_place ? a.dir : a.out;
  const char* format =
      r.bits == 8 ? "gptq-int8 (qweight I32 [H/4, V], qzeros 0x7F7F7F7F, scales F16 [1, V])"
                  : "gptq-int4 (qweight I32 [H/8, V], qzeros 0x77777777 [G, V/8], scales F16 "
                    "[G, V], G = H/128)";
  if (a.json) {
    const nlohmann::json j = {{"input", a.dir},
                              {"out", dest},
                              {"dry_run", a.dry_run},
                              {"shape", {r.rows, r.cols}},
                              {"shard", r.shard},
                              {"source_dtype", r.source_dtype},
                              {"format", format},
                              {"bits", r.bits},
                              {"group_size", r.group},
                              {"max_abs_error", r.max_abs_error},
                              {"mean_abs_error", r.mean_abs_error},
                              {"min_row_cosine", r.min_row_cosine},
                              {"mean_row_cosine", r.mean_row_cosine},
                              {"samples", r.samples},
                              {"seed", a.seed},
                              {"top1_agreement", r.top1_agreement},
                              {"top5_overlap", r.top5_overlap},
                              {"tensor_bytes_before", r.bytes_before},
                              {"tensor_bytes_after", r.bytes_after},
                              {"manifest_updated", r.manifest_updated},
                              {"seconds", r.seconds}};
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::printf("%slm_head.weight %s [%lld, %lld] in %s -> %s\n", a.dry_run ? "plan (dry run): " : "",
              r.source_dtype.c_str(), static_cast<long long>(r.rows),
              static_cast<long long>(r.cols), r.shard.c_str(),
              r.bits == 8 ? "INT8 per row, GPTQ 8-bit (group -1, sym)"
                          : "INT4 per group of 128, GPTQ 4-bit (group 128, sym)");
  std::printf("weights: max abs error %.3g, mean abs error %.3g, row cosine min %.6f mean %.6f\n",
              r.max_abs_error, r.mean_abs_error, r.min_row_cosine, r.mean_row_cosine);
  if (r.samples > 0) {
    std::printf(
        "logits on %d random hidden states N(0,1), seed %llu: top-1 agreement %.1f%%, "
        "top-5 overlap %.1f%%\n",
        r.samples, static_cast<unsigned long long>(a.seed), 100 * r.top1_agreement,
        100 * r.top5_overlap);
  }
  std::printf("lm_head bytes: %s -> %s\n", human_bytes(r.bytes_before).c_str(),
              human_bytes(r.bytes_after).c_str());
  if (r.manifest_updated) std::printf("checksums: manifest updated\n");
  if (!a.dry_run) std::printf("wrote %s in %.2f s\n", dest.c_str(), r.seconds);
  return kExitOk;
}

}  // namespace

Command add_quantize_lm_head(CLI::App& app) {
  auto a = std::make_shared<LmHeadArgs>();
  CLI::App* sub = app.add_subcommand(
      "quantize-lm-head",
      "Quantize lm_head.weight to INT8 per row or INT4 per group of 128 (GPTQ layouts)");
  sub->add_option("dir", a->dir, "checkpoint directory (AutoRound/INC config)")->required();
  CLI::Option* out =
      sub->add_option("--out", a->out, "write the result here (OUT.tmp, then renamed)");
  CLI::Option* in_place = sub->add_flag(
      "--in-place", a->in_place, "replace DIR (built beside it with hard links, then swapped)");
  out->excludes(in_place);
  sub->add_flag("--force", a->force, "replace an existing --out");
  sub->add_flag("--dry-run", a->dry_run, "measure the error and print the report; write nothing");
  sub->add_option("--bits", a->bits,
                  "8: INT8 per row (default); 4: INT4 per group of 128, AutoRound's RTN (half "
                  "the bytes, less exact: compare the reports)")
      ->check(CLI::IsMember({4, 8}));
  sub->add_option("--samples", a->samples, "random hidden states for the logits comparison")
      ->check(CLI::Range(0, 4096));
  sub->add_option("--seed", a->seed, "seed of the random hidden states");
  add_threads_option(sub, &a->threads, "worker threads");
  sub->add_flag("--json", a->json, "machine-readable report on stdout");
  sub->footer(
      "Stores lm_head.qweight I32 [H/4, V], lm_head.qzeros I32 [1, V/4] (0x7F7F7F7F) and\n"
      "lm_head.scales F16 [1, V] (--bits 4: [H/8, V], [G, V/8] of 0x77777777 and [G, V],\n"
      "G = H/128); removes lm_head.weight; sets quantization_config\n"
      "extra_config[\"lm_head\"] = {bits, group_size (-1 or 128), sym true} and config.json's\n"
      "\"qforge\".\"lm_head\" (format and quality). Every other file is unchanged.\n\n"
      "Example:\n  qforge quantize-lm-head /models/Qwen3.5-122B-A10B-hybrid --in-place");
  return {sub, [a] {
            if (a->out.empty() == !a->in_place) {
              throw Error(Errc::kUsage,
                          "quantize-lm-head: give exactly one of --out DIR and --in-place");
            }
            return run(*a);
          }};
}

}  // namespace qf::tools
