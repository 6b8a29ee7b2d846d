#include "spes/util/failpoint.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cmath>
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

namespace {

struct Poison {
  std::string part;  // empty: not armed
  double factor = 1;
  int node = -1;     // -1: every node
  std::uint64_t from_round = 1;
};

const Poison& armed_poison() {
  static const Poison p = [] {
    Poison out;
    const char* env = std::getenv("SPES_POISON");
    if (!env || !*env) return out;
    const std::string spec(env);
    const auto colon = spec.find(':'), at = spec.find('@');
    char* end = nullptr;
    const double f = colon == std::string::npos ? 0 : std::strtod(spec.c_str() + colon + 1, &end);
    const bool node_ok = at == std::string::npos || (at + 1 < spec.size() && spec.size() - at - 1 <= 6 &&
                         spec.find_first_not_of("0123456789", at + 1) == std::string::npos);
    if (colon == std::string::npos || !end || (*end != '\0' && *end != '@') || !(f > 0) || !node_ok) {
      spdlog::warn("SPES_POISON='{}' is not PART:FACTOR[@NODE] (experts:1.5, shared:1.1@3); ignored", spec);
      return out;
    }
    out.part = spec.substr(0, colon);
    out.factor = f;
    if (at != std::string::npos) out.node = std::stoi(spec.substr(at + 1));
    if (const char* from = std::getenv("SPES_POISON_FROM"); from && *from) out.from_round = std::strtoull(from, nullptr, 10);
    return out;
  }();
  return p;
}

}  // namespace

double poison_factor(std::string_view part, int node_id, std::uint64_t round) {
  const Poison& p = armed_poison();
  if (p.part != part || (p.node >= 0 && p.node != node_id) || round < p.from_round) return 1.0;
  // Experts drift: the copy published in round r is the honest one × factor^(r - from + 1), so
  // every round moves them ×factor further from what the owner trains (a slow steer). Shared
  // contributions are averaged afresh each round, so a constant factor already pulls every round.
  const bool drift = p.part == "experts";
  static std::atomic<bool> said{false};
  if (!said.exchange(true))
    spdlog::warn("SPES_POISON: node {} scales the {} it publishes by {} {} from round {} (a test of robust merging)",
                 node_id, p.part, p.factor, drift ? "more every round (compounding)" : "every round", round);
  return drift ? std::pow(p.factor, static_cast<double>(round - p.from_round + 1)) : p.factor;
}

}  // namespace spes
