#include "spes/util/progress.h"

#include <fmt/format.h>

#include <cmath>

namespace spes {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto total = static_cast<std::int64_t>(std::llround(seconds));
  if (total < 60) return fmt::format("{}s", total);
  if (total < 3600) return fmt::format("{}m{:02}s", total / 60, total % 60);
  return fmt::format("{}h{:02}m", total / 3600, (total % 3600) / 60);
}

std::string format_count(double value) {
  const double a = std::fabs(value);
  if (a < 1e3) return fmt::format("{:.0f}", value);
  if (a < 1e6) return fmt::format("{:.1f}k", value / 1e3);
  if (a < 1e9) return fmt::format("{:.2f}M", value / 1e6);
  return fmt::format("{:.2f}B", value / 1e9);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (std::fabs(bytes) >= 1024.0 && unit < 4) {
    bytes /= 1024.0;
    ++unit;
  }
  if (unit == 0) return fmt::format("{:.0f} B", bytes);
  return fmt::format("{:.2f} {}", bytes, units[unit]);
}

std::string format_list(const std::vector<int>& values, const char* empty) {
  std::string out;
  for (int v : values) out += (out.empty() ? "" : ",") + std::to_string(v);
  return out.empty() ? empty : out;
}

}  // namespace spes
