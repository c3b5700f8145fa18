#include "args.h"

#include <cmath>
#include <cstdlib>

#include "qf/error.h"

namespace qf::tools {

uint64_t parse_size(const std::string& text, const std::string& flag) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  const std::string unit = end ? std::string(end) : "";
  double mult = 0;
  if (unit.empty() || unit == "B") mult = 1;
  if (unit == "K" || unit == "KB") mult = 1e3;
  if (unit == "M" || unit == "MB") mult = 1e6;
  if (unit == "G" || unit == "GB") mult = 1e9;
  if (unit == "T" || unit == "TB") mult = 1e12;
  if (unit == "KiB") mult = 1024.0;
  if (unit == "MiB") mult = 1024.0 * 1024;
  if (unit == "GiB") mult = 1024.0 * 1024 * 1024;
  if (unit == "TiB") mult = 1024.0 * 1024 * 1024 * 1024;
  if (end == text.c_str() || mult == 0 || !(v > 0) || !std::isfinite(v * mult) ||
      v * mult > 1.8e19) {
    throw Error(Errc::kUsage, flag + " '" + text + "' is not a size such as 5GiB, 512MiB or 4096");
  }
  return static_cast<uint64_t>(std::llround(v * mult));
}

}  // namespace qf::tools
