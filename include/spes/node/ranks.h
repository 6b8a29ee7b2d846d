// A node of several processes (node.ranks = K, `spes node --nproc-per-node K`): this process
// serves the ranks' rendezvous store, starts the K ranks and watches them, as torchrun does.
#pragma once

#include <string>
#include <vector>

#include "spes/config/config.h"

namespace spes {

// Starts `argv` (a spes command line) K times, rank r with SPES_NODE_RANK=r etc. in its
// environment, each in its own process group and killed if this process dies. Forwards the
// first SIGINT/SIGTERM to every rank (they agree on a step, rank 0 writes its shard) and waits.
// When a rank exits with an error or a signal, stops the others (SIGTERM, then SIGKILL after a
// few seconds) and throws Error(Peer) naming the rank; returns when all ranks exited with 0.
void run_node_ranks(const std::vector<std::string>& argv, const Config& config);

}  // namespace spes
