// `spes ckpt merge`: one whole model from the node shards of one step, each expert taken from
// the node that owns (trains) it. Torch-free.
#pragma once

#include <vector>

#include "spes/ckpt/shard.h"

namespace spes {

// The shards must be node shards of the same run (same resume fields apart from the node id),
// step and sync round, from distinct nodes whose ownerships cover every expert exactly once.
// Experts (weights, AdamW moments and step counts) come from their owners. Shared tensors come
// from the lowest node id when all shards agree bit for bit (as after a sync round); otherwise
// they are the fp32 mean in node-id order (logged), and shared moments are always that mean.
// The result has kind "merged", node_id -1, every expert owned, and the nodes' data positions
// as its sources. Error(Checkpoint) naming the shards for anything that does not fit.
Shard merge_shards(std::vector<Shard> shards);

}  // namespace spes
