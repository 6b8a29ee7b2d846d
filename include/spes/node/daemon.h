// The node daemon (`spes node`): trainer, sync service and coordinator client of one node of a
// SPES cluster, as one process or as one of the node's ranks.
#pragma once

#include "spes/config/config.h"
#include "spes/dist/rank_context.h"

namespace spes {

// Runs this process's part of the node until train.steps or a stop signal. Rank 0 (or the only
// process) runs the sync rounds, the coordinator client and the checkpoints; with several ranks
// the others train data-parallel with it through a c10d process group and take its weights
// after every round. Throws spes::Error on bad config, peers or data.
void run_node_process(const Config& config, const RankContext& context);

}  // namespace spes
