// Output helpers shared by the subcommands: number formatting, problem lists, progress bars.
// Results go to stdout; logs and progress to stderr.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "qf/ckpt/problem.h"
#include "qf/ckpt/progress.h"

namespace qf::tools {

// "62.69 GiB", "512 B"
std::string human_bytes(uint64_t bytes);
// "110,912"
std::string with_commas(uint64_t n);

// One line per problem, "error[code] file: tensor 'x': message"; at most `max_per_code` lines
// for each code, then a count of the rest.
void print_problems(std::FILE* out, const std::vector<ckpt::Problem>& problems,
                    size_t max_per_code);
nlohmann::json problems_json(const std::vector<ckpt::Problem>& problems);

// Renders a Progress on stderr until destroyed: a redrawn bar on a terminal, a line every few
// seconds otherwise. `unit` names what the Progress counts: empty for bytes (sizes and GB/s),
// else a plural noun such as "tokens" (counts and tokens/s).
class ProgressBar {
 public:
  ProgressBar(std::string label, const ckpt::Progress& progress, std::string unit = "");
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

 private:
  void draw(bool final);

  std::string label_;
  const ckpt::Progress& progress_;
  std::string unit_;
  bool tty_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  double start_;
  std::thread thread_;
};

}  // namespace qf::tools
