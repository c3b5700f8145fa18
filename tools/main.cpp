// qforge: build, check and run quantized Qwen3.5-MoE checkpoints.
#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <system_error>
#include <vector>

#include "args.h"
#include "commands.h"
#include "qf/error.h"

int main(int argc, char** argv) {
  // Past a file-size limit (ulimit -f), fail the write with EFBIG and clean up instead of dying.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"qforge: build, validate and inspect quantized Qwen3.5-MoE checkpoints"};
  app.set_version_flag("--version", QF_VERSION);
  app.require_subcommand(1, 1);
  app.footer(
      "Exit codes: 0 ok, 1 usage, 2 invalid input or validation failed, 3 I/O error,\n"
      "4 unsupported.\n\n"
      "Example:\n  qforge inspect /models/Qwen3.5-122B-A10B-int4-AutoRound");

  const std::vector<qf::tools::Command> commands = {
      qf::tools::add_add_mtp(app),
      qf::tools::add_bench(app),
      qf::tools::add_build_hybrid(app),
      qf::tools::add_dequantize(app),
      qf::tools::add_eval_ppl(app),
      qf::tools::add_generate(app),
      qf::tools::add_inspect(app),
      qf::tools::add_logits(app),
      qf::tools::add_quantize_lm_head(app),
      qf::tools::add_recipe(app),
      qf::tools::add_serve(app),
      qf::tools::add_synth(app),
      qf::tools::add_tokenize(app),
      qf::tools::add_validate(app),
  };
  qf::tools::strict_integers(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? qf::kExitOk : qf::kExitUsage;
  }
  for (const qf::tools::Command& cmd : commands) {
    if (!cmd.app->parsed()) continue;
    try {
      return cmd.run();
    } catch (const qf::Error& e) {
      std::fprintf(stderr, "qforge %s: error: %s\n", cmd.app->get_name().c_str(), e.what());
      return qf::errc_exit_code(e.code());
    } catch (const std::filesystem::filesystem_error& e) {  // should have been a qf::Error
      std::fprintf(stderr, "qforge %s: error: %s\n", cmd.app->get_name().c_str(), e.what());
      return qf::kExitIo;
    } catch (const std::system_error& e) {  // a thread that could not start, say
      std::fprintf(stderr, "qforge %s: error: %s\n", cmd.app->get_name().c_str(), e.what());
      return qf::kExitIo;
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "qforge %s: error: out of memory\n", cmd.app->get_name().c_str());
      return qf::kExitIo;
    }
  }
  return qf::kExitUsage;
}
