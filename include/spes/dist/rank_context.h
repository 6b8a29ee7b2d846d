// Which rank of its node a process is, and where the node's rendezvous store listens. The rank
// launcher (spes/node/ranks.h) passes it to each child process in its environment:
//   SPES_NODE_RANK=r  SPES_NODE_RANKS=K  SPES_NODE_STORE=127.0.0.1:port
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace spes {

struct RankContext {
  int rank = 0;
  int ranks = 1;
  std::string store_host = "127.0.0.1";
  int store_port = 0;

  bool leader() const { return rank == 0; }
  // "rank 1 of 2" for log lines.
  std::string describe() const;
  // The environment entries ("NAME=value") that hand this context to a child process.
  std::vector<std::string> environment() const;
};

// The context the launcher set, or nullopt when this process was not started as a rank.
// Error(Usage) when the variables are present but malformed.
std::optional<RankContext> rank_context_from_environment();

}  // namespace spes
