#include "spes/dist/rank_context.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "spes/util/error.h"

namespace spes {

namespace {

int parse_int(const char* name, const char* text, int min, int max) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < min || value > max)
    raise(ErrorKind::Usage, "environment variable {}='{}' is not a number in {}..{} (it is set by `spes node "
          "--nproc-per-node`; unset it to run a single process)", name, text, min, max);
  return static_cast<int>(value);
}

}  // namespace

std::string RankContext::describe() const { return fmt::format("rank {} of {}", rank, ranks); }

std::vector<std::string> RankContext::environment() const {
  return {fmt::format("SPES_NODE_RANK={}", rank), fmt::format("SPES_NODE_RANKS={}", ranks),
          fmt::format("SPES_NODE_STORE={}:{}", store_host, store_port)};
}

std::optional<RankContext> rank_context_from_environment() {
  const char* rank = std::getenv("SPES_NODE_RANK");
  if (!rank) return std::nullopt;
  const char* ranks = std::getenv("SPES_NODE_RANKS");
  const char* store = std::getenv("SPES_NODE_STORE");
  if (!ranks || !store)
    raise(ErrorKind::Usage, "SPES_NODE_RANK is set but SPES_NODE_RANKS or SPES_NODE_STORE is not (they are set "
          "together by `spes node --nproc-per-node`)");
  RankContext c;
  c.ranks = parse_int("SPES_NODE_RANKS", ranks, 1, 1024);
  c.rank = parse_int("SPES_NODE_RANK", rank, 0, c.ranks - 1);
  const std::string address = store;
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0)
    raise(ErrorKind::Usage, "SPES_NODE_STORE='{}' is not host:port", address);
  c.store_host = address.substr(0, colon);
  c.store_port = parse_int("SPES_NODE_STORE (port)", address.c_str() + colon + 1, 1, 65535);
  return c;
}

}  // namespace spes
