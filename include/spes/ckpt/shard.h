// Checkpoint folders on disk, without torch: a manifest (JSON) plus safetensors files, written
// through a temporary folder (fsync, rename) and read back with every checksum verified.
// Format: docs/checkpoint-format.md.
//
//   FOLDER/model.safetensors       every model weight
//          optimizer.safetensors   AdamW moments (NAME.exp_avg, NAME.exp_avg_sq)
//          sync.safetensors        only with lossy wire encodings: error-feedback residuals
//          manifest.json           kind, step, data position, sync round, ownership, config, checksums
//
// One format serves four kinds of folder: a node's shard (what `spes node` writes), a merged
// model (`spes ckpt merge`: every expert from its owner), an imported Hugging Face model and an
// upcycled one. All of them can be resumed from, evaluated, exported and inspected.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "spes/config/config.h"
#include "spes/data/loader.h"
#include "spes/sync/carry.h"
#include "spes/util/safetensors.h"

namespace spes {

// What a merged folder remembers about each node shard it was built from.
struct ShardSource {
  int node_id = 0;
  std::vector<int> owned_experts;
  LoaderState loader;
};

struct ShardInfo {
  std::string path;
  std::string kind = "node";  // node | merged | imported | upcycled
  std::int64_t step = 0;
  int node_id = 0;            // -1 for folders that are not one node's
  std::uint64_t sync_round = 0;
  std::vector<int> owned_experts;
  std::string config_hash;
  std::vector<std::pair<std::string, std::string>> config_fields;  // what the hash covers
  LoaderState loader;
  std::map<std::string, std::int64_t> adam_steps;  // per trained parameter
  std::vector<std::string> grad_buffers;           // parameters that had a gradient buffer
  std::vector<ShardSource> sources;                // merged: the node shards, by node id
  std::string tokenizer;                           // SentencePiece model of the run ("" = unknown)
  std::string origin;                              // imported/upcycled: where the weights came from
  std::optional<SyncCarry> sync_carry;             // node shards written right after a lossy round
  std::int64_t bytes = 0;                          // tensor data in all files

  bool is_node_shard() const { return kind == "node"; }
};

struct Shard {
  ShardInfo info;
  std::map<std::string, LoadedTensor> model, optimizer;
};

// The settings a run must share with a shard to resume from it exactly, as "key" = "value":
// model, loss, optim, schedule, data.seq_len, train.steps/batch_size/grad_accum, run.seed and
// node_id, sync.every, merge. Not paths, logging, evaluation or checkpoint settings.
std::vector<std::pair<std::string, std::string>> resume_fields(const Config& config);
// Only the model.* entries of resume_fields: what a weights-only folder (import, upcycle) records.
std::vector<std::pair<std::string, std::string>> model_fields(const ModelConfig& model);
std::string config_hash(const std::vector<std::pair<std::string, std::string>>& fields);
std::string config_hash(const Config& config);
// The model configuration a folder was written with (from its model.* fields).
ModelConfig model_config_of(const ShardInfo& info);

// Writes a checkpoint folder at `final_path` (write_folder_atomic: every file fsynced, the
// manifest last, one rename; an existing folder is an error). The manifest's config hash and
// tensor checksums are computed here from info.config_fields and the tensors.
void write_shard_folder(const std::string& final_path, const ShardInfo& info, const std::vector<TensorView>& weights,
                        const std::vector<TensorView>& moments);
// Same from loaded tensors (merge, import, upcycle).
void write_shard_folder(const std::string& final_path, const Shard& shard);

// Reads a folder and verifies it against its manifest: every file present, every tensor's
// shape and crc32. Error(Checkpoint) naming the folder and what is wrong.
Shard read_shard(const std::string& path);
// The newest shard in `dir` that verifies; broken ones are reported by name and skipped.
std::optional<Shard> newest_shard(const std::string& dir);
// Complete shards in `dir` (step-NNNNNNNN), oldest first (folder names only; nothing verified).
std::vector<std::string> list_shards(const std::string& dir);
// Deletes all but the newest `keep` shards in `dir`, and the unfinished ones (below).
void keep_newest_shards(const std::string& dir, int keep);
// Deletes the unfinished shards a killed writer left in `dir` (hidden temporary folders, never
// taken for a shard), each with a warning.
void remove_abandoned_shards(const std::string& dir);

// Expert index of "layers.{l}.mlp.experts.{e}.…" (and of its moments), or -1 for a shared tensor.
int expert_index_of(const std::string& tensor_name);

// How a folder differs from what a run is configured as: "key: shard X, config Y" lines (empty =
// none). Keys the folder does not record are not compared (an imported model records only its
// model). A merged folder is compared without node id and ownership: loading one under another
// assignment is what it is for.
std::vector<std::string> shard_differences(const ShardInfo& shard, const Config& config);

}  // namespace spes
