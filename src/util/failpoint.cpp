#include "spes/util/failpoint.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "spes/util/signals.h"

namespace spes {
namespace {

struct Armed {
  std::string name;  // empty: no failpoint armed
  long hit = 1;      // fires the hit-th time the point is reached
  double seconds = 10;
};

const Armed& armed() {
  static const Armed a = [] {
    Armed out;
    const char* env = std::getenv("SPES_FAILPOINT");
    if (!env || !*env) return out;
    const std::string spec(env);
    const auto colon = spec.find(':'), at = spec.find('@');
    out.name = spec.substr(0, std::min(colon, at));
    if (at != std::string::npos) {
      char* end = nullptr;
      const long n = std::strtol(spec.c_str() + at + 1, &end, 10);
      if (n >= 1 && end && (*end == '\0' || *end == ':')) out.hit = n;
      else spdlog::warn("SPES_FAILPOINT='{}': the hit after '@' is not a count >= 1; firing at the first", spec);
    }
    if (colon != std::string::npos) {
      char* end = nullptr;
      const double s = std::strtod(spec.c_str() + colon + 1, &end);
      if (end && *end == '\0' && s >= 0) out.seconds = s;
      else spdlog::warn("SPES_FAILPOINT='{}': the hold is not a number of seconds; holding {} s", spec, out.seconds);
    }
    return out;
  }();
  return a;
}

}  // namespace

void failpoint(std::string_view name) {
  const Armed& a = armed();
  if (a.name.empty() || a.name != name) return;
  static std::atomic<long> hits{0};
  if (++hits != a.hit) return;
  spdlog::warn("failpoint {} reached: holding {} s", name, a.seconds);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(a.seconds);
  while (std::chrono::steady_clock::now() < until && !stop_requested())
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  spdlog::warn("failpoint {} released{}", name, stop_requested() ? " by a stop signal" : "");
}

}  // namespace spes
