// The `qforge` subcommands. Each add_* registers its flags on `app` and returns the function
// that runs it; the function returns the process exit code and may throw qf::Error.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace qf::tools {

struct Command {
  CLI::App* app;
  std::function<int()> run;
};

Command add_add_mtp(CLI::App& app);
Command add_bench(CLI::App& app);
Command add_build_hybrid(CLI::App& app);
Command add_dequantize(CLI::App& app);
Command add_eval_ppl(CLI::App& app);
Command add_generate(CLI::App& app);
Command add_inspect(CLI::App& app);
Command add_logits(CLI::App& app);
Command add_quantize_lm_head(CLI::App& app);
Command add_recipe(CLI::App& app);
Command add_serve(CLI::App& app);
Command add_synth(CLI::App& app);
Command add_tokenize(CLI::App& app);
Command add_validate(CLI::App& app);

}  // namespace qf::tools
