// Per-node checkpoint shards: the trainer's whole state in one folder, written so that a crash
// never leaves a half shard that looks complete, and read back with every checksum verified.
// Format: docs/checkpoint-format.md.
//
//   DIR/step-00000100/model.safetensors       every model weight (trained and frozen copies)
//                     optimizer.safetensors   AdamW moments of the trained ones (NAME.exp_avg, NAME.exp_avg_sq)
//                     manifest.json           step, data position, sync round, ownership, config, checksums
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "spes/config/config.h"
#include "spes/data/loader.h"
#include "spes/util/safetensors.h"

namespace spes {

class Trainer;

struct ShardInfo {
  std::string path;
  std::int64_t step = 0;
  int node_id = 0;
  std::uint64_t sync_round = 0;
  std::vector<int> owned_experts;
  std::string config_hash;
  std::vector<std::pair<std::string, std::string>> config_fields;  // what the hash covers
  LoaderState loader;
  std::map<std::string, std::int64_t> adam_steps;  // per trained parameter
  std::vector<std::string> grad_buffers;           // parameters that had a gradient buffer
  std::int64_t bytes = 0;                          // tensor data in all files
};

struct Shard {
  ShardInfo info;
  std::map<std::string, LoadedTensor> model, optimizer;
};

// The settings a run must share with a shard to resume from it exactly, as "key" = "value":
// model, loss, optim, schedule, data.seq_len, train.steps/batch_size/grad_accum, run.seed and
// node_id, sync.every, merge. Not paths, logging, evaluation or checkpoint settings.
std::vector<std::pair<std::string, std::string>> resume_fields(const Config& config);
std::string config_hash(const Config& config);

// Writes the trainer's state as DIR/step-NNNNNNNN (DIR = checkpoint.effective_dir): into a
// temporary folder, every file fsynced, then renamed; keeps the newest checkpoint.keep shards.
// Returns the shard's path (an existing shard of the same step is kept as it is).
std::string write_shard(Trainer& trainer, std::uint64_t sync_round);

// After a step: writes a shard when checkpoint.every divides the step (and logs it).
void checkpoint_if_due(Trainer& trainer, std::uint64_t sync_round);

// Reads a shard and verifies it against its manifest: every file present, every tensor's
// shape and crc32. Error(Checkpoint) naming the shard and what is wrong.
Shard read_shard(const std::string& path);
// The newest shard in `dir` that verifies; broken ones are reported by name and skipped.
std::optional<Shard> newest_shard(const std::string& dir);
// Complete shards in `dir`, oldest first (folder names only; nothing verified).
std::vector<std::string> list_shards(const std::string& dir);

// How a shard differs from what the trainer runs: "key: shard X, config Y" lines (empty = none).
std::vector<std::string> shard_differences(const ShardInfo& shard, const Config& config);
// Loads a verified shard: weights, AdamW moments and step counts, the step counter and the data
// position. A shard that differs (shard_differences) is refused with Error(Checkpoint) listing
// the differences unless allow_mismatch; then trained experts the shard has no moments for start
// at zero (logged).
void load_shard(Trainer& trainer, const Shard& shard, bool allow_mismatch);
// Applies checkpoint.resume ("" = nothing, "auto" = newest usable shard, else a shard folder or
// the name of one in the checkpoint folder);
// returns what it resumed from.
std::optional<ShardInfo> resume_from_config(Trainer& trainer);

}  // namespace spes
