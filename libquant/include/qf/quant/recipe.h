// Recipes (recipes/*.json): the steps that turn Intel's INT4 and Qwen's FP8 releases into a
// deployable checkpoint, with their parameters, run end to end by `qforge recipe run`.
//
//   {"recipe": name, "description": text,
//    "sources": {"int4": hub id, "fp8": hub id},                  (documentation)
//    "model": {config key: value, ...},   the text-config values the inputs must have
//    "layout": {"intel_mtp_int4": bool},  how the INT4 release stores its MTP head
//    "steps": [{"step": "build-hybrid", "mtp": bool, "min_cosine": x},
//              {"step": "add-mtp"},
//              {"step": "quantize-lm-head", "samples": n, "seed": n, "min_mean_row_cosine": x},
//              {"step": "validate", "scan_values": bool}]}
//
// build-hybrid must come first; the steps then work on "<out>.recipe.tmp", which becomes <out>
// only after every step (and the final validate with checksums) passed.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "qf/ckpt/progress.h"

namespace qf::quant {

struct RecipeStep {
  std::string step;       // build-hybrid, add-mtp, quantize-lm-head, validate
  nlohmann::json params;  // the step's object without "step"
};

struct Recipe {
  std::string name, description;
  std::map<std::string, std::string> sources;
  std::map<std::string, int64_t> model;
  bool intel_mtp_int4 = false;
  std::vector<RecipeStep> steps;
};

// Strict: unknown keys, wrong types and unknown steps are Error(kConfigInvalid) naming the
// file and the key, so a typo never silently changes what runs.
Recipe parse_recipe(const std::string& text, const std::string& source);
Recipe load_recipe(const std::filesystem::path& path);

struct RecipeRunOptions {
  bool any_size = false;  // accept inputs whose sizes differ from "model" (scaled-down tests)
  bool force = false;     // replace an existing output
  bool dry_run = false;   // check the recipe and the inputs; run nothing
  int threads = 0;
};

struct RecipeStepResult {
  std::string step;
  double seconds = 0;
  nlohmann::json report;  // the step's figures
};

struct RecipeReport {
  std::vector<RecipeStepResult> steps;
  double seconds = 0;
};

// Called before each step with its index; returns the Progress the step should advance (or
// nullptr).
using RecipeStepHook = std::function<ckpt::Progress*(size_t index, const RecipeStep& step)>;

// Throws Error: kUnsupported (inputs of another model than "model" without any_size; a
// quality threshold missed), kExists, and whatever a step throws. On failure the work
// directory is removed and <out> is untouched.
RecipeReport run_recipe(const Recipe& recipe, const std::filesystem::path& int4,
                        const std::filesystem::path& fp8, const std::filesystem::path& out,
                        const RecipeRunOptions& options, const RecipeStepHook& hook = {});

}  // namespace qf::quant
