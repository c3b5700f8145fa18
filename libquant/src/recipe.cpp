#include "qf/quant/recipe.h"

#include <chrono>
#include <set>

#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/file_io.h"
#include "qf/ckpt/qwen35_config.h"
#include "qf/ckpt/validate.h"
#include "qf/error.h"
#include "qf/quant/add_mtp.h"
#include "qf/quant/hybrid.h"
#include "qf/quant/lm_head.h"
#include "qf/quant/model_check.h"

namespace qf::quant {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The config values a recipe may pin, as Qwen35Config reads them.
const std::map<std::string, std::function<int64_t(const ckpt::Qwen35Config&)>>& model_keys() {
  static const std::map<std::string, std::function<int64_t(const ckpt::Qwen35Config&)>> keys = {
      {"hidden_size", [](const auto& c) { return c.hidden_size; }},
      {"num_hidden_layers", [](const auto& c) { return c.num_layers(); }},
      {"num_experts", [](const auto& c) { return c.num_experts; }},
      {"num_experts_per_tok", [](const auto& c) { return c.num_experts_per_tok; }},
      {"moe_intermediate_size", [](const auto& c) { return c.moe_intermediate_size; }},
      {"shared_expert_intermediate_size",
       [](const auto& c) { return c.shared_expert_intermediate_size; }},
      {"vocab_size", [](const auto& c) { return c.vocab_size; }},
      {"mtp_num_hidden_layers", [](const auto& c) { return c.mtp_num_hidden_layers; }},
      {"num_attention_heads", [](const auto& c) { return c.num_attention_heads; }},
      {"num_key_value_heads", [](const auto& c) { return c.num_key_value_heads; }},
      {"linear_num_value_heads", [](const auto& c) { return c.linear_num_value_heads; }},
  };
  return keys;
}

// Each step's parameters and their JSON types.
const std::map<std::string, std::map<std::string, json::value_t>>& step_params() {
  static const std::map<std::string, std::map<std::string, json::value_t>> steps = {
      {"build-hybrid",
       {{"mtp", json::value_t::boolean}, {"min_cosine", json::value_t::number_float}}},
      {"add-mtp", {}},
      {"quantize-lm-head",
       {{"bits", json::value_t::number_unsigned},
        {"samples", json::value_t::number_unsigned},
        {"seed", json::value_t::number_unsigned},
        {"min_mean_row_cosine", json::value_t::number_float},
        {"min_top1_agreement", json::value_t::number_float}}},
      {"validate", {{"scan_values", json::value_t::boolean}}},
  };
  return steps;
}

bool type_fits(const json& v, json::value_t want) {
  switch (want) {
    case json::value_t::boolean:
      return v.is_boolean();
    case json::value_t::number_unsigned:
      return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
    case json::value_t::number_float:
      return v.is_number();
    default:
      return v.is_string();
  }
}

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw Error(Errc::kConfigInvalid, source + ": " + what);
}

void check_model(const Recipe& r, const fs::path& dir, bool any_size) {
  const fs::path p = dir / "config.json";
  std::error_code ec;
  if (!fs::exists(p, ec)) throw Error(Errc::kConfigInvalid, p.string() + ": missing");
  const ckpt::Qwen35Config cfg = ckpt::qwen35_config_from_json(ckpt::read_text_file(p), p.string());
  if (any_size) return;
  for (const auto& [key, want] : r.model) {
    const int64_t have = model_keys().at(key)(cfg);
    if (have != want) {
      throw Error(Errc::kUnsupported, "recipe " + r.name + " is for " + key + " = " +
                                          std::to_string(want) + "; " + p.string() + " has " +
                                          std::to_string(have) + " (--any-size runs it anyway)");
    }
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

json run_build_hybrid(const json& p, const fs::path& int4, const fs::path& fp8,
                      const fs::path& work, int threads, ckpt::Progress* progress) {
  HybridOptions o;
  o.mtp = p.value("mtp", true);
  o.min_cosine = p.value("min_cosine", o.min_cosine);
  o.force = true;  // the work directory is ours
  o.threads = threads;
  const HybridReport r = build_hybrid(int4, fp8, work, o, progress);
  json unused = json::object();
  for (const HybridCategory& c : r.unused) unused[c.name] = c.n_tensors;
  return {{"replaced", r.modules.size()}, {"replaced_layers", r.n_main},
          {"replaced_mtp", r.n_mtp},      {"scales_added", r.modules.size()},
          {"min_cosine", r.min_cosine},   {"unused_fp8", unused},
          {"tensor_bytes", r.bytes_out}};
}

json run_lm_head(const json& p, const fs::path& work, int threads, ckpt::Progress* progress) {
  LmHeadOptions o;
  o.in_place = true;
  o.bits = p.value("bits", o.bits);
  o.samples = p.value("samples", o.samples);
  o.seed = p.value("seed", o.seed);
  o.threads = threads;
  // Measure first, so a head below the recipe's thresholds is refused before it is written.
  LmHeadOptions dry = o;
  dry.dry_run = true;
  const LmHeadReport m = quantize_lm_head(work, dry, nullptr);
  const double min_cos = p.value("min_mean_row_cosine", 0.0),
               min_top1 = p.value("min_top1_agreement", 0.0);
  if (m.mean_row_cosine < min_cos || m.top1_agreement < min_top1) {
    throw Error(Errc::kUnsupported, std::string(o.bits == 8 ? "INT8" : "INT4") +
                                        " LM head below the recipe's thresholds: mean row cosine " +
                                        std::to_string(m.mean_row_cosine) + " (min " +
                                        std::to_string(min_cos) + "), top-1 agreement " +
                                        std::to_string(m.top1_agreement) + " (min " +
                                        std::to_string(min_top1) + ")");
  }
  const LmHeadReport r = quantize_lm_head(work, o, progress);
  return {{"bits", r.bits},
          {"max_abs_error", r.max_abs_error},
          {"mean_abs_error", r.mean_abs_error},
          {"min_row_cosine", r.min_row_cosine},
          {"mean_row_cosine", r.mean_row_cosine},
          {"top1_agreement", r.top1_agreement},
          {"top5_overlap", r.top5_overlap},
          {"bytes_before", r.bytes_before},
          {"bytes_after", r.bytes_after}};
}

json run_validate(const json& p, const fs::path& work, int threads, ckpt::Progress* progress) {
  ModelCheckOptions mo;
  mo.scan_values = p.value("scan_values", false);
  mo.threads = threads;
  ModelCheckStats stats;
  ckpt::ValidateOptions vo;
  vo.checksums = true;
  vo.threads = threads;
  vo.progress = progress;
  vo.extra_checks = [&](const ckpt::Checkpoint& c, std::vector<ckpt::Problem>& problems) {
    stats = check_qwen35_model(c, mo, problems);
  };
  const ckpt::ValidateReport r = ckpt::validate_checkpoint(work, vo);
  if (!r.ok()) {
    throw Error(
        r.problems[0].code,
        "validate: " + ckpt::format_problem(r.problems[0]) +
            (r.problems.size() > 1 ? " (and " + std::to_string(r.problems.size() - 1) + " more)"
                                   : ""));
  }
  if (r.checksums != ckpt::ChecksumAction::kVerified) {
    throw Error(Errc::kIo, "validate: the steps left no checksum manifest to verify");
  }
  return {{"ok", true},
          {"files", r.n_model_files},
          {"tensors", r.n_tensors},
          {"tensor_bytes", r.tensor_bytes},
          {"modules_by_format", stats.modules_by_format},
          {"mtp", stats.has_mtp},
          {"checksums", "verified"},
          {"scanned_bytes", stats.scanned_bytes}};
}

}  // namespace

Recipe parse_recipe(const std::string& text, const std::string& source) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    bad(source, e.what());
  }
  if (!doc.is_object()) bad(source, "a recipe is a JSON object");
  static const std::set<std::string> top = {"recipe", "description", "sources",
                                            "model",  "layout",      "steps"};
  for (const auto& [k, v] : doc.items()) {
    if (!top.count(k)) bad(source, "unknown key \"" + k + "\"");
  }
  Recipe r;
  if (!doc.contains("recipe") || !doc["recipe"].is_string())
    bad(source, "\"recipe\" (a name) is required");
  r.name = doc["recipe"].get<std::string>();
  // The optional members' types, before any is read (found by fuzz_config: a description
  // object escaped as nlohmann's type_error).
  for (const auto& [key, is_object] : {std::pair{"description", false}, std::pair{"sources", true},
                                       std::pair{"model", true}, std::pair{"layout", true}}) {
    if (doc.contains(key) && (is_object ? !doc[key].is_object() : !doc[key].is_string())) {
      bad(source, std::string("\"") + key + "\" must be " + (is_object ? "an object" : "a string"));
    }
  }
  r.description = doc.value("description", "");
  const json sources = doc.value("sources", json::object());
  for (const auto& [k, v] : sources.items()) {
    if (!v.is_string()) bad(source, "sources." + k + " must be a string");
    r.sources[k] = v.get<std::string>();
  }
  const json model = doc.value("model", json::object());
  for (const auto& [k, v] : model.items()) {
    if (!model_keys().count(k))
      bad(source, "model." + k + " is not a config value recipes can pin");
    if (!v.is_number_integer()) bad(source, "model." + k + " must be an integer");
    r.model[k] = v.get<int64_t>();
  }
  const json layout = doc.value("layout", json::object());
  for (const auto& [k, v] : layout.items()) {
    if (k != "intel_mtp_int4") bad(source, "unknown key layout." + k);
    if (!v.is_boolean()) bad(source, "layout." + k + " must be true or false");
    r.intel_mtp_int4 = v.get<bool>();
  }
  if (!doc.contains("steps") || !doc["steps"].is_array() || doc["steps"].empty()) {
    bad(source, "\"steps\" must be a non-empty array");
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < doc["steps"].size(); ++i) {
    const json& s = doc["steps"][i];
    const std::string where = "steps[" + std::to_string(i) + "]";
    if (!s.is_object() || !s.contains("step") || !s["step"].is_string()) {
      bad(source, where + " must be an object with a \"step\" name");
    }
    RecipeStep step{s["step"].get<std::string>(), json::object()};
    const auto known = step_params().find(step.step);
    if (known == step_params().end()) {
      bad(source, where + ": unknown step \"" + step.step +
                      "\" (build-hybrid, add-mtp, quantize-lm-head, validate)");
    }
    if (!seen.insert(step.step).second)
      bad(source, where + ": \"" + step.step + "\" appears twice");
    for (const auto& [k, v] : s.items()) {
      if (k == "step") continue;
      const auto type = known->second.find(k);
      if (type == known->second.end())
        bad(source, where + " (" + step.step + "): unknown parameter \"" + k + "\"");
      if (!type_fits(v, type->second))
        bad(source, where + " (" + step.step + "): \"" + k + "\" has the wrong type");
      if (k == "bits" && v != 4 && v != 8)
        bad(source, where + " (" + step.step + "): \"bits\" must be 8 or 4");
      step.params[k] = v;
    }
    r.steps.push_back(std::move(step));
  }
  if (r.steps.front().step != "build-hybrid") bad(source, "the first step must be build-hybrid");
  if (r.steps.back().step != "validate") bad(source, "the last step must be validate");
  return r;
}

Recipe load_recipe(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw Error(Errc::kIo, "'" + path.string() + "': no such recipe file");
  return parse_recipe(ckpt::read_text_file(path, 1 << 20), path.string());
}

RecipeReport run_recipe(const Recipe& recipe, const fs::path& int4, const fs::path& fp8,
                        const fs::path& out, const RecipeRunOptions& o,
                        const RecipeStepHook& hook) {
  const auto t0 = std::chrono::steady_clock::now();
  std::error_code ec;
  if (!o.force && !o.dry_run && fs::exists(out, ec)) {
    throw Error(Errc::kExists, "'" + out.string() + "' exists (use --force to overwrite)");
  }
  for (const fs::path& in : {int4, fp8}) {
    if (!fs::is_directory(in, ec))
      throw Error(Errc::kIo, "'" + in.string() + "': no such checkpoint directory");
    check_model(recipe, in, o.any_size);
  }
  RecipeReport rep;
  if (o.dry_run) return rep;
  fs::path work = out;
  work += ".recipe.tmp";
  fs::remove_all(work, ec);  // an interrupted run's
  try {
    for (size_t i = 0; i < recipe.steps.size(); ++i) {
      const RecipeStep& s = recipe.steps[i];
      ckpt::Progress* progress = hook ? hook(i, s) : nullptr;
      const auto ts = std::chrono::steady_clock::now();
      RecipeStepResult res{s.step, 0, json::object()};
      if (s.step == "build-hybrid") {
        res.report = run_build_hybrid(s.params, int4, fp8, work, o.threads, progress);
      } else if (s.step == "add-mtp") {
        const AddMtpReport r = add_mtp(int4, work, {});
        res.report = {{"found", r.found},
                      {"added", r.added},
                      {"already", r.already},
                      {"transfer", r.transfer}};
      } else if (s.step == "quantize-lm-head") {
        res.report = run_lm_head(s.params, work, o.threads, progress);
      } else {
        res.report = run_validate(s.params, work, o.threads, progress);
      }
      res.seconds = seconds_since(ts);
      rep.steps.push_back(std::move(res));
    }
    ckpt::publish_directory(work, out, o.force);
  } catch (...) {
    fs::remove_all(work, ec);
    throw;
  }
  rep.seconds = seconds_since(t0);
  return rep;
}

}  // namespace qf::quant
