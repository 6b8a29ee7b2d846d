// Fixed-length training windows from a token shard.
//
// A window is seq_len + 1 consecutive tokens (inputs and next-token targets). Each epoch
// draws a random start offset in [0, seq_len) and a random permutation of the windows, both
// from (seed + 1000 * node_id, epoch): the reference SPES shuffle, where every node reads the
// same corpus in its own order. The position (epoch, cursor) is the whole state, so a
// checkpoint can save it and resume exactly. Not thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "spes/data/shard.h"

namespace spes {

struct LoaderState {
  std::uint64_t epoch = 0;
  std::uint64_t cursor = 0;  // windows already handed out in this epoch
  bool operator==(const LoaderState&) const = default;
};

// A batch of `batch` windows, row-major [batch, seq_len].
struct TokenBatch {
  std::int64_t batch = 0;
  std::int64_t seq_len = 0;
  std::vector<std::int64_t> inputs;
  std::vector<std::int64_t> targets;
};

// The shuffle seed of a node: the reference's seed + 1000 * node.
std::uint64_t node_data_seed(std::uint64_t seed, int node_id);

class WindowSampler {
 public:
  // Error(Data) when the shard is too short for even one window.
  WindowSampler(const TokenShard& shard, std::int64_t seq_len, std::uint64_t seed, int node_id);

  TokenBatch next_batch(std::int64_t batch);
  LoaderState state() const { return state_; }
  void restore(const LoaderState& state);
  std::int64_t windows_per_epoch() const { return windows_; }

 private:
  void start_epoch();
  const TokenShard& shard_;
  std::int64_t seq_len_;
  std::uint64_t seed_;
  std::int64_t windows_;
  LoaderState state_;
  std::int64_t offset_ = 0;
  std::vector<std::uint32_t> order_;
};

// Validation windows: fixed, non-overlapping windows of seq_len tokens from the start of the
// shard; window i is the same on every call, so losses are comparable across steps, nodes and
// batch sizes. Returns windows first .. first+count-1 (wrapping around at the shard's end).
TokenBatch validation_batch(const TokenShard& shard, std::int64_t seq_len, std::int64_t first,
                            std::int64_t count);
// How many distinct validation windows the shard holds.
std::int64_t validation_windows(const TokenShard& shard, std::int64_t seq_len);

}  // namespace spes
