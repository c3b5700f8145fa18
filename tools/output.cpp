#include "output.h"

#include <unistd.h>

#include <chrono>
#include <map>

namespace qf::tools {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string human_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  }
  return buf;
}

std::string with_commas(uint64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

void print_problems(std::FILE* out, const std::vector<ckpt::Problem>& problems,
                    size_t max_per_code) {
  std::map<Errc, size_t> shown, hidden;
  for (const ckpt::Problem& p : problems) {
    if (shown[p.code] >= max_per_code) {
      ++hidden[p.code];
      continue;
    }
    ++shown[p.code];
    std::fprintf(out, "error[%s] %s\n", std::string(errc_name(p.code)).c_str(),
                 ckpt::format_problem(p).c_str());
  }
  for (const auto& [code, n] : hidden) {
    std::fprintf(out, "error[%s] ... and %s more like it\n", std::string(errc_name(code)).c_str(),
                 with_commas(n).c_str());
  }
}

nlohmann::json problems_json(const std::vector<ckpt::Problem>& problems) {
  nlohmann::json arr = nlohmann::json::array();
  for (const ckpt::Problem& p : problems) {
    nlohmann::json j = {{"code", errc_name(p.code)}, {"message", p.message}};
    if (!p.file.empty()) j["file"] = p.file;
    if (!p.tensor.empty()) j["tensor"] = p.tensor;
    arr.push_back(std::move(j));
  }
  return arr;
}

ProgressBar::ProgressBar(std::string label, const ckpt::Progress& progress, std::string unit)
    : label_(std::move(label)),
      progress_(progress),
      unit_(std::move(unit)),
      tty_(::isatty(STDERR_FILENO) == 1),
      start_(now_seconds()) {
  thread_ = std::thread([this] {
    double last_line = start_;
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stop_; })) {
      const double t = now_seconds();
      if (tty_ || t - last_line >= 5.0) {
        draw(false);
        last_line = t;
      }
    }
  });
}

ProgressBar::~ProgressBar() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // A redrawn bar always gets its final state; a log only when the work took a while.
  if (tty_ || now_seconds() - start_ >= 5.0) draw(true);
}

void ProgressBar::draw(bool final) {
  const uint64_t done = progress_.done.load();
  const uint64_t total = progress_.total.load();
  const double elapsed = std::max(now_seconds() - start_, 1e-9);
  const double frac = total ? static_cast<double>(done) / static_cast<double>(total) : 0.0;
  char bar[33];
  const int filled = static_cast<int>(frac * 30.0 + 0.5);
  for (int i = 0; i < 30; ++i) bar[i] = i < filled ? '#' : '.';
  bar[30] = '\0';
  char amounts[96];
  if (unit_.empty()) {
    std::snprintf(amounts, sizeof amounts, "%s / %s  %.2f GB/s", human_bytes(done).c_str(),
                  human_bytes(total).c_str(), static_cast<double>(done) / elapsed / 1e9);
  } else {
    std::snprintf(amounts, sizeof amounts, "%s / %s %s  %.1f %s/s", with_commas(done).c_str(),
                  with_commas(total).c_str(), unit_.c_str(), static_cast<double>(done) / elapsed,
                  unit_.c_str());
  }
  std::fprintf(stderr, "%s%s [%s] %5.1f%%  %s  %.1f s%s", tty_ ? "\r" : "", label_.c_str(), bar,
               frac * 100.0, amounts, elapsed, tty_ && !final ? "" : "\n");
  std::fflush(stderr);
}

}  // namespace qf::tools
