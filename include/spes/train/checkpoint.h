// Per-node checkpoint shards of a running trainer: its whole state in one folder (the folder
// format itself is spes/ckpt/shard.h, docs/checkpoint-format.md).
//
//   DIR/step-00000100/   what write_shard() writes, DIR = checkpoint.effective_dir
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "spes/ckpt/shard.h"
#include "spes/config/config.h"

namespace spes {

class Trainer;

// Writes the trainer's state as DIR/step-NNNNNNNN (DIR = checkpoint.effective_dir): into a
// temporary folder, every file fsynced, then renamed; keeps the newest checkpoint.keep shards.
// Returns the shard's path (an existing shard of the same step is kept as it is).
// `carry`: the sync engine's residuals and baseline rounds, only when the shard is written right
// after round sync_round (what makes a lossy-encoded run resume bit-exactly).
std::string write_shard(Trainer& trainer, std::uint64_t sync_round, const SyncCarry* carry = nullptr);

// Whether checkpoint.every asks for a shard at the trainer's current step.
bool checkpoint_due(const Trainer& trainer);
// After a step: writes a shard when checkpoint_due (and logs it).
void checkpoint_if_due(Trainer& trainer, std::uint64_t sync_round, const SyncCarry* carry = nullptr);

// Loads a verified folder: weights, AdamW moments and step counts, the step counter and the data
// position. A folder that differs (shard_differences) is refused with Error(Checkpoint) listing
// the differences unless allow_mismatch.
// A merged folder (resharding to a new assignment or node count) gives every node all weights,
// the shared moments, and moments only for experts this node id owned before: newly owned experts
// start with zero moments (logged), and a node id the merged run did not have starts its data
// position at zero (logged). Imported and upcycled folders hold weights only (step 0).
void load_shard(Trainer& trainer, const Shard& shard, bool allow_mismatch);
// Applies checkpoint.resume ("" = nothing, "auto" = newest usable shard, else a folder (shard,
// merged, imported, upcycled, or a Hugging Face OLMoE / Qwen3-MoE folder) or the name of a shard
// in the checkpoint folder);
// returns what it resumed from.
std::optional<ShardInfo> resume_from_config(Trainer& trainer);

}  // namespace spes
